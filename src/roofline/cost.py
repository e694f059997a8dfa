"""Cost: the sharding algebra applied to every ledger row, with collective times on the system.

For each distinct (system, mesh, microbatch) of a family of candidate plans, every ledger
row becomes three sharded einsums (forward, d_lhs, d_rhs; book training.md Appendix A);
`sharding.plan_einsum` picks each one's collectives, and this module sums per-chip compute
(per-op roofline), the collectives by bucket (FSDP gathers, gradient reductions, tensor /
sequence / expert traffic), and the memory pieces that depend on the mesh. `training`
lays these sums on a step timeline. All arithmetic is vectorised over candidates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.collectives import CollectiveKind, collective_cost
from roofline.errors import PlanError
from roofline.ledger import Ledger, Op, OpKind, Tensor, build_ledger
from roofline.memory import LAST_PROJECTIONS, Remat, RematKind, saved_tensors
from roofline.mesh import Mesh, make_mesh
from roofline.rules import AXIS_OF, Degrees, Rules, Strategy, rules_for
from roofline.sharding import Comm, EinsumPlan, Spec, plan_einsum, plan_training_einsum
from roofline.specs.efficiency import Efficiency
from roofline.specs.model import ModelSpec
from roofline.specs.system import System
from roofline.units import dtype_bytes

BUCKETS = ("fsdp", "grad_mb", "grad_step", "tp", "sp", "ep", "act")


@dataclass(frozen=True)
class Structure:
    """What is the same for a family of candidates: which strategies exist and how layers run."""

    active: frozenset[Strategy]
    remat: Remat
    sequence_parallel: bool = False
    collective_matmul: bool = False
    kv_replicated: bool = (
        False  # tp > kv_heads: K/V projections replicated across the tensor axis (Megatron)
    )


class Reasons:
    """Why each candidate is infeasible, rendered lazily (most candidates never need the text)."""

    def __init__(
        self,
        mesh_reason: np.ndarray,
        inv: np.ndarray,
        mesh_bad: np.ndarray,
        over: np.ndarray,
        mem: np.ndarray,
        cap: float,
    ):
        self.mesh_reason, self.inv, self.mesh_bad, self.over, self.mem, self.cap = (
            mesh_reason,
            inv,
            mesh_bad,
            over,
            mem,
            cap,
        )

    def __getitem__(self, i: int) -> str:
        if self.mesh_bad[i]:
            return str(self.mesh_reason[self.inv[i]])
        if self.over[i]:
            return f"does not fit HBM: needs {self.mem[i] / 1e9:.1f} GB per chip, chip has {self.cap / 1e9:.1f} GB"
        return ""

    def counts(self) -> dict[str, int]:
        """Rejections by reason (HBM counted as one reason, each mesh error as its own)."""
        out: dict[str, int] = {}
        n_over = int(self.over.sum())
        if n_over:
            out["does not fit HBM"] = n_over
        n_mesh = int(self.mesh_bad.sum())
        if n_mesh:
            out["mesh does not fit the topology"] = n_mesh
        return out


def bucket_of(c: Comm, block: str) -> str:
    t = c.tensor
    if t.startswith("dW") or t.startswith("dw"):
        return "grad_mb" if "fsdp" in c.axes or "expert" in c.axes else "grad_step"
    if t.startswith("W") or t.startswith("w_"):
        return "fsdp"
    if c.kind == CollectiveKind.ALL_TO_ALL and "expert" in c.axes:
        return "ep"
    if "tensor" in c.axes:
        return "tp"
    if "seq" in c.axes:
        return "sp"
    return "act"


class CommModel:
    """comm_fn for the algebra: per-candidate collective times from each candidate's mesh.

    A collective's cost depends only on where its axes sit on the system, so meshes are
    grouped by that placement (interned per axis as an integer) and `collective_cost` runs once
    per distinct placement, not once per mesh.
    """

    def __init__(self, inverse: np.ndarray, meshes: list[Mesh | None], eff: Efficiency) -> None:
        self.inv, self.meshes, self.eff = inverse, meshes, eff
        self.cache: dict[tuple[CollectiveKind, tuple[str, ...]], tuple[np.ndarray, np.ndarray]] = {}
        self.pid: dict[str, np.ndarray] = {}
        self.sig_of: list[tuple] = []
        intern: dict[tuple, int] = {}
        axes = sorted({a for m in meshes if m is not None for a in m.placement})
        for a in axes:
            ids = np.full(len(meshes), -1, dtype=np.int64)
            for i, m in enumerate(meshes):
                if m is None or a not in m.placement:
                    continue
                sig = (
                    id(m.system),
                    tuple((g.dim.name, g.size, g.full, g.stride) for g in m.placement[a]),
                )
                j = intern.get(sig)
                if j is None:
                    j = intern[sig] = len(self.sig_of)
                    self.sig_of.append(sig)
                ids[i] = j
            self.pid[a] = ids

    def coef(self, kind: CollectiveKind, axes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        key = (kind, axes)
        if key not in self.cache:
            n = len(self.meshes)
            lat = np.zeros(n)
            spb = np.zeros(n)
            # an axis of size 1 is absent from a mesh (pid -1): it adds nothing to the group
            cols = np.stack([self.pid.get(a, np.full(n, -1, dtype=np.int64)) for a in axes], axis=1)
            valid = np.any(cols >= 0, axis=1)
            if valid.any():
                combos, where = np.unique(cols[valid], axis=0, return_inverse=True)
                where = where.reshape(-1)
                vidx = np.nonzero(valid)[0]
                first = np.zeros(len(combos), dtype=int)
                first[where[::-1]] = vidx[::-1]
                vals = np.zeros((len(combos), 2))
                for c, combo in enumerate(combos):
                    present = tuple(a for a, j in zip(axes, combo, strict=True) if j >= 0)
                    ukey = (kind, tuple(self.sig_of[j] for j in combo if j >= 0))
                    hit = _UNIT_CACHE.get(ukey)
                    if hit is None:
                        m = self.meshes[first[c]]
                        if kind in _DERIVED and not m.system.sharp:
                            agkey = (CollectiveKind.ALL_GATHER, ukey[1])
                            ag = _UNIT_CACHE.get(agkey)
                            if ag is None:
                                ag = _UNIT_CACHE[agkey] = _cost_unit(
                                    CollectiveKind.ALL_GATHER, present, m
                                )
                            hit = (ag[0] * _DERIVED[kind], ag[1] * _DERIVED[kind])
                        else:
                            hit = _cost_unit(kind, present, m)
                        _UNIT_CACHE[ukey] = hit
                    vals[c] = hit
                lat[vidx] = vals[where, 0]
                spb[vidx] = vals[where, 1]
            self.cache[key] = (lat[self.inv], spb[self.inv] / self.eff.link)
        return self.cache[key]

    def __call__(self, kind: CollectiveKind, nbytes: Any, axes: tuple[str, ...]) -> Any:
        lat, spb = self.coef(kind, tuple(axes))
        b = np.asarray(nbytes, float)
        return np.where(spb > 0, np.maximum(lat, spb * b), 0.0)


# Caches keyed by object identity (System and Mesh hold read-only mappings, so they are not
# hashable); the cached objects are kept alive by the caches themselves.
_UNIT_CACHE: dict[tuple, tuple[float, float]] = {}
_MESH_CACHE: dict[tuple, tuple[System, Mesh | str]] = {}


def _cost_unit(kind: CollectiveKind, axes: tuple[str, ...], mesh: Mesh) -> tuple[float, float]:
    """(latency, seconds per byte) of a collective over `axes`; time = max(latency, spb · bytes)."""
    c = collective_cost(kind, 1.0e6, axes, mesh)
    return (0.0, 0.0) if c.group_size == 1 else (float(c.latency_s), float(c.seconds_per_byte))


_DERIVED = {
    CollectiveKind.REDUCE_SCATTER: 1.0,
    CollectiveKind.ALL_REDUCE: 2.0,
}  # × AllGather (book: AR = RS + AG)


def mesh_for(system: System, axes: tuple[tuple[str, int], ...]) -> Mesh | str:
    key = (id(system), axes)
    hit = _MESH_CACHE.get(key)
    if hit is None or hit[0] is not system:
        try:
            m: Mesh | str = make_mesh(system, axes)
        except PlanError as e:
            m = f"mesh does not fit the topology ({e.what})"
        hit = _MESH_CACHE[key] = (system, m)
    return hit[1]


def rules_of(structure: Structure, model: ModelSpec) -> Rules:
    d = Degrees(**{s.value: 2 for s in structure.active})
    r = rules_for(d, sequence_parallel=structure.sequence_parallel)
    act = dict(r.activations)
    par = dict(r.params)
    # inside the MoE block tokens are grouped by expert: the per-expert token slots ("capacity")
    # keep the batch axes except the expert axis, which now splits the experts
    cap = tuple(a for a in act.get("batch", ()) if a != "expert")
    if cap:
        act["capacity"] = cap
    if Strategy.TP in structure.active and model.moe is not None:
        act["expert_mlp"] = ("tensor",)
        par["expert_mlp"] = ("tensor",)
    if structure.kv_replicated:
        act.pop("kv_heads", None)
        par.pop("kv_heads", None)
    return Rules(MappingProxyType(act), MappingProxyType(par), r.sequence_parallel)


def spec_of(t: Tensor, rules: Rules, *, block_io: bool = False) -> Spec:
    axes = []
    used: set[str] = set()
    for d in t.dims:
        a = tuple(x for x in rules.axes_for(d, t.is_param) if x not in used)
        if (
            block_io
            and rules.sequence_parallel
            and d == "seq"
            and not t.is_param
            and "tensor" not in used
        ):
            a = a + ("tensor",)
        used.update(a)
        axes.append(a)
    return Spec(t.name, t.dims, tuple(axes), (), t.dtype)


_BLOCK_INPUT_OPS = (
    "attn/q",
    "attn/k",
    "attn/v",
    "attn/q_a",
    "attn/kv_a",
    "mlp/gate",
    "mlp/up",
    "moe/router",
    "moe/shared/gate",
    "moe/shared/up",
)
_BLOCK_OUTPUT_OPS = ("attn/out", "mlp/down", "moe/shared/down")


def op_specs(op: Op, rules: Rules) -> tuple[Spec, Spec, Spec]:
    lhs_t, rhs_t = op.inputs
    lhs = spec_of(lhs_t, rules, block_io=op.name in _BLOCK_INPUT_OPS)
    rhs = spec_of(rhs_t, rules)
    out = spec_of(op.out, rules, block_io=op.name in _BLOCK_OUTPUT_OPS)
    if op.name == "unembed":
        lhs = spec_of(lhs_t, rules, block_io=True)
    return lhs, rhs, out


def op_sizes(op: Op, batch: np.ndarray) -> dict[str, Any]:
    s: dict[str, Any] = dict(op.sizes)
    s["batch"] = batch
    if "capacity" in s:
        s["capacity"] = batch * s["seq"] * s["top_k"] / s["experts"]
    return s


def shard_factor(
    dims: tuple[str, ...], rules: Rules, is_param: bool, mesh: Mapping[str, Any]
) -> Any:
    n: Any = 1.0
    used: set[str] = set()
    for d in dims:
        for a in rules.axes_for(d, is_param):
            if a not in used:
                used.add(a)
                n = n * mesh[a]
    return n


def layer_terms(
    model: ModelSpec,
    systems: list[System],
    workload: Any,  # training.Workload: .sequences, .seq_len, .causal
    structure: Structure,
    uniq: np.ndarray,
    eff: Efficiency,
    keep_einsums: bool,
    merge_reductions: bool,
    remat_list: list[Remat],
    ops: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The algebra over every ledger row for each distinct (system, degrees, microbatch) row of `uniq`."""
    chip = systems[0].chip
    n = len(uniq)
    order = (Strategy.DP, Strategy.FSDP, Strategy.TP, Strategy.SP, Strategy.EP, Strategy.PP)
    deg = {s: uniq[:, 1 + i].astype(float) for i, s in enumerate(order)}
    M = uniq[:, 7].astype(float)
    pp = deg[Strategy.PP]
    ones = np.ones(n)
    mesh_sizes = {AXIS_OF[s]: deg[s] for s in Strategy}
    rules = rules_of(structure, model)

    # meshes on the physical systems: one per distinct (system, degrees) — microbatches do not matter
    mesh_rows, minv = np.unique(uniq[:, :7], axis=0, return_inverse=True)
    minv = minv.reshape(-1)
    mkeys = []
    for row in mesh_rows:
        d = Degrees(**{s.value: int(row[1 + j]) for j, s in enumerate(order)})
        mkeys.append((int(row[0]), d.mesh_axes()))
    meshes_or_err = [mesh_for(systems[k[0]], k[1]) for k in mkeys]
    meshes = [m if isinstance(m, Mesh) else None for m in meshes_or_err]
    mesh_reason = np.array([(m if isinstance(m, str) else "") for m in meshes_or_err], dtype=object)
    reason_rows = mesh_reason[minv]
    comm = CommModel(minv, meshes, eff)

    seqs_mb = workload.sequences / M
    led = build_ledger(model, batch=1, seq=workload.seq_len, causal=workload.causal)
    if ops is not None:  # a subset of rows, e.g. the book's simplified layer ("mlp/up", "mlp/down")
        led = replace(led, ops=tuple(o for o in led.ops if o.name in ops))
    peak = chip.peak("bf16") * eff.matmul
    vec_peak = (
        peak * 0.05
    )  # elementwise work runs on the vector units (~1/20 of the MXU; book tpus.md)
    hbm = chip.hbm_bw_bytes_per_s * eff.hbm
    z = np.zeros(n)
    out: dict[str, Any] = {
        k: z.copy()
        for k in (
            "tf_mm",
            "tf_last",
            "ff_last",
            "tp_f_last",
            "act_f_last",
            "tf_ae",
            "tf_other",
            "tb",
            "ff_mm",
            "ff_ae",
            "ff_other",
            "fb",
            "tp_f",
            "tp_b",
            "act_f",
            "act_b",
            "sp_base",
            "ep_base",
            "fsdp_f",
            "fsdp_b",
            "fsdp_b_dup",
            "grad_mb",
            "grad_step",
        )
    }
    counted: dict[tuple, np.ndarray] = {}
    einsums = []
    same: dict[tuple, tuple] = {}  # identical einsums (gate and up) are planned once
    for op in led:
        layer_op = op.name not in ("embed", "unembed")
        copies = (
            np.ceil(op.count / pp) if layer_op else ones
        )  # stages may be uneven: the fullest one binds
        sizes = op_sizes(op, seqs_mb)
        block = op.name.rsplit("/", 1)[0]
        if op.kind == OpKind.MATMUL:
            lhs, rhs, out_s = op_specs(op, rules)
            skey = (
                lhs,
                rhs,
                out_s,
                tuple(sorted((k, v) for k, v in op.sizes.items() if k != "batch")),
            )
            if skey not in same:
                same[skey] = plan_training_einsum(
                    lhs,
                    rhs,
                    out_s,
                    sizes,
                    mesh_sizes,
                    comm,
                    peak_flops_per_s=peak,
                    hbm_bw_bytes_per_s=hbm,
                    check_divisible=False,
                    trusted=not keep_einsums,
                )
            fwd, bl, br = same[skey]
            if merge_reductions:
                bl = merged_dlhs(
                    bl, block, sizes, mesh_sizes, comm, counted, peak, hbm, trusted=not keep_einsums
                )
            t_f = np.maximum(fwd.compute_time_s, fwd.memory_time_s)
            t_b = np.maximum(bl.compute_time_s, bl.memory_time_s) + np.maximum(
                br.compute_time_s, br.memory_time_s
            )
            # a layer's last projection is not rerun by remat: the backward pass never reads its
            # output (the next layer's checkpoint holds it); XLA skips it too (see docs/verify.md)
            last = op.name in LAST_PROJECTIONS
            out[("tf_last" if last else "tf_mm") if layer_op else "tf_other"] += copies * t_f
            out[("ff_last" if last else "ff_mm") if layer_op else "ff_other"] += (
                copies * fwd.flops_per_chip
            )
            if last:
                before = {k: out[k].copy() for k in ("tp_f", "act_f")}
            out["tb"] += copies * t_b
            out["fb"] += copies * (bl.flops_per_chip + br.flops_per_chip)
            for e in (fwd, bl, br):
                add_comms(e, block, copies, out, counted, merge_reductions)
            if last:  # its forward collectives are not rerun either
                for k in ("tp_f", "act_f"):
                    out[k + "_last"] += out[k] - before[k]
                    out[k] = before[k]
            if keep_einsums:
                einsums.append((op.name, fwd, bl, br))
        elif op.kind == OpKind.ATTENTION:
            # scores/context: activation x activation, local once heads and batch are split
            # (GQA: each chip reads only the KV heads its query heads need); book inference.md
            sh = shard_factor(op.out.dims, rules, False, mesh_sizes)
            fl = op.flops / op.count * seqs_mb / op.sizes["batch"] / sh
            by = sum(
                spec_of(t, rules).local_bytes(sizes, mesh_sizes)
                for t in (*op.inputs, op.out)
                if not t.on_chip
            )
            t = np.maximum(fl / peak, by / hbm)
            out["tf_ae"] += copies * t
            out["ff_ae"] += copies * fl
            out["tb"] += copies * 2 * t
            out["fb"] += copies * 2 * fl
            if op.name.startswith("attn/scores") and "seq" in rules.activations.get("seq", ()):
                # context parallelism: K (and V) gathered along the sequence before attention
                kv_b = spec_of(op.inputs[1], rules).local_bytes(sizes, mesh_sizes)
                out["sp_base"] += copies * comm(CollectiveKind.ALL_GATHER, kv_b, ("seq",))
        else:
            # elementwise ops and the embedding gather: memory-bound, sharded like their output
            sh = shard_factor(op.out.dims, rules, False, mesh_sizes)
            fl = op.flops / op.count / op.sizes["batch"] * seqs_mb / sh
            by = op.bytes / op.count / op.sizes["batch"] * seqs_mb / sh
            t = np.maximum(fl / vec_peak, by / hbm)
            out["tf_ae" if layer_op else "tf_other"] += copies * t
            out["ff_ae" if layer_op else "ff_other"] += copies * fl
            out["tb"] += copies * t
            out["fb"] += copies * fl
        if op.name == "moe/up" and Strategy.EP in structure.active:
            # dispatch and combine: AllToAll over the expert axis (book gpus.md, expert parallelism)
            xe = Tensor("xe", ("experts", "capacity", "embed"), op.inputs[0].dtype)
            b = spec_of(xe, rules).local_bytes(sizes, mesh_sizes)
            out["ep_base"] += copies * comm(CollectiveKind.ALL_TO_ALL, b, ("expert",))

    # pipeline hop: one microbatch's activations to the next stage
    x_local = spec_of(
        Tensor("x", ("batch", "seq", "embed"), "bf16"), rules, block_io=True
    ).local_bytes({"batch": seqs_mb, "seq": workload.seq_len, "embed": model.d_model}, mesh_sizes)
    out["hop"] = (
        comm(CollectiveKind.PERMUTE, x_local, ("stage",))
        if Strategy.PP in structure.active
        else z.copy()
    )

    # memory pieces that depend on the mesh
    params_local = z.copy()
    weight_gathered = z.copy()
    for op in led:
        w = op.weight
        if w is None:
            continue
        layer_op = op.name not in ("embed", "unembed")
        per = w.elements(op.sizes) / shard_factor(w.dims, rules, True, mesh_sizes)
        params_local = params_local + per * (np.ceil(op.count / pp) if layer_op else 1)
        if layer_op:
            weight_gathered = (
                weight_gathered + per * mesh_sizes["fsdp"] * dtype_bytes(w.dtype) * op.count
            )
    out["params_local"] = params_local
    fsdp_on = mesh_sizes["fsdp"] > 1
    # two layers' gathered weights in flight (prefetch double buffer) ...
    out["gathered"] = np.where(fsdp_on, 2 * weight_gathered / model.n_layers, 0.0)
    # ... or, when the backward pass reuses the forward's gathers (no remat), every layer's of the stage
    out["gathered_all"] = np.where(
        fsdp_on, weight_gathered * np.ceil(model.n_layers / pp) / model.n_layers, 0.0
    )
    for i, r in enumerate(remat_list):
        out[f"saved_{i}"] = np.broadcast_to(
            np.asarray(saved_local_bytes(led, r, rules, seqs_mb, mesh_sizes, model), float), (n,)
        )
    out["one_layer"] = np.broadcast_to(
        np.asarray(
            saved_local_bytes(led, Remat(RematKind.NONE), rules, seqs_mb, mesh_sizes, model), float
        ),
        (n,),
    )
    out["logits"] = (
        seqs_mb
        * workload.seq_len
        * model.vocab
        * 4.0
        / shard_factor(("batch", "seq", "vocab"), rules, False, mesh_sizes)
    )
    out["reason"] = reason_rows
    out["mesh_bad"] = reason_rows != ""
    out["einsums"] = tuple(einsums)
    return out


def merged_dlhs(
    bl: EinsumPlan,
    block: str,
    sizes,
    mesh_sizes,
    comm,
    counted: dict,
    peak: float,
    hbm: float,
    trusted: bool = True,
) -> EinsumPlan:
    """Re-plan a d_lhs einsum knowing which reductions of the block's dx are already paid.

    The partial input-gradients of one block (dq, dk, dv -> dx; gate and up -> dx) are summed
    and reduced once (see `add_comms`), so once one projection pays the AllReduce (or
    ReduceScatter) of dx over some axes, the next one's reduction over them is free — and the
    option that reduces becomes the cheap one. Without this each einsum would choose alone
    (e.g. gather dk and W_k rather than reduce), which neither XLA nor a fused projection does.
    """
    if not bl.options or not bl.options[0].out.name.startswith("dx"):
        return bl
    prefix = block.split("/")[0]
    paid = {
        (k[2], k[3]): v
        for k, v in counted.items()
        if len(k) == 5 and k[0] == prefix and k[1] == bl.options[0].out.name and k[4] == "backward"
    }
    if not paid:
        return bl

    def comm_paid(kind: CollectiveKind, b: Any, axes: tuple[str, ...]) -> Any:
        t = comm(kind, b, axes)
        m = paid.get((kind, tuple(axes)))
        return t if m is None else np.where(m, 0.0, t)

    return plan_einsum(
        bl.lhs,
        bl.rhs,
        bl.out,
        sizes,
        mesh_sizes,
        comm_paid,
        peak_flops_per_s=peak,
        hbm_bw_bytes_per_s=hbm,
        phase="backward",
        check_divisible=False,
        trusted=trusted,
    )


def add_comms(
    ep: EinsumPlan, block: str, copies: Any, out: dict, counted: dict, merge: bool
) -> None:
    """Add the chosen option's collectives to the step's buckets, counting shared ones once."""
    choice = np.asarray(ep.choice)
    for oi, o in enumerate(ep.options):
        sel = choice == oi
        if not np.any(sel):
            continue
        for c in o.comms:
            b = bucket_of(c, block)
            t = c.time_s * copies
            if c.kind == CollectiveKind.ALL_GATHER and not c.tensor.startswith("d"):
                # the same array gathered the same way is gathered once per phase (x for q, k, v)
                key = (block, c.tensor, c.before, c.after, c.phase)
                prev = counted.get(key, np.zeros_like(sel))
                add = sel & ~prev
                counted[key] = prev | sel
                if b == "fsdp" and c.phase == "backward":
                    # without remat the forward's gathered weights can be kept for the backward pass
                    fwd_prev = counted.get(
                        (block, c.tensor, c.before, c.after, "forward"), np.zeros_like(sel)
                    )
                    out["fsdp_b_dup"] += np.where(add & fwd_prev, t, 0.0)
            elif (
                merge
                and c.tensor.startswith("dx")
                and c.kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)
            ):
                # partial input-gradients of one block (dq, dk, dv -> dx) are summed, then reduced once
                key = (block.split("/")[0], c.tensor, c.kind, c.axes, c.phase)
                prev = counted.get(key, np.zeros_like(sel))
                add = sel & ~prev
                counted[key] = prev | sel
            else:
                add = sel
            phase = "f" if c.phase == "forward" else "b"
            name = {
                "fsdp": f"fsdp_{phase}",
                "tp": f"tp_{phase}",
                "act": f"act_{phase}",
                "sp": f"act_{phase}",
                "ep": f"act_{phase}",
                "grad_mb": "grad_mb",
                "grad_step": "grad_step",
            }[b]
            out[name] = out[name] + np.where(add, t, 0.0)


def saved_local_bytes(
    led: Ledger, remat: Remat, rules: Rules, seqs_mb: Any, mesh: Mapping[str, Any], model: ModelSpec
) -> Any:
    """Saved activation bytes per layer per chip for one microbatch (see memory.py)."""
    kind = remat.kind
    if kind in (RematKind.FULL, RematKind.CHECKPOINTS):
        n = 1 if kind == RematKind.FULL else remat.n
        x = spec_of(
            Tensor("x", ("batch", "seq", "embed"), (led.ops[0].out.dtype if led.ops else "bf16")),
            rules,
            block_io=True,
        )
        return n * x.local_bytes(
            {"batch": seqs_mb, "seq": led.sizes["seq"], "embed": model.d_model}, mesh
        )
    total: Any = 0.0
    for op, t in saved_tensors(led, remat):
        total = (
            total
            + spec_of(t, rules).local_bytes(op_sizes(op, seqs_mb), mesh) * op.count / model.n_layers
        )
    if (
        kind == RematKind.NONE
    ):  # the normalised copies of x the norms keep (as memory.py counts them)
        x = spec_of(
            Tensor("x", ("batch", "seq", "embed"), (led.ops[0].out.dtype if led.ops else "bf16")),
            rules,
            block_io=True,
        )
        total = total + model.norms_per_layer * x.local_bytes(
            {"batch": seqs_mb, "seq": led.sizes["seq"], "embed": model.d_model}, mesh
        )
    return total
