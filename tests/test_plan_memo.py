"""A single plan's walk is remembered (issue 21 item 3: one plan in under a millisecond):
the same plan on the same objects walks once, and its answer is the answer of a fresh walk to
the last bit; anything the walk reads that differs (profile, stack, plan, model) walks again."""

from __future__ import annotations

import functools

import pytest

from roofline.core import walk as walk_mod
from roofline.core.stack import resolve_framework
from roofline.specs.efficiency import load_profile
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.training.step import evaluate_plan

CASES = [
    ("llama-3-70b", "tpu-v5p:16x16x16", "fsdp=1024,tp=4", "auto"),
    ("llama-3-8b", "h100:64", "dp=8,tp=8,remat=full", "megatron"),
    ("gpt-3-175b", "a100:1024", "dp=8,tp=8,pp=16,microbatch=8", "megatron"),
    ("mixtral-8x7b", "h100:256", "fsdp=32,ep=8", "torchtitan"),
]


def _forget() -> None:
    walk_mod._ONE_WALKS.clear()
    walk_mod._ONE_TOTALS.clear()


@functools.cache
def _system(name: str):  # one object per name: the memo is keyed on the objects a caller holds
    return parse_system(name)


def _cost(model, system, plan, fw, **kw):
    s = _system(system)
    stack = resolve_framework(fw, s.chip)
    w = Workload(4 * 2**20, 4096)
    return evaluate_plan(load_model(model), s, w, parse_plan(plan), framework=stack, **kw)


@pytest.mark.parametrize("model, system, plan, fw", CASES)
def test_remembered_walk_is_a_fresh_walk(model, system, plan, fw):
    _forget()
    fresh = _cost(model, system, plan, fw).to_dict()
    n = len(walk_mod._ONE_WALKS)
    assert n == 1  # the plan's walk was remembered
    again = _cost(model, system, plan, fw).to_dict()
    assert len(walk_mod._ONE_WALKS) == n  # ... and read back, not walked again
    assert again == fresh
    _forget()
    assert _cost(model, system, plan, fw).to_dict() == fresh


def test_another_profile_walks_again():
    _forget()
    a = _cost(*CASES[1])
    b = _cost(*CASES[1], efficiency=load_profile("datasheet"))
    assert len(walk_mod._ONE_WALKS) == 2
    assert a.step_time_s != b.step_time_s
    _forget()
    assert _cost(*CASES[1], efficiency=load_profile("datasheet")).to_dict() == b.to_dict()


def test_another_system_object_walks_again():
    _forget()
    model, system, plan, fw = CASES[1]
    a = _cost(model, system, plan, fw)
    s = parse_system(system)  # equal, but another object: keyed by identity, walked again
    b = evaluate_plan(load_model(model), s, Workload(4 * 2**20, 4096), parse_plan(plan),
                      framework=resolve_framework(fw, s.chip))  # fmt: skip
    assert len(walk_mod._ONE_WALKS) == 2
    assert a.to_dict() == b.to_dict()


def test_another_plan_or_stack_walks_again():
    _forget()
    model, system, plan, _ = CASES[1]
    _cost(model, system, plan, "megatron")
    _cost(model, system, plan, "torchtitan")
    _cost(model, system, "dp=8,tp=8,remat=none", "megatron")
    _cost(model, system, "dp=8,tp=8,remat=full,microbatch=2", "megatron")
    assert len(walk_mod._ONE_WALKS) == 4


def test_memo_is_bounded(monkeypatch):
    _forget()
    monkeypatch.setattr(walk_mod, "_MAX_ONE_WALKS", 2)
    for plan in ("dp=8,tp=8", "dp=8,tp=8,microbatch=2", "dp=4,tp=8,pp=2,microbatch=4"):
        _cost("llama-3-8b", "h100:64", plan, "megatron")
    assert len(walk_mod._ONE_WALKS) <= 2
    assert len(walk_mod._ONE_TOTALS) <= 2


def test_each_cost_owns_its_collective_rows():
    _forget()
    a = _cost(*CASES[0])
    assert a.collectives  # the plan has collectives to list
    before = [dict(d, axes=list(d["axes"])) for d in a.collectives]
    a.collectives[0]["kind"] = "edited"
    a.collectives[0]["axes"].append("edited")
    b = _cost(*CASES[0])  # the remembered walk's rows, not a's edited ones
    assert list(b.collectives) == before


def _one_einsum(comm_s: float):
    """A TP-sharded matmul's einsum on floats, with every collective taking `comm_s`."""
    from roofline.core.sharding import Spec, plan_einsum

    x = Spec("x", ("B", "D"), ((), ("tensor",)))
    w = Spec("w", ("D", "F"), (("tensor",), ()))
    y = Spec("y", ("B", "F"), ((), ()))
    return plan_einsum(
        x, w, y, {"B": 4096.0, "D": 8192.0, "F": 28672.0}, {"tensor": 4.0},
        lambda kind, nbytes, axes: comm_s * nbytes,
        peak_flops_per_s=1e15, hbm_bw_bytes_per_s=2e12, trusted=True,
    )  # fmt: skip


def test_sized_options_remembered_by_their_numbers():
    """A single plan's sized options are built once per (shape, sizes, collective times): the
    same numbers give the same options, other collective times others, and the remembered
    options are the ones a fresh build gives."""
    from roofline.core import sharding

    sharding._OPTIONS.clear()
    a = _one_einsum(1e-10)
    assert _one_einsum(1e-10).options is a.options
    slow = _one_einsum(1e-9)
    assert slow.options is not a.options
    assert [o.comm_time_s for o in slow.options] != [o.comm_time_s for o in a.options]
    sharding._OPTIONS.clear()
    fresh = _one_einsum(1e-10)
    assert fresh.options is not a.options and fresh.options == a.options
    assert (fresh.choice, fresh.compute_time_s) == (a.choice, a.compute_time_s)


def test_stack_answers_shared_across_profiles():
    """The stack's answers (remat reruns, policies) do not depend on the profile: contexts of
    one stack and chip under two profiles share them; the rates stay each profile's own."""
    from roofline.core.pricing import pricing_context
    from roofline.core.stack import stack_of

    chip = _system("h100:64").chip
    st = stack_of("megatron")
    a = pricing_context(st, load_profile("fitted"), chip)
    b = pricing_context(st, load_profile("datasheet"), chip)
    assert a is not b
    assert a._reruns is b._reruns and a._policy is b._policy
    assert a._rates is not b._rates
    assert a.matmul_peak("bf16") != b.matmul_peak("bf16")


def test_timeline_sums_shared_per_remat_choice():
    """One plan's sums of its walk's Totals are kept per (Totals, remat choice, reuse): the
    same plan twice reads them back, another remat policy gets its own, and each answer is
    the fresh one."""
    from roofline.training import step as step_mod

    _forget()
    step_mod._SUMS.clear()
    model, system, _, fw = CASES[1]
    full = _cost(model, system, "dp=8,tp=8,remat=full", fw).to_dict()
    assert len(step_mod._SUMS) == 1
    assert _cost(model, system, "dp=8,tp=8,remat=full", fw).to_dict() == full
    assert len(step_mod._SUMS) == 1
    none = _cost(model, system, "dp=8,tp=8,remat=none", fw).to_dict()
    assert len(step_mod._SUMS) == 2 and none != full
    _forget()
    step_mod._SUMS.clear()
    assert _cost(model, system, "dp=8,tp=8,remat=none", fw).to_dict() == none


def test_every_walk_option_is_in_the_memo_key():
    """A WalkOptions field missing from the key would hand one option's walk to another (the
    cuda_graph plan's host_syncs=False, serving's MoE combine): each field, changed, changes it."""
    from dataclasses import fields, replace

    from roofline.specs.plan import ComputeDtype, ComputeDtypes

    base = walk_mod.WalkOptions()
    changed = {
        "dtypes": ComputeDtypes(matmul=ComputeDtype.FP8),
        "keep_einsums": not base.keep_einsums,
        "merge_reductions": not base.merge_reductions,
        "trusted": not base.trusted,
        "choices": {("mlp/up", "fwd"): 1},
        "remats": ("x",),
        "eager": not base.eager,
        "floats": not base.floats,
    }
    for f in fields(base):
        if f.name in ("policy", "stack"):  # by identity, in the refs
            continue
        value = changed.get(f.name, not getattr(base, f.name))
        other = replace(base, **{f.name: value})
        assert walk_mod._options_key(other) != walk_mod._options_key(base), f.name
