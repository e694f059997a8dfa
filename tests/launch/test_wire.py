"""The wiring of issue 17: `import` of serving launch lines costs them as `serve --plan` does,
`export --to vllm|sglang|trtllm` writes serve's plans and round-trips through `import`, and
`train` / `serve` end with the chosen plan's launch line (text and the JSON `launch` key)."""

from __future__ import annotations

import json

import pytest

from roofline.cli import main
from roofline.launch import read_launch
from roofline.launch.serving_common import engine_profile
from roofline.specs.engines import load_engine

VLLM_70B = "vllm serve meta-llama/Meta-Llama-3-70B-Instruct --tensor-parallel-size 8\n"
SERVE_70B = ["--model", "llama-3-70b", "--plan", "tp=8", "--system", "h100:8"]
BF16 = ["--weight-dtype", "bf16", "--kv-dtype", "bf16", "--compute-dtype", "bf16"]


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def result(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("schema_version", "command", "inputs")}


def launch_file(tmp_path, text: str, name: str = "serve.sh") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# ------------------------------------------------------------------------------ import


def test_import_of_a_serving_line_costs_it_as_serve_plan(capsys, tmp_path):
    f = launch_file(tmp_path, VLLM_70B)
    doc = run_json(capsys, "import", f, "--system", "h100:8", "--concurrency", "32")
    assert (doc["kind"], doc["stack"], doc["plan"]["spec"]) == ("serving", "vllm", "tp=8")
    serve = run_json(capsys, "serve", *SERVE_70B, *BF16, "--engine", "vllm", "--concurrency", "32")
    assert doc["cost"] == result(serve)
    assert doc["cost"]["best"]["plan"]["spec"] == "tp=8"


def test_import_of_a_serving_line_text_has_serves_tables(capsys, tmp_path):
    f = launch_file(tmp_path, VLLM_70B)
    assert main(["import", f, "--system", "h100:8", "--concurrency", "32"]) == 0
    out = capsys.readouterr().out
    assert "roofline import:" in out and "best plan" in out and "Pareto" in out


def test_import_costs_with_the_files_engine_limits(capsys, tmp_path):
    """--max-num-seqs reaches the cost through the engine's profile (serve has no flag for it)."""
    text = VLLM_70B.rstrip("\n") + " --max-num-seqs 16\n"
    assert engine_profile(read_launch(text, source="x.sh")).max_num_seqs == 16
    assert engine_profile(read_launch(VLLM_70B, source="x.sh")) == load_engine("vllm")
    f = launch_file(tmp_path, text)
    doc = run_json(capsys, "import", f, "--system", "h100:8", "--concurrency", "64")
    serve = run_json(capsys, "serve", *SERVE_70B, *BF16, "--engine", "vllm", "--concurrency", "64")
    assert doc["cost"]["tpot_s"] != serve["tpot_s"]


def test_import_refuses_serve_load_flags_for_a_training_file(capsys):
    from tests.launch.test_cli import TT405

    assert main(["import", TT405, "--system", "h100:128", "--concurrency", "8"]) == 2
    assert "--concurrency" in capsys.readouterr().err


# ------------------------------------------------------------------------------ export

ROUND_TRIPS = [
    ("vllm", "llama-3-70b", "tp=4", "h100:16", ["--weight-dtype", "fp8", "--compute-dtype", "fp8"]),
    ("vllm", "deepseek-v3", "tp=1,dp=8,ep=8", "h200:8", []),
    ("sglang", "deepseek-v3", "tp=1,dp=8,ep=8", "h200:16", ["--kv-dtype", "fp8"]),
    ("sglang", "llama-3-70b", "tp=8", "h100:8", []),
    ("trtllm", "deepseek-v3", "tp=1,dp=8,ep=8", "h200:16", ["--draft", "3"]),
    ("trtllm", "llama-3-70b", "tp=4,pp=2", "h100:8", []),
]


@pytest.mark.parametrize(("stack", "model", "plan", "system", "extra"), ROUND_TRIPS)
def test_serving_export_round_trips_through_import(
    capsys, tmp_path, stack, model, plan, system, extra
):
    out = str(tmp_path / "launch.sh")
    argv = ["export", "--to", stack, "--model", model, "--plan", plan, "--system", system]
    exp = run_json(capsys, *argv, *extra, "--out", out)
    assert exp["kind"] == "serving" and exp["plan"]["spec"] == plan
    back = run_json(capsys, "import", out)
    assert (back["stack"], back["plan"]["spec"]) == (stack, plan)
    assert back["chips"] == int(system.split(":")[1])
    assert back["options"] == exp["options"]


def test_serving_export_without_plan_writes_serves_best(capsys):
    load = ["--model", "llama-3-70b", "--system", "h100:16", "--concurrency", "64"]
    exp = run_json(capsys, "export", "--to", "sglang", *load)
    serve = run_json(capsys, "serve", *load, "--engine", "sglang")
    assert exp["skipped"] == [] and exp["plan"]["spec"] == serve["best"]["plan"]["spec"]
    assert exp["text"] == serve["launch"]["text"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--to", "vllm", "--model", "llama-3-70b", "--plan", "tp=2,dp=2"], "dense"),
        (["--to", "vllm", "--plan", "tp=4,kv=heads_batch"], "KV layout"),
        (["--to", "sglang", "--plan", "tp=4", "--concurrency", "8"], "--concurrency"),
        (["--to", "trtllm", "--precision", "fp8"], "--precision"),
        (["--to", "megatron", "--plan", "dp=8", "--kv-dtype", "fp8"], "--kv-dtype"),
        (["--to", "vllm", "--plan", "tp=2,pp=2", "--system", "h100:6"], "whole servers"),
    ],
)
def test_serving_export_errors_name_what_the_engine_lacks(capsys, argv, said):
    assert main(["export", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


# ------------------------------------------------------------------------------ train / serve


TRAIN = [
    "--model",
    "llama-3-8b",
    "--system",
    "h100:64",
    "--tokens",
    "1T",
    "--framework",
    "megatron",
]


def test_train_plan_shows_its_launch_line_and_it_imports_back(capsys, tmp_path):
    plan = "dp=8,tp=8,microbatch=8,remat=full"
    doc = run_json(capsys, "train", *TRAIN, "--plan", plan, "--optimizer", "adam-fp32-master")
    launch = doc["launch"]
    assert launch["stack"] == "megatron" and launch["reason"] is None
    back = run_json(capsys, "import", launch_file(tmp_path, launch["text"], "run.sh"))
    assert back["plan"]["spec"] == doc["plan"]["spec"]
    assert main(["train", *TRAIN, "--plan", plan, "--optimizer", "adam-fp32-master"]) == 0
    out = capsys.readouterr().out
    assert "Launch (megatron" in out and "--tensor-model-parallel-size 8" in out


def test_train_names_why_a_plan_has_no_launch_line(capsys):
    argv = ["--plan", "dp=8,tp=8,microbatch=8,remat=full", "--optimizer", "adam-bf16"]
    doc = run_json(capsys, "train", *TRAIN, *argv)
    assert doc["launch"]["text"] is None and "optimizer=adam-bf16" in doc["launch"]["reason"]
    assert doc["inputs"]["optimizer_default"] is None  # given, not defaulted


def test_train_keeps_the_stacks_own_optimizer_unless_told(capsys):
    """Without --optimizer, the named stack's own (launch/defaults/capabilities.toml, cited),
    shown in the output and written by the launch line; the idealised machine keeps the book's."""
    doc = run_json(capsys, "train", *TRAIN, "--plan", "dp=8,tp=8,microbatch=8,remat=full")
    assert doc["plan"]["optimizer"] == doc["inputs"]["optimizer"] == "adam-fp32-master"
    source = doc["inputs"]["optimizer_default"]
    assert source.startswith("Megatron-LM's own: NVIDIA/Megatron-LM megatron/training/arguments.py")
    assert doc["launch"]["reason"] is None and "--bf16" in doc["launch"]["text"]
    assert main(["train", *TRAIN, "--plan", "dp=8,tp=8,microbatch=8,remat=full"]) == 0
    assert "Optimizer (not given): adam-fp32-master, Megatron-LM's own" in capsys.readouterr().out
    for stack, opt in (
        ("torchtitan", "adam-fp32"),
        ("maxtext", "adam-fp32"),
        ("ideal", "adam-bf16"),
    ):
        doc = run_json(capsys, "train", *TRAIN[:-1], stack, "--plan", "fsdp=64,microbatch=8")
        assert doc["plan"]["optimizer"] == opt


def test_train_search_shows_the_best_plans_launch(capsys):
    doc = run_json(capsys, "train", *TRAIN, "--optimizer", "adam-fp32-master", "--top", "2")
    assert doc["launch"]["stack"] == "megatron"
    assert (doc["launch"]["text"] is None) == (doc["launch"]["reason"] is not None)


def test_train_with_the_ideal_stack_has_no_launch(capsys):
    doc = run_json(capsys, "train", *TRAIN[:-1], "ideal", "--plan", "dp=64,microbatch=8")
    assert doc["launch"] is None


def test_serve_shows_the_best_plans_launch_and_it_imports_back(capsys, tmp_path):
    load = ["--model", "llama-3-70b", "--system", "h100:16", "--concurrency", "64"]
    doc = run_json(capsys, "serve", *load, "--engine", "vllm")
    back = run_json(capsys, "import", launch_file(tmp_path, doc["launch"]["text"]))
    assert back["plan"]["spec"] == doc["best"]["plan"]["spec"]
    assert back["options"]["weight_dtype"] == doc["best"]["quant"]["weights"]
    assert main(["serve", *load, "--engine", "vllm"]) == 0
    assert "Launch (vllm" in capsys.readouterr().out


def test_serve_on_jetstream_has_no_launch(capsys):
    doc = run_json(
        capsys, "serve", "--model", "llama-3-8b", "--system", "tpu-v5e:2x2", "--concurrency", "8"
    )
    assert doc["launch"] is None


def test_serve_one_step_shows_its_launch_with_the_draft(capsys, tmp_path):
    argv = ["serve", "--model", "deepseek-v3", "--system", "h200:8", "--plan", "tp=1,dp=8,ep=8"]
    argv += ["--batch", "64", "--context", "4096", "--engine", "sglang", "--draft", "3"]
    doc = run_json(capsys, *argv)
    back = run_json(capsys, "import", launch_file(tmp_path, doc["launch"]["text"]))
    assert back["plan"]["spec"] == "tp=1,dp=8,ep=8" and back["options"]["draft"] == "3"


def test_import_refuses_training_flags_for_a_serving_line(capsys, tmp_path):
    f = launch_file(tmp_path, VLLM_70B)
    assert main(["import", f, "--system", "h100:8", "--seq", "4096"]) == 2
    assert "--seq with the serving launch file" in capsys.readouterr().err
