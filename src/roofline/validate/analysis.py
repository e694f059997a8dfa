"""Error analysis of a training scoreboard: which structured causes explain the error.

Diagnostics only — nothing here changes a prediction (efficiency is physics, never a fit):

- `scalar_residual(report, key)`: if one constant per group (chip family, stack, ...) were
  divided out of the predictions, what median |error| would remain? A large drop means the
  error is mostly a per-group level; what remains is structure within the groups.
- `regression(report)`: least squares of log(predicted/measured) on indicator features
  (stack, long sequence, pipeline, MoE, model size, fp8, ...), so confounded causes (fp8 runs
  are mostly NVIDIA stacks, long-context runs mostly torchtitan/MPT) are separated. Each
  coefficient is reported as a multiplicative factor exp(beta) on the predicted throughput.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from roofline.validate.features import features

if TYPE_CHECKING:  # the records only; scoreboard imports this module to render its analysis
    from roofline.validate.scoreboard import TrainingReport, TrainingResult


def _covered(report: TrainingReport) -> list[TrainingResult]:
    return [r for r in report.results if r.covered]


def scalar_residual(report: TrainingReport, key: Callable[[TrainingResult], str]) -> dict[str, Any]:
    """Median |error| after dividing each group's predictions by that group's median ratio."""
    rs = _covered(report)
    ratios: dict[str, list[float]] = {}
    for r in rs:
        ratios.setdefault(key(r), []).append(1 + r.error)
    scale = {k: float(np.median(v)) for k, v in ratios.items()}
    resid = [abs((1 + r.error) / scale[key(r)] - 1) for r in rs]
    return {
        "median_abs_error_before": float(np.median([abs(r.error) for r in rs])) if rs else None,
        "median_abs_error_after": float(np.median(resid)) if rs else None,
        "group_factor": {k: round(v, 4) for k, v in sorted(scale.items())},
    }


FEATURES: dict[str, Callable[[TrainingResult], bool]] = {
    "stack=torchtitan": lambda r: r.run.source.stack == "torchtitan",
    "stack=llm-foundry": lambda r: r.run.source.stack == "llm-foundry",
    "stack=maxtext": lambda r: r.run.source.stack == "maxtext",
    "stack=meta": lambda r: r.run.source.stack == "meta",
    "seq>8k": lambda r: features(r)["seq_len"] == ">8k",
    "pp>1": lambda r: features(r)["pipeline"] == "pp>1",
    "moe": lambda r: features(r)["moe"] == "moe",
    "params<10B": lambda r: features(r)["model_size"] == "<10B",
    "params>=100B": lambda r: features(r)["model_size"] == ">=100B",
    "fp8/fp4": lambda r: features(r)["compute_dtype"] in ("fp8", "fp4"),
    "remat=full": lambda r: features(r)["remat"] == "full",
}
# (No separate TPU indicator: in the public set every TPU run is a MaxText run, so the two
# cannot be told apart; stack=maxtext carries both.)


def regression(report: TrainingReport) -> dict[str, Any]:
    """log(pred/meas) ~ intercept + indicators; the base case is a Megatron-family GPU run,
    <= 8k tokens, no pipeline, dense, 10-100B parameters, bf16, no full remat."""
    rs = _covered(report)
    names, X, dropped = _identifiable_columns(rs)
    if len(rs) <= len(names) + 1:
        return {"n": len(rs), "factors": {}, "note": "too few runs for the regression"}
    y = np.log([1 + r.error for r in rs])
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    fit = X @ beta
    resid = y - fit
    dof = max(len(rs) - len(beta), 1)
    cov = np.linalg.pinv(X.T @ X) * float(resid @ resid) / dof
    se = np.sqrt(np.clip(np.diag(cov), 0, None))
    return {
        "n": len(rs),
        "base_factor": round(float(np.exp(beta[0])), 4),
        "factors": {
            n: {
                "factor": round(float(np.exp(b)), 4),
                "se_log": round(float(s), 4),
                "runs": int(X[:, i + 1].sum()),
            }
            for i, (n, b, s) in enumerate(zip(names, beta[1:], se[1:], strict=True))
        },
        "median_abs_error_of_fit_residual": float(np.median(np.abs(np.exp(resid) - 1))),
        "not_identifiable": dropped,
    }


def _identifiable_columns(rs: list) -> tuple[list[str], np.ndarray, list[str]]:
    """Indicator columns that add rank to the design (a feature true for every covered run, or
    equal to a combination of others, cannot be told apart from them: it is listed, not fitted)."""
    cols = [np.ones(len(rs))]
    names: list[str] = []
    dropped: list[str] = []
    for n, f in FEATURES.items():
        c = np.array([float(f(r)) for r in rs])
        if not c.any():
            continue
        if np.linalg.matrix_rank(np.column_stack([*cols, c])) > len(cols):
            cols.append(c)
            names.append(n)
        else:
            dropped.append(n)
    return names, np.column_stack(cols), dropped


def analyse(report: TrainingReport) -> dict[str, Any]:
    return {
        "one_scalar_per_chip_family": scalar_residual(report, lambda r: r.run.chip_family),
        "one_scalar_per_stack": scalar_residual(report, lambda r: r.run.source.stack),
        "one_scalar_per_source": scalar_residual(report, lambda r: r.run.source.family),
        "regression": regression(report),
    }
