"""The plan vocabulary: how a step runs, as validated frozen records built by keyword.

One module for every word a plan is written in (docs/architecture.md, "Plan vocabulary"):

- `Strategy` and `Degrees`: the degree of each parallelism strategy (dp, fsdp, tp, sp, ep,
  pp) and the mesh axis each one owns;
- `Remat` (`RematKind`): what the backward pass recomputes;
- `OptimizerPolicy`: bytes per parameter of the persistent training buffers;
- `Schedule`: the pipeline schedule (GPipe, 1F1B, interleaved with virtual stages);
- `ComputeDtypes`: the dtype each op class computes in (matmuls, attention, expert GEMMs);
- `Plan`: all of the above plus the overlap flags;
- `Phase`, `Causal` and `Workload`: what is being run (training step, prefill, decode) and
  how big it is.

Enums are stored as enums; strings are parsed at the edge (`parse_plan`, `parse_remat`,
`parse_optimizer`, `parse_degrees`). Every constructor checks its values and raises a typed
one-paragraph error (what, rule, fix) instead of computing with nonsense.
"""

from __future__ import annotations

import enum
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where a search array is built (trivial commands skip it)
    import numpy as np

from roofline.errors import PlanError, SpecError

# -- bounds where a size stops being physical ---------------------------------------------
# The largest degree of one strategy: a million-way split is beyond any machine built.
MAX_DEGREE = 1 << 20
# Gradient-accumulation steps per optimizer step (2^16 microbatches of one sequence each
# would already be a 64Ki-sequence batch on one replica).
MAX_MICROBATCHES = 1 << 16
# Checkpoints of size D per layer: saving every intermediate costs ~20·D per token per
# layer (book transformers.md), so more than 64 checkpoints is never a remat policy.
MAX_CHECKPOINTS = 64
# Model chunks per pipeline stage (interleaved schedule); at most one layer per chunk is
# enforced against the model when a plan is checked.
MAX_VIRTUAL_STAGES = 1 << 10


# ------------------------------------------------------------------------------ strategies


class Strategy(enum.StrEnum):
    """A parallelism strategy; its order here is the order plans are written in."""

    DP = "dp"
    FSDP = "fsdp"
    TP = "tp"
    SP = "sp"  # sequence / context parallelism over the query sequence
    EP = "ep"
    PP = "pp"


# The strategies in plan order, and their names (iterating an Enum is slow in hot loops).
STRATEGIES: tuple[Strategy, ...] = tuple(Strategy)
STRATEGY_NAMES: tuple[str, ...] = tuple(s.value for s in STRATEGIES)
_NAME_OF = dict(zip(STRATEGIES, STRATEGY_NAMES, strict=True))

AXIS_OF = {
    Strategy.DP: "data",
    Strategy.FSDP: "fsdp",
    Strategy.TP: "tensor",
    Strategy.SP: "seq",
    Strategy.EP: "expert",
    Strategy.PP: "stage",
}
# Mesh axis order, outermost first (JAX convention: the last axis is innermost, so tensor
# parallelism lands on the fastest links — the NVLink domain or the innermost ICI dims).
AXIS_ORDER = ("data", "stage", "fsdp", "expert", "seq", "tensor")
_STRATEGY_ALIASES = {
    "dp": "dp",
    "data": "dp",
    "fsdp": "fsdp",
    "zero3": "fsdp",
    "tp": "tp",
    "tensor": "tp",
    "mp": "tp",
    "model": "tp",
    "sp": "sp",
    "cp": "sp",
    "seq": "sp",
    "sequence": "sp",
    "context": "sp",
    "ep": "ep",
    "expert": "ep",
    "pp": "pp",
    "pipeline": "pp",
    "stage": "pp",
}


def _whole(value: Any, what: str, *, low: int, high: int, fix: str, rule: str = "") -> int:
    """`value` as an int in [low, high], or a PlanError naming it (bools and floats refused)."""
    rule = rule or f"{what} is an integer from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PlanError(f"{what} = {value!r} is not a whole number", rule=rule, fix=fix)
    if not low <= value <= high:
        raise PlanError(f"{what} = {value}", rule=rule, fix=fix)
    return int(value)


@dataclass(frozen=True)
class Degrees:
    """Degree of each strategy (1 = unused)."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    sp: int = 1
    ep: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in STRATEGY_NAMES:
            v = getattr(self, name)
            if type(v) is int and 1 <= v <= MAX_DEGREE:
                continue  # the common case, checked fast (plans are built in hot loops)
            v = _whole(
                v,
                f"plan degree {name}",
                low=1,
                high=MAX_DEGREE,
                fix=f"write {name}=1 (unused) or a power of two such as {name}=8",
            )
            object.__setattr__(self, name, v)

    def of(self, s: Strategy) -> int:
        return getattr(self, _NAME_OF[s])

    @property
    def n_chips(self) -> int:
        return math.prod(getattr(self, n) for n in STRATEGY_NAMES)

    def mesh_axes(self) -> tuple[tuple[str, int], ...]:
        """(axis name, size) for every strategy in use, outermost first; always at least one axis."""
        return mesh_axes_of(tuple(getattr(self, n) for n in STRATEGY_NAMES))

    def describe(self, empty: str = "dp=1") -> str:
        """'fsdp=64,tp=4': the strategies in use, in plan order (`empty` when none is)."""
        used = [f"{n}={getattr(self, n)}" for n in STRATEGY_NAMES if getattr(self, n) > 1]
        return ",".join(used) or empty


_AXIS_RANK = tuple(AXIS_ORDER.index(AXIS_OF[s]) for s in STRATEGIES)


# each mesh axis in `AXIS_ORDER` with the index of its strategy's degree in `STRATEGIES` order
_AXIS_DEGREE = tuple(
    (AXIS_ORDER[r], i) for r, i in sorted((r, i) for i, r in enumerate(_AXIS_RANK))
)


def mesh_axes_of(degrees: tuple[int, ...]) -> tuple[tuple[str, int], ...]:
    """(axis name, size) of degrees given in `STRATEGIES` order: the axes of size > 1 in
    `AXIS_ORDER` (outermost first), or one axis of size 1. (A list read in axis order: the
    planner places hundreds of meshes a search, ~4x faster than filling sizes by rank.)"""
    if len(degrees) != len(_AXIS_DEGREE):
        raise ValueError(f"{len(degrees)} degrees for {len(_AXIS_DEGREE)} strategies")
    axes = tuple([(a, degrees[i]) for a, i in _AXIS_DEGREE if degrees[i] > 1])
    return axes or (("data", 1),)


def parse_degrees(text: str | Mapping[str, Any]) -> tuple[Degrees, dict[str, str]]:
    """'fsdp=1024,tp=4,sp=2' -> (Degrees, other key=value options left for the caller)."""
    items = _plan_items(text)
    deg: dict[str, int] = {}
    rest: dict[str, str] = {}
    for k, v in items.items():
        if k not in _STRATEGY_ALIASES:
            rest[k] = v
            continue
        if not re.fullmatch(r"[+-]?\d+", v):
            raise PlanError(
                f"plan degree {k}={v!r} is not a whole number",
                rule="degrees are positive integers",
                fix=f"write {k}=4",
            )
        if len(v.lstrip("+-")) > 18:
            raise PlanError(
                f"plan degree {k} has {len(v.lstrip('+-')):,} digits",
                rule="a degree counts chips: at most 18 digits (no system is larger)",
                fix=f"write {k}=4",
            )
        n = int(v)
        if n < 1:
            raise PlanError(
                f"plan degree {k}={n}",
                rule="degrees are positive integers (1 = unused)",
                fix=f"write {k}=1 or more",
            )
        deg[_STRATEGY_ALIASES[k]] = n
    return Degrees(**deg), rest


def _plan_items(text: str | Mapping[str, Any]) -> dict[str, str]:
    if isinstance(text, Mapping):
        return {str(k).strip().lower(): str(v).strip() for k, v in text.items()}
    if not isinstance(text, str):
        raise PlanError(
            f"plan {text!r} is a {type(text).__name__}, not text",
            rule="a plan is a comma-separated list of name=value",
            fix='write e.g. "fsdp=256,tp=4,microbatch=4,remat=full"',
        )
    items: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise PlanError(
                f"cannot read plan item {part!r}",
                rule="a plan is a comma-separated list of name=value",
                fix='write e.g. --plan "fsdp=256,tp=4,microbatch=4,remat=full"',
            )
        k, v = part.split("=", 1)
        items[k.strip().lower()] = v.strip()
    return items


# ------------------------------------------------------------------------------ remat


class RematKind(enum.StrEnum):
    NONE = "none"  # save every intermediate the backward pass reads
    # save only matmul outputs (jax dots_saveable); recompute attention + elementwise
    MATMULS = "matmuls"
    FULL = "full"  # one checkpoint per layer (the layer input); recompute the whole layer
    CHECKPOINTS = "checkpoints"  # N checkpoints of size D per layer (book applied-training: 4)
    # save everything but what the named modules produce; rerun those modules in backward
    # (Megatron's --recompute-granularity selective --recompute-modules ...)
    MODULES = "modules"


# The modules a partial recompute may name, in Megatron-Core's words and order
# (NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py, the `recompute_modules`
# docstring: "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts").
# What each one reruns over the ledger is `specs.framework.MODULE_RERUNS`.
RECOMPUTE_MODULES = (
    "core_attn",
    "mla_up_proj",
    "layernorm",
    "mlp",
    "moe",
    "moe_act",
    "shared_experts",
)


@dataclass(frozen=True)
class Remat:
    kind: RematKind = RematKind.FULL
    n: int = 1  # checkpoints per layer for CHECKPOINTS
    modules: tuple[str, ...] = ()  # the recomputed modules for MODULES (RECOMPUTE_MODULES order)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, RematKind):
            raise PlanError(
                f"remat kind {self.kind!r} is not a RematKind",
                rule="build remat policies with parse_remat('full') or Remat(RematKind.FULL)",
                fix="write e.g. remat=full",
            )
        _whole(
            self.n,
            "remat checkpoints per layer",
            low=1,
            high=MAX_CHECKPOINTS,
            fix="write e.g. remat=ckpt4 (the book's four checkpoints per layer)",
        )
        self._check_modules()

    def _check_modules(self) -> None:
        mods = self.modules
        wanted = self.kind == RematKind.MODULES
        bad = [m for m in mods if m not in RECOMPUTE_MODULES]
        if (
            bad
            or wanted != bool(mods)
            or list(mods) != sorted(set(mods), key=RECOMPUTE_MODULES.index)
        ):
            raise PlanError(
                f"remat {self.kind.value} with modules {mods!r}",
                rule="a partial recompute (kind modules) names one or more distinct modules of "
                + ", ".join(RECOMPUTE_MODULES)
                + " in that order; other kinds name none",
                fix="write e.g. remat=mla_up_proj+moe_act (parse_remat orders them)",
            )

    def __str__(self) -> str:
        if self.kind == RematKind.MODULES:
            return "+".join(self.modules)
        return f"ckpt{self.n}" if self.kind == RematKind.CHECKPOINTS else self.kind.value


_REMAT_ALIASES = {
    "none": RematKind.NONE,
    "off": RematKind.NONE,
    "matmuls": RematKind.MATMULS,
    "dots": RematKind.MATMULS,
    "selective": RematKind.MATMULS,
    "full": RematKind.FULL,
    "block": RematKind.FULL,
    "layer": RematKind.FULL,
}


def parse_modules(text: str) -> Remat | None:
    """'mla_up_proj+moe_act' (or a list's text 'mla_up_proj, moe_act') -> a MODULES remat;
    None where a word is not one of RECOMPUTE_MODULES."""
    words = [w for w in re.split(r"[+,\s\[\]'\"]+", text.strip().lower()) if w]
    if not words or any(w not in RECOMPUTE_MODULES for w in words):
        return None
    return Remat(RematKind.MODULES, modules=tuple(m for m in RECOMPUTE_MODULES if m in words))


def parse_remat(text: str | Remat) -> Remat:
    """'none' | 'matmuls' (alias 'dots', 'selective') | 'full' (alias 'block', 'layer') | 'ckpt4' / 'checkpoints=4'
    | modules joined by '+' (partial recompute, e.g. 'mla_up_proj+moe_act')."""
    if isinstance(text, Remat):
        return text
    s = str(text).strip().lower()
    if s in _REMAT_ALIASES:
        return Remat(_REMAT_ALIASES[s])
    mods = parse_modules(s)
    if mods is not None:
        return mods
    m = re.fullmatch(r"(?:ckpt|checkpoints?)[=:]?(\d{1,6})", s)
    if m and 0 < int(m.group(1)) <= MAX_CHECKPOINTS:
        return Remat(RematKind.CHECKPOINTS, int(m.group(1)))
    raise SpecError(
        f"unknown remat policy {text!r}",
        rule=f"remat is none, matmuls, full, ckptN (N = 1..{MAX_CHECKPOINTS} checkpoints of size D per layer), "
        "or recomputed modules joined by '+' (" + ", ".join(RECOMPUTE_MODULES) + ")",
        fix="write e.g. remat=full, remat=ckpt4 or remat=mla_up_proj+moe_act",
    )


# ------------------------------------------------------------------------------ optimizer


@dataclass(frozen=True)
class OptimizerPolicy:
    """Bytes per parameter of each persistent training buffer."""

    name: str
    param_bytes: float  # the weights the forward pass reads
    grad_bytes: float  # gradient buffer
    state_bytes: float  # optimizer state incl. fp32 master copy if any

    def __post_init__(self) -> None:
        for f in ("param_bytes", "grad_bytes", "state_bytes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 64:
                raise SpecError(
                    f"optimizer policy {self.name!r}: {f} = {v!r}",
                    rule="bytes per parameter are numbers from 0 to 64",
                    fix=f"set {f} to e.g. 2 (bf16) or 4 (fp32)",
                )

    @property
    def bytes_per_param(self) -> float:
        return self.param_bytes + self.grad_bytes + self.state_bytes


OPTIMIZERS = {
    # book training.md: bf16 params + fp32 Adam moments = 10 bytes/param (gradients transient, bf16)
    "adam-bf16": OptimizerPolicy("adam-bf16", 2.0, 2.0, 8.0),
    # Megatron/DeepSpeed mixed precision: bf16 params, fp32 grads, fp32 master + m + v (18 B/param)
    "adam-fp32-master": OptimizerPolicy("adam-fp32-master", 2.0, 4.0, 12.0),
    # the same with the gradients accumulated and reduced in bf16 (16 B/param): Megatron's
    # --no-gradient-reduce-in-fp32 / Megatron-Bridge ddp.grad_reduce_in_fp32=False, NeMo's
    # distributed_fused_adam grad_sync_dtype: bf16
    "adam-fp32-master-bf16-grads": OptimizerPolicy("adam-fp32-master-bf16-grads", 2.0, 2.0, 12.0),
    "adam-fp32": OptimizerPolicy("adam-fp32", 4.0, 4.0, 8.0),
    "sgd-bf16": OptimizerPolicy("sgd-bf16", 2.0, 2.0, 0.0),
}
DEFAULT_OPTIMIZER = "adam-bf16"


def parse_optimizer(name: str | OptimizerPolicy) -> OptimizerPolicy:
    if isinstance(name, OptimizerPolicy):
        return name
    key = str(name).strip().lower()
    if key not in OPTIMIZERS:
        raise SpecError(
            f"unknown optimizer policy {name!r}",
            rule="policies: " + ", ".join(OPTIMIZERS),
            fix="write e.g. optimizer=adam-bf16 (the book's 10 bytes/param)",
        )
    return OPTIMIZERS[key]


# ------------------------------------------------------------------------------ schedule


class Schedule(enum.StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"

    @property
    def code(self) -> int:
        """A stable small integer for numpy arrays of schedules (see `SCHEDULE_OF_CODE`)."""
        return _SCHEDULE_CODES[self]


_SCHEDULE_CODES = {s: i for i, s in enumerate(Schedule)}
SCHEDULE_OF_CODE = {i: s for s, i in _SCHEDULE_CODES.items()}


# ------------------------------------------------------------------------------ compute dtypes


class ComputeDtype(enum.StrEnum):
    """A dtype tensor cores / MXUs compute in; its peak comes from the chip file."""

    BF16 = "bf16"
    FP16 = "fp16"  # chips without bf16 units (V100) train in fp16
    FP8 = "fp8"
    FP4 = "fp4"
    INT8 = "int8"


class OpClass(enum.StrEnum):
    """What kind of kernel an op runs as (efficiency and compute dtype depend on it)."""

    DENSE_GEMM = "dense_gemm"
    EXPERT_GEMM = "expert_gemm"  # grouped GEMMs of the routed experts
    ATTENTION = "attention"  # the scores and context contractions (flash attention)
    ELEMENTWISE = "elementwise"  # norms, activations: vector units, memory-bound
    EMBEDDING = "embedding"  # the table lookup
    HOST_SYNC = "host_sync"  # no kernel: the GPU idle while the host waits on the device


def _compute_dtype(value: Any, what: str) -> ComputeDtype:
    try:
        return ComputeDtype(str(value).strip().lower())
    except ValueError:
        raise PlanError(
            f"{what} = {value!r}",
            rule="compute dtypes are " + ", ".join(d.value for d in ComputeDtype),
            fix=f"write e.g. {what}=fp8",
        ) from None


# the casts' scalings a plan names (specs/frameworks/*.toml recipe `scaling`); "delayed" (and a
# 16-bit recipe's "none") is the default, held as ""
SCALINGS = ("delayed", "current", "mx", "blockwise", "rowwise", "nvfp4")


def _scaling(value: Any, what: str) -> str:
    v = str(value or "").strip().lower()
    if v in ("", "none", "delayed"):
        return ""
    if v not in SCALINGS:
        raise PlanError(
            f"{what} = {value!r}",
            rule="scalings are " + ", ".join(SCALINGS),
            fix=f"write e.g. {what}=current",
        )
    return v


# ledger rows a low-precision recipe keeps in 16 bits: the LM head and the MoE router
_HIGH_PRECISION_OPS = ("unembed", "moe/router")


@dataclass(frozen=True)
class ComputeDtypes:
    """The dtype each op class computes in (bf16 by default; MFU is reported against the bf16
    peak, or the chip's 16-bit dtype where it has no bf16).

    Elementwise ops and the embedding lookup run on vector units and follow `attention`'s
    dtype only for their bytes; they have no tensor-core peak of their own.
    """

    matmul: ComputeDtype = ComputeDtype.BF16
    attention: ComputeDtype = ComputeDtype.BF16
    experts: ComputeDtype = ComputeDtype.BF16
    # the LM head (unembedding): fp8 recipes keep it in bf16 (Transformer Engine, torchao)
    vocab: ComputeDtype = ComputeDtype.BF16
    # how the low-precision recipe scales its casts (the stack profile's recipe `scaling`): ""
    # is delayed scaling (or none); "mx" and the others as core.walk.quantise prices them
    scaling: str = ""

    def __post_init__(self) -> None:
        for f in _DTYPE_FIELDS:
            object.__setattr__(self, f, _compute_dtype(getattr(self, f), f"{f}_dtype"))
        object.__setattr__(self, "scaling", _scaling(self.scaling, "scaling"))

    def of(self, op_class: OpClass) -> ComputeDtype:
        if op_class == OpClass.EXPERT_GEMM:
            return self.experts
        if op_class == OpClass.DENSE_GEMM:
            return self.matmul
        return self.attention

    def for_op(self, op_name: str, op_class: OpClass) -> ComputeDtype:
        """The dtype of one ledger op: the LM head has its own (`vocab`), and the MoE router
        computes with it, never in the experts' low precision (Megatron-Core runs it as a
        16-bit GEMM with fp32 logits: NVIDIA/Megatron-LM@d98e8a64
        megatron/core/transformer/moe/moe_utils.py:1389-1396 RouterGatingLinearFunction)."""
        return self.vocab if op_name in _HIGH_PRECISION_OPS else self.of(op_class)

    @staticmethod
    def uniform(dtype: Any) -> ComputeDtypes:
        """Every op class in one dtype (fp16 training on chips without bf16)."""
        return ComputeDtypes(**dict.fromkeys(_DTYPE_FIELDS, dtype))

    @property
    def is_default(self) -> bool:
        return self == ComputeDtypes()

    def describe(self) -> list[str]:
        """The dtypes that differ from the defaults as plan items, each under its canonical plan
        key (`expert_dtype`, not the `experts_dtype` alias parse_plan also reads)."""
        d = ComputeDtypes()
        out = [
            f"{_CANONICAL_KEY[f'dtype:{f}']}={getattr(self, f).value}"
            for f in _DTYPE_FIELDS
            if getattr(self, f) != getattr(d, f)
        ]
        return out + ([f"{_CANONICAL_KEY['dtype:scaling']}={self.scaling}"] if self.scaling else [])


_DTYPE_FIELDS = ("matmul", "attention", "experts", "vocab")


# ------------------------------------------------------------------------------ plan


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How to run a step: strategy degrees, microbatches, remat, ZeRO stage, pipeline schedule,
    compute dtypes and the overlap flags."""

    degrees: Degrees = field(default_factory=Degrees)
    microbatches: int = 1
    remat: Remat = field(default_factory=Remat)
    zero: int = 1  # ZeRO stage over the `data` axis (the `fsdp` axis is stage 3 by definition)
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1  # interleaved schedule: model chunks per pipeline stage
    sequence_parallel: bool = False  # Megatron SP: TP AllReduce -> ReduceScatter + AllGather
    # The overlap switches a stack can default (TRISTATE_FLAGS): None is the stack's default
    # (its profile's `default`, given the plan's conditions), True on, False off.
    collective_matmul: bool | None = None  # overlap TP collectives with their matmuls
    overlap_ep: bool | None = None  # hide the expert all-to-alls behind compute (DualPipe)
    # routed experts split over the tensor axis (Megatron's expert tensor parallel size = tp, its
    # default); False: expert_tensor_parallel_size = 1 (core.rules.moe_rules)
    expert_tp: bool = True
    # elementwise ops run as the compiler's fused kernels (torch.compile, XLA, Megatron's fused
    # kernels); False: as eager PyTorch kernels (the stack profile's [eager] traffic); None
    # (`compile` left out): the stack's default (the [eager] table's compiled_by_default,
    # core.stack.Stack.compiled; torchtitan runs eager unless [compile] enable is set)
    compiled: bool | None = None
    # the saved activations kept in host memory between forward and backward
    # (`training.offload.offload_activations`; Megatron's --cpu-offloading, MaxText's offload
    # remat policies)
    offload_activations: bool = False
    # the whole step replayed from one CUDA graph (Megatron --cuda-graph-impl full_iteration,
    # with static per-rank expert capacity): the host never waits on the device mid-step, so
    # the MoE layers' host syncs (Stack.moe_host_sync_s) are not paid
    cuda_graph: bool = False
    optimizer: OptimizerPolicy = field(default_factory=lambda: OPTIMIZERS[DEFAULT_OPTIMIZER])
    dtypes: ComputeDtypes = field(default_factory=ComputeDtypes)

    def __post_init__(self) -> None:
        for name, typ in (
            ("degrees", Degrees),
            ("remat", Remat),
            ("schedule", Schedule),
            ("optimizer", OptimizerPolicy),
            ("dtypes", ComputeDtypes),
        ):
            if not isinstance(getattr(self, name), typ):
                raise PlanError(
                    f"plan {name} = {getattr(self, name)!r} is not a {typ.__name__}",
                    rule="build plans with parse_plan(...) or Plan(degrees=Degrees(...), ...)",
                    fix=f'write e.g. parse_plan("fsdp=8,tp=2,{name}=...")',
                )
        _whole(
            self.microbatches,
            "microbatch",
            low=1,
            high=MAX_MICROBATCHES,
            fix="write microbatch=1 or more",
            rule=f"at least one microbatch, at most {MAX_MICROBATCHES}",
        )
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise PlanError(
                f"zero={self.zero!r}", rule="ZeRO stages are 0, 1, 2 or 3", fix="write zero=1"
            )
        _whole(
            self.virtual_stages,
            "virtual",
            low=1,
            high=MAX_VIRTUAL_STAGES,
            fix="write virtual=2 (two model chunks per pipeline stage) with schedule=interleaved",
        )
        if self.virtual_stages > 1 and self.schedule != Schedule.INTERLEAVED:
            raise PlanError(
                f"virtual={self.virtual_stages} with schedule={self.schedule.value}",
                rule="virtual stages (model chunks per pipeline stage) exist only in the interleaved schedule",
                fix=f"add schedule=interleaved, or drop virtual={self.virtual_stages}",
            )
        for f in (*TRISTATE_FLAGS, "compiled"):
            object.__setattr__(self, f, _tristate_value(f, getattr(self, f)))
        for f in (
            "sequence_parallel",
            "offload_activations",
            "expert_tp",
            "cuda_graph",
        ):
            object.__setattr__(self, f, bool(getattr(self, f)))

    @property
    def active(self) -> frozenset[Strategy]:
        """The strategies of degree > 1."""
        return frozenset(s for s in STRATEGIES if self.degrees.of(s) > 1)

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:  # the spec parse_plan reads back, not a dataclass dump
        return f"Plan({self.describe()!r})"

    def describe(self) -> str:
        d = self.degrees
        parts = [d.describe()]
        parts.append(f"microbatch={self.microbatches}")
        parts.append(f"remat={self.remat}")
        if d.dp > 1:
            parts.append(f"zero={self.zero}")
        if d.pp > 1:
            parts.append(f"schedule={self.schedule.value}")
            if self.schedule == Schedule.INTERLEAVED:
                parts.append(f"virtual={self.virtual_stages}")
        for flag, on in (
            ("megatron_sp", self.sequence_parallel and d.tp > 1),
            ("collective_matmul", self.collective_matmul),
            ("overlap_ep", self.overlap_ep),
            ("offload_activations", self.offload_activations),
            ("cuda_graph", self.cuda_graph),
        ):
            if on or (on is False and flag in TRISTATE_FLAGS):  # a tri-state flag's 0 is said
                parts.append(f"{flag}={int(on)}")
        if self.compiled is not None:  # tri-state: left out is the stack's default
            parts.append(f"compile={int(self.compiled)}")
        if not self.expert_tp and d.tp > 1:
            parts.append("expert_tp=0")
        parts += self.dtypes.describe()
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = self.degrees
        return {
            "spec": self.describe(),
            **{s.value: d.of(s) for s in Strategy},
            "microbatches": self.microbatches,
            "remat": str(self.remat),
            "zero": self.zero,
            "schedule": self.schedule.value,
            "virtual_stages": self.virtual_stages,
            "sequence_parallel": self.sequence_parallel,
            "collective_matmul": self.collective_matmul,
            "overlap_ep": self.overlap_ep,
            "expert_tp": self.expert_tp,
            "compiled": self.compiled,
            "offload_activations": self.offload_activations,
            "cuda_graph": self.cuda_graph,
            "optimizer": self.optimizer.name,
            "compute_dtypes": {
                "matmul": self.dtypes.matmul.value,
                "attention": self.dtypes.attention.value,
                "experts": self.dtypes.experts.value,
                "vocab": self.dtypes.vocab.value,
            },
            "mesh_axes": [list(a) for a in d.mesh_axes()],
        }


PLAN_KEYS = (
    "dp, fsdp, tp, sp, ep, pp, microbatch, remat, zero, schedule, virtual, megatron_sp, "
    "collective_matmul, overlap_ep, expert_tp, compile, offload_activations, cuda_graph, optimizer, matmul_dtype, attention_dtype, expert_dtype, "
    "vocab_dtype, scaling"
)
_FLAG_TRUE = ("1", "true", "yes", "on")
_FLAG_FALSE = ("0", "false", "no", "off")

# Plan flags whose mechanism a stack may switch on by default (the profile's overlap `plan_key`s):
# unset (None) leaves the stack's default, 1 forces the mechanism on, 0 off.
TRISTATE_FLAGS = ("collective_matmul", "overlap_ep")
# per-candidate code of a tri-state flag in the search arrays (`flag_codes`): unset, off, on
FLAG_UNSET, FLAG_OFF, FLAG_ON = -1, 0, 1


def _tristate_value(name: str, v: Any) -> bool | None:
    """A tri-state flag's value as None/True/False (numpy bools and 0/1 accepted)."""
    if v is None:
        return None
    if _bool_like(v) and int(v) in (0, 1):  # bools (numpy's too), 0/1
        return bool(v)
    raise PlanError(
        f"plan {name} = {v!r}",
        rule=f"{name} is tri-state: left out (None) keeps the stack's default, 1 (True) "
        "switches the mechanism on, 0 (False) switches it off",
        fix=f"write {name}=1 or {name}=0, or leave {name} out for the stack's default",
    )


def _bool_like(v: Any) -> bool:
    if isinstance(v, numbers.Integral):
        return True
    if type(v).__module__ != "numpy":
        return False
    import numpy as np

    return isinstance(v, np.bool_)


def flag_code(v: bool | None) -> int:
    """A tri-state flag as its search-array code (FLAG_UNSET, FLAG_OFF, FLAG_ON)."""
    return FLAG_UNSET if v is None else FLAG_ON if v else FLAG_OFF


def flag_codes(values: Any) -> np.ndarray:
    """Tri-state flags (None/True/False each) as an int8 array of their codes."""
    import numpy as np

    return np.array([flag_code(v) for v in values], dtype=np.int8)


def flag_of_code(code: Any) -> bool | None:
    """The tri-state flag a search-array code stands for (inverse of `flag_code`)."""
    c = int(code)
    return None if c == FLAG_UNSET else c == FLAG_ON


def _flag(k: str, v: str, tristate: bool = False) -> bool:
    s = v.lower()
    if s in _FLAG_TRUE:
        return True
    if s in _FLAG_FALSE:
        return False
    rule, fix = "flags are 1/0 (or true/false, on/off)", f"write {k}=1"
    if tristate:
        rule += (
            f"; {k} is tri-state: 1 switches the mechanism on, 0 off, and leaving it out keeps "
            "the stack's own default (its profile's: an overlap's default under the plan's "
            "conditions, compile's [eager] compiled_by_default)"
        )
        fix = f"write {k}=1 or {k}=0, or drop {k} to keep the stack's default"
    raise PlanError(f"plan flag {k}={v!r}", rule=rule, fix=fix)


def _tristate(k: str, v: str) -> bool:
    """A tri-state flag written in a plan: 1 or 0 (leaving the key out is the stack's default)."""
    return _flag(k, v, tristate=True)


def _int(k: str, v: str) -> int:
    if not re.fullmatch(r"[+-]?\d{1,9}", v):
        raise PlanError(
            f"plan value {k}={v!r} cannot be read",
            rule="numbers are integers; schedule is gpipe, 1f1b or interleaved",
            fix=f"correct {k}",
        )
    return int(v)


def _schedule(k: str, v: str) -> Schedule:
    try:
        return Schedule(v.lower())
    except ValueError:
        raise PlanError(
            f"plan value {k}={v!r} cannot be read",
            rule="numbers are integers; schedule is gpipe, 1f1b or interleaved",
            fix=f"correct {k}",
        ) from None


# plan key (and its aliases) -> (Plan field, reader); a field's canonical key is its first
_PLAN_KEY_READERS: dict[str, tuple[str, Any]] = {}
_CANONICAL_KEY: dict[str, str] = {}
for _keys, _field, _reader in (
    (("microbatch", "microbatches", "mb", "accum", "grad_accum"), "microbatches", _int),
    (("remat",), "remat", lambda k, v: parse_remat(v)),
    (("zero",), "zero", _int),
    (("schedule",), "schedule", _schedule),
    (("virtual", "virtual_stages", "v"), "virtual_stages", _int),
    (("megatron_sp", "sequence_parallel", "seqpar"), "sequence_parallel", _flag),
    (("collective_matmul", "cm"), "collective_matmul", _tristate),
    (("overlap_ep", "dualpipe"), "overlap_ep", _tristate),
    (("compile", "compiled"), "compiled", _tristate),
    (("offload_activations", "offload_acts"), "offload_activations", _flag),
    (("expert_tp",), "expert_tp", _flag),
    (("cuda_graph", "full_graph"), "cuda_graph", _flag),
    (("optimizer", "opt"), "optimizer", lambda k, v: parse_optimizer(v)),
    (("matmul_dtype", "dtype"), "dtype:matmul", lambda k, v: _compute_dtype(v, k)),
    (("attention_dtype", "attn_dtype"), "dtype:attention", lambda k, v: _compute_dtype(v, k)),
    (("expert_dtype", "experts_dtype"), "dtype:experts", lambda k, v: _compute_dtype(v, k)),
    (("vocab_dtype", "head_dtype"), "dtype:vocab", lambda k, v: _compute_dtype(v, k)),
    (("scaling", "fp8_scaling"), "dtype:scaling", lambda k, v: _scaling(v, k)),
):
    _CANONICAL_KEY[_field] = _keys[0]
    for _k in _keys:
        _PLAN_KEY_READERS[_k] = (_field, _reader)


def parse_plan(text: str | Mapping[str, Any]) -> Plan:
    """'fsdp=1024,tp=4,sp=2,microbatch=4,remat=full' -> Plan (unknown keys are errors).

    `zero=3` over the data axis is FSDP: dp moves to fsdp.
    """
    if isinstance(text, str) and not text.strip():
        raise PlanError(
            "empty plan",
            rule="a plan names at least one strategy degree or option, e.g. dp=8",
            fix='write e.g. --plan "fsdp=256,tp=4,microbatch=4,remat=full" (or omit --plan to search)',
        )
    deg, rest = parse_degrees(text)
    kw: dict[str, Any] = {}
    dtypes: dict[str, Any] = {}
    for k, v in rest.items():
        if k not in _PLAN_KEY_READERS:
            raise PlanError(
                f"unknown plan key {k!r}",
                rule="plan keys: " + PLAN_KEYS,
                fix='write e.g. --plan "fsdp=256,tp=4,microbatch=4,remat=full"',
            )
        name, reader = _PLAN_KEY_READERS[k]
        value = reader(k, v)
        if name.startswith("dtype:"):
            dtypes[name.split(":", 1)[1]] = value
        else:
            kw[name] = value
    if dtypes:
        kw["dtypes"] = ComputeDtypes(**dtypes)
    if kw.get("zero") == 3 and deg.dp > 1:  # ZeRO-3 over the data axis is FSDP
        deg = replace(deg, fsdp=deg.fsdp * deg.dp, dp=1)
    return Plan(degrees=deg, **kw)


# ------------------------------------------------------------------------------ workload


class Phase(enum.StrEnum):
    """What one step runs: a training step (forward, d_lhs, d_rhs), or inference."""

    TRAIN = "train"
    PREFILL = "prefill"  # forward over the prompt
    DECODE = "decode"  # forward of one new token per sequence, reading a KV cache of S tokens


class Causal(enum.StrEnum):
    """How causal attention FLOPs are counted: FULL (dense kernel, book's 12BT²NH) or HALF (useful work)."""

    FULL = "full"
    HALF = "half"


# Above these a workload is beyond any training run (and the arithmetic overflows float ranges
# long before a user meant it): 10T tokens per step, a billion-token sequence, 1e18 run tokens.
MAX_BATCH_TOKENS = 1e13
MAX_SEQ_LEN = 10**9
MAX_RUN_TOKENS = 1e18


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(
            f"{what} = {value!r} is a {type(value).__name__}, not a number",
            rule=f"{what} is a number (parse text such as '4M' with units.parse_quantity)",
            fix=f"pass {what} as a number, e.g. 4 * 2**20",
        )
    return value


def _tokens(b: float) -> str:
    """A batch in tokens as a user would type it: 16Mi for whole mebitokens, else the integer."""
    return f"{b / 2**20:g}Mi" if b % 2**20 == 0 else f"{b:.0f}"


@dataclass(frozen=True)
class Workload:
    """Global batch (tokens per optimizer step), sequence length, and run length in tokens."""

    batch_tokens: float
    seq_len: int
    total_tokens: float = 0.0
    causal: Causal = Causal.HALF

    def __post_init__(self) -> None:
        for name in ("batch_tokens", "seq_len", "total_tokens"):
            _number(getattr(self, name), name)
        if isinstance(self.seq_len, float):
            if not self.seq_len.is_integer():
                raise PlanError(
                    f"seq_len = {self.seq_len!r}",
                    rule="a sequence holds a whole number of tokens",
                    fix=f"write seq_len={math.floor(self.seq_len)} or {math.ceil(self.seq_len)}",
                )
            object.__setattr__(self, "seq_len", int(self.seq_len))
        object.__setattr__(self, "causal", Causal(self.causal))
        if self.seq_len <= 0 or not self.batch_tokens > 0 or not self.total_tokens >= 0:
            raise PlanError(
                f"batch_tokens={self.batch_tokens}, seq_len={self.seq_len}, tokens={self.total_tokens}",
                rule="batch and sequence length are positive, run tokens non-negative",
                fix="give positive sizes",
            )
        for name, v, cap in (
            ("batch_tokens", self.batch_tokens, MAX_BATCH_TOKENS),
            ("seq_len", self.seq_len, MAX_SEQ_LEN),
            ("tokens", self.total_tokens, MAX_RUN_TOKENS),
        ):
            if not math.isfinite(v) or v > cap:
                raise PlanError(
                    f"{name} = {v:g} is beyond any training run",
                    rule=f"{name} is at most {cap:g}",
                    fix=f"check the units of {name} (e.g. 4M tokens per step, 15T tokens per run)",
                )
        if self.batch_tokens < self.seq_len:
            raise PlanError(
                f"batch of {self.batch_tokens:g} tokens is shorter than one {self.seq_len}-token sequence",
                rule="a batch holds at least one sequence",
                fix="raise --batch-tokens or lower --seq",
            )

    @property
    def sequences(self) -> float:
        return self.batch_tokens / self.seq_len

    @property
    def whole_sequences(self) -> bool:
        return float(self.sequences).is_integer()

    def nearest_whole_batches(self) -> tuple[float, ...]:
        """Batches (tokens) near this one that hold a whole number of sequences: the
        power-of-two sequence count nearest to it, then the whole counts just below and above."""
        s = self.sequences
        pow2 = 2 ** round(math.log2(s))
        counts = [pow2] + [c for c in (math.floor(s), math.ceil(s)) if c >= 1 and c != pow2]
        return tuple(float(c * self.seq_len) for c in dict.fromkeys(counts))

    def require_whole_sequences(self) -> None:
        """A PlanError naming the nearest valid batches when the batch splits a sequence."""
        if self.whole_sequences:
            return
        near = ", ".join(
            f"{_tokens(b)} ({b / self.seq_len:.0f} sequences)" for b in self.nearest_whole_batches()
        )
        raise PlanError(
            f"a batch of {self.batch_tokens:g} tokens is {self.sequences:g} sequences of {self.seq_len} tokens",
            rule="a training batch holds a whole number of sequences",
            fix=f"use a batch that is a multiple of {self.seq_len} tokens, e.g. {near}",
        )


__all__ = [
    "AXIS_OF",
    "AXIS_ORDER",
    "Causal",
    "ComputeDtype",
    "ComputeDtypes",
    "Degrees",
    "OPTIMIZERS",
    "OpClass",
    "OptimizerPolicy",
    "Phase",
    "Plan",
    "Remat",
    "RECOMPUTE_MODULES",
    "RematKind",
    "SCHEDULE_OF_CODE",
    "Schedule",
    "Strategy",
    "Workload",
    "parse_degrees",
    "parse_optimizer",
    "parse_plan",
    "parse_modules",
    "parse_remat",
]
