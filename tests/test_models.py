"""Model presets, name lookup, Hugging Face config.json loading, and published parameter counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roofline.errors import SpecError, UnknownNameError
from roofline.specs.hf import SUPPORTED_MODEL_TYPES, load_hf_config
from roofline.specs.model import AttentionKind, MLPKind, ModelSpec
from roofline.specs.model_catalog import load_model, model_names

HF = Path(__file__).parent / "data" / "hf"

# fields that describe the catalog entry, not the architecture
_META = {"name", "aliases", "family", "source", "published_params", "published_active_params"}


def arch(m: ModelSpec) -> dict:
    return {k: v for k, v in m.to_dict().items() if k not in _META}


# ---------------------------------------------------------------------------------------
# presets
# ---------------------------------------------------------------------------------------

EXPECTED_PRESETS = {
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "deepseek-v3",
    "gemma-2-9b",
    "gemma-2-27b",
    "qwen2.5-72b",
    "qwen3-8b",
    "gpt-3-175b",
    "book-tf-q1",
    "book-inference-q1",
    "book-inference-moe",
    "tiny-llama",
}


def test_expected_presets_present():
    assert EXPECTED_PRESETS <= set(model_names())


@pytest.mark.parametrize("name", model_names())
def test_every_preset_loads(name):
    m = load_model(name)
    assert m.name == name
    assert m.source, "every preset cites its source"
    assert load_model(m) is m
    m.to_dict()  # serialisable
    for a in m.aliases:
        assert load_model(a) == m, a


def test_preset_file_names_match_names():
    from roofline.specs.model import MODEL_DIR

    for p in MODEL_DIR.glob("*.toml"):
        assert load_model(p.stem).name == p.stem
        assert load_model(str(p)) == load_model(p.stem)


def test_aliases_do_not_collide():
    from roofline.specs.catalog import normalize

    seen: dict[str, str] = {}
    for name in model_names():
        m = load_model(name)
        for a in (name, *m.aliases):
            k = normalize(a)
            assert seen.setdefault(k, name) == name, f"{a!r} names both {seen[k]} and {name}"


@pytest.mark.parametrize(
    "alias, name",
    [
        ("llama3-70b", "llama-3-70b"),
        ("meta-llama/Meta-Llama-3-70B", "llama-3-70b"),
        ("Meta-Llama-3-70B", "llama-3-70b"),
        ("LLaMA-3-70B", "llama-3-70b"),
        ("llama_3_70b", "llama-3-70b"),
        ("llama-3.1-70b", "llama-3.1-70b"),
        ("meta-llama/Llama-3.1-70B", "llama-3.1-70b"),
        ("meta-llama/Meta-Llama-3.1-405B", "llama-3.1-405b"),
        ("llama-3-405b", "llama-3.1-405b"),
        ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Llama-2-13b-hf", "llama-2-13b"),
        ("llama2-7b", "llama-2-7b"),
        ("Llama-2-70b-chat-hf", "llama-2-70b"),
        ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
        ("Mixtral-8x22B", "mixtral-8x22b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("DeepSeek V3", "deepseek-v3"),
        ("google/gemma-2-9b", "gemma-2-9b"),
        ("gemma2-27b", "gemma-2-27b"),
        ("Qwen/Qwen2.5-72B", "qwen2.5-72b"),
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("GPT-3", "gpt-3-175b"),
        ("tiny", "tiny-llama"),
        ("inference-moe", "book-inference-moe"),
    ],
)
def test_aliases_resolve(alias, name):
    assert load_model(alias).name == name


def test_unknown_name_lists_closest():
    with pytest.raises(UnknownNameError) as e:
        load_model("llama-3-7b")
    msg = str(e.value)
    assert "llama-3-7b" in msg and "closest" in msg
    assert "llama-3-70b" in msg or "llama-3-8b" in msg
    with pytest.raises(UnknownNameError, match="mixtral"):
        load_model("mixtrall-8x7b")


def test_llama3_and_31_differ_only_in_context():
    for size in ("8b", "70b"):
        a, b = load_model(f"llama-3-{size}"), load_model(f"llama-3.1-{size}")
        assert a.max_seq_len == 8192 and b.max_seq_len == 131072
        assert arch(a) | {"max_seq_len": 0} == arch(b) | {"max_seq_len": 0}


def test_preset_architectures():
    m = load_model("llama-3.1-405b")
    assert (m.n_layers, m.d_model, m.d_ff, m.n_heads, m.n_kv_heads, m.d_head, m.vocab) == (
        126,
        16384,
        53248,
        128,
        8,
        128,
        128256,
    )
    assert m.attention == AttentionKind.GQA
    assert load_model("llama-2-13b").attention == AttentionKind.MHA

    ds = load_model("deepseek-v3")
    assert ds.attention == AttentionKind.MLA and ds.n_mtp_modules == 1
    assert ds.n_dense_layers == 3 and ds.n_moe_layers == 58
    assert ds.moe.n_experts == 256 and ds.moe.top_k == 8 and ds.moe.d_ff_expert == 2048
    assert ds.moe.n_shared_experts == 1 and ds.d_ff == 18432
    assert (
        ds.mla.q_lora_rank,
        ds.mla.kv_lora_rank,
        ds.mla.qk_nope_head_dim,
        ds.mla.qk_rope_head_dim,
        ds.mla.v_head_dim,
    ) == (1536, 512, 128, 64, 128)

    g9, g27 = load_model("gemma-2-9b"), load_model("gemma-2-27b")
    assert g9.d_head == 256 and g27.d_head == 128
    for g in (g9, g27):
        assert g.tied_embeddings and g.sliding_window == 4096 and g.norms_per_layer == 4
        assert g.is_local_layer(0) and not g.is_local_layer(1)
        assert g.n_local_layers == g.n_layers // 2

    assert load_model("qwen2.5-72b").qkv_bias
    gpt = load_model("gpt-3-175b")
    assert (
        gpt.mlp == MLPKind.PLAIN
        and gpt.d_ff == 4 * gpt.d_model
        and gpt.attention == AttentionKind.MHA
    )

    moe = load_model("book-inference-moe")
    assert moe.n_moe_layers == 64 and moe.moe.n_experts == 16 and moe.moe.top_k == 2
    q1 = load_model("book-inference-q1")
    assert arch(q1) | {"moe": None} == arch(moe) | {"moe": None}

    tiny = load_model("tiny-llama")
    assert (
        tiny.n_layers,
        tiny.d_model,
        tiny.d_ff,
        tiny.n_heads,
        tiny.n_kv_heads,
        tiny.d_head,
        tiny.vocab,
    ) == (2, 256, 1024, 8, 4, 32, 1024)


# ---------------------------------------------------------------------------------------
# Hugging Face config.json
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture, preset",
    [
        ("llama-2-13b.json", "llama-2-13b"),
        ("llama-3-8b.json", "llama-3-8b"),
        ("mixtral-8x7b.json", "mixtral-8x7b"),
        ("qwen2.5-72b.json", "qwen2.5-72b"),
        ("gemma-2-9b.json", "gemma-2-9b"),
        ("deepseek-v3.json", "deepseek-v3"),
        ("qwen3-8b.json", "qwen3-8b"),
    ],
)
def test_hf_config_matches_preset(fixture, preset):
    m = load_hf_config(HF / fixture)
    assert arch(m) == arch(load_model(preset))
    assert m.family == load_model(preset).family
    # load_model dispatches *.json here too
    assert load_model(HF / fixture) == m
    assert load_model(str(HF / fixture)) == m


def test_hf_name():
    assert (
        load_hf_config(HF / "llama-2-13b.json").name == "meta-llama/Llama-2-13b-hf"
    )  # _name_or_path
    assert load_hf_config(HF / "llama-3-8b.json").name == "llama-3-8b"  # file stem


def test_hf_directory(tmp_path):
    d = tmp_path / "Meta-Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text((HF / "llama-3-8b.json").read_text())
    m = load_hf_config(d)
    assert m.name == "Meta-Llama-3-8B"
    assert load_model(d) == m
    assert arch(m) == arch(load_model("llama-3-8b"))


def test_hf_head_dim_and_tying():
    m = load_hf_config(HF / "qwen3-0.6b.json")  # Qwen/Qwen3-0.6B: head_dim 128 != 1024/16
    assert (m.n_layers, m.d_model, m.d_ff, m.n_heads, m.n_kv_heads, m.d_head, m.vocab) == (
        28,
        1024,
        3072,
        16,
        8,
        128,
        151936,
    )
    assert m.tied_embeddings and m.qk_norm and not m.qkv_bias and m.sliding_window is None


def test_hf_mistral_window_on_all_layers():
    m = load_hf_config(HF / "mistral-7b-v0.1.json")
    assert m.sliding_window == 4096 and m.n_local_layers == m.n_layers == 32
    assert m.family == "mistral" and m.max_seq_len == 32768 and m.attention == AttentionKind.GQA


def test_hf_deepseek_v2_lite():
    m = load_hf_config(HF / "deepseek-v2-lite.json")
    assert m.mla.q_lora_rank is None and m.mla.kv_lora_rank == 512
    assert m.moe.n_experts == 64 and m.moe.top_k == 6 and m.moe.n_shared_experts == 2
    assert m.moe.d_ff_expert == 1408 and m.n_dense_layers == 1 and not m.moe.router_bias
    assert m.n_mtp_modules == 0


def _write(tmp_path: Path, data: dict | str, name: str = "cfg.json") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))
    return p


def _llama3(**changes) -> dict:
    d = json.loads((HF / "llama-3-8b.json").read_text())
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def test_hf_defaults(tmp_path):
    d = _llama3(num_key_value_heads=None, tie_word_embeddings=None, max_position_embeddings=None)
    m = load_hf_config(_write(tmp_path, d))
    assert m.n_kv_heads == m.n_heads == 32 and m.d_head == 128 and not m.tied_embeddings
    g = json.loads((HF / "gemma-2-9b.json").read_text())
    assert "tie_word_embeddings" not in g  # Gemma2Config ties by default
    assert load_hf_config(HF / "gemma-2-9b.json").tied_embeddings


def test_hf_qwen2_sliding_window_ignored_unless_used(tmp_path):
    assert load_hf_config(HF / "qwen2.5-72b.json").sliding_window is None
    d = json.loads((HF / "qwen2.5-72b.json").read_text()) | {
        "use_sliding_window": True,
        "max_window_layers": 0,
        "sliding_window": 32768,
    }
    m = load_hf_config(_write(tmp_path, d))
    assert m.sliding_window == 32768 and m.n_local_layers == 80
    d["max_window_layers"] = 40
    with pytest.raises(SpecError, match="max_window_layers"):
        load_hf_config(_write(tmp_path, d))


def test_hf_layer_types(tmp_path):
    d = _llama3()
    d["model_type"] = "gemma2"
    d |= {"sliding_window": 1024, "layer_types": ["sliding_attention", "full_attention"] * 16}
    m = load_hf_config(_write(tmp_path, d))
    assert m.sliding_window == 1024 and m.local_layer_period == 2 and m.n_local_layers == 16
    d["layer_types"] = ["full_attention"] * 31 + ["sliding_attention"]
    with pytest.raises(SpecError, match="layer_types"):
        load_hf_config(_write(tmp_path, d))


# ---- errors -----------------------------------------------------------------------------


def test_hf_malformed_json(tmp_path):
    p = _write(tmp_path, '{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}')
    with pytest.raises(SpecError) as e:
        load_hf_config(p)
    msg = str(e.value)
    assert str(p) in msg and "not valid JSON" in msg and "line 3" in msg and "column" in msg
    assert "Fix:" in msg and "\n" not in msg


def test_hf_not_an_object(tmp_path):
    with pytest.raises(SpecError, match="not an object"):
        load_hf_config(_write(tmp_path, "[1, 2]"))


def test_hf_missing_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_hf_config(tmp_path / "nope.json")
    with pytest.raises(SpecError, match="does not exist"):
        load_hf_config(tmp_path)  # a directory without config.json


def test_hf_unknown_model_type(tmp_path):
    p = _write(tmp_path, _llama3(model_type="rwkv"))  # was gpt_neox, supported since issue 9
    with pytest.raises(SpecError) as e:
        load_hf_config(p)
    msg = str(e.value)
    assert "rwkv" in msg and str(p) in msg
    for mt in ("llama", "mixtral", "qwen2", "qwen3", "gemma2", "deepseek_v3"):
        assert mt in msg
    assert set(SUPPORTED_MODEL_TYPES) >= {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "gemma2",
        "deepseek_v3",
    }
    with pytest.raises(SpecError, match="'model_type' is missing"):
        load_hf_config(_write(tmp_path, _llama3(model_type=None)))


@pytest.mark.parametrize(
    "field",
    ["hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "vocab_size"],
)
def test_hf_missing_field(tmp_path, field):
    p = _write(tmp_path, _llama3(**{field: None}))
    with pytest.raises(SpecError) as e:
        load_hf_config(p)
    msg = str(e.value)
    assert f"'{field}' is missing" in msg and str(p) in msg and "Fix:" in msg


def test_hf_missing_moe_field(tmp_path):
    d = json.loads((HF / "deepseek-v3.json").read_text())
    del d["kv_lora_rank"]
    with pytest.raises(SpecError, match="'kv_lora_rank' is missing"):
        load_hf_config(_write(tmp_path, d))
    d = json.loads((HF / "mixtral-8x7b.json").read_text())
    del d["num_local_experts"]
    with pytest.raises(SpecError, match="'num_local_experts' is missing"):
        load_hf_config(_write(tmp_path, d))


@pytest.mark.parametrize(
    "field, value",
    [
        ("hidden_size", 0),
        ("num_hidden_layers", -2),
        ("intermediate_size", 0),
        ("vocab_size", -1),
        ("num_attention_heads", 0),
        ("num_key_value_heads", 0),
        ("head_dim", -128),
        ("max_position_embeddings", 0),
        ("hidden_size", 40.5),
        ("num_hidden_layers", "32"),
        ("num_hidden_layers", True),
    ],
)
def test_hf_non_positive(tmp_path, field, value):
    p = _write(tmp_path, _llama3(**{field: value}))
    with pytest.raises(SpecError) as e:
        load_hf_config(p)
    msg = str(e.value)
    assert f"'{field}'" in msg and "positive integer" in msg and str(p) in msg


def test_hf_bad_bool(tmp_path):
    with pytest.raises(SpecError, match="tie_word_embeddings"):
        load_hf_config(_write(tmp_path, _llama3(tie_word_embeddings="yes")))


def test_hf_indivisible_heads(tmp_path):
    p = _write(tmp_path, _llama3(num_key_value_heads=5))
    with pytest.raises(SpecError) as e:
        load_hf_config(p)
    msg = str(e.value)
    assert "num_key_value_heads" in msg and "num_attention_heads" in msg and str(p) in msg
    assert "[1, 2, 4, 8, 16, 32]" in msg


def test_hf_head_dim_needed(tmp_path):
    with pytest.raises(SpecError, match="head_dim"):
        load_hf_config(_write(tmp_path, _llama3(hidden_size=4100, head_dim=None)))


def test_hf_too_many_experts_per_token(tmp_path):
    d = json.loads((HF / "mixtral-8x7b.json").read_text()) | {"num_experts_per_tok": 9}
    with pytest.raises(SpecError, match="num_experts_per_tok"):
        load_hf_config(_write(tmp_path, d))


# ---------------------------------------------------------------------------------------
# parameter counts against published figures
# ---------------------------------------------------------------------------------------

# (model, total, active or None, relative tolerance on total, on active). Sources:
PUBLISHED = [
    # HF safetensors metadata 8,030,261,248 (meta-llama/Meta-Llama-3-8B)
    ("llama-3-8b", 8.03e9, None, 0.005, 0.005),
    ("llama-3.1-8b", 8.03e9, None, 0.005, 0.005),
    # HF safetensors metadata 70,553,706,496; book applied-training.md "exact sum 70.55e9"
    ("llama-3-70b", 70.55e9, None, 0.005, 0.005),
    ("llama-3.1-70b", 70.55e9, None, 0.005, 0.005),
    # HF safetensors metadata 405,853,388,800 (meta-llama/Llama-3.1-405B)
    ("llama-3.1-405b", 405.9e9, None, 0.005, 0.005),
    # Mistral AI "Mixtral of experts" blog (Dec 2023): 46.7B total, 12.9B per token
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.005, 0.005),
    # Mistral AI "Cheaper, Better, Faster, Stronger" (Apr 2024): 141B total, 39B active
    # (figures rounded to 3 and 2 digits: tolerance 0.5% / 1.5%)
    ("mixtral-8x22b", 141e9, 39e9, 0.005, 0.015),
    # book training.md Q1 / inference.md: 13.0e9 (HF safetensors 13,015,864,320)
    ("llama-2-13b", 13.0e9, None, 0.005, 0.005),
    # HF safetensors metadata 6,738,415,616 and 68,976,648,192
    ("llama-2-7b", 6.74e9, None, 0.005, 0.005),
    ("llama-2-70b", 68.98e9, None, 0.005, 0.005),
    # Gemma 2 report (2024) Table 2: 9B = 917,962,752 + 8,324,201,984; 27B = 1,180,237,824 + 26,047,480,320
    # (the report pads the vocab to 256128; HF uses 256000)
    ("gemma-2-9b", 9.24e9, None, 0.005, 0.005),
    ("gemma-2-27b", 27.2e9, None, 0.005, 0.005),
    # Qwen/Qwen2.5-72B model card: 72.7B
    ("qwen2.5-72b", 72.7e9, None, 0.005, 0.005),
    # Qwen/Qwen3-8B model card: 8.2B (6.95B non-embedding)
    ("qwen3-8b", 8.2e9, None, 0.01, 0.01),
    # Brown et al. 2020 Table 2.1: 175.0B (position embeddings and non-qkv biases not modelled)
    ("gpt-3-175b", 175.0e9, None, 0.005, 0.005),
    # DeepSeek-V3 Technical Report (arXiv 2412.19437): 671B total, 37B activated, MTP excluded
    ("deepseek-v3", 671e9, 37e9, 0.02, 0.02),
    # scaling-book transformers.md Q1: exact value of L(3DF + 4DNH + D) + 2DV = 17.44e9
    ("book-tf-q1", 17.44e9, None, 0.001, 0.001),
    # scaling-book inference.md Q1: L·D·(3F + 2H(N+K)) + D·V = 18.4e9
    ("book-inference-q1", 18.4e9, None, 0.005, 0.005),
    # scaling-book inference.md Q5: 212e9 total, 31.2e9 active
    ("book-inference-moe", 212e9, 31.2e9, 0.005, 0.005),
]


@pytest.mark.parametrize(
    "name, total, active, tol, tol_active", PUBLISHED, ids=[p[0] for p in PUBLISHED]
)
def test_param_counts(name, total, active, tol, tol_active):
    from roofline.core.ledger import count_params

    m = load_model(name)
    c = count_params(m)
    assert c.total == pytest.approx(total, rel=tol)
    assert c.active == pytest.approx(active if active is not None else total, rel=tol_active)
    assert sum(c.breakdown.values()) == pytest.approx(c.total)
    assert m.published_params == total
    if active is not None:
        assert m.published_active_params == active


def test_param_counts_exact():
    """Exact totals of the HF checkpoints (safetensors metadata), where the architecture is fully modelled."""
    from roofline.core.ledger import count_params

    exact = {
        "llama-2-7b": 6_738_415_616,
        "llama-2-13b": 13_015_864_320,
        "llama-2-70b": 68_976_648_192,
        "llama-3-8b": 8_030_261_248,
        "llama-3-70b": 70_553_706_496,
        "llama-3.1-405b": 405_853_388_800,
        "mixtral-8x7b": 46_702_792_704,
        "gemma-2-9b": 9_241_705_984,
        "gemma-2-27b": 27_227_128_320,
        "qwen2.5-72b": 72_706_203_648,
    }
    for name, n in exact.items():
        assert count_params(load_model(name)).total == n, name


def test_param_counts_via_hf_json():
    from roofline.core.ledger import count_params

    # LLaMA-2 13B through its config.json: 13.0e9 (book training.md Q1)
    c = count_params(load_model(HF / "llama-2-13b.json"))
    assert c.total == pytest.approx(13.0e9, rel=0.005)
    assert c.total == count_params(load_model("llama-2-13b")).total
    ds = count_params(load_hf_config(HF / "deepseek-v3.json"))
    assert ds.total == pytest.approx(671e9, rel=0.02) and ds.active == pytest.approx(37e9, rel=0.02)
    mx = count_params(load_hf_config(HF / "mixtral-8x7b.json"))
    assert mx.total == pytest.approx(46.7e9, rel=0.005) and mx.active == pytest.approx(
        12.9e9, rel=0.005
    )
    # Qwen/Qwen3-0.6B model card: 0.6B total, 0.44B non-embedding (tied: one 151936×1024 table)
    q = count_params(load_hf_config(HF / "qwen3-0.6b.json"))
    assert q.total == pytest.approx(0.596e9, rel=0.01)
    # Mistral-7B-v0.1: 7,241,732,096 (HF safetensors metadata)
    assert count_params(load_hf_config(HF / "mistral-7b-v0.1.json")).total == 7_241_732_096
    # DeepSeek-V2-Lite model card: 15.7B total
    assert count_params(load_hf_config(HF / "deepseek-v2-lite.json")).total == pytest.approx(
        15.7e9, rel=0.005
    )
