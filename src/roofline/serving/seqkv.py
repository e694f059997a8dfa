"""Sequence-sharded KV caches for long contexts: decode attention with the KV cache split over a
mesh axis (book inference.md: "sequence-sharding the KV cache" for a tiny batch and a long
context; flash-decoding's split-K combine).

The layout: a replica of `tp · kvseq` chips; the KV heads split over `tensor` as in the plain
tensor-parallel layout (`memory_per_chip`, replicated beyond K heads) and every sequence's
context split over `kvseq`, so each chip holds 1/kvseq of the KV cache the tensor-parallel
layout holds. Weights shard over `tensor` only (the kvseq chips keep copies).

The collectives come from the sharded-einsum algebra, not from a formula here: decode
attention is two einsums per layer,

    Sc[B, K_tensor, G, S_kvseq] = Q[B, K_tensor, G, H] · Kc[B, S_kvseq, K_tensor, H]
    O[B, K_tensor, G, H]        = P[B, K_tensor, G, S_kvseq] · Vc[B, S_kvseq, K_tensor, H]

(G = N/K query heads per KV head; MLA: one latent head, H its rank). The first needs no
communication; the second contracts the sharded S, so `plan_einsum` leaves partial sums and
picks the cheapest way to finish them (an AllReduce of O over kvseq, B·N·H/tp elements). The
softmax's running max and sum are combined the same way (an AllReduce of 2·B·N/tp fp32 values:
flash-decoding's log-sum-exp). Each is priced by `collective_cost` on the replica's mesh, so the
extra time per step is L · (T_out + T_stats).

It pays where the KV read it saves, `(1 − 1/kvseq)` of the tensor-parallel layout's, exceeds
that: above `S* = L·(T_out + T_stats) / ((1 − 1/kvseq) · B · kv/token/chip / W_hbm)` tokens of
context (`breakeven_context`), and it fits contexts kvseq times longer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from roofline.core.collectives import CollectiveKind, collective_cost
from roofline.core.mesh import Mesh, make_mesh
from roofline.core.sharding import EinsumPlan, parse_einsum, plan_einsum
from roofline.errors import PlanError
from roofline.serving.inference import Quant, ServePlan, memory_per_chip
from roofline.specs.model import ModelSpec
from roofline.specs.system import System
from roofline.units import fmt_bytes, fmt_time

_AXES = ("replica", "kvseq", "tensor")
_SCORES = "Q[B, K{k}, G{g}, H] * Kc[B, S{s}, K{k}, H] -> Sc[B, K{k}, G{g}, S{s}]"
_OUTPUT = "P[B, K{k}, G{g}, S{s}] * Vc[B, S{s}, K{k}, H] -> O[B, K{k}, G{g}, H]"
_STATS_BYTES = 4.0  # fp32 running max and sum per query head


@dataclass(frozen=True)
class SeqKV:
    """Decode attention with the KV cache sharded over `kvseq` chips (per chip unless named)."""

    tp: int
    kvseq: int
    batch: float
    context: float
    n_layers: int
    weights_bytes: float
    kv_bytes: float  # this layout
    kv_bytes_tp_only: float  # the tensor-parallel layout on tp chips
    hbm_bytes: float
    kv_read_s: float  # kv_bytes / W_hbm per step
    kv_read_tp_only_s: float
    einsums: tuple[dict[str, Any], ...]  # the algebra's plans of one layer's attention
    out_allreduce_s: float  # per layer, from the algebra's chosen option
    stats_allreduce_s: float  # per layer
    extra_comm_s: float  # per step: L · (out + stats)
    breakeven_context: float | None  # context above which it reads faster than it talks
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return self.weights_bytes + self.kv_bytes <= self.hbm_bytes

    @property
    def fits_tp_only(self) -> bool:
        return self.weights_bytes + self.kv_bytes_tp_only <= self.hbm_bytes

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["notes"] = list(self.notes)
        out["einsums"] = list(self.einsums)
        out["fits"], out["fits_tp_only"] = self.fits, self.fits_tp_only
        if self.breakeven_context is None:
            out["breakeven_context_reason"] = "kvseq = 1: nothing is sharded, nothing saved"
        return out


def _mesh(system: System, tp: int, kvseq: int) -> Mesh:
    per = tp * kvseq
    if kvseq < 1 or tp < 1 or system.n_chips % per:
        raise PlanError(
            f"tp={tp} × kvseq={kvseq} on {system.name} ({system.n_chips} chips)",
            rule="a sequence-sharded replica has tp·kvseq chips and the system holds whole replicas",
            fix=f"pick tp·kvseq dividing {system.n_chips}, e.g. --plan tp=8 --kv-seq "
            f"{max(1, system.n_chips // 8)}",
        )
    return make_mesh(system, [("replica", system.n_chips // per), ("kvseq", kvseq), ("tensor", tp)])


def _heads(model: ModelSpec, tp: int) -> tuple[dict[str, float], str, str]:
    """Dim sizes of one layer's decode attention and which of K, G carries `tensor`."""
    if model.mla is not None:
        K, H = 1, model.mla.kv_lora_rank
    else:
        K, H = model.n_kv_heads, model.d_head
    G = model.n_heads / K
    on_k = tp > 1 and K % tp == 0
    k_ax = "_tensor" if on_k else ""
    g_ax = "_tensor" if tp > 1 and not on_k else ""
    return {"K": K, "G": G, "H": H}, k_ax, g_ax


def _attention_plans(
    model: ModelSpec, mesh: Mesh, tp: int, kvseq: int, batch: float, context: float
) -> tuple[EinsumPlan, EinsumPlan]:
    dims, k_ax, g_ax = _heads(model, tp)
    sizes = dims | {"B": batch, "S": context}
    sizes_mesh = {"replica": 1, "kvseq": kvseq, "tensor": tp}
    chip = mesh.system.chip

    def comm(kind: CollectiveKind, b: Any, axes: tuple[str, ...]) -> Any:
        return collective_cost(kind, b, axes, mesh).time_s

    plans = []
    for expr in (_SCORES, _OUTPUT):
        lhs, rhs, out = parse_einsum(expr.format(k=k_ax, g=g_ax, s="_kvseq"), _AXES)
        plans.append(
            plan_einsum(
                lhs,
                rhs,
                out,
                sizes,
                sizes_mesh,
                comm,
                peak_flops_per_s=chip.peak(chip.default_dtype),
                hbm_bw_bytes_per_s=chip.hbm_bw_bytes_per_s,
                check_divisible=False,
            )
        )
    return plans[0], plans[1]


def sequence_sharded_decode(
    model: ModelSpec,
    system: System,
    *,
    tp: int,
    kvseq: int,
    batch: float,
    context: float,
    quant: Quant | None = None,
) -> SeqKV:
    """The sequence-sharded KV layout of a decode step (see the module docstring)."""
    quant = quant or Quant()
    mesh = _mesh(system, tp, kvseq)
    mem = memory_per_chip(model, ServePlan(tp=tp), quant, batch, context)
    kv_tp = float(mem.kv_bytes)
    kv = kv_tp / kvseq
    w_hbm = system.chip.hbm_bw_bytes_per_s
    scores, output = _attention_plans(model, mesh, tp, kvseq, batch, context)
    t_out = float(output.comm_time_s)
    n_tp = output.out.local_elements({"B": batch, **_heads(model, tp)[0]}, {"tensor": tp})
    stats = 2 * _STATS_BYTES * n_tp / _heads(model, tp)[0]["H"]
    t_stats = float(collective_cost(CollectiveKind.ALL_REDUCE, stats, ("kvseq",), mesh).time_s)
    L = model.n_layers
    extra = L * (t_out + t_stats)
    saved_per_token = (1 - 1 / kvseq) * kv_tp / context / w_hbm
    return SeqKV(
        tp=tp,
        kvseq=kvseq,
        batch=batch,
        context=context,
        n_layers=L,
        weights_bytes=float(mem.weights_bytes),
        kv_bytes=kv,
        kv_bytes_tp_only=kv_tp,
        hbm_bytes=system.chip.fit_hbm_bytes,
        kv_read_s=kv / w_hbm,
        kv_read_tp_only_s=kv_tp / w_hbm,
        einsums=tuple(_einsum_row(p) for p in (scores, output)),
        out_allreduce_s=t_out,
        stats_allreduce_s=t_stats,
        extra_comm_s=extra,
        breakeven_context=extra / saved_per_token if saved_per_token > 0 else None,
        notes=(
            "weights shard over tensor only (the kvseq chips keep copies)",
            "KV per chip is the tensor-parallel layout's (memory_per_chip) over kvseq",
        ),
    )


def _einsum_row(p: EinsumPlan) -> dict[str, Any]:
    b = p.best
    return {
        "expr": p.expr,
        "strategy": b.describe(),
        "collectives": [c.to_dict() for c in b.comms],
        "comm_time_s": float(b.comm_time_s),
        "hbm_bytes_per_chip": float(b.hbm_bytes_per_chip),
        "memory_time_s": float(p.memory_time_s),
    }


def explain(s: SeqKV) -> list[str]:
    """Book-style lines: formula, substitution, result."""
    n, L = s.kvseq, s.n_layers
    fit = "fits" if s.fits else "DOES NOT FIT"
    fit_tp = "fits" if s.fits_tp_only else "does not fit"
    lines = [
        f"KV per chip: KV(tp={s.tp}) / kvseq = {fmt_bytes(s.kv_bytes_tp_only)} / {n} = "
        f"{fmt_bytes(s.kv_bytes)}; with weights {fmt_bytes(s.weights_bytes)}: "
        f"{fmt_bytes(s.kv_bytes + s.weights_bytes)} of {fmt_bytes(s.hbm_bytes)} ({fit}; "
        f"on tp={s.tp} chips alone it {fit_tp})",
        f"KV read per step: {fmt_time(s.kv_read_s)} (tp only: {fmt_time(s.kv_read_tp_only_s)})",
        "one layer's decode attention, by the sharded-einsum algebra:",
    ]
    for e in s.einsums:
        lines.append(f"  {e['expr']}: {e['strategy']} ({fmt_time(e['comm_time_s'])})")
    lines += [
        f"  softmax max and sum: all-reduce_kvseq of 2·B·N/tp fp32 ({fmt_time(s.stats_allreduce_s)})",
        f"extra per step: L·(T_out + T_stats) = {L}·({fmt_time(s.out_allreduce_s)} + "
        f"{fmt_time(s.stats_allreduce_s)}) = {fmt_time(s.extra_comm_s)}",
    ]
    if s.breakeven_context is not None:
        lines.append(
            f"pays off above S* = L·(T_out + T_stats) / ((1 − 1/kvseq)·KV read per token) = "
            f"{s.breakeven_context:.4g} tokens of context (asked: {s.context:.4g})"
        )
    return lines
