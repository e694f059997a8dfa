"""A stack's version (issue 19): framework records date the features the planner chooses
([features]: since + source), and a search for the stack as of a date (`plan_training(as_of=)`,
`train --stack-date`) leaves out exactly the features dated later."""

from __future__ import annotations

import datetime

import numpy as np
import pytest

from roofline.cli import main
from roofline.core.stack import stack_of
from roofline.errors import SpecError
from roofline.specs.catalog import read_toml
from roofline.specs.framework import (
    FRAMEWORK_DIR,
    Feature,
    OverlapClass,
    framework_from_dict,
    load_framework,
    parse_stack_date,
)
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import RematKind, Schedule, Strategy, Workload
from roofline.specs.system import parse_system
from roofline.training.planner import plan_training
from roofline.training.planner.space import SearchSpace, enumerate_plans, stack_as_of

DAY = datetime.timedelta(days=1)
MODEL = load_model("llama-3-8b")
SYSTEM = parse_system("h100:16")
WORK = Workload(2**20, 4096)


def _space(name: str, when: datetime.date | None):
    stack = stack_of(name)
    return stack_as_of(SearchSpace().for_stack(stack, MODEL), stack, when)


def test_every_dated_feature_has_a_date_and_a_source():
    for name in ("megatron", "maxtext", "torchtitan", "llm-foundry"):
        fw = load_framework(name)
        assert fw.features, name
        for f, s in fw.features.items():
            assert isinstance(f, Feature) and isinstance(s.since, datetime.date)
            assert "@" in s.source or "arXiv" in s.source, (name, f)


@pytest.mark.parametrize("name", ["megatron", "maxtext", "torchtitan", "llm-foundry"])
def test_lacks_is_exactly_the_features_dated_after(name):
    fw = load_framework(name)
    assert fw.lacks(None) == {}
    for f, s in fw.features.items():
        assert f in fw.lacks(s.since - DAY)
        assert f not in fw.lacks(s.since)  # shipped that day: a stack of that date has it
        before = {g for g, t in fw.features.items() if t.since > s.since - DAY}
        assert set(fw.lacks(s.since - DAY)) == before


def test_a_late_date_leaves_the_space_and_stack_as_they_are():
    for name in ("megatron", "maxtext", "torchtitan", "ideal"):
        stack = stack_of(name)
        base = SearchSpace().for_stack(stack, MODEL)
        assert stack_as_of(base, stack, datetime.date(2100, 1, 1)) == (stack, base)
        assert stack_as_of(base, stack, None) == (stack, base)
    # the idealised machine is never gated
    ideal = stack_of("ideal")
    base = SearchSpace().for_stack(ideal, MODEL)
    assert stack_as_of(base, ideal, datetime.date(2000, 1, 1)) == (ideal, base)


def test_megatron_of_2021_runs_no_feature_it_shipped_later():
    """Megatron-LM of April 2021 (Narayanan et al.): no FSDP, context or expert parallelism, no
    distributed optimizer, selective recompute, sequence parallelism or TP comm overlap."""
    stack, space = _space("megatron", datetime.date(2021, 4, 8))
    today_stack, today = _space("megatron", None)
    assert set(today.strategies) - set(space.strategies) == {
        Strategy.FSDP,
        Strategy.SP,
        Strategy.EP,
    }
    assert RematKind.MATMULS in {r.kind for r in today.remats}
    assert RematKind.MATMULS not in {r.kind for r in space.remats}
    assert space.zero_stages == (0,) and today.zero_stages == (1,)
    assert space.megatron_sp == (False,) and today.megatron_sp == (True,)
    assert space.collective_matmul == (None,) and today.collective_matmul == (None, True)
    assert stack.overlap(OverlapClass.TENSOR).default == "off"
    assert today_stack.overlap(OverlapClass.TENSOR).default != "off"
    assert Schedule.INTERLEAVED in space.schedules  # interleaving shipped in December 2020


def test_megatron_of_mid_2022_has_sequence_parallelism_but_no_fsdp():
    _, space = _space("megatron", datetime.date(2022, 5, 19))  # Korthikanti et al.'s README
    assert Strategy.FSDP not in space.strategies and Strategy.SP not in space.strategies
    assert space.megatron_sp == (True,) and space.zero_stages == (1,)
    assert RematKind.MATMULS in {r.kind for r in space.remats}
    assert space.collective_matmul == (None,)


def test_accumulation_without_a_pipeline_is_a_named_bound():
    """MaxText before 2024-08-02 and torchtitan before 2025-06-05 had no gradient accumulation:
    microbatches > 1 only inside a pipeline; torchtitan before 2024-09-10 no HSDP."""
    _, space = _space("torchtitan", datetime.date(2024, 8, 1))
    enum = enumerate_plans(MODEL, WORK, [SYSTEM], space)
    names = set(enum.rejected)
    assert any("gradient accumulation" in n for n in names)
    assert any("hybrid sharding" in n for n in names)
    for _, cand in enum.groups:
        pp, mb = np.asarray(cand.deg[Strategy.PP]), np.asarray(cand.microbatches)
        assert not ((pp <= 1) & (mb > 1)).any()
        dp, fsdp = np.asarray(cand.deg[Strategy.DP]), np.asarray(cand.deg[Strategy.FSDP])
        assert not ((dp > 1) & (fsdp > 1)).any()
    _, later = _space("torchtitan", datetime.date(2025, 6, 5))
    assert len(later.bounds) == len(SearchSpace().bounds)


@pytest.mark.parametrize(
    ("name", "when"),
    [("megatron", "2021-04-08"), ("megatron", "2022-05"), ("torchtitan", "2024-12")],
)
def test_the_planner_on_a_dated_stack_never_returns_a_later_feature(name, when):
    res = plan_training(
        MODEL,
        SYSTEM,
        WORK,
        objective="time",
        top_k=5,
        allow_sub_slices=False,
        framework=name,
        as_of=when,
        dtypes=stack_of(name).dtypes("bf16"),
    )
    gone = load_framework(name).lacks(parse_stack_date(when))
    assert gone
    for c in res.top:
        p = c.plan
        d = p.degrees
        if Feature.FSDP in gone:
            assert d.fsdp == 1, p.describe()
        if Feature.CONTEXT_PARALLEL in gone:
            assert d.sp == 1, p.describe()
        if Feature.EXPERT_PARALLEL in gone:
            assert d.ep == 1, p.describe()
        if Feature.DISTRIBUTED_OPTIMIZER in gone:
            assert p.zero != 1, p.describe()
        if Feature.SELECTIVE_RECOMPUTE in gone:
            assert p.remat.kind != RematKind.MATMULS, p.describe()
        if Feature.SEQUENCE_PARALLEL in gone:
            assert not p.sequence_parallel, p.describe()
        if Feature.TP_COMM_OVERLAP in gone:
            assert p.collective_matmul is not True, p.describe()
        if Feature.GRADIENT_ACCUMULATION in gone:
            assert d.pp > 1 or p.microbatches == 1, p.describe()
        if Feature.HYBRID_SHARDING in gone:
            assert d.dp == 1 or d.fsdp == 1, p.describe()


def test_parse_stack_date():
    assert parse_stack_date("2022-06") == datetime.date(2022, 6, 30)
    assert parse_stack_date("2024-02") == datetime.date(2024, 2, 29)
    assert parse_stack_date("2022-06-15") == datetime.date(2022, 6, 15)
    for bad in ("2022-13", "June 2022", "2022-02-30", "22-06", ""):
        with pytest.raises(SpecError) as e:
            parse_stack_date(bad, "--stack-date")
        assert "YYYY-MM" in str(e.value)


def test_train_with_a_bad_stack_date_is_one_paragraph(capsys):
    rc = main(["train", "--model", "llama-3-8b", "--system", "h100:16", "--stack-date", "June"])
    err = capsys.readouterr().err
    assert rc == 2 and "--stack-date 'June' is not a date" in err and "Traceback" not in err


def test_train_says_what_the_stack_date_left_out(capsys):
    rc = main(
        [
            "train",
            "--model",
            "llama-3-8b",
            "--system",
            "h100:16",
            "--framework",
            "megatron",
            "--stack-date",
            "2022-06",
            "--objective",
            "time",
            "--top",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("Stack as of 2022-06-30"))
    assert "fsdp (2024-11-13)" in line and "sequence parallel" not in line


def test_a_bad_feature_table_is_a_clean_error():
    raw = read_toml(FRAMEWORK_DIR / "megatron.toml", "framework")
    bad = dict(raw, features={"fsdp": {"since": "late 2024", "source": "x"}})
    with pytest.raises(SpecError) as e:
        framework_from_dict(bad, "m.toml")
    assert "since" in str(e.value) and "YYYY" in str(e.value)
    with pytest.raises(SpecError):  # a feature the planner does not know
        framework_from_dict(
            dict(raw, features={"warp_drive": {"since": "2024-01-01", "source": "x"}})
        )
    with pytest.raises(SpecError):  # every date has a source
        framework_from_dict(dict(raw, features={"fsdp": {"since": "2024-01-01"}}))
