"""Inference steps on the ledger: what one engine pass costs and what a replica holds in memory.

A serving replica runs passes. A pass decodes one token for each of B running sequences (KV length
S each) and, when the engine mixes them in, prefills a chunk of new prompt tokens. Its cost is the
ledger's rows at those shapes walked by the sharded-einsum algebra (serving_step.py): weight rows
once per pass for all the pass's tokens (routed experts: only the distinct ones the tokens chose),
attention rows per part (decode reads each sequence's KV cache; prefill is causal flash attention
over the prompt), each row on the chip's roofline (book inference.md).

This module holds what the step models share: quantisation (`Quant`), the replica's plan
(`ServePlan`), the pass shape and its cost record (`PassShape`, `PassTimes`), the `StepModel`
interface, the split of the ledger's rows into token rows and per-part rows (`Rows`), and memory
per chip. Memory per chip (`memory_per_chip`) follows the plan: dense weights over tp·pp, expert
weights over all chips of the replica, the KV cache over min(tp, K) KV heads (replicated when
tp > K: each chip keeps the KV heads its query heads need), the batch over dp and the layers
over pp.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from roofline.core.ledger import (
    DtypePolicy,
    Ledger,
    Op,
    OpKind,
    build_ledger,
    causal_fraction,
    count_params,
    kv_cache_bytes_per_token,
    moe_token_rows,
)
from roofline.errors import PlanError
from roofline.specs.chip import Chip
from roofline.specs.efficiency import Efficiency
from roofline.specs.model import ModelSpec
from roofline.units import dtype_bytes, parse_dtype

BIG = float(2**30)  # template key length: long enough that every sliding window is shorter


# --------------------------------------------------------------------------------------
# Quantisation and plans
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quant:
    """Storage dtypes of weights and KV cache and the matmul compute dtype.

    `compute` is the activation dtype of the matmuls: W8A8 / FP8 / NVFP4 kernels compute in the
    low precision (compute = fp8 / fp4), weight-only quantisation dequantises into bf16 (compute =
    bf16; book inference.md: int8 weights with bf16 FLOPs halve B_crit to 120 on v5e).
    `experts` / `embeddings` default to `weights` (see DtypePolicy).
    """

    weights: str = "bf16"
    kv: str = "bf16"
    compute: str = "bf16"
    experts: str | None = None
    embeddings: str | None = None

    def __post_init__(self) -> None:
        for f in ("weights", "kv", "compute"):
            object.__setattr__(self, f, parse_dtype(getattr(self, f)))
        for f in ("experts", "embeddings"):
            v = getattr(self, f)
            if v is not None:
                object.__setattr__(self, f, parse_dtype(v))

    @property
    def policy(self) -> DtypePolicy:
        return DtypePolicy(
            weights=self.weights,
            activations=self.compute,
            kv=self.kv,
            experts=self.experts,
            embeddings=self.embeddings,
        )

    def describe(self) -> str:
        s = f"w={self.weights},kv={self.kv},compute={self.compute}"
        if self.experts and self.experts != self.weights:
            s += f",experts={self.experts}"
        return s


class KVLayout(enum.StrEnum):
    # KV heads over the tensor axis; beyond K ways each chip keeps the KV heads its query heads
    # read, so they replicate (Megatron, vLLM, SGLang, TensorRT-LLM)
    HEADS = "heads"
    # heads over the tensor axis up to K ways, then the batch over the rest: no copies, two
    # AllToAlls per attention layer move the queries (book inference.md "KV cache sharding")
    HEADS_BATCH = "heads_batch"


@dataclass(frozen=True)
class ServePlan:
    """One serving replica's parallelism.

    tp: tensor parallel over heads and MLP (Megatron); KV heads replicate when tp > K.
    pp: pipeline stages over layers. dp: attention data parallel inside the replica (each dp rank
    holds its own sequences' KV; DeepSeek's DP-attention). ep: experts split over ep of the
    tp·dp chips, the rest of them split each expert (expert tensor parallel).
    The replica has tp·pp·dp chips; a system of N chips runs N / (tp·pp·dp) replicas.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    kv_layout: KVLayout = KVLayout.HEADS

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "ep"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PlanError(
                    f"serving plan {f}={v!r}",
                    rule="degrees are positive whole numbers",
                    fix=f"write {f}=1 or more",
                )
        if (self.tp * self.dp) % self.ep:
            raise PlanError(
                f"serving plan ep={self.ep} with tp·dp = {self.tp * self.dp}",
                rule="experts are split over ep of the tp·dp chips that run attention, so ep divides tp·dp",
                fix=f"use ep in {[d for d in range(1, self.tp * self.dp + 1) if (self.tp * self.dp) % d == 0]}",
            )
        object.__setattr__(self, "kv_layout", KVLayout(self.kv_layout))

    @property
    def chips(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def expert_tp(self) -> int:
        return self.tp * self.dp // self.ep

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:  # the spec parse_serve_plan reads back
        return f"ServePlan({self.describe()!r})"

    def describe(self) -> str:
        parts = [f"tp={self.tp}"]
        parts += [f"{k}={getattr(self, k)}" for k in ("pp", "dp", "ep") if getattr(self, k) > 1]
        if self.kv_layout != KVLayout.HEADS:
            parts.append(f"kv={self.kv_layout.value}")
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.describe(),
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "ep": self.ep,
            "chips": self.chips,
            "kv_layout": self.kv_layout.value,
        }


_PLAN_KEYS = {
    "tp": "tp",
    "tensor": "tp",
    "mp": "tp",
    "model": "tp",
    "pp": "pp",
    "pipeline": "pp",
    "dp": "dp",
    "attn_dp": "dp",
    "dp_attention": "dp",
    "ep": "ep",
    "expert": "ep",
}


def parse_serve_plan(text: str | ServePlan) -> ServePlan:
    """'tp=8', 'tp=8,ep=8,dp=8', 'tp=16,kv=heads_batch' -> ServePlan."""
    if isinstance(text, ServePlan):
        return text
    kw: dict[str, Any] = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        k, eq, v = part.partition("=")
        k = k.strip().lower()
        if not eq:
            raise PlanError(
                f"cannot read serving plan item {part!r}",
                rule="a serving plan is a comma-separated list of name=value",
                fix="write e.g. --plan tp=8 or --plan tp=8,ep=8,dp=8",
            )
        if k in _PLAN_KEYS:
            if not re.fullmatch(r"\d+", v.strip()):
                raise PlanError(
                    f"serving plan {k}={v!r}", rule="degrees are whole numbers", fix=f"write {k}=8"
                )
            kw[_PLAN_KEYS[k]] = int(v)
        elif k in ("kv", "kv_layout"):
            try:
                kw["kv_layout"] = KVLayout(v.strip().lower())
            except ValueError:
                raise PlanError(
                    f"serving plan kv={v!r}",
                    rule="kv is 'heads' (KV heads over tp, replicated beyond K) or 'heads_batch' (heads, then the batch: the book's layout)",
                    fix="write kv=heads or kv=heads_batch",
                ) from None
        else:
            raise PlanError(
                f"unknown serving plan key {k!r}",
                rule="keys: tp, pp, dp, ep, kv",
                fix="write e.g. --plan tp=8,ep=8",
            )
    return ServePlan(**kw)


# --------------------------------------------------------------------------------------
# The ledger's rows at pass shapes
# --------------------------------------------------------------------------------------


def _has_kv_seq(op: Op) -> bool:
    return any("kv_seq" in t.dims for t in (*op.inputs, op.out))


def _per_sequence(op: Op) -> bool:
    """A row whose cost follows the sequences, not only the tokens: attention over the KV
    cache, or a per-sequence state (a linear-attention layer's S[batch, heads, dk, dv])."""
    return _has_kv_seq(op) or any(
        "batch" in t.dims and "seq" not in t.dims and not t.is_param for t in (*op.inputs, op.out)
    )


def eval_row(op: Op, batch: Any, seq: Any, kv_seq: Any = None) -> tuple[Any, Any]:
    """FLOPs and HBM bytes of one ledger row at (batch, seq, kv_seq), numpy-broadcast.

    The row's own formulas (Op.flops, Op.bytes) at new sizes: the expert capacity B·T·k/E, the
    routed-weight fraction, the causal fraction and the sliding window follow the new shape.
    """
    s: dict[str, Any] = {"batch": batch, "seq": seq}
    f = op.flop_factor
    if kv_seq is not None and _has_kv_seq(op):
        s["kv_seq"] = kv_seq if op.window is None else np.minimum(kv_seq, op.window)
        if op.kind == OpKind.ATTENTION and op.flop_factor != 1.0 or op.window is not None:
            f = causal_fraction(seq, kv_seq, op.window)
    if "capacity" in op.sizes:
        s["capacity"] = batch * seq * op.sizes["top_k"] / op.sizes["experts"]
    o = replace(op.with_sizes(**s), flop_factor=f)
    return o.flops, o.bytes


def serving_ledger(led: Ledger) -> Ledger:
    """A ledger as an engine runs it: with a MoE layer's combine pass, each token's top_k expert
    outputs summed with its router weights into [tokens, d_model] (ledger.moe_token_rows'
    `moe/unpermute`: vLLM's fused_moe ops.moe_sum, vllm/model_executor/layers/fused_moe/
    fused_moe.py; TensorRT-LLM's finalizeMoeRoutingKernel), in the 16-bit hidden-state dtype the
    expert outputs are written in whatever the GEMMs compute in. The permute before the experts
    is not added: vLLM's and SGLang's Triton fused_moe read the tokens in place through
    sorted_token_ids (TensorRT-LLM's CUTLASS path does permute: not modelled per engine)."""
    up = next((o for o in led.ops if o.name == "moe/up"), None)
    if up is None:
        return led
    dt = up.out.dtype if dtype_bytes(up.out.dtype) >= 2 else "bf16"
    return replace(led, ops=(*led.ops, moe_token_rows(up, dt)[1]))


@dataclass(frozen=True)
class Rows:
    """The ledger rows of a model split for pass pricing.

    `shared`: weight and elementwise rows whose cost depends only on the pass's token count.
    `decode` / `prefill`: rows of that part alone (attention over the KV cache; MLA's absorbed
    projections in decode, its decompression of the cache in prefill).
    """

    shared: tuple[Op, ...]
    decode: tuple[Op, ...]
    prefill: tuple[Op, ...]

    @staticmethod
    def of(model: ModelSpec, quant: Quant) -> Rows:
        pol = quant.policy
        dec = serving_ledger(build_ledger(model, batch=1, seq=1, kv_seq=BIG, dtypes=pol))
        pre = serving_ledger(build_ledger(model, batch=1, seq=BIG, kv_seq=BIG, dtypes=pol))
        dec_names = {o.name for o in dec}
        pre_names = {o.name for o in pre}
        shared = tuple(o for o in dec if o.name in pre_names and not _per_sequence(o))
        names = {o.name for o in shared}
        return Rows(
            shared,
            tuple(o for o in dec if o.name not in names),
            tuple(o for o in pre if o.name not in names and o.name not in dec_names - pre_names),
        )


# --------------------------------------------------------------------------------------
# Pass cost
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassTimes:
    """Per-chip cost of one engine pass (arrays broadcast over candidates / batch sizes).

    time_s = Σ_rows max(T_math, T_mem) + exposed communication + overheads (book roofline.md:
    each row on its own roofline, rows run one after another).
    """

    time_s: Any
    compute_s: Any  # Σ T_math over rows
    memory_s: Any  # Σ T_mem over rows (the HBM-bound time; the book's "step = bytes / W")
    rows_s: Any  # Σ max(T_math, T_mem)
    comm_s: Any  # exposed collective time
    overhead_s: Any  # engine / launch overheads
    flops_per_chip: Any
    hbm_bytes_per_chip: Any
    weight_bytes_per_chip: Any
    kv_bytes_per_chip: Any  # the KV cache read this pass
    breakdown: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    launch_s: Any = 0.0  # fixed kernel time inside rows_s (the profile's kernel_overhead_s)

    @property
    def bound(self) -> Any:
        return np.where(
            np.asarray(self.compute_s) >= np.asarray(self.memory_s), "compute", "memory"
        )


_PASS_SUMS = (
    "time_s",
    "compute_s",
    "memory_s",
    "rows_s",
    "comm_s",
    "overhead_s",
    "flops_per_chip",
    "hbm_bytes_per_chip",
    "weight_bytes_per_chip",
    "kv_bytes_per_chip",
)


@dataclass(frozen=True)
class PassShape:
    """What one pass runs: `decode` sequences at KV length `context`, plus a prefill part of
    `prefill_seqs` chunks of `prefill_chunk` new tokens ending at position `prefill_context`."""

    decode: Any = 0.0
    context: Any = 1.0
    prefill_seqs: Any = 0.0
    prefill_chunk: Any = 1.0
    prefill_context: Any = 1.0

    @property
    def tokens(self) -> Any:
        return (
            np.asarray(self.decode, float)
            + np.asarray(self.prefill_seqs, float) * self.prefill_chunk
        )


class StepModel(Protocol):
    """What the serving layer needs from a step model (serving_step.ShardedStep: the walk's
    sharded step; serving_step.IdealStep: the book's even split of the one-chip walk)."""

    model: ModelSpec
    chip: Chip
    plan: ServePlan
    quant: Quant
    efficiency: Efficiency

    def pass_time(self, shape: PassShape) -> PassTimes: ...

    def memory_per_chip(self, batch: Any, context: Any) -> MemoryPerChip: ...

    def degree(self, name: str) -> Any:
        """A plan degree ('tp', 'dp', ...) per candidate (a scalar for one plan)."""
        ...


@functools.cache
def rows_of(model: ModelSpec, quant: Quant) -> Rows:
    """The model's rows split for pass pricing (cached)."""
    return Rows.of(model, quant)


# --------------------------------------------------------------------------------------
# Memory per chip
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryPerChip:
    """Bytes one chip holds: weights, KV cache, activation workspace (arrays over batch/context)."""

    weights_bytes: Any
    kv_bytes: Any
    activation_bytes: Any
    kv_bytes_per_token: float  # one token of context on this chip (all its layers)
    kv_replication: float  # copies of each KV head across the tensor axis (1 = none)

    @property
    def total_bytes(self) -> Any:
        return self.weights_bytes + self.kv_bytes + self.activation_bytes


def weight_bytes(model: ModelSpec, quant: Quant) -> dict[str, float]:
    """Stored weight bytes by kind: 'dense' (attention, dense MLP, shared experts, norms, router),
    'experts' (routed), 'embeddings' (embedding + unembedding), in each kind's storage dtype."""
    led = build_ledger(model, dtypes=quant.policy)
    out = {"dense": 0.0, "experts": 0.0, "embeddings": 0.0}
    for op in led:
        w = op.weight
        if w is None:
            continue
        b = w.nbytes(op.sizes) * op.count
        if op.routed:
            out["experts"] += b
        elif op.name in ("embed", "unembed"):
            out["embeddings"] += b
        else:
            out["dense"] += b
    return out


def kv_replication(model: ModelSpec, plan: ServePlan) -> float:
    """Copies of each KV head on the tensor axis: tp / K when tp > K (each chip keeps the KV head
    its query heads read; MLA's latent is one shared head, so it replicates tp ways); 1 otherwise."""
    if plan.kv_layout == KVLayout.HEADS_BATCH:
        return 1.0
    K = 1 if model.mla is not None else model.n_kv_heads
    return max(1.0, plan.tp / K)


def memory_per_chip(
    model: ModelSpec,
    plan: ServePlan,
    quant: Quant,
    batch: Any,
    context: Any,
    *,
    ideal: bool = False,
    workspace_tokens: float = 0.0,
) -> MemoryPerChip:
    """Weights + KV + activations on one chip of a replica serving `batch` sequences of `context`.

    ideal=True: the book's even split of everything over the replica's chips (inference.md tables).
    Otherwise dense weights over tp·pp (replicated over dp), routed experts over all tp·pp·dp chips,
    embeddings over tp (vocab-parallel), the KV cache over tp (KV heads, replicated beyond K) and
    pp (layers) with the batch split over dp. `workspace_tokens`: the largest pass (the engine's
    token budget) keeps its activations, D and F/tp wide, alive: ~4 such buffers.
    """
    wb = weight_bytes(model, quant)
    kv_tok = kv_cache_bytes_per_token(model, quant.kv, context=context)
    N = plan.chips
    B = np.asarray(batch, float)
    S = np.asarray(context, float)
    if ideal:
        w = sum(wb.values()) / N
        rep = 1.0
        kv_chip = kv_tok / N
        kv = B * S * kv_chip
    else:
        w = wb["dense"] / (plan.tp * plan.pp) + wb["experts"] / N + wb["embeddings"] / plan.tp
        rep = kv_replication(model, plan)
        kv_chip = kv_cache_bytes_per_token(model, quant.kv, context, rep) / (plan.tp * plan.pp)
        kv = np.ceil(B / plan.dp) * S * kv_chip
    act_b = dtype_bytes(quant.compute if quant.compute != "fp4" else "fp8")
    width = model.d_model + max(model.d_ff, (model.moe.d_ff_expert if model.moe else 0)) / plan.tp
    act = 4 * workspace_tokens * width * max(act_b, 2.0)
    return MemoryPerChip(w + 0 * B, kv, act + 0 * B, float(np.mean(kv_chip)), rep)


def max_batch(
    model: ModelSpec,
    plan: ServePlan,
    quant: Quant,
    context: Any,
    hbm_bytes: float,
    *,
    ideal: bool = False,
    workspace_tokens: float = 0.0,
    usable_fraction: float = 1.0,
) -> Any:
    """Most sequences of `context` tokens a replica holds: (usable HBM − weights − workspace) per
    chip over the KV bytes one sequence puts on a chip (×dp sequences per chip group). 0 when the
    weights alone do not fit."""
    m = memory_per_chip(
        model, plan, quant, 1, context, ideal=ideal, workspace_tokens=workspace_tokens
    )
    free = hbm_bytes * usable_fraction - m.weights_bytes - m.activation_bytes
    per_seq = np.asarray(m.kv_bytes, float)
    n = np.floor(np.maximum(free, 0.0) / per_seq)
    return n if ideal else n * plan.dp


def params_active(model: ModelSpec) -> float:
    return count_params(model).active


def ledger_for(model: ModelSpec, quant: Quant, *, batch: float, context: float) -> Ledger:
    """The decode-step ledger of `batch` sequences at KV length `context` (for display)."""
    from roofline.core.ledger import decode_ledger

    return decode_ledger(model, batch=batch, context=context, dtypes=quant.policy)


def chips_needed(total_bytes: Any, hbm_bytes: float) -> Any:
    """Chips whose HBM holds `total_bytes` (book applied-inference.md: ceil(bytes / HBM))."""
    return np.ceil(np.asarray(total_bytes, float) / hbm_bytes - 1e-12)


def power_of_two_at_least(n: Any) -> Any:
    """2^ceil(log2(n)) (book applied-inference.md `min_topology`)."""
    n = np.maximum(np.asarray(n, float), 1.0)
    return 2.0 ** np.ceil(np.log2(n) - 1e-12)


__all__ = [
    "KVLayout",
    "MemoryPerChip",
    "PassShape",
    "PassTimes",
    "Quant",
    "Rows",
    "ServePlan",
    "StepModel",
    "chips_needed",
    "eval_row",
    "kv_replication",
    "max_batch",
    "memory_per_chip",
    "parse_serve_plan",
    "power_of_two_at_least",
    "rows_of",
    "weight_bytes",
]
