"""validate's planner mode searches each run's stack as it stood at the run's date (issue 19):
the date is read from the entry (sources.stack_date) and passed to plan_training(as_of=) where
the run ran on the stack it is costed on."""

from __future__ import annotations

import datetime

import pytest

from roofline.validate import scoreboard
from roofline.validate.scoreboard import planner_check, predict_run, stack_date_of
from roofline.validate.sources import dates_named, stack_date
from roofline.validate.training_runs import map_training_run

D = datetime.date


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("README.md (table added in commit f2e5db40, 2024-07-15, 'New scaling')", D(2024, 7, 15)),
        ("images/cases_april2021.png (added 2021-04-08; removed 2024-07-15)", D(2021, 4, 8)),
        ("benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md", D(2025, 6, 30)),
        ("benchmarks/llama3_h100_202412_torchtitan.md", D(2024, 12, 31)),
        ("torchtitan benchmark (June 2025)", D(2025, 6, 30)),
        ("NeMo Framework performance summary (container NeMo 24.07, DGX-H100)", D(2024, 7, 31)),
        ("DGX Cloud Benchmarking recipes v24.11.1", D(2024, 11, 30)),
        ("Megatron-Bridge performance summary, 26.04.01 NeMo container", D(2026, 4, 30)),
        ("https://arxiv.org/abs/2205.05198", D(2022, 5, 31)),
        ("Llama 3 (arXiv:2407.21783)", D(2024, 7, 31)),
    ],
)
def test_the_earliest_date_a_source_names(text, want):
    assert min(dates_named(text)) == want


def test_no_date_is_named_in_hashes_versions_or_model_names():
    assert (
        dates_named("commit d98e8a64ddf34856e74b24714e3bedb2f5a39553, Llama 3.1 70B, r0.8.0") == []
    )


def test_an_entrys_measured_date_wins_and_an_undated_source_is_not_gated():
    e = {"source": {"title": "x", "location": "2024-07-15"}, "measured": {"date": "2023-02"}}
    assert stack_date(e) == (D(2023, 2, 28), "the entry's measured.date")
    assert stack_date({"source": {"title": "MaxText tiering.md at commit e591f30c"}})[0] is None


def _run(entries, rid):
    return predict_run(map_training_run(entries[rid]), None)


def test_the_planner_gets_the_runs_date(training_entries, monkeypatch):
    seen = []

    stacks = []

    def fake(*a, **kw):
        seen.append(kw.get("as_of"))
        stacks.append(kw.get("framework"))
        raise scoreboard.RooflineError("stop")

    monkeypatch.setattr(scoreboard, "plan_training", fake)
    monkeypatch.setattr(scoreboard, "_PLANNER_CACHE", {})
    r = _run(training_entries, "megatron-a100-narayanan2021-1.7b")
    assert r.run.stack_date == D(2021, 4, 8)
    out = planner_check(r, None)
    assert seen == [D(2021, 4, 8)] and out.planner["stack_date"] == "2021-04-08"
    # on the stack as the run's document ran it (predict_run's): 2021's unfused attention
    assert stacks[-1] is r.run.inputs.stack and stacks[-1].framework.kernels.attention == "unfused"
    # a run on a stack the profile stands in for (Meta's, costed as torchtitan): not gated
    r = _run(training_entries, "llama3-405b-h100-8192gpu-cp1")
    assert r.run.stack_date is not None and stack_date_of(r.run) is None
    planner_check(r, None)
    assert seen[-1] is None
    # a forced --framework searches today's stack
    r = _run(training_entries, "megatron-a100-narayanan2021-1.7b")
    assert stack_date_of(r.run, "megatron") is None


def test_a_dated_run_gets_no_later_feature(training_entries):
    r = planner_check(_run(training_entries, "megatron-a100-narayanan2021-39b"), None)
    plan = r.planner["plan"]
    assert "fsdp=" not in plan and "zero=1" not in plan and "megatron_sp=1" not in plan
    assert "remat=matmuls" not in plan and "collective_matmul=1" not in plan


def test_no_published_run_uses_a_feature_its_stack_lacked_at_its_date():
    """The dates and the run-date rule agree with the published plans: a run that used a
    feature its stack had not shipped by the run's date would show one of them wrong."""
    from roofline.specs.framework import Feature as F
    from roofline.specs.framework import load_framework
    from roofline.specs.plan import RematKind, Schedule
    from roofline.validate import mapped_runs
    from roofline.validate.runfile import load_runs

    dated = 0
    for r in mapped_runs(load_runs("training")):
        when = stack_date_of(r) if r.mapped else None
        if when is None:
            continue
        dated += 1
        p = r.inputs.plan
        g = p.degrees
        uses = {
            F.FSDP: g.fsdp > 1,
            F.CONTEXT_PARALLEL: g.sp > 1,
            F.EXPERT_PARALLEL: g.ep > 1,
            F.PIPELINE: g.pp > 1,
            F.DISTRIBUTED_OPTIMIZER: p.zero == 1 and g.dp > 1,
            F.SELECTIVE_RECOMPUTE: p.remat.kind == RematKind.MATMULS,
            F.SEQUENCE_PARALLEL: bool(p.sequence_parallel) and g.tp > 1,
            F.TP_COMM_OVERLAP: p.collective_matmul is True,
            F.EP_OVERLAP: p.overlap_ep is True,
            F.INTERLEAVED_PIPELINE: p.schedule == Schedule.INTERLEAVED,
            F.GRADIENT_ACCUMULATION: g.pp <= 1 and p.microbatches > 1,
            F.HYBRID_SHARDING: g.dp > 1 and g.fsdp > 1,
        }
        gone = load_framework(r.inputs.framework).lacks(when)
        assert not [f for f, used in uses.items() if used and f in gone], (r.id, when)
    assert dated >= 50
