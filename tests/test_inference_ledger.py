"""The ledger at serving shapes: decode and prefill steps, MLA absorbed, routed experts, windows.

Each formula is checked against its closed form and, where it can be, against a brute-force
count (a mask matrix, a routing simulation, the absorbed and decompressed MLA computed in numpy).
"""

from __future__ import annotations

import numpy as np
import pytest

from roofline.core.ledger import (
    Causal,
    DtypePolicy,
    OpKind,
    build_ledger,
    count_params,
    decode_ledger,
    expected_distinct_experts,
    kv_cache_bytes_per_token,
    mla_absorbed_by_default,
    prefill_ledger,
)
from roofline.errors import SpecError
from roofline.specs.model import MLASpec, ModelSpec, MoESpec
from roofline.specs.model_catalog import load_model
from roofline.units import dtype_bytes


def tiny(**kw) -> ModelSpec:
    args = dict(
        name="tiny",
        n_layers=4,
        d_model=256,
        d_ff=512,
        n_heads=8,
        n_kv_heads=2,
        d_head=32,
        vocab=1000,
    )
    args.update(kw)
    return ModelSpec(**args)


# ---- routed experts ----------------------------------------------------------------------------


def test_distinct_experts_limits_and_closed_form():
    E, k = 256, 8
    assert expected_distinct_experts(E, k, 1) == pytest.approx(k)
    assert expected_distinct_experts(E, k, 1e6) == pytest.approx(E)
    t = np.array([1, 2, 8, 64, 512])
    got = expected_distinct_experts(E, k, t)
    assert np.all(np.diff(got) > 0) and np.all(got <= E)
    assert got[1] == pytest.approx(E * (1 - (1 - k / E) ** 2))


def test_distinct_experts_matches_a_routing_simulation():
    """Uniform top-k routing simulated: the mean count of distinct experts hit by B tokens."""
    rng = np.random.default_rng(0)
    E, k = 64, 4
    for B in (1, 4, 16, 64):
        hits = [
            len({e for _ in range(B) for e in rng.choice(E, size=k, replace=False)})
            for _ in range(400)
        ]
        assert np.mean(hits) == pytest.approx(expected_distinct_experts(E, k, B), rel=0.03)


def test_decode_reads_only_the_routed_experts():
    m = tiny(moe=MoESpec(n_experts=32, top_k=2, d_ff_expert=128))
    w = count_params(m).breakdown["moe/up"] * dtype_bytes("bf16")
    for B in (1, 4, 64, 4096):
        up = decode_ledger(m, batch=B, context=128)["moe/up"]
        frac = expected_distinct_experts(32, 2, B) / 32
        act = up.inputs[0].nbytes(up.sizes) + up.out.nbytes(up.sizes)
        assert up.bytes == pytest.approx(w * frac + act * up.count)
        assert up.weight_bytes == pytest.approx(w)  # storage is all E experts
    assert decode_ledger(m, batch=1, context=128)["moe/up"].weight_read_fraction == pytest.approx(
        2 / 32
    )


# ---- MLA ---------------------------------------------------------------------------------------

MLA = MLASpec(
    q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32
)


def mla_model() -> ModelSpec:
    return tiny(n_heads=8, n_kv_heads=8, d_head=48, mla=MLA)


def test_absorbed_mla_keeps_the_parameters_and_drops_the_decompression():
    m = mla_model()
    a = decode_ledger(m, batch=4, context=1024)
    d = build_ledger(m, batch=4, seq=1, kv_seq=1024, mla_absorb=False)
    assert a.params == d.params == count_params(m).total
    names = {o.name for o in a}
    assert "attn/kv_b" not in names and {"attn/q_absorb", "attn/v_absorb"} <= names
    assert a.flops < d.flops / 5


def test_absorbed_mla_closed_forms_and_one_read_of_the_latent_cache():
    m = mla_model()
    B, S, L, N, r, rope = 4, 1024, 4, 8, 64, 16
    led = decode_ledger(m, batch=B, context=S, dtypes=DtypePolicy(kv="fp8"))
    assert led["attn/scores"].flops == 2 * B * N * S * (r + rope) * L
    assert led["attn/context"].flops == 2 * B * N * S * r * L
    assert led["attn/q_absorb"].flops == 2 * B * N * 32 * r * L
    read = sum(
        t.hbm_bytes(o.sizes) * o.count
        for o in (led["attn/scores"], led["attn/context"])
        for t in o.inputs
        if "kv_seq" in t.dims
    )
    assert read == pytest.approx(B * S * kv_cache_bytes_per_token(m, "fp8"))


def test_absorbed_and_decompressed_mla_compute_the_same_attention():
    """The algebra behind absorption, in numpy: q·(W_UK c) = (q W_UK)·c and p·(W_UV c) = (p·c) W_UV."""
    rng = np.random.default_rng(1)
    S, N, r, dn, dr, dv = 50, 4, 16, 8, 4, 8
    c, k_rope = rng.normal(size=(S, r)), rng.normal(size=(S, dr))
    W_uk, W_uv = rng.normal(size=(r, N, dn)), rng.normal(size=(r, N, dv))
    q_nope, q_rope = rng.normal(size=(N, dn)), rng.normal(size=(N, dr))

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    k = np.einsum("sr,rnd->snd", c, W_uk)
    v = np.einsum("sr,rnd->snd", c, W_uv)
    p = softmax(np.einsum("nd,snd->ns", q_nope, k) + q_rope @ k_rope.T)
    out_dec = np.einsum("ns,snd->nd", p, v)
    q_lat = np.einsum("nd,rnd->nr", q_nope, W_uk)
    p2 = softmax(q_lat @ c.T + q_rope @ k_rope.T)
    out_abs = np.einsum("nr,rnd->nd", p2 @ c, W_uv)
    assert np.allclose(out_dec, out_abs)


def test_mla_form_follows_the_cheaper_flops():
    m = load_model("deepseek-v3")
    assert mla_absorbed_by_default(m, 1, 8192)
    assert not mla_absorbed_by_default(m, 8192, 8192)
    for T, S in ((1, 8192), (64, 8192), (512, 8192), (8192, 8192)):
        auto = build_ledger(m, seq=T, kv_seq=S).flops
        both = [build_ledger(m, seq=T, kv_seq=S, mla_absorb=f).flops for f in (True, False)]
        assert auto == pytest.approx(min(both), rel=0.02)


def test_deepseek_decode_no_longer_decompresses_the_cache():
    """The issue's reproduction: B=64, S=8192 decode spent 99.3% of its FLOPs in attn/kv_b."""
    led = decode_ledger(load_model("deepseek-v3"), batch=64, context=8192)
    assert all(o.name != "attn/kv_b" for o in led)
    attn = sum(o.flops for o in led if o.kind == OpKind.ATTENTION)
    assert attn / led.flops < 0.7
    cache = led["attn/scores"].inputs[1]
    assert cache.dims == ("batch", "kv_seq", "kv_a_dim")


# ---- causal masks, windows, prefill -----------------------------------------------------------


@pytest.mark.parametrize(
    "T,S,W",
    [(8, 8, None), (5, 12, None), (1, 9, None), (12, 12, 4), (6, 20, 8), (3, 20, 30), (10, 10, 10)],
)
def test_causal_fraction_matches_a_mask(T, S, W):
    pos = np.arange(S - T + 1, S + 1)[:, None]  # query positions (1-based)
    key = np.arange(1, S + 1)[None, :]
    mask = (key <= pos) & ((key > pos - W) if W else True)
    m = tiny(sliding_window=W, local_layer_period=1 if W else 0)
    led = build_ledger(m, batch=1, seq=T, kv_seq=S)
    sc = next(o for o in led if o.name.startswith("attn/scores"))
    dense = 2 * T * sc.sizes["kv_seq"] * m.n_heads * m.d_head * sc.count
    assert sc.flops / dense == pytest.approx(mask.sum() / (T * sc.sizes["kv_seq"]))


def test_prefill_computes_one_logit_row_and_skips_the_cached_prefix():
    m = tiny()
    full = prefill_ledger(m, batch=2, prompt=512)
    assert full["unembed"].flops == 2 * 2 * m.d_model * m.vocab
    assert full["attn/q"].flops == build_ledger(m, batch=2, seq=512)["attn/q"].flops
    hit = prefill_ledger(m, batch=2, prompt=512, cached=384)
    assert hit["attn/q"].flops == pytest.approx(full["attn/q"].flops / 4)
    assert hit["attn/scores"].sizes["kv_seq"] == 512
    with pytest.raises(SpecError):
        prefill_ledger(m, prompt=512, cached=512)


def test_decode_sliding_window_layers_read_at_most_the_window():
    m = load_model("gemma-2-9b")
    led = decode_ledger(m, batch=1, context=32768)
    assert led["attn/scores_local"].sizes["kv_seq"] == m.sliding_window
    assert led["attn/scores_global"].sizes["kv_seq"] == 32768
    assert led["attn/scores_local"].count + led["attn/scores_global"].count == m.n_layers


def test_speculative_verify_step_is_a_short_decode():
    m = tiny()
    one = decode_ledger(m, batch=8, context=1000)
    five = decode_ledger(m, batch=8, context=1000, tokens_per_step=5)
    assert five["mlp/up"].flops == 5 * one["mlp/up"].flops
    assert five["mlp/up"].weight_bytes == one["mlp/up"].weight_bytes


def test_dtype_policy_for_experts_and_embeddings():
    m = tiny(moe=MoESpec(n_experts=8, top_k=2, d_ff_expert=128))
    led = build_ledger(m, dtypes=DtypePolicy(weights="fp8", experts="int4", embeddings="bf16"))
    assert led["moe/up"].weight.dtype == "int4"
    assert led["attn/q"].weight.dtype == "fp8"
    assert led["unembed"].weight.dtype == "bf16" and led["embed"].inputs[0].dtype == "bf16"
    assert DtypePolicy(weights="int8").experts == "int8"


def test_causal_full_keeps_the_dense_count():
    m = tiny()
    led = build_ledger(m, seq=64, kv_seq=256, causal=Causal.FULL)
    assert led["attn/scores"].flop_factor == 1.0
