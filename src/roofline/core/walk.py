"""The walk: the sharded-einsum algebra applied to every ledger row once, as typed records.

For a (model, mesh family, phase) every ledger row becomes per-chip records (docs/
architecture.md, "The walk"):

- `OpRecord` per op and pass (forward, d_lhs, d_rhs): op class, compute dtype, per-chip
  FLOPs and HBM bytes, compute and memory seconds, the per-chip GEMM (matmuls), how many
  copies (layers on the fullest pipeline stage) run per microbatch, and which remat
  policies rerun its forward;
- `CollectiveRecord` per collective: kind, mesh axes, tensor, bytes and seconds per
  execution, pass, overlap class (weight gather, gradient reduction per microbatch or per
  step, tensor, sequence, expert, pipeline, other), whether it is counted here or with
  another row (x gathered once for Q, K and V; a block's partial dx reduced once), and
  whether a step without remat may skip it (a backward re-gather of a forward FSDP gather);
- `MemoryPieces`: per-chip parameters, gathered FSDP weights and saved activations per
  remat policy, read off the same rows.

Fields are numpy arrays with one entry per row of the mesh family (a single plan is n=1).
Training's timeline, the planner, verify's predictor and inference all read these records;
`Totals` sums them by field, in one place. Phases: `train` walks forward, d_lhs and d_rhs;
`prefill` and `decode` walk the forward pass only (decode reads a KV cache of `kv_seq`).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.core.collectives import CollectiveKind
from roofline.core.cost import CommModel, ComputeModel, mesh_for, unique_rows
from roofline.core.ledger import (
    Ledger,
    Op,
    OpKind,
    Tensor,
    build_ledger,
    moe_bias_rows,
    moe_token_rows,
)
from roofline.core.memory import NON_LAYER_ROWS, reruns_module, saved_bytes
from roofline.core.mesh import Mesh, auto_placed_columns
from roofline.core.pricing import PricingContext, pricing_context, profile_key
from roofline.core.rules import AXIS_OF, AXIS_ORDER, Rules, Strategy, Structure, rules_of
from roofline.core.sharding import (
    CHEAPEST,
    Comm,
    CommFn,
    EinsumPlan,
    GemmShape,
    OptionContext,
    OptionPolicy,
    SizedMemo,
    Spec,
    choice_inputs,
    choose_floats,
    chooses_cheapest,
    plan_einsum,
    plan_training_einsum,
)
from roofline.core.stack import Stack, experts_replicated_over_tensor, stack_of
from roofline.memo import IdentityMemo
from roofline.specs.efficiency import Efficiency
from roofline.specs.framework import Dispatch, LoadBalance, OverlapClass
from roofline.specs.model import ModelSpec
from roofline.specs.plan import (
    Causal,
    ComputeDtypes,
    OpClass,
    Phase,
    Remat,
    RematKind,
    mesh_axes_of,
)
from roofline.specs.system import System
from roofline.units import dtype_bytes


class Pass(enum.StrEnum):
    """A pass of an op: the forward einsum, or one of its two backward einsums (book
    training.md Appendix A: d_lhs = d_out · rhs, d_rhs = lhs · d_out)."""

    FORWARD = "forward"
    D_LHS = "d_lhs"
    D_RHS = "d_rhs"


class Overlap(enum.StrEnum):
    """What a collective overlaps with; the timeline decides per class what is hidden.

    The values are the short names the reports use for each class.
    """

    WEIGHT_GATHER = "fsdp"  # a weight (or its FSDP shard) gathered before its matmul
    GRAD_REDUCE_MB = "grad_mb"  # weight gradients reduced every microbatch (fsdp / expert axes)
    GRAD_REDUCE_STEP = "grad_step"  # weight gradients reduced once per step (data axis)
    TENSOR = "tp"  # activations over the tensor axis (Megatron TP)
    SEQUENCE = "sp"  # activations over the sequence axis (context parallelism)
    EXPERT = "ep"  # token dispatch and combine over the expert axis
    PIPELINE = "pp"  # activations to the next pipeline stage
    OTHER = "other"  # any other activation traffic (e.g. gathers over batch axes)


# The framework profiles' name of each class (specs.framework.OverlapClass).
FRAMEWORK_CLASS: Mapping[Overlap, OverlapClass] = {
    Overlap.WEIGHT_GATHER: OverlapClass.WEIGHT_GATHER,
    Overlap.GRAD_REDUCE_MB: OverlapClass.GRAD_REDUCE,
    Overlap.GRAD_REDUCE_STEP: OverlapClass.GRAD_REDUCE,
    Overlap.TENSOR: OverlapClass.TENSOR,
    Overlap.SEQUENCE: OverlapClass.SEQUENCE,
    Overlap.EXPERT: OverlapClass.EXPERT,
    Overlap.PIPELINE: OverlapClass.PIPELINE,
    Overlap.OTHER: OverlapClass.OTHER,
}


def per_step_gradient(c: Comm) -> bool:
    """A weight-gradient reduction over replicas of the weight (data, context-parallel or, for
    dense weights, expert-parallel ranks), not over its FSDP shards: summed once per step after
    gradient accumulation, not once per microbatch (issue 9 cause 1)."""
    return c.tensor.startswith(("dW", "dw")) and "fsdp" not in c.axes


def overlap_class(c: Comm) -> Overlap:
    """The overlap class of a collective the algebra chose (the one home of the rule)."""
    t = c.tensor
    if t.startswith(("dW", "dw")):
        if "fsdp" in c.axes:
            return Overlap.GRAD_REDUCE_MB  # FSDP reduce-scatters every microbatch
        return Overlap.GRAD_REDUCE_STEP  # replicas (data, seq, expert) sum once per step
    if t.startswith(("W", "w_")):
        return Overlap.WEIGHT_GATHER
    if c.kind == CollectiveKind.ALL_TO_ALL and "expert" in c.axes:
        return Overlap.EXPERT
    if "tensor" in c.axes:
        return Overlap.TENSOR
    if "seq" in c.axes:
        return Overlap.SEQUENCE
    return Overlap.OTHER


NO_RERUN: frozenset[RematKind] = frozenset()


@dataclass(frozen=True)
class OpRecord:
    """One pass of one ledger op on one chip (per execution; `copies` executions per microbatch)."""

    op: str
    pass_: Pass
    op_class: OpClass
    dtype: str
    copies: Any
    flops_per_chip: Any
    # HBM bytes per chip; None for a matmul, whose chosen option holds them (read on demand:
    # picking them per candidate costs the planner time it does not need)
    hbm_bytes: Any
    compute_s: Any
    memory_s: Any
    rerun_by: frozenset[RematKind] = NO_RERUN
    einsum: EinsumPlan | None = field(default=None, repr=False, compare=False)
    # fixed seconds per kernel launch (the profile's `kernel_overhead_s`): one launch per op
    # per pass, whatever bounds the kernel (a grouped expert GEMM is one launch)
    launch_s: Any = 0.0

    @property
    def hbm_bytes_per_chip(self) -> Any:
        if self.hbm_bytes is None and self.einsum is not None:
            return self.einsum.hbm_bytes_per_chip
        return self.hbm_bytes

    @property
    def time_s(self) -> Any:
        """The op's roofline max(compute, memory), plus its kernel launch."""
        return np.maximum(self.compute_s, self.memory_s) + self.launch_s

    def gemm(self) -> GemmShape | None:
        """The per-chip GEMM (m, n, k, count) of a matmul's chosen option (None otherwise)."""
        if self.einsum is None:
            return None
        return self.einsum.gemm_shape(self.einsum.sizes, self.einsum.mesh)


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective of one op's pass (per execution; `copies` executions per microbatch).

    `chosen`: the option holding it was chosen (masks per row); `counted`: it is paid here
    (not with another row); `time_s` is zero where it is not counted. `reusable`: a backward
    re-gather of a weight the forward gathered, which a step without remat skips.
    """

    op: str
    einsum: str  # forward | d_lhs | d_rhs | kv-gather | dispatch | combine | hop
    pass_: Pass
    kind: CollectiveKind
    axes: tuple[str, ...]
    tensor: str
    dtype: str
    overlap: Overlap
    bytes_per_chip: Any
    time_s: Any
    copies: Any
    rerun_by: frozenset[RematKind] = NO_RERUN
    chosen: Any = True
    counted: Any = True
    reusable: Any = False
    before: str = ""
    after: str = ""
    why: str = ""

    @property
    def backward(self) -> bool:
        return self.pass_ != Pass.FORWARD


@dataclass(frozen=True)
class MemoryPieces:
    """Per-chip memory the mesh decides (one microbatch, arrays per row)."""

    params_local: Any  # parameter elements on the fullest stage
    weights_gathered_bytes: Any  # every layer's weights after the FSDP gather (bytes)
    saved_per_layer: Mapping[Remat, Any]  # activation bytes one layer keeps, by remat policy
    logits_bytes: Any  # the fp32 logits of one microbatch
    expert_params_local: Any = 0.0  # the routed experts' share of params_local


@dataclass(frozen=True)
class Walk:
    """Everything the algebra says about one phase of a family of plans (arrays per row)."""

    phase: Phase
    n: int
    ops: tuple[OpRecord, ...]
    collectives: tuple[CollectiveRecord, ...]
    memory: MemoryPieces | None
    mesh_reason: np.ndarray  # "" where the mesh fits the topology
    einsums: tuple = ()  # (op name, forward[, d_lhs, d_rhs]) EinsumPlans when kept

    @property
    def mesh_bad(self) -> np.ndarray:
        return self.mesh_reason != ""


def cheapest_at(walk: Walk, row: int) -> bool:
    """Whether every einsum of `walk` chose, at `row`, the option the algebra's own rule
    (`Cheapest`) picks from the same costs (`sharding.chooses_cheapest`). Every einsum the
    walk plans is a matmul pass's (its record's `einsum`, the merged backward's where the
    block's reductions were merged), and a later einsum's costs depend only on the choices
    before it (the reductions paid), so where this holds the walk of the same row under
    `Cheapest` makes every choice alike: the same walk."""
    return all(chooses_cheapest(r.einsum, row) for r in walk.ops if r.einsum is not None)


# --------------------------------------------------------------------------------------
# Sums by field (the one place records are added up)
# --------------------------------------------------------------------------------------


# The routed experts' own rows: what Megatron's fine-grained MoE schedule runs as its `mlp`
# node between the dispatch and the combine (NVIDIA/Megatron-LM@d98e8a64
# megatron/core/models/gpt/fine_grained_callables.py submodule_moe_forward: the grouped expert
# MLP; attention, router and shared experts are its `pre_dispatch_computation`, :67-148).
ROUTED_EXPERT_ROWS = frozenset({"moe/gate", "moe/up", "moe/act", "moe/down"})


@dataclass(frozen=True)
class Totals:
    """A walk's records summed per microbatch (× copies), by the fields the readers need.

    `compute_s` / `flops` by (forward?, rerun_by); `comm_s` by (overlap, forward?, rerun_by);
    `reusable_s` by overlap (the backward re-gathers a no-remat step skips).
    """

    compute_s: Mapping[tuple[bool, frozenset[RematKind]], Any]
    flops: Mapping[tuple[bool, frozenset[RematKind]], Any]
    comm_s: Mapping[tuple[Overlap, bool, frozenset[RematKind]], Any]
    reusable_s: Mapping[Overlap, Any]
    # compute seconds by (forward?, rerun_by, op class): the windows collectives hide behind
    compute_class_s: Mapping[tuple[bool, frozenset[RematKind], OpClass], Any] = field(
        default_factory=dict
    )
    # compute seconds of the rows outside the layer stack (embedding, LM head), all passes
    edge_s: Any = 0.0
    # compute seconds of the routed experts' rows (ROUTED_EXPERT_ROWS) by (forward?, rerun_by)
    expert_s: Mapping[tuple[bool, frozenset[RematKind]], Any] = field(default_factory=dict)

    @staticmethod
    def of(walk: Walk) -> Totals:
        """The sums of `walk`; a remembered single-plan walk's (`walk_rows`) are summed once."""
        if walk.n != 1:
            return Totals._of(walk)
        return _ONE_TOTALS((walk,), (), lambda: Totals._of(walk))

    @staticmethod
    def _of(walk: Walk) -> Totals:
        compute: dict = {}
        by_class: dict = {}
        experts: dict = {}
        edge: Any = 0.0
        flops: dict = {}
        for r in walk.ops:
            k = (r.pass_ == Pass.FORWARD, r.rerun_by)
            t = r.copies * r.time_s
            compute[k] = compute.get(k, 0.0) + t
            if r.op in ROUTED_EXPERT_ROWS:
                experts[k] = experts.get(k, 0.0) + t
            kc = (*k, r.op_class)
            by_class[kc] = by_class.get(kc, 0.0) + t
            if r.op in NON_LAYER_ROWS:
                edge = edge + t
            flops[k] = flops.get(k, 0.0) + r.copies * r.flops_per_chip
        shape = (walk.n,)  # arrays per row, also where a single plan's walk ran on floats
        if walk.n != 1:
            comm, reusable = _comm_sums(walk.collectives, shape)
        else:  # a repriced walk shares its template's collectives: summed once
            colls = walk.collectives
            comm, reusable = _COMM_SUMS((colls,), (), lambda: _comm_sums(colls, shape))
        return Totals(
            _rows(compute, shape),
            _rows(flops, shape),
            comm,
            reusable,
            _rows(by_class, shape),
            np.broadcast_to(np.asarray(edge, float), shape),
            _rows(experts, shape),
        )


def _comm_sums(colls: tuple[CollectiveRecord, ...], shape: tuple[int]) -> tuple[dict, dict]:
    """`Totals.comm_s` and `Totals.reusable_s` of a walk's collectives."""
    comm: dict = {}
    reusable: dict = {}
    for c in colls:
        t = c.copies * c.time_s
        k2 = (c.overlap, not c.backward, c.rerun_by)
        comm[k2] = comm.get(k2, 0.0) + t
        if np.any(c.reusable):
            reusable[c.overlap] = reusable.get(c.overlap, 0.0) + np.where(c.reusable, t, 0.0)
    return _rows(comm, shape), _rows(reusable, shape)


def _rows(d: dict, shape: tuple[int]) -> dict:
    return {k: np.broadcast_to(np.asarray(v, float), shape) for k, v in d.items()}


# --------------------------------------------------------------------------------------
# Sharding the ledger's tensors
# --------------------------------------------------------------------------------------


# (id(rules), tensor, block_io) -> (rules, spec): the rules kept, so an id cannot be reused by
# other rules while its entry lives
_SPECS: dict[tuple[int, Tensor, bool], tuple[Rules, Spec]] = {}
_MAX_SPECS = 1 << 16


def spec_of(t: Tensor, rules: Rules, *, block_io: bool = False) -> Spec:
    """The sharded array of a ledger tensor under `rules` (an axis is used once per array).

    `block_io`: a layer's input or output between blocks, which Megatron sequence parallelism
    splits along the sequence over the tensor axis. Remembered per (rules, tensor): the walk
    asks again for every plan of a structure (`_rules_of` keeps one Rules per structure).
    """
    key = (id(rules), t, block_io)
    hit = _SPECS.get(key)
    if hit is not None and hit[0] is rules:
        return hit[1]
    if len(_SPECS) >= _MAX_SPECS:
        _SPECS.clear()
    spec = _spec_of(t, rules, block_io)
    _SPECS[key] = (rules, spec)
    return spec


def _spec_of(t: Tensor, rules: Rules, block_io: bool) -> Spec:
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
    "unembed",
)
# the router scores each token where it is: under sequence parallelism on the rank's slice of
# the sequence (Megatron-Core moe/router.py runs on the sequence-parallel hidden states; the
# token dispatcher gathers over the tensor ranks only after routing)
_BLOCK_OUTPUT_OPS = ("attn/out", "mlp/down", "moe/shared/down", "moe/router")


def op_specs(op: Op, rules: Rules) -> tuple[Spec, Spec, Spec]:
    lhs_t, rhs_t = op.inputs
    lhs = spec_of(lhs_t, rules, block_io=op.name in _BLOCK_INPUT_OPS)
    rhs = spec_of(rhs_t, rules)
    out = spec_of(op.out, rules, block_io=op.name in _BLOCK_OUTPUT_OPS)
    return lhs, rhs, out


def op_sizes(op: Op, sequences: Any) -> dict[str, Any]:
    """The op's dim sizes for `sequences` per microbatch (the ledger row is for batch=1).

    The MoE capacity (tokens per expert) scales with the batch like every other size.
    """
    s: dict[str, Any] = dict(op.sizes)
    s["batch"] = sequences
    if "capacity" in s:
        s["capacity"] = op.sizes["capacity"] * sequences / op.sizes["batch"]
    return s


def shard_factor(
    dims: tuple[str, ...], rules: Rules, is_param: bool, mesh: Mapping[str, Any]
) -> Any:
    """How many ways an array of these dims is split (product of its distinct mesh axes)."""
    n: Any = 1.0
    used: set[str] = set()
    for d in dims:
        for a in rules.axes_for(d, is_param):
            if a not in used:
                used.add(a)
                n = n * mesh[a]
    return n


# --------------------------------------------------------------------------------------
# Shared collectives: what one block pays once
# --------------------------------------------------------------------------------------


class SharedCollectives:
    """Collectives a block pays once however many of its einsums ask for them.

    - the same array gathered the same way is gathered once per pass (x for q, k and v);
    - the partial input-gradients of one block are summed, then reduced once (dq, dk, dv -> dx).

    Masks are per row (a row's einsums may choose different options).
    """

    def __init__(self) -> None:
        self.gathers: dict[tuple[str, str, str, str, str], Any] = {}
        self.reductions: dict[tuple[str, str, CollectiveKind, tuple[str, ...], str], Any] = {}

    def count(self, c: Comm, block: str, sel: Any, merge: bool) -> tuple[Any, Any]:
        """(counted, reusable) masks for collective `c` of an option chosen where `sel`."""
        no = np.zeros_like(sel)
        if c.kind == CollectiveKind.ALL_GATHER and not c.tensor.startswith("d"):
            key = (block, c.tensor, c.before, c.after, c.phase)
            prev = self.gathers.get(key, no)
            add = sel & ~prev
            self.gathers[key] = prev | sel
            reusable = no
            if c.phase == "backward" and c.tensor.startswith(("W", "w_")):
                fwd = self.gathers.get((block, c.tensor, c.before, c.after, "forward"), no)
                reusable = add & fwd
            return add, reusable
        if (
            merge
            and c.tensor.startswith("dx")
            and c.kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)
        ):
            key2 = (block.split("/")[0], c.tensor, c.kind, c.axes, c.phase)
            prev = self.reductions.get(key2, no)
            self.reductions[key2] = prev | sel
            return sel & ~prev, no
        return sel, no

    def paid_reductions(self, block: str, dx: str) -> dict[tuple[CollectiveKind, tuple], Any]:
        prefix = block.split("/")[0]
        return {
            (k[2], k[3]): v
            for k, v in self.reductions.items()
            if k[0] == prefix and k[1] == dx and k[4] == "backward"
        }


# --------------------------------------------------------------------------------------
# The walk
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlgebraPricing:
    """How the algebra prices an einsum's options: collectives, matmul FLOP/s, HBM bytes/s.

    Training prices on the system through the efficiency profile (`for_system`); verify
    prices with its own compute-first rule (see verify/predict.py).
    """

    comm: CommFn
    compute: ComputeModel | None  # None: the record times are the algebra's own
    peak_flops_per_s: float
    hbm_bw_bytes_per_s: float
    vector_flops_per_s: float = 1.0
    vector_hbm_bytes_per_s: float | None = None  # elementwise kernels' bandwidth (default: hbm)
    # the stack's and the cost model's answers, resolved once (None: built for this walk)
    context: PricingContext | None = None

    @property
    def launch_s(self) -> float:
        """Fixed seconds per kernel launch (0 without a compute model or for TPUs)."""
        return 0.0 if self.compute is None else self.compute.kernel_overhead_s

    def matmul_peak(self, dtype: str) -> float:
        """The FLOP/s the algebra ranks an einsum's options with (a large GEMM in `dtype`)."""
        if self.compute is None:
            return self.peak_flops_per_s
        if self.context is not None and self.context.compute is self.compute:
            return self.context.matmul_peak(dtype)
        return self.compute.matmul_flops_per_s(dtype)

    def attention_peak(self, dtype: str, backward: bool, head_dim: float) -> Any:
        if self.compute is None:
            return self.peak_flops_per_s
        if self.context is not None and self.context.compute is self.compute:
            return self.context.attention_flops_per_s(dtype, backward, head_dim)
        return self.compute.attention_flops_per_s(dtype, backward, head_dim)


@dataclass(frozen=True)
class WalkOptions:
    """How the walk treats the rows (defaults are training's)."""

    dtypes: ComputeDtypes = ComputeDtypes()
    policy: OptionPolicy = CHEAPEST
    keep_einsums: bool = False  # keep the EinsumPlans (single plans; reports)
    merge_reductions: bool = True  # a block's partial dx reduced once (see SharedCollectives)
    trusted: bool = True  # specs come from rules: skip the algebra's input checks
    choices: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (op, pass) -> option
    remats: tuple[Remat, ...] = ()  # remat policies to count saved activations for
    stack: Stack | None = None  # the framework profile applied (None: the idealised machine)
    eager: bool = False  # elementwise rows as the stack's eager kernels (Plan.compiled False)
    host_syncs: bool = True  # the MoE layers' host syncs are paid (not under Plan.cuda_graph)
    # the MoE output reduced over the tensor axis once per layer, after the weighted combine of
    # the routed experts plus the shared expert (`_Walker.combine_reduce`: the inference engines);
    # False: each down projection reduces its own output (Megatron's alltoall dispatcher
    # reduce-scatters the expert outputs before the combine)
    moe_combine_reduce: bool = False
    # a walk of one row runs on Python floats, not 1-element arrays (numpy's cost per call is
    # most of a single plan's time); its records then hold floats, which `Totals` broadcasts
    # to the row — for readers that broadcast (training's timeline), not those that index
    floats: bool = False


# the fewest rows a walk shares its sized quantities between einsums at (`SizedMemo`)
SIZED_MEMO_ROWS = 64


class _CommShare:
    """The share of a collective's time one microbatch's option choice carries: a per-step
    gradient sum is paid once for the M microbatches of a step (`step_share` = 1/M)."""

    __slots__ = ("step_share", "_per_step")

    def __init__(self, step_share: Any) -> None:
        self.step_share = step_share
        self._per_step: dict[tuple[str, tuple[str, ...]], bool] = {}  # per_step_gradient

    def __call__(self, c: Comm) -> Any:
        key = (c.tensor, c.axes)
        per_step = self._per_step.get(key)
        if per_step is None:
            per_step = self._per_step[key] = per_step_gradient(c)
        return self.step_share if per_step else 1.0


class _Walker:
    """State of one walk: the rows' meshes, pricing, rules, and the records so far."""

    def __init__(
        self, model, ledger, rules, mesh_sizes, sequences, phase, pricing, opts, pp, mb, scale_up
    ):
        self.model, self.ledger, self.rules = model, ledger, rules
        self.op_names = frozenset(o.name for o in ledger.ops)
        self.mesh, self.seqs, self.phase = mesh_sizes, sequences, phase
        self.pricing, self.opts, self.pp = pricing, opts, pp
        self.stack = stack_of(opts.stack)
        ctx = pricing.context
        if ctx is None or ctx.stack is not self.stack or ctx.compute is not pricing.compute:
            ctx = PricingContext(self.stack, pricing.compute)
        self.ctx = ctx  # what the walk asks per op, resolved once per (stack, profile, chip)
        self.scale_up = scale_up  # GPUs per NVLink domain per row (0: a TPU torus; None: unknown)
        # the option choice prices a per-step gradient sum once per step: 1/M per microbatch
        self.comm_share = _CommShare(1.0 / np.asarray(mb, float))
        self.shared = SharedCollectives()
        # a family walk's sized arrays, collectives and splits, shared by its einsums (a walk
        # of a few rows computes them faster than it would look them up)
        many = not opts.floats and np.size(sequences) >= SIZED_MEMO_ROWS
        self.sized = SizedMemo() if many else None
        self.same: dict[tuple, tuple[EinsumPlan, ...]] = {}
        self.ops: list[OpRecord] = []
        self.colls: list[CollectiveRecord] = []
        self.einsums: list[tuple] = []
        self.tape: _Tape | None = None  # set to record what the records owe the rates
        self.passes = (Pass.FORWARD,) if phase != Phase.TRAIN else tuple(Pass)

    # -- per op -------------------------------------------------------------------------
    def rerun_by(self, op: Op) -> frozenset:
        """The remat kinds the stack reruns `op` under, plus the partial recomputes (MODULES
        remats, held as the `Remat` itself) of the walk's policies that rerun it."""
        kinds = self.ctx.rerun_by(op)
        mods = [r for r in self.opts.remats if reruns_module(op, r)]
        return kinds | frozenset(mods) if mods else kinds

    def copies(self, op: Op) -> Any:
        """Copies of a row on the fullest pipeline stage (stages may be uneven)."""
        if op.name in NON_LAYER_ROWS:
            return np.ones_like(np.asarray(self.pp, float))
        return np.ceil(op.count / self.pp)

    def visit(self, op: Op) -> None:
        sizes = op_sizes(op, self.seqs)
        copies = self.copies(op)
        if op.kind == OpKind.MATMUL:
            self.matmul(op, sizes, copies)
        elif op.kind == OpKind.ATTENTION:
            self.attention(op, sizes, copies)
        else:
            self.elementwise(op, sizes, copies)
        if op.name == "moe/down" and self.opts.moe_combine_reduce:
            self.combine_reduce(op, sizes, copies)
        if op.name == "moe/up":
            self.host_sync(op, copies)
            if "expert" in self.rules.activations.get("experts", ()):
                self.dispatch(op, sizes, copies)

    def host_sync(self, op: Op, copies: Any) -> None:
        """The GPU idle of one routed-expert layer forward while the host waits on the device
        for the tokens each expert received (`Stack.moe_host_sync_s`; rerun with the layer;
        the step hides it under the EP-overlap schedule, training.step._host_idle)."""
        idle = self.stack.moe_host_sync_s
        if idle and self.opts.host_syncs:
            rr = self.rerun_by(op)
            self.ops.append(
                OpRecord(
                    "moe/host_sync", Pass.FORWARD, OpClass.HOST_SYNC, op.out.dtype, copies,
                    0.0, 0.0, 0.0, 0.0, rr, launch_s=idle,
                )
            )  # fmt: skip

    def matmul(self, op: Op, sizes: dict, copies: Any) -> None:
        op_class = OpClass.EXPERT_GEMM if "experts" in op.inputs[1].dims else OpClass.DENSE_GEMM
        dtype = self.opts.dtypes.for_op(op.name, op_class).value
        plans = list(self.plan(op, sizes, dtype))
        chosen = list(plans)  # as the policy chose them (a pinned choice keeps their times)
        for i, label in enumerate(self.passes):
            idx = self.opts.choices.get((op.name, label.value))
            if idx is not None:
                plans[i] = plans[i].with_choice(idx)
        block = op.name.rsplit("/", 1)[0]
        if self.phase == Phase.TRAIN and self.opts.merge_reductions:
            merged = self.merged_dlhs(plans[1], block, sizes, dtype, op)
            if merged is not plans[1]:
                plans[1] = chosen[1] = merged
        if self.opts.keep_einsums:
            self.einsums.append((op.name, *plans))
        reruns = self.rerun_by(op)
        for label, ep, base in zip(self.passes, plans, chosen, strict=True):
            if label == Pass.D_RHS and op.frozen_rhs:
                continue  # the second operand takes no gradient (Op.frozen_rhs)
            rr = reruns if label == Pass.FORWARD else NO_RERUN
            shape = gemm_shape_of(ep, self.pricing.compute)
            rec = self.op_record(op, label, op_class, dtype, copies, ep, rr, shape)
            self.ops.append(rec)
            if self.tape is not None:
                self.tape.gemm(rec, base, ep, shape, _rate_class(op, op_class))
            self.einsum_collectives(op, label, ep, block, copies, rr, dtype)
        if self.phase == Phase.TRAIN and dtype in _QUANTISED and not self.stack.book:
            self.quantise(op, sizes, dtype, copies, reruns)

    def quantise(self, op: Op, sizes: dict, dtype: str, copies: Any, reruns) -> None:
        """The casts of a low-precision GEMM's activation operands (Transformer Engine's
        cast-transpose kernels): forward, the 16-bit input x is read once and written in the
        narrow format twice, row- and column-wise (the forward GEMM reads one, the weight
        gradient the other); backward, the output gradient dy likewise (dgrad and wgrad read
        one each). 2 + 2·b bytes per element, b the format's bytes (fp8 1; fp4 as NVFP4,
        0.5 + 1/16 with its scales). Weights are cast once per step (not here).
        An input quantised by the fused norm before it (TE LayerNormLinear: q/k/v and the
        dense MLP's fc1) or already quantised for its twin (gate and up read the same x, so do
        q, k and v) is not cast again; the router stays in high precision (no cast).

        MXFP8 under Transformer Engine (`_UNFUSED_NORM_CASTS`, `_PER_GROUP_CASTS`): the norm
        writes 16 bits and a separate cast follows, each cast also writes one E8M0 scale per 32
        elements per layout, and a grouped GEMM's operand is cast expert by expert (one launch
        per local expert)."""
        if op.name in _NO_QUANT_OPS:
            return
        narrow = dtype_bytes(_SCALED_FORMAT.get(dtype, dtype))
        x_norm = op.name in _NORM_FUSED_INPUTS
        # gate reads up's x; k and v read q's (Megatron's one fused linear_qkv)
        x_twin = (op.name.endswith("/gate") and op.name[:-4] + "up" in self.op_names) or (
            op.name in ("attn/k", "attn/v") and "attn/q" in self.op_names
        )
        te = self.stack.framework.precision.saves_quantised_inputs  # the TE stacks' mark
        scaling = self.opts.dtypes.scaling if te else ""
        narrow += _BLOCK_SCALE_BYTES.get(scaling, 0.0)
        per_elem = dtype_bytes(op.inputs[0].dtype) + 2.0 * narrow
        per_expert = op.routed and scaling in _PER_GROUP_CASTS
        if per_expert:  # one cast per local expert
            local = op.sizes["experts"] / shard_factor(("experts",), self.rules, True, self.mesh)
        pairs = [(Pass.D_LHS, op.out)]
        if not x_twin and not (x_norm and scaling not in _UNFUSED_NORM_CASTS):
            pairs.append((Pass.FORWARD, op.inputs[0]))
        for label, t in pairs:
            s = spec_of(t, self.rules)
            elems = s.local_bytes(sizes, self.mesh) / dtype_bytes(t.dtype)
            by = elems * per_elem
            rr = reruns if label == Pass.FORWARD else NO_RERUN
            name = op.name + "/quantise"
            rec = self.vector_record(
                name, label, OpClass.ELEMENTWISE, dtype, copies, 0.0 * by, by, rr
            )
            if per_expert:
                rec = replace(rec, launch_s=rec.launch_s * local)
            self.ops.append(rec)

    def vector_record(
        self, name: str, label: Pass, cls: OpClass, dtype: str, copies, fl, by, rr
    ) -> OpRecord:
        """A memory-bound kernel (elementwise, gather, cast): FLOPs at the vector units' rate,
        bytes at the profile's vector-kernel HBM bandwidth, one launch."""
        p = self.pricing
        comp = fl / p.vector_flops_per_s
        mem = by / (p.vector_hbm_bytes_per_s or p.hbm_bw_bytes_per_s)
        rec = OpRecord(name, label, cls, dtype, copies, fl, by, comp, mem, rr, launch_s=p.launch_s)
        if self.tape is not None:
            self.tape.recipes[id(rec)] = (_VECTOR, fl)
        return rec

    def combine_axes(self) -> tuple[str, ...]:
        """The tensor axes the MoE layer's down projections leave partial sums over (the routed
        experts' width under expert tensor parallelism, the shared expert's width under tp)."""
        dims = ["expert_mlp"] + (["mlp"] if "moe/shared/down" in self.op_names else [])
        return tuple(
            dict.fromkeys(
                a for d in dims for a in self.rules.axes_for(d, True) if a == AXIS_OF[Strategy.TP]
            )
        )

    def combine_reduce(self, op: Op, sizes: dict, copies: Any) -> None:
        """The MoE layer's one tensor-parallel AllReduce, of its output x[batch, seq, embed]
        after the weighted combine: vLLM's fused_moe (and SGLang's, TensorRT-LLM's) computes each
        token's top_k expert outputs with the expert width split over the tensor ranks, sums them
        with the router weights into [tokens, embed] and adds the shared expert's partial output
        before one all-reduce (vllm-project/vllm vllm/model_executor/models/deepseek_v2.py,
        DeepseekV2MoE.forward: maybe_all_reduce_tensor_model_parallel on final_hidden_states) —
        1/top_k of the bytes of reducing the routed outputs before the combine. The sum is in
        the 16-bit hidden-state dtype whatever the GEMMs compute in: fused_moe writes its output
        like its input hidden states (vllm/model_executor/layers/fused_moe/fused_moe.py,
        fused_experts_impl: out_hidden_states = torch.empty_like(hidden_states)); fp8 / fp4
        quantise only each GEMM's input."""
        axes = self.combine_axes()
        if not axes:
            return
        dt = op.out.dtype if dtype_bytes(op.out.dtype) >= 2 else "bf16"
        x = spec_of(Tensor("x", ("batch", "seq", "embed"), dt), self.rules)
        b = x.local_bytes(sizes, self.mesh)
        t = self.pricing.comm(CollectiveKind.ALL_REDUCE, b, axes)
        rr = self.rerun_collective(self.rerun_by(op), Overlap.TENSOR, CollectiveKind.ALL_REDUCE)
        self.colls.append(
            CollectiveRecord(
                op.name, "combine", Pass.FORWARD, CollectiveKind.ALL_REDUCE, axes, "x", dt,
                Overlap.TENSOR, b, t, copies, rr,
                before=str(replace(x, unreduced=axes)), after=str(x),
                why="MoE output (routed experts combined + shared expert) summed over the tensor axis",
            )
        )  # fmt: skip

    def plan(self, op: Op, sizes: dict, dtype: str) -> tuple[EinsumPlan, ...]:
        """The forward (and, training, both backward) einsums; identical einsums (gate and up)
        are planned once. Under `moe_combine_reduce` the MoE down projections keep their partial
        sums (reduced once after the combine, `combine_reduce`)."""
        lhs, rhs, out = op_specs(op, self.rules)
        if self.opts.moe_combine_reduce and op.name in ("moe/down", "moe/shared/down"):
            part = tuple(a for d in op.contracting for a in rhs.axes_of(d))
            out = replace(out, unreduced=tuple(a for a in self.combine_axes() if a in part))
        key = (lhs, rhs, out, tuple(sorted((k, v) for k, v in op.sizes.items() if k != "batch")))
        if key not in self.same:
            p = self.pricing
            kw = dict(
                peak_flops_per_s=p.matmul_peak(dtype),
                hbm_bw_bytes_per_s=p.hbm_bw_bytes_per_s,
                check_divisible=False,
                trusted=self.opts.trusted,
                policy=self.policy(op),
                weights=_weight_names(op),
                weight_read_fraction=self.weight_read_fraction(op),
                comm_share=self.comm_share,
                sized=self.sized,
            )
            if self.phase == Phase.TRAIN:
                eps = plan_training_einsum(lhs, rhs, out, sizes, self.mesh, p.comm, **kw)
                phases = ("forward", "backward", "backward")
            else:
                eps = (plan_einsum(lhs, rhs, out, sizes, self.mesh, p.comm, **kw),)
                phases = ("forward",)
            if self.tape is not None:
                for ep, ph in zip(eps, phases, strict=True):
                    self.tape.choice(ep, ph, dtype, kw["policy"], kw["weights"], self)
            self.same[key] = eps
        return self.same[key]

    def policy(self, op: Op) -> Any:
        """The stack's option policy for the op; routed experts whole on every tensor rank
        (capacity split over the tensor axis: `rules.moe_rules`) treat it as a replica axis."""
        policy = self.ctx.policy(self.opts.policy, op.name)
        if op.routed and "tensor" in self.rules.activations.get("capacity", ()):
            return experts_replicated_over_tensor(policy)
        return policy

    def rerun_collective(self, reruns: frozenset[RematKind], cls: Overlap, c_kind) -> Any:
        """The remat kinds that rerun a collective of class `cls` inside an op they rerun."""
        return self.ctx.rerun_collective(reruns, FRAMEWORK_CLASS[cls], c_kind)

    def weight_read_fraction(self, op: Op) -> Any:
        """Share of a weight one pass reads from HBM: 1, or for a routed-expert row the
        expected distinct experts the microbatch's tokens chose (ledger.Op)."""
        if not op.routed:
            return 1.0
        return op.weight_read_fraction_at(self.seqs * op.sizes["seq"])

    def merged_dlhs(
        self, bl: EinsumPlan, block: str, sizes: dict, dtype: str, op: Op
    ) -> EinsumPlan:
        """Re-plan a d_lhs einsum knowing which reductions of the block's dx are already paid.

        The partial input-gradients of one block (dq, dk, dv -> dx; gate and up -> dx) are
        summed and reduced once, so once one projection pays the AllReduce (or ReduceScatter)
        of dx over some axes, the next one's reduction over them is free — and the option
        that reduces becomes the cheap one. Without this each einsum would choose alone (e.g.
        gather dk and W_k rather than reduce), which neither XLA nor a fused projection does.
        """
        if not bl.options or not bl.options[0].out.name.startswith("dx"):
            return bl
        paid = self.shared.paid_reductions(block, bl.options[0].out.name)
        if not paid:
            return bl
        comm = self.pricing.comm

        def comm_paid(kind: CollectiveKind, b: Any, axes: tuple[str, ...]) -> Any:
            t = comm(kind, b, axes)
            m = paid.get((kind, tuple(axes)))
            return t if m is None else np.where(m, 0.0, t)

        p = self.pricing
        policy, weights = self.ctx.policy(self.opts.policy, op.name), _weight_names(op)
        ep = plan_einsum(
            bl.lhs,
            bl.rhs,
            bl.out,
            sizes,
            self.mesh,
            comm_paid,
            peak_flops_per_s=p.matmul_peak(dtype),
            hbm_bw_bytes_per_s=p.hbm_bw_bytes_per_s,
            phase="backward",
            check_divisible=False,
            trusted=self.opts.trusted,
            policy=policy,
            weights=weights,
            weight_read_fraction=self.weight_read_fraction(op),
            comm_share=self.comm_share,
            sized=self.sized,
        )
        if self.tape is not None:
            self.tape.choice(ep, "backward", dtype, policy, weights, self)
        return ep

    def touched_experts(self, op: Op) -> Any:
        """Expected distinct routed experts one chip's slice of a routed row touches per pass:
        the expected distinct experts of the pass's tokens over the chip's share of them."""
        local = op.sizes["experts"] / shard_factor(("experts",), self.rules, True, self.mesh)
        return self.weight_read_fraction(op) * local

    def op_record(self, op, label, op_class, dtype, copies, ep, reruns, shape) -> OpRecord:
        """A matmul pass's record; `shape` its GEMM where the profile prices by shape. A taped
        walk leaves such a record's compute seconds to `_Tape.fill` (one call of the
        efficiency curve for all its shapes)."""
        memory_s = ep.memory_time_s
        cm = self.pricing.compute
        if shape is not None and self.tape is not None:
            compute_s = None
        else:
            rate = (
                None
                if shape is None
                else self.ctx.gemm_flops_per_s(_rate_class(op, op_class), dtype, shape)
            )
            compute_s = gemm_compute_s(ep, rate)
        if shape is not None and not op.batched:
            if op.routed and cm.expert_overhead_s and dtype_bytes(op.weight.dtype) >= 1:
                memory_s = memory_s + self.touched_experts(op) * cm.expert_overhead_s
            # once per MoE layer pass (on its last routed row, where the combine runs): the
            # 4-bit-expert path's own kernels beyond the walked rows (Efficiency.w4_moe_overhead_s)
            if op.name == "moe/down" and cm.w4_moe_overhead_s and dtype_bytes(op.weight.dtype) < 1:
                memory_s = memory_s + cm.w4_moe_overhead_s
        return OpRecord(
            op.name,
            label,
            op_class,
            dtype,
            copies,
            ep.flops_per_chip,
            None,
            compute_s,
            memory_s,
            reruns,
            ep,
            self.pricing.launch_s,
        )

    def narrow_gather(self, c: Comm, cls: Overlap, dtype: str, array_dtype: str) -> float:
        """Bytes of a tensor-parallel all-gather of a quantised GEMM against its array's dtype:
        the narrow format's share where the stack casts before gathering
        (`Precision.tp_gathers_quantised`: torchao's Float8 TP styles gather the block input,
        and in backward the output gradient, in float8); 1 otherwise (reduce-scatters, other
        axes, 16-bit GEMMs, stacks that gather 16-bit). The collective's whole time scales
        with it (the large activation gathers of TP are bandwidth-bound)."""
        if (
            cls != Overlap.TENSOR
            or c.kind != CollectiveKind.ALL_GATHER
            or dtype not in _QUANTISED
            or self.stack.book
            or not self.stack.framework.precision.tp_gathers_quantised
        ):
            return 1.0
        return min(1.0, dtype_bytes(_SCALED_FORMAT.get(dtype, dtype)) / dtype_bytes(array_dtype))

    def einsum_collectives(self, op, label, ep, block, copies, reruns, dtype: str = "") -> None:
        """Records for the collectives of every option chosen on some row (`dtype`: the GEMM's
        compute dtype, for the stacks that gather its inputs narrow, `narrow_gather`)."""
        choice = ep.choice
        one = type(choice) is int  # a single plan: only its option has records
        # the options some row chose, in order (a family's rows choose a few of ~10-30)
        used = [choice] if one else _chosen_options(choice, len(ep.options))
        for oi in used:
            o = ep.options[oi]
            sel = np.True_ if one else np.asarray(choice) == oi
            for c in o.comms:
                counted, reusable = self.shared.count(c, block, sel, self.opts.merge_reductions)
                cls = overlap_class(c)
                # remat reruns a forward collective with its op as the stack says; weights are
                # gathered once for the recompute and the backward pass (a backward re-gather)
                rr = self.rerun_collective(reruns, cls, c.kind)
                array_dtype = _dtype_of(c, ep)
                narrow = self.narrow_gather(c, cls, dtype, array_dtype)
                self.colls.append(
                    CollectiveRecord(
                        op.name,
                        label.value,
                        label,
                        c.kind,
                        tuple(c.axes),
                        c.tensor,
                        _SCALED_FORMAT.get(dtype, dtype) if narrow < 1.0 else array_dtype,
                        cls,
                        c.bytes_per_chip * narrow,
                        np.where(counted, c.time_s * narrow, 0.0),
                        copies,
                        rr,
                        sel,
                        counted,
                        reusable,
                        c.before,
                        c.after,
                        c.why,
                    )
                )

    def attention(self, op: Op, sizes: dict, copies: Any) -> None:
        """Scores / context: activation x activation, local once heads and batch are split
        (GQA: each chip reads only the KV heads its query heads need); book inference.md."""
        rules, mesh = self.rules, self.mesh
        sh = shard_factor(op.out.dims, rules, False, mesh)
        fl = op.flops / op.count * self.seqs / op.sizes["batch"] / sh
        by = sum(
            spec_of(t, rules).local_bytes(sizes, mesh)
            for t in (*op.inputs, op.out)
            if not t.on_chip
        )
        dtype = self.opts.dtypes.attention.value
        p = self.pricing
        head_dim = op.sizes.get("head_dim", 0.0)
        mem = by / p.hbm_bw_bytes_per_s
        flash, imbalance = self.stack.flash_attention, self.cp_imbalance(op)
        for label in self.passes:  # the backward pass: two contractions of the same size
            fwd = label == Pass.FORWARD
            recipe = (_ATTENTION, fl, dtype, not fwd, head_dim, flash, imbalance)
            comp = attention_compute_s(p, self.ctx, *recipe[1:])
            rr = self.rerun_by(op) if fwd else NO_RERUN
            rec = OpRecord(
                op.name, label, OpClass.ATTENTION, dtype, copies, fl, by, comp, mem, rr,
                launch_s=p.launch_s,
            )  # fmt: skip
            self.ops.append(rec)
            if self.tape is not None:
                self.tape.recipes[id(rec)] = recipe
        if op.name.startswith("attn/scores") and "seq" in rules.activations.get("seq", ()):
            self.context_parallel(op, sizes, copies)

    def elementwise(self, op: Op, sizes: dict, copies: Any) -> None:
        """Elementwise ops and the embedding gather: memory-bound, sharded like their output.

        An elementwise op reads and writes its tensors once, each sharded by its own spec (a
        norm's weight vector does not grow with the batch); the gather reads and writes the
        rows of its output."""
        # norms and residual adds act on the residual stream, which Megatron sequence
        # parallelism keeps split over the tensor axis (that is what SP shards)
        io = op.name in _STREAM_OPS
        out = spec_of(op.out, self.rules, block_io=io)
        sh = _prod_axes(out, self.mesh)
        fl = op.flops / op.count / op.sizes["batch"] * self.seqs / sh
        if op.kind == OpKind.GATHER:
            by = op.bytes / op.count / op.sizes["batch"] * self.seqs / sh
        else:
            by = sum(
                spec_of(t, self.rules, block_io=io and not t.is_param).local_bytes(sizes, self.mesh)
                for t in (*op.inputs, op.out)
                if not t.on_chip
            )
        cls = OpClass.EMBEDDING if op.kind == OpKind.GATHER else OpClass.ELEMENTWISE
        if self.opts.eager:  # uncompiled: the row's eager kernels move more bytes
            by = by * self.stack.eager_traffic(op.name)
        rr = self.rerun_by(op)
        rec = self.vector_record(op.name, Pass.FORWARD, cls, op.out.dtype, copies, fl, by, rr)
        self.ops.append(rec)
        if self.phase == Phase.TRAIN:  # one backward pass: the gradient of the input (the table)
            back = Pass.D_RHS if cls == OpClass.EMBEDDING else Pass.D_LHS
            self.ops.append(replace(rec, pass_=back, rerun_by=NO_RERUN))
            if self.tape is not None:
                self.tape.recipes[id(self.ops[-1])] = self.tape.recipes[id(rec)]

    def context_parallel(self, op: Op, sizes: dict, copies: Any) -> None:
        """K and V gathered along the sequence before attention (forward, rerun with attention
        under remat) and their gradients reduce-scattered back (backward). V is priced with
        K's shard (the same size for GQA/MHA)."""
        k = op.inputs[1]
        s = spec_of(k, self.rules)
        b = s.local_bytes(sizes, self.mesh)
        shard = str(replace(s, axes=_with_seq(s)))
        fwd_rr = self.rerun_collective(
            self.rerun_by(op), Overlap.SEQUENCE, CollectiveKind.ALL_GATHER
        )
        why = "context parallelism: K/V gathered along the sequence"
        t_ag = self.pricing.comm(CollectiveKind.ALL_GATHER, b, ("seq",))
        t_rs = self.pricing.comm(CollectiveKind.REDUCE_SCATTER, b, ("seq",))
        for name in (k.name, "v"):
            t = t_ag
            self.colls.append(
                CollectiveRecord(
                    op.name,
                    "kv-gather",
                    Pass.FORWARD,
                    CollectiveKind.ALL_GATHER,
                    ("seq",),
                    name,
                    k.dtype,
                    Overlap.SEQUENCE,
                    b,
                    t,
                    copies,
                    fwd_rr,
                    before=shard,
                    after=str(s),
                    why=why,
                )
            )
            if self.phase == Phase.TRAIN:
                t = t_rs
                self.colls.append(
                    CollectiveRecord(
                        op.name,
                        "kv-gather",
                        Pass.D_RHS,
                        CollectiveKind.REDUCE_SCATTER,
                        ("seq",),
                        "d" + name,
                        k.dtype,
                        Overlap.SEQUENCE,
                        b,
                        t,
                        copies,
                        before=str(s),
                        after=shard,
                        why="context parallelism: dK/dV reduce-scattered along the sequence",
                    )
                )

    def dispatch(self, op: Op, sizes: dict, copies: Any) -> None:
        """MoE dispatch and combine: AllToAll over the expert axis (book gpus.md, expert
        parallelism), forward (rerun with the expert matmuls under remat) and backward."""
        xe = Tensor("xe", ("experts", "capacity", "embed"), op.inputs[0].dtype)
        s = spec_of(xe, self.rules)
        b = s.local_bytes(sizes, self.mesh) * self.dispatch_share(op)
        t = self.pricing.comm(CollectiveKind.ALL_TO_ALL, b, ("expert",))
        why = "MoE dispatch/combine over the expert axis"
        for label in self.passes[:2]:
            rr = NO_RERUN
            if label == Pass.FORWARD:
                rr = self.rerun_collective(
                    self.rerun_by(op), Overlap.EXPERT, CollectiveKind.ALL_TO_ALL
                )
            for name in ("dispatch", "combine"):
                self.colls.append(
                    CollectiveRecord(
                        op.name,
                        name,
                        label,
                        CollectiveKind.ALL_TO_ALL,
                        ("expert",),
                        "xe",
                        xe.dtype,
                        Overlap.EXPERT,
                        b,
                        t,
                        copies,
                        rr,
                        before="[tokens, embed] sharded over the batch axes",
                        after=str(s),
                        why=why,
                    )
                )

    def edge_params(self, edges: list[Any]) -> Any:
        """Embedding and LM-head parameters on the fullest stage: both without a pipeline; with
        one, the first stage holds the embedding and the last the head, so a stack that lays
        out its stages (not the idealised machine, which keeps both) holds the larger one."""
        both = _edge_sum(edges)
        if self.stack.book or not edges:
            return both
        one = edges[0]
        for e in edges[1:]:
            one = np.maximum(one, e)
        return np.where(np.asarray(self.pp, float) > 1, one, both)

    def cp_imbalance(self, op: Op) -> Any:
        """Causal attention under context parallelism with contiguous sequence chunks: rank i
        attends to i+1 chunks, so the last of sp ranks does (2·sp − 1)/sp of the average work
        and the others wait for it. Zigzag / striped layouts (every stack's) balance it."""
        sp = np.asarray(self.mesh.get("seq", 1.0), float)
        causal = op.flop_factor < 1.0  # the ledger counts the causal half
        if not causal or self.stack.cp_load_balance != LoadBalance.NONE:
            return 1.0
        return np.where(sp > 1, (2 * sp - 1) / sp, 1.0)

    def dispatch_share(self, op: Op) -> Any:
        """The share of (tokens × top_k × d_model) per chip the dispatch really moves.

        - Under Megatron sequence parallelism each tensor rank dispatches its own sequence
          shard of the tokens (Megatron-Core MoE token dispatchers, torchtitan's TP+EP), not
          the whole microbatch: 1/tp.
        - A dispatcher that sends a token once per destination node and forwards it over
          NVLink there (DeepEP, Megatron's flex dispatcher) moves, across nodes, the expected
          number of distinct nodes its top_k experts sit on, N·(1 − (1 − 1/N)^k), not k
          copies (N: the NVLink domains the expert group spans; uniform routing).
        - Group-limited routing (DeepSeek-V3 n_group 8 / topk_group 4, on in a stack with
          node-limited routing) picks a token's experts inside its best topk_groups of
          n_groups contiguous expert groups: they reach at most R = topk_groups · max(1,
          N / n_groups) nodes, and N is replaced by min(N, R) above (DeepSeek-V3 Technical
          Report §2.1.2: each token is sent to at most M = 4 nodes).
        """
        share: Any = 1.0
        tp = np.asarray(self.mesh.get("tensor", 1.0), float)
        # with expert tensor parallel size 1 (rules.moe_rules) the dispatched tokens' sharding
        # already splits them over the tensor axis, and the expert-parallel ranks are
        # consecutive: Megatron-LM parallel_state.py builds the expert groups with its own
        # RankGenerator(tp=expert_tensor_parallel_size, ep=..., order "tp-cp-ep-dp-pp")
        etp1 = "tensor" in self.rules.activations.get("capacity", ())
        if self.rules.sequence_parallel and not etp1:
            share = share / tp
        if self.stack.dispatch == Dispatch.DEEPEP and self.scale_up is not None:
            k = float(op.sizes.get("top_k", 1.0))
            ep = np.asarray(self.mesh.get("expert", 1.0), float)
            stride = np.asarray(self.mesh.get("seq", 1.0), float) * (1.0 if etp1 else tp)
            per_node = np.clip(self.scale_up / stride, 1.0, ep)
            nodes = np.where(self.scale_up > 0, ep / per_node, 1.0)
            reach = np.minimum(nodes, self.route_reach(nodes))
            distinct = reach * (1.0 - (1.0 - 1.0 / reach) ** k)
            share = share * np.where(nodes > 1, np.minimum(distinct, k) / k, 1.0)
        return share

    def route_reach(self, nodes: Any) -> Any:
        """The nodes one token's experts can lie on under group-limited routing (the experts'
        groups are contiguous, as the expert ranks are): topk_groups groups of n_groups, each
        spanning max(1, nodes / n_groups) nodes; unlimited without it."""
        moe = self.model.moe
        if moe is None or moe.n_groups <= 1 or not self.stack.node_limited_routing:
            return nodes
        return moe.topk_groups * np.maximum(1.0, nodes / moe.n_groups)

    # -- per step -----------------------------------------------------------------------
    def pipeline_hop(self, seq: float) -> None:
        """One microbatch's activations to the next stage (a permute over the stage axis)."""
        if "stage" not in self.rules.activations.get("layers", ()):
            return
        x = spec_of(Tensor("x", ("batch", "seq", "embed"), "bf16"), self.rules, block_io=True)
        b = x.local_bytes({"batch": self.seqs, "seq": seq, "embed": self.model.d_model}, self.mesh)
        t = self.pricing.comm(CollectiveKind.PERMUTE, b, ("stage",))
        self.colls.append(
            CollectiveRecord(
                "pipeline",
                "hop",
                Pass.FORWARD,
                CollectiveKind.PERMUTE,
                ("stage",),
                "x",
                "bf16",
                Overlap.PIPELINE,
                b,
                t,
                1.0,
                why="activations to the next pipeline stage",
            )
        )

    def saved_scale(self, op: Op, t: Tensor, attn_outs: set[str]) -> float:
        """Bytes a saved tensor takes against its 16-bit size: a quantised GEMM's activation
        input is kept for the weight gradient in the narrow format where the stack saves it so
        (Transformer Engine: `Precision.saves_quantised_inputs`; fp8 1 B, NVFP4 0.5625 B);
        an attention output is kept in 16-bit by the attention kernel too, so its narrow copy
        comes on top."""
        if (
            op.kind != OpKind.MATMUL
            or t is not op.inputs[0]
            or op.name in _NO_QUANT_OPS
            or self.stack.book
            or not self.stack.framework.precision.saves_quantised_inputs
        ):
            return 1.0
        op_class = OpClass.EXPERT_GEMM if "experts" in op.inputs[1].dims else OpClass.DENSE_GEMM
        dtype = self.opts.dtypes.for_op(op.name, op_class).value
        if dtype not in _QUANTISED:
            return 1.0
        narrow = dtype_bytes(_SCALED_FORMAT.get(dtype, dtype)) / dtype_bytes(t.dtype)
        return 1.0 + narrow if t.name in attn_outs else narrow

    def memory(self, seq: float) -> MemoryPieces:
        rules, mesh, led, m = self.rules, self.mesh, self.ledger, self.model
        params_local: Any = 0.0
        experts: Any = 0.0
        gathered: Any = 0.0
        edges: list[Any] = []
        for op in led:
            w = op.weight
            if w is None:
                continue
            per = w.elements(op.sizes) / shard_factor(w.dims, rules, True, mesh)
            if op.name in NON_LAYER_ROWS:
                edges.append(per)
                continue
            params_local = params_local + per * self.copies(op)
            if "experts" in w.dims:
                experts = experts + per * self.copies(op)
            gathered = gathered + per * mesh["fsdp"] * dtype_bytes(w.dtype) * op.count
        params_local = params_local + self.edge_params(edges)
        x_sizes = {"batch": self.seqs, "seq": led.sizes["seq"], "embed": m.d_model}

        def local(op: Op | None, t: Tensor) -> Any:
            if op is None:
                return spec_of(t, rules, block_io=True).local_bytes(x_sizes, mesh)
            # under sequence parallelism a block's input and output are kept sharded over the
            # tensor axis (Megatron saves the sharded input and gathers it again backward)
            io = (op.name in _BLOCK_INPUT_OPS and t is op.inputs[0]) or (
                op.name in _BLOCK_OUTPUT_OPS and t is op.out
            )
            b = spec_of(t, rules, block_io=io).local_bytes(op_sizes(op, self.seqs), mesh)
            return b * self.saved_scale(op, t, attn_outs)

        attn_outs = {op.out.name for op in led if op.kind == OpKind.ATTENTION}

        remats = dict.fromkeys((*self.opts.remats, Remat(RematKind.NONE)))
        keeps_x = not self.stack.book  # a real stack's MATMULS policy keeps the layer input
        saved = {
            r: saved_bytes(led, r, local, keeps_layer_input=keeps_x) / m.n_layers for r in remats
        }
        logits = (
            self.seqs
            * seq
            * m.vocab
            * 4.0
            / shard_factor(("batch", "seq", "vocab"), rules, False, mesh)
        )
        return MemoryPieces(params_local, gathered, saved, logits, experts)


# elementwise rows on the residual stream (split over tensor under sequence parallelism)
_STREAM_OPS = ("norms", "residual")
# low-precision GEMM formats whose activation operands Transformer Engine casts (walk.quantise)
_QUANTISED = ("fp8", "fp4")
_SCALED_FORMAT = {"fp4": "nvfp4"}  # NVFP4: fp4 values with one fp8 scale per 16
# GEMM inputs quantised inside the fused norm before them (TE LayerNormLinear), and the router
_NORM_FUSED_INPUTS = ("attn/q", "attn/k", "attn/v", "attn/q_a", "attn/kv_a", "mlp/up", "mlp/gate")
_NO_QUANT_OPS = ("moe/router",)
# Transformer Engine's MXFP8 casts (walk.quantise). NVIDIA/TransformerEngine@d0067d0d
# transformer_engine/pytorch/csrc/extensions/normalization.cpp layernorm_fwd / rmsnorm_fwd: the
# norm and the cast are one kernel (FULLY_FUSED) for delayed-scaling FP8 only; an MXFP8 quantizer
# runs UNFUSED (the norm writes 16 bits, then quantizer->quantize) unless NVTE_NORM_FWD_USE_CUDNN
# is set. extensions/cast.cpp multi_tensor_quantize_impl: "only have fused kernel for FP8 delayed
# scaling" (nvte_multi_cast_transpose), other quantizers quantize each tensor individually, as
# split_quantize does for GroupedLinear's per-expert inputs and output gradients. Megatron-Bridge
# 26.04.01 ran these per-expert casts (NVIDIA-NeMo/Megatron-Bridge issue #2885, labelled
# 26.04.01, "Unfused expert GEMMs and cast functions"; grouped MXFP8 quantisation came for 26.06).
# MXFP8 writes one E8M0 (1-byte) scale per 32 elements in each layout (OCP MX v1.0).
# Current scaling (an amax pass over the input before each cast, quantizer.cpp
# Float8CurrentScalingQuantizer::quantize_impl) is not charged: priced so, the held-out error by
# source rose from 5.6% to 6.2% (issue 19, s7-moe report).
_UNFUSED_NORM_CASTS = ("mx",)
_PER_GROUP_CASTS = ("mx",)
_BLOCK_SCALE_BYTES = {"mx": 1.0 / 32.0}


def _chosen_options(choice: Any, n: int) -> list[int]:
    """The indices of the options some row of `choice` (an index per row) names, ascending."""
    c = np.asarray(choice)
    if c.dtype.kind == "i" and c.size and c.min() >= 0:
        return np.flatnonzero(np.bincount(c.ravel(), minlength=n)[:n]).tolist()
    return [oi for oi in range(n) if np.any(c == oi)]


def _prod_axes(s: Spec, mesh: Mapping[str, Any]) -> Any:
    n: Any = 1.0
    for a in s.used_axes:
        n = n * mesh[a]
    return n


def _edge_sum(edges: list[Any]) -> Any:
    return sum(edges, start=0.0)


def _weight_names(op: Op) -> frozenset[str]:
    """The operand names that are the op's parameter (and its gradient)."""
    w = op.weight
    return frozenset() if w is None else frozenset({w.name, "d" + w.name})


def _dtype_of(c: Comm, ep: EinsumPlan) -> str:
    """The dtype of the collective's array: the einsum operand or output it names."""
    for s in (ep.lhs, ep.rhs, ep.out):
        if s.name == c.tensor:
            return s.dtype
    return ep.out.dtype


def _with_seq(s: Spec) -> tuple[tuple[str, ...], ...]:
    """The axes of `s` with kv_seq split over `seq` (the K/V shard before the gather)."""
    return tuple((("seq",) if d == "kv_seq" else ax) for d, ax in zip(s.dims, s.axes, strict=True))


# --------------------------------------------------------------------------------------
# Compute seconds from the profile's rates (one home: the walk and its repricing)
# --------------------------------------------------------------------------------------


def gemm_shape_of(ep: EinsumPlan, compute: ComputeModel | None) -> GemmShape | None:
    """The per-chip GEMM of a matmul's chosen option where the profile prices GEMMs by shape
    (None where it prices them at the large-GEMM rate the option choice used)."""
    if compute is None or not compute.shape_dependent:
        return None
    return ep.gemm_shape(ep.sizes, ep.mesh)


def gemm_compute_s(ep: EinsumPlan, rate: Any) -> Any:
    """A matmul pass's compute seconds: its FLOPs at the profile's `rate` for its GEMM shape
    (None: the large-GEMM rate its option choice used)."""
    if rate is None:
        return ep.compute_time_s
    return ep.flops_per_chip / rate


def attention_compute_s(
    p: AlgebraPricing,
    ctx: PricingContext,
    fl: Any,
    dtype: str,
    backward: bool,
    head_dim: Any,
    flash: bool,
    imbalance: Any,
) -> Any:
    """An attention pass's compute seconds: the stack's flash kernel at the profile's attention
    rate, or without one batched GEMMs (QK^T and PV) at the matmul rate; × the context-parallel
    load imbalance (`_Walker.cp_imbalance`)."""
    if not flash:
        comp = fl / p.matmul_peak(dtype)
    else:
        comp = fl / (p.attention_peak(dtype, backward, head_dim) * ctx.attention_speed(backward))
    return comp * imbalance


_GEMM, _VECTOR, _ATTENTION = "gemm", "vector", "attention"  # kinds of _Tape recipes


def _rate_class(op: Op, op_class: OpClass) -> OpClass:
    """The class a GEMM's rate is read for: a routed-expert row of the dropping path is one
    batched dot at a fixed capacity (`Op.batched`), priced as a dense GEMM, not a grouped one."""
    return OpClass.DENSE_GEMM if op.batched else op_class


class _Tape:
    """What a single-plan float walk's records owe the profile's repriced numbers
    (`core.pricing.REPRICED`): per einsum plan the walk made, its option choice's inputs
    other than the matmul rate (`choose_floats`); per op record, how its compute seconds were
    priced. `ok` is False where the walk left that path (arrays, a keep-einsums walk)."""

    __slots__ = ("plans", "recipes", "peaks", "ok", "at_gemm", "listed", "listed_inputs", "groups")

    def __init__(self) -> None:
        self.plans: dict[int, tuple] = {}
        self.peaks: dict[str, float] = {}  # the matmul rate the choices were made at, by dtype
        self.recipes: dict[int, tuple] = {}
        self.ok = True
        # the records the GEMM fractions price (attention's left None), by those fractions
        self.at_gemm: dict[tuple, list] = {}
        self.listed: list | None = None
        self.listed_inputs: dict[int, tuple] = {}
        self.groups: dict[tuple, tuple[GemmShape, list[int]]] | None = None

    def choice(self, ep: EinsumPlan, phase: str, dtype: str, policy, weights, w: _Walker) -> None:
        """An einsum plan the walk made: what its choice weighed, besides the matmul rate, is
        listed when a repricing first needs it (`inputs`)."""
        if type(ep.choice) is not int or type(ep.compute_time_s) is not float:
            self.ok = False
            return
        why = (phase, policy, weights, w.opts.trusted, w.pricing.hbm_bw_bytes_per_s, w.comm_share)
        self.plans[id(ep)] = (ep, dtype, why)
        self.peaks[dtype] = w.pricing.matmul_peak(dtype)

    def inputs(self, key: int) -> tuple:
        """`choose_floats`' inputs but the rate, for einsum plan `key`: the options' memory
        and choice communication seconds listed once, when a repricing first needs them."""
        hit = self.listed_inputs.get(key)
        if hit is None:
            ep, _, (phase, policy, weights, trusted, bw, share) = self.plans[key]
            memt, commt = choice_inputs(ep.options, bw, share)
            ctx = OptionContext(ep.lhs, ep.rhs, ep.out, phase, ep.options, (), weights)
            hit = self.listed_inputs[key] = (ctx, memt, commt, policy, trusted)
        return hit

    def order(self, walk: Walk) -> list:
        """The recipe of each of `walk`'s records, in order (None: no repriced number)."""
        if self.listed is None:
            self.listed = [self.recipes.get(id(r)) for r in walk.ops]
        return self.listed

    def gemm(
        self, rec: OpRecord, chosen: EinsumPlan, ep: EinsumPlan, shape, rate_class: Any = None
    ) -> None:
        """A matmul pass's record: `ep` its plan, `chosen` the plan as the policy chose it,
        `shape` its GEMM (None: priced at the option choice's rate), `rate_class` the class
        its rate is read for (default the record's)."""
        if id(chosen) not in self.plans:
            self.ok = False
        cls = rec.op_class if rate_class is None else rate_class
        self.recipes[id(rec)] = (_GEMM, id(chosen), ep, cls, rec.dtype, shape)

    def fill(self, walk: Walk, ctx: PricingContext) -> None:
        """Set the compute seconds `_Walker.op_record` left to the tape: each GEMM at its
        shape's rate (`gemm_rates`). The records are the walk's own, not yet handed out: set
        in place."""
        recipes = self.order(walk)
        for i, rate in self.gemm_rates(walk, ctx):
            walk.ops[i].__dict__["compute_s"] = gemm_compute_s(recipes[i][2], rate)

    def gemm_rates(self, walk: Walk, ctx: PricingContext) -> list[tuple[int, Any]]:
        """(index, rate) of each of `walk`'s GEMM records priced by shape: the rates of all
        its shapes from one call of the efficiency curve per (op class, dtype)."""
        out = []
        for (op_class, dtype), (shapes, at) in self.shape_groups(walk).items():
            out += zip(at, ctx.gemm_rates(op_class, dtype, shapes), strict=True)
        return out

    def shape_groups(self, walk: Walk) -> dict[tuple, tuple[GemmShape, list[int]]]:
        """The GEMM shapes of `walk`'s records priced by shape, as arrays per (op class,
        dtype), with the records' indices; listed once."""
        if self.groups is None:
            lists: dict[tuple, tuple[list, list[int]]] = {}
            for i, rc in enumerate(self.order(walk)):
                if rc is not None and rc[0] == _GEMM and rc[5] is not None:
                    dims, at = lists.setdefault((rc[3], rc[4]), ([], []))
                    sh = rc[5]
                    dims.append((sh.m, sh.n, sh.k, sh.count))
                    at.append(i)
            self.groups = {
                k: (GemmShape(*(np.array(c, float) for c in zip(*dims, strict=True))), at)
                for k, (dims, at) in lists.items()
            }
        return self.groups


def walk_ledger(
    model: ModelSpec,
    ledger: Ledger,
    rules: Rules,
    mesh_sizes: Mapping[str, Any],
    sequences: Any,
    *,
    phase: Phase = Phase.TRAIN,
    pricing: AlgebraPricing,
    options: WalkOptions = WalkOptions(),
    mesh_reason: np.ndarray | None = None,
    microbatches: Any = 1.0,
    scale_up: Any = None,
    tape: _Tape | None = None,
) -> Walk:
    """Walk every row of `ledger` under `rules` on meshes of `mesh_sizes` (arrays per row),
    `sequences` per microbatch, `microbatches` per step, on systems whose NVLink domains hold
    `scale_up` GPUs (0 for TPU tori; None: unknown); see the module docstring."""
    pp = mesh_sizes.get("stage", 1.0)
    w = _Walker(
        model,
        ledger,
        rules,
        mesh_sizes,
        sequences,
        phase,
        pricing,
        options,
        pp,
        microbatches,
        scale_up,
    )
    w.tape = tape
    for op in ledger:
        w.visit(op)
    seq = ledger.sizes["seq"]
    w.pipeline_hop(seq)
    memory = w.memory(seq) if phase == Phase.TRAIN else None
    n = max(int(np.size(sequences)), int(np.size(pp)), 1)
    reason = mesh_reason if mesh_reason is not None else np.full(n, "", dtype=object)
    return Walk(phase, n, tuple(w.ops), tuple(w.colls), memory, reason, tuple(w.einsums))


# --------------------------------------------------------------------------------------
# Walking a family of candidate plans on systems
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeshRows:
    """The distinct rows the algebra runs on: a system, the degrees and the microbatches."""

    system_idx: np.ndarray
    degrees: Mapping[Strategy, np.ndarray]
    microbatches: np.ndarray

    def __len__(self) -> int:
        return len(self.microbatches)


@functools.lru_cache(maxsize=256)
def ledger_for(
    model: ModelSpec,
    phase: Phase,
    seq: int,
    kv_seq: int | None = None,
    causal: Causal = Causal.HALF,
    *,
    training_rows: bool = False,
    flash: bool = True,
    eager_expert_bias: bool = False,
) -> Ledger:
    """The ledger a phase walks (batch 1; the walk scales it): training and prefill over `seq`
    query tokens, decode over one new token reading a KV cache of `kv_seq` tokens.

    `training_rows` (a training step of a real stack) adds the memory-bound kernels every
    training step runs that the inference ledger does not hold (`training_ledger_rows`);
    `flash=False` writes the attention scores to HBM (a stack without a flash kernel);
    `eager_expert_bias` (a stack that adds the experts' output bias with eager ops) adds
    `ledger.moe_bias_rows` for a model whose experts carry biases."""
    if phase == Phase.DECODE:
        return build_ledger(model, batch=1, seq=1, kv_seq=kv_seq or seq, causal=causal)
    led = build_ledger(model, batch=1, seq=seq, causal=causal, flash=flash)
    if training_rows and phase == Phase.TRAIN:
        rows = training_ledger_rows(model, led, eager_expert_bias=eager_expert_bias)
        led = replace(led, ops=(*led.ops, *rows))
    return led


def training_ledger_rows(
    model: ModelSpec, led: Ledger, *, eager_expert_bias: bool = False
) -> tuple[Op, ...]:
    """The residual adds (two per layer: after attention and after the MLP; each reads the
    stream and the block output and writes the sum), MoE token permutation (below) and the
    loss (softmax cross-entropy over
    the vocabulary in fp32: the stacks upcast the logits, e.g. Megatron-Core's
    vocab_parallel_cross_entropy and torch's cross_entropy; ~5 FLOPs per logit for max, exp,
    sum, log and the gradient), each a memory-bound kernel forward and backward."""
    dt = led.ops[0].out.dtype if led.ops else "bf16"
    sizes = dict(led.sizes)
    sizes.setdefault("vocab", model.vocab)
    sizes.setdefault("embed", model.d_model)
    x = Tensor("x", ("batch", "seq", "embed"), dt)
    y = Tensor("y", ("batch", "seq", "embed"), dt)
    logits = Tensor("logits", ("batch", "seq", "vocab"), dt)
    probs = Tensor("probs", ("batch", "seq", "vocab"), "fp32")
    rows = [
        Op("residual", OpKind.ELEMENTWISE, (x, y), x, sizes, 2 * model.n_layers, 1.0, 1.0),
        Op("loss", OpKind.ELEMENTWISE, (logits,), probs, sizes, 1, 1.0, 5.0),
    ]
    up = next((o for o in led.ops if o.name == "moe/up"), None)
    if up is not None:
        # MoE token permutation: tokens copied top_k times into expert order before the expert
        # GEMMs and weighted back after them (Megatron-Core moe_utils permute/unpermute,
        # torchtitan's token reorder): memory-bound gathers and scatters of top_k·d per token
        rows += list(moe_token_rows(up, dt))
        if eager_expert_bias and model.moe is not None and model.moe.expert_bias:
            rows += list(moe_bias_rows(up, dt))
    return tuple(rows)


def walk_rows(
    model: ModelSpec,
    systems: list[System],
    structure: Structure,
    rows: MeshRows,
    sequences: float,
    ledger: Ledger,
    eff: Efficiency,
    *,
    phase: Phase = Phase.TRAIN,
    options: WalkOptions = WalkOptions(),
) -> Walk:
    """Walk `ledger` for every row: meshes placed on the systems (one per distinct system and
    degrees), collectives priced on each row's own mesh, compute through the efficiency profile.

    `sequences` is the global batch in sequences; each row runs `sequences / microbatches`.

    A single plan's float walk (`options.floats`, one row) is remembered (`_ONE_WALKS`): the
    walk is a pure function of its arguments, so the same plan on the same objects (model,
    systems, ledger, policy, stack) under profiles with the same numbers
    (`core.pricing.profile_key`) walks once; under new GEMM or attention fractions it is
    repriced (`_one_walk`).
    """
    if options.floats and len(rows) == 1:
        refs, key = _one_walk_key(structure, rows, sequences, phase, options)
        args = (model, systems, structure, rows, sequences, ledger, eff, phase, options)
        objs = (model, *systems, ledger, *refs)
        prof = tuple(zip(*(profile_key(eff, s.chip) for s in systems), strict=True))
        return _ONE_WALKS(objs, (key, prof), lambda: _one_walk(args, objs, key, prof))
    return _walk_rows(model, systems, structure, rows, sequences, ledger, eff, phase, options)


_MAX_ONE_WALKS = 128  # ~90 KB a walk (records, einsum plans); calibrate walks many profiles
# a single plan's walks and their Totals, by the objects they were given and the plan's values
_ONE_WALKS = IdentityMemo(lambda: _MAX_ONE_WALKS)
_ONE_TOTALS = IdentityMemo(lambda: _MAX_ONE_WALKS)
_COMM_SUMS = IdentityMemo(lambda: _MAX_ONE_WALKS)  # by a single-plan walk's collectives


def _one_walk_key(structure, rows, sequences, phase, options) -> tuple[tuple, tuple]:
    """The objects of a one-row float walk's options (by identity) and the values of its key."""
    o = options
    key = (
        structure,
        int(rows.system_idx[0]),
        tuple(int(rows.degrees[s][0]) for s in Strategy),
        int(rows.microbatches[0]),
        float(sequences),
        phase,
        _options_key(o),
    )
    return (o.policy, o.stack), key


def _options_key(o: WalkOptions) -> tuple:
    """Every WalkOptions field by value (the policy and the stack go by id in the refs), so a
    field added later cannot be left out of the memo key."""
    return tuple(
        (f.name, tuple(sorted(o.choices.items())) if f.name == "choices" else getattr(o, f.name))
        for f in fields(o)
        if f.name not in ("policy", "stack")
    )


def _one_walk(args: tuple, objs: tuple, key: tuple, prof: tuple) -> Walk:
    """A single plan's float walk under a profile not seen with it: repriced from the walk of
    the same plan under a profile that differs only in the repriced numbers
    (`core.pricing.REPRICED`: calibrate's GEMM, low-precision and attention factors) when every
    option choice stays the same, else walked (and kept as the template to reprice from).

    Repricing redoes what those numbers set — each einsum's option choice (`choose_floats` on
    the kept options), the chosen plans' compute seconds, each GEMM's rate on its kept shape
    (`PricingContext.gemm_rates`: the efficiency curve once on arrays), the vector and
    attention records' compute — with the walk's own formulas; collectives, memory and every
    other record are the template's."""
    model, systems, structure, rows, sequences, ledger, eff, phase, options = args
    if options.keep_einsums:  # reports: the einsum plans kept as walked
        return _walk_rows(*args)
    tkey = (key, prof[0])  # the plan and the numbers that are not repriced
    tpl = _TEMPLATES.get(objs, tkey)
    if tpl is not None:
        walk = _reprice(tpl, _rates(systems, eff, options), prof[1])
        if walk is not None:
            return walk
    tape = _Tape()
    walk = _walk_rows(*args, tape=tape)
    ctx = pricing_context(stack_of(options.stack), eff, systems[0].chip)
    tape.fill(walk, ctx)
    if tape.ok:
        _TEMPLATES.put(objs, tkey, (walk, tape))
    return walk


# a single plan's walk and its tape, by the objects and values of its key and the numbers of
# its profile that are not repriced (`_one_walk`)
_TEMPLATES = IdentityMemo(lambda: _MAX_ONE_WALKS)


def _reprice(tpl: tuple[Walk, _Tape], pricing: AlgebraPricing, gemm_key: tuple) -> Walk | None:
    """`tpl`'s walk under `pricing` (see `_one_walk`), its GEMM fractions `gemm_key`; None
    where an option choice changes. The records those fractions price alone are kept per
    `gemm_key` (calibrate moves the attention factor at fixed GEMM fractions, and back)."""
    walk, tape = tpl
    ctx = pricing.context
    assert ctx is not None
    ops = tape.at_gemm.get(gemm_key)
    if ops is None:
        ops = _gemm_side(walk, tape, pricing)
        if ops is None:
            return None
        if len(tape.at_gemm) >= _MAX_GEMM_SIDES:
            tape.at_gemm.clear()
        tape.at_gemm[gemm_key] = ops
    recipes = tape.order(walk)
    out = [
        r if r is not None else _with(o, compute_s=attention_compute_s(pricing, ctx, *rc[1:]))
        for r, o, rc in zip(ops, walk.ops, recipes, strict=True)
    ]
    return _with(walk, ops=tuple(out))


_MAX_GEMM_SIDES = 16


def _gemm_side(walk: Walk, tape: _Tape, pricing: AlgebraPricing) -> list | None:
    """The walk's records under `pricing`'s GEMM rates (attention records None): each option
    choice made again at the new matmul rate (None if one changes), the chosen plans' compute
    seconds, each GEMM record at its shape's rate, each vector record at the vector rate."""
    ctx = pricing.context
    assert ctx is not None
    comp: dict[int, float] = {}  # the chosen option's compute seconds, per einsum plan
    peaks = {d: pricing.matmul_peak(d) for d in tape.peaks}
    for key, (ep, dtype, _) in tape.plans.items():
        if peaks[dtype] == tape.peaks[dtype]:  # the same rate: the same choice and times
            comp[key] = ep.compute_time_s
            continue
        if len(ep.options) == 1:  # one legal option: any policy's choice (the same times)
            comp[key] = ep.options[0].flops_per_chip / peaks[dtype]
            continue
        octx, memt, commt, policy, trusted = tape.inputs(key)
        choice, times = choose_floats(octx, memt, commt, peaks[dtype], policy, trusted)
        if choice != ep.choice:
            return None
        comp[key] = times[choice]
    rates = dict(tape.gemm_rates(walk, ctx))
    eps: dict[int, EinsumPlan] = {}  # each plan repriced once (gate and up share theirs)
    out: list[OpRecord | None] = []
    for i, (r, rc) in enumerate(zip(walk.ops, tape.order(walk), strict=True)):
        if rc is None or rc[0] == _VECTOR:
            out.append(r if rc is None else _with(r, compute_s=rc[1] / pricing.vector_flops_per_s))
            continue
        if rc[0] == _ATTENTION:
            out.append(None)
            continue
        ep = eps.get(id(rc[2]))
        if ep is None:
            ep = eps[id(rc[2])] = _with(rc[2], compute_time_s=comp[rc[1]])
        out.append(_with(r, compute_s=gemm_compute_s(ep, rates.get(i)), einsum=ep))
    return out


def _with(rec: Any, **changes: Any) -> Any:
    """A copy of the frozen record `rec` (no `__post_init__`) with `changes`: its `__dict__`
    copied at once (`dataclasses.replace` calls the generated `__init__`, several times slower)."""
    o = object.__new__(type(rec))
    o.__dict__.update(rec.__dict__)
    o.__dict__.update(changes)
    return o


def _pricing(systems, rows, eff, options) -> tuple[AlgebraPricing, np.ndarray]:
    """How a walk of `rows` on `systems` prices under `eff`, and each row's mesh reason."""
    meshes, minv, reason, placed = _meshes(systems, rows)
    comm = CommModel(minv, meshes, eff, floats=options.floats, placed=placed)
    return _rates(systems, eff, options, comm), reason


def _rates(systems, eff, options, comm: Any = None) -> AlgebraPricing:
    """The compute rates of a walk on `systems` under `eff`; `comm` prices its collectives
    (None: a repriced walk, whose collectives are its template's)."""
    context = pricing_context(stack_of(options.stack), eff, systems[0].chip)
    compute = context.compute
    assert compute is not None
    return AlgebraPricing(
        comm,
        compute,
        compute.matmul_flops_per_s(options.dtypes.matmul.value),
        compute.hbm_bytes_per_s,
        compute.vector_flops_per_s(options.dtypes.attention.value),
        compute.vector_hbm_bytes_per_s,
        context,
    )


def _walk_rows(
    model, systems, structure, rows, sequences, ledger, eff, phase, options, tape=None
) -> Walk:
    deg = {s: np.asarray(rows.degrees[s], float) for s in Strategy}
    mesh_sizes = {AXIS_OF[s]: deg[s] for s in Strategy}
    rules = _rules_of(structure, model)
    pricing, reason = _pricing(systems, rows, eff, options)
    seqs = sequences / rows.microbatches.astype(float)
    mb = rows.microbatches.astype(float)
    scale_up = np.array([_scale_up(s) for s in systems], float)[np.asarray(rows.system_idx, int)]
    if options.floats and len(rows) == 1:  # one plan on floats (WalkOptions.floats)
        mesh_sizes = {a: float(v[0]) for a, v in mesh_sizes.items()}
        seqs, mb, scale_up = float(seqs[0]), float(mb[0]), float(scale_up[0])
    return walk_ledger(
        model,
        ledger,
        rules,
        mesh_sizes,
        seqs,
        phase=phase,
        pricing=pricing,
        options=options,
        mesh_reason=reason,
        microbatches=mb,
        scale_up=scale_up,
        tape=tape,
    )


@functools.lru_cache(maxsize=256)
def _rules_of(structure: Structure, model: ModelSpec) -> Rules:
    """`rules_of`, one Rules object per (structure, model) (immutable: read-only mappings)."""
    return rules_of(structure, model)


def _scale_up(system: System) -> float:
    """GPUs per NVLink domain (the innermost physical dim of a GPU cluster); 0 for a TPU."""
    inner = system.dims[-1] if system.dims else None
    if system.chip.is_tpu or inner is None or inner.name != "nvlink":
        return 0.0
    return float(inner.size)


# a family with fewer distinct meshes than this places each on its own (`mesh_for`)
_COLUMNS_FROM = 8


def _meshes(systems: list[System], rows: MeshRows) -> tuple[Any, np.ndarray, np.ndarray, Any]:
    """One mesh per distinct (system, degrees) — microbatches do not matter — with each row's
    index into them, the reason a mesh does not fit ("" where it does), and the placements
    found column by column (`CommModel`'s `placed`; None where each mesh was placed alone).

    A family's meshes are placed one axis at a time over all of them
    (`mesh.auto_placed_columns`: each distinct step once); a Mesh object is built only where
    a collective's unit cost asks for it (`_FamilyMeshes`). A mesh whose sizes miss its
    system's chip count, whose every axis has size 1, or that does not fit is placed alone
    (`mesh_for`), so its reason is `place_mesh`'s own."""
    cols = np.column_stack(
        [rows.system_idx] + [np.asarray(rows.degrees[s]) for s in Strategy]
    ).astype(np.int64)
    mesh_rows, minv = unique_rows(cols)
    if len(mesh_rows) < _COLUMNS_FROM:
        found = []
        for row in mesh_rows.tolist():  # Python ints: numpy scalars are slow to convert
            found.append(mesh_for(systems[row[0]], mesh_axes_of(tuple(row[1:]))))
        meshes = [m if isinstance(m, Mesh) else None for m in found]
        reason = np.array([(m if isinstance(m, str) else "") for m in found], dtype=object)
        return meshes, minv, reason[minv], None
    sidx = mesh_rows[:, 0]
    by_axis = {AXIS_OF[s]: mesh_rows[:, 1 + k] for k, s in enumerate(Strategy)}
    columns = [(a, by_axis[a]) for a in AXIS_ORDER]
    placed, bad = auto_placed_columns(systems, sidx, columns)
    chips = np.array([s.n_chips for s in systems], dtype=np.int64)[sidx]
    alone = bad | (np.prod(mesh_rows[:, 1:], axis=1) != chips) | np.all(mesh_rows[:, 1:] == 1, 1)
    own = np.flatnonzero(alone).tolist()
    reason = np.full(len(mesh_rows), "", dtype=object)
    for i in own:
        for _, idx in placed.values():
            idx[i] = -1
    meshes = _FamilyMeshes(systems, mesh_rows, placed)
    for i in own:
        reason[i] = meshes.reason(i)
    return meshes, minv, reason[minv], (placed, systems, own)


class _FamilyMeshes:
    """A family's meshes by index, each built when first asked for: from its axes' placements
    found column by column (the Mesh `place_mesh` builds: the same system, axes and Segment
    tuples), or placed alone (`mesh_for`) where the columns have none; None where it does not
    fit (`reason` says why)."""

    def __init__(self, systems: list[System], mesh_rows: np.ndarray, placed: Mapping) -> None:
        self.systems, self.rows = systems, mesh_rows
        self.placed = [(a, segs, idx.tolist()) for a, (segs, idx) in placed.items()]
        self._made: dict[int, Mesh | str] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def _placed(self, i: int) -> Mesh | str:
        m = self._made.get(i)
        if m is None:
            row = self.rows[i].tolist()
            system, axes = self.systems[row[0]], mesh_axes_of(tuple(row[1:]))
            where = {a: segs[idx[i]][1] for a, segs, idx in self.placed if idx[i] >= 0}
            if len(where) == len(axes):
                m = Mesh(system, axes, MappingProxyType({a: where[a] for a, _ in axes}))
            else:
                m = mesh_for(system, axes)
            self._made[i] = m
        return m

    def __getitem__(self, i: int) -> Mesh | None:
        m = self._placed(i)
        return m if isinstance(m, Mesh) else None

    def reason(self, i: int) -> str:
        """Why mesh `i` does not fit the topology ("" where it does)."""
        m = self._placed(i)
        return m if isinstance(m, str) else ""


__all__ = [
    "AlgebraPricing",
    "CollectiveRecord",
    "MemoryPieces",
    "MeshRows",
    "OpRecord",
    "Overlap",
    "Pass",
    "Totals",
    "Walk",
    "WalkOptions",
    "ledger_for",
    "training_ledger_rows",
    "op_sizes",
    "op_specs",
    "overlap_class",
    "shard_factor",
    "spec_of",
    "walk_ledger",
    "walk_rows",
]
