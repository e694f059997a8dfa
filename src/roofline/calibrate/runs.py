"""`calibrate --from-runs`: fit the physical parameters per chip family x framework on
measured training runs, with leave-one-source-out and leave-one-chip-family-out CV.

The interface is small: a list of `RunCase`s (id, source, chip family, framework, the chip,
the measured tokens/s per chip, and whatever the predictor needs) and a predictor
`(profile, cases) -> predicted tokens/s per chip` (NaN where a run cannot be predicted).
`roofline.validate` supplies both for files in the measured_training.yaml schema
(`cases_from_file`); tests use synthetic ones whose true parameters are known.

Only physical parameters are fitted, per chip family (the large-GEMM ceiling per dtype,
attention forward/backward, grouped GEMMs, HBM, elementwise, link tiers, k roll-off, kernel
time) and per framework (per-step and per-layer overheads); never a per-run factor. What the
runs cannot identify is refused with the reason (see `fit.identify`) and keeps its datasheet
value. A framework's fit is stored as that framework's overrides in the written profile
(`profile.for_framework(name)` applies it); the fit over all runs sets the families.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.calibrate.fit import CrossValidation, FitResult, Problem, cross_validate, fit
from roofline.specs.efficiency import OVERHEADS, Efficiency, load_profile

# Candidate parameters per chip family, primary physics first (identify() keeps this order).
# Kernel-level physics that end-to-end runs cannot separate from the rest (the k roll-off,
# the fixed kernel time, tiles) is left to `calibrate --device`.
FAMILY_CANDIDATES = (
    "mm_fraction.bf16",
    "mm_fraction.fp8",
    "attn_fwd",
    "attn_bwd",
    "grouped_fraction",
    "link.nvlink",
    "link.ici",
    "link.scale_out",
    "link.dcn",
    "hbm",
    "vector",
)
PROFILE_CANDIDATES = ("step_overhead_s", "layer_overhead_s")
_ORDER = (*FAMILY_CANDIDATES[:9], *PROFILE_CANDIDATES, *FAMILY_CANDIDATES[9:])
CV_GROUPINGS = ("source", "chip family")


@dataclass(frozen=True)
class RunCase:
    id: str
    source: str
    family: str  # the profile's chip family key ("hopper", "tpu-v5p", ...)
    framework: str
    chip: Any
    measured_tokens_per_s_per_chip: float
    payload: Any = None


Predictor = Callable[[Efficiency, Sequence[RunCase]], np.ndarray]


@dataclass(frozen=True)
class FrameworkFit:
    framework: str  # "" = all runs
    cases: tuple[RunCase, ...]
    names: tuple[str, ...]
    result: FitResult
    cv: tuple[CrossValidation, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework or "all",
            "runs": [c.id for c in self.cases],
            "candidates": list(self.names),
            "fit": self.result.to_dict(),
            "cv": [cv.to_dict() for cv in self.cv],
        }


@dataclass(frozen=True)
class RunsCalibration:
    profile: Efficiency
    fits: tuple[FrameworkFit, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)  # run id -> why it was not used
    written: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.to_dict(),
            "fits": [f.to_dict() for f in self.fits],
            "skipped": dict(self.skipped),
            "written": list(self.written),
        }


# -- parameters <-> profile -------------------------------------------------------------------


def _split(values: Mapping[str, float]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    fams: dict[str, dict[str, float]] = {}
    ovh: dict[str, float] = {}
    for k, v in values.items():
        if "/" in k:
            fam, name = k.split("/", 1)
            fams.setdefault(fam, {})[name] = float(v)
        else:
            ovh[k] = float(v)
    return fams, ovh


def apply(profile: Efficiency, values: Mapping[str, float]) -> Efficiency:
    """`profile` with family parameters ('hopper/hbm') and profile overheads set."""
    fams, ovh = _split(values)
    for fam, vals in fams.items():
        profile = profile.with_family(profile.family_named(fam).with_params(vals))
    return replace(profile, **ovh)


def candidates(profile: Efficiency, cases: Sequence[RunCase]) -> tuple[list[str], dict[str, float]]:
    """Candidate names for the families the runs touch, and their current (prior) values."""
    names, prior = [], {}
    fams = sorted({c.family for c in cases})
    for fam in fams:
        phys = profile.family_named(fam)
        p = phys.params()
        for n in FAMILY_CANDIDATES:
            key = f"{fam}/{n}"
            names.append(key)
            if n in p:
                prior[key] = p[n]
            elif n.startswith("mm_fraction."):
                prior[key] = phys.mm_ceiling(n.split(".", 1)[1])
            else:  # a link tier the family does not list: the profile's constant
                prior[key] = float(profile.link)
    for n in PROFILE_CANDIDATES:
        names.append(n)
        prior[n] = float(getattr(profile, n))
    # primary physics of every family first, then the secondary ones
    order = {n: i for i, n in enumerate(_ORDER)}
    names.sort(key=lambda k: order[k.rsplit("/", 1)[-1]])
    return names, prior


# -- the fit ----------------------------------------------------------------------------------


def build_problem(
    base: Efficiency, cases: Sequence[RunCase], predictor: Predictor
) -> tuple[Problem, list[str]]:
    names, prior = candidates(base, cases)
    measured = np.array([c.measured_tokens_per_s_per_chip for c in cases], float)

    def predict(values: Mapping[str, float], idx: np.ndarray) -> np.ndarray:
        return np.asarray(predictor(apply(base, values), [cases[i] for i in idx]), float)

    labels = {"source": [c.source for c in cases], "chip family": [c.family for c in cases]}
    return Problem(
        tuple(c.id for c in cases), measured, predict, prior, labels, "tokens_per_s_per_chip"
    ), names


def fit_cases(
    base: Efficiency,
    cases: Sequence[RunCase],
    predictor: Predictor,
    framework: str = "",
    cv: bool = True,
) -> FrameworkFit:
    problem, names = build_problem(base, cases, predictor)
    result = fit(problem, names, loss="soft_l1")
    cvs = tuple(
        cross_validate(problem, names, by, loss="soft_l1")
        for by in CV_GROUPINGS
        if cv and len(set(problem.labels[by])) > 1
    )
    return FrameworkFit(framework, tuple(cases), tuple(names), result, cvs)


def usable(
    base: Efficiency, cases: Sequence[RunCase], predictor: Predictor
) -> tuple[list[RunCase], dict[str, str]]:
    """Cases the base profile can predict (and whose chip a family covers); the rest, with why."""
    keep, skipped = [], {}
    fams = {f.family for f in base.families}
    for c in cases:
        if c.family not in fams:
            skipped[c.id] = f"chip family {c.family!r} is not in profile {base.name!r}"
    rest = [c for c in cases if c.id not in skipped]
    pred = np.asarray(predictor(base, rest), float) if rest else np.zeros(0)
    for c, p in zip(rest, pred, strict=True):
        if np.isfinite(p) and p > 0:
            keep.append(c)
        else:
            skipped[c.id] = "the model cannot predict this run (see `roofline validate`)"
    return keep, skipped


def calibrate_cases(
    cases: Sequence[RunCase],
    predictor: Predictor,
    *,
    base: str | Efficiency = "datasheet",
    framework: str | None = None,
    min_runs: int = 3,
    cv: bool = True,
) -> RunsCalibration:
    """Fit on all runs (the families) and per framework (its overrides), each cross-validated."""
    prof = load_profile(base)
    keep, skipped = usable(prof, cases, predictor)
    if framework:
        keep = [c for c in keep if c.framework == framework]
    fits = []
    pooled = fit_cases(prof, keep, predictor, cv=cv) if len(keep) >= 3 else None
    if pooled is not None and not framework:
        fits.append(pooled)
        prof = apply(prof, {k: pooled.result.values[k] for k in pooled.result.fitted})
    frameworks = dict(prof.frameworks)
    for fw in sorted({c.framework for c in keep}):
        sub = [c for c in keep if c.framework == fw]
        if len(sub) < min_runs:
            for c in sub:
                skipped.setdefault(
                    c.id,
                    f"framework {fw!r} has {len(sub)} usable runs (< {min_runs}): not fitted alone",
                )
            continue
        ff = fit_cases(prof, sub, predictor, fw, cv=cv)
        fits.append(ff)
        frameworks[fw] = MappingProxyType(_override(ff))
    fitted = replace(
        prof,
        name="fitted" if not framework else f"fitted-{framework}",
        calibrated=bool(fits),
        source=f"roofline calibrate --from-runs on {len(keep)} runs"
        + (f" (framework {framework})" if framework else ""),
        frameworks=MappingProxyType(frameworks),
    )
    return RunsCalibration(fitted, tuple(fits), skipped)


def _override(ff: FrameworkFit) -> dict[str, Any]:
    fams, ovh = _split({k: ff.result.values[k] for k in ff.result.fitted})
    return {"calibrated": True, **ovh, "families": fams}


# -- files ------------------------------------------------------------------------------------


def calibrate_from_runs(
    path: str | Path,
    *,
    framework: str | None = None,
    base: str = "datasheet",
    out: str | None = None,
    docs: str | None = None,
) -> RunsCalibration:
    """The command: read runs with roofline.validate, fit, cross-validate, write."""
    from roofline.calibrate.write import profile_to_toml
    from roofline.validate.calibration import cases_from_file, predict_cases  # h3-validate

    cases = cases_from_file(path, framework=framework)
    res = calibrate_cases(cases, predict_cases, base=base, framework=framework)
    written = []
    if out:
        head = (
            f"Written by `roofline calibrate --from-runs {path}"
            + (f" --framework {framework}" if framework else "")
            + "`."
        )
        Path(out).write_text(profile_to_toml(res.profile, head))
        written.append(out)
    if docs:
        write_cv_docs(
            docs,
            res,
            f"roofline calibrate --from-runs {path}"
            + (f" --framework {framework}" if framework else "")
            + (f" --out {out}" if out else ""),
        )
        written.append(docs)
    return replace(res, written=tuple(written))


BEGIN, END = "<!-- calibrate:cv-table:begin -->", "<!-- calibrate:cv-table:end -->"


def write_cv_docs(path: str | Path, res: RunsCalibration, command: str) -> None:
    """Replace the text between the CV-table markers of `path` with this calibration's tables."""
    p = Path(path)
    text = p.read_text() if p.exists() else f"{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = f"Generated by `{command}`.\n\n```\n{runs_text(res)}\n```\n"
    p.write_text(head + BEGIN + "\n" + body + END + tail)


def runs_text(res: RunsCalibration) -> str:
    from roofline.calibrate import render

    out = []
    for ff in res.fits:
        who = "all runs" if not ff.framework else f"framework {ff.framework}"
        before, after = (
            render.apct(_med(ff.result.error_before)),
            render.apct(_med(ff.result.error_after)),
        )
        out.append(f"== {who}: {len(ff.cases)} runs ==")
        out.append(f"throughput median |error| (in-sample): datasheet {before}, fitted {after}")
        out.append(render.fit_table(ff.result))
        for cv in ff.cv:
            out += ["", f"Leave-one-{cv.by}-out (held-out runs; error = predicted/measured - 1):"]
            out.append(render.cv_table(cv))
        out.append("")
    if res.skipped:
        out.append(f"Runs not used ({len(res.skipped)}):")
        out += [f"- {k}: {v}" for k, v in res.skipped.items()]
    out.append(f"Profile: {res.profile.describe()}")
    out += [f"Wrote {w}" for w in res.written]
    return "\n".join(out)


def _med(e: np.ndarray) -> float | None:
    return float(np.median(np.abs(e))) if len(e) else None


__all__ = [
    "RunCase",
    "Predictor",
    "RunsCalibration",
    "FrameworkFit",
    "calibrate_cases",
    "calibrate_from_runs",
    "runs_text",
    "write_cv_docs",
    "OVERHEADS",
]
