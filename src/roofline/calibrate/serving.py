"""`roofline calibrate --from-runs serving`: fit the disaggregated hand-off and SGLang's
per-request latency on measured TTFT.

A disaggregated deployment hands every request from the router to a prefill worker, then (the KV
cache written over the link) to a decode worker, whose first step emits the first token. The
serving model costs the prefill, the KV transfer and the queues; the hand-off itself (request
plane, KV-ready notification, the decode worker picking the request up) has no published number
we found, so it is a physical parameter with a bound, `disagg_handoff_s` in [0, 2] s on the
efficiency profile, fitted here and only here:

- the runs: the mapped disaggregated runs with a measured TTFT of a serving-schema file
  (`roofline.validate`'s readers), predicted by `roofline.serving.predict.predict_measured_run`;
- the fit: `scipy.optimize.least_squares` on log(predicted / measured TTFT) with the `cauchy`
  loss, f_scale 0.3 (TTFT's noise floor: the same configuration measures 30%+ apart between
  engine releases and arrival patterns, docs/serving.md): quadratic for errors within that,
  logarithmic beyond, so its influence fades as 1/error. Runs whose measured TTFT is a queue the
  model does not see (seconds measured against a tenth of a second predicted: TensorRT-LLM
  DeepSeek-R1 GB300 cfg392) say nothing about a constant hand-off. Under `soft_l1` (influence
  constant beyond f_scale) each still pulls with the slope of its log error, 1/predicted — the
  largest for exactly those low-predicted, badly missed runs: it fitted 0.34 s with a +18% bias
  on the disaggregated runs (docs/calibration.md). Started at the best of a dense scan of the
  cached cost (the loss is not convex), polished by least_squares. Refused (one line) with
  fewer than `MIN_RUNS` runs;
- the cache: a prediction takes ~0.15 s per run, so each run's TTFT is predicted exactly at the
  hand-offs of `GRID_S` and interpolated linearly between them. TTFT(h) = TTFT(0) + h holds
  only while no pool saturates: in a closed loop the hand-off lengthens every request's cycle,
  and where a pool is the bottleneck it replaces queueing instead of adding to it. The fitted
  value is re-predicted exactly; the largest gap to the interpolation is reported;
- cross-validation: leave-one-engine-out, leave-one-chip-family-out (the runs' chip family
  as validate reports it) and leave-one-model×system-pair-out (a model on a chip family: the
  unit an unseen deployment differs by — the pair-held-out number is the honest one) over the
  disaggregated runs: each fold's held-out runs predicted exactly with the fold's value, before
  (no hand-off) and after;
- the whole file's TTFT and TPOT before and after (aggregated runs do not read the hand-off).

Aggregated TTFT carries a per-request latency the model's passes do not hold: the engine's API
server (HTTP, tokenisation), the hand-over to the scheduler and its admission step, the first
token's detokenisation and the way back to the client (at low concurrency the measured TTFT sits
a near-constant 0.03-0.25 s over the predicted one). No engine publishes the number (sources per
engine in specs/engines/*.toml: SGLang [front], vLLM [v1]/[drift], TensorRT-LLM [step]), so it is
one bounded parameter per engine, `request_latency_s` in [0, 0.5] s, stored under
`[framework.ENGINE]` of the profile (the engine file keeps 0) for each engine of
`LATENCY_ENGINES` and fitted the same way on that engine's mapped aggregated runs with a measured
TTFT. The profile's own `request_latency_s` is the prior an engine with no fitted value falls
back to: one value fitted on every fitted engine's aggregated runs together (`PRIOR_T`). All the
parameters touch disjoint runs (disaggregated TTFT does not read a latency, an engine's
aggregated TTFT reads only its own), so the joint robust cost is a sum of one-parameter costs
and the joint fit is the 1-D fits side by side. Leave-one-engine-out cannot identify an engine's
own latency: its fold gives the held-out engine the prior fitted on the other engines' runs
(what an unseen engine is predicted with); the chip-family and pair folds refit every engine's
own value without the held-out group.

`--out` the base's own file (`--base fitted --out src/roofline/specs/profiles/fitted.toml`) adds
`disagg_handoff_s` and a `[provenance.serving]` table to it, keeping what the training fit
wrote; another `--out` writes a profile over the base. The serving fit owns the top-level
`disagg_handoff_s` and `request_latency_s`, the `[framework.ENGINE]` table of each engine of
`LATENCY_ENGINES` and `[provenance.serving]`. `--docs` writes the tables between the
serving markers of docs/calibration.md.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.calibrate import render
from roofline.calibrate.fit import spread_of
from roofline.calibrate.write import toml_key, toml_value
from roofline.errors import RooflineError, SpecError
from roofline.report.table import table
from roofline.specs.catalog import is_file
from roofline.specs.efficiency import OVERHEADS, Efficiency, Param, load_profile

HANDOFF = "disagg_handoff_s"
BOUNDS = OVERHEADS[HANDOFF]
LATENCY = "request_latency_s"
# the engines whose per-request latency is fitted (specs/engines/NAME.toml), with display names
LATENCY_ENGINES: tuple[tuple[str, str], ...] = (
    ("sglang", "SGLang"),
    ("vllm", "vLLM"),
    ("trtllm", "TensorRT-LLM"),
)
MIN_RUNS = 3
LOSS, F_SCALE = "cauchy", 0.3
# scipy.optimize.least_squares' loss functions rho(z), z = (residual / f_scale)^2
_RHO = {
    "linear": lambda z: z,
    "soft_l1": lambda z: 2.0 * (np.sqrt(1.0 + z) - 1.0),
    "cauchy": np.log1p,
    "arctan": np.arctan,
}
# hand-offs (s) each run's TTFT is predicted at exactly (linear in between)
GRID_S: tuple[float, ...] = (
    *(round(0.05 * i, 2) for i in range(13)),
    0.8,
    1.0,
    1.25,
    1.5,
    2.0,
)
# per-request latencies (s) each aggregated run's TTFT is predicted at exactly
LATENCY_GRID_S: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(11))
PAIR = "model×system pair"
CV_GROUPINGS = ("engine", "chip family", PAIR)
BEGIN = "<!-- calibrate:serving-cv-table:begin -->"
END = "<!-- calibrate:serving-cv-table:end -->"
TOML_MARK = "# serving fit:"

Predict = Callable[..., Mapping[str, Any]]


@dataclass(frozen=True)
class Target:
    """One bounded profile parameter this calibration fits, and the runs that read it."""

    key: str  # the profile field (an OVERHEADS entry)
    engine: str = ""  # "": the profile's own value; else the value under [framework.ENGINE]
    runs: str = "disaggregated"  # which runs read it, for messages
    zero: str = "no hand-off"  # what `before` means, for the tables

    @property
    def name(self) -> str:
        return f"{self.key}@{self.engine}" if self.engine else self.key

    @property
    def bounds(self) -> Param:
        return OVERHEADS[self.key]

    @property
    def grid(self) -> tuple[float, ...]:  # read at call time: tests narrow the module's grids
        return LATENCY_GRID_S if self.engine else GRID_S

    def on(self, prof: Efficiency, v: float) -> Efficiency:
        """`prof` with this parameter at `v` (per engine: in its framework overrides)."""
        if not self.engine:
            return replace(prof, **{self.key: float(v)})
        fws = dict(prof.frameworks)
        fws[self.engine] = MappingProxyType({**fws.get(self.engine, {}), self.key: float(v)})
        return replace(prof, frameworks=MappingProxyType(fws))

    def value(self, prof: Efficiency) -> float:
        if not self.engine:
            return float(getattr(prof, self.key))
        return float(prof.frameworks.get(self.engine, {}).get(self.key, 0.0))

    def reads(self, run: Any) -> bool:
        """Whether the serving model's prediction of `run` reads this parameter (the prior:
        every aggregated run, as the fallback of an engine without its own value)."""
        if not self.engine:
            return bool(run.disaggregated) == (self.key == HANDOFF)
        return not run.disaggregated and engine_name(run) == self.engine


HANDOFF_T = Target(HANDOFF)
LATENCY_TS: tuple[Target, ...] = tuple(
    Target(LATENCY, e, f"aggregated {d}", "no request latency") for e, d in LATENCY_ENGINES
)
PRIOR_T = Target(LATENCY, "", "aggregated runs of the fitted engines", "no request latency")
TARGETS = (HANDOFF_T, PRIOR_T, *LATENCY_TS)


def latency_target(engine: str) -> Target:
    """The per-request latency target of `engine` (one of LATENCY_ENGINES)."""
    return next(t for t in LATENCY_TS if t.engine == engine)


def engine_name(run: Any) -> str:
    from roofline.serving.predict import engine_of

    e = engine_of(run)
    return e.name if e is not None else ""


def _default_predict() -> Predict:
    from roofline.serving.predict import predict_measured_run

    return predict_measured_run


@dataclass(frozen=True)
class ServingCase:
    """One disaggregated run with a measured TTFT."""

    run: Any
    measured_ttft_s: float

    @property
    def id(self) -> str:
        return str(self.run.id)

    def group(self, by: str) -> str:
        fam = self.run.chip_family or "unknown"
        if by == PAIR:  # the deployment an unseen point is most likely to differ by
            return f"{getattr(self.run, 'model_name', '') or 'unknown'} on {fam}"
        return str(self.run.engine if by == "engine" else fam)


def cv_key(by: str) -> str:
    """A grouping's name as a TOML bare key ('model×system pair' -> 'model_system_pair')."""
    return by.replace("×", "_").replace(" ", "_")


# -- reading ----------------------------------------------------------------------------------


def load_serving_runs(path: str | Path) -> tuple[str, list[Any]]:
    """The runs of a serving- or inference-schema file, mapped by roofline.validate (a repeated
    id keeps its first entry, as validate does)."""
    from roofline.validate import Schema, load_runs, mapped_runs

    rf = load_runs(path)
    if rf.schema == Schema.TRAINING:
        raise SpecError(
            f"runs file {rf.path!r} holds training runs",
            rule="the serving calibration fits serving runs (the measured_serving_aic.yaml schema)",
            fix="give a serving-runs file, or let `calibrate --from-runs` dispatch it",
        )
    return rf.schema.value, mapped_runs(rf)


def disagg_cases(runs: Sequence[Any]) -> tuple[list[ServingCase], dict[str, str]]:
    """The mapped disaggregated runs with a measured TTFT; the others' reasons."""
    return _cases(runs, HANDOFF_T.reads)


def latency_cases(
    runs: Sequence[Any], engine: str = "sglang"
) -> tuple[list[ServingCase], dict[str, str]]:
    """The mapped aggregated runs of `engine` with a measured TTFT; the others' reasons."""
    return _cases(runs, latency_target(engine).reads)


def _cases(runs: Sequence[Any], reads: Any) -> tuple[list[ServingCase], dict[str, str]]:
    """The mapped runs a parameter reads (`reads(run)`) with a measured TTFT; the others'
    reasons."""
    cases, skipped = [], {}
    for r in runs:
        if not reads(r):
            continue
        if not r.mapped:
            skipped[r.id] = r.skipped_reason
        elif not r.measured.ttft_s:
            skipped[r.id] = "no measured TTFT"
        else:
            cases.append(ServingCase(r, float(r.measured.ttft_s)))
    return cases, skipped


def refuse_if_few(n: int, where: str, t: Target = HANDOFF_T) -> None:
    if n < MIN_RUNS:
        raise SpecError(
            f"{where}: {n} mapped {t.runs} run(s) with a measured TTFT (< {MIN_RUNS}): "
            f"too few to fit {t.name}",
            rule=f"{t.name} is fitted only on at least {MIN_RUNS} {t.runs} runs",
            fix="give a serving-runs file with more disaggregated runs (e.g. --from-runs serving)",
        )


# -- the cache: exact TTFT on a grid of hand-offs -----------------------------------------------


@dataclass(frozen=True)
class TtftCurves:
    """Each case's predicted TTFT (s) at the hand-offs of `grid` (rows: cases)."""

    grid: np.ndarray
    ttft_s: np.ndarray

    def at(self, h: float, idx: Sequence[int] | None = None) -> np.ndarray:
        rows = self.ttft_s if idx is None else self.ttft_s[list(idx)]
        return np.array([np.interp(h, self.grid, row) for row in rows])


def predict_ttft(
    predict: Predict, case: ServingCase, start: Efficiency, h: float, p: Target = HANDOFF_T
) -> float:
    """One exact prediction of a case's TTFT with the parameter at `h` (NaN if it cannot be
    costed)."""
    try:
        t = predict(case.run, efficiency=p.on(start, h))["ttft_s"]
    except RooflineError:
        return float("nan")
    return float("nan") if t is None else float(t)


def ttft_curves(
    cases: Sequence[ServingCase],
    start: Efficiency,
    predict: Predict,
    grid: Sequence[float] | None = None,
    progress: Callable[[str], None] | None = None,
    p: Target = HANDOFF_T,
) -> TtftCurves:
    g = np.asarray(sorted({float(x) for x in (p.grid if grid is None else grid)}), float)
    out = np.empty((len(cases), len(g)))
    from roofline.progress import track

    for i, c in enumerate(track(cases, "calibrate: TTFT curves", unit="run")):
        out[i] = [predict_ttft(predict, c, start, h, p) for h in g]
        if progress and (i + 1) % 8 == 0:
            progress(f"predicted {i + 1}/{len(cases)} runs at {len(g)} values of {p.name}")
    return TtftCurves(g, out)


# -- the fit ----------------------------------------------------------------------------------


def log_residuals(curves: TtftCurves, measured: np.ndarray, idx: Sequence[int], h: float):
    return np.log(curves.at(h, idx) / measured[list(idx)])


def robust_cost(r: np.ndarray) -> float:
    """least_squares' cost of residuals `r` under LOSS and F_SCALE (up to a constant factor)."""
    return float(np.sum(_RHO[LOSS]((np.asarray(r) / F_SCALE) ** 2)))


def fit_handoff(
    curves: TtftCurves, measured: np.ndarray, idx: Sequence[int], p: Target = HANDOFF_T
) -> float:
    """The value (s) of `p` minimising the robust cost of log(predicted / measured) over `idx`:
    started at the best point of a dense scan of its bounds (401 points; the cost is not
    convex), polished by least_squares."""
    from scipy.optimize import least_squares

    b = p.bounds
    scan = np.linspace(b.lo, b.hi, 401)
    costs = [robust_cost(log_residuals(curves, measured, idx, h)) for h in scan]
    x0 = float(scan[int(np.argmin(costs))])
    x0 = min(max(x0, b.lo + 1e-9), b.hi - 1e-9)
    sol = least_squares(
        lambda x: log_residuals(curves, measured, idx, float(x[0])),
        [x0],
        bounds=([b.lo], [b.hi]),
        loss=LOSS,
        f_scale=F_SCALE,
        x_scale=[0.1],
        diff_step=[1e-3],
    )
    best = float(sol.x[0])
    # the polish must not lose to its start (a kink of the interpolation can stop it early)
    if robust_cost(log_residuals(curves, measured, idx, best)) > min(costs):
        best = x0
    return float(np.clip(round(best, 4), b.lo, b.hi))


# -- cross-validation -------------------------------------------------------------------------


@dataclass(frozen=True)
class Fold:
    held_out: str
    n_train: int
    n_test: int
    handoff_s: float | None  # None: refused (too few training runs)
    error_before: np.ndarray  # held-out TTFT errors with no hand-off
    error_after: np.ndarray  # ... with the fold's fitted hand-off (exact predictions)
    reason: str = ""


@dataclass(frozen=True)
class ServingCV:
    by: str
    folds: tuple[Fold, ...]
    target: Target = HANDOFF_T

    @property
    def error_before(self) -> np.ndarray:
        return np.concatenate([f.error_before for f in self.folds] or [np.zeros(0)])

    @property
    def error_after(self) -> np.ndarray:
        return np.concatenate([f.error_after for f in self.folds] or [np.zeros(0)])

    def spread(self) -> dict[str, float]:
        v = [f.handoff_s for f in self.folds if f.handoff_s is not None]
        return spread_of(v) if v else {}


Exact = Callable[[Sequence[int], float], np.ndarray]


def cross_validate(
    cases: Sequence[ServingCase],
    curves: TtftCurves,
    exact: Exact,
    by: str,
    p: Target = HANDOFF_T,
) -> ServingCV:
    """Leave one group out: fit on the others, predict the held-out runs exactly."""
    measured = np.array([c.measured_ttft_s for c in cases])
    groups = [c.group(by) for c in cases]
    folds = []
    for g in sorted(set(groups)):
        test = [i for i, x in enumerate(groups) if x == g]
        train = [i for i, x in enumerate(groups) if x != g]
        before = curves.at(0.0, test) / measured[test] - 1
        why = _unfittable(p, len(train))
        if why:
            folds.append(Fold(g, len(train), len(test), None, before, before, why))
            continue
        h = fit_handoff(curves, measured, train, p)
        after = exact(test, h) / measured[test] - 1
        folds.append(Fold(g, len(train), len(test), h, before, after))
    return ServingCV(by, tuple(folds), p)


def _unfittable(p: Target, n_train: int) -> str:
    """Why a fold keeps no value ("" when it is fitted)."""
    if n_train < MIN_RUNS:
        return f"{n_train} training runs (< {MIN_RUNS}): the fold keeps no {p.key}"
    return ""


# -- the whole calibration ---------------------------------------------------------------------


@dataclass(frozen=True)
class HandoffFit:
    cases: tuple[ServingCase, ...]
    handoff_s: float
    error_before: np.ndarray  # in-sample TTFT errors, no hand-off
    error_after: np.ndarray  # ... fitted hand-off, exact predictions
    interpolation_gap_s: float  # max |interpolated - exact| TTFT at the fitted value
    cv: tuple[ServingCV, ...] = ()
    skipped: Mapping[str, str] = field(default_factory=dict)
    target: Target = HANDOFF_T
    curves: TtftCurves | None = field(default=None, repr=False, compare=False)  # cases' cache

    @property
    def at_bound(self) -> bool:
        b = self.target.bounds
        return self.handoff_s <= b.lo or self.handoff_s >= b.hi


def fit_cases(
    cases: Sequence[ServingCase],
    start: Efficiency,
    predict: Predict,
    *,
    cv: bool = True,
    grid: Sequence[float] | None = None,
    progress: Callable[[str], None] | None = None,
    p: Target = HANDOFF_T,
) -> HandoffFit:
    """Fit `p` on `cases` (their predictor and the profile `start`, its value of `p` ignored).
    An engine's own latency is cross-validated by chip family and pair here; its engine fold
    needs the other engines' fits (`fit_latencies`)."""
    start = p.on(start, 0.0)
    refuse_if_few(len(cases), "calibrate --from-runs (serving)", p)
    curves = ttft_curves(cases, start, predict, grid, progress, p)
    ok = np.all(np.isfinite(curves.ttft_s) & (curves.ttft_s > 0), axis=1)
    skipped = {
        c.id: "the serving model cannot cost this run"
        for c, k in zip(cases, ok, strict=True)
        if not k
    }
    cases = [c for c, k in zip(cases, ok, strict=True) if k]
    curves = TtftCurves(curves.grid, curves.ttft_s[ok])
    refuse_if_few(len(cases), "calibrate --from-runs (serving), runs the model can cost", p)
    measured = np.array([c.measured_ttft_s for c in cases])

    def exact(idx: Sequence[int], h: float) -> np.ndarray:
        return np.array([predict_ttft(predict, cases[i], start, h, p) for i in idx])

    every = list(range(len(cases)))
    h = fit_handoff(curves, measured, every, p)
    after = exact(every, h)
    gap = float(np.max(np.abs(after - curves.at(h))))
    groupings = [by for by in CV_GROUPINGS if not (p.engine and by == "engine")] if cv else []
    folds = tuple(cross_validate(cases, curves, exact, by, p) for by in groupings)
    before = curves.at(0.0) / measured - 1
    return HandoffFit(tuple(cases), h, before, after / measured - 1, gap, folds, skipped, p, curves)


# -- the whole file before and after -----------------------------------------------------------


def whole_file(
    runs: Sequence[Any],
    start: Efficiency,
    fitted: Efficiency,
    predict: Predict,
    cv: Sequence[ServingCV] = (),
    targets: Sequence[Target] = TARGETS,
) -> dict[str, dict[str, dict[str, Any]]]:
    """TTFT and TPOT summaries of every run (and the aggregated / disaggregated ones) with none
    of `targets` (no hand-off, no request latency) and with the fitted ones; runs that read
    none are predicted once. With `cv`, also the whole file's TTFT with every run a fitted
    parameter reads given the error its fold (fitted without its group) gives it: the honest
    whole-file number."""
    from roofline.validate.serving_runs import Metric
    from roofline.validate.serving_score import predict_serving_run
    from roofline.validate.stats import summarize

    zero = start
    for t in targets:
        zero = t.on(zero, 0.0)
    before = [predict_serving_run(r, predict, zero) for r in runs]
    after = [
        predict_serving_run(r, predict, fitted) if any(t.reads(r) for t in targets) else b
        for r, b in zip(runs, before, strict=True)
    ]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for subset, keep in (
        ("all", lambda r: True),
        ("aggregated", lambda r: not r.disaggregated),
        ("disaggregated", lambda r: r.disaggregated),
    ):
        for m in (Metric.TTFT, Metric.TPOT):
            for when, res in (("before", before), ("after", after)):
                have = [x for x in res if keep(x.run) and x.run.measured.value(m) is not None]
                errs = [x.errors[m.value] for x in have if m.value in x.errors]
                s = summarize(errs, total=len(have))
                out.setdefault(subset, {}).setdefault(m.value, {})[when] = s
    out.update(_held_out_rows(before, out["all"][Metric.TTFT.value]["before"], cv))
    return out


def held_out_key(by: str) -> str:
    return f"all, fits held out by {by}"


def _held_out_rows(before: Sequence[Any], all_before: Any, cv: Sequence[ServingCV]) -> dict:
    """Per grouping: the whole file's TTFT errors, each run a cross-validated parameter reads
    taking its fold's error, the others as predicted."""
    from roofline.validate.stats import summarize

    ttft = "ttft"
    fitted = {c.target for c in cv}
    rest = [
        x.errors[ttft]
        for x in before
        if ttft in x.errors and not any(t.reads(x.run) for t in fitted)
    ]
    rows = {}
    for by in dict.fromkeys(c.by for c in cv):
        errs = rest + [e for c in cv if c.by == by for e in c.error_after.tolist()]
        after = summarize(errs, total=len(errs))
        rows[held_out_key(by)] = {ttft: {"before": all_before, "after": after}}
    return rows


@dataclass(frozen=True)
class ServingCalibration:
    profile: Efficiency
    fit: HandoffFit
    whole: Mapping[str, Any]
    skipped: Mapping[str, str]
    written: tuple[str, ...] = ()
    latency: LatencyFits | None = None

    def to_dict(self) -> dict[str, Any]:
        lat = self.latency or LatencyFits()
        return {
            **fit_dict(self.fit),
            LATENCY: lat.to_dict(),
            "whole_file": self.whole,
            "skipped": dict(self.skipped),
            "profile": self.profile.to_dict(),
            "written": list(self.written),
        }


def fit_dict(f: HandoffFit) -> dict[str, Any]:
    b = f.target.bounds
    return {
        "parameter": f.target.name,
        "bounds_s": [b.lo, b.hi],
        "loss": LOSS,
        "f_scale": F_SCALE,
        "fitted_s": f.handoff_s,
        "at_bound": f.at_bound,
        "interpolation_gap_s": f.interpolation_gap_s,
        "runs": [
            {
                "id": c.id,
                "engine": c.group("engine"),
                "chip_family": c.group("chip family"),
                "measured_ttft_s": c.measured_ttft_s,
                "error_before": float(eb),
                "error_after": float(ea),
            }
            for c, eb, ea in zip(f.cases, f.error_before, f.error_after, strict=True)
        ],
        "in_sample_before": render.error_summary(f.error_before),
        "in_sample_after": render.error_summary(f.error_after),
        "cv": [_cv_dict(cv) for cv in f.cv],
    }


def _cv_dict(cv: ServingCV) -> dict[str, Any]:
    return {
        "by": cv.by,
        "folds": [
            {
                "held_out": f.held_out,
                "train": f.n_train,
                "test": f.n_test,
                "value_s": f.handoff_s,
                "before": render.error_summary(f.error_before),
                "after": render.error_summary(f.error_after),
                "reason": f.reason or None,
            }
            for f in cv.folds
        ],
        "before": render.error_summary(cv.error_before),
        "after": render.error_summary(cv.error_after),
        "spread": cv.spread(),
    }


# -- provenance and the profile file -----------------------------------------------------------


def provenance(
    fit: HandoffFit,
    whole: Mapping[str, Any],
    path: str | Path,
    base: str,
    command: str,
    latency: LatencyFits | None = None,
) -> dict[str, Any]:
    """What `[provenance.serving]` records and the shipped-profile tests check."""
    from roofline.calibrate.ship import runs_path, sha256_of

    out: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).date().isoformat(),
        "command": command,
        "runs_file": str(path),
        "runs_sha256": sha256_of(runs_path(path)),
        "base": base,
        "runs": len(fit.cases),
        "fitted": {HANDOFF: fit.handoff_s},
        "loss": f"{LOSS}, f_scale {F_SCALE:g}, on log(predicted / measured TTFT)",
    }
    out.update(_fit_provenance(fit, ""))
    if latency is not None:
        out.update(_latency_provenance(latency, out["fitted"]))
    for subset in ("all", "aggregated", "disaggregated"):
        for m in ("ttft", "tpot"):
            for when in ("before", "after"):
                s = whole.get(subset, {}).get(m, {}).get(when, {})
                if s.get("median_abs_error") is not None:
                    out[f"{subset}_{m}_{when}"] = _short(s)
    for by in CV_GROUPINGS:
        s = whole.get(held_out_key(by), {}).get("ttft", {}).get("after", {})
        if s.get("median_abs_error") is not None:
            out["all_ttft_held_out_by_" + cv_key(by)] = _short(s)
    return out


def _latency_provenance(lat: LatencyFits, fitted: dict[str, Any]) -> dict[str, Any]:
    """Each engine's latency (in `fitted`, and its runs and CV as latency_ENGINE_*), the
    prior (`fitted`'s request_latency_s)."""
    out: dict[str, Any] = {"latency_runs": sum(len(f.cases) for f in lat.fits)}  # all engines'
    if lat.prior_s is not None:
        fitted[PRIOR_T.name] = lat.prior_s
    for f in lat.fits:
        fitted[f.target.name] = f.handoff_s
        prefix = f"latency_{f.target.engine}_"
        out[prefix + "runs"] = len(f.cases)
        out.update(_fit_provenance(f, prefix))
    return out


def _short(s: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": s["n"], "median_abs": round(s["median_abs_error"], 4), "bias": round(s["bias"], 4)}


def _fit_provenance(fit: HandoffFit, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        prefix + "in_sample_before": render.error_summary(fit.error_before),
        prefix + "in_sample_after": render.error_summary(fit.error_after),
    }
    for cv in fit.cv:
        key = prefix + "cv_" + cv_key(cv.by)
        out[key + "_before"] = render.error_summary(cv.error_before)
        out[key + "_after"] = render.error_summary(cv.error_after)
        spread = cv.spread()
        if spread:
            out[key + "_spread_s"] = {
                k: (int(v) if k == "folds" else round(float(v), 4)) for k, v in spread.items()
            }
    return out


LATENCY_TABLES = tuple(f"framework.{e}" for e, _ in LATENCY_ENGINES)


def strip_serving(text: str) -> str:
    """A profile file's text without a previous serving fit (its keys, comments and tables: the
    serving fit owns [framework.ENGINE] of each LATENCY_ENGINES engine, where it writes the
    engine's request latency)."""
    out, table_name = [], ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("[") and not s.startswith("[["):
            table_name = s.strip("[]").strip()
        if table_name in ("provenance.serving", *LATENCY_TABLES) or s.startswith(TOML_MARK):
            continue
        if not table_name and s.split("=", 1)[0].strip() in (HANDOFF, LATENCY):
            continue
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"


Latencies = Mapping[str, float]  # engine -> request_latency_s; "" -> the profile's prior


def _serving_lines(
    h: float, prov: Mapping[str, Any], latency: Latencies | None = None, mask_base: bool = False
) -> tuple[list[str], list[str]]:
    latency = dict(latency or {})
    # an overlay inherits its base's [framework.ENGINE] keys: an engine this fit did not fit
    # gets the prior written out (`mask_base`), else an older fit's value would apply
    masked = latency.get("") if mask_base else None
    key = [
        f"{TOML_MARK} fitted by `{prov.get('command', 'roofline calibrate --from-runs serving')}`",
        f"{TOML_MARK} per-request hand-off of disaggregated serving (docs/calibration.md)",
        f"{HANDOFF} = {toml_value(float(h))}",
    ]
    if "" in latency:
        key += [
            f"{TOML_MARK} per-request latency of an engine without its own [framework.ENGINE] "
            "value: one fitted on every fitted engine's aggregated runs",
            f"{LATENCY} = {toml_value(float(latency.pop('')))}",
        ]
    table_lines = []
    for engine in [e for e, _ in LATENCY_ENGINES if e in latency]:
        table_lines += [
            "",
            f"[framework.{engine}]",
            f"{TOML_MARK} {engine}'s per-request latency on aggregated TTFT: API server, "
            "tokenisation, scheduler admission, detokenisation, the way back to the client",
            f"{TOML_MARK} (no published number: sources and candidates in "
            f"specs/engines/{engine}.toml; docs/calibration.md has its CV)",
            f"{LATENCY} = {toml_value(float(latency[engine]))}",
        ]
    for engine in [e for e, _ in LATENCY_ENGINES if e not in latency] if masked else ():
        table_lines += [
            "",
            f"[framework.{engine}]",
            f"{TOML_MARK} {engine}: not fitted here (too few runs); the prior above, stated so "
            "that the base profile's own value for it does not apply",
            f"{LATENCY} = {toml_value(float(masked))}",
        ]
    table_lines += ["", "[provenance.serving]"]
    table_lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in prov.items()]
    return key, table_lines


def add_serving(
    text: str,
    h: float,
    prov: Mapping[str, Any],
    latency: Latencies | None = None,
    mask_base: bool = False,
) -> str:
    """`text` (a profile file) with this serving fit in place of any previous one: the keys
    (the hand-off, `latency['']` the prior) before the first table, [framework.ENGINE] (each
    engine's `latency`) and `[provenance.serving]` at the end."""
    lines = strip_serving(text).rstrip("\n").splitlines()
    key, table_lines = _serving_lines(h, prov, latency, mask_base)
    first = next((i for i, x in enumerate(lines) if x.strip().startswith("[")), len(lines))
    while first > 0 and not lines[first - 1].strip():
        first -= 1
    lines = lines[:first] + key + lines[first:]
    return "\n".join(lines + table_lines) + "\n"


def overlay_text(
    base: str,
    name: str,
    calibrated: bool,
    h: float,
    prov: Mapping[str, Any],
    latency: Latencies | None = None,
) -> str:
    """A new profile file: `base` with the fitted hand-off (and request latencies)."""
    base_ref = str(Path(base).resolve()) if is_file(base) else base
    head = [
        "# The base profile with the serving parameters fitted on measured serving runs.",
        f"# Regenerate: {prov.get('command', '')}",
        f"name = {toml_value(name)}",
        f"base = {toml_value(base_ref)}",
        f"calibrated = {toml_value(bool(calibrated))}",
    ]
    return add_serving("\n".join(head) + "\n", h, prov, latency, mask_base=True)


def write_profile(out: str | Path, base: str, profile: Efficiency, prov: Mapping[str, Any]) -> str:
    """Write the fit: into the base's own file when `out` is it, else a profile over the base."""
    from roofline.calibrate.ship import base_path

    p, bp = Path(out), base_path(base)
    h = profile.disagg_handoff_s
    fitted = prov.get("fitted", {})
    latency = {t.engine: t.value(profile) for t in (PRIOR_T, *LATENCY_TS) if t.name in fitted}
    if bp is not None and p.exists() and p.resolve() == bp.resolve():
        text = add_serving(p.read_text(), h, prov, latency)
    else:
        text = overlay_text(base, p.stem, profile.calibrated, h, prov, latency)
    p.write_text(text)
    return str(p)


# -- text and docs ----------------------------------------------------------------------------


def cv_table(cv: ServingCV) -> str:
    """Per fold: the held-out runs' median |error| and bias before and after; the spread."""
    rows = [
        (
            f.held_out,
            f.n_train,
            f.n_test,
            render.apct(render.median_abs(f.error_before)),
            render.apct(render.median_abs(f.error_after)),
            render.pct(render.median_bias(f.error_before)),
            render.pct(render.median_bias(f.error_after)),
            "refused" if f.handoff_s is None else f"{f.handoff_s:.3f} s",
        )
        for f in cv.folds
    ]
    eb, ea = cv.error_before, cv.error_after
    pooled = (
        "all held-out runs",
        "",
        len(ea),
        render.apct(render.median_abs(eb)),
        render.apct(render.median_abs(ea)),
    )
    rows.append(
        (*pooled, render.pct(render.median_bias(eb)), render.pct(render.median_bias(ea)), "")
    )
    name = cv.target.name
    head = (f"held-out {cv.by}", "train", "test", "median |err| before", "after")
    out = table(rows, (*head, "bias before", "after", name))
    s = cv.spread()
    if s:
        out += (
            f"\n{name} over {s['folds']} folds: mean {s['mean']:.3f} s, "
            f"min {s['min']:.3f}, max {s['max']:.3f}, std {s['std']:.3f}"
        )
    out += "".join(f"\n- {f.held_out}: {f.reason}" for f in cv.folds if f.reason)
    return out


def whole_table(whole: Mapping[str, Any]) -> str:
    rows = []
    for subset, by_metric in whole.items():
        for m, s in by_metric.items():
            b, a = s["before"], s["after"]
            rows.append(
                (
                    subset,
                    m.upper(),
                    a["n"],
                    render.apct(b["median_abs_error"]),
                    render.apct(a["median_abs_error"]),
                    render.pct(b["bias"]),
                    render.pct(a["bias"]),
                )
            )
    head = ("runs", "metric", "n", "median |err| before", "after", "bias before", "after")
    return table(rows, head)


def fit_text(f: HandoffFit) -> list[str]:
    """One fitted parameter: its runs, value, in-sample error and CV tables."""
    t, b = f.target, f.target.bounds
    engines = sorted({c.group("engine") for c in f.cases})
    fams = sorted({c.group("chip family") for c in f.cases})
    bound = " (AT ITS BOUND: the bound, not the runs, sets it)" if f.at_bound else ""
    mb, ma = render.median_abs(f.error_before), render.median_abs(f.error_after)
    out = [
        f"{len(f.cases)} {t.runs} runs with a measured TTFT (engines: {', '.join(engines)}; "
        f"chip families: {', '.join(fams)}).",
        f"Fitted {t.name} = {f.handoff_s:.3f} s{bound}, bounds [{b.lo:g}, {b.hi:g}] s "
        f"({LOSS} loss, f_scale {F_SCALE:g}, on log(predicted / measured TTFT)).",
        "TTFT error = predicted / measured - 1 over these runs. In-sample: median |error| "
        f"{render.apct(mb)} ({t.zero}) -> {render.apct(ma)}; "
        f"bias {render.pct(render.median_bias(f.error_before))} -> "
        f"{render.pct(render.median_bias(f.error_after))}.",
    ]
    for cv in f.cv:
        out += ["", _cv_title(cv.by, t), cv_table(cv)]
    return out


def runs_text(res: ServingCalibration, docs: bool = False) -> str:
    f, lat = res.fit, res.latency or LatencyFits()
    out = fit_text(f)
    for g in lat.fits:
        out += [""] + fit_text(g)
    out += [""] + lat.notes_text()
    out += [
        "",
        "The whole file, before (no hand-off, no request latency) and after (the fitted ones); "
        "'held out by' rows give each run a fitted parameter reads its fold's error:",
        whole_table(res.whole),
    ]
    if not docs:
        for g in (f, *lat.fits):
            if g is not None:
                out.append(
                    f"({g.target.name}: TTFT cached at {len(g.target.grid)} values per run; at "
                    f"the fitted value the exact predictions differ from the cache by at most "
                    f"{g.interpolation_gap_s * 1e3:.2f} ms)"
                )
        if res.skipped:
            out += ["", f"Runs not used ({len(res.skipped)}):"]
            out += [f"- {k}: {v}" for k, v in res.skipped.items()]
        out += ["", f"Profile: {res.profile.describe()}"]
        out += [f"Wrote {w}" for w in res.written]
    return "\n".join(out)


def _cv_title(by: str, t: Target = HANDOFF_T) -> str:
    after = "the fold's fit"
    if t.engine and by == "engine":
        after = f"the prior {PRIOR_T.name} fitted on the other engines' runs"
    return (
        f"Leave-one-{by}-out (held-out {t.runs} runs; before = {t.zero}, "
        f"after = {after}, predicted exactly):"
    )


def write_cv_docs(path: str | Path, res: ServingCalibration, command: str) -> None:
    """Replace the text between the serving markers of `path` with this calibration's tables."""
    body = f"Generated by `{command}`.\n\n```text\n{runs_text(res, docs=True)}\n```\n"
    render.write_between(path, BEGIN, END, body)


# -- the command ------------------------------------------------------------------------------


def fit_latency(
    runs: Sequence[Any],
    prof: Efficiency,
    predict: Predict,
    cv: bool = True,
    progress: Callable[[str], None] | None = None,
    p: Target = LATENCY_TS[0],
) -> tuple[HandoffFit | None, str, dict[str, str]]:
    """One engine's per-request latency on its aggregated runs, or None and why (too few
    runs: the engine falls back to the prior)."""
    cases, skipped = _cases(runs, p.reads)
    if len(cases) < MIN_RUNS:
        note = (
            f"{p.name} not fitted: {len(cases)} mapped {p.runs} run(s) with a measured TTFT "
            f"(< {MIN_RUNS}); {p.engine} falls back to the prior {PRIOR_T.name}"
        )
        return None, note, skipped
    fit = fit_cases(cases, prof, predict, cv=cv, progress=progress, p=p)
    return fit, "", {**skipped, **fit.skipped}


@dataclass(frozen=True)
class LatencyFits:
    """Each engine's fitted latency (with its CV) and the prior of the engines without one."""

    fits: tuple[HandoffFit, ...] = ()
    prior_s: float | None = None  # None: no engine fitted
    notes: tuple[str, ...] = ()  # the engines not fitted, and why

    def notes_text(self) -> list[str]:
        head = (
            f"Prior {PRIOR_T.name} (an engine without its own value; leave-one-engine-out's "
            f"held-out engine): {self.prior_s:.3f} s, fitted on the "
            f"{sum(len(f.cases) for f in self.fits)} {PRIOR_T.runs} together."
            if self.prior_s is not None
            else f"Prior {PRIOR_T.name}: not fitted (no engine's latency is)."
        )
        return [head, *self.notes]

    def to_dict(self) -> dict[str, Any]:
        return {
            "prior_s": self.prior_s,
            "engines": {f.target.engine: fit_dict(f) for f in self.fits},
            "not_fitted": list(self.notes),
        }


def pooled_latency(fits: Sequence[HandoffFit]) -> float | None:
    """One latency fitted on every case of `fits` together (each case's TTFT at its own
    engine's value: the engines' curves share LATENCY_GRID_S), or None with too few runs."""
    have = [f for f in fits if f.curves is not None]
    if sum(len(f.cases) for f in have) < MIN_RUNS:
        return None
    curves = TtftCurves(have[0].curves.grid, np.vstack([f.curves.ttft_s for f in have]))
    measured = np.array([c.measured_ttft_s for f in have for c in f.cases])
    return fit_handoff(curves, measured, range(len(measured)), PRIOR_T)


def engine_prior_cv(
    fits: Sequence[HandoffFit], i: int, prof: Efficiency, predict: Predict
) -> ServingCV:
    """Leave-one-engine-out for engine `fits[i]`: its runs predicted exactly with the prior
    fitted on the other engines' runs (what an engine with no value of its own is given)."""
    f, others = fits[i], [g for j, g in enumerate(fits) if j != i]
    measured = np.array([c.measured_ttft_s for c in f.cases])
    before = f.error_before
    n_train = sum(len(g.cases) for g in others)
    h = pooled_latency(others)
    if h is None:
        why = f"{n_train} runs of other engines (< {MIN_RUNS}): no prior to fall back to"
        return ServingCV(
            "engine",
            (Fold(f.target.engine, n_train, len(f.cases), None, before, before, why),),
            f.target,
        )
    start = f.target.on(prof, 0.0)
    pred = np.array([predict_ttft(predict, c, start, h, f.target) for c in f.cases])
    names = ", ".join(g.target.engine for g in others)
    why = f"falls back to the prior, one latency fitted on the aggregated runs of {names}"
    fold = Fold(f.target.engine, n_train, len(f.cases), h, before, pred / measured - 1, why)
    return ServingCV("engine", (fold,), f.target)


def fit_latencies(
    runs: Sequence[Any],
    prof: Efficiency,
    predict: Predict,
    cv: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[LatencyFits, dict[str, str]]:
    """Every LATENCY_ENGINES engine's latency on its aggregated runs, the prior on all of them
    and (with `cv`) each engine's leave-one-engine-out fold."""
    fits, notes, skipped = [], [], {}
    for t in LATENCY_TS:
        fit, note, sk = fit_latency(runs, prof, predict, cv, progress, t)
        skipped.update(sk)
        if fit is None:
            notes.append(note)
        else:
            fits.append(fit)
    if cv:
        fits = [
            replace(f, cv=(engine_prior_cv(fits, i, prof, predict), *f.cv))
            for i, f in enumerate(fits)
        ]
    return LatencyFits(tuple(fits), pooled_latency(fits), tuple(notes)), skipped


def with_latencies(prof: Efficiency, lat: LatencyFits) -> Efficiency:
    """`prof` with each fitted engine's latency and the prior (an unfitted engine's own value
    set to 0, so that it falls back to the prior)."""
    fitted = {f.target.engine: f.handoff_s for f in lat.fits}
    out = PRIOR_T.on(prof, lat.prior_s or 0.0)
    for t in LATENCY_TS:
        out = t.on(out, fitted.get(t.engine, 0.0)) if t.engine in fitted else _drop(out, t)
    return out


def _drop(prof: Efficiency, t: Target) -> Efficiency:
    """`prof` without `t`'s per-engine value (the engine reads the profile's prior)."""
    fws = dict(prof.frameworks)
    rest = {k: v for k, v in fws.get(t.engine, {}).items() if k != t.key}
    fws[t.engine] = MappingProxyType(rest)
    return replace(prof, frameworks=MappingProxyType(fws))


def calibrate_serving(
    path: str | Path,
    *,
    base: str = "fitted",
    out: str | None = None,
    docs: str | None = None,
    cv: bool = True,
    predict: Predict | None = None,
    progress: Callable[[str], None] | None = None,
) -> ServingCalibration:
    """Read the serving runs, fit the hand-off and SGLang's request latency, cross-validate,
    summarise, write."""
    predict = predict or _default_predict()
    prof = load_profile(base)
    _, runs = load_serving_runs(path)
    cases, skipped = disagg_cases(runs)
    refuse_if_few(len(cases), f"runs file {str(path)!r}")
    fit = fit_cases(cases, prof, predict, cv=cv, progress=progress)
    lat, lat_skipped = fit_latencies(runs, prof, predict, cv, progress)
    fitted = with_latencies(replace(prof, disagg_handoff_s=fit.handoff_s), lat)
    if progress:
        progress("predicting the whole file before and after")
    whole = whole_file(runs, prof, fitted, predict, (*fit.cv, *(c for f in lat.fits for c in f.cv)))
    cmd = f"roofline calibrate --from-runs {path} --base {base}"
    cmd += (f" --out {out}" if out else "") + (f" --docs {docs}" if docs else "")
    cmd += "" if cv else " --no-cv"
    prov = provenance(fit, whole, path, base, cmd, lat)
    fitted = replace(fitted, provenance={**dict(prof.provenance), "serving": prov})
    every_skip = {**skipped, **fit.skipped, **lat_skipped}
    res = ServingCalibration(fitted, fit, whole, every_skip, latency=lat)
    written = []
    if out:
        written.append(write_profile(out, base, fitted, prov))
    if docs:
        write_cv_docs(docs, res, cmd)
        written.append(str(docs))
    return replace(res, written=tuple(written))


__all__ = [
    "BEGIN",
    "END",
    "HANDOFF",
    "LATENCY",
    "LATENCY_ENGINES",
    "LATENCY_TS",
    "PRIOR_T",
    "ServingCalibration",
    "Target",
    "add_serving",
    "calibrate_serving",
    "disagg_cases",
    "fit_cases",
    "fit_handoff",
    "fit_latencies",
    "latency_cases",
    "latency_target",
    "runs_text",
    "strip_serving",
]
