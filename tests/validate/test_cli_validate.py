"""`roofline validate`: JSON keys, text, plots, planner mode, any file of the schema, errors."""

from __future__ import annotations

import json

import pytest
import yaml

from roofline.cli import main
from roofline.validate import load_runs

RUN_KEYS = {
    "id",
    "predicted_tokens_per_s_per_chip",
    "measured_tokens_per_s_per_chip",
    "error",
    "defaults",
    "skipped_reason",
}
SUMMARY_KEYS = {"coverage", "n", "median_abs_error", "mean_abs_error", "within_10", "bias"}


@pytest.fixture
def small_file(tmp_path, training_entries):
    """Any file in the training schema works: three public entries, one unmappable."""
    ids = [
        "mpt-h100-80gb-amp_bf16-1b-seq2048-8gpu",
        "dgxc-2411-llama3.1-8b-bf16-8gpu",
        "maxtext-v5p-7680-1160b",
    ]
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump([training_entries[i] for i in ids]))
    return p


def run_json(capsys, argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_keys_on_any_file(capsys, small_file):
    doc = run_json(capsys, ["validate", "--runs", str(small_file)])
    assert doc["command"] == "validate" and doc["schema"] == "training"
    assert all(RUN_KEYS <= set(r) for r in doc["runs"])
    assert SUMMARY_KEYS <= set(doc["summary"])
    assert doc["summary"]["n"] == 2 and doc["summary"]["coverage"] == pytest.approx(2 / 3)
    assert {"by_source", "by_chip_family", "by_stack", "by_cause"} <= set(doc)
    unmapped = next(r for r in doc["runs"] if r["id"].startswith("maxtext-v5p-7680"))
    assert unmapped["error"] is None and "model dims" in unmapped["skipped_reason"]


def test_text_and_plot(capsys, small_file, tmp_path):
    out = tmp_path / "v.png"
    argv = [
        "validate",
        "--runs",
        str(small_file),
        "--plot",
        str(out),
        "--show-defaults",
        "--analysis",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Summary: covered 2/3" in text and "By source:" in text and "Not covered (1)" in text
    assert "Defaults filled per run:" in text and "Error analysis" in text
    assert out.exists() and out.stat().st_size > 10_000


def test_planner_mode(capsys, tmp_path, training_entries):
    p = tmp_path / "one.yaml"
    p.write_text(yaml.safe_dump([training_entries["mpt-h100-80gb-amp_bf16-1b-seq2048-8gpu"]]))
    doc = run_json(capsys, ["validate", "--runs", str(p), "--planner"])
    (run,) = doc["runs"]
    pl = run["planner"]
    # the planner searches the run's own plan too, so it is at least as fast as that plan
    assert pl["predicted_tokens_per_s_per_chip"] >= run["predicted_tokens_per_s_per_chip"] * 0.999
    assert doc["planner"]["n"] == 1 and doc["planner"]["median_excess"] == pytest.approx(
        pl["excess_over_measured"]
    )
    assert "fp8" not in pl["plan"]  # a bf16 run: the planner searches bf16 plans


def test_planner_mode_searches_the_runs_precision(capsys, tmp_path, training_entries):
    """Issue 19 item 3: an fp8 run's planner plans compute in fp8 too (they were bf16 only, so
    the planner's 'best' was slower than the published plan in the tool's own model)."""
    p = tmp_path / "one.yaml"
    p.write_text(yaml.safe_dump([training_entries["mbridge-25.11-dgx-h100-fp8cs-llama3-8b-8gpu"]]))
    doc = run_json(capsys, ["validate", "--runs", str(p), "--planner"])
    (run,) = doc["runs"]
    assert run["compute_dtype"] == "fp8" and "matmul_dtype=fp8" in run["planner"]["plan"]
    assert run["planner"]["excess_over_own_plan_prediction"] >= -0.001
    # the summary keeps the 8/4-bit runs' excess apart from the 16-bit ones (never pooled)
    by = doc["planner"]["by_precision"]
    assert by["16-bit"] == {"n": 0, "median_excess": None}
    assert by["8/4-bit"]["n"] == 1
    assert by["8/4-bit"]["median_excess"] == pytest.approx(run["planner"]["excess_over_measured"])


def test_planner_text_splits_the_excess_by_precision(capsys, tmp_path, training_entries):
    ids = ["mpt-h100-80gb-amp_bf16-1b-seq2048-8gpu", "mbridge-25.11-dgx-h100-fp8cs-llama3-8b-8gpu"]
    p = tmp_path / "two.yaml"
    p.write_text(yaml.safe_dump([training_entries[i] for i in ids]))
    assert main(["validate", "--runs", str(p), "--planner"]) == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if "by compute precision" in ln)
    assert "16-bit runs" in line and "(1)" in line and "8/4-bit runs" in line


def test_serving_json_has_one_summary_per_metric(capsys):
    doc = run_json(capsys, ["validate", "--runs", "inference"])
    assert set(doc["summary"]) == {"ttft", "tpot", "throughput"}
    assert {"by_engine", "by_chip_family"} <= set(doc)


@pytest.mark.parametrize(
    "content,phrase",
    [
        ("- id: [unclosed\n", "not valid YAML"),
        ("just text", "not a list of runs"),
        ("- 1\n- 2\n", "no entries that are mappings"),
        ("- {id: a, model: {}}\n- {id: b, engine: {name: vLLM}}\n", "mixes training entries"),
    ],
)
def test_bad_files_are_one_paragraph_errors(tmp_path, capsys, content, phrase):
    p = tmp_path / "bad.yaml"
    p.write_text(content)
    assert main(["validate", "--runs", str(p)]) == 2
    err = capsys.readouterr().err
    assert phrase in err and "Traceback" not in err and err.count("\n") == 1


def test_missing_file_and_bad_profile(capsys, small_file):
    assert main(["validate", "--runs", "/nonexistent/runs.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["validate", "--runs", str(small_file), "--profile", "nosuch"]) == 2
    assert "unknown efficiency profile" in capsys.readouterr().err
    assert main(["validate", "--runs", str(small_file), "--plot", "x.gif"]) == 2
    assert "image suffix" in capsys.readouterr().err


def test_peak_profile_is_faster_than_the_default(small_file):
    from roofline.validate import validate

    d = validate(load_runs(str(small_file))).to_dict()["runs"]
    p = validate(load_runs(str(small_file)), profile="peak").to_dict()["runs"]
    for a, b in zip(d, p, strict=True):
        if a["error"] is not None:
            assert b["predicted_tokens_per_s_per_chip"] > a["predicted_tokens_per_s_per_chip"]


def test_duplicate_ids_are_skipped(tmp_path, training_entries):
    from roofline.validate import validate

    e = training_entries["mpt-h100-80gb-amp_bf16-1b-seq2048-8gpu"]
    p = tmp_path / "dup.yaml"
    p.write_text(yaml.safe_dump([e, e]))
    runs = validate(str(p)).to_dict()["runs"]
    assert runs[0]["error"] is not None and "duplicate id" in runs[1]["skipped_reason"]


def test_an_unknown_framework_names_validates_own_choices(capsys):
    """validate's --framework also takes auto and none: the error says so."""
    assert main(["validate", "--runs", "training", "--framework", "nope"]) == 2
    err = capsys.readouterr().err
    assert "auto (each run's own stack)" in err and "none" in err and "megatron" in err
    assert "Traceback" not in err
