"""Screenshot of the default report (`roofline report`, the README's main job) -> docs/report.png.

    python docs/report_screenshot.py [OUT.png]

Writes the report with the CLI, opens it in headless Chromium (Debian's package, driven by
Playwright) with every request outside the file itself aborted, waits for the charts and
saves the top of the page. The browser tests run this same script (into test-artifacts/).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

VIEWPORT = {"width": 1360, "height": 1400}
CANDIDATES = (
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
)


def find_chromium() -> str | None:
    """A Chromium binary: $ROOFLINE_CHROMIUM, Debian's real binary, then one on PATH.

    Debian's /usr/bin/chromium is a shell wrapper; the binary behind it is preferred.
    """
    env = os.environ.get("ROOFLINE_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    for path in ("/usr/lib/chromium/chromium", "/usr/lib/chromium-browser/chromium-browser"):
        if os.access(path, os.X_OK):
            return path
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def open_offline(context, allowed_prefixes: tuple[str, ...]) -> list[str]:
    """Abort every request whose URL does not start with an allowed prefix; return them."""
    blocked: list[str] = []

    def handle(route):
        url = route.request.url
        if url.startswith(allowed_prefixes):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    context.route("**/*", handle)
    return blocked


def screenshot(html: Path, out: Path, browser) -> list[str]:
    """Open `html` with the network cut, wait for every chart, save the viewport to `out`."""
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1, offline=True)
    blocked = open_offline(context, ("file://",))
    page = context.new_page()
    page.goto(html.resolve().as_uri())
    page.wait_for_selector("body[data-charts-ready]", timeout=30_000)
    page.screenshot(path=str(out))
    context.close()
    return blocked


def main(argv: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    from roofline.cli import main as roofline

    out = Path(argv[0]) if argv else Path(__file__).with_name("report.png")
    exe = find_chromium()
    if exe is None:
        print(
            "no Chromium found: apt-get install chromium (or set ROOFLINE_CHROMIUM)",
            file=sys.stderr,
        )
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "roofline-report.html"
        if roofline(["report", "--out", str(html)]) != 0:
            return 1
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe)
            blocked = screenshot(html, out, browser)
            browser.close()
    if blocked:
        print("the page requested the network: " + ", ".join(blocked), file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
