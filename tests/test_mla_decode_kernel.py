"""An absorbed MLA decode's latent-cache read at the engine's decode kernel's achieved bandwidth
(`mla_decode`, datasheet.toml [trtmla]: SGLang's trtllm_mla backend on Blackwell, from vLLM
#41778's kernel timings at 16 heads per rank): applied where the tensor axis splits the heads,
nowhere else, and to no other engine or chip family."""

from __future__ import annotations

import dataclasses

import pytest

from roofline.serving.inference import PassShape, Quant, ServePlan
from roofline.serving.step import ShardedStep
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import load_profile
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system

FP8 = Quant("fp8", "fp8", "fp8")
ROWS = ("attn/scores", "attn/context")


def at_rate(eff, eta: float = 1.0):
    """`eff` with every family's MLA decode fraction set to `eta` where one is listed (<1)."""
    fams = tuple(
        dataclasses.replace(f, mla_decode=eta if f.mla_decode < 1.0 else 1.0) for f in eff.families
    )
    return dataclasses.replace(eff, families=fams)


def at_full_rate(eff):
    return at_rate(eff, 1.0)


def rows_s(eff, plan: ServePlan, model="deepseek-v3", system="b200:8") -> dict[str, float]:
    step = ShardedStep(load_model(model), [parse_system(system)], [plan], FP8, eff)
    br = step.pass_time(PassShape(decode=64, context=8192)).breakdown
    return {n: float(br[n][0]) for n in ROWS}


def test_only_sglang_on_blackwell_lists_the_kernel_timing():
    base = load_profile("datasheet")
    sgl = base.for_framework("sglang")
    for chip in ("b200", "b300"):
        assert sgl.mla_decode_fraction(load_chip(chip)) == pytest.approx(0.29)
    assert sgl.mla_decode_fraction(load_chip("h200")) == 1.0
    for fw in (None, "vllm", "trtllm"):
        eff = base if fw is None else base.for_framework(fw)
        assert eff.mla_decode_fraction(load_chip("b200")) == 1.0


def test_tensor_parallel_mla_decode_reads_the_latent_at_the_kernel_rate():
    eff = load_profile("datasheet").for_framework("sglang")
    slow, full = rows_s(eff, ServePlan(tp=8)), rows_s(at_full_rate(eff), ServePlan(tp=8))
    half = rows_s(at_rate(eff, 0.145), ServePlan(tp=8))
    # the scores row reads the latent cache (its time: that read at eta's bandwidth plus fixed
    # launch time), so going from eta to eta / 2 adds m / eta, from 1 to eta m (1 / eta - 1)
    n = "attn/scores"
    added_by_halving = half[n] - slow[n]
    assert added_by_halving > 0.5 * slow[n]
    assert slow[n] - full[n] == pytest.approx((1 - 0.29) * added_by_halving, rel=1e-9)
    # the context row reuses the scores' read (compute-bound here): never faster for it
    assert full["attn/context"] <= slow["attn/context"] <= half["attn/context"]


def test_attention_data_parallel_and_dense_attention_are_untouched():
    eff = load_profile("datasheet").for_framework("sglang")
    dp = ServePlan(tp=1, dp=8, ep=8)  # DeepSeek's DP attention: all 128 heads on each rank
    assert rows_s(eff, dp) == rows_s(at_full_rate(eff), dp)
    gqa = ServePlan(tp=8)  # no absorbed MLA: the fraction is never read
    assert rows_s(eff, gqa, "llama-3-70b") == rows_s(at_full_rate(eff), gqa, "llama-3-70b")
