"""Training step cost: the sharding algebra applied to every ledger row, forward and backward.

A plan (mesh degrees + rule set + schedule) turns each ledger op into three sharded
einsums (forward, d_lhs, d_rhs; book training.md Appendix A). The algebra picks each
einsum's collectives; this module only adds them up on a timeline:

- compute: per-op roofline max(FLOPs/(peak·eff), bytes/(HBM·eff)), remat recompute added;
- FSDP weight gathers are prefetched a layer ahead and weight-gradient reductions run
  behind the backward pass: exposed = max(0, their time − compute);
- tensor/sequence-parallel and expert all-to-all collectives sit on the critical path
  (unless collective matmul overlaps TP with its matmul);
- data-parallel gradient reduction happens once per step, behind the last microbatch's backward;
- pipeline: bubble (p−1)/v over M microbatches (GPipe / 1F1B / interleaved) plus p2p hops;
- the optimizer update streams params, grads and state once through HBM.

All arithmetic is vectorised over candidate plans (numpy arrays, one entry per
candidate) so the planner evaluates thousands at once; `evaluate_plan` is the
one-candidate case with the details kept.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.collectives import CollectiveKind, collective_cost
from roofline.errors import PlanError, RooflineError
from roofline.ledger import Causal, Ledger, Op, OpKind, Tensor, build_ledger, count_params
from roofline.memory import OptimizerPolicy, Remat, RematKind, parse_optimizer, parse_remat
from roofline.mesh import Mesh, make_mesh
from roofline.rules import AXIS_OF, Degrees, Rules, Strategy, parse_degrees, rules_for
from roofline.sharding import Comm, EinsumPlan, Spec, plan_einsum, plan_training_einsum
from roofline.specs.efficiency import Efficiency, default_efficiency
from roofline.specs.model import ModelSpec
from roofline.specs.system import System
from roofline.units import DAY, dtype_bytes, parse_quantity


class Schedule(enum.StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


@dataclass(frozen=True)
class Plan:
    """How to run a step: strategy degrees, microbatches, remat, ZeRO stage, pipeline schedule."""

    degrees: Degrees
    microbatches: int = 1
    remat: Remat = field(default_factory=Remat)
    zero: int = 1  # ZeRO stage over the `data` axis (the `fsdp` axis is stage 3 by definition)
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1  # interleaved schedule: model chunks per pipeline stage
    sequence_parallel: bool = False  # Megatron SP: TP AllReduce -> ReduceScatter + AllGather
    collective_matmul: bool = False  # overlap TP collectives with their matmuls
    optimizer: OptimizerPolicy = field(default_factory=lambda: parse_optimizer("adam-bf16"))

    def describe(self) -> str:
        d = self.degrees
        parts = [
            f"{s.value}={getattr(d, s.value)}" for s in Strategy if getattr(d, s.value) > 1
        ] or ["dp=1"]
        parts.append(f"microbatch={self.microbatches}")
        parts.append(f"remat={self.remat}")
        if d.dp > 1:
            parts.append(f"zero={self.zero}")
        if d.pp > 1:
            parts.append(
                f"schedule={self.schedule.value}"
                + (
                    f",virtual={self.virtual_stages}"
                    if self.schedule == Schedule.INTERLEAVED
                    else ""
                )
            )
        if self.sequence_parallel:
            parts.append("megatron_sp=1")
        if self.collective_matmul:
            parts.append("collective_matmul=1")
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = self.degrees
        return {
            "spec": self.describe(),
            **{s.value: getattr(d, s.value) for s in Strategy},
            "microbatches": self.microbatches,
            "remat": str(self.remat),
            "zero": self.zero,
            "schedule": self.schedule.value,
            "virtual_stages": self.virtual_stages,
            "sequence_parallel": self.sequence_parallel,
            "collective_matmul": self.collective_matmul,
            "optimizer": self.optimizer.name,
            "mesh_axes": [list(a) for a in d.mesh_axes()],
        }


def parse_plan(text: str) -> Plan:
    """'fsdp=1024,tp=4,sp=2,microbatch=4,remat=full' -> Plan (unknown keys are errors)."""
    deg, rest = parse_degrees(text)
    kw: dict[str, Any] = {}
    for k, v in rest.items():
        try:
            if k in ("microbatch", "microbatches", "mb", "accum", "grad_accum"):
                kw["microbatches"] = int(v)
            elif k == "remat":
                kw["remat"] = parse_remat(v)
            elif k == "zero":
                kw["zero"] = int(v)
            elif k == "schedule":
                kw["schedule"] = Schedule(v.lower())
            elif k in ("virtual", "virtual_stages", "v"):
                kw["virtual_stages"] = int(v)
            elif k in ("megatron_sp", "sequence_parallel", "seqpar"):
                kw["sequence_parallel"] = v.lower() in ("1", "true", "yes", "on")
            elif k in ("collective_matmul", "cm"):
                kw["collective_matmul"] = v.lower() in ("1", "true", "yes", "on")
            elif k in ("optimizer", "opt"):
                kw["optimizer"] = parse_optimizer(v)
            else:
                raise PlanError(
                    f"unknown plan key {k!r}",
                    rule="plan keys: dp, fsdp, tp, sp, ep, pp, microbatch, remat, zero, schedule, virtual, megatron_sp, collective_matmul, optimizer",
                    fix='write e.g. --plan "fsdp=256,tp=4,microbatch=4,remat=full"',
                )
        except ValueError:
            raise PlanError(
                f"plan value {k}={v!r} cannot be read",
                rule="numbers are integers; schedule is gpipe, 1f1b or interleaved",
                fix=f"correct {k}",
            ) from None
    if kw.get("microbatches", 1) < 1:
        raise PlanError(
            f"microbatch={kw['microbatches']}",
            rule="at least one microbatch",
            fix="write microbatch=1 or more",
        )
    if kw.get("zero", 1) not in (0, 1, 2, 3):
        raise PlanError(
            f"zero={kw['zero']}", rule="ZeRO stages are 0, 1, 2 or 3", fix="write zero=1"
        )
    if kw.get("zero") == 3 and deg.dp > 1:  # ZeRO-3 over the data axis is FSDP
        deg = replace(deg, fsdp=deg.fsdp * deg.dp, dp=1)
    return Plan(deg, **kw)


@dataclass(frozen=True)
class Workload:
    """Global batch (tokens per optimizer step), sequence length, and run length in tokens."""

    batch_tokens: float
    seq_len: int
    total_tokens: float = 0.0
    causal: Causal = Causal.HALF

    def __post_init__(self) -> None:
        if self.seq_len <= 0 or self.batch_tokens <= 0 or self.total_tokens < 0:
            raise RooflineError(
                f"batch_tokens={self.batch_tokens}, seq_len={self.seq_len}, tokens={self.total_tokens}",
                rule="batch and sequence length are positive, run tokens non-negative",
                fix="give positive sizes",
            )
        if self.batch_tokens < self.seq_len:
            raise RooflineError(
                f"batch of {self.batch_tokens:g} tokens is shorter than one {self.seq_len}-token sequence",
                rule="a batch holds at least one sequence",
                fix="raise --batch-tokens or lower --seq",
            )

    @property
    def sequences(self) -> float:
        return self.batch_tokens / self.seq_len


# --------------------------------------------------------------------------------------
# Vectorised evaluation
# --------------------------------------------------------------------------------------

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


@dataclass
class Candidates:
    """Arrays (one entry per candidate) of the numeric plan choices within one Structure."""

    deg: dict[Strategy, np.ndarray]
    microbatches: np.ndarray
    zero: np.ndarray
    schedule: np.ndarray  # 0 gpipe, 1 1f1b, 2 interleaved
    virtual: np.ndarray
    system_idx: np.ndarray | None = (
        None  # which of several systems (sub-slices) each candidate runs on
    )
    remat_idx: np.ndarray | None = None  # index into the remat list given to evaluate_plans
    collective_matmul: np.ndarray | None = None  # bool per candidate

    def __len__(self) -> int:
        return len(self.microbatches)


@dataclass(frozen=True)
class StepArrays:
    """Per-candidate step results (arrays). Times in seconds, memory in bytes per chip."""

    step_time_s: np.ndarray
    compute_time_s: np.ndarray
    exposed_comm_time_s: np.ndarray
    bubble_time_s: np.ndarray
    bubble_fraction: np.ndarray
    optimizer_time_s: np.ndarray
    comm: Mapping[str, np.ndarray]  # raw time per bucket per step
    exposed: Mapping[str, np.ndarray]
    memory: Mapping[str, np.ndarray]
    memory_total: np.ndarray
    flops_per_chip: np.ndarray  # executed (incl. recompute) per step
    model_flops: float  # 6·N·tokens per step
    mfu: np.ndarray
    hfu: np.ndarray
    tokens_per_s: np.ndarray
    infeasible: np.ndarray  # bool
    reason: Any  # reason[i] -> str ("" if feasible); .counts() -> {reason: count}
    einsums: tuple = ()  # (op name, forward, d_lhs, d_rhs) EinsumPlans — kept for single plans
    terms: Mapping[str, np.ndarray] = field(
        default_factory=dict
    )  # raw per-step terms by phase (see step_terms)


class _Reasons:
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


def _bucket(c: Comm, block: str) -> str:
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


class _CommModel:
    """comm_fn for the algebra: per-candidate collective times from each candidate's mesh.

    A collective's cost depends only on where its axes sit on the system, so meshes are
    grouped by that placement (interned per axis as an integer) and `collective_cost` runs once
    per distinct placement, not once per mesh.
    """

    def __init__(
        self,
        system: System,
        mesh_keys: list,
        inverse: np.ndarray,
        meshes: list[Mesh | None],
        eff: Efficiency,
    ) -> None:
        self.system, self.keys, self.inv, self.meshes, self.eff = (
            system,
            mesh_keys,
            inverse,
            meshes,
            eff,
        )
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


def _mesh_for(system: System, axes: tuple[tuple[str, int], ...]) -> Mesh | str:
    key = (id(system), axes)
    hit = _MESH_CACHE.get(key)
    if hit is None or hit[0] is not system:
        try:
            m: Mesh | str = make_mesh(system, axes)
        except PlanError as e:
            m = f"mesh does not fit the topology ({e.what})"
        hit = _MESH_CACHE[key] = (system, m)
    return hit[1]


def _rules(structure: Structure, model: ModelSpec) -> Rules:
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


def _spec(t: Tensor, rules: Rules, *, block_io: bool = False) -> Spec:
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


def _op_specs(op: Op, rules: Rules) -> tuple[Spec, Spec, Spec]:
    lhs_t, rhs_t = op.inputs
    lhs = _spec(lhs_t, rules, block_io=op.name in _BLOCK_INPUT_OPS)
    rhs = _spec(rhs_t, rules)
    out = _spec(op.out, rules, block_io=op.name in _BLOCK_OUTPUT_OPS)
    if op.name == "unembed":
        lhs = _spec(lhs_t, rules, block_io=True)
    return lhs, rhs, out


def _sizes(op: Op, batch: np.ndarray) -> dict[str, Any]:
    s: dict[str, Any] = dict(op.sizes)
    s["batch"] = batch
    if "capacity" in s:
        s["capacity"] = batch * s["seq"] * s["top_k"] / s["experts"]
    return s


def _shard(dims: tuple[str, ...], rules: Rules, is_param: bool, mesh: Mapping[str, Any]) -> Any:
    n: Any = 1.0
    used: set[str] = set()
    for d in dims:
        for a in rules.axes_for(d, is_param):
            if a not in used:
                used.add(a)
                n = n * mesh[a]
    return n


def evaluate_plans(
    model: ModelSpec,
    system: System | list[System],
    workload: Workload,
    structure: Structure,
    cand: Candidates,
    *,
    eff: Efficiency | None = None,
    optimizer: OptimizerPolicy | None = None,
    keep_einsums: bool = False,
    merge_reductions: bool = True,
    remats: list[Remat] | None = None,
    ops: tuple[str, ...] | None = None,
) -> StepArrays:
    """Evaluate every candidate of one Structure at once (numpy arrays in, arrays out).

    `system` may be a list (sub-slices of one pod, same chip): `cand.system_idx` picks one
    per candidate. `remats` (with `cand.remat_idx`) and `cand.collective_matmul` vary those
    choices per candidate too; otherwise `structure.remat` / `structure.collective_matmul` apply.

    Two phases: the algebra runs once per distinct (system, mesh, microbatch) — the only
    inputs the einsums see — and the timeline then combines its sums with each candidate's
    remat, ZeRO stage, schedule and overlap choices.
    """
    systems = list(system) if isinstance(system, (list, tuple)) else [system]
    system = systems[0]
    eff = eff or default_efficiency(system.chip.vendor)
    opt = optimizer or parse_optimizer("adam-bf16")
    chip = system.chip
    n = len(cand)
    ones = np.ones(n)
    sys_idx = cand.system_idx if cand.system_idx is not None else np.zeros(n, dtype=int)
    remat_list = remats or [structure.remat]
    r_idx = cand.remat_idx if cand.remat_idx is not None else np.zeros(n, dtype=int)
    cm = (
        cand.collective_matmul
        if cand.collective_matmul is not None
        else np.full(n, structure.collective_matmul)
    )
    order = (Strategy.DP, Strategy.FSDP, Strategy.TP, Strategy.SP, Strategy.EP, Strategy.PP)
    key_mat = np.column_stack(
        [sys_idx] + [cand.deg.get(s, ones) for s in order] + [cand.microbatches]
    ).astype(np.int64)
    # distinct rows via one mixed-radix integer per row (much faster than unique(axis=0))
    radix = key_mat.max(axis=0) + 1
    flat_key = np.zeros(n, dtype=np.int64)
    for j in range(key_mat.shape[1]):
        flat_key = flat_key * int(radix[j]) + key_mat[:, j]
    _, first, inv = np.unique(flat_key, return_index=True, return_inverse=True)
    uniq = key_mat[first]
    inv = inv.reshape(-1)
    core = _core(
        model,
        systems,
        workload,
        structure,
        uniq,
        eff,
        keep_einsums,
        merge_reductions,
        remat_list,
        ops,
    )

    def g(name: str) -> np.ndarray:
        return core[name][inv]

    deg = {s: cand.deg.get(s, ones).astype(float) for s in Strategy}
    M = cand.microbatches.astype(float)
    pp = deg[Strategy.PP]
    dp = deg[Strategy.DP]
    rc_all = np.array([r.kind in (RematKind.FULL, RematKind.CHECKPOINTS) for r in remat_list])[
        r_idx
    ].astype(float)
    rc_mm = np.array([r.kind == RematKind.MATMULS for r in remat_list])[r_idx].astype(float)
    reuse = np.array([r.kind == RematKind.NONE for r in remat_list])[r_idx]
    rc_ae = np.maximum(
        rc_all, rc_mm
    )  # attention + elementwise rerun under both FULL and MATMULS remat

    # ---- per microbatch (one pipeline stage) ------------------------------------------
    compute = (
        g("tf_mm") * (1 + rc_all)
        + g("tf_last")
        + g("tf_ae") * (1 + rc_ae)
        + g("tf_other")
        + g("tb")
    )
    compute_bwd = g("tb")
    flops_mb = (
        g("ff_mm") * (1 + rc_all)
        + g("ff_last")
        + g("ff_ae") * (1 + rc_ae)
        + g("ff_other")
        + g("fb")
    )
    tp = g("tp_f") * (1 + rc_all) + g("tp_f_last") + g("tp_b")
    act = g("act_f") * (1 + rc_all) + g("act_f_last") + g("act_b")
    sp = (
        g("sp_base") * 2 * (2 + rc_ae)
    )  # K and V: gathered forward (+ remat), reduce-scattered backward
    ep = g("ep_base") * (2 * (1 + rc_all) + 2)  # dispatch + combine, forward (+ remat) and backward
    # FSDP gathers weights again for the backward pass under remat; without remat the forward's
    # gathered weights are kept (XLA without scan does this; PyTorch FSDP and scanned stacks
    # re-gather: docs/verify.md names the difference)
    fsdp = g("fsdp_f") + g("fsdp_b") - np.where(reuse, g("fsdp_b_dup"), 0.0)
    hidden = fsdp + g("grad_mb")
    fsdp_exposed = np.maximum(0.0, hidden - compute)
    tp_exposed = np.where(cm, np.maximum(0.0, tp - compute), tp)
    t_mb = compute + tp_exposed + sp + ep + act + fsdp_exposed

    # ---- pipeline and step -------------------------------------------------------------
    v = np.where(cand.schedule == 2, cand.virtual, 1).astype(float)
    fill = np.where(pp > 1, (pp - 1) / v, 0.0)
    bubble_frac = fill / (M + fill)
    t_pipe = t_mb * (M + fill)
    bubble_t = t_mb * fill
    p2p = 2 * g("hop") * np.maximum(pp - 1, 0)
    grad_step_exposed = np.maximum(0.0, g("grad_step") - compute_bwd)

    # ---- memory per chip -----------------------------------------------------------------
    z = cand.zero
    params_local = g("params_local")
    p_bytes = params_local * opt.param_bytes
    g_bytes = params_local * opt.grad_bytes / np.where(z >= 2, dp, 1)
    o_bytes = params_local * opt.state_bytes / np.where(z >= 1, dp, 1)
    act_layer = np.choose(r_idx, [core[f"saved_{i}"][inv] for i in range(len(remat_list))])
    in_flight = np.where(pp > 1, np.where(cand.schedule == 0, M, np.minimum(M, pp)), 1.0)
    acts = act_layer * np.ceil(model.n_layers / pp) * in_flight  # the fullest stage
    temps = np.where(reuse, 0.0, g("one_layer")) + g("logits") + g("gathered")
    mem = {
        "params": p_bytes,
        "grads": g_bytes,
        "optimizer": o_bytes,
        "activations": acts,
        "temporaries": temps,
    }
    mem_total = p_bytes + g_bytes + o_bytes + acts + temps
    opt_t = (p_bytes * 2 + g_bytes + o_bytes * 2) / (chip.hbm_bw_bytes_per_s * eff.hbm)

    step = t_pipe + p2p + grad_step_exposed + opt_t
    exposed_comm = (tp_exposed + sp + ep + act + fsdp_exposed) * M + p2p + grad_step_exposed
    n_chips = np.array([s.n_chips for s in systems], dtype=float)[sys_idx]
    model_flops = 6.0 * count_params(model).active * workload.batch_tokens
    peak = chip.peak("bf16")
    mfu = model_flops / (step * n_chips * peak)
    hfu = flops_mb * M / (step * peak)
    comm_step = {
        "fsdp": fsdp * M,
        "grad_mb": g("grad_mb") * M,
        "grad_step": g("grad_step"),
        "tp": tp * M,
        "sp": sp * M,
        "ep": ep * M,
        "act": act * M,
        "pp": p2p,
    }
    exposed = {
        "fsdp+grad": fsdp_exposed * M,
        "grad_step": grad_step_exposed,
        "tp": tp_exposed * M,
        "sp": sp * M,
        "ep": ep * M,
        "act": act * M,
        "pp": p2p,
    }

    mesh_bad = core["mesh_bad"][inv]
    over = (mem_total > chip.hbm_bytes) & ~mesh_bad
    infeasible = mesh_bad | over
    reason = _Reasons(core["reason"], inv, mesh_bad, over, mem_total, chip.hbm_bytes)
    pk = chip.peak("bf16") * eff.matmul
    terms = {
        "t_math_forward_s": (g("ff_mm") + g("ff_last") + g("ff_ae") + g("ff_other")) * M / pk,
        "t_math_backward_s": g("fb") * M / pk,
        "t_math_recompute_s": (g("ff_mm") * rc_all + g("ff_ae") * rc_ae) * M / pk,
        "fsdp_forward_s": g("fsdp_f") * M,
        "tp_forward_s": (g("tp_f") + g("tp_f_last")) * M,
        # the first forward pass; remat's second forward runs inside the backward pass
        "comm_forward_s": (
            g("tp_f")
            + g("tp_f_last")
            + g("fsdp_f")
            + g("act_f")
            + g("act_f_last")
            + 2 * g("sp_base")
            + 2 * g("ep_base")
        )
        * M,
        "comm_backward_s": (
            g("tp_f") * rc_all
            + g("act_f") * rc_all
            + 2 * g("sp_base") * (1 + rc_ae)
            + 2 * g("ep_base") * (1 + rc_all)
            + g("tp_b")
            + g("act_b")
            + g("grad_mb")
        )
        * M
        + (g("fsdp_b") - np.where(reuse, g("fsdp_b_dup"), 0.0)) * M
        + g("grad_step"),
    }
    return StepArrays(
        step,
        compute * M,
        exposed_comm,
        bubble_t,
        bubble_frac,
        opt_t,
        comm_step,
        exposed,
        mem,
        mem_total,
        flops_mb * M,
        model_flops,
        mfu,
        hfu,
        workload.batch_tokens / step,
        infeasible,
        reason,
        core["einsums"],
        terms,
    )


def _core(
    model: ModelSpec,
    systems: list[System],
    workload: Workload,
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
    rules = _rules(structure, model)

    # meshes on the physical systems: one per distinct (system, degrees) — microbatches do not matter
    mesh_rows, minv = np.unique(uniq[:, :7], axis=0, return_inverse=True)
    minv = minv.reshape(-1)
    mkeys = []
    for row in mesh_rows:
        d = Degrees(**{s.value: int(row[1 + j]) for j, s in enumerate(order)})
        mkeys.append((int(row[0]), d.mesh_axes()))
    meshes_or_err = [_mesh_for(systems[k[0]], k[1]) for k in mkeys]
    meshes = [m if isinstance(m, Mesh) else None for m in meshes_or_err]
    mesh_reason = np.array([(m if isinstance(m, str) else "") for m in meshes_or_err], dtype=object)
    reason_rows = mesh_reason[minv]
    comm = _CommModel(systems[0], list(mkeys), minv, meshes, eff)

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
        sizes = _sizes(op, seqs_mb)
        block = op.name.rsplit("/", 1)[0]
        if op.kind == OpKind.MATMUL:
            lhs, rhs, out_s = _op_specs(op, rules)
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
                _add_comms(e, block, copies, out, counted, merge_reductions)
            if last:  # its forward collectives are not rerun either
                for k in ("tp_f", "act_f"):
                    out[k + "_last"] += out[k] - before[k]
                    out[k] = before[k]
            if keep_einsums:
                einsums.append((op.name, fwd, bl, br))
        elif op.kind == OpKind.ATTENTION:
            # scores/context: activation x activation, local once heads and batch are split
            # (GQA: each chip reads only the KV heads its query heads need); book inference.md
            sh = _shard(op.out.dims, rules, False, mesh_sizes)
            fl = op.flops / op.count * seqs_mb / op.sizes["batch"] / sh
            by = sum(
                _spec(t, rules).local_bytes(sizes, mesh_sizes)
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
                kv_b = _spec(op.inputs[1], rules).local_bytes(sizes, mesh_sizes)
                out["sp_base"] += copies * comm(CollectiveKind.ALL_GATHER, kv_b, ("seq",))
        else:
            # elementwise ops and the embedding gather: memory-bound, sharded like their output
            sh = _shard(op.out.dims, rules, False, mesh_sizes)
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
            b = _spec(xe, rules).local_bytes(sizes, mesh_sizes)
            out["ep_base"] += copies * comm(CollectiveKind.ALL_TO_ALL, b, ("expert",))

    # pipeline hop: one microbatch's activations to the next stage
    x_local = _spec(
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
        per = w.elements(op.sizes) / _shard(w.dims, rules, True, mesh_sizes)
        params_local = params_local + per * (np.ceil(op.count / pp) if layer_op else 1)
        if layer_op:
            weight_gathered = (
                weight_gathered + per * mesh_sizes["fsdp"] * dtype_bytes(w.dtype) * op.count
            )
    out["params_local"] = params_local
    out["gathered"] = np.where(mesh_sizes["fsdp"] > 1, 2 * weight_gathered / model.n_layers, 0.0)
    for i, r in enumerate(remat_list):
        out[f"saved_{i}"] = np.broadcast_to(
            np.asarray(_saved_local_bytes(led, r, rules, seqs_mb, mesh_sizes, model), float), (n,)
        )
    out["one_layer"] = np.broadcast_to(
        np.asarray(
            _saved_local_bytes(led, Remat(RematKind.NONE), rules, seqs_mb, mesh_sizes, model), float
        ),
        (n,),
    )
    out["logits"] = (
        seqs_mb
        * workload.seq_len
        * model.vocab
        * 4.0
        / _shard(("batch", "seq", "vocab"), rules, False, mesh_sizes)
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
    and reduced once (see `_add_comms`), so once one projection pays the AllReduce (or
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


# The last projection of each layer type: its output only feeds the residual stream.
LAST_PROJECTIONS = ("mlp/down", "moe/down", "moe/shared/down")


def _add_comms(
    ep: EinsumPlan, block: str, copies: Any, out: dict, counted: dict, merge: bool
) -> None:
    """Add the chosen option's collectives to the step's buckets, counting shared ones once."""
    choice = np.asarray(ep.choice)
    for oi, o in enumerate(ep.options):
        sel = choice == oi
        if not np.any(sel):
            continue
        for c in o.comms:
            b = _bucket(c, block)
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


def _saved_local_bytes(
    led: Ledger, remat: Remat, rules: Rules, seqs_mb: Any, mesh: Mapping[str, Any], model: ModelSpec
) -> Any:
    """Saved activation bytes per layer per chip for one microbatch (see memory.py)."""
    kind = remat.kind
    if kind in (RematKind.FULL, RematKind.CHECKPOINTS):
        n = 1 if kind == RematKind.FULL else remat.n
        x = _spec(
            Tensor("x", ("batch", "seq", "embed"), led.ops[1].out.dtype), rules, block_io=True
        )
        return n * x.local_bytes(
            {"batch": seqs_mb, "seq": led.sizes["seq"], "embed": model.d_model}, mesh
        )
    total: Any = 0.0
    seen: set[tuple[str, str]] = set()
    for op in led:
        if op.name in ("embed", "unembed", "norms"):
            continue
        blk = op.name.split("/")[0]
        if kind == RematKind.MATMULS:
            ts = [op.out] if op.kind == OpKind.MATMUL else []
        else:
            ts = [t for t in op.inputs if not t.is_param] + (
                [op.out] if op.kind == OpKind.MATMUL else []
            )
        for t in ts:
            if t.name in ("s", "p") or (blk, t.name) in seen:
                continue
            seen.add((blk, t.name))
            total = (
                total
                + _spec(t, rules).local_bytes(_sizes(op, seqs_mb), mesh) * op.count / model.n_layers
            )
    return total


# --------------------------------------------------------------------------------------
# One plan, with the details
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """One plan's training step: time, memory per chip (breakdown), MFU, run time and cost."""

    plan: Plan
    system: System
    workload: Workload
    step_time_s: float
    compute_time_s: float
    exposed_comm_time_s: float
    bubble_time_s: float
    bubble_fraction: float
    optimizer_time_s: float
    comm_time_s: Mapping[str, float]
    exposed_time_s: Mapping[str, float]
    memory_per_chip_bytes: float
    memory_breakdown: Mapping[str, float]
    fits: bool
    reason: str
    mfu: float
    hfu: float
    tokens_per_s: float
    flops_per_chip: float
    model_flops: float
    efficiency: Efficiency
    collectives: tuple[dict, ...] = ()

    @property
    def bottleneck(self) -> str:
        """The largest term of the step: compute, a communication bucket, bubble, or optimizer."""
        terms = {
            "compute": self.compute_time_s,
            "pipeline bubble": self.bubble_time_s,
            "optimizer update": self.optimizer_time_s,
        }
        for k, v in self.exposed_time_s.items():
            terms[f"exposed {k} communication"] = v
        return max(terms, key=lambda k: terms[k])

    @property
    def run_time_s(self) -> float:
        return self.workload.total_tokens / self.tokens_per_s if self.workload.total_tokens else 0.0

    @property
    def run_cost_usd(self) -> float | None:
        price = self.system.usd_per_chip_hour
        return None if price is None else self.run_time_s / 3600 * self.system.n_chips * price

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "step_time_s": self.step_time_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tokens_per_s": self.tokens_per_s,
            "memory_per_chip_bytes": self.memory_per_chip_bytes,
            "memory_breakdown": dict(self.memory_breakdown),
            "hbm_bytes": self.system.chip.hbm_bytes,
            "fits": self.fits,
            "reason": self.reason,
            "compute_time_s": self.compute_time_s,
            "exposed_comm_time_s": self.exposed_comm_time_s,
            "comm_time_s": dict(self.comm_time_s),
            "exposed_time_s": dict(self.exposed_time_s),
            "bubble_fraction": self.bubble_fraction,
            "bubble_time_s": self.bubble_time_s,
            "optimizer_time_s": self.optimizer_time_s,
            "bottleneck": self.bottleneck,
            "run_time_s": self.run_time_s,
            "run_time_days": self.run_time_s / DAY,
            "run_cost_usd": self.run_cost_usd,
            "flops_per_chip_per_step": self.flops_per_chip,
            "model_flops_per_step": self.model_flops,
            "efficiency": {
                "name": self.efficiency.name,
                "matmul": self.efficiency.matmul,
                "hbm": self.efficiency.hbm,
                "link": self.efficiency.link,
                "source": self.efficiency.source,
            },
            "collectives": list(self.collectives),
        }


def structure_of(plan: Plan, model: ModelSpec) -> Structure:
    active = frozenset(s for s in Strategy if getattr(plan.degrees, s.value) > 1)
    kv_rep = plan.degrees.tp > 1 and model.mla is None and model.n_kv_heads % plan.degrees.tp != 0
    return Structure(active, plan.remat, plan.sequence_parallel, plan.collective_matmul, kv_rep)


def candidates_of(plan: Plan) -> Candidates:
    d = plan.degrees
    return Candidates(
        {s: np.array([getattr(d, s.value)]) for s in Strategy},
        np.array([plan.microbatches]),
        np.array([plan.zero]),
        np.array([list(Schedule).index(plan.schedule)]),
        np.array([plan.virtual_stages]),
    )


def check_plan(model: ModelSpec, system: System, workload: Workload, plan: Plan) -> list[str]:
    """Reasons (possibly none) why a plan cannot run, before costing it."""
    d = plan.degrees
    out = []
    if d.n_chips != system.n_chips:
        out.append(
            f"plan uses {d.n_chips} chips ({plan.describe()}) but the system has {system.n_chips}"
        )
    seqs = workload.sequences
    batch_ways = d.dp * d.fsdp * d.ep
    if seqs != int(seqs) or int(seqs) % (batch_ways * plan.microbatches):
        out.append(
            f"batch of {seqs:g} sequences is not divisible by dp·fsdp·ep·microbatches = {batch_ways * plan.microbatches}"
        )
    if workload.seq_len % d.sp:
        out.append(f"sequence length {workload.seq_len} is not divisible by sp={d.sp}")
    if model.n_heads % d.tp:
        out.append(f"heads={model.n_heads} are not divisible by tp={d.tp}")
    if model.d_ff % d.tp:
        out.append(f"d_ff={model.d_ff} is not divisible by tp={d.tp}")
    if d.pp > model.n_layers:
        out.append(f"pp={d.pp} is more pipeline stages than layers={model.n_layers}")
    if d.ep > 1 and (model.moe is None or model.moe.n_experts % d.ep):
        out.append(
            "ep>1 needs a MoE model"
            if model.moe is None
            else f"experts={model.moe.n_experts} are not divisible by ep={d.ep}"
        )
    if (
        d.pp > 1
        and plan.schedule == Schedule.INTERLEAVED
        and model.n_layers % (d.pp * plan.virtual_stages)
    ):
        out.append(
            f"layers={model.n_layers} are not divisible by pp·virtual={d.pp * plan.virtual_stages}"
        )
    return out


def step_terms(
    model: ModelSpec,
    system: System,
    workload: Workload,
    plan: Plan,
    *,
    efficiency: Efficiency | None = None,
    ops: tuple[str, ...] | None = None,
) -> dict[str, float]:
    """Raw per-step terms of one plan, before any overlap: `t_math_s` (FLOPs / peak, the book's
    T_math) and the communication time of each bucket (fsdp, grad_mb, grad_step, tp, sp, ep, act, pp).

    No divisibility checks: the book's closed forms are continuous in the batch.
    """
    from roofline.specs.efficiency import PEAK

    eff = efficiency or PEAK
    r = evaluate_plans(
        model,
        system,
        workload,
        structure_of(plan, model),
        candidates_of(plan),
        eff=eff,
        optimizer=plan.optimizer,
        ops=ops,
    )
    out = {
        "t_math_s": float(r.flops_per_chip[0]) / (system.chip.peak("bf16") * eff.matmul),
        "compute_time_s": float(r.compute_time_s[0]),
    }
    out.update({k: float(v[0]) for k, v in r.terms.items()})
    out.update({k: float(v[0]) for k, v in r.comm.items()})
    out["comm_time_s"] = sum(float(v[0]) for v in r.comm.values())
    return out


def balance_batch(
    model: ModelSpec,
    system: System,
    plan: Plan,
    *,
    seq: int = 1,
    buckets: tuple[str, ...] | None = None,
    phase: str = "step",
    ops: tuple[str, ...] | None = None,
    efficiency: Efficiency | None = None,
    probe_tokens: float = 2.0**20,
) -> float:
    """Global batch (tokens) at which T_math equals the communication time (below it: comms-bound).

    `phase`: "forward" compares forward FLOPs with forward collectives (the book's FSDP and TP
    rooflines), "backward" backward FLOPs with backward collectives incl. gradient reductions
    (the book's DP roofline), "step" the whole step; `buckets` restricts the communication to
    some buckets (e.g. ("grad_step",) for the DCN data-parallel reduction). Both sides are
    affine in the batch for the book's strategies (weights move a fixed amount, activations an
    amount ∝ B), so two evaluations of the algebra give the crossing exactly.
    """
    if phase not in ("forward", "backward", "step"):
        raise PlanError(
            f"phase {phase!r}",
            rule="phase is forward, backward or step",
            fix="write phase='forward'",
        )

    def terms(b: float) -> tuple[float, float]:
        t = step_terms(model, system, Workload(b, seq), plan, efficiency=efficiency, ops=ops)
        if buckets is not None:
            comm = sum(t[k] for k in buckets)
        else:
            comm = t["comm_time_s"] if phase == "step" else t[f"comm_{phase}_s"]
        math_t = t["t_math_s"] if phase == "step" else t[f"t_math_{phase}_s"]
        return math_t, comm

    b1, b2 = probe_tokens, 2 * probe_tokens
    m1, c1 = terms(b1)
    m2, c2 = terms(b2)
    dm, dc = (m2 - m1) / (b2 - b1), (c2 - c1) / (b2 - b1)
    if dm <= dc:
        return math.inf  # communication grows as fast as compute: never compute-bound
    return max(0.0, (c1 - m1) / (dm - dc) + b1)


def evaluate_plan(
    model: ModelSpec,
    system: System,
    workload: Workload,
    plan: Plan,
    *,
    efficiency: Efficiency | None = None,
    assume_mfu: float | None = None,
) -> StepCost:
    """Cost one plan. Raises PlanError if it cannot run at all (indivisible, wrong chip count)."""
    problems = check_plan(model, system, workload, plan)
    if problems:
        raise PlanError(
            f"plan {plan.describe()} cannot run: " + "; ".join(problems),
            rule="every sharded dimension splits evenly and the mesh uses every chip",
            fix="change the degrees (e.g. run `roofline train` without --plan to search)",
        )
    eff = efficiency or default_efficiency(system.chip.vendor)
    r = evaluate_plans(
        model,
        system,
        workload,
        structure_of(plan, model),
        candidates_of(plan),
        eff=eff,
        optimizer=plan.optimizer,
        keep_einsums=True,
    )

    def f(a: Any) -> float:
        return float(np.asarray(a).reshape(-1)[0])

    step = f(r.step_time_s)
    tokens_s = f(r.tokens_per_s)
    mfu = f(r.mfu)
    if assume_mfu is not None:
        if not 0 < assume_mfu <= 1:
            raise PlanError(
                f"--assume-mfu {assume_mfu}",
                rule="MFU is a fraction in (0, 1]",
                fix="write e.g. --assume-mfu 0.4",
            )
        step = r.model_flops / (system.n_chips * system.chip.peak("bf16") * assume_mfu)
        tokens_s = workload.batch_tokens / step
        mfu = assume_mfu
    colls = _collective_rows(r.einsums)
    reason = r.reason[0]
    return StepCost(
        plan,
        system,
        workload,
        step,
        f(r.compute_time_s),
        f(r.exposed_comm_time_s),
        f(r.bubble_time_s),
        f(r.bubble_fraction),
        f(r.optimizer_time_s),
        MappingProxyType({k: f(v) for k, v in r.comm.items()}),
        MappingProxyType({k: f(v) for k, v in r.exposed.items()}),
        f(r.memory_total),
        MappingProxyType({k: f(v) for k, v in r.memory.items()}),
        not bool(r.infeasible[0]),
        reason,
        mfu,
        f(r.hfu) if assume_mfu is None else assume_mfu,
        tokens_s,
        f(r.flops_per_chip),
        r.model_flops,
        eff,
        colls,
    )


def _collective_rows(einsums: tuple) -> tuple[dict, ...]:
    rows = []
    for name, *plans in einsums:
        for p in plans:
            for c in p.best.comms:
                rows.append(
                    {
                        "op": name,
                        "phase": c.phase,
                        "kind": c.kind.value,
                        "axes": list(c.axes),
                        "tensor": c.tensor,
                        "bytes_per_chip": float(np.asarray(c.bytes_per_chip).reshape(-1)[0]),
                        "time_s": float(np.asarray(c.time_s).reshape(-1)[0]),
                        "before": c.before,
                        "after": c.after,
                    }
                )
    return tuple(rows)


def assumed_mfu_run(
    model: ModelSpec, workload: Workload, n_chips: int, peak_flops_per_s: float, mfu: float
) -> dict[str, float]:
    """Back-of-envelope run: 6·N·tokens / (chips · peak · MFU) (book applied-training.md)."""
    flops = 6.0 * count_params(model).total * workload.total_tokens
    t = flops / (n_chips * peak_flops_per_s * mfu)
    return {"total_flops": flops, "run_time_s": t, "run_time_days": t / DAY}


def parse_tokens(text: str | float) -> float:
    return parse_quantity(text, what="tokens")


_ = math
