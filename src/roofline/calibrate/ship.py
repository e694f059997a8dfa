"""`roofline calibrate --from-runs FILE`: read, fit, cross-validate, and write what ships —
the fitted profile (only what was fitted, over its base, with its provenance) and the CV
tables in the docs.

    roofline calibrate --from-runs training \\
        --out src/roofline/specs/profiles/fitted.toml --docs docs/calibration.md

regenerates the shipped default profile (`specs/profiles/fitted.toml`) and the tables of
docs/calibration.md from the public runs (`shared/reference/measured_training.yaml`, shipped
as `validate/measured_training.yaml`, short name `training`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from roofline.calibrate import render, scales
from roofline.calibrate.evaluate import default_jobs
from roofline.calibrate.runs import (
    RunsCalibration,
    calibrate_cases,
    cases_from_file,
    pooled_for_uncovered,
    predict_cases,
    tidy,
)
from roofline.calibrate.write import toml_key, toml_value
from roofline.specs.catalog import is_file
from roofline.specs.efficiency import PROFILE_DIR, load_profile

BEGIN, END = "<!-- calibrate:cv-table:begin -->", "<!-- calibrate:cv-table:end -->"
POOLED_WHY = (
    "no runs of this framework: the mean of the fitted frameworks' overheads, the pool the fit"
    " shrinks each framework's towards (provenance.pooled)"
)


def calibrate_from_runs(
    path: str | Path,
    *,
    framework: str | None = None,
    base: str = "datasheet",
    out: str | None = None,
    docs: str | None = None,
    cv: bool = True,
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> RunsCalibration:
    """The command: read runs with roofline.validate, fit, cross-validate, write."""
    prof = load_profile(base)
    cases, unmapped = cases_from_file(path, prof)
    res = calibrate_cases(
        cases,
        predict_cases,
        base=prof,
        framework=framework,
        cv=cv,
        jobs=default_jobs() if jobs is None else jobs,
        progress=progress,
    )
    res = replace(res, skipped={**unmapped, **res.skipped})
    cmd = f"roofline calibrate --from-runs {path}" + (
        f" --framework {framework}" if framework else ""
    )
    cmd += (f" --out {out}" if out else "") + (f" --docs {docs}" if docs else "")
    res = replace(res, profile=replace(res.profile, provenance=provenance(res, path, base, cmd)))
    written = []
    if out:
        Path(out).write_text(profile_text(res, base))
        written.append(out)
    if docs:
        write_cv_docs(docs, res, cmd)
        written.append(docs)
    return replace(res, written=tuple(written))


# -- provenance and the profile file --------------------------------------------------------


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def runs_path(path: str | Path) -> Path:
    from roofline.validate.runfile import resolve_path

    return resolve_path(path)


def base_path(base: str) -> Path | None:
    p = Path(base)
    if is_file(p):
        return p
    named = PROFILE_DIR / f"{base}.toml"
    return named if is_file(named) else None


def provenance(res: RunsCalibration, path: str | Path, base: str, command: str) -> dict[str, Any]:
    """How the profile was made: what `[provenance]` records and the tests check."""
    bp = base_path(base)
    out: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).date().isoformat(),
        "command": command,
        "runs_file": str(path),
        "runs_sha256": sha256_of(runs_path(path)),
        "base": base,
        "base_sha256": sha256_of(bp) if bp else "",
    }
    rf = res.fit
    if rf is None:
        return out
    r = rf.result
    out["runs"] = len(rf.cases)
    out["fitted"] = tidy({n: r.values[n] for n in r.fitted})
    out["pooled"] = pooled_for_uncovered(out["fitted"], rf.cases)
    out["refused"] = {x.name: x.reason for x in r.refused}
    out["in_sample_before"] = render.error_summary(r.error_before)
    out["in_sample_after"] = render.error_summary(r.error_after)
    for cv in rf.cv:
        key = "cv_" + cv.by.replace(" ", "_")
        out[key + "_before"] = render.error_summary(cv.error_before)
        out[key + "_after"] = render.error_summary(cv.error_after)
    return out


def profile_text(res: RunsCalibration, base: str) -> str:
    """The fitted profile as TOML over its base: only the values the fit changed."""
    prof, rf = res.profile, res.fit
    cmd = prof.provenance.get("command", "roofline calibrate --from-runs")
    lines = [
        "# Measured-calibrated efficiency profile: the datasheet physics times a few factors fitted",
        "# on measured training runs through the step model (docs/calibration.md has the CV tables).",
        f"# Regenerate: {cmd}",
        "# Written by that command; do not edit by hand.",
        f"name = {toml_value(prof.name)}",
        f"base = {toml_value(base)}",
        f"source = {toml_value(prof.source)}",
        f"calibrated = {toml_value(prof.calibrated)}",
        "",
        "[provenance]",
    ]
    lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in prof.provenance.items()]
    values = {} if rf is None else tidy({n: rf.result.values[n] for n in rf.result.fitted})
    base_prof = load_profile(base)
    for fam in base_prof.families:
        lines += _family_lines(fam, values)
    pooled = {} if rf is None else pooled_for_uncovered(values, rf.cases)
    for vals, why in (
        (values, "fitted by roofline calibrate --from-runs (provenance above)"),
        (pooled, POOLED_WHY),
    ):
        for fw, ovh in sorted(scales.framework_values(vals).items()):
            lines += ["", f"[framework.{toml_key(fw)}]", "calibrated = true"]
            lines.append(f"source = {toml_value(why)}")
            lines += [f"{k} = {toml_value(v)}" for k, v in sorted(ovh.items())]
    return "\n".join(lines) + "\n"


def _family_lines(fam: Any, values: dict[str, float]) -> list[str]:
    changed = scales.family_values(fam, values)
    if not changed:
        return []
    head = ["", f"[family.{toml_key(fam.family)}]"]
    mm = {k.split(".", 1)[1]: v for k, v in changed.items() if k.startswith("mm_fraction.")}
    body = [f"mm_fraction = {toml_value(mm)}"] if mm else []
    body += [f"{k} = {toml_value(v)}" for k, v in changed.items() if "." not in k]
    why = {}
    for kind, keys in (
        ("gemm_scale", ("mm_fraction",)),
        ("attn_scale", ("attn_fwd", "attn_bwd")),
        ("vector_scale", ("vector",)),
    ):
        f = [n for n in (kind, f"{kind}@{fam.family}") if n in values]
        if f and any(k.split(".")[0] in keys for k in changed):
            text = " x ".join(f"{n} {values[n]:.4g}" for n in f)
            for k in keys:
                why[k] = f"datasheet x {text} (calibrate --from-runs; provenance above)"
    if "lowp_scale" in values and any(d in scales.LOW_PRECISION for d in mm):
        why["mm_fraction"] = (
            why.get("mm_fraction", "datasheet")
            + f"; fp8/fp4 also x lowp_scale {values['lowp_scale']:.4g}"
        )
    src = [f"[family.{toml_key(fam.family)}.sources]"] + [
        f"{k} = {toml_value(v)}" for k, v in why.items()
    ]
    return head + body + src


# -- text and docs ---------------------------------------------------------------------------


def write_cv_docs(path: str | Path, res: RunsCalibration, command: str) -> None:
    """Replace the text between the CV-table markers of `path` with this calibration's tables."""
    body = f"Generated by `{command}`.\n\n```text\n{runs_text(res, docs=True)}\n```\n"
    render.write_between(path, BEGIN, END, body)


def runs_text(res: RunsCalibration, docs: bool = False) -> str:
    out = []
    rf = res.fit
    if rf is not None:
        r = rf.result
        fams = sorted({c.family for c in rf.cases})
        fws = sorted({c.framework for c in rf.cases})
        out.append(
            f"{len(rf.cases)} runs ({len(fams)} chip families: {', '.join(fams)}; "
            f"frameworks: {', '.join(fws)})."
        )
        out.append(
            "Throughput error = predicted / measured - 1. In-sample: median |error| "
            f"{render.apct(render.median_abs(r.error_before))} (datasheet) -> {render.apct(render.median_abs(r.error_after))} (fitted); "
            f"bias {render.pct(render.median_bias(r.error_before))} -> {render.pct(render.median_bias(r.error_after))}."
        )
        out += ["", render.fit_table(r, lambda n: scales.parse(n).bounds, _support(rf))]
        for cv in rf.cv:
            out += ["", _cv_title(cv.by), render.cv_table(cv)]
        if not docs:
            out += ["", f"({rf.evaluations} step-model evaluations)"]
    if res.skipped:
        out += ["", f"Runs not used ({len(res.skipped)}):"]
        out += [f"- {k}: {v}" for k, v in res.skipped.items()]
    out += [f"Note: {n}" for n in res.notes]
    out += ["", f"Profile: {res.profile.describe()}"]
    out += [f"Wrote {w}" for w in res.written]
    return "\n".join(out)


def _cv_title(by: str) -> str:
    what = {
        "source": "a held-out source's framework, when no other source runs it, takes the mean of the fitted frameworks' overheads",
        "chip family": "a held-out family takes the shared factors (its own deviation is not fitted)",
    }[by]
    return f"Leave-one-{by}-out ({what}); before = datasheet, after = the fold's fit:"


def _support(rf: Any) -> dict[str, int]:
    from roofline.calibrate.runs import masks_of

    return {n: int(m.sum()) for n, m in masks_of(rf.params, rf.cases).items()}


__all__ = ["calibrate_from_runs", "profile_text", "provenance", "runs_text", "write_cv_docs"]
