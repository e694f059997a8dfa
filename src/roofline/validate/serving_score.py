"""Score inference/serving runs: TTFT, TPOT and throughput errors, each metric on its own.

The predictions come from the serving model (issue 11, h5). The contract validate needs is
one function:

    roofline.serving.predict.predict_measured_run(run: ServingRun, *, efficiency: Efficiency | None)
        -> ServingPrediction

taking the typed record of serving_runs.py and returning the predicted TTFT (s), TPOT (s)
and output tokens/s of the whole deployment for that run's workload (None for a metric it
cannot predict; a RooflineError for a run it cannot cost, whose message becomes the skip
reason). Until that function exists every mapped run is skipped with reason "serving model
not available yet", and the command still reports coverage.

Errors never cancel across metrics: each run has up to three errors, and the summary has one
entry per metric (`ttft`, `tpot`, `throughput`), each with n, median_abs_error and bias.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from roofline.errors import RooflineError
from roofline.specs.efficiency import Efficiency
from roofline.validate.serving_bounds import physical_violation
from roofline.validate.serving_runs import Metric, ServingRun
from roofline.validate.stats import breakdown, relative_error, summarize

PREDICTOR_MODULE, PREDICTOR_NAME = "roofline.serving.predict", "predict_measured_run"
NO_MODEL = "serving model not available yet"


@dataclass(frozen=True)
class ServingPrediction:
    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens_per_s: float | None = None  # whole deployment
    notes: tuple[str, ...] = ()

    def value(self, metric: Metric) -> float | None:
        return {
            Metric.TTFT: self.ttft_s,
            Metric.TPOT: self.tpot_s,
            Metric.THROUGHPUT: self.output_tokens_per_s,
        }[metric]


class ServingPredictor(Protocol):
    def __call__(self, run: ServingRun, *, efficiency: Efficiency | None) -> ServingPrediction: ...


def find_predictor() -> ServingPredictor | None:
    """The serving model's entry point, or None while it does not exist."""
    try:
        mod = importlib.import_module(PREDICTOR_MODULE)
    except ImportError:
        return None
    return getattr(mod, PREDICTOR_NAME, None)


@dataclass(frozen=True)
class ServingResult:
    run: ServingRun
    prediction: ServingPrediction | None = None
    errors: dict[str, float] = field(default_factory=dict)  # metric -> signed error
    skipped_reason: str = ""


def _as_prediction(p: Any) -> ServingPrediction:
    if isinstance(p, ServingPrediction):
        return p
    get = p.get if isinstance(p, dict) else lambda k, d=None: getattr(p, k, d)
    notes = tuple(str(n) for n in (get("notes") or ()))
    return ServingPrediction(get("ttft_s"), get("tpot_s"), get("output_tokens_per_s"), notes)


def predict_serving_run(
    run: ServingRun, predictor: ServingPredictor | None, efficiency: Efficiency | None
) -> ServingResult:
    if not run.mapped:
        return ServingResult(run, skipped_reason=run.skipped_reason)
    if predictor is None:
        return ServingResult(run, skipped_reason=NO_MODEL)
    impossible = physical_violation(run)  # the bounds every run is checked against
    if impossible:
        why, flag = impossible
        return ServingResult(replace(run, flags=(*run.flags, flag)), skipped_reason=why)
    try:
        pred = _as_prediction(predictor(run, efficiency=efficiency))
    except RooflineError as e:
        return ServingResult(run, skipped_reason=f"the serving model cannot cost this run: {e}")
    errors = {}
    for metric in Metric:
        meas, got = run.measured.value(metric), pred.value(metric)
        if meas and got is not None and got > 0:
            errors[metric.value] = relative_error(got, meas)
    return ServingResult(run, pred, errors)


def _result_dict(r: ServingResult) -> dict[str, Any]:
    run, p = r.run, r.prediction
    per_metric = {}
    for metric in Metric:
        per_metric[metric.value] = {
            "measured": run.measured.value(metric),
            "predicted": p.value(metric) if p else None,
            "error": r.errors.get(metric.value),
        }
    return {
        "id": run.id,
        "engine": run.engine,
        "engine_version": run.engine_version,
        "model": run.model_name,
        "attention": run.attention,
        "chip_family": run.chip_family,
        "chips": run.chips,
        "mode": run.workload.mode,
        "isl": run.workload.isl,
        "osl": run.workload.osl,
        "concurrency": run.workload.concurrency,
        "precision": {
            "weights": run.precision.weights,
            "moe_weights": run.precision.moe_weights,
            "activations": run.precision.activations,
            "kv_cache": run.precision.kv_cache,
        },
        "parallel": _par(run),
        "metrics": per_metric,
        "measured_statistic": run.measured.statistic,
        "conversions": list(run.measured.conversions),
        "defaults": list(run.defaults),
        "flags": list(run.flags),
        "harness": run.workload.harness or None,
        # what the predictor assumed (engine profile, quantisation, first-wave share, hand-off)
        "prediction_notes": list(p.notes) if p else [],
        "skipped_reason": r.skipped_reason or None,
    }


def _par(run: ServingRun) -> dict[str, Any] | None:
    def d(p):
        return None if p is None else dict(p.__dict__)

    if run.disaggregated:
        return {"prefill": d(run.prefill), "decode": d(run.decode)}
    return d(run.parallel)


@dataclass(frozen=True)
class ServingReport:
    schema: str
    results: tuple[ServingResult, ...]
    predictor_available: bool

    def _metric_summary(self, results, metric: Metric) -> dict[str, Any]:
        have = [r for r in results if r.run.measured.value(metric) is not None]
        return summarize(
            [r.errors[metric.value] for r in have if metric.value in r.errors], total=len(have)
        )

    def summary(self) -> dict[str, Any]:
        return {m.value: self._metric_summary(self.results, m) for m in Metric}

    def _by(self, key: Callable[[ServingResult], str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for m in Metric:
            have = [r for r in self.results if r.run.measured.value(m) is not None]
            out[m.value] = breakdown(have, key, lambda r, m=m: r.errors.get(m.value))
        return out

    def to_dict(self) -> dict[str, Any]:
        mapped = sum(1 for r in self.results if r.run.mapped)
        return {
            "schema": self.schema,
            "predictor": f"{PREDICTOR_MODULE}.{PREDICTOR_NAME}",
            "predictor_available": self.predictor_available,
            "runs": [_result_dict(r) for r in self.results],
            "summary": self.summary(),
            "mapped": mapped,
            "n_total": len(self.results),
            "by_engine": self._by(lambda r: r.run.engine),
            "by_chip_family": self._by(lambda r: r.run.chip_family or "unknown"),
            "skipped": dict(
                Counter(_key(r.skipped_reason) for r in self.results if r.skipped_reason)
            ),
        }


def _key(reason: str) -> str:
    return reason.split(":")[0].split(" (")[0].strip()


def validate_serving(
    runs: list[ServingRun],
    schema: str,
    *,
    efficiency: Efficiency | None = None,
    predictor: ServingPredictor | None = None,
) -> ServingReport:
    pred = predictor or find_predictor()
    from roofline.progress import track

    results = tuple(
        predict_serving_run(r, pred, efficiency)
        for r in track(runs, f"validate: {schema} runs", unit="run")
    )
    return ServingReport(schema, results, pred is not None)
