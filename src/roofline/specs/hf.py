"""Read a Hugging Face `config.json` into a ModelSpec.

Supported `model_type`s: llama, mistral, mixtral, qwen2, qwen3, gemma2, deepseek_v2, deepseek_v3.
Only the fields that fix the architecture's shapes are read (rope scaling, softcapping, dtypes
and the like are ignored). Defaults follow the transformers config classes where a field may
be absent (num_key_value_heads = num_attention_heads, head_dim = hidden_size / heads,
tie_word_embeddings per family). Every problem is a SpecError naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from roofline.errors import SpecError
from roofline.specs.model import MLASpec, MLPKind, ModelSpec, MoESpec

# model_type -> (family, tie_word_embeddings default of its transformers config class)
_FAMILIES: dict[str, tuple[str, bool]] = {
    "llama": ("llama", False),
    "mistral": ("mistral", False),
    "mixtral": ("mixtral", False),
    "qwen2": ("qwen", False),
    "qwen3": ("qwen", False),
    "gemma2": ("gemma", True),
    "deepseek_v2": ("deepseek", False),
    "deepseek_v3": ("deepseek", False),
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_FAMILIES)


class _Cfg:
    """A parsed config.json with typed, error-reporting field access."""

    def __init__(self, data: dict[str, Any], origin: str, model_type: str) -> None:
        self.data, self.origin, self.model_type = data, origin, model_type

    def _err(self, key: str, problem: str, rule: str, fix: str) -> SpecError:
        return SpecError(f"HF config {self.origin}: field {key!r} {problem}", rule=rule, fix=fix)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def int(self, key: str, default: int | None = None, *, allow_zero: bool = False) -> int:
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
            raise self._err(key, f"is {v!r}", rule=f"{key} is {kind}", fix=f"set {key} to {kind}")
        return v

    def opt_int(self, key: str) -> int | None:
        return self.int(key) if self.has(key) else None

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
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(
            f"HF config {str(path)!r} does not exist",
            fix="give the path of a config.json file or of a directory that holds one",
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(
            f"HF config {str(path)!r} cannot be read ({e})",
            fix="check the file's permissions and that it is UTF-8 text",
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(
            f"HF config {str(path)!r} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}",
            rule="config.json is a JSON object",
            fix=f"correct the syntax at line {e.lineno}, column {e.colno} (or download config.json again)",
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
        return c.int("sliding_window"), period
    if mt == "gemma2":
        # HF Gemma2: layers 0, 2, 4, ... use the sliding window
        w = c.opt_int("sliding_window") or c.opt_int("sliding_window_size")
        return (w, 2) if w is not None else (None, 0)
    if mt in ("mistral", "mixtral"):
        w = c.opt_int("sliding_window")
        return (w, 1) if w is not None else (None, 0)
    if mt in ("qwen2", "qwen3"):
        if not c.bool("use_sliding_window", False):
            return None, 0  # sliding_window is present but unused
        # HF Qwen2/Qwen3: layers i >= max_window_layers use the window
        first = c.int(
            "max_window_layers", 28, allow_zero=True
        )  # 28: the Qwen2Config/Qwen3Config default
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
        return c.int("sliding_window"), 1
    return None, 0


def _moe(c: _Cfg, n_layers: int) -> MoESpec | None:
    mt = c.model_type
    if mt == "mixtral":
        E, k = c.int("num_local_experts"), c.int("num_experts_per_tok")
        if k > E:
            raise c._err(
                "num_experts_per_tok",
                f"is {k}, more than num_local_experts={E}",
                rule="a token picks at most all experts",
                fix="correct num_experts_per_tok",
            )
        return MoESpec(n_experts=E, top_k=k, d_ff_expert=c.int("intermediate_size"))
    if mt in ("deepseek_v2", "deepseek_v3"):
        if c.int("moe_layer_freq", 1) != 1:
            raise c._err(
                "moe_layer_freq",
                f"is {c.data['moe_layer_freq']!r}",
                rule="this tool represents MoE on every layer after the first_k_dense_replace dense ones",
                fix="set moe_layer_freq to 1",
            )
        dense = c.int("first_k_dense_replace", 0, allow_zero=True)
        if dense > n_layers:
            raise c._err(
                "first_k_dense_replace",
                f"is {dense}, more than num_hidden_layers={n_layers}",
                rule="the dense layers are some of the layers",
                fix="correct first_k_dense_replace",
            )
        E = c.int("n_routed_experts")
        k = c.int("num_experts_per_tok")
        if k > E:
            raise c._err(
                "num_experts_per_tok",
                f"is {k}, more than n_routed_experts={E}",
                rule="a token picks at most all experts",
                fix="correct num_experts_per_tok",
            )
        return MoESpec(
            n_experts=E,
            top_k=k,
            d_ff_expert=c.int("moe_intermediate_size"),
            n_shared_experts=c.int("n_shared_experts", 0, allow_zero=True),
            dense_layers=dense,
            router_bias=c.data.get("topk_method") == "noaux_tc",
        )
    return None


def _mla(c: _Cfg) -> MLASpec | None:
    if c.model_type not in ("deepseek_v2", "deepseek_v3"):
        return None
    return MLASpec(
        q_lora_rank=c.opt_int("q_lora_rank"),
        kv_lora_rank=c.int("kv_lora_rank"),
        qk_nope_head_dim=c.int("qk_nope_head_dim"),
        qk_rope_head_dim=c.int("qk_rope_head_dim"),
        v_head_dim=c.int("v_head_dim"),
    )


def load_hf_config(path_or_dir: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (or a directory holding one).

    The name is `_name_or_path` when the file has it, else the file's stem (the directory's
    name for a file called config.json).
    """
    path = Path(path_or_dir)
    if path.is_dir():
        path = path / "config.json"
    origin = repr(str(path))
    data = _read(path)
    mt = data.get("model_type")
    if mt is None:
        raise SpecError(
            f"HF config {origin}: field 'model_type' is missing",
            rule="config.json names its architecture in model_type",
            fix=f'add "model_type": one of {", ".join(SUPPORTED_MODEL_TYPES)}',
        )
    if mt not in _FAMILIES:
        raise SpecError(
            f"HF config {origin}: model_type {mt!r} is not supported",
            rule=f"supported model_types are {', '.join(SUPPORTED_MODEL_TYPES)}",
            fix="write a model TOML file for it (see src/roofline/specs/models/*.toml) or use a preset",
        )
    family, tie_default = _FAMILIES[mt]
    c = _Cfg(data, origin, mt)

    L = c.int("num_hidden_layers")
    D = c.int("hidden_size")
    F = c.int("intermediate_size")
    N = c.int("num_attention_heads")
    V = c.int("vocab_size")
    K = c.int("num_key_value_heads", N)
    mla = _mla(c)
    if mla is not None:
        H = mla.qk_nope_head_dim + mla.qk_rope_head_dim  # q/k head dim; MLA's ranks live in mla
    else:
        if N % K:
            divisors = [d for d in range(1, N + 1) if N % d == 0]
            raise c._err(
                "num_key_value_heads",
                f"= {K} does not divide num_attention_heads = {N}",
                rule="grouped-query attention shares each KV head among N/K query heads",
                fix=f"use num_key_value_heads in {divisors}",
            )
        if c.has("head_dim"):
            H = c.int("head_dim")
        elif mt == "gemma2":
            H = 256  # Gemma2Config's default head_dim
        elif D % N:
            raise c._err(
                "head_dim",
                f"is missing and hidden_size = {D} is not divisible by num_attention_heads = {N}",
                rule="head_dim defaults to hidden_size / num_attention_heads",
                fix='add "head_dim": <value>',
            )
        else:
            H = D // N
    window, period = _window(c, L)
    moe = _moe(c, L)

    name = data.get("_name_or_path")
    if not isinstance(name, str) or not name.strip():
        name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    kwargs: dict[str, Any] = {}
    if c.has("max_position_embeddings"):
        kwargs["max_seq_len"] = c.int("max_position_embeddings")
    spec = dict(
        name=name,
        n_layers=L,
        d_model=D,
        d_ff=F,
        n_heads=N,
        n_kv_heads=K,
        d_head=H,
        vocab=V,
        mlp=MLPKind.GATED,  # every supported family uses SwiGLU/GeGLU
        tied_embeddings=c.bool("tie_word_embeddings", tie_default),
        qkv_bias=True
        if mt == "qwen2"
        else c.bool("attention_bias", False),  # Qwen2 always has q/k/v bias
        qk_norm=mt == "qwen3",
        moe=moe,
        mla=mla,
        sliding_window=window,
        local_layer_period=period,
        norms_per_layer=4
        if mt == "gemma2"
        else 2,  # Gemma2: pre/post norms around attention and MLP
        n_mtp_modules=c.int("num_nextn_predict_layers", 0, allow_zero=True)
        if mt == "deepseek_v3"
        else 0,
        family=family,
        source=f"HF config.json {path}",
        **kwargs,
    )
    try:
        return ModelSpec(**spec)
    except SpecError as e:  # a rule ModelSpec checks that the reads above did not
        raise SpecError(f"HF config {origin}: {e.what}", rule=e.rule, fix=e.fix) from None


__all__ = ["load_hf_config", "SUPPORTED_MODEL_TYPES"]
