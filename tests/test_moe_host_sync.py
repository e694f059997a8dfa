"""The host sync of a dropless MoE layer (Stack.moe_host_sync_s, specs/frameworks/megatron.toml
[expert_parallel] host_sync_s): once per routed-expert layer forward Megatron's host waits on the
device for the tokens each expert received (DeepEP dispatch, the alltoall dispatcher's
d2h_event.synchronize(), the fp8 grouped MLP's tokens_per_expert.tolist()), and the GPU idles.

The number is a measurement: Megatron-Bridge's Nsight profile of Qwen3-30B-A3B on 16 H100
(EP16, MBS 1, GBS 1024, overlap off) has a 24.714 s step with a 22.821 s GPU-active union."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from roofline.errors import SpecError
from roofline.specs.framework import FRAMEWORK_DIR, framework_from_dict, load_framework
from roofline.specs.model import ModelSpec, MoESpec
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.training.step import evaluate_plan

# Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): 48 layers, d 2048, 32 heads of 128, 4 KV
# heads, vocab 151936, 128 experts of width 768, top-8, every layer MoE
QWEN3_30B = ModelSpec(
    name="qwen3-30b-a3b-test",
    n_layers=48,
    d_model=2048,
    d_ff=768,
    n_heads=32,
    n_kv_heads=4,
    d_head=128,
    vocab=151936,
    qk_norm=True,
    moe=MoESpec(n_experts=128, top_k=8, d_ff_expert=768),
)
SEQ = 4096
GBS = 1024  # sequences
M = 64  # microbatches per step: 1024 sequences / 16 ranks / MBS 1
SYSTEM = parse_system("h100:16")
WORK = Workload(GBS * SEQ, SEQ)
PLAN = f"ep=16,microbatch={M},remat=none"
MEGATRON = load_framework("megatron")


def _without_sync(fw):
    ep = dataclasses.replace(fw.expert_parallel, host_sync_s=0.0)
    return dataclasses.replace(fw, expert_parallel=ep)


def _step(model, plan: str, framework, system=SYSTEM, work=WORK) -> float:
    cost = evaluate_plan(model, system, work, parse_plan(plan), framework=framework)
    return cost.step_time_s


def test_step_idle_is_the_measured_one():
    """Closed form against the measurement: the step grows by M · L_moe · host_sync_s, and on
    the measured run's layout that is its idle, 24.714 − 22.821 = 1.893 s."""
    with_sync = _step(QWEN3_30B, PLAN, MEGATRON)
    without = _step(QWEN3_30B, PLAN, _without_sync(MEGATRON))
    sync = MEGATRON.expert_parallel.host_sync_s
    assert with_sync - without == pytest.approx(M * QWEN3_30B.n_moe_layers * sync, rel=1e-9)
    assert with_sync - without == pytest.approx(24.714 - 22.821, abs=0.002)


def test_the_ep_overlap_schedule_hides_it():
    """Combined 1F1B (overlap_ep=1): the other microbatch's kernels are queued while the host
    waits, so the step pays no idle (the same profile with overlap on: a GPU-active union of
    21.22 s in a 20.99-21.07 s step). Also in a planner-style walk of both flags at once."""
    plan = PLAN + ",overlap_ep=1"
    assert _step(QWEN3_30B, plan, MEGATRON) == pytest.approx(
        _step(QWEN3_30B, plan, _without_sync(MEGATRON)), rel=1e-12
    )


def test_a_full_iteration_graph_syncs_never():
    """cuda_graph=1 (the step replayed from one CUDA graph, static expert capacity): no sync."""
    graphed = _step(QWEN3_30B, PLAN + ",cuda_graph=1", MEGATRON)
    assert graphed == _step(QWEN3_30B, PLAN, _without_sync(MEGATRON))
    assert parse_plan(PLAN + ",cuda_graph=1").describe().endswith("cuda_graph=1")


def test_full_recompute_syncs_again():
    """Full recompute reruns the layer forward, its dispatch and its sync: twice the idle."""
    plan = PLAN.replace("remat=none", "remat=full")
    extra = _step(QWEN3_30B, plan, MEGATRON) - _step(QWEN3_30B, plan, _without_sync(MEGATRON))
    sync = MEGATRON.expert_parallel.host_sync_s
    assert extra == pytest.approx(2 * M * QWEN3_30B.n_moe_layers * sync, rel=1e-9)


def test_dense_models_and_other_stacks_pay_nothing():
    dense = load_model("llama-3-8b")
    plan = "dp=8,microbatch=4,remat=none"
    work = Workload(32 * SEQ, SEQ)
    system = parse_system("h100:8")
    assert _step(dense, plan, MEGATRON, system, work) == _step(
        dense, plan, _without_sync(MEGATRON), system, work
    )
    for name in ("maxtext", "torchtitan", "ideal"):
        assert load_framework(name).expert_parallel.host_sync_s == 0.0


def _megatron_raw() -> dict:
    with open(FRAMEWORK_DIR / "megatron.toml", "rb") as f:
        return tomllib.load(f)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"host_sync_s": -1e-4}, "0 to"),
        ({"host_sync_s": 1.0}, "0 to"),
        ({"host_sync_source": ""}, "host_sync_source names it"),
    ],
)
def test_bad_host_sync_is_refused(edit: dict, words: str):
    raw = _megatron_raw()
    raw["expert_parallel"].update(edit)
    with pytest.raises(SpecError, match=words):
        framework_from_dict(raw, "bad.toml")
