"""Read what XLA did: collectives, FLOPs and bytes from HLO text and cost_analysis().

Two HLO texts come out of one compile (`observe`):

* **post-SPMD** — the module right after the SPMD partitioner (dumped with
  `xla_dump_to` + `xla_dump_hlo_pass_re=spmd-partitioning`): the collectives the
  partitioner chose, in the program's dtypes, one instruction per logical collective,
  before combiners/CSE. This is what the algebra's prediction is diffed against.
* **final** — `compiled.as_text()`: after all passes (combined tuple all-reduces, CPU's
  bf16 all-reduce done in f32, async pairs on GPU/TPU).

Per-device bytes of one execution (`ObservedCollective.bytes_per_device`):

| kind               | bytes_per_device                                        |
|--------------------|---------------------------------------------------------|
| all-gather         | OUTPUT buffer per device (= input x group size)          |
| reduce-scatter     | INPUT buffer per device (= output x group size)          |
| all-reduce         | the buffer (input = output)                             |
| all-to-all         | the buffer (input = output)                             |
| collective-permute | the bytes one device sends (its operand)                |

`count` is how many times the instruction runs per step: the product of the trip counts
of the while loops around it (a `jax.lax.scan` over L layers runs its body L times).
A tuple-shaped (combined) collective is split into one record per element
(`tuple_index`, `tuple_size`, same `instruction`). Async `-start`/`-done` pairs count once
(at `-start`). An all-reduce whose every use is a 1/n `dynamic-slice` (directly, through
bitcast/copy/convert/reshape, or inside a fusion) is reported as a reduce-scatter with
`normalized_from="all-reduce"` (what the CPU partitioner emits instead of reduce-scatter).

Replica groups are read in all printed syntaxes — explicit `{{0,1},{2,3}}`, iota
`[2,4]<=[8]`, transposed iota `[4,2]<=[2,4]T(1,0)`, and the Shardy mesh form
`mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}` — expanded to logical
device ids (partition ids = positions in the program's mesh, row-major), then mapped back
to the program's mesh axes: `mesh_axes` are the axes whose coordinate varies inside a group.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roofline.errors import VerifyError

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "u64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "f8e3m4": 1,
    "f4e2m1fn": 0.5,
    "tf32": 4,
    "token": 0,
}
_SHAPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_PASS_THROUGH = {"bitcast", "copy", "convert", "reshape"}


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Shape:
    dtype: str
    dims: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def bytes(self) -> float:
        return self.elements * _DTYPE_BYTES.get(self.dtype, 4)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass(frozen=True)
class Instruction:
    name: str
    computation: str
    opcode: str
    shapes: tuple[Shape, ...]  # result (tuple elements flattened)
    is_tuple: bool
    operands: tuple[str, ...]  # operand instruction names
    operand_shapes: tuple[Shape | None, ...]  # inline-printed operand types, if any
    attrs: str
    line: str


@dataclass(frozen=True)
class ObservedCollective:
    """One collective (or one element of a combined one) as XLA emitted it."""

    kind: str  # all-gather | reduce-scatter | all-reduce | all-to-all | collective-permute
    dtype: str
    shape: tuple[int, ...]  # the buffer whose bytes are counted (see module table)
    operand_shape: tuple[int, ...]
    result_shape: tuple[int, ...]
    bytes_per_device: float  # one execution, see module table
    group_size: int
    n_groups: int
    # program mesh axes varying inside a group (permute: between src and dst)
    mesh_axes: tuple[str, ...]
    axes_complete: bool  # group covers every device along mesh_axes (False: a sub-group)
    count: int  # executions per step (product of enclosing loop trip counts)
    instruction: str
    computation: str
    source: str  # the HLO line (truncated), for error messages
    # jax op_name from metadata (e.g. 'jit(step)/transpose(jvp(btd,df->btf))/dot_general')
    op_name: str = ""
    # "all-reduce" when an AR+dynamic-slice became a reduce-scatter
    normalized_from: str | None = None
    tuple_index: int | None = None
    tuple_size: int = 1
    replica_groups: tuple[tuple[int, ...], ...] = ()
    async_pair: bool = False

    @property
    def total_bytes_per_device(self) -> float:
        return self.bytes_per_device * self.count

    def key(self) -> tuple[str, tuple[str, ...], str]:
        return (self.kind, self.mesh_axes, self.dtype)


@dataclass(frozen=True)
class Observed:
    """Everything read from one compile of a program."""

    collectives: tuple[ObservedCollective, ...]  # from the post-SPMD HLO (primary)
    collectives_final: tuple[ObservedCollective, ...]  # from the final HLO
    flops_per_device: float  # cost_analysis flops, loop bodies corrected by trip count
    bytes_accessed_per_device: float  # cost_analysis bytes accessed, loop-corrected (estimate)
    flops_per_device_raw: float  # cost_analysis as reported (loop bodies once)
    bytes_accessed_per_device_raw: float
    dot_flops_per_device: float  # 2*M*N*K of every dot in the final HLO, times loop counts
    hlo_text_post_spmd: str
    hlo_text_final: str
    mesh_shape: tuple[tuple[str, int], ...]
    loops: tuple[tuple[str, int], ...] = ()  # (while instruction, trip count) in the final HLO
    program: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def summary(self, final: bool = False) -> list[dict[str, Any]]:
        """Collectives aggregated by (kind, mesh axes, dtype, bytes): count and total bytes."""
        return summarize(self.collectives_final if final else self.collectives)


def summarize(colls: Iterable[ObservedCollective]) -> list[dict[str, Any]]:
    agg: dict[tuple, dict[str, Any]] = {}
    for c in colls:
        k = (c.kind, c.mesh_axes, c.dtype, c.bytes_per_device, c.normalized_from)
        row = agg.setdefault(
            k,
            {
                "kind": c.kind,
                "mesh_axes": c.mesh_axes,
                "dtype": c.dtype,
                "bytes_per_device": c.bytes_per_device,
                "normalized_from": c.normalized_from,
                "count": 0,
                "total_bytes_per_device": 0.0,
            },
        )
        row["count"] += c.count
        row["total_bytes_per_device"] += c.total_bytes_per_device
    return sorted(agg.values(), key=lambda r: (r["kind"], r["mesh_axes"], -r["bytes_per_device"]))


# ----------------------------------------------------------------------------- text parsing


def _match_close(s: str, i: int) -> int:
    """Index just past the bracket that closes s[i] ('(' '{' '[')."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    j = i
    in_str = False
    while j < len(s):
        ch = s[j]
        if in_str:
            if ch == "\\":
                j += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return j + 1
        j += 1
    raise VerifyError(
        f"unbalanced brackets in HLO line {s[:200]!r}",
        rule="HLO text from XLA",
        fix="pass the text of an HLO module (compiled.as_text() or an xla_dump_to file)",
    )


def _split_top(s: str, sep: str = ",") -> list[str]:
    out, depth, cur, in_str = [], 0, [], False
    for ch in s:
        if in_str:
            cur.append(ch)
            if ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def parse_shapes(text: str) -> tuple[Shape, ...]:
    text = re.sub(r"/\*.*?\*/", "", text)
    text = re.sub(r"\{[^{}]*\}", "", text)  # layouts
    return tuple(
        Shape(m.group(1), tuple(int(x) for x in m.group(2).split(",") if x))
        for m in _SHAPE.finditer(text)
    )


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_COMP = re.compile(
    r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$|^\s*(ENTRY\s+)?%?([\w.\-]+)\s*\{\s*$"
)


@dataclass
class Module:
    computations: dict[str, list[Instruction]]
    entry: str
    by_name: dict[str, Instruction]

    def users(self) -> dict[str, list[Instruction]]:
        out: dict[str, list[Instruction]] = {}
        for instrs in self.computations.values():
            for ins in instrs:
                for o in ins.operands:
                    out.setdefault(o, []).append(ins)
        return out


def parse_module(text: str) -> Module:
    """Computations and instructions of an HLO module's text."""
    comps: dict[str, list[Instruction]] = {}
    entry = ""
    cur: str | None = None
    by_name: dict[str, Instruction] = {}
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith(("HloModule", "//", "#")):
            continue
        if cur is None or line.strip() == "}":
            if line.strip() == "}":
                cur = None
                continue
            m = _COMP.match(line)
            if m:
                is_entry = bool(m.group(1) or m.group(4))
                cur = m.group(2) or m.group(5)
                comps[cur] = []
                if is_entry:
                    entry = cur
            continue
        ins = _parse_instruction(line, cur)
        if ins is not None:
            comps[cur].append(ins)
            by_name[ins.name] = ins
    if not comps:
        raise VerifyError(
            "no HLO computations found in the text",
            rule="HLO module text, as printed by XLA",
            fix="pass compiled.as_text() or a *.txt file from xla_dump_to",
        )
    if not entry:
        entry = next(reversed(comps))
    return Module(comps, entry, by_name)


def _parse_instruction(line: str, comp: str) -> Instruction | None:
    m = _INSTR.match(line)
    if not m:
        return None
    name = m.group(1)
    i = m.end()
    if i < len(line) and line[i] == "(":
        j = _match_close(line, i)
        type_text, is_tuple = line[i:j], True
    else:
        j = line.find(" ", i)
        if j < 0:
            return None
        type_text, is_tuple = line[i:j], False
    rest = line[j:].lstrip()
    k = rest.find("(")
    if k < 0:
        return None
    opcode = rest[:k].strip()
    e = _match_close(rest, k)
    ops_text = rest[k + 1 : e - 1]
    attrs = rest[e:]
    operands: list[str] = []
    op_shapes: list[Shape | None] = []
    if opcode not in ("constant", "parameter", "iota"):
        for part in _split_top(ops_text):
            part = re.sub(r"/\*.*?\*/", "", part).strip()
            if not part:
                continue
            nm = re.findall(r"%([\w.\-]+)", part)
            if not nm:
                toks = part.split()
                if not toks:
                    continue
                nm = [toks[-1]]
            operands.append(nm[-1])
            sh = parse_shapes(part[: part.rfind(nm[-1])]) if " " in part else ()
            op_shapes.append(sh[0] if sh else None)
    return Instruction(
        name,
        comp,
        opcode,
        parse_shapes(type_text),
        is_tuple,
        tuple(operands),
        tuple(op_shapes),
        attrs,
        line.strip(),
    )


# ----------------------------------------------------------------------------- replica groups


def _iota(dims: Sequence[int], perm: Sequence[int] | None):
    import numpy as np

    a = np.arange(math.prod(dims)).reshape(dims)
    if perm:
        a = a.transpose(perm)
    return a


def _ints(s: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", s)]


def parse_replica_groups(attrs: str, n_devices: int) -> tuple[tuple[int, ...], ...]:
    """Expand replica_groups (any printed syntax) to tuples of logical device ids."""
    import numpy as np

    m = re.search(r"replica_groups=", attrs)
    if not m:
        return (tuple(range(n_devices)),)
    s = attrs[m.end() :]
    if s.startswith("{"):
        body = s[: _match_close(s, 0)]
        groups = re.findall(r"\{([0-9,\s]*)\}", body[1:-1])
        if not groups:  # {} = one group of everyone
            return (tuple(range(n_devices)),)
        return tuple(tuple(_ints(g)) for g in groups)
    mi = re.match(r"\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", s)
    if mi:
        shape = _ints(mi.group(1))
        a = _iota(_ints(mi.group(2)), _ints(mi.group(3)) if mi.group(3) else None).reshape(shape)
        return tuple(tuple(int(x) for x in row) for row in a.reshape(shape[0], -1))
    mm = re.match(r"mesh\[([^\]]*)\]", s)
    if mm:
        axes = re.findall(r"'([^']+)'\s*=\s*(\d+)", mm.group(1))
        names = [a for a, _ in axes]
        sizes = [int(n) for _, n in axes]
        tail = s[mm.end() :]
        devs = np.arange(math.prod(sizes))
        md = re.match(r",?\s*device_ids=\(", tail)
        if md:
            st = md.end() - 1
            inner = tail[st + 1 : _match_close(tail, st) - 1]
            tail = tail[_match_close(tail, st) :]
            mi2 = re.match(r"\s*\[([0-9,]+)\](?:T\(([0-9,]+)\))?\s*$", inner)
            if mi2:
                devs = _iota(
                    _ints(mi2.group(1)), _ints(mi2.group(2)) if mi2.group(2) else None
                ).reshape(-1)
            else:
                devs = np.array(_ints(inner))
        devs = devs.reshape(sizes)
        mb = re.match(r"\s*\{([^}]*)\}", tail)
        if mb:
            if ":" in mb.group(1) or "(" in mb.group(1):
                raise VerifyError(
                    f"sub-axis replica groups are not supported: {s[:120]!r}",
                    rule="roofline reads whole mesh axes in Shardy replica groups",
                    fix="report the HLO line so the parser can learn this form",
                )
            inside = re.findall(r"'([^']+)'", mb.group(1))
        else:
            inside = list(names)
        outside = [a for a in names if a not in inside]
        perm = [names.index(a) for a in outside] + [names.index(a) for a in inside]
        g = math.prod(sizes[names.index(a)] for a in inside)
        a = devs.transpose(perm).reshape(-1, g)
        return tuple(tuple(int(x) for x in row) for row in a)
    raise VerifyError(
        f"cannot read replica_groups {s[:120]!r}",
        rule="explicit, iota or mesh replica groups",
        fix="report the HLO line so the parser can learn this form",
    )


def parse_source_target_pairs(attrs: str) -> tuple[tuple[int, int], ...]:
    m = re.search(r"source_target_pairs=\{", attrs)
    if not m:
        return ()
    st = m.end() - 1
    body = attrs[st : _match_close(attrs, st)]
    return tuple(
        (a, b) for a, b in (tuple(_ints(p)) for p in re.findall(r"\{(\s*\d+\s*,\s*\d+\s*)\}", body))
    )


def mesh_axes_of_groups(
    groups: Sequence[Sequence[int]], mesh_shape: Sequence[tuple[str, int]]
) -> tuple[tuple[str, ...], bool]:
    """Which mesh axes vary inside the groups; and whether groups cover those axes fully."""
    import numpy as np

    names = [a for a, _ in mesh_shape]
    sizes = [n for _, n in mesh_shape]
    n = math.prod(sizes)
    varying: set[int] = set()
    for g in groups:
        if not g or max(g) >= n:
            continue
        coords = np.array(np.unravel_index(np.array(g), sizes)).T
        for ax in range(len(sizes)):
            if len(set(coords[:, ax])) > 1:
                varying.add(ax)
    axes = tuple(names[i] for i in sorted(varying))
    full = math.prod(sizes[i] for i in varying) if varying else 1
    complete = all(len(g) == full for g in groups) if groups else True
    return axes, complete


def mesh_axes_of_pairs(
    pairs: Sequence[tuple[int, int]], mesh_shape: Sequence[tuple[str, int]]
) -> tuple[str, ...]:
    import numpy as np

    names = [a for a, _ in mesh_shape]
    sizes = [n for _, n in mesh_shape]
    n = math.prod(sizes)
    varying: set[int] = set()
    for s, t in pairs:
        if s == t or s >= n or t >= n:
            continue
        cs, ct = np.unravel_index(s, sizes), np.unravel_index(t, sizes)
        varying.update(i for i in range(len(sizes)) if cs[i] != ct[i])
    return tuple(names[i] for i in sorted(varying))


# ----------------------------------------------------------------------------- call graph, loops


def _callees(ins: Instruction, comps: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(attribute, computation) pairs this instruction calls."""
    out = []
    for m in re.finditer(r"(\w+)=(?:%([\w.\-]+)|\{([^{}]*)\})", ins.attrs):
        names = [m.group(2)] if m.group(2) else re.findall(r"%?([\w.\-]+)", m.group(3) or "")
        out.extend((m.group(1), nm) for nm in names if nm in comps)
    return out


def trip_count(mod: Module, ins: Instruction) -> int | None:
    """Trip count of a while: backend_config known_trip_count, else `i < constant` in its condition."""
    m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', ins.attrs)
    if m:
        return int(m.group(1))
    mc = re.search(r"condition=%?([\w.\-]+)", ins.attrs)
    if not mc or mc.group(1) not in mod.computations:
        return None
    cond = mod.computations[mc.group(1)]
    consts = {i.name: i for i in cond if i.opcode == "constant"}
    for i in cond:
        if i.opcode == "compare" and "direction=LT" in i.attrs:
            for o in i.operands:
                if o in consts:
                    v = re.search(r"constant\((-?\d+)\)", consts[o].line)
                    if v:
                        return int(v.group(1))
    return None


def multiplicities(mod: Module) -> tuple[dict[str, int], list[tuple[str, int, str]]]:
    """How many times each computation runs per execution of ENTRY; and the while loops
    as (instruction, trip count, body computation)."""
    mult: dict[str, int] = {mod.entry: 1}
    loops: list[tuple[str, int, str]] = []
    order = [mod.entry]
    seen = {mod.entry}
    i = 0
    while i < len(order):
        c = order[i]
        i += 1
        for ins in mod.computations.get(c, []):
            calls = _callees(ins, mod.computations)
            if not calls:
                continue
            trip = 1
            if ins.opcode == "while":
                t = trip_count(mod, ins)
                trip = t if t is not None else 1
                body = next((n for a, n in calls if a == "body"), "")
                loops.append((ins.name, t if t is not None else -1, body))
            for attr, callee in calls:
                k = trip if attr in ("body", "condition") else 1
                mult[callee] = mult.get(callee, 0) + mult[c] * k
                if callee not in seen:
                    seen.add(callee)
                    order.append(callee)
    return mult, loops


# ----------------------------------------------------------------------------- collectives


def _base_kind(opcode: str) -> tuple[str | None, bool]:
    for k in COLLECTIVES:
        if opcode == k:
            return k, False
        if opcode == k + "-start":
            return k, True
    return None, False


def _operand_shapes(mod: Module, ins: Instruction) -> list[Shape | None]:
    out: list[Shape | None] = []
    for o, sh in zip(ins.operands, ins.operand_shapes, strict=True):
        if sh is not None:
            out.append(sh)
        elif o in mod.by_name:
            src = mod.by_name[o]
            out.append(src.shapes[0] if len(src.shapes) == 1 else None)
        else:
            out.append(None)
    return out


def _is_convert_fusion(mod: Module, ins: Instruction) -> bool:
    """A fusion that only converts/copies/reshapes its one operand (CPU's `wrapped_convert`)."""
    mc = re.search(r"calls=%?([\w.\-]+)", ins.attrs)
    body = mod.computations.get(mc.group(1), []) if mc else []
    return (
        bool(body)
        and len(ins.operands) == 1
        and all(i.opcode in _PASS_THROUGH or i.opcode in ("parameter", "transpose") for i in body)
    )


def _direct_users(
    users: Mapping[str, list[Instruction]], name: str, tuple_index: int | None
) -> list[Instruction] | None:
    """The users of an all-reduce (of its tuple element `tuple_index`); None when a user of a
    tuple result is not a get-tuple-element."""
    frontier = []
    for u in users.get(name, []):
        if tuple_index is not None:
            if u.opcode != "get-tuple-element":
                return None
            mi = re.search(r"index=(\d+)", u.attrs)
            if not mi or int(mi.group(1)) != tuple_index:
                continue
        frontier.append(u)
    if tuple_index is not None:  # users of the gte
        frontier = [u for gte in frontier for u in users.get(gte.name, [])]
    return frontier


def _slice_verdict(mod: Module, users, u: Instruction, target: int) -> str | list:
    """For one user: "slice" (a 1/g dynamic-slice, maybe fused), its users (a pass-through
    op), or "no"."""
    out_elems = u.shapes[0].elements if len(u.shapes) == 1 else -1
    if u.opcode == "dynamic-slice" and out_elems == target:
        return "slice"
    if u.opcode == "fusion" and out_elems == target:
        mc = re.search(r"calls=%?([\w.\-]+)", u.attrs)
        if mc and any(i.opcode == "dynamic-slice" for i in mod.computations.get(mc.group(1), [])):
            return "slice"
        return "no"
    if u.opcode in _PASS_THROUGH or (u.opcode == "fusion" and _is_convert_fusion(mod, u)):
        return users.get(u.name, []) or "no"
    return "no"


def _is_sliced_by_all_users(
    mod: Module,
    users: Mapping[str, list[Instruction]],
    name: str,
    tuple_index: int | None,
    buf_elems: int,
    g: int,
) -> bool:
    """True if every use of the all-reduce (element) is a 1/g dynamic-slice (possibly fused),
    following pass-through ops (copies, converts, bitcasts) up to 8 deep."""
    if g <= 1:
        return False
    frontier = _direct_users(users, name, tuple_index)
    if not frontier:
        return False
    target = buf_elems // g
    depth = 0
    while frontier and depth < 8:
        nxt: list[Instruction] = []
        for u in frontier:
            v = _slice_verdict(mod, users, u, target)
            if v == "no":
                return False
            if v != "slice":
                nxt.extend(v)
        frontier = nxt
        depth += 1
    return not frontier


def collectives_in(
    text_or_module: str | Module, mesh_shape: Sequence[tuple[str, int]], *, normalize: bool = True
) -> tuple[ObservedCollective, ...]:
    """Every collective in an HLO module, with per-device bytes, groups, mesh axes, count."""
    mod = parse_module(text_or_module) if isinstance(text_or_module, str) else text_or_module
    mesh_shape = tuple((str(a), int(n)) for a, n in mesh_shape)
    mult, _ = multiplicities(mod)
    users = mod.users() if normalize else {}
    out: list[ObservedCollective] = []
    for comp, instrs in mod.computations.items():
        count = mult.get(comp, 0)
        if count == 0:
            continue
        for ins in instrs:
            kind, is_async = _base_kind(ins.opcode)
            if kind is not None:
                out += _observed(
                    mod, users, comp, count, ins, kind, is_async, mesh_shape, normalize
                )
    return tuple(out)


def _groups_of(ins, kind: str, mesh_shape) -> tuple[tuple, tuple[str, ...], bool, int, int]:
    """(groups, mesh axes, axes complete, group size, number of groups) of a collective."""
    if kind == "collective-permute":
        pairs = parse_source_target_pairs(ins.attrs)
        g = len({d for p in pairs if p[0] != p[1] for d in p}) or 1
        return tuple(pairs), mesh_axes_of_pairs(pairs, mesh_shape), True, g, 1
    n_dev = math.prod(n for _, n in mesh_shape)
    groups = parse_replica_groups(ins.attrs, n_dev)
    axes, complete = mesh_axes_of_groups(groups, mesh_shape)
    return groups, axes, complete, (len(groups[0]) if groups else 1), len(groups)


def _buffers(mod: Module, ins, kind: str, is_async: bool) -> tuple[list, list]:
    """Operand and result shapes of a collective (an async -start keeps only its outputs)."""
    op_shapes = _operand_shapes(mod, ins)
    if kind == "collective-permute":
        op_shapes = op_shapes[:1]
    res = list(ins.shapes)
    if is_async and kind in ("all-gather", "collective-permute", "all-to-all", "reduce-scatter"):
        # -start results are (operands..., outputs..., [scratch]); keep the outputs
        k = len(op_shapes)
        res = res[k : 2 * k] if len(res) >= 2 * k else res[-k:]
    return op_shapes, res


def _pair(kind: str, osh, rsh, g: int):
    """Operand and result shape of one buffer, each inferred from the other when missing."""
    if osh is None and rsh is not None:  # infer the operand from the result
        if kind == "all-gather":
            osh = Shape(rsh.dtype, rsh.dims)  # bytes only: output counted below
        elif kind == "reduce-scatter":
            osh = Shape(rsh.dtype, (rsh.elements * g,))
        else:
            osh = rsh
    return osh, rsh if rsh is not None else osh


def _observed(mod, users, comp, count, ins, kind, is_async, mesh_shape, normalize) -> list:
    """One ObservedCollective per buffer of collective instruction `ins`."""
    mo = re.search(r'op_name="([^"]*)"', ins.attrs)
    op_name = mo.group(1) if mo else ""
    groups, axes, complete, g, n_groups = _groups_of(ins, kind, mesh_shape)
    op_shapes, res = _buffers(mod, ins, kind, is_async)
    elems = max(len(op_shapes), len(res), 1)
    out = []
    for idx in range(elems):
        osh = op_shapes[idx] if idx < len(op_shapes) else None
        osh, rsh = _pair(kind, osh, res[idx] if idx < len(res) else None, g)
        if osh is None or rsh is None:
            continue
        # bytes: the all-gather's output, every other collective's operand
        buf = rsh if kind == "all-gather" else osh
        tidx = idx if elems > 1 else None
        k2, norm = kind, None
        if normalize and kind == "all-reduce" and not is_async:
            sliced = _is_sliced_by_all_users(
                mod, users, ins.name, tidx if ins.is_tuple else None, buf.elements, g
            )
            if sliced:
                k2, norm = "reduce-scatter", "all-reduce"
        out.append(
            ObservedCollective(
                kind=k2,
                dtype=buf.dtype,
                shape=buf.dims,
                operand_shape=osh.dims,
                result_shape=rsh.dims,
                bytes_per_device=float(buf.bytes),
                group_size=g,
                n_groups=n_groups,
                mesh_axes=axes,
                axes_complete=complete,
                count=count,
                instruction=ins.name,
                computation=comp,
                source=ins.line[:400],
                op_name=op_name,
                normalized_from=norm,
                tuple_index=tidx,
                tuple_size=elems,
                replica_groups=groups,
                async_pair=is_async,
            )
        )
    return out


# ----------------------------------------------------------------------------- FLOPs


def dot_flops_of(mod: Module, ins: Instruction) -> float | None:
    """FLOPs of one dot: 2 x (output elements) x (contracted size); None if not a readable dot."""
    if ins.opcode != "dot" or not ins.shapes:
        return None
    lhs = _operand_shapes(mod, ins)[0] if ins.operands else None
    mc = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins.attrs)
    if lhs is None or mc is None:
        return None
    k = math.prod(lhs.dims[int(d)] for d in mc.group(1).split(",") if d)
    return 2.0 * ins.shapes[0].elements * k


def dot_flops(mod: Module) -> tuple[float, dict[str, float]]:
    """The FLOPs of every dot (`dot_flops_of`), times computation counts; also the
    per-computation sums (one execution each)."""
    mult, _ = multiplicities(mod)
    per: dict[str, float] = {}
    for comp, instrs in mod.computations.items():
        per[comp] = sum(f for ins in instrs if (f := dot_flops_of(mod, ins)) is not None)
    total = sum(per[c] * mult.get(c, 0) for c in per)
    return total, per


def _bytes_estimate(mod: Module, comp: str) -> float:
    """Bytes read + written by the top-level instructions of a computation (cost-model-like)."""
    skip = {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "while",
        "call",
        "conditional",
    }
    tot = 0.0
    for ins in mod.computations.get(comp, []):
        if ins.opcode in skip:
            continue
        tot += sum(s.bytes for s in ins.shapes)
        tot += sum(s.bytes for s in _operand_shapes(mod, ins) if s is not None)
    return tot


def _inclusive(
    mod: Module, comp: str, per: Mapping[str, float], seen: set[str] | None = None
) -> float:
    """Value of a computation including what it calls (nested loops times their trips)."""
    seen = set() if seen is None else seen
    if comp in seen:
        return 0.0
    seen.add(comp)
    tot = per.get(comp, 0.0)
    for ins in mod.computations.get(comp, []):
        trip = 1
        if ins.opcode == "while":
            trip = trip_count(mod, ins) or 1
        for attr, callee in _callees(ins, mod.computations):
            k = trip if attr in ("body", "condition") else 1
            tot += k * _inclusive(mod, callee, per, seen)
    return tot


def loop_corrections(mod: Module) -> tuple[float, float, tuple[tuple[str, int], ...]]:
    """Extra (FLOPs, bytes) that cost_analysis misses because it counts each while body once:
    (trip - 1) x the body's dot FLOPs / estimated bytes (nested loops included)."""
    _, per_flops = dot_flops(mod)
    per_bytes = {c: _bytes_estimate(mod, c) for c in mod.computations}
    mult, loops = multiplicities(mod)
    extra_f = extra_b = 0.0
    out = []
    for name, trip, body in loops:
        out.append((name, trip))
        if trip <= 1 or not body:
            continue
        ins = mod.by_name[name]
        outer = mult.get(ins.computation, 1)
        extra_f += outer * (trip - 1) * _inclusive(mod, body, per_flops)
        extra_b += outer * (trip - 1) * _inclusive(mod, body, per_bytes)
    return extra_f, extra_b, tuple(out)


# ----------------------------------------------------------------------------- observe


def _cost_dict(compiled: Any) -> dict[str, float]:
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    return dict(ca or {})


def scrub(text: str) -> str:
    """Remove machine paths (source file names, dump dirs, home dirs) from HLO text."""
    text = re.sub(r'source_file="[^"]*"', 'source_file="<scrubbed>"', text)
    text = re.sub(
        r"(/(?:home|Users|tmp|work|private|var|root|opt|usr)/[^\s\"',)]*)", "<path>", text
    )
    return text


def compact(text: str, *, keep_op_name: bool = False) -> str:
    """Scrubbed HLO without stack-frame tables and metadata (for test fixtures)."""
    text = scrub(text)
    out, skipping = [], False
    for line in text.splitlines():
        if line.strip() in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            skipping = True
            continue
        if skipping:
            if not line.startswith(("%", "ENTRY")):
                continue
            skipping = False
        if keep_op_name:
            line = re.sub(
                r", metadata=\{(?:[^{}\"]|\"[^\"]*\")*?(op_name=\"[^\"]*\")?(?:[^{}\"]|\"[^\"]*\")*\}",
                lambda m: f", metadata={{{m.group(1)}}}" if m.group(1) else "",
                line,
            )
        else:
            line = re.sub(r", metadata=\{(?:[^{}\"]|\"[^\"]*\")*\}", "", line)
        out.append(line)
    return "\n".join(out) + "\n"


def observe(program: Any, *, keep_dump: str | Path | None = None) -> Observed:
    """Compile a `Program` (or (Lowered, mesh_shape)) and read its collectives and costs.

    One compile: the post-SPMD HLO comes from `xla_dump_to` filtered to the SPMD
    partitioning pass; the final HLO from `compiled.as_text()`; FLOPs and bytes from
    `compiled.cost_analysis()` (per device), corrected for loop trip counts.
    """
    import tempfile

    if isinstance(program, tuple):
        lowered, mesh_shape = program
        name = ""
    else:
        lowered = program.lower()
        mesh_shape = tuple(program.mesh.shape.items())
        name = program.name
    with tempfile.TemporaryDirectory(prefix="roofline-hlo-") as tmp:
        dump = Path(keep_dump) if keep_dump else Path(tmp)
        opts = {
            "xla_dump_to": str(dump),
            "xla_dump_hlo_pass_re": "spmd-partitioning",
            "xla_dump_hlo_as_text": True,
        }
        compiled = lowered.compile(compiler_options=opts)
        files = sorted(dump.glob("*after_spmd-partitioning*.txt"))
        if not files:
            raise VerifyError(
                "XLA wrote no post-SPMD-partitioning HLO dump",
                rule="observe() reads the module after the spmd-partitioning pass",
                fix=f"check that this jaxlib supports xla_dump_hlo_pass_re; files: "
                f"{[p.name for p in dump.iterdir()][:5]}",
            )
        post = files[-1].read_text()
    final = compiled.as_text()
    return observe_text(post, final, mesh_shape, cost=_cost_dict(compiled), program=name)


def observe_text(
    post_spmd: str,
    final: str,
    mesh_shape: Sequence[tuple[str, int]],
    *,
    cost: Mapping[str, float] | None = None,
    program: str = "",
) -> Observed:
    """`observe` from texts already in hand (fixtures, saved dumps)."""
    mesh_shape = tuple((str(a), int(n)) for a, n in mesh_shape)
    mod_post = parse_module(post_spmd)
    mod_final = parse_module(final)
    colls = collectives_in(mod_post, mesh_shape)
    colls_final = collectives_in(mod_final, mesh_shape)
    dflops, _ = dot_flops(mod_final)
    extra_f, extra_b, loops = loop_corrections(mod_final)
    cost = dict(cost or {})
    raw_f = float(cost.get("flops", float("nan")))
    raw_b = float(cost.get("bytes accessed", float("nan")))
    notes = []
    if any(t < 0 for _, t in loops):
        notes.append("a while loop's trip count could not be read; its body is counted once")
    if extra_f:
        notes.append(
            "loop-corrected flops/bytes add (trip-1) x body dot FLOPs / estimated body bytes"
        )
    return Observed(
        collectives=colls,
        collectives_final=colls_final,
        flops_per_device=raw_f + extra_f,
        bytes_accessed_per_device=raw_b + extra_b,
        flops_per_device_raw=raw_f,
        bytes_accessed_per_device_raw=raw_b,
        dot_flops_per_device=dflops,
        hlo_text_post_spmd=post_spmd,
        hlo_text_final=final,
        mesh_shape=mesh_shape,
        loops=loops,
        program=program,
        notes=tuple(notes),
    )


def to_json(obs: Observed, *, include_hlo: bool = False) -> dict[str, Any]:
    def c(x: ObservedCollective) -> dict[str, Any]:
        d = {
            k: getattr(x, k)
            for k in (
                "kind",
                "dtype",
                "shape",
                "bytes_per_device",
                "group_size",
                "mesh_axes",
                "count",
                "instruction",
                "op_name",
                "normalized_from",
                "tuple_index",
            )
        }
        d["shape"] = list(d["shape"])
        d["mesh_axes"] = list(d["mesh_axes"])
        return d

    out = {
        "program": obs.program,
        "mesh": dict(obs.mesh_shape),
        "flops_per_device": obs.flops_per_device,
        "bytes_accessed_per_device": obs.bytes_accessed_per_device,
        "flops_per_device_raw": obs.flops_per_device_raw,
        "dot_flops_per_device": obs.dot_flops_per_device,
        "loops": [list(x) for x in obs.loops],
        "collectives": [c(x) for x in obs.collectives],
        "collectives_final": [c(x) for x in obs.collectives_final],
        "notes": list(obs.notes),
    }
    if include_hlo:
        out["hlo_post_spmd"] = obs.hlo_text_post_spmd
        out["hlo_final"] = obs.hlo_text_final
    json.dumps(out)
    return out


__all__ = [
    "Shape",
    "Instruction",
    "ObservedCollective",
    "Observed",
    "describe",
    "Module",
    "parse_module",
    "parse_shapes",
    "parse_replica_groups",
    "parse_source_target_pairs",
    "mesh_axes_of_groups",
    "mesh_axes_of_pairs",
    "collectives_in",
    "dot_flops",
    "loop_corrections",
    "multiplicities",
    "trip_count",
    "observe",
    "observe_text",
    "scrub",
    "compact",
    "summarize",
    "to_json",
    "COLLECTIVES",
]


def describe(obs: Observed, *, final: bool = False) -> str:
    """A markdown table of the observed collectives (aggregated) and the FLOPs."""
    rows = summarize(obs.collectives_final if final else obs.collectives)
    lines = [
        "| kind | mesh axes | dtype | bytes/device | count | total bytes/device | note |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        note = "AR+dynamic-slice" if r["normalized_from"] else ""
        lines.append(
            f"| {r['kind']} | {','.join(r['mesh_axes']) or '-'} | {r['dtype']} | {r['bytes_per_device']:,.0f} "
            f"| {r['count']} | {r['total_bytes_per_device']:,.0f} | {note} |"
        )
    if not rows:
        lines.append("| (none) | | | | | | |")
    lines.append("")
    lines.append(
        f"FLOPs/device: cost_analysis {obs.flops_per_device_raw:,.0f}"
        + (f" (loop-corrected {obs.flops_per_device:,.0f})" if obs.loops else "")
        + f"; dot FLOPs from HLO {obs.dot_flops_per_device:,.0f}"
    )
    return "\n".join(lines)
