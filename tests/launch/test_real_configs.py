"""Each restated real launch file (tests/data/launch/MANIFEST.md) imports to the plan the
stack's own documentation implies; the numbers are worked from the file's settings and the
stack's documented rules (cited in launch/defaults/<stack>.toml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from roofline.launch import read_launch
from roofline.specs.plan import RematKind, Schedule

DATA = Path(__file__).parents[1] / "data" / "launch"


def load(name: str, chips: int | None = None):
    path = DATA / name
    return read_launch(path.read_text(), source=str(path), chips=chips)


# name, chips given, stack, degrees (dp, fsdp, tp, sp, ep, pp), microbatches, remat, global
# sequences, seq len, precision recipe
CASES = [
    # shard -1 = 128 / 8 = 16; global -1 = 2 × 16; pp = 1 so one pass
    (
        "torchtitan_llama3_405b.toml",
        128,
        "torchtitan",
        (1, 16, 8, 1, 1, 1),
        1,
        RematKind.FULL,
        32,
        8192,
        "float8-tensorwise",
    ),
    (
        "torchtitan_llama3_70b.toml",
        64,
        "torchtitan",
        (1, 8, 8, 1, 1, 1),
        1,
        RematKind.FULL,
        64,
        8192,
        "bf16",
    ),
    (
        "torchtitan_llama3_8b.toml",
        8,
        "torchtitan",
        (1, 8, 1, 1, 1, 1),
        1,
        RematKind.MATMULS,
        8,
        8192,
        "bf16",
    ),
    # 4 per device × 256 = 1024 sequences × 4096 = 4Mi tokens ("4M token global batch")
    (
        "maxtext_llama2_70b_v5p.sh",
        256,
        "maxtext",
        (1, 256, 1, 1, 1, 1),
        1,
        RematKind.MATMULS,
        1024,
        4096,
        "bf16",
    ),
    # ici_fsdp 8 × dcn_fsdp 128; num_slices -1 = the dcn product
    (
        "maxtext_llama3.1_405b_a3_128vm.sh",
        None,
        "maxtext",
        (1, 1024, 1, 1, 1, 1),
        1,
        RematKind.FULL,
        1024,
        8192,
        "bf16",
    ),
    # 128 / (1 × 8) = 16 microbatches; --fp8-format hybrid with the default delayed recipe
    (
        "megatron_llama3_8b_h100_fp8.sh",
        None,
        "megatron",
        (8, 1, 1, 1, 1, 1),
        16,
        RematKind.NONE,
        128,
        8192,
        "fp8-delayed",
    ),
    (
        "megatron_gpt3_175b.sh",
        128,
        "megatron",
        (1, 1, 8, 1, 1, 16),
        1536,
        RematKind.NONE,
        1536,
        2048,
        "bf16",
    ),
    # 24 × 8 = 192 GPUs; dp = 192 / (4 × 12) = 4; 2048 / (2 × 4) = 256
    (
        "megatron_deepspeed_bloom_176b.slurm",
        None,
        "megatron",
        (4, 1, 4, 1, 1, 12),
        256,
        RematKind.FULL,
        2048,
        2048,
        "bf16",
    ),
    (
        "deepspeed_bloom_176b.json",
        4,
        "deepspeed",
        (4, 1, 1, 1, 1, 1),
        256,
        RematKind.NONE,
        2048,
        None,
        "bf16",
    ),
    # 1024 / (4 × 4) = 64 data-parallel; 2048 / 64 = 32
    (
        "nemo_llama2_70b.yaml",
        None,
        "nemo",
        (64, 1, 4, 1, 1, 4),
        32,
        RematKind.NONE,
        2048,
        4096,
        "bf16",
    ),
    (
        "nemo_gpt3_175b.yaml",
        None,
        "nemo",
        (32, 1, 4, 1, 1, 8),
        64,
        RematKind.NONE,
        2048,
        2048,
        "bf16",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_real_config_imports_to_the_documented_plan(case):
    name, chips, stack, degrees, m, remat, seqs, seq_len, recipe = case
    c = load(name, chips)
    d = c.plan.degrees
    assert c.stack == stack
    assert (d.dp, d.fsdp, d.tp, d.sp, d.ep, d.pp) == degrees
    assert c.plan.microbatches == m
    assert c.plan.remat.kind == remat
    assert c.workload.global_batch_sequences == seqs
    assert c.workload.seq_len == seq_len
    assert c.options["precision"] == recipe


def test_torchtitan_405b_reads_async_tp_and_fp32_master_weights():
    c = load("torchtitan_llama3_405b.toml", 128)
    assert c.plan.collective_matmul and c.plan.sequence_parallel
    assert c.plan.optimizer.name == "adam-fp32"  # training.dtype float32 (job_config.py:275)
    assert c.workload.total_tokens == 3000 * 32 * 8192
    assert c.plan.compiled  # [compile] enable = true: fused kernels (issue 19 item 2)


def test_maxtext_on_gpu_is_costed_as_maxtext_not_megatron():
    c = load("maxtext_llama3.1_405b_a3_128vm.sh")
    assert c.options["framework"] == "maxtext"
    assert c.chips == 1024 and c.model == "llama3.1-405b"


def test_maxtext_policy_named_when_only_approximated():
    c = load("maxtext_llama2_70b_v5p.sh", 256)
    assert [u.value for u in c.unsupported if u.key == "remat_policy"] == ["save_dot_except_mlpwi"]


def test_megatron_example_launched_on_too_few_gpus_is_a_problem():
    c = load("megatron_gpt3_175b.sh")
    assert c.chips == 8
    assert any("128 does not divide the 8 GPUs" in p.message for p in c.problems)
    with_chips = load("megatron_gpt3_175b.sh", 128)
    assert any(
        "launcher starts 8 GPUs but --chips gives 128" in p.message for p in with_chips.problems
    )


def test_megatron_fp8_example_keeps_its_distributed_optimizer_and_bf16_grads():
    c = load("megatron_llama3_8b_h100_fp8.sh")
    assert c.plan.zero == 1 and c.chips == 8
    assert c.plan.dtypes.matmul.value == "fp8" and c.plan.dtypes.attention.value == "bf16"
    # --grad-reduce-in-bf16: gradients in bf16 (16 B/param), no longer an unsupported note
    assert c.plan.optimizer.name == "adam-fp32-master-bf16-grads" and c.unsupported == ()


def test_nemo_interleaved_pipeline_and_megatron_sp():
    c = load("nemo_llama2_70b.yaml")
    assert c.plan.schedule == Schedule.INTERLEAVED and c.plan.virtual_stages == 20
    assert c.plan.sequence_parallel and c.plan.zero == 1
    assert c.model == "llama2_70b"


def test_bloom_notes_its_batch_ramp():
    c = load("megatron_deepspeed_bloom_176b.slurm")
    assert [u.key for u in c.unsupported] == ["rampup-batch-size"]
    assert c.plan.zero == 0


def test_every_default_names_the_stack_source():
    for name, chips, *_ in CASES:
        for d in load(name, chips).defaults:
            assert "@" in d.source and ("/" in d.source), d
