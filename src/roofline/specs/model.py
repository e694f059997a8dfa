"""ModelSpec: a decoder-only Transformer's architecture, from a preset or a HF config.json.

Letters used in formulas (book `transformers.md`): L layers, D d_model, F d_ff, N query
heads, K kv heads, H head dim, V vocab, E experts, k experts per token.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, fields, replace
from typing import Any

from roofline.errors import SpecError
from roofline.specs.catalog import (
    DATA_DIR,
    check_bool,
    check_int,
    check_number,
    check_str,
    check_str_list,
)
from roofline.specs.schema import check as check_schema

MODEL_DIR = DATA_DIR / "models"

# Upper bounds where a size stops being physical (the largest published models: ~200 layers,
# d_model 25k, vocab 256k, 384 experts, 10M-token context). Each is far above any model built, and
# low enough that counting FLOPs, parameters and bytes stays finite and quick.
MAX_LAYERS = 10_000
MAX_WIDTH = 1 << 20  # d_model, q/kv LoRA ranks: 1,048,576
MAX_FF = 1 << 24  # d_ff, d_ff_expert: 16,777,216
MAX_HEADS = 1 << 16  # query/kv heads, head dims: 65,536
MAX_VOCAB = 1 << 24  # 16,777,216 tokens
MAX_EXPERTS = 1 << 16
MAX_SEQ = 1 << 30  # tokens of context: 1,073,741,824
MAX_PARAMS = 1e16  # published parameter counts

# field -> (lo, hi) for integer fields; each names its bound in the error
_INT_FIELDS: dict[str, tuple[int, int]] = {
    "n_layers": (1, MAX_LAYERS),
    "d_model": (1, MAX_WIDTH),
    "d_ff": (1, MAX_FF),
    "n_heads": (1, MAX_HEADS),
    "n_kv_heads": (1, MAX_HEADS),
    "d_head": (1, MAX_HEADS),
    "vocab": (1, MAX_VOCAB),
    "local_layer_period": (0, MAX_LAYERS),
    "norms_per_layer": (0, 16),
    "max_seq_len": (1, MAX_SEQ),
    "n_mtp_modules": (0, 64),
}
_OPT_INT_FIELDS = {"sliding_window": (1, MAX_SEQ)}
_BOOL_FIELDS = ("tied_embeddings", "qkv_bias", "qk_norm", "attn_output_gate")
_STR_FIELDS = ("name", "family", "source")
_OPT_NUMBER_FIELDS = ("published_params", "published_active_params")
MAX_CAPACITY_FACTOR = 64.0  # an expert holding 64x its balanced share is no real setting
_MOE_INT = {
    "n_experts": (1, MAX_EXPERTS),
    "top_k": (1, MAX_EXPERTS),
    "d_ff_expert": (1, MAX_FF),
    "n_shared_experts": (0, 1024),
    "dense_layers": (0, MAX_LAYERS),
    "n_groups": (1, MAX_EXPERTS),
    "topk_groups": (1, MAX_EXPERTS),
}
_MLA_INT = {
    "kv_lora_rank": (1, MAX_WIDTH),
    "qk_nope_head_dim": (1, MAX_HEADS),
    "qk_rope_head_dim": (0, MAX_HEADS),
    "v_head_dim": (1, MAX_HEADS),
}
# Gated DeltaNet layers of a linear-attention hybrid (Qwen3-Next, Qwen3.5): HF config keys
# linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
# linear_conv_kernel_dim, full_attention_interval (see LinearAttentionSpec)
_LINEAR_INT = {
    "n_key_heads": (1, MAX_HEADS),
    "n_value_heads": (1, MAX_HEADS),
    "key_head_dim": (1, MAX_HEADS),
    "value_head_dim": (1, MAX_HEADS),
    "conv_kernel": (1, 64),
    "full_attention_interval": (2, MAX_LAYERS),
    "chunk_size": (1, 4096),
}
# DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-5): HF config keys
# index_n_heads, index_head_dim, index_topk (see DSASpec)
_DSA_INT = {
    "index_n_heads": (1, MAX_HEADS),
    "index_head_dim": (1, MAX_HEADS),
    "index_topk": (1, MAX_SEQ),
}


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
    # the routed experts' linear layers carry biases (gpt-oss: gate_up_proj_bias, down_proj_bias)
    expert_bias: bool = False
    # group-limited routing (DeepSeek-V2/V3 n_group / topk_group; Megatron-Core
    # moe_router_num_groups / moe_router_group_topk): the experts split into `n_groups`
    # contiguous groups and a token picks its top_k experts inside its `topk_groups` best
    # groups. 1 / 1 = unlimited.
    n_groups: int = 1
    topk_groups: int = 1
    # token dropping (GShard/Switch capacity factor): each sequence gives every expert
    # int(T·k/E·capacity_factor) token slots and the expert matmuls run over all of them, padded
    # or not (MaxText's dense_matmul with capacity_factor > 0: maxtext@261a8be0
    # MaxText/layers/linears.py:457-505 generate_masks, :549-605). 0 = dropless (every routed
    # token computed, B·T·k/E per expert on average).
    capacity_factor: float = 0.0

    def __post_init__(self) -> None:
        for f, (lo, hi) in _MOE_INT.items():
            check_int("[moe]", f, getattr(self, f), lo, hi)
        cf = self.capacity_factor
        if (
            isinstance(cf, bool)
            or not isinstance(cf, (int, float))
            or not 0.0 <= cf <= MAX_CAPACITY_FACTOR
        ):
            raise SpecError(
                f"[moe]: capacity_factor={cf!r}",
                rule=f"the capacity factor is 0 (dropless) or a number up to {MAX_CAPACITY_FACTOR:g} (tokens per expert over the balanced share)",
                fix="write e.g. capacity_factor = 1.25 (MaxText's dropping recipes), or 0 for dropless",
            )
        if self.d_ff_shared is not None:
            check_int("[moe]", "d_ff_shared", self.d_ff_shared, 1, MAX_FF)
        check_bool("[moe]", "router_bias", self.router_bias)
        check_bool("[moe]", "expert_bias", self.expert_bias)
        if self.n_experts % self.n_groups or self.topk_groups > self.n_groups:
            raise SpecError(
                f"[moe]: n_groups={self.n_groups}, topk_groups={self.topk_groups} for "
                f"{self.n_experts} experts",
                rule="the routing groups split the experts evenly and a token picks at most all groups",
                fix="e.g. n_groups = 8, topk_groups = 4 (DeepSeek-V3), or leave both at 1",
            )


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek-V2/V3 multi-head latent attention ranks."""

    q_lora_rank: int | None  # None = plain Q projection
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        for f, (lo, hi) in _MLA_INT.items():
            check_int("[mla]", f, getattr(self, f), lo, hi)
        if self.q_lora_rank is not None:
            check_int("[mla]", "q_lora_rank", self.q_lora_rank, 1, MAX_WIDTH)


@dataclass(frozen=True)
class LinearAttentionSpec:
    """Gated DeltaNet layers of a linear-attention hybrid (Qwen3-Next, Qwen3.5).

    Every `full_attention_interval`-th layer (i % interval == interval − 1) is ordinary full
    attention; the others are Gated DeltaNet (Yang, Kautz, Hatamizadeh, "Gated Delta Networks",
    arXiv 2412.06464): q, k over `n_key_heads` of `key_head_dim`, v and the output gate z over
    `n_value_heads` of `value_head_dim`, a depthwise causal conv of `conv_kernel` taps over the
    q/k/v channels, and per sequence a fixed recurrent state of n_value_heads·dk·dv values per
    layer instead of a KV cache. Qwen/Qwen3.5-397B-A17B config.json (text_config): 16 key / 64
    value heads of 128, conv 4, full_attention_interval 4 (layer_types: 3 linear : 1 full).
    `chunk_size`: the block of the chunked delta rule in prefill (flash-linear-attention's
    chunk_gated_delta_rule uses 64; Yang et al., arXiv 2406.06484 §3.2).
    """

    n_key_heads: int
    n_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4
    full_attention_interval: int = 4
    chunk_size: int = 64

    def __post_init__(self) -> None:
        for f, (lo, hi) in _LINEAR_INT.items():
            check_int("[linear]", f, getattr(self, f), lo, hi)
        if self.n_value_heads % self.n_key_heads:
            raise SpecError(
                f"[linear]: n_value_heads={self.n_value_heads}, n_key_heads={self.n_key_heads}",
                rule="each key head serves n_value_heads / n_key_heads value heads, so it divides them",
                fix=f"use n_key_heads in {divisors(self.n_value_heads)}",
            )

    @property
    def conv_channels(self) -> int:
        """Channels of the depthwise conv: q and k (key heads) plus v (value heads)."""
        return 2 * self.n_key_heads * self.key_head_dim + self.n_value_heads * self.value_head_dim

    @property
    def state_elements(self) -> int:
        """Recurrent state of one sequence in one layer: n_value_heads · dk · dv."""
        return self.n_value_heads * self.key_head_dim * self.value_head_dim


@dataclass(frozen=True)
class DSASpec:
    """DeepSeek Sparse Attention (DeepSeek-V3.2-Exp report, 2025): a lightning indexer of
    `index_n_heads` heads of `index_head_dim` scores every cached token for every query (FP8 in
    the reference kernels), and attention runs over the `index_topk` best keys only.
    GLM-5 (transformers GlmMoeDsaConfig defaults for zai-org/GLM-5): 32 heads of 128, top-2048."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int

    def __post_init__(self) -> None:
        for f, (lo, hi) in _DSA_INT.items():
            check_int("[dsa]", f, getattr(self, f), lo, hi)


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
    # full-attention output gate (Qwen3-Next/Qwen3.5 attn_output_gate): q_proj also yields a
    # sigmoid gate of N·H per token that multiplies the context, N·H·D more weights per layer
    attn_output_gate: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    linear: LinearAttentionSpec | None = None  # Gated DeltaNet hybrid: most layers linear
    dsa: DSASpec | None = None  # DeepSeek Sparse Attention on the (MLA) attention layers
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
        where = f"model {self.name!r}" if isinstance(self.name, str) else "model"
        self._check_scalars(where)
        self._check_parts(where)
        self._check_relations()

    def _check_scalars(self, where: str) -> None:
        """Every scalar field's type and range (bounds where a size stops being physical)."""
        for f in _STR_FIELDS:
            check_str(where, f, getattr(self, f))
        for f, (lo, hi) in _INT_FIELDS.items():
            check_int(where, f, getattr(self, f), lo, hi)
        for f, (lo, hi) in _OPT_INT_FIELDS.items():
            if getattr(self, f) is not None:
                check_int(where, f, getattr(self, f), lo, hi)
        for f in _BOOL_FIELDS:
            check_bool(where, f, getattr(self, f))
        for f in _OPT_NUMBER_FIELDS:
            if getattr(self, f) is not None:
                check_number(where, f, getattr(self, f), hi=MAX_PARAMS)

    def _check_parts(self, where: str) -> None:
        """mlp, moe, mla and aliases are of their own types (tables parsed at the edge)."""
        if not isinstance(self.mlp, MLPKind):
            raise SpecError(
                f"{where}: mlp = {self.mlp!r}",
                rule="mlp is 'gated' (SwiGLU/GeGLU) or 'plain'",
                fix='write mlp = "gated" or mlp = "plain"',
            )
        for f, kind in _SUBTABLES:
            v = getattr(self, f)
            if v is not None and not isinstance(v, kind):
                raise SpecError(
                    f"{where}: {f} = {v!r}",
                    rule=f"{f} is a [{f}] table with the fields of {kind.__name__}",
                    fix=f"write a [{f}] table (see specs/models/deepseek-v3.toml) or remove {f}",
                )
        if not isinstance(self.aliases, tuple):
            raise SpecError(
                f"{where}: aliases = {self.aliases!r}", rule="aliases is a tuple of names"
            )

    def _check_relations(self) -> None:
        """Rules between fields: K divides N (not MLA), top_k <= E, dense layers <= L."""
        if self.mla is None and self.n_heads % self.n_kv_heads:
            raise SpecError(
                f"model {self.name!r}: n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}",
                rule="grouped-query attention shares each KV head among N/K query heads, so K must divide N",
                fix=f"use n_kv_heads in {divisors(self.n_heads)}",
            )
        m = self.moe
        if m is not None and not (0 < m.top_k <= m.n_experts):
            raise SpecError(
                f"model {self.name!r}: top_k={m.top_k} with n_experts={m.n_experts}",
                rule="1 <= top_k <= n_experts",
                fix="correct moe.top_k or moe.n_experts",
            )
        if m is not None and not (0 <= m.dense_layers <= self.n_layers):
            raise SpecError(
                f"model {self.name!r}: moe.dense_layers={m.dense_layers} with n_layers={self.n_layers}",
                rule="0 <= dense_layers <= n_layers",
                fix="correct moe.dense_layers",
            )
        if self.dsa is not None and self.mla is None:
            raise SpecError(
                f"model {self.name!r}: [dsa] without [mla]",
                rule="DeepSeek Sparse Attention is modelled on MLA attention (DeepSeek-V3.2, GLM-5)",
                fix="add the [mla] table of the model or remove [dsa]",
            )

    # -- derived ----------------------------------------------------------------
    @property
    def attention(self) -> AttentionKind:
        if self.mla is not None:
            return AttentionKind.MLA
        if self.n_kv_heads == self.n_heads:
            return AttentionKind.MHA
        return AttentionKind.MQA if self.n_kv_heads == 1 else AttentionKind.GQA

    def is_full_attention_layer(self, i: int) -> bool:
        """True unless layer i is a linear-attention (Gated DeltaNet) layer of a hybrid."""
        lin = self.linear
        return lin is None or i % lin.full_attention_interval == lin.full_attention_interval - 1

    @property
    def n_attention_layers(self) -> int:
        """Layers with softmax attention and a KV cache: all, or L // interval in a hybrid."""
        lin = self.linear
        return self.n_layers if lin is None else self.n_layers // lin.full_attention_interval

    @property
    def n_linear_layers(self) -> int:
        return self.n_layers - self.n_attention_layers

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
        """Layers i in [0, L) with i % period == 0: ceil(L / period) (closed form, no loop)."""
        if self.sliding_window is None or self.local_layer_period <= 0:
            return 0
        return -(-self.n_layers // self.local_layer_period)

    def __repr__(self) -> str:  # short: the name and the shape that sizes everything
        moe = f", {self.moe.n_experts} experts top-{self.moe.top_k}" if self.moe else ""
        return (
            f"ModelSpec({self.name!r}: L={self.n_layers}, D={self.d_model}, F={self.d_ff}, "
            f"heads {self.n_heads}/{self.n_kv_heads} kv x {self.d_head}, V={self.vocab}{moe})"
        )

    def with_(self, **changes: Any) -> ModelSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (MoESpec, MLASpec, LinearAttentionSpec, DSASpec)):
                v = {g.name: getattr(v, g.name) for g in fields(v)}
            elif isinstance(v, enum.Enum):
                v = v.value
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        out["attention"] = self.attention.value
        return out


_SUBTABLES: tuple[tuple[str, type], ...] = (
    ("moe", MoESpec),
    ("mla", MLASpec),
    ("linear", LinearAttentionSpec),
    ("dsa", DSASpec),
)


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, in O(sqrt n) (n is bounded by MAX_HEADS where used)."""
    small, large, i = [], [], 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def _subtable(data: dict, key: str, kind: type, where: str) -> Any:
    """[moe] / [mla] / [linear] / [dsa] table -> its spec, missing fields named (that it is a
    table of the spec's fields is the schema's, checked before this)."""
    v = dict(data[key])
    if kind is MLASpec:
        v.setdefault("q_lora_rank", None)  # TOML has no null: absent = a plain Q projection
    required = [f.name for f in fields(kind) if f.default is dataclasses.MISSING]
    for k in required:
        if k not in v:
            raise SpecError(
                f"{where}: [{key}] lacks {k!r}",
                rule=f"[{key}] needs " + ", ".join(required),
                fix=f"add `{k} = ...` under [{key}]",
            )
    return kind(**v)


def _check_required(data: dict, where: str) -> None:
    """The keys every model file gives (unknown keys are the schema's, checked before this)."""
    for req in ("name", "n_layers", "d_model", "d_ff", "n_heads", "vocab"):
        if req not in data:
            raise SpecError(
                f"{where} lacks {req!r}",
                rule="name, n_layers, d_model, d_ff, n_heads and vocab are required",
                fix=f"add `{req} = ...`",
            )


def _fill_defaults(data: dict, where: str) -> None:
    """n_kv_heads = n_heads and d_head = d_model / n_heads, read after both are checked."""
    for f in ("d_model", "n_heads"):
        check_int(where, f, data[f], *_INT_FIELDS[f])
    data.setdefault("n_kv_heads", data["n_heads"])
    if "d_head" not in data:
        if data["d_model"] % data["n_heads"]:
            raise SpecError(
                f"{where}: d_head not given and d_model={data['d_model']} is not divisible by n_heads={data['n_heads']}",
                rule="d_head defaults to d_model / n_heads",
                fix="give d_head explicitly",
            )
        data["d_head"] = data["d_model"] // data["n_heads"]


def _parse_mlp(v: Any, where: str) -> MLPKind:
    mlp = check_str(where, "mlp", v, max_chars=16)
    if mlp not in {k.value for k in MLPKind}:
        raise SpecError(
            f"{where}: mlp = {mlp!r}",
            rule="mlp is 'gated' (SwiGLU/GeGLU) or 'plain'",
            fix='write mlp = "gated" or mlp = "plain"',
        )
    return MLPKind(mlp)


def model_from_dict(d: dict[str, Any], origin: str) -> ModelSpec:
    """Build a ModelSpec from a TOML-shaped dict ([moe] and [mla] sub-tables allowed).

    Every value is type- and range-checked before any arithmetic; errors name the file. Keys,
    types and sub-table shapes are the schema's; presence, ranges and relations are checked here
    and in ModelSpec (which also guards models built in code).
    """
    check_schema("model", d, origin)
    data = dict(d)
    where = f"model file {origin}"
    _check_required(data, where)
    try:
        _fill_defaults(data, where)
        if "mlp" in data:
            data["mlp"] = _parse_mlp(data["mlp"], where)
        for key, kind in _SUBTABLES:
            if key in data:
                data[key] = _subtable(data, key, kind, where)
        if "aliases" in data:
            data["aliases"] = check_str_list(where, "aliases", data["aliases"])
        return ModelSpec(**data)
    except SpecError as e:
        if e.what.startswith(where):
            raise
        raise SpecError(f"{where}: {e.what}", rule=e.rule, fix=e.fix) from None


__all__ = [
    "ModelSpec",
    "MoESpec",
    "MLASpec",
    "LinearAttentionSpec",
    "DSASpec",
    "MLPKind",
    "AttentionKind",
    "model_from_dict",
]
