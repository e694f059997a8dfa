"""The serving Pareto chart: tokens/s/user against tokens/s/chip (applied-inference.md's plot).

Presentation only: every number comes from the serving planner's arrays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def pareto_chart(
    per_user: Any,
    per_chip: Any,
    front: Any,
    path: str | Path,
    *,
    title: str = "",
    best: int | None = None,
) -> Path:
    """Scatter of every feasible candidate, the frontier as a line, the chosen plan marked."""
    from roofline.report.plots import check_plot_path

    p = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    u, c = np.asarray(per_user, float), np.asarray(per_chip, float)
    ok = np.isfinite(u) & np.isfinite(c)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(u[ok], c[ok], s=8, color="0.75", label="feasible plans")
    f = np.asarray(front, int)
    if f.size:
        ax.plot(u[f], c[f], "-o", color="tab:blue", ms=4, label="Pareto frontier")
    if best is not None:
        ax.plot([u[best]], [c[best]], "*", color="tab:red", ms=14, label="chosen plan")
    ax.set_xlabel("tokens/s per user (1 / TPOT)")
    ax.set_ylabel("output tokens/s per chip")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(p)
    plt.close(fig)
    return p
