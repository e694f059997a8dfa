"""The proposal page as Markdown that renders on GitHub, with its charts as PNGs beside it.

Same sections and the same rows as the HTML page (`roofline.report.page`); the charts are
the same Vega-Lite specs, rendered to PNG by vl-convert (no browser needed).
"""

from __future__ import annotations

from pathlib import Path

from roofline.report import page
from roofline.report.page import ReportDocuments
from roofline.report.page_charts import chart_titles, charts
from roofline.report.page_html import RENDERER_MISSING, renderer_works, require_web_extra


def _cell(x: object) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[str]], num: tuple[int, ...] = ()) -> str:
    align = ["---:" if i in num else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def md_kv(rows: list[tuple[str, str]]) -> str:
    return md_table(["", ""], [[k, v] for k, v in rows])


def write_pngs(docs: ReportDocuments, out: Path) -> dict[str, Path]:
    """One PNG per chart, named `<out stem>-<chart>.png` beside `out` (none when the
    renderer cannot start: page_html.renderer_works)."""
    if not renderer_works():
        return {}
    import vl_convert

    written = {}
    for name, spec in charts(docs).items():
        path = out.with_name(f"{out.stem}-{name}.png")
        path.write_bytes(vl_convert.vegalite_to_png(spec, scale=1.5))
        written[name] = path
    return written


def render_markdown(docs: ReportDocuments, out: Path) -> list[Path]:
    """Write `out` (.md) and its PNGs; return every path written."""
    require_web_extra()
    pngs = write_pngs(docs, out)
    titles = chart_titles(charts(docs))

    def img(name: str) -> str:
        return f"![{titles.get(name, name)}]({pngs[name].name})" if name in pngs else ""

    out.write_text(_body(docs, img), encoding="utf-8")
    return [out, *pngs.values()]


def _body(docs: ReportDocuments, img) -> str:
    c = page.chosen(docs)
    parts = [
        f"# roofline report: {page.title(docs)}",
        f"roofline {docs.version} · `{docs.commands.get('train', '')}`",
        "## The chosen plan" if c is not None else "## The estimate (no plan was costed)",
        md_kv(page.summary_rows(docs)),
    ]
    if docs.train.get("why"):
        parts.append(f"Why it wins: {docs.train['why']}.")
    if not renderer_works():
        parts.append(f"Charts not drawn: {RENDERER_MISSING}")
    if docs.train.get("sub_slice_note"):
        parts.append(f"Note: {docs.train['sub_slice_note']}.")
    if c is not None:
        parts.append(page.search_line(docs))
    parts += _launches(docs)
    parts += ["## Roofline of the chip, with every ledger op", img("roofline")]
    unplaced = page.roofline_points(docs)[1]
    if unplaced:
        parts.append("Not on the log axes (no FLOPs): " + ", ".join(unplaced) + ".")
    if c is not None:
        parts += ["## Step timeline", img("timeline"), "## Memory per chip", img("memory")]
        parts += _plans(docs, img) + _communication(c) + _rejected(docs, img)
    parts += _serving(docs, img) + _ledger(docs)
    parts += ["## Inputs", md_kv(page.input_rows(docs))]
    parts += ["## Assumptions", md_kv(page.assumption_rows(docs))]
    parts.append(
        "Every number here is a field of the CLI's `--json` documents: "
        + ", ".join(f"`{v}`" for v in docs.commands.values())
        + "."
    )
    return "\n\n".join(p for p in parts if p) + "\n"


def _launches(docs: ReportDocuments) -> list[str]:
    blocks = page.launch_blocks(docs)
    out = ["## Launch lines of the chosen plans"] if blocks else []
    for b in blocks:
        body = f"```sh\n{b['text'].rstrip()}\n```" if b["text"] else f"Not written: {b['reason']}"
        out += [f"### {b['title']}", body]
    return out


def _plans(docs: ReportDocuments, img) -> list[str]:
    out = ["## Top plans and the Pareto set", img("pareto")]
    out.append(md_table(page.TOP_PLAN_HEADER, page.top_plan_rows(docs), num=(0, 2, 3, 4, 5, 7, 8)))
    pareto = page.pareto_data(docs)
    if pareto:
        rows = [[str(p["chips"]), p["step"], p["cost"], p["plan"]] for p in pareto]
        out += [
            "Pareto set (chips vs step time vs cost):",
            md_table(["chips", "step", "cost", "plan"], rows, num=(0, 1, 2)),
        ]
    return out


def _communication(c) -> list[str]:
    out = [
        "## Communication of the chosen plan",
        md_table(["kind", "time per step", "exposed"], page.comm_rows(c), num=(1, 2)),
    ]
    coll = page.collective_rows(c)
    if coll:
        header = ["op", "pass", "collective", "mesh axes", "bytes/chip", "time", "sharding"]
        out.append(
            f"<details><summary>every collective ({len(coll)})</summary>\n\n{md_table(header, coll, num=(4, 5))}\n\n</details>"
        )
    return out


def _rejected(docs: ReportDocuments, img) -> list[str]:
    rows = page.rejected_rows(docs)
    if not rows:
        return ["## Rejected plans", "None rejected."]
    return ["## Rejected plans", img("rejected"), md_table(["reason", "plans"], rows, num=(1,))]


def _serving(docs: ReportDocuments, img) -> list[str]:
    if not docs.serve:
        return []
    out = ["## Serving", md_kv(page.serve_rows(docs.serve)), img("serve_pareto")]
    rej = page.serve_rejected_rows(docs.serve)
    if rej:
        out += ["Rejected serving plans:", md_table(["reason", "plans"], rej, num=(1,))]
    return out


def _ledger(docs: ReportDocuments) -> list[str]:
    name = docs.model.get("inputs", {}).get("model", "?")
    return [
        f"## The ledger: {name}",
        f"{page.ledger_shape(docs).capitalize()}; from `{docs.commands.get('model', '')}`.",
        md_table(page.LEDGER_HEADER, page.ledger_rows(docs), num=(2, 3, 4, 5, 6, 7, 8)),
        "Totals and their arithmetic:",
        md_table(["total", "value", "arithmetic"], page.ledger_total_rows(docs), num=(1,)),
    ]
