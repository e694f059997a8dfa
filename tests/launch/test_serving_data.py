"""The serving test data: launch files restated from real published launch lines
(tests/data/launch/serving/MANIFEST.toml cites each), each imported to the plan its engine's
documentation implies, each export imported back to the same plan, and each plan one that
`roofline serve --plan` takes and costs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from roofline.cli import main
from roofline.launch import LaunchError, LaunchKind, detect_stack, read_launch, write_launch
from roofline.launch.base import stack_module
from roofline.launch.serving_common import from_serve, model_spec, serve_argv
from roofline.serving.inference import Quant, parse_serve_plan

DATA = Path(__file__).parents[1] / "data" / "launch" / "serving"
CASES = tomllib.loads((DATA / "MANIFEST.toml").read_text())["case"]
WORKLOAD_KEYS = ("max_num_seqs", "max_batched_tokens", "max_model_len")
SERVING = ("vllm", "sglang", "trtllm")


def _read(case: dict):
    path = DATA / case["file"]
    return read_launch(path.read_text(), source=str(path), stack=case["stack"])


def test_every_file_is_in_the_manifest_with_a_source():
    files = {
        p.relative_to(DATA).as_posix() for p in DATA.rglob("*") if p.suffix in (".sh", ".yaml")
    }
    assert files == {c["file"] for c in CASES}
    for c in CASES:
        repo_path, _, commit = c["follows"].partition(" @")
        assert "/" in repo_path and len(commit.split()[0]) == 40, c["follows"]


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_imports_to_the_documented_plan(case):
    cfg = _read(case)
    want = case["expect"]
    assert cfg.kind == LaunchKind.SERVING and cfg.stack == case["stack"]
    assert cfg.serve_plan_text == want["plan"]
    assert cfg.chips == want["chips"]
    for k in ("weight_dtype", "kv_dtype", "compute_dtype"):
        assert cfg.options[k] == want[k], k
    assert cfg.options.get("draft") == (str(want["draft"]) if "draft" in want else None)
    for k in WORKLOAD_KEYS:
        assert getattr(cfg.workload, k) == want.get(k), k
    assert len(cfg.problems) == want["problems"], [p.message for p in cfg.problems]


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_the_format_is_told_apart(case):
    """Its own engine claims the file, the other serving engines do not, and the detector over
    every stack (training ones too) picks it."""
    path = DATA / case["file"]
    text = path.read_text()
    scores = {s: stack_module(s).sniff(text, str(path)) for s in SERVING}
    assert scores.pop(case["stack"]) > 0
    assert set(scores.values()) == {0}
    assert detect_stack(text, str(path)) == case["stack"]  # against every stack's sniffer


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_export_imports_back_to_the_same_plan(case):
    cfg = _read(case)
    again = read_launch(write_launch(cfg, case["stack"]), stack=case["stack"])
    assert again.serve_plan == cfg.serve_plan
    assert again.chips == cfg.chips
    assert again.model == cfg.model
    for k in ("weight_dtype", "kv_dtype", "compute_dtype", "draft"):
        assert again.options.get(k) == cfg.options.get(k), k
    for k in WORKLOAD_KEYS:
        assert getattr(again.workload, k) == getattr(cfg.workload, k), k


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_the_plan_is_one_serve_takes(case):
    cfg = _read(case)
    plan = parse_serve_plan(cfg.serve_plan_text)
    assert cfg.chips % plan.chips == 0  # whole replicas of the plan
    Quant(cfg.options["weight_dtype"], cfg.options["kv_dtype"], cfg.options["compute_dtype"])


def test_serve_costs_an_imported_plan(capsys):
    """The DP8+EP DeepSeek line, handed to `serve --plan` with the dtypes it read: a decode step
    of 64 sequences per rank costs, and the plan serve reports is the one imported."""
    case = next(c for c in CASES if c["file"] == "vllm/deepseek-r1-h200-dp8-ep.sh")
    cfg = _read(case)
    o = cfg.options
    argv = ["serve", "--model", "deepseek-v3", "--system", f"h200:{cfg.chips}"]
    argv += ["--plan", cfg.serve_plan_text, "--batch", "64", "--context", "2048"]
    argv += ["--weight-dtype", o["weight_dtype"], "--kv-dtype", o["kv_dtype"]]
    argv += ["--compute-dtype", o["compute_dtype"], "--engine", o["engine"], "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    plan = doc["result"]["plan"] if "result" in doc else doc["plan"]
    assert (plan["tp"], plan["dp"], plan["ep"]) == (1, 8, 8)


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_serve_costs_every_imported_plan_as_read(case, capsys):
    """serve_argv hands `roofline serve` the plan, dtypes and engine the file states; one decode
    step of 8 sequences costs on H200s, with the plan serve reports the one imported."""
    cfg = _read(case)
    if model_spec(cfg.model) is None:
        pytest.skip(f"the catalog has no {cfg.model}: import asks for --model")
    argv = ["serve", *serve_argv(cfg), "--system", f"h200:{cfg.chips}"]
    argv += ["--batch", "8", "--context", "1024", "--json"]
    argv += ["--draft", cfg.options["draft"]] if "draft" in cfg.options else []
    assert main(argv) == 0, argv
    doc = json.loads(capsys.readouterr().out)
    plan = doc["result"]["plan"] if "result" in doc else doc["plan"]
    assert plan["spec"] == parse_serve_plan(cfg.serve_plan_text).describe()


@pytest.mark.parametrize("stack", SERVING)
def test_from_serve_inputs_round_trip(stack):
    """export's inputs (model, serve's parsed plan, GPUs, dtypes) -> the engine's file -> the
    same plan (the checkpoint's own dtypes when none is given)."""
    plan = parse_serve_plan("tp=1,dp=8,ep=8").to_dict()
    cfg = from_serve(stack, model="deepseek-ai/DeepSeek-V3", plan=plan, chips=16, draft=2)
    assert cfg.options["weight_dtype"] == "fp8_block" and cfg.options["compute_dtype"] == "fp8"
    back = read_launch(write_launch(cfg, stack), stack=stack)
    assert (back.serve_plan, back.chips) == ({"tp": "1", "dp": "8", "ep": "8"}, 16)
    assert back.options == cfg.options


def test_from_serve_refuses_the_books_kv_layout():
    plan = parse_serve_plan("tp=16,kv=heads_batch").to_dict()
    with pytest.raises(LaunchError, match="KV layout"):
        from_serve("vllm", model="llama-3.1-70b", plan=plan)


def test_no_serving_engine_claims_a_training_file():
    files = [p for p in DATA.parent.glob("*") if p.is_file() and not p.name.startswith("MANIFEST")]
    assert files
    for p in files:
        text = p.read_text()
        assert {s: stack_module(s).sniff(text, str(p)) for s in SERVING} == dict.fromkeys(
            SERVING, 0
        ), p


def test_engine_profile_takes_the_files_limits_and_memory_fraction():
    """The Llama-3.3 vLLM line: 512 sequences, 8192 tokens a step, 90% of the GPU; the
    TensorRT-LLM DeepSeek line: 1024 sequences on each of 8 attention-DP ranks, 80% of what the
    weights leave (its profile's own kind of fraction)."""
    from roofline.launch.serving_common import engine_profile
    from roofline.specs.engines import load_engine

    cfg = _read(next(c for c in CASES if c["file"] == "vllm/llama-3.3-70b-fp8.sh"))
    eng = engine_profile(cfg)
    assert (eng.max_num_seqs, eng.max_num_batched_tokens, eng.memory_fraction) == (512, 8192, 0.9)
    assert eng.token_budget(200e9) == 8192  # the file's budget holds on big GPUs too
    assert eng.chunked_prefill is True
    trt = engine_profile(
        _read(next(c for c in CASES if c["file"] == "trtllm/deepseek-r1-fp8-adp.sh"))
    )
    assert (trt.max_num_seqs, trt.max_num_batched_tokens, trt.memory_fraction) == (
        8 * 1024,
        3200,
        0.8,
    )
    # the file's cap is the replica's total: not multiplied by the 8 ranks a second time
    assert trt.seq_cap(8) == 8 * 1024
    assert (
        trt.memory_fraction_of == load_engine("trtllm").memory_fraction_of == "free_after_weights"
    )
    # a file that sets none of them keeps the profile
    plain = _read(next(c for c in CASES if c["file"] == "vllm/deepseek-r1-h200-tp8-ep.sh"))
    assert engine_profile(plain) == load_engine("vllm")


def test_engine_profile_refuses_a_fraction_out_of_range():
    cfg = read_launch("vllm serve x --gpu-memory-utilization 1.5", stack="vllm")
    with pytest.raises(LaunchError, match="in \\(0, 1\\]"):
        from roofline.launch.serving_common import engine_profile

        engine_profile(cfg)
