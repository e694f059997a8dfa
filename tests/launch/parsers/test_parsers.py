"""The parser tier: each stack's own configuration code reads roofline's exports and the
restated launch files, and must read the same batch, degrees and precision roofline read.

Run by `bash .ci/parsers.sh` (a venv with torch, DeepSpeed, megatron-core, omegaconf). A
stack whose code is not importable skips with the reason (docs/launch.md lists them);
ROOFLINE_PARSERS_REQUIRE="deepspeed,nemo" turns those skips into failures.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest
from tests.launch.test_roundtrip import PLANS, config_of

from roofline.launch import read_launch, write_launch

pytestmark = pytest.mark.parsers
DATA = Path(__file__).parents[2] / "data" / "launch"
WHY = {
    "deepspeed.runtime.config": "DeepSpeed is not installed here (bash .ci/parsers.sh builds a venv with it)",
    "omegaconf": "omegaconf (NeMo's YAML loader) is not installed here (bash .ci/parsers.sh)",
    "megatron.training.arguments": "Megatron-LM's training argument parser is not importable: the megatron-core wheel ships megatron.core only",
}
STACK_OF = {
    "deepspeed.runtime.config": "deepspeed",
    "omegaconf": "nemo",
    "megatron.training.arguments": "megatron",
}


def need(module: str):
    required = {s.strip() for s in os.environ.get("ROOFLINE_PARSERS_REQUIRE", "").split(",")}
    try:
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
    assert ds.bfloat16_enabled == (c.plan.dtypes.matmul.value == "bf16")


def test_deepspeed_reads_the_restated_bloom_config(monkeypatch):
    text = (DATA / "deepspeed_bloom_176b.json").read_text()
    ours = read_launch(text, source="bloom.json", chips=4)
    ds = deepspeed_reads(text, 4, monkeypatch)
    assert ds.train_batch_size == ours.workload.global_batch_sequences == 2048
    assert ds.gradient_accumulation_steps == ours.plan.microbatches == 256
    assert int(ds.zero_optimization_stage) == ours.plan.zero == 0
    assert ds.bfloat16_enabled


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


@pytest.mark.parametrize("spec,recipe", PLANS["megatron"])
def test_megatron_argument_parser_reads_exports(spec, recipe, monkeypatch):
    arguments = need("megatron.training.arguments")
    from roofline.launch.megatron import _command

    c = config_of("megatron", spec, recipe)
    _, words, _ = _command("<export>", write_launch(c, "megatron"))
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *words])
    args = arguments.parse_args(ignore_unknown_args=True)
    d = c.plan.degrees
    assert args.tensor_model_parallel_size == d.tp
    assert args.pipeline_model_parallel_size == d.pp
    assert args.context_parallel_size == d.sp
    assert args.global_batch_size == c.workload.global_batch_sequences
