"""HF config.json families added for the measured runs (issue 9 item 5): qwen3_moe, gpt_oss,
nemotron, gpt2, gpt_neox, phi3. Fixtures are the published configs, written by hand; parameter
counts are checked against the published totals (sources next to each number)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roofline.core.ledger import count_params
from roofline.errors import SpecError
from roofline.specs.hf import SUPPORTED_MODEL_TYPES, load_hf_config
from roofline.specs.model import AttentionKind, MLPKind

HF = Path(__file__).parent / "data" / "hf"

# fixture, published total, published active, tolerance, whether the publisher's "active" counts
# the input embedding table. Sources:
#  Qwen3-30B-A3B / 235B-A22B model cards: "30.5B in total and 3.3B activated", "235B / 22B"
#  OpenAI gpt-oss model card (2025) Table 1: gpt-oss-120b 116.83B total, 5.13B active (the active
#    count excludes the embedding table: 5.13 = 5.71 - 0.58)
#  Nemotron-4 340B Technical Report (arXiv 2406.11704): 9.4B embedding + 331.6B non-embedding
#  GPT-2 small: 124,439,808 (HF safetensors metadata; learned position embeddings and the biases
#    outside q/k/v are not modelled: -0.7%)
#  Pythia paper (Biderman et al. 2023) Table 1: Pythia-1.4B 1,414,647,808 (biases outside q/k/v
#    and LayerNorm biases not modelled: -0.03%)
#  microsoft/Phi-3-mini-4k-instruct HF safetensors metadata: 3,821,079,552 (exact)
PUBLISHED = [
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02, True),
    ("qwen3-235b-a22b", 235e9, 22e9, 0.01, True),
    ("gpt-oss-120b", 116.83e9, 5.13e9, 0.002, False),
    ("nemotron-4-340b", 341.0e9, None, 0.001, True),
    ("gpt2", 124_439_808, None, 0.01, True),
    ("pythia-1.4b", 1_414_647_808, None, 0.001, True),
    ("phi-3-mini-4k", 3_821_079_552, None, 0.0, True),
]


@pytest.mark.parametrize(("fixture", "total", "active", "tol", "embed_counted"), PUBLISHED)
def test_param_counts_match_published(fixture, total, active, tol, embed_counted):
    m = load_hf_config(HF / f"{fixture}.json")
    c = count_params(m)
    assert c.total == pytest.approx(total, rel=tol, abs=1)
    if active is not None:
        got = c.active if embed_counted else c.active - m.vocab * m.d_model
        assert got == pytest.approx(active, rel=0.02)


def test_supported_types():
    assert {"qwen3_moe", "gpt_oss", "nemotron", "gpt2", "gpt_neox", "phi3"} <= set(
        SUPPORTED_MODEL_TYPES
    )


def test_qwen3_moe_shape():
    m = load_hf_config(HF / "qwen3-30b-a3b.json")
    assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.d_head) == (48, 2048, 32, 4, 128)
    assert (m.moe.n_experts, m.moe.top_k, m.moe.d_ff_expert, m.moe.dense_layers) == (128, 8, 768, 0)
    assert m.qk_norm and not m.tied_embeddings and m.sliding_window is None


def test_gpt_oss_shape(tmp_path):
    m = load_hf_config(HF / "gpt-oss-120b.json")
    assert m.attention is AttentionKind.GQA and m.d_head == 64 and m.qkv_bias
    assert (m.moe.n_experts, m.moe.top_k, m.moe.d_ff_expert) == (128, 4, 2880)
    assert (m.sliding_window, m.local_layer_period, m.n_local_layers) == (128, 2, 18)
    # without layer_types the GptOssConfig default is the same alternation
    d = json.loads((HF / "gpt-oss-120b.json").read_text())
    del d["layer_types"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    assert load_hf_config(p).n_local_layers == 18


def test_plain_mlp_families():
    for fixture in ("nemotron-4-340b", "gpt2", "pythia-1.4b"):
        assert load_hf_config(HF / f"{fixture}.json").mlp is MLPKind.PLAIN, fixture
    g = load_hf_config(HF / "gpt2.json")
    assert (g.n_layers, g.d_model, g.n_heads, g.d_ff, g.max_seq_len) == (12, 768, 12, 3072, 1024)
    assert g.tied_embeddings and g.qkv_bias  # GPT-2 ties lm_head to wte; c_attn has a bias
    n = load_hf_config(HF / "nemotron-4-340b.json")
    assert (n.n_kv_heads, n.d_head, n.tied_embeddings) == (8, 192, False)
    p = load_hf_config(HF / "pythia-1.4b.json")
    assert p.attention is AttentionKind.MHA and p.qkv_bias and not p.tied_embeddings


def test_phi3_window_on_every_layer():
    m = load_hf_config(HF / "phi-3-mini-4k.json")
    assert (m.sliding_window, m.local_layer_period, m.n_local_layers) == (2047, 1, 32)
    assert m.name == "Phi-3-mini-4k-instruct" and m.mlp is MLPKind.GATED


def _write(tmp_path, d):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    return p


def test_qwen3_moe_leading_dense_layers_and_errors(tmp_path):
    base = json.loads((HF / "qwen3-30b-a3b.json").read_text())
    m = load_hf_config(_write(tmp_path, base | {"mlp_only_layers": [0, 1]}))
    assert m.moe.dense_layers == 2 and m.n_dense_layers == 2
    with pytest.raises(SpecError, match="mlp_only_layers"):
        load_hf_config(_write(tmp_path, base | {"mlp_only_layers": [3, 7]}))
    with pytest.raises(SpecError, match="decoder_sparse_step"):
        load_hf_config(_write(tmp_path, base | {"decoder_sparse_step": 2}))
    with pytest.raises(SpecError, match="num_experts_per_tok"):
        load_hf_config(_write(tmp_path, base | {"num_experts_per_tok": 129}))


def test_gpt2_defaults_n_inner_to_four_d(tmp_path):
    base = json.loads((HF / "gpt2.json").read_text())
    assert load_hf_config(_write(tmp_path, base | {"n_inner": None})).d_ff == 4 * 768
    assert load_hf_config(_write(tmp_path, base | {"n_inner": 1000})).d_ff == 1000
    with pytest.raises(SpecError, match="'n_layer'"):
        load_hf_config(_write(tmp_path, base | {"n_layer": "12"}))
