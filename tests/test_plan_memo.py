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
