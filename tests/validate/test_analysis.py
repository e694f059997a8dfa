"""The error analysis recovers what was put in: a per-group level, and known causal factors."""

from __future__ import annotations

import dataclasses
import math

import pytest

from roofline.validate import scoreboard
from roofline.validate.analysis import regression, scalar_residual
from roofline.validate.scoreboard import TrainingReport, features


def with_errors(report, err_of):
    res = tuple(dataclasses.replace(r, error=err_of(r)) if r.covered else r for r in report.results)
    return TrainingReport(res, report.profile, report.framework, False)


def test_one_scalar_per_group_removes_a_pure_group_level(training_report):
    level = {"H100": 0.3, "A100-80GB": 0.5}
    rep = with_errors(training_report, lambda r: level.get(r.run.chip_family, -0.2))
    out = scalar_residual(rep, lambda r: r.run.chip_family)
    assert out["median_abs_error_after"] == pytest.approx(0.0, abs=1e-12)
    assert out["group_factor"]["H100"] == pytest.approx(1.3)


def test_regression_recovers_planted_factors(training_report):
    def err(r):
        f = features(r)
        log = (
            math.log(1.5)
            + math.log(0.7) * (f["compute_dtype"] in ("fp8", "fp4"))
            + math.log(1.9) * (f["seq_len"] == ">8k")
        )
        return math.exp(log) - 1

    out = regression(with_errors(training_report, err))
    assert out["base_factor"] == pytest.approx(1.5, rel=1e-6)
    assert out["factors"]["fp8/fp4"]["factor"] == pytest.approx(0.7, rel=1e-4)
    assert out["factors"]["seq>8k"]["factor"] == pytest.approx(1.9, rel=1e-4)
    assert out["factors"]["moe"]["factor"] == pytest.approx(1.0, abs=1e-4)


def test_framework_is_passed_through_once_the_core_takes_it(training_report, monkeypatch):
    seen = []
    real = scoreboard.evaluate_plan

    def fake(model, system, workload, plan, *, efficiency=None, framework=None):
        seen.append(framework)
        return real(model, system, workload, plan, efficiency=efficiency)

    monkeypatch.setattr(scoreboard, "evaluate_plan", fake)
    monkeypatch.setattr(scoreboard, "TAKES_FRAMEWORK", True)
    run = next(
        r.run for r in training_report.results if r.covered and r.run.source.stack == "maxtext"
    )
    assert scoreboard.predict_run(run, None, "auto").prediction["framework"] == "maxtext"
    assert scoreboard.predict_run(run, None, "torchtitan").prediction["framework"] == "torchtitan"
    scoreboard.predict_run(run, None, "none")
    assert seen == ["maxtext", "torchtitan", None]
