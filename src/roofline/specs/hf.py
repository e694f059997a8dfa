"""Read a Hugging Face `config.json` into a ModelSpec.

Supported `model_type`s: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma2, deepseek_v2,
deepseek_v3, gpt_oss, nemotron, gpt2, gpt_neox, phi3; the linear-attention hybrids qwen3_next,
qwen3_5_moe / qwen3_5 (their `text_config`; Gated DeltaNet keys linear_num_key_heads,
linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim,
full_attention_interval or layer_types, attn_output_gate) and the DeepSeek-Sparse-Attention
models deepseek_v32 and glm_moe_dsa (MLA plus index_n_heads, index_head_dim, index_topk). Only the fields that fix the architecture's
shapes are read (rope scaling, softcapping, dtypes and the like are ignored). Field names and
defaults follow the transformers config classes (`src/transformers/models/<type>/configuration_*.py`):
num_key_value_heads = num_attention_heads, head_dim = hidden_size / heads, tie_word_embeddings
per family; GPT-2 spells its fields n_layer, n_embd, n_head, n_inner (default 4·n_embd),
n_positions. Not modelled (a few per mille of the parameters at most): learned position
embeddings (GPT-2), MLP/output biases and LayerNorm biases (GPT-2, GPT-NeoX), expert biases and
attention sinks (gpt-oss). Every problem is a SpecError naming the file and the field; sizes above
the physical bounds of roofline.specs.model are errors, not hangs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roofline.errors import SpecError
from roofline.specs.catalog import huge_number_error, is_dir, read_text_file, too_many_digits
from roofline.specs.model import (
    MAX_EXPERTS,
    MAX_FF,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SEQ,
    MAX_VOCAB,
    MAX_WIDTH,
    DSASpec,
    LinearAttentionSpec,
    MLASpec,
    MLPKind,
    ModelSpec,
    MoESpec,
    divisors,
)

_STANDARD_KEYS = {
    "n_layers": "num_hidden_layers",
    "d_model": "hidden_size",
    "d_ff": "intermediate_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "vocab": "vocab_size",
    "max_seq_len": "max_position_embeddings",
}


@dataclass(frozen=True)
class _Family:
    """What a model_type's transformers config class defaults to, and how it names its fields."""

    family: str
    tie_default: bool = False  # tie_word_embeddings default of the config class
    mlp: MLPKind = MLPKind.GATED  # SwiGLU/GeGLU; PLAIN for GELU / squared-ReLU MLPs
    bias_default: bool = False  # attention_bias default (q/k/v biases)
    qk_norm: bool = False
    norms_per_layer: int = 2
    keys: dict[str, str] = field(default_factory=lambda: dict(_STANDARD_KEYS))


_GPT2_KEYS = {
    "n_layers": "n_layer",
    "d_model": "n_embd",
    "d_ff": "n_inner",
    "n_heads": "n_head",
    "n_kv_heads": "n_head",
    "vocab": "vocab_size",
    "max_seq_len": "n_positions",
}
_FAMILIES: dict[str, _Family] = {
    "llama": _Family("llama"),
    "mistral": _Family("mistral"),
    "mixtral": _Family("mixtral"),
    "qwen2": _Family("qwen", bias_default=True),  # Qwen2 always has q/k/v bias
    "qwen3": _Family("qwen", qk_norm=True),
    "qwen3_moe": _Family("qwen", qk_norm=True),
    "gemma2": _Family("gemma", tie_default=True, norms_per_layer=4),  # pre/post norms
    "deepseek_v2": _Family("deepseek"),
    "deepseek_v3": _Family("deepseek"),
    "gpt_oss": _Family("gpt-oss", bias_default=True),  # GptOssConfig.attention_bias = True
    "nemotron": _Family("nemotron", mlp=MLPKind.PLAIN),  # hidden_act relu2, up/down only
    "gpt2": _Family(
        "gpt2", tie_default=True, mlp=MLPKind.PLAIN, bias_default=True, keys=_GPT2_KEYS
    ),
    "gpt_neox": _Family("gpt-neox", mlp=MLPKind.PLAIN, bias_default=True),
    "phi3": _Family("phi"),
    # Gated DeltaNet hybrids (transformers Qwen3NextConfig / Qwen3_5MoeTextConfig): q/k norm
    "qwen3_next": _Family("qwen", qk_norm=True),
    "qwen3_5_moe_text": _Family("qwen", qk_norm=True),
    "qwen3_5_text": _Family("qwen", qk_norm=True),
    # DeepSeek Sparse Attention on MLA (DeepseekV32Config, GlmMoeDsaConfig)
    "deepseek_v32": _Family("deepseek"),
    "glm_moe_dsa": _Family("glm"),
}
# multimodal wrappers whose language model is the `text_config` of another model_type
_TEXT_CONFIG_TYPES = {"qwen3_5_moe": "qwen3_5_moe_text", "qwen3_5": "qwen3_5_text"}
_HYBRID_TYPES = ("qwen3_next", "qwen3_5_moe_text", "qwen3_5_text")
_DSA_TYPES = ("deepseek_v32", "glm_moe_dsa")
_MLA_TYPES = ("deepseek_v2", "deepseek_v3", *_DSA_TYPES)
SUPPORTED_MODEL_TYPES: tuple[str, ...] = (*_FAMILIES, *_TEXT_CONFIG_TYPES)
_BOUNDS = {
    "n_layers": MAX_LAYERS,
    "d_model": MAX_WIDTH,
    "d_ff": MAX_FF,
    "n_heads": MAX_HEADS,
    "n_kv_heads": MAX_HEADS,
    "vocab": MAX_VOCAB,
    "max_seq_len": MAX_SEQ,
}
_DEFAULT_BOUND = 1 << 30


class _Cfg:
    """A parsed config.json with typed, error-reporting field access."""

    def __init__(self, data: dict[str, Any], origin: str, model_type: str) -> None:
        self.data, self.origin, self.model_type = data, origin, model_type

    def _err(self, key: str, problem: str, rule: str, fix: str) -> SpecError:
        return SpecError(f"HF config {self.origin}: field {key!r} {problem}", rule=rule, fix=fix)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def int(
        self,
        key: str,
        default: int | None = None,
        *,
        allow_zero: bool = False,
        hi: int = _DEFAULT_BOUND,
    ) -> int:
        v = self.data.get(key)
        if v is None:
            if default is not None:
                return default
            raise self._err(
                key,
                "is missing",
                rule=f"a {self.model_type} config.json must give {key}",
                fix=f'add "{key}": <value> (copy config.json unchanged from the model\'s Hugging Face repo)',
            )
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        lo = 0 if allow_zero else 1
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            kind = "a non-negative integer" if allow_zero else "a positive integer"
            shown = repr(v) if len(repr(v)) < 60 else repr(v)[:55] + "..."
            raise self._err(key, f"is {shown}", rule=f"{key} is {kind}", fix=f"set {key} to {kind}")
        if v > hi:
            raise self._err(
                key,
                f"is {v:,}",
                rule=f"{key} is at most {hi:,} (larger is not a physical size)",
                fix=f"check {key}: copy config.json unchanged from the model's Hugging Face repo",
            )
        return v

    def opt_int(self, key: str, hi: int = _DEFAULT_BOUND) -> int | None:
        return self.int(key, hi=hi) if self.has(key) else None

    def bool(self, key: str, default: bool) -> bool:
        v = self.data.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._err(
                key, f"is {v!r}", rule=f"{key} is true or false", fix=f"set {key} to true or false"
            )
        return v


def _read(path: Path) -> dict[str, Any]:
    text = read_text_file(path, "HF config")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(
            f"HF config {str(path)!r} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}",
            rule="config.json is a JSON object",
            fix=f"correct the syntax at line {e.lineno}, column {e.colno} (or download config.json again)",
        ) from None
    except ValueError as e:  # a number of more than 4,300 digits
        if too_many_digits(e):
            raise huge_number_error(f"HF config {str(path)!r}") from None
        raise
    except RecursionError:
        raise SpecError(
            f"HF config {str(path)!r} nests too deeply to be a config.json",
            rule="config.json is a flat JSON object of fields such as hidden_size",
            fix="point at the model's config.json",
        ) from None
    if not isinstance(data, dict):
        raise SpecError(
            f"HF config {str(path)!r} holds a JSON {type(data).__name__}, not an object",
            rule="config.json is a JSON object of fields such as hidden_size and num_hidden_layers",
            fix="point at the model's config.json",
        )
    return data


def _window(c: _Cfg, n_layers: int) -> tuple[int | None, int]:
    """(sliding_window, local_layer_period) for the family's attention pattern."""
    mt = c.model_type
    types = c.data.get("layer_types")
    if isinstance(types, list) and types:
        # newer transformers configs spell the pattern out per layer
        local = [t == "sliding_attention" for t in types]
        if not any(local):
            return None, 0
        period = 1 if all(local) else 2
        if len(local) != n_layers or any(local[i] != (i % period == 0) for i in range(len(local))):
            raise c._err(
                "layer_types",
                "has a sliding/full pattern this tool cannot represent",
                rule="sliding-window layers are all layers, or every other layer starting at layer 0",
                fix="use a config whose layer_types is all 'sliding_attention' or alternates starting with it",
            )
        return c.int("sliding_window", hi=MAX_SEQ), period
    if mt == "gpt_oss":
        # GptOssConfig: layer_types defaults to sliding on even layers (0, 2, ...), window 128
        return c.int("sliding_window", 128, hi=MAX_SEQ), 2
    if mt == "phi3":
        w = c.opt_int("sliding_window", hi=MAX_SEQ)  # Phi3: the window applies to every layer
        return (w, 1) if w is not None else (None, 0)
    if mt == "gemma2":
        # HF Gemma2: layers 0, 2, 4, ... use the sliding window
        w = c.opt_int("sliding_window", hi=MAX_SEQ) or c.opt_int("sliding_window_size", hi=MAX_SEQ)
        return (w, 2) if w is not None else (None, 0)
    if mt in ("mistral", "mixtral"):
        w = c.opt_int("sliding_window", hi=MAX_SEQ)
        return (w, 1) if w is not None else (None, 0)
    if mt in ("qwen2", "qwen3", "qwen3_moe"):
        if not c.bool("use_sliding_window", False):
            return None, 0  # sliding_window is present but unused
        # HF Qwen2/Qwen3: layers i >= max_window_layers use the window (default 28 in
        # Qwen2Config/Qwen3Config; Qwen3MoeConfig has no such field: every layer)
        first = c.int("max_window_layers", 0 if mt == "qwen3_moe" else 28, allow_zero=True)
        if first >= n_layers:
            return None, 0
        if first > 0:
            raise c._err(
                "max_window_layers",
                f"is {first} with use_sliding_window true and {n_layers} layers",
                rule="this tool represents a sliding window on all layers or on every other layer, "
                "not on the layers from max_window_layers on",
                fix="set use_sliding_window to false to estimate with full attention",
            )
        return c.int("sliding_window", hi=MAX_SEQ), 1
    return None, 0


def _experts(c: _Cfg, e_key: str, k_key: str) -> tuple[int, int]:
    E, k = c.int(e_key, hi=MAX_EXPERTS), c.int(k_key, hi=MAX_EXPERTS)
    if k > E:
        raise c._err(
            k_key,
            f"is {k}, more than {e_key}={E}",
            rule="a token picks at most all experts",
            fix=f"correct {k_key}",
        )
    return E, k


def _qwen3_moe(c: _Cfg, n_layers: int) -> MoESpec:
    """Qwen3MoeConfig: MoE on every layer except mlp_only_layers (dense, intermediate_size)."""
    if c.int("decoder_sparse_step", 1) != 1:
        raise c._err(
            "decoder_sparse_step",
            f"is {c.data['decoder_sparse_step']!r}",
            rule="this tool represents MoE on every layer after a run of leading dense layers",
            fix="set decoder_sparse_step to 1",
        )
    dense = c.data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or dense != list(range(len(dense))) or len(dense) > n_layers:
        raise c._err(
            "mlp_only_layers",
            f"is {str(dense)[:60]}",
            rule="dense (MLP-only) layers are the first layers, [0, 1, ..., k-1], or none",
            fix="use [] or a leading run of layer indices",
        )
    E, k = _experts(c, "num_experts", "num_experts_per_tok")
    # Qwen3-Next / Qwen3.5: one gated shared expert of shared_expert_intermediate_size
    shared = c.int("shared_expert_intermediate_size", 0, allow_zero=True, hi=MAX_FF)
    return MoESpec(
        n_experts=E,
        top_k=k,
        d_ff_expert=c.int("moe_intermediate_size", hi=MAX_FF),
        n_shared_experts=1 if shared else 0,
        d_ff_shared=shared or None,
        dense_layers=len(dense),
    )


def _moe(c: _Cfg, n_layers: int) -> MoESpec | None:
    mt = c.model_type
    if mt == "mixtral":
        E, k = _experts(c, "num_local_experts", "num_experts_per_tok")
        return MoESpec(n_experts=E, top_k=k, d_ff_expert=c.int("intermediate_size", hi=MAX_FF))
    if mt == "gpt_oss":
        # GptOssConfig: every layer routes to num_local_experts SwiGLU experts of width
        # intermediate_size (the router has a bias); no shared experts, no dense layers
        e_key = "num_local_experts" if c.has("num_local_experts") else "num_experts"
        E, k = _experts(c, e_key, "num_experts_per_tok")
        return MoESpec(
            n_experts=E,
            top_k=k,
            d_ff_expert=c.int("intermediate_size", hi=MAX_FF),
            router_bias=True,
            expert_bias=True,  # GptOssExperts: gate_up_proj_bias, down_proj_bias
        )
    if mt in ("qwen3_moe", "qwen3_next", "qwen3_5_moe_text"):
        return _qwen3_moe(c, n_layers)
    if mt in _MLA_TYPES:
        if c.int("moe_layer_freq", 1) != 1:
            raise c._err(
                "moe_layer_freq",
                f"is {c.data['moe_layer_freq']!r}",
                rule="this tool represents MoE on every layer after the first_k_dense_replace dense ones",
                fix="set moe_layer_freq to 1",
            )
        dense = c.int("first_k_dense_replace", 0, allow_zero=True, hi=MAX_LAYERS)
        if dense > n_layers:
            raise c._err(
                "first_k_dense_replace",
                f"is {dense}, more than num_hidden_layers={n_layers}",
                rule="the dense layers are some of the layers",
                fix="correct first_k_dense_replace",
            )
        E, k = _experts(c, "n_routed_experts", "num_experts_per_tok")
        return MoESpec(
            n_experts=E,
            top_k=k,
            d_ff_expert=c.int("moe_intermediate_size", hi=MAX_FF),
            n_shared_experts=c.int("n_shared_experts", 0, allow_zero=True, hi=1024),
            dense_layers=dense,
            router_bias=c.data.get("topk_method") == "noaux_tc",
            # group-limited routing: DeepSeek-V3 n_group 8 / topk_group 4 (a token's experts
            # sit in at most 4 of 8 groups); V2-Lite leaves both at 1
            n_groups=c.int("n_group", 1, hi=MAX_EXPERTS),
            topk_groups=c.int("topk_group", 1, hi=MAX_EXPERTS),
        )
    return None


def _linear(c: _Cfg, n_layers: int) -> LinearAttentionSpec | None:
    """Gated DeltaNet layers of a hybrid: every full_attention_interval-th layer is full
    attention (Qwen3NextConfig default 4); `layer_types`, when given, must be that pattern."""
    if c.model_type not in _HYBRID_TYPES:
        return None
    interval = c.int("full_attention_interval", 4, hi=MAX_LAYERS)
    types = c.data.get("layer_types")
    if types is not None:
        want = [
            "full_attention" if i % interval == interval - 1 else "linear_attention"
            for i in range(n_layers)
        ]
        if types != want:
            raise c._err(
                "layer_types",
                f"is {str(types)[:60]}",
                rule=f"full attention on every {interval}th layer (layers {interval - 1}, "
                f"{2 * interval - 1}, ...), Gated DeltaNet on the others, one entry per layer",
                fix="use the layer_types of the checkpoint's config.json unchanged",
            )
    return LinearAttentionSpec(
        n_key_heads=c.int("linear_num_key_heads", hi=MAX_HEADS),
        n_value_heads=c.int("linear_num_value_heads", hi=MAX_HEADS),
        key_head_dim=c.int("linear_key_head_dim", hi=MAX_HEADS),
        value_head_dim=c.int("linear_value_head_dim", hi=MAX_HEADS),
        conv_kernel=c.int("linear_conv_kernel_dim", 4, hi=64),
        full_attention_interval=interval,
    )


def _dsa(c: _Cfg) -> DSASpec | None:
    """The DSA indexer; defaults are GlmMoeDsaConfig's / DeepseekV32Config's (transformers)."""
    if c.model_type not in _DSA_TYPES:
        return None
    heads = 32 if c.model_type == "glm_moe_dsa" else 64
    return DSASpec(
        index_n_heads=c.int("index_n_heads", heads, hi=MAX_HEADS),
        index_head_dim=c.int("index_head_dim", 128, hi=MAX_HEADS),
        index_topk=c.int("index_topk", 2048, hi=MAX_SEQ),
    )


def _unwrap(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """A multimodal wrapper's language model: its `text_config`, with the wrapper's
    tie_word_embeddings (Qwen3.5 keeps it at the top level) and name."""
    mt = data.get("model_type")
    if not isinstance(mt, str) or mt not in _TEXT_CONFIG_TYPES:
        return data
    text = data.get("text_config")
    if not isinstance(text, dict):
        raise SpecError(
            f"HF config {origin}: model_type {mt!r} without a text_config object",
            rule=f"a {mt} config.json holds its language model under text_config",
            fix="use the checkpoint's config.json unchanged",
        )
    out = {**text, "model_type": _TEXT_CONFIG_TYPES[mt]}
    for k in ("tie_word_embeddings", "_name_or_path"):
        if k in data and k not in text:
            out[k] = data[k]
    return out


def _mla(c: _Cfg) -> MLASpec | None:
    if c.model_type not in _MLA_TYPES:
        return None
    return MLASpec(
        q_lora_rank=c.opt_int("q_lora_rank", hi=MAX_WIDTH),
        kv_lora_rank=c.int("kv_lora_rank", hi=MAX_WIDTH),
        qk_nope_head_dim=c.int("qk_nope_head_dim", hi=MAX_HEADS),
        qk_rope_head_dim=c.int("qk_rope_head_dim", hi=MAX_HEADS),
        v_head_dim=c.int("v_head_dim", hi=MAX_HEADS),
    )


def _model_type(data: dict[str, Any], origin: str) -> str:
    mt = data.get("model_type")
    if mt is None:
        raise SpecError(
            f"HF config {origin}: field 'model_type' is missing",
            rule="config.json names its architecture in model_type",
            fix=f'add "model_type": one of {", ".join(SUPPORTED_MODEL_TYPES)}',
        )
    if not isinstance(mt, str) or mt not in _FAMILIES:
        shown = repr(mt) if len(repr(mt)) < 60 else repr(mt)[:55] + "..."
        raise SpecError(
            f"HF config {origin}: model_type {shown} is not supported",
            rule=f"model_type is a string, one of {', '.join(SUPPORTED_MODEL_TYPES)}",
            fix="write a model TOML file for it (see src/roofline/specs/models/*.toml) or use a preset",
        )
    return mt


def _head_dim(c: _Cfg, fam: _Family, D: int, N: int, K: int) -> int:
    if N % K:
        raise c._err(
            fam.keys["n_kv_heads"],
            f"= {K} does not divide {fam.keys['n_heads']} = {N}",
            rule="grouped-query attention shares each KV head among N/K query heads",
            fix=f"use {fam.keys['n_kv_heads']} in {divisors(N)}",
        )
    if c.has("head_dim"):
        return c.int("head_dim", hi=MAX_HEADS)
    if c.model_type == "gemma2":
        return 256  # Gemma2Config's default head_dim
    if D % N:
        raise c._err(
            "head_dim",
            f"is missing and {fam.keys['d_model']} = {D} is not divisible by {fam.keys['n_heads']} = {N}",
            rule="head_dim defaults to hidden_size / num_attention_heads",
            fix='add "head_dim": <value>',
        )
    return D // N


def _shape(c: _Cfg, fam: _Family) -> dict[str, int]:
    """The core sizes under the family's field names, bounded (GPT-2: n_inner defaults to 4·D)."""
    k = fam.keys
    out = {f: c.int(k[f], hi=_BOUNDS[f]) for f in ("n_layers", "d_model", "n_heads", "vocab")}
    if c.model_type == "gpt2":
        out["d_ff"] = c.int(k["d_ff"], 4 * out["d_model"], hi=MAX_FF)
    elif c.model_type == "qwen3_5_moe_text" and not c.has(k["d_ff"]):
        # every layer MoE and no intermediate_size: d_ff (dense width) is unused; the expert's
        out["d_ff"] = c.int("moe_intermediate_size", hi=MAX_FF)
    else:
        out["d_ff"] = c.int(k["d_ff"], hi=MAX_FF)
    n_kv_key = (
        "num_key_value_heads" if k is _STANDARD_KEYS or "n_kv_heads" not in k else k["n_kv_heads"]
    )
    out["n_kv_heads"] = c.int(n_kv_key, out["n_heads"], hi=MAX_HEADS)
    if c.has(k["max_seq_len"]):
        out["max_seq_len"] = c.int(k["max_seq_len"], hi=MAX_SEQ)
    return out


def _mtp(c: _Cfg) -> int:
    """Multi-token-prediction modules (not counted in the parameters)."""
    if c.model_type in ("deepseek_v3", *_DSA_TYPES):
        return c.int("num_nextn_predict_layers", 0, allow_zero=True, hi=64)
    if c.model_type in _HYBRID_TYPES:
        return c.int("mtp_num_hidden_layers", 0, allow_zero=True, hi=64)
    return 0


def load_hf_config(path_or_dir: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (or a directory holding one).

    The name is `_name_or_path` when the file has it, else the file's stem (the directory's
    name for a file called config.json).
    """
    path = Path(path_or_dir)
    if is_dir(path):
        path = path / "config.json"
    origin = repr(str(path)) if len(str(path)) < 200 else repr(str(path)[:195] + "...")
    data = _unwrap(_read(path), origin)
    mt = _model_type(data, origin)
    fam = _FAMILIES[mt]
    c = _Cfg(data, origin, mt)
    shape = _shape(c, fam)
    mla = _mla(c)
    if mla is not None:  # q/k head dim; MLA's ranks live in mla
        H = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    else:
        H = _head_dim(c, fam, shape["d_model"], shape["n_heads"], shape["n_kv_heads"])
    window, period = _window(c, shape["n_layers"])
    moe = _moe(c, shape["n_layers"])
    name = data.get("_name_or_path")
    if not isinstance(name, str) or not name.strip() or len(name) > 256:
        name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    spec = dict(
        name=name,
        **shape,
        d_head=H,
        mlp=fam.mlp,
        tied_embeddings=c.bool("tie_word_embeddings", fam.tie_default),
        qkv_bias=True if mt in ("qwen2", "gpt2") else c.bool("attention_bias", fam.bias_default),
        qk_norm=fam.qk_norm,
        moe=moe,
        mla=mla,
        sliding_window=window,
        local_layer_period=period,
        norms_per_layer=fam.norms_per_layer,
        n_mtp_modules=_mtp(c),
        attn_output_gate=mt in _HYBRID_TYPES and c.bool("attn_output_gate", True),
        linear=_linear(c, shape["n_layers"]),
        dsa=_dsa(c),
        family=fam.family,
        source=f"HF config.json {path}",
    )
    try:
        return ModelSpec(**spec)
    except SpecError as e:  # a rule ModelSpec checks that the reads above did not
        raise SpecError(f"HF config {origin}: {e.what}", rule=e.rule, fix=e.fix) from None


__all__ = ["load_hf_config", "SUPPORTED_MODEL_TYPES"]
