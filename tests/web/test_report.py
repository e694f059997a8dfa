"""`roofline report`: the page is built from the CLI's own documents and shows their numbers.

The default report (the README's main job) is compared with a separate `roofline train
--json` run; the HTML is self-contained; `--format md` writes Markdown with PNGs beside it;
bad input is one paragraph with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import pytest

from roofline.cli import main
from roofline.errors import SpecError
from roofline.report import page
from roofline.report.page import ReportDocuments
from roofline.units import fmt_bytes, fmt_time
from roofline.web import documents

VOLATILE = {"search_time_s"}  # wall-clock of the search: differs between two runs


def cli_json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def embedded(html: str, element_id: str) -> dict:
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', html, re.S)
    assert m, f"no {element_id} in the page"
    return json.loads(m.group(1))


def stable(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in VOLATILE}


@pytest.fixture(scope="module")
def default_html(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("report") / "roofline-report.html"
    assert main(["report", "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def test_default_report_documents_are_the_cli_documents(default_html, capsys):
    docs = embedded(default_html, "roofline-documents")
    train = cli_json(capsys, ["train"])
    assert stable(docs["train"]) == stable(train)
    chip = docs["chip"]["name"]
    assert chip == docs["system"]["chip"] == "tpu-v5p"
    seq = str(train["inputs"]["seq_len"])
    assert docs["model"] == cli_json(capsys, ["model", "llama-3-70b", "--seq", seq, "--chip", chip])
    assert docs["commands"]["train"] == "roofline train --json"


def test_default_report_shows_the_documents_numbers(default_html):
    train = embedded(default_html, "roofline-documents")["train"]
    text = re.sub(r"<[^>]+>", " ", default_html.split('<script type="application/json"')[0])
    shown = [
        fmt_time(train["step_time_s"]),
        f"{train['mfu']:.1%}",
        f"{train['hfu']:.1%}",
        fmt_bytes(train["memory_per_chip_bytes"]),
        fmt_bytes(train["hbm_fit_bytes"]),  # what the plan must fit in
        train["plan"]["spec"],
        train["system_used"],
        *(f"{n:,}" for n in train["rejected"].values()),
        *(c["plan"]["spec"] for c in train["top"]),
        *(p["plan"] for p in train["pareto"]),
        train["efficiency"]["name"],
    ]
    for s in shown:
        assert s in text, f"{s!r} is not on the page"


def test_the_page_states_the_profile_and_its_held_out_error(default_html):
    """The assumptions name the profile, its kind and the chip family's physics it used, and a
    calibrated profile's error bar from its provenance; no input is shown as a raw mapping."""
    import html as _html

    train = embedded(default_html, "roofline-documents")["train"]
    text = _html.unescape(
        re.sub(r"<[^>]+>", " ", default_html.split('<script type="application/json"')[0])
    )
    e = train["efficiency"]
    prov = e["provenance"]
    assert f"{e['name']} ({e['kind']}) on tpu-v5p" in text
    src = prov["cv_source_after"]
    assert f"median |error| {src['median_abs']:.1%}, bias {src['bias']:+.1%}" in text
    assert "{'" not in text  # a dict's repr never reaches the page


def test_default_report_charts_carry_the_documents_numbers(default_html):
    docs = embedded(default_html, "roofline-documents")
    charts = embedded(default_html, "roofline-charts")
    assert {"roofline", "timeline", "memory", "pareto", "rejected"} <= set(charts)
    train = docs["train"]
    timeline = _values(charts["timeline"])
    for rank, cost in enumerate(train["top"], 1):
        parts = [r["seconds"] for r in timeline if r["rank"] == rank]
        assert math.isclose(sum(parts), cost["step_time_s"], rel_tol=1e-9)
        mem = [r["bytes"] for r in _values(charts["memory"]) if r["rank"] == rank]
        assert math.isclose(sum(mem), cost["memory_per_chip_bytes"], rel_tol=1e-9)
    rows = {r["name"]: r for r in docs["model"]["roofline"]["rows"]}
    points = _values(charts["roofline"], mark="point")
    assert {p["op"] for p in points} == {n for n, r in rows.items() if r["flops"] > 0}
    for p in points:
        assert p["intensity"] == rows[p["op"]]["intensity"]
        assert p["bound"] == rows[p["op"]]["bound"]
    assert [(p["chips"], p["step_time_s"]) for p in _values(charts["pareto"], mark="circle")] == [
        (p["chips"], p["step_time_s"]) for p in train["pareto"]
    ]


def _values(spec: dict, mark: str | None = None) -> list[dict]:
    """The data rows of a chart (the layer with `mark`, or the chart itself)."""
    for layer in spec.get("layer", [spec]):
        kind = layer.get("mark")
        kind = kind.get("type") if isinstance(kind, dict) else kind
        if mark is None or kind == mark:
            return (layer.get("data") or spec.get("data"))["values"]
    raise AssertionError(f"no {mark} layer")


def test_page_is_self_contained(default_html):
    assert "<script src" not in default_html and "<link" not in default_html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", default_html)
    assert "@import" not in default_html and "url(http" not in default_html
    assert "vegaEmbed" in default_html  # the chart library itself is inlined


def test_markdown_report_with_pngs(tmp_path, capsys):
    out = tmp_path / "proposal.md"
    argv = ["report", "--model", "tiny-llama", "--system", "tpu-v5e:4x4", "--out", str(out)]
    assert main(argv) == 0
    md = out.read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert {"proposal-roofline.png", "proposal-timeline.png", "proposal-memory.png"} <= set(images)
    for name in images:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    train = cli_json(capsys, ["train", "--model", "tiny-llama", "--system", "tpu-v5e:4x4"])
    assert f"| plan | {train['plan']['spec']} |" in md
    assert "| row | kind | count |" in md and "| total |" in md


def test_one_plan_report(tmp_path):
    out = tmp_path / "one.html"
    argv = [
        "report",
        "--model",
        "tiny-llama",
        "--system",
        "tpu-v5e:4x4",
        "--plan",
        "fsdp=16",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    html = out.read_text(encoding="utf-8")
    docs = embedded(html, "roofline-documents")
    assert docs["train"]["plan"]["spec"].startswith("fsdp=16")
    assert "pareto" not in embedded(html, "roofline-charts")
    assert "a single plan was costed" in html


SERVE_DOC = {
    "schema_version": "1.0",
    "command": "serve",
    "inputs": {"model": "llama-3-70b", "concurrency": 64},
    "plan": {"spec": "tp=8"},
    "ttft_s": 0.412,
    "tpot_s": 0.0213,
    "tokens_per_s_per_chip": 1510.0,
    "tokens_per_s_per_user": 46.9,
    "usd_per_million_output_tokens": 0.87,
    "pareto": [
        {
            "plan": "tp=8",
            "concurrency": 8,
            "tokens_per_s_per_user": 80.0,
            "tokens_per_s_per_chip": 400.0,
        },
        {
            "plan": "tp=8",
            "concurrency": 64,
            "tokens_per_s_per_user": 46.9,
            "tokens_per_s_per_chip": 1510.0,
        },
    ],
}


def test_serving_section_from_a_serve_document(tmp_path):
    serve = tmp_path / "serve.json"
    serve.write_text(json.dumps(SERVE_DOC))
    out = tmp_path / "r.html"
    argv = [
        "report",
        "--model",
        "tiny-llama",
        "--system",
        "tpu-v5e:4x4",
        "--serving",
        str(serve),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    html = out.read_text(encoding="utf-8")
    assert embedded(html, "roofline-documents")["serve"] == SERVE_DOC
    points = _values(embedded(html, "roofline-charts")["serve_pareto"], mark="circle")
    assert [p["tokens_per_s_per_chip"] for p in points] == [400.0, 1510.0]
    text = re.sub(r"<[^>]+>", " ", html)
    for s in ("TTFT", fmt_time(0.412), "TPOT", fmt_time(0.0213), "concurrency"):
        assert s in text


def test_no_serving_section_without_a_serve_document(default_html):
    assert 'id="serving"' not in default_html


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--model", "nope"], ["unknown model 'nope'", "Fix:"]),
        (["--serving", "/nonexistent/serve.json"], ["does not exist", "Fix:"]),
        (["--out", "/nonexistent/dir/r.html"], ["does not exist", "Fix:"]),
        (["--seq", "-5"], ["Rule:", "Fix:"]),
    ],
)
def test_bad_input_is_one_paragraph(argv, words, capsys, tmp_path):
    capsys.readouterr()
    assert main(["report", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    for w in words:
        assert w in err


def test_serving_file_must_be_a_serve_document(tmp_path, capsys):
    bad = tmp_path / "train.json"
    bad.write_text(json.dumps({"command": "train"}))
    assert main(["report", "--serving", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert "not a serve document" in capsys.readouterr().err


# --- the pieces: inputs to argv, and the page's rows -----------------------------------


def test_argv_for_uses_the_commands_own_options():
    argv = documents.argv_for(
        "train", {"batch-tokens": "1M", "seq": 2048, "no_sub_slices": "on", "plan": ""}
    )
    assert argv == ["--batch-tokens", "1M", "--seq", "2048", "--no-sub-slices"]
    assert documents.argv_for("model", {"model": "llama-3-8b", "chip": "h100"}) == [
        "llama-3-8b",
        "--chip",
        "h100",
    ]
    with pytest.raises(SpecError, match="has no input 'bogus'.*Fix: use one of"):
        documents.argv_for("train", {"bogus": "1"})


def test_values_from_namespace_keeps_only_what_was_set():
    ns = argparse.Namespace(
        model="llama-3-8b", seq=4096, batch_tokens=str(4 * 2**20), top=5, out="x"
    )
    assert documents.values_from_namespace("train", ns) == {"model": "llama-3-8b"}


def test_unknown_command_document_is_an_error():
    with pytest.raises(SpecError, match="unknown command"):
        documents.document("nonexistent", [])


def _docs(train: dict) -> ReportDocuments:
    return ReportDocuments(train=train, model={}, system={}, chip={})


def test_timeline_keeps_a_remainder_it_cannot_name():
    cost = {
        "step_time_s": 1.0,
        "compute_time_s": 0.6,
        "exposed_time_s": {"tp": 0.1, "fsdp+grad": 0.0},
        "bubble_time_s": 0.05,
        "optimizer_time_s": 0.05,
    }
    segs = page.timeline_segments(cost)
    assert [s["part"] for s in segs] == [
        "compute",
        "exposed tp",
        "pipeline bubble",
        "optimizer",
        "other (step − listed parts)",
    ]
    assert math.isclose(sum(s["seconds"] for s in segs), 1.0)


def test_timeline_names_the_fixed_overheads():
    """The profile's and stack's fixed overheads are a named part of the step, not a remainder:
    the default report's plan (MaxText's fitted per-layer time) adds up without "other"."""
    cost = {
        "step_time_s": 1.0,
        "compute_time_s": 0.6,
        "exposed_time_s": {"tp": 0.1},
        "optimizer_time_s": 0.05,
        "overhead_time_s": 0.25,
    }
    segs = page.timeline_segments(cost)
    assert [s["part"] for s in segs][-1] == "fixed overheads (step, per layer)"
    assert math.isclose(sum(s["seconds"] for s in segs), 1.0)


def test_comm_rows_show_raw_and_exposed_side_by_side():
    cost = {
        "comm_time_s": {"fsdp": 0.1, "tp": 0.4, "sp": 0.0},
        "exposed_time_s": {"fsdp+grad": 0.0, "tp": 0.2, "sp": 0.0},
    }
    assert page.comm_rows(cost) == [
        ["fsdp", "100 ms", "—"],
        ["tp", "400 ms", "200 ms"],
        ["fsdp+grad", "—", "0 ns"],
    ]


def test_summary_of_a_document_without_a_plan():
    """A back-of-envelope document (--assume-mfu) has no plan: the page lists its numbers."""
    doc = {"command": "train", "inputs": {}, "run_time_s": 3.86e6, "mfu": 0.4, "formula": "6·N·D"}
    assert dict(page.summary_rows(_docs(doc))) == {
        "run time s": "3.86e+06",
        "mfu": "0.4",
        "formula": "6·N·D",
    }


def test_back_of_envelope_report(tmp_path, capsys):
    out = tmp_path / "mfu.html"
    assert main(["report", "--model", "llama-3-8b", "--assume-mfu", "0.4", "--out", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    assert "The estimate (no plan was costed)" in html and 'id="chart-timeline"' not in html
    train = cli_json(capsys, ["train", "--model", "llama-3-8b", "--assume-mfu", "0.4"])
    assert embedded(html, "roofline-documents")["train"] == train
    assert train["formula"] in html
    md = tmp_path / "mfu.md"
    assert main(["report", "--model", "llama-3-8b", "--assume-mfu", "0.4", "--out", str(md)]) == 0
    assert "## Step timeline" not in md.read_text() and (tmp_path / "mfu-roofline.png").exists()


def test_docs_screenshot_exists():
    png = Path(__file__).parents[2] / "docs" / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SERVE_ARGS = "--system h100:8 --prompt 512 --gen 128"
needs_serve = pytest.mark.skipif(
    not documents.has_command("serve"), reason="this tree has no `roofline serve` (issue 11)"
)


@needs_serve
def test_report_runs_serve_for_its_section(tmp_path, capsys):
    out = tmp_path / "r.html"
    base = ["--model", "llama-3-8b", "--system", "tpu-v5e:4x4"]
    assert main(["report", *base, "--serve", SERVE_ARGS, "--out", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    docs = embedded(html, "roofline-documents")
    serve = cli_json(capsys, ["serve", "--model", "llama-3-8b", *SERVE_ARGS.split()])
    assert {k: v for k, v in docs["serve"].items() if k != "search_time_s"} == {
        k: v for k, v in serve.items() if k != "search_time_s"
    }
    assert docs["commands"]["serve"].startswith("roofline serve --model llama-3-8b --system h100:8")
    assert 'id="serving"' in html and "serve_pareto" in embedded(html, "roofline-charts")
    assert fmt_time(serve["ttft_s"]) in html and fmt_time(serve["tpot_s"]) in html


def test_serve_and_serving_together_is_an_error(capsys, tmp_path):
    serve = tmp_path / "serve.json"
    serve.write_text(json.dumps(SERVE_DOC))
    argv = [
        "report",
        "--serve",
        SERVE_ARGS,
        "--serving",
        str(serve),
        "--out",
        str(tmp_path / "r.html"),
    ]
    assert main(argv) == 2
    assert "--serve and --serving both given" in capsys.readouterr().err
