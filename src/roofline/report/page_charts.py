"""The proposal page's charts as Vega-Lite specs (built with Altair; drawn by Vega in the page).

One spec per chart serves both outputs: the HTML page embeds it (Vega renders it as SVG,
with tooltips), the Markdown report turns it into a PNG with vl-convert. The data are the
rows of `roofline.report.page`, i.e. fields of the CLI documents.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roofline.report import page
from roofline.report.page import ReportDocuments

WIDTH, HEIGHT = 400, 300
BAR_WIDTH = 340  # the bar charts leave room for plan labels on their y axis
LABEL_LIMIT = 190  # px of a plan label on the y axis (the full plan is in the tooltip)
PALETTE = {
    "compute": "#4c78a8",
    "exposed": "#e45756",
    "bubble": "#b279a2",
    "optimizer": "#54a24b",
    "other": "#9d755d",
}


def _alt():
    import altair as alt

    return alt


def _data(rows: list[dict[str, Any]]):
    return _alt().Data(values=rows)


def charts(docs: ReportDocuments) -> dict[str, dict[str, Any]]:
    """{chart id: Vega-Lite spec} for every chart the documents have data for."""
    builders = {
        "roofline": roofline_chart,
        "timeline": timeline_chart,
        "memory": memory_chart,
        "pareto": pareto_chart,
        "rejected": rejected_chart,
        "serve_pareto": serve_pareto_chart,
    }
    out = {}
    for name, build in builders.items():
        chart = build(docs)
        if chart is not None:
            out[name] = chart.to_dict()
    return out


def roofline_chart(docs: ReportDocuments):
    alt = _alt()
    points, _ = page.roofline_points(docs)
    if not points:
        return None
    xs = [p["intensity"] for p in points]
    roofs = page.roof_lines(docs, min(min(xs), 1.0) / 2, max(xs) * 2)
    x = alt.X(
        "intensity:Q",
        scale=alt.Scale(type="log"),
        title="arithmetic intensity (FLOP/byte)",
        axis=alt.Axis(format="~g"),
    )
    y = alt.Y(
        "flops_per_s:Q",
        scale=alt.Scale(type="log"),
        title="attainable FLOP/s per chip",
        axis=alt.Axis(format="~s"),
    )
    roof = (
        alt.Chart(_data(roofs))
        .mark_line(strokeWidth=2, color="#888")
        .encode(
            x=x,
            y=y,
            strokeDash=alt.StrokeDash("dtype:N", title="roof (dtype)"),
            tooltip=[
                alt.Tooltip("dtype:N", title="roof"),
                alt.Tooltip("ridge:Q", title="ridge FLOP/B", format=".4g"),
            ],
        )
    )
    ops = (
        alt.Chart(_data(points))
        .mark_point(filled=True, size=80)
        .encode(
            x=x,
            y=y,
            shape=alt.Shape("bound:N", title="bound"),
            color=alt.Color("op:N", title="op", scale=alt.Scale(scheme="tableau20"), sort=None),
            tooltip=[
                alt.Tooltip("op:N", title="op"),
                alt.Tooltip("intensity:Q", title="intensity (FLOP/B)", format=".4g"),
                alt.Tooltip("bound:N", title="bound"),
                alt.Tooltip("flops:N", title="FLOPs"),
                alt.Tooltip("bytes:N", title="HBM bytes"),
                alt.Tooltip("time:N", title="time (lower bound)"),
            ],
        )
    )
    chip = docs.chip.get("name", "chip")
    return (roof + ops).properties(
        width=WIDTH, height=HEIGHT, title=f"Roofline of {chip} with every ledger op"
    )


def timeline_chart(docs: ReportDocuments):
    alt = _alt()
    rows = page.timeline_data(docs)
    if not rows:
        return None
    return (
        alt.Chart(_data(rows))
        .mark_bar()
        .encode(
            x=alt.X("sum(seconds):Q", title="seconds per step"),
            y=alt.Y(
                "plan:N",
                sort=alt.EncodingSortField("rank"),
                title="plan (#1 = chosen)",
                axis=alt.Axis(labelLimit=LABEL_LIMIT),
            ),
            color=alt.Color(
                "part:N",
                title="part of the step",
                scale=alt.Scale(scheme="tableau20"),
                legend=alt.Legend(orient="bottom", columns=3),
            ),
            order=alt.Order("index:Q"),
            tooltip=[
                "plan:N",
                "part:N",
                alt.Tooltip("time:N", title="time"),
                alt.Tooltip("seconds:Q", format=".4g"),
            ],
        )
        .properties(
            width=BAR_WIDTH,
            height=max(60, 28 * len({r["plan"] for r in rows})),
            title="Step timeline of the listed plans",
        )
    )


def memory_chart(docs: ReportDocuments):
    alt = _alt()
    rows = page.memory_data(docs)
    if not rows:
        return None
    bars = (
        alt.Chart(_data(rows))
        .mark_bar()
        .encode(
            x=alt.X("sum(bytes):Q", title="bytes per chip (G = 10⁹)", axis=alt.Axis(format="~s")),
            y=alt.Y(
                "plan:N",
                sort=alt.EncodingSortField("rank"),
                title="plan (#1 = chosen)",
                axis=alt.Axis(labelLimit=LABEL_LIMIT),
            ),
            color=alt.Color(
                "part:N", title="memory", legend=alt.Legend(orient="bottom", columns=5)
            ),
            tooltip=["plan:N", "part:N", alt.Tooltip("size:N", title="size")],
        )
    )
    hbm = page.hbm_bytes(docs)
    layers = bars
    if hbm:
        rule = alt.Chart(_data([{"hbm": hbm, "label": f"HBM {page.fmt(hbm, 'bytes')}"}])).mark_rule(
            color="black", strokeDash=[4, 3], strokeWidth=2
        )
        layers = (
            bars
            + rule.encode(x="hbm:Q", tooltip=["label:N"])
            + rule.mark_text(align="right", dx=-4, dy=-4, baseline="bottom").encode(
                x="hbm:Q", text="label:N", y=alt.value(0)
            )
        )
    n = len({r["plan"] for r in rows})
    return layers.properties(
        width=BAR_WIDTH, height=max(60, 28 * n), title="Memory per chip against HBM"
    )


def pareto_chart(docs: ReportDocuments):
    alt = _alt()
    rows = page.pareto_data(docs)
    if not rows:
        return None
    x = alt.X(
        "chips:Q",
        scale=alt.Scale(type="log", base=2, nice=False, padding=20),
        title="chips",
        axis=alt.Axis(format="~g"),
    )
    y = alt.Y(
        "step_time_s:Q",
        title="step time (s)",
        scale=alt.Scale(zero=False, padding=20),
    )
    top = (
        alt.Chart(_data(page.top_plan_points(docs)))
        .mark_point(size=120, color="#777", shape="diamond")
        .encode(
            x=x,
            y=y,
            tooltip=[
                alt.Tooltip("rank:Q", title="top plan #"),
                "plan:N",
                alt.Tooltip("step:N", title="step"),
            ],
        )
    )
    base = alt.Chart(_data(rows)).encode(x=x, y=y)
    line = base.mark_line(color="#999", strokeDash=[3, 3])
    pts = base.mark_circle(size=140).encode(
        color=alt.Color(
            "usd_per_million_tokens:Q",
            title="$ per M tokens",
            scale=alt.Scale(scheme="viridis"),
            legend=alt.Legend(format="$.3~g"),
        ),
        tooltip=[
            "plan:N",
            "chips:Q",
            alt.Tooltip("step:N", title="step"),
            alt.Tooltip("cost:N", title="cost"),
        ],
    )
    return (top + line + pts).properties(
        width=WIDTH, height=HEIGHT, title="Pareto set (circles) and top plans (diamonds)"
    )


def rejected_chart(docs: ReportDocuments):
    alt = _alt()
    rej = docs.train.get("rejected") or {}
    rows = [{"reason": k, "plans": int(v)} for k, v in rej.items() if v]
    if not rows:
        return None
    return (
        alt.Chart(_data(rows))
        .mark_bar(color="#e45756")
        .encode(
            x=alt.X("plans:Q", title="plans rejected"),
            y=alt.Y("reason:N", sort="-x", title=None, axis=alt.Axis(labelLimit=320)),
            tooltip=["reason:N", alt.Tooltip("plans:Q", format=",")],
        )
        .properties(
            width=WIDTH - 100, height=max(60, 26 * len(rows)), title="Rejected plans by reason"
        )
    )


def serve_pareto_chart(docs: ReportDocuments):
    alt = _alt()
    rows = page.serve_pareto(docs.serve) if docs.serve else []
    if not rows:
        return None
    kinds = {k: "N" if isinstance(v, str) else "Q" for k, v in rows[0].items()}
    tips = [alt.Tooltip(f"{k}:{t}", title=k.replace("_", " ")) for k, t in kinds.items()]
    x = alt.X("tokens_per_s_per_user:Q", title="tokens/s per user", scale=alt.Scale(zero=False))
    y = alt.Y("tokens_per_s_per_chip:Q", title="tokens/s per chip", scale=alt.Scale(zero=False))
    base = alt.Chart(_data(rows)).encode(x=x, y=y)
    layers = base.mark_line(color="#999") + base.mark_circle(size=100).encode(tooltip=tips)
    chosen = page.serve_chosen_point(docs.serve)
    if chosen:
        layers += (
            alt.Chart(_data([chosen]))
            .mark_point(shape="diamond", size=260, color="#e45756", strokeWidth=2)
            .encode(x=x, y=y, tooltip=[alt.Tooltip("label:N", title="chosen")])
        )
    return layers.properties(
        width=WIDTH,
        height=HEIGHT,
        title="Serving: tokens/s per user vs per chip (Pareto; ◆ chosen)",
    )


def chart_titles(specs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    out = {}
    for name, spec in specs.items():
        t = spec.get("title")
        out[name] = t.get("text", "") if isinstance(t, Mapping) else str(t or name)
    return out
