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
from typing import Any

import numpy as np

from roofline.collectives import CollectiveKind
from roofline.errors import ShardingError
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
        parts = []
        for d, a in zip(self.dims, self.axes, strict=True):
            parts.append(d if not a else d + "_" + _axes_str(a))
        u = "{U_" + _axes_str(self.unreduced) + "}" if self.unreduced else ""
        return f"{self.name}[{', '.join(parts)}]{u}"

    def axes_of(self, dim: str) -> tuple[str, ...]:
        return self.axes[self.dims.index(dim)]

    def with_axes(self, dim: str, axes: tuple[str, ...]) -> Spec:
        i = self.dims.index(dim)
        return replace(self, axes=self.axes[:i] + (tuple(axes),) + self.axes[i + 1 :])

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
    return "".join(axes) if all(len(a) == 1 for a in axes) else "{" + ",".join(axes) + "}"


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

    @property
    def best(self) -> Option:
        return self.options[int(np.asarray(self.choice).flat[0])]

    def pick(self, attr: str) -> Any:
        if np.ndim(self.choice) == 0:
            return getattr(self.best, attr)
        vals = [
            np.broadcast_to(np.asarray(getattr(o, attr), float), np.shape(self.choice))
            for o in self.options
        ]
        return np.choose(self.choice, vals)

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


def _gather(
    s: Spec, dim: str, drop: tuple[str, ...], sizes, mesh, comm_fn, why: str, phase: str
) -> tuple[Spec, Comm]:
    new = s.with_axes(dim, tuple(a for a in s.axes_of(dim) if a not in drop))
    return new, _comm(
        CollectiveKind.ALL_GATHER,
        drop,
        s.name,
        new,
        sizes,
        mesh,
        comm_fn,
        str(s),
        str(new),
        why,
        phase,
    )


def _comm(
    kind: CollectiveKind,
    axes: tuple[str, ...],
    tensor: str,
    measured: Spec,
    sizes,
    mesh,
    comm_fn,
    before: str,
    after: str,
    why: str,
    phase: str,
) -> Comm:
    """A Comm whose bytes are `measured`'s local bytes; symbolic (bytes = the Spec) when sizes is None."""
    if sizes is None:
        return Comm(kind, axes, tensor, measured, None, before, after, why, phase)
    b = measured.local_bytes(sizes, mesh)
    return Comm(kind, axes, tensor, b, comm_fn(kind, b, axes), before, after, why, phase)


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
) -> EinsumPlan:
    """Cost every legal way to compute `out = lhs · rhs` with the given shardings; pick the cheapest.

    `mesh` maps axis name -> size (ints or numpy arrays), `sizes` maps dim -> size.
    `allow_conflict=False` turns the book's case 4 (an axis on a free dim of both
    operands) into a ShardingError listing the two legal fixes instead of resolving it.
    """
    if trusted:  # specs generated from rules by the planner: already valid, skip the checks
        return _plan_trusted(
            lhs, rhs, out, sizes, mesh, comm_fn, peak_flops_per_s, hbm_bw_bytes_per_s, phase
        )
    for s in (lhs, rhs):
        validate_spec(s, sizes, mesh, check_divisible=check_divisible)
    expr = f"{lhs} * {rhs} -> {out}"
    contracting = [d for d in lhs.dims if d in rhs.dims and d not in out.dims]
    free_l = [d for d in lhs.dims if d not in rhs.dims]
    free_r = [d for d in rhs.dims if d not in lhs.dims]
    for d in out.dims:
        if d not in lhs.dims and d not in rhs.dims:
            raise ShardingError(
                f"output dim {d!r} of {out} appears in neither input",
                rule="einsum outputs come from the inputs",
                fix=f"remove {d} from the output",
            )
    for d in (*free_l, *free_r):
        if d not in out.dims:
            raise ShardingError(
                f"dim {d!r} appears in one input only and not in the output of {expr}",
                rule="a dim in one operand only must be kept in the output (sums over one operand are not matmuls)",
                fix=f"add {d} to the output",
            )

    conflict = sorted(
        set(a for d in free_l for a in lhs.axes_of(d))
        & set(a for d in free_r for a in rhs.axes_of(d))
    )
    if conflict and not allow_conflict:
        a = conflict[0]
        dl = next(d for d in free_l if a in lhs.axes_of(d))
        dr = next(d for d in free_r if a in rhs.axes_of(d))
        lg = lhs.with_axes(dl, tuple(x for x in lhs.axes_of(dl) if x != a))
        rg = rhs.with_axes(dr, tuple(x for x in rhs.axes_of(dr) if x != a))
        out1 = out.with_axes(dl, tuple(x for x in out.axes_of(dl) if x != a))
        out2 = out.with_axes(dr, tuple(x for x in out.axes_of(dr) if x != a))
        raise ShardingError(
            f"{expr} is invalid: mesh axis {a} splits the non-contracting dim {dl} of {lhs.name} and {dr} of {rhs.name}, "
            f"so the output would use {a} twice",
            rule="book sharding.md case 4: both operands may not shard a non-contracting dim on the same axis",
            fix=f"AllGather_{a} {lhs.name} first ({lg} * {rhs} -> {out1}) or AllGather_{a} {rhs.name} first ({lhs} * {rg} -> {out2})",
        )

    validate_spec(out, sizes, mesh, check_divisible=check_divisible)
    sym = _symbolic_options(lhs, rhs, out, phase)
    options = [_numeric(o, contracting, sizes, mesh, comm_fn) for o in sym]
    if not options:
        raise ShardingError(
            f"no legal way to compute {expr}",
            rule="see book sharding.md cases 1-4",
            fix="shard the output like the inputs' free dims",
        )
    case = _case_name(lhs, rhs, contracting, conflict)
    times = [np.asarray(o.comm_time_s, float) for o in options]
    # compute/memory time depend on local shapes, which differ only by what was gathered
    comp = [np.asarray(o.flops_per_chip, float) / peak_flops_per_s for o in options]
    memt = [np.asarray(o.hbm_bytes_per_chip, float) / hbm_bw_bytes_per_s for o in options]
    totals = [
        np.maximum(np.maximum(c, m), t) + 1e-3 * (c + m + t)
        for c, m, t in zip(comp, memt, times, strict=True)
    ]
    stacked = np.stack(np.broadcast_arrays(*totals))
    choice = np.argmin(stacked, axis=0)
    if choice.ndim == 0:
        choice = int(choice)
        compute_t, mem_t = comp[choice], memt[choice]
        compute_t, mem_t = (
            float(compute_t) if np.ndim(compute_t) == 0 else compute_t,
            float(mem_t) if np.ndim(mem_t) == 0 else mem_t,
        )
    else:
        compute_t = np.choose(choice, np.broadcast_arrays(*comp))
        mem_t = np.choose(choice, np.broadcast_arrays(*memt))
    rep = _prod(mesh[a] for a in mesh) / _prod(mesh[a] for a in out.used_axes + out.unreduced)
    return EinsumPlan(
        expr,
        lhs,
        rhs,
        out,
        case,
        tuple(options),
        choice,
        compute_t,
        mem_t,
        rep,
        dict(sizes),
        dict(mesh),
    )


def _plan_trusted(lhs, rhs, out, sizes, mesh, comm_fn, peak, hbm, phase) -> EinsumPlan:
    contracting = tuple(d for d in lhs.dims if d in rhs.dims and d not in out.dims)
    sym = _symbolic_options(lhs, rhs, out, phase)
    options = [_numeric(o, contracting, sizes, mesh, comm_fn) for o in sym]
    if len(options) == 1:
        o = options[0]
        return EinsumPlan(
            "",
            lhs,
            rhs,
            out,
            "",
            tuple(options),
            0,
            o.flops_per_chip / peak,
            o.hbm_bytes_per_chip / hbm,
        )
    comp = [o.flops_per_chip / peak for o in options]
    memt = [o.hbm_bytes_per_chip / hbm for o in options]
    totals = [
        np.maximum(np.maximum(c, m), o.comm_time_s) + 1e-3 * (c + m + o.comm_time_s)
        for c, m, o in zip(comp, memt, options, strict=True)
    ]
    choice = np.argmin(np.stack(np.broadcast_arrays(*totals)), axis=0)
    if np.ndim(choice) == 0:
        choice = int(choice)
        return EinsumPlan("", lhs, rhs, out, "", tuple(options), choice, comp[choice], memt[choice])
    return EinsumPlan(
        "",
        lhs,
        rhs,
        out,
        "",
        tuple(options),
        choice,
        np.choose(choice, np.broadcast_arrays(*comp)),
        np.choose(choice, np.broadcast_arrays(*memt)),
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


@functools.lru_cache(maxsize=8192)
def _symbolic_options(lhs: Spec, rhs: Spec, out: Spec, phase: str) -> tuple[Option, ...]:
    """Every legal option as a recipe (which arrays move how); bytes and times come later.

    Depends on the shardings only, so it is computed once per distinct einsum and reused
    for every size and mesh the planner tries.
    """
    contracting = [d for d in lhs.dims if d in rhs.dims and d not in out.dims]
    batch_dims = [d for d in lhs.dims if d in rhs.dims and d in out.dims]
    free_l = [d for d in lhs.dims if d not in rhs.dims]
    free_r = [d for d in rhs.dims if d not in lhs.dims]
    return tuple(
        _enumerate_options(
            lhs, rhs, out, contracting, batch_dims, free_l, free_r, None, None, None, phase
        )
    )


def _numeric(o: Option, contracting: list[str], sizes, mesh, comm_fn) -> Option:
    """Put numbers on a symbolic option: bytes per chip, collective times, FLOPs and HBM bytes."""
    comms = []
    for c in o.comms:
        b = c.bytes_per_chip.local_bytes(sizes, mesh)
        comms.append(
            Comm(
                c.kind,
                c.axes,
                c.tensor,
                b,
                comm_fn(c.kind, b, c.axes),
                c.before,
                c.after,
                c.why,
                c.phase,
            )
        )
    L, R, nat = o.lhs, o.rhs, o.natural_out
    flops = (
        2.0
        * nat.local_elements(sizes, mesh)
        * _prod(sizes[d] / _prod(mesh[a] for a in L.axes_of(d)) for d in contracting)
    )
    hbm = L.local_bytes(sizes, mesh) + R.local_bytes(sizes, mesh) + nat.local_bytes(sizes, mesh)
    t = sum((c.time_s for c in comms), start=0.0)
    return Option(o.label, L, R, nat, o.out, tuple(comms), flops, hbm, t)


def _enumerate_options(
    lhs, rhs, out, contracting, batch_dims, free_l, free_r, sizes, mesh, comm_fn, phase
) -> list[Option]:
    options: list[Option] = []
    seen: dict[str, int] = {}
    # targets for each contracting/batch dim: the lhs sharding, the rhs sharding, or none
    shared = contracting + batch_dims
    choices = []
    for d in shared:
        c = [lhs.axes_of(d), rhs.axes_of(d), ()]
        if d in batch_dims:
            c.append(out.axes_of(d))
        uniq: list[tuple[str, ...]] = []
        for x in c:
            if x not in uniq:
                uniq.append(x)
        choices.append(uniq)
    conflict = sorted(
        set(a for d in free_l for a in lhs.axes_of(d))
        & set(a for d in free_r for a in rhs.axes_of(d))
    )
    for targets in itertools.product(*choices) if shared else [()]:
        tmap = dict(zip(shared, targets, strict=True))
        tax = [a for t in targets for a in t]
        if len(tax) != len(set(tax)):
            continue
        for side_bits in itertools.product((0, 1), repeat=len(conflict)):
            opt = _build_option(
                lhs,
                rhs,
                out,
                tmap,
                contracting,
                batch_dims,
                free_l,
                free_r,
                dict(zip(conflict, side_bits, strict=True)),
                sizes,
                mesh,
                comm_fn,
                phase,
            )
            if opt is None:
                continue
            key = opt.describe()
            if key not in seen:
                seen[key] = len(options)
                options.append(opt)
            elif _more_sliced(opt, options[seen[key]]):
                # same collectives, operands split further (a batch dim sliced before the
                # matmul): fewer FLOPs and bytes, so it replaces the other
                options[seen[key]] = opt
    return options


def _more_sliced(a: Option, b: Option) -> bool:
    """True if a's local operands are b's split over more mesh axes (a does less local work)."""
    la, lb = (
        set(a.lhs.used_axes) | set(a.rhs.used_axes),
        set(b.lhs.used_axes) | set(b.rhs.used_axes),
    )
    return (
        la > lb
        and set(a.lhs.used_axes) >= set(b.lhs.used_axes)
        and set(a.rhs.used_axes) >= set(b.rhs.used_axes)
    )


def _to_target(
    s: Spec,
    dim: str,
    target: tuple[str, ...],
    sizes,
    mesh,
    comm_fn,
    phase,
    comms: list[Comm],
    why: str,
) -> Spec | None:
    cur = s.axes_of(dim)
    drop = tuple(a for a in cur if a not in target)
    if drop:
        s, c = _gather(s, dim, drop, sizes, mesh, comm_fn, why, phase)
        comms.append(c)
    add = tuple(a for a in target if a not in s.axes_of(dim))
    if add:
        if any(a in s.used_axes for a in add):
            return None
        s = s.with_axes(dim, tuple(target))  # local slice of a replicated dim: free
    return s


def _build_option(
    lhs,
    rhs,
    out,
    tmap,
    contracting,
    batch_dims,
    free_l,
    free_r,
    conflict_side,
    sizes,
    mesh,
    comm_fn,
    phase,
) -> Option | None:
    comms: list[Comm] = []
    L, R = lhs, rhs
    # 1. free-dim conflicts (case 4): gather the chosen side's free dim over the axis
    for a, side in conflict_side.items():
        if side == 0:
            d = next(d for d in free_l if a in L.axes_of(d))
            L, c = _gather(
                L,
                d,
                (a,),
                sizes,
                mesh,
                comm_fn,
                f"{a} splits free dims of both operands (case 4): gather {L.name}",
                phase,
            )
        else:
            d = next(d for d in free_r if a in R.axes_of(d))
            R, c = _gather(
                R,
                d,
                (a,),
                sizes,
                mesh,
                comm_fn,
                f"{a} splits free dims of both operands (case 4): gather {R.name}",
                phase,
            )
        comms.append(c)
    # 2. axes that the shared-dim targets need must leave the operands' free dims
    target_axes = {a for t in tmap.values() for a in t}
    for S_, free in ((0, free_l), (1, free_r)):
        for d in free:
            s = L if S_ == 0 else R
            clash = tuple(a for a in s.axes_of(d) if a in target_axes)
            if clash:
                s, c = _gather(
                    s,
                    d,
                    clash,
                    sizes,
                    mesh,
                    comm_fn,
                    f"axis {_axes_str(clash)} is needed on the contracting dim: gather {s.name}'s {d}",
                    phase,
                )
                comms.append(c)
                if S_ == 0:
                    L = s
                else:
                    R = s
    # 3. bring contracting and batch dims of both operands to the target
    for d, t in tmap.items():
        why = (
            "contracting dim sharded differently on the two operands (case 2): gather"
            if d in contracting
            else "batch dim sharded differently: gather"
        )
        L2 = _to_target(L, d, t, sizes, mesh, comm_fn, phase, comms, f"{why} {L.name}")
        R2 = _to_target(R, d, t, sizes, mesh, comm_fn, phase, comms, f"{why} {R.name}")
        if L2 is None or R2 is None:
            return None
        L, R = L2, R2
    # 3b. a free dim the output wants split over an axis no operand uses: slice it locally
    # first (free), so each chip computes only its output block (A[I,J]·B[J,K] -> C[I_X,K_Y]
    # is 1/(|X||Y|) of the FLOPs, not a full product sliced afterwards)
    busy = (
        set(L.used_axes) | set(R.used_axes) | target_axes | set(lhs.unreduced) | set(rhs.unreduced)
    )
    for S_, free in ((0, free_l), (1, free_r)):
        for d in free:
            s = L if S_ == 0 else R
            have, want = s.axes_of(d), out.axes_of(d)
            add = want[len(have) :]
            if add and want[: len(have)] == have and not busy & set(add):
                busy |= set(add)
                if S_ == 0:
                    L = s.with_axes(d, want)
                else:
                    R = s.with_axes(d, want)
    # 4. local matmul -> natural output
    nat_dims = tuple(out.dims)
    nat_axes = []
    for d in nat_dims:
        nat_axes.append(L.axes_of(d) if d in L.dims else R.axes_of(d))
    unreduced = tuple(a for d in contracting for a in tmap[d]) + tuple(lhs.unreduced)
    natural = Spec(out.name, nat_dims, tuple(nat_axes), unreduced, out.dtype)
    if len(set(natural.used_axes + natural.unreduced)) != len(
        natural.used_axes + natural.unreduced
    ):
        return None
    if sizes is None:
        flops = hbm = 0.0
    else:
        flops = (
            2.0
            * natural.local_elements(sizes, mesh)
            * _prod(sizes[d] / _prod(mesh[a] for a in tmap[d]) for d in contracting)
        )
        hbm = (
            L.local_bytes(sizes, mesh)
            + R.local_bytes(sizes, mesh)
            + natural.local_bytes(sizes, mesh)
        )
    # 5. move the natural output to the requested output
    cur = natural
    res = _reshard_output(cur, out, sizes, mesh, comm_fn, phase)
    if res is None:
        return None
    cur, post = res
    comms += post
    t = 0.0 if sizes is None else sum((c.time_s for c in comms), start=0.0)
    label = "; ".join(f"{c.kind.value}({c.tensor})" for c in comms) or "local"
    return Option(label, L, R, natural, cur, tuple(comms), flops, hbm, t)


def _reshard_output(
    cur: Spec, out: Spec, sizes, mesh, comm_fn, phase
) -> tuple[Spec, list[Comm]] | None:
    comms: list[Comm] = []
    want_unreduced = set(out.unreduced)
    if not want_unreduced <= set(cur.unreduced):
        return None
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
            comms.append(
                _comm(
                    CollectiveKind.REDUCE_SCATTER,
                    rs,
                    cur.name,
                    cur,
                    sizes,
                    mesh,
                    comm_fn,
                    str(cur),
                    str(new),
                    "partial sums over the contracting axes, output wanted sharded: ReduceScatter",
                    phase,
                )
            )
            cur = new
    # AllReduce what remains unreduced
    ar = tuple(a for a in cur.unreduced if a not in want_unreduced)
    if ar:
        new = replace(cur, unreduced=tuple(want_unreduced))
        comms.append(
            _comm(
                CollectiveKind.ALL_REDUCE,
                ar,
                cur.name,
                cur,
                sizes,
                mesh,
                comm_fn,
                str(cur),
                str(new),
                "partial sums over the contracting axes, output wanted replicated: AllReduce",
                phase,
            )
        )
        cur = new
    # Axes on the wrong dim: AllToAll moves a subscript; otherwise AllGather / free slice
    for d in cur.dims:
        extra = tuple(a for a in cur.axes_of(d) if a not in out.axes_of(d))
        for a in extra:
            dest = next((e for e in out.dims if a in out.axes_of(e) and e != d), None)
            if dest is not None and a not in cur.axes_of(dest):
                new = cur.with_axes(d, tuple(x for x in cur.axes_of(d) if x != a)).with_axes(
                    dest, cur.axes_of(dest) + (a,)
                )
                comms.append(
                    _comm(
                        CollectiveKind.ALL_TO_ALL,
                        (a,),
                        cur.name,
                        cur,
                        sizes,
                        mesh,
                        comm_fn,
                        str(cur),
                        str(new),
                        f"move subscript {a} from {d} to {dest}: AllToAll",
                        phase,
                    )
                )
                cur = new
            else:
                new, c = _gather(
                    cur,
                    d,
                    (a,),
                    sizes,
                    mesh,
                    comm_fn,
                    "output wanted less sharded: AllGather",
                    phase,
                )
                comms.append(c)
                cur = new
    for d in out.dims:
        add = tuple(a for a in out.axes_of(d) if a not in cur.axes_of(d))
        if add:
            if any(a in cur.used_axes or a in cur.unreduced for a in add):
                return None
            have = cur.axes_of(d)
            if out.axes_of(d)[: len(have)] != have:
                # I_Y -> I_XY is no local slice (the rows a chip needs live on other chips)
                cur, c = _gather(
                    cur,
                    d,
                    have,
                    sizes,
                    mesh,
                    comm_fn,
                    "output splits the dim in another order: AllGather, then slice",
                    phase,
                )
                comms.append(c)
            cur = cur.with_axes(d, out.axes_of(d))  # slicing a replicated dim is free
    if cur.axes != out.axes:
        return None
    return cur, comms


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
