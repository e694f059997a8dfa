"""`roofline export --to STACK`: write a plan as the file or command line that stack runs.

The plan is `--plan` (roofline's vocabulary) or, without it, the best plan of `train`'s own
search on `--system` (`search_plans`). Where the stack cannot say the plan, the
error names what it lacks. `roofline import` of the exported text gives the same plan back.

`--to vllm|sglang|trtllm` takes serve's inputs: `--plan` is serve's (one server's tp, pp, dp,
ep) with `--weight-dtype` / `--kv-dtype` / `--compute-dtype` / `--draft`, and `--system` the
GPUs of all its replicas; without `--plan`, serve's own search (`serve_cmd.cost_serving`,
the engine's profile) for the load, and the best of its top plans the engine can express.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from roofline.cli._common import add_json, check_output_path, emit, int_flag
from roofline.cli._profile import add_profile_arg
from roofline.cli.train_cmd import search_plans, stack_and_profile
from roofline.core.stack import stack_of
from roofline.errors import SpecError
from roofline.launch import WRITERS, LaunchConfig, LaunchKind, LaunchWorkload, write_launch
from roofline.launch.base import LaunchError, stack_module
from roofline.launch.lines import SERVING_STACKS
from roofline.launch.serving_common import from_serve
from roofline.serving.inference import parse_serve_plan
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.units import parse_quantity

NAME = "export"
HELP = "write a plan as a stack's own launch file: torchtitan TOML, MaxText command, Megatron-LM script, NeMo YAML, DeepSpeed JSON; vLLM, SGLang, TensorRT-LLM launch lines"


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
        help="the system train's search plans for (without --plan; default tpu-v5p:16x20x28); "
        "serving: the GPUs of all the replicas (default h100:8)",
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
        "--objective",
        choices=("cost", "time", "throughput", "latency"),
        default=None,
        help="search objective: train's cost or time; serve's cost, throughput or latency",
    )
    p.add_argument(
        "--top",
        type=int,
        default=20,
        help="without --plan: export the best of train's top plans the stack can express (default 20)",
    )
    p.add_argument("--no-sub-slices", action="store_true", help="search exactly the given system")
    _add_serving_arguments(p)
    add_profile_arg(p)
    p.add_argument("--price", type=float, help="override USD per chip-hour")
    p.add_argument("--out", metavar="FILE", help="write the launch file here (default: print it)")
    add_json(p)


# serve's flags a serving export takes (dtypes and draft with --plan; the load for the search)
SERVE_FLAGS = (
    "weight-dtype",
    "kv-dtype",
    "compute-dtype",
    "draft",
    "prompt",
    "gen",
    "concurrency",
    "rate",
    "slo-ttft",
    "slo-tpot",
)


def _add_serving_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--to vllm|sglang|trtllm: serve's inputs")
    for flag in SERVE_FLAGS:
        g.add_argument(f"--{flag}", help=f"serve's --{flag}")


def _given(args: argparse.Namespace, flags) -> list[str]:
    return [f for f in flags if getattr(args, f.replace("-", "_"), None) is not None]


def _workload(args: argparse.Namespace) -> Workload:
    batch = parse_quantity(args.batch_tokens, what="batch-tokens")
    work = Workload(batch, args.seq, float(batch * (args.steps or 0)))
    work.require_whole_sequences()
    return work


def _plans(args: argparse.Namespace, model, work: Workload) -> list:
    """The plans to try, best first: --plan (with the target's optimizer and precision), or
    train's top plans for the target stack."""
    mod = stack_module(args.to)
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
    check_output_path(args.out, "--out")  # before any search, not at the write
    if args.to in SERVING_STACKS:
        return _emit(args, *_serving_export(args))
    _training_only(args)
    args.system = args.system or "tpu-v5p:16x20x28"
    model = load_model(args.model)
    work = _workload(args)
    config, text, skipped = _first_expressible(args, _plans(args, model, work), work)
    doc = {
        "stack": args.to,
        "kind": "training",
        "plan": config.plan.to_dict(),
        "workload": config.workload.to_dict(),
        "skipped": skipped,
        "text": text,
    }
    return _emit(args, model.name, config.plan.describe(), doc)


def _training_only(args: argparse.Namespace) -> None:
    given = _given(args, SERVE_FLAGS)
    if given or args.objective in ("throughput", "latency"):
        flag = f"--{given[0]}" if given else f"--objective {args.objective}"
        raise SpecError(
            f"{flag} with --to {args.to}",
            rule="serve's flags and objectives export serving launch lines (vllm, sglang, trtllm)",
            fix=f"drop {flag}, or export to a serving engine",
        )


def _emit(args: argparse.Namespace, model_name: str, described: str, doc: dict) -> int:
    text, skipped = doc["text"], doc["skipped"]
    if args.out:
        try:
            Path(args.out).write_text(text)
        except OSError as e:
            raise SpecError(
                f"cannot write {args.out}: {e.strerror}",
                rule="--out names a file roofline can write",
                fix="pick a writable path",
            ) from None
    inputs = {"to": args.to, "model": model_name, "plan": args.plan, "out": args.out}
    shown = f"wrote {args.out} ({args.to}: {described})" if args.out else text.rstrip("\n")
    if skipped and not args.json:  # on stderr: stdout stays the launch file
        for s in skipped:
            print(
                f"roofline export: skipped a better plan {args.to} cannot express: {s}",
                file=sys.stderr,
            )
    return emit(args, NAME, inputs, doc, shown)


# ------------------------------------------------------------------------------ serving


def _serving_config(args: argparse.Namespace, plan: dict, chips, quant: dict, draft=None):
    return from_serve(
        args.to,
        model=args.model,
        plan=plan,
        chips=chips,
        weight_dtype=quant.get("weights"),
        kv_dtype=quant.get("kv"),
        compute_dtype=quant.get("compute"),
        draft=draft,
    )


def _serving_inputs_only(args: argparse.Namespace) -> None:
    """Train's flags (and, with --plan, serve's load; without it, --draft) are errors here."""
    train = [f for f in ("precision", "optimizer", "steps", "chips") if getattr(args, f)]
    train += ["objective time"] if args.objective == "time" else []
    wrong = [f"--{f}" for f in train]
    if args.plan:
        wrong += [f"--{f}" for f in _given(args, SERVE_FLAGS[4:])]
    elif args.draft is not None:
        wrong.append("--draft")
    if wrong:
        raise SpecError(
            f"{wrong[0]} with --to {args.to}" + (" --plan" if args.plan else ""),
            rule="a serving export takes serve's inputs: --plan with --weight-dtype, --kv-dtype, "
            "--compute-dtype and --draft, or, without --plan, serve's load (--concurrency or "
            "--rate, --prompt, --gen, --slo-ttft, --slo-tpot, --objective cost|throughput|latency) "
            "for serve's search",
            fix=f"drop {wrong[0]}",
        )


def _serving_export(args: argparse.Namespace) -> tuple[str, str, dict]:
    """(model, the plan described, the export document) of a serving export."""
    _serving_inputs_only(args)
    system = parse_system(args.system or "h100:8", usd_per_chip_hour=args.price)
    skipped: list[str] = []
    if args.plan:
        quant = {"weights": args.weight_dtype, "kv": args.kv_dtype, "compute": args.compute_dtype}
        draft = int_flag(args.draft, "draft", hi=64, example="3") if args.draft else None
        plan = parse_serve_plan(args.plan).to_dict()
        config = _serving_config(args, plan, system.n_chips if args.system else None, quant, draft)
        text = write_launch(config, args.to)
    else:
        config, text, skipped = _serving_search(args, system)
    doc = {k: v for k, v in config.to_dict().items() if k in ("plan", "chips", "options")}
    doc = {"stack": args.to, "kind": "serving", "model": args.model, **doc}
    doc |= {"workload": config.workload.to_dict(), "skipped": skipped, "text": text}
    return load_model(args.model).name, config.serve_plan_text, doc


def _serving_search(args: argparse.Namespace, system) -> tuple:
    """serve's search on --system for the load (the engine's profile), and the best of its
    top plans the engine can express: (config, text, the better plans skipped)."""
    from roofline.cli._profile import resolve_profile
    from roofline.cli.serve_cmd import cost_serving, serve_namespace
    from roofline.specs.engines import load_engine

    argv = ["--model", args.model, "--system", system.name, "--engine", args.to]
    argv += ["--top", str(args.top), "--objective", args.objective or "cost"]
    for flag in _given(args, SERVE_FLAGS):
        argv += [f"--{flag}", getattr(args, flag.replace("-", "_"))]
    argv += ["--profile", args.profile] if args.profile else []
    sargs = serve_namespace(argv + (["--price", str(args.price)] if args.price else []))
    sargs.json = True
    engine = load_engine(args.to)
    eff = resolve_profile(sargs, system.chip, engine.name)
    doc, _ = cost_serving(sargs, load_model(args.model), system, eff, engine)
    skipped: list[str] = []
    for row in doc["top"]:
        chips = int(row["chips_per_replica"] * round(row["replicas"]))
        try:
            config = _serving_config(args, row["plan"], chips, row["quant"])
            return config, write_launch(config, args.to), skipped
        except LaunchError as e:
            skipped.append(f"{row['plan']['spec']} {'/'.join(row['quant'].values())}: {e.what}")
    raise LaunchError(
        f"none of serve's top {len(doc['top'])} plans can be written for {args.to}"
        + (": " + "; ".join(skipped[:3]) if skipped else " (serve found no feasible plan)"),
        rule="an export writes only what the engine's own launch line can say",
        fix="raise --top, or give --plan",
    )
