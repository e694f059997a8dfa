"""The interleaved schedule's virtual stages as a searched axis (issues 19, 21): the planner
tries every count of `SearchSpace.virtual_stages` that the feasibility rules allow, keeps the
rest out by those rules, and finds the published kind of plan (v > 2) where the model costs
it below v = 2."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from roofline.core.stack import stack_of
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Schedule, Strategy, Workload, parse_optimizer
from roofline.specs.system import parse_system
from roofline.training.feasibility import EDGE_LAYERS, plan_problems
from roofline.training.planner import SearchSpace, plan_training
from roofline.training.planner.rank import candidate_plan
from roofline.training.planner.space import (
    UNEQUAL_CHUNKS,
    VIRTUAL_STAGES,
    chunk_imbalance,
    enumerate_plans,
)
from roofline.training.step import evaluate_plan

IL = Schedule.INTERLEAVED.code


def _pipeline_rows(model, system, stack, work):
    space = SearchSpace().for_stack(stack_of(stack), model)
    found = enumerate_plans(model, work, [system], space)
    rows = []
    for st, c in found.groups:
        pp = np.asarray(c.deg[Strategy.PP])
        for i in np.nonzero(pp > 1)[0]:
            rows.append((st, c, int(i)))
    return space, found, rows


@pytest.mark.parametrize(
    "model,system,stack",
    [
        ("llama-3-8b", "h100:64", "ideal"),  # 32 layers, even stages only
        ("llama-3-8b", "h100:64", "megatron"),  # uneven stages (first/last, layout)
        ("gpt-3-175b", "a100:256", "megatron"),  # 96 layers
        ("llama-3.1-405b", "h100:144", "torchtitan"),  # 126 layers, balanced stages
    ],
)
def test_every_enumerated_pipeline_choice_satisfies_the_feasibility_rules(model, system, stack):
    """Every interleaved candidate has a virtual-stage count of the space that its layers
    allow (pp·v dividing them, or at most layers + 2 where the stack lays out uneven stages)
    in chunks no more unequal than the stage bound, every other candidate v = 1; every such
    count is tried on each pipeline degree; and a sample of the candidates, rebuilt as plans,
    breaks none of the plan rules."""
    m, s = load_model(model), parse_system(system)
    work = Workload(2**21, 4096)
    space, found, rows = _pipeline_rows(m, s, stack, work)
    assert space.virtual_stages == VIRTUAL_STAGES
    uneven = stack_of(stack).uneven_stages
    L = m.n_layers

    def legal(pp: int, v: int) -> bool:  # feasibility.rules_for
        return pp * v <= L + EDGE_LAYERS if uneven else L % (pp * v) == 0

    def equal_enough(pp: int, v: int) -> bool:  # the space's bound on unequal chunks
        worst = chunk_imbalance(L, np.array([pp * v]))[0]
        if uneven:
            worst = min(worst, chunk_imbalance(L + EDGE_LAYERS, np.array([pp * v]))[0])
        return worst <= space.max_stage_imbalance

    seen: dict[int, set[int]] = {}
    for _, c, i in rows:
        pp, v, sc = int(c.deg[Strategy.PP][i]), int(c.virtual[i]), int(c.schedule[i])
        if sc != IL:
            assert v == 1
            continue
        assert v in space.virtual_stages and legal(pp, v) and equal_enough(pp, v)
        seen.setdefault(pp, set()).add(v)
    assert seen and any(max(vs) > 2 for vs in seen.values())
    for pp, vs in seen.items():
        want = {v for v in space.virtual_stages if legal(pp, v) and equal_enough(pp, v)}
        assert vs == want, pp
    if uneven:  # counts the layers allow but whose chunks are unequal: counted, not searched
        assert found.rejected[UNEQUAL_CHUNKS] > 0
    interleaved = [r for r in rows if int(r[1].schedule[r[2]]) == IL]
    step = max(1, len(interleaved) // 40)
    for st, c, i in interleaved[::step]:
        plan = candidate_plan(c, st, i, space, parse_optimizer("adam-bf16"))
        assert plan.schedule == Schedule.INTERLEAVED and plan.virtual_stages == int(c.virtual[i])
        problems = plan_problems(m, s.n_chips, work, plan, uneven_stages=uneven)
        assert problems == [], (plan.describe(), problems)


def test_rejected_counts_name_the_virtual_stage_rule():
    """The counts a model's layers do not allow are counted under the feasibility rule's name
    (32 layers on the idealised machine: v = 3, 5, 6, 7, ... never divide 32/pp)."""
    m, s = load_model("llama-3-8b"), parse_system("h100:64")
    _, found, _ = _pipeline_rows(m, s, "ideal", Workload(2**21, 4096))
    assert found.rejected["layers not divisible by pp·virtual stages"] > 0


def test_planner_finds_a_published_style_interleaved_plan_with_more_than_two_virtual_stages():
    """LLaMA-3 70B (80 layers) on 64 H100 under Megatron, searched over dp, tp and pp: the best
    plan is interleaved with more than 2 virtual stages (NeMo's published LLaMA-3 70B plans
    use 5 on pp=4), costs less than the same plan at v = 2 (and than 1F1B), and no count of
    the space costs less than it by more than the planner's tie tolerance."""
    m, s, w = load_model("llama-3-70b"), parse_system("h100:64"), Workload(2**21, 4096)
    space = SearchSpace(strategies=(Strategy.DP, Strategy.TP, Strategy.PP))
    res = plan_training(
        m, s, w, space=space, framework="megatron", allow_sub_slices=False, top_k=1,
        efficient_size=False,
    )  # fmt: skip
    best = res.best
    assert best.plan.schedule == Schedule.INTERLEAVED and best.plan.virtual_stages > 2
    assert best.plan.degrees.pp > 1

    def at(v: int):
        sched = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
        plan = replace(best.plan, schedule=sched, virtual_stages=v)
        return evaluate_plan(m, s, w, plan, framework="megatron").step_time_s

    assert best.step_time_s == pytest.approx(at(best.plan.virtual_stages), rel=1e-9)
    assert best.step_time_s < at(2) and best.step_time_s < at(1)
    fastest = min(at(v) for v in space.virtual_stages)
    assert best.step_time_s <= fastest * (1 + res.tie_tolerance)
    assert f"virtual={best.plan.virtual_stages}" in best.plan.describe()
    assert best.to_dict()["plan"]["virtual_stages"] == best.plan.virtual_stages


@pytest.mark.parametrize("stack", ["megatron", "nemo"])
def test_the_searched_virtual_stages_are_written_and_read_back(stack):
    """The count the planner chose reaches the launch file (Megatron's
    --num-virtual-stages-per-pipeline-rank, NeMo's virtual_pipeline_model_parallel_size) and
    reads back as the same plan."""
    from roofline.launch import LaunchConfig, LaunchKind, LaunchWorkload, read_launch, write_launch

    m, s, w = load_model("llama-3-70b"), parse_system("h100:64"), Workload(2**21, 4096)
    space = SearchSpace(strategies=(Strategy.DP, Strategy.TP, Strategy.PP))
    res = plan_training(
        m, s, w, space=space, framework="megatron", allow_sub_slices=False, top_k=1,
        efficient_size=False, launch_stack=stack, optimizer="adam-fp32-master",
    )  # fmt: skip
    plan = res.best.plan
    assert plan.virtual_stages > 2
    config = LaunchConfig(
        stack=stack,
        kind=LaunchKind.TRAINING,
        model="llama-3-70b",
        plan=plan,
        workload=LaunchWorkload(seq_len=w.seq_len, global_batch_sequences=int(w.sequences)),
    )
    text = write_launch(config, stack)
    key = {
        "megatron": "--num-virtual-stages-per-pipeline-rank ",
        "nemo": "virtual_pipeline_model_parallel_size: ",
    }
    assert f"{key[stack]}{plan.virtual_stages}" in text
    back = read_launch(text, source=f"<{stack} export>")
    assert back.problems == ()
    assert back.plan.schedule == Schedule.INTERLEAVED
    assert back.plan.virtual_stages == plan.virtual_stages
