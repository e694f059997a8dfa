"""Routed-expert GEMMs at decode: a fixed memory-side cost per touched expert (`expert_fixed_s`).

The datasheet profile derives the constant from two published benchmarks of the Triton fused_moe
kernel (datasheet.toml [moeh], [moeb]) and sets it for the engines that run that kernel (vLLM;
SGLang on Hopper; SGLang on Blackwell runs FP8 experts through flashinfer_trtllm instead,
datasheet.toml [sgl11816]/[sgl13489]); here the walk's priced expert rows reproduce those kernel times on the shapes that were
measured, and the added time has its closed form (touched experts x expert_fixed_s per
expert-GEMM row, touched = E(1 - (1 - k/E)^T) per chip).
"""

from __future__ import annotations

import dataclasses

import pytest

from roofline.core.ledger import expected_distinct_experts
from roofline.serving.inference import PassShape, Quant, ServePlan
from roofline.serving.step import ShardedStep
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import load_profile
from roofline.specs.model import ModelSpec, MoESpec
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system

EXPERT_ROWS = ("moe/gate", "moe/up", "moe/down")
FP8 = Quant("fp8", "fp8", "fp8")

# Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B config.json): 94 layers, hidden 4096, 64 / 4 heads x 128,
# 128 experts, top-8, moe_intermediate_size 1536, vocab 151936; every layer MoE.
QWEN3_235B = ModelSpec(
    name="qwen3-235b-a22b",
    n_layers=94,
    d_model=4096,
    d_ff=12288,
    n_heads=64,
    n_kv_heads=4,
    d_head=128,
    vocab=151936,
    moe=MoESpec(n_experts=128, top_k=8, d_ff_expert=1536),
)


# Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): 48 layers, hidden 2048, 32 / 4 heads x 128,
# 128 experts, top-8, moe_intermediate_size 768, vocab 151936; every layer MoE.
QWEN3_30B = ModelSpec(
    name="qwen3-30b-a3b",
    n_layers=48,
    d_model=2048,
    d_ff=6144,
    n_heads=32,
    n_kv_heads=4,
    d_head=128,
    vocab=151936,
    moe=MoESpec(n_experts=128, top_k=8, d_ff_expert=768),
)


def expert_time_per_layer(model, system: str, tokens: int, eff) -> float:
    """Seconds of the three expert-GEMM rows of one MoE layer in a decode pass of `tokens`
    (tensor parallel over every chip of `system`)."""
    tp = int(system.split(":")[1])
    step = ShardedStep(model, [parse_system(system)], [ServePlan(tp=tp)], FP8, eff)
    br = step.pass_time(PassShape(decode=tokens, context=1024)).breakdown
    moe_layers = model.n_layers - model.moe.dense_layers
    return sum(float(br[n][0]) for n in EXPERT_ROWS) / moe_layers


def triton_moe_profile():
    """The datasheet profile as an engine running the Triton fused_moe kernel on Hopper and
    Blackwell sees it (vLLM; the [moeb] timing is SGLang's Triton run on B200, the kernel SGLang
    itself replaced there by flashinfer_trtllm)."""
    return load_profile("datasheet").for_framework("vllm")


def without_expert_cost(eff, family: str):
    fam = next(f for f in eff.families if f.family == family)
    return dataclasses.replace(
        eff,
        families=tuple(
            dataclasses.replace(f, expert_fixed_s=0.0) if f is fam else f for f in eff.families
        ),
    )


# (model, system, family, tokens, measured fused_moe kernel time in s) -- datasheet.toml sources
CASES = [
    (QWEN3_235B, "h200:8", "hopper", 16, 92.36e-6),  # [moeh] sglang #11730, H200, TP=8
    (QWEN3_235B, "h200:8", "hopper", 32, 124.99e-6),
    ("deepseek-v3", "b200:8", "blackwell", 16, 138.68e-6),  # [moeb] sglang #11816, B200, TP=8
    ("deepseek-v3", "b200:8", "blackwell", 24, 175.80e-6),
    # a third chip and shape the constant was not derived from: vLLM #24700 ("Main" column),
    # Qwen3-30B-A3B FP8 W8A8 on one H100 (E=128, N=768)
    (QWEN3_30B, "h100:1", "hopper", 16, 185.40e-6),
    (QWEN3_30B, "h100:1", "hopper", 32, 238.37e-6),
    (QWEN3_30B, "h100:1", "hopper", 64, 262.73e-6),
]


@pytest.mark.parametrize(("model", "system", "family", "tokens", "measured"), CASES)
def test_expert_rows_reproduce_the_measured_fused_moe_kernel(
    model, system, family, tokens, measured
):
    m = load_model(model) if isinstance(model, str) else model
    eff = triton_moe_profile()
    got = expert_time_per_layer(m, system, tokens, eff)
    assert got == pytest.approx(measured, rel=0.08)
    # without the per-expert cost the rows are a bandwidth bound 20-40% below the measurement
    bare = expert_time_per_layer(m, system, tokens, without_expert_cost(eff, family))
    assert bare < 0.85 * measured


@pytest.mark.parametrize("tokens", [1, 4, 64])
def test_added_time_is_touched_experts_times_the_constant(tokens):
    m = load_model("deepseek-v3")
    eff = triton_moe_profile()
    chip = load_chip("b200")
    c = eff.expert_overhead_s(chip)
    assert c == pytest.approx(1.5e-7)
    with_c = expert_time_per_layer(m, "b200:8", tokens, eff)
    bare = expert_time_per_layer(m, "b200:8", tokens, without_expert_cost(eff, "blackwell"))
    touched = expected_distinct_experts(256, 8, tokens)  # ep = 1: every chip holds all 256
    # memory-bound at decode: max(compute, memory) moves by the whole added memory time
    assert with_c - bare == pytest.approx(len(EXPERT_ROWS) * touched * c, rel=1e-6)


def test_only_the_engines_that_run_the_triton_kernel_pay_it():
    base = load_profile("datasheet")
    for chip in (load_chip("h200"), load_chip("b200")):
        assert base.expert_overhead_s(chip) == 0.0  # no engine named: no kernel assumed
        assert base.for_framework("trtllm").expert_overhead_s(chip) == 0.0  # own CUTLASS MoE
        assert base.for_framework("vllm").expert_overhead_s(chip) == pytest.approx(1.5e-7)
    assert base.for_framework("vllm").expert_overhead_s(load_chip("a100-40gb")) == 0.0
    # SGLang: Triton on Hopper; on Blackwell (SM100) its `auto` MoE runner is flashinfer_trtllm
    # for FP8 checkpoints (sglang #11816 DeepSeek, #13489 Qwen3-MoE family): nothing charged
    sgl = base.for_framework("sglang")
    assert sgl.expert_overhead_s(load_chip("h200")) == pytest.approx(1.5e-7)
    for chip in ("b200", "b300"):
        assert sgl.expert_overhead_s(load_chip(chip)) == 0.0


def test_four_bit_expert_weights_run_other_kernels_and_pay_nothing():
    m = load_model("deepseek-v3")
    eff = triton_moe_profile()
    fp4 = Quant("nvfp4", "fp8", "nvfp4")
    step = ShardedStep(m, [parse_system("b200:8")], [ServePlan(tp=8)], fp4, eff)
    bare_eff = without_expert_cost(eff, "blackwell")
    bare = ShardedStep(m, [parse_system("b200:8")], [ServePlan(tp=8)], fp4, bare_eff)
    shape = PassShape(decode=16, context=1024)
    assert float(step.pass_time(shape).time_s[0]) == pytest.approx(
        float(bare.pass_time(shape).time_s[0])
    )
