"""The Python API (issue 22 item 12): serving, validate and calibrate as functions with typed
results that hold the CLI's own documents; short reprs; docs/api.md is a doctest of it."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest

import roofline as rl
from roofline.cli import main
from roofline.errors import RooflineError

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = {"search_time_s"}


def cli_doc(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return {k: v for k, v in doc.items() if k not in VOLATILE}


def test_docs_api_md_runs_as_written():
    """Every example of docs/api.md, run (the page cannot go stale)."""
    r = doctest.testfile(
        str(ROOT / "docs" / "api.md"),
        module_relative=False,
        optionflags=doctest.ELLIPSIS,
        raise_on_error=False,
    )
    assert r.attempted > 20 and r.failed == 0


def test_the_module_docstring_example():
    import roofline.api

    r = doctest.testmod(roofline.api, optionflags=doctest.ELLIPSIS)
    assert r.attempted >= 2 and r.failed == 0


def test_serve_step_is_the_cli_document(capsys):
    args = dict(batch=32, context=8192, weight_dtype="int8", kv_dtype="int8", profile="peak")
    step = rl.serve_step("llama-3-70b", "tpu-v5e:4x2", "tp=8", **args)
    argv = ["serve", "--model", "llama-3-70b", "--system", "tpu-v5e:4x2", "--plan", "tp=8"]
    argv += ["--batch", "32", "--context", "8192", "--weight-dtype", "int8"]
    argv += ["--kv-dtype", "int8", "--profile", "peak"]
    doc = cli_doc(capsys, argv)
    assert step.document == doc
    assert step.step_time_s == doc["step_time_s"] and step.max_batch == doc["max_batch"]
    assert step.tokens_per_s == pytest.approx(step.batch / step.step_time_s, rel=1e-12)
    assert isinstance(step, rl.ServeStep) and step.tpot_s == step.step_time_s


def test_serve_search_is_the_cli_document(capsys):
    res = rl.serve_search("llama-3-8b", "h100:8", concurrency=64, profile="peak")
    doc = cli_doc(
        capsys,
        ["serve", "--model", "llama-3-8b", "--system", "h100:8"]
        + ["--concurrency", "64", "--profile", "peak"],
    )
    assert {k: v for k, v in res.document.items() if k not in VOLATILE} == doc
    assert res.best.plan == doc["best"]["plan"]["spec"]
    assert res.best.ttft_s == doc["best"]["ttft_s"]
    assert [c.plan for c in res.top] == [r["plan"]["spec"] for r in doc["top"]]
    assert res.candidates == doc["candidates_evaluated"] and res.rejections == doc["rejections"]
    assert len(res.pareto) == len(doc["pareto"])


def test_serve_search_refuses_step_options():
    with pytest.raises(RooflineError, match="serve_step"):
        rl.serve_search("llama-3-8b", "h100:8", plan="tp=1", batch=8, context=1024)


def test_bad_options_are_errors_not_tracebacks():
    with pytest.raises(RooflineError, match="no input 'concurency'"):
        rl.serve_search("llama-3-8b", "h100:8", concurency=64)
    with pytest.raises(RooflineError, match="unknown model"):
        rl.serve_step("no-such-model", "h100:8", "tp=1", batch=8, context=1024)
    with pytest.raises(RooflineError):
        rl.validate_runs("training", profile="no-such-profile")


def test_validate_runs_is_the_cli_document(capsys):
    v = rl.validate_runs("training")
    doc = cli_doc(capsys, ["validate", "--runs", "training"])
    assert v.document == doc
    s = v.scores["tokens_per_s_per_chip"]
    assert (s.n, s.n_total) == (doc["summary"]["n"], doc["summary"]["n_total"])
    assert s.median_abs_error == doc["summary"]["median_abs_error"]
    assert v.held_out == doc["held_out"] and v.held_out is not None
    assert f"{s.median_abs_error:.1%}" in repr(v)


def test_validate_runs_scores_each_metric_apart():
    v = rl.validate_runs("inference")
    assert v.schema == "inference" and set(v.scores) == {"ttft", "tpot", "throughput"}
    for metric, score in v.scores.items():
        assert score.n == v.document["summary"][metric]["n"]
        assert score.median_abs_error == v.document["summary"][metric]["median_abs_error"]


def test_validate_and_calibrate_are_not_shadowed_by_their_subpackages():
    """`roofline.validate` and `roofline.calibrate` are subpackages; the functions have other
    names, so importing the subpackages cannot replace them."""
    import roofline.calibrate  # noqa: F401
    import roofline.validate  # noqa: F401

    assert callable(rl.validate_runs) and callable(rl.calibrate_profile)


def test_calibrate_profile_on_the_device(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "me.toml"
    cal = rl.calibrate_profile(device=True, quick=True, out=str(out))
    assert cal.mode == "device" and out.is_file() and str(out) in cal.written
    assert cal.profile["name"] == cal.document["profile"]["name"]
    assert cal.document["kernels"] and "Calibration(device" in repr(cal)
    # the written profile is one `profile=` reads back
    assert (
        rl.serve_step(
            "tiny-llama", "h100:1", "tp=1", batch=8, context=1024, profile=str(out)
        ).document["inputs"]["profile"]["name"]
        == cal.profile["name"]
    )


def test_reprs_are_short():
    plan = rl.parse_plan("fsdp=8,tp=2")
    assert repr(plan) == f"Plan({plan.describe()!r})" and str(plan) == plan.describe()
    assert rl.parse_plan(str(plan)) == plan
    for obj in (
        rl.load_model("deepseek-v3"),
        rl.parse_system("2xtpu-v5p:16x20x28"),
        rl.load_chip("gb200"),
        rl.parse_plan("dp=2,fsdp=64,tp=8,pp=4,schedule=interleaved,virtual=2,microbatch=8"),
    ):
        assert len(repr(obj)) < 120, repr(obj)
    assert "256 experts top-8" in repr(rl.load_model("deepseek-v3"))


def test_import_roofline_loads_no_api_until_asked():
    code = "import sys, roofline; print('roofline.api' in sys.modules, 'numpy' in sys.modules)"
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "src")},
        check=True,
    )
    assert p.stdout.split() == ["False", "False"]


def test_training_results_print_one_line():
    work = rl.Workload(batch_tokens=2**20, seq_len=4096, total_tokens=1e12)
    res = rl.plan_training(rl.load_model("tiny-llama"), rl.parse_system("h100:8"), work)
    best = res.best
    assert repr(best).startswith(f"StepCost({best.plan.describe()} on h100:8: step ")
    assert f"MFU {best.mfu:.1%}" in repr(best) and "\n" not in repr(res)
    assert repr(res).endswith(f"best {best!r})") and len(repr(res)) < 300
