"""The proposal page as one self-contained HTML file: styles, data, charts and Vega inlined.

Opening it needs no network: the Vega/Vega-Lite/Vega-Embed bundle comes from vl-convert
(which ships it) and is written into the page; the CLI documents the page shows are embedded
as JSON (`<script id="roofline-documents">`), so a reader can check any number against them.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from roofline.errors import SpecError
from roofline.report import page
from roofline.report.page import ReportDocuments
from roofline.report.page_charts import charts

TEMPLATE = Path(__file__).with_name("page.html.j2")
WEB_EXTRA = "pip install '.[web]'  (the report and the UI need Altair, vl-convert, Jinja2, Starlette and uvicorn)"


def require_web_extra() -> None:
    """A clear error (not an ImportError traceback) when the optional `web` extra is missing."""
    import importlib.util

    missing = [m for m in ("altair", "vl_convert", "jinja2") if importlib.util.find_spec(m) is None]
    if missing:
        raise SpecError(
            f"the report needs {', '.join(missing)}, "
            + ("which is" if len(missing) == 1 else "which are")
            + " not installed",
            rule="the report and UI dependencies are the optional extra `web`",
            fix=WEB_EXTRA,
        )


RENDERER_MISSING = (
    "the chart renderer (vl-convert, which runs V8) cannot start in this process's memory "
    "limit (ulimit -v); the numbers are all here, the charts are not. Run without the limit "
    "for the charts."
)


@functools.cache
def renderer_works() -> bool:
    """Whether vl-convert can start here. V8 reserves a large address space and aborts the
    whole process natively (SIGTRAP, no Python exception) when `ulimit -v` forbids it, so
    under a limit it is first tried in a child process, which inherits the limit."""
    import resource
    import subprocess
    import sys

    limited = any(
        resource.getrlimit(r)[0] != resource.RLIM_INFINITY
        for r in (resource.RLIMIT_AS, resource.RLIMIT_DATA)
    )
    if not limited:
        return True
    probe = "import vl_convert; vl_convert.vegalite_to_svg({'mark': 'point'})"
    try:
        r = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@functools.cache
def vega_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed as one script (from the vl-convert package; offline).

    vl-convert bundles it anew on every call (seconds: about half of a report), so the bundle
    is kept on disk per vl-convert version (`bundle_cache_path`) and read back by the next
    report; where that folder cannot be written the bundle is simply rebuilt; empty when the renderer cannot start (see renderer_works)."""
    if not renderer_works():
        return ""
    import vl_convert

    path = bundle_cache_path(getattr(vl_convert, "__version__", "unknown"))
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    js = vl_convert.javascript_bundle()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(js, encoding="utf-8")
        os.replace(tmp, path)  # atomic: a concurrent report reads a whole file or none
    except OSError:
        pass
    return js


def bundle_cache_path(version: str) -> Path:
    """Where the Vega bundle of vl-convert `version` is kept: $ROOFLINE_CACHE_DIR, else
    $XDG_CACHE_HOME/roofline, else ~/.cache/roofline."""
    root = os.environ.get("ROOFLINE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "roofline",
    )
    safe = "".join(ch if ch.isalnum() or ch in ".-_" else "_" for ch in version)
    return Path(root) / f"vega-bundle-{safe}.js"


@functools.cache
def _template():
    import jinja2

    env = jinja2.Environment(
        autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
    )
    return env.from_string(TEMPLATE.read_text(encoding="utf-8"))


def script_json(obj: Any) -> str:
    """JSON safe inside a <script> element (no `</script>` or `<!--` can close it early)."""
    return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")


def context(docs: ReportDocuments) -> dict[str, Any]:
    """Everything the template shows, read off the documents by `roofline.report.page`."""
    unplaced = page.roofline_points(docs)[1]
    c = page.chosen(docs) or {}
    return {
        "title": page.title(docs),
        "version": docs.version,
        "commands": {"train": "", "model": "", "serve": "", **docs.commands},
        "summary": page.summary_rows(docs),
        "why": docs.train.get("why", ""),
        "note": docs.train.get("sub_slice_note", ""),
        "search": page.search_line(docs),
        "unplaced": unplaced,
        "has_plan": page.chosen(docs) is not None,
        "has_pareto": bool(page.pareto_data(docs)),
        "top_header": page.TOP_PLAN_HEADER,
        "top_rows": page.top_plan_rows(docs),
        "pareto_rows": [
            [str(p["chips"]), p["step"], p["cost"], p["plan"]] for p in page.pareto_data(docs)
        ],
        "comm_rows": page.comm_rows(c),
        "collective_rows": page.collective_rows(c),
        "rejected_rows": page.rejected_rows(docs),
        "serve_rows": page.serve_rows(docs.serve) if docs.serve else [],
        "serve_rejected": page.serve_rejected_rows(docs.serve) if docs.serve else [],
        "model_name": docs.model.get("inputs", {}).get("model", "?"),
        "ledger_shape": page.ledger_shape(docs).capitalize(),
        "ledger_header": page.LEDGER_HEADER,
        "ledger_rows": page.ledger_rows(docs),
        "ledger_totals": page.ledger_total_rows(docs),
        "inputs": page.input_rows(docs),
        "assumptions": page.assumption_rows(docs),
        "launches": page.launch_blocks(docs),
    }


def render_html(
    docs: ReportDocuments, *, before: str = "", after: str = "", extra_css: str = ""
) -> str:
    """The report page. `before`/`after`/`extra_css` are trusted HTML/CSS the UI adds (its form)."""
    require_web_extra()
    return _template().render(
        **context(docs),
        documents_json=script_json(docs.as_dict()),
        charts_json=script_json(charts(docs)),
        vega_js=vega_bundle(),
        charts_missing="" if renderer_works() else RENDERER_MISSING,
        before=before,
        after=after,
        extra_css=extra_css,
    )
