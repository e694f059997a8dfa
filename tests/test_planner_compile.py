"""The planner searches compile like the overlap flags (issue 19/21): unset (the stack's default)
and on, where the stack runs eager by default (its profile's [eager] table: torchtitan, whose
launch writer says [compile] enable). Stacks without an [eager] table search nothing new;
`plan_training(compiled=)` pins it (validate's planner mode)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from roofline.core.stack import stack_of
from roofline.errors import PlanError
from roofline.launch import LaunchConfig, LaunchKind, LaunchWorkload, read_launch, write_launch
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import (
    FLAG_ON,
    FLAG_UNSET,
    Plan,
    Workload,
    parse_optimizer,
)
from roofline.specs.system import parse_system
from roofline.training.planner import plan_training
from roofline.training.planner.rank import candidate_plan
from roofline.training.planner.space import SearchSpace, enumerate_plans, searches_compile
from roofline.training.step import evaluate_plan, evaluate_plans

MODEL = load_model("llama-3-8b")
SYSTEM = parse_system("h100:16")
WORK = Workload(2**20, 4096)
OPT = "adam-fp32"


def _plan(cand, structure, space, i: int) -> Plan:
    """Candidate i of a family as a Plan (as the planner's `plan_at` rebuilds it)."""
    return candidate_plan(cand, structure, i, space, parse_optimizer(OPT))


def _families(stack):
    space = SearchSpace().for_stack(stack, MODEL)
    return space, enumerate_plans(MODEL, WORK, [SYSTEM], space).groups


def test_torchtitan_searches_compile_unset_and_on_in_separate_families():
    tt = stack_of("torchtitan")
    space, groups = _families(tt)
    assert searches_compile(tt) and space.compile == (None, True)
    codes = [set(np.unique(c.compiled).tolist()) for _, c in groups]
    assert all(len(c) == 1 for c in codes)  # one walk costs one compile setting
    assert {next(iter(c)) for c in codes} == {FLAG_UNSET, FLAG_ON}
    # the same plans either way: the compile families mirror the unset ones
    by = {FLAG_UNSET: 0, FLAG_ON: 0}
    for (_, c), code in zip(groups, codes, strict=True):
        by[next(iter(code))] += len(c)
    assert by[FLAG_UNSET] == by[FLAG_ON] > 0


def test_searched_candidates_cost_as_the_single_plan_says():
    """The family walk of a compile=1 (and an unset) family gives each candidate exactly what
    evaluate_plan gives it alone, compile=1 in its plan; compiled is faster, same memory."""
    tt = stack_of("torchtitan")
    space, groups = _families(tt)
    best = {}
    for st, cand in groups:
        r = evaluate_plans(
            MODEL, [SYSTEM], WORK, st, cand, optimizer=parse_optimizer(OPT),
            remats=list(space.remats), framework=tt,
        )  # fmt: skip
        ok = np.nonzero(~r.infeasible)[0]
        code = int(cand.compiled[0])
        best[code] = min(best.get(code, np.inf), float(r.step_time_s[ok].min()))
        for i in ok[:: max(1, len(ok) // 4)][:4]:
            plan = _plan(cand, st, space, int(i))
            assert plan.compiled is (True if code == FLAG_ON else None)
            alone = evaluate_plan(MODEL, SYSTEM, WORK, plan, framework=tt)
            assert float(r.step_time_s[i]) == pytest.approx(alone.step_time_s, rel=1e-12)
            assert float(r.memory_total[i]) == pytest.approx(alone.memory_per_chip_bytes)
    assert best[FLAG_ON] < best[FLAG_UNSET]


def test_mixed_compile_in_one_evaluation_is_refused():
    tt = stack_of("torchtitan")
    space, groups = _families(tt)
    st, cand = groups[0]
    cand.compiled = np.where(np.arange(len(cand)) % 2 == 0, FLAG_ON, FLAG_UNSET).astype(np.int8)
    with pytest.raises(PlanError, match="one walk costs one compile setting"):
        evaluate_plans(MODEL, [SYSTEM], WORK, st, cand, remats=list(space.remats), framework=tt)


def test_the_listed_plan_says_compile_and_its_launch_file_writes_it():
    res = plan_training(
        MODEL, SYSTEM, WORK, top_k=3, framework="torchtitan", optimizer=OPT,
        launch_stack="torchtitan",
    )  # fmt: skip
    best = res.best
    assert best.plan.compiled is True and "compile=1" in best.plan.describe()
    alone = evaluate_plan(MODEL, best.system, WORK, best.plan, framework="torchtitan")
    assert json.dumps(best.to_dict(), sort_keys=True, default=str) == json.dumps(
        alone.to_dict(), sort_keys=True, default=str
    )
    eager = evaluate_plan(
        MODEL, best.system, WORK, Plan(**{**best.plan.__dict__, "compiled": None}),
        framework="torchtitan",
    )  # fmt: skip
    assert best.step_time_s < eager.step_time_s  # the unset plan is torchtitan's eager default
    w = LaunchWorkload(seq_len=4096, global_batch_sequences=256, train_steps=10)
    text = write_launch(
        LaunchConfig(stack="torchtitan", kind=LaunchKind.TRAINING, plan=best.plan, workload=w),
        "torchtitan",
    )
    assert "[compile]\nenable = true" in text
    back = read_launch(text, source="tt.toml", stack="torchtitan", chips=SYSTEM.n_chips)
    assert back.plan.compiled is True


def test_pinned_compile_searches_nothing_and_costs_the_pin():
    """plan_training(compiled=) as validate's planner mode uses it: the plans stay unset (the
    stack's default made the pin), and no compile family is searched."""
    free = plan_training(MODEL, SYSTEM, WORK, top_k=1, framework="torchtitan", optimizer=OPT)
    runs = {
        c: plan_training(
            MODEL, SYSTEM, WORK, top_k=1, framework="torchtitan", optimizer=OPT, compiled=c
        )
        for c in (True, False)
    }
    for r in runs.values():
        assert r.best.plan.compiled is None
        assert 2 * r.candidates_enumerated == free.candidates_enumerated
    assert runs[True].best.step_time_s == free.best.step_time_s
    assert runs[True].best.step_time_s < runs[False].best.step_time_s


@pytest.mark.parametrize("name", ["megatron", "maxtext", "deepspeed", "llm-foundry", None])
def test_stacks_without_an_eager_table_search_no_compile(name):
    stack = stack_of(name)
    space, groups = _families(stack)
    assert not searches_compile(stack) and space.compile == (None,)
    assert all(c.compiled is None for _, c in groups)


def test_a_stack_compiling_by_default_has_nothing_to_search():
    on = stack_of("torchtitan").compiling_by_default(True)
    assert not searches_compile(on)
    assert SearchSpace().for_stack(on, MODEL).compile == (None,)
