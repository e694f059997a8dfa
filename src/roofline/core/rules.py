"""Sharding rules: which mesh axes each named dimension is split over.

A parallelism strategy is *only* a rule set (DESIGN.md, "The one idea"): it maps the
logical dimensions of the ledger's einsums (`batch`, `seq`, `embed`, `mlp`, `heads`,
`kv_heads`, `head_dim`, `vocab`, `experts`, `layers`) to mesh axes, separately for
activations and for parameters (FSDP shards a weight's `embed` dim but not the
activation's). The same rules produce JAX `PartitionSpec`s (see `partition_spec`).

Plan strings name the degree of each strategy, e.g. "fsdp=1024,tp=4,sp=2"; each strategy
owns one mesh axis with a fixed name:

| strategy | mesh axis | activations                | parameters                          |
|----------|-----------|----------------------------|-------------------------------------|
| dp       | data      | batch                      | replicated                          |
| fsdp     | fsdp      | batch                      | embed (ZeRO-3; ZeRO-1/2 shard state) |
| tp       | tensor    | heads, kv_heads, mlp, vocab| heads, kv_heads, mlp, vocab          |
| sp / cp  | seq       | seq (query) — context par. | replicated                          |
| ep       | expert    | batch outside MoE, experts | experts                             |
| pp       | stage     | layers                     | layers                              |

The MoE router's output width is its own dim, `routes`, which no rule shards: the router weight
[embed, routes] is replicated over the expert axis like a dense weight (Megatron-Core's
TopKRouter weight is not expert-parallel; the inference engines replicate the gate too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.specs.model import ModelSpec

# the strategy vocabulary lives with the rest of the plan vocabulary (re-exported here)
from roofline.specs.plan import AXIS_OF as AXIS_OF
from roofline.specs.plan import AXIS_ORDER as AXIS_ORDER
from roofline.specs.plan import Degrees as Degrees
from roofline.specs.plan import Remat, RematKind
from roofline.specs.plan import Strategy as Strategy
from roofline.specs.plan import parse_degrees as parse_degrees

LOGICAL_DIMS = (
    "batch",
    "seq",
    "kv_seq",
    "embed",
    "mlp",
    "heads",
    "kv_heads",
    "head_dim",
    "vocab",
    "experts",
    "routes",  # the router's output width (= experts), never sharded: the router is replicated
    "expert_mlp",
    "capacity",
    "slots",  # one sequence's expert slots on the dropping path (ledger._dense_dispatch); never sharded
    "layers",
    "q_lora",
    "kv_lora",
)


@dataclass(frozen=True)
class Rules:
    """Logical dim -> mesh axes, for activations and for parameters. Missing = replicated."""

    activations: Mapping[str, tuple[str, ...]]
    params: Mapping[str, tuple[str, ...]]
    sequence_parallel: bool = False  # Megatron-SP: TP's AllReduce becomes ReduceScatter + AllGather

    def axes_for(self, dim: str, is_param: bool) -> tuple[str, ...]:
        return (self.params if is_param else self.activations).get(dim, ())


@dataclass(frozen=True)
class Structure:
    """What is the same for a family of candidate plans: which strategies exist (a strategy of
    degree 1 is a mesh axis of size 1, priced at zero) and how the layers are sharded.

    `remat` and `collective_matmul` are the family's defaults where candidates carry none
    (`collective_matmul` tri-state as the plan's: None the stack's default, True on, False off).
    """

    active: frozenset[Strategy]
    remat: Remat = Remat(RematKind.FULL)
    sequence_parallel: bool = False
    collective_matmul: bool | None = None
    # tp does not divide the KV heads: K/V projections replicated across the tensor axis
    kv_replicated: bool = False
    # routed experts split over the tensor axis (Megatron's expert tensor parallel size ETP =
    # TP, its default); False: ETP = 1, see `moe_rules`
    expert_tp: bool = True


def rules_of(structure: Structure, model: ModelSpec) -> Rules:
    """The rule set of a structure, with the MoE and KV-replication refinements."""
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
        moe_rules(act, par, expert_tp=structure.expert_tp)
    if structure.kv_replicated:
        act.pop("kv_heads", None)
        par.pop("kv_heads", None)
    return Rules(MappingProxyType(act), MappingProxyType(par), r.sequence_parallel)


def moe_rules(act: dict, par: dict, *, expert_tp: bool) -> None:
    """The routed experts under tensor parallelism, in place: with ETP = TP (Megatron-LM's default:
    NVIDIA/Megatron-LM megatron/training/arguments.py sets expert_tensor_parallel_size = tensor_model_parallel_size
    when unset) every expert's FFN width is split over the tensor axis and the tensor ranks share
    the dispatched tokens (the alltoall dispatcher all-gathers them over the ETP group), so the
    dispatched tokens are whole on every tensor rank. With ETP = 1 (e.g. the Megatron-Bridge
    DeepSeek-V3 recipe, NVIDIA-NeMo/Megatron-Bridge@05d003fb
    src/megatron/bridge/recipes/deepseek/deepseek_v3.py: `expert_tensor_parallel_size = 1`)
    each rank routes only its own sequence-parallel slice of the tokens (Megatron requires
    sequence parallelism for MoE under TP) and its experts are whole: the tensor axis splits the
    per-expert token slots instead of the FFN width, and the expert layer needs no tensor
    collective (megatron/core/transformer/moe/token_dispatcher.py: the ETP all-gather and
    reduce-scatter are skipped at tp_size 1)."""
    if expert_tp:
        act["expert_mlp"] = ("tensor",)
        par["expert_mlp"] = ("tensor",)
    else:
        act["capacity"] = (*act.get("capacity", ()), "tensor")


def rules_for(
    deg: Degrees, *, sequence_parallel: bool = False, shard_params_fsdp: bool = True
) -> Rules:
    """The standard rule set of a combination of strategies (book training.md notation).

    DP: In[B_X]; FSDP: In[B_X], W[D_X, F]; TP: W[D, F_Y], heads_Y; SP: In[T_Z];
    EP: W[E_Z, D, F]; PP: W[L_Z, ...]. A strategy of degree 1 adds no rule.
    """
    act: dict[str, tuple[str, ...]] = {}
    par: dict[str, tuple[str, ...]] = {}
    batch_axes = tuple(
        a for a, n in (("data", deg.dp), ("fsdp", deg.fsdp), ("expert", deg.ep)) if n > 1
    )
    if batch_axes:
        act["batch"] = batch_axes
    if deg.fsdp > 1 and shard_params_fsdp:
        par["embed"] = ("fsdp",)
    if deg.tp > 1:
        for d in ("heads", "kv_heads", "mlp", "vocab"):
            act[d] = ("tensor",)
            par[d] = ("tensor",)
    if deg.sp > 1:
        act["seq"] = ("seq",)
    if deg.ep > 1:
        act["experts"] = ("expert",)
        par["experts"] = ("expert",)
    if deg.pp > 1:
        act["layers"] = ("stage",)
        par["layers"] = ("stage",)
    return Rules(
        MappingProxyType(act),
        MappingProxyType(par),
        sequence_parallel=sequence_parallel and deg.tp > 1,
    )


def kv_heads_replicated(n_kv_heads: int, has_mla: bool, tp: Any) -> Any:
    """True where tensor parallelism cannot split the KV heads (tp does not divide them), so
    the K/V projections are replicated across the tensor axis (Megatron does this; MLA has
    no KV heads to split). Vectorised over `tp`."""
    tp = np.asarray(tp)
    out = (tp > 1) & (not has_mla) & (n_kv_heads % np.maximum(tp, 1) != 0)
    return bool(out) if out.ndim == 0 else out


def partition_spec(
    dims: tuple[str, ...], rules: Rules, is_param: bool
) -> tuple[str | tuple[str, ...] | None, ...]:
    """The JAX PartitionSpec entries for an array with these logical dims (None = replicated).

    A mesh axis already used by an earlier dim of the same array is dropped (JAX forbids
    using an axis twice), e.g. MoE expert weights [experts, embed, mlp] under EP+FSDP.
    """
    used: set[str] = set()
    out: list[str | tuple[str, ...] | None] = []
    for d in dims:
        axes = tuple(a for a in rules.axes_for(d, is_param) if a not in used)
        used.update(axes)
        out.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
    return tuple(out)
