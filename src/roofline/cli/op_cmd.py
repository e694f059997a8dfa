"""`roofline op "bf16[B,D] @ int8[D,F]" --dims B=256,D=8192,F=32768 --chip tpu-v5e`."""

from __future__ import annotations

import argparse
import math

from roofline.cli._common import add_json, emit, parse_assignments
from roofline.core.ledger import Op
from roofline.core.opexpr import (
    bytes_formula,
    flops_formula,
    is_elementwise,
    matmul_shape,
    parse_elementwise,
    parse_op,
)
from roofline.core.roofline import (
    analyze_levels,
    analyze_on_units,
    critical_batch,
    matmul_crossover_batch,
)
from roofline.specs.chip import load_chip
from roofline.units import DTYPE_BYTES, fmt_bytes, fmt_flops, fmt_time

NAME = "op"
HELP = (
    'Roofline of one matmul/einsum, e.g. "bf16[B,D] @ int8[D,F]", or elementwise op "fp32[N] + fp32[N]" '
    "(vector units): FLOPs, bytes, intensity, bound, time, against HBM and each on-chip memory level."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "expr",
        help='op expression, e.g. "bf16[B,D] @ int8[D,F]" or "bf16[B,T,D] @ bf16[D,N,H] -> bf16[B,T,N,H]" '
        '(the rhs is the weight), or an elementwise "fp32[N] + fp32[N]"',
    )
    p.add_argument(
        "--dims", default="", help="dim sizes, e.g. B=256,D=8192,F=32768 (suffixes k, M allowed)"
    )
    p.add_argument("--chip", default="tpu-v5e", help="chip name or TOML file (default: tpu-v5e)")
    p.add_argument("--plot", metavar="FILE", help="write a roofline chart (.png, .svg or .pdf)")
    add_json(p)


def parse(expr: str, dims: dict[str, float]) -> Op:
    """A matmul (`@`) or an elementwise op (`+`)."""
    return parse_elementwise(expr, dims) if is_elementwise(expr) else parse_op(expr, dims)


def _formulas(op: Op) -> dict[str, str]:
    if matmul_shape(op) is None and not op.contracting:
        return {
            "flops": "·".join(op.out.dims) + " (one per element)",
            "bytes": bytes_formula(op)[0],
        }
    return {"flops": flops_formula(op)[0], "bytes": bytes_formula(op)[0]}


def _levels(op: Op, chip, shape) -> list[dict]:
    """The op against every memory level; a matmul's critical batch at each level's bandwidth."""
    out = []
    for lv in analyze_levels(op, chip):
        d = lv.to_dict()
        bw = lv.result.hbm_bw_bytes_per_s
        d["critical_batch"] = (
            critical_batch(chip, shape.weight_dtype, shape.activation_dtype, bw) if shape else None
        )
        out.append(d)
    return out


def result(expr: str, dims: dict[str, float], chip_name: str) -> dict:
    """Everything `op` reports, as plain data (also used by tests)."""
    chip = load_chip(chip_name)
    op = parse(expr, dims)
    r = analyze_on_units(op, chip)
    shape = matmul_shape(op)
    out = r.to_dict()
    out["chip"] = chip.name
    out["unit"] = "matrix" if op.contracting else "vector"
    out["peak_flops_per_s"] = r.peak_flops_per_s
    out["levels"] = _levels(op, chip, shape)
    out["op"] = {
        "einsum": op.einsum,
        "inputs": [str(t) for t in op.inputs],
        "output": str(op.out),
        "contracting": list(op.contracting),
        "weight": op.inputs[1].name,
    }
    out["formulas"] = _formulas(op)
    if out.get("intensity") is not None and not math.isfinite(out["intensity"]):
        out["intensity"] = None
        out["intensity_reason"] = "the op moves no HBM bytes: intensity has no finite value"
    out["batch_tokens"] = shape.tokens if shape else None
    out["critical_batch"] = (
        critical_batch(chip, shape.weight_dtype, shape.activation_dtype) if shape else None
    )
    out["crossover_batch"] = (
        matmul_crossover_batch(
            chip, shape.contract, shape.features, shape.weight_dtype, shape.activation_dtype
        )
        if shape and op.out.dtype == shape.activation_dtype
        else None
    )
    if out["crossover_batch"] is not None and not math.isfinite(out["crossover_batch"]):
        out["crossover_batch"] = None
        out["crossover_batch_reason"] = (
            "never: at these D and F the op stays memory-bound at any batch "
            "(2·D·F/C <= activation bytes·(D+F)/W)"
        )
    return out


def _text(res: dict, expr: str, dims: dict[str, float], chip_name: str) -> str:
    from roofline.report.table import kv, table

    op = parse(expr, dims)
    chip = load_chip(chip_name)
    C, W = res["peak_flops_per_s"], chip.hbm_bw_bytes_per_s
    fsym, fnum = (
        flops_formula(op)
        if op.contracting
        else ("·".join(op.out.dims), "·".join(f"{op.sizes[d]:g}" for d in op.out.dims))
    )
    bsym, bnum = bytes_formula(op)
    I, Ic = res["intensity"], res["critical_intensity"]
    rows = [
        ["FLOPs", fmt_flops(res["flops"]), f"{fsym} = {fnum}"],
        ["HBM bytes", fmt_bytes(res["bytes"]), f"{bsym} = {bnum}"],
        [
            "intensity",
            f"{I:.4g} FLOP/B",
            f"FLOPs / bytes = {res['flops']:.4g} / {res['bytes']:.4g}",
        ],
        [
            "critical intensity",
            f"{Ic:.4g} FLOP/B",
            f"C / W_hbm = {C:.3g} / {W:.3g}  ({res['compute_dtype']} compute)",
        ],
        ["T_math", fmt_time(res["t_math_s"]), f"{fsym} / {C:.3g} = {res['flops']:.4g} / {C:.3g}"],
        ["T_mem", fmt_time(res["t_mem_s"]), f"bytes / {W:.3g} = {res['bytes']:.4g} / {W:.3g}"],
        ["T_lower", fmt_time(res["time_lower_s"]), "max(T_math, T_mem)"],
        ["T_upper", fmt_time(res["time_upper_s"]), "T_math + T_mem"],
        [
            "bound",
            res["bound"],
            f"intensity {I:.4g} {'≥' if res['bound'] == 'compute' else '<'} {Ic:.4g}",
        ],
    ]
    shape = matmul_shape(op)
    if res["critical_batch"] is not None and shape is not None:
        wb = DTYPE_BYTES[shape.weight_dtype]
        rows.append(
            [
                "critical batch",
                f"{res['critical_batch']:.4g} tokens",
                f"weight bytes · C / (2·W) = {wb:g}·{C:.3g} / (2·{W:.3g})  (B ≪ D, F)",
            ]
        )
        rows.append(
            ["token batch", f"{res['batch_tokens']:g}", "product of the lhs dims not contracted"]
        )
    if res["crossover_batch"] is not None:
        cb = res["crossover_batch"]
        rows.append(
            [
                "exact crossover",
                f"{cb:.4g} tokens" if cb != float("inf") else "never",
                "B where T_math = T_mem at these D, F",
            ]
        )
    head = kv(
        [
            ("op", _describe(op)),
            ("dims", "  ".join(f"{d}={v:g}" for d, v in op.sizes.items())),
            ("chip", f"{chip.name}: {C:.3g} {_unit_text(res)}, HBM {W:.3g} B/s"),
        ]
    )
    out = head + "\n\n" + table(rows, ["quantity", "value", "arithmetic"], align="lrl")
    out += "\n\n" + _level_table(res)
    if res.get("plot"):
        out += f"\n\nplot written to {res['plot']}"
    return out


def _unit_text(res: dict) -> str:
    if res["unit"] == "matrix":
        return f"FLOP/s ({res['compute_dtype']})"
    return f"vector op/s ({res['compute_dtype']}, vector units)"


def _describe(op: Op) -> str:
    x, w = op.inputs
    if not op.contracting:
        return (
            f"{x.name} {x} + {w.name} {w} -> {op.out.name} {op.out}   (elementwise, vector units)"
        )
    return (
        f"{x.name} {x} · {w.name} {w} -> {op.out.name} {op.out}   (contracting "
        f"{', '.join(op.contracting)}; {w.name} is the weight)"
    )


def _level_table(res: dict) -> str:
    """The op with its operands in each memory level: T = max(FLOPs/C, bytes/W_level)."""
    from roofline.report.table import table

    rows = []
    for lv in res["levels"]:
        cap = "?" if lv["capacity_bytes"] is None else fmt_bytes(lv["capacity_bytes"])
        fits = {None: "", True: "yes", False: "no"}[lv["fits"]]
        cb = lv["critical_batch"]
        rows.append(
            [
                lv["level"],
                cap,
                fits,
                f"{lv['bw_bytes_per_s']:.3g}",
                f"{lv['critical_intensity']:.4g}",
                fmt_time(lv["t_mem_s"]),
                fmt_time(lv["time_lower_s"]),
                lv["bound"],
                "" if cb is None else f"{cb:.4g}",
            ]
        )
    head = ["level", "size", "fits", "W (B/s)", "C/W", "T_mem", "T_lower", "bound", "B_crit"]
    return "operands in each memory level (T_lower = max(T_math, bytes / W_level)):\n" + table(
        rows, head, align="llllrrrlr"
    )


def run(args: argparse.Namespace) -> int:
    dims = parse_assignments(args.dims, what="dims")
    res = result(args.expr, dims, args.chip)
    if args.plot:
        from roofline.report.plots import roofline_chart

        chip = load_chip(args.chip)
        op = parse(args.expr, dims)
        res["plot"] = str(
            roofline_chart([(args.expr, analyze_on_units(op, chip))], chip, args.plot)
        )
    inputs = {"expr": args.expr, "dims": dims, "chip": res["chip"]}
    return emit(args, NAME, inputs, res, _text(res, args.expr, dims, args.chip))
