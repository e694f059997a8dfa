"""The plan vocabulary (specs/plan.py) and the planner's usability: typed, one-paragraph errors
for bad plans and workloads, the formulas with one home, and the searches users asked for."""

from __future__ import annotations

import json
import math

import pytest

import roofline as rl
from roofline.cli import main
from roofline.errors import PlanError, RooflineError
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import (
    ComputeDtypes,
    Degrees,
    Plan,
    Remat,
    RematKind,
    Schedule,
    Strategy,
    Workload,
    parse_plan,
)
from roofline.specs.system import parse_system
from roofline.training.planner import plan_training, sub_slices, systems_for_counts
from roofline.training.planner.rank import listing_key
from roofline.training.step import evaluate_plan, model_flops, run_cost_usd

TINY = load_model("tiny-llama")


def _paragraph(e: RooflineError) -> str:
    s = str(e)
    assert "Rule:" in s and "Fix:" in s and "\n" not in s
    return s


@pytest.mark.parametrize(
    "text,match",
    [
        ("", "empty plan"),
        ("   ", "empty plan"),
        ("schedule=interleaved,virtual=0", "virtual = 0"),
        ("pp=2,schedule=interleaved,virtual=-2", "virtual = -2"),
        ("pp=2,virtual=2", "only in the interleaved schedule"),
        ("remat=ckpt99999999999999999999", "unknown remat policy"),
        ("remat=ckpt0", "unknown remat policy"),
        ("dp=99999999999999999999", "plan degree dp"),
        ("collective_matmul=maybe", "flags are 1/0"),
        ("matmul_dtype=fp7", "compute dtypes are"),
    ],
)
def test_bad_plans_are_typed_paragraphs(text, match):
    with pytest.raises(PlanError if "remat" not in text else RooflineError, match=match) as e:
        parse_plan(text)
    _paragraph(e.value)


def test_plans_are_built_by_keyword_and_store_enums():
    p = Plan(degrees=Degrees(fsdp=8), remat=Remat(RematKind.MATMULS), schedule=Schedule.GPIPE)
    assert p.degrees.of(Strategy.FSDP) == 8 and p.dtypes == ComputeDtypes()
    with pytest.raises(TypeError):
        Plan(Degrees(fsdp=8))  # positional construction is refused
    with pytest.raises(PlanError, match="is not a Remat"):
        Plan(remat="full")
    with pytest.raises(PlanError, match="not a whole number"):
        Degrees(tp=2.5)


@pytest.mark.parametrize(
    "args,match",
    [
        (("4M", 4096), "is a str, not a number"),
        ((4 * 2**20, 4096.5), "whole number of tokens"),
        ((4 * 2**20, 0), "positive"),
        ((float("nan"), 4096), "positive"),
    ],
)
def test_bad_workloads_are_typed_paragraphs(args, match):
    with pytest.raises(PlanError, match=match) as e:
        Workload(*args)
    _paragraph(e.value)


def test_a_batch_that_splits_a_sequence_names_the_nearest_batches():
    w = Workload(16e6, 8192)
    assert not w.whole_sequences
    assert w.nearest_whole_batches()[0] == 16 * 2**20  # the power-of-two count: 2048 sequences
    with pytest.raises(PlanError, match="16Mi") as e:
        plan_training(load_model("llama-3-8b"), parse_system("h100:64"), w)
    assert "1953 sequences" in _paragraph(e.value)


def test_evaluate_plan_names_wrong_argument_types():
    with pytest.raises(PlanError, match="model = 'tiny-llama' is a str") as e:
        evaluate_plan(
            "tiny-llama", parse_system("h100:8"), Workload(2**16, 1024), parse_plan("dp=8")
        )
    assert "load_model" in _paragraph(e.value)
    with pytest.raises(PlanError, match="plan = 'dp=8' is a str"):
        rl.evaluate_plan(TINY, parse_system("h100:8"), Workload(2**16, 1024), "dp=8")


def test_model_flops_use_active_parameters():
    """6·N·tokens with N the active parameters, everywhere: MFU and the assumed-MFU run."""
    ds = load_model("deepseek-v3")
    active = rl.count_params(ds).active
    assert model_flops(ds, 1e12) == pytest.approx(6 * active * 1e12)
    assert run_cost_usd(3600.0, 8, 2.0) == pytest.approx(16.0) and run_cost_usd(1, 1, None) is None


def test_deepseek_assume_mfu_is_about_24_days(capsys):
    """Regression: the back-of-envelope used total params (671B) and printed ~425 days; with the
    37.6B active params 6·N·15T / (8960 · 459 TFLOP/s · 0.4) is ~24 days."""
    assert main(["train", "--model", "deepseek-v3", "--assume-mfu", "0.4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    chip = parse_system("tpu-v5p:16x20x28").chip
    expect = 6 * rl.count_params(load_model("deepseek-v3")).active * 15e12
    expect /= 8960 * chip.peak("bf16") * 0.4 * 86400
    assert d["run_time_days"] == pytest.approx(expect, rel=1e-9)
    assert 22 < d["run_time_days"] < 26


@pytest.mark.parametrize("mfu", ["0", "3", "-1", "nan"])
def test_assume_mfu_outside_zero_one_is_an_error(mfu, capsys):
    assert main(["train", "--model", "llama-3-8b", "--system", "h100:64", "--assume-mfu", mfu]) == 2
    err = capsys.readouterr().err
    assert "MFU is a fraction in (0, 1]" in err and "Traceback" not in err


@pytest.mark.parametrize("chips", ["1e30", "1-1e30"])
def test_absurd_chip_counts_end_quickly(chips, capsys):
    argv = ["train", "--model", "tiny-llama", "--system", "h100:1024", "--chips", chips]
    argv += ["--batch-tokens", "65536", "--seq", "1024", "--top", "1"]
    rc = main(argv)
    out = capsys.readouterr()
    assert rc in (0, 2) and "Traceback" not in out.err


def test_gpu_clusters_that_are_not_a_power_of_two_plan_on_a_subset():
    s = parse_system("h100:1000")
    subsets = [x.n_chips for x in sub_slices(s)]
    assert subsets[0] == 1000 and 512 in subsets and all(n % 8 == 0 for n in subsets)
    assert [x.n_chips for x in sub_slices(parse_system("h100:1024"))] == [1024]
    res = plan_training(load_model("llama-3-8b"), s, Workload(2**22, 4096, 1e12), top_k=2)
    assert res.best.system.n_chips < 1000 and "were searched" in res.sub_slice_note


def test_tpu_chip_counts_reach_small_sub_slices():
    found = systems_for_counts(parse_system("tpu-v5p:16x20x28"), [1024])
    assert [(x.n_chips, x.topology) for x in found] == [(1024, (8, 8, 16))]
    with pytest.raises(PlanError, match="within the given cluster"):
        systems_for_counts(parse_system("h100:1024"), [2048])


def test_top_plans_are_distinct_shapes():
    res = plan_training(
        load_model("llama-3-8b"), parse_system("h100:64"), Workload(2**20, 4096), top_k=5
    )
    keys = [
        listing_key({s: c.plan.degrees.of(s) for s in Strategy}, c.system.n_chips) for c in res.top
    ]
    assert len(set(keys)) == len(keys)


def test_a_chip_without_a_price_has_no_cost(capsys):
    s = parse_system("h100:64")
    s = s.with_options(usd_per_chip_hour=None)
    res = plan_training(load_model("llama-3-8b"), s, Workload(2**20, 4096, 1e12), top_k=2)
    assert all(p["usd_per_million_tokens"] is None for p in res.pareto)
    assert res.best.run_cost_usd is None and not math.isnan(res.best.step_time_s)
