"""`roofline validate --plot`: predicted vs measured, log-log, with the ±10% and ±20% bands.

Training: one panel (tokens/s per chip), points coloured by source. Serving: one panel per
metric (TTFT, TPOT, throughput), points coloured by engine; errors are never pooled.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from roofline.errors import SpecError

_FORMATS = (".png", ".svg", ".pdf")


def _bands(ax, lo: float, hi: float) -> None:
    import numpy as np

    x = np.geomspace(lo, hi, 50)
    ax.plot(x, x, color="black", lw=1, label="predicted = measured")
    ax.fill_between(x, x * 0.9, x * 1.1, color="tab:green", alpha=0.18, lw=0, label="±10%")
    ax.fill_between(x, x * 0.8, x * 0.9, color="tab:olive", alpha=0.12, lw=0, label="±20%")
    ax.fill_between(x, x * 1.1, x * 1.2, color="tab:olive", alpha=0.12, lw=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)


def _panel(ax, points: Sequence[tuple[float, float, str]], xlabel: str, title: str) -> None:
    if not points:
        ax.text(0.5, 0.5, "no predictions", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        return
    vals = [v for p in points for v in p[:2]]
    lo, hi = min(vals) / 1.5, max(vals) * 1.5
    _bands(ax, lo, hi)
    groups = sorted({g for *_, g in points})
    for g in groups:
        xs = [m for m, _, gg in points if gg == g]
        ys = [p for _, p, gg in points if gg == g]
        ax.scatter(xs, ys, s=22, label=g, zorder=3)
    ax.set_xlabel(f"measured {xlabel}")
    ax.set_ylabel(f"predicted {xlabel}")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)


def _check_path(path: str | Path) -> Path:
    p = Path(path)
    if p.suffix.lower() not in _FORMATS:
        raise SpecError(
            f"plot file {str(p)!r} has no known image suffix",
            rule="--plot writes " + ", ".join(_FORMATS),
            fix=f"write e.g. --plot {p.with_suffix('.png').name}",
        )
    return p


def plot_training(report, path: str | Path) -> Path:
    """Scatter of the covered training runs of a TrainingReport."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = _check_path(path)
    pts = [
        (
            r.run.measured.tokens_per_s_per_chip,
            r.predicted_tokens_per_s_per_chip,
            r.run.source.family,
        )
        for r in report.results
        if r.covered
    ]
    s = report.summary()
    fig, ax = plt.subplots(figsize=(7, 6.5))
    title = f"training: {s['n']}/{s['n_total']} runs"
    if s["n"]:
        title += f", median |error| {s['median_abs_error']:.0%}, bias {s['bias']:+.0%}"
    _panel(ax, pts, "tokens/s per chip", title)
    fig.tight_layout()
    fig.savefig(p, dpi=130)
    plt.close(fig)
    return p


def plot_serving(report, path: str | Path) -> Path:
    """One panel per metric of a ServingReport."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from roofline.validate.serving_runs import Metric

    p = _check_path(path)
    fig, axes = plt.subplots(1, 3, figsize=(18, 6))
    summ = report.summary()
    units = {Metric.TTFT: "TTFT (s)", Metric.TPOT: "TPOT (s)", Metric.THROUGHPUT: "output tokens/s"}
    for ax, m in zip(axes, Metric, strict=True):
        pts = [
            (r.run.measured.value(m), r.prediction.value(m), r.run.engine)
            for r in report.results
            if m.value in r.errors and r.prediction is not None
        ]
        s = summ[m.value]
        t = f"{m.value}: {s['n']}/{s['n_total']} points"
        if s["n"]:
            t += f", median |error| {s['median_abs_error']:.0%}, bias {s['bias']:+.0%}"
        _panel(ax, pts, units[m], t)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
