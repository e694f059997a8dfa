"""`roofline report --serve`: the serving section states the efficiency profile as the training
section does — name and kind, the physics on the serving chip, the held-out error, the
disaggregated hand-off — never the profile as a raw dict (issue 22 item 10)."""

from __future__ import annotations

import json
import re

from roofline.cli import main
from roofline.report import page
from roofline.report.text import family_physics
from roofline.specs.efficiency import default_profile
from roofline.specs.system import parse_system
from roofline.units import fmt_time

SERVE = ["serve", "--model", "llama-3-8b", "--system", "h100:8", "--concurrency", "64"]


def _serve_doc(capsys) -> dict:
    capsys.readouterr()
    assert main([*SERVE, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_serving_rows_state_the_profile_not_its_dict(capsys):
    doc = _serve_doc(capsys)
    rows = dict(page.serve_rows(doc))
    prof = doc["inputs"]["profile"]
    chip = parse_system("h100:8").chip
    eff = default_profile(chip)
    assert prof["name"] == eff.name
    fam = eff.family_for(chip)
    assert rows["efficiency profile"] == (
        f"{eff.name} ({eff.kind}) on {fam.family}: {family_physics(fam.params())}"
    )
    ttft = prof["provenance"]["serving"]["all_ttft_held_out_by_model_system_pair"]
    assert rows["its error bar"].startswith(
        f"TTFT, the fits held out by model×system pair: median |error| {ttft['median_abs']:.1%}"
    )
    assert rows["disaggregated hand-off"].startswith(fmt_time(eff.disagg_handoff_s))
    for label, value in rows.items():
        assert "{" not in value and "'families'" not in value, (label, value)


def test_serving_rows_of_a_profile_named_by_a_string():
    """Older serve documents named the profile; the row shows the name as it is."""
    rows = dict(page.serve_rows({"inputs": {"profile": "peak", "system": "h100:8"}}))
    assert rows["efficiency profile"] == "peak"


def test_the_page_and_the_markdown_carry_no_profile_dump(tmp_path, capsys):
    doc = _serve_doc(capsys)
    serve = tmp_path / "serve.json"
    serve.write_text(json.dumps(doc))
    base = ["report", "--model", "llama-3-8b", "--system", "h100:8", "--serving", str(serve)]
    assert main([*base, "--out", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    section = html[html.index('id="serving"') :]
    section = re.sub(r'<script type="application/json".*?</script>', "", section, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", section)
    assert "disaggregated hand-off" in text and "&#39;families&#39;" not in section
    assert "'families'" not in text and "'provenance'" not in text
    md = tmp_path / "r.md"
    assert main([*base, "--format", "md", "--out", str(md)]) == 0
    body = md.read_text(encoding="utf-8")
    serving = body[body.index("## Serving") :]
    assert "'families'" not in serving and "disaggregated hand-off" in serving
