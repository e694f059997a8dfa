"""ModelSpec: a decoder-only Transformer's architecture, from a preset or a HF config.json.

Letters used in formulas (book `transformers.md`): L layers, D d_model, F d_ff, N query
heads, K kv heads, H head dim, V vocab, E experts, k experts per token.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from roofline.errors import SpecError
from roofline.specs.catalog import DATA_DIR, read_toml, resolve

MODEL_DIR = DATA_DIR / "models"


class MLPKind(enum.StrEnum):
    GATED = "gated"  # SwiGLU/GeGLU: W_in1, W_in2 [D,F], W_out [F,D] -> 3DF params
    PLAIN = "plain"  # W_in [D,F], W_out [F,D] -> 2DF params


class AttentionKind(enum.StrEnum):
    MHA = "mha"
    GQA = "gqa"
    MQA = "mqa"
    MLA = "mla"  # DeepSeek multi-head latent attention


@dataclass(frozen=True)
class MoESpec:
    """Mixture of experts on the MLP. `dense_layers` counts leading dense (non-MoE) layers."""

    n_experts: int  # E
    top_k: int  # k
    d_ff_expert: int  # F of one expert
    n_shared_experts: int = 0
    d_ff_shared: int | None = None  # F of one shared expert (default d_ff_expert)
    dense_layers: int = 0  # first layers that use a dense MLP of width ModelSpec.d_ff
    router_bias: bool = False


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek-V2/V3 multi-head latent attention ranks."""

    q_lora_rank: int | None  # None = plain Q projection
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelSpec:
    name: str
    n_layers: int  # L
    d_model: int  # D
    d_ff: int  # F (dense MLP width)
    n_heads: int  # N
    n_kv_heads: int  # K
    d_head: int  # H (not always D/N)
    vocab: int  # V
    mlp: MLPKind = MLPKind.GATED
    tied_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3): 2·H weights per layer
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    sliding_window: int | None = None  # tokens, for layers marked local
    local_layer_period: int = 0  # 2 = every other layer local (Gemma-2: layers 0,2,4.. local)
    norms_per_layer: int = 2  # RMSNorm/LayerNorm weight vectors of size D per layer
    max_seq_len: int = 4096
    n_mtp_modules: int = 0  # DeepSeek-V3 multi-token prediction (not counted in params)
    aliases: tuple[str, ...] = ()
    family: str = ""
    source: str = ""
    published_params: float | None = None
    published_active_params: float | None = None

    def __post_init__(self) -> None:
        for f in ("n_layers", "d_model", "d_ff", "n_heads", "n_kv_heads", "d_head", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(
                    f"model {self.name!r}: {f} = {v!r}",
                    rule=f"{f} is a positive integer",
                    fix=f"set {f} to a positive whole number",
                )
        if self.mla is None and self.n_heads % self.n_kv_heads:
            raise SpecError(
                f"model {self.name!r}: n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}",
                rule="grouped-query attention shares each KV head among N/K query heads, so K must divide N",
                fix=f"use n_kv_heads in {_divisors(self.n_heads)}",
            )
        if self.moe is not None:
            m = self.moe
            if not (0 < m.top_k <= m.n_experts):
                raise SpecError(
                    f"model {self.name!r}: top_k={m.top_k} with n_experts={m.n_experts}",
                    rule="1 <= top_k <= n_experts",
                    fix="correct moe.top_k or moe.n_experts",
                )
            if not (0 <= m.dense_layers <= self.n_layers):
                raise SpecError(
                    f"model {self.name!r}: moe.dense_layers={m.dense_layers} with n_layers={self.n_layers}",
                    rule="0 <= dense_layers <= n_layers",
                    fix="correct moe.dense_layers",
                )
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise SpecError(
                f"model {self.name!r}: sliding_window={self.sliding_window}",
                rule="a window is a positive token count",
                fix="remove it or give a positive value",
            )

    # -- derived ----------------------------------------------------------------
    @property
    def attention(self) -> AttentionKind:
        if self.mla is not None:
            return AttentionKind.MLA
        if self.n_kv_heads == self.n_heads:
            return AttentionKind.MHA
        return AttentionKind.MQA if self.n_kv_heads == 1 else AttentionKind.GQA

    @property
    def n_moe_layers(self) -> int:
        return 0 if self.moe is None else self.n_layers - self.moe.dense_layers

    @property
    def n_dense_layers(self) -> int:
        return self.n_layers - self.n_moe_layers

    def is_local_layer(self, i: int) -> bool:
        """True if layer i uses sliding-window attention (Gemma-2: even layers)."""
        return (
            self.sliding_window is not None
            and self.local_layer_period > 0
            and i % self.local_layer_period == 0
        )

    @property
    def n_local_layers(self) -> int:
        return sum(self.is_local_layer(i) for i in range(self.n_layers))

    def with_(self, **changes: Any) -> ModelSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (MoESpec, MLASpec)):
                v = {g.name: getattr(v, g.name) for g in fields(v)}
            elif isinstance(v, enum.Enum):
                v = v.value
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        out["attention"] = self.attention.value
        return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def model_from_dict(d: dict[str, Any], origin: str) -> ModelSpec:
    """Build a ModelSpec from a TOML-shaped dict ([moe] and [mla] sub-tables allowed)."""
    import difflib

    data = dict(d)
    known = {f.name for f in fields(ModelSpec)}
    unknown = [k for k in data if k not in known]
    if unknown:
        k = unknown[0]
        near = difflib.get_close_matches(k, sorted(known), n=1)
        raise SpecError(
            f"model file {origin}: unknown key {k!r}"
            + (f" (did you mean {near[0]!r}?)" if near else ""),
            rule="keys are the fields of roofline.specs.model.ModelSpec",
            fix="rename or remove the key",
        )
    for req in ("name", "n_layers", "d_model", "d_ff", "n_heads", "vocab"):
        if req not in data:
            raise SpecError(
                f"model file {origin} lacks {req!r}",
                rule="name, n_layers, d_model, d_ff, n_heads and vocab are required",
                fix=f"add `{req} = ...`",
            )
    data.setdefault("n_kv_heads", data["n_heads"])
    if "d_head" not in data:
        if data["d_model"] % data["n_heads"]:
            raise SpecError(
                f"model file {origin}: d_head not given and d_model={data['d_model']} is not divisible by n_heads={data['n_heads']}",
                rule="d_head defaults to d_model / n_heads",
                fix="give d_head explicitly",
            )
        data["d_head"] = data["d_model"] // data["n_heads"]
    try:
        if "mlp" in data:
            data["mlp"] = MLPKind(data["mlp"])
        if isinstance(data.get("moe"), dict):
            data["moe"] = MoESpec(**data["moe"])
        if isinstance(data.get("mla"), dict):
            data["mla"] = MLASpec(**data["mla"])
    except (TypeError, ValueError) as e:
        raise SpecError(
            f"model file {origin}: {e}",
            rule="mlp is 'gated' or 'plain'; [moe] and [mla] take the fields of MoESpec/MLASpec",
            fix="correct the table",
        ) from None
    if "aliases" in data:
        data["aliases"] = tuple(data["aliases"])
    return ModelSpec(**data)


@cache
def _catalog() -> dict[str, tuple[Path, tuple[str, ...]]]:
    out = {}
    for p in sorted(MODEL_DIR.glob("*.toml")):
        raw = read_toml(p, "model")
        out[raw["name"]] = (p, tuple(raw.get("aliases", ())))
    return out


def model_names() -> list[str]:
    return list(_catalog())


@cache
def _load_named(key: str) -> ModelSpec:
    path, _ = _catalog()[key]
    return model_from_dict(read_toml(path, "model"), str(path))


def load_model(name_or_path: str | Path | ModelSpec) -> ModelSpec:
    """A ModelSpec from a preset name, a model TOML file, or a Hugging Face config.json."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    s = str(name_or_path)
    if s.endswith(".json") or (Path(s).is_dir() and (Path(s) / "config.json").exists()):
        from roofline.specs.hf import load_hf_config

        return load_hf_config(s)
    if s.endswith(".toml"):
        return model_from_dict(read_toml(Path(s), "model"), s)
    key = resolve(s, {k: v[1] for k, v in _catalog().items()}, "model")
    return _load_named(key)


__all__ = [
    "ModelSpec",
    "MoESpec",
    "MLASpec",
    "MLPKind",
    "AttentionKind",
    "load_model",
    "model_names",
    "model_from_dict",
]
