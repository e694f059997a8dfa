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
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from roofline.errors import PlanError

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
    "layers",
    "q_lora",
    "kv_lora",
)


class Strategy(enum.StrEnum):
    DP = "dp"
    FSDP = "fsdp"
    TP = "tp"
    SP = "sp"  # sequence / context parallelism over the query sequence
    EP = "ep"
    PP = "pp"


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
_ALIASES = {
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


@dataclass(frozen=True)
class Rules:
    """Logical dim -> mesh axes, for activations and for parameters. Missing = replicated."""

    activations: Mapping[str, tuple[str, ...]]
    params: Mapping[str, tuple[str, ...]]
    sequence_parallel: bool = False  # Megatron-SP: TP's AllReduce becomes ReduceScatter + AllGather

    def axes_for(self, dim: str, is_param: bool) -> tuple[str, ...]:
        return (self.params if is_param else self.activations).get(dim, ())


@dataclass(frozen=True)
class Degrees:
    """Degree of each strategy (1 = unused)."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    sp: int = 1
    ep: int = 1
    pp: int = 1
    extra: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def n_chips(self) -> int:
        return self.dp * self.fsdp * self.tp * self.sp * self.ep * self.pp

    def mesh_axes(self) -> tuple[tuple[str, int], ...]:
        """(axis name, size) for every strategy in use, outermost first; always at least one axis."""
        sizes = {AXIS_OF[s]: getattr(self, s.value) for s in Strategy}
        axes = tuple((a, sizes[a]) for a in AXIS_ORDER if sizes[a] > 1)
        return axes or (("data", 1),)


def parse_degrees(text: str | Mapping[str, int]) -> tuple[Degrees, dict[str, str]]:
    """'fsdp=1024,tp=4,sp=2' -> (Degrees, other key=value options left for the caller)."""
    items: dict[str, str] = {}
    if isinstance(text, Mapping):
        items = {str(k): str(v) for k, v in text.items()}
    else:
        for part in str(text).split(","):
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
    deg: dict[str, int] = {}
    rest: dict[str, str] = {}
    for k, v in items.items():
        if k in _ALIASES:
            try:
                n = int(v)
            except ValueError:
                raise PlanError(
                    f"plan degree {k}={v!r} is not a whole number",
                    rule="degrees are positive integers",
                    fix=f"write {k}=4",
                ) from None
            if n < 1:
                raise PlanError(
                    f"plan degree {k}={n}",
                    rule="degrees are positive integers (1 = unused)",
                    fix=f"write {k}=1 or more",
                )
            deg[_ALIASES[k]] = n
        else:
            rest[k] = v
    return Degrees(**deg), rest


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
