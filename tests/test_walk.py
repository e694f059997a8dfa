"""The walk: one application of the algebra to every ledger row, read by every consumer.

Checked three ways: closed forms (on one chip the walk's per-chip FLOPs and bytes are the
ledger's own), the records against the training step they feed (sums by field), and the
hooks the next features plug into (phases, overlap classes, the option policy).
"""

from __future__ import annotations

import numpy as np
import pytest

from roofline.core.ledger import build_ledger
from roofline.core.rules import Structure, rules_of
from roofline.core.sharding import CHEAPEST, Prefer, gathers_only_weights
from roofline.core.walk import (
    AlgebraPricing,
    Overlap,
    Pass,
    Totals,
    WalkOptions,
    ledger_for,
    walk_ledger,
)
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import OpClass, Phase
from roofline.specs.system import parse_system
from roofline.training.step import Workload, evaluate_plan, parse_plan, step_terms

MODEL = load_model("llama-3-8b")
ONE_CHIP = {"data": 1.0, "fsdp": 1.0, "tensor": 1.0, "seq": 1.0, "expert": 1.0, "stage": 1.0}
FREE = AlgebraPricing(lambda kind, b, axes: 0.0 * np.asarray(b, float), None, 1.0, 1.0)


def _one_chip(model, phase: Phase, batch: float, seq: int, kv_seq: int | None = None):
    led = ledger_for(model, phase, seq, kv_seq)
    rules = rules_of(Structure(frozenset()), model)
    return walk_ledger(model, led, rules, ONE_CHIP, np.array([batch]), phase=phase, pricing=FREE)


def _f(x) -> float:
    return float(np.asarray(x, float).reshape(-1)[0])


def _per_chip(walk, field: str, passes=(Pass.FORWARD,)) -> float:
    return float(
        sum(np.asarray(r.copies * getattr(r, field)).sum() for r in walk.ops if r.pass_ in passes)
    )


@pytest.mark.parametrize("model_name", ["llama-3-8b", "mixtral-8x7b", "deepseek-v3"])
def test_decode_step_on_one_chip_is_the_ledgers(model_name):
    """A decode step (B sequences, one new token each, KV cache of S) on one chip: the walk's
    FLOPs and HBM bytes are exactly the forward ledger's at batch B, seq 1, kv_seq S."""
    m = load_model(model_name)
    B, S = 32, 8192
    w = _one_chip(m, Phase.DECODE, B, 1, S)
    led = build_ledger(m, batch=B, seq=1, kv_seq=S)
    assert {r.pass_ for r in w.ops} == {Pass.FORWARD} and w.memory is None
    assert _per_chip(w, "flops_per_chip") == pytest.approx(led.flops, rel=1e-12)
    assert _per_chip(w, "hbm_bytes_per_chip") == pytest.approx(led.bytes, rel=1e-12)
    # the KV cache is read: attention bytes grow with S
    w2 = _one_chip(m, Phase.DECODE, B, 1, 2 * S)
    assert _per_chip(w2, "hbm_bytes_per_chip") > _per_chip(w, "hbm_bytes_per_chip")


def test_prefill_and_train_forward_on_one_chip_are_the_ledgers():
    B, T = 4, 2048
    led = build_ledger(MODEL, batch=B, seq=T)
    pre = _one_chip(MODEL, Phase.PREFILL, B, T)
    train = _one_chip(MODEL, Phase.TRAIN, B, T)
    assert _per_chip(pre, "flops_per_chip") == pytest.approx(led.flops, rel=1e-12)
    assert _per_chip(train, "flops_per_chip") == pytest.approx(led.flops, rel=1e-12)
    # the backward passes: two contractions per matmul and attention row, one per elementwise row
    back = _per_chip(train, "flops_per_chip", (Pass.D_LHS, Pass.D_RHS))
    assert back == pytest.approx(led.backward_flops, rel=1e-12)


def test_every_matmul_record_has_its_gemm_shape_and_class():
    w = _one_chip(MODEL, Phase.TRAIN, 2, 512)
    mm = [r for r in w.ops if r.op_class == OpClass.DENSE_GEMM]
    assert mm and all(r.dtype == "bf16" for r in mm)
    for r in mm:
        g = r.gemm()
        assert g is not None
        gemm_flops = 2 * _f(g.m) * _f(g.n) * _f(g.k) * _f(g.count)
        assert gemm_flops == pytest.approx(_f(r.flops_per_chip), rel=1e-12)
    q = next(r for r in mm if r.op == "attn/q" and r.pass_ == Pass.FORWARD).gemm()
    # x[B·T, D] · W_q[D, N·H]: m = tokens, k = d_model (the heads and head_dim are n)
    assert (_f(q.m), _f(q.k), _f(q.n)) == (2 * 512, MODEL.d_model, MODEL.n_heads * MODEL.d_head)
    classes = {r.op_class for r in _one_chip(load_model("mixtral-8x7b"), Phase.TRAIN, 1, 64).ops}
    assert OpClass.EXPERT_GEMM in classes and OpClass.ATTENTION in classes


def test_totals_feed_the_step_terms():
    """The timeline reads the walk's sums: its forward math time is the walk's forward FLOPs."""
    s, w, p = parse_system("h100:8"), Workload(2**16, 4096), parse_plan("fsdp=8,remat=full")
    t = step_terms(MODEL, s, w, p)
    from roofline.training.step import candidates_of, evaluate_plans, structure_of

    r = evaluate_plans(
        MODEL, s, w, structure_of(p, MODEL), candidates_of(p), keep_einsums=True, plan=p
    )
    tot = Totals.of(r.walk)
    fwd = sum(float(np.asarray(v).sum()) for (f, _), v in tot.flops.items() if f)
    peak = s.chip.peak("bf16")
    assert t["t_math_forward_s"] == pytest.approx(fwd * p.microbatches / peak, rel=1e-12)


def test_sequence_and_expert_traffic_have_their_own_classes():
    s = parse_system("h100:64")
    sp = evaluate_plan(MODEL, s, Workload(2**21, 4096), parse_plan("fsdp=16,sp=4,remat=none"))
    assert sp.comm_time_s["sp"] > 0 and "act" not in sp.comm_time_s
    moe = load_model("mixtral-8x7b")
    ep = evaluate_plan(moe, s, Workload(2**21, 4096), parse_plan("ep=8,fsdp=8,remat=full"))
    classes = {c["overlap"] for c in ep.collectives}
    assert {Overlap.EXPERT.value, Overlap.WEIGHT_GATHER.value} <= classes
    assert all(
        c["overlap"] == "ep" for c in ep.collectives if c["einsum"] in ("dispatch", "combine")
    )


def test_option_policy_that_gathers_weights_changes_the_choice_and_the_cost():
    """Eight sequences of 64 tokens over fsdp=8: the cheapest options gather activations; a
    policy that makes FSDP gather its weights (what FSDP stacks do) picks other options, and
    the step costs what those options cost."""
    m, s = load_model("llama-3-8b"), parse_system("h100:8")
    w, p = Workload(8 * 64, 64), parse_plan("fsdp=8,remat=full")
    cheap = evaluate_plan(m, s, w, p, policy=CHEAPEST)
    forced = evaluate_plan(m, s, w, p, policy=Prefer("fsdp-gathers-weights", gathers_only_weights))

    def gathered(c):
        return {x["tensor"] for x in c.collectives if x["kind"] == "all-gather"}

    assert any(not t.startswith("W") for t in gathered(cheap))
    assert all(t.startswith("W") for t in gathered(forced))
    assert forced.step_time_s > cheap.step_time_s
    assert evaluate_plan(m, s, w, p).step_time_s == cheap.step_time_s  # the default is CHEAPEST


def test_walk_options_choose_compute_dtypes():
    p = parse_plan("fsdp=8,matmul_dtype=fp8")
    assert p.dtypes.matmul.value == "fp8" and "matmul_dtype=fp8" in p.describe()
    assert parse_plan(p.describe()).dtypes == p.dtypes
    s, w = parse_system("h100:8"), Workload(2**16, 4096)
    fp8 = evaluate_plan(MODEL, s, w, p)
    bf16 = evaluate_plan(MODEL, s, w, parse_plan("fsdp=8"))
    assert fp8.compute_time_s < bf16.compute_time_s
    opts = WalkOptions(dtypes=p.dtypes)
    assert opts.dtypes.of(OpClass.DENSE_GEMM).value == "fp8"


def test_the_planner_searches_with_the_option_policy():
    """A policy that restricts the options can only make the best plan slower or equal, and
    the planner reports the cost of the options the policy chose."""
    from roofline.training.planner import plan_training

    m, s, w = load_model("llama-3-8b"), parse_system("h100:8"), Workload(8 * 64, 64)
    free = plan_training(m, s, w, top_k=1)
    pol = Prefer("fsdp-gathers-weights", gathers_only_weights)
    forced = plan_training(m, s, w, top_k=1, policy=pol)
    assert forced.best.step_time_s >= free.best.step_time_s * (1 - 1e-12)
    again = evaluate_plan(m, forced.best.system, w, forced.best.plan, policy=pol)
    assert again.step_time_s == pytest.approx(forced.best.step_time_s, rel=1e-12)


def test_routed_expert_weights_are_read_only_for_the_chosen_experts():
    """A decode step of one token reads top_k of E experts' weights (the ledger's fraction),
    and a large batch reads them all: the walk prices the weight's HBM bytes with it."""
    m = load_model("mixtral-8x7b")
    one = _one_chip(m, Phase.DECODE, 1, 1, 1024)
    up = next(r for r in one.ops if r.op == "moe/up")
    led = build_ledger(m, batch=1, seq=1, kv_seq=1024)
    op = next(o for o in led if o.name == "moe/up")
    assert _f(up.hbm_bytes_per_chip) == pytest.approx(op.bytes / op.count, rel=1e-12)
    w_bytes = op.weight.nbytes(op.sizes)
    # one token reads k/E of the weight (2 of 8 experts for Mixtral)
    assert op.weight_read_fraction == pytest.approx(m.moe.top_k / m.moe.n_experts)
    big = _one_chip(m, Phase.DECODE, 4096, 1, 1024)
    up_big = next(r for r in big.ops if r.op == "moe/up")
    assert _f(up_big.hbm_bytes_per_chip) - _f(up.hbm_bytes_per_chip) > 0.7 * w_bytes


def test_every_kernel_launch_pays_the_profiles_fixed_time():
    """A physics profile's kernel_overhead_s is added once per op per pass (a grouped expert
    GEMM is one launch), compute- or memory-bound; a constant profile adds nothing."""
    from roofline.core.rules import Strategy
    from roofline.core.walk import MeshRows, walk_rows
    from roofline.specs.efficiency import PEAK, load_profile

    ds = load_profile("datasheet")
    sysm = parse_system("h100:8")
    launch = ds.kernel_overhead_s(sysm.chip)
    assert launch > 0
    led = ledger_for(MODEL, Phase.TRAIN, 1024)
    rows = MeshRows(np.array([0]), {s: np.array([1]) for s in Strategy}, np.array([1]))
    w = walk_rows(MODEL, [sysm], Structure(frozenset()), rows, 1.0, led, ds)
    for r in w.ops:
        assert _f(r.time_s) == pytest.approx(max(_f(r.compute_s), _f(r.memory_s)) + launch)
    w0 = walk_rows(MODEL, [sysm], Structure(frozenset()), rows, 1.0, led, PEAK)
    assert all(_f(r.time_s) == max(_f(r.compute_s), _f(r.memory_s)) for r in w0.ops)


def test_low_precision_gemms_pay_their_activation_casts():
    """Megatron fp8 training on one chip: every fp8 GEMM's activation operand is cast
    (Transformer Engine cast-transpose): the input x forward and the output gradient dy
    backward, each read in bf16 and written in fp8 twice (row- and column-wise), 2 + 2·1
    bytes per element. Inputs the fused norm already quantised (q/k/v, the dense MLP's fc1)
    and the gate's x (shared with up) are not cast again. bf16 and the idealised machine pay
    none; the casts make the step slower, relatively more for narrow (small-expert) GEMMs."""
    from roofline.core.stack import stack_of
    from roofline.training.step import _evaluate_one, training_profile

    m = load_model("llama-3-8b")
    s, w = parse_system("h100:1"), Workload(4096.0, 4096)
    eff = training_profile(None).for_framework("megatron")

    def walk_of(plan, fw="megatron"):
        p = parse_plan(plan)
        return _evaluate_one(m, s, w, p, eff, keep=True, fw=stack_of(fw)).walk

    fp8 = walk_of("dp=1,remat=none,matmul_dtype=fp8,experts_dtype=fp8")
    casts = {(r.op, r.pass_): _f(r.hbm_bytes) for r in fp8.ops if r.op.endswith("/quantise")}
    T, D, F, L = 4096, m.d_model, m.d_ff, m.n_layers
    H = m.n_heads * m.d_head
    want = {
        ("attn/out/quantise", Pass.FORWARD): 4 * T * H,  # x of the output projection
        ("attn/out/quantise", Pass.D_LHS): 4 * T * D,  # its dy
        ("mlp/down/quantise", Pass.FORWARD): 4 * T * F,
        ("mlp/down/quantise", Pass.D_LHS): 4 * T * D,
        ("mlp/up/quantise", Pass.D_LHS): 4 * T * F,
        ("mlp/gate/quantise", Pass.D_LHS): 4 * T * F,
        ("attn/q/quantise", Pass.D_LHS): 4 * T * H,
        ("attn/k/quantise", Pass.D_LHS): 4 * T * m.n_kv_heads * m.d_head,
        ("attn/v/quantise", Pass.D_LHS): 4 * T * m.n_kv_heads * m.d_head,
    }
    assert casts == pytest.approx(want, rel=1e-12)
    copies = {r.op: _f(r.copies) for r in fp8.ops if r.op.endswith("/quantise")}
    assert set(copies.values()) == {float(L)}
    bf16 = walk_of("dp=1,remat=none")
    ideal = walk_of("dp=1,remat=none,matmul_dtype=fp8,experts_dtype=fp8", fw="ideal")
    assert not [r for r in (*bf16.ops, *ideal.ops) if r.op.endswith("/quantise")]
    # direction: the casts cost time, and relatively more as the GEMM narrows: per FLOP of
    # the down projection (x [T, F] -> [T, D]) they move 4T(F + D) bytes for 6TFD FLOPs
    t_cast = sum(_f(r.time_s) * _f(r.copies) for r in fp8.ops if r.op.endswith("/quantise"))
    assert t_cast > 0

    def down_bytes_per_flop(model):
        wk = _evaluate_one(model, s, w, parse_plan("dp=1,remat=none,matmul_dtype=fp8"), eff,
                           keep=True, fw=stack_of("megatron")).walk  # fmt: skip
        by = sum(_f(r.hbm_bytes) for r in wk.ops if r.op == "mlp/down/quantise")
        fl = sum(_f(r.flops_per_chip) for r in wk.ops if r.op == "mlp/down")
        return by / fl, model.d_ff, model.d_model

    for model in (m, m.with_(d_ff=768)):
        got, f_, d_ = down_bytes_per_flop(model)
        assert got == pytest.approx(4 * (f_ + d_) / (6 * f_ * d_), rel=1e-12)
    assert down_bytes_per_flop(m.with_(d_ff=768))[0] > 4 * down_bytes_per_flop(m)[0]


def test_mxfp8_casts_follow_the_norm_write_their_scales_and_launch_per_expert():
    """Transformer Engine's MXFP8 casts (core.walk.quantise): the norm does not fuse the cast
    (normalization.cpp runs MXFP8 UNFUSED), so the input of q/k/v (one fused linear_qkv) and of
    the dense MLP's fc1 (gate and up) is cast once each; every cast writes one 1-byte E8M0
    scale per 32 elements per layout, 2 + 2·(1 + 1/32) bytes per element; a grouped expert
    GEMM's operand is cast expert by expert (cast.cpp: only delayed scaling has a fused
    multi-tensor cast), one launch per local expert. Delayed scaling (the default, and what
    `scaling=delayed` reads as) keeps the fused casts and one launch."""
    from roofline.core.stack import stack_of
    from roofline.specs.plan import ComputeDtypes
    from roofline.training.step import _evaluate_one, training_profile

    eff = training_profile(None).for_framework("megatron")

    def walk_of(model, system, plan, tokens):
        p = parse_plan(plan)
        w = Workload(float(tokens), 4096)
        return _evaluate_one(model, parse_system(system), w, p, eff, keep=True,
                             fw=stack_of("megatron")).walk  # fmt: skip

    m = load_model("llama-3-8b")
    T, D = 4096, m.d_model
    mx = walk_of(m, "b200:1", "dp=1,remat=none,matmul_dtype=fp8,expert_dtype=fp8,scaling=mx", T)
    dl = walk_of(m, "b200:1", "dp=1,remat=none,matmul_dtype=fp8,expert_dtype=fp8", T)
    fwd = {
        r.op: _f(r.hbm_bytes)
        for r in mx.ops
        if r.op.endswith("/quantise") and r.pass_ == Pass.FORWARD
    }
    per_elem = 2 + 2 * (1 + 1 / 32)
    assert fwd["attn/q/quantise"] == pytest.approx(per_elem * T * D, rel=1e-12)
    assert fwd["mlp/up/quantise"] == pytest.approx(per_elem * T * D, rel=1e-12)
    assert "attn/k/quantise" not in fwd and "mlp/gate/quantise" not in fwd
    fwd_dl = {r.op for r in dl.ops if r.op.endswith("/quantise") and r.pass_ == Pass.FORWARD}
    assert fwd_dl == {"attn/out/quantise", "mlp/down/quantise"}  # the norm fused the others
    dy = {
        r.op: _f(r.hbm_bytes)
        for r in mx.ops
        if r.op == "mlp/down/quantise" and r.pass_ == Pass.D_LHS
    }
    assert dy["mlp/down/quantise"] == pytest.approx(per_elem * T * D, rel=1e-12)
    assert parse_plan("dp=1,matmul_dtype=fp8,scaling=delayed").dtypes == ComputeDtypes(matmul="fp8")
    assert (
        parse_plan(parse_plan("dp=1,matmul_dtype=fp8,scaling=mx").describe()).dtypes.scaling == "mx"
    )

    q = load_model("tests/data/hf/qwen3-30b-a3b.json")
    launch = eff.kernel_overhead_s(parse_system("b200:8").chip)
    assert launch > 0
    plan = "ep=8,microbatch=1,remat=none,matmul_dtype=fp8,expert_dtype=fp8"
    for scaling, n in (("", 1.0), (",scaling=mx", q.moe.n_experts / 8)):
        wk = walk_of(q, "b200:8", plan + scaling, 8 * 4096)
        got = {
            (r.op, r.pass_): _f(r.launch_s)
            for r in wk.ops
            if r.op.startswith("moe/") and r.op.endswith("/quantise")
        }
        assert got and list(got.values()) == pytest.approx([n * launch] * len(got), rel=1e-12)
        dense = [_f(r.launch_s) for r in wk.ops if r.op == "attn/out/quantise"]
        assert dense == [pytest.approx(launch, rel=1e-12)] * 2  # one launch: not grouped
