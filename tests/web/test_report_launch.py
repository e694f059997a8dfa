"""The report page shows the chosen plans' launch lines (`launch` of the train / serve
documents) with a copy button; without a writer for the stack there is no section."""

from __future__ import annotations

import json
import re

import pytest

from roofline.cli import main
from roofline.report import page
from roofline.report.page import ReportDocuments

LAUNCH = {
    "stack": "vllm",
    "text": "vllm serve llama-3-70b \\\n  --tensor-parallel-size 8\n",
    "reason": None,
}
SERVE_DOC = {
    "schema_version": "1.0",
    "command": "serve",
    "inputs": {"model": "llama-3-70b", "concurrency": 64},
    "plan": {"spec": "tp=8"},
    "ttft_s": 0.412,
    "tpot_s": 0.0213,
    "launch": LAUNCH,
}


def report(tmp_path, fmt: str = "html") -> str:
    serve = tmp_path / "serve.json"
    serve.write_text(json.dumps(SERVE_DOC))
    out = tmp_path / ("r.html" if fmt == "html" else "r.md")
    argv = ["report", "--model", "tiny-llama", "--system", "tpu-v5e:4x4", "--plan", "fsdp=16"]
    argv += ["--serving", str(serve), "--out", str(out)]
    assert main([*argv, *(["--format", "md"] if fmt == "md" else [])]) == 0
    return out.read_text(encoding="utf-8")


def test_launch_blocks_come_from_the_documents():
    train = {"launch": {"stack": "maxtext", "text": None, "reason": "MaxText cannot express X."}}
    docs = ReportDocuments(train=train, model={}, system={}, chip={}, serve=SERVE_DOC)
    blocks = page.launch_blocks(docs)
    assert [b["id"] for b in blocks] == ["launch-train", "launch-serve"]
    assert blocks[0]["text"] is None and blocks[0]["reason"] == "MaxText cannot express X."
    assert blocks[1]["text"] == LAUNCH["text"]
    none = ReportDocuments(train={"launch": None}, model={}, system={}, chip={})
    assert page.launch_blocks(none) == []


def test_html_page_shows_the_serving_launch_with_a_copy_button(tmp_path):
    html = report(tmp_path)
    pre = re.search(r'<pre class="mono" id="launch-serve">(.*?)</pre>', html, re.S)
    assert pre and pre.group(1) == LAUNCH["text"]
    assert 'data-copy="launch-serve"' in html
    # the training plan (maxtext, with MaxText's own adam-fp32) is written too, with its button
    train = re.search(r'<pre class="mono" id="launch-train">(.*?)</pre>', html, re.S)
    assert "Training launch (maxtext" in html and train and "MaxText.train" in train.group(1)
    assert 'data-copy="launch-train"' in html and "Not written:" not in html


def test_markdown_report_shows_the_launch_lines(tmp_path):
    md = report(tmp_path, "md")
    assert "## Launch lines of the chosen plans" in md
    assert "```sh\n" + LAUNCH["text"].rstrip() + "\n```" in md


@pytest.mark.browser
def test_copy_button_copies_the_launch_line(browser, tmp_path):
    report(tmp_path)
    context = browser.new_context()
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.goto((tmp_path / "r.html").resolve().as_uri())
    p.click('button[data-copy="launch-serve"]')
    p.wait_for_selector('button[data-copy="launch-serve"][data-copied="1"]', timeout=5_000)
    assert p.evaluate("navigator.clipboard.readText()") == LAUNCH["text"]
    assert errors == []
    context.close()
