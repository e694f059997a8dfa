"""`roofline calibrate --from-runs serving`: fit the disaggregated hand-off on measured TTFT.

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

`--out` the base's own file (`--base fitted --out src/roofline/specs/profiles/fitted.toml`) adds
`disagg_handoff_s` and a `[provenance.serving]` table to it, keeping what the training fit
wrote; another `--out` writes a profile over the base. `--docs` writes the tables between the
serving markers of docs/calibration.md.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from roofline.calibrate import render
from roofline.calibrate.fit import spread_of
from roofline.calibrate.write import toml_key, toml_value
from roofline.errors import RooflineError, SpecError
from roofline.report.table import table
from roofline.specs.catalog import is_file
from roofline.specs.efficiency import OVERHEADS, Efficiency, load_profile

HANDOFF = "disagg_handoff_s"
BOUNDS = OVERHEADS[HANDOFF]
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
PAIR = "model×system pair"
CV_GROUPINGS = ("engine", "chip family", PAIR)
BEGIN = "<!-- calibrate:serving-cv-table:begin -->"
END = "<!-- calibrate:serving-cv-table:end -->"
TOML_MARK = "# serving fit:"

Predict = Callable[..., Mapping[str, Any]]


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
    cases, skipped = [], {}
    for r in runs:
        if not r.disaggregated:
            continue
        if not r.mapped:
            skipped[r.id] = r.skipped_reason
        elif not r.measured.ttft_s:
            skipped[r.id] = "no measured TTFT"
        else:
            cases.append(ServingCase(r, float(r.measured.ttft_s)))
    return cases, skipped


def refuse_if_few(n: int, where: str) -> None:
    if n < MIN_RUNS:
        raise SpecError(
            f"{where}: {n} mapped disaggregated run(s) with a measured TTFT (< {MIN_RUNS}): "
            f"too few to fit {HANDOFF}",
            rule=f"{HANDOFF} is fitted only on at least {MIN_RUNS} disaggregated runs",
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


def predict_ttft(predict: Predict, case: ServingCase, start: Efficiency, h: float) -> float:
    """One exact prediction of a case's TTFT with the hand-off `h` (NaN if it cannot be costed)."""
    try:
        t = predict(case.run, efficiency=replace(start, disagg_handoff_s=float(h)))["ttft_s"]
    except RooflineError:
        return float("nan")
    return float("nan") if t is None else float(t)


def ttft_curves(
    cases: Sequence[ServingCase],
    start: Efficiency,
    predict: Predict,
    grid: Sequence[float] | None = None,
    progress: Callable[[str], None] | None = None,
) -> TtftCurves:
    g = np.asarray(sorted({float(x) for x in (GRID_S if grid is None else grid)}), float)
    out = np.empty((len(cases), len(g)))
    from roofline.progress import track

    for i, c in enumerate(track(cases, "calibrate: TTFT curves", unit="run")):
        out[i] = [predict_ttft(predict, c, start, h) for h in g]
        if progress and (i + 1) % 8 == 0:
            progress(f"predicted {i + 1}/{len(cases)} runs at {len(g)} hand-offs")
    return TtftCurves(g, out)


# -- the fit ----------------------------------------------------------------------------------


def log_residuals(curves: TtftCurves, measured: np.ndarray, idx: Sequence[int], h: float):
    return np.log(curves.at(h, idx) / measured[list(idx)])


def robust_cost(r: np.ndarray) -> float:
    """least_squares' cost of residuals `r` under LOSS and F_SCALE (up to a constant factor)."""
    return float(np.sum(_RHO[LOSS]((np.asarray(r) / F_SCALE) ** 2)))


SCAN = np.linspace(BOUNDS.lo, BOUNDS.hi, 401)  # the start's scan over the bounds (5 ms steps)


def fit_handoff(curves: TtftCurves, measured: np.ndarray, idx: Sequence[int]) -> float:
    """The hand-off (s) minimising the robust cost of log(predicted / measured) over `idx`:
    started at the best point of a dense scan (the cost is not convex), polished by
    least_squares."""
    from scipy.optimize import least_squares

    costs = [robust_cost(log_residuals(curves, measured, idx, h)) for h in SCAN]
    x0 = float(SCAN[int(np.argmin(costs))])
    x0 = min(max(x0, BOUNDS.lo + 1e-9), BOUNDS.hi - 1e-9)
    sol = least_squares(
        lambda x: log_residuals(curves, measured, idx, float(x[0])),
        [x0],
        bounds=([BOUNDS.lo], [BOUNDS.hi]),
        loss=LOSS,
        f_scale=F_SCALE,
        x_scale=[0.1],
        diff_step=[1e-3],
    )
    best = float(sol.x[0])
    # the polish must not lose to its start (a kink of the interpolation can stop it early)
    if robust_cost(log_residuals(curves, measured, idx, best)) > min(costs):
        best = x0
    return float(np.clip(round(best, 4), BOUNDS.lo, BOUNDS.hi))


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
) -> ServingCV:
    """Leave one group out: fit on the others, predict the held-out runs exactly."""
    measured = np.array([c.measured_ttft_s for c in cases])
    groups = [c.group(by) for c in cases]
    folds = []
    for g in sorted(set(groups)):
        test = [i for i, x in enumerate(groups) if x == g]
        train = [i for i, x in enumerate(groups) if x != g]
        before = curves.at(0.0, test) / measured[test] - 1
        if len(train) < MIN_RUNS:
            why = f"{len(train)} training runs (< {MIN_RUNS}): the fold keeps no hand-off"
            folds.append(Fold(g, len(train), len(test), None, before, before, why))
            continue
        h = fit_handoff(curves, measured, train)
        after = exact(test, h) / measured[test] - 1
        folds.append(Fold(g, len(train), len(test), h, before, after))
    return ServingCV(by, tuple(folds))


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

    @property
    def at_bound(self) -> bool:
        return self.handoff_s <= BOUNDS.lo or self.handoff_s >= BOUNDS.hi


def fit_cases(
    cases: Sequence[ServingCase],
    start: Efficiency,
    predict: Predict,
    *,
    cv: bool = True,
    grid: Sequence[float] | None = None,
    progress: Callable[[str], None] | None = None,
) -> HandoffFit:
    """Fit the hand-off on `cases` (their predictor and the profile `start`, hand-off ignored)."""
    start = replace(start, disagg_handoff_s=0.0)
    refuse_if_few(len(cases), "calibrate --from-runs (serving)")
    curves = ttft_curves(cases, start, predict, grid, progress)
    ok = np.all(np.isfinite(curves.ttft_s) & (curves.ttft_s > 0), axis=1)
    skipped = {
        c.id: "the serving model cannot cost this run"
        for c, k in zip(cases, ok, strict=True)
        if not k
    }
    cases = [c for c, k in zip(cases, ok, strict=True) if k]
    curves = TtftCurves(curves.grid, curves.ttft_s[ok])
    refuse_if_few(len(cases), "calibrate --from-runs (serving), runs the model can cost")
    measured = np.array([c.measured_ttft_s for c in cases])

    def exact(idx: Sequence[int], h: float) -> np.ndarray:
        return np.array([predict_ttft(predict, cases[i], start, h) for i in idx])

    every = list(range(len(cases)))
    h = fit_handoff(curves, measured, every)
    after = exact(every, h)
    gap = float(np.max(np.abs(after - curves.at(h))))
    folds = tuple(cross_validate(cases, curves, exact, by) for by in CV_GROUPINGS) if cv else ()
    return HandoffFit(
        tuple(cases),
        h,
        curves.at(0.0) / measured - 1,
        after / measured - 1,
        gap,
        folds,
        skipped,
    )


# -- the whole file before and after -----------------------------------------------------------


def whole_file(
    runs: Sequence[Any],
    start: Efficiency,
    fitted: Efficiency,
    predict: Predict,
    cv: Sequence[ServingCV] = (),
) -> dict[str, dict[str, dict[str, Any]]]:
    """TTFT and TPOT summaries of every run (and the aggregated / disaggregated ones) with no
    hand-off and with the fitted one; aggregated runs are predicted once (they do not read it).
    With `cv`, also the whole file's TTFT with every disaggregated run predicted by its fold's
    hand-off (fitted without its group): the honest whole-file number."""
    from roofline.validate.serving_runs import Metric
    from roofline.validate.serving_score import predict_serving_run
    from roofline.validate.stats import summarize

    start = replace(start, disagg_handoff_s=0.0)
    before = [predict_serving_run(r, predict, start) for r in runs]
    after = [
        predict_serving_run(r, predict, fitted) if r.disaggregated else b
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
    agg = [
        x.errors[Metric.TTFT.value]
        for x in before
        if not x.run.disaggregated and Metric.TTFT.value in x.errors
    ]
    for c in cv:
        errs = [*agg, *c.error_after.tolist()]
        out[f"all, hand-off held out by {c.by}"] = {
            Metric.TTFT.value: {
                "before": out["all"][Metric.TTFT.value]["before"],
                "after": summarize(errs, total=len(errs)),
            }
        }
    return out


@dataclass(frozen=True)
class ServingCalibration:
    profile: Efficiency
    fit: HandoffFit
    whole: Mapping[str, Any]
    skipped: Mapping[str, str]
    written: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        f = self.fit
        return {
            "parameter": HANDOFF,
            "bounds_s": [BOUNDS.lo, BOUNDS.hi],
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
                    "error_before": float(b),
                    "error_after": float(a),
                }
                for c, b, a in zip(f.cases, f.error_before, f.error_after, strict=True)
            ],
            "in_sample_before": render.error_summary(f.error_before),
            "in_sample_after": render.error_summary(f.error_after),
            "cv": [_cv_dict(cv) for cv in f.cv],
            "whole_file": self.whole,
            "skipped": dict(self.skipped),
            "profile": self.profile.to_dict(),
            "written": list(self.written),
        }


def _cv_dict(cv: ServingCV) -> dict[str, Any]:
    return {
        "by": cv.by,
        "folds": [
            {
                "held_out": f.held_out,
                "train": f.n_train,
                "test": f.n_test,
                "handoff_s": f.handoff_s,
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
    fit: HandoffFit, whole: Mapping[str, Any], path: str | Path, base: str, command: str
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
        "in_sample_before": render.error_summary(fit.error_before),
        "in_sample_after": render.error_summary(fit.error_after),
    }
    for cv in fit.cv:
        key = "cv_" + cv_key(cv.by)
        out[key + "_before"] = render.error_summary(cv.error_before)
        out[key + "_after"] = render.error_summary(cv.error_after)
        out[key + "_spread_s"] = {
            k: (int(v) if k == "folds" else round(float(v), 4)) for k, v in cv.spread().items()
        }
    for subset in ("all", "disaggregated"):
        for m in ("ttft", "tpot"):
            for when in ("before", "after"):
                s = whole.get(subset, {}).get(m, {}).get(when, {})
                if s.get("median_abs_error") is not None:
                    out[f"{subset}_{m}_{when}"] = {
                        "n": s["n"],
                        "median_abs": round(s["median_abs_error"], 4),
                        "bias": round(s["bias"], 4),
                    }
    for cv in fit.cv:
        s = whole.get(f"all, hand-off held out by {cv.by}", {}).get("ttft", {}).get("after", {})
        if s.get("median_abs_error") is not None:
            out["all_ttft_held_out_by_" + cv_key(cv.by)] = {
                "n": s["n"],
                "median_abs": round(s["median_abs_error"], 4),
                "bias": round(s["bias"], 4),
            }
    return out


def strip_serving(text: str) -> str:
    """A profile file's text without a previous serving fit (its key, comment and table)."""
    out, table_name = [], ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("[") and not s.startswith("[["):
            table_name = s.strip("[]").strip()
        if table_name == "provenance.serving" or s.startswith(TOML_MARK):
            continue
        if not table_name and s.split("=", 1)[0].strip() == HANDOFF:
            continue
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"


def _serving_lines(h: float, prov: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    key = [
        f"{TOML_MARK} fitted by `{prov.get('command', 'roofline calibrate --from-runs serving')}`",
        f"{TOML_MARK} per-request hand-off of disaggregated serving (docs/calibration.md)",
        f"{HANDOFF} = {toml_value(float(h))}",
    ]
    table_lines = ["", "[provenance.serving]"]
    table_lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in prov.items()]
    return key, table_lines


def add_serving(text: str, h: float, prov: Mapping[str, Any]) -> str:
    """`text` (a profile file) with this serving fit in place of any previous one: the key
    before the first table, `[provenance.serving]` at the end."""
    lines = strip_serving(text).rstrip("\n").splitlines()
    key, table_lines = _serving_lines(h, prov)
    first = next((i for i, x in enumerate(lines) if x.strip().startswith("[")), len(lines))
    while first > 0 and not lines[first - 1].strip():
        first -= 1
    lines = lines[:first] + key + lines[first:]
    return "\n".join(lines + table_lines) + "\n"


def overlay_text(base: str, name: str, calibrated: bool, h: float, prov: Mapping[str, Any]) -> str:
    """A new profile file: `base` with the fitted hand-off."""
    base_ref = str(Path(base).resolve()) if is_file(base) else base
    head = [
        "# The base profile with the disaggregated hand-off fitted on measured serving runs.",
        f"# Regenerate: {prov.get('command', '')}",
        f"name = {toml_value(name)}",
        f"base = {toml_value(base_ref)}",
        f"calibrated = {toml_value(bool(calibrated))}",
    ]
    return add_serving("\n".join(head) + "\n", h, prov)


def write_profile(out: str | Path, base: str, profile: Efficiency, prov: Mapping[str, Any]) -> str:
    """Write the fit: into the base's own file when `out` is it, else a profile over the base."""
    from roofline.calibrate.ship import base_path

    p, bp = Path(out), base_path(base)
    h = profile.disagg_handoff_s
    if bp is not None and p.exists() and p.resolve() == bp.resolve():
        text = add_serving(p.read_text(), h, prov)
    else:
        text = overlay_text(base, p.stem, profile.calibrated, h, prov)
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
    head = (f"held-out {cv.by}", "train", "test", "median |err| before", "after")
    out = table(rows, (*head, "bias before", "after", HANDOFF))
    s = cv.spread()
    if s:
        out += (
            f"\n{HANDOFF} over {s['folds']} folds: mean {s['mean']:.3f} s, "
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


def runs_text(res: ServingCalibration, docs: bool = False) -> str:
    f = res.fit
    engines = sorted({c.group("engine") for c in f.cases})
    fams = sorted({c.group("chip family") for c in f.cases})
    bound = " (at its bound)" if f.at_bound else ""
    out = [
        f"{len(f.cases)} disaggregated runs with a measured TTFT (engines: {', '.join(engines)}; "
        f"chip families: {', '.join(fams)}).",
        f"Fitted {HANDOFF} = {f.handoff_s:.3f} s{bound}, bounds [{BOUNDS.lo:g}, {BOUNDS.hi:g}] s "
        f"({LOSS} loss, f_scale {F_SCALE:g}, on log(predicted / measured TTFT)).",
        "TTFT error = predicted / measured - 1 over these runs. In-sample: median |error| "
        f"{render.apct(render.median_abs(f.error_before))} (no hand-off) -> {render.apct(render.median_abs(f.error_after))}; "
        f"bias {render.pct(render.median_bias(f.error_before))} -> {render.pct(render.median_bias(f.error_after))}.",
    ]
    for cv in f.cv:
        out += ["", _cv_title(cv.by), cv_table(cv)]
    out += [
        "",
        "The whole file, before (no hand-off) and after (the fitted one); aggregated runs do not read it:",
        whole_table(res.whole),
    ]
    if not docs:
        out.append(
            f"(TTFT cached at {len(GRID_S)} hand-offs per run; at the fitted value the exact "
            f"predictions differ from the cache by at most {f.interpolation_gap_s * 1e3:.2f} ms)"
        )
        if res.skipped:
            out += ["", f"Disaggregated runs not used ({len(res.skipped)}):"]
            out += [f"- {k}: {v}" for k, v in res.skipped.items()]
        out += ["", f"Profile: {res.profile.describe()}"]
        out += [f"Wrote {w}" for w in res.written]
    return "\n".join(out)


def _cv_title(by: str) -> str:
    return (
        f"Leave-one-{by}-out (held-out disaggregated runs; before = no hand-off, "
        "after = the fold's fit, predicted exactly):"
    )


def write_cv_docs(path: str | Path, res: ServingCalibration, command: str) -> None:
    """Replace the text between the serving markers of `path` with this calibration's tables."""
    body = f"Generated by `{command}`.\n\n```text\n{runs_text(res, docs=True)}\n```\n"
    render.write_between(path, BEGIN, END, body)


# -- the command ------------------------------------------------------------------------------


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
    """Read the serving runs, fit the hand-off, cross-validate, summarise, write."""
    predict = predict or _default_predict()
    prof = load_profile(base)
    _, runs = load_serving_runs(path)
    cases, skipped = disagg_cases(runs)
    refuse_if_few(len(cases), f"runs file {str(path)!r}")
    fit = fit_cases(cases, prof, predict, cv=cv, progress=progress)
    fitted = replace(prof, disagg_handoff_s=fit.handoff_s)
    if progress:
        progress(f"{HANDOFF} = {fit.handoff_s:.3f} s; predicting the whole file before and after")
    whole = whole_file(runs, prof, fitted, predict, fit.cv)
    cmd = f"roofline calibrate --from-runs {path} --base {base}"
    cmd += (f" --out {out}" if out else "") + (f" --docs {docs}" if docs else "")
    cmd += "" if cv else " --no-cv"
    prov = provenance(fit, whole, path, base, cmd)
    fitted = replace(fitted, provenance={**dict(prof.provenance), "serving": prov})
    res = ServingCalibration(fitted, fit, whole, {**skipped, **fit.skipped})
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
    "ServingCalibration",
    "add_serving",
    "calibrate_serving",
    "disagg_cases",
    "fit_cases",
    "fit_handoff",
    "runs_text",
    "strip_serving",
]
