"""`roofline report`: the proposal ledger as one self-contained page (HTML) or Markdown + PNGs.

Takes the inputs of `roofline train` (with none: the README's main job) and writes a page
built from the CLI's own `--json` documents (train, model, system, chip, and a serve
document when given): the inputs, the ledger, a roofline chart with every op, the step
timeline, memory against HBM, the top plans and Pareto set, the rejections, the assumptions.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from roofline.cli._common import check_output_path, emit
from roofline.errors import SpecError

NAME = "report"
HELP = "write the proposal page (self-contained HTML, or Markdown with PNGs) of a training plan"
FORMATS = ("html", "md")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from roofline.web.documents import input_actions

    # the inputs of `roofline train`, exactly (its own argparse actions; not --json/--plot)
    for action in input_actions("train").values():
        p._add_action(action)
    p.add_argument(
        "--out", help="file to write (default roofline-report.html, or .md with --format md)"
    )
    p.add_argument("--format", choices=FORMATS, help="html (default; or from --out's suffix) or md")
    p.add_argument(
        "--serving",
        metavar="FILE",
        help="a `roofline serve --json` document: adds the serving section (TTFT/TPOT, Pareto)",
    )
    p.add_argument(
        "--serve",
        metavar="ARGS",
        help='run `roofline serve ARGS` for the serving section, e.g. "--system h100:16 --prompt 1024 --gen 256 --concurrency 64" (the report\'s model unless ARGS names one)',
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the documents the report shows (JSON) instead of the one-line summary",
    )


def _format_and_out(args: argparse.Namespace) -> tuple[str, Path]:
    fmt = args.format
    if fmt is None:
        fmt = "md" if args.out and Path(args.out).suffix.lower() == ".md" else "html"
    out = check_output_path(f"roofline-report.{fmt}" if args.out is None else args.out, "--out")
    return fmt, out


def load_serving(path: str) -> dict[str, Any]:
    """A `roofline serve --json` document from a file, or a SpecError saying what is wrong."""
    from roofline.specs.catalog import MAX_DATA_FILE_BYTES, read_text_file

    fix = "write it with `roofline serve ... --json > serve.json`"
    text = read_text_file(path, "--serving", max_bytes=MAX_DATA_FILE_BYTES)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        why = e.msg if isinstance(e, json.JSONDecodeError) else "too deep or a huge number"
        raise SpecError(
            f"--serving {path}: cannot read it as JSON ({why})",
            rule="the file is a JSON document",
            fix=fix,
        ) from None
    if not isinstance(doc, dict) or doc.get("command", "serve") != "serve":
        raise SpecError(
            f"--serving {path} is not a serve document (command {doc.get('command') if isinstance(doc, dict) else type(doc).__name__!r})",
            rule="the serving section reads the output of `roofline serve --json`",
            fix=fix,
        )
    return doc


def _serve_argv(args: argparse.Namespace) -> list[str] | None:
    import shlex

    from roofline.web.documents import has_command

    if args.serve is None:
        return None
    if args.serving:
        raise SpecError(
            "--serve and --serving both given",
            rule="the serving section comes from one serve document",
            fix="give --serve ARGS (run it now) or --serving FILE (one made before)",
        )
    if not has_command("serve"):
        raise SpecError(
            "--serve: this roofline has no `serve` command",
            rule="the serving section runs `roofline serve`",
            fix="use --serving FILE with a serve document, or a roofline that has `serve`",
        )
    try:
        return shlex.split(args.serve)
    except ValueError as e:
        raise SpecError(
            f"--serve {args.serve!r}: {e}",
            rule="ARGS is a shell-quoted list of serve options",
            fix='write e.g. --serve "--system h100:16 --concurrency 64"',
        ) from None


def _say_if_no_charts() -> None:
    import sys

    from roofline.report.page_html import RENDERER_MISSING, renderer_works

    if not renderer_works():
        print(f"roofline report: note: charts not drawn: {RENDERER_MISSING}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from roofline.progress import bar
    from roofline.report.page_html import render_html, require_web_extra
    from roofline.report.page_md import render_markdown
    from roofline.web.documents import report_documents, values_from_namespace

    require_web_extra()
    fmt, out = _format_and_out(args)
    serve = load_serving(args.serving) if args.serving else None
    with bar(2, "report: running the commands", unit="stage") as stages:
        docs = report_documents(values_from_namespace("train", args), serve, _serve_argv(args))
        stages.update(1)
        stages.set_description("report: charts and page")
        if fmt == "html":
            out.write_text(render_html(docs), encoding="utf-8")
            written = [out]
        else:
            written = render_markdown(docs, out)
        stages.update(1)
    _say_if_no_charts()
    size = sum(p.stat().st_size for p in written)
    text = f"wrote {', '.join(str(p) for p in written)} ({size / 1e6:.2f} MB): {docs.commands['train']}"
    inputs = {"out": str(out), "format": fmt, "serving": args.serving}
    return emit(
        args,
        NAME,
        inputs,
        {"written": [str(p) for p in written], "documents": docs.as_dict()},
        text,
    )
