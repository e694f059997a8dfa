"""`roofline limits --model llama-3-70b --system tpu-v5p:16x16x16 --batch 4M --strategy fsdp+tp`."""

from __future__ import annotations

import argparse

from roofline.cli._common import add_json, emit, model_source, number_flag
from roofline.core.limits import LimitsReport, LimitStrategy, limits
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system

NAME = "limits"
HELP = (
    "the book's closed-form limits: smallest batch per chip for FSDP / TP / FSDP+TP / ZeRO-3+PP / EP, "
    "widest TP, most chips for a batch, decode critical batch, break-even points"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-3-70b", help="preset name or config.json")
    p.add_argument("--system", default="tpu-v5p:16x16x16", help="e.g. tpu-v5p:16x16x16, h100:1024")
    p.add_argument(
        "--batch",
        help="global batch in tokens (training) or decode batch per replica (e.g. 4M, 64); "
        "with it each limit says on which side the run is",
    )
    p.add_argument(
        "--strategy",
        choices=[s.value for s in LimitStrategy],
        help="only this strategy's limits (default: all)",
    )
    p.add_argument(
        "--plan",
        help='degrees to evaluate at, e.g. "fsdp=256,tp=16" (default: TP on the innermost axis, '
        "FSDP on the rest, 8 pipeline stages)",
    )
    p.add_argument("--weight-dtype", help="weight dtype for decode limits (default: the chip's)")
    p.add_argument("--activation-dtype", help="activation dtype (default: the chip's)")
    add_json(p)


def _batch(args: argparse.Namespace) -> float | None:
    return None if args.batch is None else number_flag(args.batch, "batch", hi=1e15, example="4M")


def result(args: argparse.Namespace) -> LimitsReport:
    batch = _batch(args)
    return limits(
        load_model(args.model),
        parse_system(args.system),
        strategy=args.strategy,
        batch_tokens=batch,
        plan=args.plan,
        weight_dtype=args.weight_dtype,
        activation_dtype=args.activation_dtype,
    )


def render(rep: LimitsReport) -> str:
    """Book style: each limit as formula = substitution = value, the regimes either side."""
    out = [
        f"{rep.model} on {rep.system}: C = {rep.compute_flops_per_s:.4g} FLOP/s per chip",
        "plans: " + "; ".join(f"{k}: {v}" for k, v in rep.plans.items()),
        "",
    ]
    for lim in rep.limits:
        out.append(lim.title)
        out.append(f"  {lim.formula}")
        out.append(f"    = {lim.substitution} = {lim.value:.4g} {lim.unit}")
        out.append(f"  below: {lim.below}; above: {lim.above}")
        if lim.side is not None:
            out.append(f"  asked: {lim.at:.4g} {lim.unit} -> {lim.side}")
        if lim.note:
            out.append(f"  note: {lim.note}")
        out.append("")
    for k, why in rep.skipped.items():
        out.append(f"skipped {k}: {why}")
    return "\n".join(out).rstrip()


def run(args: argparse.Namespace) -> int:
    rep = result(args)
    inputs = {
        "model": rep.model,
        **model_source(args.model),
        "system": rep.system,
        "batch_tokens": _batch(args),
        "strategy": args.strategy,
        "plan": args.plan,
    }
    return emit(args, NAME, inputs, rep.to_dict(), render(rep))
