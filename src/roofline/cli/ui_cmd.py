"""`roofline ui`: a local page (127.0.0.1) to pick a model, a system and a workload and get the report.

The URL holds the inputs, so a result can be shared; `/api/<command>` returns exactly the
CLI's `--json` documents. Needs the `web` extra (Starlette, uvicorn, Altair, vl-convert).
"""

from __future__ import annotations

import argparse

from roofline.errors import SpecError

NAME = "ui"
HELP = "serve the report as a local web page on 127.0.0.1 (the URL holds the inputs; /api gives the JSON)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (default 8000)")


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from roofline.report.page_html import WEB_EXTRA, require_web_extra

    require_web_extra()
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise SpecError(
            f"roofline ui needs {', '.join(missing)}, "
            + ("which is" if len(missing) == 1 else "which are")
            + " not installed",
            rule="the UI dependencies are the optional extra `web`",
            fix=WEB_EXTRA,
        )
    if not 0 < args.port < 65536:
        raise SpecError(
            f"--port {args.port}", rule="a TCP port is 1..65535", fix="give e.g. --port 8000"
        )
    from roofline.web.app import serve

    serve(port=args.port)
    return 0
