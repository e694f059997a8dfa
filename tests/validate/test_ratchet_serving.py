"""The public inference and serving scoreboards may only improve, metric by metric.

`ratchet_serving.json` holds, for `roofline validate --runs inference` and `--runs serving`
(default profile), each metric's covered points and median |error| (TTFT, TPOT and throughput
scored separately: errors must not cancel), and the ids of the points it covered. The test fails
when a metric covers fewer points or its median |error| over the points the file covered rises
beyond a tiny tolerance: a change that maps new, harder points is judged like for like on the old
ones (the new points' errors are then in the stored median). When a change improves them, update
the file (it is rewritten only if nothing got worse):

    ROOFLINE_UPDATE_RATCHET=1 python -m pytest tests/validate/test_ratchet_serving.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from roofline.validate import validate

RATCHET = Path(__file__).with_name("ratchet_serving.json")
TOL = 0.002  # 0.2 percentage points: float noise, not a regression budget
FILES = ("inference", "serving")


@pytest.fixture(scope="module")
def reports() -> dict:
    return {f: validate(f) for f in FILES}


@pytest.fixture(scope="module")
def summaries(reports) -> dict[str, dict]:
    return {f: r.summary() for f, r in reports.items()}


def _errors(report, metric: str) -> dict[str, float]:
    """Each covered point's |error| on `metric`, by run id."""
    return {r.run.id: abs(r.errors[metric]) for r in report.results if metric in r.errors}


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _snapshot(reports: dict) -> dict:
    out: dict = {
        "what": "roofline validate --runs inference|serving (default profile)",
        "update": "ROOFLINE_UPDATE_RATCHET=1 python -m pytest tests/validate/test_ratchet_serving.py",
    }
    for f, report in reports.items():
        out[f] = {}
        for m, v in report.summary().items():
            if v["n"]:
                ids = sorted(_errors(report, m))
                out[f][m] = {
                    "n": v["n"],
                    "median_abs_error": round(v["median_abs_error"], 6),
                    "ids": ids,
                }
    return out


def _worse(stored: dict, reports: dict) -> list[str]:
    bad = []
    for f in FILES:
        for m, old in stored[f].items():
            now = _errors(reports[f], m)
            kept = [now[i] for i in old["ids"] if i in now]
            if len(now) < old["n"] or len(kept) < len(old["ids"]):
                lost = sorted(set(old["ids"]) - set(now))[:5]
                bad.append(f"{f} {m}: {len(now)} points covered, was {old['n']} (lost {lost})")
            elif _median(kept) > old["median_abs_error"] + TOL:
                bad.append(
                    f"{f} {m}: median |error| over the {len(kept)} points covered before "
                    f"{_median(kept):.4f}, was {old['median_abs_error']:.4f}"
                )
    return bad


def test_the_like_for_like_median_is_the_summary_median(reports, summaries):
    """The ratchet's own median over every covered id is validate's reported one."""
    for f, report in reports.items():
        for m, v in summaries[f].items():
            if v["n"]:
                assert _median(list(_errors(report, m).values())) == pytest.approx(
                    v["median_abs_error"], abs=1e-12
                )


def test_public_serving_scoreboards_only_improve(reports):
    stored = json.loads(RATCHET.read_text())
    now = _snapshot(reports)
    bad = _worse(stored, reports)
    if os.environ.get("ROOFLINE_UPDATE_RATCHET") and not bad:
        RATCHET.write_text(json.dumps(now, indent=1) + "\n")
        return
    assert not bad, "; ".join(bad)


def test_the_issue_targets_hold(summaries):
    """Issue 11's targets on both public files: TPOT and throughput <= 20%, TTFT <= 30%, and at
    least 80% of the serving points covered."""
    for f, s in summaries.items():
        for m, cap in (("ttft", 0.30), ("tpot", 0.20), ("throughput", 0.20)):
            if s[m]["n"]:
                assert s[m]["median_abs_error"] <= cap, (f, m, s[m]["median_abs_error"])
    assert summaries["serving"]["ttft"]["coverage"] >= 0.8


def _fake(errors: dict[str, float]):
    """A report whose points have these TTFT errors, by id."""
    results = [
        SimpleNamespace(run=SimpleNamespace(id=i), errors={"ttft": e}) for i, e in errors.items()
    ]
    return SimpleNamespace(results=results)


def test_the_ratchet_catches_a_regression():
    base = {f"r{i}": 0.1 * i for i in range(1, 6)}  # median 0.3
    stored = {f: {"ttft": {"n": 5, "median_abs_error": 0.3, "ids": sorted(base)}} for f in FILES}
    same = {f: _fake(base) for f in FILES}
    worse = {f: _fake({**base, "r3": 0.35}) for f in FILES}
    fewer = {f: _fake({k: v for k, v in base.items() if k != "r1"}) for f in FILES}
    # a new, much worse point raises the overall median but not the like-for-like one
    more = {f: _fake({**base, "r6": 0.9, "r7": 0.9}) for f in FILES}
    swapped = {f: _fake({**{k: v for k, v in base.items() if k != "r1"}, "r6": 0.0}) for f in FILES}
    assert _worse(stored, same) == []
    assert len(_worse(stored, worse)) == 2 and len(_worse(stored, fewer)) == 2
    assert _worse(stored, more) == []
    assert len(_worse(stored, swapped)) == 2  # as many points, but one of the old ones lost
