"""`roofline limits`: the book's closed forms, its worked numbers, and the step model agreeing.

Three kinds of check:
1. each closed form of `core.limits` with the book's own inputs gives the book's printed answer;
2. `limits()` on the book's systems (the chip and system records, the collectives module's
   per-axis bandwidth) gives the book's answer, with the ring's (N-1)/N the book drops
   restored where the geometry has one;
3. the same limit read off the step model (`balance_batch`, `step_terms`) is the same number,
   and a plan on the wrong side of a limit is communication-bound in `evaluate_plan`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from roofline.cli import main
from roofline.core import limits as L
from roofline.errors import PlanError
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.step import Workload, balance_batch, evaluate_plan, parse_plan, step_terms

sys.path.insert(0, str(Path(__file__).parent))
from test_training_cases import BOOK_OPS, book_layer, fsdp_tp_min_batch, fsdp_tp_x_opt  # noqa: E402

V5P_C, W_ICI = 4.59e14, 1.8e11  # tpus.md: v5p bf16 peak, bidirectional ICI per axis
H100_C = 9.89e14


# --------------------------------------------------------------- 1. closed forms, book inputs


def test_fsdp_limit_training_md():
    """tr-02: B/X > C/W_ici = 2550 on one v5p axis, 850 on three."""
    assert L.fsdp_min_tokens_per_chip(V5P_C, W_ICI) == pytest.approx(2550)
    assert L.fsdp_min_tokens_per_chip(V5P_C, 3 * W_ICI) == pytest.approx(850)


def test_tp_limit_training_md():
    """tr-06: Y < F·W/C: LLaMA-3 70B (F≈30k) 11.8, Gemma 7B (F≈50k) ~19; 8-way needs F ≥ 20,400."""
    assert L.tp_max_degree(30000, V5P_C, W_ICI) == pytest.approx(11.76, rel=0.01)
    assert L.tp_max_degree(50000, V5P_C, W_ICI) == pytest.approx(19, rel=0.05)
    assert 8 * V5P_C / W_ICI == pytest.approx(20400)


def test_mixed_limits_training_md():
    """tr-09 (N·α²/(2F) ≈ 4e5 on 4096 chips, F=32768), tr-14 (235; X_opt 1333), at-08 (113; 1618)."""
    WX, WY = 2 * W_ICI, W_ICI  # the book: FSDP on 2 axes, TP on 1
    assert 4096 * L.mixed_min_tokens_per_chip(V5P_C, WX, WY, 32768) == pytest.approx(4e5, rel=0.03)
    assert L.mixed_min_tokens_per_chip(V5P_C, WX, WY, 13824) == pytest.approx(235, rel=0.01)
    assert L.mixed_x_opt(3e6, 4096, 13824, WX, WY) == pytest.approx(1333, rel=0.01)
    assert L.mixed_min_tokens_per_chip(V5P_C, WX, WY, 28672) == pytest.approx(113, rel=0.01)
    assert L.mixed_x_opt(4.19e6, 8960, 28672, WX, WY) == pytest.approx(1618, rel=0.01)
    # training.md: X_opt = sqrt((B/F)(M_X/M_Y)N) ≈ 13.9 for N=64, B=48k, F=32768
    assert L.mixed_x_opt(48 * 1024, 64, 32768, WX, WY) == pytest.approx(13.9, rel=0.01)


def test_gpu_limits_gpus_md():
    """gp-24: 2200 in a node, 2475 across; gp-27: F/2200; Quiz 5 Q2: ZeRO-3 + 8-way PP -> 309."""
    assert L.fsdp_min_tokens_per_chip(990e12, 450e9) == pytest.approx(2200)
    assert L.fsdp_min_tokens_per_chip(990e12, 400e9) == pytest.approx(2475)
    assert L.tp_max_degree(28672, 990e12, 450e9 * 2200 / 1995) == pytest.approx(14.37, rel=0.01)
    assert L.zero3_pp_min_tokens_per_chip(990e12, 400e9, 8) == pytest.approx(309, rel=0.01)


def test_decode_limits_inference_md():
    """ai-10: compute TP limit 2·F/2200 = 26 on 2 axes; memory-bound F/(8B) = 56 at B=64;
    inference.md: F=16384, B=32 -> 64-way (β = W_hbm/W_ici ≈ 8)."""
    assert L.tp_max_degree(28672, 1.97e14, 2 * 9e10) == pytest.approx(26, rel=0.02)
    assert L.decode_tp_max_degree(28672, 1.0, 64, 8.0) == pytest.approx(56, rel=0.01)
    assert L.decode_tp_max_degree(16384, 1.0, 32, 8.0) == pytest.approx(64)
    # the exact β for v5e over one bidirectional axis is 8.2e11/9e10 = 9.1, not 8
    assert L.decode_tp_max_degree(28672, 9e10, 64, 8.2e11) == pytest.approx(
        28672 / (64 * 8.2e11 / 9e10)
    )


def test_two_d_weight_stationary_inference_md():
    """Q7: X_opt = sqrt(N/8) and T_2D = sqrt(128)·BD/(sqrt(N)·W) for F = 4D; beats 1D (4BD/(3W)) above 72 chips."""
    D = 8192
    assert L.two_d_x_opt(512, D, 4 * D) == pytest.approx(math.sqrt(512 / 8))
    assert L.two_d_coefficient(D, 4 * D) == pytest.approx(math.sqrt(128))
    assert L.two_d_breakeven_chips(D, 4 * D, 3.0, 1.0) == pytest.approx(72)
    assert L.two_d_breakeven_chips(D, 4 * D, 3.0, 1.0) == pytest.approx(32 * 4 * (3 / 4) ** 2)


def test_dcn_and_host_limits():
    """training.md: DP over DCN needs B/slice > C/W_dcn = 4.46e14/6.25e9 = 71,360; tpus.md Q3:
    weights from host over PCIe need B > C/W_pcie = 9.2e14/1.6e10 = 57,500."""
    assert L.fsdp_min_tokens_per_chip(4.46e14, 6.25e9) == pytest.approx(71360)
    assert L.fsdp_min_tokens_per_chip(9.2e14, 1.6e10) == pytest.approx(57500)


# --------------------------------------------------------------- 2. the records give the book's numbers

LLAMA70 = load_model("llama-3-70b")


def test_v5p_pod_limits_from_records():
    rep = L.limits(LLAMA70, parse_system("tpu-v5p:16x16x16"), batch_tokens=4.19e6)
    assert rep["fsdp_min_tokens_per_chip"].value == pytest.approx(850, rel=1e-9)
    assert rep["mixed_min_tokens_per_chip"].value == pytest.approx(2550**2 / (2 * 28672), rel=1e-9)
    assert rep["mixed_over_fsdp_factor"].value == pytest.approx(850 / (2550**2 / (2 * 28672)))
    assert rep["tp_max_degree"].value == pytest.approx(28672 / 2550)
    assert rep["two_d_breakeven_chips"].value == pytest.approx(2 * 28672 / 8192 * 9)
    # 4.19e6 tokens on 4096 chips: 1023 per chip, above 850: FSDP compute-bound
    assert rep["fsdp_min_tokens_per_chip"].side == "compute-bound"
    assert rep.plans["fsdp+tp"] == "fsdp=256,tp=16"


def test_h100_limits_from_records():
    """The collectives module keeps an 8-GPU ring's 7/8 and the 32-node leaf's 31/32."""
    rep = L.limits(LLAMA70, parse_system("h100:4096"))
    assert rep["tp_max_degree"].value * 7 / 8 == pytest.approx(28672 * 450e9 / H100_C)
    pp = rep["zero3_pp_min_tokens_per_chip"].value
    assert pp * 32 / 31 == pytest.approx(H100_C / (8 * 400e9))
    assert pp == pytest.approx(309, rel=0.04)


def test_decode_critical_batch_from_records():
    v5e = parse_system("tpu-v5e:4x4")
    assert L.limits(LLAMA70, v5e, strategy="decode")[
        "decode_critical_batch"
    ].value == pytest.approx(240, rel=0.01)
    int8 = L.limits(LLAMA70, v5e, strategy="decode", weight_dtype="int8")
    assert int8["decode_critical_batch"].value == pytest.approx(120, rel=0.01)
    moe = load_model("book-inference-moe")  # inference.md Q5: E=16, k=2 -> 240·8 = 1920
    got = L.limits(moe, v5e, strategy="decode")["decode_critical_batch"].value
    assert got == pytest.approx(1920, rel=0.01)


def test_decode_tp_needs_a_batch_and_says_so():
    rep = L.limits(LLAMA70, parse_system("tpu-v5e:4x8"), strategy="decode")
    assert "decode_tp_max_degree" in rep.skipped
    rep = L.limits(LLAMA70, parse_system("tpu-v5e:4x8"), strategy="decode", batch_tokens=64)
    lim = rep["decode_tp_max_degree"]
    W = rep.bandwidths["W_Y(tensor)"].bytes_per_s
    assert lim.value == pytest.approx(28672 * W / (64 * 8.2e11))


# --------------------------------------------------------------- 3. the step model agrees


@pytest.mark.parametrize(
    "system,plan,key,buckets",
    [
        ("tpu-v5p:16x16x16", "fsdp=4096", "fsdp_min_tokens_per_chip", None),
        ("h100:256", "fsdp=256", "fsdp_min_tokens_per_chip", None),
        ("tpu-v5p:16x16x16", "fsdp=512,pp=8", "zero3_pp_min_tokens_per_chip", ("fsdp",)),
        ("h100:4096", "fsdp=512,pp=8", "zero3_pp_min_tokens_per_chip", ("fsdp",)),
    ],
)
def test_batch_limits_equal_the_step_models_balance(system, plan, key, buckets):
    s = parse_system(system)
    layer = book_layer(F=28672)
    closed = L.limits(layer, s, plan=plan)[key].value
    algebra = balance_batch(
        layer, s, parse_plan(plan + ",remat=none"), ops=BOOK_OPS, phase="forward", buckets=buckets
    )
    assert closed == pytest.approx(algebra / s.n_chips, rel=1e-9)


@pytest.mark.parametrize("system", ["tpu-v5p:16x16x16", "h100:64"])
def test_tp_limit_equals_the_step_models_crossing(system):
    s = parse_system(system)
    layer = book_layer(F=28672)
    rep = L.limits(layer, s, strategy="tp")
    Y = int(rep.plans["tp"].split("tp=")[1])
    t = step_terms(
        layer, s, Workload(2**20, 1), parse_plan(rep.plans["tp"] + ",remat=none"), ops=BOOK_OPS
    )
    assert rep["tp_max_degree"].value == pytest.approx(
        Y * t["t_math_forward_s"] / t["comm_forward_s"], rel=1e-9
    )


def _whole_batch(per_chip: float, plan: str, n: int, seq: int = 128, mb: int = 1) -> float:
    d = parse_plan(plan).degrees
    unit = d.dp * d.fsdp * mb * seq
    return max(1, round(per_chip * n / unit)) * unit


@pytest.mark.parametrize(
    "system,plan,key,mb",
    [
        ("tpu-v5p:16x16x16", "fsdp=4096", "fsdp_min_tokens_per_chip", 1),
        ("h100:256", "fsdp=256", "fsdp_min_tokens_per_chip", 1),
        ("tpu-v5p:16x16x16", "fsdp=256,tp=16", "mixed_min_tokens_per_chip", 1),
        ("h100:4096", "fsdp=512,pp=8", "zero3_pp_min_tokens_per_chip", 8),
    ],
)
def test_wrong_side_of_a_limit_is_communication_bound_in_the_step(system, plan, key, mb):
    """A quarter of the limit's batch: the plan's collectives outlast its compute in evaluate_plan."""
    s = parse_system(system)
    lim = L.limits(LLAMA70, s, plan=plan)[key].value
    B = _whole_batch(lim / 4, plan, s.n_chips, mb=mb)
    assert B / s.n_chips < lim
    c = evaluate_plan(
        LLAMA70, s, Workload(B, 128), parse_plan(f"{plan},remat=none,microbatch={mb}")
    )
    assert sum(c.comm_time_s.values()) > c.compute_time_s


@pytest.mark.parametrize(
    "system,plan", [("tpu-v5p:16x16x16", "fsdp=4096"), ("h100:256", "fsdp=256")]
)
def test_right_side_of_the_fsdp_limit_is_compute_bound_in_the_step(system, plan):
    s = parse_system(system)
    lim = L.limits(LLAMA70, s, plan=plan)["fsdp_min_tokens_per_chip"].value
    B = _whole_batch(lim * 4, plan, s.n_chips)
    c = evaluate_plan(LLAMA70, s, Workload(B, 128), parse_plan(f"{plan},remat=none"))
    assert sum(c.comm_time_s.values()) < c.compute_time_s


# --------------------------------------------------------------- CLI and errors


def test_cli_text_and_json(capsys):
    assert (
        main(["limits", "--system", "tpu-v5p:16x16x16", "--batch", "4M", "--strategy", "fsdp"]) == 0
    )
    out = capsys.readouterr().out
    assert "B/N > C / W_X" in out and "= 4.59e+14 / 5.4e+11 = 850 tokens per chip" in out
    assert (
        main(["limits", "--system", "h100:64", "--strategy", "decode", "--batch", "64", "--json"])
        == 0
    )
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "limits"
    assert doc["limits"]["decode_critical_batch"]["value"] == pytest.approx(H100_C / 3.35e12)


def test_cli_bad_input_is_one_paragraph(capsys):
    assert main(["limits", "--system", "h100:8", "--strategy", "zero3+pp"]) == 2
    err = capsys.readouterr().err
    assert "fewer than 2 per stage" in err and "Traceback" not in err
    assert main(["limits", "--system", "h100:8", "--plan", "fsdp=3"]) == 2
    with pytest.raises(PlanError):
        L.parse_strategy("sideways")


def test_one_chip_keeps_the_decode_batch_and_skips_the_rest(capsys):
    rep = L.limits(LLAMA70, parse_system("tpu-v5e:1x1"))
    assert rep["decode_critical_batch"].value == pytest.approx(240, rel=0.01)
    assert {"fsdp", "tp", "fsdp+tp", "zero3+pp", "decode_tp_max_degree"} <= set(rep.skipped)
    assert main(["limits", "--system", "h100:8", "--strategy", "fsdp+tp"]) == 2
    assert "leaves fsdp a single chip" in capsys.readouterr().err


def test_optimizer_offload_limit():
    """ZeRO-Offload: per step 2 B/param of gradients out and 2 B/param of parameters back over a
    full-duplex host link, against 6 FLOPs/param/token: B/N > C/(3·W_host)."""
    h = parse_system("h100:64")
    lim = L.limits(LLAMA70, h, strategy="fsdp")["offload_min_tokens_per_chip"].value
    P, W = 70e9 / 64, 6.4e10  # any per-chip parameter count: it cancels
    assert 6 * lim * P / H100_C == pytest.approx(2 * P / W)


def test_offload_host_adam_limit():
    """The host's Adam update under offload: adam-bf16 moves 2 + 2·8 + 2 = 20 B/param of the
    DGX H100 host's DRAM (76.8 GB/s per GPU) and does 16 FLOPs (1.792 TFLOP/s per GPU): DRAM-
    bound, so B/N > C·(20/76.8e9)/6 ≈ 4.3e4 tokens per chip, 8x the host link's 5.2e3; the
    same as `train --offload-optimizer`'s break-even where a chip holds a whole replica's state."""
    from roofline.core.ledger import count_params
    from roofline.training.offload import offload_optimizer
    from roofline.training.step import mfu_peak

    h = parse_system("h100:64")
    rep = L.limits(LLAMA70, h, strategy="fsdp")
    lim = rep["offload_adam_min_tokens_per_chip"].value
    assert lim == pytest.approx(H100_C * 20 / 76.8e9 / 6, rel=1e-12)
    assert 4.2e4 < lim < 4.4e4
    assert lim / rep["offload_min_tokens_per_chip"].value == pytest.approx(
        20 * 3 * 6.4e10 / 6 / 76.8e9
    )
    m8, h8 = load_model("llama-3-8b"), parse_system("h100:8")
    c = evaluate_plan(m8, h8, Workload(2**17, 1024), parse_plan("dp=8,zero=0,microbatch=8"))
    o = offload_optimizer(m8, c)
    p = count_params(m8)
    v = L.limits(m8, h8, strategy="fsdp")["offload_adam_min_tokens_per_chip"].value
    assert mfu_peak(h8.chip) == H100_C
    assert o.adam_breakeven_tokens_per_chip == pytest.approx(v * p.total / p.active, rel=1e-9)
    v5p = L.limits(LLAMA70, parse_system("tpu-v5p:4x4x4"), strategy="fsdp")
    assert "offload_adam_min_tokens_per_chip" in v5p.skipped


@pytest.mark.parametrize("F", [13824, 28672, 32768])
def test_mixed_limit_and_x_opt_equal_the_step_models(F):
    """The FSDP+TP limit and X_opt from the records equal the ones the training tests read off
    step_terms (T_FSDP·Y, T_TP·X/B and T_math on fsdp=256, tp=16 of a v5p 16x16x16)."""
    s = parse_system("tpu-v5p:16x16x16")
    rep = L.limits(book_layer(F=F), s, plan="fsdp=256,tp=16", batch_tokens=3e6)
    assert rep["mixed_min_tokens_per_chip"].value == pytest.approx(
        fsdp_tp_min_batch(F, 4096) / 4096, rel=1e-9
    )
    assert rep["mixed_x_opt"].value == pytest.approx(fsdp_tp_x_opt(F, 4096, 3e6), rel=1e-9)


def test_moe_fsdp_limit_gp25():
    """gpus.md: MoE data parallelism needs E/k times the dense batch (k=4, E=128: 32·2475 = 79,200);
    cross-checked with the step model's balance on the expert layer alone."""
    from roofline.specs.model import MoESpec

    h = parse_system("h100:16384")
    moe = book_layer(moe=MoESpec(n_experts=128, top_k=4, d_ff_expert=32768))
    rep = L.limits(moe, h, strategy="fsdp")
    lim = rep["moe_fsdp_min_tokens_per_chip"]
    assert lim.value == pytest.approx(32 * rep["fsdp_min_tokens_per_chip"].value)
    assert lim.value * 32 / 31 == pytest.approx(32 * H100_C / 400e9, rel=1e-6)  # leaf's 31/32
    algebra = balance_batch(
        moe, h, parse_plan("fsdp=16384,remat=none"), ops=("moe/up", "moe/down"), phase="forward"
    )
    assert lim.value == pytest.approx(algebra / h.n_chips, rel=1e-6)
