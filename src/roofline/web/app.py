"""`roofline ui`: the report behind a form, on 127.0.0.1 (Starlette; served by uvicorn).

Routes (every input is a query parameter, so a URL is a shareable result):

- `GET /?model=...&system=...&seq=...` — the form and the report of those `roofline train`
  inputs; `config=<config.json text>` stands for a pasted Hugging Face config.
- `GET /report.html?...` — the bare self-contained report page (what `roofline report` writes).
- `GET /api/<command>?...` — exactly the document `roofline <command> ... --json` prints
  (`train`, `model`, `system`, `chip`, `chips`, `models`, and `serve` once it exists); options
  by their long name (`batch-tokens` or `batch_tokens`), positionals by their argparse name
  (`/api/model?model=llama-3-8b`, `/api/chip?name=h100`); `GET /api/report?...` — all
  documents of one report.

Bad input answers 400 with the CLI's one-paragraph message (what, rule, fix).
"""

from __future__ import annotations

import hashlib
import html
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from roofline.errors import RooflineError, SpecError
from roofline.web import documents
from roofline.web.form import FORM_CSS, form_html

API_COMMANDS = ("train", "model", "system", "chip", "chips", "models", "serve")
UI_ONLY = frozenset({"config"})
SERVE = "serve"  # `serve=on` adds the serving section; `serve.<input>=...` are its inputs
MAX_CONFIG_BYTES = 64_000
_PASTED = Path(tempfile.gettempdir()) / "roofline-ui-configs"


def pasted_config_path(text: str) -> str:
    """Write a pasted config.json once (named by its hash) and return its path for --model."""
    data = text.encode("utf-8")
    if len(data) > MAX_CONFIG_BYTES:
        raise SpecError(
            f"the pasted config.json has {len(data):,} bytes",
            rule=f"a pasted config is at most {MAX_CONFIG_BYTES:,} bytes (a Hugging Face config.json is ~1 kB)",
            fix="paste only the model's config.json",
        )
    folder = _PASTED / f"pasted-{hashlib.sha256(data).hexdigest()[:10]}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    if not path.exists():
        path.write_bytes(data)
    return str(path)


def train_values(query: Mapping[str, str]) -> dict[str, str]:
    """The query's `roofline train` inputs (a pasted config becomes --model PATH)."""
    values = {k: v for k, v in query.items() if k not in UI_ONLY and not k.startswith(SERVE)}
    config = (query.get("config") or "").strip()
    if config:
        values["model"] = pasted_config_path(config)
    return values


def serve_argv(query: Mapping[str, str]) -> list[str] | None:
    """`roofline serve` argv from `serve.<input>` keys when `serve=on` (else no serving)."""
    if str(query.get(SERVE, "")).lower() not in ("1", "on", "true", "yes"):
        return None
    if not documents.has_command("serve"):
        raise SpecError(
            "serve=on: this roofline has no `serve` command",
            rule="the serving section runs `roofline serve`",
            fix="leave serving off",
        )
    prefix = SERVE + "."
    values = {k[len(prefix) :]: v for k, v in query.items() if k.startswith(prefix)}
    argv = documents.argv_for("serve", values)
    config = (query.get("config") or "").strip()
    if config and "model" not in values:
        argv = ["--model", pasted_config_path(config), *argv]
    return argv


def report_documents(query: Mapping[str, str]):
    return documents.report_documents(train_values(query), serve_argv=serve_argv(query))


def _error_json(e: RooflineError, status: int = 400):
    from starlette.responses import JSONResponse

    return JSONResponse(
        {"error": str(e), "what": e.what, "rule": e.rule, "fix": e.fix}, status_code=status
    )


def api(request):
    from starlette.responses import JSONResponse

    command = request.path_params["command"]
    query = dict(request.query_params)
    try:
        if command == "report":
            return JSONResponse(report_documents(query).as_dict())
        if command not in API_COMMANDS or not documents.has_command(command):
            raise SpecError(
                f"no API for {command!r}",
                rule="the API serves the documents of "
                + ", ".join(c for c in API_COMMANDS if documents.has_command(c))
                + " and report",
                fix="use /api/train?model=...&system=...",
            )
        values = train_values(query) if command == "train" else query
        return JSONResponse(documents.document(command, documents.argv_for(command, values)))
    except RooflineError as e:
        return _error_json(e, 404 if str(e).startswith("no API") else 400)


def report_page(request):
    from starlette.responses import HTMLResponse

    from roofline.report.page_html import render_html

    try:
        docs = report_documents(dict(request.query_params))
    except RooflineError as e:
        return HTMLResponse(_error_page(e), status_code=400)
    return HTMLResponse(render_html(docs))


def index(request):
    from starlette.responses import HTMLResponse

    from roofline.report.page_html import render_html

    query = dict(request.query_params)
    try:
        docs = report_documents(query)
    except RooflineError as e:
        return HTMLResponse(_error_page(e, form_html(query, _presets())), status_code=400)
    return HTMLResponse(render_html(docs, before=form_html(query, _presets()), extra_css=FORM_CSS))


def _presets() -> list[str]:
    return [m["name"] for m in documents.document("models", [])["models"]]


def _error_page(e: RooflineError, form: str = "") -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>roofline: bad input</title>'
        f"<style>{FORM_CSS} body{{font:14px/1.45 system-ui,sans-serif;margin:0}}</style></head><body>{form}"
        f'<main><p class="error" role="alert" id="error">{html.escape(str(e))}</p></main></body></html>'
    )


def create_app() -> Any:
    """The ASGI app (Starlette). Import-time cheap: nothing is computed until a request."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.routing import Route

    # answer only requests addressed to this machine (a web page cannot rebind a name to it)
    local = Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost"])
    return Starlette(
        routes=[
            Route("/", index),
            Route("/report.html", report_page),
            Route("/api/{command}", api),
        ],
        middleware=[local],
    )


def check_port_free(host: str, port: int) -> None:
    import socket

    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise SpecError(
                f"cannot listen on {host}:{port} ({e.strerror})",
                rule="the UI needs a free local port",
                fix=f"stop what uses it or pick another, e.g. --port {port + 1}",
            ) from None


def serve(host: str = "127.0.0.1", port: int = 8000) -> None:
    import uvicorn

    check_port_free(host, port)
    print(f"roofline ui: http://{host}:{port}/  (Ctrl-C to stop)", flush=True)
    uvicorn.run(create_app(), host=host, port=port, log_level="warning")
