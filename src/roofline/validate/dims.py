"""A run's `model:` block -> ModelSpec, with every default it fills written down.

Shared by the training, inference and serving readers. Rules (docs/validate.md, "Model"):

- `layers`, `d_model` and `vocab` are required; without them the run is not mapped.
- `heads` missing: d_model / 128 (128-wide heads, the usual choice), if that divides.
- `kv_heads` missing: = heads (MHA, GPT-style).
- `d_ff` missing: 4·d_model (GPT-style) for dense models; for MoE models without a dense
  width, the expert width (all layers are MoE).
- MLP kind: `ffn_type` when given ("gated"/"SiLU"/"GLU" -> gated; "non-gated" -> plain), else
  by model family: LLaMA, Mixtral, Qwen, DeepSeek, Kimi, GLM, MiniMax, gpt-oss, Gemma ->
  gated (SwiGLU/GeGLU); GPT, MPT, Nemotron-4 and anything else -> plain (GPT-style).
- head_dim: given, else d_model / heads.
- MoE: experts, top_k, moe_d_ff, shared_experts, first_dense_layers, routing_groups,
  topk_routing_groups -> MoESpec; MLA ranks.
- attention notes: "QK-norm" -> qk_norm; "sliding-window-N" alternating -> every other layer
  local with window N.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roofline.errors import RooflineError
from roofline.specs.model import MLASpec, MLPKind, ModelSpec, MoESpec

_GATED_FAMILIES = (
    "llama",
    "mixtral",
    "mistral",
    "qwen",
    "deepseek",
    "kimi",
    "glm",
    "minimax",
    "gpt-oss",
    "gemma",
    "nemotron-h",
)


@dataclass(frozen=True)
class BuiltModel:
    spec: ModelSpec | None
    defaults: tuple[str, ...]  # every default filled, one sentence each
    reason: str = ""  # why no spec (empty when built)
    published_params: float | None = None  # the entry's own parameter count, if any


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def parse_params(m: dict[str, Any]) -> float | None:
    """The entry's published parameter count: params / params_derived / params_billion."""
    if _int(m.get("params_derived")):
        return float(m["params_derived"])
    if isinstance(m.get("params_billion"), (int, float)):
        return float(m["params_billion"]) * 1e9
    p = m.get("params")
    if isinstance(p, (int, float)) and not isinstance(p, bool):
        return float(p)
    if isinstance(p, str):
        mt = re.match(r"\s*~?([0-9.]+)\s*([BbMmTt])", p)
        if mt:
            scale = {"b": 1e9, "m": 1e6, "t": 1e12}[mt.group(2).lower()]
            return float(mt.group(1)) * scale
    return None


def _mlp_kind(m: dict[str, Any], name: str) -> tuple[MLPKind, str | None]:
    ffn = str(m.get("ffn_type", "")).lower()
    if ffn:
        if "non-gated" in ffn or "non gated" in ffn:
            return MLPKind.PLAIN, None
        if "gated" in ffn or "glu" in ffn or "silu" in ffn:
            return MLPKind.GATED, None
        return MLPKind.PLAIN, None
    low = name.lower().replace(" ", "-")
    fam = next((f for f in _GATED_FAMILIES if f in low), None)
    if fam:
        return MLPKind.GATED, f"MLP kind unstated: gated (SwiGLU), as every {fam} model"
    return MLPKind.PLAIN, "MLP kind unstated: plain GELU (GPT-style)"


# model families whose routed experts carry biases (gpt-oss: GptOssExperts gate_up_proj_bias and
# down_proj_bias, huggingface/transformers models/gpt_oss/modeling_gpt_oss.py)
_EXPERT_BIAS_FAMILIES = ("gpt-oss",)


def _expert_bias(moe: dict[str, Any], name: str, defaults: list[str]) -> bool:
    if "expert_bias" in moe:
        return bool(moe["expert_bias"])
    low = name.lower().replace(" ", "-")
    fam = next((f for f in _EXPERT_BIAS_FAMILIES if f in low), None)
    if fam:
        defaults.append(
            f"expert biases unstated: the routed experts carry biases, as every {fam} model"
        )
    return fam is not None


def _moe(moe: dict[str, Any], expert_bias: bool = False) -> MoESpec:
    return MoESpec(
        n_experts=int(moe["experts"]),
        top_k=int(moe["top_k"]),
        d_ff_expert=int(moe["moe_d_ff"]),
        n_shared_experts=int(moe.get("shared_experts") or 0),
        dense_layers=int(moe.get("first_dense_layers") or 0),
        n_groups=int(moe.get("routing_groups") or 1),
        topk_groups=int(moe.get("topk_routing_groups") or 1),
        expert_bias=expert_bias,
        capacity_factor=float(moe.get("capacity_factor") or 0.0),
    )


def _mla(mla: dict[str, Any]) -> MLASpec:
    return MLASpec(
        q_lora_rank=_int(mla.get("q_lora_rank")),
        kv_lora_rank=int(mla["kv_lora_rank"]),
        qk_nope_head_dim=int(mla["qk_nope_head_dim"]),
        qk_rope_head_dim=int(mla["qk_rope_head_dim"]),
        v_head_dim=int(mla["v_head_dim"]),
    )


def _attention_options(note: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    low = note.lower()
    if "qk-norm" in low or "qk norm" in low:
        out["qk_norm"] = True
    w = re.search(r"sliding[- ]window[- ]?(\d+)", low)
    if w:
        out["sliding_window"] = int(w.group(1))
        out["local_layer_period"] = 2 if "alternat" in low else 1
    return out


PUBLIC_DIMS = Path(__file__).with_name("public_dims.toml")


def public_dims(name: str) -> dict[str, Any] | None:
    """Dims of a public model an entry names without transcribing them (public_dims.toml)."""
    with PUBLIC_DIMS.open("rb") as f:
        table = tomllib.load(f)
    hit = table.get(name.strip())
    return dict(hit) if hit else None


ROUTING_KEYS = ("routing_groups", "topk_routing_groups")


def _public_routing(moe: dict[str, Any], name: str, defaults: list[str]) -> dict[str, Any]:
    """An entry's `moe:` mapping with the routing groups of the model preset it names
    (DeepSeek's device-limited routing, in specs/models/deepseek-v3.toml from its config.json)
    when the entry does not transcribe them and the preset has the entry's expert count."""
    if all(k in moe for k in ROUTING_KEYS):
        return moe
    from roofline.errors import RooflineError
    from roofline.specs.model_catalog import load_model

    try:
        preset = (
            load_model(name.strip())
            if name.strip() and not name.endswith((".toml", ".json"))
            else None
        )
    except RooflineError:
        preset = None
    pm = preset.moe if preset is not None else None
    if pm is None or pm.n_groups <= 1 or pm.n_experts != _int(moe.get("experts")):
        return moe
    fill = {
        k: v
        for k, v in (("routing_groups", pm.n_groups), ("topk_routing_groups", pm.topk_groups))
        if k not in moe
    }
    defaults.append(
        "MoE routing groups not in the entry: "
        + ", ".join(f"{k} {v}" for k, v in fill.items())
        + f" from the {preset.name} preset ({preset.source})"
    )
    return {**moe, **fill}


def build_model(m: Any, run_id: str) -> BuiltModel:
    """ModelSpec from a run's `model:` mapping; `reason` says why not when it cannot be built."""
    if not isinstance(m, dict):
        return BuiltModel(None, (), "the entry has no `model:` mapping")
    missing = [k for k in ("layers", "d_model", "vocab") if _int(m.get(k)) is None]
    unstated = missing or [k for k in ("heads", "kv_heads", "d_ff") if _int(m.get(k)) is None]
    public = public_dims(str(m.get("name", ""))) if unstated else None
    if public is not None:
        source = public.pop("source")
        m = {**public, **{k: v for k, v in m.items() if v is not None}}
        missing = [k for k in ("layers", "d_model", "vocab") if _int(m.get(k)) is None]
    if missing:
        return BuiltModel(
            None, (), f"model dims not published ({', '.join('model.' + k for k in missing)})"
        )
    name = str(m.get("name") or run_id)
    L, D, V = int(m["layers"]), int(m["d_model"]), int(m["vocab"])
    defaults: list[str] = []
    if public is not None:
        defaults.append(f"model dims not in the entry: taken from its public config, {source}")
    heads = _int(m.get("heads"))
    if heads is None:
        if D % 128:
            return BuiltModel(
                None, (), "model.heads not published and d_model is not a multiple of 128"
            )
        heads = D // 128
        defaults.append(f"heads unstated: d_model/128 = {heads} (128-wide heads)")
    kv = _int(m.get("kv_heads"))
    if kv is None:
        kv = heads
        defaults.append(f"kv_heads unstated: = heads = {heads} (MHA)")
    moe_raw = m.get("moe") if isinstance(m.get("moe"), dict) else None
    if moe_raw is not None:
        moe_raw = _public_routing(moe_raw, name, defaults)
    d_ff = _int(m.get("d_ff"))
    if d_ff is None:
        if moe_raw and _int(moe_raw.get("moe_d_ff")):
            d_ff = int(moe_raw["moe_d_ff"])
            defaults.append(f"d_ff unstated for a MoE model: expert width {d_ff} (every layer MoE)")
        else:
            d_ff = 4 * D
            defaults.append(f"d_ff unstated: 4·d_model = {d_ff} (GPT-style)")
    mlp, why = _mlp_kind(m, name)
    if why:
        defaults.append(why)
    head_dim = _int(m.get("head_dim"))
    if head_dim is None:
        if D % heads:
            return BuiltModel(
                None,
                (),
                f"head_dim not published and d_model={D} is not divisible by heads={heads}",
            )
        head_dim = D // heads
    kw: dict[str, Any] = {}
    try:
        if moe_raw:
            kw["moe"] = _moe(moe_raw, _expert_bias(moe_raw, name, defaults))
            if isinstance(moe_raw.get("mla"), dict):
                kw["mla"] = _mla(moe_raw["mla"])
        if isinstance(m.get("mla"), dict):
            kw["mla"] = _mla(m["mla"])
    except (KeyError, TypeError, ValueError) as e:
        return BuiltModel(None, (), f"model.moe/mla block cannot be read ({e})")
    kw.update(_attention_options(str(m.get("attention") or "")))
    if m.get("tied_embeddings") is True:
        kw["tied_embeddings"] = True
    try:
        spec = ModelSpec(
            name=name,
            n_layers=L,
            d_model=D,
            d_ff=d_ff,
            n_heads=heads,
            n_kv_heads=kv,
            d_head=head_dim,
            vocab=V,
            mlp=mlp,
            source=f"validate: run {run_id}",
            **kw,
        )
    except RooflineError as e:
        return BuiltModel(None, tuple(defaults), f"model dims rejected: {e}")
    return BuiltModel(spec, tuple(defaults), "", parse_params(m))
