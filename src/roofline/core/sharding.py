"""The sharded-einsum algebra (book sharding.md): sharded operands in, per-chip work and collectives out.

Notation: `In[B_X, D] * W[D_X, F] -> Out[B_X, F]` — each dim may carry mesh-axis
subscripts (`I_XY` = split over X then Y; `B_{fsdp,tensor}` for long axis names), and an
output may stay unreduced (`Out[B, F]{U_X}`). The four cases of the book emerge from one
rule: before the local matmul every contracting dim must be split identically on both
operands and no mesh axis may split two different dims; afterwards the natural output
(free dims keep their axes, contracted axes leave partial sums) is moved to the requested
output by AllReduce / ReduceScatter / AllGather / AllToAll or a free local slice.

Every candidate way to get there (gather weights vs gather activations, gather-then-multiply
vs multiply-then-reduce, ...) is costed; the cheapest wins and the others are reported.
Sizes may be numpy arrays (one entry per candidate plan): the structure of each option is
fixed and only the arithmetic is vectorised, which is what makes the planner fast.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from roofline.core.collectives import CollectiveKind
from roofline.errors import ShardingError
from roofline.memo import IdentityMemo
from roofline.units import dtype_bytes

# (kind, bytes_per_chip, axes) -> seconds; bytes follow collectives.py's convention.
CommFn = Callable[[CollectiveKind, Any, tuple[str, ...]], Any]


# --------------------------------------------------------------------------------------
# Sharded arrays in the book's notation
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A sharded array: dims with the mesh axes splitting each, plus unreduced axes."""

    name: str
    dims: tuple[str, ...]
    axes: tuple[tuple[str, ...], ...]
    unreduced: tuple[str, ...] = ()
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if len(self.dims) != len(self.axes):
            raise ValueError("dims and axes differ in length")

    def __str__(self) -> str:
        return self._text

    @functools.cached_property
    def _text(self) -> str:
        parts = []
        for d, a in zip(self.dims, self.axes, strict=True):
            parts.append(d if not a else d + "_" + _axes_str(a))
        u = "{U_" + _axes_str(self.unreduced) + "}" if self.unreduced else ""
        return f"{self.name}[{', '.join(parts)}]{u}"

    def axes_of(self, dim: str) -> tuple[str, ...]:
        return self.axes[self.dims.index(dim)]

    def with_axes(self, dim: str, axes: tuple[str, ...]) -> Spec:
        i = self.dims.index(dim)
        new = self.axes[:i] + (tuple(axes),) + self.axes[i + 1 :]
        return Spec(self.name, self.dims, new, self.unreduced, self.dtype)

    @functools.cached_property
    def used_axes(self) -> tuple[str, ...]:
        return tuple(a for ax in self.axes for a in ax)

    @functools.cached_property
    def itemsize(self) -> float:
        return dtype_bytes(self.dtype)

    def local_elements(self, sizes: Mapping[str, Any], mesh: Mapping[str, Any]) -> Any:
        """Elements per chip: product of the dims over product of the mesh axes splitting them."""
        num: Any = 1.0
        for d in self.dims:
            num = num * sizes[d]
        den: Any = 1.0
        for a in self.used_axes:
            den = den * mesh[a]
        return num / den

    def local_bytes(self, sizes: Mapping[str, Any], mesh: Mapping[str, Any]) -> Any:
        return self.local_elements(sizes, mesh) * self.itemsize

    def local_shape(self, sizes: Mapping[str, Any], mesh: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(
            sizes[d] / _prod(mesh[a] for a in ax)
            for d, ax in zip(self.dims, self.axes, strict=True)
        )


def _axes_str(axes: Sequence[str]) -> str:
    return _axes_text(axes) if isinstance(axes, tuple) else _axes_join(axes)


@functools.lru_cache(maxsize=4096)
def _axes_text(axes: tuple[str, ...]) -> str:
    return _axes_join(axes)


def _axes_join(axes: Sequence[str]) -> str:
    return "".join(axes) if all(len(a) == 1 for a in axes) else "{" + ",".join(axes) + "}"


_AXES_IN_TEXT = re.compile(r"_\{([^{}]*)\}")


def without_axes_text(text: str, drop: frozenset[str]) -> str:
    """A Spec's text (`Spec.__str__`) as the same Spec without the mesh axes in `drop` would
    print: each `_{a,b}` group less those axes (gone where none is left), an unreduced set
    left empty gone. Mesh axis names are words, so every group is braced (`_axes_join`)."""

    def kept(m: re.Match) -> str:
        axes = [a for a in m.group(1).split(",") if a not in drop]
        return "_{" + ",".join(axes) + "}" if axes else ""

    return _AXES_IN_TEXT.sub(kept, text).replace("{U}", "")


def _prod(xs: Any) -> Any:
    out: Any = 1
    for x in xs:
        out = out * x
    return out


_SPEC_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_']*)?\s*\[([^\]]*)\]\s*(\{\s*U_?([^}]*)\})?\s*$")


def _split_axes(sub: str, mesh_axes: Sequence[str] | None, text: str) -> tuple[str, ...]:
    sub = sub.strip()
    if sub.startswith("{") and sub.endswith("}"):
        return tuple(a.strip() for a in sub[1:-1].split(",") if a.strip())
    if mesh_axes is not None and sub in mesh_axes:
        return (sub,)
    if mesh_axes is not None and len(sub) > 1 and not all(c in mesh_axes for c in sub):
        raise ShardingError(
            f"cannot read mesh axes {sub!r} in {text!r}",
            rule="a subscript is a mesh axis name, single-letter axes run together (I_XY), or a braced list (B_{data,fsdp})",
            fix=f"use the mesh's axes {list(mesh_axes)}",
        )
    return tuple(sub)


def parse_spec(
    text: str, mesh_axes: Sequence[str] | None = None, *, dtype: str = "bf16", name: str = "A"
) -> Spec:
    """Parse `In[B_X, D]`, `[I_XY, J]`, `Out[B, F]{U_X}` (book sharding.md notation).

    A JAX-style PartitionSpec tuple is also accepted: `In(B,D)=('X', None)` is written
    `In[B, D]` plus `spec_from_partition_spec`.
    """
    m = _SPEC_RE.match(text)
    if not m:
        raise ShardingError(
            f"cannot read sharded array {text!r}",
            rule="write NAME[DIM_AXES, DIM, ...] with optional {U_AXES}, e.g. In[B_X, D]",
            fix="check brackets and commas",
        )
    nm = m.group(1) or name
    dims, axes = [], []
    for part in re.split(
        r",(?![^{]*\})", m.group(2)
    ):  # commas inside B_{data,fsdp} are not separators
        part = part.strip()
        if not part:
            raise ShardingError(
                f"empty dimension in {text!r}",
                rule="dimensions are separated by single commas",
                fix="remove the extra comma",
            )
        if "_" in part:
            d, sub = part.split("_", 1)
            dims.append(d.strip())
            axes.append(_split_axes(sub, mesh_axes, text))
        else:
            dims.append(part)
            axes.append(())
    unreduced = _split_axes(m.group(4), mesh_axes, text) if m.group(3) and m.group(4) else ()
    return Spec(nm, tuple(dims), tuple(axes), unreduced, dtype)


def spec_from_partition_spec(
    name: str, dims: Sequence[str], pspec: Sequence[Any], dtype: str = "bf16"
) -> Spec:
    """Build a Spec from a JAX PartitionSpec-like tuple: ('X', None, ('X','Y'))."""
    if len(pspec) > len(dims):
        raise ShardingError(
            f"PartitionSpec {tuple(pspec)} has more entries than {name}'s dims {tuple(dims)}",
            rule="one PartitionSpec entry per dimension",
            fix="drop the extra entries",
        )
    axes = []
    for i in range(len(dims)):
        p = pspec[i] if i < len(pspec) else None
        axes.append(() if p is None else ((p,) if isinstance(p, str) else tuple(p)))
    return Spec(name, tuple(dims), tuple(axes), (), dtype)


def parse_einsum(
    text: str,
    mesh_axes: Sequence[str] | None = None,
    dtypes: Sequence[str] = ("bf16", "bf16", "bf16"),
) -> tuple[Spec, Spec, Spec]:
    """`A[I_X, J] * B[J, K_Y] -> C[I_X, K_Y]` → three Specs (`·`, `@`, `x` also accepted)."""
    if not isinstance(text, str):  # h2-robust (issue 12): a clear error for the Python API
        raise ShardingError(
            f"einsum {text!r} is a {type(text).__name__}, not a string",
            rule="an einsum is a string in the book's notation",
            fix='pass e.g. "In[B_X, D] * W[D_X, F] -> Out[B_X, F]"',
        )
    if "->" not in text:
        raise ShardingError(
            f"no output in {text!r}",
            rule="write LHS * RHS -> OUT, e.g. In[B_X, D] * W[D_X, F] -> Out[B_X, F]",
            fix="add '-> Out[...]'",
        )
    left, out = text.split("->", 1)
    ops = re.split(r"\s*(?:\*|·|@|\bx\b)\s*(?![^\[]*\])", left.strip())
    ops = [o for o in ops if o.strip()]
    if len(ops) != 2:
        raise ShardingError(
            f"expected two operands in {text!r}, found {len(ops)}",
            rule="the algebra multiplies two sharded arrays",
            fix="write LHS * RHS -> OUT",
        )
    a = parse_spec(ops[0], mesh_axes, dtype=dtypes[0], name="A")
    b = parse_spec(ops[1], mesh_axes, dtype=dtypes[1], name="B")
    c = parse_spec(out, mesh_axes, dtype=dtypes[2], name="C")
    return a, b, c


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comm:
    """One collective the plan needs, with bytes per chip (collectives.py convention) and time."""

    kind: CollectiveKind
    axes: tuple[str, ...]
    tensor: str
    bytes_per_chip: Any
    time_s: Any
    before: str
    after: str
    why: str
    phase: str = "forward"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "axes": list(self.axes),
            "tensor": self.tensor,
            "bytes": self.bytes_per_chip,
            "time_s": self.time_s,
            "before": self.before,
            "after": self.after,
            "why": self.why,
            "phase": self.phase,
        }


@dataclass(frozen=True)
class Option:
    """One way to compute the einsum: collectives before, a local matmul, collectives after."""

    label: str
    lhs: Spec
    rhs: Spec
    natural_out: Spec
    out: Spec
    comms: tuple[Comm, ...]
    flops_per_chip: Any
    hbm_bytes_per_chip: Any
    comm_time_s: Any

    def describe(self) -> str:
        steps = [f"{c.kind.value}_{_axes_str(c.axes)}({c.before}) -> {c.after}" for c in self.comms]
        return "; ".join(steps) if steps else "no communication"


@dataclass(frozen=True)
class GemmShape:
    """A per-chip GEMM: `count` products C[m, n] = A[m, k] · B[k, n] (floats or arrays)."""

    m: Any
    n: Any
    k: Any
    count: Any = 1.0


def gemm_shape(o: Option, sizes: Mapping[str, Any], mesh: Mapping[str, Any]) -> GemmShape:
    """The local matmul of option `o` as a GEMM (free dims of each operand, contracting, batch)."""
    return GemmShape(
        *(_local_size(g, sizes, mesh) for g in _gemm_dims(o.lhs, o.rhs, o.natural_out))
    )


@functools.lru_cache(maxsize=8192)
def _gemm_dims(L: Spec, R: Spec, out: Spec) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], ...]:
    """(dim, splitting axes) of the GEMM's m (free dims of the lhs), n (of the rhs), k
    (contracting) and count (batch dims), read off the operands' specs once."""
    contracting = [d for d in L.dims if d in R.dims and d not in out.dims]
    batch = [d for d in L.dims if d in R.dims and d in out.dims]
    return (
        tuple((d, L.axes_of(d)) for d in L.dims if d not in R.dims),
        tuple((d, R.axes_of(d)) for d in R.dims if d not in L.dims),
        tuple((d, L.axes_of(d)) for d in contracting),
        tuple((d, L.axes_of(d)) for d in batch),
    )


def _local_size(
    dims: tuple[tuple[str, tuple[str, ...]], ...], sizes: Mapping[str, Any], mesh: Mapping[str, Any]
) -> Any:
    """Product over `dims` of each dim's size over the product of its splitting axes."""
    out: Any = 1
    for d, ax in dims:
        den: Any = 1
        for a in ax:
            den = den * mesh[a]
        out = out * (sizes[d] / den)
    return out


@dataclass(frozen=True)
class EinsumPlan:
    """The chosen option for one einsum and the costed alternatives.

    Times: compute = FLOPs/peak, memory = HBM bytes/bandwidth, comm = sum of collectives;
    lower bound = max of the three (perfect overlap), upper = their sum (none).
    """

    expr: str
    lhs: Spec
    rhs: Spec
    out: Spec
    case: str
    options: tuple[Option, ...]
    choice: Any  # index into options (array when vectorised)
    compute_time_s: Any = 0.0
    memory_time_s: Any = 0.0
    replication: Any = 1.0
    sizes: Mapping[str, Any] = field(default_factory=dict)
    mesh: Mapping[str, Any] = field(default_factory=dict)
    # the options' `option_cost`s the policy chose on where they are arrays (a multi-row walk:
    # `chooses_cheapest` reads them); () where nothing was weighed or the choice was on floats
    costs: tuple = field(default=(), repr=False, compare=False)

    @property
    def best(self) -> Option:
        if type(self.choice) is int:  # a single plan's choice
            return self.options[self.choice]
        return self.options[int(np.asarray(self.choice).flat[0])]

    def pick(self, attr: str) -> Any:
        if type(self.choice) is int or np.ndim(self.choice) == 0:
            return getattr(self.best, attr)
        if len(self.options) == 1:  # nothing was chosen: the one option, shaped like the choice
            v = np.asarray(getattr(self.options[0], attr), float)
            return np.broadcast_to(v, np.broadcast_shapes(v.shape, np.shape(self.choice)))
        vals = [np.asarray(getattr(o, attr), float) for o in self.options]
        return choose_rows(self.choice, vals)

    @property
    def flops_per_chip(self) -> Any:
        return self.pick("flops_per_chip")

    @property
    def hbm_bytes_per_chip(self) -> Any:
        return self.pick("hbm_bytes_per_chip")

    @property
    def comm_time_s(self) -> Any:
        return self.pick("comm_time_s")

    @property
    def time_lower_s(self) -> Any:
        return np.maximum(np.maximum(self.compute_time_s, self.memory_time_s), self.comm_time_s)

    @property
    def time_upper_s(self) -> Any:
        return self.compute_time_s + self.memory_time_s + self.comm_time_s

    @property
    def collectives(self) -> tuple[Comm, ...]:
        return self.best.comms

    def with_choice(self, index: int) -> EinsumPlan:
        """This plan with option `index` chosen instead (e.g. the one a compiler took)."""
        if not 0 <= index < len(self.options):
            raise ShardingError(
                f"option {index} of {self.expr or self.lhs}",
                rule=f"the algebra costed {len(self.options)} options",
                fix="pick an index from EinsumPlan.options",
            )
        return replace(self, choice=index, costs=())

    def gemm_shape(self, sizes: Mapping[str, Any], mesh: Mapping[str, Any]) -> GemmShape:
        """The per-chip GEMM of the chosen option: C[m, n] = A[m, k] · B[k, n], `count` of them
        (batch dims shared by both operands, e.g. experts). Arrays when the choice varies."""
        if np.ndim(self.choice) == 0:  # one option chosen: only its shape
            return gemm_shape(self.options[int(self.choice)], sizes, mesh)
        # only the options some row chose are read: the others take the first one's shape
        used = np.flatnonzero(np.bincount(np.ravel(self.choice), minlength=len(self.options)))
        chosen = {i: gemm_shape(self.options[i], sizes, mesh) for i in used.tolist()}
        fill = next(iter(chosen.values()))
        shapes = [chosen.get(i, fill) for i in range(len(self.options))]

        def pick(f: str) -> Any:
            return choose_rows(self.choice, [getattr(g, f) for g in shapes])

        return GemmShape(pick("m"), pick("n"), pick("k"), pick("count"))

    def to_dict(self) -> dict[str, Any]:
        b = self.best
        return {
            "expr": self.expr,
            "case": self.case,
            "strategy": b.describe(),
            "local_shapes": {
                s.name: list(s.local_shape(self.sizes, self.mesh)) for s in (b.lhs, b.rhs, b.out)
            },
            "flops_per_chip": b.flops_per_chip,
            "hbm_bytes_per_chip": b.hbm_bytes_per_chip,
            "collectives": [c.to_dict() for c in b.comms],
            "compute_time_s": self.compute_time_s,
            "memory_time_s": self.memory_time_s,
            "comm_time_s": b.comm_time_s,
            "time_lower_s": self.time_lower_s,
            "time_upper_s": self.time_upper_s,
            "replication": self.replication,
            "alternatives": [
                {
                    "strategy": o.describe(),
                    "comm_time_s": o.comm_time_s,
                    "collectives": [c.to_dict() for c in o.comms],
                }
                for i, o in enumerate(self.options)
                if i != int(np.asarray(self.choice).flat[0])
            ],
        }


# --------------------------------------------------------------------------------------
# The algebra
# --------------------------------------------------------------------------------------


def validate_spec(
    s: Spec, sizes: Mapping[str, Any], mesh: Mapping[str, Any], *, check_divisible: bool = True
) -> None:
    """Raise ShardingError for an axis used twice, an unknown axis or dim, or an indivisible dim."""
    used: dict[str, str] = {}
    for d, ax in zip(s.dims, s.axes, strict=True):
        if d not in sizes:
            raise ShardingError(
                f"dimension {d!r} of {s} has no size",
                rule="every dimension needs a size",
                fix=f"add {d}=... to --dims",
            )
        for a in ax:
            if a not in mesh:
                raise ShardingError(
                    f"mesh axis {a!r} in {s} is not in the mesh {list(mesh)}",
                    rule="subscripts name mesh axes",
                    fix=f"add {a}=N to --mesh or use one of {list(mesh)}",
                )
            if a in used:
                other = used[a]
                fix1 = s.with_axes(d, tuple(x for x in ax if x != a))
                fix2 = s.with_axes(other, tuple(x for x in s.axes_of(other) if x != a))
                raise ShardingError(
                    f"{s} uses mesh axis {a} twice (on {other} and on {d})",
                    rule="a mesh axis may shard at most one dimension of an array (book sharding.md: A[I_X, J_X] is forbidden)",
                    fix=f"write {fix1} or {fix2}",
                )
            used[a] = d
    for a in s.unreduced:
        if a not in mesh:
            raise ShardingError(
                f"unreduced axis {a!r} of {s} is not in the mesh",
                rule="subscripts name mesh axes",
                fix=f"use one of {list(mesh)}",
            )
    if check_divisible:
        for d, ax in zip(s.dims, s.axes, strict=True):
            n = _prod(mesh[a] for a in ax)
            bad = np.mod(np.asarray(sizes[d]), np.asarray(n)) != 0
            if np.any(bad):
                raise ShardingError(
                    f"dimension {d}={_fmt(sizes[d])} of {s} is not divisible by {_axes_str(ax)}={_fmt(n)}",
                    rule="a sharded dimension splits evenly over its mesh axes",
                    fix=f"choose {d} as a multiple of {_fmt(n)} or shard it over fewer axes",
                )


def _fmt(x: Any) -> str:
    a = np.asarray(x)
    return f"{float(a):g}" if a.ndim == 0 else f"{a.flat[0]:g}.."


# -- option choice: the one home of the rule that picks among an einsum's legal options ----


def option_cost(compute_s: Any, memory_s: Any, comm_s: Any) -> Any:
    """What the cheapest-option rule minimises: the roofline time max(compute, memory, comm),
    ties broken by 1e-3 × their sum (the option that would be cheaper without overlap wins)."""
    return np.maximum(np.maximum(compute_s, memory_s), comm_s) + 1e-3 * (
        compute_s + memory_s + comm_s
    )


@dataclass(frozen=True)
class OptionContext:
    """What an option policy sees for one einsum: the legal options and what each costs.

    `costs[i]` is `option_cost` of option i (an array when the sizes are arrays);
    `weights` names the operands that are parameters (empty when the caller does not know).
    """

    lhs: Spec
    rhs: Spec
    out: Spec
    phase: str
    options: tuple[Option, ...]
    costs: tuple[Any, ...]
    weights: frozenset[str] = frozenset()


class OptionPolicy(Protocol):
    """Chooses among an einsum's legal options (all costed by the algebra). Framework profiles
    plug in here (e.g. "FSDP always gathers weights"); the default takes the cheapest."""

    name: str

    def choose(self, ctx: OptionContext) -> Any:
        """The index of the chosen option (an int array when the costs are arrays)."""
        ...


@dataclass(frozen=True)
class Cheapest:
    """Today's rule: the option with the lowest `option_cost`."""

    name: str = "cheapest"

    def choose(self, ctx: OptionContext) -> Any:
        return argmin_allowed(ctx.costs)


@dataclass(frozen=True)
class Prefer:
    """The cheapest option among those `predicate(option, ctx)` accepts; the cheapest of all
    when it accepts none (the algebra never leaves an einsum without a way to run)."""

    name: str
    predicate: Callable[[Option, OptionContext], bool]

    def choose(self, ctx: OptionContext) -> Any:
        return argmin_allowed(ctx.costs, [bool(self.predicate(o, ctx)) for o in ctx.options])


CHEAPEST = Cheapest()


def gathers_only_weights(option: Option, ctx: OptionContext) -> bool:
    """True when every AllGather of the option moves a parameter (or its gradient): the
    option FSDP implementations take (they gather weights, never activations)."""
    return all(c.tensor in ctx.weights for c in option.comms if c.kind == CollectiveKind.ALL_GATHER)


# -- the algebra ------------------------------------------------------------------------


@dataclass(frozen=True)
class CommStep:
    """A collective of an option's recipe, before sizes: `array` is the sharded array whose
    per-chip bytes it moves (collectives.py convention)."""

    kind: CollectiveKind
    axes: tuple[str, ...]
    tensor: str
    array: Spec
    before: str
    after: str
    why: str
    phase: str

    def describe(self) -> str:
        return f"{self.kind.value}_{_axes_str(self.axes)}({self.before}) -> {self.after}"


@dataclass(frozen=True)
class Recipe:
    """One legal way to compute an einsum, without sizes: collectives before, a local matmul
    of `lhs` · `rhs` into `natural_out`, collectives after, ending at `out`."""

    lhs: Spec
    rhs: Spec
    natural_out: Spec
    out: Spec
    steps: tuple[CommStep, ...]

    @property
    def label(self) -> str:
        return "; ".join(f"{c.kind.value}({c.tensor})" for c in self.steps) or "local"

    def describe(self) -> str:
        return "; ".join(c.describe() for c in self.steps) if self.steps else "no communication"


def _gather(
    s: Spec, dim: str, drop: tuple[str, ...], why: str, phase: str
) -> tuple[Spec, CommStep]:
    new = s.with_axes(dim, tuple(a for a in s.axes_of(dim) if a not in drop))
    step = CommStep(
        CollectiveKind.ALL_GATHER, tuple(drop), s.name, new, str(s), str(new), why, phase
    )
    return new, step


def _reduce_or_move(
    kind: CollectiveKind, axes: tuple[str, ...], cur: Spec, new: Spec, why: str, phase: str
) -> CommStep:
    """A ReduceScatter / AllReduce / AllToAll of `cur` (its per-chip bytes are `cur`'s)."""
    return CommStep(kind, tuple(axes), cur.name, cur, str(cur), str(new), why, phase)


class _Einsum:
    """The dims of `lhs · rhs -> out` by role (contracting, batch, free on each side)."""

    def __init__(self, lhs: Spec, rhs: Spec, out: Spec, phase: str) -> None:
        self.lhs, self.rhs, self.out, self.phase = lhs, rhs, out, phase
        self.contracting = [d for d in lhs.dims if d in rhs.dims and d not in out.dims]
        self.batch = [d for d in lhs.dims if d in rhs.dims and d in out.dims]
        self.free_l = [d for d in lhs.dims if d not in rhs.dims]
        self.free_r = [d for d in rhs.dims if d not in lhs.dims]
        # axes on a free dim of both operands (the book's case 4)
        left = {a for d in self.free_l for a in lhs.axes_of(d)}
        right = {a for d in self.free_r for a in rhs.axes_of(d)}
        self.conflict = sorted(left & right)

    def target_choices(self) -> list[list[tuple[str, ...]]]:
        """For each contracting/batch dim: the shardings it may meet in (lhs's, rhs's, none,
        and for batch dims the output's)."""
        choices = []
        for d in self.contracting + self.batch:
            c = [self.lhs.axes_of(d), self.rhs.axes_of(d), ()]
            if d in self.batch:
                c.append(self.out.axes_of(d))
            choices.append(list(dict.fromkeys(c)))
        return choices


@functools.lru_cache(maxsize=8192)
def _einsum_of(lhs: Spec, rhs: Spec, out: Spec, phase: str) -> _Einsum:
    """`_Einsum` of the specs (symbolic, so computed once per distinct einsum)."""
    return _Einsum(lhs, rhs, out, phase)


@functools.lru_cache(maxsize=8192)
def _symbolic_options(lhs: Spec, rhs: Spec, out: Spec, phase: str) -> tuple[Recipe, ...]:
    """Every legal option as a recipe (which arrays move how); bytes and times come later.

    Depends on the shardings only, so it is computed once per distinct einsum and reused
    for every size and mesh the planner tries.
    """
    e = _Einsum(lhs, rhs, out, phase)
    shared = e.contracting + e.batch
    recipes: list[Recipe] = []
    seen: dict[str, int] = {}
    for targets in itertools.product(*e.target_choices()) if shared else [()]:
        tax = [a for t in targets for a in t]
        if len(tax) != len(set(tax)):
            continue
        tmap = dict(zip(shared, targets, strict=True))
        for side_bits in itertools.product((0, 1), repeat=len(e.conflict)):
            r = _build_recipe(e, tmap, dict(zip(e.conflict, side_bits, strict=True)))
            if r is None:
                continue
            key = r.describe()
            if key not in seen:
                seen[key] = len(recipes)
                recipes.append(r)
            elif _more_sliced(r, recipes[seen[key]]):
                # same collectives, operands split further (a batch dim sliced before the
                # matmul): fewer FLOPs and bytes, so it replaces the other
                recipes[seen[key]] = r
    return tuple(recipes)


def _more_sliced(a: Recipe, b: Recipe) -> bool:
    """True if a's local operands are b's split over more mesh axes (a does less local work)."""
    la = set(a.lhs.used_axes) | set(a.rhs.used_axes)
    lb = set(b.lhs.used_axes) | set(b.rhs.used_axes)
    return (
        la > lb
        and set(a.lhs.used_axes) >= set(b.lhs.used_axes)
        and set(a.rhs.used_axes) >= set(b.rhs.used_axes)
    )


def _build_recipe(e: _Einsum, tmap: dict, conflict_side: dict[str, int]) -> Recipe | None:
    """One option: resolve case-4 conflicts, bring the shared dims to `tmap`, slice free dims
    the output wants split, multiply locally, then move the natural output to `out`."""
    steps: list[CommStep] = []
    sides = [e.lhs, e.rhs]
    _resolve_conflicts(e, sides, conflict_side, steps)
    target_axes = {a for t in tmap.values() for a in t}
    _free_target_axes(e, sides, target_axes, steps)
    if not _meet_targets(e, sides, tmap, steps):
        return None
    _slice_free_dims(e, sides, target_axes)
    L, R = sides
    nat_axes = tuple(L.axes_of(d) if d in L.dims else R.axes_of(d) for d in e.out.dims)
    unreduced = tuple(a for d in e.contracting for a in tmap[d]) + tuple(e.lhs.unreduced)
    natural = Spec(e.out.name, tuple(e.out.dims), nat_axes, unreduced, e.out.dtype)
    every = natural.used_axes + natural.unreduced
    if len(set(every)) != len(every):
        return None
    res = _reshard_output(natural, e.out, e.phase)
    if res is None:
        return None
    final, post = res
    return Recipe(L, R, natural, final, tuple(steps + post))


def _resolve_conflicts(
    e: _Einsum, sides: list[Spec], conflict_side: dict[str, int], steps: list[CommStep]
) -> None:
    """Case 4: an axis splits a free dim of both operands; gather it on the chosen side."""
    for a, side in conflict_side.items():
        free = e.free_l if side == 0 else e.free_r
        s = sides[side]
        d = next(d for d in free if a in s.axes_of(d))
        why = f"{a} splits free dims of both operands (case 4): gather {s.name}"
        sides[side], c = _gather(s, d, (a,), why, e.phase)
        steps.append(c)


def _free_target_axes(
    e: _Einsum, sides: list[Spec], target_axes: set[str], steps: list[CommStep]
) -> None:
    """Axes the shared-dim targets need must leave the operands' free dims."""
    for side, free in ((0, e.free_l), (1, e.free_r)):
        for d in free:
            s = sides[side]
            clash = tuple(a for a in s.axes_of(d) if a in target_axes)
            if clash:
                why = f"axis {_axes_str(clash)} is needed on the contracting dim: gather {s.name}'s {d}"
                sides[side], c = _gather(s, d, clash, why, e.phase)
                steps.append(c)


def _meet_targets(e: _Einsum, sides: list[Spec], tmap: dict, steps: list[CommStep]) -> bool:
    """Bring the contracting and batch dims of both operands to their target sharding."""
    for d, t in tmap.items():
        why = (
            "contracting dim sharded differently on the two operands (case 2): gather"
            if d in e.contracting
            else "batch dim sharded differently: gather"
        )
        for side in (0, 1):
            s = _to_target(sides[side], d, t, e.phase, steps, f"{why} {sides[side].name}")
            if s is None:
                return False
            sides[side] = s
    return True


def _slice_free_dims(e: _Einsum, sides: list[Spec], target_axes: set[str]) -> None:
    """A free dim the output wants split over an axis no operand uses is sliced locally first
    (free), so each chip computes only its output block (A[I,J]·B[J,K] -> C[I_X,K_Y] is
    1/(|X||Y|) of the FLOPs, not a full product sliced afterwards)."""
    busy = (
        set(sides[0].used_axes)
        | set(sides[1].used_axes)
        | target_axes
        | set(e.lhs.unreduced)
        | set(e.rhs.unreduced)
    )
    for side, free in ((0, e.free_l), (1, e.free_r)):
        for d in free:
            s = sides[side]
            have, want = s.axes_of(d), e.out.axes_of(d)
            add = want[len(have) :]
            if add and want[: len(have)] == have and not busy & set(add):
                busy |= set(add)
                sides[side] = s.with_axes(d, want)


def _to_target(
    s: Spec, dim: str, target: tuple[str, ...], phase: str, steps: list[CommStep], why: str
) -> Spec | None:
    cur = s.axes_of(dim)
    drop = tuple(a for a in cur if a not in target)
    if drop:
        s, c = _gather(s, dim, drop, why, phase)
        steps.append(c)
    add = tuple(a for a in target if a not in s.axes_of(dim))
    if add:
        if any(a in s.used_axes for a in add):
            return None
        s = s.with_axes(dim, tuple(target))  # local slice of a replicated dim: free
    return s


def _reshard_output(cur: Spec, out: Spec, phase: str) -> tuple[Spec, list[CommStep]] | None:
    """Move the local matmul's natural output to the requested output: ReduceScatter,
    AllReduce, AllToAll / AllGather of misplaced axes, then free local slices."""
    if not set(out.unreduced) <= set(cur.unreduced):
        return None
    steps: list[CommStep] = []
    cur = _reduce(cur, out, phase, steps)
    cur = _move_axes(cur, out, phase, steps)
    cur = _slice_to(cur, out, phase, steps)
    if cur is None or cur.axes != out.axes:
        return None
    return cur, steps


def _reduce(cur: Spec, out: Spec, phase: str, steps: list[CommStep]) -> Spec:
    want_unreduced = set(out.unreduced)
    # ReduceScatter: unreduced axes that the output wants on some dim
    for d in out.dims:
        rs = tuple(
            a
            for a in out.axes_of(d)
            if a in cur.unreduced and a not in cur.axes_of(d) and a not in want_unreduced
        )
        if rs:
            new = replace(
                cur.with_axes(d, cur.axes_of(d) + rs),
                unreduced=tuple(a for a in cur.unreduced if a not in rs),
            )
            why = "partial sums over the contracting axes, output wanted sharded: ReduceScatter"
            steps.append(_reduce_or_move(CollectiveKind.REDUCE_SCATTER, rs, cur, new, why, phase))
            cur = new
    # AllReduce what remains unreduced
    ar = tuple(a for a in cur.unreduced if a not in want_unreduced)
    if ar:
        new = replace(cur, unreduced=tuple(want_unreduced))
        why = "partial sums over the contracting axes, output wanted replicated: AllReduce"
        steps.append(_reduce_or_move(CollectiveKind.ALL_REDUCE, ar, cur, new, why, phase))
        cur = new
    return cur


def _move_axes(cur: Spec, out: Spec, phase: str, steps: list[CommStep]) -> Spec:
    """Axes on the wrong dim: AllToAll moves a subscript; otherwise AllGather it away."""
    for d in cur.dims:
        extra = tuple(a for a in cur.axes_of(d) if a not in out.axes_of(d))
        for a in extra:
            dest = next((e for e in out.dims if a in out.axes_of(e) and e != d), None)
            if dest is not None and a not in cur.axes_of(dest):
                new = cur.with_axes(d, tuple(x for x in cur.axes_of(d) if x != a)).with_axes(
                    dest, cur.axes_of(dest) + (a,)
                )
                why = f"move subscript {a} from {d} to {dest}: AllToAll"
                steps.append(_reduce_or_move(CollectiveKind.ALL_TO_ALL, (a,), cur, new, why, phase))
                cur = new
            else:
                cur, c = _gather(cur, d, (a,), "output wanted less sharded: AllGather", phase)
                steps.append(c)
    return cur


def _slice_to(cur: Spec, out: Spec, phase: str, steps: list[CommStep]) -> Spec | None:
    """Split dims the output wants split: a free local slice of a replicated dim, or (when the
    order of the axes differs) an AllGather first."""
    for d in out.dims:
        add = tuple(a for a in out.axes_of(d) if a not in cur.axes_of(d))
        if not add:
            continue
        if any(a in cur.used_axes or a in cur.unreduced for a in add):
            return None
        have = cur.axes_of(d)
        if out.axes_of(d)[: len(have)] != have:
            # I_Y -> I_XY is no local slice (the rows a chip needs live on other chips)
            why = "output splits the dim in another order: AllGather, then slice"
            cur, c = _gather(cur, d, have, why, phase)
            steps.append(c)
        cur = cur.with_axes(d, out.axes_of(d))  # slicing a replicated dim is free
    return cur


@dataclass(frozen=True)
class _Shape:
    """An einsum's options with their sized quantities deduplicated, computed once per
    (lhs, rhs, out, phase): the distinct arrays whose per-chip elements the options read
    (`arrays`, by dims, splitting axes and dtype: equal keys give equal bytes), the distinct
    collectives (kind, axes, array index), the distinct contracting splits of the lhs, and
    per recipe the indices into them. A plan then sizes each distinct quantity once."""

    recipes: tuple[Recipe, ...]
    labels: tuple[str, ...]
    arrays: tuple[Spec, ...]
    comms: tuple[tuple[CollectiveKind, tuple[str, ...], int], ...]
    splits: tuple[tuple[tuple[str, ...], ...], ...]
    # per recipe: (comm indices, lhs, rhs, natural-out array indices, split index)
    index: tuple[tuple[tuple[int, ...], int, int, int, int], ...]
    # per distinct split: (contracting dim, axes splitting it on the lhs) pairs
    split_dims: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...] = ()


def _key_index(table: dict, key: Any) -> int:
    return table.setdefault(key, len(table))


@functools.lru_cache(maxsize=8192)
def _shape(lhs: Spec, rhs: Spec, out: Spec, phase: str) -> _Shape:
    recipes = _symbolic_options(lhs, rhs, out, phase)
    contracting = [d for d in lhs.dims if d in rhs.dims and d not in out.dims]
    arrays: dict[tuple, int] = {}
    specs: list[Spec] = []
    comms: dict[tuple, int] = {}
    splits: dict[tuple, int] = {}

    def array(x: Spec) -> int:
        i = _key_index(arrays, (x.dims, x.used_axes, x.dtype))
        if i == len(specs):
            specs.append(x)
        return i

    index = []
    for r in recipes:
        cs = tuple(_key_index(comms, (c.kind, c.axes, array(c.array))) for c in r.steps)
        split = tuple(r.lhs.axes_of(d) for d in contracting)
        index.append(
            (cs, array(r.lhs), array(r.rhs), array(r.natural_out), _key_index(splits, split))
        )
    return _Shape(
        recipes,
        tuple(r.label for r in recipes),
        tuple(specs),
        tuple(comms),
        tuple(splits),
        tuple(index),
        tuple(tuple(zip(contracting, sp, strict=True)) for sp in splits),
    )


def _numeric_all(
    lhs: Spec,
    rhs: Spec,
    out: Spec,
    phase: str,
    sizes,
    mesh,
    comm_fn,
    weights: frozenset[str] = frozenset(),
    weight_read_fraction: Any = 1.0,
    sized: SizedMemo | None = None,
) -> tuple[Option, ...]:
    """Put numbers on every option: bytes per chip, collective times, FLOPs and HBM bytes.

    Each distinct array, collective and contracting split is sized once (`_Shape`), with the
    same arithmetic in the same order as sizing every option on its own; `sized` (a family
    walk's) shares them between the einsums of the walk. Operands named in `weights` move
    `weight_read_fraction` of their bytes through HBM (a routed-expert weight: a pass reads
    only the experts its tokens chose)."""
    sh = _shape(lhs, rhs, out, phase)
    if sized is not None:
        elems, nbytes = sized.arrays(sh.arrays, sizes, mesh)
        times = [sized.comm(comm_fn, k, nbytes[i], axes) for k, axes, i in sh.comms]
        split = [sized.split(dims, sizes, mesh) for dims in sh.split_dims]
        return _options(sh, elems, nbytes, times, split, weights, weight_read_fraction)
    elems = [x.local_elements(sizes, mesh) for x in sh.arrays]
    nbytes = [e * x.itemsize for e, x in zip(elems, sh.arrays, strict=True)]
    times = [comm_fn(k, nbytes[i], axes) for k, axes, i in sh.comms]
    split = [_local_size(dims, sizes, mesh) for dims in sh.split_dims]
    key = _options_key(elems, times, split, weights, weight_read_fraction)
    if key is None:
        return _options(sh, elems, nbytes, times, split, weights, weight_read_fraction)
    return _OPTIONS(
        (sh,),
        key,
        lambda: _options(sh, elems, nbytes, times, split, weights, weight_read_fraction),
    )


class SizedMemo:
    """The sized quantities of one multi-row walk, shared by its einsums: an array's per-chip
    elements and bytes, a collective's time over them, a contracting split. The q, k and v
    projections (and their backward einsums) read the same activations sharded alike, so a
    family walk sizes each distinct array once, not once per einsum (GPT-3 175B's 2,799 rows:
    72 distinct of 360). Each value is what the plain expression gives (the same arithmetic
    on the same objects); array-valued sizes, the mesh and the pricing function go by
    identity (`IdentityMemo`), plain sizes by value."""

    def __init__(self) -> None:
        self._memo = IdentityMemo(lambda: _MAX_SIZED)

    @staticmethod
    def _sizes_key(dims: Sequence[str], sizes: Mapping[str, Any]) -> tuple[tuple, tuple]:
        """(the plain sizes by value, None where a size is an array; the arrays)."""
        vals = tuple(sizes[d] for d in dims)
        plain = tuple(v if type(v) is float or type(v) is int else None for v in vals)
        return plain, tuple(v for v, p in zip(vals, plain, strict=True) if p is None)

    def arrays(self, specs: Sequence[Spec], sizes, mesh) -> tuple[list[Any], list[Any]]:
        """(per-chip elements, bytes) of each spec: `local_elements` and that × itemsize."""
        elems, nbytes = [], []
        for x in specs:
            plain, held = self._sizes_key(x.dims, sizes)
            key = ("array", x.dims, x.used_axes, x.itemsize, plain)
            e, b = self._memo((*held, mesh), key, lambda x=x: _sized_array(x, sizes, mesh))
            elems.append(e)
            nbytes.append(b)
        return elems, nbytes

    def comm(self, comm_fn: CommFn, kind: CollectiveKind, nbytes: Any, axes) -> Any:
        """`comm_fn(kind, nbytes, axes)`."""
        key = ("comm", kind, tuple(axes))
        return self._memo((comm_fn, nbytes), key, lambda: comm_fn(kind, nbytes, axes))

    def split(self, dims: tuple[tuple[str, tuple[str, ...]], ...], sizes, mesh) -> Any:
        """`_local_size(dims, sizes, mesh)`."""
        plain, held = self._sizes_key([d for d, _ in dims], sizes)
        key = ("split", dims, plain)
        return self._memo((*held, mesh), key, lambda: _local_size(dims, sizes, mesh))


_MAX_SIZED = 1 << 12  # a family walk holds a few hundred (GPT-3 175B's: ~250)


def _sized_array(x: Spec, sizes: Mapping[str, Any], mesh: Mapping[str, Any]) -> tuple[Any, Any]:
    e = x.local_elements(sizes, mesh)
    return e, e * x.itemsize


# A single plan's sized options by (shape, per-chip elements of its arrays, its collectives'
# times, its contracting splits, weights, read fraction): every number of every option is a
# function of these, so a plan priced again (the same plan, or the same run under another
# efficiency profile whose link fractions are the same: calibrate) builds none of them again.
_MAX_OPTIONS = 4096  # a few KB an entry; calibrate's 78 runs hold ~2,100
_OPTIONS = IdentityMemo(lambda: _MAX_OPTIONS)


def _options_key(elems, times, split, weights, wrf) -> tuple | None:
    """The memo key of a single plan's options (Python floats only), else None."""
    if type(wrf) is not float:
        return None
    for xs in (elems, times, split):
        for x in xs:
            if type(x) is not float:
                return None
    return (tuple(elems), tuple(times), tuple(split), weights, wrf)


def _options(sh, elems, nbytes, times, split, weights, weight_read_fraction) -> tuple[Option, ...]:
    """Every option of `sh` with its numbers (see `_numeric_all`)."""
    options = []
    for r, label, (cs, li, ri, ni, si) in zip(sh.recipes, sh.labels, sh.index, strict=True):
        comm = tuple(
            _built(
                Comm,
                kind=c.kind,
                axes=c.axes,
                tensor=c.tensor,
                bytes_per_chip=nbytes[sh.comms[j][2]],
                time_s=times[j],
                before=c.before,
                after=c.after,
                why=c.why,
                phase=c.phase,
            )
            for c, j in zip(r.steps, cs, strict=True)
        )
        hbm = nbytes[ni]
        for x, i in ((r.lhs, li), (r.rhs, ri)):
            hbm = hbm + (nbytes[i] * weight_read_fraction if x.name in weights else nbytes[i])
        t = sum((c.time_s for c in comm), start=0.0)
        flops = 2.0 * elems[ni] * split[si]
        options.append(
            _built(
                Option,
                label=label,
                lhs=r.lhs,
                rhs=r.rhs,
                natural_out=r.natural_out,
                out=r.out,
                comms=comm,
                flops_per_chip=flops,
                hbm_bytes_per_chip=hbm,
                comm_time_s=t,
            )
        )
    return tuple(options)


def _built(cls: type, **fields: Any) -> Any:
    """An instance of the frozen dataclass `cls` (Comm, Option: no `__post_init__`) from all
    its fields, its `__dict__` filled at once: what the generated `__init__` does one
    `object.__setattr__` at a time, ~3x slower (a single plan builds ~400 of them)."""
    o = object.__new__(cls)
    o.__dict__.update(fields)
    return o


def plan_einsum(
    lhs: Spec,
    rhs: Spec,
    out: Spec,
    sizes: Mapping[str, Any],
    mesh: Mapping[str, Any],
    comm_fn: CommFn,
    *,
    peak_flops_per_s: float = 1.0,
    hbm_bw_bytes_per_s: float = 1.0,
    phase: str = "forward",
    check_divisible: bool = True,
    allow_conflict: bool = True,
    trusted: bool = False,
    policy: OptionPolicy = CHEAPEST,
    weights: frozenset[str] = frozenset(),
    weight_read_fraction: Any = 1.0,
    comm_share: Callable[[Comm], Any] | None = None,
    sized: SizedMemo | None = None,
) -> EinsumPlan:
    """Cost every legal way to compute `out = lhs · rhs` with the given shardings; `policy`
    picks one (default: the cheapest, see `option_cost`).

    `mesh` maps axis name -> size (ints or numpy arrays), `sizes` maps dim -> size.
    `allow_conflict=False` turns the book's case 4 (an axis on a free dim of both
    operands) into a ShardingError listing the two legal fixes instead of resolving it.
    `trusted`: the specs come from rules (the walk), so the checks and the case name are
    skipped. `weights` names the operands that are parameters (for policies);
    `weight_read_fraction` is the share of their bytes a pass reads (routed experts);
    `comm_share(c)` is the share of collective c's time this einsum's choice carries (a
    gradient sum paid once per step weighs 1/M in a microbatch's choice; default 1).
    """
    e = None if trusted else _einsum_of(lhs, rhs, out, phase)
    if e is not None:
        _check_einsum(e, sizes, mesh, check_divisible, allow_conflict)
    options = _numeric_all(
        lhs, rhs, out, phase, sizes, mesh, comm_fn, weights, weight_read_fraction, sized
    )
    if not options:
        raise ShardingError(
            f"no legal way to compute {lhs} * {rhs} -> {out}",
            rule="see book sharding.md cases 1-4",
            fix="shard the output like the inputs' free dims",
        )
    weighed: tuple = ()  # the costs an array choice was made on (EinsumPlan.costs)
    floats = _all_floats(options, peak_flops_per_s, hbm_bw_bytes_per_s)
    if floats:  # one plan: Python floats, the same arithmetic without numpy's per-call cost
        memt, commt = choice_inputs(options, hbm_bw_bytes_per_s, comm_share)
        choice, comp = choose_floats(
            OptionContext(lhs, rhs, out, phase, tuple(options), (), weights),
            memt,
            commt,
            peak_flops_per_s,
            policy,
            trusted,
        )
    else:
        comp = [np.asarray(o.flops_per_chip, float) / peak_flops_per_s for o in options]
        memt = [np.asarray(o.hbm_bytes_per_chip, float) / hbm_bw_bytes_per_s for o in options]
        if trusted and len(options) == 1 and policy is CHEAPEST:  # nothing to choose
            choice = 0
        else:
            costs = tuple(
                option_cost(c, m, _choice_comm(o, comm_share))
                for c, m, o in zip(comp, memt, options, strict=True)
            )
            ctx = OptionContext(lhs, rhs, out, phase, tuple(options), costs, weights)
            choice = policy.choose(ctx)
            weighed = costs
    if type(choice) is int or np.ndim(choice) == 0:
        choice = int(choice)
        compute_t, mem_t = _scalar(comp[choice]), _scalar(memt[choice])
    else:
        compute_t = choose_rows(choice, comp)
        mem_t = choose_rows(choice, memt)
    if trusted:  # the walk: no report fields (they cost array arithmetic per einsum)
        return EinsumPlan(
            "", lhs, rhs, out, "", tuple(options), choice, compute_t, mem_t, 1.0, sizes, mesh,
            weighed,
        )  # fmt: skip
    assert e is not None
    expr = f"{lhs} * {rhs} -> {out}"
    case = _case_name(lhs, rhs, e.contracting, e.conflict)
    rep = _prod(mesh[a] for a in mesh) / _prod(mesh[a] for a in out.used_axes + out.unreduced)
    return EinsumPlan(
        expr, lhs, rhs, out, case, tuple(options), choice, compute_t, mem_t, rep, sizes, mesh,
        weighed,
    )  # fmt: skip


def chooses_cheapest(ep: EinsumPlan, row: int) -> bool:
    """Whether the option `ep` chose at `row` of its walk is the one `Cheapest` picks from the
    same costs (`argmin_allowed` with no option barred: the first lowest, the first NaN), so
    the algebra's own choice would be the same. True where there was one option to take;
    False where the costs the choice was made on are not kept (`EinsumPlan.costs`)."""
    if len(ep.options) == 1:
        return True
    if not ep.costs:
        return False
    at = [float(c[row]) if np.ndim(c) else float(c) for c in ep.costs]
    chosen = int(ep.choice) if np.ndim(ep.choice) == 0 else int(ep.choice[row])
    return int(argmin_allowed(tuple(at))) == chosen


def choose_rows(choice: np.ndarray, values: Sequence[Any]) -> np.ndarray:
    """`np.choose(choice, np.broadcast_arrays(*values))`: per row, the value of the option
    `choice` names. The same array, built by copying only the options some row chose (a
    family walk's einsum has ~10-30 options and its rows choose a few; numpy's choose reads
    every broadcast option per row, ~3x slower at the planner's ~3,000 rows)."""
    arrs = [np.asarray(v) for v in values]
    c = np.asarray(choice)
    if c.ndim != 1 or c.dtype.kind != "i" or any(a.ndim > 1 for a in arrs):
        return np.choose(c, np.broadcast_arrays(*arrs))
    if any(a.ndim == 1 and a.shape != c.shape for a in arrs) or (c.size and c.min() < 0):
        return np.choose(c, np.broadcast_arrays(*arrs))  # numpy's errors, as before
    counts = np.bincount(c, minlength=len(arrs))
    if len(counts) > len(arrs):
        return np.choose(c, np.broadcast_arrays(*arrs))  # an index out of range: numpy's error
    out = np.empty(c.shape, dtype=np.result_type(*arrs))
    for i in np.flatnonzero(counts).tolist():
        a = arrs[i]
        if counts[i] == c.size:
            out[...] = a
        else:
            rows = c == i
            out[rows] = a[rows] if a.ndim else a
    return out


def choice_inputs(
    options: Sequence[Option], hbm_bw_bytes_per_s: float, comm_share: Callable[[Comm], Any] | None
) -> tuple[list[float], list[float]]:
    """A single plan's per-option memory seconds and the communication seconds its choice
    weighs (`_choice_comm`): what `choose_floats` takes besides the matmul rate."""
    memt = [o.hbm_bytes_per_chip / hbm_bw_bytes_per_s for o in options]
    return memt, [_choice_comm(o, comm_share, True) for o in options]


def choose_floats(
    ctx: OptionContext,
    memory_s: list[float],
    comm_s: list[float],
    peak_flops_per_s: float,
    policy: OptionPolicy,
    trusted: bool,
) -> tuple[Any, list[float]]:
    """A single plan's option choice on floats, and each option's compute seconds at
    `peak_flops_per_s`: `ctx` without costs (they are made here), each option's memory seconds
    and the communication seconds the choice weighs (`_choice_comm`). Everything but the peak
    is independent of the efficiency profile's matmul rate, so a walk repriced under a new
    rate chooses again with this (`core.walk`) exactly as `plan_einsum` chose."""
    options = ctx.options
    comp = [o.flops_per_chip / peak_flops_per_s for o in options]
    if trusted and len(options) == 1 and policy is CHEAPEST:  # nothing to choose
        return 0, comp
    costs = tuple(
        _float_option_cost(c, m, x) for c, m, x in zip(comp, memory_s, comm_s, strict=True)
    )
    c = ctx
    return policy.choose(
        OptionContext(c.lhs, c.rhs, c.out, c.phase, options, costs, c.weights)
    ), comp


def _choice_comm(o: Option, share: Callable[[Comm], Any] | None, floats: bool = False) -> Any:
    """The communication seconds the option choice weighs (each collective × its share)."""
    if floats:
        if share is None:
            return o.comm_time_s
        return sum((c.time_s * share(c) for c in o.comms), start=0.0)
    if share is None:
        return np.asarray(o.comm_time_s, float)
    return sum(
        (_shared(np.asarray(c.time_s, float), share(c)) for c in o.comms), start=np.zeros(())
    )


def _shared(t: np.ndarray, share: Any) -> Any:
    """`t * share`; a rows' array under a share of the float 1.0 is itself (x · 1.0 is x
    exactly), without the copy (a family walk weighs ~360 collectives, most at share 1)."""
    if type(share) is float and share == 1.0 and t.ndim:
        return t
    return t * share


def _is_float(x: Any) -> bool:
    return type(x) is float or type(x) is np.float64


def _all_floats(options: list[Option], peak: Any, bw: Any) -> bool:
    """True when every number of every option is a float (a single plan's walk)."""
    if not (_is_float(peak) and _is_float(bw)):
        return False
    for o in options:
        if not (_is_float(o.flops_per_chip) and _is_float(o.hbm_bytes_per_chip)):
            return False
        if not all(_is_float(c.time_s) for c in o.comms):
            return False
    return True


def _float_option_cost(compute_s: float, memory_s: float, comm_s: float) -> float:
    """`option_cost` of floats (the same value; NaN propagates as numpy's maximum does)."""
    if compute_s != compute_s or memory_s != memory_s or comm_s != comm_s:
        return math.nan
    return max(max(compute_s, memory_s), comm_s) + 1e-3 * (compute_s + memory_s + comm_s)


def argmin_allowed(costs: tuple[Any, ...], ok: list[bool] | None = None) -> Any:
    """The index of the cheapest option (per row when the costs are arrays), among those `ok`
    allows when it allows any; the first on ties, as numpy's argmin."""
    if all(_is_float(c) for c in costs):
        vals = costs
        if ok is not None and any(ok):
            vals = tuple(c if a else math.inf for c, a in zip(costs, ok, strict=True))
        at = 0
        for i, v in enumerate(vals):
            if v != v:  # NaN: numpy's argmin takes the first NaN
                return np.intp(i)
            if v < vals[at]:
                at = i
        return np.intp(at)
    keep = None if ok is None else np.array(ok, dtype=bool)
    if keep is not None and not keep.any():
        keep = None
    by_row = _options_by_row(costs)
    if by_row is not None:  # rows x options: numpy's argmin along the last axis is ~6x faster
        if keep is not None:
            by_row = np.where(keep, by_row, np.inf)
        return np.argmin(by_row, axis=1)
    stacked = np.stack(np.broadcast_arrays(*costs))
    if keep is not None:
        stacked = np.where(keep.reshape((-1,) + (1,) * (stacked.ndim - 1)), stacked, np.inf)
    return np.argmin(stacked, axis=0)


def _options_by_row(costs: tuple[Any, ...]) -> np.ndarray | None:
    """The options' costs as one (rows, options) float array when each is a scalar or one
    value per row (a family walk's einsum), else None."""
    arrs = [np.asarray(c) for c in costs]
    n = max((a.shape[0] for a in arrs if a.ndim == 1), default=None)
    if n is None or any(a.ndim > 1 or (a.ndim == 1 and a.shape[0] != n) for a in arrs):
        return None
    if any(a.dtype != np.float64 for a in arrs):
        return None
    out = np.empty((n, len(arrs)))
    for i, a in enumerate(arrs):
        out[:, i] = a
    return out


def _scalar(x: Any) -> Any:
    if type(x) is float:
        return x
    return float(x) if np.ndim(x) == 0 else x


def _check_einsum(
    e: _Einsum,
    sizes: Mapping[str, Any],
    mesh: Mapping[str, Any],
    divisible: bool,
    conflict_ok: bool,
) -> None:
    """ShardingError for an invalid einsum: bad specs, output dims from nowhere, a dim in one
    operand only that the output drops, or (when not allowed) the book's case 4."""
    lhs, rhs, out = e.lhs, e.rhs, e.out
    for s in (lhs, rhs):
        validate_spec(s, sizes, mesh, check_divisible=divisible)
    for d in out.dims:
        if d not in lhs.dims and d not in rhs.dims:
            raise ShardingError(
                f"output dim {d!r} of {out} appears in neither input",
                rule="einsum outputs come from the inputs",
                fix=f"remove {d} from the output",
            )
    for d in (*e.free_l, *e.free_r):
        if d not in out.dims:
            raise ShardingError(
                f"dim {d!r} appears in one input only and not in the output of {lhs} * {rhs} -> {out}",
                rule="a dim in one operand only must be kept in the output (sums over one operand are not matmuls)",
                fix=f"add {d} to the output",
            )
    if e.conflict and not conflict_ok:
        raise _case4_error(e, f"{lhs} * {rhs} -> {out}")
    validate_spec(out, sizes, mesh, check_divisible=divisible)


def _case4_error(e: _Einsum, expr: str) -> ShardingError:
    lhs, rhs, out = e.lhs, e.rhs, e.out
    a = e.conflict[0]
    dl = next(d for d in e.free_l if a in lhs.axes_of(d))
    dr = next(d for d in e.free_r if a in rhs.axes_of(d))
    lg = lhs.with_axes(dl, tuple(x for x in lhs.axes_of(dl) if x != a))
    rg = rhs.with_axes(dr, tuple(x for x in rhs.axes_of(dr) if x != a))
    out1 = out.with_axes(dl, tuple(x for x in out.axes_of(dl) if x != a))
    out2 = out.with_axes(dr, tuple(x for x in out.axes_of(dr) if x != a))
    return ShardingError(
        f"{expr} is invalid: mesh axis {a} splits the non-contracting dim {dl} of {lhs.name} and {dr} of {rhs.name}, "
        f"so the output would use {a} twice",
        rule="book sharding.md case 4: both operands may not shard a non-contracting dim on the same axis",
        fix=f"AllGather_{a} {lhs.name} first ({lg} * {rhs} -> {out1}) or AllGather_{a} {rhs.name} first ({lhs} * {rg} -> {out2})",
    )


def _case_name(lhs: Spec, rhs: Spec, contracting: list[str], conflict: list[str]) -> str:
    if conflict:
        return "4: an axis splits a free dim of both operands (gather one first)"
    ls = any(lhs.axes_of(d) for d in contracting)
    rs = any(rhs.axes_of(d) for d in contracting)
    if not ls and not rs:
        return "1: contracting dim unsharded (no communication needed)"
    if ls and rs and all(lhs.axes_of(d) == rhs.axes_of(d) for d in contracting):
        return "3: both operands sharded on the contracting dim (partial sums, then AllReduce/ReduceScatter)"
    return "2: one operand sharded on the contracting dim (AllGather it, or slice the other and reduce)"


def backward_specs(
    lhs: Spec, rhs: Spec, out: Spec
) -> tuple[tuple[Spec, Spec, Spec], tuple[Spec, Spec, Spec]]:
    """The two backward einsums of out = lhs · rhs (book training.md Appendix A).

    d_lhs = d_out · rhs (contracting rhs's free dims), d_rhs = lhs · d_out (contracting
    lhs's free dims); each gradient is sharded like its primal, so an AllGather in the
    forward pass becomes a ReduceScatter here (they are transposes).
    """
    d_out = replace(out, name="d" + out.name, unreduced=())
    d_lhs = replace(lhs, name="d" + lhs.name, unreduced=())
    d_rhs = replace(rhs, name="d" + rhs.name, unreduced=())
    return (d_out, rhs, d_lhs), (lhs, d_out, d_rhs)


@functools.lru_cache(maxsize=8192)
def _backward_specs_cached(lhs: Spec, rhs: Spec, out: Spec):
    return backward_specs(lhs, rhs, out)


def plan_training_einsum(
    lhs: Spec, rhs: Spec, out: Spec, sizes, mesh, comm_fn, **kw
) -> tuple[EinsumPlan, EinsumPlan, EinsumPlan]:
    """Forward plus both backward einsums, each planned by the same algebra."""
    fwd = plan_einsum(lhs, rhs, out, sizes, mesh, comm_fn, phase="forward", **kw)
    (a1, b1, c1), (a2, b2, c2) = _backward_specs_cached(lhs, rhs, out)
    bl = plan_einsum(a1, b1, c1, sizes, mesh, comm_fn, phase="backward", **kw)
    br = plan_einsum(a2, b2, c2, sizes, mesh, comm_fn, phase="backward", **kw)
    return fwd, bl, br


def bytes_in_notation(
    spec: Spec, sizes: Mapping[str, Any], mesh: Mapping[str, Any]
) -> dict[str, Any]:
    """Per-device and total bytes of a sharded array, and the replication factor (book sh-02, sh-08)."""
    per = spec.local_bytes(sizes, mesh)
    n = _prod(mesh[a] for a in mesh)
    full = math.prod(float(sizes[d]) for d in spec.dims) * dtype_bytes(spec.dtype)
    return {
        "local_shape": spec.local_shape(sizes, mesh),
        "bytes_per_device": per,
        "total_bytes": per * n,
        "replication": per * n / full,
    }
