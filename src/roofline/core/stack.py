"""A training stack as the step model reads it: a framework profile applied to the walk.

`specs/framework.py` holds what each stack does as sourced data (docs/frameworks.md). This
module turns one profile into the answers the walk, the timeline and the planner ask for:

- `policy`: which of the algebra's options an einsum may take (per einsum family and mesh
  axis, the operand the stack moves: FSDP gathers weights, Megatron TP moves activations,
  expert parallelism moves tokens; replicas only exchange weight gradients);
- `rerun_by(op)` / `reruns_collective`: what each plan remat policy reruns under this stack
  (Megatron's full recompute reruns the whole layer with its TP collectives, selective the
  attention core; XLA drops the last projection);
- `grad_reduce_per`, `fsdp_when`: when gradient sums and FSDP gathers are paid;
- `overlap(cls)`: the overlap mechanism per class (fractions, window, exposed part);
- `dtypes(recipe)`: a precision recipe's compute dtype per op class;
- pipeline schedules and uneven stages, context-parallel method and load balance, expert
  dispatch and node-limited routing, fixed overheads.

`stack_of(None)` is the idealised machine of the book (the `ideal` profile): the cheapest
option everywhere and the book's remat rule (`memory.rerun_by`), i.e. the model as it was
before framework profiles. `resolve_framework("auto", chip)` is the stack a real run on that
chip most likely uses (`default_framework_for`); the CLI's `train` and `report` default to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.core.collectives import CollectiveKind
from roofline.core.ledger import Op
from roofline.core.memory import LAST_PROJECTIONS, NON_LAYER_ROWS
from roofline.core.memory import rerun_by as book_rerun_by
from roofline.core.sharding import (
    CHEAPEST,
    Option,
    OptionContext,
    OptionPolicy,
    argmin_allowed,
)
from roofline.errors import SpecError
from roofline.specs.framework import (
    MODULE_RERUNS,
    AttentionKernel,
    AxisRole,
    CPMethod,
    Dispatch,
    Exposed,
    Family,
    Framework,
    Kernels,
    LoadBalance,
    Move,
    Overlap,
    OverlapClass,
    OverlapMode,
    Per,
    Recipe,
    Regather,
    RematPolicy,
    Uneven,
    Window,
    family_of,
    load_framework,
)
from roofline.specs.framework import Schedule as FwSchedule
from roofline.specs.plan import ComputeDtypes, Plan, Remat, RematKind, Schedule, Strategy
from roofline.units import compute_format

IDEAL = "ideal"
AUTO = "auto"

# The reference training stack per chip vendor, for `--framework auto`: what a published run on
# that hardware most likely used. TPU: MaxText, Google's reference JAX/XLA LLM stack (the one
# Google's published TPU training performance tables are measured with). NVIDIA
# GPUs: Megatron-LM / Megatron-Core, the stack under NeMo and NVIDIA's DGX Cloud benchmarking
# recipes. AMD GPUs: Megatron-LM through AMD's ROCm fork (github.com/ROCm/Megatron-LM), the
# stack AMD's ROCm training documentation benchmarks Instinct GPUs with. Vendors not listed
# (e.g. a calibration's "cpu") have no reference stack: the idealised machine.
DEFAULT_FRAMEWORK_BY_VENDOR: Mapping[str, tuple[str, str]] = {
    "google": ("tpu", "maxtext"),
    "nvidia": ("nvidia gpu", "megatron"),
    "amd": ("amd gpu", "megatron"),
}

# The stack's own names a plan remat kind stands for, in order of preference (the first one
# the profile lists wins): Megatron "selective", torchtitan "selective-op", MaxText "minimal".
_REMAT_NAMES: Mapping[RematKind, tuple[str, ...]] = {
    RematKind.NONE: ("none",),
    RematKind.MATMULS: ("selective", "minimal", "matmuls"),
    RematKind.FULL: ("full",),
    RematKind.CHECKPOINTS: ("full",),
}

# Speed of a stack's attention kernel relative to the efficiency profile's reference kernel of
# the chip generation, (forward, backward). The datasheet profile's Hopper attention is
# FlashAttention-3 (specs/profiles/datasheet.toml, [fa3]); FlashAttention-2 on Hopper is slower:
# FA3 (Shah et al. 2024, abstract and §4.1) is 1.5-2.0x faster than FA2 in the forward pass and
# 1.5-1.75x in the backward pass (midpoints 1.75 and 1.6). Ampere's reference is FA2 itself,
# Blackwell's cuDNN, TPU's splash: pairs not listed run at the reference speed.
ATTENTION_KERNEL_SPEED: Mapping[tuple[AttentionKernel, str], tuple[float, float]] = {
    (AttentionKernel.FLASH_ATTENTION_2, "hopper"): (1 / 1.75, 1 / 1.6),
}

# The plan's schedules in the profile's vocabulary.
_SCHEDULE = {
    Schedule.GPIPE: (FwSchedule.GPIPE,),
    Schedule.ONE_F_ONE_B: (FwSchedule.ONE_F_ONE_B,),
    Schedule.INTERLEAVED: (FwSchedule.INTERLEAVED, FwSchedule.CIRCULAR, FwSchedule.LOOPED_BFS),
}

_COLLECTIVE_KIND = {
    CollectiveKind.ALL_GATHER: "all-gather",
    CollectiveKind.REDUCE_SCATTER: "reduce-scatter",
    CollectiveKind.ALL_REDUCE: "all-reduce",
    CollectiveKind.ALL_TO_ALL: "all-to-all",
    CollectiveKind.PERMUTE: "permute",
}


# --------------------------------------------------------------------------------------
# The option policy: which operand moves over which axis
# --------------------------------------------------------------------------------------


def move_allows(move: Move, moves_weight: bool) -> bool:
    """Whether a collective over an axis is one the stack issues: `weights` moves only
    parameters (and their gradients), `activations` / `tokens` / `kv` / `heads` never move a
    parameter, `cheapest` anything."""
    if move == Move.CHEAPEST:
        return True
    if move == Move.WEIGHTS:
        return moves_weight
    return not moves_weight


@dataclass(frozen=True)
class MovePolicy:
    """The cheapest option whose every collective moves what the stack moves over its axes
    (the cheapest of all when none does: the algebra never leaves an einsum without a way)."""

    name: str
    moves: Mapping[str, Move]  # mesh axis -> move

    def allows(self, option: Option, ctx: OptionContext) -> bool:
        for c in option.comms:
            w = c.tensor in ctx.weights
            for a in c.axes:
                if not move_allows(self.moves.get(a, Move.CHEAPEST), w):
                    return False
        return True

    def choose(self, ctx: OptionContext) -> Any:
        return argmin_allowed(ctx.costs, [self.allows(o, ctx) for o in ctx.options])


@dataclass(frozen=True)
class FamilyPolicy:
    """One `MovePolicy` per einsum family (`specs.framework.family_of` of the ledger op);
    the walk asks `for_op(name)`."""

    name: str
    by_family: Mapping[Family, MovePolicy]

    def for_op(self, op_name: str) -> OptionPolicy:
        return self.by_family.get(family_of(op_name), CHEAPEST)

    def choose(self, ctx: OptionContext) -> Any:  # an einsum without an op: the dense rule
        return self.for_op("").choose(ctx)


def experts_replicated_over_tensor(policy: OptionPolicy) -> OptionPolicy:
    """The routed-expert policy where the experts are whole on every tensor rank (expert tensor
    parallel size 1, `rules.moe_rules`): the tensor ranks are then replicas of the experts —
    Megatron's expert-data-parallel group spans them (megatron/core/parallel_state.py) — so the
    stack moves over the tensor axis what it moves over the data axis (the weight gradients,
    summed once per step), never the tokens (each rank keeps its own)."""
    if not isinstance(policy, MovePolicy):
        return policy
    moves = dict(policy.moves)
    moves[AxisRole.TENSOR.value] = moves.get(AxisRole.DATA.value, Move.CHEAPEST)
    return MovePolicy(policy.name + ":etp1", MappingProxyType(moves))


def policy_for_op(policy: OptionPolicy, op_name: str) -> OptionPolicy:
    """The policy the walk applies to one ledger op (family policies pick by the op's family)."""
    for_op = getattr(policy, "for_op", None)
    return for_op(op_name) if for_op is not None else policy


def _family_policy(fw: Framework) -> OptionPolicy:
    if all(
        fw.move(f, a) == Move.CHEAPEST for f in Family for a in AxisRole
    ):  # the idealised machine
        return CHEAPEST
    by = {}
    for fam in Family:
        moves = {a.value: fw.move(fam, a) for a in AxisRole}
        by[fam] = MovePolicy(f"{fw.name}:{fam.value}", moves)
    return FamilyPolicy(fw.name, by)


# --------------------------------------------------------------------------------------
# The stack
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    """A framework profile as the step model applies it (see the module docstring)."""

    framework: Framework
    policy: OptionPolicy
    remat: Mapping[RematKind, RematPolicy | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.framework.name

    @property
    def book(self) -> bool:
        """The idealised machine: the book's rules, exactly as before framework profiles."""
        return self.framework.name == IDEAL

    # -- remat ---------------------------------------------------------------------------
    def remat_policy(self, kind: RematKind) -> RematPolicy | None:
        """The stack's policy a plan remat kind stands for (None: the book's rule)."""
        return self.remat.get(kind)

    def rerun_by(self, op: Op) -> frozenset[RematKind]:
        """The plan remat kinds whose backward pass reruns `op`'s forward under this stack."""
        if self.book:
            return book_rerun_by(op)
        if op.name in NON_LAYER_ROWS:
            return frozenset()
        out = set()
        for kind, pol in self.remat.items():
            if pol is None:
                if kind in book_rerun_by(op):
                    out.add(kind)
                continue
            if op.name in LAST_PROJECTIONS and not pol.reruns_last_projection:
                continue
            if pol.reruns_op(op.name):
                out.add(kind)
        return frozenset(out)

    def reruns_collective(
        self, kind: RematKind | Remat, cls: OverlapClass, ckind: CollectiveKind
    ) -> bool:
        """Whether remat `kind` reruns a collective of class `cls` inside a rerun op (a
        policy may save some collectives' outputs, e.g. torchtitan's reduce-scatters). A
        partial recompute (a MODULES `Remat`) reruns the classes its modules hold
        (`MODULE_RERUNS`)."""
        if cls == OverlapClass.WEIGHT_GATHER:
            return False  # weights are gathered once for the recompute and backward together
        if isinstance(kind, Remat):
            return cls == OverlapClass.OTHER or any(
                cls in MODULE_RERUNS[m][1] for m in kind.modules
            )
        pol = self.remat.get(kind)
        if pol is None or self.book or cls == OverlapClass.OTHER:
            return True
        if _COLLECTIVE_KIND.get(ckind) in pol.keeps_collective_kinds:
            return False
        return cls in pol.reruns_collectives

    # -- eager mode ------------------------------------------------------------------------
    def eager_traffic(self, op_name: str) -> float:
        """HBM bytes of the row's eager kernels over its fused kernel (1 where the stack has
        no [eager] table: its kernels are fused whether or not a compiler runs)."""
        e = self.framework.eager
        return 1.0 if e is None else e.factor(op_name)

    def compiled(self, flag: bool | None) -> bool:
        """Whether a plan's elementwise rows run compiled: its `compile` flag where set, else
        the stack's default (the [eager] table's compiled_by_default; compiled, i.e. fused,
        where the profile has no [eager] table)."""
        if flag is not None:
            return bool(flag)
        e = self.framework.eager
        return True if e is None else e.compiled_by_default

    def compiling_by_default(self, compiled: bool) -> Stack:
        """This stack with plans whose `compile` is unset costed `compiled` (a run whose
        published configuration states it, as `without_overlap` does for an overlap); the
        stack itself where it has no [eager] table or already defaults so."""
        e = self.framework.eager
        if e is None or e.compiled_by_default == compiled:
            return self
        return _build(replace(self.framework, eager=replace(e, compiled_by_default=compiled)))

    # -- data parallelism and FSDP --------------------------------------------------------
    def grad_reduce_per(self, zero: int, pipelined: bool = False) -> Per:
        return self.framework.data_parallel.grad_reduce_per(zero, pipelined)

    def fsdp_when(self, pipelined: bool) -> tuple[Regather, Per, Per]:
        return self.framework.fsdp.when(pipelined)

    @property
    def grad_reduce_bytes_factor(self) -> float:
        """Bytes of the replicas' gradient sum against bf16 (fp32 reduction: 2)."""
        from roofline.units import dtype_bytes

        return dtype_bytes(self.framework.data_parallel.grad_reduce.dtype) / 2.0

    def accumulator_bytes(self, param_bytes: float, zero: Any, dp: Any) -> Any:
        """Bytes per local parameter of the stack's gradient accumulator under ZeRO stage
        `zero` over `dp` replicas (arrays broadcast), 0 where the stack keeps none (the
        idealised machine, and stacks that accumulate into their one gradient buffer).
        `param_bytes` is the dtype of the parameters the loss differentiates
        (`OptimizerPolicy.param_bytes`); ZeRO-1/2 applies only with replicas."""
        from roofline.units import dtype_bytes

        ga = self.framework.grad_accumulation
        z = np.asarray(zero)
        if ga is None or self.book:
            return 0.0 * np.asarray(z * dp, float)
        own = param_bytes if ga.buffer == "params" else dtype_bytes(ga.buffer)
        under_zero = own if ga.zero_buffer is None else dtype_bytes(ga.zero_buffer)
        return np.where((z >= 1) & (z <= 2) & (np.asarray(dp) > 1), under_zero, own)

    @property
    def param_gather(self) -> bool:
        """ZeRO-1/2 all-gather the updated parameters over the replicas after each step."""
        return self.framework.data_parallel.param_gather is not None and not self.book

    # -- overlap ---------------------------------------------------------------------------
    def overlap(self, cls: OverlapClass) -> Overlap:
        """The class's mechanism; a class the profile does not list (`other`) is exposed."""
        return self.framework.overlap.get(cls) or _EXPOSED[cls]

    def default_on(self, cls: OverlapClass, conditions: frozenset[str]) -> bool:
        """Whether the class's mechanism is on by default under `conditions` (the profile's
        `default` and `requires`, `specs.framework.Overlap.mode`)."""
        ov = self.overlap(cls)
        return ov.mode(None, conditions) is ov.on

    def plan_overlap(self, plan: Plan, held: frozenset[str] = frozenset()) -> dict[str, bool]:
        """The overlap switches in force for one plan, by plan key (collective_matmul,
        overlap_ep): the plan's tri-state flag where set and the profile has that key, else
        the stack's default under the plan's conditions (`overlap_conditions`; `held`: the
        chip-level requirements, `chip_requirements`). What the step model costs, for writers
        whose tool's own default differs."""
        cond = plan_conditions(self, plan, held)
        out = {}
        for cls, ov in self.framework.overlap.items():
            if ov.plan_key:
                flag = getattr(plan, ov.plan_key)
                out[ov.plan_key] = self.default_on(cls, cond) if flag is None else flag
        return out

    # -- precision ----------------------------------------------------------------------------
    def recipe(self, name: str | None = None) -> Recipe:
        return self.framework.precision.recipe(name)

    def dtypes(self, name: str | None = None) -> ComputeDtypes:
        """The compute dtypes of a precision recipe (None: the stack's default)."""
        return recipe_dtypes(self.recipe(name))

    def searchable_dtypes(self, chip: Any) -> tuple[ComputeDtypes | None, ...]:
        """The compute dtypes a planner search covers on `chip` when the user pins none: the
        chip's 16-bit default (None) and, once each, the dtypes of every faster recipe
        (`faster_recipes`) that the stack documents for production pre-training
        (`Recipe.pretraining`: Transformer Engine fp8 and NVFP4 under Megatron, torchao float8
        under torchtitan; not MaxText's int8 AQT, which is offered as advice); recipes whose
        dtypes differ only in their casts' scaling once, the first in the profile's order."""
        out: list[ComputeDtypes | None] = [None]
        formats: set[ComputeDtypes] = set()  # recipes differing only in scaling: the first
        for r in self.faster_recipes(chip):
            d = recipe_dtypes(r)
            if r.pretraining and replace(d, scaling="") not in formats:
                formats.add(replace(d, scaling=""))
                out.append(d)
        return tuple(out)

    def faster_recipes(self, chip: Any) -> list[Recipe]:
        """The stack's recipes (in profile order) whose requirements hold on `chip`
        (`chip_requirements`) and whose matmuls compute in formats the chip has a faster peak
        for than its 16-bit default (fp8 on Hopper, fp4 on Blackwell, int8 on TPUs); fp16 and
        fp32 are not."""
        held = chip_requirements(chip)
        base = chip.peak(chip.default_dtype)
        return [
            r
            for r in self.framework.precision.recipes.values()
            if all(q.value in held for q in r.requires) and _matmul_peak(r, chip) > base
        ]

    def advised_recipe(self, chip: Any) -> Recipe | None:
        """The fastest recipe the chip runs faster than 16-bit whose dtypes the default search
        does not cover (the stack does not document it for pre-training), or None."""
        searched = {replace(d, scaling="") for d in self.searchable_dtypes(chip) if d is not None}
        rest = [
            r
            for r in self.faster_recipes(chip)
            if replace(recipe_dtypes(r), scaling="") not in searched
        ]
        return max(rest, key=lambda r: _matmul_peak(r, chip), default=None)

    def precision_name(self, dtypes: ComputeDtypes | None, chip: Any) -> str:
        """A searched precision as a user names it: the chip's 16-bit dtype for None, else the
        first recipe with these dtypes (a documented pre-training one first)."""
        if dtypes is None:
            return str(chip.default_dtype)
        recipes = sorted(self.framework.precision.recipes.values(), key=lambda r: not r.pretraining)
        return next(
            (r.name for r in recipes if recipe_dtypes(r) == dtypes), ",".join(dtypes.describe())
        )

    # -- pipeline, context and expert parallelism -------------------------------------------
    def supports_schedule(self, schedule: Schedule) -> bool:
        return any(self.framework.pipeline.supports(s) for s in _SCHEDULE[schedule])

    @property
    def uneven_stages(self) -> bool:
        """Stages may hold different numbers of layers (Megatron first/last or a layout,
        torchtitan's balanced split, MaxText's partial pipeline)."""
        return any(u != Uneven.NONE for u in self.framework.pipeline.uneven)

    @property
    def spreads_uneven_stages(self) -> bool:
        """Stages may hold unequal shares of the layers within the pipeline (Megatron's
        first/last or layout, torchtitan's balanced split): what the planner's chunk bound and
        the timeline's fullest stage model. MaxText's partial pipeline is not this: it pipelines
        pp·repeats equal chunks and runs the layers left over outside the pipeline with the
        stage axis as data parallelism, which neither the timeline nor its launch writer
        (pipeline_parallel_layers unset) expresses, so its plans keep pp·v dividing the layers."""
        return any(u not in (Uneven.NONE, Uneven.PARTIAL) for u in self.framework.pipeline.uneven)

    @property
    def cp_method(self) -> CPMethod | None:
        return self.framework.context_parallel.default

    @property
    def cp_load_balance(self) -> LoadBalance:
        return self.framework.context_parallel.load_balance

    @property
    def dispatch(self) -> Dispatch | None:
        return self.framework.expert_parallel.default

    @property
    def node_limited_routing(self) -> bool:
        return self.framework.expert_parallel.node_limited_routing

    def dispatch_sm_share(self, chip: Any) -> float:
        """The share of `chip`'s SMs the expert dispatcher's kernels hold while they run (a
        DeepEP-style dispatcher keeps its kernels resident on `[expert_parallel] dispatch_sms`
        SMs); 0 for another dispatcher or a chip without an SM count."""
        ep = self.framework.expert_parallel
        sms = getattr(chip, "sm_count", None)
        if self.dispatch != Dispatch.DEEPEP or not ep.dispatch_sms or not sms:
            return 0.0
        return min(1.0, ep.dispatch_sms / sms)

    @property
    def moe_host_sync_s(self) -> float:
        """GPU idle per routed-expert layer forward while the host reads the token counts."""
        return self.framework.expert_parallel.host_sync_s

    # -- kernels -------------------------------------------------------------------------------
    def attention_speed(self, chip: Any, backward: bool) -> float:
        """The stack's attention kernel speed against the profile's reference kernel on `chip`
        (`ATTENTION_KERNEL_SPEED`; 1 where the stack names no kernel or the pair is unlisted)."""
        k = self.framework.kernels.attention if self.framework.kernels else None
        if k is None:
            return 1.0
        gen = str(getattr(chip, "generation", "")).lower()
        speed = ATTENTION_KERNEL_SPEED.get((k, gen))
        return 1.0 if speed is None else speed[1 if backward else 0]

    @property
    def flash_attention(self) -> bool:
        """The attention kernel keeps the score matrix on chip (every stack since 2022; an
        `unfused` kernel writes it to HBM and runs QK^T and PV as batched GEMMs)."""
        k = self.framework.kernels.attention if self.framework.kernels else None
        return k != AttentionKernel.UNFUSED

    def with_attention_kernel(self, kernel: AttentionKernel, source: str) -> Stack:
        """This stack running another attention kernel (an older version of it)."""
        fw = replace(self.framework, kernels=Kernels(kernel, source))
        return _build(fw)

    def without_overlap(self, cls: OverlapClass, source: str, *, serial: bool = False) -> Stack:
        """This stack with a class's overlap mechanism off by default (an older version that
        did not have it); the plan's flag can still switch it on. `serial`: that version's
        collectives also ran outside any compute when off (no async path), all exposed."""
        ov = self.overlap(cls)
        off = ov.off
        if serial:
            off = replace(off, forward=0.0, backward=0.0, exposed=Exposed.ALL, source=source)
        ov = replace(ov, default="off", off=off, note=source)
        fw = replace(self.framework, overlap=MappingProxyType({**self.framework.overlap, cls: ov}))
        return _build(fw)

    # -- overheads ----------------------------------------------------------------------------
    @property
    def step_overhead_s(self) -> float:
        return self.framework.overheads.step.value_s or 0.0

    @property
    def layer_overhead_s(self) -> float:
        return self.framework.overheads.layer.value_s or 0.0


def _exposed_overlap(cls: OverlapClass) -> Overlap:
    mode = OverlapMode(0.0, 0.0, Window.PASS, Exposed.ALL, "no mechanism hides this class")
    return Overlap(cls, "off", mode, mode)


_EXPOSED = {c: _exposed_overlap(c) for c in OverlapClass}


def overlap_conditions(
    stack: Stack,
    deg: Mapping[Strategy, Any],
    *,
    sequence_parallel: bool,
    interleaved: Any,
    full_remat: Any,
    zero: Any,
    held: frozenset[str],
) -> dict[str, np.ndarray]:
    """Which of the profiles' requirements (`specs.framework.Requirement`) hold, per candidate:
    `deg` the degrees per strategy (arrays of one length), `interleaved` the interleaved
    schedule with virtual stages > 1, `full_remat` a full (or checkpoint) recompute, `zero` the
    ZeRO stage, `held` the chip's requirements (`chip_requirements`)."""
    n = len(np.atleast_1d(deg[Strategy.TP]))
    yes, no = np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
    return {
        "sequence_parallel": yes if sequence_parallel else no,
        "tensor_parallel": deg[Strategy.TP] > 1,
        "data_parallel": (deg[Strategy.DP] > 1) | (deg[Strategy.FSDP] > 1),
        "pipeline_parallel": deg[Strategy.PP] > 1,
        "virtual_stages": np.asarray(interleaved, dtype=bool),
        "expert_parallel": deg[Strategy.EP] > 1,
        # the walk's dispatch is an all-to-all (the MoE recipes' alltoall / flex dispatchers)
        "all_to_all_dispatch": deg[Strategy.EP] > 1,
        "ring_attention": yes if stack.cp_method == CPMethod.RING else no,
        "no_full_remat": ~np.asarray(full_remat, dtype=bool),
        "distributed_optimizer": (zero >= 1) | (deg[Strategy.FSDP] > 1),
        "zero3": deg[Strategy.FSDP] > 1,
        "compile": no,
        **{k: yes if k in held else no for k in ("tpu", "gpu", "fp8_hardware", "blackwell")},
    }


def plan_conditions(stack: Stack, plan: Plan, held: frozenset[str] = frozenset()) -> frozenset[str]:
    """The requirements that hold for one plan (`overlap_conditions` of a single candidate)."""
    d = plan.degrees
    cond = overlap_conditions(
        stack,
        {s: np.array([d.of(s)]) for s in Strategy},
        sequence_parallel=plan.sequence_parallel,
        interleaved=[plan.schedule == Schedule.INTERLEAVED and plan.virtual_stages > 1],
        full_remat=[plan.remat.kind in (RematKind.FULL, RematKind.CHECKPOINTS)],
        zero=np.array([plan.zero]),
        held=held,
    )
    return frozenset(k for k, v in cond.items() if v[0])


def chip_requirements(chip: Any) -> frozenset[str]:
    """The profiles' chip-level requirements (`specs.framework.Requirement`) that `chip` meets:
    tpu or gpu, fp8_hardware (an fp8 peak: Hopper or newer), blackwell."""
    out = {"tpu" if chip.is_tpu else "gpu"}
    if "fp8" in chip.peak_flops_per_s:
        out.add("fp8_hardware")
    if "blackwell" in str(chip.generation).lower():
        out.add("blackwell")
    return frozenset(out)


def recipe_dtypes(r: Recipe) -> ComputeDtypes:
    """A precision recipe's compute dtypes: dense and expert matmuls, attention, the LM head."""
    return ComputeDtypes(
        matmul=_compute(r.dtype(Family.DENSE)),
        attention=_compute(r.dtype(Family.ATTENTION)),
        experts=_compute(r.dtype(Family.EXPERT)),
        vocab=_compute(r.dtype(Family.VOCAB)),
        scaling=r.scaling,
    )


def _matmul_peak(r: Recipe, chip: Any) -> float:
    """The slower of a recipe's dense and expert matmul peaks on `chip` (0: a format the chip
    has no peak for)."""
    fmts = {compute_format(_compute(r.dtype(f))) for f in (Family.DENSE, Family.EXPERT)}
    if not fmts <= set(chip.peak_flops_per_s):
        return 0.0
    return min(chip.peak(f) for f in fmts)


def _compute(dtype: str) -> str:
    """A recipe dtype as a compute dtype (block-scaled formats compute at their element type)."""
    d = dtype.lower()
    if "fp4" in d:
        return "fp4"
    if "fp8" in d:
        return "fp8"
    return d


# The memory class a stack's policy must have to stand for a plan remat kind (MaxText's alias
# "none" names its full policy, nothing_saveable: a name alone is not enough).
_REMAT_MEMORY = {
    RematKind.NONE: "none",
    RematKind.MATMULS: "matmuls",
    RematKind.FULL: "full",
    RematKind.CHECKPOINTS: "full",
}


def _remat_map(fw: Framework) -> dict[RematKind, RematPolicy | None]:
    """The stack's policy for each plan remat kind: the first of `_REMAT_NAMES` the profile
    lists with the kind's memory class (None: the book's rule applies)."""
    out: dict[RematKind, RematPolicy | None] = {}
    for kind, names in _REMAT_NAMES.items():
        pol = None
        for n in names:
            try:
                p = fw.remat.policy(n)
            except SpecError:
                continue
            if p.memory == _REMAT_MEMORY[kind]:
                pol = p
                break
        out[kind] = pol
    return out


@cache
def _stack_named(name: str) -> Stack:
    return _build(load_framework(name))


def _build(fw: Framework) -> Stack:
    return Stack(fw, _family_policy(fw), _remat_map(fw))


def default_framework_for(chip: Any) -> str:
    """The framework `--framework auto` means on `chip`: its vendor's reference stack
    (`DEFAULT_FRAMEWORK_BY_VENDOR`: TPU -> maxtext, NVIDIA and AMD GPUs -> megatron), the
    idealised machine for a vendor without one."""
    entry = DEFAULT_FRAMEWORK_BY_VENDOR.get(str(getattr(chip, "vendor", "")))
    return IDEAL if entry is None else entry[1]


def auto_reason(chip: Any) -> str:
    """Why `auto` chose its stack on `chip`, e.g. 'tpu → maxtext'."""
    vendor = str(getattr(chip, "vendor", ""))
    entry = DEFAULT_FRAMEWORK_BY_VENDOR.get(vendor)
    kind = entry[0] if entry is not None else (vendor or "unknown vendor")
    return f"{kind} → {default_framework_for(chip)}"


def is_auto(framework: Any) -> bool:
    """Whether `framework` asks for the chip's reference stack (`auto`, any case)."""
    return isinstance(framework, str) and framework.strip().lower() == AUTO


def resolve_framework(framework: str | None, chip: Any) -> str | None:
    """`framework` with `auto` replaced by the reference stack of `chip`'s vendor
    (`default_framework_for`); any other value (a name, alias, path or None) unchanged."""
    return default_framework_for(chip) if is_auto(framework) else framework


def stack_of(framework: str | Framework | Stack | None) -> Stack:
    """The stack for a framework name, alias, TOML path or profile (None: the ideal machine).
    An unknown name is a one-paragraph UnknownNameError (load_framework)."""
    if isinstance(framework, Stack):
        return framework
    if framework is None or framework == "":
        return _stack_named(IDEAL)
    if isinstance(framework, Framework):
        return _build(framework)
    return _stack_named(str(framework))


__all__ = [
    "AUTO",
    "DEFAULT_FRAMEWORK_BY_VENDOR",
    "FamilyPolicy",
    "IDEAL",
    "MovePolicy",
    "Stack",
    "auto_reason",
    "chip_requirements",
    "default_framework_for",
    "is_auto",
    "move_allows",
    "policy_for_op",
    "recipe_dtypes",
    "resolve_framework",
    "stack_of",
]
