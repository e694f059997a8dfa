"""The public training scoreboard may only improve.

`ratchet_training.json` holds the runs `roofline validate --runs training` covers (default
profile, framework auto) and the median |error| over exactly those runs. The test fails when
a run it covered is no longer covered, or when the median |error| over the ratchet's runs
rises beyond a tiny tolerance. Newly covered runs (a chip added to the catalog, say) never
fail it. When a change improves the numbers or covers more runs, update the file
(docs/validate.md, "The ratchet"):

    ROOFLINE_UPDATE_RATCHET=1 python -m pytest tests/validate/test_ratchet.py

which rewrites it only if nothing got worse.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

RATCHET = Path(__file__).with_name("ratchet_training.json")
TOL = 0.002  # 0.2 percentage points of median |error|: float noise, not a regression budget


def _snapshot(report) -> dict:
    s = report.summary()
    covered = sorted(r.run.id for r in report.results if r.covered)
    return {
        "what": "roofline validate --runs training (default profile, framework auto)",
        "update": "ROOFLINE_UPDATE_RATCHET=1 python -m pytest tests/validate/test_ratchet.py",
        **{
            k: round(s[k], 6) if isinstance(s[k], float) else s[k]
            for k in (
                "n",
                "n_total",
                "coverage",
                "median_abs_error",
                "mean_abs_error",
                "bias",
                "within_10",
                "within_20",
            )
        },
        "covered": covered,
    }


def _median_over(report, ids: list[str]) -> float:
    err = {r.run.id: abs(r.error) for r in report.results if r.covered}
    return float(np.median([err[i] for i in ids]))


def test_public_training_scoreboard_only_improves(training_report):
    stored = json.loads(RATCHET.read_text())
    now = _snapshot(training_report)
    lost = sorted(set(stored["covered"]) - set(now["covered"]))
    median_same_runs = _median_over(training_report, stored["covered"]) if not lost else None
    worse = bool(lost) or median_same_runs > stored["median_abs_error"] + TOL
    if os.environ.get("ROOFLINE_UPDATE_RATCHET") and not worse:
        RATCHET.write_text(json.dumps(now, indent=1) + "\n")
        return
    assert not lost, f"runs no longer covered: {lost}"
    assert median_same_runs <= stored["median_abs_error"] + TOL, (
        f"median |error| over the ratchet's {len(stored['covered'])} runs rose to "
        f"{median_same_runs:.4f} from {stored['median_abs_error']:.4f}"
    )


def test_the_ratchet_file_is_consistent():
    stored = json.loads(RATCHET.read_text())
    assert stored["n_total"] == 78 and stored["n"] == len(stored["covered"])
    assert 0 < stored["median_abs_error"] < 10


def test_every_measured_run_is_predicted_to_fit(training_report):
    """A run that ran must fit (issue 19): the memory model may not refuse a published plan that
    ran. Memory is not fitted, so this checks the memory model itself on every covered run."""
    refused = {
        r.run.id: r.prediction.get("memory_note")
        for r in training_report.results
        if r.covered and r.prediction.get("fits") is False
    }
    assert not refused, refused
