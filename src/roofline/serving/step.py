"""The sharded serving step: decode and prefill passes priced by the walk (the algebra on every
ledger row, forward only), behind inference.py's StepModel interface.

A replica's plan becomes strategies on a mesh of its chips:
- tensor parallel (tp) over heads and MLP (Megatron); when tp exceeds the KV heads K each KV
  head is copied onto the tp/K chips whose query heads read it, as vLLM, SGLang and TensorRT-LLM
  do (vLLM's `num_kv_head_replicas`): the walk runs the model with those tp copies as its KV
  heads, split over the tensor axis, so each chip computes, holds and reads one head — 1/K of
  the cache, not all of it. A tp that divides neither way replicates the K/V projections;
- attention data parallel (dp) of an MoE model on the expert axis: the batch is split over it
  outside the MoE block and the experts inside it, with the dispatch/combine AllToAlls (DeepSeek's
  DP-attention + EP); of a dense model, on the data axis;
- experts split over the tensor axis when ep = tp (vLLM/TRT-LLM "EP within TP"): the algebra
  shards each expert's F over the same chips instead (same bytes and FLOPs per chip; the MoE
  output is all-reduced like TP's instead of combined by an AllToAll);
- pipeline (pp): the batch runs as pp microbatches; a pass is pp stage-times plus the hops.
Collectives are priced on the replica's mesh with their per-hop latency (book Appendix C), and
a decode step's tensor-parallel AllReduces sit on its critical path.

A pass runs as an engine runs it: every matmul, norm and activation once over all the pass's
tokens (decodes and prefill chunks in one GEMM; routed experts read for the experts all of them
chose), the output head over the sampled rows, and each part's attention on its own. Each row
pays the profile's fixed kernel time per launch (the walk's `launch_s`). Token rows and decode
attention are tabulated once per context on a geometric grid of batch sizes (one walk with a row
per grid point and candidate) and interpolated linearly between grid points; prefill attention
is walked at the chunk's shape and cached.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from roofline.core.ledger import (
    OpKind,
    build_ledger,
    decode_ledger,
    expert_parallel_imbalance,
)
from roofline.core.walk import MeshRows, Pass, WalkOptions, shard_factor, walk_rows
from roofline.serving.inference import (
    _PASS_SUMS,
    PassShape,
    PassTimes,
    Quant,
    ServePlan,
    kv_replication,
    memory_per_chip,
    rows_of,
    serving_ledger,
)
from roofline.specs.efficiency import PEAK, Efficiency
from roofline.specs.model import ModelSpec
from roofline.specs.plan import ComputeDtypes, Phase, Strategy
from roofline.specs.system import System
from roofline.units import compute_format, dtype_bytes

_ROUTED_GEMMS = ("moe/gate", "moe/up", "moe/down")  # the grouped expert GEMMs
GRID = np.unique(np.round(np.geomspace(1, 65536, 49), 6))  # decode batch grid (1/4 octave)


def compute_on(dtype: str, chip: Any) -> str:
    """The format a GEMM computes in on `chip`: the activations' format where the chip has units
    for it, else bf16 — a weight-only kernel dequantises narrow weights into 16-bit math (fp4
    weights on Hopper run W4A16: vLLM's and TensorRT-LLM's MXFP4 MoE on H100/H200 use Triton
    kernels with bf16 activations; fp8 on Ampere runs W8A16 Marlin)."""
    d = compute_format(dtype)
    if d in ("fp8", "fp4", "int8") and d in chip.peak_flops_per_s:
        return d
    return "bf16"


def gemm_format(weights: str, compute: str, chip: Any) -> str:
    """A GEMM's math format: the compute dtype (where the chip has units for it) for weights
    stored that narrow; 16-bit weights are not requantised on the fly, so the unquantised layers
    of a quantised checkpoint (gpt-oss's BF16 attention beside MXFP4 experts, Kimi-K2's BF16
    attention beside INT4 experts) run in bf16."""
    if dtype_bytes(weights) >= 2:
        return "bf16"
    return compute_on(compute, chip)


def degrees_of(model: ModelSpec, plan: ServePlan) -> dict[Strategy, int]:
    """The algebra's strategy degrees of a serving plan (see the module doc)."""
    deg = {s: 1 for s in Strategy}
    deg[Strategy.TP] = plan.tp
    deg[Strategy.PP] = plan.pp
    if plan.dp > 1:
        deg[Strategy.EP if model.moe is not None else Strategy.DP] = plan.dp
    return deg


def served_kv_heads(model: ModelSpec, tp: int) -> int:
    """The KV heads a tensor axis of `tp` holds in all: K, or K·(tp/K) = tp when tp > K (each head
    copied onto the chips whose query heads read it; inference.kv_replication is the copy count,
    memory_per_chip holds the same bytes)."""
    rep = kv_replication(model, ServePlan(tp=tp)) if model.mla is None else 1.0
    K = round(model.n_kv_heads * rep)
    return K if K % tp == 0 and model.n_heads % K == 0 else model.n_kv_heads


def served_model(model: ModelSpec, tp: int) -> ModelSpec:
    """The model the walk prices at tensor parallelism `tp`: its KV heads as served."""
    K = served_kv_heads(model, tp)
    return model if K == model.n_kv_heads else replace(model, n_kv_heads=K)


def kv_replicated(model: ModelSpec, tp: int) -> bool:
    """tp splits neither the served KV heads nor into them: the K/V projections and the cache
    are replicated whole over the tensor axis (no engine runs this; kept for odd plans)."""
    K = served_kv_heads(model, tp)
    return model.mla is None and tp > 1 and K % tp != 0


def kv_layout(model: ModelSpec, tp: int) -> tuple[int, bool]:
    """What candidates sharing one ShardedStep must agree on: the served KV heads and whether the
    tensor axis replicates them whole."""
    return served_kv_heads(model, tp), kv_replicated(model, tp)


@dataclass(frozen=True)
class _Tab:
    """Per-op costs of one walk, summed over the op's records: arrays (ops × rows...).

    `comm` holds the collectives each op's einsums pay (the pipeline hop under "pipeline");
    `launch` the fixed kernel time (the profile's `kernel_overhead_s` per launch × copies)."""

    names: tuple[str, ...]
    compute: np.ndarray
    memory: np.ndarray
    flops: np.ndarray
    nbytes: np.ndarray
    kv_bytes: np.ndarray
    weight_bytes: np.ndarray  # the parameters read (routed experts: the ones chosen)
    comm: np.ndarray
    launch: np.ndarray

    def reshaped(self, g: int, n: int) -> _Tab:
        rs = lambda a: a.reshape(a.shape[:-1] + (g, n))  # noqa: E731
        return _Tab(self.names, *(rs(getattr(self, f)) for f in _FIELDS))

    def taken(self, inv: np.ndarray) -> _Tab:
        return _Tab(self.names, *(getattr(self, f)[..., inv] for f in _FIELDS))

    @functools.cached_property
    def stacked(self) -> np.ndarray:
        """The fields as one array (field × ops × ...), in `_FIELDS` order: one gather serves
        them all (`_prefill_rows`, `_Tab.slopes`)."""
        return np.stack([getattr(self, f) for f in _FIELDS])

    @functools.cached_property
    def slopes(self) -> np.ndarray:
        """A decode table's (ops × grid × candidates) values at each grid point but the last
        and the slopes to the next (value[j + 1] − value[j]), each flattened over (op, point,
        candidate): (2 × field × ...), one gather for `_decode_rows`' interpolation."""
        a = self.stacked
        lo = a[:, :, :-1]
        return np.stack([lo, a[:, :, 1:] - lo]).reshape(2, len(_FIELDS), -1)


@dataclass
class ShardedStep:
    """StepModel from the walk for candidates sharing one strategy structure.

    `plans[j]` runs on `systems[j]` (its chip count = tp·pp·dp). Candidate i uses plan
    `select[i]` (default: one candidate per plan); decode tables are walked once per plan.

    A pass is the ledger's rows at its shape, as an engine runs them: the token rows (every
    matmul, norm and activation) once over all the pass's tokens (decodes plus prefill chunks:
    one GEMM of m = all tokens, routed experts read for the experts all of them chose), the
    output head over the sampled rows (one per sequence), and each part's attention on its own
    (decode over the KV cache, prefill causal over the chunk).
    """

    model: ModelSpec
    systems: list[System]
    plans: list[ServePlan]
    quant: Quant = field(default_factory=Quant)
    efficiency: Efficiency = PEAK
    overhead_s: float = 0.0
    select: Any = None
    # the book's even split: every row's FLOPs and bytes over this many chips (IdealStep)
    even_split: float = 1.0
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        layouts = {kv_layout(self.model, p.tp) for p in self.plans}
        if len(layouts) > 1:
            raise ValueError("ShardedStep groups candidates of one KV layout; split them first")
        self.kv_rep = kv_replicated(self.model, self.plans[0].tp)
        # the ledger's model: the KV heads as the tensor axis holds them (memory uses self.model)
        self.walked = served_model(self.model, self.plans[0].tp)
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
        dt = ComputeDtypes(
            matmul=gemm_format(self.quant.weights, self.quant.compute, self.chip),
            attention="bf16",
            experts=gemm_format(
                self.quant.experts or self.quant.weights, self.quant.compute, self.chip
            ),
        )
        # the engines reduce a MoE layer's output once, after the combine (walk.combine_reduce)
        self.options = WalkOptions(dtypes=dt, moe_combine_reduce=True)
        self.token_rows = frozenset(o.name for o in rows_of(self.model, self.quant).shared) | {
            "pipeline"
        }

    # -- walks ------------------------------------------------------------------------------
    def _walk(self, ledger, phase: Phase, seqs: np.ndarray, idx: np.ndarray):
        """Walk `ledger` on rows `idx` (plan indices) with `seqs` sequences per row."""
        from roofline.core.rules import Structure

        rows = MeshRows(
            system_idx=idx,
            degrees={s: v[idx] for s, v in self.degrees.items()},
            microbatches=np.ones(len(idx)),
        )
        st = Structure(active=self.active, kv_replicated=self.kv_rep)
        return walk_rows(
            self.walked,
            self.systems,
            st,
            rows,
            seqs,
            ledger,
            self.efficiency,
            phase=phase,
            options=self.options,
        )

    def _table(self, walk, seqs: np.ndarray, ledger, idx: np.ndarray, decode: bool = False) -> _Tab:
        """Sum the walk's forward records by op (collectives by the op that pays them)."""
        from roofline.core.rules import Structure, rules_of

        rules = rules_of(Structure(active=self.active, kv_replicated=self.kv_rep), self.walked)
        mesh = {a: self.degrees[s][idx] for s, a in _AXES.items()}
        ops = {o.name: o for o in ledger}
        fwd = [r for r in walk.ops if r.pass_ == Pass.FORWARD]
        names = tuple(dict.fromkeys([r.op for r in fwd] + [c.op for c in walk.collectives]))
        at = {n: i for i, n in enumerate(names)}
        comp, mem, fl, by, kv, wb, comm, launch = (
            np.zeros((len(names), len(seqs))) for _ in range(8)
        )
        imb = self._ep_imbalance(ledger, seqs, idx)
        for r in fwd:
            i = at[r.op]
            comp[i] += r.copies * np.asarray(r.compute_s, float) * imb.get(r.op, 1.0)
            mem[i] += r.copies * np.asarray(r.memory_s, float)
            fl[i] += r.copies * np.asarray(r.flops_per_chip, float)
            by[i] += r.copies * np.asarray(r.hbm_bytes_per_chip, float)
            launch[i] += r.copies * np.asarray(r.launch_s, float)
            op = ops[r.op]
            if op.kind == OpKind.ATTENTION:
                kv[i] += r.copies * _kv_local(op, rules, mesh, seqs)
            wb[i] += r.copies * _weight_read(op, rules, mesh, seqs)
        for c in walk.collectives:
            comm[at[c.op]] += np.asarray(c.copies, float) * np.asarray(c.time_s, float)
        if decode:
            self._mla_decode_kernel(ops, at, mem, mesh)
        return _Tab(names, comp, mem, fl, by, kv, wb, comm, launch)

    def _mla_decode_kernel(self, ops: dict, at: dict, mem: np.ndarray, mesh: dict) -> None:
        """An absorbed MLA decode's latent-cache read at the engine's decode kernel's achieved
        bandwidth (`Efficiency.mla_decode_fraction`, 1 unless the engine's profile entry lists
        a published kernel timing), where the tensor axis splits the heads: the timings are of
        tensor-parallel head counts (16 of DeepSeek's 128 at tp 8), not of attention DP's
        whole head set on one rank."""
        if "attn/q_absorb" not in ops:
            return
        eta = self.efficiency.mla_decode_fraction(self.chip)
        if eta >= 1.0:
            return
        split = np.asarray(mesh.get("tensor", 1), float) > 1
        for name in ("attn/scores", "attn/context"):
            if name in at:
                mem[at[name]] = np.where(split, mem[at[name]] / eta, mem[at[name]])

    def _ep_imbalance(self, ledger, seqs: np.ndarray, idx: np.ndarray) -> dict:
        """The routed expert GEMMs' compute time scale per row (`ledger.expert_parallel_imbalance`):
        with experts split over ep ranks the pass waits for the rank its tokens load most. The
        pass's tokens are the walk row's sequences × the ledger's tokens per sequence (the
        routed row's capacity B·T·k/E at B = 1)."""
        ops = {o.name: o for o in ledger}
        ep = np.array([p.ep for p in self.plans], float)[idx]
        up = ops.get("moe/up")
        if up is None or not np.any(ep > 1):
            return {}
        E, k = up.sizes["experts"], up.sizes["top_k"]
        tokens = seqs * up.sizes["capacity"] * E / k
        f = np.ones(len(seqs))
        for e in np.unique(ep[ep > 1]):
            on = ep == e
            f[on] = expert_parallel_imbalance(E, k, tokens[on], int(e))
        return {n: f for n in _ROUTED_GEMMS if n in ops}

    def _decode_tab(self, context: float) -> _Tab:
        key = ("decode", round(context, 6))
        if key not in self._cache:
            led = serving_ledger(
                decode_ledger(self.walked, batch=1, context=context, dtypes=self.quant.policy)
            )
            idx = np.tile(np.arange(self.n), len(GRID))
            seqs = np.repeat(GRID, self.n) / self.pp_plan[idx]
            t = self._table(self._walk(led, Phase.DECODE, seqs, idx), seqs, led, idx, decode=True)
            self._cache[key] = t.reshaped(len(GRID), self.n)
        return self._cache[key]

    def _prefill_tab(self, seqs: np.ndarray, chunk: float, context: float, sel: np.ndarray) -> _Tab:
        """The prefill part per candidate: `seqs[i]` chunks of `chunk` tokens ending at `context`.
        Walked once per distinct (plan, seqs) pair; only its attention rows are read (the token
        rows of a pass come from the token table, over all the pass's tokens)."""
        # walked at the key's values (prompts to 6 places): a table is then a function of its
        # key, not of which nearby batch a sweep asked for first, so one plan's fixed point and
        # a search's (other sweeps, other cache hits) agree to the bit
        seqs, chunk, context = np.round(seqs, 6), round(chunk, 6), round(context, 6)
        key = (tuple(seqs), tuple(sel), chunk, context)
        hit = self._cache.get(key)
        if hit is None:
            led = self._prefill_ledger(chunk, max(context, chunk))
            pairs, inv = np.unique(np.column_stack([sel, seqs]), axis=0, return_inverse=True)
            idx = pairs[:, 0].astype(int)
            per = np.maximum(pairs[:, 1], 1e-9) / self.pp_plan[idx]
            t = self._table(self._walk(led, Phase.PREFILL, per, idx), per, led, idx)
            hit = self._cache[key] = t.taken(inv.reshape(-1))
        return hit

    def _prefill_ledger(self, chunk: float, kv_seq: float):
        """The prefill ledger's read rows (`_read_rows`) at a chunk and its keys, built once
        per (chunk, keys): a prefill-first engine's fixed point walks a table per sweep (its
        batch follows the arrivals) at one chunk."""
        key = ("ledger", chunk, kv_seq)
        hit = self._cache.get(key)
        if hit is None:
            led = build_ledger(
                self.walked, batch=1, seq=chunk, kv_seq=kv_seq, dtypes=self.quant.policy
            )
            hit = self._cache[key] = self._read_rows(led)
        return hit

    def _read_rows(self, ledger):
        """The prefill ledger's rows a pass reads (those that are not token rows) and, before a
        matmul among them, the rows of its block before it: a block's einsums share their
        gathers (walk.SharedCollectives, by block), so each read row's records are those of
        the whole ledger's walk, to the bit, at a fraction of its cost (an attention row's
        records depend on its own op alone). The token rows come from the decode table; a
        walk whose stack pays the MoE host sync keeps moe/up, which records it (not a token
        row: the ideal stack the step walks pays none)."""
        from roofline.core.stack import stack_of

        o = self.options
        sync = o.host_syncs and stack_of(o.stack).moe_host_sync_s > 0
        tok, ops = self.token_rows, ledger.ops
        keep: set[int] = set()
        for i, op in enumerate(ops):
            if op.name in tok and not (sync and op.name == "moe/up"):
                continue
            keep.add(i)
            if op.kind == OpKind.MATMUL:
                block = op.name.rsplit("/", 1)[0]
                keep.update(j for j in range(i) if ops[j].name.rsplit("/", 1)[0] == block)
        return replace(ledger, ops=tuple(ops[i] for i in sorted(keep)))

    # -- the StepModel interface --------------------------------------------------------------
    def pass_time(self, shape: PassShape) -> PassTimes:
        """One pass per candidate (arrays of length `len(select)`); a single-plan step also
        takes any 1-d array of shapes (each element a candidate of that plan)."""
        dec = np.asarray(shape.decode, float)
        pseq = np.asarray(shape.prefill_seqs, float)
        if self.m > 1:
            shp = np.broadcast(dec, pseq, np.empty(self.m)).shape
        else:
            shp = dec.shape if dec.shape == pseq.shape else np.broadcast(dec, pseq).shape
        shp = shp or (1,)
        dec, pseq = _to(dec, shp), _to(pseq, shp)
        sel = self.sel if self.m > 1 else self._zeros(shp)
        chunk = _largest(shape.prefill_chunk)
        pre_on = pseq > 0
        ctx = _mean(shape.context) if (dec > 0).any() else _largest(shape.prefill_context)
        tab = self._decode_tab(ctx)
        tokens = dec + np.where(pre_on, pseq * chunk, 0.0)
        names, every = self._decode_rows(tab, (tokens, dec + pseq, dec), sel)
        if pre_on.any():
            ctx_p = _largest(shape.prefill_context)
            pre_names, pre = self._prefill_rows(pseq.reshape(-1), chunk, ctx_p, sel.reshape(-1))
            pre = np.where(pre_on, pre.reshape((len(_FIELDS), -1, *shp)), 0.0)
            names, every = (*names, pre_names), np.concatenate((every, pre), axis=1)
        return self._combine(names, every, shp)

    def _zeros(self, shp: tuple) -> np.ndarray:
        """The one plan's index per element of a one-plan pass (read only)."""
        hit = self._cache.get(("zeros", shp))
        if hit is None:
            hit = self._cache["zeros", shp] = np.zeros(shp, int)
            hit.flags.writeable = False
        return hit

    def _decode_rows(self, tab: _Tab, sizes: tuple, sel: np.ndarray) -> tuple[tuple, np.ndarray]:
        """The decode table's token rows at all the pass's tokens, its output head at the pass's
        sequences, the rest (decode attention) at its decodes (`sizes`, in that order): (the
        three parts' row names, every field of their rows, part after part: field × rows × the
        sizes' shape). Each row is read at its own part's size only: linear in B between grid
        points (the costs are affine in B between the roofline's kinks), affine beyond the
        grid's end, 0 where B is 0, from one gather of the table's values and slopes."""
        names, part, base = self._row_layout(tab.names)
        shp = sizes[0].shape
        B = np.concatenate(sizes).reshape((len(sizes), *shp))[part]  # each row's size
        x = np.maximum(B, GRID[0])
        j = np.minimum(np.maximum(np.searchsorted(GRID, x) - 1, 0), len(GRID) - 2)
        f = (x - GRID[j]) / _GRID_STEP[j]
        at = base.reshape((-1,) + (1,) * len(shp)) + j  # (row, *shape)
        if self.n > 1:
            at = at * self.n + np.broadcast_to(sel, shp)
        lo, slope = tab.slopes[:, :, at]
        return names, np.where(B > 0, lo + f * slope, 0.0)

    def _row_layout(self, names: tuple[str, ...]) -> tuple[tuple, np.ndarray, np.ndarray]:
        """Where a decode table's rows are read (`_decode_rows`), found once per table layout:
        the three parts' names, each read row's part (the size it is read at) and its offset in
        the flattened slopes (`_Tab.slopes`)."""
        key = ("rows", names)
        hit = self._cache.get(key)
        if hit is None:
            groups = self._groups(names)
            part = np.concatenate([np.full(len(k), i) for i, (_, k) in enumerate(groups)])
            rows = np.concatenate([k for _, k in groups]).astype(int)
            hit = (tuple(n for n, _ in groups), part.astype(int), rows * (len(GRID) - 1))
            self._cache[key] = hit
        return hit

    def _prefill_rows(self, seqs, chunk: float, context: float, sel) -> tuple[tuple, np.ndarray]:
        """The prefill table's rows a pass reads (its attention, not token rows): their names
        and fields (field × rows × candidates), remembered per table."""
        key = (
            "read",
            np.round(seqs, 6).tobytes(),
            sel.tobytes(),
            round(chunk, 6),
            round(context, 6),
        )
        hit = self._cache.get(key)
        if hit is None:
            t = self._prefill_tab(seqs, chunk, context, sel)
            names, keep = self._groups(t.names)[2]
            hit = self._cache[key] = (names, t.stacked[:, keep])
        return hit

    def _groups(self, names: tuple[str, ...]) -> tuple[tuple, tuple, tuple]:
        """A decode table's rows as `_decode_rows` reads them: (the token rows but the output
        head, the output head, the rest), each as (names, indices); found once per table
        layout."""
        key = ("groups", names)
        hit = self._cache.get(key)
        if hit is None:
            tok = self.token_rows
            hit = self._cache[key] = tuple(
                _rows(names, which)
                for which in (
                    lambda n: n in tok and n not in _SAMPLED,
                    lambda n: n in _SAMPLED,
                    lambda n: n not in tok,
                )
            )
        return hit

    def _merged(self, names: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], np.ndarray]:
        """The parts' rows (`names`, part after part) merged: each row once, in order of first
        appearance, and where each part's row goes; found once per layout of parts."""
        key = ("merged", names)
        hit = self._cache.get(key)
        if hit is None:
            every = [n for part in names for n in part]
            order = tuple(dict.fromkeys(every))
            at = {n: i for i, n in enumerate(order)}
            hit = self._cache[key] = (order, np.array([at[n] for n in every], dtype=int))
        return hit

    def _combine(self, names: tuple, every: np.ndarray, shp: tuple) -> PassTimes:
        """The pass from its parts' rows (`every`: field × rows × shp, part after part): each
        row on its own roofline, max(compute, memory) / N plus its launches; the rows summed."""
        N = self.even_split
        order, idx = self._merged(names)
        if N != 1.0:  # every field but the launch time / N: max(c, m) / N = max(c / N, m / N)
            every = every / np.where(_IS_LAUNCH, 1.0, N).reshape((-1,) + (1,) * (every.ndim - 1))
        r = np.maximum(every[_COMPUTE], every[_MEMORY]) + every[_LAUNCH]
        # each row's parts added to 0 in order (add.at is unbuffered: index after index)
        per = np.zeros((len(order), *shp))
        np.add.at(per, idx, r)
        # the rows summed one after another from 0 (accumulates: the loop's sums to the bit)
        if every.shape[1]:
            sums = np.add.accumulate(every, axis=1)[:, -1]
        else:
            sums = np.zeros((len(_FIELDS), *shp))
        rows_s = np.add.accumulate(per, axis=0)[-1] + 0.0 if len(order) else np.zeros(shp)
        layer = getattr(self.efficiency, "layer_overhead_s", 0.0) * self.model.n_layers
        over = np.full(shp, 0.0 + self.overhead_s + layer)
        pp = self.pp
        compute, memory, flops, nbytes, kv, weights, comm, launch = pp * sums  # _FIELDS order
        return PassTimes(
            time_s=pp * (rows_s + sums[_COMM]) + over,
            compute_s=compute,
            memory_s=memory,
            rows_s=pp * rows_s,
            comm_s=comm,
            overhead_s=over,
            flops_per_chip=flops,
            hbm_bytes_per_chip=nbytes,
            weight_bytes_per_chip=weights,
            kv_bytes_per_chip=kv,
            launch_s=launch,
            breakdown=dict(zip(order, pp * per, strict=True)),
        )

    def memory_per_chip(self, batch: Any, context: Any):
        return memory_per_chip(self.model, self.plan, self.quant, batch, context)

    def degree(self, name: str) -> Any:
        """A plan degree per candidate (`select` order); a scalar when there is one plan."""
        if self.n == 1:
            return getattr(self.plan, name)
        return np.array([getattr(p, name) for p in self.plans])[self.sel]


@dataclass
class IdealStep:
    """The book's perfectly-sharded bound (the model of every table in inference.md and
    applied-inference.md): the walk of the ledger on ONE chip, every row's FLOPs and HBM bytes
    split evenly over the replica's chips, no collectives — "step = (params + KV) / (N·W)",
    "2·params·B / (N·C)", row by row. With pp stages the batch runs as pp microbatches of B/pp
    (each rereads the stage's weights: pipelining buys memory, not latency)."""

    model: ModelSpec
    chip: Any
    plan: ServePlan = field(default_factory=ServePlan)
    quant: Quant = field(default_factory=Quant)
    efficiency: Efficiency = PEAK
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        self._step = ShardedStep(
            self.model,
            [_one_chip(self.chip)],
            [ServePlan()],
            self.quant,
            self.efficiency,
            self.overhead_s,
            even_split=float(self.plan.chips),
        )

    def pass_time(self, shape: PassShape) -> PassTimes:
        pp = float(self.plan.pp)
        sub = replace(
            shape,
            decode=np.asarray(shape.decode, float) / pp,
            prefill_seqs=np.asarray(shape.prefill_seqs, float) / pp,
        )
        t = self._step.pass_time(sub)
        # scalar shapes give scalars (the book's questions); arrays keep their shape
        scalar = all(np.ndim(getattr(shape, f)) == 0 for f in ("decode", "prefill_seqs"))
        out = (lambda a: np.asarray(a, float).reshape(())) if scalar else np.asarray  # noqa: E731
        return PassTimes(
            *(out(getattr(t, f)) * pp for f in _PASS_SUMS),
            breakdown={k: out(v) * pp for k, v in t.breakdown.items()},
            launch_s=out(t.launch_s) * pp,
        )

    def memory_per_chip(self, batch: Any, context: Any):
        return memory_per_chip(self.model, self.plan, self.quant, batch, context, ideal=True)

    def degree(self, name: str) -> Any:
        return getattr(self.plan, name)


def _one_chip(chip: Any) -> System:
    """A system of one chip (a 1x1 slice of a TPU)."""
    from roofline.specs.system import gpu_cluster, tpu_slice

    if chip.is_tpu:
        return tpu_slice(chip, (1,) * max(len(chip.pod_topology or ()), 2))
    return gpu_cluster(chip, 1)


def _rows(names: tuple[str, ...], which) -> tuple[tuple[str, ...], np.ndarray]:
    """The rows `which(name)` of a table: (their names, their indices)."""
    keep = [i for i, n in enumerate(names) if which(n)]
    return tuple(names[i] for i in keep), np.array(keep, dtype=int)


def _to(a: np.ndarray, shp: tuple) -> np.ndarray:
    return a if a.shape == shp else np.broadcast_to(a, shp)


def _largest(x: Any) -> float:
    """float(np.max(x)), without numpy for a plain number (the same value)."""
    return float(x) if type(x) in (float, int) else float(np.max(x))


def _mean(x: Any) -> float:
    """float(np.mean(x)), without numpy for a plain number (the same value)."""
    return float(x) if type(x) in (float, int) else float(np.mean(x))


_FIELDS = ("compute", "memory", "flops", "nbytes", "kv_bytes", "weight_bytes", "comm", "launch")
_COMPUTE, _MEMORY, _COMM, _LAUNCH = (
    _FIELDS.index(f) for f in ("compute", "memory", "comm", "launch")
)
_IS_LAUNCH = np.array([f == "launch" for f in _FIELDS])
_GRID_STEP = GRID[1:] - GRID[:-1]  # GRID[j + 1] - GRID[j], elementwise as `_decode_rows` needs
_SAMPLED = ("unembed",)  # the output head runs on the sampled rows only: one per sequence
_AXES = {
    Strategy.DP: "data",
    Strategy.FSDP: "fsdp",
    Strategy.TP: "tensor",
    Strategy.SP: "seq",
    Strategy.EP: "expert",
    Strategy.PP: "stage",
}


def _weight_read(op, rules, mesh, seqs) -> Any:
    """HBM bytes of the row's weight one chip reads in a pass of `seqs` sequences (one layer):
    its local shard, for a routed-expert row only the experts the tokens chose (for the report;
    the walk prices the same bytes)."""
    w = op.weight
    if w is None or op.kind == OpKind.GATHER:
        return 0.0
    local = w.nbytes(op.sizes) / shard_factor(w.dims, rules, True, mesh)
    return local * op.weight_read_fraction_at(seqs * op.sizes["seq"])


def _kv_local(op, rules, mesh, seqs) -> Any:
    """Per-chip bytes of the KV cache an attention row reads (operands over kv_seq, not seq)."""
    tot: Any = 0.0
    for t in op.inputs:
        if "kv_seq" in t.dims and "seq" not in t.dims and not t.on_chip:
            sz = dict(op.sizes)
            sz["batch"] = seqs
            tot = tot + t.nbytes(sz) / shard_factor(t.dims, rules, False, mesh)
    return tot
