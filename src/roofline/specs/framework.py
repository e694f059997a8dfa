"""Framework profiles: what a training stack really does, as sourced data.

The sharded-einsum algebra lists every legal way to run a step and picks the cheapest.
Real stacks do not: FSDP in every stack gathers the weights, Megatron's full recompute
reruns the whole layer, a2a dispatch is exposed unless a schedule hides it. A profile
(`specs/frameworks/<name>.toml`) says, for one stack, with a source for every entry:

- `options`: which operand may move over each mesh axis, per einsum family (the algebra's
  options a stack takes; "cheapest" = the algebra decides);
- `data_parallel` / `fsdp`: when gradients are reduced and weights (re)gathered, and in
  which dtype;
- `overlap`: per overlap class (weight-gather, grad-reduce, tensor, sequence, expert,
  pipeline) the fraction of that class's collective time hidden behind compute, per pass,
  with the compute window it can hide behind and the part that is always exposed — once
  with the stack's mechanism on, once off;
- `remat`: each activation-recompute policy by the stack's own name and what it reruns;
- `pipeline`, `context_parallel`, `expert_parallel`: what the stack supports;
- `precision`: recipes and which op families run in which dtype;
- `overheads`: fixed per-step / per-layer costs where the stack documents them;
- `features`: the date each feature the planner may choose first shipped in the stack, with its
  source (`Framework.lacks(as_of)`: what a stack of that date could not run; a feature not
  listed is never gated).

Everything here is data and vocabulary; the step model (walk/timeline) applies it. The
fractions are defaults with their evidence; calibration may refit them.
"""

from __future__ import annotations

import calendar
import datetime
import enum
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from roofline.errors import SpecError, UnknownNameError
from roofline.specs.catalog import DATA_DIR, is_file, normalize, read_toml, resolve
from roofline.specs.filecache import cached
from roofline.specs.filecache import read_toml as stamped_toml
from roofline.specs.schema import check as check_schema
from roofline.units import parse_dtype

FRAMEWORK_DIR = DATA_DIR / "frameworks"
SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------
# Vocabulary (enums parsed at the edge)
# --------------------------------------------------------------------------------------


class OverlapClass(enum.StrEnum):
    """What a collective is for; the walk labels every collective with one of these."""

    WEIGHT_GATHER = "weight-gather"  # FSDP/ZeRO-3 weight all-gathers; ZeRO-1/2 updated-param gather
    GRAD_REDUCE = "grad-reduce"  # weight-gradient reduce-scatter / all-reduce over data/fsdp
    TENSOR = "tensor"  # tensor(+sequence)-parallel activation collectives
    SEQUENCE = "sequence"  # context parallelism (K/V exchange, Ulysses all-to-all)
    EXPERT = "expert"  # expert dispatch / combine
    PIPELINE = "pipeline"  # stage-to-stage point-to-point
    OTHER = "other"  # anything the algebra chose that no mechanism above covers


REQUIRED_OVERLAP = tuple(c for c in OverlapClass if c != OverlapClass.OTHER)


class Pass(enum.StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"


class Window(enum.StrEnum):
    """The compute a collective can hide behind (the timeline caps hiding by this compute)."""

    OWN_MATMUL = "own_matmul"  # the matmul it feeds or drains, decomposed (collective matmul)
    LOCAL_CHUNK = "local_chunk"  # only the op's work on the local shard (1/n of the op)
    LAYER = "layer"  # other compute of the same or the neighbouring layer (prefetch, bulk)
    PASS = "pass"  # the rest of this microbatch's forward or backward pass
    OTHER_MICROBATCH = "other_microbatch"  # another microbatch's compute (1F1B steady state)
    # Megatron's combined 1F1B (EP overlap): each of a layer's all-to-alls runs beside one
    # phase of the other microbatch's layer, and a phase takes the longer of the two
    # (training.step._combined_1f1b); warm-up and flush passes run unpaired
    COMBINED_1F1B = "combined_1f1b"


class Exposed(enum.StrEnum):
    """The part of a class's collective time that stays exposed even when the mechanism is on."""

    NONE = "none"
    FIRST_CHUNK = "first_chunk"  # 1/n of the collective (the first step of a decomposed ring)
    ONE_LAYER = "one_layer"  # one layer's worth per pass (first gather / last reduce)
    ONE_BUCKET = "one_bucket"  # the last bucket (see the bucket size in data_parallel)
    FILL_DRAIN = "fill_drain"  # pipeline warm-up and flush
    ALL = "all"


class Requirement(enum.StrEnum):
    """Conditions a mechanism needs (or that switch a default on)."""

    SEQUENCE_PARALLEL = "sequence_parallel"
    TENSOR_PARALLEL = "tensor_parallel"
    DATA_PARALLEL = "data_parallel"
    PIPELINE_PARALLEL = "pipeline_parallel"
    VIRTUAL_STAGES = "virtual_stages"
    EXPERT_PARALLEL = "expert_parallel"
    ALL_TO_ALL_DISPATCH = "all_to_all_dispatch"
    RING_ATTENTION = "ring_attention"
    NO_FULL_REMAT = "no_full_remat"
    DISTRIBUTED_OPTIMIZER = "distributed_optimizer"
    ZERO3 = "zero3"
    COMPILE = "compile"
    TPU = "tpu"
    GPU = "gpu"
    FP8_HARDWARE = "fp8_hardware"  # Hopper or newer
    BLACKWELL = "blackwell"


class Family(enum.StrEnum):
    """Einsum families a profile's choices apply to (see `family_of`)."""

    DENSE = "dense"  # projections, dense/shared MLP, router, norms
    ATTENTION = "attention"  # activation x activation: scores and context
    EXPERT = "expert"  # routed-expert matmuls and their activation
    VOCAB = "vocab"  # embedding and unembedding


class AxisRole(enum.StrEnum):
    """Mesh axes of the algebra (`rules.AXIS_OF` values) a policy can speak about."""

    DATA = "data"
    FSDP = "fsdp"
    TENSOR = "tensor"
    SEQ = "seq"
    EXPERT = "expert"


class Move(enum.StrEnum):
    """Which operand a stack moves over an axis (the only option it takes there)."""

    CHEAPEST = "cheapest"  # the algebra's cheapest legal option (the book's idealised machine)
    WEIGHTS = "weights"  # gather the weights (FSDP / ZeRO-3), never the activations
    ACTIVATIONS = "activations"  # weights stay sharded; gather/reduce activations (Megatron TP)
    KV = "kv"  # attention: move keys/values, never the queries (ring / all-gather CP)
    HEADS = "heads"  # attention: all-to-all from sequence to head sharding (Ulysses)
    TOKENS = (
        "tokens"  # experts: move tokens to the experts (dispatch/combine), never expert weights
    )


class Per(enum.StrEnum):
    MICROBATCH = "microbatch"
    STEP = "step"


class Regather(enum.StrEnum):
    """Whether FSDP gathers weights again for the backward pass."""

    ALWAYS = "always"  # resharded after forward, gathered again in backward
    NEVER = "never"  # kept gathered from forward to backward (ZeRO-2-like)
    WITH_REMAT = "with_remat"  # only when remat reruns the layer (unscanned XLA)


class Schedule(enum.StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"  # 1F1B over virtual stages (looped)
    CIRCULAR = "circular"  # GPipe order over repeated (virtual) stages, SPMD pipeline
    LOOPED_BFS = "looped_bfs"
    ZERO_BUBBLE = "zero_bubble"  # interleaved zero-bubble (split dgrad/wgrad)
    ZBV = "zbv"  # zero-bubble V schedule
    DUALPIPE = "dualpipe"  # DualPipe(V): bidirectional, overlaps EP comm of two microbatches


class Uneven(enum.StrEnum):
    """How a stack lets pipeline stages hold different numbers of layers."""

    NONE = "none"  # layers must divide evenly
    FIRST_LAST = "first_last"  # set the first/last stage's layer count; the rest even
    LAYOUT = "layout"  # an arbitrary per-stage layout
    BALANCED = "balanced"  # layers + embedding/output weights spread, stages differ by <= 1
    BY_PARAMS = "by_params"  # partition by parameter count
    PARTIAL = "partial"  # pipeline only some layers; the rest run with the stage axis as DP


class CPMethod(enum.StrEnum):
    RING = "ring"  # K/V chunks passed around a ring, overlapped with attention
    ALLGATHER_KV = "allgather_kv"  # all-gather K/V, then local attention
    ALL_TO_ALL_HEADS = "all_to_all_heads"  # Ulysses: all-to-all to head sharding and back
    HYBRID = "hybrid"  # all-to-all inside, ring across (a2a+p2p, USP)


class LoadBalance(enum.StrEnum):
    NONE = "none"  # contiguous chunks: causal work grows with the rank
    ZIGZAG = "zigzag"  # 2n chunks, rank i takes i and 2n-1-i (head-tail, dual-chunk swap)
    STRIPED = "striped"
    PERFECT = "perfect"  # idealised: causal work split evenly


class AttentionKernel(enum.StrEnum):
    """The attention kernel a stack runs (its speed differs from the efficiency profile's
    reference kernel per chip family; see roofline.core.stack.ATTENTION_KERNEL_SPEED)."""

    FLASH_ATTENTION_2 = "flash-attention-2"  # Dao 2023 (flash-attn 2, PyTorch SDPA's flash backend)
    FLASH_ATTENTION_3 = "flash-attention-3"  # Shah et al. 2024 (Hopper)
    CUDNN = "cudnn"  # cuDNN fused attention (Transformer Engine's FusedAttention)
    SPLASH = "splash"  # Pallas splash attention (TPU)
    # no flash kernel: batched GEMMs with the score matrix written to HBM and a separate softmax
    # (Megatron's fused scale-mask-softmax before FlashAttention, Dao et al. 2022)
    UNFUSED = "unfused"


class Dispatch(enum.StrEnum):
    ALL_TO_ALL = "all_to_all"
    ALLGATHER = "allgather"  # every rank gathers all tokens, keeps its experts' (no a2a)
    DEEPEP = "deepep"  # fused all-to-all that sends each token once per node (node dedup)
    RING = "ring"  # ring of experts: all-gather tokens, reduce-scatter outputs


REMAT_MEMORY_KINDS = ("none", "matmuls", "full", "checkpoints")  # memory.RematKind values
COLLECTIVE_KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "permute")
SCALINGS = ("none", "delayed", "current", "rowwise", "blockwise", "mx", "nvfp4")

# Rerun groups: names a remat policy uses for parts of a layer, as globs over ledger op
# names (ledger.build_ledger). A policy may also list a glob directly (it contains "/").
RERUN_GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "layer": ("attn/*", "mlp/*", "moe/*", "norms"),
        "attention_core": ("attn/scores*", "attn/softmax*", "attn/dropout*", "attn/context*"),
        "qkv_proj": (
            "attn/q",
            "attn/k",
            "attn/v",
            "attn/q_a",
            "attn/q_b",
            "attn/kv_a",
            "attn/kv_b",
            "attn/bias",
        ),
        "mla_up_proj": ("attn/q_b", "attn/kv_b"),
        "out_proj": ("attn/out",),
        "norms": ("norms",),
        "mlp_in": ("mlp/gate", "mlp/up"),
        "mlp_act": ("mlp/act",),
        "mlp_out": ("mlp/down",),
        "router": ("moe/router",),
        # the dropping path's dispatch/combine einsums (ledger._dense_dispatch) go with the
        # expert matmuls they feed and drain
        "moe_in": ("moe/dispatch", "moe/gate", "moe/up"),
        "moe_act": ("moe/act",),
        "moe_out": ("moe/down", "moe/combine"),
        "shared_experts": ("moe/shared/*",),
    }
)

# What each module of a partial recompute (plan `remat=a+b`, `specs.plan.RECOMPUTE_MODULES`)
# reruns: its rerun groups, and the overlap classes of the collectives inside it that rerun with
# it. From the `recompute_modules` docstring of MLM megatron/core/transformer/transformer_config.py:
# core_attn "the core attention part" (under context parallelism the K/V exchange is inside it),
# mla_up_proj "the MLA up projection and RoPE applying parts", layernorm "the input_layernorm and
# pre_mlp_layernorm", mlp "the dense MLP submodule" (its TP collectives inside), moe "the MoE
# layer" (router, dispatch/combine and experts), moe_act "the MoE MLP activation function",
# shared_experts "the shared experts in the MoE layer".
MODULE_RERUNS: Mapping[str, tuple[tuple[str, ...], tuple[OverlapClass, ...]]] = MappingProxyType(
    {
        "core_attn": (("attention_core",), (OverlapClass.SEQUENCE,)),
        "mla_up_proj": (("mla_up_proj",), ()),
        "layernorm": (("norms",), ()),
        "mlp": (("mlp_in", "mlp_act", "mlp_out"), (OverlapClass.TENSOR,)),
        "moe": (
            ("router", "moe_in", "moe_act", "moe_out", "shared_experts"),
            (OverlapClass.TENSOR, OverlapClass.EXPERT),
        ),
        "moe_act": (("moe_act",), ()),
        "shared_experts": (("shared_experts",), (OverlapClass.TENSOR,)),
    }
)


# Which family an op belongs to, by ledger op name (first match wins).
FAMILY_PATTERNS: tuple[tuple[str, Family], ...] = (
    ("embed", Family.VOCAB),
    ("unembed", Family.VOCAB),
    ("attn/scores*", Family.ATTENTION),
    ("attn/context*", Family.ATTENTION),
    ("moe/shared/*", Family.DENSE),
    ("moe/router", Family.DENSE),
    ("moe/*", Family.EXPERT),
)


def family_of(op_name: str) -> Family:
    """The einsum family of a ledger op ('attn/scores' -> attention, 'moe/up' -> expert)."""
    for pattern, fam in FAMILY_PATTERNS:
        if fnmatch.fnmatchcase(op_name, pattern):
            return fam
    return Family.DENSE


# --------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptionPolicy:
    """Per family and mesh axis, the operand the stack moves; absent pairs are `cheapest`."""

    moves: Mapping[Family, Mapping[AxisRole, Move]]
    source: str
    note: str = ""
    # tensor parallelism always leaves the residual stream between blocks split over the
    # sequence (Megatron's sequence parallelism, without a switch): the planner searches only
    # megatron_sp=1 on such a stack, as validate's mapping costs its runs
    tp_shards_sequence: bool = False

    def move(self, family: Family | str, axis: AxisRole | str) -> Move:
        by_axis = self.moves.get(Family(family), {})
        return by_axis.get(AxisRole(axis), Move.CHEAPEST)


@dataclass(frozen=True)
class Timing:
    """When a data-parallel collective is paid, in which dtype, with which bucket."""

    per: Per
    dtype: str
    source: str
    bucket_params: float | None = None  # elements per bucket, where the stack fixes one
    note: str = ""
    per_with_pipeline: Per | None = None  # where pipeline parallelism changes `per`


class HostTraffic(enum.StrEnum):
    """When an offloading stack moves gradients to the host and parameters back."""

    BEHIND_COMPUTE = "behind_compute"  # streamed during backward / next forward (ZeRO-Offload)
    WITH_UPDATE = "with_update"  # at the optimizer step, pipelined with the host's update


@dataclass(frozen=True)
class OptimizerOffload:
    """The stack runs the optimizer on the host with its state in host DRAM
    (`training.offload`): the switch as its launch file writes it and the traffic's schedule."""

    switch: str
    host_traffic: HostTraffic
    source: str
    note: str = ""
    with_fsdp: bool = True  # whether the stack offloads on its fsdp (ZeRO-3) axis too


@dataclass(frozen=True)
class DataParallel:
    """Replicated data parallelism (the `data` axis) and the ZeRO stages the stack runs."""

    zero_stages: tuple[int, ...]
    default_zero: int
    grad_reduce: Timing  # weight-gradient reduction over replicas
    param_gather: Timing | None  # ZeRO-1/2: updated parameters gathered after the step
    source: str
    # ZeRO-2 keeps only a gradient shard, so some stacks reduce-scatter every microbatch
    zero2_grad_reduce_per: Per | None = None
    note: str = ""
    # optimizer state and update on the host (None: the stack's records do not offload)
    optimizer_offload: OptimizerOffload | None = None

    def grad_reduce_per(self, zero: int, pipelined: bool = False) -> Per:
        """When the replicas' gradient sum is paid under ZeRO stage `zero` (0-2), with or
        without pipeline parallelism (torch's PipelineStage syncs on the last microbatch)."""
        if pipelined and self.grad_reduce.per_with_pipeline is not None:
            return self.grad_reduce.per_with_pipeline
        if zero >= 2 and self.zero2_grad_reduce_per is not None:
            return self.zero2_grad_reduce_per
        return self.grad_reduce.per


@dataclass(frozen=True)
class Fsdp:
    """Sharded data parallelism (the `fsdp` axis, ZeRO-3): what is gathered and when."""

    supported: bool
    regather: Regather
    gather_per: Per
    grad_reduce_per: Per
    gather_dtype: str
    grad_reduce_dtype: str
    unit: str  # what one gather covers ("layer" = one transformer block)
    source: str
    # with pipeline parallelism some stacks keep weights gathered across microbatches
    regather_with_pipeline: Regather | None = None
    gather_per_with_pipeline: Per | None = None
    grad_reduce_per_with_pipeline: Per | None = None
    note: str = ""

    def when(self, pipelined: bool) -> tuple[Regather, Per, Per]:
        """(regather, gather_per, grad_reduce_per) with or without pipeline parallelism."""
        if not pipelined:
            return self.regather, self.gather_per, self.grad_reduce_per
        return (
            self.regather_with_pipeline or self.regather,
            self.gather_per_with_pipeline or self.gather_per,
            self.grad_reduce_per_with_pipeline or self.grad_reduce_per,
        )


@dataclass(frozen=True)
class OverlapMode:
    """Hidden fraction of a class's collective time per pass, and what bounds it."""

    forward: float
    backward: float
    window: Window
    exposed: Exposed
    source: str
    evidence: str = ""

    def fraction(self, pass_: Pass | str) -> float:
        return self.forward if Pass(pass_) == Pass.FORWARD else self.backward


@dataclass(frozen=True)
class Overlap:
    """One overlap class: the stack's mechanism on and off, and when it is on by default.

    `default` is "on", "off", or a `Requirement` value (on when that condition holds,
    e.g. DeepSpeed overlaps communication by default only under ZeRO-3). `requires` lists
    what the mechanism needs; `plan_key` names the roofline plan key that switches it.
    """

    cls: OverlapClass
    default: str
    on: OverlapMode
    off: OverlapMode
    flag: str = ""
    plan_key: str = ""
    requires: tuple[Requirement, ...] = ()
    note: str = ""

    def missing(self, conditions: frozenset[str] = frozenset()) -> tuple[Requirement, ...]:
        """The prerequisites of the mechanism that `conditions` (requirement values) lack."""
        return tuple(r for r in self.requires if r.value not in conditions)

    def mode(
        self, enabled: bool | None = None, conditions: frozenset[str] = frozenset()
    ) -> OverlapMode:
        """The mode in force: `enabled` if the run says, else the stack's default.

        The default is on when `default` is "on" or names a condition that holds, and the
        prerequisites in `requires` all hold (`conditions` holds `Requirement` values).
        """
        if enabled is None:
            wanted = self.default == "on" or self.default in conditions
            enabled = wanted and not self.missing(conditions)
        return self.on if enabled else self.off


@dataclass(frozen=True)
class RematPolicy:
    """One activation-recompute policy of a stack and what it reruns in the backward pass.

    `reruns` lists rerun groups (`RERUN_GROUPS`) or ledger-name globs. `memory` is the
    closest `memory.RematKind` for saved bytes. `reruns_last_projection` is False where the
    compiler drops the layer's final projection from the recompute (XLA; torch's early stop),
    True where the whole layer function reruns (Megatron's checkpoint, torch with
    early_stop=False). `reruns_collectives` lists the overlap classes whose collectives
    inside rerun ops run again; `keeps_collective_kinds` collective outputs the policy saves.
    `layer_fraction` is the share of layers the policy applies to. `parts` (optional) names
    selectable sub-policies (Megatron's --recompute-modules) with their rerun groups.
    """

    name: str
    memory: str
    reruns: tuple[str, ...]
    reruns_last_projection: bool
    source: str
    aliases: tuple[str, ...] = ()
    reruns_collectives: tuple[OverlapClass, ...] = ()
    keeps_collective_kinds: tuple[str, ...] = ()
    layer_fraction: float = 1.0
    offloaded: bool = False
    parts: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    note: str = ""

    def patterns(self) -> tuple[str, ...]:
        """The ledger-name globs this policy reruns."""
        out: list[str] = []
        for g in self.reruns:
            out.extend(RERUN_GROUPS.get(g, (g,)))
        return tuple(out)

    def reruns_op(self, op_name: str) -> bool:
        """True if the policy reruns ledger op `op_name` (before any last-projection skip)."""
        return any(fnmatch.fnmatchcase(op_name, p) for p in self.patterns())


@dataclass(frozen=True)
class Remat:
    default: str
    policies: Mapping[str, RematPolicy]
    source: str
    note: str = ""

    def policy(self, name: str | None = None) -> RematPolicy:
        """A policy by its name or alias; None gives the stack's default."""
        want = normalize(name if name is not None else self.default)
        for p in self.policies.values():
            if want in {normalize(a) for a in (p.name, *p.aliases)}:
                return p
        raise SpecError(
            f"remat policy {name!r} is not one of this stack's policies",
            rule="a policy is a name or alias listed under [remat.policies] of the profile",
            fix="use one of " + ", ".join(self.policies),
        )


@dataclass(frozen=True)
class Pipeline:
    """Pipeline support; `schedules` empty (and `default` None) where the stack has none."""

    schedules: tuple[Schedule, ...]
    default: Schedule | None
    uneven: tuple[Uneven, ...]
    embedding_stage: str  # "first"
    loss_stage: str  # "last"
    embedding_layers: float  # layers the embedding counts as when stages are split
    loss_layers: float  # layers the output/loss counts as
    source: str
    note: str = ""

    def supports(self, schedule: Schedule | str) -> bool:
        return Schedule(schedule) in self.schedules


@dataclass(frozen=True)
class ContextParallel:
    """Context-parallel support; `methods` empty (and `default` None) where there is none."""

    methods: tuple[CPMethod, ...]
    default: CPMethod | None
    load_balance: LoadBalance
    source: str
    note: str = ""


@dataclass(frozen=True)
class ExpertParallel:
    """Expert-parallel support; `dispatch` empty (and `default` None) where there is none."""

    dispatch: tuple[Dispatch, ...]
    default: Dispatch | None
    node_limited_routing: bool
    grouped_gemm: bool
    dropless: bool
    source: str
    note: str = ""
    # GPU idle per routed-expert layer forward while the host waits on the device for the
    # tokens each expert received (the dropless dispatchers' device-to-host sync)
    host_sync_s: float = 0.0
    host_sync_source: str = ""
    # SMs the DeepEP-style dispatcher's kernels hold while they move tokens: compute running
    # beside them (the EP-overlap schedule) has the chip's other SMs only
    dispatch_sms: int = 0
    dispatch_sms_source: str = ""
    # the routed experts' output bias (models whose experts carry one, gpt-oss) added by eager
    # torch ops after the grouped GEMM, not in its epilogue (ledger.moe_bias_rows)
    eager_expert_bias: bool = False
    eager_expert_bias_source: str = ""


@dataclass(frozen=True)
class Recipe:
    """A precision recipe: the compute dtype of each op family."""

    name: str
    dtypes: Mapping[Family, str]
    scaling: str
    source: str
    aliases: tuple[str, ...] = ()
    bf16_edge_layers: int = 0  # first and last N layers kept in bf16
    requires: tuple[Requirement, ...] = ()
    note: str = ""
    # where the stack documents this recipe for production pre-training (empty: it does not,
    # and the planner offers it as advice instead of searching it by default)
    pretraining: str = ""

    def dtype(self, family: Family | str) -> str:
        return self.dtypes[Family(family)]


@dataclass(frozen=True)
class Precision:
    default: str
    recipes: Mapping[str, Recipe]
    source: str
    note: str = ""
    # a quantised GEMM saves its activation input for the weight gradient in the narrow
    # format (Transformer Engine), not in 16-bit (torchao's Float8Linear saves 16-bit)
    saves_quantised_inputs: bool = False
    # with tensor (sequence) parallelism the block inputs are cast to the narrow format before
    # their all-gather, and so are the output gradients in the backward pass (torchao's
    # Float8ColwiseParallel / Float8RowwiseParallel / PrepareFloat8ModuleInput): the tensor
    # all-gathers of a quantised GEMM move narrow bytes; its reduce-scatters stay 16-bit
    tp_gathers_quantised: bool = False

    def recipe(self, name: str | None = None) -> Recipe:
        """A recipe by name or alias (case and punctuation ignored); None gives the default."""
        want = normalize(name if name is not None else self.default)
        for r in self.recipes.values():
            if want in {normalize(a) for a in (r.name, *r.aliases)}:
                return r
        raise SpecError(
            f"precision {name!r} is not one of this stack's recipes",
            rule="a recipe is a name or alias listed under [precision.recipes] of the profile",
            fix="use one of " + ", ".join(self.recipes),
        )


class Feature(enum.StrEnum):
    """A capability the planner chooses that a stack shipped at some date (`[features]`).

    Each gates one choice of the search (training.planner.space.stack_as_of): fsdp, pipeline,
    context_parallel and expert_parallel the strategy of that name (context_parallel
    is Strategy.SP); distributed_optimizer ZeRO-1 over the data axis (zero=1);
    selective_recompute remat=matmuls; sequence_parallel megatron_sp=1; interleaved_pipeline
    the interleaved schedule; tp_comm_overlap collective_matmul=1; ep_overlap overlap_ep=1;
    gradient_accumulation microbatches > 1 without a pipeline (pp = 1); hybrid_sharding
    dp > 1 beside fsdp > 1 (replicas of a sharded model, HSDP)."""

    FSDP = "fsdp"
    PIPELINE = "pipeline"
    INTERLEAVED_PIPELINE = "interleaved_pipeline"
    CONTEXT_PARALLEL = "context_parallel"
    EXPERT_PARALLEL = "expert_parallel"
    DISTRIBUTED_OPTIMIZER = "distributed_optimizer"
    SELECTIVE_RECOMPUTE = "selective_recompute"
    SEQUENCE_PARALLEL = "sequence_parallel"
    TP_COMM_OVERLAP = "tp_comm_overlap"
    EP_OVERLAP = "ep_overlap"
    GRADIENT_ACCUMULATION = "gradient_accumulation"
    HYBRID_SHARDING = "hybrid_sharding"


@dataclass(frozen=True)
class FeatureSince:
    """When a feature first shipped in the stack (`since`: the date of the first commit of the
    stack's public repository that let a user run it) and where that is read."""

    since: datetime.date
    source: str
    note: str = ""


_STACK_DATE = re.compile(r"(\d{4})-(\d{2})(?:-(\d{2}))?")


def month_end(year: int, month: int) -> datetime.date:
    """A month named as a stack's date: its last day (whatever shipped in it counts)."""
    return datetime.date(year, month, calendar.monthrange(year, month)[1])


def parse_stack_date(text: str | datetime.date, what: str = "stack date") -> datetime.date:
    """A stack's date from 'YYYY-MM-DD' or 'YYYY-MM' (a month names the stack as it stood at
    the month's end: whatever shipped in that month counts as shipped); a one-paragraph
    SpecError otherwise."""
    if isinstance(text, datetime.date):
        return text
    m = _STACK_DATE.fullmatch(str(text).strip())
    err = SpecError(
        f"{what} {str(text)!r} is not a date",
        rule="a stack date is YYYY-MM-DD or YYYY-MM (a month means its last day), "
        "e.g. 2022-06 or 2022-06-15",
        fix="write the date of the stack version the plans must run on, e.g. 2022-06",
    )
    if m is None:
        raise err
    y, mo = int(m[1]), int(m[2])
    if not 1 <= mo <= 12 or not 1900 <= y <= 9999:
        raise err
    try:
        return datetime.date(y, mo, int(m[3])) if m[3] else month_end(y, mo)
    except ValueError:
        raise err from None


@dataclass(frozen=True)
class Overhead:
    """A fixed cost; `value_s` is None where no source gives one (never invented)."""

    source: str
    value_s: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Kernels:
    """The kernels a stack runs where they differ in speed between stacks (optional table)."""

    attention: AttentionKernel | None
    source: str
    note: str = ""


@dataclass(frozen=True)
class GradAccumulation:
    """How a stack accumulates the gradients of the microbatches of one step where it keeps a
    separate accumulator (optional table): `buffer` is the accumulator's dtype ("params": the
    dtype of the parameters the loss differentiates, `OptimizerPolicy.param_bytes`), and
    `zero_buffer` its dtype under ZeRO-1 where the stack differentiates a cast copy of the
    parameters instead (None: as `buffer`). With more than one microbatch the step keeps the
    accumulator beside each microbatch's gradient and adds every microbatch into it."""

    buffer: str
    source: str
    zero_buffer: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Eager:
    """A stack that runs uncompiled (eager) by default or on request: `traffic` is, per ledger
    row (a glob over op names), the HBM bytes its eager kernels move over the bytes of the one
    fused kernel a compiled step runs for it (optional table)."""

    flag: str  # the stack's own switch, e.g. torchtitan's [compile] enable
    compiled_by_default: bool
    traffic: Mapping[str, float]
    source: str
    note: str = ""

    def factor(self, op_name: str) -> float:
        """The eager traffic factor of ledger row `op_name` (1 where no glob matches)."""
        for pattern, f in self.traffic.items():
            if fnmatch.fnmatchcase(op_name, pattern):
                return f
        return 1.0


@dataclass(frozen=True)
class Overheads:
    step: Overhead  # per optimizer step (optimizer launch, data loading, logging)
    layer: Overhead  # per layer per microbatch pass (kernel launches)


@dataclass(frozen=True)
class Framework:
    """One stack's profile. See the module docstring and docs/frameworks.md."""

    name: str
    title: str
    versions: tuple[str, ...]
    match: tuple[str, ...]  # names in run descriptions that mean this stack
    options: OptionPolicy
    data_parallel: DataParallel
    fsdp: Fsdp
    overlap: Mapping[OverlapClass, Overlap]
    remat: Remat
    pipeline: Pipeline
    context_parallel: ContextParallel
    expert_parallel: ExpertParallel
    precision: Precision
    overheads: Overheads
    aliases: tuple[str, ...] = ()
    notes: str = ""
    kernels: Kernels | None = None
    eager: Eager | None = None
    grad_accumulation: GradAccumulation | None = None
    features: Mapping[Feature, FeatureSince] = field(default_factory=lambda: MappingProxyType({}))

    def move(self, family: Family | str, axis: AxisRole | str) -> Move:
        return self.options.move(family, axis)

    def lacks(self, as_of: datetime.date | None) -> dict[Feature, FeatureSince]:
        """The features this stack had not shipped by `as_of` (None: today, nothing lacking);
        a feature without a recorded date is never lacking."""
        if as_of is None:
            return {}
        return {f: s for f, s in self.features.items() if s.since > as_of}

    def overlap_fraction(
        self,
        cls: OverlapClass | str,
        pass_: Pass | str,
        enabled: bool | None = None,
        conditions: frozenset[str] = frozenset(),
    ) -> float:
        """Hidden fraction of class `cls` in `pass_` (see `Overlap.mode`)."""
        return self.overlap[OverlapClass(cls)].mode(enabled, conditions).fraction(pass_)


# --------------------------------------------------------------------------------------
# Parsing: one reader per table; the schema (run first) owns keys, types and tables, the
# readers own presence, enums, ranges and cross-field rules, each a one-paragraph error
# --------------------------------------------------------------------------------------

_MISSING = object()


def _norm_token(s: str) -> str:
    return re.sub(r"[\s_]+", "-", str(s).strip().lower())


class _Table:
    """A TOML table being read, after the schema checked its keys and their types."""

    def __init__(self, raw: dict, where: str, origin: str) -> None:
        self.raw, self.where, self.origin = raw, where, origin

    def error(self, key: str, value: Any, rule: str, fix: str) -> SpecError:
        at = f"[{self.where}] " if self.where else ""
        return SpecError(f"framework file {self.origin}: {at}{key} = {value!r}", rule=rule, fix=fix)

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key not in self.raw:
            if default is _MISSING:
                raise SpecError(
                    f"framework file {self.origin}: [{self.where}] has no {key!r}",
                    rule=f"[{self.where}] needs {key}",
                    fix=f"add {key} = ... to [{self.where}] (see docs/frameworks.md)",
                )
            return default
        return self.raw[key]

    def text(self, key: str, default: Any = _MISSING) -> str:
        return self.get(key, default)

    def source(self, key: str = "source") -> str:
        s = self.text(key)
        if not s.strip():
            raise self.error(
                key,
                s,
                "every entry names its source (file:line@commit or a URL)",
                "write where the value comes from, or 'no source: why'",
            )
        return s

    def number(self, key: str, default: Any = _MISSING) -> float:
        return float(self.get(key, default))

    def fraction(self, key: str) -> float:
        v = self.number(key)
        if not 0.0 <= v <= 1.0:
            raise self.error(key, v, "overlap fractions are in [0, 1]", "write a value from 0 to 1")
        return v

    def flag(self, key: str, default: Any = _MISSING) -> bool:
        return self.get(key, default)

    def enum(self, key: str, cls: type[enum.Enum], default: Any = _MISSING) -> Any:
        v = self.get(key, default)
        return v if v is default else _parse_enum(self, key, v, cls)

    def enums(self, key: str, cls: type[enum.Enum], default: Any = _MISSING) -> tuple:
        vals = self.get(key, default)
        return tuple(_parse_enum(self, key, v, cls) for v in vals)

    def texts(self, key: str, default: Any = _MISSING) -> tuple[str, ...]:
        vals = self.get(key, default)
        # the schema types every such list's items; this guards a dict built in code
        if not all(isinstance(v, str) for v in vals):
            raise self.error(key, vals, f"{key} is a list of strings", 'write ["a", "b"]')
        return tuple(vals)

    def dtype(self, key: str) -> str:
        v = self.text(key)
        try:
            return parse_dtype(v)
        except SpecError as e:
            raise self.error(key, v, e.rule, e.fix) from None

    def sub(self, key: str, default: Any = _MISSING) -> _Table | None:
        raw = self.get(key, default)
        return None if raw is None else _Table(raw, f"{self.where}.{key}".lstrip("."), self.origin)


def _parse_enum(t: _Table, key: str, value: Any, cls: type[enum.Enum]) -> Any:
    want = _norm_token(value) if isinstance(value, str) else value
    for member in cls:
        if _norm_token(member.value) == want:
            return member
    choices = ", ".join(m.value for m in cls)
    raise t.error(key, value, f"{key} is one of: {choices}", f"write one of {choices}")


def _parse_mode(t: _Table) -> OverlapMode:
    m = OverlapMode(
        forward=t.fraction("forward"),
        backward=t.fraction("backward"),
        window=t.enum("window", Window),
        exposed=t.enum("exposed", Exposed),
        source=t.source(),
        evidence=t.text("evidence", ""),
    )
    return m


def _parse_default(t: _Table) -> str:
    v = t.text("default")
    if _norm_token(v) in ("on", "off"):
        return _norm_token(v)
    return _parse_enum(t, "default", v, Requirement).value


def _parse_overlap(t: _Table, cls: OverlapClass) -> Overlap:
    on, off = t.sub("on"), t.sub("off")
    assert on is not None and off is not None
    o = Overlap(
        cls=cls,
        default=_parse_default(t),
        on=_parse_mode(on),
        off=_parse_mode(off),
        flag=t.text("flag", ""),
        plan_key=t.text("plan_key", ""),
        requires=t.enums("requires", Requirement, ()),
        note=t.text("note", ""),
    )
    return o


def _parse_overlaps(t: _Table) -> Mapping[OverlapClass, Overlap]:
    out: dict[OverlapClass, Overlap] = {}
    for key in list(t.raw):
        cls = _parse_enum(t, key, key, OverlapClass)
        sub = t.sub(key)
        assert sub is not None
        out[cls] = _parse_overlap(sub, cls)
    missing = [c.value for c in REQUIRED_OVERLAP if c not in out]
    if missing:
        raise SpecError(
            f"framework file {t.origin}: [overlap] has no entry for {', '.join(missing)}",
            rule="a profile states its overlap for every class: " + ", ".join(REQUIRED_OVERLAP),
            fix="add [overlap.<class>] with default, [on] and [off] (fraction 0 where absent)",
        )
    return MappingProxyType(out)


def _parse_options(t: _Table) -> OptionPolicy:
    moves: dict[Family, Mapping[AxisRole, Move]] = {}
    for fam in Family:
        sub = t.sub(fam.value, None)
        if sub is None:
            continue
        moves[fam] = MappingProxyType(
            {_parse_enum(sub, k, k, AxisRole): sub.enum(k, Move) for k in list(sub.raw)}
        )
    p = OptionPolicy(
        MappingProxyType(moves),
        t.source(),
        t.text("note", ""),
        t.flag("tp_shards_sequence", False),
    )
    return p


def _parse_timing(t: _Table) -> Timing:
    bucket = t.get("bucket_params", None)
    out = Timing(
        per=t.enum("per", Per),
        dtype=t.dtype("dtype"),
        source=t.source(),
        bucket_params=None if bucket is None else float(bucket),
        note=t.text("note", ""),
        per_with_pipeline=t.enum("per_with_pipeline", Per, None),
    )
    return out


def _parse_data_parallel(t: _Table) -> DataParallel:
    stages = tuple(int(s) for s in t.get("zero_stages"))
    default = int(t.number("default_zero"))
    if not stages or any(s not in (0, 1, 2, 3) for s in stages) or default not in stages:
        raise t.error(
            "zero_stages",
            stages,
            "ZeRO stages are 0-3 and include default_zero",
            "write e.g. zero_stages = [0, 1, 3] and default_zero = 1",
        )
    grad = t.sub("grad_reduce")
    gather = t.sub("param_gather", None)
    off = t.sub("optimizer_offload", None)
    assert grad is not None
    out = DataParallel(
        zero_stages=stages,
        default_zero=default,
        grad_reduce=_parse_timing(grad),
        param_gather=None if gather is None else _parse_timing(gather),
        source=t.source(),
        zero2_grad_reduce_per=t.enum("zero2_grad_reduce_per", Per, None),
        note=t.text("note", ""),
        optimizer_offload=None if off is None else _parse_offload(off),
    )
    return out


def _parse_offload(t: _Table) -> OptimizerOffload:
    out = OptimizerOffload(
        switch=t.text("switch"),
        host_traffic=t.enum("host_traffic", HostTraffic),
        source=t.source(),
        note=t.text("note", ""),
        with_fsdp=t.flag("with_fsdp", True),
    )
    return out


def _parse_fsdp(t: _Table) -> Fsdp:
    out = Fsdp(
        supported=t.flag("supported"),
        regather=t.enum("regather", Regather),
        gather_per=t.enum("gather_per", Per),
        grad_reduce_per=t.enum("grad_reduce_per", Per),
        gather_dtype=t.dtype("gather_dtype"),
        grad_reduce_dtype=t.dtype("grad_reduce_dtype"),
        unit=t.text("unit"),
        source=t.source(),
        regather_with_pipeline=t.enum("regather_with_pipeline", Regather, None),
        gather_per_with_pipeline=t.enum("gather_per_with_pipeline", Per, None),
        grad_reduce_per_with_pipeline=t.enum("grad_reduce_per_with_pipeline", Per, None),
        note=t.text("note", ""),
    )
    return out


def _check_reruns(t: _Table, key: str, names: tuple[str, ...]) -> tuple[str, ...]:
    for n in names:
        if n not in RERUN_GROUPS and "/" not in n and n not in ("norms", "embed", "unembed"):
            raise t.error(
                key,
                n,
                "a rerun entry is a group ("
                + ", ".join(RERUN_GROUPS)
                + ") or a ledger-op glob containing '/'",
                "use a group name or e.g. 'attn/k'",
            )
    return names


def _parse_policy(t: _Table, name: str) -> RematPolicy:
    memory = t.text("memory")
    if memory not in REMAT_MEMORY_KINDS:
        raise t.error(
            "memory",
            memory,
            "memory is one of " + ", ".join(REMAT_MEMORY_KINDS),
            "write the closest roofline remat kind",
        )
    kinds = t.texts("keeps_collective_kinds", ())
    if any(k not in COLLECTIVE_KINDS for k in kinds):
        raise t.error(
            "keeps_collective_kinds",
            kinds,
            "kinds are " + ", ".join(COLLECTIVE_KINDS),
            "write e.g. ['reduce-scatter']",
        )
    parts_t = t.sub("parts", None)
    parts = (
        {}
        if parts_t is None
        else {k: _check_reruns(parts_t, k, parts_t.texts(k)) for k in list(parts_t.raw)}
    )
    frac = t.number("layer_fraction", 1.0)
    if not 0.0 < frac <= 1.0:
        raise t.error("layer_fraction", frac, "layer_fraction is in (0, 1]", "write e.g. 0.5")
    p = RematPolicy(
        name=name,
        memory=memory,
        reruns=_check_reruns(t, "reruns", t.texts("reruns")),
        reruns_last_projection=t.flag("reruns_last_projection"),
        source=t.source(),
        aliases=t.texts("aliases", ()),
        reruns_collectives=t.enums("reruns_collectives", OverlapClass, ()),
        keeps_collective_kinds=kinds,
        layer_fraction=frac,
        offloaded=t.flag("offloaded", False),
        parts=MappingProxyType(parts),
        note=t.text("note", ""),
    )
    return p


def _parse_remat(t: _Table) -> Remat:
    pol_t = t.sub("policies")
    assert pol_t is not None
    policies = {}
    for name in list(pol_t.raw):
        sub = pol_t.sub(name)
        assert sub is not None
        policies[name] = _parse_policy(sub, name)
    r = Remat(t.text("default"), MappingProxyType(policies), t.source(), t.text("note", ""))
    try:
        r.policy()
    except SpecError:
        raise t.error(
            "default",
            r.default,
            "the default is one of the policies listed",
            "name a policy under [remat.policies]",
        ) from None
    return r


def _sourced_in_range(
    t: Any,
    key: str,
    value: float,
    source: str,
    hi: float,
    unsourced: tuple[str, str],
    outside: tuple[str, str],
) -> None:
    """A measured or configured number must name its source and lie in [0, hi]: each breach a
    one-paragraph error (rule, fix) on `key`."""
    if value and not source:
        raise t.error(key, value, *unsourced)
    if not 0 <= value <= hi:
        raise t.error(key, value, *outside)


def _check_default(t: _Table, default: Any, options: tuple, what: str) -> None:
    """A default is one of the listed options; both are absent where the stack has none."""
    if (default is None) != (not options) or (default is not None and default not in options):
        raise t.error(
            "default",
            getattr(default, "value", default),
            f"the default is one of `{what}` (both absent where the stack has none)",
            f"add it to {what} or pick another default",
        )


def _parse_pipeline(t: _Table) -> Pipeline:
    p = Pipeline(
        schedules=t.enums("schedules", Schedule),
        default=t.enum("default", Schedule, None),
        uneven=t.enums("uneven", Uneven),
        embedding_stage=t.text("embedding_stage"),
        loss_stage=t.text("loss_stage"),
        embedding_layers=t.number("embedding_layers"),
        loss_layers=t.number("loss_layers"),
        source=t.source(),
        note=t.text("note", ""),
    )
    _check_default(t, p.default, p.schedules, "schedules")
    return p


def _parse_cp(t: _Table) -> ContextParallel:
    c = ContextParallel(
        methods=t.enums("methods", CPMethod),
        default=t.enum("default", CPMethod, None),
        load_balance=t.enum("load_balance", LoadBalance),
        source=t.source(),
        note=t.text("note", ""),
    )
    _check_default(t, c.default, c.methods, "methods")
    return c


MAX_HOST_SYNC_S = 0.01  # seconds: ten milliseconds of idle per MoE layer is no real stack
MAX_DISPATCH_SMS = 256  # more SMs than any GPU has


def _parse_ep(t: _Table) -> ExpertParallel:
    e = ExpertParallel(
        dispatch=t.enums("dispatch", Dispatch),
        default=t.enum("default", Dispatch, None),
        node_limited_routing=t.flag("node_limited_routing"),
        grouped_gemm=t.flag("grouped_gemm"),
        dropless=t.flag("dropless"),
        source=t.source(),
        note=t.text("note", ""),
        host_sync_s=t.number("host_sync_s", 0.0),
        host_sync_source=t.text("host_sync_source", ""),
        dispatch_sms=int(t.number("dispatch_sms", 0)),
        dispatch_sms_source=t.text("dispatch_sms_source", ""),
        eager_expert_bias=t.flag("eager_expert_bias", False),
        eager_expert_bias_source=t.text("eager_expert_bias_source", ""),
    )
    if e.eager_expert_bias and not e.eager_expert_bias_source:
        raise t.error(
            "eager_expert_bias",
            True,
            "how a stack adds the experts' bias is read from its code: eager_expert_bias_source names it",
            'add eager_expert_bias_source = "<file:line of the bias add>"',
        )
    _sourced_in_range(
        t, "dispatch_sms", e.dispatch_sms, e.dispatch_sms_source, MAX_DISPATCH_SMS,
        ("the dispatcher's SM count is the stack's setting: dispatch_sms_source names it",
         'add dispatch_sms_source = "<file:line of the setting>"'),
        (f"a dispatcher holds 0 to {MAX_DISPATCH_SMS} SMs",
         "write the number of SMs the dispatch kernels use (DeepEP: 20)"),
    )  # fmt: skip
    _sourced_in_range(
        t, "host_sync_s", e.host_sync_s, e.host_sync_source, MAX_HOST_SYNC_S,
        ("a host sync time is a measurement: host_sync_source names it",
         'add host_sync_source = "<the measurement and its source>"'),
        (f"a host sync per MoE layer is 0 to {MAX_HOST_SYNC_S} s",
         "write the measured GPU idle per MoE layer forward in seconds"),
    )  # fmt: skip
    _check_default(t, e.default, e.dispatch, "dispatch")
    return e


def _parse_recipe(t: _Table, name: str) -> Recipe:
    scaling = t.text("scaling")
    if scaling not in SCALINGS:
        raise t.error(
            "scaling",
            scaling,
            "scaling is one of " + ", ".join(SCALINGS),
            "write e.g. scaling = 'delayed'",
        )
    r = Recipe(
        name=name,
        dtypes=MappingProxyType({f: t.dtype(f.value) for f in Family}),
        scaling=scaling,
        source=t.source(),
        aliases=t.texts("aliases", ()),
        bf16_edge_layers=int(t.number("bf16_edge_layers", 0)),
        requires=t.enums("requires", Requirement, ()),
        note=t.text("note", ""),
        pretraining=t.text("pretraining", ""),
    )
    return r


def _parse_precision(t: _Table) -> Precision:
    rec_t = t.sub("recipes")
    assert rec_t is not None
    recipes = {}
    for name in list(rec_t.raw):
        sub = rec_t.sub(name)
        assert sub is not None
        recipes[name] = _parse_recipe(sub, name)
    p = Precision(
        t.text("default"),
        MappingProxyType(recipes),
        t.source(),
        t.text("note", ""),
        t.flag("saves_quantised_inputs", False),
        t.flag("tp_gathers_quantised", False),
    )
    try:
        p.recipe()
    except SpecError:
        raise t.error(
            "default",
            p.default,
            "the default is one of the recipes listed",
            "name a recipe under [precision.recipes]",
        ) from None
    return p


def _parse_overhead(t: _Table) -> Overhead:
    value = t.get("value_s", None)
    src = t.source()
    if value is not None and (value < 0 or src.lower().startswith("no source")):
        raise t.error(
            "value_s",
            value,
            "an overhead value is >= 0 and has a source",
            "drop value_s where no source gives one",
        )
    o = Overhead(src, None if value is None else float(value), t.text("note", ""))
    return o


def _parse_kernels(t: _Table | None) -> Kernels | None:
    if t is None:
        return None
    k = Kernels(
        attention=t.enum("attention", AttentionKernel, None),
        source=t.source(),
        note=t.text("note", ""),
    )
    return k


def _parse_grad_accumulation(t: _Table | None) -> GradAccumulation | None:
    if t is None:
        return None
    g = GradAccumulation(
        buffer=_accumulator_dtype(t, "buffer", params=True),
        source=t.source(),
        zero_buffer=_accumulator_dtype(t, "zero_buffer", params=False),
        note=t.text("note", ""),
    )
    return g


def _accumulator_dtype(t: _Table, key: str, *, params: bool) -> str | None:
    """A gradient accumulator's dtype: a dtype name, or (where `params`) "params"."""
    v = t.get(key, None)
    if v is None:
        return None if not params else t.text(key)  # a missing buffer is "has no"
    if params and v == "params":
        return v
    try:
        return parse_dtype(v)
    except SpecError as e:
        words = "'params' (the parameters' own dtype) or a dtype" if params else "a dtype"
        raise t.error(
            key, v, f"{key} is {words}: {e.rule}", f'write {key} = "fp32" or "bf16"'
        ) from None


def _parse_eager(t: _Table | None) -> Eager | None:
    if t is None:
        return None
    raw = t.get("traffic")  # a missing table is "has no", as every needed key
    if not raw or any(not isinstance(v, (int, float)) or v < 1.0 for v in raw.values()):
        raise t.error(
            "traffic",
            raw,
            "traffic maps ledger-row globs to eager/compiled byte ratios of at least 1",
            "write e.g. traffic = { norms = 9.0 }",
        )
    e = Eager(
        flag=t.text("flag"),
        compiled_by_default=t.flag("compiled_by_default"),
        traffic=MappingProxyType({str(k): float(v) for k, v in raw.items()}),
        source=t.source(),
        note=t.text("note", ""),
    )
    return e


def _parse_features(t: _Table | None) -> Mapping[Feature, FeatureSince]:
    if t is None:
        return MappingProxyType({})
    out: dict[Feature, FeatureSince] = {}
    for key in t.raw:
        feature = _parse_enum(t, key, key, Feature)
        sub = t.sub(key)
        assert sub is not None
        raw = sub.get("since")
        try:
            since = parse_stack_date(raw, "since")
        except SpecError as e:
            raise sub.error("since", raw, e.rule, 'write since = "YYYY-MM-DD"') from None
        out[feature] = FeatureSince(since, sub.source(), sub.text("note", ""))
    return MappingProxyType(out)


def _parse_overheads(t: _Table) -> Overheads:
    step, layer = t.sub("step"), t.sub("layer")
    assert step is not None and layer is not None
    o = Overheads(_parse_overhead(step), _parse_overhead(layer))
    return o


def framework_from_dict(raw: dict, origin: str = "<dict>") -> Framework:
    """Validate a parsed profile (the TOML's dict) into a frozen `Framework`."""
    check_schema("framework", raw, origin)
    t = _Table(raw, "", origin)
    schema = int(t.number("schema"))
    if schema != SCHEMA_VERSION:
        raise t.error(
            "schema",
            schema,
            f"this roofline reads framework schema {SCHEMA_VERSION}",
            f"write schema = {SCHEMA_VERSION} and follow docs/frameworks.md",
        )

    def sub(key: str) -> _Table:
        s = t.sub(key)
        assert s is not None
        return s

    fw = Framework(
        name=t.text("name"),
        title=t.text("title"),
        versions=t.texts("versions"),
        match=t.texts("match", ()),
        options=_parse_options(sub("options")),
        data_parallel=_parse_data_parallel(sub("data_parallel")),
        fsdp=_parse_fsdp(sub("fsdp")),
        overlap=_parse_overlaps(sub("overlap")),
        remat=_parse_remat(sub("remat")),
        pipeline=_parse_pipeline(sub("pipeline")),
        context_parallel=_parse_cp(sub("context_parallel")),
        expert_parallel=_parse_ep(sub("expert_parallel")),
        precision=_parse_precision(sub("precision")),
        overheads=_parse_overheads(sub("overheads")),
        aliases=t.texts("aliases", ()),
        notes=t.text("notes", ""),
        kernels=_parse_kernels(t.sub("kernels", None)),
        eager=_parse_eager(t.sub("eager", None)),
        grad_accumulation=_parse_grad_accumulation(t.sub("gradient_accumulation", None)),
        features=_parse_features(t.sub("features", None)),
    )
    return fw


# --------------------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------------------


@cache
def _catalog() -> dict[str, tuple[Path, tuple[str, ...], tuple[str, ...]]]:
    """name -> (path, aliases, match strings), read once from specs/frameworks/*.toml."""
    out = {}
    for p in sorted(FRAMEWORK_DIR.glob("*.toml")):
        raw = read_toml(p, "framework")
        name = raw.get("name", p.stem)
        out[name] = (p, tuple(raw.get("aliases", ())), tuple(raw.get("match", ())))
    return out


def framework_names() -> list[str]:
    return list(_catalog())


@cache
def _load_named(key: str) -> Framework:
    path = _catalog()[key][0]
    return framework_from_dict(read_toml(path, "framework"), str(path))


def load_framework(name_or_path: str | Path | Framework) -> Framework:
    """A profile by catalog name or alias ('megatron', 'nemo', 'maxtext') or a TOML path."""
    if isinstance(name_or_path, Framework):
        return name_or_path
    s = str(name_or_path)
    if s.endswith(".toml") or is_file(s):
        return cached(
            ("framework", s), lambda: framework_from_dict(stamped_toml(s, "framework"), s)
        )
    try:
        key = resolve(s, {k: v[1] for k, v in _catalog().items()}, "framework")
    except UnknownNameError as e:
        raise UnknownNameError(
            e.what,
            rule="a framework is one of "
            + ", ".join(framework_names())
            + " or a path to a TOML file",
            fix="pass e.g. --framework megatron (docs/frameworks.md lists what each covers)",
        ) from None
    return _load_named(key)


def framework_for_source(text: str) -> str | None:
    """The profile a run description names (its source title, URL or stack), or None.

    Each profile lists `match` strings (e.g. 'Megatron-Bridge', 'dgxc-benchmarking',
    'llm-foundry'); the longest one found in `text` (case-insensitive) wins.
    """
    low = str(text).lower()
    best: tuple[int, str] | None = None
    for name, (_, _, matches) in _catalog().items():
        for m in matches:
            if m.lower() in low and (best is None or len(m) > best[0]):
                best = (len(m), name)
    return None if best is None else best[1]


__all__ = [
    "AttentionKernel",
    "Eager",
    "GradAccumulation",
    "Kernels",
    "COLLECTIVE_KINDS",
    "REMAT_MEMORY_KINDS",
    "REQUIRED_OVERLAP",
    "SCHEMA_VERSION",
    "AxisRole",
    "CPMethod",
    "ContextParallel",
    "DataParallel",
    "Dispatch",
    "ExpertParallel",
    "Exposed",
    "FAMILY_PATTERNS",
    "Family",
    "Feature",
    "FeatureSince",
    "Framework",
    "Fsdp",
    "LoadBalance",
    "Move",
    "OptionPolicy",
    "Overhead",
    "Overheads",
    "Overlap",
    "OverlapClass",
    "OverlapMode",
    "Pass",
    "Per",
    "Pipeline",
    "Precision",
    "RERUN_GROUPS",
    "Recipe",
    "Regather",
    "Remat",
    "RematPolicy",
    "Requirement",
    "Schedule",
    "Timing",
    "Uneven",
    "Window",
    "family_of",
    "framework_for_source",
    "framework_from_dict",
    "framework_names",
    "load_framework",
    "parse_stack_date",
]
