"""Efficiency profiles: the contract (constant profiles keep today's numbers), the physics in
closed form, the shipped datasheet profile against the published measurements it cites, and
the file format's checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from roofline.errors import SpecError, UnknownNameError
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import (
    DEFAULTS,
    PARAMS,
    PEAK,
    TIERS,
    Efficiency,
    default_efficiency,
    expected_tiles,
    load_efficiency,
    load_profile,
    profile_from_dict,
    profile_names,
)

H100, A100, V5P, V5E = (load_chip(c) for c in ("h100", "a100", "tpu-v5p", "tpu-v5e"))


def family_table(**over):
    t = {
        "match": ["h100"],
        "tile": [128, 128, 64],
        "mm_fraction": {"bf16": 0.8, "fp8": 0.7},
        "k_half": 0.0,
        "hbm": 0.85,
        "vector": 0.6,
        "link": {"nvlink": 0.75},
    }
    t.update(over)
    return t


def physics(**over) -> Efficiency:
    return profile_from_dict(
        {
            "name": "t",
            "matmul": 0.5,
            "hbm": 0.5,
            "link": 0.5,
            "family": {"h": family_table(**over)},
        },
        "test",
    )


# -- the contract: constant profiles are today's numbers ------------------------------------


def test_constant_profile_methods_return_its_constants():
    e = Efficiency("x", 0.7, 0.6, 0.5, "s")
    m = np.array([1, 64, 4096, 1e6])
    assert np.all(e.matmul_fraction(H100, "bf16", m, 8192, 8192) == 0.7)
    assert np.all(e.matmul_fraction(H100, "fp8", m, 3, 5, grouped=True) == 0.7)
    assert np.all(e.attention_fraction(H100, "bf16", [True, False], 128, True) == 0.7)
    assert e.hbm_fraction(H100) == 0.6 and e.vector_fraction(V5P) == 0.6
    assert all(e.link_fraction(H100, t) == 0.5 for t in TIERS)
    assert e.step_overhead_s == 0 and e.layer_overhead_s == 0 and e.calibrated is False
    assert e.matmul_fraction(H100, "bf16", 10, 10, 10).shape == ()


def test_old_constants_unchanged():
    assert (DEFAULTS["nvidia"].matmul, DEFAULTS["nvidia"].hbm, DEFAULTS["nvidia"].link) == (
        0.8,
        0.9,
        0.8,
    )
    assert (DEFAULTS["google"].matmul, DEFAULTS["google"].hbm, DEFAULTS["google"].link) == (
        0.9,
        0.9,
        0.9,
    )
    assert default_efficiency("amd") is DEFAULTS["nvidia"]
    assert PEAK.matmul == PEAK.hbm == PEAK.link == 1.0
    peak = load_profile("peak")
    assert (
        peak.matmul_fraction(V5E, "bf16", 8, 8, 8) == 1.0 and peak.link_fraction(H100, "dcn") == 1.0
    )


def test_old_format_file_loads(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('matmul = 0.6\nhbm = 0.7\nlink = 0.65\nsource = "measured"\n')
    e = load_efficiency(f)
    assert (e.name, e.matmul, e.hbm, e.link) == ("mine", 0.6, 0.7, 0.65)
    assert load_profile(str(f)) == e


def test_to_dict_says_which_profile_and_whether_measured():
    d = load_profile("datasheet").to_dict()
    assert d["name"] == "datasheet" and d["calibrated"] is False and d["kind"] == "datasheet-only"
    assert "hopper" in d["families"] and d["families"]["hopper"][
        "mm_fraction.bf16"
    ] == pytest.approx(0.803)
    cal = Efficiency("c", 0.5, 0.5, 0.5, calibrated=True)
    assert cal.to_dict()["kind"] == "measured-calibrated" and "measured" in cal.describe()


# -- the physics in closed form ---------------------------------------------------------------


def test_large_aligned_gemm_reaches_the_ceiling_times_k_rolloff():
    e = physics(k_half=256.0)
    m, n, k = 128 * 132 * 4, 128 * 8, 64 * 100  # whole tiles; items a multiple of 132 SMs
    assert float(e.matmul_fraction(H100, "bf16", m, n, k)) == pytest.approx(0.8 * k / (k + 256.0))
    # k_half is a time: in fp8 (twice bf16's rate on H100) it is twice the k elements
    kh = 256.0 * H100.peak("fp8") / H100.peak("bf16")
    assert float(e.matmul_fraction(H100, "fp8", m, n, k)) == pytest.approx(0.7 * k / (k + kh))


def test_tile_quantisation():
    e = physics()
    base = float(e.matmul_fraction(H100, "bf16", 128 * 132, 1024, 4096))
    one_more = float(e.matmul_fraction(H100, "bf16", 128 * 132, 1025, 4096))
    # n=1025 needs 9 tiles of 128 where 1024 needs 8; the work items then fill the SMs differently
    items = 132 * 9 * 64
    wave = items / (math.ceil(items / 132) * 132)
    assert one_more == pytest.approx(base * (1025 / (9 * 128)) * wave)


def test_wave_quantisation_over_work_items():
    e = physics()
    # 1 tile x 1 k step = 1 work item on a 132-SM chip: 1/132 of the chip
    assert float(e.matmul_fraction(H100, "bf16", 128, 128, 64)) == pytest.approx(0.8 / 132)
    # 133 items: 2 waves, 133/264 of the chip
    assert float(e.matmul_fraction(H100, "bf16", 128, 128, 64 * 133)) == pytest.approx(
        0.8 * 133 / 264
    )


def test_grouped_fraction_and_kernel_overhead():
    e = physics(grouped_fraction=0.5, kernel_fixed_s=1e-6)
    m, n, k = 128 * 132, 1024, 6400
    got = e.matmul_fraction(H100, "bf16", m, n, k, grouped=[False, True])
    # the fixed time is not inside the fraction; the experts' counts around m = 132 whole tiles
    # leave partial tiles (test_routed_expert_tiles)
    fill = m / (poisson_ceil_mean(m, 128) * 128)
    np.testing.assert_allclose(got, [0.8, 0.4 * fill])
    assert e.kernel_overhead_s(H100) == 1e-6 and e.kernel_overhead_s(V5P) == 0.0
    assert PEAK.kernel_overhead_s(H100) == 0.0


def poisson_ceil_mean(lam: float, t: int) -> float:
    """E[ceil(X / t)], X ~ Poisson(lam), summed exactly over the pmf (log-space)."""
    hi = int(lam + 12 * math.sqrt(lam) + 20)
    return sum(
        math.ceil(x / t) * math.exp(x * math.log(lam) - lam - math.lgamma(x + 1))
        for x in range(1, hi)
    )


@pytest.mark.parametrize(
    "lam,t",
    [(256.0, 128), (128.0, 128), (170.7, 128), (16.0, 16), (0.5, 8)]
    + [(601.0, 128), (640.0, 640), (700.0, 16), (3000.0, 64)],  # the normal approximation
)
def test_expected_tiles_is_the_poisson_mean_of_whole_tiles(lam, t):
    assert float(expected_tiles(lam, t)) == pytest.approx(poisson_ceil_mean(lam, t), rel=3e-3)
    # vectorised: each element its own mean, exact and approximated side by side
    got = expected_tiles(np.array([lam, 4.0, 5000.0]), t)
    assert got[1] == pytest.approx(poisson_ceil_mean(4.0, t), rel=1e-6)


def test_routed_expert_tiles():
    """A grouped expert GEMM computes each expert's tokens in whole token tiles (vLLM fused_moe's
    moe_align_block_size pads each expert's count to the block): at a mean of exactly two tiles
    per expert the experts above the mean pay a third, partial tile."""
    e = physics(grouped_fraction=1.0)
    n, k = 1024, 6400
    dense, grouped = e.matmul_fraction(H100, "bf16", 256, n, k, grouped=[False, True])
    assert grouped / dense == pytest.approx(256 / (poisson_ceil_mean(256.0, 128) * 128), rel=2e-3)
    assert 0.78 < grouped / dense < 0.82  # E[ceil(X/128)] = 2.49 tiles for 2 tiles' tokens
    # many tiles per expert: the partial tiles vanish; a mean that already pays a partial tile
    # (m = 170: 2 tiles for 1.33 tiles' tokens) pays about the same on average
    big = e.matmul_fraction(H100, "bf16", 128 * 400, n, k, grouped=[False, True])
    assert big[1] / big[0] > 0.99
    odd = e.matmul_fraction(H100, "bf16", 170.0, n, k, grouped=[False, True])
    assert odd[1] / odd[0] == pytest.approx(1.0, abs=0.01)
    # never better than the dense GEMM of the mean count
    m = np.geomspace(1, 1e5, 40)
    g = e.matmul_fraction(H100, "bf16", m, n, k, grouped=True)
    assert np.all(g <= e.matmul_fraction(H100, "bf16", m, n, k) + 1e-12)


def test_vectorised_and_monotone_in_size():
    p = load_profile("datasheet")
    m = np.array([256, 1024, 4096, 16384])
    f = p.matmul_fraction(H100, "bf16", m[:, None], 8192, np.array([512, 2048, 8192]))
    assert f.shape == (4, 3)
    assert np.all(np.diff(f, axis=1) > 0)  # more k, closer to the ceiling
    assert np.all(f <= 0.803 + 1e-12) and np.all(f > 0)


def test_attention_closed_form():
    e = physics(attn_fwd=0.9, attn_bwd=0.6, attn_softmax_flops=200.0, attn_causal=0.8)
    got = e.attention_fraction(H100, "bf16", [False, True, False], 128, [False, False, True])
    want = [0.9 * 512 / 712, 0.6 * 1280 / 1480, 0.8 * 0.9 * 512 / 712]
    np.testing.assert_allclose(got, want)
    # fp8 attention keeps the kernel's efficiency scaled as fp8 GEMMs reach their own peak
    assert float(e.attention_fraction(H100, "fp8", False, 128, False)) == pytest.approx(
        want[0] * 0.7 / 0.8
    )


def test_attention_head_dim_fills_the_systolic_array():
    # book tpus.md: operands are padded to the MXU side (128; 256 on v6e) in every dimension, so
    # a contraction over head_dim 128 fills half of v6e's 256x256 MXU and all of v5p's 128x128
    # one: QK^T (half the forward's matmul FLOPs) runs at half speed, PV at full speed
    V6E = load_chip("tpu-v6e")
    p = load_profile("datasheet")
    fam6, fam5 = p.family_for(V6E), p.family_for(V5P)
    assert (fam6.head_dim_tile, fam5.head_dim_tile) == (256, 128)
    for chip in (V6E, V5P):
        at = {hd: float(p.attention_fraction(chip, "bf16", False, hd, False)) for hd in (128, 256)}
        mm = {hd: 4 * hd / (4 * hd + 128) for hd in (128, 256)}  # the softmax term alone
        speed = 1 / (0.5 + 0.5 / 0.5) if chip is V6E else 1.0  # = 2/3 on v6e
        assert at[128] / at[256] == pytest.approx(speed * mm[128] / mm[256])
    bwd = {hd: float(p.attention_fraction(V6E, "bf16", True, hd, False)) for hd in (128, 256)}
    mm_b = {hd: 10 * hd / (10 * hd + 128) for hd in (128, 256)}
    assert bwd[128] / bwd[256] == pytest.approx(mm_b[128] / mm_b[256] / (0.6 + 0.4 / 0.5))
    # no head_dim_tile (GPUs): nothing lost to padding
    e = physics(attn_fwd=0.9, attn_softmax_flops=0.0)
    assert float(e.attention_fraction(H100, "bf16", False, 96, False)) == pytest.approx(0.9)
    with pytest.raises(SpecError, match="head_dim_tile"):
        physics(head_dim_tile=0)


def test_memory_and_link_fractions():
    e = physics()
    assert e.hbm_fraction(H100) == 0.85 and e.vector_fraction(H100) == 0.6
    assert e.link_fraction(H100, "nvlink") == 0.75
    assert e.link_fraction(H100, "scale-out") == 0.5  # not in the family: the profile's constant
    assert e.hbm_fraction(V5P) == 0.5  # no family covers v5p: the constants
    with pytest.raises(SpecError, match="link tier"):
        e.link_fraction(H100, "pcie")


# -- the shipped datasheet profile against the measurements it cites ---------------------------

# deepseek-ai/DeepGEMM README (Feb 2025): H800 FP8 dense GEMMs (m, n, k, TFLOP/s), from
# memory-bound m=64 to compute-bound m=4096
DGEMM_FP8 = [
    (64, 2112, 7168, 206), (64, 24576, 1536, 289), (64, 32768, 512, 219),
    (64, 7168, 16384, 336), (64, 4096, 7168, 287), (64, 7168, 2048, 295),
    (128, 2112, 7168, 352), (128, 24576, 1536, 535), (128, 32768, 512, 358),
    (128, 7168, 16384, 645), (128, 4096, 7168, 533), (128, 7168, 2048, 510),
    (4096, 2112, 7168, 1058), (4096, 24576, 1536, 990), (4096, 32768, 512, 590),
    (4096, 7168, 16384, 1358), (4096, 4096, 7168, 1304), (4096, 7168, 2048, 1025),
]  # fmt: skip


def test_datasheet_predicts_the_deepgemm_table():
    """Kernel time = roofline with the profile's fractions + the per-launch overhead."""
    from roofline.calibrate.kernels import Kernel, KernelKind, predict_time_s

    h800 = load_chip("h800")
    ks = [Kernel(KernelKind.MATMUL, "g", "fp8", m, n, k) for m, n, k, _ in DGEMM_FP8]
    t = predict_time_s(load_profile("datasheet"), h800, ks)
    pred = np.array([2 * k.m * k.n * k.k for k in ks]) / t / 1e12
    err = pred / np.array([r[3] for r in DGEMM_FP8]) - 1
    assert np.median(np.abs(err)) < 0.10 and np.max(np.abs(err)) < 0.35


# [tegg] NVIDIA/TransformerEngine pull request #2045: TE 2.7 general_grouped_gemm (multi-stream
# cuBLAS), H100 BF16, Qwen3-30B-A3B's expert fc1 shapes (groups, m per group, n, k) -> TFLOP/s
TE_GROUPED_BF16 = [(8, 4096, 768, 2048, 627.903), (16, 2048, 768, 2048, 553.945)]


def test_datasheet_grouped_fraction_predicts_te_grouped_gemm_on_narrow_experts():
    """Hopper's grouped_fraction (0.9) against Transformer Engine's own grouped GEMM at a
    fine-grained MoE's expert shape (768 wide, 2048-4096 tokens per expert): the kernel time the
    datasheet profile predicts (tiles, waves, k roll-off, the experts' Poisson token tiles, one
    launch) lands within 10% of both measured rows; the profile's dense GEMM of the same shape
    over the measured grouped one is the fraction, 0.86-0.95."""
    from roofline.calibrate.kernels import Kernel, KernelKind, predict_time_s

    p = load_profile("datasheet")
    ks = [
        Kernel(KernelKind.MATMUL, "g", "bf16", g * m, n, k, groups=g, grouped=True)
        for g, m, n, k, _ in TE_GROUPED_BF16
    ]
    t = predict_time_s(p, H100, ks)
    pred = np.array([2.0 * kr.m * kr.n * kr.k for kr in ks]) / t / 1e12
    meas = np.array([r[4] for r in TE_GROUPED_BF16])
    assert np.all(np.abs(pred / meas - 1) < 0.10), pred
    dense = np.array(
        [float(p.matmul_fraction(H100, "bf16", m, n, k)) for _, m, n, k, _ in TE_GROUPED_BF16]
    )
    ratio = meas * 1e12 / (dense * H100.peak("bf16"))
    fam = p.family_for(H100)
    assert ratio.min() < fam.grouped_fraction < ratio.max()
    assert float(np.mean(ratio)) == pytest.approx(fam.grouped_fraction, abs=0.02)


@pytest.mark.parametrize("hd,tflops", [(64, 497), (128, 648), (256, 756)])
def test_datasheet_matches_flashattention3_forward(hd, tflops):
    """FlashAttention-3 (Shah et al. 2024), H100 FP16 forward, non-causal, long sequence."""
    p = load_profile("datasheet")
    pred = float(p.attention_fraction(H100, "bf16", False, hd, False)) * H100.peak("bf16") / 1e12
    assert pred == pytest.approx(tflops, rel=0.08)


def test_mamf_ceilings_are_the_large_gemm_limit():
    """A huge aligned bf16 GEMM lands within 3% of the MAMF measurement the profile cites."""
    p = load_profile("datasheet")
    for chip, mamf in ((H100, 794.5), (A100, 271.2)):
        pred = (
            float(p.matmul_fraction(chip, "bf16", 16384, 16384, 16384)) * chip.peak("bf16") / 1e12
        )
        assert pred == pytest.approx(mamf, rel=0.03)


def test_every_family_cites_a_source_and_stays_in_bounds():
    p = load_profile("datasheet")
    assert len(p.families) >= 8
    for fam in p.families:
        assert "mm_fraction" in fam.sources, fam.family
        for key, v in fam.params().items():
            b = PARAMS[key.split(".")[0]]
            assert b.lo <= v <= b.hi, (fam.family, key, v)
    chips = [
        load_chip(c)
        for c in (
            "h100",
            "h200",
            "a100",
            "b200",
            "gb200",
            "v100",
            "tpu-v4p",
            "tpu-v5e",
            "tpu-v5p",
            "tpu-v6e",
            "tpu-7x",
        )
    ]
    for c in chips:
        assert p.family_for(c) is not None, c.name


def test_for_chip_gives_a_constant_view():
    p = load_profile("datasheet")
    c = p.for_chip(V5P)
    assert (c.matmul, c.hbm, c.link, c.families) == (0.95, 0.9, 0.95, ())
    assert p.for_chip(H100).link == 0.82  # NVLink, the fastest GPU tier


# -- frameworks and the file format ---------------------------------------------------------


def test_framework_overrides():
    raw = {
        "name": "fit",
        "matmul": 0.5,
        "hbm": 0.5,
        "link": 0.5,
        "family": {"h": family_table()},
        "framework": {
            "megatron": {
                "calibrated": True,
                "step_overhead_s": 0.2,
                "family": {"h": {"mm_fraction.bf16": 0.6, "link.nvlink": 0.7}},
            }
        },
    }
    e = profile_from_dict(raw, "test")
    m = e.for_framework("megatron")
    assert m.calibrated and m.step_overhead_s == 0.2 and m.framework == "megatron"
    assert float(m.matmul_fraction(H100, "bf16", 128 * 132, 1024, 64 * 1000)) == pytest.approx(0.6)
    assert m.link_fraction(H100, "nvlink") == 0.7
    assert e.for_framework("torchtitan") is e and e.for_framework(None) is e


@pytest.mark.parametrize(
    "over,match",
    [
        ({"mm_fraction": {"bf16": 1.2}}, "mm_fraction.bf16"),
        ({"k_half": -1.0}, "k_half"),
        ({"attn_causal": 0.0}, "attn_causal"),
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"tile": [128, 128]}, "tile"),
        ({"link": {"pcie": 0.5}}, "link tier"),
    ],
)
def test_bad_family_values_are_clear_errors(over, match):
    with pytest.raises(SpecError, match=match):
        physics(**over)


def test_bad_top_level_and_unknown_names():
    with pytest.raises(SpecError, match="step_overhead_s"):
        Efficiency("x", 0.5, 0.5, 0.5, step_overhead_s=-1.0)
    with pytest.raises(SpecError, match="unknown key 'fudge'"):
        profile_from_dict({"matmul": 0.5, "hbm": 0.5, "link": 0.5, "fudge": 2}, "t")
    with pytest.raises(UnknownNameError, match="datasheet"):
        load_profile("datashet-x")
    assert {"peak", "datasheet"} <= set(profile_names())


def test_train_takes_a_profile_and_says_which(tmp_path):
    import contextlib
    import io
    import json

    from roofline.cli import main

    args = ["train", "--model", "llama-3-8b", "--system", "v5p:8x8x8", "--batch-tokens", "4Mi"]
    args += ["--seq", "4096", "--tokens", "1T", "--plan", "fsdp=512", "--json"]
    out = {}
    for prof in ("peak", "datasheet"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main([*args, "--profile", prof]) == 0
        out[prof] = json.loads(buf.getvalue())
    assert out["peak"]["inputs"]["profile"]["name"] == "peak"
    assert out["datasheet"]["inputs"]["profile"]["kind"] == "datasheet-only"
    assert out["datasheet"]["step_time_s"] > out["peak"]["step_time_s"]
    old = tmp_path / "old.toml"
    old.write_text("matmul = 0.5\nhbm = 0.5\nlink = 0.5\n")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main([*args, "--efficiency", str(old)]) == 0  # the old spelling still works
    assert json.loads(buf.getvalue())["inputs"]["profile"]["name"] == "old"


def test_profiles_hash_by_content_and_fp16_chips_scale_k_half():
    a, b = load_profile("datasheet"), load_profile("datasheet")
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert hash(a.for_framework("x")) == hash(a)
    v100 = load_chip("v100")
    f = load_profile("datasheet").matmul_fraction(v100, "fp16", 4096, 4096, [256, 8192])
    assert 0 < f[0] < f[1] <= 0.8


def test_an_overlong_profile_name_is_a_clear_error():
    with pytest.raises(SpecError, match="too long"):
        load_profile("x" * 300)
    with pytest.raises(SpecError):
        load_profile(".")  # a directory is not a profile file
