"""Each source's FLOP convention, checked three ways: the closed form by hand, the worked
number the source itself prints, and the source's own pair of metrics (tokens/s and TFLOP/s
or MFU of the same run must convert to the same tokens/s)."""

from __future__ import annotations

import pytest

from roofline.specs.model import MLPKind, ModelSpec
from roofline.validate.conventions import CONVENTIONS, DOCUMENT_CONVENTION, from_flops
from roofline.validate.dims import build_model
from roofline.validate.training_runs import map_training_run

LLAMA31_8B = ModelSpec("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256, MLPKind.GATED)
LLAMA31_70B = ModelSpec("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 128256, MLPKind.GATED)
GPT3_175B = ModelSpec("gpt-3", 96, 12288, 49152, 96, 96, 128, 51200, MLPKind.PLAIN)


def fpt(key: str, m: ModelSpec, seq: int, params: float | None = None) -> float:
    return CONVENTIONS[key].flops_per_token(m, seq, params)


def test_megatron_2024_closed_form():
    # 12·L·h²·[(1 + K/N + s/h)·1 + F/h·3/2 + V/(2Lh)] for LLaMA-3.1 8B at s = 8192, by hand:
    L, h, s, F, V = 32, 4096, 8192, 14336, 128256
    hand = 12 * L * h * h * ((1 + 8 / 32 + s / h) + F / h * 1.5 + V / (2 * L * h))
    assert fpt("megatron-2024", LLAMA31_8B, s) == pytest.approx(hand, rel=1e-12)


@pytest.mark.parametrize(
    "model,seq_flops",
    [(LLAMA31_8B, 4.74e14), (LLAMA31_70B, 3.94e15)],
    ids=["llama3.1-8b", "llama3.1-70b"],
)
def test_megatron_2024_matches_dgx_cloud_worked_numbers(model, seq_flops):
    """NVIDIA dgxc-benchmarking v24.11.1 READMEs print model FLOPs per sequence (GBS=1)."""
    assert fpt("megatron-2024", model, 8192) * 8192 == pytest.approx(seq_flops, rel=0.005)


def test_megatron_2024_nemotron4_340b_worked_number():
    """nemotron/README_340b.md: 1.01e16 FLOPs per 4096-token sequence — the formula applied in
    MHA form (K/N = 1) with a 4h plain MLP. The model itself has 8 query groups (the recipe's
    config, public_dims.toml), which the same formula counts at 8.6e15: the README's MFU
    overstates the FLOPs by 17%, so its MFU converts to throughput in the MHA form."""
    from roofline.validate.conventions import convention_model

    built = build_model(
        {"name": "Nemotron-4 340B", "layers": 96, "d_model": 18432, "vocab": 256000}, "x"
    )
    s = built.spec
    assert s is not None and s.mlp == MLPKind.PLAIN and (s.n_heads, s.n_kv_heads) == (96, 8)
    mha, why = convention_model("dgx-cloud", s)
    assert mha.n_kv_heads == 96 and "README_340b" in why
    assert convention_model("nemo", s) == (s, "")
    assert fpt("megatron-2024", mha, 4096) * 4096 == pytest.approx(1.01e16, rel=0.005)
    assert fpt("megatron-2024", s, 4096) * 4096 == pytest.approx(8.62e15, rel=0.005)


def test_megatron_2025_halves_causal_attention():
    full, half = fpt("megatron-2024", LLAMA31_8B, 8192), fpt("megatron-2025", LLAMA31_8B, 8192)
    attn_full = 12 * 32 * 8192 * 4096  # 12·L·s·(N·H)
    assert full - half == pytest.approx(attn_full / 2, rel=1e-9)


def test_narayanan_includes_recompute():
    """eq. 3 is 4/3 of the no-recompute count 72·L·h²·(1 + s/6h) + 6·V·h."""
    m = build_model({"layers": 24, "d_model": 2304, "heads": 24, "vocab": 51200}, "x").spec
    L, h, s, V = 24, 2304, 2048, 51200
    no_recompute = 72 * L * h * h * (1 + s / (6 * h)) + 6 * V * h * 1.0
    assert fpt("narayanan2021", m, s) == pytest.approx(
        4 / 3 * 72 * L * h * h * (1 + s / (6 * h)) + 96 * L * h * h * V / (16 * L * h), rel=1e-12
    )
    assert fpt("narayanan2021", m, s) > no_recompute * 1.3


def test_maxtext_and_mpt_conventions_use_the_published_parameter_count():
    m = GPT3_175B
    assert fpt("maxtext-6n", m, 2048, 1e9) == 6e9
    attn = 12 * 96 * 96 * 128 * 2048
    assert fpt("maxtext-6n-attn", m, 2048, 1e9) == pytest.approx(6e9 + attn)
    assert fpt("maxtext-6n-causal", m, 2048, 1e9) == pytest.approx(6e9 + attn / 2)
    assert fpt("mpt", m, 2048, 1e9) == pytest.approx(6e9 + 6 * 96 * 2 * 12288 * 2048)


def test_mpt_convention_reproduces_the_published_pair():
    """MPT-7B on 8 H100: 459 TFLOP/s and 10,643 tokens/s per GPU (llm-foundry table)."""
    got = from_flops(
        {"tflops_per_chip": 459},
        CONVENTIONS["mpt"],
        GPT3_175B.with_(
            name="mpt-7b",
            n_layers=32,
            d_model=4096,
            d_ff=16384,
            n_heads=32,
            n_kv_heads=32,
            d_head=128,
            vocab=50368,
        ),
        2048,
        6658859008,
        989e12,
    )
    assert got is not None and got.tokens_per_s_per_chip == pytest.approx(10643, rel=0.005)


def test_every_document_convention_exists():
    assert set(DOCUMENT_CONVENTION.values()) <= set(CONVENTIONS)


def _pairs(entries):
    """(run id, check) for every run whose source publishes two metrics of the same run."""
    out = []
    for rid, e in entries.items():
        run = map_training_run(e)
        moe = run.inputs is not None and run.inputs.model.moe is not None
        for c in run.checks:
            if not moe and not (run.measured and run.measured.assumed):
                out.append((rid, c))
    return out


def test_published_metric_pairs_agree_under_each_sources_convention(training_entries):
    """NeMo, Megatron-Bridge, MaxText tiering, llm-foundry, DGX Cloud, MaxText and Megatron-LM
    READMEs (tokens vs TFLOP/s vs MFU): each source's own formula reconciles its own numbers."""
    pairs = _pairs(training_entries)
    assert len(pairs) >= 45
    bad = [
        (rid, c["metric"], round(c["vs_used"], 4)) for rid, c in pairs if abs(c["vs_used"]) > 0.02
    ]
    assert not bad, bad


def test_fp8_mfu_is_against_the_fp8_peak_where_the_source_says_so(training_entries):
    run = map_training_run(training_entries["dgxc-2411-llama3.1-8b-fp8-8gpu"])
    (check,) = run.checks
    assert check["metric"] == "mfu_pct" and abs(check["vs_used"]) < 0.01
