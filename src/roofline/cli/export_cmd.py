"""`roofline export --to STACK`: write a plan as the file or command line that stack runs.

The plan is `--plan` (roofline's vocabulary) or, without it, the best plan of `train`'s own
search on `--system` (`search_plans`). Where the stack cannot say the plan, the
error names what it lacks. `roofline import` of the exported text gives the same plan back.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from roofline.cli._common import add_json, check_output_path, emit
from roofline.cli._profile import add_profile_arg
from roofline.cli.train_cmd import search_plans, stack_and_profile
from roofline.core.stack import stack_of
from roofline.errors import SpecError
from roofline.launch import WRITERS, LaunchConfig, LaunchKind, LaunchWorkload, write_launch
from roofline.launch.base import LaunchError, stack_module
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.units import parse_quantity

NAME = "export"
HELP = "write a plan as a stack's own launch file: torchtitan TOML, MaxText command, Megatron-LM script, NeMo YAML, DeepSpeed JSON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", required=True, choices=list(WRITERS), help="the stack to write for")
    p.add_argument(
        "--plan",
        help='the plan, e.g. "fsdp=64,tp=8,microbatch=4,remat=full" (default: train\'s best plan on --system)',
    )
    p.add_argument(
        "--model", default="llama-3-70b", help="preset name or config.json (default llama-3-70b)"
    )
    p.add_argument(
        "--system",
        default="tpu-v5p:16x20x28",
        help="the system train's search plans for (without --plan)",
    )
    p.add_argument("--chips", help="only these chip counts of the system's sub-slices (search)")
    p.add_argument(
        "--batch-tokens", default=str(4 * 2**20), help="global batch in tokens (default 4Mi)"
    )
    p.add_argument("--seq", type=int, default=4096, help="sequence length (default 4096)")
    p.add_argument("--steps", type=int, help="training steps to write (default: none written)")
    p.add_argument(
        "--precision",
        metavar="RECIPE",
        help="the stack's precision recipe, e.g. fp8 (default bf16)",
    )
    p.add_argument(
        "--optimizer",
        help="optimizer policy (default: what the target stack keeps, e.g. adam-fp32-master for Megatron)",
    )
    p.add_argument(
        "--objective", choices=("cost", "time"), default=None, help="search objective (as train)"
    )
    p.add_argument(
        "--top",
        type=int,
        default=20,
        help="without --plan: export the best of train's top plans the stack can express (default 20)",
    )
    p.add_argument("--no-sub-slices", action="store_true", help="search exactly the given system")
    add_profile_arg(p)
    p.add_argument("--price", type=float, help="override USD per chip-hour")
    p.add_argument("--out", metavar="FILE", help="write the launch file here (default: print it)")
    add_json(p)


def _workload(args: argparse.Namespace) -> Workload:
    batch = parse_quantity(args.batch_tokens, what="batch-tokens")
    work = Workload(batch, args.seq, float(batch * (args.steps or 0)))
    work.require_whole_sequences()
    return work


def _plans(args: argparse.Namespace, model, work: Workload) -> list:
    """The plans to try, best first: --plan (with the target's optimizer and precision), or
    train's top plans for the target stack."""
    mod = stack_module(args.to)
    if mod.KIND != LaunchKind.TRAINING:  # vllm, sglang, trtllm: no training plan to write
        raise LaunchError(
            f"export --to {args.to}: {args.to} is a serving engine and export writes a "
            "training plan",
            rule="export --to takes a training stack (torchtitan, maxtext, megatron, nemo, "
            "deepspeed); roofline serve costs serving plans",
            fix="pick a training stack for --to",
        )
    args.optimizer = args.optimizer or mod.OPTIMIZER
    dtypes = stack_of(mod.PROFILE).dtypes(args.precision) if args.precision else None
    if args.plan:
        plan = parse_plan(
            args.plan if "optimizer" in args.plan else args.plan + f",optimizer={args.optimizer}"
        )
        return [
            replace(plan, dtypes=dtypes) if dtypes is not None and plan.dtypes.is_default else plan
        ]
    system = parse_system(args.system, usd_per_chip_hour=args.price)
    if args.objective is None:
        args.objective = "cost" if system.usd_per_chip_hour is not None else "time"
    args.framework = mod.PROFILE
    stack, eff = stack_and_profile(args, system.chip)
    return [c.plan for c in search_plans(args, model, system, work, eff, stack, dtypes).top]


def _first_expressible(args: argparse.Namespace, plans: list, work: Workload) -> tuple:
    """(config, text, the better plans skipped with what the stack lacks for each)."""
    skipped: list[str] = []
    for plan in plans:
        config = LaunchConfig(
            stack=args.to,
            kind=LaunchKind.TRAINING,
            model=args.model,
            plan=plan,
            workload=LaunchWorkload(
                seq_len=work.seq_len,
                global_batch_sequences=int(work.sequences),
                train_steps=args.steps,
            ),
            options={"precision": args.precision} if args.precision else {},
        )
        try:
            return config, write_launch(config, args.to), skipped
        except LaunchError as e:
            if len(plans) == 1:
                raise
            skipped.append(f"{plan.describe()}: {e.what}")
    raise LaunchError(
        f"none of train's top {len(plans)} plans can be written for {args.to}: "
        + "; ".join(skipped[:3]),
        rule="an export writes only what the stack's own configuration can say",
        fix="raise --top, or give --plan",
    )


def run(args: argparse.Namespace) -> int:
    check_output_path(args.out, "--out")  # before train's search, not at the write
    model = load_model(args.model)
    work = _workload(args)
    config, text, skipped = _first_expressible(args, _plans(args, model, work), work)
    plan = config.plan
    if args.out:
        try:
            Path(args.out).write_text(text)
        except OSError as e:
            raise SpecError(
                f"cannot write {args.out}: {e.strerror}",
                rule="--out names a file roofline can write",
                fix="pick a writable path",
            ) from None
    inputs = {"to": args.to, "model": model.name, "plan": args.plan, "out": args.out}
    doc = {
        "stack": args.to,
        "kind": "training",
        "plan": plan.to_dict(),
        "workload": config.workload.to_dict(),
        "skipped": skipped,
        "text": text,
    }
    shown = f"wrote {args.out} ({args.to}: {plan.describe()})" if args.out else text.rstrip("\n")
    if skipped and not args.json:  # on stderr: stdout stays the launch file
        for s in skipped:
            print(
                f"roofline export: skipped a better plan {args.to} cannot express: {s}",
                file=sys.stderr,
            )
    return emit(args, NAME, inputs, doc, shown)
