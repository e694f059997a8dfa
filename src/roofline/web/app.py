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

Every route also takes POST: a multipart form whose file parts are uploads (a config.json
as `model`, a lengths file as `serve.lengths` or `lengths`); the stored file's path becomes
the input. Requests carry the session token and come from this server's own pages, and the
work runs in a bounded child process that reads only uploads and `--data-dir` files
(web.security, web.worker; the threat model is in docs/report.md).

Bad input answers 400 with the CLI's one-paragraph message (what, rule, fix); a request past
a bound answers 503 (busy, too slow, too big in memory) or 413 (upload too large).
"""

from __future__ import annotations

import contextlib
import html
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roofline.errors import RooflineError, SpecError
from roofline.web import documents, security
from roofline.web.form import FORM_CSS, form_html
from roofline.web.worker import Limits, Sandbox, Worker

API_COMMANDS = ("train", "model", "system", "chip", "chips", "models", "serve")
UI_ONLY = frozenset({"config"})
SERVE = "serve"  # `serve=on` adds the serving section; `serve.<input>=...` are its inputs
MAX_CONFIG_BYTES = 64_000
NOT_VALUES = frozenset({"token"})  # in the URL for the guard, not an input


@dataclass
class UIState:
    """One server's session: its token, its private upload folder, the data dir it may read."""

    token: str
    uploads: Path
    data_dir: Path | None = None
    limits: Limits = field(default_factory=Limits)
    worker: Worker = field(init=False)

    def __post_init__(self) -> None:
        roots = (str(self.uploads),) + ((str(self.data_dir),) if self.data_dir else ())
        cwd = str(self.data_dir or self.uploads)
        self.worker = Worker(self.limits, Sandbox(roots=roots, cwd=cwd))

    def stamp(self) -> Any:
        """The data dir's top-level listing (names, sizes, times): a result computed from a
        file there is recomputed once the file changes."""
        if self.data_dir is None:
            return None
        try:
            return tuple(
                sorted(
                    (e.name, e.stat().st_mtime_ns, e.stat().st_size)
                    for e in os.scandir(self.data_dir)
                )
            )
        except OSError:
            return None


def pasted_config_path(text: str, state: UIState) -> str:
    """Store a pasted config.json as an upload and return its path for --model."""
    data = text.encode("utf-8")
    if len(data) > MAX_CONFIG_BYTES:
        raise SpecError(
            f"the pasted config.json has {len(data):,} bytes",
            rule=f"a pasted config is at most {MAX_CONFIG_BYTES:,} bytes (a Hugging Face config.json is ~1 kB)",
            fix="paste only the model's config.json",
        )
    return security.save_upload(state.uploads, "config.json", data)


def train_values(query: Mapping[str, str], state: UIState) -> dict[str, str]:
    """The query's `roofline train` inputs (a pasted config becomes --model PATH)."""
    values = {k: v for k, v in query.items() if k not in UI_ONLY and not k.startswith(SERVE)}
    config = (query.get("config") or "").strip()
    if config:
        values["model"] = pasted_config_path(config, state)
    return values


def serve_argv(query: Mapping[str, str], state: UIState) -> list[str] | None:
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
        argv = ["--model", pasted_config_path(config, state), *argv]
    return argv


def report_documents(query: Mapping[str, str], state: UIState):
    """Every document of the report, each computed in a bounded worker (web.worker) and
    cached there, so /api/train shows the very document the page shows."""
    train = train_values(query, state)
    documents.argv_for("train", train)  # an unknown input fails here, before any work
    serve = serve_argv(query, state)
    stamp = state.stamp()

    def one(command: str, argv: list[str]) -> dict[str, Any]:
        return state.worker.run("document", command, tuple(argv), stamp=stamp)

    return documents.report_documents(train, serve_argv=serve, run_document=one)


def _error_json(e: RooflineError, status: int = 400):
    from starlette.responses import JSONResponse

    return JSONResponse(
        {"error": str(e), "what": e.what, "rule": e.rule, "fix": e.fix},
        status_code=getattr(e, "status", status),
    )


async def _inputs(request) -> dict[str, str]:
    """The request's inputs: the query string, plus a POST's fields and uploaded files."""
    values = {k: v for k, v in request.query_params.items() if k not in NOT_VALUES}
    if request.method == "POST":
        form = await security.read_form(request, _state(request).uploads)
        values.update({k: v for k, v in form.items() if k not in NOT_VALUES})
    return values


def _state(request) -> UIState:
    return request.app.state.ui


def _api_answer(command: str, query: dict[str, str], state: UIState) -> dict[str, Any]:
    if command == "report":
        return report_documents(query, state).as_dict()
    if command not in API_COMMANDS or not documents.has_command(command):
        raise SpecError(
            f"no API for {command!r}",
            rule="the API serves the documents of "
            + ", ".join(c for c in API_COMMANDS if documents.has_command(c))
            + " and report",
            fix="use /api/train?model=...&system=...",
        )
    values = train_values(query, state) if command == "train" else query
    argv = documents.argv_for(command, values)
    return state.worker.run("document", command, tuple(argv), stamp=state.stamp())


async def api(request):
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse

    command = request.path_params["command"]
    try:
        query = await _inputs(request)
        return JSONResponse(await run_in_threadpool(_api_answer, command, query, _state(request)))
    except RooflineError as e:
        return _error_json(e, 404 if str(e).startswith("no API") else 400)


async def report_page(request):
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import HTMLResponse

    from roofline.report.page_html import render_html

    try:
        query = await _inputs(request)
        docs = await run_in_threadpool(report_documents, query, _state(request))
    except RooflineError as e:
        return HTMLResponse(_error_page(e), status_code=getattr(e, "status", 400))
    return HTMLResponse(await run_in_threadpool(render_html, docs))


async def index(request):
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import HTMLResponse

    query: dict[str, str] = {}
    try:
        query = await _inputs(request)
        html_text = await run_in_threadpool(_index_html, query, _state(request))
    except RooflineError as e:
        form = form_html(query, _presets())
        return HTMLResponse(_error_page(e, form), status_code=getattr(e, "status", 400))
    return HTMLResponse(html_text)


def _index_html(query: dict[str, str], state: UIState) -> str:
    from roofline.report.page_html import render_html

    docs = report_documents(query, state)
    return render_html(docs, before=form_html(query, _presets()), extra_css=FORM_CSS)


def _presets() -> list[str]:
    return [m["name"] for m in documents.document("models", [])["models"]]


def _error_page(e: RooflineError, form: str = "") -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>roofline: bad input</title>'
        f"<style>{FORM_CSS} body{{font:14px/1.45 system-ui,sans-serif;margin:0}}</style></head><body>{form}"
        f'<main><p class="error" role="alert" id="error">{html.escape(str(e))}</p></main></body></html>'
    )


def create_app(
    token: str | None = None, data_dir: str | Path | None = None, limits: Limits | None = None
) -> Any:
    """The ASGI app (Starlette). Import-time cheap: nothing is computed until a request.

    `token` is the session's secret (a new random one when None: read it from
    app.state.ui.token); `data_dir` the one folder whose files requests may name. Requests
    compute in worker processes (multiprocessing, web.worker), which import the main
    module: a script that serves this app keeps its code under `if __name__ == "__main__":`."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.routing import Route

    state = UIState(
        token=token or security.new_token(),
        uploads=Path(tempfile.mkdtemp(prefix="roofline-ui-uploads-")),
        data_dir=None if data_dir is None else Path(data_dir).resolve(),
        limits=limits or Limits(),
    )
    methods = ["GET", "POST"]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        shutil.rmtree(state.uploads, ignore_errors=True)  # the uploads live as long as the server

    # answer only requests addressed to this machine (a web page cannot rebind a name to it),
    # then only those of this session's pages (web.security)
    app = Starlette(
        routes=[
            Route("/", index, methods=methods),
            Route("/report.html", report_page, methods=methods),
            Route("/api/{command}", api, methods=methods),
        ],
        lifespan=lifespan,
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost"]),
            Middleware(security.Guard, token=state.token),
        ],
    )
    app.state.ui = state
    return app


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


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    data_dir: str | Path | None = None,
    limits: Limits | None = None,
) -> None:
    import uvicorn

    check_port_free(host, port)
    app = create_app(data_dir=data_dir, limits=limits)
    token = app.state.ui.token
    print(f"roofline ui: http://{host}:{port}/?token={token}  (Ctrl-C to stop)", flush=True)
    if data_dir is not None:
        print(f"requests may name files in {app.state.ui.data_dir} (and uploads)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
