"""A single plan's walk repriced under a new profile (issue 21: calibrate's fit evaluates each
run under a new profile per parameter vector) equals a fresh walk under that profile, to the
last bit: the records, their einsum plans and the step's whole answer. A profile whose matmul
rate flips an option choice walks again (and agrees with a fresh walk too); a profile that
differs in a number the repricing does not redo (a link fraction) is never repriced."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest

from roofline.calibrate import scales
from roofline.core import walk as walk_mod
from roofline.core.cost import ComputeModel
from roofline.core.pricing import PricingContext
from roofline.core.sharding import GemmShape
from roofline.core.stack import resolve_framework, stack_of
from roofline.specs.efficiency import Efficiency, load_profile
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import OpClass, Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.training import step as step_mod
from roofline.training.step import evaluate_plan

CASES = [
    ("llama-3-70b", "tpu-v5p:16x16x16", "fsdp=1024,tp=4", "auto", "bf16"),
    ("llama-3-8b", "h100:64", "dp=8,tp=8,remat=full", "megatron", "bf16"),
    ("gpt-3-175b", "a100:1024", "dp=8,tp=8,pp=16,microbatch=8", "megatron", "bf16"),
    ("mixtral-8x7b", "h100:256", "fsdp=32,ep=8", "torchtitan", "bf16"),
    ("llama-3-70b", "h100:256", "dp=4,tp=8,pp=8,microbatch=8", "megatron", "fp8"),
    ("llama-3-8b", "tpu-v5e:16x16", "fsdp=64,tp=4,sp=1", "maxtext", "bf16"),
]

# calibrate's moves (`calibrate.scales.apply`): the GEMM, low-precision and attention factors
MOVES = [
    {"gemm_scale": 0.7},
    {"gemm_scale": 1.2, "attn_scale": 0.8},
    {"attn_scale": 1.1},
    {"lowp_scale": 0.6, "gemm_scale": 0.95},
]


def _forget() -> None:
    """Every memo a single plan's costing keeps (the walk's and the timeline's)."""
    for memo in (
        walk_mod._ONE_WALKS,
        walk_mod._ONE_TOTALS,
        walk_mod._TEMPLATES,
        walk_mod._COMM_SUMS,
        step_mod._SUMS,
        step_mod._COMM_SUMS,
        step_mod._COLL_ROWS,
        step_mod._MODES,
        step_mod._MEMORY,
    ):
        memo.clear()


@functools.cache
def _system(name: str):  # one object per name: the memos are keyed on the objects a caller holds
    return parse_system(name)


def _cost(case, eff: Efficiency):
    model, system, plan, fw, dtype = case
    s = _system(system)
    stack = _stack(resolve_framework(fw, s.chip))
    p = parse_plan(plan)
    if dtype != "bf16":  # as `roofline train --precision fp8` does
        p = replace(p, dtypes=stack.dtypes(dtype))
    w = Workload(4 * 2**20, 4096)
    return evaluate_plan(load_model(model), s, w, p, framework=stack, efficiency=eff)


@functools.cache
def _stack(name: str):
    return stack_of(name)


class _Spy:
    """Counts the walks `_one_walk` repriced, and those it walked because a choice moved."""

    def __init__(self, monkeypatch) -> None:
        self.repriced = self.refused = 0
        real = walk_mod._reprice

        def spy(*args):
            out = real(*args)
            if out is None:
                self.refused += 1
            else:
                self.repriced += 1
            return out

        monkeypatch.setattr(walk_mod, "_reprice", spy)


def _walk_of(case, eff: Efficiency, monkeypatch) -> walk_mod.Walk:
    """The single-plan walk `evaluate_plan` reads for `case` under `eff`."""
    seen = []
    real = walk_mod._one_walk

    def keep(*args):
        seen.append(real(*args))
        return seen[-1]

    with monkeypatch.context() as m:
        m.setattr(walk_mod, "_one_walk", keep)
        walk_mod._ONE_WALKS.clear()
        walk_mod._ONE_TOTALS.clear()
        _cost(case, eff)
    (walk,) = seen
    return walk


def _same_walk(a: walk_mod.Walk, b: walk_mod.Walk) -> None:
    assert a.ops == b.ops  # every field but the einsum plan (compare=False) ...
    for x, y in zip(a.ops, b.ops, strict=True):
        assert type(x.compute_s) is type(y.compute_s)
        if x.einsum is not None:  # ... and the plan's numbers
            assert x.einsum.choice == y.einsum.choice
            assert x.einsum.compute_time_s == y.einsum.compute_time_s
            assert x.einsum.memory_time_s == y.einsum.memory_time_s
    assert a.collectives == b.collectives
    assert a.memory == b.memory


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[4]}")
def test_repriced_walk_is_a_fresh_walk(case, monkeypatch):
    base = load_profile("fitted")
    fw = case[3] if case[3] != "auto" else None
    spy = _Spy(monkeypatch)
    for move in MOVES:
        eff = scales.apply(base, move).for_framework(fw)
        _forget()
        _cost(case, base.for_framework(fw))  # the template
        walk = _walk_of(case, eff, monkeypatch)
        repriced = _cost(case, eff).to_dict()
        _forget()
        _same_walk(_walk_of(case, eff, monkeypatch), walk)
        assert _cost(case, eff).to_dict() == repriced
    assert spy.repriced == len(MOVES) and spy.refused == 0


def _fraction(eff: Efficiency, chip, value: float) -> Efficiency:
    fam = eff.family_for(chip)
    return eff.with_family(fam.with_params({f"mm_fraction.{d}": value for d in fam.mm_fraction}))


def _choices() -> list:
    """The option each einsum plan of the kept template chose (before any re-plan)."""
    ((_, (_, tape)),) = walk_mod._TEMPLATES._entries.values()
    return [ep.choice for ep, _, _ in tape.plans.values()]


def test_a_choice_the_matmul_rate_flips_walks_again(monkeypatch):
    """LLaMA-3 70B, fsdp=8 x tp=8 on 64 H100 (the idealised stack): between GEMM fractions 0.2
    and 0.3 of the datasheet's an einsum's cheapest option changes."""
    case = ("llama-3-70b", "h100:64", "fsdp=8,tp=8", "ideal", "bf16")
    base = load_profile("fitted")
    chip = _system(case[1]).chip
    lo, hi, near = (_fraction(base, chip, x) for x in (0.2, 0.3, 0.31))
    spy = _Spy(monkeypatch)
    _forget()
    _walk_of(case, lo, monkeypatch)
    low = _choices()
    walked = _walk_of(case, hi, monkeypatch)
    assert spy.refused == 1 and spy.repriced == 0  # the choice moved: walked again
    assert _choices() != low
    _forget()
    _same_walk(_walk_of(case, hi, monkeypatch), walked)
    # the walk that moved it is the template now: a nearby rate reprices from it
    _forget()
    _walk_of(case, lo, monkeypatch)
    _walk_of(case, hi, monkeypatch)
    repriced = _walk_of(case, near, monkeypatch)
    assert spy.refused == 2 and spy.repriced == 1
    _forget()
    _same_walk(_walk_of(case, near, monkeypatch), repriced)


def test_attention_moves_reuse_the_gemm_side(monkeypatch):
    """Calibrate's attention column at fixed GEMM fractions: the GEMM and vector records are
    read back (`_Tape.at_gemm`), the attention records priced again; a fresh walk agrees."""
    case = CASES[1]
    base = load_profile("fitted").for_framework(case[3])
    g = scales.apply(base, {"gemm_scale": 0.9})
    moves = [scales.apply(base, {"gemm_scale": 0.9, "attn_scale": a}) for a in (0.7, 1.2)]
    _forget()
    _cost(case, base)
    _cost(case, g)
    ((_, (_, tape)),) = walk_mod._TEMPLATES._entries.values()
    assert len(tape.at_gemm) == 1
    got = [_walk_of(case, e, monkeypatch) for e in moves]
    assert len(tape.at_gemm) == 1  # the same GEMM fractions: the same records read back
    for e, walk in zip(moves, got, strict=True):
        _forget()
        _same_walk(_walk_of(case, e, monkeypatch), walk)


def test_a_profile_with_the_same_numbers_walks_once():
    """The walk memo reads a profile's numbers, not its identity: calibrate's per-layer and
    per-step overhead columns (numbers the walk does not read) walk nothing."""
    case = CASES[1]
    base = load_profile("fitted").for_framework(case[3])
    _forget()
    a = _cost(case, base)
    b = _cost(case, replace(base, layer_overhead_s=base.layer_overhead_s + 1e-4))
    assert len(walk_mod._ONE_WALKS) == 1 and len(walk_mod._TEMPLATES) == 1
    assert a.step_time_s != b.step_time_s  # the step still reads the overhead


def test_a_new_link_fraction_walks_again(monkeypatch):
    case = CASES[1]
    base = load_profile("fitted")
    chip = _system(case[1]).chip
    fam = base.family_for(chip)
    tier = sorted(fam.link)[0]
    other = base.with_family(fam.with_params({f"link.{tier}": fam.link[tier] * 0.9}))
    spy = _Spy(monkeypatch)
    _forget()
    _cost(case, base)
    _cost(case, other)
    assert spy.repriced == spy.refused == 0  # another template, not a repricing


def test_gemm_rates_on_arrays_are_the_rates_one_by_one():
    """`PricingContext.gemm_rates` evaluates the efficiency curve once on arrays; each rate is
    the one a call for its shape alone returns, to the last bit (dense and grouped, several
    families, small and large shapes)."""
    prof = load_profile("fitted")
    rng = np.random.default_rng(7)
    dims = [tuple(float(x) for x in row) for row in rng.integers(1, 70_000, size=(40, 3))]
    dims += [(8.0, 4096.0, 1024.0), (1.0, 1.0, 1.0), (3.0, 14336.0, 4096.0)]
    shapes = [GemmShape(m, n, k, 1.0) for m, n, k in dims]
    arrays = GemmShape(*(np.array(c, float) for c in zip(*dims, strict=True)), np.ones(len(dims)))
    for system in ("h100:8", "tpu-v5p:2x2x1", "a100:8", "b200:8"):
        chip = _system(system).chip
        ctx = PricingContext(_stack("ideal"), ComputeModel(chip, prof))
        for op_class in (OpClass.DENSE_GEMM, OpClass.EXPERT_GEMM):
            for dtype in ("bf16", "fp8") if "fp8" in chip.peak_flops_per_s else ("bf16",):
                want = [ctx.gemm_flops_per_s(op_class, dtype, s) for s in shapes]
                got = list(ctx.gemm_rates(op_class, dtype, arrays))
                assert [float(x) for x in got] == [float(x) for x in want]
                assert all(type(a) is type(b) for a, b in zip(got, want, strict=True))
