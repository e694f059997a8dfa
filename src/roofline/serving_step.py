"""The sharded serving step: decode and prefill passes priced by the walk (the algebra on every
ledger row, forward only), behind inference.py's StepModel interface.

A replica's plan becomes strategies on a mesh of its chips:
- tensor parallel (tp) over heads and MLP (Megatron); when tp exceeds the KV heads (or does not
  divide them) the K/V projections and the KV cache are replicated over the tensor axis — each
  chip keeps the KV heads its query heads read, as vLLM, SGLang and TensorRT-LLM do;
- attention data parallel (dp) of an MoE model on the expert axis: the batch is split over it
  outside the MoE block and the experts inside it, with the dispatch/combine AllToAlls (DeepSeek's
  DP-attention + EP); of a dense model, on the data axis;
- experts split over the tensor axis when ep = tp (vLLM/TRT-LLM "EP within TP"): the algebra
  shards each expert's F over the same chips instead (same bytes and FLOPs per chip; the MoE
  output is all-reduced like TP's instead of combined by an AllToAll);
- pipeline (pp): the batch runs as pp microbatches; a pass is pp stage-times plus the hops.
Collectives are priced on the replica's mesh with their per-hop latency (book Appendix C), and
a decode step's tensor-parallel AllReduces sit on its critical path.

Decode costs are tabulated once per context on a geometric grid of batch sizes (one walk with a
row per grid point and candidate) and interpolated in log(batch); prefill chunks are walked at
their shape and cached. A pass that mixes both pays each row's weights once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roofline.inference import (
    PassShape,
    PassTimes,
    Quant,
    ServePlan,
    memory_per_chip,
)
from roofline.ledger import OpKind, build_ledger, decode_ledger
from roofline.specs.efficiency import PEAK, Efficiency
from roofline.specs.model import ModelSpec
from roofline.specs.plan import ComputeDtypes, Phase, Strategy
from roofline.specs.system import System
from roofline.units import compute_format
from roofline.walk import MeshRows, Pass, WalkOptions, shard_factor, walk_rows

GRID = np.unique(np.round(np.geomspace(1, 65536, 49), 6))  # decode batch grid (1/4 octave)


def _compute(dtype: str) -> str:
    d = compute_format(dtype)
    return d if d in ("bf16", "fp8", "fp4", "int8") else "bf16"


def degrees_of(model: ModelSpec, plan: ServePlan) -> dict[Strategy, int]:
    """The algebra's strategy degrees of a serving plan (see the module doc)."""
    deg = {s: 1 for s in Strategy}
    deg[Strategy.TP] = plan.tp
    deg[Strategy.PP] = plan.pp
    if plan.dp > 1:
        deg[Strategy.EP if model.moe is not None else Strategy.DP] = plan.dp
    return deg


def kv_replicated(model: ModelSpec, tp: int) -> bool:
    K = model.n_kv_heads
    return model.mla is None and tp > 1 and (tp > K or K % tp != 0)


@dataclass(frozen=True)
class _Tab:
    """Per-op decode costs on the batch grid: arrays (ops × grid × candidates)."""

    names: tuple[str, ...]
    compute: np.ndarray
    memory: np.ndarray
    weight_s: np.ndarray  # the weight reads inside memory (what a mixed pass pays once)
    flops: np.ndarray
    nbytes: np.ndarray
    kv_bytes: np.ndarray
    comm: np.ndarray  # (grid × candidates): exposed collectives of the pass


@dataclass
class ShardedStep:
    """StepModel from the walk for candidates sharing one strategy structure.

    `plans[j]` runs on `systems[j]` (its chip count = tp·pp·dp). Candidate i uses plan
    `select[i]` (default: one candidate per plan); decode tables are walked once per plan.
    """

    model: ModelSpec
    systems: list[System]
    plans: list[ServePlan]
    quant: Quant = field(default_factory=Quant)
    efficiency: Efficiency = PEAK
    overhead_s: float = 0.0
    select: Any = None
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        flags = {kv_replicated(self.model, p.tp) for p in self.plans}
        if len(flags) > 1:
            raise ValueError("ShardedStep groups candidates of one KV layout; split them first")
        self.chip = self.systems[0].chip
        self.plan = self.plans[0]
        self.n = len(self.plans)
        self.sel = np.arange(self.n) if self.select is None else np.asarray(self.select, int)
        self.m = len(self.sel)
        self.pp_plan = np.array([p.pp for p in self.plans], float)
        self.pp = self.pp_plan[self.sel]
        deg = [degrees_of(self.model, p) for p in self.plans]
        self.degrees = {s: np.array([d[s] for d in deg]) for s in Strategy}
        self.active = frozenset(s for s in Strategy if np.any(self.degrees[s] > 1))
        self.kv_rep = flags.pop()
        dt = ComputeDtypes(
            matmul=_compute(self.quant.compute),
            attention="bf16",
            experts=_compute(self.quant.compute),
        )
        self.options = WalkOptions(dtypes=dt)

    # -- walks ------------------------------------------------------------------------------
    def _walk(self, ledger, phase: Phase, seqs: np.ndarray, idx: np.ndarray):
        """Walk `ledger` on rows `idx` (plan indices) with `seqs` sequences per row."""
        from roofline.rules import Structure

        rows = MeshRows(
            system_idx=idx,
            degrees={s: v[idx] for s, v in self.degrees.items()},
            microbatches=np.ones(len(idx)),
        )
        st = Structure(active=self.active, kv_replicated=self.kv_rep)
        return walk_rows(
            self.model,
            self.systems,
            st,
            rows,
            seqs,
            ledger,
            self.efficiency,
            phase=phase,
            options=self.options,
        )

    def _table(self, walk, seqs: np.ndarray, ledger, idx: np.ndarray) -> _Tab:
        """Sum the walk's forward records by op; weights' share of each op's memory time."""
        from roofline.rules import Structure, rules_of

        rules = rules_of(Structure(active=self.active, kv_replicated=self.kv_rep), self.model)
        mesh = {a: self.degrees[s][idx] for s, a in _AXES.items()}
        ops = {o.name: o for o in ledger}
        names = tuple(dict.fromkeys(r.op for r in walk.ops if r.pass_ == Pass.FORWARD))
        shape = (len(names), len(seqs))
        comp, mem, wts, fl, by, kv = (np.zeros(shape) for _ in range(6))
        hbm = self.chip.hbm_bw_bytes_per_s * _hbm_frac(self.efficiency, self.chip)
        for r in walk.ops:
            if r.pass_ != Pass.FORWARD:
                continue
            i = names.index(r.op)
            op = ops[r.op]
            w_local = _weight_local(op, rules, mesh)
            frac = op.weight_read_fraction_at(seqs * op.sizes["seq"])
            unread = w_local * (1.0 - frac)  # routed experts no token chose
            comp[i] += r.copies * np.asarray(r.compute_s, float)
            # the walk already reads only the chosen experts' weights (h8: walk fix (a))
            mem[i] += r.copies * np.asarray(r.memory_s, float)
            wts[i] += r.copies * (w_local - unread) / hbm
            fl[i] += r.copies * np.asarray(r.flops_per_chip, float)
            by[i] += r.copies * np.asarray(r.hbm_bytes_per_chip, float)
            if op.kind == OpKind.ATTENTION:
                kv[i] += r.copies * _kv_local(op, rules, mesh, seqs)
        comm = np.zeros(len(seqs))
        for c in walk.collectives:
            comm = comm + np.asarray(c.copies, float) * np.asarray(c.time_s, float)
        return _Tab(names, comp, mem, wts, fl, by, kv, comm)

    def _decode_tab(self, context: float) -> _Tab:
        key = ("decode", round(context, 6))
        if key not in self._cache:
            self._cache[key] = self._decode_walk(context)
        return self._cache[key]

    def _decode_walk(self, context: float) -> _Tab:
        led = decode_ledger(self.model, batch=1, context=context, dtypes=self.quant.policy)
        idx = np.tile(np.arange(self.n), len(GRID))
        seqs = np.repeat(GRID, self.n) / self.pp_plan[idx]
        t = self._table(self._walk(led, Phase.DECODE, seqs, idx), seqs, led, idx)
        g = len(GRID)
        rs = lambda a: a.reshape(a.shape[:-1] + (g, self.n))  # noqa: E731
        return _Tab(
            t.names,
            rs(t.compute),
            rs(t.memory),
            rs(t.weight_s),
            rs(t.flops),
            rs(t.nbytes),
            rs(t.kv_bytes),
            rs(t.comm),
        )

    def _prefill_tab(self, seqs: np.ndarray, chunk: float, context: float, sel: np.ndarray) -> _Tab:
        """The prefill part per candidate: `seqs[i]` chunks of `chunk` tokens ending at `context`
        (only the last position's logits, as engines sample). Walked once per distinct
        (plan, seqs) pair."""
        key = (tuple(np.round(seqs, 6)), tuple(sel), round(chunk, 6), round(context, 6))
        hit = self._cache.get(key)
        if hit is None:
            led = build_ledger(
                self.model, batch=1, seq=chunk, kv_seq=max(context, chunk), dtypes=self.quant.policy
            )
            ops = tuple(o.with_sizes(seq=1.0) if o.name == "unembed" else o for o in led.ops)
            led = type(led)(ops, led.model, led.sizes)
            pairs, inv = np.unique(np.column_stack([sel, seqs]), axis=0, return_inverse=True)
            idx = pairs[:, 0].astype(int)
            per = np.maximum(pairs[:, 1], 1e-9) / self.pp_plan[idx]
            t = self._table(self._walk(led, Phase.PREFILL, per, idx), per, led, idx)
            inv = inv.reshape(-1)
            hit = self._cache[key] = _Tab(t.names, *(getattr(t, f)[..., inv] for f in _FIELDS))
        return hit

    # -- the StepModel interface --------------------------------------------------------------
    def pass_time(self, shape: PassShape) -> PassTimes:
        """One pass per candidate (arrays of length `len(select)`); a single-plan step also
        takes any 1-d array of shapes (each element a candidate of that plan)."""
        dec = np.asarray(shape.decode, float)
        pseq = np.asarray(shape.prefill_seqs, float)
        shp = (
            np.broadcast(dec, pseq, np.empty(self.m)).shape
            if self.m > 1
            else np.broadcast(dec, pseq).shape
        )
        shp = shp or (1,)
        dec, pseq = np.broadcast_to(dec, shp), np.broadcast_to(pseq, shp)
        sel = self.sel if self.m > 1 else np.zeros(shp, int)
        parts = []
        if np.any(dec > 0):
            parts.append(self._decode_at(float(np.mean(shape.context)), dec, sel))
        if np.any(pseq > 0):
            parts.append(self._prefill_at(pseq, shape, sel))
        return self._combine(parts, shp)

    def _decode_at(self, context: float, B: np.ndarray, sel: np.ndarray) -> dict:
        t = self._decode_tab(context)
        x = np.log(np.clip(B, GRID[0], GRID[-1]))
        lg = np.log(GRID)
        j = np.clip(np.searchsorted(lg, x) - 1, 0, len(GRID) - 2)
        f = (x - lg[j]) / (lg[j + 1] - lg[j])
        cand = np.broadcast_to(sel, B.shape)

        def at(a: np.ndarray) -> np.ndarray:  # a: (..., grid, n)
            lo = a[..., j, cand]
            hi = a[..., j + 1, cand]
            return lo + f * (hi - lo)

        on = B > 0
        return {k: np.where(on, at(getattr(t, k)), 0.0) for k in _FIELDS} | {"names": t.names}

    def _prefill_at(self, pseq: np.ndarray, shape: PassShape, sel: np.ndarray) -> dict:
        chunk = float(np.max(shape.prefill_chunk))
        ctx = float(np.max(shape.prefill_context))
        t = self._prefill_tab(np.asarray(pseq, float).reshape(-1), chunk, ctx, sel.reshape(-1))
        on = pseq > 0
        return {k: np.where(on, getattr(t, k), 0.0) for k in _FIELDS} | {"names": t.names}

    def _combine(self, parts: list[dict], shp: tuple) -> PassTimes:
        names = tuple(dict.fromkeys(n for p in parts for n in p["names"]))
        z = np.zeros(shp)
        comp, mem, wts = ({n: z.copy() for n in names} for _ in range(3))
        tot = {k: z.copy() for k in ("flops", "nbytes", "kv_bytes", "comm")}
        for p in parts:
            for i, n in enumerate(p["names"]):
                comp[n] = comp[n] + p["compute"][i]
                mem[n] = mem[n] + p["memory"][i]
                wts[n] = (
                    np.maximum(wts[n], p["weight_s"][i]) if len(parts) > 1 else p["weight_s"][i]
                )
            for k in tot:
                tot[k] = tot[k] + (p[k].sum(axis=0) if p[k].ndim > len(shp) else p[k])
        shared = {
            n: sum(p["weight_s"][p["names"].index(n)] for p in parts if n in p["names"]) - wts[n]
            for n in names
        }
        rows = {n: np.maximum(comp[n], mem[n] - shared[n]) for n in names}
        rows_s = sum(rows.values(), z.copy())
        layer = getattr(self.efficiency, "layer_overhead_s", 0.0) * self.model.n_layers
        over = z + self.overhead_s + layer
        pp = self.pp
        return PassTimes(
            time_s=pp * (rows_s + tot["comm"]) + over,
            compute_s=pp * sum(comp.values(), z.copy()),
            memory_s=pp * sum((mem[n] - shared[n] for n in names), z.copy()),
            rows_s=pp * rows_s,
            comm_s=pp * tot["comm"],
            overhead_s=over,
            flops_per_chip=pp * tot["flops"],
            hbm_bytes_per_chip=pp * tot["nbytes"],
            weight_bytes_per_chip=pp
            * sum(wts.values(), z.copy())
            * self.chip.hbm_bw_bytes_per_s
            * _hbm_frac(self.efficiency, self.chip),
            kv_bytes_per_chip=pp * tot["kv_bytes"],
            breakdown={n: pp * rows[n] for n in names},
        )

    def memory_per_chip(self, batch: Any, context: Any):
        return memory_per_chip(self.model, self.plan, self.quant, batch, context)


_FIELDS = ("compute", "memory", "weight_s", "flops", "nbytes", "kv_bytes", "comm")
_AXES = {
    Strategy.DP: "data",
    Strategy.FSDP: "fsdp",
    Strategy.TP: "tensor",
    Strategy.SP: "seq",
    Strategy.EP: "expert",
    Strategy.PP: "stage",
}


def _hbm_frac(eff: Efficiency, chip: Any) -> float:
    fn = getattr(eff, "hbm_fraction", None)
    return float(fn(chip)) if callable(fn) else eff.hbm


def _weight_local(op, rules, mesh) -> Any:
    """HBM bytes of the row's weight on one chip (all `count` layers of the row)."""
    w = op.weight
    if w is None or op.kind == OpKind.GATHER:
        return 0.0
    return w.nbytes(op.sizes) / shard_factor(w.dims, rules, True, mesh)  # one layer's copy


def _kv_local(op, rules, mesh, seqs) -> Any:
    """Per-chip bytes of the KV cache an attention row reads (operands over kv_seq, not seq)."""
    tot: Any = 0.0
    for t in op.inputs:
        if "kv_seq" in t.dims and "seq" not in t.dims and not t.on_chip:
            sz = dict(op.sizes)
            sz["batch"] = seqs
            tot = tot + t.nbytes(sz) / shard_factor(t.dims, rules, False, mesh)
    return tot
