"""MaxText's gradient accumulation and what a real stack's matmul-saving remat keeps (issue 19,
the planner's gradient-accumulation plans on TPU): the accumulator MaxText carries through its
jax.lax.scan over microbatches (specs/frameworks/maxtext.toml [gradient_accumulation]) is one
more gradient buffer and an HBM pass per microbatch; the layer input every checkpointed layer
keeps is counted under MATMULS for a real stack, and the down projection's output, which no
backward reads, is not."""

from __future__ import annotations

import copy
import tomllib

import numpy as np
import pytest

from roofline.core.ledger import build_ledger
from roofline.core.memory import Remat, RematKind, layer_input, saved_bytes
from roofline.core.stack import stack_of
from roofline.errors import SpecError
from roofline.specs.framework import FRAMEWORK_DIR, framework_from_dict, load_framework
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.step import Workload, evaluate_plan, parse_plan

SEQ = 2048


def _whole(ledger):
    return lambda op, t: t.nbytes(op.sizes if op is not None else ledger.sizes)


# -- what MATMULS keeps -------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["llama-3.1-8b", "mixtral-8x7b"])
def test_a_real_stack_keeps_the_layer_input_not_the_down_projection(model):
    m = load_model(model)
    led = build_ledger(m, seq=SEQ)
    tb = _whole(led)
    mm = Remat(RematKind.MATMULS)
    book, real = saved_bytes(led, mm, tb), saved_bytes(led, mm, tb, keeps_layer_input=True)
    x = tb(None, layer_input(led)) * m.n_layers
    if m.moe is None:
        # a dense layer trades the down projection's output [b, s, D] for its input [b, s, D]
        assert real == pytest.approx(book)
    else:
        # the routed experts' down projection was never kept: the MoE layer keeps x on top
        assert real == pytest.approx(book + x)
    # full remat keeps the layer input either way
    full = Remat(RematKind.FULL)
    assert saved_bytes(led, full, tb, keeps_layer_input=True) == saved_bytes(led, full, tb)


def test_the_walk_counts_the_layer_input_for_a_real_stack_only():
    m = load_model("mixtral-8x7b")
    sysm, w = parse_system("tpu-v5p:4x4x4"), Workload(256 * SEQ, SEQ)
    plan = parse_plan("fsdp=64,microbatch=1,remat=matmuls")
    book = evaluate_plan(m, sysm, w, plan, framework="ideal").memory_breakdown["activations"]
    mt = evaluate_plan(m, sysm, w, plan, framework="maxtext").memory_breakdown["activations"]
    # x: 4 sequences of D per chip per layer, in bf16
    x = 4 * SEQ * m.d_model * 2 * m.n_layers
    assert mt - book == pytest.approx(x, rel=1e-6)


# -- MaxText's accumulator ----------------------------------------------------------------------


def test_maxtext_declares_its_accumulator_and_the_others_none():
    ga = load_framework("maxtext").grad_accumulation
    assert ga is not None and ga.buffer == "params" and ga.zero_buffer == "bf16"
    assert "gradient_accumulation.py" in ga.source
    for name in ("megatron", "torchtitan", "deepspeed", "ideal"):
        assert load_framework(name).grad_accumulation is None, name
    st = stack_of("maxtext")
    # fp32 parameters: an fp32 accumulator; ZeRO-1 over replicas: bf16; ZeRO-1 without
    # replicas (the plan's default stage) is no shard_optimizer_over_data
    got = st.accumulator_bytes(4.0, np.array([0, 1, 1, 3]), np.array([8, 8, 1, 8]))
    assert got.tolist() == [4.0, 2.0, 4.0, 4.0]
    assert stack_of("megatron").accumulator_bytes(4.0, np.array([0, 1]), 8).tolist() == [0, 0]


def _cost(plan: str, framework: str = "maxtext", system: str = "tpu-v5e:16x16"):
    m = load_model("llama-3.1-8b")
    w = Workload(1024 * SEQ, SEQ)
    return evaluate_plan(m, parse_system(system), w, parse_plan(plan), framework=framework)


def _params_local(c) -> float:
    return c.memory_breakdown["optimizer"] / 8.0  # adam-fp32: two fp32 moments per parameter


def test_accumulation_steps_keep_an_fp32_accumulator_and_pay_its_passes():
    one = _cost("fsdp=256,microbatch=1,remat=full,optimizer=adam-fp32")
    four = _cost("fsdp=256,microbatch=4,remat=full,optimizer=adam-fp32")
    n = _params_local(one)
    assert one.memory_breakdown["grads"] == pytest.approx(4 * n)
    assert four.memory_breakdown["grads"] == pytest.approx(8 * n)  # the microbatch's + the sum
    assert four.memory_breakdown["params"] == pytest.approx(one.memory_breakdown["params"])
    # the step's update is the same; zeroing and dividing the accumulator: 3 x 4 B per parameter
    hbm = one.system.chip.hbm_bw_bytes_per_s * one.efficiency.hbm_fraction(one.system.chip)
    assert four.optimizer_time_s - one.optimizer_time_s == pytest.approx(12 * n / hbm, rel=1e-6)


def test_each_microbatch_adds_into_the_accumulator():
    two = _cost("fsdp=256,microbatch=2,remat=full,optimizer=adam-fp32")
    ideal2 = _cost("fsdp=256,microbatch=2,remat=full,optimizer=adam-fp32", framework="ideal")
    assert ideal2.memory_breakdown["grads"] == pytest.approx(_params_local(ideal2) * 4)
    # the add reads both and writes one (3 x 4 B per parameter) in each of the 2 microbatches
    four = _cost("fsdp=256,microbatch=4,remat=full,optimizer=adam-fp32")
    n = _params_local(two)
    hbm = two.system.chip.hbm_bw_bytes_per_s * two.efficiency.hbm_fraction(two.system.chip)
    per_mb_two = two.compute_time_s / 2
    per_mb_four = four.compute_time_s / 4
    add = 12 * n / hbm
    # each microbatch's compute is its share of the batch's work plus one add
    assert per_mb_two - add == pytest.approx(2 * (per_mb_four - add), rel=1e-3)


def test_zero1_accumulates_in_bf16_beside_a_bf16_copy_of_the_parameters():
    z0 = _cost("dp=8,fsdp=32,microbatch=4,remat=full,zero=0,optimizer=adam-fp32")
    z1 = _cost("dp=8,fsdp=32,microbatch=4,remat=full,zero=1,optimizer=adam-fp32")
    n = z0.memory_breakdown["params"] / 4.0
    assert z0.memory_breakdown["grads"] == pytest.approx(8 * n)
    assert z1.memory_breakdown["grads"] == pytest.approx(6 * n)  # fp32 gradient + bf16 sum
    assert z1.memory_breakdown["params"] == pytest.approx(6 * n)  # fp32 + the bf16 cast


def test_pipeline_microbatches_are_not_accumulation_steps():
    one = _cost("fsdp=64,pp=4,microbatch=4,remat=full,optimizer=adam-fp32")
    n = one.memory_breakdown["params"] / 4.0
    assert one.memory_breakdown["grads"] == pytest.approx(4 * n)


# -- the table's errors -------------------------------------------------------------------------


def _raw() -> dict:
    with open(FRAMEWORK_DIR / "maxtext.toml", "rb") as f:
        return tomllib.load(f)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("buffer", "fp33", "'params'"),
        ("zero_buffer", "params", "a dtype"),
        ("source", " ", "source"),
    ],
)
def test_a_bad_accumulation_table_is_one_paragraph(key, value, words):
    raw = copy.deepcopy(_raw())
    raw["gradient_accumulation"][key] = value
    with pytest.raises(SpecError) as e:
        framework_from_dict(raw, "bad.toml")
    msg = str(e.value)
    assert "\n" not in msg and "bad.toml" in msg and words in msg, msg


def test_a_table_without_its_buffer_says_so():
    raw = copy.deepcopy(_raw())
    del raw["gradient_accumulation"]["buffer"]
    with pytest.raises(SpecError) as e:
        framework_from_dict(raw, "bad.toml")
    assert "buffer" in str(e.value)
