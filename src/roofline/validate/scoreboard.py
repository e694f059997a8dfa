"""Predict every mapped training run through the public API and score the predictions.

`validate_training(runs)` costs each run's published plan with `roofline.evaluate_plan` (the
framework profile passed through when the core accepts `framework=`), compares predicted
with measured tokens/s per chip, and summarises the error overall and by source, chip
family, stack, precision and the structured causes of the error analysis (sequence length,
pipeline, MoE, model size). With `planner=True` it also lets the planner choose a plan for the
same chips, batch and sequence and reports how far the planner's predicted throughput sits
above the measured throughput of the run's own plan.
"""

from __future__ import annotations

import datetime
import inspect
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from roofline.errors import RooflineError
from roofline.specs.efficiency import Efficiency
from roofline.training.planner import plan_training
from roofline.training.step import effective_dtypes, evaluate_plan, training_profile
from roofline.validate.analysis import analyse
from roofline.validate.conventions import CONVENTIONS
from roofline.validate.features import CAUSES, features
from roofline.validate.stats import breakdown, relative_error, summarize
from roofline.validate.training_runs import TrainingRun

TAKES_FRAMEWORK = "framework" in inspect.signature(evaluate_plan).parameters
PLANNER_TAKES_FRAMEWORK = "framework" in inspect.signature(plan_training).parameters


@dataclass(frozen=True)
class TrainingResult:
    run: TrainingRun
    predicted_tokens_per_s_per_chip: float | None = None
    error: float | None = None
    skipped_reason: str = ""
    prediction: dict[str, Any] = field(default_factory=dict)
    planner: dict[str, Any] | None = None

    @property
    def covered(self) -> bool:
        return self.error is not None


def _framework_for(run: TrainingRun, framework: str) -> str:
    if framework in ("auto", ""):
        return run.inputs.framework if run.inputs else ""
    return "" if framework == "none" else framework


def predict_run(
    run: TrainingRun, efficiency: Efficiency | None, framework: str = "auto"
) -> TrainingResult:
    """Cost one mapped run's published plan; a run that cannot be costed gets the reason."""
    if not run.mapped:
        return TrainingResult(run, skipped_reason=run.skipped_reason or "not mapped")
    x = run.inputs
    assert x is not None and run.measured is not None
    eff = training_profile(efficiency)
    kw: dict[str, Any] = {"efficiency": eff}
    fw = _framework_for(run, framework)
    if fw and TAKES_FRAMEWORK:
        # the run's own stack as its document ran it (an older version), when auto
        own = framework in ("auto", "") and x.stack is not None
        kw["framework"] = x.stack if own else fw
    try:
        cost = evaluate_plan(x.model, x.system, x.workload, x.plan, **kw)
    except RooflineError as e:
        return TrainingResult(run, skipped_reason=f"the core cannot cost plan {x.plan_text}: {e}")
    if run.layout_defaulted and not cost.fits:
        return TrainingResult(
            run,
            skipped_reason=f"parallel layout not published and the stack's default layout does not fit: {cost.reason}",
        )
    pred = cost.tokens_per_s / x.system.n_chips
    meas = run.measured.tokens_per_s_per_chip
    assert meas is not None
    info = {
        "step_time_s": cost.step_time_s,
        "mfu": cost.mfu,
        "compute_time_s": cost.compute_time_s,
        "exposed_comm_time_s": cost.exposed_comm_time_s,
        "bubble_fraction": cost.bubble_fraction,
        "bottleneck": cost.bottleneck,
        "fits": cost.fits,
        "memory_note": cost.reason,
        "efficiency": eff.name,
        "framework": fw if (fw and TAKES_FRAMEWORK) else "",
    }
    return TrainingResult(run, pred, relative_error(pred, meas), "", info)


_PLANNER_CACHE: dict[tuple, tuple[float, str, int]] = {}


def _planner_best(
    model, system, workload, eff, optimizer, framework, dtypes, compiled=None, as_of=None
) -> tuple[float, str, int]:
    """The planner's fastest plan on exactly this system in the run's compute dtypes, and
    with the run's compile pinned where it states one (else the planner searches it where the
    stack runs eager by default), on the stack as it stood at `as_of` (the run's date; None:
    today); cached per process: CI and repeated validate calls reuse searches."""
    key = (
        repr(model),
        system.name,
        workload.batch_tokens,
        workload.seq_len,
        repr(eff),
        optimizer,
        (framework[0].name, framework[1]) if isinstance(framework, tuple) else framework,
        dtypes,
        compiled,
        as_of,
    )
    if key in _PLANNER_CACHE:
        return _PLANNER_CACHE[key]
    kw: dict[str, Any] = {}
    if framework and PLANNER_TAKES_FRAMEWORK:
        kw["framework"] = framework[0] if isinstance(framework, tuple) else framework
        kw["compiled"] = compiled  # the run's stated compile, pinned (None: searched)
        if as_of is not None:
            kw["as_of"] = as_of
    res = plan_training(
        model,
        system,
        workload,
        objective="time",
        top_k=1,
        efficiency=eff,
        optimizer=optimizer,
        allow_sub_slices=False,
        dtypes=dtypes,
        **kw,
    )
    out = (
        res.best.tokens_per_s / system.n_chips,
        res.best.plan.describe(),
        res.candidates_evaluated,
    )
    _PLANNER_CACHE[key] = out
    return out


def planner_check(
    result: TrainingResult, efficiency: Efficiency | None, framework: str = "auto"
) -> TrainingResult:
    """Add the planner's best plan for the run's chips, batch and sequence (its predicted
    throughput vs the measured throughput of the run's own plan)."""
    if not result.covered:
        return result
    run = result.run
    x = run.inputs
    assert x is not None and run.measured is not None and run.measured.tokens_per_s_per_chip
    eff = training_profile(efficiency)
    as_of = stack_date_of(run, framework)
    fw = _framework_for(run, framework)
    own = framework in ("auto", "") and x.stack is not None and PLANNER_TAKES_FRAMEWORK
    t0 = time.perf_counter()
    try:
        best, plan, n = _planner_best(
            x.model,
            x.system,
            x.workload,
            eff,
            x.plan.optimizer.name,
            # the run's own stack as its document ran it (an older version), as predict_run
            # costs its plan: (the stack, the document naming it for the cache)
            (x.stack, run.source.document) if own else fw,
            effective_dtypes(x.plan, x.system.chip),
            x.plan.compiled,
            as_of,
        )
    except RooflineError as e:
        info = {"skipped_reason": f"planner found no plan: {e}"}
    else:
        info = {
            "predicted_tokens_per_s_per_chip": best,
            "plan": plan,
            "excess_over_measured": best / run.measured.tokens_per_s_per_chip - 1,
            "excess_over_own_plan_prediction": best / result.predicted_tokens_per_s_per_chip - 1
            if result.predicted_tokens_per_s_per_chip
            else None,
            "candidates_evaluated": n,
        }
    info["stack_date"] = as_of.isoformat() if as_of else None
    if as_of:
        info["stack_date_from"] = run.stack_date_from
    info["search_time_s"] = time.perf_counter() - t0
    return TrainingResult(
        run,
        result.predicted_tokens_per_s_per_chip,
        result.error,
        result.skipped_reason,
        result.prediction,
        info,
    )


def stack_date_of(run: TrainingRun, framework: str = "auto") -> datetime.date | None:
    """The date the planner searches the run's stack at: the run's own (`stack_date`) where it
    ran on the stack it is costed on (its source's stack is the profile's, `--framework auto`);
    None otherwise (another stack, or a run on a stack the profile stands in for, e.g. Meta's
    for the Llama 3 paper, is searched as it is today)."""
    x = run.inputs
    if run.stack_date is None or x is None or framework not in ("auto", ""):
        return None
    return run.stack_date if run.source.stack == x.framework else None


def result_dict(r: TrainingResult) -> dict[str, Any]:
    run = r.run
    m = run.measured
    conv = CONVENTIONS.get(m.convention) if m and m.convention else None
    x = run.inputs
    return {
        "id": run.id,
        "source": run.source.family,
        "document": run.source.document,
        "stack": run.source.stack,
        "chip_family": run.chip_family,
        "chips": run.chips,
        "precision": run.precision,
        "compute_dtype": run.compute_dtype,
        "predicted_tokens_per_s_per_chip": r.predicted_tokens_per_s_per_chip,
        "measured_tokens_per_s_per_chip": m.tokens_per_s_per_chip if m else None,
        "error": r.error,
        "defaults": list(run.defaults),
        "skipped_reason": r.skipped_reason or None,
        "measured_metric": m.metric if m else None,
        "conversion": m.conversion if m else None,
        "convention": {
            "key": conv.key,
            "formula": conv.formula,
            "source": conv.source,
            "assumed": m.assumed,
        }
        if conv and m
        else None,
        "checks": list(run.checks),
        "model": x.model.name if x else None,
        "seq_len": run.seq_len,
        "system": x.topology if x else None,
        "plan": x.plan_text if x else None,
        "framework": x.framework if x else None,
        "layout_from_stack_defaults": run.layout_defaulted,
        "prediction": r.prediction or None,
        "planner": r.planner,
        "features": features(r),
    }


@dataclass(frozen=True)
class TrainingReport:
    results: tuple[TrainingResult, ...]
    profile: str
    framework: str
    planner: bool

    def summary(self) -> dict[str, Any]:
        return summarize([r.error for r in self.results if r.covered], total=len(self.results))

    def breakdowns(self) -> dict[str, Any]:
        res = self.results

        def err(r: TrainingResult) -> float | None:
            return r.error

        out = {
            "by_source": breakdown(res, lambda r: r.run.source.family, err),
            "by_chip_family": breakdown(res, lambda r: r.run.chip_family or "unknown", err),
            "by_stack": breakdown(res, lambda r: r.run.source.stack, err),
        }
        mapped = [r for r in res if r.run.inputs is not None]
        out["by_cause"] = {
            c: breakdown(mapped, lambda r, c=c: features(r).get(c), err) for c in CAUSES
        }
        return out

    def planner_summary(self) -> dict[str, Any] | None:
        if not self.planner:
            return None
        rows = [r for r in self.results if r.planner and "excess_over_measured" in r.planner]
        ex = [r.planner["excess_over_measured"] for r in rows]
        s = summarize(ex, total=sum(1 for r in self.results if r.covered))
        import numpy as np

        s["median_excess"] = s.pop("bias")
        s["mean_excess"] = s.pop("mean_error")
        s["within_15"] = float(np.mean(np.asarray(ex) <= 0.15)) if ex else None
        s["search_time_s"] = sum(
            r.planner.get("search_time_s", 0.0) for r in self.results if r.planner
        )
        for k in ("median_abs_error", "mean_abs_error", "within_10", "within_20"):
            s.pop(k, None)
        s["by_precision"] = _excess_by_precision(rows)
        return s

    def skipped(self) -> dict[str, int]:
        return dict(Counter(_reason_key(r.skipped_reason) for r in self.results if not r.covered))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "schema": "training",
            "profile": self.profile,
            "framework": self.framework,
            "framework_applied": TAKES_FRAMEWORK,
            "runs": [result_dict(r) for r in self.results],
            "summary": self.summary(),
            **self.breakdowns(),
            "skipped": self.skipped(),
        }
        if self.planner:
            out["planner"] = self.planner_summary()
        out["analysis"] = analyse(self)
        return out


def _reason_key(reason: str) -> str:
    """Group skip reasons by their first clause ('chip not in catalog: GB300' -> 'chip not in catalog')."""
    return reason.split(":")[0].split(" (")[0].strip()


def validate_training(
    runs: list[TrainingRun],
    *,
    efficiency: Efficiency | None = None,
    profile_name: str = "default",
    framework: str = "auto",
    planner: bool = False,
) -> TrainingReport:
    from roofline.progress import track

    results = []
    for run in track(runs, "validate: training runs", unit="run"):
        r = predict_run(run, efficiency, framework)
        if planner:
            r = planner_check(r, efficiency, framework)
        results.append(r)
    return TrainingReport(tuple(results), profile_name, framework, planner)


def _excess_by_precision(rows: list[TrainingResult]) -> dict[str, dict[str, Any]]:
    """The planner's median excess over the measured plan, 16-bit runs apart from 8/4-bit ones
    (issue 19: a pooled median hid a +8% 16-bit half and a -23% fp8 half)."""
    import numpy as np

    out: dict[str, dict[str, Any]] = {}
    for name, low in (("16-bit", False), ("8/4-bit", True)):
        ex = [
            r.planner["excess_over_measured"]
            for r in rows
            if (r.run.compute_dtype in ("fp8", "fp4")) == low
        ]
        out[name] = {
            "n": len(ex),
            "median_excess": float(np.median(ex)) if ex else None,
        }
    return out
