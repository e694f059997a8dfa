"""`roofline collective KIND`: time of one collective over mesh axes on a system.

Example (book gpus.md pop quiz 1, ~65 µs):
    roofline collective all-gather --array "bf16[1024,16384]" --sharding "[B_X, F]" --over X --mesh X=8 --system h100:8
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from roofline.cli._common import MAX_DIM, add_json, add_wraparound, emit, number_flag
from roofline.core.collectives import CollectiveKind, collective_cost, parse_collective_kind
from roofline.core.mesh import Mesh, make_mesh
from roofline.errors import PlanError, ShardingError, SpecError
from roofline.report.table import kv, table
from roofline.specs.system import parse_system
from roofline.units import dtype_bytes, fmt_bytes, fmt_rate, fmt_time, parse_dtype, parse_quantity

NAME = "collective"
HELP = (
    "time an AllGather / ReduceScatter / AllReduce / AllToAll / permute over mesh axes on a system"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "kind",
        metavar="KIND",
        help="all-gather (AG), reduce-scatter (RS), all-reduce (AR), all-to-all (A2A), permute",
    )
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument(
        "--array", metavar="DTYPE[dims]", help='the whole (global) array, e.g. "bf16[1024,16384]"'
    )
    size.add_argument(
        "--bytes",
        metavar="N",
        help="bytes per chip directly (see the convention in `roofline.core.collectives`), e.g. 32M",
    )
    p.add_argument(
        "--sharding",
        metavar="[D_X, F]",
        help='book notation: one entry per array dim, subscripts name mesh axes, e.g. "[B_X, F]" or "[B_XY, D]"',
    )
    p.add_argument(
        "--over", required=True, metavar="AXES", help="mesh axes of the collective: X, XY or X,Y"
    )
    p.add_argument(
        "--mesh",
        metavar="X=8,Y=4",
        help="mesh axes and sizes (default: one axis named --over spanning the system)",
    )
    p.add_argument(
        "--system",
        required=True,
        metavar="SPEC",
        help="tpu-v5e:8x4, h100:8, 2xtpu-v5p:16x20x28, a .toml, ...",
    )
    p.add_argument(
        "--sharp",
        action="store_true",
        default=None,
        help="in-network reduction for AllReduce (SHARP)",
    )
    p.add_argument(
        "--sharp-speedup",
        type=float,
        default=None,
        metavar="X",
        help="measured SHARP gain over the ring AllReduce (book: 1.3); default: theory",
    )
    p.add_argument(
        "--ragged",
        type=float,
        default=1.0,
        metavar="FRACTION",
        help="AllToAll: fraction actually sent (MoE top-k: min(k/N,1))",
    )
    add_wraparound(p)
    add_json(p)


def parse_array(text: str) -> tuple[str, tuple[int, ...]]:
    """'bf16[1024,16384]' -> ('bf16', (1024, 16384))."""
    m = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*\[\s*(.*?)\s*\]\s*", text or "")
    if not m:
        raise SpecError(
            f"cannot read array {text!r}",
            rule="an array is DTYPE[d0,d1,...]",
            fix='write e.g. "bf16[1024,16384]"',
        )
    dt = parse_dtype(m.group(1))
    dims = []
    for part in [p for p in re.split(r"\s*,\s*", m.group(2)) if p]:
        v = parse_quantity(part, what="array dim")
        if v != int(v) or not 0 < v <= MAX_DIM:
            raise SpecError(
                f"array {text!r}: dim {part!r}",
                rule=f"array dims are positive whole numbers up to {MAX_DIM:,} (2^40)",
                fix="e.g. bf16[1024,16384]",
            )
        dims.append(int(v))
    if len(dims) > 8 or math.prod(dims) > MAX_DIM**2:
        raise SpecError(
            f"array {text!r} has {math.prod(dims):.3g} elements",
            rule="an array has at most 8 dims and 2^80 elements (beyond that nothing is physical)",
            fix='write e.g. "bf16[1024,16384]"',
        )
    if not dims:
        raise SpecError(
            f"array {text!r} has no dims",
            rule="an array is DTYPE[d0,d1,...]",
            fix='write e.g. "bf16[1024,16384]"',
        )
    return dt, tuple(dims)


def parse_sharding(text: str, mesh: Mesh) -> list[tuple[str, tuple[str, ...]]]:
    """'[B_X, F]' -> [('B', ('X',)), ('F', ())]; subscripts split into mesh axis names ('XY' -> X, Y)."""
    m = re.fullmatch(r"\s*\[\s*(.*?)\s*\]\s*", text or "")
    if not m:
        raise ShardingError(
            f"cannot read sharding {text!r}",
            rule="a sharding is [DIM, DIM_AXES, ...] in the book's notation",
            fix='write e.g. "[B_X, F]" or "[B_XY, D]"',
        )
    out = []
    used: list[str] = []
    for item in [p for p in re.split(r"\s*,\s*", m.group(1)) if p]:
        im = re.fullmatch(
            r"([A-Za-z][A-Za-z0-9]*)(?:_\{?\(?([A-Za-z0-9_,\s]+?)\)?\}?)?", item.strip()
        )
        if not im:
            raise ShardingError(
                f"cannot read sharding entry {item!r} in {text!r}",
                rule="entries are DIM or DIM_AXES, e.g. B_X",
                fix='write e.g. "[B_X, F]"',
            )
        axes = mesh.resolve_axes(im.group(2)) if im.group(2) else ()
        for a in axes:
            if a in used:
                raise ShardingError(
                    f"sharding {text!r} uses mesh axis {a!r} twice",
                    rule="a mesh axis shards at most one dim (book: A[I_X, J_X] is forbidden)",
                    fix="drop one of them",
                )
            used.append(a)
        out.append((im.group(1), axes))
    return out


def bytes_per_chip_for(
    kind: CollectiveKind,
    total_bytes: float,
    sharding: list[tuple[str, tuple[str, ...]]],
    over: tuple[str, ...],
    mesh: Mesh,
) -> float:
    """Per-chip bytes under the collectives convention: AG output / RS input = full / (axes other than `over`); others = local shard."""
    sharded = [a for _, axes in sharding for a in axes]
    if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER):
        missing = [a for a in over if a not in sharded]
        if missing:
            what = (
                "AllGather"
                if kind is CollectiveKind.ALL_GATHER
                else "ReduceScatter (sharding = the output's)"
            )
            raise ShardingError(
                f"{what} over {','.join(over)} but axis {missing[0]!r} does not shard the array",
                rule="an AllGather removes subscripts the array has; a ReduceScatter adds them to its output",
                fix=f"add _{missing[0]} to a dim of --sharding, or gather over the axes it has",
            )
        return total_bytes / mesh.size(tuple(a for a in sharded if a not in over))
    if kind is CollectiveKind.ALL_REDUCE:
        both = [a for a in over if a in sharded]
        if both:
            raise ShardingError(
                f"AllReduce over {','.join(over)} of an array sharded over {both[0]!r}",
                rule="an AllReduce sums partial results over its axes; those axes cannot also shard the array",
                fix="drop that subscript (the sum is {U_X}, not a sharding), or use reduce-scatter",
            )
    return total_bytes / mesh.size(tuple(sharded))


def _mesh(args: argparse.Namespace, system) -> Mesh:
    if args.mesh:
        return make_mesh(system, args.mesh)
    over_names = [p for p in re.split(r"[,\s]+", args.over.strip()) if p]
    if len(over_names) != 1:
        raise PlanError(
            f"--over {args.over!r} without --mesh",
            rule="without --mesh the mesh is one axis named by --over",
            fix="give --mesh, e.g. --mesh X=8,Y=4",
        )
    return make_mesh(system, {over_names[0]: system.n_chips})


def _array_bytes(args: argparse.Namespace, kind, over, mesh: Mesh) -> tuple[float, float]:
    """(bytes per chip, total bytes) of --array with --sharding."""
    dt, shape = parse_array(args.array)
    total = math.prod(shape) * dtype_bytes(dt)
    sharding = (
        parse_sharding(args.sharding, mesh)
        if args.sharding
        else [(f"d{i}", ()) for i in range(len(shape))]
    )
    if len(sharding) != len(shape):
        raise ShardingError(
            f"sharding {args.sharding!r} has {len(sharding)} entries but array {args.array!r} has {len(shape)} dims",
            rule="one sharding entry per array dim",
            fix="list every dim, e.g. [B_X, F]",
        )
    for (dname, axes), n in zip(sharding, shape, strict=True):
        k = mesh.size(axes)
        if n % k:
            raise ShardingError(
                f"dim {dname} = {n} of {args.array!r} is not divisible by {'x'.join(axes)} = {k}",
                rule="a sharded dim divides evenly over its mesh axes",
                fix="pick sizes that divide",
            )
    return bytes_per_chip_for(kind, total, sharding, over, mesh), total


def run(args: argparse.Namespace) -> int:
    kind = parse_collective_kind(args.kind)
    system = parse_system(args.system, sharp=args.sharp, wraparound=args.wraparound)
    mesh = _mesh(args, system)
    over = mesh.resolve_axes(args.over)
    inputs: dict[str, Any] = {
        "kind": kind.value,
        "system": args.system,
        "mesh": mesh.spec(),
        "over": list(over),
    }
    if args.array:
        b, total = _array_bytes(args, kind, over, mesh)
        inputs.update(array=args.array, sharding=args.sharding, total_bytes=total)
    else:
        b = number_flag(args.bytes, "bytes", lo=0.0, lo_open=False, hi=1e18, example="32M")
        inputs["bytes"] = b
    ragged = number_flag(args.ragged, "ragged", hi=1.0, example="0.25")
    speedup = (
        None
        if args.sharp_speedup is None
        else number_flag(args.sharp_speedup, "sharp-speedup", hi=100.0, example="1.3")
    )
    cost = collective_cost(kind, b, over, mesh, ragged_fraction=ragged, sharp_speedup=speedup)
    result = cost.to_dict()
    result["placement"] = mesh.describe()
    result["system"] = system.name
    if cost.time_s <= 0:  # group of 1 or nothing to send: bytes / 0 s has no value
        result["algo_bw_bytes_per_s"] = None
        result["algo_bw_bytes_per_s_reason"] = "no communication (a group of 1 or 0 bytes): 0 s"
    bps = lambda v: fmt_rate(v, "B/s")  # noqa: E731
    text = kv(
        [
            ("collective", f"{kind.value} over {','.join(over)} (group of {cost.group_size})"),
            ("mesh", mesh.describe()),
            (
                "system",
                f"{system.name} ({system.description})" if system.description else system.name,
            ),
            ("bytes per chip", fmt_bytes(b)),
            ("wire bytes per chip", fmt_bytes(cost.wire_bytes_per_chip)),
            ("time", fmt_time(cost.time_s)),
            ("  bandwidth term", fmt_time(cost.bandwidth_s)),
            ("  latency term", fmt_time(cost.latency_s)),
            (
                "bound by",
                f"latency (hops; bandwidth would be {cost.bottleneck})"
                if cost.latency_bound
                else cost.bottleneck,
            ),
            (
                "effective bandwidth",
                bps(cost.algo_bw_bytes_per_s) if cost.time_s > 0 else "- (no communication)",
            ),
            ("latency-bound below", fmt_bytes(cost.latency_bound_below_bytes) + " per chip"),
        ]
    )
    if cost.tiers:
        text += "\n\nStages (innermost first; bandwidth term = max, latency = sum):\n" + table(
            [
                (t.name, t.size, t.inner, bps(t.bytes_per_s), fmt_time(t.latency_s), t.detail)
                for t in cost.tiers
            ],
            ["stage", "D_i", "P_i-1", "B/s", "latency", "arithmetic"],
            align="lrrrrl",
        )
    text += "\n\n" + cost.formula
    return emit(args, NAME, inputs, result, text)
