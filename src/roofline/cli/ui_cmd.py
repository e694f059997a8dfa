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
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the one folder whose files requests may name (relative to it); without it "
        "requests read only the files they upload",
    )
    p.add_argument("--timeout", default="120", help="seconds one request may compute (default 120)")
    p.add_argument(
        "--memory-mib", default="4096", help="memory one request may use, MiB (default 4096)"
    )
    p.add_argument(
        "--workers", default="4", help="requests computing at once; more are refused (default 4)"
    )


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from roofline.report.page_html import WEB_EXTRA, require_web_extra

    require_web_extra()
    need = ("starlette", "uvicorn", "python_multipart")
    missing = [m for m in need if importlib.util.find_spec(m) is None]
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

    serve(port=args.port, data_dir=_data_dir(args.data_dir), limits=_limits(args))
    return 0


def _data_dir(path: str | None) -> str | None:
    from roofline.specs.catalog import is_dir

    if path is not None and not is_dir(path):
        raise SpecError(
            f"--data-dir {path!r} is not a folder",
            rule="--data-dir names an existing folder whose files requests may read",
            fix="create it, or give the folder that holds your config and lengths files",
        )
    return path


def _limits(args: argparse.Namespace):
    from roofline.cli._common import int_flag, number_flag
    from roofline.web.worker import Limits

    return Limits(
        timeout_s=number_flag(args.timeout, "timeout", hi=86_400, example="120"),
        memory_bytes=int_flag(args.memory_mib, "memory-mib", lo=64, hi=1 << 24, example="4096")
        << 20,
        workers=int_flag(args.workers, "workers", hi=256, example="4"),
    )
