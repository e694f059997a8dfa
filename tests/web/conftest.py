"""Fixtures of the report/UI tests: the artifacts folder, a live `roofline ui` server on
loopback, and (for the `browser` tier) Debian's Chromium driven by Playwright.

Browser tests skip, with the reason, only when no Chromium (or no Playwright) is found and
ROOFLINE_REQUIRE_BROWSER is unset; CI (`.ci/run`) sets it, so there they fail instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
UI_TOKEN = "test-session-token"  # the served app's token (roofline ui makes a random one)
ARTIFACTS = ROOT / "test-artifacts"


def _load_docs_script():
    spec = importlib.util.spec_from_file_location(
        "report_screenshot", ROOT / "docs" / "report_screenshot.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["report_screenshot"] = mod
    spec.loader.exec_module(mod)
    return mod


shots = _load_docs_script()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(app):
    """An ASGI app under uvicorn on 127.0.0.1 (a thread of this process); yields its URL."""
    import uvicorn

    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the ui server did not start within 20 s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def serve_app():
    """`served` as a fixture: `with serve_app(app) as url: ...`."""
    return served


@pytest.fixture(scope="session")
def ui_token() -> str:
    return UI_TOKEN


@pytest.fixture(scope="session")
def ui_url():
    """`roofline ui`'s app (token UI_TOKEN) on 127.0.0.1; requests need the token."""
    from roofline.web.app import create_app

    with served(create_app(token=UI_TOKEN)) as url:
        yield url


def _browser_missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install '.[test]')"
    if shots.find_chromium() is None:
        return "no Chromium binary (apt-get install chromium, or set ROOFLINE_CHROMIUM)"
    return None


@pytest.fixture(scope="session")
def browser():
    missing = _browser_missing()
    if missing:
        if os.environ.get("ROOFLINE_REQUIRE_BROWSER"):
            pytest.fail(f"ROOFLINE_REQUIRE_BROWSER is set but {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shots.find_chromium())
        yield b
        b.close()
