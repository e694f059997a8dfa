"""The parser tier: each stack's own configuration code reads roofline's exports and the
restated launch files, and must read the same batch, degrees and precision roofline read.

Run by `bash .ci/parsers.sh` (a venv with torch, DeepSpeed, megatron-core, omegaconf). A
stack whose code is not importable skips with the reason (docs/launch.md lists them);
ROOFLINE_PARSERS_REQUIRE="deepspeed,nemo,megatron" turns those skips into failures.
Megatron-LM's own argument parser (megatron/training/arguments.py) is not in the
megatron-core wheel, so Megatron is judged by Megatron Core's TransformerConfig, which checks
the parallelism, recompute and precision settings the arguments become.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
from pathlib import Path

import pytest
from tests.launch.test_roundtrip import PLANS, config_of

from roofline.launch import read_launch, write_launch

pytestmark = pytest.mark.parsers
DATA = Path(__file__).parents[2] / "data" / "launch"
WHY = {
    "deepspeed.runtime.config": "DeepSpeed is not installed here (bash .ci/parsers.sh builds a venv with it)",
    "omegaconf": "omegaconf (NeMo's YAML loader) is not installed here (bash .ci/parsers.sh)",
    "megatron.core.transformer.transformer_config": "Megatron Core is not installed here (bash .ci/parsers.sh installs megatron-core)",
}
STACK_OF = {
    "deepspeed.runtime.config": "deepspeed",
    "omegaconf": "nemo",
    "megatron.core.transformer.transformer_config": "megatron",
}


def need(module: str):
    required = {s.strip() for s in os.environ.get("ROOFLINE_PARSERS_REQUIRE", "").split(",")}
    try:
        with warnings.catch_warnings():  # the stacks warn at import (no GPU, no Apex)
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except Exception as e:  # an import that fails for any reason: the stack is not usable here
        if STACK_OF[module] in required:
            raise
        pytest.skip(f"{WHY[module]} ({type(e).__name__})")


# ------------------------------------------------------------------------------ DeepSpeed


class _DataParallel:
    """The `mpu` DeepSpeed's config asks for the data-parallel world size."""

    def __init__(self, n: int) -> None:
        self.n = n

    def get_data_parallel_world_size(self) -> int:
        return self.n


def deepspeed_reads(text: str, dp: int, monkeypatch):
    cfg = need("deepspeed.runtime.config")
    monkeypatch.setattr(cfg.dist, "get_rank", lambda *a, **k: 0)
    return cfg.DeepSpeedConfig(json.loads(text), mpu=_DataParallel(dp))


@pytest.mark.parametrize("spec,recipe", PLANS["deepspeed"])
def test_deepspeed_reads_roofline_exports_as_roofline_does(spec, recipe, monkeypatch):
    c = config_of("deepspeed", spec, recipe)
    text = write_launch(c, "deepspeed")
    d = c.plan.degrees
    ds = deepspeed_reads(text, d.dp * d.fsdp, monkeypatch)
    assert ds.train_batch_size == c.workload.global_batch_sequences
    assert ds.gradient_accumulation_steps == c.plan.microbatches
    assert (
        ds.train_micro_batch_size_per_gpu * ds.gradient_accumulation_steps * d.dp * d.fsdp
        == ds.train_batch_size
    )
    assert int(ds.zero_optimization_stage) == (3 if d.fsdp > 1 else c.plan.zero)
    assert ds.bfloat16_config.enabled == (c.plan.dtypes.matmul.value == "bf16")
    assert ds.float16_config.enabled == (c.plan.dtypes.matmul.value == "fp16")


def test_deepspeed_reads_the_restated_bloom_config(monkeypatch):
    text = (DATA / "deepspeed_bloom_176b.json").read_text()
    ours = read_launch(text, source="bloom.json", chips=4)
    ds = deepspeed_reads(text, 4, monkeypatch)
    assert ds.train_batch_size == ours.workload.global_batch_sequences == 2048
    assert ds.gradient_accumulation_steps == ours.plan.microbatches == 256
    assert int(ds.zero_optimization_stage) == ours.plan.zero == 0
    assert ds.bfloat16_config.enabled


# ------------------------------------------------------------------------------ NeMo


def omegaconf_reads(text: str):
    oc = need("omegaconf")
    if not oc.OmegaConf.has_resolver("multiply"):  # NeMo registers this resolver at import
        oc.OmegaConf.register_new_resolver("multiply", lambda x, y: x * y)
    return oc.OmegaConf.create(text)


@pytest.mark.parametrize("name", ["nemo_llama2_70b.yaml", "nemo_gpt3_175b.yaml"])
def test_nemo_files_read_by_omegaconf_as_roofline_reads_them(name):
    text = (DATA / name).read_text()
    cfg = omegaconf_reads(text)
    ours = read_launch(text, source=name)
    m = cfg.model
    assert cfg.trainer.devices * cfg.trainer.num_nodes == ours.chips
    assert m.tensor_model_parallel_size == ours.plan.degrees.tp
    assert m.pipeline_model_parallel_size == ours.plan.degrees.pp
    assert m.virtual_pipeline_model_parallel_size == ours.plan.virtual_stages
    assert m.global_batch_size == ours.workload.global_batch_sequences
    assert m.encoder_seq_length == ours.workload.seq_len


@pytest.mark.parametrize("spec,recipe", PLANS["nemo"])
def test_nemo_exports_load_in_omegaconf(spec, recipe):
    c = config_of("nemo", spec, recipe)
    cfg = omegaconf_reads(write_launch(c, "nemo"))
    d = c.plan.degrees
    assert cfg.trainer.devices * cfg.trainer.num_nodes == d.n_chips
    dp = d.dp * d.fsdp * d.ep
    assert cfg.model.micro_batch_size * dp * c.plan.microbatches == cfg.model.global_batch_size


# ------------------------------------------------------------------------------ Megatron-LM


def megatron_accepts(args: dict) -> object:
    """Megatron Core's own TransformerConfig built from a script's arguments: its
    __post_init__ checks the parallelism, recompute and fp8 settings together."""
    tc = need("megatron.core.transformer.transformer_config")
    torch = pytest.importorskip("torch")
    pp = int(args.get("pipeline-model-parallel-size", 1))
    vp = int(args.get("num-virtual-stages-per-pipeline-rank", 1))
    ep = int(args.get("expert-model-parallel-size", 1))
    tp = int(args.get("tensor-model-parallel-size", 1))
    kw = {
        "num_layers": pp * vp * 2,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "virtual_pipeline_model_parallel_size": vp if vp > 1 else None,
        "context_parallel_size": int(args.get("context-parallel-size", 1)),
        "expert_model_parallel_size": ep,
        "num_moe_experts": 2 * ep if ep > 1 else None,
        # arguments.py:1432-1439 drops sequence parallelism when TP is 1, as roofline's reader does
        "sequence_parallel": bool(args.get("sequence-parallel", False)) and tp > 1,
        "add_bias_linear": False,  # the Llama-style layers of these runs (MoE biases need ETP 1)
        "recompute_granularity": args.get("recompute-granularity"),
        "recompute_method": args.get("recompute-method"),
        "recompute_num_layers": int(args["recompute-num-layers"])
        if "recompute-num-layers" in args
        else None,
        "fp8": args.get("fp8-format"),
        "bf16": bool(args.get("bf16", False)),
        "fp16": bool(args.get("fp16", False)),
        "pipeline_dtype": torch.bfloat16 if pp > 1 else None,
    }
    if "fp8-recipe" in args:
        kw["fp8_recipe"] = args["fp8-recipe"]
    if "fp4-format" in args:
        kw["fp4"] = args["fp4-format"]
    try:
        return tc.TransformerConfig(**kw)
    except TypeError as e:  # a recipe check that asks Transformer Engine's version
        if "Version" not in str(e):
            raise
        pytest.skip("this fp8 recipe is checked against Transformer Engine, which has no CPU build")


def script_args(text: str) -> dict:
    from roofline.launch.megatron import _command, parse_args

    _, words, _ = _command("<script>", text)
    return parse_args(words)


@pytest.mark.parametrize("spec,recipe", PLANS["megatron"])
def test_megatron_core_accepts_every_export(spec, recipe):
    c = config_of("megatron", spec, recipe)
    args = script_args(write_launch(c, "megatron"))
    cfg = megatron_accepts(args)
    d = c.plan.degrees
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (d.tp, d.pp)
    assert cfg.context_parallel_size == d.sp and cfg.expert_model_parallel_size == d.ep
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == c.plan.virtual_stages


@pytest.mark.parametrize(
    "name",
    [
        "megatron_llama3_8b_h100_fp8.sh",
        "megatron_gpt3_175b.sh",
        "megatron_deepspeed_bloom_176b.slurm",
    ],
)
def test_megatron_core_accepts_the_restated_scripts(name):
    text = (DATA / name).read_text()
    args = {k: v for k, v in script_args(text).items() if k != "checkpoint-activations"}
    ours = read_launch(text, source=name)
    cfg = megatron_accepts(args)
    assert cfg.tensor_model_parallel_size == ours.plan.degrees.tp
    assert cfg.pipeline_model_parallel_size == ours.plan.degrees.pp
    assert (cfg.fp8 is not None) == (ours.plan.dtypes.matmul.value == "fp8")
