"""The ledger against the book's closed forms (transformers.md), plus properties and errors.

Letters: B batch, T seq, D d_model, F d_ff, N heads, K kv heads, H head dim, V vocab, L layers.
Training FLOPs = 3 × forward (2 forward + 4 backward per weight), book "6NPM".
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roofline.core.ledger import (
    Causal,
    DtypePolicy,
    OpKind,
    build_ledger,
    count_params,
    flops_per_token,
    forward_flops,
    kv_cache_bytes_per_token,
)
from roofline.core.roofline import Bound, analyze
from roofline.errors import SpecError
from roofline.specs.chip import load_chip
from roofline.specs.model import MLPKind, ModelSpec, MoESpec
from roofline.specs.model_catalog import load_model
from roofline.units import DTYPE_BYTES

B, T, D, F, N, K, H, V, L = 3, 128, 512, 1536, 8, 2, 64, 1000, 4


def small(**kw) -> ModelSpec:
    args = {
        "name": "small",
        "n_layers": L,
        "d_model": D,
        "d_ff": F,
        "n_heads": N,
        "n_kv_heads": K,
        "d_head": H,
        "vocab": V,
    }
    args.update(kw)
    return ModelSpec(**args)


def train(led, *names: str, prefix: str | None = None) -> float:
    """Training FLOPs (forward + backward) of the named rows (or rows under a prefix)."""
    rows = [o for o in led if o.name in names or (prefix and o.name.startswith(prefix + "/"))]
    assert rows, (names, prefix)
    return sum(o.flops + o.backward_flops for o in rows)


# ---- closed forms (book transformers.md, "Counting parameters and FLOPs") ------------------


def test_gated_mlp_train_flops_18BTDF_and_3DF_params():
    led = build_ledger(small(), batch=B, seq=T)
    mm = [o for o in led.select("mlp") if o.kind == OpKind.MATMUL]
    assert sum(o.flops + o.backward_flops for o in mm) == 18 * B * T * D * F * L
    assert sum(o.params for o in mm) == 3 * D * F * L


def test_plain_mlp_train_flops_12BTDF_and_2DF_params():
    led = build_ledger(small(mlp=MLPKind.PLAIN), batch=B, seq=T)
    mm = [o for o in led.select("mlp") if o.kind == OpKind.MATMUL]
    assert sum(o.flops + o.backward_flops for o in mm) == 12 * B * T * D * F * L
    assert sum(o.params for o in mm) == 2 * D * F * L


def test_attention_projections_12BTD_NplusK_H():
    led = build_ledger(small(), batch=B, seq=T)
    assert train(led, "attn/q", "attn/k", "attn/v", "attn/out") == 12 * B * T * D * (N + K) * H * L
    assert (
        sum(led[n].params for n in ("attn/q", "attn/k", "attn/v", "attn/out"))
        == 2 * D * (N + K) * H * L
    )


def test_attention_dot_products_12BT2NH_with_full_causal_count():
    led = build_ledger(small(), batch=B, seq=T, causal=Causal.FULL)
    assert train(led, "attn/scores", "attn/context") == 12 * B * T * T * N * H * L


def test_causal_half_counts_the_unmasked_triangle():
    full = build_ledger(small(), batch=B, seq=T, causal=Causal.FULL)
    half = build_ledger(small(), batch=B, seq=T, causal=Causal.HALF)
    f = train(full, "attn/scores", "attn/context")
    assert train(half, "attn/scores", "attn/context") == pytest.approx(f * (T + 1) / (2 * T))


def test_unfused_kernel_adds_softmax_and_dropout_9_bytes_per_score():
    """Without a flash kernel the score matrix crosses HBM: the softmax reads the scores and
    writes the probabilities (2 + 2 bytes at 16 bits), the dropout reads them and writes the
    dropped ones and a one-byte mask (2 + 2 + 1): 9·B·N·T² bytes per layer forward
    (Korthikanti et al. 2022 §4.1's softmax output, mask and dropout output)."""
    fused = build_ledger(small(), batch=B, seq=T)
    led = build_ledger(small(), batch=B, seq=T, flash=False)
    assert not [o for o in fused if o.name in ("attn/softmax", "attn/dropout")]
    rows = {o.name: o for o in led if o.name in ("attn/softmax", "attn/dropout")}
    assert set(rows) == {"attn/softmax", "attn/dropout"}
    scores = B * N * T * T
    assert rows["attn/softmax"].bytes == 4 * scores * L
    assert rows["attn/dropout"].bytes == 5 * scores * L
    assert all(o.kind == OpKind.ELEMENTWISE for o in rows.values())
    # the GEMM rows are unchanged; only the elementwise rows are new
    assert len(led.ops) == len(fused.ops) + 2
    assert train(led, "attn/scores", "attn/context") == train(fused, "attn/scores", "attn/context")


def test_unfused_softmax_rows_follow_each_score_row():
    """A sliding-window model has a local and a global score row: each gets its own pair."""
    m = small(sliding_window=32, local_layer_period=2)
    led = build_ledger(m, batch=B, seq=T, flash=False)
    rows = {o.name: o for o in led}
    for part in ("softmax", "dropout"):
        assert rows[f"attn/{part}_local"].count == rows["attn/scores_local"].count
        assert rows[f"attn/{part}_global"].count == rows["attn/scores_global"].count
    bare = build_ledger(small(), batch=B, seq=T, flash=False, include_elementwise=False)
    assert not [o for o in bare if o.name.startswith(("attn/softmax", "attn/dropout"))]


def test_unembed_6BTDV_and_DV_params():
    led = build_ledger(small(), batch=B, seq=T)
    assert train(led, "unembed") == 6 * B * T * D * V
    assert led["unembed"].params == D * V


def test_total_is_6_params_tokens_plus_attention():
    m = small()
    tokens = B * T
    pc = count_params(m)
    matmul_params = pc.total - pc.breakdown["embed"] - pc.breakdown["norms"]
    total = 3 * forward_flops(m, T, batch=B, causal=Causal.FULL)
    assert total == pytest.approx(
        6 * matmul_params * tokens + 12 * B * T * T * N * H * L, rel=1e-12
    )
    assert flops_per_token(m, T, causal=Causal.FULL, include_attention=False) == pytest.approx(
        6 * matmul_params, rel=1e-12
    )


def test_params_summary_table_mha():
    # book table (MHA, N = K): MLP 3DF, attention 4DNH, norms D per norm, vocab DV each way
    m = small(n_kv_heads=N)
    pc = count_params(m)
    attn = sum(v for k, v in pc.breakdown.items() if k.startswith("attn/"))
    assert attn == 4 * D * N * H * L
    assert pc.breakdown["mlp"] == 3 * D * F * L
    assert pc.breakdown["norms"] == D * (2 * L + 1)
    assert pc.breakdown["embed"] == pc.breakdown["unembed"] == D * V
    assert pc.total == pc.active == sum(pc.breakdown.values())


def test_tied_embeddings_count_the_table_once():
    untied, tied = count_params(small()), count_params(small(tied_embeddings=True))
    assert untied.total - tied.total == D * V


def test_moe_active_params():
    E, k, Fe, shared = 8, 2, 768, 1
    m = small(
        moe=MoESpec(n_experts=E, top_k=k, d_ff_expert=Fe, n_shared_experts=shared, dense_layers=1)
    )
    pc = count_params(m)
    attn = 2 * D * (N + K) * H
    dense_mlp = 3 * D * F
    router = D * E
    experts = E * 3 * D * Fe
    shared_mlp = shared * 3 * D * Fe
    rest = 2 * D * V + D * (2 * L + 1)
    n_moe = L - 1
    assert pc.total == L * attn + dense_mlp + n_moe * (router + experts + shared_mlp) + rest
    assert (
        pc.active == L * attn + dense_mlp + n_moe * (router + experts * k / E + shared_mlp) + rest
    )
    # FLOPs per token see only the active experts: 6 × active matmul params
    matmul_active = pc.active - pc.breakdown["embed"] - pc.breakdown["norms"]
    assert flops_per_token(m, 64, include_attention=False) == pytest.approx(
        6 * matmul_active, rel=1e-12
    )


def test_mixtral_preset_active_params():
    m = load_model("mixtral-8x7b")
    pc = count_params(m)
    assert pc.total == pytest.approx(46.7e9, rel=0.01)
    assert pc.active == pytest.approx(12.9e9, rel=0.01)


def test_kv_cache_bytes_per_token_2LKH_bytes():
    m = small()
    for dt, b in DTYPE_BYTES.items():
        assert kv_cache_bytes_per_token(m, dt) == 2 * L * K * H * b
    assert (
        kv_cache_bytes_per_token(load_model("llama-3-70b"), "int8") == 163_840
    )  # book: 160 kB/token


def test_decode_row_reads_the_cache():
    led = build_ledger(small(), batch=B, seq=1, kv_seq=4096)
    sc = led["attn/scores"]
    assert sc.flops == 2 * B * 1 * 4096 * N * H * L  # T = 1: no causal discount


# ---- properties ----------------------------------------------------------------------------

sizes = st.integers(min_value=1, max_value=4096)


@settings(max_examples=40, deadline=None)
@given(
    batch=sizes, seq=st.integers(min_value=1, max_value=2048), causal=st.sampled_from(list(Causal))
)
def test_training_flops_linear_in_batch(batch: int, seq: int, causal: Causal) -> None:
    m = small()
    one = 3 * forward_flops(m, seq, batch=1, causal=causal)
    assert 3 * forward_flops(m, seq, batch=batch, causal=causal) == pytest.approx(
        batch * one, rel=1e-12
    )


@settings(max_examples=40, deadline=None)
@given(batch=sizes, seq=sizes)
def test_params_independent_of_batch_and_seq(batch: int, seq: int) -> None:
    m = small()
    assert (
        build_ledger(m, batch=batch, seq=seq).params
        == build_ledger(m).params
        == count_params(m).total
    )


@settings(max_examples=200, deadline=None)
@given(
    intensity_over_critical=st.floats(min_value=1e-3, max_value=1e3),
    nbytes=st.floats(min_value=1.0, max_value=1e15),
    dtype=st.sampled_from(["bf16", "int8", "int4"]),
)
def test_bound_flips_exactly_at_the_critical_intensity(
    intensity_over_critical: float, nbytes: float, dtype: str
) -> None:
    chip = load_chip("tpu-v5e")
    crit = chip.critical_intensity(dtype)
    r = analyze(intensity_over_critical * crit * nbytes, nbytes, chip, dtype)
    assert r.critical_intensity == pytest.approx(crit)
    if intensity_over_critical > 1 + 1e-12:
        assert r.bound == Bound.COMPUTE and r.t_math_s >= r.t_mem_s
    elif intensity_over_critical < 1 - 1e-12:
        assert r.bound == Bound.MEMORY and r.t_math_s < r.t_mem_s
    assert r.time_lower_s == max(r.t_math_s, r.t_mem_s)
    assert r.time_upper_s == pytest.approx(r.t_math_s + r.t_mem_s)
    assert r.time_lower_s <= r.time_upper_s <= 2 * r.time_lower_s * (1 + 1e-12)


def test_bound_at_exactly_the_ridge_is_compute():
    chip = load_chip("tpu-v5e")
    r = analyze(chip.peak("bf16"), chip.hbm_bw_bytes_per_s, chip)
    assert r.t_math_s == r.t_mem_s and r.bound == Bound.COMPUTE


@settings(max_examples=40, deadline=None)
@given(k_index=st.integers(min_value=0, max_value=4), dtype=st.sampled_from(sorted(DTYPE_BYTES)))
def test_kv_bytes_linear_in_kv_heads_and_dtype_bytes(k_index: int, dtype: str) -> None:
    kvh = [1, 2, 4, 8, 16][k_index]
    m = small(n_heads=16, n_kv_heads=kvh)
    one = kv_cache_bytes_per_token(small(n_heads=16, n_kv_heads=1), "int8")
    assert kv_cache_bytes_per_token(m, dtype) == pytest.approx(one * kvh * DTYPE_BYTES[dtype])
    led = build_ledger(m, batch=2, seq=1, kv_seq=1024, dtypes=DtypePolicy(kv=dtype))
    k_in = led["attn/scores"].inputs[1]
    assert (
        k_in.dtype == dtype
        and k_in.nbytes(led["attn/scores"].sizes) == 2 * 1024 * kvh * H * DTYPE_BYTES[dtype]
    )


@settings(max_examples=30, deadline=None)
@given(seq=st.integers(min_value=1, max_value=1 << 16))
def test_forward_flops_per_token_grows_with_seq_only_through_attention(seq: int) -> None:
    m = small()
    no_attn = flops_per_token(m, seq, training=False, include_attention=False)
    assert no_attn == pytest.approx(
        flops_per_token(m, 1, training=False, include_attention=False), rel=1e-12
    )
    assert flops_per_token(m, seq, training=False) >= no_attn


# ---- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw", [{"batch": 0}, {"batch": -1}, {"seq": 0}, {"seq": -5}, {"kv_seq": 0}]
)
def test_nonpositive_sizes_are_spec_errors(kw):
    with pytest.raises(SpecError) as e:
        build_ledger(small(), **kw)
    msg = str(e.value)
    assert "Rule:" in msg and "Fix:" in msg and "\n" not in msg


def test_unknown_kv_dtype_is_a_spec_error():
    with pytest.raises(SpecError, match="unknown dtype"):
        kv_cache_bytes_per_token(small(), "bf17")
    with pytest.raises(SpecError, match="unknown dtype"):
        DtypePolicy(weights="fp7")


def test_rows_are_itemised_and_sum_to_totals():
    led = build_ledger(load_model("llama-3-70b"), batch=2, seq=512)
    rows = led.rows()
    assert {"name", "kind", "einsum", "count", "flops", "bytes", "params", "intensity"} <= set(
        rows[0]
    )
    assert math.isclose(sum(r["flops"] for r in rows), led.flops)
    assert math.isclose(sum(r["params"] for r in rows), led.params)


def test_capacity_factor_pads_each_sequence_experts_to_int_T_k_over_E_times_cf():
    # MaxText dense_matmul (capacity_factor > 0): every expert of every sequence gets
    # int(T·k/E·cf) slots, all computed; dropless (0) computes B·T·k/E on average
    E, k, Fe, B, T = 8, 2, 768, 3, 100
    base = dict(n_experts=E, top_k=k, d_ff_expert=Fe)
    drop = build_ledger(small(moe=MoESpec(**base, capacity_factor=1.25)), batch=B, seq=T)
    free = build_ledger(small(moe=MoESpec(**base)), batch=B, seq=T)
    up_d = next(o for o in drop.ops if o.name == "moe/up")
    up_f = next(o for o in free.ops if o.name == "moe/up")
    assert up_f.sizes["capacity"] == pytest.approx(B * T * k / E)
    assert up_d.sizes["capacity"] == B * int(T * k / E * 1.25) == 3 * 31
    assert up_d.flops / up_f.flops == pytest.approx(31 / 25)


@pytest.mark.parametrize("cf", [-1.0, 100.0, True, "1.25"])
def test_capacity_factor_out_of_range_is_a_spec_error(cf):
    with pytest.raises(SpecError, match="capacity_factor"):
        MoESpec(n_experts=8, top_k=2, d_ff_expert=64, capacity_factor=cf)


def test_dropping_path_dispatch_and_combine_are_one_hot_einsums():
    # MaxText dense_matmul: 'BSM,BSEC -> EBCM' and 'EBCM,BSEC -> BSM', 2·B·T·E·C·D FLOPs each;
    # the dispatch mask (bool one-hots) takes no gradient, the combine mask (router weights) does
    E, k, Fe, B, T = 8, 2, 768, 2, 64
    led = build_ledger(
        small(moe=MoESpec(n_experts=E, top_k=k, d_ff_expert=Fe, capacity_factor=1.25)),
        batch=B,
        seq=T,
    )
    ops = {o.name: o for o in led.ops}
    C = int(T * k / E * 1.25)
    for name in ("moe/dispatch", "moe/combine"):
        assert ops[name].flops == pytest.approx(2 * B * T * E * C * D * ops[name].count)
    assert ops["moe/dispatch"].backward_flops == pytest.approx(ops["moe/dispatch"].flops)
    assert ops["moe/combine"].backward_flops == pytest.approx(2 * ops["moe/combine"].flops)
    assert all(o.batched for o in led.ops if o.name in ("moe/gate", "moe/up", "moe/down"))
    dropless = build_ledger(
        small(moe=MoESpec(n_experts=E, top_k=k, d_ff_expert=Fe)), batch=B, seq=T
    )
    assert not {"moe/dispatch", "moe/combine"} & {o.name for o in dropless.ops}
    assert not any(o.batched for o in dropless.ops)
