"""The report and the UI in a real browser (Debian's Chromium via Playwright), network cut.

Every request that is not the page itself (file://, or the loopback UI server) is aborted and
recorded; the tests assert there was none, that every chart drew an SVG with its axis titles,
that hovering an op shows its tooltip, that the console stayed clean, and they save
screenshots under test-artifacts/.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import report_screenshot as shots  # docs/report_screenshot.py, loaded by conftest

from roofline.cli import main

pytestmark = pytest.mark.browser

CHART_AXES = {
    "roofline": ["arithmetic intensity (FLOP/byte)", "attainable FLOP/s per chip"],
    "timeline": ["seconds per step", "plan (#1 = chosen)"],
    "memory": ["bytes per chip (G = 10⁹)", "plan (#1 = chosen)"],
    "pareto": ["chips", "step time (s)"],
    "rejected": ["plans rejected"],
}


class Watched:
    """A page whose console errors, page errors and off-page requests are recorded."""

    def __init__(self, browser, allowed: tuple[str, ...], viewport=shots.VIEWPORT):
        # a file:// page also runs with the browser offline; the UI needs loopback
        offline = allowed == ("file://",)
        self.context = browser.new_context(viewport=viewport, offline=offline)
        self.blocked = shots.open_offline(self.context, allowed)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on(
            "console",
            lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None,
        )
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def charts_ready(self) -> int:
        self.page.wait_for_selector("body[data-charts-ready]", timeout=30_000)
        return int(self.page.get_attribute("body", "data-charts-ready"))

    def close(self):
        self.context.close()


def check_chart(page, name: str, titles: list[str]) -> None:
    svg = page.locator(f"#chart-{name} svg")
    assert svg.count() == 1, f"chart {name} drew no SVG"
    box = svg.bounding_box()
    assert box and box["width"] > 200 and box["height"] > 100
    marks = page.locator(f"#chart-{name} svg .role-mark path, #chart-{name} svg .role-mark rect")
    assert marks.count() > 0, f"chart {name} has no marks"
    axis_titles = page.locator(f"#chart-{name} svg .role-axis-title text").all_text_contents()
    for t in titles:
        assert t in axis_titles, f"chart {name}: axis {t!r} not in {axis_titles}"


@pytest.fixture(scope="module")
def report_html(artifacts) -> Path:
    out = artifacts / "roofline-report.html"
    assert main(["report", "--out", str(out)]) == 0
    return out


def test_report_renders_offline(browser, report_html, artifacts):
    w = Watched(browser, ("file://",))
    w.page.goto(report_html.resolve().as_uri())
    assert w.charts_ready() == 5
    for name, titles in CHART_AXES.items():
        check_chart(w.page, name, titles)
    docs = json.loads(w.page.locator("#roofline-documents").text_content())
    placed = [r for r in docs["model"]["roofline"]["rows"] if r["flops"] > 0]
    points = w.page.locator("#chart-roofline svg .role-mark path")
    roofs = {r["compute_dtype"] for r in docs["model"]["roofline"]["rows"]}
    assert points.count() == len(placed) + len(roofs)  # a symbol per placed op, a line per roof
    w.page.screenshot(path=str(artifacts / "report.png"))
    w.page.screenshot(path=str(artifacts / "report-full.png"), full_page=True)
    assert w.blocked == [] and w.errors == []
    w.close()


def test_roofline_tooltip_names_the_op(browser, report_html):
    w = Watched(browser, ("file://",))
    w.page.goto(report_html.resolve().as_uri())
    w.charts_ready()
    symbols = w.page.locator("#chart-roofline svg .mark-symbol path")
    symbols.first.hover(force=True)
    tip = w.page.locator("#vg-tooltip-element")
    tip.wait_for(state="visible", timeout=5_000)
    text = tip.text_content()
    assert "op" in text and "intensity (FLOP/B)" in text and "bound" in text
    assert w.blocked == []
    w.close()


def test_docs_screenshot_script(browser, report_html, artifacts):
    """docs/report_screenshot.py, the script that made docs/report.png, on the same page."""
    out = artifacts / "docs-report.png"
    assert shots.screenshot(report_html, out, browser) == []
    from PIL import Image

    with (
        Image.open(out) as fresh,
        Image.open(Path(shots.__file__).with_name("report.png")) as committed,
    ):
        assert fresh.size == committed.size == (shots.VIEWPORT["width"], shots.VIEWPORT["height"])
        assert len(fresh.getcolors(1 << 16) or range(1 << 16)) > 50  # not a blank page


def test_ui_form_round_trip(browser, ui_url, ui_token, artifacts):
    w = Watched(browser, (ui_url,))
    w.page.goto(
        ui_url
        + "/?"
        + urllib.parse.urlencode(
            {"model": "tiny-llama", "system": "tpu-v5e:4x4", "token": ui_token}
        )
    )
    assert w.charts_ready() >= 4
    w.page.select_option("#model", "llama-3-8b")
    w.page.fill("#system", "tpu-v5e:4x4")
    w.page.fill("#seq", "2048")
    w.page.select_option("#objective", "time")
    with w.page.expect_navigation():
        w.page.click("#submit")
    w.charts_ready()
    query = urllib.parse.parse_qs(urllib.parse.urlparse(w.page.url).query)
    assert (
        query["model"] == ["llama-3-8b"]
        and query["seq"] == ["2048"]
        and query["objective"] == ["time"]
    )
    assert "llama-3-8b on tpu-v5e:4x4" in w.page.locator("header h1").text_content()
    for name in ("roofline", "timeline", "memory"):
        check_chart(w.page, name, CHART_AXES[name])
    page_doc = json.loads(w.page.locator("#roofline-documents").text_content())["train"]
    api = "/api/train?" + urllib.parse.urlparse(w.page.url).query
    req = urllib.request.Request(ui_url + api, headers={"Authorization": f"token {ui_token}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        api_doc = json.loads(r.read())
    assert page_doc == api_doc  # the page and the JSON API show the same document
    w.page.screenshot(path=str(artifacts / "ui.png"))
    shared = w.page.url  # the URL (and the session's token) reproduces the result
    w2 = Watched(browser, (ui_url,))
    w2.page.goto(shared + "&token=" + ui_token)
    w2.charts_ready()
    assert json.loads(w2.page.locator("#roofline-documents").text_content())["train"] == page_doc
    assert w.blocked == w2.blocked == [] and w.errors == w2.errors == []
    w.close()
    w2.close()


def test_ui_bad_input_message(browser, ui_url, ui_token, artifacts):
    w = Watched(browser, (ui_url,))
    w.page.goto(
        ui_url
        + "/?"
        + urllib.parse.urlencode(
            {"model": "tiny-llama", "system": "tpu-v5e:4x4", "token": ui_token}
        )
    )
    w.charts_ready()
    w.page.fill("#seq", "-5")
    with w.page.expect_navigation() as nav:
        w.page.click("#submit")
    assert nav.value.status == 400
    msg = w.page.locator("#error").text_content()
    assert "Rule:" in msg and "Fix:" in msg
    assert w.page.input_value("#seq") == "-5"  # the form keeps what was typed
    w.page.screenshot(path=str(artifacts / "ui-error.png"))
    assert w.blocked == []
    w.close()


def test_ui_uploads_a_lengths_file(browser, ui_url, ui_token, tmp_path, capsys):
    """The form's file inputs switch it to a multipart POST: the serving section is computed
    from the uploaded lengths file, as `roofline serve --lengths FILE` computes it."""
    lengths = tmp_path / "traffic.csv"
    lengths.write_text("prompt,output\n1024,256\n4096,64\n")
    w = Watched(browser, (ui_url,))
    start = {"model": "tiny-llama", "system": "h100:8", "token": ui_token}
    w.page.goto(ui_url + "/?" + urllib.parse.urlencode(start))
    w.charts_ready()
    w.page.check("#serve")
    w.page.fill("#serve-system", "h100:8")
    w.page.set_input_files("#serve-lengths", str(lengths))
    with w.page.expect_navigation() as nav:
        w.page.click("#submit")
    assert nav.value.status == 200 and nav.value.request.method == "POST"
    w.charts_ready()
    served = json.loads(w.page.locator("#roofline-documents").text_content())["serve"]
    capsys.readouterr()
    argv = ["serve", "--model", "tiny-llama", "--system", "h100:8", "--lengths", str(lengths)]
    assert main([*argv, "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)

    def outputs(doc):
        return {k: v for k, v in doc.items() if k not in ("inputs", "search_time_s")}

    assert outputs(served) == outputs(cli)
    assert w.blocked == [] and w.errors == []
    w.close()
