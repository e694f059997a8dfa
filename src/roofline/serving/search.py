"""The serving planner: topology × plan × batch × quantisation, searched as arrays.

Each candidate is one replica shape (chips, tensor/pipeline/expert/attention-data degrees, weight
and KV dtypes) running B sequences; the deployment holds as many replicas as the load needs
(`concurrency` or `rate`) within the system's chips. Rejections are data with a name ("does not
fit HBM", "misses the TTFT target", ...); the survivors are ranked by the objective (cost: $ per
million output tokens; throughput: output tokens/s per chip; latency: TPOT), and the Pareto of
tokens/s/user against tokens/s/chip is returned with the best plan's arithmetic.

Long contexts (issue 20): beside tp/pp/dp/ep the search tries sequence-sharded KV replicas,
`tp × kvseq` chips with each sequence's KV cache split over `kvseq` (serving.seqkv), where the
workload's longest context passes seqkv's break-even at the largest batch tried (the KV read
saved outweighs the per-layer AllReduces over kvseq). Such a replica costs as the tensor-
parallel step on `tp` chips at 1/kvseq of the context, plus seqkv's extra communication at each
pass's decode batch (`_SeqKVStep`); its weights shard over tensor only. Searched without an
engine only: the engines' launch writers do not express it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roofline.core.ledger import kv_cache_bytes_per_token
from roofline.errors import PlanError, RooflineError
from roofline.serving.inference import (
    PassShape,
    Quant,
    ServePlan,
    kv_replication,
    weight_bytes,
)
from roofline.serving.steady import (
    Workload,
    deployment_metrics,
    engine_overhead_s,
    pareto_front,
    steady_state,
)
from roofline.serving.step import IdealStep
from roofline.specs.efficiency import PEAK, Efficiency
from roofline.specs.engines import EngineProfile
from roofline.specs.model import ModelSpec
from roofline.specs.system import System, parse_system
from roofline.units import HOUR, parse_dtype


class Objective(enum.StrEnum):
    COST = "cost"
    THROUGHPUT = "throughput"
    LATENCY = "latency"


REJECT_HBM = "does not fit HBM"
REJECT_KV = "KV cache does not fit at this batch"
REJECT_TTFT = "misses the TTFT target"
REJECT_TPOT = "misses the TPOT target"
REJECT_CHIPS = "needs more chips than the system has"
REJECT_LOAD = "cannot carry the load"


@dataclass(frozen=True)
class ServeQuery:
    model: ModelSpec
    system: System
    workload: Workload
    quants: tuple[Quant, ...] = (Quant(),)
    plan: ServePlan | None = None
    engine: EngineProfile | None = None
    efficiency: Efficiency = PEAK
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    objective: Objective = Objective.COST
    batches: tuple[int, ...] | None = None
    # with `plan` (tp only): its replicas shard each sequence's KV cache over kvseq chips, the
    # `tp=T,kvseq=K` rows the search prints (`seqkv_options`) fixed as `serve --plan` reads them
    kvseq: int = 1


@dataclass(frozen=True)
class Candidates:
    """Flat arrays, one entry per candidate."""

    chips: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    batch: np.ndarray
    quant: np.ndarray  # index into query.quants
    system: list[System] = field(default_factory=list)  # by chip count index
    sys_index: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    kvseq: np.ndarray = field(default_factory=lambda: np.zeros(0, int))  # KV sequence shards

    def __len__(self) -> int:
        return len(self.chips)

    def plan(self, i: int) -> ServePlan:
        return ServePlan(
            tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]), ep=int(self.ep[i])
        )


def topologies(system: System) -> list[System]:
    """Replica sizes to try: TPU slices of the system's chip doubling one axis at a time (book
    applied-inference.md: 2x2, 4x2, 4x4, 4x8, ...) up to the system's shape; GPU counts 1, 2, 4,
    ... up to the system."""
    if system.is_tpu and system.topology:
        full = tuple(system.topology)
        shape = [1] * len(full)
        out = [_slice(system, shape)]
        while True:
            grow = [i for i in range(len(full)) if shape[i] * 2 <= full[i]]
            if not grow:
                break
            i = min(grow, key=lambda j: (shape[j], -j))
            shape[i] *= 2
            out.append(_slice(system, shape))
        if out[-1].n_chips != system.n_chips:
            out.append(system)
        return out
    out, n = [], 1
    while n <= system.n_chips:
        out.append(
            parse_system(f"{system.chip.name}:{n}", usd_per_chip_hour=system.usd_per_chip_hour)
        )
        n *= 2
    if out[-1].n_chips != system.n_chips:
        out.append(system)
    return out


def _slice(system: System, shape: list[int]) -> System:
    if tuple(shape) == tuple(system.topology):
        return system
    return parse_system(
        f"{system.chip.name}:{'x'.join(map(str, shape))}",
        usd_per_chip_hour=system.usd_per_chip_hour,
    )


def plans_for(model: ModelSpec, n: int, system: System) -> list[ServePlan]:
    """Plans of one replica of n chips: tensor parallel within the fast domain (heads must
    divide), pipeline over the rest; MoE models also expert parallel with attention data
    parallel (DeepSeek's layout)."""
    out = []
    heads = model.n_heads
    fast = n if system.is_tpu else (system.chip.nvlink_domain or 8)
    for tp in (d for d in range(1, n + 1) if n % d == 0):
        pp = n // tp
        if heads % tp or tp > fast or pp > model.n_layers or (pp & (pp - 1)):
            continue
        out.append(ServePlan(tp=tp, pp=pp))
        if model.moe is not None and tp > 1:
            out.append(ServePlan(tp=tp, pp=pp, ep=tp))
            out.append(ServePlan(tp=1, pp=pp, dp=tp, ep=tp))
    return out


def candidates(q: ServeQuery) -> Candidates:
    systems = topologies(q.system)
    rows: list[tuple[int, ...]] = []
    batches = q.batches or _batches(q.workload.concurrency)
    for si, s in enumerate(systems):
        plans = [q.plan] if q.plan is not None else plans_for(q.model, s.n_chips, s)
        if q.plan is not None and q.plan.chips * q.kvseq != s.n_chips:
            continue
        kv = q.kvseq if q.plan is not None else 1
        for p in plans:
            for b in batches:
                for qi in range(len(q.quants)):
                    rows.append((s.n_chips, p.tp, p.pp, p.dp, p.ep, b, qi, si, kv))
        for tp, kvseq, qi in seqkv_options(q, s, max(batches)):
            rows += [(s.n_chips, tp, 1, 1, 1, b, qi, si, kvseq) for b in batches]
    if not rows:
        raise PlanError(
            f"no replica of the plan {q.plan.describe() if q.plan else ''} fits {q.system.name}",
            rule="a replica's chips (tp·pp·dp) are one of the system's sub-slices or GPU counts",
            fix="change --plan or --system",
        )
    a = np.array(rows, dtype=np.int64)
    return Candidates(
        *(a[:, i] for i in range(7)), system=systems, sys_index=a[:, 7], kvseq=a[:, 8]
    )


def seqkv_options(q: ServeQuery, s: System, batch: float) -> list[tuple[int, int, int]]:
    """(tp, kvseq, quant index) of the sequence-sharded KV replicas of `s` worth searching: the
    heads split over tp inside the fast domain, the context over kvseq = chips/tp ≥ 2, where the
    workload's longest context is past seqkv's break-even at `batch` (long contexts only)."""
    from roofline.serving.seqkv import sequence_sharded_decode

    n, ctx = s.n_chips, q.workload.max_context
    if q.plan is not None or q.engine is not None or n < 2:
        return []
    fast = n if s.is_tpu else (s.chip.nvlink_domain or 8)
    out = []
    for tp in (d for d in range(1, n // 2 + 1) if n % d == 0):
        if q.model.n_heads % tp or tp > fast:
            continue
        for qi, quant in enumerate(q.quants):
            try:
                sk = sequence_sharded_decode(
                    q.model, s, tp=tp, kvseq=n // tp, batch=batch, context=ctx, quant=quant
                )
            except RooflineError:
                continue
            if sk.breakeven_context is not None and ctx >= sk.breakeven_context:
                out.append((tp, n // tp, qi))
    return out


@dataclass
class _SeqKVStep:
    """Replicas of tp × kvseq chips (one kvseq for all, tp per candidate) with each sequence's
    KV cache split over kvseq: the tensor-parallel step on tp chips (`inner`, a ShardedStep
    with one plan per shape and `select`) at 1/kvseq of the context (its KV read and attention
    per chip), plus serving.seqkv's per-layer AllReduces over kvseq (`extra_comm_s`) at each
    pass's decode batch. Every other attribute is the inner step's."""

    inner: Any
    shapes: list[tuple[System, int]]  # (replica system, tp) of each plan of `inner`
    kvseq: int
    context: float
    _extra: dict[tuple[int, int], float] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _extra_at(self, u: int, batch: int) -> float:
        from roofline.serving.seqkv import sequence_sharded_decode

        if (u, batch) not in self._extra:
            system, tp = self.shapes[u]
            self._extra[(u, batch)] = sequence_sharded_decode(
                self.inner.model,
                system,
                tp=tp,
                kvseq=self.kvseq,
                batch=float(batch),
                context=self.context,
                quant=self.inner.quant,
            ).extra_comm_s
        return self._extra[(u, batch)]

    def extra_comm_s(self, batch: Any) -> Any:
        sel = self.inner.sel
        B = np.broadcast_to(
            np.asarray(batch, float), np.broadcast_shapes(np.shape(batch), sel.shape)
        )
        keys = np.ceil(np.maximum(B, 1.0)).astype(int)
        rows = np.broadcast_to(sel, B.shape)  # a pass's batch may carry more axes than `sel`
        extra = np.array(
            [self._extra_at(int(u), int(k)) for u, k in zip(rows.flat, keys.flat, strict=True)],
            float,
        ).reshape(B.shape)
        return np.where(B > 0, extra, 0.0)

    def pass_time(self, shape: PassShape) -> Any:
        ctx = np.asarray(shape.context, float) / self.kvseq
        t = self.inner.pass_time(dataclasses.replace(shape, context=ctx))
        extra = self.extra_comm_s(shape.decode)
        return dataclasses.replace(t, time_s=t.time_s + extra, comm_s=t.comm_s + extra)


def _seqkv_step(
    q: ServeQuery, shapes: list[tuple[System, int]], kvseq: int, quant: Quant, select: Any = None
) -> _SeqKVStep:
    """The sequence-sharded step of replicas `shapes` ((system of tp·kvseq chips, tp) each)."""
    from roofline.serving.step import ShardedStep

    inner = ShardedStep(
        q.model,
        [_replica_system(system, tp) for system, tp in shapes],
        [ServePlan(tp=tp) for _, tp in shapes],
        quant,
        q.efficiency,
        select=select,
    )
    return _SeqKVStep(inner, shapes, kvseq, q.workload.max_context)


def _batches(concurrency: float | None = None) -> tuple[int, ...]:
    """Sequences per replica to try: 1, 2, 4, ... 2048 — at a given concurrency only up to the
    power of two that holds it (larger batches would run the same load)."""
    out = tuple(2**k for k in range(0, 12))
    if concurrency is None:
        return out
    top = 2 ** int(np.ceil(np.log2(max(concurrency, 1.0))))
    return tuple(b for b in out if b <= top) or (1,)


@dataclass(frozen=True)
class Evaluated:
    """Arrays of every candidate's metrics and its rejection (empty string = feasible)."""

    cand: Candidates
    metrics: dict[str, np.ndarray]
    reason: np.ndarray
    prompt_per_output: float = 1.0  # input tokens per output token of the workload


def default_quants(
    chip: Any,
    engine: EngineProfile | None = None,
    *,
    weights: str | None = None,
    kv: str | None = None,
    compute: str | None = None,
) -> tuple[Quant, ...]:
    """The quantisations the search tries on `chip`, around the dtypes the user pinned.

    Nothing pinned: bf16; int8 (TPU) or fp8 weights and KV with bf16 and with low-precision
    math; and on chips with FP4 units (Blackwell) the NVFP4 checkpoints the engines serve there
    (nvfp4 weights, an FP8 KV cache, FP4 math: NVIDIA's *-FP4 ModelOpt checkpoints). Some
    pinned: an unpinned compute follows the weights where the chip computes their format
    (W8A8, W4A4 as the engines run quantised checkpoints) and is bf16 where it does not
    (weight-only kernels); an unpinned KV cache is the engine's default for those weights
    (`EngineProfile.kv_dtype_for`; bf16 without an engine) — never a silent bf16 compute."""
    from roofline.serving.step import compute_on

    if not (weights or kv or compute):
        low = "int8" if chip.is_tpu else "fp8"
        out = [Quant(), Quant(low, low, "bf16"), Quant(low, low, low)]
        if "fp4" in chip.peak_flops_per_s:
            out.append(Quant("nvfp4", "fp8", "nvfp4"))
        return tuple(out)
    w = weights or "bf16"
    kv_d = kv or (engine.kv_dtype_for(parse_dtype(w)) if engine else "bf16")
    return (Quant(w, kv_d, compute or compute_on(w, chip)),)


def memory_arrays(q: ServeQuery, c: Candidates, qi: int, sel: np.ndarray) -> dict[str, np.ndarray]:
    """Weights, KV per sequence and capacity per chip for the selected candidates (inference.py's
    memory_per_chip rules, vectorised over plans)."""
    quant = q.quants[qi]
    wb = weight_bytes(q.model, quant)
    tp, pp, dp, n = (c.tp[sel].astype(float), c.pp[sel].astype(float), c.dp[sel], c.chips[sel])
    kvs = c.kvseq[sel].astype(float)  # sequence-sharded KV: weights over tensor only
    w = wb["dense"] / (tp * pp) + wb["experts"] / (n / kvs) + wb["embeddings"] / tp
    ctx = q.workload.max_context
    rep = np.array([kv_replication(q.model, ServePlan(tp=int(t))) for t in c.tp[sel]])
    kv_seq = kv_cache_bytes_per_token(q.model, quant.kv, ctx, rep) * ctx / (tp * pp * kvs)
    hbm = q.system.chip.fit_hbm_bytes
    e = q.engine
    usable = e.kv_memory_bytes(hbm, w, 0.0, n) if e else hbm - w
    cap = np.floor(np.maximum(usable, 0.0) / kv_seq) * dp
    return {"weights": w, "kv_seq": kv_seq, "cap": cap, "usable": usable}


def evaluate(q: ServeQuery) -> Evaluated:
    c = candidates(q)
    n = len(c)
    out: dict[str, np.ndarray] = {
        k: np.full(n, np.nan)
        for k in (
            "ttft_s",
            "tpot_s",
            "e2e_s",
            "tokens_per_s",
            "tokens_per_s_per_chip",
            "tokens_per_s_per_user",
            "requests_per_s",
            "replicas",
            "deploy_chips",
            "max_batch",
            "memory_per_chip_bytes",
            "weights_per_chip_bytes",
            "usd_per_million_output_tokens",
            "usd_per_million_input_tokens",
            "usd_bill_per_million_output_tokens",
            "step_time_s",
            "prefill_share",
            "concurrency_per_replica",
        )
    }
    reason = np.full(n, "", dtype=object)
    from roofline.progress import track

    for qi, quant in track(list(enumerate(q.quants)), "serve: costing dtypes", unit="dtype set"):
        sel = c.quant == qi
        mem = memory_arrays(q, c, qi, sel)
        _evaluate_quant(q, c, sel, quant, mem, out, reason)
    return Evaluated(c, out, reason, q.workload.prompt / q.workload.gen)


def _evaluate_quant(q, c, sel, quant, mem, out, reason) -> None:
    idx = np.nonzero(sel)[0]
    B = c.batch[sel].astype(float)
    cap = mem["cap"]
    w = q.workload
    # B is the most sequences a replica runs; a given concurrency spreads over enough replicas
    conc = np.minimum(B, np.maximum(cap, 1.0))
    if w.concurrency is not None:
        replicas = np.ceil(w.concurrency / conc)
        conc = w.concurrency / replicas
    s, dec = _steady(q, c, idx, quant, conc, np.maximum(cap, 1.0))
    if w.rate is not None:
        replicas = np.ceil(w.rate / s.requests_per_s)
    elif w.concurrency is None:
        replicas = np.ones_like(B)
    chips_total = replicas * c.chips[sel]
    m = deployment_metrics(s, w, c.chips[sel], replicas, q.system.usd_per_chip_hour)
    vals = {
        "ttft_s": m.ttft_s,
        "tpot_s": m.tpot_s,
        "e2e_s": m.e2e_s,
        "tokens_per_s": m.output_tokens_per_s,
        "tokens_per_s_per_chip": m.tokens_per_s_per_chip,
        "tokens_per_s_per_user": m.tokens_per_s_per_user,
        "requests_per_s": m.requests_per_s,
        "replicas": replicas,
        "deploy_chips": chips_total,
        "max_batch": cap,
        "memory_per_chip_bytes": mem["weights"] + np.minimum(B, cap) / c.dp[sel] * mem["kv_seq"],
        "weights_per_chip_bytes": mem["weights"],
        "step_time_s": dec,
        "prefill_share": s.prefill_share,
        "concurrency_per_replica": conc,
    }
    if m.usd_per_million_output_tokens is not None:
        vals["usd_per_million_output_tokens"] = m.usd_per_million_output_tokens
        vals["usd_per_million_input_tokens"] = m.usd_per_million_input_tokens
        vals["usd_bill_per_million_output_tokens"] = m.usd_bill_per_million_output_tokens
    for k, v in vals.items():
        out[k][idx] = np.broadcast_to(np.asarray(v, float), idx.shape)
    r = np.full(len(idx), "", dtype=object)
    hbm = q.system.chip.fit_hbm_bytes
    r[(B > cap) & (cap >= 1)] = REJECT_KV
    r[mem["usable"] <= 0] = REJECT_HBM
    r[(cap < 1) & (mem["usable"] > 0)] = REJECT_HBM
    ok = r == ""
    if q.slo_ttft_s is not None:
        r[ok & (m.ttft_s > q.slo_ttft_s)] = REJECT_TTFT
    ok = r == ""
    if q.slo_tpot_s is not None:
        r[ok & (m.tpot_s > q.slo_tpot_s)] = REJECT_TPOT
    ok = r == ""
    r[ok & (chips_total > q.system.n_chips)] = REJECT_CHIPS
    del hbm
    reason[idx] = r


def _steady(q: ServeQuery, c: Candidates, idx: np.ndarray, quant: Quant, conc, cap):
    """Steady state of the candidates `idx` on the walk's sharded step, one step model per KV
    layout (the KV heads as the tensor axis holds them: tp beyond K copies them); also the
    decode pass time."""
    from roofline.serving.steady import Steady
    from roofline.serving.step import ShardedStep, kv_layout

    fields = [f for f in Steady.__dataclass_fields__ if f != "gen_tokens"]
    out = {f: np.zeros(len(idx)) for f in fields}
    dec = np.zeros(len(idx))
    layouts = [
        kv_layout(q.model, int(t)) if kv == 1 else ""
        for t, kv in zip(c.tp[idx], c.kvseq[idx], strict=True)
    ]
    _steady_seqkv(q, c, idx, quant, conc, cap, out, dec)
    for k in sorted(set(layouts) - {""}):
        part = np.array([i for i, x in enumerate(layouts) if x == k])
        rows = np.column_stack(
            [
                c.sys_index[idx][part],
                c.tp[idx][part],
                c.pp[idx][part],
                c.dp[idx][part],
                c.ep[idx][part],
            ]
        )
        uniq, inv = np.unique(rows, axis=0, return_inverse=True)
        plans = [ServePlan(tp=int(r[1]), pp=int(r[2]), dp=int(r[3]), ep=int(r[4])) for r in uniq]
        systems = [c.system[int(r[0])] for r in uniq]
        step = ShardedStep(q.model, systems, plans, quant, q.efficiency, select=inv.reshape(-1))
        st = steady_state(
            step, q.engine, q.workload, conc[part], batch_cap=cap[part], request_latency_s=_lat(q)
        )
        for f in fields:
            out[f][part] = np.broadcast_to(np.asarray(getattr(st, f), float), part.shape)
        d = step.pass_time(
            PassShape(decode=np.maximum(st.decode_batch, 1.0), context=q.workload.decode_context)
        )
        dec[part] = d.time_s
    return Steady(**out, gen_tokens=q.workload.gen), dec


def _lat(q) -> float:
    """The profile's per-request latency (for the engine `serve` specialised it to)."""
    return float(getattr(q.efficiency, "request_latency_s", 0.0))


def _steady_seqkv(q, c, idx, quant, conc, cap, out, dec) -> None:
    """`_steady` for the sequence-sharded KV candidates: one `_SeqKVStep` per kvseq and KV
    layout (the inner step's decode tables hold one context), its shapes selected per candidate."""
    from roofline.serving.steady import Steady
    from roofline.serving.step import kv_layout

    kv, tps = c.kvseq[idx], c.tp[idx]
    groups = {(int(k), kv_layout(q.model, int(t))) for k, t in zip(kv, tps, strict=True) if k > 1}
    for k, lay in sorted(groups, key=str):
        part = np.array(
            [j for j in range(len(idx)) if kv[j] == k and kv_layout(q.model, int(tps[j])) == lay]
        )
        rows = np.column_stack([c.sys_index[idx][part], tps[part]])
        uniq, inv = np.unique(rows, axis=0, return_inverse=True)
        shapes = [(c.system[int(si)], int(tp)) for si, tp in uniq]
        step = _seqkv_step(q, shapes, k, quant, select=inv.reshape(-1))
        st = steady_state(
            step, q.engine, q.workload, conc[part], batch_cap=cap[part], request_latency_s=_lat(q)
        )
        for f in Steady.__dataclass_fields__:
            if f != "gen_tokens":
                out[f][part] = np.broadcast_to(np.asarray(getattr(st, f), float), part.shape)
        d = step.pass_time(
            PassShape(decode=np.maximum(st.decode_batch, 1.0), context=q.workload.decode_context)
        )
        dec[part] = d.time_s


def score(ev: Evaluated, objective: Objective) -> np.ndarray:
    """Lower is better; infeasible candidates get +inf."""
    m = ev.metrics
    if objective == Objective.COST:
        # the whole bill per output token (prefill time included): splitting off the input
        # tokens' share would favour plans that spend longer in prefill; the tables show it
        usd = m["usd_bill_per_million_output_tokens"]
        s = np.where(np.isfinite(usd), usd, -m["tokens_per_s_per_chip"])
    elif objective == Objective.THROUGHPUT:
        s = -m["tokens_per_s_per_chip"]
    else:
        s = m["tpot_s"] + 1e-6 * m["ttft_s"]
    return np.where(ev.reason == "", s, np.inf)


@dataclass(frozen=True)
class ServeResult:
    query: ServeQuery
    evaluated: Evaluated
    order: np.ndarray  # feasible candidates, best first
    pareto: np.ndarray

    @property
    def best(self) -> int | None:
        return int(self.order[0]) if len(self.order) else None

    def rejections(self) -> dict[str, int]:
        r = self.evaluated.reason
        names, counts = np.unique(r[r != ""], return_counts=True)
        return {str(k): int(v) for k, v in zip(names, counts, strict=True)}

    def row(self, i: int) -> dict[str, Any]:
        c = self.evaluated.cand
        m = self.evaluated.metrics
        quant = self.query.quants[int(c.quant[i])]
        d: dict[str, Any] = {
            "plan": _plan_dict(c, i),
            "chips_per_replica": int(c.chips[i]),
            # requests in flight on each replica (the load over the replicas), not the most it
            # was sized for: that is max_batch / batch_cap
            "batch": _num(m["concurrency_per_replica"][i]),
            "batch_cap": int(c.batch[i]),
            "quant": {"weights": quant.weights, "kv": quant.kv, "compute": quant.compute},
            "system": c.system[int(c.sys_index[i])].name,
        }
        d.update({k: _num(v[i]) for k, v in m.items()})
        d["reason"] = str(self.evaluated.reason[i])
        return d


def _plan_dict(c: Candidates, i: int) -> dict[str, Any]:
    """The candidate's plan; a sequence-sharded KV replica names its kvseq degree and chips."""
    d = c.plan(i).to_dict()
    k = int(c.kvseq[i]) if len(c.kvseq) else 1
    d["kvseq"] = k
    if k > 1:
        d["spec"] += f",kvseq={k}"
        d["chips"] = int(c.chips[i])
    return d


def _num(x: Any) -> Any:
    x = float(x)
    return x if math.isfinite(x) else None


def search(q: ServeQuery) -> ServeResult:
    ev = evaluate(q)
    s = score(ev, q.objective)
    ok = np.isfinite(s)
    order = np.nonzero(ok)[0][np.argsort(s[ok], kind="stable")]
    m = ev.metrics
    front = pareto_front(
        np.where(ok, m["tokens_per_s_per_user"], np.nan),
        np.where(ok, m["tokens_per_s_per_chip"], np.nan),
    )
    return ServeResult(q, ev, order, front)


__all__ = [
    "Candidates",
    "Evaluated",
    "Objective",
    "ServeQuery",
    "ServeResult",
    "evaluate",
    "plans_for",
    "search",
    "step_report",
    "topologies",
]


# --------------------------------------------------------------------------------------
# One decode step (the book's questions)
# --------------------------------------------------------------------------------------


def step_report(
    model: ModelSpec,
    system: System,
    plan: ServePlan,
    batch: int,
    context: float,
    quant: Quant | None = None,
    efficiency: Efficiency = PEAK,
    *,
    prompt: float | None = None,
    engine: EngineProfile | None = None,
    speculation: Any = None,
) -> dict[str, Any]:
    """Cost one decode step of `batch` sequences at KV length `context` on one replica of `plan`,
    with the arithmetic: memory per chip (weights + KV + workspace), step time (weights and KV
    read, FLOPs, bound), tokens/s, the batch sweep's Pareto, $ per million tokens."""
    quant = quant or Quant()
    if plan.chips > system.n_chips:
        raise PlanError(
            f"plan {plan.describe()} needs {plan.chips} chips, {system.name} has {system.n_chips}",
            rule="a replica's chips (tp·pp·dp) fit in the system",
            fix="lower the degrees or give a bigger --system",
        )
    step = _step_for(model, system, plan, quant, efficiency)
    t = step.pass_time(PassShape(decode=float(batch), context=float(context)))
    memory, maxb = _step_memory(model, system, plan, quant, batch, context, engine)
    P = float(prompt if prompt is not None else context)
    pre = step.pass_time(PassShape(prefill_seqs=1.0, prefill_chunk=P, prefill_context=P))
    # the engine's exposed host time per pass (scheduler step, eager launches beyond its largest
    # CUDA graph), as its steady state pays it (issue 18 item 8)
    ovh = _scalar(engine_overhead_s(step, engine, float(batch)))
    step_s = _scalar(t.time_s) + ovh
    ttft_s = _scalar(pre.time_s) + _scalar(engine_overhead_s(step, engine, 1.0))
    tps = batch / step_s
    n = plan.chips
    sweep, pareto = _batch_sweep(step, context, maxb, n, engine)
    out: dict[str, Any] = {
        "plan": plan.to_dict(),
        "batch": batch,
        "context": context,
        "quant": {"weights": quant.weights, "kv": quant.kv, "compute": quant.compute},
        "step_time_s": step_s,
        "tpot_s": step_s,
        "ttft_s": ttft_s,
        "engine_overhead_s": ovh,
        "engine": engine.name if engine else None,
        "tokens_per_s": tps,
        "tokens_per_s_per_chip": tps / n,
        "tokens_per_s_per_user": 1.0 / step_s,
        "bound": str(np.asarray(t.bound).reshape(-1)[0]),
        "compute_time_s": _scalar(t.compute_s),
        "hbm_time_s": _scalar(t.memory_s),
        "comm_time_s": _scalar(t.comm_s),
        "launch_time_s": _scalar(t.launch_s),
        "weights_read_bytes_per_chip": _scalar(t.weight_bytes_per_chip),
        "kv_read_bytes_per_chip": _scalar(t.kv_bytes_per_chip),
        "flops_per_chip": _scalar(t.flops_per_chip),
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token(model, quant.kv, context=context),
        "memory_per_chip_bytes": memory["total_bytes"],
        "memory": {k: v for k, v in memory.items() if k != "total_bytes"},
        "max_batch": maxb,
        "usd_per_million_output_tokens": None,
        "usd_per_million_input_tokens": None,
        "pareto": pareto,
        "candidates_evaluated": int(len(sweep)),
        "efficiency": getattr(efficiency, "name", "custom"),
    }
    price = system.usd_per_chip_hour
    if price is not None:
        usd_s = price * n / HOUR
        out["usd_per_million_output_tokens"] = usd_s / tps * 1e6
        out["usd_per_million_input_tokens"] = usd_s * ttft_s / P * 1e6
    if speculation is not None:
        out["speculative"] = _speculative(step, speculation, batch, context)
    return out


def _step_memory(model, system, plan, quant, batch, context, engine) -> tuple[dict, float]:
    """Memory per chip of one decode step and the largest batch the engine's KV memory holds
    at this context (the book's even split for kv=heads_batch plans)."""
    from roofline.serving.inference import memory_per_chip

    ideal = _is_ideal(plan)
    mem = memory_per_chip(model, plan, quant, batch, context, ideal=ideal)
    hbm = system.chip.fit_hbm_bytes
    usable = (
        engine.kv_memory_bytes(hbm, mem.weights_bytes, mem.activation_bytes, plan.chips)
        if engine
        else (hbm - mem.weights_bytes - mem.activation_bytes)
    )
    maxb = float(np.floor(max(_scalar(usable), 0.0) / (mem.kv_bytes_per_token * context)))
    if not ideal:
        maxb *= plan.dp
    total = _scalar(mem.total_bytes)
    return {
        "total_bytes": total,
        "weights_bytes": _scalar(mem.weights_bytes),
        "kv_bytes": _scalar(mem.kv_bytes),
        "activation_bytes": _scalar(mem.activation_bytes),
        "hbm_bytes": hbm,
        "fits": bool(total <= hbm),
        "kv_replication": mem.kv_replication,
    }, maxb


def _batch_sweep(
    step, context: float, max_batch: float, chips: int, engine: EngineProfile | None = None
) -> tuple[np.ndarray, list]:
    """Decode steps at batches 1, 2, 4, … up to the max batch: the latency/throughput Pareto."""
    sweep = np.array([b for b in (2**k for k in range(0, 16)) if b <= max(max_batch, 1)], float)
    sw = step.pass_time(PassShape(decode=sweep, context=float(context)))
    t = np.asarray(sw.time_s, float) + engine_overhead_s(step, engine, sweep)
    front = pareto_front(1 / t, sweep / t / chips)
    return sweep, [
        {
            "batch": int(sweep[i]),
            "tokens_per_s_per_user": float(1 / t[i]),
            "tokens_per_s_per_chip": float(sweep[i] / t[i] / chips),
        }
        for i in front
    ]


def _speculative(step, speculation, batch: int, context: float) -> dict[str, Any]:
    from roofline.serving.steady import speculative_tpot

    sp = speculative_tpot(step, speculation, np.array([float(batch)]), float(context))
    return {
        "draft_tokens": speculation.draft_tokens,
        "acceptance": speculation.acceptance,
        "draft_cost": speculation.draft_cost,
        "tokens_per_verify": sp["tokens_per_verify"],
        "verify_s": _scalar(sp["verify_s"]),
        "tpot_s": _scalar(sp["tpot_s"]),
        "speedup": _scalar(sp["speedup"]),
    }


def disaggregated_view(res: ServeResult, i: int) -> dict[str, Any]:
    """The best plan run disaggregated at the same load: one pool of that replica for prefill and
    one for decode, the KV cache over the chips' link (NVLink inside an NVL72 rack, the node's NICs
    between GPU nodes, DCN between TPU slices); the prefill:decode ratio that balances them."""
    from roofline.core.ledger import kv_cache_bytes_per_token
    from roofline.serving.steady import Disagg, disaggregated, kv_link_bytes_per_s
    from roofline.serving.step import ShardedStep

    q, c = res.query, res.evaluated.cand
    plan, system = c.plan(i), c.system[int(c.sys_index[i])]
    quant = q.quants[int(c.quant[i])]
    kvseq = int(c.kvseq[i]) if len(c.kvseq) else 1
    step = (
        ShardedStep(q.model, [system], [plan], quant, q.efficiency)
        if kvseq == 1
        else _seqkv_step(q, [(system, plan.tp)], kvseq, quant)
    )
    link = kv_link_bytes_per_s(system.chip)
    kv = kv_cache_bytes_per_token(q.model, quant.kv, context=q.workload.prompt)
    conc = float(res.evaluated.metrics["concurrency_per_replica"][i])
    handoff = float(getattr(q.efficiency, "disagg_handoff_s", 0.0))

    def run(n_prefill: int) -> dict[str, Any]:
        d = Disagg(n_prefill, 1, link * int(c.chips[i]), 10e-6, kv, plan.dp, handoff_s=handoff)
        return disaggregated(step, step, d, q.workload, np.array([conc]), engine=q.engine)

    # one decode replica at the plan's load; its prefill pool is as many replicas as the
    # balancing ratio asks (a 1:1 layout whose prefill pool saturates would report a queue, not
    # what disaggregation delivers)
    ratio = _scalar(run(MAX_PREFILL_REPLICAS)["prefill_decode_ratio"])
    n_prefill = max(1, min(int(np.ceil(ratio - 1e-9)), MAX_PREFILL_REPLICAS))
    r = run(n_prefill)
    return {
        "ttft_s": _scalar(r["ttft_s"]),
        "tpot_s": _scalar(r["tpot_s"]),
        "kv_transfer_s": _scalar(r["kv_transfer_s"]),
        "handoff_s": handoff,
        "prefill_decode_ratio": ratio,
        "prefill_replicas": n_prefill,
        "decode_replicas": 1,
        "link_bytes_per_s_per_chip": link,
    }


# prefill replicas the disaggregated view sizes per decode replica at most
MAX_PREFILL_REPLICAS = 64


def _scalar(x: Any) -> float:
    return float(np.asarray(x, float).reshape(-1)[0])


def _step_for(model, system, plan, quant, efficiency):
    """The walk's sharded step on a replica of `plan` (its collectives with per-hop latency);
    the book's layout (KV heads, then the batch: kv=heads_batch) is the even split the book's
    tables assume, which the algebra's rules do not express: the perfectly-sharded step."""
    from roofline.serving.step import ShardedStep

    if _is_ideal(plan):
        return IdealStep(model, system.chip, plan, quant, efficiency)
    replica = system if plan.chips == system.n_chips else _replica_system(system, plan.chips)
    return ShardedStep(model, [replica], [plan], quant, efficiency)


def _replica_system(system: System, n: int) -> System:
    for s in topologies(system):
        if s.n_chips == n:
            return s
    raise PlanError(
        f"no {system.chip.name} slice of {n} chips inside {system.name}",
        rule="a replica runs on one of the system's slices (TPU) or GPU counts",
        fix="pick degrees that multiply to one of those chip counts",
    )


def _is_ideal(plan: ServePlan) -> bool:
    """The book's layout splits everything evenly (heads then batch): no copies of weights or KV."""
    from roofline.serving.inference import KVLayout

    return plan.kv_layout == KVLayout.HEADS_BATCH and plan.dp == 1 and plan.ep == 1
