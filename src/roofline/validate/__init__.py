"""`roofline validate`: predict published measured runs from their configs; report the error.

>>> from roofline.validate import validate
>>> report = validate("training")             # the public training runs shipped with roofline
>>> report.summary()["n"] > 0
True

`validate(runs)` reads a runs file (schema detected from content: training, inference or
serving), maps every entry to the tool's inputs (defaults written down per run), predicts it
and returns a report whose `to_dict()` is the `--json` document. docs/validate.md documents
every default, FLOP convention and skip rule.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from roofline.errors import SpecError
from roofline.specs.catalog import DATA_DIR as SPEC_DIR
from roofline.specs.catalog import is_file
from roofline.specs.efficiency import PEAK, Efficiency, load_efficiency
from roofline.specs.schema import violation
from roofline.validate.runfile import BUILTIN, RunFile, Schema, load_runs
from roofline.validate.scoreboard import TrainingReport, validate_training
from roofline.validate.serving_runs import ServingRun, map_serving_run
from roofline.validate.serving_score import (
    ServingPrediction,
    ServingPredictor,
    ServingReport,
    validate_serving,
)
from roofline.validate.training_runs import TrainingRun, map_training_run

PROFILE_DIR = SPEC_DIR / "profiles"


def load_profile(profile: str | Path | Efficiency | None) -> Efficiency | None:
    """`None`/'default' (the project default, see `profile_used`: the 'fitted' profile),
    'peak', a named profile in specs/profiles/, or a profile TOML file."""
    if profile is None or isinstance(profile, Efficiency):
        return profile
    s = str(profile)
    if s == "default":
        return None
    if s == "peak":
        return PEAK
    if s.endswith(".toml") or is_file(s):
        return load_efficiency(s)
    named = PROFILE_DIR / f"{s}.toml"
    if is_file(named):
        return load_efficiency(named)
    names = sorted(p.stem for p in PROFILE_DIR.glob("*.toml")) if PROFILE_DIR.is_dir() else []
    raise SpecError(
        f"unknown efficiency profile {s!r}",
        rule="a profile is 'default', 'peak', "
        + (", ".join(names) + ", " if names else "")
        + "or a TOML file",
        fix="write --profile default or --profile path/to/profile.toml",
    )


def profile_used(eff: Efficiency | None) -> Efficiency:
    """The profile predictions run under: the one given, else the project default
    (specs.efficiency.DEFAULT_PROFILE, what `roofline train` uses too)."""
    from roofline.training.step import training_profile

    return training_profile(eff)


def _dedupe(runs: list) -> list:
    """A repeated id is skipped (the first entry with that id is kept)."""
    seen: set[str] = set()
    out = []
    for r in runs:
        if r.id in seen:
            r = replace(
                r, skipped_reason=f"duplicate id {r.id!r} (the first entry with it is used)"
            )
        seen.add(r.id)
        out.append(r)
    return out


def validate(
    runs: str | Path | RunFile,
    *,
    profile: str | Path | Efficiency | None = None,
    framework: str = "auto",
    planner: bool = False,
    predictor: ServingPredictor | None = None,
) -> TrainingReport | ServingReport:
    """Validate a runs file (path or 'training' / 'inference' / 'serving')."""
    if framework not in ("auto", "none", ""):
        from roofline.core.stack import stack_of
        from roofline.errors import UnknownNameError
        from roofline.specs.framework import framework_names

        try:  # an unknown stack is a one-paragraph error, not a silent no-op
            stack_of(framework)
        except UnknownNameError as e:
            raise UnknownNameError(
                e.what,
                rule="validate's --framework is auto (each run's own stack), none (no profile), "
                + "one of "
                + ", ".join(framework_names())
                + ", or a path to a framework TOML file",
                fix="pass --framework auto, or one of the stacks named",
            ) from None
    rf = runs if isinstance(runs, RunFile) else load_runs(runs)
    eff = load_profile(profile)
    name = profile_used(eff).describe(handoff=rf.schema != Schema.TRAINING)
    if rf.schema == Schema.TRAINING:
        return validate_training(
            mapped_runs(rf), efficiency=eff, profile_name=name, framework=framework, planner=planner
        )
    return validate_serving(mapped_runs(rf), rf.schema.value, efficiency=eff, predictor=predictor)


def mapped_runs(rf: RunFile) -> list:
    """Every entry of a runs file as a typed run of its schema (TrainingRun or ServingRun),
    mapped or with the reason it is not; a repeated id keeps its first entry."""
    if rf.schema == Schema.TRAINING:
        runs = [map_training_run(e) for e in rf.entries]
    else:
        runs = [map_serving_run(e, rf.schema.value) for e in rf.entries]
    runs = _dedupe([_schema_checked(r, e, rf.path) for r, e in zip(runs, rf.entries, strict=True)])
    return runs if rf.schema == Schema.TRAINING else _sweeps_checked(runs)


def _sweeps_checked(runs: list) -> list:
    """Serving runs whose sweep holds a run its stated layout cannot hold are not scored
    (validate.serving_bounds, "Its sweep")."""
    from roofline.validate.serving_bounds import mislabelled_sweeps, sibling_violation

    sweeps = mislabelled_sweeps(runs)
    if not sweeps:
        return runs
    out = []
    for r in runs:
        why = sibling_violation(r, sweeps)
        out.append(replace(r, skipped_reason=why) if why else r)
    return out


def _schema_checked(run: Any, entry: Any, origin: str) -> Any:
    """A run the hand checks mapped is still skipped if its entry breaks the runs schema
    (roofline.specs.schema: an unknown or misspelt key, a wrong type); their reasons come first."""
    if run.skipped_reason:
        return run
    err = violation("runs", entry, origin, part="entry")
    if err is None:
        return run
    what = err.what.removeprefix(f"runs file {origin}: ")
    return replace(run, skipped_reason=f"schema: {what}; {err.rule}")


__all__ = [
    "mapped_runs",
    "BUILTIN",
    "RunFile",
    "Schema",
    "ServingPrediction",
    "ServingPredictor",
    "ServingReport",
    "ServingRun",
    "TrainingReport",
    "TrainingRun",
    "load_profile",
    "load_runs",
    "profile_used",
    "map_serving_run",
    "map_training_run",
    "validate",
]
