"""Linear-attention hybrids (Gated DeltaNet) and DSA sparse attention as model features.

Every number is a hand computation from the layer's definition (Gated DeltaNet, arXiv
2412.06464; chunked delta rule, arXiv 2406.06484 §3.2; DeepSeek-V3.2-Exp DSA), the published
parameter counts of the catalog models, or the book's KV-cache rule (transformers.md).
"""

from __future__ import annotations

import json

import pytest

from roofline.core.ledger import (
    LINEAR_STATE_DTYPE,
    DtypePolicy,
    build_ledger,
    count_params,
    decode_ledger,
    kv_cache_bytes_per_token,
    linear_state_bytes_per_sequence,
    prefill_ledger,
)
from roofline.errors import SpecError
from roofline.specs.hf import load_hf_config
from roofline.specs.model import (
    DSASpec,
    LinearAttentionSpec,
    MLASpec,
    ModelSpec,
    model_from_dict,
)
from roofline.specs.model_catalog import load_model
from roofline.units import dtype_bytes

# a small hybrid: 8 layers, every 4th full attention -> layers 3 and 7 full, 6 linear
HK, HV, DK, DV, KC, D = 2, 4, 8, 16, 4, 64
HYBRID = ModelSpec(
    name="tiny-hybrid",
    n_layers=8,
    d_model=D,
    d_ff=128,
    n_heads=4,
    n_kv_heads=2,
    d_head=16,
    vocab=100,
    linear=LinearAttentionSpec(HK, HV, DK, DV, conv_kernel=KC, full_attention_interval=4),
)
# a small MLA model with DSA (top-k 4)
R, ROPE, NOPE, VD, QL, N = 32, 8, 16, 16, 24, 4
HI, DI, TOPK = 2, 8, 4
MLA = MLASpec(
    q_lora_rank=QL, kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=VD
)
DSA_MODEL = ModelSpec(
    name="tiny-dsa",
    n_layers=3,
    d_model=D,
    d_ff=128,
    n_heads=N,
    n_kv_heads=N,
    d_head=NOPE + ROPE,
    vocab=100,
    mla=MLA,
    dsa=DSASpec(index_n_heads=HI, index_head_dim=DI, index_topk=TOPK),
)


def _rows(led, prefix):
    return {o.name: o for o in led if o.name.startswith(prefix)}


# -- the model spec -------------------------------------------------------------------------


def test_layer_pattern_counts():
    assert [HYBRID.is_full_attention_layer(i) for i in range(8)] == [False, False, False, True] * 2
    assert (HYBRID.n_attention_layers, HYBRID.n_linear_layers) == (2, 6)
    q = load_model("qwen3.5-397b-a17b")
    assert (q.n_attention_layers, q.n_linear_layers) == (15, 45)  # "3:1", 45 + 15 layers


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            {
                "linear": {
                    "n_key_heads": 3,
                    "n_value_heads": 4,
                    "key_head_dim": 8,
                    "value_head_dim": 8,
                }
            },
            "n_key_heads",
        ),
        (
            {
                "linear": {
                    "n_key_heads": 2,
                    "n_value_heads": 4,
                    "key_head_dim": 8,
                    "value_head_dim": 8,
                    "full_attention_interval": 1,
                }
            },
            "full_attention_interval",
        ),
        (
            {
                "linear": {
                    "n_key_heads": 2,
                    "n_value_heads": 4,
                    "key_head_dim": 8,
                    "value_heads_dim": 8,
                }
            },
            "value_head_dim",
        ),
        ({"dsa": {"index_n_heads": 2, "index_head_dim": 8, "index_topk": 4}}, "[mla]"),
        ({"dsa": {"index_n_heads": 2, "index_head_dim": 8}}, "index_topk"),
    ],
)
def test_bad_tables_are_spec_errors(change, needle):
    base = {"name": "m", "n_layers": 8, "d_model": 64, "d_ff": 128, "n_heads": 4, "vocab": 100}
    with pytest.raises(SpecError) as e:
        model_from_dict({**base, **change}, "test.toml")
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "name, total, active, tol_active",
    [
        # Qwen3.5-397B-A17B: 397B total, 17B activated (the name; model card); the vision tower
        # and the shared-expert gate are not modelled
        ("qwen3.5-397b-a17b", 397e9, 17e9, 0.03),
        # GLM-5: 744B total, 40B active (zai-org/GLM-5 model card)
        ("glm-5", 744e9, 40e9, 0.05),
    ],
)
def test_catalog_param_counts(name, total, active, tol_active):
    m = load_model(name)
    c = count_params(m)
    assert c.total == pytest.approx(total, rel=0.005)
    assert c.active == pytest.approx(active, rel=tol_active)
    assert (m.published_params, m.published_active_params) == (total, active)


# -- HF config.json -------------------------------------------------------------------------

_QWEN35_TEXT = {  # restated from specs/models/qwen3.5-397b-a17b.toml (its cited config)
    "model_type": "qwen3_5_moe_text",
    "num_hidden_layers": 60,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "attn_output_gate": True,
    "full_attention_interval": 4,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 15,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 64,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 1024,
    "shared_expert_intermediate_size": 1024,
    "mlp_only_layers": [],
    "mtp_num_hidden_layers": 1,
}
_GLM5 = {  # restated from specs/models/glm-5.toml (its cited config)
    "model_type": "glm_moe_dsa",
    "num_hidden_layers": 78,
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "vocab_size": 154880,
    "max_position_embeddings": 202752,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "first_k_dense_replace": 3,
    "kv_lora_rank": 512,
    "q_lora_rank": 2048,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
}
_SAME = ("name", "aliases", "source", "family", "published_params", "published_active_params")


def _arch(m: ModelSpec) -> dict:
    return {k: v for k, v in m.to_dict().items() if k not in _SAME}


@pytest.mark.parametrize(
    "config, preset",
    [
        (
            {
                "model_type": "qwen3_5_moe",
                "text_config": _QWEN35_TEXT,
                "tie_word_embeddings": False,
            },
            "qwen3.5-397b-a17b",
        ),
        (_GLM5, "glm-5"),  # index_* absent: GlmMoeDsaConfig's defaults 32 / 128 / 2048
    ],
)
def test_hf_config_reads_the_catalog_architecture(tmp_path, config, preset):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(config))
    assert _arch(load_hf_config(p)) == _arch(load_model(preset))


def test_hf_layer_types_other_than_the_interval_are_refused(tmp_path):
    bad = dict(_QWEN35_TEXT, layer_types=["full_attention"] + ["linear_attention"] * 59)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(SpecError) as e:
        load_hf_config(p)
    assert "layer_types" in str(e.value)


# -- the ledger: a Gated DeltaNet layer -----------------------------------------------------


def test_linear_decode_flops_and_bytes_by_hand():
    B, S = 3, 100
    led = decode_ledger(HYBRID, batch=B, context=S)
    lin = _rows(led, "attn/lin_")
    n = HYBRID.n_linear_layers
    conv_ch = 2 * HK * DK + HV * DV
    # per token and layer: projections q, k (key heads), v, z (value heads), β/α, out
    proj = 2 * D * (2 * HK * DK + 2 * HV * DV + 2 * HV) + 2 * HV * DV * D
    conv = 2 * KC * conv_ch
    state = 3 * 2 * HV * DK * DV  # u = β(v − Sᵀk), o = Sᵀq, S += k·uᵀ
    assert "attn/lin_chunk" not in lin  # the recurrent step has no chunk
    assert sum(o.flops for o in lin.values()) == pytest.approx(B * n * (proj + conv + state))
    b = dtype_bytes("bf16")
    sb = dtype_bytes(LINEAR_STATE_DTYPE)
    # the state is read once (state_in) and written once (state_update) per step
    assert lin["attn/lin_state_in"].bytes == pytest.approx(
        B * n * (HK * DK * b + HV * DK * DV * sb + HV * DV * b)
    )
    assert lin["attn/lin_state_update"].bytes == pytest.approx(B * n * HV * DK * DV * sb)
    # only the full-attention layers attend over the cache
    assert led["attn/scores"].count == HYBRID.n_attention_layers == 2


def test_linear_prefill_chunk_flops_by_hand():
    T = 200  # chunk C = 64
    led = prefill_ledger(HYBRID, batch=2, prompt=T)
    c = led["attn/lin_chunk"]
    assert c.flops == pytest.approx(
        2 * 2 * T * HV * 64 * (3 * DK + 2 * DV) * HYBRID.n_linear_layers
    )
    assert c.bytes == 0  # within-chunk tiles stay on chip
    short = prefill_ledger(HYBRID, batch=1, prompt=10)["attn/lin_chunk"]  # C = min(64, T)
    assert short.flops == pytest.approx(2 * 10 * HV * 10 * (3 * DK + 2 * DV) * 6)
    # the state products are linear in T: O(L) per token, no T² term
    per_tok = [prefill_ledger(HYBRID, prompt=t)["attn/lin_state_in"].flops / t for t in (128, 4096)]
    assert per_tok[0] == pytest.approx(per_tok[1]) == pytest.approx(2 * HV * DK * DV * 6)


def test_hybrid_kv_per_sequence_is_the_full_layer_share_of_a_dense_model():
    """Book transformers.md: KV/token = 2·K·H·L·bytes over the layers that cache; a 3:1 hybrid
    caches in 1 layer of 4, plus a fixed state per sequence that does not grow with context."""
    q = load_model("qwen3.5-397b-a17b")
    dense = q.with_(linear=None)
    per_tok = kv_cache_bytes_per_token(q, "bf16")
    assert per_tok == pytest.approx(kv_cache_bytes_per_token(dense, "bf16") * 15 / 60)
    assert per_tok == 2 * 2 * 256 * 15 * 2
    conv_ch = 2 * 16 * 128 + 64 * 128
    state = 45 * (64 * 128 * 128 + 3 * conv_ch) * 4
    assert linear_state_bytes_per_sequence(q) == state
    for ctx in (1024, 65536):
        assert kv_cache_bytes_per_token(q, "bf16", context=ctx) * ctx == pytest.approx(
            per_tok * ctx + state
        )
    assert linear_state_bytes_per_sequence(dense) == 0


# -- the ledger: a DSA layer ----------------------------------------------------------------


def test_dsa_decode_flops_and_bytes_by_hand():
    B, S = 2, 50  # S > top-k: attention reads 4 of 50 cached latents
    led = decode_ledger(DSA_MODEL, batch=B, context=S)
    L = DSA_MODEL.n_layers
    # the lightning indexer scores every cached key: 2·H_I·d_I per (query, key), FP8 keys read
    idx = led["attn/index_scores"]
    assert idx.flops == pytest.approx(2 * B * S * HI * DI * L)
    assert idx.bytes == pytest.approx(L * B * (HI * DI * 1 + S * DI * 1))
    # absorbed MLA over the top-k: scores over r + rope, context over r
    assert led["attn/scores"].flops == pytest.approx(2 * B * N * TOPK * (R + ROPE) * L)
    assert led["attn/context"].flops == pytest.approx(2 * B * N * TOPK * R * L)
    cache_read = B * TOPK * (R + ROPE) * 2 * L  # bf16 latents of the chosen keys
    q_read = B * N * (R + ROPE) * 2 * L
    assert led["attn/scores"].bytes == pytest.approx(cache_read + q_read)
    # the same model without DSA reads every latent
    full = decode_ledger(DSA_MODEL.with_(dsa=None), batch=B, context=S, mla_absorb=True)
    assert full["attn/scores"].flops / led["attn/scores"].flops == pytest.approx(S / TOPK)


INDEXER_KERNELS = (
    "attn/index_k_norm",
    "attn/index_rope",
    "attn/index_rotate_q",
    "attn/index_rotate_k",
    "attn/index_quant_q",
    "attn/index_quant_k",
    "attn/index_store",
    "attn/index_w_scale",
)


def test_dsa_indexer_elementwise_kernels_one_per_layer_and_small():
    """The indexer's own elementwise kernels (k LayerNorm, RoPE, two Hadamards, two FP8
    quantisations, the index-key store, the weights' scaling): one row each, a launch per DSA
    layer, moving per token what the index query/key hold; none without DSA or elementwise."""
    B, S = 2, 50
    led = decode_ledger(DSA_MODEL, batch=B, context=S)
    L = DSA_MODEL.n_layers
    rows = _rows(led, "attn/index_")
    assert set(INDEXER_KERNELS) <= set(rows)
    for name in INDEXER_KERNELS:
        assert rows[name].count == L
        # at most the index query and key in bf16, read and written
        assert rows[name].bytes <= L * B * (2 * HI * DI * 2 + 2 * DI * 2)
    # by hand: the query's Hadamard reads and writes H_I·d_I bf16 values, log2(d_I) FLOPs each
    assert rows["attn/index_rotate_q"].bytes == pytest.approx(L * B * HI * DI * 2 * 2)
    assert rows["attn/index_rotate_q"].flops == pytest.approx(L * B * HI * DI * 3)
    # the key's FP8 quantisation: d_I bf16 in, d_I fp8 out
    assert rows["attn/index_quant_k"].bytes == pytest.approx(L * B * DI * (2 + 1))
    # RoPE over the first qk_rope_head_dim dims of the query's heads and of the key
    assert rows["attn/index_rope"].bytes == pytest.approx(L * B * ROPE * (2 * HI + 1) * 2)
    # the indexer's kernels sit between its projections and its scores
    names = [o.name for o in led]
    assert names.index("attn/index_w") < names.index("attn/index_k_norm")
    assert names.index("attn/index_w_scale") < names.index("attn/index_scores")
    bare = build_ledger(DSA_MODEL, batch=B, seq=1, kv_seq=S, include_elementwise=False)
    assert not set(INDEXER_KERNELS) & {o.name for o in bare}
    assert "attn/index_topk" in {o.name for o in bare}  # the select is the indexer's output
    plain = decode_ledger(DSA_MODEL.with_(dsa=None), batch=B, context=S)
    assert not any(o.name.startswith("attn/index_") for o in plain)


def test_dsa_prefill_counts_min_position_topk_keys_per_query():
    T = 10
    led = prefill_ledger(DSA_MODEL, prompt=T)
    keys = sum(min(p, TOPK) for p in range(1, T + 1))  # query p sees min(p, k) keys
    L = DSA_MODEL.n_layers
    assert led["attn/scores"].flops == pytest.approx(2 * N * (R + ROPE) * keys * L)
    # the indexer is causal over all T keys: Σ p = T(T+1)/2 pairs
    assert led["attn/index_scores"].flops == pytest.approx(2 * HI * DI * T * (T + 1) / 2 * L)


def test_dsa_kv_cache_stays_full_mla_plus_the_index_key():
    g = load_model("glm-5")
    mla = (512 + 64) * 1  # fp8 latent + rope key
    assert kv_cache_bytes_per_token(g, "fp8") == 78 * (mla + 128 * 1)
    assert kv_cache_bytes_per_token(g, "fp8", context=8192) == kv_cache_bytes_per_token(g, "fp8")


def test_quantised_policy_keeps_index_keys_fp8_and_state_fp32():
    led = decode_ledger(DSA_MODEL, batch=1, context=8, dtypes=DtypePolicy(kv="bf16"))
    assert led["attn/index_scores"].inputs[1].dtype == "fp8"
    hy = build_ledger(HYBRID, batch=1, seq=1, kv_seq=8, dtypes=DtypePolicy(kv="fp8"))
    assert hy["attn/lin_state_in"].inputs[1].dtype == "fp32"


# -- serving and training on a hybrid ---------------------------------------------------------


def test_serving_prices_the_state_per_sequence_not_per_token():
    from roofline.serving.inference import Quant, Rows

    rows = Rows.of(HYBRID, Quant())
    shared = {o.name for o in rows.shared}
    assert {"attn/lin_q", "attn/lin_out"} <= shared  # token rows: one GEMM over all tokens
    per_seq = {o.name for o in rows.decode}
    assert {"attn/lin_state_in", "attn/lin_state_out", "attn/lin_state_update"} <= per_seq
    assert "attn/lin_chunk" in {o.name for o in rows.prefill}


def test_serving_kv_pool_holds_the_state():
    """Per chip: the attention cache over tp (copied tp/K times past the 2 KV heads) plus the
    linear state, split by value heads over tp and never copied."""
    from roofline.serving.inference import Quant, ServePlan, memory_per_chip

    q = load_model("qwen3.5-397b-a17b")
    B, C = 8, 4096
    attn = 2 * 2 * 256 * 15 * 2 * C  # one sequence's KV in the 15 full layers
    state = linear_state_bytes_per_sequence(q)
    for tp, copies in ((2, 1), (8, 4)):
        m = memory_per_chip(q, ServePlan(tp=tp), Quant(), B, C)
        assert float(m.kv_bytes) == pytest.approx(B * (attn * copies + state) / tp)


@pytest.mark.parametrize("model", ["qwen3.5-397b-a17b", "glm-5"])
def test_cli_serve_and_train_run_on_the_new_models(model, capsys):
    from roofline.cli import main

    rc = main(
        [
            "serve", "--model", model, "--system", "b200:8", "--plan", "tp=8",
            "--prompt", "2048", "--gen", "256", "--concurrency", "16", "--json",
        ]
    )  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["best"]["ttft_s"] > 0 and doc["best"]["tpot_s"] > 0
    rc = main(
        [
            "train", "--model", model, "--system", "h100:512", "--seq", "4096",
            "--plan", "fsdp=64,ep=8,microbatch=1,remat=full", "--json",
        ]
    )  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["step_time_s"] > 0
    assert doc["memory_breakdown"]["activations"] > 0


def test_training_keeps_the_state_of_each_linear_layer():
    """Without remat the backward pass keeps each linear layer's input state S (the chunked
    kernels recompute the per-chunk states from it): Hv·dk·dv fp32 values per sequence."""
    from roofline.core.memory import saved_tensors
    from roofline.specs.plan import Remat, RematKind

    led = build_ledger(HYBRID, batch=3, seq=256)
    kept = {(op.name, t.name): (op, t) for op, t in saved_tensors(led, Remat(RematKind.NONE))}
    op, t = kept[("attn/lin_state_in", "S")]
    assert t.nbytes(op.sizes) * op.count == 3 * HV * DK * DV * 4 * HYBRID.n_linear_layers


def test_verify_refuses_a_hybrid_instead_of_compiling_gqa_layers(tmp_path, capsys):
    from roofline.cli import main

    p = tmp_path / "hybrid.toml"
    p.write_text(
        'name = "h"\nn_layers = 4\nd_model = 256\nd_ff = 512\nn_heads = 4\nn_kv_heads = 2\n'
        "vocab = 1000\n[linear]\nn_key_heads = 2\nn_value_heads = 4\nkey_head_dim = 32\n"
        "value_head_dim = 32\n"
    )
    assert main(["verify", "--model", str(p), "--plan", "tp=2", "--devices", "2"]) == 2
    assert "linear-attention layers" in capsys.readouterr().err


def test_model_command_states_the_kv_formula_it_computes(capsys):
    from roofline.cli import main

    assert main(["model", "qwen3.5-397b-a17b"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("KV cache/token"))
    assert "2·15·2·256·2 over the 15 full-attention layers" in line
    assert main(["model", "glm-5"]) == 0
    out = capsys.readouterr().out
    assert "(512 + 64)·78·2 + 128·78·1 (DSA fp8 index key)" in out


def test_deepseek_v32_is_deepseek_v3_plus_the_indexer():
    v3, v32 = load_model("deepseek-v3"), load_model("deepseek-v3.2")
    assert _arch(v32.with_(dsa=None)) == _arch(v3)
    # per layer: wq_b [q_lora, 64·128], wk [D, 128], weights_proj [D, 64]
    indexer = 61 * (1536 * 64 * 128 + 7168 * 128 + 7168 * 64)
    assert count_params(v32).total - count_params(v3).total == indexer
    cfg = {
        "model_type": "deepseek_v32",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
        "topk_method": "noaux_tc",
        "n_group": 8,
        "topk_group": 4,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "num_nextn_predict_layers": 1,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 2048,
    }
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "config.json"
        p.write_text(json.dumps(cfg))
        assert _arch(load_hf_config(p)) == _arch(v32)


def test_qwen3_next_reads_from_its_config_and_counts_80b():
    """Qwen3-Next-80B-A3B: 80B total (model card); "3B activated" counts no embedding tables:
    the ledger's active 3.87B less the 2 x 151936 x 2048 embedding and unembedding = 3.25B."""
    q = load_model("qwen3-next-80b-a3b")
    c = count_params(q)
    assert c.total == pytest.approx(80e9, rel=0.005)
    emb = c.breakdown["embed"] + c.breakdown["unembed"]
    assert emb == 2 * 151936 * 2048
    assert c.active - emb == pytest.approx(3e9, rel=0.1)
    cfg = {
        "model_type": "qwen3_next",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "mlp_only_layers": [],
        "decoder_sparse_step": 1,
        "tie_word_embeddings": False,
    }
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "config.json"
        p.write_text(json.dumps(cfg))
        assert _arch(load_hf_config(p)) == _arch(q)
