"""`roofline matmul`: one sharded matmul in the book's notation: case, collectives, times.

Example (book sharding.md / training.md, FSDP forward on a v5e 16x16):
    roofline matmul "In[B_X, D] * W[D_X, F] -> Out[B_X, F]" --dims B=4096,D=8192,F=32768 \\
        --mesh X=16,Y=16 --system tpu-v5e:16x16 [--dtype bf16] [--backward] [--json]

The analysis (every legal option costed, the chosen one, the book's textbook option) is
`roofline.core.matmul.analyze_matmul`; this module only prints it.
"""

from __future__ import annotations

import argparse
from typing import Any

from roofline.cli._common import add_json, emit, parse_assignments
from roofline.core.matmul import analyze_matmul
from roofline.report.table import kv, table
from roofline.units import fmt_bytes, fmt_flops, fmt_rate, fmt_time

NAME = "matmul"
HELP = (
    'one sharded matmul in the book\'s notation, e.g. "In[B_X, D] * W[D_X, F] -> Out[B_X, F]": '
    "case, local shapes, collectives, times, alternatives"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "expr",
        metavar="EINSUM",
        help='book notation: "In[B_X, D] * W[D_X, F] -> Out[B_X, F]"; subscripts are mesh axes '
        "(I_XY = X then Y, B_{data,fsdp} for long names), {U_X} marks an unreduced output",
    )
    p.add_argument(
        "--dims",
        required=True,
        metavar="B=4096,...",
        help="every dim's global size (k, M suffixes allowed)",
    )
    p.add_argument(
        "--mesh",
        required=True,
        metavar="X=16,Y=16",
        help="mesh axes and sizes (multiply to the chips)",
    )
    p.add_argument(
        "--system",
        required=True,
        metavar="SPEC",
        help="tpu-v5e:16x16, tpu-v5p:4x4x4, h100:64, a .toml, ...",
    )
    p.add_argument(
        "--dtype", default="bf16", help="dtype of both operands and the output (default bf16)"
    )
    p.add_argument(
        "--backward", action="store_true", help="also plan the two gradient einsums (dLHS and dRHS)"
    )
    add_json(p)


# ------------------------------------------------------------------------------------------
# Human output
# ------------------------------------------------------------------------------------------


def _shape_str(shape: list[Any]) -> str:
    return "[" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in shape) + "]"


def _shapes_block(d: dict[str, Any]) -> str:
    lhs, rhs, out = d["specs"]["lhs"], d["specs"]["rhs"], d["specs"]["out"]
    mm = d["matmul"]
    shapes = list(d["local_shapes"].values())
    rows = [
        [name, spec, _shape_str(shape), mm[name], _shape_str(mm["local_shapes"][name])]
        for name, spec, shape in (
            ("lhs", lhs, shapes[0]),
            ("rhs", rhs, shapes[1]),
            ("out", out, shapes[2]),
        )
    ]
    return "Local shapes per chip (as given, and as they meet in the local matmul):\n" + table(
        rows, ["", "sharding", "local shape", "at the matmul", "local shape"], align="lllll"
    )


def _collectives_block(d: dict[str, Any]) -> str:
    if not d["collectives"]:
        return "Collectives: none (the output follows the inputs' shardings)"
    crow = [
        [
            c["name"],
            f"{c['before']} -> {c['after']}",
            fmt_bytes(c["bytes"]),
            fmt_time(c["time_s"]),
            c["why"],
        ]
        for c in d["collectives"]
    ]
    return (
        "Collectives (bytes per chip: AllGather output, ReduceScatter input, AllReduce/AllToAll buffer):\n"
        + table(crow, ["collective", "arrays", "bytes/chip", "time", "why"], align="llrrl")
    )


def _times_block(d: dict[str, Any]) -> str:
    peak, hbm = d["_peak"], d["_hbm"]
    comm_sum = " + ".join(f"{c['name']} {fmt_time(c['time_s'])}" for c in d["collectives"]) or "0"
    trows = [
        [
            "compute",
            fmt_time(d["compute_time_s"]),
            f"FLOPs/chip / peak = {fmt_flops(d['flops_per_chip'])} / {fmt_rate(peak)}",
        ],
        [
            "memory",
            fmt_time(d["memory_time_s"]),
            f"HBM bytes/chip / bandwidth = {fmt_bytes(d['hbm_bytes_per_chip'])} / {fmt_rate(hbm, 'B/s')} "
            "(both operands + output, once)",
        ],
        ["communication", fmt_time(d["comm_time_s"]), f"sum of collectives = {comm_sum}"],
        [
            "lower bound",
            fmt_time(d["time_lower_s"]),
            f"max of the three (perfect overlap): {d['bound']}-bound",
        ],
        ["upper bound", fmt_time(d["time_upper_s"]), "sum of the three (no overlap)"],
    ]
    return table(trows, ["time", "value", "arithmetic"], align="lrl")


def _alternatives_block(d: dict[str, Any]) -> list[str]:
    alts = d["alternatives"]
    if not alts:
        return []

    def row(label: str, a: dict[str, Any]) -> list[str]:
        return [
            label,
            a["strategy"],
            fmt_time(a["comm_time_s"]),
            fmt_time(a["compute_time_s"]),
            fmt_time(a["time_lower_s"]),
        ]

    arow = [row("chosen", d)] + [row(f"alt {i + 1}", a) for i, a in enumerate(alts)]
    listing = "Options costed (time = max(compute, memory, comm)):\n" + table(
        arow, ["", "strategy", "comm", "compute", "time"], align="llrrr"
    )
    nxt = min(alts, key=lambda a: a["time_lower_s"])
    ratio = nxt["time_lower_s"] / d["time_lower_s"] if d["time_lower_s"] > 0 else float("inf")
    why = (
        f"chosen because its time {fmt_time(d['time_lower_s'])} ({d['bound']}-bound) is the lowest; "
        f"next best: {nxt['strategy']} at {fmt_time(nxt['time_lower_s'])} ({nxt['bound']}-bound, "
        f"{ratio:.3g}x)"
    )
    if not d["chosen_is_textbook"] and d["textbook_strategy"]:
        why += f". The book's textbook strategy for this case is: {d['textbook_strategy']}"
    return [listing, why + "."]


def _einsum_text(d: dict[str, Any], title: str) -> str:
    head = kv([(title, d["expr"]), ("case", d["case"]), ("strategy", d["strategy"])])
    lines = [head, _shapes_block(d), _collectives_block(d), _times_block(d)]
    lines.append(f"replication of the output: {d['replication']:g} chips hold each block")
    lines += _alternatives_block(d)
    return "\n\n".join(lines)


def text(res: dict[str, Any]) -> str:
    head = kv(
        [
            (
                "system",
                f"{res['system']}: {fmt_rate(res['peak_flops_per_s'])} ({res['dtype']}), "
                f"HBM {fmt_rate(res['hbm_bw_bytes_per_s'], 'B/s')} per chip",
            ),
            ("mesh", f"{res['mesh']} ({res['n_chips']} chips): {res['placement']}"),
        ]
    )
    parts = [head]
    extra = {"_peak": res["peak_flops_per_s"], "_hbm": res["hbm_bw_bytes_per_s"]}
    parts.append(_einsum_text({**res, **extra}, "einsum"))
    for i, b in enumerate(res.get("backward", [])):
        parts.append("-" * 72)
        parts.append(_einsum_text({**b, **extra}, f"backward {i + 1}"))
    if res.get("backward"):
        tr = res.get("transposes") or []
        parts.append(
            "Transposes: "
            + (
                "; ".join(tr)
                if tr
                else "no forward AllGather of an input to pair with a backward "
                "ReduceScatter of its gradient"
            )
        )
    return "\n\n".join(parts)


def run(args: argparse.Namespace) -> int:
    dims = parse_assignments(args.dims, what="dims")
    res = analyze_matmul(args.expr, dims, args.mesh, args.system, args.dtype, args.backward)
    inputs = {
        "expr": args.expr,
        "dims": dims,
        "mesh": args.mesh,
        "system": args.system,
        "dtype": res["dtype"],
        "backward": bool(args.backward),
    }
    return emit(args, NAME, inputs, res, text(res))
