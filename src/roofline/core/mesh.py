"""Mesh: named logical axes (the book's `Mesh({'X': 16, 'Y': 16})`) placed on physical dims.

Axes keep the user's order. JAX convention: the LAST axis is the innermost (fastest-varying
device index), so auto-placement walks the axes from last to first and gives each the
innermost physical dims still free (NVLink before scale-out; the innermost ICI axis first).
A mesh axis may span several physical dims (the book's `M_X` axes of bandwidth), and a
physical dim may be split among axes when sizes share factors: the first axis to take a
factor gets the contiguous (stride 1) part, the next the strided part, and so on.

A placement is a tuple of `Segment`s per axis, innermost first. `Segment.stride` is how many
chips apart two neighbours of the segment are on the physical dim (the product of the
factors of that dim taken before it); on an ICI dim a strided segment shares each link with
`stride` other groups and each of its hops crosses `stride` links.

Explicit placement: `make_mesh(system, "X=4@z,Y=16@x*y")` or
`make_mesh(system, {"X": 4, "Y": 16}, placement={"X": "z", "Y": "x*y"})`; axes without an
explicit placement are auto-placed on what is left.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.errors import PlanError
from roofline.memo import IdentityMemo
from roofline.specs.system import DimKind, PhysDim, System, parse_system

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Segment:
    """The part of one physical dim that one mesh axis (or a collective's group) spans.

    `full`: the segment covers the whole physical dim (size == dim.size).
    `stride`: distance in chips between neighbours of the segment along the dim.
    """

    dim: PhysDim
    size: int
    full: bool
    stride: int = 1

    @property
    def ring(self) -> bool:
        """True when the segment closes into a ring through the dim's wraparound link
        (whole dim, or its outermost strided factor)."""
        return self.dim.wraparound and self.size * self.stride == self.dim.size and self.size > 2

    def describe(self) -> str:
        if self.dim.kind is DimKind.ICI:
            part = (
                ""
                if self.full
                else f" {self.size}/{self.dim.size}"
                + (f" stride {self.stride}" if self.stride > 1 else "")
            )
            return f"{self.dim.name}{part}"
        return self.dim.name if self.full else f"{self.dim.name} {self.size}/{self.dim.size}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "dim": self.dim.name,
            "kind": self.dim.kind.value,
            "size": self.size,
            "full": self.full,
            "stride": self.stride,
            "ring": self.ring,
        }


@dataclass(frozen=True)
class Mesh:
    """Named mesh axes on a System. `placement[axis]` lists the axis' segments innermost first."""

    system: System
    axes: tuple[tuple[str, int], ...]
    placement: Mapping[str, tuple[Segment, ...]]

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def shape(self) -> dict[str, int]:
        return dict(self.axes)

    @functools.cached_property
    def sizes(self) -> Mapping[str, int]:
        """`shape`, built once (read-only: the mesh's own lookups)."""
        return MappingProxyType(dict(self.axes))

    @functools.cached_property
    def _dim_rank(self) -> dict[str, int]:
        """Each physical dim's position in the system, outermost first (built once)."""
        return {d.name: i for i, d in enumerate(self.system.dims)}

    @property
    def n_chips(self) -> int:
        return self.system.n_chips

    def axis_size(self, name: str) -> int:
        return self.shape[self.resolve_axes((name,))[0]]

    def resolve_axes(self, axes: str | Iterable[str]) -> tuple[str, ...]:
        """Axis names from 'X', 'XY' (book notation), 'X,Y' or a sequence; PlanError if unknown."""
        known = self.sizes
        if type(axes) is tuple and all(a in known for a in axes) and len(set(axes)) == len(axes):
            return axes  # already resolved (the walk's and the unit costs' axes)
        names = _as_axis_tuple(axes, self.axis_names)
        for a in names:
            if a not in known:
                raise PlanError(
                    f"mesh axis {a!r} is not in the mesh {self.spec()}",
                    rule="collectives and shardings name axes of the mesh",
                    fix="use one of " + ", ".join(known),
                )
        if len(set(names)) != len(names):
            raise PlanError(
                f"mesh axes {names} repeat an axis",
                rule="a mesh axis appears at most once",
                fix="list each axis once",
            )
        return names

    def size(self, axes: str | Iterable[str] = ()) -> int:
        """Product of the sizes of `axes` (1 for none)."""
        shape = self.sizes
        return math.prod(shape[a] for a in self.resolve_axes(axes))

    def segments(self, axes: str | Iterable[str]) -> tuple[Segment, ...]:
        """The physical segments a group over `axes` spans, innermost first.

        Segments of the same physical dim that are adjacent (one's stride is the other's
        stride x size) merge into one, so e.g. a collective over both halves of a split
        ring sees the whole ring (with its wraparound)."""
        names = self.resolve_axes(axes)
        by_dim: dict[str, list[Segment]] = {}
        for a in names:
            for seg in self.placement[a]:
                by_dim.setdefault(seg.dim.name, []).append(seg)
        order = self._dim_rank
        out: list[Segment] = []
        for dname in sorted(by_dim, key=lambda n: -order[n]):
            segs = sorted(by_dim[dname], key=lambda s: s.stride)
            merged = [segs[0]]
            for s in segs[1:]:
                last = merged[-1]
                if s.stride == last.stride * last.size:
                    size = last.size * s.size
                    merged[-1] = Segment(last.dim, size, size == last.dim.size, last.stride)
                else:
                    merged.append(s)
            out.extend(merged)
        return tuple(out)

    def spec(self) -> str:
        return ",".join(f"{n}={s}" for n, s in self.axes)

    def describe(self) -> str:
        parts = []
        for n, s in self.axes:
            segs = self.placement[n]
            parts.append(
                f"{n}={s}@" + ("*".join(seg.describe() for seg in reversed(segs)) if segs else "-")
            )
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system.name,
            "axes": {n: s for n, s in self.axes},
            "placement": {n: [seg.to_dict() for seg in self.placement[n]] for n, _ in self.axes},
        }


# each system's dims by name -> position, outermost first (`Mesh._dim_rank`), shared by the
# group meshes of one system (`group_mesh`); by identity, the system kept to check it
_DIM_RANKS = IdentityMemo(256)


def group_mesh(sys_: System, placement: Mapping[str, tuple[Segment, ...]]) -> Mesh:
    """The mesh of a collective group's own axes, placed as `placement` says (each axis' size
    the product of its segments'): what `collectives.unit_cost` reads of any mesh holding
    that placement (the system, the axes' sizes and segments). Built without the dataclass's
    field-by-field `__init__` and with its cached lookups filled (the dims' ranks shared per
    system): the planner prices hundreds of groups a search, each on its own mesh."""
    axes = tuple((a, math.prod(g.size for g in segs)) for a, segs in placement.items())
    m = object.__new__(Mesh)
    m.__dict__.update(
        system=sys_,
        axes=axes,
        placement=MappingProxyType(dict(placement)),
        sizes=MappingProxyType(dict(axes)),
        _dim_rank=_DIM_RANKS((sys_,), (), lambda: {d.name: i for i, d in enumerate(sys_.dims)}),
    )
    return m


def _as_axis_tuple(axes: str | Iterable[str], known: Sequence[str]) -> tuple[str, ...]:
    if isinstance(axes, str):
        s = axes.strip()
        if not s:
            return ()
        if s in known:
            return (s,)
        if re.search(r"[,\s+]", s):
            return tuple(p for p in re.split(r"[,\s+]+", s) if p)
        # 'XY' -> ('X', 'Y') when it decomposes into known axis names (book notation)
        parts = _split_axes_greedy(s, known)
        return parts if parts is not None else (s,)
    return tuple(str(a) for a in axes)


def _split_axes_greedy(s: str, known: Sequence[str]) -> tuple[str, ...] | None:
    """Split 'XY' or 'datatensor' into known axis names (longest match first)."""
    names = sorted(known, key=len, reverse=True)

    def rec(rest: str) -> tuple[str, ...] | None:
        if not rest:
            return ()
        for n in names:
            if rest.startswith(n):
                tail = rec(rest[len(n) :])
                if tail is not None:
                    return (n, *tail)
        return None

    return rec(s)


def _parse_axes(
    axes: Mapping[str, int] | str | Sequence[tuple[str, int]],
) -> tuple[list[tuple[str, int]], dict[str, str]]:
    inline: dict[str, str] = {}
    items: list[tuple[str, Any]]
    if isinstance(axes, str):
        items = []
        for part in re.split(r"\s*,\s*", axes.strip()):
            if not part:
                continue
            m = re.fullmatch(
                r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*[=:]\s*([0-9]+)\s*(?:@\s*(.+?))?\s*", part
            )
            if not m:
                raise PlanError(
                    f"cannot read mesh axis {part!r} in {axes!r}",
                    rule="a mesh is NAME=SIZE[,NAME=SIZE...], optionally NAME=SIZE@dim*dim",
                    fix="write e.g. X=16,Y=16 or X=4@z,Y=16@x*y",
                )
            items.append((m.group(1), int(m.group(2))))
            if m.group(3):
                inline[m.group(1)] = m.group(3)
    elif isinstance(axes, Mapping):
        items = list(axes.items())
    else:
        items = [tuple(p) for p in axes]  # type: ignore[misc]
    out: list[tuple[str, int]] = []
    for name, size in items:
        name = str(name)
        if not _NAME_RE.match(name):
            raise PlanError(
                f"mesh axis name {name!r}",
                rule="axis names are identifiers (letters, digits, _)",
                fix="rename the axis, e.g. X or data",
            )
        if (
            isinstance(size, bool)
            or not isinstance(size, (int, float))
            or size != int(size)
            or size < 1
        ):
            raise PlanError(
                f"mesh axis {name}={size!r}",
                rule="mesh axis sizes are positive whole numbers",
                fix=f"give {name} a size of 1 or more",
            )
        out.append((name, int(size)))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise PlanError(
            f"mesh axis {dup!r} appears twice in {axes!r}",
            rule="each mesh axis has one size",
            fix="list each axis once",
        )
    if not out:
        raise PlanError(
            f"empty mesh {axes!r}", rule="a mesh has at least one axis", fix="write e.g. X=16"
        )
    return out, inline


def _parse_placement(
    placement: Mapping[str, str | Sequence[str]] | str | None,
) -> dict[str, tuple[str, ...]]:
    if placement is None:
        return {}
    if isinstance(placement, str):
        out: dict[str, tuple[str, ...]] = {}
        for part in re.split(r"\s*,\s*", placement.strip()):
            if not part:
                continue
            m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:=\s*[0-9]+\s*)?@\s*(.+?)\s*", part)
            if not m:
                raise PlanError(
                    f"cannot read placement {part!r}",
                    rule="a placement is AXIS@dim*dim[,AXIS@dim...]",
                    fix="write e.g. X@z,Y@x*y",
                )
            out[m.group(1)] = _dim_list(m.group(2))
        return out
    return {
        str(k): (_dim_list(v) if isinstance(v, str) else tuple(str(x) for x in v))
        for k, v in placement.items()
    }


def _dim_list(s: str) -> tuple[str, ...]:
    return tuple(p for p in re.split(r"\s*[*×+]\s*|\s+", s.strip()) if p)


def _suggest_shape(axes: list[tuple[str, int]], n: int) -> str:
    if len(axes) == 1:
        return f"{axes[0][0]}={n}"
    rest = math.prod(s for _, s in axes[1:])
    if n % rest == 0:
        return ",".join([f"{axes[0][0]}={n // rest}"] + [f"{a}={s}" for a, s in axes[1:]])
    first = math.prod(s for _, s in axes[:-1])
    if n % first == 0:
        return ",".join([f"{a}={s}" for a, s in axes[:-1]] + [f"{axes[-1][0]}={n // first}"])
    return ",".join([f"{axes[0][0]}={n}"] + [f"{a}=1" for a, _ in axes[1:]])


def make_mesh(
    system: System | str,
    axes: Mapping[str, int] | str | Sequence[tuple[str, int]],
    placement: Mapping[str, str | Sequence[str]] | str | None = None,
) -> Mesh:
    """A Mesh of named axes on `system`; sizes must multiply to the chip count.

    `axes`: {"X": 16, "Y": 16}, "X=16,Y=16" (optionally "X=4@z,Y=16@x*y"), or pairs.
    `placement`: optional physical dims per axis ({"X": "z", "Y": ("x", "y")} or "X@z,Y@x*y").
    """
    sys_ = parse_system(system) if not isinstance(system, System) else system
    items, inline = _parse_axes(axes)
    wanted = {**inline, **{k: "*".join(v) for k, v in _parse_placement(placement).items()}}
    explicit = {k: _dim_list(v) for k, v in wanted.items()}
    return place_mesh(sys_, items, explicit)


def place_mesh(
    sys_: System,
    items: list[tuple[str, int]],
    explicit: Mapping[str, tuple[str, ...]] | None = None,
) -> Mesh:
    """`make_mesh` of axes already read: (name, whole size >= 1) pairs, names distinct (the
    planner's meshes, `specs.plan.mesh_axes_of`), and explicit placements per axis."""
    explicit = explicit or {}
    names = [n for n, _ in items]
    _check_mesh(sys_, items, explicit)
    if not explicit:
        result = _auto_placed(sys_, items)
    else:
        inner_first = list(reversed(sys_.dims))
        placer = _Placer(sys_)
        result = {}
        order = list(reversed(names))
        for a in [n for n in order if n in explicit]:
            allowed = [d for d in inner_first if d.name in explicit[a]]
            result[a] = placer.take(a, dict(items)[a], allowed)
        for a in [n for n in order if n not in explicit]:
            result[a] = placer.take(a, dict(items)[a], inner_first)
    return Mesh(
        system=sys_, axes=tuple(items), placement=MappingProxyType({n: result[n] for n in names})
    )


# One auto-placed axis's segments and what it leaves free, by system, then (what was free, size):
# an axis takes the same factors whatever it is named, so the planner's hundreds of meshes on
# one system (sharing their inner axes) place each step once. Keyed by the system's identity
# (System holds read-only mappings, not hashable), the system kept to check it; bounded.
_TAKES_MAX = 1 << 16
_TAKES = IdentityMemo(lambda: _TAKES_MAX)


def _auto_placed(sys_: System, items: list[tuple[str, int]]) -> dict[str, tuple[Segment, ...]]:
    """Every axis placed innermost first on the dims still free (`_Placer`), steps remembered
    in the system's own table (one identity lookup a mesh, a plain dict lookup an axis)."""
    steps = _TAKES((sys_,), (), dict)
    free = tuple(d.size for d in sys_.dims)
    result: dict[str, tuple[Segment, ...]] = {}
    for a, size in reversed(items):
        result[a], free = _remembered_take(steps, sys_, free, a, size)
    return result


def _remembered_take(
    steps: dict, sys_: System, free: tuple[int, ...], axis: str, size: int
) -> tuple[tuple[Segment, ...], tuple[int, ...]]:
    """`_take` of `axis` (`size`) on the dims `free`, from the system's table `steps` or
    taken and remembered there (a PlanError is not remembered)."""
    hit = steps.get((free, size))
    if hit is None:
        hit = _take(sys_, free, axis, size)
        if len(steps) >= _TAKES_MAX:
            steps.clear()
        steps[(free, size)] = hit
    return hit


def auto_placed_columns(
    systems: Sequence[System],
    system_idx: Any,
    columns: Sequence[tuple[str, Any]],
) -> tuple[dict[str, tuple[list[tuple[int, tuple[Segment, ...]]], Any]], Any]:
    """`_auto_placed` of many meshes at once, one axis (column) at a time: mesh i lives on
    `systems[system_idx[i]]` with axis sizes `columns` ((name, int array) pairs, outermost
    first; an axis of size 1 is absent and takes nothing).

    Auto-placement walks the axes innermost first, and where an axis goes depends only on its
    size and what the axes inside it left free (`_take`, remembered in the system's table of
    `_auto_placed`), so the meshes are grouped per axis by (what is free, size) and each
    distinct step is taken once, not once per mesh: the same steps, the same Segment tuples.
    Returns, per axis, (the distinct (system index, segment tuple) pairs, each mesh's index
    into them: -1 where
    the axis has size 1 or the mesh did not fit), and which meshes did not fit (an axis that
    cannot be placed: `place_mesh` says why)."""
    sidx = np.asarray(system_idx, dtype=np.int64)
    n = len(sidx)
    tables = [_TAKES((s,), (), dict) for s in systems]
    # a state is (system index, what each of its dims has free); meshes start with all free
    states: list[tuple[int, tuple[int, ...]]] = [
        (i, tuple(d.size for d in s.dims)) for i, s in enumerate(systems)
    ]
    state_id = {st: j for j, st in enumerate(states)}
    state = sidx.copy()
    bad = np.zeros(n, dtype=bool)
    out: dict[str, tuple[list[tuple[int, tuple[Segment, ...]]], Any]] = {}
    for a, col in reversed(columns):
        size = np.asarray(col, dtype=np.int64)
        idx = np.full(n, -1, dtype=np.int64)
        segs_list: list[tuple[int, tuple[Segment, ...]]] = []
        live = (size > 1) & ~bad
        if live.any():
            rows = np.flatnonzero(live)
            radix = int(size[rows].max()) + 1
            keys, inv = np.unique(state[rows] * radix + size[rows], return_inverse=True)
            step_seg = np.full(len(keys), -1, dtype=np.int64)
            step_state = np.full(len(keys), -1, dtype=np.int64)
            for k, key in enumerate(keys.tolist()):
                st, sz = divmod(key, radix)
                si, free = states[st]
                try:
                    segs, left = _remembered_take(tables[si], systems[si], free, a, sz)
                except PlanError:
                    continue  # the mesh's own placement says why
                nxt = (si, left)
                j = state_id.get(nxt)
                if j is None:
                    j = state_id[nxt] = len(states)
                    states.append(nxt)
                step_seg[k], step_state[k] = len(segs_list), j
                segs_list.append((si, segs))
            got = step_seg[inv]
            failed = got < 0
            idx[rows] = got
            state[rows] = np.where(failed, state[rows], step_state[inv])
            bad[rows[failed]] = True
        out[a] = (segs_list, idx)
    for _, idx in out.values():
        idx[bad] = -1
    return out, bad


def _take(sys_: System, free: tuple[int, ...], a: str, size: int) -> tuple:
    """One axis placed on the dims still free: (its segments, the dims' sizes left)."""
    placer = _Placer(sys_, free)
    segs = placer.take(a, size, list(reversed(sys_.dims)))  # PlanError: not remembered
    return segs, tuple(placer.remaining[d.name] for d in sys_.dims)


def _check_mesh(sys_: System, items: list[tuple[str, int]], explicit: Mapping[str, tuple]) -> None:
    """PlanError for a placement of an unknown axis or dim, or sizes that miss the chip count."""
    names = [n for n, _ in items]
    for k in explicit:
        if k not in names:
            raise PlanError(
                f"placement names axis {k!r}, which the mesh {','.join(names)} does not have",
                rule="a placement places axes of the mesh",
                fix="use one of " + ", ".join(names),
            )
    prod = math.prod(s for _, s in items)
    if prod != sys_.n_chips:
        raise PlanError(
            f"mesh {','.join(f'{a}={s}' for a, s in items)} has {prod} devices but system {sys_.name!r} has {sys_.n_chips} chips",
            rule="mesh axis sizes multiply to the number of chips",
            fix=f"use e.g. {_suggest_shape(items, sys_.n_chips)}",
        )
    dim_names = [d.name for d in sys_.dims]
    for k, ds in explicit.items():
        for d in ds:
            if d not in dim_names:
                raise PlanError(
                    f"placement of axis {k!r} names physical dim {d!r}, which system {sys_.name!r} does not have",
                    rule="physical dims are " + ", ".join(dim_names) + " (outermost first)",
                    fix="use those names",
                )


class _Placer:
    """Hands out factors of the physical dims to mesh axes, innermost first."""

    def __init__(self, sys_: System, free: tuple[int, ...] | None = None) -> None:
        """`free`: what each dim (in `sys_.dims` order) still has free (default: all of it)."""
        left = free if free is not None else tuple(d.size for d in sys_.dims)
        self.remaining = {d.name: f for d, f in zip(sys_.dims, left, strict=True)}
        self.taken = {d.name: d.size // f for d, f in zip(sys_.dims, left, strict=True)}

    def take(self, axis: str, size: int, allowed: list[PhysDim]) -> tuple[Segment, ...]:
        remaining, taken = self.remaining, self.taken
        segs: list[Segment] = []
        s = size
        for d in allowed:
            if s == 1:
                break
            g = math.gcd(s, remaining[d.name])
            if g > 1:
                segs.append(Segment(d, g, g == d.size, taken[d.name]))
                taken[d.name] *= g
                remaining[d.name] //= g
                s //= g
        if s != 1:
            free = (
                ", ".join(f"{d.name}: {remaining[d.name]} of {d.size} free" for d in allowed)
                or "none"
            )
            fit = math.prod(remaining[d.name] for d in allowed)
            raise PlanError(
                f"mesh axis {axis!r} of size {size} cannot be placed on physical dims {'*'.join(d.name for d in allowed)} ({free})",
                rule="an axis takes factors of the physical dims still free, innermost first",
                fix=f"give {axis} a size whose factors fit (e.g. {math.gcd(size, fit) if math.gcd(size, fit) > 1 else fit}), or change the placement",
            )
        return tuple(segs)


__all__ = ["Mesh", "Segment", "make_mesh"]
