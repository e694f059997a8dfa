"""Text tables for calibration: measured vs predicted per kernel, the fit, the CV folds."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from roofline.calibrate.fit import CrossValidation, FitResult, bounds_of
from roofline.report.table import table
from roofline.specs.efficiency import Param


def pct(x: float | None) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x * 100:+.1f}%"


def apct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def median_abs(e: np.ndarray) -> float | None:
    """Median |error| (None for no errors)."""
    return float(np.median(np.abs(e))) if len(e) else None


def median_bias(e: np.ndarray) -> float | None:
    """Median signed error (None for no errors)."""
    return float(np.median(e)) if len(e) else None


def error_summary(e: np.ndarray) -> dict[str, float]:
    """Median |error| and median signed error, rounded to 4 digits, as provenance records them
    ({} for no errors)."""
    if not len(e):
        return {}
    return {
        "median_abs": round(float(np.median(np.abs(e))), 4),
        "bias": round(float(np.median(e)), 4),
    }


def write_between(path: str | Path, begin: str, end: str, body: str) -> None:
    """Replace the text between the markers `begin` and `end` of the file at `path` with
    `body` (markers appended first when the file lacks them; the file created if absent)."""
    p = Path(path)
    text = p.read_text() if p.exists() else ""
    if begin not in text or end not in text:
        text += f"\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    p.write_text(head + begin + "\n" + body + end + tail)


def fmt_s(t: float) -> str:
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.3f} ms" if t < 1 else f"{t:.3f} s"


def kernel_table(
    labels: Sequence[str],
    rates: Sequence[str],
    measured: np.ndarray,
    before: np.ndarray,
    after: np.ndarray,
) -> str:
    rows = [
        (lab, fmt_s(m), rate, fmt_s(b), pct(b / m - 1), fmt_s(a), pct(a / m - 1))
        for lab, rate, m, b, a in zip(labels, rates, measured, before, after, strict=True)
    ]
    head = ("kernel", "measured", "achieved", "datasheet", "err", "fitted", "err")
    return table(rows, head)


def by_kind(
    kinds: Sequence[str], measured: np.ndarray, before: np.ndarray, after: np.ndarray
) -> str:
    rows = []
    ks = np.asarray(kinds, dtype=object)
    for k in dict.fromkeys(kinds):
        sel = ks == k
        rows.append(
            (
                k,
                int(sel.sum()),
                apct(median_abs(before[sel] / measured[sel] - 1)),
                apct(median_abs(after[sel] / measured[sel] - 1)),
            )
        )
    rows.append(
        (
            "all",
            len(ks),
            apct(median_abs(before / measured - 1)),
            apct(median_abs(after / measured - 1)),
        )
    )
    return table(rows, ("kernels", "n", "median |err| datasheet", "median |err| fitted"))


def fit_table(
    r: FitResult,
    bound: Callable[[str], Param] = bounds_of,
    support: Mapping[str, int] | None = None,
) -> str:
    """Fitted parameters (start, fitted, bounds[, runs in scope]) and the refused ones."""
    rows = []
    for n in r.fitted:
        b = bound(n)
        flag = "at bound" if n in r.at_bound else ""
        row = (n, f"{r.prior[n]:.4g}", f"{r.values[n]:.4g}", f"[{b.lo:g}, {b.hi:g}] {b.unit}")
        rows.append((*row, support[n], flag) if support else (*row, flag))
    head = ("parameter", "start", "fitted", "bounds")
    head = (*head, "runs", "") if support else (*head, "")
    out = table(rows, head) if rows else "nothing fitted"
    if r.refused:
        out += "\n\nNot fitted (kept at the starting value):\n" + "\n".join(
            f"- {x.name}: {x.reason}" for x in r.refused
        )
    return out


def cv_table(cv: CrossValidation) -> str:
    """Per fold: the held-out runs' median |error| and bias before and after the fold's fit."""
    rows = [
        (
            f.held_out,
            f.n_train,
            f.n_test,
            apct(median_abs(f.error_before)),
            apct(median_abs(f.error_after)),
            pct(median_bias(f.error_before)),
            pct(median_bias(f.error_after)),
            f"{len(f.fitted)} / {len(f.refused)}",
        )
        for f in cv.folds
    ]
    eb, ea = cv.error_before, cv.error_after
    pooled = ("all held-out runs", "", len(ea), apct(median_abs(eb)), apct(median_abs(ea)))
    rows.append((*pooled, pct(median_bias(eb)), pct(median_bias(ea)), ""))
    head = (
        f"held-out {cv.by}",
        "train",
        "test",
        "median |err| before",
        "after",
        "bias before",
        "after",
        "fitted / refused",
    )
    out = table(rows, head)
    if len(ea):
        # the mean as well as the median: a few far-off held-out runs hide under a median
        out += (
            f"\nmean |error| of all held-out runs: {apct(float(np.mean(np.abs(eb))))} before,"
            f" {apct(float(np.mean(np.abs(ea))))} after"
        )
    spread = cv.spread()
    if spread:
        srows = [
            (
                n,
                s["folds"],
                f"{s['mean']:.4g}",
                f"{s['min']:.4g}",
                f"{s['max']:.4g}",
                f"{s['std']:.3g}",
            )
            for n, s in spread.items()
        ]
        out += "\n\n" + table(srows, ("parameter", "folds", "mean", "min", "max", "std"))
    return out
