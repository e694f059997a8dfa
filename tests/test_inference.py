"""Inference steps: plans, memory per chip, the perfectly-sharded step and the walk's sharded step.

Each check pairs the tool with a closed form (bytes / bandwidth, the book's KV formula) or with
the other step model (the walk at one chip is the ideal step; tensor parallelism adds exactly its
collectives).
"""

from __future__ import annotations

import numpy as np
import pytest

from roofline.core.ledger import count_params, kv_cache_bytes_per_token
from roofline.errors import PlanError
from roofline.serving.inference import (
    KVLayout,
    PassShape,
    Quant,
    ServePlan,
    kv_replication,
    max_batch,
    memory_per_chip,
    parse_serve_plan,
    weight_bytes,
)
from roofline.serving.step import (
    IdealStep,
    ShardedStep,
    degrees_of,
    kv_replicated,
    served_kv_heads,
)
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import PEAK
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Strategy
from roofline.specs.system import parse_system
from roofline.units import dtype_bytes

LLAMA = load_model("llama-3-70b")
H100 = load_chip("h100")


# ---- plans and quantisation ---------------------------------------------------------------------


def test_parse_serve_plan():
    p = parse_serve_plan("tp=8,ep=8,dp=1")
    assert (p.tp, p.ep, p.chips, p.expert_tp) == (8, 8, 8, 1)
    assert parse_serve_plan("tp=4,pp=2,kv=heads_batch").kv_layout == KVLayout.HEADS_BATCH
    assert parse_serve_plan("mp=16").tp == 16


@pytest.mark.parametrize(
    "text", ["tp=8,ep=3", "tp=x", "tp", "foo=2", "tp=4,kv=diagonal", "tp=0", "tp=4,layout=2d"]
)
def test_bad_plans_name_the_rule(text):
    with pytest.raises(PlanError):
        parse_serve_plan(text)


def test_quant_block_scaled_weights_carry_their_scales():
    w = weight_bytes(LLAMA, Quant("nvfp4", "fp8", "nvfp4", embeddings="bf16"))
    dense = weight_bytes(LLAMA, Quant("bf16"))["dense"]
    assert w["dense"] == pytest.approx(dense / 2 * dtype_bytes("nvfp4"))
    assert dtype_bytes("nvfp4") == 0.5 + 1 / 16


# ---- memory per chip ----------------------------------------------------------------------------


def test_memory_per_chip_closed_form():
    q = Quant("int8", "int8", "bf16")
    m = memory_per_chip(LLAMA, ServePlan(tp=8), q, 32, 8192)
    wb = weight_bytes(LLAMA, q)
    assert m.weights_bytes == pytest.approx(sum(wb.values()) / 8)
    assert m.kv_bytes == pytest.approx(32 * 8192 * kv_cache_bytes_per_token(LLAMA, "int8") / 8)


def test_kv_heads_replicate_beyond_k_unless_the_batch_takes_the_rest():
    """tp=16 > K=8: Megatron keeps two copies of each KV head; the book's layout splits the batch."""
    q = Quant()
    mega = memory_per_chip(LLAMA, ServePlan(tp=16), q, 16, 4096)
    book = memory_per_chip(LLAMA, parse_serve_plan("tp=16,kv=heads_batch"), q, 16, 4096)
    assert kv_replication(LLAMA, ServePlan(tp=16)) == 2
    assert mega.kv_bytes == pytest.approx(2 * book.kv_bytes)


def test_mla_latent_replicates_over_tensor_parallelism():
    ds = load_model("deepseek-v3")
    assert kv_replication(ds, ServePlan(tp=8)) == 8
    assert kv_replication(ds, ServePlan(tp=1, dp=8, ep=8)) == 1  # DP-attention: no copies


def test_max_batch_is_free_memory_over_kv_per_sequence():
    q = Quant("int8", "int8", "bf16")
    plan = parse_serve_plan("tp=8,kv=heads_batch")
    got = max_batch(LLAMA, plan, q, 8192, 16e9, ideal=True)
    free = 8 * 16e9 - sum(weight_bytes(LLAMA, q).values())
    assert got == np.floor(free / (8192 * kv_cache_bytes_per_token(LLAMA, "int8")))


# ---- the ideal step -----------------------------------------------------------------------------


def test_ideal_decode_is_bytes_over_bandwidth_at_small_batch():
    st = IdealStep(LLAMA, H100, ServePlan(tp=8), Quant("fp8", "fp8", "bf16"), PEAK)
    t = st.pass_time(PassShape(decode=1.0, context=4096))
    assert str(t.bound) == "memory"
    assert t.time_s == pytest.approx(t.hbm_bytes_per_chip / H100.hbm_bw_bytes_per_s)
    assert t.weight_bytes_per_chip == pytest.approx(
        sum(weight_bytes(LLAMA, Quant("fp8")).values()) / 8, rel=0.02
    )


def test_pipeline_decode_takes_pp_stage_times():
    """pp stages run the batch as pp microbatches: the pass is pp × a stage at B/pp, so each
    microbatch rereads the stage's weights (latency does not drop with stages)."""
    a = IdealStep(LLAMA, H100, ServePlan(tp=4, pp=2), Quant(), PEAK)
    b = IdealStep(LLAMA, H100, ServePlan(tp=4), Quant(), PEAK)
    ta = a.pass_time(PassShape(decode=8.0, context=2048)).time_s
    tb = b.pass_time(PassShape(decode=4.0, context=2048)).time_s
    assert ta == pytest.approx(tb, rel=1e-9)  # 2 stages × (8 chips' share of 4 sequences)


def test_moe_decode_reads_the_routed_experts():
    m = load_model("mixtral-8x7b")
    st = IdealStep(m, H100, ServePlan(tp=8), Quant(), PEAK)
    one = st.pass_time(PassShape(decode=1.0, context=1)).weight_bytes_per_chip
    many = st.pass_time(PassShape(decode=512.0, context=1)).weight_bytes_per_chip
    pc = count_params(m)
    assert one * 8 == pytest.approx(2 * pc.active, rel=0.02)  # top-2 of 8 experts
    assert many * 8 == pytest.approx(2 * pc.total, rel=0.02)


def _one(x) -> float:
    return np.asarray(x).item()


# ---- the walk's sharded step --------------------------------------------------------------------


def test_walk_on_one_chip_is_the_ideal_step():
    sys1 = parse_system("h100:1")
    q = Quant("fp8", "bf16", "bf16")
    w = ShardedStep(LLAMA, [sys1], [ServePlan()], q, PEAK)
    i = IdealStep(LLAMA, H100, ServePlan(), q, PEAK)
    for B in (1.0, 16.0, 256.0):
        tw = w.pass_time(PassShape(decode=B, context=2048))
        ti = i.pass_time(PassShape(decode=B, context=2048))
        assert _one(tw.comm_s) == 0
        assert _one(tw.time_s) == pytest.approx(_one(ti.time_s), rel=0.03)


def test_tensor_parallel_decode_pays_two_allreduces_per_layer():
    sys8 = parse_system("h100:8")
    w = ShardedStep(LLAMA, [sys8], [ServePlan(tp=8)], Quant(), PEAK)
    small = w.pass_time(PassShape(decode=1.0, context=2048))
    big = w.pass_time(PassShape(decode=512.0, context=2048))
    assert _one(small.comm_s) > 0
    # latency-bound at batch 1 (Appendix C): 512x the bytes costs far less than 512x the time
    assert _one(big.comm_s) < 100 * _one(small.comm_s)
    assert _one(small.comm_s) >= 2 * LLAMA.n_layers * 1e-6  # at least a hop per AllReduce


def test_a_mixed_pass_reads_the_weights_once():
    sys8 = parse_system("h100:8")
    w = ShardedStep(LLAMA, [sys8], [ServePlan(tp=8)], Quant(), PEAK)
    d = w.pass_time(PassShape(decode=32.0, context=2048)).time_s
    p = w.pass_time(PassShape(prefill_seqs=1.0, prefill_chunk=512, prefill_context=512)).time_s
    mix = w.pass_time(
        PassShape(
            decode=32.0, context=2048, prefill_seqs=1.0, prefill_chunk=512, prefill_context=512
        )
    ).time_s
    assert max(d, p) < mix < d + p


def test_plan_to_strategies():
    ds = load_model("deepseek-v3")
    deg = degrees_of(ds, ServePlan(tp=1, dp=8, ep=8))
    assert deg[Strategy.EP] == 8 and deg[Strategy.TP] == 1  # DP-attention + EP on the expert axis
    assert degrees_of(LLAMA, ServePlan(tp=2, dp=4))[Strategy.DP] == 4
    # tp = 16 > K = 8: each head copied onto the 2 chips that read it, split over the tensor axis
    assert served_kv_heads(LLAMA, 16) == 16 and served_kv_heads(LLAMA, 8) == 8
    assert not kv_replicated(LLAMA, 16) and not kv_replicated(LLAMA, 8)
    assert kv_replicated(LLAMA, 3)  # 3 splits neither way: the K/V projections replicated
    assert not kv_replicated(ds, 8)  # the MLA latent has no KV heads to split


def test_tp_beyond_the_kv_heads_reads_one_head_per_chip():
    """Issue 18 item 1: at tp > K each chip holds and reads the one KV head its query heads use
    (1/K of the cache), not all of it: LLaMA-3 8B (K = 8) on 16 H100s read 34 GB of KV per chip
    at tp = 16 (12 ms) while memory held 4.3 GB. The KV read per chip is the closed form
    2·L·d_head·bytes·B·S (one head), the same as at tp = 8, and equals the memory held."""
    m8 = load_model("llama-3-8b")
    B, S = 32, 8192
    one_head = 2 * m8.n_layers * m8.d_head * 2 * B * S
    for tp in (8, 16):
        plan = ServePlan(tp=tp)
        st = ShardedStep(m8, [parse_system(f"h100:{tp}")], [plan], Quant(), PEAK)
        t = st.pass_time(PassShape(decode=float(B), context=S))
        assert np.ravel(t.kv_bytes_per_chip)[0] == pytest.approx(one_head, rel=1e-9)
        assert np.ravel(st.memory_per_chip(B, S).kv_bytes)[0] == pytest.approx(one_head, rel=1e-9)
    # the weights still split 16 ways: tp = 16 reads less per chip than tp = 8
    t8, t16 = (
        ShardedStep(m8, [parse_system(f"h100:{tp}")], [ServePlan(tp=tp)], Quant(), PEAK)
        .pass_time(PassShape(decode=float(B), context=S))
        .memory_s
        for tp in (8, 16)
    )
    assert np.ravel(t16)[0] < np.ravel(t8)[0]


def test_small_m_gemms_tile_tokens_by_the_instructions_smallest_side():
    """datasheet: Hopper GEMM libraries swap the operands of a decode GEMM so the tokens are
    wgmma's N (8..256 in steps of 8): one token computes in an 8-row tile, not a 128-row one, and
    a one-token-per-expert decode GEMM stays memory-bound (it was priced 16x compute-bound)."""
    from roofline.specs.efficiency import load_profile

    eff = load_profile("datasheet")
    fam = eff.family_for(H100)
    assert fam.tile_m_min == 8 and fam.tile[0] == 128
    f1, f8, f128 = (float(eff.matmul_fraction(H100, "bf16", m, 4096, 4096)) for m in (1, 8, 128))
    assert f8 == pytest.approx(8 * f1, rel=1e-9)  # same 8-row tile: 8x the useful rows
    assert f128 == pytest.approx(f8, rel=1e-9)  # a filled tile of either size: the same rate
    # one token of a 2880 x 2880 bf16 expert: compute time far below the weight read
    t_math = 2 * 2880 * 2880 / (H100.peak("bf16") * f1)
    t_mem = 2880 * 2880 * 2 / (H100.hbm_bw_bytes_per_s * eff.hbm_fraction(H100))
    assert t_math < 0.5 * t_mem


def test_candidates_of_one_step_share_a_kv_layout():
    """A model with 40 heads over 8 KV heads: tp = 5 replicates the K/V projections, tp = 8 splits
    them — same served head count, different layouts, so they never share a ShardedStep."""
    from dataclasses import replace as dc_replace

    from roofline.serving.step import kv_layout

    m = dc_replace(load_model("llama-3-8b"), n_heads=40, d_head=128)
    assert kv_layout(m, 5) == (8, True) and kv_layout(m, 8) == (8, False)
    with pytest.raises(ValueError, match="one KV layout"):
        ShardedStep(
            m, [parse_system("h100:8")] * 2, [ServePlan(tp=5), ServePlan(tp=8)], Quant(), PEAK
        )
