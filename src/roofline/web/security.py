"""What `roofline ui` lets a request do: who may ask (token, same origin) and what files it may hand over.

Threat model (docs/report.md, "The local UI as a security boundary"): the server listens on
127.0.0.1, but every web page the user opens can make the browser send it requests. So:

- a request must carry the session token printed at start (`?token=`, an
  `Authorization: token ...` header, or the cookie the first tokened visit sets: HttpOnly,
  SameSite=Strict), as Jupyter does; a foreign page cannot know it;
- a request whose `Origin` is not this server, or whose `Sec-Fetch-Site` says another site
  sent it, is refused even with a token; so is one addressed to another Host (DNS rebinding);
- files come only as uploads (multipart POST, at most MAX_UPLOAD_BYTES, stored under a
  private folder named by their hash) or from the `--data-dir` folder; the worker that
  computes (web.worker) cannot read anything else.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

from roofline.specs.catalog import MAX_DATA_FILE_BYTES
from roofline.web.worker import LimitError

TOKEN_COOKIE = "roofline-token"
MAX_UPLOAD_BYTES = MAX_DATA_FILE_BYTES  # one request's body (a lengths file, a config)
MAX_UPLOADS_KEPT = 256  # stored uploads; the oldest go first
SAME_SITE = frozenset({"same-origin", "none"})  # `none`: typed or opened from outside a page


def new_token() -> str:
    return secrets.token_urlsafe(24)


def _given_token(scope: dict[str, Any]) -> tuple[str, bool]:
    """(token the request carries, whether it came in the query string)."""
    from starlette.requests import HTTPConnection

    conn = HTTPConnection(scope)
    q = conn.query_params.get("token")
    if q:
        return q, True
    auth = conn.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip(), False
    return conn.cookies.get(cookie_name(scope), ""), False


def cookie_name(scope: dict[str, Any]) -> str:
    """The token cookie, one per port (cookies are shared by every port of a host, and two
    servers must not overwrite each other's)."""
    server = scope.get("server") or (None, None)
    return f"{TOKEN_COOKIE}-{server[1]}"


def refusal(scope: dict[str, Any], token: str) -> str | None:
    """Why this request is refused (one paragraph), or None when it may go on."""
    from starlette.requests import HTTPConnection

    headers = HTTPConnection(scope).headers
    origin, site = headers.get("origin"), headers.get("sec-fetch-site")
    if origin is not None and origin != f"http://{headers.get('host', '')}":
        return _paragraph(f"a request from the page at origin {origin[:100]!r}")
    if site is not None and site.lower() not in SAME_SITE:
        return _paragraph(f"a request sent by another site (Sec-Fetch-Site: {site[:40]})")
    given, _ = _given_token(scope)
    if not secrets.compare_digest(given.encode(), token.encode()):
        return (
            "a request without this server's token. Rule: roofline ui answers only requests "
            "that carry the token it printed at start (so no other web page can use it). Fix: "
            "open the URL `roofline ui` printed (http://127.0.0.1:PORT/?token=...); the page "
            "then remembers it in a cookie."
        )
    return None


def _paragraph(what: str) -> str:
    return (
        f"{what}. Rule: roofline ui answers only its own pages (same origin), never a request "
        "another site makes the browser send. Fix: open the URL `roofline ui` printed and use "
        "the form there."
    )


class Guard:
    """ASGI middleware: refuse (403) what `refusal` refuses; remember a query token in a cookie."""

    def __init__(self, app, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        why = refusal(scope, self.token)
        if why is not None:
            return await _forbidden(scope, why)(scope, receive, send)
        _, in_query = _given_token(scope)
        if not in_query:
            return await self.app(scope, receive, send)
        cookie = f"{cookie_name(scope)}={self.token}; HttpOnly; SameSite=Strict; Path=/".encode()

        async def send_with_cookie(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"set-cookie", cookie)]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def _forbidden(scope, why: str):
    import html

    from starlette.responses import HTMLResponse, JSONResponse

    if scope.get("path", "").startswith("/api/"):
        what, _, rest = why.partition(". Rule: ")
        rule, _, fix = rest.partition(". Fix: ")
        return JSONResponse(
            {"error": why, "what": what, "rule": rule, "fix": fix.rstrip(".")}, status_code=403
        )
    return HTMLResponse(
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>roofline: refused'
        f'</title></head><body><p id="error">{html.escape(why)}</p></body></html>',
        status_code=403,
    )


# -- uploads ----------------------------------------------------------------------------------


def _too_large(size: str) -> LimitError:
    e = LimitError(
        f"the request body has {size} bytes",
        rule=f"an upload is at most {MAX_UPLOAD_BYTES / 2**20:g} MiB",
        fix="upload the file roofline reads (a config.json, a lengths file), not a data set",
    )
    e.status = 413
    return e


async def read_form(request, uploads: Path) -> dict[str, str]:
    """A multipart (or urlencoded) POST's fields; each uploaded file is stored under `uploads`
    and its field's value becomes the stored path. The body is read up to MAX_UPLOAD_BYTES."""
    from starlette.datastructures import UploadFile
    from starlette.requests import Request

    declared = request.headers.get("content-length", "0")
    if not declared.isdigit() or len(declared) > 15 or int(declared) > MAX_UPLOAD_BYTES:
        raise _too_large(f"{declared[:20]!r}" if not declared.isdigit() else f"{int(declared):,}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_UPLOAD_BYTES:
            raise _too_large(f"more than {MAX_UPLOAD_BYTES:,}")

    async def replay():
        return {"type": "http.request", "body": bytes(body), "more_body": False}

    form = await Request(request.scope, replay).form(max_files=8, max_fields=200)
    out: dict[str, str] = {}
    try:
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if value.filename:  # a file input left empty sends a part with no name
                    out[key] = save_upload(uploads, value.filename, await value.read())
            else:
                out[key] = str(value)
    finally:
        await form.close()
    return out


def safe_name(filename: str) -> str:
    """A stored upload's file name: the sent name's last part, plain characters only
    (the suffix stays: a `.json` config is read as one)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(filename.replace("\\", "/")).name)[-64:]
    return name.lstrip(".") or "upload"


def save_upload(uploads: Path, filename: str, data: bytes) -> str:
    """Store `data` as uploads/<hash>/<name> (once) and return that path."""
    folder = uploads / hashlib.sha256(data).hexdigest()[:16]
    path = folder / safe_name(filename)
    if not path.exists():
        _make_room(uploads)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(path)


def _make_room(uploads: Path) -> None:
    kept = sorted((p for p in uploads.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in kept[: max(0, len(kept) - MAX_UPLOADS_KEPT + 1)]:
        shutil.rmtree(old, ignore_errors=True)
