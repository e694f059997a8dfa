"""The pricing context (issue 21 item 2): the walk's questions to the stack and the cost model
answered once per (stack, profile, chip), with the answers the rules themselves give; a single
plan walked on floats costs exactly what the walk on arrays costs."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.core.collectives import CollectiveKind
from roofline.core.cost import ComputeModel
from roofline.core.pricing import pricing_context
from roofline.core.sharding import CHEAPEST, GemmShape
from roofline.core.stack import Stack, policy_for_op, stack_of
from roofline.core.walk import Totals, WalkOptions, ledger_for, walk_rows
from roofline.specs.efficiency import load_profile
from roofline.specs.framework import OverlapClass
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import OpClass, Phase, RematKind, Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.training.step import (
    _distinct_rows,
    candidates_of,
    evaluate_plan,
    structure_of,
)

STACKS = ("ideal", "megatron", "maxtext", "torchtitan")


@pytest.fixture(scope="module")
def chip():
    return parse_system("h100:64").chip


def test_one_context_per_stack_profile_chip(chip):
    eff = load_profile("fitted")
    st = stack_of("megatron")
    ctx = pricing_context(st, eff, chip)
    assert pricing_context(st, eff, chip) is ctx
    assert pricing_context(stack_of("maxtext"), eff, chip) is not ctx
    assert pricing_context(st, load_profile("datasheet"), chip) is not ctx


@pytest.mark.parametrize("name", STACKS)
def test_answers_are_the_rules(name, chip):
    """Every remembered answer equals what the stack / cost model says when asked directly."""
    st = stack_of(name)
    eff = load_profile("fitted").for_framework(st.name)
    ctx = pricing_context(st, eff, chip)
    led = ledger_for(load_model("mixtral-8x7b"), Phase.TRAIN, 4096, training_rows=not st.book)
    for op in led.ops:
        for _ in range(2):  # first computed, then remembered
            assert ctx.rerun_by(op) == st.rerun_by(op)
            assert ctx.policy(st.policy, op.name) is policy_for_op(st.policy, op.name)
            assert ctx.policy(CHEAPEST, op.name) is policy_for_op(CHEAPEST, op.name)
    every = frozenset(RematKind)
    for cls in OverlapClass:
        for kind in CollectiveKind:
            want = frozenset(k for k in every if st.reruns_collective(k, cls, kind))
            assert ctx.rerun_collective(every, cls, kind) == want
    for backward in (False, True):
        assert ctx.attention_speed(backward) == st.attention_speed(chip, backward)


def test_rates_are_the_cost_model(chip):
    eff = load_profile("fitted")
    ctx = pricing_context(stack_of("megatron"), eff, chip)
    cm = ComputeModel(chip, eff)
    for shape in (GemmShape(4096.0, 8192.0, 8192.0), GemmShape(16.0, 1024.0, 7168.0, 8.0)):
        for cls in (OpClass.DENSE_GEMM, OpClass.EXPERT_GEMM):
            want = cm.flops_per_s(cls, "bf16", shape)
            assert ctx.gemm_flops_per_s(cls, "bf16", shape) == want
            assert ctx.gemm_flops_per_s(cls, "bf16", shape) == want  # remembered
    arrays = GemmShape(np.array([16.0, 4096.0]), np.array([1024.0, 8192.0]), 8192.0)
    np.testing.assert_array_equal(
        ctx.gemm_flops_per_s(OpClass.DENSE_GEMM, "bf16", arrays),
        cm.flops_per_s(OpClass.DENSE_GEMM, "bf16", arrays),
    )
    assert ctx.matmul_peak("fp8") == cm.matmul_flops_per_s("fp8")
    assert ctx.vector_flops_per_s("bf16") == cm.vector_flops_per_s("bf16")
    assert ctx.attention_flops_per_s("bf16", True, 128.0) == cm.attention_flops_per_s(
        "bf16", True, 128.0
    )


@pytest.mark.parametrize(
    "model, system, plan, fw",
    [
        ("llama-3-70b", "tpu-v5p:16x16x16", "fsdp=1024,tp=4", "maxtext"),
        ("mixtral-8x7b", "h100:64", "dp=2,fsdp=4,tp=2,ep=4,microbatch=2,remat=full", "megatron"),
        ("llama-3-8b", "h100:64", "dp=8,tp=2,pp=4,microbatch=8", "torchtitan"),
        ("llama-3-8b", "a100:64", "fsdp=16,tp=4,remat=matmuls", "ideal"),
    ],
)
def test_floats_walk_is_the_array_walk(model, system, plan, fw):
    """A single plan's walk on Python floats sums to the same totals as on 1-element arrays."""
    m, sysm, p = load_model(model), parse_system(system), parse_plan(plan)
    st = stack_of(fw)
    eff = load_profile("fitted").for_framework(st.name)
    work = Workload(2**20, 4096)
    rows, _ = _distinct_rows(candidates_of(p))
    led = ledger_for(m, Phase.TRAIN, 4096, training_rows=not st.book)
    totals = []
    for floats in (False, True):
        opts = WalkOptions(policy=st.policy, stack=st, floats=floats, remats=(p.remat,))
        w = walk_rows(m, [sysm], structure_of(p, m), rows, work.sequences, led, eff, options=opts)
        totals.append(Totals.of(w))
    arrays, floats_ = totals
    for field in ("compute_s", "flops", "comm_s", "reusable_s", "compute_class_s"):
        a, b = getattr(arrays, field), getattr(floats_, field)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-12, err_msg=f"{field} {k}")
    np.testing.assert_allclose(floats_.edge_s, arrays.edge_s, rtol=1e-12)


def test_second_plan_asks_the_stack_nothing(monkeypatch):
    """Once a (stack, profile, chip) has been walked, costing a plan on it does not call back up
    into the stack's remat rules: the context answers."""
    m, sysm = load_model("llama-3-70b"), parse_system("tpu-v5p:16x16x16")
    work = Workload(4 * 2**20, 4096)
    evaluate_plan(m, sysm, work, parse_plan("fsdp=1024,tp=4"), framework="maxtext")
    calls = []
    orig = Stack.rerun_by
    monkeypatch.setattr(Stack, "rerun_by", lambda self, op: calls.append(op.name) or orig(self, op))
    evaluate_plan(m, sysm, work, parse_plan("fsdp=512,tp=8"), framework="maxtext")
    assert calls == []
