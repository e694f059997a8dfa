"""`roofline limits --strategy ep`: gpus.md's expert-parallelism limits (issue 20).

gpus.md: EP over Z GPUs (nodes of G = 8) sends each MoE layer's tokens through two AllToAlls,
`T_comms = 4·B·D·(Z−G)/(W_node·Z)·min(G·k/Z, 1)`, against `T_math = 4·B·k·D·F/(Z·C)`; the batch
cancels, so the limits are on F and Z: `F > α·(Z−G)·min(G·k/Z, 1)/k` (α = C/W_node), which
tends to `G·α` (H100: 8·2475 = 19,800) as Z grows. Checked: the closed forms with the book's
inputs, the same limits from the records, the AllToAll time against the collectives module,
and a plan on the wrong side being communication-bound in the step model.
"""

from __future__ import annotations

import json
import math

import pytest

from roofline.cli import main
from roofline.core import limits as L
from roofline.core.collectives import collective_cost
from roofline.core.mesh import make_mesh
from roofline.errors import PlanError
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.step import Workload, evaluate_plan, parse_plan

ALPHA = 990e12 / 400e9  # gpus.md: C/W_node across H100 nodes, 2475
DSV3 = load_model("deepseek-v3")  # E = 256, k = 8, expert F = 2048, D = 7168


def test_wide_ep_threshold_gp28():
    """gp-28: F > 8·C/W_node = 19,800 separates 1-2-node EP from wide EP; the general form
    tends to it as Z grows (Z ≫ k·G)."""
    assert 8 * ALPHA == pytest.approx(19800, rel=0.01)
    assert L.ep_min_d_ff(ALPHA, 1e9, 8, 4) == pytest.approx(8 * ALPHA, rel=1e-6)
    assert math.isinf(L.ep_max_degree(8 * ALPHA, ALPHA, 8, 4))


@pytest.mark.parametrize("Z,k", [(16, 8), (32, 4), (64, 8)])
def test_small_ep_regime(Z, k):
    """k ≥ Z/8: F > α·(Z−8)/k (gpus.md's first domain)."""
    assert L.ep_min_d_ff(ALPHA, Z, 8, k) == pytest.approx(ALPHA * (Z - 8) / k)


@pytest.mark.parametrize("F", [500.0, 2048.0, 9000.0, 17000.0, 19000.0])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_max_degree_inverts_min_d_ff(F, k):
    """ep_max_degree is ep_min_d_ff solved for Z, in both regimes."""
    z = L.ep_max_degree(F, ALPHA, 8, k)
    assert z > 8
    assert L.ep_min_d_ff(ALPHA, z, 8, k) == pytest.approx(F, rel=1e-9)


def test_deepseek_v3_on_h800_records():
    """DeepSeek V3 (F = 2048 < 8α) on H800s: EP is compute-bound only across 1-2 nodes
    (Z < 8 + k·F/α ≈ 14.6); the 64-way EP it trained with is on the AllToAll-bound side."""
    h800 = parse_system("h800:2048")
    rep = L.limits(DSV3, h800, strategy="ep", batch_tokens=4096 * 15360, plan="fsdp=32,ep=64")
    C, W_node = h800.chip.peak("bf16"), 8 * 50e9
    a = C / W_node
    assert rep["ep_wide_d_ff"].value == pytest.approx(8 * a)
    assert rep["ep_wide_d_ff"].side == "narrow EP"
    assert rep["ep_min_d_ff"].value == pytest.approx(a * (64 - 8) / 8)
    assert rep["ep_max_degree"].value == pytest.approx(8 + 8 * 2048 / a)
    assert 8 < rep["ep_max_degree"].value < 16
    assert rep["ep_max_degree"].side == "communication-bound"
    t = rep["ep_alltoall_s_per_layer"]
    Bg = 4096 * 15360 * 64 / 2048
    assert t.value == pytest.approx(4 * Bg * 7168 * 56 / (W_node * 64))
    assert t.at == pytest.approx(4 * Bg * 8 * 7168 * 2048 / (64 * C))
    assert t.side == "communication-bound"
    # (E/k)·C/W_X with E/Z experts a chip: DeepSeek's 30k tokens per GPU clears it
    fs = rep["ep_fsdp_min_tokens_per_chip"]
    assert fs.value == pytest.approx(
        256 / (8 * 64) * C / rep.bandwidths["W_X(fsdp, beside ep)"].bytes_per_s
    )
    assert fs.side == "compute-bound"


def test_moe_dp_limit_at_z1_gp25():
    """gp-25: with no EP (Z = 1) the limit is gpus.md's (E/k)·C/W: k=4, E=128 -> 79,200."""
    assert L.ep_fsdp_min_tokens_per_chip(990e12, 400e9, 128, 4, 1) == pytest.approx(79200)


@pytest.mark.parametrize("Z,k", [(64, 4), (128, 8), (256, 2)])
def test_alltoall_time_is_the_collectives_modules(Z, k):
    """Z ≥ G·k (the ragged regime): each GPU's k copies of its B/Z tokens spread over the Z
    shards; the collectives module's AllToAll over the EP axis, twice, is the book's T_comms."""
    B, D = 2**20, 7168
    h = parse_system(f"h100:{Z}")
    c = collective_cost("A2A", k * (B / Z) * 2 * D, "expert", make_mesh(h, {"expert": Z}))
    assert 2 * c.bandwidth_s == pytest.approx(L.ep_alltoall_time(B, D, Z, 8, k, 400e9))


def test_wrong_side_plan_is_communication_bound_in_the_step_model():
    """64-way EP of DeepSeek V3 on H800s (above ep_max_degree): the step model's expert
    AllToAlls outlast the routed experts' matmuls (6 FLOPs per active parameter per token)."""
    h800 = parse_system("h800:2048")
    B = 4096 * 15360
    c = evaluate_plan(DSV3, h800, Workload(B, 15360), parse_plan("fsdp=32,ep=64,remat=none"))
    moe = DSV3.moe
    layers = DSV3.n_layers - moe.dense_layers
    t_experts = 6 * layers * moe.top_k * 3 * DSV3.d_model * moe.d_ff_expert * B
    t_experts /= h800.n_chips * h800.chip.peak("bf16")
    assert c.comm_time_s["ep"] > t_experts


def test_switch_capped_node_egress_lowers_the_limit(tmp_path):
    """W_node is the scale-out tier as the collectives module prices it, switch cap included."""
    p = tmp_path / "s.toml"
    p.write_text('base = "h100:1024"\n[switch_bw]\nleaf = 6.4e12\n')  # 25 GB/s per GPU
    rep = L.limits(DSV3, parse_system(p), strategy="ep", plan="fsdp=16,ep=64")
    assert rep["ep_wide_d_ff"].value == pytest.approx(8 * 9.89e14 / (8 * 25e9))


def test_errors_and_cli(capsys):
    with pytest.raises(PlanError, match="dense model"):
        L.limits(load_model("llama-3-70b"), parse_system("h100:1024"), strategy="ep")
    with pytest.raises(PlanError, match="NVLink nodes"):
        L.limits(DSV3, parse_system("tpu-v5p:8x8x8"), strategy="ep")
    rep = L.limits(load_model("llama-3-70b"), parse_system("h100:1024"))
    assert "dense model" in rep.skipped["ep"]
    assert (
        main(["limits", "--model", "llama-3-70b", "--system", "h100:64", "--strategy", "ep"]) == 2
    )
    assert "Traceback" not in capsys.readouterr().err
    argv = [
        "limits",
        "--model",
        "deepseek-v3",
        "--system",
        "h800:2048",
        "--strategy",
        "ep",
        "--json",
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["limits"]["ep_wide_d_ff"]["formula"] == "F > G · C / W_node"
    assert doc["plans"]["ep"] == "fsdp=8,ep=256"
