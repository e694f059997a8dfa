"""Charts (matplotlib, Agg canvas: no display needed). Presentation only: no formulas.

`roofline_chart` draws the book's roofline (roofline.md): attainable FLOP/s against
arithmetic intensity on log-log axes, one roof per compute dtype present, the ridge at
the critical intensity peak/bandwidth, and each op as a labelled point.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from roofline.core.roofline import RooflineResult
from roofline.errors import SpecError
from roofline.specs.chip import Chip

FORMATS = (".png", ".svg", ".pdf")
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def _label(key: Any) -> str:
    return str(getattr(key, "name", key))


def _pairs(points: Any) -> list[tuple[str, RooflineResult]]:
    if isinstance(points, RooflineResult):
        return [("op", points)]
    items: Iterable[Any] = points.items() if isinstance(points, Mapping) else points
    out = []
    for item in items:
        if isinstance(item, RooflineResult):
            out.append((f"op{len(out) + 1}", item))
        else:
            key, res = item
            out.append((_label(key), res))
    return out


def check_plot_path(path: str | Path) -> Path:
    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        raise SpecError(
            f"plot file {str(p)!r} has no known image extension",
            rule="the format follows the extension: " + ", ".join(FORMATS),
            fix=f"name the file e.g. {p.with_suffix('.png').name}",
        )
    if not p.parent.exists():
        raise SpecError(
            f"plot file {str(p)!r}: folder {str(p.parent)!r} does not exist",
            rule="plots are written into an existing folder",
            fix="create the folder or choose another path",
        )
    return p


def roofline_chart(points: Any, chip: Chip, path: str | Path, *, title: str | None = None) -> Path:
    """Write a log-log roofline of `points` on `chip` to `path` (.png, .svg or .pdf).

    `points`: (label or Op, RooflineResult) pairs (what `analyze_ledger` returns), a
    {label: RooflineResult} mapping, or one RooflineResult. Points with zero FLOPs or
    zero bytes have no place on log axes and are left out. Ops at the same spot share
    one marker and one label. Returns the path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    p = check_plot_path(path)
    pairs = _pairs(points)
    W = chip.hbm_bw_bytes_per_s
    dtypes = sorted({r.compute_dtype for _, r in pairs} or {"bf16"}, key=lambda d: chip.peak(d))
    ridges = {d: chip.peak(d) / W for d in dtypes}

    # group points that land on the same spot (e.g. mlp/gate, mlp/up share a shape)
    spots: dict[tuple[float, float, str], list[str]] = {}
    skipped = 0
    for label, r in pairs:
        x, f, t = float(r.intensity), float(r.flops), float(r.time_lower_s)
        if not (math.isfinite(x) and x > 0 and f > 0 and t > 0):
            skipped += 1
            continue
        y = f / t
        spots.setdefault((float(f"{x:.6g}"), float(f"{y:.6g}"), r.compute_dtype), []).append(label)

    xs = [k[0] for k in spots] + list(ridges.values())
    xmin = 10 ** math.floor(math.log10(min(xs) / 4))
    xmax = 10 ** math.ceil(math.log10(max(xs) * 4))
    n = 200
    grid = [xmin * (xmax / xmin) ** (i / (n - 1)) for i in range(n)]

    fig = Figure(figsize=(8, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    color = {d: _COLORS[i % len(_COLORS)] for i, d in enumerate(dtypes)}
    for d in dtypes:
        C = chip.peak(d)
        ax.plot(
            grid,
            [min(C, x * W) for x in grid],
            color=color[d],
            lw=2,
            label=f"{d}: peak {C:.3g} FLOP/s, ridge {ridges[d]:.0f} FLOP/B",
        )
        ax.axvline(ridges[d], color=color[d], ls=":", lw=1)
    level, prev = 0, None
    for (x, y, d), labels in sorted(spots.items()):
        ax.plot([x], [y], "o", color=color[d], ms=6, mec="black", mew=0.5)
        text = (
            ", ".join(labels) if len(labels) <= 3 else f"{', '.join(labels[:3])} +{len(labels) - 3}"
        )
        # stack labels of points closer than ~0.6 decade at the same height so they stay readable
        crowded = (
            prev is not None
            and math.log10(x / prev[0]) < 0.6
            and abs(math.log10(y / prev[1])) < 0.15
        )
        level = level + 1 if crowded else 0
        prev = (x, y)
        ax.annotate(
            text,
            (x, y),
            textcoords="offset points",
            xytext=(6, -12 - 11 * level),
            fontsize=7,
            arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "gray"} if level else None,
        )
    ax.set_xlim(xmin, xmax)
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("attainable FLOP/s")
    note = f"; {skipped} op(s) with no FLOPs or bytes not shown" if skipped else ""
    ax.set_title(title or f"Roofline on {chip.name} (HBM {W:.3g} B/s){note}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(p)
    return p


__all__ = ["roofline_chart", "FORMATS"]


def _exposed(p: Any, kind: str) -> float:
    return p.exposed_time_s.get(kind, 0.0)


def plan_breakdown_chart(plans: Any, path: str | Path, *, title: str | None = None) -> Path:
    """Two panels for ranked training plans: where the step time goes (compute, exposed
    communication by kind, pipeline bubble, optimizer) and where the memory per chip goes
    (params, grads, optimizer state, activations, temporaries) against the chip's HBM.

    `plans` are `training.StepCost`s (the planner's top list); presentation only.
    """
    out = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plans = list(plans)
    labels = [
        f"#{i + 1} {p.plan.describe().split(',microbatch')[0]}\n{p.system.n_chips} chips"
        for i, p in enumerate(plans)
    ]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 1.2 + 0.9 * len(plans)))
    y = list(range(len(plans)))[::-1]

    time_parts = [("compute", lambda p: p.compute_time_s)]
    kinds = sorted({k for p in plans for k, v in p.exposed_time_s.items() if v > 0})
    time_parts += [(f"exposed {k}", functools.partial(_exposed, kind=k)) for k in kinds]
    time_parts += [
        ("bubble", lambda p: p.bubble_time_s),
        ("optimizer", lambda p: p.optimizer_time_s),
        ("fixed overheads", lambda p: p.overhead_time_s),
    ]
    left = [0.0] * len(plans)
    for i, (name, get) in enumerate(time_parts):
        vals = [get(p) for p in plans]
        if not any(vals):
            continue
        ax_t.barh(
            y, vals, left=left, color=_COLORS[i % len(_COLORS)] if i else "tab:gray", label=name
        )
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax_t.set_yticks(y, labels, fontsize=8)
    ax_t.set_xlabel("seconds per step")
    ax_t.set_title("step time")
    ax_t.legend(fontsize=8, loc="lower right")

    mem_keys = ("params", "grads", "optimizer", "activations", "temporaries")
    left = [0.0] * len(plans)
    for i, k in enumerate(mem_keys):
        vals = [p.memory_breakdown.get(k, 0.0) / 1e9 for p in plans]
        ax_m.barh(y, vals, left=left, color=_COLORS[i % len(_COLORS)], label=k)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    hbm = max(p.system.chip.hbm_bytes for p in plans) / 1e9
    ax_m.axvline(hbm, color="black", linestyle="--", linewidth=1)
    ax_m.text(hbm, max(y) + 0.45, f" HBM {hbm:.0f} GB", fontsize=8, va="bottom")
    ax_m.set_yticks(y, [""] * len(plans))
    ax_m.set_xlabel("GB per chip (1 GB = 1e9 B)")
    ax_m.set_title("memory per chip")
    ax_m.legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
