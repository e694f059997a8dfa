"""The routed experts' output bias (gpt-oss) as Megatron-Core 0.17 adds it: eager torch ops after
the grouped down projection (experts.py _apply_bias: per expert t + b·p in fp32, torch.cat,
.to(bf16)), four memory passes over the routed rows, 28 bytes per element forward
(ledger.moe_bias_rows); a stack without the flag, or a model without expert biases, pays none."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from roofline.core.ledger import MOE_BIAS_ROWS
from roofline.errors import SpecError
from roofline.specs.framework import FRAMEWORK_DIR, framework_from_dict, load_framework
from roofline.specs.hf import load_hf_config
from roofline.specs.model import ModelSpec, MoESpec
from roofline.specs.plan import Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.training.step import evaluate_plan
from roofline.validate.dims import build_model

MEGATRON = load_framework("megatron")
HF = Path(__file__).parent / "data" / "hf"


def _model(bias: bool) -> ModelSpec:
    return ModelSpec(
        name="biased-moe-test", n_layers=4, d_model=2048, d_ff=1024, n_heads=16, n_kv_heads=4,
        d_head=128, vocab=32768,
        moe=MoESpec(n_experts=32, top_k=4, d_ff_expert=1024, expert_bias=bias),
    )  # fmt: skip


def _walk(model, fw=MEGATRON):
    from roofline.core.stack import stack_of
    from roofline.training.step import _evaluate_one, training_profile

    eff = training_profile(None).for_framework("megatron")
    return _evaluate_one(
        model, parse_system("h100:8"), Workload(8 * 4096.0, 4096),
        parse_plan("ep=8,microbatch=1,remat=none"), eff, keep=True, fw=stack_of(fw),
    ).walk  # fmt: skip


def _step(model):
    return evaluate_plan(
        model, parse_system("h100:8"), Workload(8 * 4096.0, 4096),
        parse_plan("ep=8,microbatch=1,remat=none"), framework=MEGATRON,
    ).step_time_s  # fmt: skip


def test_megatron_pays_four_passes_over_the_routed_rows():
    from roofline.core.walk import Pass

    c = _walk(_model(True))
    rows = [r for r in c.ops if r.op in MOE_BIAS_ROWS]
    fwd = [r for r in rows if r.pass_ == Pass.FORWARD]
    assert {r.op for r in fwd} == set(MOE_BIAS_ROWS)
    # per chip: 4096 tokens x top_k 4 routed rows arrive (balanced), D = 2048 each
    elems = 4096 * 4 * 2048
    got = sum(float(r.hbm_bytes) for r in fwd)
    small = 32 / 8 * 2048 * 2 + 4096 * 4 * 4  # the bias rows read and the router weights
    assert got == pytest.approx(28 * elems + small, rel=1e-9)
    assert len(rows) == 2 * len(fwd)  # the backward priced like the forward
    plain = _walk(_model(False))
    assert not [r for r in plain.ops if r.op in MOE_BIAS_ROWS]
    assert _step(_model(True)) > _step(_model(False))


def test_a_stack_without_eager_bias_pays_none():
    ep = dataclasses.replace(MEGATRON.expert_parallel, eager_expert_bias=False)
    fused = dataclasses.replace(MEGATRON, expert_parallel=ep)
    c = _walk(_model(True), fw=fused)
    assert not [r for r in c.ops if r.op in MOE_BIAS_ROWS]


def test_the_flag_needs_its_source():
    raw = tomllib.loads((FRAMEWORK_DIR / "megatron.toml").read_text())
    raw["expert_parallel"].pop("eager_expert_bias_source")
    with pytest.raises(SpecError, match="eager_expert_bias"):
        framework_from_dict(raw, "megatron-test")


def test_gpt_oss_experts_carry_biases():
    assert load_hf_config(HF / "gpt-oss-120b.json").moe.expert_bias
    assert not load_hf_config(HF / "qwen3-30b-a3b.json").moe.expert_bias
    entry = {
        "name": "gpt-oss-120b", "layers": 36, "d_model": 2880, "heads": 64, "kv_heads": 8,
        "head_dim": 64, "vocab": 201088, "moe": {"experts": 128, "top_k": 4, "moe_d_ff": 2880},
    }  # fmt: skip
    b = build_model(entry, "x")
    assert b.spec.moe.expert_bias and any("expert biases" in d for d in b.defaults)
    off = build_model({**entry, "moe": {**entry["moe"], "expert_bias": False}}, "x")
    assert not off.spec.moe.expert_bias
    q = build_model({**entry, "name": "Qwen3-30B-A3B"}, "x")
    assert not q.spec.moe.expert_bias
