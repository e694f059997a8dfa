"""The parser tier, serving engines: vLLM's and SGLang's own argument parsers read every restated
serving launch line and every export, and must read the degrees, limits and dtypes roofline read.

vLLM 0.33.0 (`make_arg_parser`, with VLLM_TARGET_DEVICE=cpu) and SGLang 0.4.10
(`ServerArgs.add_cli_args`, its pure-Python wheel) import on a CPU-only machine; `bash
.ci/parsers.sh` installs them (with --no-deps and the modules their imports need). TensorRT-LLM
does not: `tensorrt_llm` loads the CUDA / TensorRT libraries at import, so trtllm-serve's options
are checked against its defaults table (tests/launch/test_serving_tables.py) only.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tomllib
import warnings
from pathlib import Path

import pytest

from roofline.launch import read_launch, write_launch
from roofline.launch.base import LaunchWorkload
from roofline.launch.serving_common import command_words, from_serve, load_table

pytestmark = pytest.mark.parsers
DATA = Path(__file__).parents[2] / "data" / "launch" / "serving"
CASES = tomllib.loads((DATA / "MANIFEST.toml").read_text())["case"]
WHY = {
    "vllm": "vLLM is not installed here (bash .ci/parsers.sh installs vllm 0.33.0 --no-deps)",
    "sglang": "SGLang is not installed here (bash .ci/parsers.sh installs sglang 0.4.10 --no-deps)",
}
# roofline's canonical flag -> the engine parser's dest
DEST = {
    "vllm": {
        "--tensor-parallel-size": "tensor_parallel_size",
        "--pipeline-parallel-size": "pipeline_parallel_size",
        "--data-parallel-size": "data_parallel_size",
        "--enable-expert-parallel": "enable_expert_parallel",
        "--max-num-seqs": "max_num_seqs",
        "--max-num-batched-tokens": "max_num_batched_tokens",
        "--max-model-len": "max_model_len",
        "--kv-cache-dtype": "kv_cache_dtype",
        "--quantization": "quantization",
    },
    "sglang": {
        "--model-path": "model_path",
        "--tp-size": "tensor_parallel_size",
        "--dp-size": "data_parallel_size",
        "--pp-size": "pipeline_parallel_size",
        "--ep-size": "expert_parallel_size",
        "--enable-dp-attention": "enable_dp_attention",
        "--max-running-requests": "max_running_requests",
        "--chunked-prefill-size": "chunked_prefill_size",
        "--context-length": "context_length",
        "--kv-cache-dtype": "kv_cache_dtype",
        "--quantization": "quantization",
        "--speculative-num-steps": "speculative_num_steps",
        "--speculative-algorithm": "speculative_algorithm",
    },
}


def _parser(stack: str) -> argparse.ArgumentParser:
    required = {s.strip() for s in os.environ.get("ROOFLINE_PARSERS_REQUIRE", "").split(",")}
    try:
        with warnings.catch_warnings():  # the engines' own imports warn (deprecations)
            warnings.simplefilter("ignore")
            return _engine_parser(stack)
    except Exception as e:  # any import failure: the engine is not usable here
        if stack in required:
            raise
        pytest.skip(f"{WHY[stack]} ({type(e).__name__})")


def _engine_parser(stack: str) -> argparse.ArgumentParser:
    if stack == "vllm":
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
        cli_args = importlib.import_module("vllm.entrypoints.common.cli_args")
        return cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser(prog="vllm serve"))
    server_args = importlib.import_module("sglang.srt.server_args")
    p = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(p)
    return p


def _same(cfg, ns, stack: str) -> None:
    """Every setting roofline read that the engine's parser has agrees with the parser."""
    for flag, dest in DEST[stack].items():
        if flag not in cfg.settings:
            continue
        mine, theirs = cfg.settings[flag], getattr(ns, dest)
        if isinstance(theirs, bool) or theirs is None:
            assert bool(mine) == bool(theirs), flag
        else:
            assert str(theirs) == str(mine) or str(theirs) == str(_human(mine)), (
                flag,
                mine,
                theirs,
            )
    if stack == "vllm":
        assert ns.model_tag == cfg.model
        spec = ns.speculative_config or {}
        if "num_speculative_tokens" in spec:
            assert str(spec["num_speculative_tokens"]) == cfg.options["draft"]


def _human(v):
    from roofline.launch.serving_common import human_int

    try:
        return human_int(v)
    except ValueError:
        return v


def _parse(stack: str, text: str):
    words, _ = command_words(text, load_table(stack), "t")
    try:
        return _parser(stack).parse_args(words)
    except SystemExit:
        pytest.fail(f"{stack}'s own parser rejects: {' '.join(words)}")


@pytest.mark.parametrize("case", [c for c in CASES if c["stack"] in DEST], ids=lambda c: c["file"])
def test_the_engines_parser_reads_the_restated_files_as_roofline_does(case):
    text = (DATA / case["file"]).read_text()
    if case["stack"] == "vllm" and "--swap-space" in text:
        pytest.skip("written for vLLM 0.14 (ROCm): --swap-space left vLLM before 0.33")
    cfg = read_launch(text, stack=case["stack"])
    _same(cfg, _parse(case["stack"], text), case["stack"])


PLANS = [
    ("deepseek-ai/DeepSeek-V3", "tp=1,dp=8,ep=8", 8, {"draft": 2}),
    ("deepseek-ai/DeepSeek-V3", "tp=8,ep=8", 16, {}),
    (
        "llama-3.1-70b",
        "tp=4,pp=2",
        16,
        {"weight_dtype": "fp8", "compute_dtype": "fp8", "kv_dtype": "fp8"},
    ),
    ("mixtral-8x7b", "tp=2,dp=2,ep=4", 4, {}),
]


@pytest.mark.parametrize("stack", sorted(DEST))
@pytest.mark.parametrize("model, plan, chips, opts", PLANS)
def test_the_engines_parser_reads_every_export(stack, model, plan, chips, opts):
    from roofline.serving.inference import parse_serve_plan

    work = LaunchWorkload(max_num_seqs=64, max_batched_tokens=4096, max_model_len=8192)
    cfg = from_serve(
        stack,
        model=model,
        plan=parse_serve_plan(plan).to_dict(),
        chips=chips,
        workload=work,
        **opts,
    )
    text = write_launch(cfg, stack)
    again = read_launch(text, stack=stack)
    _same(again, _parse(stack, text), stack)
    assert dict(again.serve_plan) == dict(cfg.serve_plan)
