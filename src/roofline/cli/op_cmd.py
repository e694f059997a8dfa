"""`roofline op "bf16[B,D] @ int8[D,F]" --dims B=256,D=8192,F=32768 --chip tpu-v5e`."""

from __future__ import annotations

import argparse
import math

from roofline.cli._common import add_json, emit, parse_assignments
from roofline.core.opexpr import bytes_formula, flops_formula, matmul_shape, parse_op
from roofline.core.roofline import analyze_op, critical_batch, matmul_crossover_batch
from roofline.specs.chip import load_chip
from roofline.units import DTYPE_BYTES, fmt_bytes, fmt_flops, fmt_time

NAME = "op"
HELP = 'Roofline of one matmul/einsum, e.g. "bf16[B,D] @ int8[D,F]": FLOPs, bytes, intensity, bound, time.'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "expr",
        help='op expression, e.g. "bf16[B,D] @ int8[D,F]" or "bf16[B,T,D] @ bf16[D,N,H] -> bf16[B,T,N,H]"; '
        "the rhs is the weight",
    )
    p.add_argument(
        "--dims", default="", help="dim sizes, e.g. B=256,D=8192,F=32768 (suffixes k, M allowed)"
    )
    p.add_argument("--chip", default="tpu-v5e", help="chip name or TOML file (default: tpu-v5e)")
    p.add_argument("--plot", metavar="FILE", help="write a roofline chart (.png, .svg or .pdf)")
    add_json(p)


def result(expr: str, dims: dict[str, float], chip_name: str) -> dict:
    """Everything `op` reports, as plain data (also used by tests)."""
    chip = load_chip(chip_name)
    op = parse_op(expr, dims)
    r = analyze_op(op, chip)
    shape = matmul_shape(op)
    out = r.to_dict()
    out["chip"] = chip.name
    out["op"] = {
        "einsum": op.einsum,
        "inputs": [str(t) for t in op.inputs],
        "output": str(op.out),
        "contracting": list(op.contracting),
        "weight": op.inputs[1].name,
    }
    out["formulas"] = {"flops": flops_formula(op)[0], "bytes": bytes_formula(op)[0]}
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

    op = parse_op(expr, dims)
    chip = load_chip(chip_name)
    C, W = chip.peak(res["compute_dtype"]), chip.hbm_bw_bytes_per_s
    fsym, fnum = flops_formula(op)
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
    x, w = op.inputs
    head = kv(
        [
            (
                "op",
                f"{x.name} {x} · {w.name} {w} -> {op.out.name} {op.out}   (contracting {', '.join(op.contracting)}; "
                f"{w.name} is the weight)",
            ),
            ("dims", "  ".join(f"{d}={v:g}" for d, v in op.sizes.items())),
            ("chip", f"{chip.name}: {C:.3g} FLOP/s ({res['compute_dtype']}), HBM {W:.3g} B/s"),
        ]
    )
    out = head + "\n\n" + table(rows, ["quantity", "value", "arithmetic"], align="lrl")
    if res.get("plot"):
        out += f"\n\nplot written to {res['plot']}"
    return out


def run(args: argparse.Namespace) -> int:
    dims = parse_assignments(args.dims, what="dims")
    res = result(args.expr, dims, args.chip)
    if args.plot:
        from roofline.report.plots import roofline_chart

        chip = load_chip(args.chip)
        op = parse_op(args.expr, dims)
        res["plot"] = str(roofline_chart([(args.expr, analyze_op(op, chip))], chip, args.plot))
    inputs = {"expr": args.expr, "dims": dims, "chip": res["chip"]}
    return emit(args, NAME, inputs, res, _text(res, args.expr, dims, args.chip))
