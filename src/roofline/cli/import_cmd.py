"""`roofline import FILE`: read a stack's own launch file and cost it as `train --plan` does.

Serving launch lines (vLLM, SGLang, TensorRT-LLM) are costed through `serve`'s own search
with the plan fixed (`serve_cmd.cost_serving`, as `serve --plan` runs it), with the engine's
profile as the file sets it (`engine_profile`: its sequence and token limits, memory
fraction, ...) and serve's load flags (`--concurrency`, `--rate`, `--prompt`, `--gen`, ...).

It prints what it read (the plan in roofline's vocabulary, the workload, the model), every
default the stack filled (with the stack's source), every setting it could not express and
the problems the file has as written; with `--system` it then costs the plan through
`train`'s own one-plan path (`cost_one_plan`), the same tables and JSON.
docs/launch.md lists the formats and each stack's semantics.
"""

from __future__ import annotations

import argparse
from typing import Any

from roofline.cli._common import add_json, emit, int_flag
from roofline.cli._profile import add_profile_arg, resolve_profile
from roofline.cli.train_cmd import cost_one_plan, stack_and_profile
from roofline.errors import PlanError
from roofline.launch import STACK_MODULES, LaunchConfig, LaunchKind, read_launch
from roofline.launch.common import resolve_model
from roofline.launch.serving_common import engine_profile, serve_argv
from roofline.report.table import kv
from roofline.serving.search import Objective
from roofline.specs.catalog import read_text_file
from roofline.specs.plan import Workload
from roofline.specs.system import parse_system
from roofline.units import parse_quantity

NAME = "import"
HELP = "read a stack's launch file (torchtitan, MaxText, Megatron-LM, NeMo, DeepSpeed; vLLM, SGLang, TensorRT-LLM) and cost it as train --plan / serve --plan do"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="the launch file: TOML, YAML, JSON, a shell script or command line")
    p.add_argument(
        "--stack",
        choices=STACK_MODULES,
        help="the file's stack (default: detected from its format)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--system", help="cost it on this system, e.g. h100:128 or tpu-v5p:8x8x8")
    where.add_argument(
        "--chips", help="the devices the file runs on (resolves -1 degrees; no costing)"
    )
    p.add_argument("--model", help="the model when the file does not name one the catalog knows")
    p.add_argument("--seq", type=int, help="sequence length when the file does not state one")
    p.add_argument(
        "--tokens", help="training tokens for run time and cost (default: the file's steps × batch)"
    )
    _add_serving_arguments(p)
    add_profile_arg(p)
    p.add_argument("--price", type=float, help="override USD per chip-hour")
    add_json(p)


# serve's load flags a serving file is costed with (passed to serve's own parser as given)
SERVE_LOAD_FLAGS = ("prompt", "gen", "concurrency", "rate", "slo-ttft", "slo-tpot", "objective")


def _add_serving_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serving files: the load, as roofline serve takes it")
    for flag in SERVE_LOAD_FLAGS[:-1]:
        g.add_argument(f"--{flag}", help=f"serve's --{flag} (default: serve's)")
    g.add_argument(
        "--objective",
        choices=[o.value for o in Objective],
        help="serve's --objective (default cost)",
    )


def run(args: argparse.Namespace) -> int:
    text = read_text_file(args.file, "launch file")
    system = parse_system(args.system, usd_per_chip_hour=args.price) if args.system else None
    chips = (
        system.n_chips
        if system
        else (int_flag(args.chips, "chips", hi=1 << 24) if args.chips else None)
    )
    config = read_launch(text, source=args.file, stack=args.stack, chips=chips)
    _flags_fit(args, config.kind)
    inputs = {"file": args.file, "stack": config.stack, "system": args.system, "chips": chips}
    reading = _reading(config)
    if system is None:
        doc = {**config.to_dict(), "cost": None, "cost_reason": "not costed: give --system"}
        return emit(
            args,
            NAME,
            inputs,
            doc,
            reading
            + "\n\nNot costed: give --system (e.g. h100:128) to cost it as "
            + ("serve --plan" if config.kind == LaunchKind.SERVING else "train --plan")
            + " does.",
        )
    if config.kind == LaunchKind.SERVING:
        cost, cost_text = _cost_serving(args, config, system)
    else:
        cost, cost_text = _cost(args, config, system)
    return emit(
        args, NAME, inputs, {**config.to_dict(), "cost": cost}, reading + "\n\n" + cost_text
    )


def _workload(args: argparse.Namespace, config: LaunchConfig) -> Workload:
    w = config.workload
    if not w.global_batch_sequences:
        raise PlanError(
            f"{config.source} states no global batch",
            rule="costing a step needs the batch the file trains on",
            fix="add the stack's batch setting to the file",
        )
    seq = w.seq_len
    if seq is None or (args.seq is not None and args.seq != seq):
        if args.seq is None:
            raise PlanError(
                f"{config.source} states no sequence length",
                rule=f"a {config.stack} file leaves the sequence length to the model code or data",
                fix="give --seq",
            )
        if seq is not None:
            raise PlanError(
                f"--seq {args.seq} but {config.source} trains on {seq}-token sequences",
                rule="--seq fills a sequence length the file does not state",
                fix="drop --seq",
            )
        seq = args.seq
    tokens = (
        parse_quantity(args.tokens, what="tokens")
        if args.tokens
        else float((w.train_steps or 0) * (w.global_batch_sequences or 0) * seq)
    )
    return Workload(float(seq * (w.global_batch_sequences or 0)), seq, tokens)


def _cost(args: argparse.Namespace, config: LaunchConfig, system) -> tuple[dict[str, Any], str]:
    """The plan costed by `train`'s one-plan path, with the file's stack and precision."""
    if args.model:
        model = resolve_model(args.model, "--model")
    else:
        model = resolve_model(config.model, config.source)
    targs = argparse.Namespace(
        framework=config.options.get("framework", "auto"),
        precision=config.options.get("precision"),
        offload_optimizer=config.options.get("offload_optimizer") == "true",
        profile=getattr(args, "profile", None),
        efficiency=getattr(args, "efficiency", None),
        assume_mfu=None,
        plot=None,
        json=args.json,
    )
    stack, eff = stack_and_profile(targs, system.chip)
    return cost_one_plan(targs, model, system, _workload(args, config), config.plan, eff, stack)


def _flags_fit(args: argparse.Namespace, kind: LaunchKind) -> None:
    """serve's load flags with a training file, or --seq / --tokens with a serving line, are
    errors (never ignored)."""
    if kind == LaunchKind.TRAINING:
        given = [f for f in SERVE_LOAD_FLAGS if getattr(args, f.replace("-", "_")) is not None]
        why = "serve's load flags cost serving launch lines (vLLM, SGLang, TensorRT-LLM)"
    else:
        given = [f for f in ("seq", "tokens") if getattr(args, f) is not None]
        why = "--seq and --tokens cost training files; a serving line is costed for serve's load"
    if given:
        raise PlanError(
            f"--{given[0]} with the {kind.value} launch file {args.file}",
            rule=why,
            fix=f"drop --{given[0]}",
        )


def serve_args(args: argparse.Namespace, config: LaunchConfig) -> argparse.Namespace:
    """serve's arguments for a serving file as read (`serve_argv`) with --system, the load
    flags given to import, --profile and --price, parsed by serve's own parser."""
    from roofline.cli.serve_cmd import serve_namespace

    argv = serve_argv(config) + ["--system", args.system]
    for flag in SERVE_LOAD_FLAGS:
        value = getattr(args, flag.replace("-", "_"))
        argv += [f"--{flag}", value] if value is not None else []
    argv += ["--profile", args.profile] if getattr(args, "profile", None) else []
    argv += ["--price", str(args.price)] if args.price is not None else []
    sargs = serve_namespace(argv)
    sargs.json = args.json
    return sargs


def _cost_serving(args: argparse.Namespace, config: LaunchConfig, system) -> tuple[dict, str]:
    """The serving plan costed by `serve`'s own search with the plan fixed (`serve --plan`),
    the engine's profile as the file sets it."""
    from roofline.cli.serve_cmd import cost_serving

    model = resolve_model(args.model or config.model, "--model" if args.model else config.source)
    engine = engine_profile(config)
    sargs = serve_args(args, config)
    eff = resolve_profile(sargs, system.chip, engine.name)
    doc, text = cost_serving(sargs, model, system, eff, engine)
    if config.options.get("draft"):
        text += (
            f"\n\nSpeculative decoding (draft {config.options['draft']}) is not in this cost: "
            "serve's search costs plain decode; roofline serve --plan ... --batch B --context C "
            f"--draft {config.options['draft']} costs one speculative step."
        )
    return doc, text


def _reading(config: LaunchConfig) -> str:
    w = config.workload
    rows = [
        ("plan", config.plan.describe() if config.plan else config.serve_plan_text),
        ("model", config.model or "(not named: give --model)"),
        ("devices", str(config.chips) if config.chips else "unknown"),
        ("workload", _workload_text(w)),
        ("stack", ", ".join(f"{k} {v}" for k, v in config.options.items())),
    ]
    parts = [f"roofline import: {config.source} ({config.stack}, {config.kind.value})", kv(rows)]
    parts.append(
        _listing(
            "Defaults filled", [f"{d.key} = {d.value!r}  ({d.source})" for d in config.defaults]
        )
    )
    parts.append(
        _listing(
            "Not expressible in the plan",
            [f"{u.key} = {u.value!r}: {u.reason}" for u in config.unsupported],
        )
    )
    parts.append(
        _listing("Problems as written", [f"{p.key}: {p.message}" for p in config.problems])
    )
    return "\n\n".join(parts)


def _workload_text(w) -> str:
    bits = []
    if w.seq_len:
        bits.append(f"{w.seq_len}-token sequences")
    if w.global_batch_sequences:
        bits.append(f"global batch {w.global_batch_sequences} sequences")
    if w.batch_tokens:
        bits.append(f"{w.batch_tokens} tokens per step")
    if w.train_steps:
        bits.append(f"{w.train_steps} steps")
    return ", ".join(bits) or "not stated"


def _listing(title: str, lines: list[str]) -> str:
    if not lines:
        return f"{title}: none."
    return f"{title} ({len(lines)}):\n" + "\n".join("  " + s for s in lines)
