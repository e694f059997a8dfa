"""`calibrate --from-runs`: fit a few physical factors on measured training runs through the
real step model, with leave-one-source-out and leave-one-chip-family-out cross-validation.

The interface is small: a list of `RunCase`s (id, source, chip family, framework, compute
dtype, the chip, the measured tokens/s per chip, and whatever the predictor needs) and a
predictor `(profile, cases) -> predicted tokens/s per chip` (NaN where a run cannot be
predicted). `roofline.validate` supplies both for files in the measured_training.yaml schema
(`cases_from_file`, `predict_cases`: the published plan with `--framework auto`, the run's
stack and precision recipe); tests use synthetic ones whose true parameters are known.

What is fitted (`calibrate.scales`): a shared GEMM scale with partially pooled per-family
deviations, a low-precision GEMM scale, an attention scale, an elementwise scale, and fixed
overheads per framework — never a per-run factor. What the runs cannot identify (too few runs
in a parameter's scope, no run depending on it, collinear with a parameter already taken) is
refused with the reason and keeps its starting value (`fit.identify`). The command, the
profile file and the docs table are in `calibrate.ship`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from roofline.calibrate import scales
from roofline.calibrate.evaluate import Evaluator, Predictor
from roofline.calibrate.fit import CrossValidation, FitResult, Problem, cross_validate, fit
from roofline.specs.efficiency import Efficiency, load_profile

CV_GROUPINGS = ("source", "chip family")
# Fewest runs in a parameter's scope for it to be fitted: a family with 2 runs keeps the shared
# GEMM scale, a framework with 2 runs its sourced overheads.
MIN_RUNS = 3
# Predicted throughput to ~0.1%: scipy's ftol on the cost, xtol (its root) in unit coordinates.
RUNS_TOL = 1e-5
# Finite-difference step in unit coordinates: large enough that a discrete choice inside the
# step model (an option flipping) does not dominate a derivative.
DIFF_STEP = 2e-3


@dataclass(frozen=True)
class RunCase:
    id: str
    source: str
    family: str  # the profile's chip family key ("hopper", "tpu-v5p", ...)
    framework: str
    chip: Any
    measured_tokens_per_s_per_chip: float
    payload: Any = None
    dtype: str = "bf16"  # the dense GEMMs' compute dtype
    tokens_per_step_per_chip: float | None = None  # turns tokens/s into step time


@dataclass(frozen=True)
class RunsFit:
    cases: tuple[RunCase, ...]
    params: tuple[scales.FitParam, ...]
    result: FitResult
    cv: tuple[CrossValidation, ...]
    evaluations: int = 0  # step-model calls the fit and CV made

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": [c.id for c in self.cases],
            "candidates": list(self.names),
            "fit": self.result.to_dict(),
            "cv": [cv.to_dict() for cv in self.cv],
            "step_model_evaluations": self.evaluations,
        }


@dataclass(frozen=True)
class RunsCalibration:
    profile: Efficiency
    fit: RunsFit | None
    skipped: Mapping[str, str] = field(default_factory=dict)  # run id -> why it was not used
    written: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.to_dict(),
            "fit": None if self.fit is None else self.fit.to_dict(),
            "skipped": dict(self.skipped),
            "written": list(self.written),
            "notes": list(self.notes),
        }


# -- the problem -----------------------------------------------------------------------------


def masks_of(params: Sequence[scales.FitParam], cases: Sequence[RunCase]) -> dict[str, np.ndarray]:
    return {
        p.name: np.array([p.covers(c.family, c.framework, c.dtype) for c in cases], bool)
        for p in params
    }


def build_problem(
    base: Efficiency,
    cases: Sequence[RunCase],
    evaluator: Evaluator,
    params: Sequence[scales.FitParam],
) -> Problem:
    names = [p.name for p in params]
    by_name = {p.name: p for p in params}
    prior = {p.name: _start(base, p) for p in params}
    masks = evaluator.masks
    labels = {"source": [c.source for c in cases], "chip family": [c.family for c in cases]}
    return Problem(
        tuple(c.id for c in cases),
        np.array([c.measured_tokens_per_s_per_chip for c in cases], float),
        lambda values, idx: evaluator(values, idx),
        {n: prior[n] for n in names},
        labels,
        "tokens_per_s_per_chip",
        scope=lambda n: masks[n],
        bounds=lambda n: by_name[n].bounds,
        prior_weight=scales.prior_weights(params),
        products=scales.products(params),
        min_rows=MIN_RUNS,
        scope_name=lambda n: by_name[n].scope_name(),
        fill=scales.fill_unfitted,
        pools=_sensitivities(evaluator, prior, scales.pools(params), by_name),
        pool_runs=scales.OVERHEAD_POOL_RUNS,
    )


# Step (a fraction of a parameter's bound range) of the pooled parameters' sensitivities.
SENSITIVITY_STEP = 1e-4


def _sensitivities(
    evaluator: Evaluator,
    prior: Mapping[str, float],
    pools: Mapping[str, str],
    by_name: Mapping[str, scales.FitParam],
) -> dict[str, tuple[str, np.ndarray]]:
    """{pooled parameter: (its pool, |d log(predicted) / d value| per run at the prior)}: how
    much a second of a framework's overhead moves each of its runs (0 outside its scope)."""
    out = {}
    for n, group in pools.items():
        rows = np.flatnonzero(evaluator.masks[n])
        sens = np.zeros(len(evaluator.cases))
        if len(rows):
            b = by_name[n].bounds
            h = SENSITIVITY_STEP * (b.hi - b.lo)
            v = prior[n] + h if prior[n] + h <= b.hi else prior[n] - h
            p0 = np.asarray(evaluator(prior, rows), float)
            p1 = np.asarray(evaluator({**prior, n: v}, rows), float)
            sens[rows] = np.abs(np.log(p1 / p0)) / h
        out[n] = (group, sens)
    return out


def _start(base: Efficiency, p: scales.FitParam) -> float:
    """A candidate's starting value: a framework overhead is the base's (its override, else the
    profile's); a factor starts at 1."""
    if p.framework:
        return float(getattr(base.for_framework(p.framework), p.kind))
    return p.start


# The per-step overhead shortcut (calibrate.evaluate) must agree with the step model.
ADDITIVE_TOL = 1e-6


def fit_runs(
    base: Efficiency,
    cases: Sequence[RunCase],
    predictor: Predictor,
    *,
    cv: bool = True,
    jobs: int = 1,
    kinds: Sequence[str] | None = None,
    cv_by: Sequence[str] = CV_GROUPINGS,
    progress: Callable[[str], None] | None = None,
    per_layer: bool = True,
) -> RunsFit:
    """The joint fit over `cases`, then each CV grouping's folds (starting from the fit).
    `kinds`: which candidates (entries of `scales.ORDER`; default `scales.DEFAULT_KINDS`).
    `per_layer`: per-layer overheads by their measured slopes (`calibrate.evaluate`); if the
    fitted values leave a run's linear piece, the fit starts again without the shortcut."""
    params = [
        p
        for p in scales.candidates([c.family for c in cases], [c.framework for c in cases])
        if p.key in (scales.DEFAULT_KINDS if kinds is None else kinds)
    ]
    masks = masks_of(params, cases)
    additive = {p.name: _start(base, p) for p in params if p.kind == "step_overhead_s"}
    layer = {p.name: _start(base, p) for p in params if p.kind == "layer_overhead_s"}
    tokens = [c.tokens_per_step_per_chip for c in cases]
    ev = Evaluator(
        base,
        cases,
        masks,
        predictor,
        scales.apply,
        jobs,
        additive,
        tokens,
        layer if per_layer else None,
    )
    with ev:
        problem = build_problem(base, cases, ev, params)
        names = [p.name for p in params]
        if progress:
            progress(f"fitting {len(cases)} runs, {len(names)} candidates")
        kw = {"loss": "soft_l1", "tol": RUNS_TOL, "diff_step": DIFF_STEP}
        result = fit(problem, names, **kw)
        gap = ev.check_additive(result.values, range(len(cases)))
        if gap <= ADDITIVE_TOL:
            if progress:
                progress(f"  fitted ({ev.evaluated} step-model calls so far)")
            start = {n: result.values[n] for n in result.fitted}
            cvs = tuple(
                cross_validate(problem, names, by, start=start, progress=progress, **kw)
                for by in cv_by
                if cv and len(set(problem.labels[by])) > 1
            )
            gap = _held_out_gap(ev, problem, cvs)
        if gap <= ADDITIVE_TOL:
            return RunsFit(tuple(cases), tuple(params), result, cvs, ev.evaluated)
    if not set(layer) & set(ev.additive):
        raise AssertionError(
            f"the step model no longer adds a per-step overhead after everything else "
            f"(shortcut off by {gap:.2%}): calibrate.evaluate's additive rule needs updating"
        )
    if progress:
        progress(f"  per-layer overhead shortcut off by {gap:.2g}: fitting again without it")
    kw_all = {"cv": cv, "jobs": jobs, "kinds": kinds, "cv_by": cv_by, "progress": progress}
    return fit_runs(base, cases, predictor, per_layer=False, **kw_all)


def _held_out_gap(ev: Evaluator, problem: Problem, cvs: Sequence[CrossValidation]) -> float:
    """The overhead shortcuts against the step model on each fold's held-out runs at the
    fold's values (the numbers the CV tables print): the largest |relative difference|."""
    gaps = [0.0]
    for cv in cvs:
        labels = np.asarray(problem.labels[cv.by], dtype=object)
        for f in cv.folds:
            test = np.flatnonzero(labels == f.held_out).tolist()
            gaps.append(ev.check_additive(f.values, test))
    return max(gaps)


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
    cv: bool = True,
    jobs: int = 1,
    kinds: Sequence[str] | None = None,
    cv_by: Sequence[str] = CV_GROUPINGS,
    progress: Callable[[str], None] | None = None,
) -> RunsCalibration:
    """Fit the factors on `cases` (those of `framework` if given), cross-validated."""
    prof = load_profile(base)
    keep, skipped = usable(prof, cases, predictor)
    if framework:
        keep = [c for c in keep if c.framework == framework]
    if len(keep) < MIN_RUNS:
        note = f"{len(keep)} usable runs (< {MIN_RUNS}): nothing fitted"
        return RunsCalibration(prof, None, skipped, notes=(note,))
    rf = fit_runs(
        prof, keep, predictor, cv=cv, jobs=jobs, kinds=kinds, cv_by=cv_by, progress=progress
    )
    values = tidy({n: rf.result.values[n] for n in rf.result.fitted})
    fitted = replace(
        scales.apply(prof, {**values, **pooled_for_uncovered(values, keep)}),
        name="fitted" if not framework else f"fitted-{framework}",
        calibrated=bool(values),
        source=f"datasheet physics x factors fitted by `roofline calibrate --from-runs` on {len(keep)} measured training runs"
        + (f" (framework {framework})" if framework else ""),
    )
    return RunsCalibration(fitted, rf, skipped)


def pooled_for_uncovered(values: Mapping[str, float], cases: Sequence[RunCase]) -> dict[str, float]:
    """Overheads for the catalog's frameworks no run covers (`ideal`, the book's machine, keeps
    none): the mean of the fitted frameworks' (`scales.pooled_overheads`)."""
    from roofline.specs.framework import framework_names

    covered = {c.framework for c in cases}
    rest = [fw for fw in framework_names() if fw not in covered and fw != "ideal"]
    return tidy(scales.pooled_overheads(values, tuple(values), rest))


def tidy(values: Mapping[str, float]) -> dict[str, float]:
    """Fitted values as shipped: 6 significant digits, snapped to a bound within 1e-6 of its
    range (an overhead of 1e-16 s is 0)."""
    out = {}
    for n, v in values.items():
        b = scales.parse(n).bounds
        tol = 1e-6 * (b.hi - b.lo)
        v = b.lo if v - b.lo < tol else b.hi if b.hi - v < tol else float(f"{v:.6g}")
        out[n] = float(v)
    return out


# -- files ------------------------------------------------------------------------------------


def cases_from_file(path: str | Path, base: Efficiency) -> tuple[list[RunCase], dict[str, str]]:
    """Training runs of a measured_training.yaml-schema file, mapped by `roofline validate`."""
    from roofline.errors import SpecError
    from roofline.validate import Schema, load_runs, map_training_run

    rf = load_runs(path)
    if rf.schema != Schema.TRAINING:
        raise SpecError(
            f"runs file {rf.path!r} holds {rf.schema.value} runs",
            rule="calibrate --from-runs fits training runs (the measured_training.yaml schema)",
            fix="give a training-runs file",
        )
    cases: list[RunCase] = []
    skipped: dict[str, str] = {}
    for e in rf.entries:
        run = map_training_run(e)
        if run.id in skipped or any(c.id == run.id for c in cases):
            skipped[f"{run.id} (repeat)"] = "duplicate id (the first entry with it is used)"
        elif not run.mapped:
            skipped[run.id] = run.skipped_reason or "not mapped"
        else:
            cases.append(_case(run, base))
    return cases, skipped


def _case(run: Any, base: Efficiency) -> RunCase:
    chip = run.inputs.system.chip
    fam = base.family_for(chip)
    return RunCase(
        run.id,
        run.source.family,
        fam.family if fam else chip.name,
        run.inputs.framework or run.source.stack,
        chip,
        run.measured.tokens_per_s_per_chip,
        run,
        str(run.compute_dtype or "bf16"),
        run.inputs.workload.batch_tokens / run.inputs.system.n_chips,
    )


def predict_cases(profile: Efficiency, cases: Sequence[RunCase]) -> np.ndarray:
    """Tokens/s per chip of each case's published plan (roofline validate's prediction, with
    the profile's overrides for the run's framework)."""
    from roofline.validate.scoreboard import predict_run

    out = []
    for c in cases:
        r = predict_run(c.payload, profile.for_framework(c.framework), framework="auto")
        out.append(r.predicted_tokens_per_s_per_chip if r.covered else float("nan"))
    return np.array(out, float)


__all__ = [
    "RunCase",
    "RunsCalibration",
    "RunsFit",
    "MIN_RUNS",
    "calibrate_cases",
    "cases_from_file",
    "predict_cases",
    "fit_runs",
]
