"""Error statistics of predicted vs measured values.

error = predicted / measured − 1 (signed: positive = the tool is optimistic, too fast).

- `median_abs_error`, `mean_abs_error`: of |error|;
- `within_10`, `within_20`: share of runs with |error| <= 10% / 20%;
- `bias`: the median signed error (robust to the few runs off by +100% or more);
  `mean_error` is the mean signed error, reported alongside.
Statistics of an empty set are None (JSON null), never NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np


def relative_error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0


def summarize(errors: Sequence[float], total: int | None = None) -> dict[str, Any]:
    """Summary of signed errors; `total` (runs attempted) adds coverage = n / total."""
    e = np.asarray([x for x in errors if x is not None], dtype=float)
    n = int(e.size)
    out: dict[str, Any] = {"n": n}
    if total is not None:
        out["n_total"] = total
        out["coverage"] = n / total if total else None
    if n == 0:
        out.update(
            median_abs_error=None,
            mean_abs_error=None,
            within_10=None,
            within_20=None,
            bias=None,
            mean_error=None,
        )
        return out
    a = np.abs(e)
    out.update(
        median_abs_error=float(np.median(a)),
        mean_abs_error=float(np.mean(a)),
        within_10=float(np.mean(a <= 0.10 + 1e-12)),
        within_20=float(np.mean(a <= 0.20 + 1e-12)),
        bias=float(np.median(e)),
        mean_error=float(np.mean(e)),
    )
    return out


def breakdown(
    items: Iterable[Any],
    key: Callable[[Any], str | None],
    error: Callable[[Any], float | None],
    covered: Callable[[Any], bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """Summary per group: key(item) names the group (None = leave out)."""
    groups: dict[str, list[Any]] = {}
    for it in items:
        k = key(it)
        if k is not None:
            groups.setdefault(str(k), []).append(it)
    out = {}
    for k in sorted(groups):
        its = groups[k]
        errs = [error(i) for i in its if (covered is None or covered(i)) and error(i) is not None]
        out[k] = summarize(errs, total=len(its))
    return out
