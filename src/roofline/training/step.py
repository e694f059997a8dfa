"""Training step: the walk's records laid on a timeline, memory per chip, MFU, run time and cost.

The walk (`walk.py`) turns each ledger row into per-chip records for the forward, d_lhs and
d_rhs einsums (book training.md Appendix A) and `walk.Totals` sums them by field. This
module decides what overlaps with what (docs/architecture.md, "The timeline"):

- compute: per-op roofline max(FLOPs/(peak·eff), bytes/(HBM·eff)); remat reruns the forward
  of the ops whose `rerun_by` holds the plan's policy;
- weight gathers (prefetched a layer ahead) and per-microbatch gradient reductions run
  behind compute: exposed = max(0, their time − compute);
- tensor, sequence and expert traffic and other activation collectives sit on the critical
  path (unless collective matmul overlaps TP with its matmul, or `overlap_ep` the expert
  all-to-alls with compute);
- data-parallel gradient reduction happens once per step, behind the last microbatch's backward;
- pipeline: bubble (p−1)/v over M microbatches (GPipe / 1F1B / interleaved) plus p2p hops;
- the optimizer update streams params, grads and state once through HBM.

All arithmetic is vectorised over candidate plans (numpy arrays, one entry per candidate)
so the planner evaluates thousands at once; `evaluate_plan` is the one-candidate case with
the details kept.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.core.ledger import count_params
from roofline.core.memory import (
    TrainingMemory,
    fsdp_gathered_bytes,
    minimum_memory_bytes,
    persistent_bytes,
)
from roofline.core.rules import Structure, kv_heads_replicated
from roofline.core.sharding import CHEAPEST, OptionPolicy, without_axes_text
from roofline.core.stack import Stack, chip_requirements, overlap_conditions, stack_of
from roofline.core.walk import (
    FRAMEWORK_CLASS,
    MeshRows,
    Overlap,
    Totals,
    Walk,
    WalkOptions,
    ledger_for,
    walk_rows,
)
from roofline.errors import PlanError
from roofline.memo import IdentityMemo
from roofline.specs.efficiency import DEFAULT_PROFILE, Efficiency, load_profile
from roofline.specs.framework import (
    Exposed,
    Framework,
    OverlapMode,
    Per,
    Regather,
    Window,
)
from roofline.specs.model import ModelSpec
from roofline.specs.plan import (
    AXIS_OF,
    FLAG_ON,
    FLAG_UNSET,
    Causal,
    ComputeDtypes,
    OpClass,
    OptimizerPolicy,
    Phase,
    Plan,
    Remat,
    RematKind,
    Schedule,
    Strategy,
    Workload,
    flag_code,
    flag_of_code,
    parse_optimizer,
    parse_plan,
)
from roofline.specs.system import System
from roofline.training.feasibility import EDGE_LAYERS, plan_problems
from roofline.units import DAY

__all__ = [
    "Candidates",
    "Plan",
    "Schedule",
    "StepArrays",
    "StepCost",
    "Structure",
    "Workload",
    "assumed_mfu_run",
    "balance_batch",
    "candidates_of",
    "evaluate_plan",
    "evaluate_plans",
    "model_flops",
    "parse_plan",
    "run_cost_usd",
    "step_terms",
    "structure_of",
    "training_profile",
]

# The efficiency profile a training prediction uses when none is given: the project default
# (specs.efficiency.DEFAULT_PROFILE: the measured-calibrated `fitted` profile, the datasheet
# physics times factors fitted on the public runs, docs/calibration.md), else the datasheet
# physics; `efficiency=` or `--profile` chooses another.
DEFAULT_TRAINING_PROFILE = DEFAULT_PROFILE or "datasheet"


def training_profile(efficiency: Efficiency | None = None) -> Efficiency:
    """The profile a training prediction runs under (the default when none is given)."""
    return efficiency if efficiency is not None else load_profile(DEFAULT_TRAINING_PROFILE)


# MFU is reported against the bf16 peak (the convention of every published training run).
MFU_PEAK_DTYPE = "bf16"


def mfu_peak(chip: Any) -> float:
    """The peak MFU is measured against: bf16, or the chip's 16-bit dtype where it has no bf16."""
    return chip.peak(MFU_PEAK_DTYPE, fallback=chip.default_dtype)


def compute_peak(chip: Any, dtypes: ComputeDtypes) -> float:
    """The peak of the dtype the dense matmuls compute in (fp8 runs: the fp8 peak), the
    second MFU a report gives next to the bf16 one."""
    return chip.peak(dtypes.matmul.value, fallback=chip.default_dtype)


def model_flops(model: ModelSpec, tokens: Any) -> Any:
    """6·N·tokens with N the ACTIVE parameters (book transformers.md; MoE: top-k experts)."""
    return 6.0 * count_params(model).active * tokens


def run_cost_usd(seconds: Any, n_chips: Any, usd_per_chip_hour: Any) -> Any:
    """Dollars for `seconds` on `n_chips` at a price per chip-hour (None without a price;
    arrays with NaN where a price is missing)."""
    if usd_per_chip_hour is None:
        return None
    return seconds / 3600 * n_chips * usd_per_chip_hour


# --------------------------------------------------------------------------------------
# Candidates and results (arrays)
# --------------------------------------------------------------------------------------


@dataclass
class Candidates:
    """Arrays (one entry per candidate) of the numeric plan choices within one Structure."""

    deg: dict[Strategy, np.ndarray]
    microbatches: np.ndarray
    zero: np.ndarray
    schedule: np.ndarray  # Schedule.code per candidate (see specs.plan.SCHEDULE_OF_CODE)
    virtual: np.ndarray
    # which of several systems (sub-slices) each candidate runs on
    system_idx: np.ndarray | None = None
    remat_idx: np.ndarray | None = None  # index into the remat list given to evaluate_plans
    # tri-state plan flags per candidate (specs.plan.flag_code: FLAG_UNSET keeps the stack's
    # default, FLAG_OFF / FLAG_ON force it); None: the structure's (collective_matmul) / unset
    collective_matmul: np.ndarray | None = None
    overlap_ep: np.ndarray | None = None
    # the plan's compile per candidate (flag codes as above; None: unset, the stack's default).
    # One walk costs one compile setting, so a family's candidates share it (planner/space.py)
    compiled: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.microbatches)

    def compile_flag(self) -> bool | None:
        """The candidates' one compile flag (None: unset, the stack's default)."""
        if self.compiled is None or not len(self.compiled):
            return None
        c = np.asarray(self.compiled)
        if (c != c[0]).any():
            raise PlanError(
                f"candidates with compile codes {np.unique(c).tolist()} in one evaluation",
                rule="one walk costs one compile setting: the eager kernels' elementwise "
                "bytes are the walk's, not the timeline's",
                fix="split the candidates by compile and evaluate each part",
            )
        return flag_of_code(c[0])


class Reasons:
    """Why each candidate is infeasible, rendered lazily (most candidates never need the text)."""

    def __init__(self, mesh_reason, mesh_bad, over, mem, cap: float, inv=None) -> None:
        # the walk's mesh reasons by row, `inv` each candidate's row (None: by candidate)
        self.mesh_reason, self.mesh_bad, self.over, self.mem, self.cap = (
            mesh_reason,
            mesh_bad,
            over,
            mem,
            cap,
        )
        self.inv = inv

    def __getitem__(self, i: int) -> str:
        if self.mesh_bad[i]:
            return str(self.mesh_reason[i if self.inv is None else self.inv[i]])
        if self.over[i]:
            return f"does not fit HBM: needs {self.mem[i] / 1e9:.1f} GB per chip, chip has {self.cap / 1e9:.1f} GB allocatable"
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


@dataclass(frozen=True, kw_only=True)
class StepArrays:
    """Per-candidate step results (arrays). Times in seconds, memory in bytes per chip."""

    step_time_s: np.ndarray
    compute_time_s: np.ndarray
    exposed_comm_time_s: np.ndarray
    bubble_time_s: np.ndarray
    bubble_fraction: np.ndarray
    optimizer_time_s: np.ndarray
    overhead_time_s: np.ndarray  # the profile's fixed per-layer and per-step costs
    comm: Mapping[str, np.ndarray]  # raw time per overlap class per step
    exposed: Mapping[str, np.ndarray]  # exposed time per overlap group per step
    memory: Mapping[str, np.ndarray]
    memory_total: np.ndarray
    flops_per_chip: np.ndarray  # executed (incl. recompute) per step
    model_flops: float  # 6·N·tokens per step
    mfu: np.ndarray
    hfu: np.ndarray
    tokens_per_s: np.ndarray
    infeasible: np.ndarray  # bool
    mfu_compute_dtype: np.ndarray  # model FLOPs against the dense matmuls' dtype peak
    reason: Any  # reason[i] -> str ("" if feasible); .counts() -> {reason: count}
    walk: Walk | None = None  # the records (kept for single plans)
    terms: Mapping[str, np.ndarray] = field(default_factory=dict)  # see step_terms


# --------------------------------------------------------------------------------------
# Overlap: what each class of collective hides behind (the framework profile says)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExposureGroup:
    """Collectives of some overlap classes reported together. Classes of one group travel on
    the same links (FSDP gathers and gradient reductions), so together they hide behind the
    compute of a pass at most once."""

    name: str
    classes: tuple[Overlap, ...]


# Per microbatch. Data-parallel gradient reduction (per step) and pipeline hops are laid
# separately (see `_step`).
EXPOSURE = (
    ExposureGroup("fsdp+grad", (Overlap.WEIGHT_GATHER, Overlap.GRAD_REDUCE_MB)),
    ExposureGroup("tp", (Overlap.TENSOR,)),
    ExposureGroup("sp", (Overlap.SEQUENCE,)),
    ExposureGroup("ep", (Overlap.EXPERT,)),
    ExposureGroup("other", (Overlap.OTHER,)),
)

# The plan flag that switches a class's mechanism on (the profile's `plan_key`).
_PLAN_KEY_CLASSES = {"collective_matmul": Overlap.TENSOR, "overlap_ep": Overlap.EXPERT}


@dataclass(frozen=True)
class ModeArrays:
    """A class's overlap mode per candidate: the mechanism on where `on`, else off."""

    on: np.ndarray  # bool per candidate
    on_mode: OverlapMode
    off_mode: OverlapMode

    def pick(self, f: Callable[[OverlapMode], Any]) -> Any:
        """f of the mode in force per candidate (each mode evaluated once, only if used)."""
        if self.on.all():
            return f(self.on_mode)
        if not self.on.any():
            return f(self.off_mode)
        return np.where(self.on, f(self.on_mode), f(self.off_mode))


def _conditions(ctx: _Context, chip: Any) -> dict[str, np.ndarray]:
    """Which of the profiles' requirements hold for each candidate (specs.framework.Requirement;
    the rule is core.stack.overlap_conditions, which launch writers use for one plan)."""
    full = np.array([r.kind in (RematKind.FULL, RematKind.CHECKPOINTS) for r in ctx.remats])
    return overlap_conditions(
        ctx.stack,
        ctx.deg,
        sequence_parallel=ctx.sequence_parallel,
        interleaved=(ctx.schedule == Schedule.INTERLEAVED.code) & (ctx.virtual > 1),
        full_remat=full[ctx.remat_idx],
        zero=ctx.zero,
        held=chip_requirements(chip),
    )


def _modes(ctx: _Context, cond: Mapping[str, np.ndarray]) -> dict[Overlap, ModeArrays]:
    """The overlap mode in force per class and candidate: the plan's flag where it is set (on
    or off) and the stack has that switch, else the stack's default given the conditions that
    hold (specs.framework.Overlap.mode)."""
    names = tuple(cond)
    if len(ctx.inv) == 1:  # one plan: its own conditions
        packed = np.zeros(1, dtype=np.int64)
        for j, k in enumerate(names):
            packed |= cond[k].astype(np.int64) << j
        uniq, where = packed, np.zeros(1, dtype=np.int64)
    else:
        uniq, where = _packed_sets(cond, names, len(ctx.inv))
    sets = [frozenset(k for j, k in enumerate(names) if (int(u) >> j) & 1) for u in uniq]
    flag_of = {c: k for k, c in _PLAN_KEY_CLASSES.items()}
    on_by_set = [_defaults_on(ctx.stack, c) for c in sets]
    out = {}
    for cls in Overlap:
        ov = ctx.stack.overlap(FRAMEWORK_CLASS[cls])
        default_on = np.array([on[cls] for on in on_by_set])[where.reshape(-1)]
        flag = ctx.flags.get(flag_of.get(cls, ""), None)
        on = default_on
        if flag is not None and ov.plan_key:
            on = np.where(flag == FLAG_UNSET, default_on, flag == FLAG_ON)
        out[cls] = ModeArrays(np.broadcast_to(on, default_on.shape), ov.on, ov.off)
    return out


def _packed_sets(
    cond: Mapping[str, np.ndarray], names: tuple[str, ...], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(packed, return_inverse=True) of each candidate's conditions packed as bits
    (bit j: condition `names[j]`), without packing or sorting the conditions that hold for
    every candidate or none: those are one constant bit or none; the varying ones are packed
    into consecutive bits in the same order (so the same order of keys), counted by a bincount
    and numbered in order."""
    const, varying = 0, []
    for j, k in enumerate(names):
        c = cond[k]
        if c.all():
            const |= 1 << j
        elif c.any():
            varying.append((j, c))
    if len(varying) > 16:  # a table of 2^16 keys at most
        packed = np.full(n, const, dtype=np.int64)
        for j, c in varying:
            packed |= c.astype(np.int64) << j
        uniq, where = np.unique(packed, return_inverse=True)
        return uniq, where.reshape(-1)
    small = np.zeros(n, dtype=np.int64)
    for _, c in reversed(varying):  # the highest bit first
        small <<= 1
        small |= c
    present = np.bincount(small, minlength=1 << len(varying)).astype(bool)
    ranks = np.cumsum(present, dtype=np.int64)
    ranks -= 1
    small_uniq = np.flatnonzero(present)
    uniq = np.full(len(small_uniq), const, dtype=np.int64)
    for b, (j, _) in enumerate(varying):
        uniq |= ((small_uniq >> b) & 1) << j
    return uniq, ranks.take(small)


# (stack, conditions) -> {class: its mechanism on by default}
_DEFAULT_ON = IdentityMemo(4096)


def _modes_of(ctx: _Context, chip: Any, key: tuple | None) -> dict[Overlap, ModeArrays]:
    """`_modes` under `_conditions`: one plan's kept by (stack, chip) and `key`, the values of
    its context (`_context_key`; calibrate costs each run's plan under many profiles)."""
    if key is None:
        return _modes(ctx, _conditions(ctx, chip))
    return _MODES((ctx.stack, chip), key, lambda: _modes(ctx, _conditions(ctx, chip)))


def _context_key(ctx: _Context) -> tuple | None:
    """Every value of one plan's context but its stack (None for a family of plans)."""
    if len(ctx.inv) != 1:
        return None
    return tuple(_plain(getattr(ctx, f.name)) for f in fields(ctx) if f.name != "stack")


def _plain(v: Any) -> Any:
    """A context field as a hashable value (arrays as tuples, mappings as sorted items)."""
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, tuple(v.ravel().tolist()))
    if isinstance(v, Mapping):
        return tuple(sorted((str(k), _plain(x)) for k, x in v.items()))
    return v


_MODES = IdentityMemo(256)
_MEMORY = IdentityMemo(256)  # one plan's memory by (its walk's pieces, model, stack), values


def _defaults_on(stack: Stack, conditions: frozenset[str]) -> dict[Overlap, bool]:
    """Per overlap class, whether the stack's mechanism is on by default under `conditions`
    (`specs.framework.Overlap.mode`), resolved once per (stack, conditions)."""

    def on() -> dict[Overlap, bool]:
        return {cls: stack.default_on(FRAMEWORK_CLASS[cls], conditions) for cls in Overlap}

    return _DEFAULT_ON((stack,), conditions, on)


# the mesh degree a decomposed collective of each class is chunked over (first_chunk)
_CHUNKS = {
    Overlap.TENSOR: Strategy.TP,
    Overlap.SEQUENCE: Strategy.SP,
    Overlap.EXPERT: Strategy.EP,
    Overlap.WEIGHT_GATHER: Strategy.FSDP,
    Overlap.GRAD_REDUCE_MB: Strategy.FSDP,
}


def _tail(m: OverlapMode, comm: Any, cls: Overlap, ctx: _Context, layers: Any) -> Any:
    """The part of a class's time that stays exposed even with its mechanism on."""
    e = m.exposed
    if e == Exposed.NONE:
        return 0.0 * comm
    if e == Exposed.ALL:
        return comm
    if e == Exposed.FIRST_CHUNK:
        chunks = ctx.deg[_CHUNKS[cls]] if cls in _CHUNKS else 1.0
        return comm / _at_least_one(chunks)
    if e == Exposed.FILL_DRAIN:
        return comm / _at_least_one(ctx.M)
    return comm / _at_least_one(layers)  # one_layer, one_bucket: the last (or first) layer


def _at_least_one(x: Any) -> Any:
    """np.maximum(x, 1.0), of a candidate array once per timeline (`_timeline` divides by the
    same degrees, microbatches and layers for several classes and both passes)."""
    if type(x) is not np.ndarray or x.size < _LARGE:
        return np.maximum(x, 1.0)
    return _AT_LEAST_ONE((x,), (), lambda: np.maximum(x, 1.0))


# arrays shorter than this are computed as they are asked (one plan, the listed plans): the
# lookups would cost more than the arithmetic
_LARGE = 1024


_AT_LEAST_ONE = IdentityMemo(16)


@functools.lru_cache(maxsize=4)  # a search has one or two candidate counts
def _zeros(n: int) -> np.ndarray:
    """n zeros, read-only: numpy's maximum of an array and the scalar 0.0 runs ~3x slower
    than of two arrays (the same values: no operand here is ever -0.0, the one case where the
    two could pick a different zero)."""
    z = np.zeros(n)
    z.flags.writeable = False
    return z


def _at_least_zero(x: Any) -> Any:
    """np.maximum(x, 0.0) of an x that is never -0.0."""
    if type(x) is not np.ndarray or x.ndim != 1 or len(x) < _LARGE:
        return np.maximum(x, 0.0)
    return np.maximum(x, _zeros(len(x)))


def _window(m: OverlapMode, cls: Overlap, win: Mapping[str, Any], ctx: _Context) -> Any:
    """The compute a class can hide behind in one pass (profile `window`)."""
    if m.window == Window.OWN_MATMUL:
        return {Overlap.TENSOR: win["gemm"], Overlap.SEQUENCE: win["attention"]}.get(
            cls, win["pass"]
        )
    if m.window == Window.LOCAL_CHUNK:
        return win["attention"] / _at_least_one(ctx.deg[Strategy.SP])
    return win["pass"]


def _hidden(mode: ModeArrays, cls, comm, forward: bool, win, ctx, layers) -> tuple[Any, Any]:
    """(seconds of a class's collectives hidden in one pass, its window): the hidden fraction
    of what is not always exposed, at most the compute of its window."""

    def one(m: OverlapMode) -> Any:
        if m.fraction("forward" if forward else "backward") == 0.0:
            return 0.0 * comm
        tail = _tail(m, comm, cls, ctx, layers)  # comm's sign and zero: comm - tail is never -0.0
        hideable = m.fraction("forward" if forward else "backward") * _at_least_zero(comm - tail)
        return np.minimum(hideable, _window(m, cls, win, ctx))

    return mode.pick(one), mode.pick(lambda m: _window(m, cls, win, ctx))


# --------------------------------------------------------------------------------------
# Vectorised evaluation
# --------------------------------------------------------------------------------------


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
    keep_walk: bool = False,
    merge_reductions: bool = True,
    remats: list[Remat] | None = None,
    ops: tuple[str, ...] | None = None,
    policy: OptionPolicy = CHEAPEST,
    plan: Plan | None = None,
    with_terms: bool = False,
    framework: str | Framework | Stack | None = None,
    dtypes: ComputeDtypes | None = None,
) -> StepArrays:
    """Evaluate every candidate of one Structure at once (numpy arrays in, arrays out).

    `system` may be a list (sub-slices of one pod, same chip): `cand.system_idx` picks one
    per candidate. `remats` (with `cand.remat_idx`) and `cand.collective_matmul` vary those
    choices per candidate too; otherwise `structure.remat` / `structure.collective_matmul` apply.
    `framework` is the stack whose behaviour is costed (None: the idealised machine); its
    option policy applies unless `policy` names another. `plan` (single plans) or `dtypes`
    supply the compute dtypes; `with_terms` adds the per-pass terms of `step_terms`.
    `keep_walk` keeps the walk's records (a single plan's collectives), `keep_einsums` its
    einsum plans too, with their report fields.

    Two phases: the walk runs once per distinct (system, mesh, microbatch) — the only inputs
    the einsums see — and the timeline then combines its sums with each candidate's remat,
    ZeRO stage, schedule and overlap choices.
    """
    systems = list(system) if isinstance(system, (list, tuple)) else [system]
    stack = stack_of(framework)
    eff = training_profile(eff).for_framework(stack.name)  # a calibrated profile's overrides
    opt = optimizer or parse_optimizer("adam-bf16")
    remat_list = list(remats or [structure.remat])
    rows, inv = _distinct_rows(cand)
    led = ledger_for(
        model,
        Phase.TRAIN,
        workload.seq_len,
        # an unfused kernel's batched GEMMs compute the whole score matrix, masked or not
        causal=workload.causal if stack.flash_attention else Causal.FULL,
        training_rows=not stack.book,
        flash=stack.flash_attention,
        eager_expert_bias=stack.framework.expert_parallel.eager_expert_bias,
    )
    if ops is not None:  # a subset of rows, e.g. the book's simplified layer ("mlp/up", "mlp/down")
        led = replace(led, ops=tuple(o for o in led.ops if o.name in ops))
    if plan is not None:
        dtypes = effective_dtypes(plan, systems[0].chip)
    options = WalkOptions(
        dtypes=dtypes if dtypes is not None else default_dtypes(systems[0].chip),
        policy=stack.policy if policy is CHEAPEST else policy,
        keep_einsums=keep_einsums,
        merge_reductions=merge_reductions,
        trusted=not keep_einsums,
        remats=tuple(remat_list),
        stack=stack,
        floats=len(rows) == 1,  # the timeline broadcasts a single row's floats
        # the single plan's compile, else the candidates' (unset: the stack's default)
        eager=not stack.compiled(cand.compile_flag() if plan is None else plan.compiled),
        host_syncs=plan is None or not plan.cuda_graph,
    )
    w = walk_rows(model, systems, structure, rows, workload.sequences, led, eff, options=options)
    ctx = _Context.of(
        cand, structure, remat_list, inv, len(cand), stack, n_rows=(w.n,), dtypes=options.dtypes
    )
    keep = keep_einsums or keep_walk
    return _step(model, systems, workload, w, Totals.of(w), ctx, eff, opt, keep, with_terms)


def effective_dtypes(plan: Plan, chip: Any) -> ComputeDtypes:
    """The dtypes a plan computes in: its own, or where it names none (bf16 everywhere) the
    chip's 16-bit dtype (V100 trains in fp16)."""
    return default_dtypes(chip) if plan.dtypes.is_default else plan.dtypes


def default_dtypes(chip: Any) -> ComputeDtypes:
    """Compute dtypes when the plan names none: bf16, or the chip's 16-bit dtype (V100: fp16)."""
    if chip.default_dtype == "bf16":
        return ComputeDtypes()
    return ComputeDtypes.uniform(chip.default_dtype)


def distinct_rows_of(cand: Candidates) -> np.ndarray:
    """Each candidate's row in the walk `evaluate_plans` runs for `cand`."""
    return _distinct_rows(cand)[1]


def _distinct_rows(cand: Candidates) -> tuple[MeshRows, np.ndarray]:
    """The distinct (system, degrees, microbatches) rows and each candidate's row.

    Remembered for the last few candidate sets by identity (`_ROWS`): a search's family is
    walked by `evaluate_plans` and its listed plans are then read off the same rows
    (`distinct_rows_of` in the planner's `_cost_rows`), one sort of ~25,000 keys each time
    (~2 ms for GPT-3 175B on a100:1024). Candidates are never changed after they are built."""
    if len(cand) == 1:
        return _distinct_rows_of(cand)
    return _ROWS((cand,), (), lambda: _distinct_rows_of(cand))


# the distinct rows of the last few multi-row candidate sets (`_distinct_rows`)
_ROWS = IdentityMemo(4)


def _distinct_rows_of(cand: Candidates) -> tuple[MeshRows, np.ndarray]:
    n = len(cand)
    ones = np.ones(n, dtype=np.int64)
    sys_idx = cand.system_idx if cand.system_idx is not None else np.zeros(n, dtype=np.int64)
    cols = [sys_idx] + [cand.deg.get(s, ones) for s in Strategy] + [cand.microbatches]
    if n == 1:  # one plan: its row
        key_mat = np.column_stack(cols).astype(np.int64)
        rows = MeshRows(key_mat[:, 0], {s: key_mat[:, 1 + j] for j, s in enumerate(Strategy)},
                        key_mat[:, -1])  # fmt: skip
        return rows, np.zeros(1, dtype=np.int64)
    # distinct rows via one mixed-radix integer per row (much faster than unique(axis=0)),
    # read column by column: stacking ~25,000 rows into one (rows, 8) matrix first costs more
    # than the sort (a strided copy of 1.6 MB and a second one to int64)
    cols = [np.asarray(c).astype(np.int64, copy=False) for c in cols]
    flat_key = np.zeros(n, dtype=np.int64)
    for c in cols:
        flat_key = flat_key * (int(c.max()) + 1) + c
    _, first, inv = np.unique(flat_key, return_index=True, return_inverse=True)
    uniq = [c[first] for c in cols]
    rows = MeshRows(uniq[0], {s: uniq[1 + j] for j, s in enumerate(Strategy)}, uniq[-1])
    return rows, inv.reshape(-1)


@dataclass(frozen=True)
class _Context:
    """Each candidate's choices the timeline needs, as arrays (inv: its row of the walk)."""

    inv: np.ndarray
    deg: Mapping[Strategy, np.ndarray]
    M: np.ndarray
    zero: np.ndarray
    schedule: np.ndarray
    virtual: np.ndarray
    sys_idx: np.ndarray
    remats: tuple[Remat, ...]  # the remat policies `remat_idx` indexes
    remat_idx: np.ndarray
    reuse: np.ndarray  # the backward pass reuses the forward's FSDP weight gathers
    flags: Mapping[str, np.ndarray]  # collective_matmul, overlap_ep: flag codes per candidate
    stack: Stack
    sequence_parallel: bool = False  # Megatron SP (the structure's)
    expert_tp: bool = True  # routed experts split over the tensor axis (the structure's)
    n_rows: tuple[int, ...] = (1,)  # the walk's rows (shape of its arrays)
    dtypes: ComputeDtypes = ComputeDtypes()

    @staticmethod
    def of(
        cand: Candidates,
        st: Structure,
        remats: list[Remat],
        inv,
        n: int,
        stack: Stack,
        n_rows: tuple[int, ...] = (1,),
        dtypes: ComputeDtypes | None = None,
    ) -> _Context:
        r_idx = cand.remat_idx if cand.remat_idx is not None else np.zeros(n, dtype=int)
        no_remat = np.array([r.kind == RematKind.NONE for r in remats])[r_idx]
        cm = cand.collective_matmul
        oe = cand.overlap_ep
        deg = {s: cand.deg.get(s, np.ones(n)).astype(float) for s in Strategy}
        return _Context(
            inv,
            deg,
            cand.microbatches.astype(float),
            cand.zero,
            cand.schedule,
            cand.virtual,
            cand.system_idx if cand.system_idx is not None else np.zeros(n, dtype=int),
            tuple(remats),
            r_idx,
            _reuses_gathers(stack, deg[Strategy.PP] > 1, no_remat),
            {
                "collective_matmul": cm
                if cm is not None
                else np.full(n, flag_code(st.collective_matmul), dtype=np.int8),
                "overlap_ep": oe if oe is not None else np.full(n, FLAG_UNSET, dtype=np.int8),
            },
            stack,
            bool(st.sequence_parallel),
            expert_tp=bool(st.expert_tp),
            n_rows=n_rows,
            dtypes=dtypes if dtypes is not None else ComputeDtypes(),
        )


def _reuses_gathers(stack: Stack, pipelined: np.ndarray, no_remat: np.ndarray) -> np.ndarray:
    """Whether the backward pass reuses the forward's FSDP gathers: never where the stack
    reshards after the forward (PyTorch FSDP, Megatron-FSDP), always where it keeps them, and
    without remat only for the idealised machine / XLA (regather with remat)."""
    out = no_remat.copy()
    for piped in (False, True):
        regather = stack.fsdp_when(piped)[0]
        sel = pipelined == piped
        if regather == Regather.ALWAYS:
            out = np.where(sel, False, out)
        elif regather == Regather.NEVER:
            out = np.where(sel, True, out)
    return out


class _Sums:
    """Per-candidate views of a walk's Totals (multiplicities applied per candidate)."""

    def __init__(self, tot: Totals, ctx: _Context, comm_memo: dict | None = None) -> None:
        self.tot, self.ctx = tot, ctx
        self._rr: dict[frozenset, np.ndarray] = {}
        self._memo: dict[tuple, Any] = {}  # each sum asked once (the timeline asks some twice)
        # the collectives' sums: shared by Totals with the same collective sums (`_sums_of`)
        self._comm_memo = {} if comm_memo is None else comm_memo

    def _remembered(self, key: tuple, f: Callable[[], Any], memo: dict | None = None) -> Any:
        memo = self._memo if memo is None else memo
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = f()
        return hit

    def rr(self, s: frozenset) -> np.ndarray:
        """1.0 for each remat policy that reruns ops of `s`, else 0.0 (`_Context.reruns`)."""
        if s not in self._rr:
            self._rr[s] = np.array([float(r.kind in s or r in s) for r in self.ctx.remats])
        return self._rr[s]

    @property
    def _cell(self) -> np.ndarray:
        """Each candidate's (walk row, remat policy) cell of a (rows, remats) table, flat."""
        cell = self._memo.get("cell")
        if cell is None:
            ctx = self.ctx
            cell = ctx.inv * len(ctx.remats)
            cell += ctx.remat_idx
            self._memo["cell"] = cell
        return cell

    def _sum(self, items, forward_mult: bool, rerun_only: bool = False) -> Any:
        if len(self.ctx.inv) < _LARGE:  # a few candidates: no table
            return self._sum_per_candidate(items, forward_mult, rerun_only)
        return self._out(self._sum_cells(items, forward_mult, rerun_only))

    def _groups(self, items, forward_mult: bool, rerun_only: bool) -> list[tuple[Any, Any]]:
        """`items` added per (pass, rerun set) group over the walk's rows first (few), each
        group with its weight per remat policy (its reruns, or one plus them for a forward
        the policy reruns; None: weight 1, not multiplied: x * 1.0 is x exactly)."""
        rows: dict[tuple[bool, frozenset], Any] = {}
        for key, v in items:
            rows[key] = rows.get(key, 0.0) + v
        out = []
        for (fwd, rerun), v in rows.items():
            if rerun_only:
                if not fwd or not rerun:
                    continue
                m: Any = self.rr(rerun)
            else:
                m = (1.0 + self.rr(rerun)) if (fwd and forward_mult and rerun) else None
            out.append((self._row(v), m))
        return out

    def _sum_per_candidate(self, items, forward_mult: bool, rerun_only: bool) -> Any:
        """`_sum`, each group indexed out to the candidates and weighed there."""
        out: Any = np.zeros(len(self.ctx.inv))
        for v, m in self._groups(items, forward_mult, rerun_only):
            x = v.take(self.ctx.inv)
            out = out + (x if m is None else x * m.take(self.ctx.remat_idx))
        return out

    def _sum_cells(self, items, forward_mult: bool, rerun_only: bool) -> tuple[bool, Any]:
        """(by cell, the sum): per walk row where no remat policy weighs it, else per (row,
        remat policy) cell (`_cell`), each group weighed by its policy's reruns — per
        candidate the same products and sums in the same order, once per row or cell."""
        terms = self._groups(items, forward_mult, rerun_only)
        if not terms:
            return False, np.zeros(self.ctx.n_rows)
        cells = any(m is not None for _, m in terms)
        out: Any = None
        for v, m in terms:
            if cells:  # x * 1.0 is x exactly: a group without reruns is not multiplied
                v = np.multiply.outer(v, m) if m is not None else v[:, None]
            out = 0.0 + v if out is None else out + v
        if cells and out.shape[1] != len(self.ctx.remats):
            out = np.broadcast_to(out, (len(out), len(self.ctx.remats)))
        return cells, out

    def _out(self, cells_sum: tuple[bool, Any]) -> np.ndarray:
        """A `_sum_cells` sum read out to the candidates (one take)."""
        cells, v = cells_sum
        if cells:
            return np.ascontiguousarray(v).reshape(-1).take(self._cell)
        return v.take(self.ctx.inv)  # v[inv]: the same values, numpy's take ~1.5x faster

    def _row(self, v: Any) -> np.ndarray:
        """A per-row sum with the rows' shape (Totals' arrays have it already; anything else
        is broadcast to it)."""
        if type(v) is not np.ndarray or v.shape != self.ctx.n_rows or v.dtype != np.float64:
            v = np.broadcast_to(np.asarray(v, float), self.ctx.n_rows)
        return v

    def compute(
        self,
        *,
        forward: bool | None = None,
        rerun_only: bool = False,
        classes: tuple[OpClass, ...] | None = None,
    ) -> Any:
        """Compute seconds per microbatch (forward incl. recompute unless `forward` filters),
        of every op or of the ops of some `classes`."""
        return self._remembered(
            ("compute", forward, rerun_only, classes),
            lambda: self._compute(forward, rerun_only, classes),
        )

    def _compute(self, forward, rerun_only, classes) -> Any:
        if classes is None:
            src = self.tot.compute_s.items()
        else:
            src = [((f, r), v) for (f, r, c), v in self.tot.compute_class_s.items() if c in classes]
        items = [(k, v) for k, v in src if forward is None or k[0] == forward]
        return self._sum(items, forward is None, rerun_only)

    def experts(self, *, forward: bool) -> Any:
        """Compute seconds per microbatch of the routed experts' rows (walk.ROUTED_EXPERT_ROWS)
        in one pass; the backward with remat's rerun of them."""

        def of() -> Any:
            items = list(self.tot.expert_s.items())
            if forward:
                return self._sum([(k, v) for k, v in items if k[0]], False)
            back = self._sum([(k, v) for k, v in items if not k[0]], False)
            return back + self._sum(items, False, rerun_only=True)

        return self._remembered(("experts", forward), of)

    def flops(self, *, forward: bool | None = None, rerun_only: bool = False) -> Any:
        return self._remembered(
            ("flops", forward, rerun_only), lambda: self._flops(forward, rerun_only)
        )

    def _flops(self, forward, rerun_only) -> Any:
        items = [(k, v) for k, v in self.tot.flops.items() if forward is None or k[0] == forward]
        return self._sum(items, forward is None, rerun_only)

    def comm(self, classes, *, forward: bool | None = None, rerun_only: bool = False) -> Any:
        """Seconds per microbatch of the collectives of `classes` (with remat's reruns, less
        the re-gathers a no-remat step skips, unless `forward` picks one pass once)."""
        return self._remembered(
            ("comm", tuple(classes), forward, rerun_only),
            lambda: self._comm(classes, forward, rerun_only),
            self._comm_memo,
        )

    def _comm(self, classes, forward, rerun_only) -> Any:
        items = [
            ((fwd, rr), v)
            for (c, fwd, rr), v in self.tot.comm_s.items()
            if c in classes and (forward is None or fwd == forward)
        ]
        if len(self.ctx.inv) < _LARGE:  # a few candidates: no table
            out = self._sum_per_candidate(items, forward is None, rerun_only)
            if not rerun_only and forward is not True:
                for c in classes:
                    if c in self.tot.reusable_s:
                        reusable = self._row(self.tot.reusable_s[c]).take(self.ctx.inv)
                        out = out - np.where(self.ctx.reuse, reusable, 0.0)
            return out
        cells, out = self._sum_cells(items, forward is None, rerun_only)
        if not rerun_only and forward is not True:
            reused = [c for c in classes if c in self.tot.reusable_s]
            if reused:  # the reuse is the remat policy's on the row's pipeline: per cell
                R = len(self.ctx.remats)
                if not cells:
                    cells, out = True, np.broadcast_to(out[:, None], (len(out), R))
                reuse = np.zeros(out.shape, dtype=bool)
                reuse.reshape(-1)[self._cell] = self.ctx.reuse
                for c in reused:
                    out = out - np.where(reuse, self._row(self.tot.reusable_s[c])[:, None], 0.0)
        return self._out((cells, out))


# one plan's sums by (its walk's Totals, what of the context they read): a remembered walk's
# Totals (`core.walk`) are summed by query once per remat choice; the collectives' sums by
# (the Totals' collective sums, the same), which a walk repriced under a new profile shares
_SUMS = IdentityMemo(128)
_COMM_SUMS = IdentityMemo(128)


def _sums_of(tot: Totals, ctx: _Context) -> _Sums:
    """The `_Sums` of `tot` under `ctx`: one plan's shared with every plan whose context gives
    them the same values (the remat policies and choice, the gather reuse, the rows)."""
    if len(ctx.inv) != 1:
        return _Sums(tot, ctx)
    key = (ctx.remats, int(ctx.remat_idx[0]), bool(ctx.reuse[0]), int(ctx.inv[0]), ctx.n_rows)
    comm = _COMM_SUMS((tot.comm_s, tot.reusable_s), key, dict)
    return _SUMS((tot,), key, lambda: _Sums(tot, ctx, comm))


def _exposed(group: ExposureGroup, comm: Any, compute: Any, ctx: _Context) -> Any:
    if group.rule == "hidden":
        return np.maximum(0.0, comm - compute)
    if group.rule.startswith("flag:"):
        return np.where(ctx.flags[group.rule[5:]], np.maximum(0.0, comm - compute), comm)
    return comm


def _balanced_stage(t_mb: Any, edge: Any, n_layers: int, ctx: _Context) -> Any:
    """One microbatch on the fullest pipeline stage.

    The walk lays ceil(L/pp) layers and both the embedding and the LM head on it. A stack that
    lays out uneven stages (Megatron's first/last counts or layout, torchtitan's balanced split)
    counts the embedding and the loss as one layer each and spreads L + 2 layers over pp·v
    (virtual) stages: the fullest stage holds ceil((L + 2)/(pp·v))·v layers and no edge row,
    which is shorter whenever the edges would otherwise sit on one overfull stage."""
    pp = ctx.deg[Strategy.PP]
    if not ctx.stack.uneven_stages:
        return t_mb
    v = np.where(ctx.schedule == Schedule.INTERLEAVED.code, ctx.virtual, 1).astype(float)
    even = np.ceil(n_layers / pp)
    units = np.ceil((n_layers + EDGE_LAYERS) / (pp * v)) * v
    per_layer = (t_mb - edge) / even
    return np.where(pp > 1, np.minimum(t_mb, units * per_layer), t_mb)


def _pipeline(t_mb: Any, ctx: _Context) -> tuple[Any, Any, Any]:
    """(stage time incl. bubble, bubble time, bubble fraction): fill (p−1)/v over M microbatches."""
    pp, M = ctx.deg[Strategy.PP], ctx.M
    v = np.where(ctx.schedule == Schedule.INTERLEAVED.code, ctx.virtual, 1).astype(float)
    fill = np.where(pp > 1, (pp - 1) / v, 0.0)
    return t_mb * (M + fill), t_mb * fill, fill / (M + fill)


def _in_flight(ctx: _Context) -> Any:
    """Microbatches whose activations a stage holds at once: GPipe all M, 1F1B at most pp.
    The interleaved schedule's warm-up runs (pp − 1) more virtual-stage chunks on the first
    rank, 1 + (pp − 1)/(pp·v) times 1F1B's activations (Megatron-LM
    megatron/training/theoretical_memory_usage.py compute_activation_memory:
    interleaved_schedule_memory_penalty)."""
    pp, M = ctx.deg[Strategy.PP], ctx.M
    gpipe = ctx.schedule == Schedule.GPIPE.code
    v = np.maximum(ctx.virtual, 1)
    interleaved = (ctx.schedule == Schedule.INTERLEAVED.code) & (v > 1)
    penalty = np.where(interleaved, 1 + (pp - 1) / (pp * v), 1.0)
    return np.where(pp > 1, np.where(gpipe, M, np.minimum(M, pp) * penalty), 1.0)


def _per_candidate(x: Any, w: Walk, inv: np.ndarray) -> Any:
    return np.broadcast_to(np.asarray(x, float), (w.n,))[inv]


def _zero_groups(ctx: _Context) -> tuple[Any, Any]:
    """The ranks ZeRO shards optimizer state (and gradients) over, for dense and for expert
    weights: every rank holding a replica. For the stacks that is the data axis with the
    context-parallel ranks (Megatron's distributed optimizer uses the data-parallel group with
    context parallelism, torchtitan's FSDP the dp_shard×cp mesh) and, for dense weights, the
    expert-parallel ranks too (Megatron carves EP out of DP; expert weights shard over the
    expert-data-parallel group only, world / (ETP·EP·PP): with expert_tensor_parallel_size 1 the
    tensor ranks hold whole replicas of the same experts and join it — Megatron-LM
    megatron/core/parallel_state.py expert_data_parallel_size). The idealised machine shards
    over `data` (the book)."""
    dp = ctx.deg[Strategy.DP]
    if ctx.stack.book:
        return dp, dp
    replicas = dp * ctx.deg[Strategy.SP]
    experts = replicas if ctx.expert_tp else replicas * ctx.deg[Strategy.TP]
    return replicas * ctx.deg[Strategy.EP], experts


def _memory(
    model: ModelSpec, w: Walk, ctx: _Context, opt: OptimizerPolicy, remats
) -> TrainingMemory:
    p, g, o, stacked, temps = _memory_parts(model, w, ctx, opt, remats)
    return TrainingMemory(p, g, o, stacked * _in_flight(ctx), temps)


def _memory_parts(
    model: ModelSpec, w: Walk, ctx: _Context, opt: OptimizerPolicy, remats
) -> tuple[Any, Any, Any, Any, Any]:
    """`_memory`'s parameters, gradients, optimizer state, one microbatch's saved activations
    on the fullest stage (times the microbatches in flight: the activations) and temporaries:
    none of them reads the schedule (`_timeline_context`)."""
    mp = w.memory
    assert mp is not None
    inv, pp = ctx.inv, ctx.deg[Strategy.PP]
    total = _per_candidate(mp.params_local, w, inv)
    expert = _per_candidate(mp.expert_params_local, w, inv)
    dense_group, expert_group = _zero_groups(ctx)
    p, g, o = persistent_bytes(total - expert, opt, dense_group, ctx.zero)
    pe, ge, oe = persistent_bytes(expert, opt, expert_group, ctx.zero)
    p, g, o = p + pe, g + ge, o + oe
    acc, copy = _accumulator(total, ctx, opt)
    p, g = p + copy, g + acc
    saved = [np.broadcast_to(np.asarray(mp.saved_per_layer[r], float), (w.n,)) for r in remats]
    act_layer = np.choose(ctx.remat_idx, [s[inv] for s in saved])
    layers_per_stage = np.ceil(model.n_layers / pp)
    stacked = act_layer * layers_per_stage  # the fullest stage, times the in-flight microbatches
    one_layer = np.broadcast_to(
        np.asarray(mp.saved_per_layer[Remat(RematKind.NONE)], float), (w.n,)
    )[inv]
    gathered = fsdp_gathered_bytes(
        np.broadcast_to(np.asarray(mp.weights_gathered_bytes, float), (w.n,))[inv],
        ctx.deg[Strategy.FSDP],
        model.n_layers,
        layers_per_stage,
        ctx.reuse,
    )
    # without remat the forward's gathered weights stay alive until their backward pass;
    # with it, one layer's intermediates are rebuilt next to two layers' gathered weights.
    # The fp32 logits live from the output head's forward to the loss's backward, which runs
    # before any layer's backward: they are never alive beside a rebuilt layer, so the peak
    # holds the larger of the two, not both
    logits = np.broadcast_to(np.asarray(mp.logits_bytes, float), (w.n,))[inv]
    temps = gathered + np.maximum(np.where(ctx.reuse, 0.0, one_layer), logits)
    return p, g, o, stacked, temps


def _accumulator(params_local: Any, ctx: _Context, opt: OptimizerPolicy) -> tuple[Any, Any]:
    """(accumulator bytes, cast-parameter bytes) per chip of a stack that accumulates the
    microbatches' gradients in a buffer of its own (`Stack.accumulator_bytes`; MaxText's
    jax.lax.scan carry, specs/frameworks/maxtext.toml [gradient_accumulation]): present with
    more than one accumulation step, beside each microbatch's own gradient. Where the
    accumulator is narrower than the parameters the stack differentiates a cast copy of them
    (MaxText's shard_optimizer_over_data: bf16 `ga_params`, kept for the whole loop). Under
    pipeline parallelism the microbatches are the pipeline's, not accumulation steps (MaxText:
    gradient_accumulation_steps 1, launch/maxtext.py `_batch_overrides`)."""
    per = ctx.stack.accumulator_bytes(opt.param_bytes, ctx.zero, ctx.deg[Strategy.DP])
    many = (ctx.M > 1) & (ctx.deg[Strategy.PP] == 1)
    acc = np.where(many, params_local * per, 0.0)
    copy = np.where(many & (per < opt.param_bytes), params_local * per, 0.0)
    return acc, copy


def _accumulation_s(
    params_local: Any, acc: Any, copy: Any, opt: OptimizerPolicy, hbm_bytes_per_s: Any
) -> tuple[Any, Any]:
    """(seconds per microbatch, seconds per step) of the accumulator's HBM passes
    (`_accumulator`'s bytes): each microbatch's add reads the accumulator and the new
    gradient and writes the sum (3 x its bytes, MaxText gradient_accumulation.py:136); once
    per step it is zeroed (:148) and divided by the weights (read and write, :184-187), and
    the cast copy of the parameters is made (read the parameters, write the copy, :93-100)."""
    cast = np.where(copy > 0, params_local * opt.param_bytes + copy, 0.0)
    return 3.0 * acc / hbm_bytes_per_s, (3.0 * acc + cast) / hbm_bytes_per_s


def _memory_of(model: ModelSpec, w: Walk, ctx: _Context, opt, key: tuple | None):
    """`_memory`: one plan's kept by (its walk's memory pieces, which a repriced walk shares,
    the model, the stack) and the values of its context and optimizer."""
    if key is None or w.n != 1:
        return _memory(model, w, ctx, opt, _remats(w))
    objs = (w.memory, model, ctx.stack)
    return _MEMORY(objs, (key, opt), lambda: _memory(model, w, ctx, opt, _remats(w)))


def _pass_compute(s: _Sums, forward: bool, classes: tuple[OpClass, ...] | None = None) -> Any:
    """Compute seconds per microbatch of one pass (of the op classes given, else all); the
    backward pass holds remat's recompute."""
    if forward:
        return s.compute(forward=True, classes=classes)
    return s.compute(forward=False, classes=classes) + s.compute(rerun_only=True, classes=classes)


def _pass_windows(s: _Sums, forward: bool) -> dict[str, Any]:
    """Compute seconds per microbatch in one pass, whole and by op class (overlap windows)."""
    gemm = (OpClass.DENSE_GEMM, OpClass.EXPERT_GEMM)
    return {
        "pass": _pass_compute(s, forward),
        "gemm": _pass_compute(s, forward, gemm),
        "attention": _pass_compute(s, forward, (OpClass.ATTENTION,)),
    }


def _shared(v: Any, share: Any) -> Any:
    """`v` times a class's FSDP share (`_fsdp_share`); the float 1.0 is not multiplied by."""
    return v if type(share) is float and share == 1.0 else v * share


def _microbatch_exposure(
    s: _Sums, ctx: _Context, modes, layers: Any, chip: Any = None
) -> tuple[dict[Overlap, Any], dict[str, Any]]:
    """(raw seconds per class, exposed seconds per group) of one microbatch's collectives.

    Per pass, each class hides its profile's fraction of what is not always exposed, at most
    the compute of its window; a group's classes share their links, so together they hide
    at most one window's worth."""
    comm_all = {c: s.comm((c,)) for c in Overlap if c not in _PER_STEP}
    share = {c: _fsdp_share(c, ctx) for c in comm_all}  # the float 1.0 is not multiplied by
    exposed = {}
    for forward in (True, False):
        win = _pass_windows(s, forward)
        for g in EXPOSURE:
            total, hidden, cap = 0.0, 0.0, 0.0
            for c in g.classes:
                comm = s.comm((c,), forward=True)
                comm = comm if forward else comm_all[c] - comm
                comm = _shared(comm, share[c])
                h, w_c = _hidden(modes[c], c, comm, forward, win, ctx, layers)
                # a window is a sum of compute seconds (never -0.0)
                hidden, cap = (
                    hidden + h,
                    _at_least_zero(w_c) if c is g.classes[0] else np.maximum(cap, w_c),
                )
                total = total + comm
            exposed[g.name] = exposed.get(g.name, 0.0) + total - np.minimum(hidden, cap)
    if _pairs_experts(ctx.stack, modes):
        fwd = s.comm((Overlap.EXPERT,), forward=True)
        sm = ctx.stack.dispatch_sm_share(chip)
        paired = _combined_1f1b(s, ctx, fwd, comm_all[Overlap.EXPERT] - fwd, sm)
        exposed["ep"] = np.where(modes[Overlap.EXPERT].on, paired, exposed["ep"])
    raw = {c: _shared(v, share[c]) for c, v in comm_all.items()}
    return raw, exposed


def _combined_1f1b(s: _Sums, ctx: _Context, fwd: Any, back: Any, sm_share: float = 0.0) -> Any:
    """Exposed expert all-to-all seconds per microbatch under Megatron's combined 1F1B
    schedule (--overlap-moe-expert-parallel-comm), which runs one microbatch's forward layer
    beside another's backward layer in three phases (NVIDIA/Megatron-LM@d98e8a64
    megatron/core/models/common/model_chunk_schedule_plan.py:243-245, run):

        comm stream:    combine_bwd      | dispatch_fwd -> dispatch_bwd    | combine_fwd
        compute stream: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | pre_dispatch_bwd

    A phase lasts as long as the longer of its two streams; while the all-to-all runs, the
    compute has only the SMs the dispatcher's kernels leave it (a share `sm_share` held,
    Stack.dispatch_sm_share), so a phase of X seconds of communication and C of compute takes
    max(X, C + sm_share·X) and shows max(X − C, sm_share·X) beyond its compute. Its compute
    is the routed experts (`mlp`, walk.ROUTED_EXPERT_ROWS) on
    one side, the rest of the layer (`pre_dispatch`: attention, router, shared experts) on the
    other. The dispatch and the combine move the same bytes (half of a pass's all-to-all time
    each). Passes outside the 1F1B steady state run unpaired, all their all-to-alls exposed:
    the warm-up's forwards and the flush's backwards, W of the M·v (virtual) microbatch passes,
    W = 2(pp − 1) + (v − 1)·pp + 1 on the first stage (megatron/core/pipeline_parallel/
    schedules.py:964-970, one extra warm-up forward with the EP overlap; microbatch group
    pp), W = 1 without a pipeline (combined_1f1b.py combined_1f1b_schedule_for_no_pipelining:
    the first forward and the last backward run alone)."""
    host = (OpClass.HOST_SYNC,)
    e_f, e_b = s.experts(forward=True), s.experts(forward=False)
    a_f = _pass_compute(s, True) - _pass_compute(s, True, host) - e_f
    a_b = _pass_compute(s, False) - _pass_compute(s, False, host) - e_b

    def shows(x: Any, c: Any) -> Any:
        return np.maximum(x - c, sm_share * x)

    paired = shows(back / 2, a_f) + shows((fwd + back) / 2, e_f + e_b) + shows(fwd / 2, a_b)
    pp = ctx.deg[Strategy.PP]
    v = np.where(ctx.schedule == Schedule.INTERLEAVED.code, np.maximum(ctx.virtual, 1), 1)
    warm = np.where(pp > 1, 2 * (pp - 1) + (v - 1) * pp + 1, 1)
    alone = np.minimum(1.0, warm / np.maximum(ctx.M * v, 1))
    return alone * (fwd + back) + (1.0 - alone) * paired


_PER_STEP = (Overlap.GRAD_REDUCE_STEP, Overlap.PIPELINE)


def _fsdp_share(c: Overlap, ctx: _Context) -> Any:
    """FSDP traffic of one microbatch: all of it, or 1/M where the stack gathers and reduces
    once per step (torchtitan and Megatron-FSDP under pipeline parallelism)."""
    if c not in (Overlap.WEIGHT_GATHER, Overlap.GRAD_REDUCE_MB):
        return 1.0
    out: Any = 1.0
    for piped in (False, True):
        _, gather, reduce_ = ctx.stack.fsdp_when(piped)
        per = gather if c == Overlap.WEIGHT_GATHER else reduce_
        if per == Per.STEP:
            out = np.where((ctx.deg[Strategy.PP] > 1) == piped, 1.0 / ctx.M, out)
    return out


def _grad_reduce_factor(st: Stack, opt: OptimizerPolicy | None) -> float:
    """Bytes of the replicas' gradient sum against bf16: the stack's reduction dtype, except
    that a master-weights optimizer whose gradient buffer is 16-bit reduces that buffer as it
    is (Megatron: grad_dtype = fp32 only if grad_reduce_in_fp32, MLM
    megatron/core/distributed/param_and_grad_buffer.py:924 @d98e8a64; NeMo's
    distributed_fused_adam grad_sync_dtype)."""
    f = st.grad_reduce_bytes_factor
    if opt is not None and opt.state_bytes >= 12.0 and opt.grad_bytes < 4.0:
        return min(f, opt.grad_bytes / 2.0)
    return f


def _replica_sync(
    s: _Sums, ctx: _Context, modes, layers: Any, opt: OptimizerPolicy | None = None
) -> tuple[Any, Any, Any]:
    """The replicas' gradient sum and ZeRO-1/2 parameter gather over the `data` axis:
    (gradient seconds per step, parameter-gather seconds per step, exposed seconds per step).

    The walk prices the gradient sum as an all-reduce of bf16 gradients; the stack reduces in
    its own dtype (fp32 in Megatron and PyTorch), as a reduce-scatter when the optimizer state
    is sharded (ZeRO >= 1; AR = RS + AG), followed by an all-gather of the updated bf16
    parameters. Paid once per step (behind the last microbatch's backward; the gather behind
    the first forward) or once per microbatch where the stack reduces every microbatch."""
    ar = s.comm((Overlap.GRAD_REDUCE_STEP,))
    st = ctx.stack
    if st.book:
        grad, gather = ar, 0.0 * ar
    else:
        sharded = ctx.zero >= 1
        grad = ar * _grad_reduce_factor(st, opt) * np.where(sharded, 0.5, 1.0)
        gather = np.where(sharded & st.param_gather, 0.5 * ar, 0.0)
    per_mb = np.array(
        [[st.grad_reduce_per(z, piped) == Per.MICROBATCH for z in range(4)] for piped in (0, 1)]
    )
    per_mb = per_mb[(ctx.deg[Strategy.PP] > 1).astype(int), np.clip(ctx.zero, 0, 3)]
    back = _pass_windows(s, False)
    fwd = _pass_windows(s, True)
    g_mode, w_mode = modes[Overlap.GRAD_REDUCE_STEP], modes[Overlap.WEIGHT_GATHER]
    g_exp = grad - _hidden(g_mode, Overlap.GRAD_REDUCE_STEP, grad, False, back, ctx, layers)[0]
    w_exp = gather - _hidden(w_mode, Overlap.GRAD_REDUCE_STEP, gather, True, fwd, ctx, layers)[0]
    times = np.where(per_mb, ctx.M, 1.0)
    return grad * times, gather, g_exp * times + w_exp


def _step(
    model, systems, workload, w: Walk, tot: Totals, ctx: _Context, eff, opt, keep, with_terms
) -> StepArrays:
    chip = systems[0].chip
    key = _context_key(ctx)
    layer_s = eff.layer_overhead_s + ctx.stack.layer_overhead_s
    step_s = eff.step_overhead_s + ctx.stack.step_overhead_s
    # the timeline of one microbatch and the per-step collectives, once per distinct choice of
    # what they read (`_timeline_context`), then read out to the candidates
    tctx, tinv = _timeline_context(ctx)
    modes = _modes_of(tctx, chip, key)
    if tinv is not None and _pairs_experts(tctx.stack, modes):  # reads the schedules
        tctx, tinv = ctx, None
        modes = _modes_of(ctx, chip, key)
    # a stack that accumulates into a buffer of its own (MaxText) passes over it per
    # microbatch and once per step (`_accumulator`): per candidate of the timeline
    hbm = chip.hbm_bw_bytes_per_s * eff.hbm_fraction(chip)
    params_local = _per_candidate(w.memory.params_local, w, tctx.inv)
    acc, copy = _accumulator(params_local, tctx, opt)
    acc_mb, acc_step = _accumulation_s(params_local, acc, copy, opt, hbm)
    tl = _timeline(model, tot, tctx, eff, opt, chip, modes, layer_s, step_s, with_terms, acc_mb)

    def out(v: Any) -> Any:
        return v if tinv is None or np.ndim(v) == 0 else v.take(tinv)

    def per_candidate(d: dict[str, Any]) -> Mapping[str, Any]:
        return d if tinv is None else _Gathered(d, tinv)

    edge = np.broadcast_to(np.asarray(tot.edge_s, float), ctx.n_rows)[ctx.inv]
    t_mb = _balanced_stage(out(tl["t_mb"]), edge, model.n_layers, ctx)
    t_pipe, bubble_t, bubble_frac = _pipeline(t_mb, ctx)
    # the update streams the parameters, one gradient and the state once; an accumulating
    # stack also zeroes and divides its accumulator (and casts the parameters) once per step
    if tinv is None:
        mem = _memory_of(model, w, ctx, opt, key)
        opt_t = ((mem.params - copy) * 2 + (mem.grads - acc) + mem.optimizer * 2) / hbm + acc_step
    else:  # the parts without the schedule once per timeline
        p, g, o, stacked, temps = _memory_parts(model, w, tctx, opt, _remats(w))
        opt_t = out(((p - copy) * 2 + (g - acc) + o * 2) / hbm + acc_step)
        mem = TrainingMemory(out(p), out(g), out(o), out(stacked) * _in_flight(ctx), out(temps))
    step = t_pipe + out(tl["p2p"]) + out(tl["sync_exposed"]) + opt_t + step_s
    n_chips = np.array([sy.n_chips for sy in systems], dtype=float)[ctx.sys_idx]
    mf = model_flops(model, workload.batch_tokens)
    peak = mfu_peak(chip)
    flops = out(tl["flops"])
    mem_total = mem.total
    mesh_bad = w.mesh_bad[ctx.inv]
    over = (mem_total > chip.fit_hbm_bytes) & ~mesh_bad
    return StepArrays(
        step_time_s=step,
        compute_time_s=out(tl["compute"]),
        exposed_comm_time_s=out(tl["exposed_comm"]),
        bubble_time_s=bubble_t,
        bubble_fraction=bubble_frac,
        optimizer_time_s=opt_t,
        overhead_time_s=out(tl["overhead"]),
        comm=per_candidate(tl["comm"]),
        exposed=per_candidate(tl["exposed"]),
        memory=mem.as_dict(),
        memory_total=mem_total,
        flops_per_chip=flops,
        model_flops=mf,
        mfu=mf / (step * n_chips * peak),
        mfu_compute_dtype=mf / (step * n_chips * compute_peak(chip, ctx.dtypes)),
        hfu=flops / (step * peak),
        tokens_per_s=workload.batch_tokens / step,
        infeasible=mesh_bad | over,
        reason=Reasons(w.mesh_reason, mesh_bad, over, mem_total, chip.fit_hbm_bytes, ctx.inv),
        walk=w if keep else None,
        terms=per_candidate(tl["terms"]),
    )


class _Gathered(Mapping):
    """Per-candidate arrays read out of a timeline's (`_timeline_context`) when first asked:
    the planner reads one sum of them per candidate (`comm_total`) and every class only for
    the plans it lists."""

    def __init__(self, rows: Mapping[str, Any], inv: np.ndarray) -> None:
        self._rows, self._inv, self._out = rows, inv, {}

    def __getitem__(self, k: str) -> Any:
        hit = self._out.get(k)
        if hit is None:
            v = self._rows[k]
            hit = self._out[k] = v if np.ndim(v) == 0 else v.take(self._inv)
        return hit

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def total(self) -> Any:
        """sum(self.values()), summed per timeline and read out once."""
        v = sum(self._rows.values())
        return v if np.ndim(v) == 0 else v.take(self._inv)


def comm_total(r: StepArrays) -> Any:
    """The collectives' time per step of each candidate if nothing overlapped:
    sum(r.comm.values())."""
    c = r.comm
    return c.total() if isinstance(c, _Gathered) else sum(c.values())


def _timeline(
    model, tot: Totals, ctx: _Context, eff, opt, chip, modes, layer_s, step_s, with_terms, acc_mb
) -> dict[str, Any]:
    """What `_step` reads of one microbatch's timeline and the per-step collectives, per
    candidate of `ctx`: `t_mb` (one microbatch's compute, exposed collectives and fixed costs,
    before the stage layout), the pipeline hops `p2p` and the replicas' exposed sync per step,
    and the per-step figures (compute, exposed communication, overhead, FLOPs, raw and exposed
    time by class and group, `terms`)."""
    try:
        return _timeline_of(
            model, tot, ctx, eff, opt, chip, modes, layer_s, step_s, with_terms, acc_mb
        )
    finally:
        _AT_LEAST_ONE.clear()  # the candidates' arrays are not kept past their timeline


def _timeline_of(
    model, tot: Totals, ctx: _Context, eff, opt, chip, modes, layer_s, step_s, with_terms, acc_mb
) -> dict[str, Any]:
    s = _sums_of(tot, ctx)
    M = ctx.M
    pp = ctx.deg[Strategy.PP]
    layers = np.ceil(model.n_layers / pp)
    compute = s.compute() - _host_idle_hidden(s, modes)
    compute = compute + acc_mb  # the accumulator's add: an elementwise pass per microbatch
    comm, exposed = _microbatch_exposure(s, ctx, modes, layers, chip)
    # fixed costs: per layer per microbatch pass (forward and backward), per step
    overhead_mb = layer_s * 2 * layers
    exposed_mb = sum(exposed.values())
    hop = s.comm((Overlap.PIPELINE,), forward=True)
    p2p = 2 * hop * np.maximum(pp - 1, 0)
    grad_step, param_gather, sync_exposed = _replica_sync(s, ctx, modes, layers, opt)
    comm_step = {c.value: v * M for c, v in comm.items()}
    comm_step[Overlap.GRAD_REDUCE_STEP.value] = grad_step + param_gather
    comm_step[Overlap.PIPELINE.value] = p2p
    exposed_step = {k: v * M for k, v in exposed.items()}
    exposed_step["grad_step"] = sync_exposed
    exposed_step["pp"] = p2p
    return {
        "t_mb": compute + exposed_mb + overhead_mb,
        "p2p": p2p,
        "sync_exposed": sync_exposed,
        "compute": compute * M,
        "exposed_comm": exposed_mb * M + p2p + sync_exposed,
        "overhead": overhead_mb * M + step_s,
        "flops": s.flops() * M,
        "comm": comm_step,
        "exposed": exposed_step,
        "terms": _terms(s, M, mfu_peak(chip) * eff.matmul, grad_step) if with_terms else {},
    }


def _timeline_context(ctx: _Context) -> tuple[_Context, np.ndarray | None]:
    """The candidates `_timeline` tells apart, and each candidate's one of them (None: all).

    The timeline of a microbatch and the per-step collectives read a candidate's walk row
    (degrees, microbatches, system), remat choice, ZeRO stage, plan flags, and of its schedule
    only whether it is interleaved with virtual stages > 1 (an overlap condition); the stage
    layout, the bubble and the in-flight activations (read per candidate in `_step` and
    `_memory`) read the schedule and the virtual stages themselves. Candidates that differ
    only there (1F1B against GPipe, interleaved schedules of several virtual-stage counts)
    share one timeline. The exception, Megatron's combined-1F1B expert overlap, counts the
    warm-up passes of each schedule (`_pairs_experts`: `_step` then times every candidate)."""
    n = len(ctx.inv)
    if n < 2:
        return ctx, None
    sched = np.asarray(ctx.schedule, dtype=np.int64)
    virt = np.asarray(ctx.virtual, dtype=np.int64)
    # which (schedule, virtual stages) pairs occur: the timeline can share only if two pairs
    # of the same interleaved bit do
    vr = int(virt.max()) + 1
    pairs = (
        np.flatnonzero(np.bincount(sched * vr + virt))
        if sched.min() >= 0 and virt.min() >= 0
        else None
    )
    if pairs is not None:
        interleaved = (pairs // vr == Schedule.INTERLEAVED.code) & (pairs % vr > 1)
        if interleaved.sum() <= 1 and (~interleaved).sum() <= 1:
            return ctx, None
    il = (sched == Schedule.INTERLEAVED.code) & (virt > 1)
    # one mixed-radix key, built in place; a column of one value adds no digit
    key = np.array(ctx.inv, dtype=np.int64)
    space = int(key.max()) + 1
    for c in (ctx.remat_idx, ctx.zero, *ctx.flags.values(), il):
        c = np.asarray(c)
        lo, hi = int(c.min()), int(c.max())
        if lo == hi:
            continue
        radix = hi - lo + 1
        key *= radix
        key += c
        if lo:
            key -= lo
        space *= radix
    if space <= 4 * n:  # a table of the key space, no sort
        seen = np.zeros(space, dtype=bool)
        seen[key] = True
        k = int(np.count_nonzero(seen))
        if k == n:
            return ctx, None
        ids = np.cumsum(seen, dtype=np.int64)
        ids -= 1
        tinv = ids.take(key)
    else:
        _, tinv = np.unique(key, return_inverse=True)
        tinv = tinv.reshape(-1)
        k = int(tinv.max()) + 1
        if k == n:
            return ctx, None
    first = np.empty(k, dtype=np.int64)
    first[tinv] = np.arange(n, dtype=np.int64)  # one candidate of each (any: they agree)
    return _subset(ctx, first), tinv


def _subset(ctx: _Context, idx: np.ndarray) -> _Context:
    """`ctx` for candidates `idx` only."""
    return replace(
        ctx,
        inv=ctx.inv.take(idx),
        deg={s: v.take(idx) for s, v in ctx.deg.items()},
        M=ctx.M.take(idx),
        zero=np.asarray(ctx.zero).take(idx),
        schedule=np.asarray(ctx.schedule).take(idx),
        virtual=np.asarray(ctx.virtual).take(idx),
        sys_idx=np.asarray(ctx.sys_idx).take(idx),
        remat_idx=np.asarray(ctx.remat_idx).take(idx),
        reuse=ctx.reuse.take(idx),
        flags={k: np.asarray(v).take(idx) for k, v in ctx.flags.items()},
    )


def _pairs_experts(stack: Stack, modes: Mapping[Overlap, ModeArrays]) -> bool:
    """Whether the expert all-to-alls run under Megatron's combined 1F1B for some candidate
    (`_combined_1f1b`, which reads each candidate's schedule)."""
    ep = stack.overlap(FRAMEWORK_CLASS[Overlap.EXPERT]).on
    return ep.window == Window.COMBINED_1F1B and bool(modes[Overlap.EXPERT].on.any())


def _host_idle_hidden(s: _Sums, modes: Mapping[Overlap, ModeArrays]) -> Any:
    """The MoE layers' host-sync idle (walk `moe/host_sync`) the step does not pay: under the
    EP-overlap schedule (combined 1F1B) the other microbatch's queued kernels keep the GPU busy
    while the host waits. Megatron-Bridge's Nsight profile of Qwen3-30B-A3B on 16 H100
    (skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md@067f987d:92-122): overlap off,
    1.9 s of a 24.71 s step idle; on, a GPU-active union of 21.22 s in a 20.99-21.07 s step."""
    idle = s.compute(classes=(OpClass.HOST_SYNC,))
    return np.where(modes[Overlap.EXPERT].on, idle, 0.0)


def _remats(w: Walk) -> list[Remat]:
    assert w.memory is not None
    return list(w.memory.saved_per_layer)


def _terms(s: _Sums, M: Any, pk: float, grad_step: Any) -> dict[str, Any]:
    """Raw per-step terms by pass (see `step_terms`): math time, and communication of the first
    forward pass vs everything after it (remat's second forward runs inside the backward pass)."""
    act = tuple(c for c in Overlap if c not in (Overlap.GRAD_REDUCE_STEP, Overlap.PIPELINE))
    return {
        "t_math_forward_s": s.flops(forward=True) * M / pk,
        "t_math_backward_s": s.flops(forward=False) * M / pk,
        "t_math_recompute_s": s.flops(rerun_only=True) * M / pk,
        "fsdp_forward_s": s.comm((Overlap.WEIGHT_GATHER,), forward=True) * M,
        "tp_forward_s": s.comm((Overlap.TENSOR,), forward=True) * M,
        "comm_forward_s": s.comm(act, forward=True) * M,
        "comm_backward_s": (s.comm(act, rerun_only=True) + s.comm(act, forward=False)) * M
        + grad_step,
    }


# --------------------------------------------------------------------------------------
# One plan, with the details
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
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
    overhead_time_s: float = 0.0  # the profile's fixed per-layer and per-step costs
    mfu_compute_dtype: float = 0.0  # model FLOPs over the dense matmuls' dtype peak
    framework: str = "ideal"  # the stack whose behaviour was costed
    compute_dtype: str = "bf16"  # the dense matmuls' dtype (the second MFU's peak)

    def __repr__(self) -> str:  # one line: the plan's spec and its key figures, not a dump
        from roofline.units import fmt_bytes, fmt_time

        fits = "" if self.fits else ", does not fit"
        return (
            f"StepCost({self.plan.describe()} on {self.system.name}: step "
            f"{fmt_time(self.step_time_s)}, MFU {self.mfu:.1%}, "
            f"{fmt_bytes(self.memory_per_chip_bytes)}/chip{fits})"
        )

    @property
    def terms(self) -> dict[str, float]:
        """The step's terms by key: compute, bubble, optimizer, overhead, "exposed:<group>"."""
        out = {
            "compute": self.compute_time_s,
            "bubble": self.bubble_time_s,
            "optimizer": self.optimizer_time_s,
            "overhead": self.overhead_time_s,
        }
        out.update({f"exposed:{k}": v for k, v in self.exposed_time_s.items()})
        return out

    @property
    def bottleneck(self) -> str:
        """The key of the largest term of the step (see `terms`; report.text words it)."""
        t = self.terms
        return max(t, key=lambda k: t[k])

    @property
    def run_time_s(self) -> float:
        return self.workload.total_tokens / self.tokens_per_s if self.workload.total_tokens else 0.0

    @property
    def run_cost_usd(self) -> float | None:
        return run_cost_usd(self.run_time_s, self.system.n_chips, self.system.usd_per_chip_hour)

    def to_dict(self) -> dict[str, Any]:
        e = self.efficiency
        return {
            "plan": self.plan.to_dict(),
            "step_time_s": self.step_time_s,
            "mfu": self.mfu,
            "mfu_compute_dtype": self.mfu_compute_dtype,
            "compute_dtype": self.compute_dtype,
            "framework": self.framework,
            "hfu": self.hfu,
            "tokens_per_s": self.tokens_per_s,
            "memory_per_chip_bytes": self.memory_per_chip_bytes,
            "memory_breakdown": dict(self.memory_breakdown),
            "hbm_bytes": self.system.chip.hbm_bytes,
            "hbm_fit_bytes": self.system.chip.fit_hbm_bytes,
            "fits": self.fits,
            "reason": self.reason,
            "compute_time_s": self.compute_time_s,
            "exposed_comm_time_s": self.exposed_comm_time_s,
            "comm_time_s": dict(self.comm_time_s),
            "exposed_time_s": dict(self.exposed_time_s),
            "bubble_fraction": self.bubble_fraction,
            "bubble_time_s": self.bubble_time_s,
            "optimizer_time_s": self.optimizer_time_s,
            "overhead_time_s": self.overhead_time_s,
            "bottleneck": self.bottleneck,
            "run_time_s": self.run_time_s,
            "run_time_days": self.run_time_s / DAY,
            "run_cost_usd": self.run_cost_usd,
            "flops_per_chip_per_step": self.flops_per_chip,
            "model_flops_per_step": self.model_flops,
            "efficiency": e.to_dict(),
            "collectives": list(self.collectives),
        }


def structure_of(plan: Plan, model: ModelSpec) -> Structure:
    kv_rep = kv_heads_replicated(model.n_kv_heads, model.mla is not None, plan.degrees.tp)
    return Structure(
        plan.active,
        plan.remat,
        plan.sequence_parallel,
        plan.collective_matmul,
        bool(kv_rep),
        plan.expert_tp,
    )


def candidates_of(plan: Plan) -> Candidates:
    d = plan.degrees
    return Candidates(
        {s: np.array([d.of(s)]) for s in Strategy},
        np.array([plan.microbatches]),
        np.array([plan.zero]),
        np.array([plan.schedule.code]),
        np.array([plan.virtual_stages]),
        overlap_ep=np.array([flag_code(plan.overlap_ep)], dtype=np.int8),
    )


def check_plan(
    model: ModelSpec, system: System, workload: Workload, plan: Plan, stack: Stack | None = None
) -> list[str]:
    """Reasons (possibly none) why a plan cannot run, before costing it (feasibility.py)."""
    uneven = stack is not None and stack.uneven_stages
    return plan_problems(model, system.n_chips, workload, plan, uneven_stages=uneven)


def _evaluate_one(
    model, system, workload, plan: Plan, eff, *, keep: bool, ops=None, policy=CHEAPEST, fw=None
) -> StepArrays:
    """One plan's StepArrays: its walk's records kept (`keep`: evaluate_plan's collectives) or
    the per-pass terms added (not `keep`: step_terms)."""
    return evaluate_plans(
        model,
        system,
        workload,
        structure_of(plan, model),
        candidates_of(plan),
        eff=eff,
        optimizer=plan.optimizer,
        keep_walk=keep,
        ops=ops,
        policy=policy,
        plan=plan,
        with_terms=not keep,
        framework=fw,
    )


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
    T_math), the math and communication time by pass (`t_math_forward_s`, `comm_forward_s`,
    ...), and the communication time of each overlap class (fsdp, grad_mb, grad_step, tp, sp,
    ep, other, pp).

    No divisibility checks: the book's closed forms are continuous in the batch.
    """
    from roofline.specs.efficiency import PEAK

    eff = efficiency or PEAK
    r = _evaluate_one(model, system, workload, plan, eff, keep=False, ops=ops)
    out = {
        "t_math_s": float(r.flops_per_chip[0]) / (mfu_peak(system.chip) * eff.matmul),
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
    some overlap classes (e.g. ("grad_step",) for the DCN data-parallel reduction). Both sides
    are affine in the batch for the book's strategies (weights move a fixed amount, activations
    an amount ∝ B), so two evaluations of the algebra give the crossing exactly.
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
    policy: OptionPolicy = CHEAPEST,
    framework: str | Framework | Stack | None = None,
) -> StepCost:
    """Cost one plan. Raises PlanError if it cannot run at all (indivisible, wrong chip count).

    `framework` (a name such as "megatron", a `specs.framework.Framework` or None for the
    idealised machine) says what the stack does: its option policy, remat semantics, overlap,
    gradient timing and overheads. `policy` overrides its option policy (default: the stack's;
    the idealised machine takes the cheapest option).
    """
    _check_types(model=model, system=system, workload=workload, plan=plan)
    stack = stack_of(framework)
    problems = check_plan(model, system, workload, plan, stack)
    if problems:
        raise PlanError(
            f"plan {plan.describe()} cannot run: " + "; ".join(problems),
            rule="every sharded dimension splits evenly and the mesh uses every chip",
            fix="change the degrees (e.g. run `roofline train` without --plan to search)",
        )
    if plan.offload_activations:  # costed a layer above (training.offload), never ignored
        raise PlanError(
            f"plan {plan.describe()} keeps its saved activations in host memory",
            rule="evaluate_plan costs the activations in HBM; activation offload is costed on "
            "top of it",
            fix="call roofline.evaluate_offloaded(...) with the same arguments",
        )
    eff = training_profile(efficiency).for_framework(stack.name)
    r = _evaluate_one(model, system, workload, plan, eff, keep=True, policy=policy, fw=stack)
    return _step_cost(r, 0, 0, plan, system, workload, eff, stack, assume_mfu)


def evaluate_plan_rows(
    model: ModelSpec,
    systems: list[System],
    workload: Workload,
    structure: Structure,
    cand: Candidates,
    plans: list[Plan],
    *,
    remats: list[Remat] | None = None,
    efficiency: Efficiency | None = None,
    policy: OptionPolicy = CHEAPEST,
    framework: str | Framework | Stack | None = None,
) -> list[StepCost]:
    """`evaluate_plan` of several plans of one family in one multi-row walk (the planner's
    listed plans): `plans[i]` is candidate i of `cand` (on `systems[cand.system_idx[i]]`, with
    `remats[cand.remat_idx[i]]`), all in the same compute dtypes and optimizer. The walk does
    a single plan's arithmetic on arrays, so each StepCost equals `evaluate_plan`'s."""
    stack = stack_of(framework)
    sys_idx = cand.system_idx if cand.system_idx is not None else np.zeros(len(cand), int)
    on = [systems[int(j)] for j in sys_idx]
    for sysm, plan in zip(on, plans, strict=True):
        if check_plan(model, sysm, workload, plan, stack):  # evaluate_plan's error
            evaluate_plan(model, sysm, workload, plan, efficiency=efficiency, framework=stack)
    eff = training_profile(efficiency).for_framework(stack.name)
    r = evaluate_plans(
        model, systems, workload, structure, cand, eff=eff, optimizer=plans[0].optimizer,
        keep_walk=True, remats=remats, policy=policy, plan=plans[0],
        framework=stack,
    )  # fmt: skip
    _, row = _distinct_rows(cand)
    return [
        _step_cost(r, i, int(row[i]), p, on[i], workload, eff, stack) for i, p in enumerate(plans)
    ]


def family_step_cost(
    r: StepArrays,
    i: int,
    row: int,
    plan: Plan,
    system: System,
    workload: Workload,
    eff: Efficiency,
    stack: Stack,
) -> StepCost:
    """The StepCost of candidate `i` (row `row` of the walk) of a family's StepArrays walked
    with `keep_walk`: what `evaluate_plan_rows` gives for `plan` on its own structure, read off
    the family's arrays. The family's walk has every strategy of the search as a mesh axis, a
    strategy of degree 1 an axis of size 1 that the algebra prices at zero; its collectives
    are listed as the plan's own walk lists them: size-1 axes left out of each collective's
    axes and array texts, and a collective over size-1 axes only (zero seconds, absent from
    the plan's walk) dropped (`without_unit_axes`)."""
    return with_own_collectives(_step_cost(r, i, row, plan, system, workload, eff, stack))


def with_own_collectives(c: StepCost) -> StepCost:
    """A StepCost walked on a family's structure with its collectives as its plan's own walk
    lists them (`without_unit_axes` of its plan's size-1 axes)."""
    return replace(c, collectives=without_unit_axes(c.collectives, unit_axes(c.plan)))


def unit_axes(plan: Plan) -> frozenset[str]:
    """The mesh axes of a plan's strategies of degree 1 (size-1 axes of a family's walk)."""
    return frozenset(AXIS_OF[s] for s in Strategy if plan.degrees.of(s) == 1)


def without_unit_axes(rows: tuple[dict, ...], unit: frozenset[str]) -> tuple[dict, ...]:
    """Collective rows (`_list_collectives`) with the mesh axes in `unit` (size 1) left out:
    of each row's axes and of its before/after array texts; a row over those axes only moves
    nothing (`time_s` 0) and is dropped."""
    out = []
    for d in rows:
        axes = [a for a in d["axes"] if a not in unit]
        if not axes:
            continue
        before, after = (_without_axes_text(d[k], unit) for k in ("before", "after"))
        out.append({**d, "axes": axes, "before": before, "after": after})
    return tuple(out)


# a walk's array texts recur in every listed plan of a family: each (text, axes) rewritten once
_without_axes_text = functools.lru_cache(maxsize=4096)(without_axes_text)


def _step_cost(
    r: StepArrays,
    i: int,
    row: int,
    plan: Plan,
    system: System,
    workload: Workload,
    eff: Efficiency,
    stack: Stack,
    assume_mfu: float | None = None,
) -> StepCost:
    """The StepCost of candidate `i` of `r` (row `row` of its walk)."""

    def f(a: Any) -> float:
        return float(_at(a, i))

    step, tokens_s, mfu, hfu = f(r.step_time_s), f(r.tokens_per_s), f(r.mfu), f(r.hfu)
    mfu_dt = f(r.mfu_compute_dtype)
    dtypes = effective_dtypes(plan, system.chip)
    if assume_mfu is not None:
        mfu = hfu = check_mfu(assume_mfu)
        mfu_dt = mfu * mfu_peak(system.chip) / compute_peak(system.chip, dtypes)
        step = r.model_flops / (system.n_chips * mfu_peak(system.chip) * mfu)
        tokens_s = workload.batch_tokens / step
    return StepCost(
        plan=plan,
        system=system,
        workload=workload,
        step_time_s=step,
        compute_time_s=f(r.compute_time_s),
        exposed_comm_time_s=f(r.exposed_comm_time_s),
        bubble_time_s=f(r.bubble_time_s),
        bubble_fraction=f(r.bubble_fraction),
        optimizer_time_s=f(r.optimizer_time_s),
        overhead_time_s=f(r.overhead_time_s),
        comm_time_s=MappingProxyType({k: f(v) for k, v in r.comm.items()}),
        exposed_time_s=MappingProxyType({k: f(v) for k, v in r.exposed.items()}),
        memory_per_chip_bytes=f(r.memory_total),
        memory_breakdown=MappingProxyType({k: f(v) for k, v in r.memory.items()}),
        fits=not bool(r.infeasible[i]),
        reason=r.reason[i],
        mfu=mfu,
        hfu=hfu,
        tokens_per_s=tokens_s,
        flops_per_chip=f(r.flops_per_chip),
        model_flops=r.model_flops,
        efficiency=eff,
        collectives=_collective_rows(r.walk, row),
        mfu_compute_dtype=mfu_dt,
        framework=stack.name,
        compute_dtype=dtypes.matmul.value,
    )


def _check_types(**values: Any) -> None:
    """A typed error (not an AttributeError deep inside) for arguments of the wrong type."""
    want = {"model": ModelSpec, "system": System, "workload": Workload, "plan": Plan}
    for name, v in values.items():
        if not isinstance(v, want[name]):
            how = {
                "model": "roofline.load_model('llama-3-8b')",
                "system": "roofline.parse_system('h100:64')",
                "workload": "roofline.Workload(batch_tokens=4 * 2**20, seq_len=4096)",
                "plan": "roofline.parse_plan('fsdp=8,tp=8')",
            }[name]
            raise PlanError(
                f"{name} = {v!r} is a {type(v).__name__}, not a {want[name].__name__}",
                rule=f"evaluate_plan takes a {want[name].__name__} for {name}",
                fix=f"pass {how}",
            )


def check_mfu(mfu: Any) -> float:
    """An assumed MFU as a fraction in (0, 1], or a PlanError."""
    if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
        raise PlanError(
            f"--assume-mfu {mfu}",
            rule="MFU is a fraction in (0, 1] (model FLOPs over the chips' bf16 peak)",
            fix="write e.g. --assume-mfu 0.4",
        )
    return float(mfu)


def _at(a: Any, i: int) -> Any:
    """Entry i of a per-row array (a scalar or one-entry array: its value for every row)."""
    if type(a) is not np.ndarray or a.ndim != 1:
        a = np.asarray(a).reshape(-1)
    return a[i] if a.size > 1 else a[0]


def _collective_rows(w: Walk | None, row: int = 0) -> tuple[dict, ...]:
    """The chosen collectives of one row of a walk (a single plan's), one row per record.

    A single plan's walk is remembered (`core.walk.walk_rows`), and one repriced under a new
    profile shares its collectives, so its rows are listed once per collectives
    (`_COLL_ROWS`) and each StepCost gets its own copies of them."""
    if w is None:
        return ()
    if w.n != 1:
        return _list_collectives(w, row)
    listed = _COLL_ROWS((w.collectives,), row, lambda: _list_collectives(w, row))
    return tuple({**d, "axes": list(d["axes"])} for d in listed)


_COLL_ROWS = IdentityMemo(128)


def _list_collectives(w: Walk, row: int) -> tuple[dict, ...]:
    rows = []
    for c in w.collectives:
        if not bool(_at(c.chosen, row)):
            continue
        rows.append(
            {
                "op": c.op,
                "einsum": c.einsum,
                "phase": "forward" if c.pass_.value == "forward" else "backward",
                "kind": c.kind.value,
                "axes": list(c.axes),
                "tensor": c.tensor,
                "overlap": c.overlap.value,
                "counted": bool(_at(c.counted, row)),
                "bytes_per_chip": float(_at(c.bytes_per_chip, row)),
                "time_s": float(_at(c.time_s, row)),
                "copies": float(_at(c.copies, row)),
                "before": c.before,
                "after": c.after,
            }
        )
    return tuple(rows)


# --------------------------------------------------------------------------------------
# The book's back-of-envelope run
# --------------------------------------------------------------------------------------


def assumed_mfu_run(
    model: ModelSpec, workload: Workload, n_chips: int, peak_flops_per_s: float, mfu: float
) -> dict[str, float]:
    """Back-of-envelope run: 6·N·tokens / (chips · peak · MFU) (book applied-training.md),
    N the active parameters."""
    mfu = check_mfu(mfu)
    flops = model_flops(model, workload.total_tokens)
    t = flops / (n_chips * peak_flops_per_s * mfu)
    return {"total_flops": flops, "run_time_s": t, "run_time_days": t / DAY}


@dataclass(frozen=True)
class AssumedRun:
    """The book's back-of-envelope for a run on a system at an assumed MFU, with the minimum
    chips by memory (parameters + optimizer state + 4 bf16 checkpoints per layer)."""

    model: ModelSpec
    system: System
    workload: Workload
    mfu: float
    optimizer: OptimizerPolicy
    total_flops: float
    run_time_s: float
    active_params: float
    memory_needed_bytes: float

    @property
    def run_cost_usd(self) -> float | None:
        return run_cost_usd(self.run_time_s, self.system.n_chips, self.system.usd_per_chip_hour)

    @property
    def min_chips_by_memory(self) -> int:
        return math.ceil(self.memory_needed_bytes / self.system.chip.hbm_bytes)

    @property
    def peak_flops_per_s(self) -> float:
        return mfu_peak(self.system.chip)

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_flops": self.total_flops,
            "run_time_s": self.run_time_s,
            "run_time_days": self.run_time_s / DAY,
            "run_cost_usd": self.run_cost_usd,
            "mfu": self.mfu,
            "chips": self.system.n_chips,
            "params": count_params(self.model).total,
            "active_params": self.active_params,
            "memory_needed_bytes": self.memory_needed_bytes,
            "min_chips_by_memory": self.min_chips_by_memory,
            "formula": "6 * active params * tokens / (chips * peak_bf16 * MFU)",
        }


def assumed_run(
    model: ModelSpec,
    system: System,
    workload: Workload,
    mfu: float,
    optimizer: str | OptimizerPolicy,
) -> AssumedRun:
    opt = parse_optimizer(optimizer)
    est = assumed_mfu_run(model, workload, system.n_chips, mfu_peak(system.chip), mfu)
    params = count_params(model)
    need = minimum_memory_bytes(
        params.total, opt, model.d_model, model.n_layers, workload.batch_tokens
    )
    return AssumedRun(
        model,
        system,
        workload,
        float(mfu),
        opt,
        est["total_flops"],
        est["run_time_s"],
        params.active,
        need,
    )
