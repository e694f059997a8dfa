"""The public inference and serving scoreboards may only improve, metric by metric.

`ratchet_serving.json` holds, for `roofline validate --runs inference` and `--runs serving`
(default profile), each metric's covered points and median |error| (TTFT, TPOT and throughput
scored separately: errors must not cancel). The test fails when a metric covers fewer points
or its median |error| rises beyond a tiny tolerance. When a change improves them, update the
file (it is rewritten only if nothing got worse):

    ROOFLINE_UPDATE_RATCHET=1 python -m pytest tests/validate/test_ratchet_serving.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from roofline.validate import validate

RATCHET = Path(__file__).with_name("ratchet_serving.json")
TOL = 0.002  # 0.2 percentage points: float noise, not a regression budget
FILES = ("inference", "serving")


@pytest.fixture(scope="module")
def summaries() -> dict[str, dict]:
    return {f: validate(f).summary() for f in FILES}


def _snapshot(summaries: dict[str, dict]) -> dict:
    out: dict = {
        "what": "roofline validate --runs inference|serving (default profile)",
        "update": "ROOFLINE_UPDATE_RATCHET=1 python -m pytest tests/validate/test_ratchet_serving.py",
    }
    for f, s in summaries.items():
        out[f] = {
            m: {"n": v["n"], "median_abs_error": round(v["median_abs_error"], 6)}
            for m, v in s.items()
            if v["n"]
        }
    return out


def _worse(stored: dict, now: dict) -> list[str]:
    bad = []
    for f in FILES:
        for m, old in stored[f].items():
            new = now[f].get(m, {"n": 0, "median_abs_error": float("inf")})
            if new["n"] < old["n"]:
                bad.append(f"{f} {m}: {new['n']} points covered, was {old['n']}")
            elif new["median_abs_error"] > old["median_abs_error"] + TOL:
                bad.append(
                    f"{f} {m}: median |error| {new['median_abs_error']:.4f}, "
                    f"was {old['median_abs_error']:.4f}"
                )
    return bad


def test_public_serving_scoreboards_only_improve(summaries):
    stored = json.loads(RATCHET.read_text())
    now = _snapshot(summaries)
    bad = _worse(stored, now)
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


def test_the_ratchet_catches_a_regression():
    stored = {f: {"ttft": {"n": 10, "median_abs_error": 0.2}} for f in FILES}
    worse = {f: {"ttft": {"n": 10, "median_abs_error": 0.25}} for f in FILES}
    fewer = {f: {"ttft": {"n": 9, "median_abs_error": 0.1}} for f in FILES}
    assert len(_worse(stored, worse)) == 2 and len(_worse(stored, fewer)) == 2
    assert _worse(stored, stored) == []
