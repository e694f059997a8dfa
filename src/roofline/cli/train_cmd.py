"""`roofline train`: plan (or cost one plan of) a training run: step time, MFU, memory, run time and cost.

With no arguments: LLaMA-3 70B, 15T tokens, a 4M-token batch of 4096-token sequences on a
TPU v5p pod (tpu-v5p:16x20x28) — the book's applied-training.md setting — costed as the chip's
reference stack runs it (`--framework auto`: maxtext on TPU, megatron on NVIDIA and AMD GPUs;
`--framework ideal` for the book's idealised machine).
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import replace
from typing import Any

from roofline.cli._common import add_json, emit
from roofline.cli._profile import add_profile_arg, resolve_profile
from roofline.core.ledger import count_params
from roofline.core.stack import AUTO, Stack, auto_reason, is_auto, resolve_framework, stack_of
from roofline.errors import PlanError
from roofline.launch.capable import capabilities
from roofline.launch.lines import launch_text, training_launch
from roofline.progress import counter
from roofline.report.table import kv, table
from roofline.report.text import precisions_phrase, profile_assumptions, stack_note, term_phrase
from roofline.specs.framework import parse_stack_date
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import DEFAULT_OPTIMIZER
from roofline.specs.system import parse_system
from roofline.training.offload import evaluate_offloaded, offload_activations
from roofline.training.pipecomm import pipeline_traffic
from roofline.training.planner import PlanResult, SearchSpace, plan_training
from roofline.training.planner.launchable import launch_space, skipped
from roofline.training.step import (
    AssumedRun,
    StepCost,
    Workload,
    assumed_run,
    parse_plan,
    training_profile,
)
from roofline.units import DAY, fmt_bytes, fmt_count, fmt_time, fmt_usd, parse_quantity

NAME = "train"
HELP = "plan a training run: parallelism, step time, MFU, memory per chip, run time and cost"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="llama-3-70b", help="preset name or config.json (default llama-3-70b)"
    )
    p.add_argument(
        "--system",
        default="tpu-v5p:16x20x28",
        help="e.g. tpu-v5p:16x20x28, 2xtpu-v5p:16x20x28, h100:1024",
    )
    p.add_argument(
        "--chips", help="only these chip counts of the system's sub-slices (e.g. 4096 or 4096,5120)"
    )
    p.add_argument(
        "--batch-tokens",
        default=str(4 * 2**20),
        help="global batch in tokens (default 4Mi = 4194304)",
    )
    p.add_argument("--seq", type=int, default=4096, help="sequence length (default 4096)")
    p.add_argument(
        "--tokens", default="15T", help="training tokens for run time and cost (default 15T)"
    )
    p.add_argument(
        "--plan", help='evaluate one plan, e.g. "fsdp=1024,tp=4,sp=2,microbatch=4,remat=full"'
    )
    p.add_argument(
        "--objective",
        choices=("cost", "time"),
        default=None,
        help="rank by $ per token (default when the chip has a price) or by step time (default otherwise)",
    )
    p.add_argument(
        "--assume-mfu",
        type=float,
        help="back-of-envelope: 6·N·tokens / (chips · peak · MFU), as in the book",
    )
    p.add_argument("--top", type=int, default=5, help="how many plans to list (default 5)")
    add_profile_arg(p)
    p.add_argument(
        "--framework",
        metavar="NAME|FILE",
        default=AUTO,
        help="the training stack whose behaviour is costed: auto (default: the chip's reference "
        "stack, maxtext on TPU and megatron on NVIDIA and AMD GPUs), megatron, torchtitan, "
        "deepspeed, maxtext, llm-foundry, ideal (the idealised machine of the book) or a TOML "
        "profile (docs/frameworks.md)",
    )
    p.add_argument(
        "--stack-date",
        metavar="YYYY-MM[-DD]",
        help="plan for the stack as it stood at this date (a month counts to its end): the "
        "features its framework record dates later are not searched, e.g. 2022-06 leaves "
        "Megatron-LM without FSDP, context parallelism and TP communication overlap "
        "(specs/frameworks/*.toml [features]); default today",
    )
    p.add_argument(
        "--precision",
        metavar="RECIPE",
        help="the stack's precision recipe, e.g. fp8 or fp8-current (dense and expert matmuls in "
        "fp8, attention and the LM head in bf16); default bf16",
    )
    p.add_argument(
        "--optimizer",
        help="adam-bf16 (book: 10 B/param), adam-fp32-master, adam-fp32-master-bf16-grads "
        "(Megatron --grad-reduce-in-bf16), adam-fp32, sgd-bf16 (default: the "
        "stack's own: adam-fp32-master for Megatron-LM and DeepSpeed, adam-fp32 for torchtitan "
        "and MaxText, adam-bf16 for the idealised machine and stacks without a launch table)",
    )
    p.add_argument("--price", type=float, help="override USD per chip-hour")
    p.add_argument(
        "--no-sub-slices",
        action="store_true",
        help="use exactly the given system, never a TPU sub-slice",
    )
    p.add_argument(
        "--deadline",
        help="find the fewest chips (of the system's chip type) that finish --tokens by then, e.g. 30d, 720h",
    )
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="save the step-time and memory breakdown of the listed plans (.png, .svg, .pdf)",
    )
    p.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="also cost the plan with its optimizer state in host memory (ZeRO-Offload)",
    )
    p.add_argument(
        "--offload-activations",
        action="store_true",
        help="search plans that fit only with their saved activations in host memory "
        "(the plan key offload_activations=1)",
    )
    add_json(p)


def _inputs(
    args: argparse.Namespace, model, system, work: Workload, stack: Stack
) -> dict[str, Any]:
    return {
        "model": model.name,
        "system": system.name,
        "chips": system.n_chips,
        "batch_tokens": work.batch_tokens,
        "seq_len": work.seq_len,
        "tokens": work.total_tokens,
        "objective": args.objective,
        "plan": args.plan,
        "assume_mfu": args.assume_mfu,
        "optimizer": args.optimizer,
        "framework": args.framework,
        "framework_resolved": stack.name,
        "precision": args.precision,
    }


def run(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    system = parse_system(args.system, usd_per_chip_hour=args.price)
    batch = parse_quantity(args.batch_tokens, what="batch-tokens")
    tokens = parse_quantity(args.tokens, what="tokens")
    work = Workload(batch, args.seq, tokens)
    when = as_of_date(args)  # a bad --stack-date is a one-paragraph error before any work
    stack, eff = _stack_and_profile(args, system.chip)
    optimizer_from = stack_optimizer(args, stack)
    dtypes = stack.dtypes(args.precision) if args.precision else None
    if args.top < 1:
        raise PlanError(f"--top {args.top}", rule="list at least one plan", fix="write --top 5")
    if args.objective is None:
        args.objective = "cost" if system.usd_per_chip_hour is not None else "time"
    inputs = _inputs(args, model, system, work, stack) | {"profile": eff.to_dict()}
    if when is not None:
        inputs["stack_date"] = when.isoformat()
    inputs["optimizer_default"] = optimizer_from

    if args.assume_mfu is not None and not args.plan:
        return _assumed(args, model, system, work, inputs)
    if args.plan:
        plan = parse_plan(
            args.plan if "optimizer" in args.plan else args.plan + f",optimizer={args.optimizer}"
        )
        if dtypes is not None and plan.dtypes.is_default:
            plan = replace(plan, dtypes=dtypes)
        result, text = cost_one_plan(args, model, system, work, plan, eff, stack)
        return emit(args, NAME, inputs, result, text + _optimizer_text(args, optimizer_from))
    if args.deadline:
        return _deadline(args, model, system, work, eff, inputs, stack, dtypes)
    res = search_plans(args, model, system, work, eff, stack, dtypes)
    if args.plot:
        from roofline.report.plots import plan_breakdown_chart

        plan_breakdown_chart(
            res.top, args.plot, title=f"{model.name}: top plans by {res.objective}"
        )
    text = _render_search(model, system, work, res, auto=_auto(args, system.chip))
    doc = res.to_dict() | {"pipeline_comm": pipeline_traffic(res.best).to_dict()}
    dated = _stack_date_doc(args, stack)
    if dated is not None:
        doc["stack_date"] = dated
        text += "\n\n" + _stack_date_text(dated)
    doc |= _offload_doc(args, model, res.best)
    text += _offload_text(args, model, res.best)
    if res.best.plan.offload_activations:  # the search kept it on the host (space.py)
        acts = offload_activations(model, res.best)
        doc["activation_offload"] = acts.to_dict()
        text += "\n\nactivation offload:\n" + "\n".join("  " + x for x in acts.explain())
    text += _optimizer_text(args, optimizer_from)
    launch = plan_launch(args, model, work, res.best.plan, stack, offloaded(res.best))
    return emit(args, NAME, inputs, doc | {"launch": launch}, text + launch_text(launch))


def offloaded(cost: StepCost) -> bool:
    from roofline.training.offload import ActivationsOffloadedCost, OffloadedCost

    if isinstance(cost, ActivationsOffloadedCost):
        cost = cost.base
    return isinstance(cost, OffloadedCost)


def plan_launch(
    args: argparse.Namespace, model, work: Workload, plan, stack: Stack, offload: bool = False
):
    """The chosen plan as the costed stack's launch file (`launch.lines`; None without a
    writer for the stack); `offload`: with its optimizer state in host memory."""
    return training_launch(
        stack.name,
        model=model.name,
        plan=plan,
        seq_len=work.seq_len,
        global_batch_sequences=int(work.sequences),
        precision=getattr(args, "precision", None),
        offload_optimizer=offload,
    )


def cost_one_plan(
    args: argparse.Namespace, model, system, work: Workload, plan, eff, stack: Stack
) -> tuple[dict[str, Any], str]:
    """One plan costed as `train --plan` costs it: (the result document, the text).
    `roofline import` costs a launch file's plan through this same function."""
    sysm = _system_for_plan(system, plan.degrees.n_chips)
    cost = evaluate_offloaded(  # evaluate_plan, offload_activations=1 costed too
        model,
        sysm,
        work,
        plan,
        efficiency=eff,
        assume_mfu=args.assume_mfu,
        framework=stack,
    )
    acts_text = ""
    result = cost.to_dict() | {"pipeline_comm": pipeline_traffic(cost).to_dict()}
    if plan.offload_activations:  # the plan key: costed with its activations on the host
        acts = offload_activations(model, cost)
        result["activation_offload"] = acts.to_dict()
        acts_text = "\n\nactivation offload:\n" + "\n".join("  " + x for x in acts.explain())
    result |= _offload_doc(args, model, cost)
    if args.plot:
        from roofline.report.plots import plan_breakdown_chart

        plan_breakdown_chart([cost], args.plot, title=f"{model.name}: {plan.describe()}")
    text = (
        _render_one(
            model, work, cost, header=f"Plan {plan.describe()}", auto=_auto(args, sysm.chip)
        )
        + _offload_text(args, model, cost)
        + acts_text
    )
    launch = plan_launch(
        args, model, work, plan, stack, bool(getattr(args, "offload_optimizer", False))
    )
    result = {**result, "candidates_evaluated": 1, "rejected": {}, "top": [result]}
    return result | {"launch": launch}, text + launch_text(launch)


def search_plans(
    args: argparse.Namespace, model, system, work: Workload, eff, stack: Stack, dtypes
) -> PlanResult:
    """The planner's search as `train` runs it (`roofline export` exports its best plan)."""
    chips = parse_chip_counts(args.chips) if args.chips else None
    return plan_training(
        model,
        system,
        work,
        objective=args.objective,
        top_k=args.top,
        efficiency=eff,
        optimizer=args.optimizer,
        allow_sub_slices=not args.no_sub_slices,
        chips=chips,
        progress=counter("train: costing plans", unit="plan"),
        space=launch_space(
            SearchSpace(
                offload_optimizer=(False, True)
                if getattr(args, "offload_optimizer", False)
                else (False,),
                offload_activations=(False, True)
                if getattr(args, "offload_activations", False)
                else (False,),
            ),
            launch_stack(args, stack),
        ),
        framework=stack,
        dtypes=dtypes,
        launch_stack=launch_stack(args, stack),
        as_of=as_of_date(args),
    )


def _stack_date_doc(args: argparse.Namespace, stack: Stack) -> dict[str, Any] | None:
    """What `--stack-date` left out of the search: each feature the stack shipped later, with
    its date and source (None without --stack-date)."""
    when = as_of_date(args)
    if when is None:
        return None
    gone = {} if stack.book else stack.framework.lacks(when)
    return {
        "as_of": when.isoformat(),
        "not_searched": {
            f.value: {"since": s.since.isoformat(), "source": s.source} for f, s in gone.items()
        },
    }


def _stack_date_text(doc: dict[str, Any]) -> str:
    gone = doc["not_searched"]
    if not gone:
        return f"Stack as of {doc['as_of']}: every feature searched had shipped by then."
    items = ", ".join(f"{k.replace('_', ' ')} ({v['since']})" for k, v in gone.items())
    return (
        f"Stack as of {doc['as_of']}: not searched, shipped later: {items} "
        "(specs/frameworks/*.toml [features])."
    )


def as_of_date(args: argparse.Namespace) -> datetime.date | None:
    """`--stack-date` as a date (None: not given, today's stack); a bad one is a SpecError."""
    text = getattr(args, "stack_date", None)
    return None if not text else parse_stack_date(text, "--stack-date")


def launch_stack(args: argparse.Namespace, stack: Stack) -> str | None:
    """The stack whose launch configuration must say the searched plans: the one named
    (`export --to`'s target, or `--framework`), None with `--framework auto`."""
    if is_auto(getattr(args, "framework", None)):
        return None
    return getattr(args, "to", None) or stack.name


def stack_optimizer(args: argparse.Namespace, stack: Stack) -> str | None:
    """Fill `args.optimizer`, where not given, with the stack's own default (the launch
    table, `launch.capable`; the book's adam-bf16 for a stack it does not hold). Returns the
    default's source, None when the optimizer was given or is the book's."""
    if args.optimizer:
        return None
    cap = capabilities(stack.name)
    args.optimizer = cap.optimizer if cap else DEFAULT_OPTIMIZER
    return f"{cap.who}'s own: {cap.optimizer_source}" if cap else None


def _optimizer_text(args: argparse.Namespace, source: str | None) -> str:
    if source is None:
        return ""
    return f"\n\nOptimizer (not given): {args.optimizer}, {source}."


def stack_and_profile(args: argparse.Namespace, chip) -> tuple[Stack, Any]:
    """The stack and efficiency profile `train` costs with (public for `roofline import`)."""
    return _stack_and_profile(args, chip)


def _stack_and_profile(args: argparse.Namespace, chip) -> tuple[Stack, Any]:
    """The stack `--framework` names (`auto`: the chip's reference stack, `resolve_framework`)
    and the efficiency profile with that stack's fitted overrides."""
    stack = stack_of(resolve_framework(args.framework, chip))
    named = getattr(args, "profile", None) or getattr(args, "efficiency", None)
    # the stack's canonical name: an alias (`--framework jax`) finds the overrides fitted for
    # maxtext as `--framework maxtext` does
    eff = (
        resolve_profile(args, chip, framework=stack.name)
        if named
        else training_profile().for_framework(stack.name)
    )
    return stack, eff


def _auto(args: argparse.Namespace, chip) -> str | None:
    """Why `--framework auto` chose the stack on `chip` ('tpu → maxtext'), None if it was named."""
    return auto_reason(chip) if is_auto(getattr(args, "framework", None)) else None


def parse_chip_counts(text: str) -> tuple[int, int] | list[int]:
    """'4096' or '4096,5120' (exact counts) or '1024-8192' (a range, inclusive)."""
    t = str(text).strip()
    if "-" in t and "," not in t:
        lo_s, hi_s = t.split("-", 1)
        lo, hi = int(parse_quantity(lo_s, what="chips")), int(parse_quantity(hi_s, what="chips"))
        if not 0 < lo <= hi:
            raise PlanError(
                f"--chips {text}",
                rule="a range LOW-HIGH with 0 < LOW <= HIGH",
                fix="write e.g. --chips 1024-8192",
            )
        return (lo, hi)
    out = [int(parse_quantity(c, what="chips")) for c in t.split(",") if c.strip()]
    if not out or min(out) <= 0:
        raise PlanError(
            f"--chips {text}",
            rule="chip counts are positive",
            fix="write e.g. --chips 4096 or 4096,5120",
        )
    return out


def parse_duration(text: str) -> float:
    """'30d', '720h', '45min', '1e6s', '2w' -> seconds."""
    import re

    m = re.fullmatch(
        r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|sec|min|m|h|d|w|days?|hours?|weeks?)?\s*",
        str(text),
    )
    if not m:
        raise PlanError(
            f"cannot read duration {text!r}",
            rule="a number with s, min, h, d or w",
            fix="write e.g. --deadline 30d",
        )
    unit = (m.group(2) or "s").rstrip("s") or "s"
    mult = {
        "s": 1,
        "sec": 1,
        "min": 60,
        "m": 60,
        "h": 3600,
        "hour": 3600,
        "d": DAY,
        "day": DAY,
        "w": 7 * DAY,
        "week": 7 * DAY,
    }[unit]
    return float(m.group(1)) * mult


def _deadline(args, model, system, work: Workload, eff, inputs, stack, dtypes) -> int:
    from roofline.training.planner import chips_for_deadline

    dl = parse_duration(args.deadline)
    res = chips_for_deadline(
        model,
        system,
        work,
        dl,
        efficiency=eff,
        optimizer=args.optimizer,
        top_k=args.top,
        framework=stack,
        dtypes=dtypes,
        space=launch_space(SearchSpace(), launch_stack(args, stack)),
        launch_stack=launch_stack(args, stack),
        as_of=as_of_date(args),
    )
    tried = table(
        [[s, n, "-" if t == float("inf") else f"{t / DAY:.1f}"] for s, n, t in res.tried],
        ["system", "chips", "best days"],
        align="lrr",
    )
    if res.result is None:
        text = (
            f"No system of {system.chip.name} up to {res.tried[-1][1] if res.tried else '?'} chips finishes "
            f"{fmt_count(work.total_tokens)} tokens in {dl / DAY:.1f} days.\n\nTried (bisection):\n{tried}"
        )
        return emit(args, NAME, {**inputs, "deadline": args.deadline}, res.to_dict(), text)
    b = res.result.best
    head = (
        f"Fewest {system.chip.name} chips to train {model.name} on {fmt_count(work.total_tokens)} tokens within "
        f"{dl / DAY:.1f} days: {b.system.n_chips} ({b.system.name}), {b.run_time_s / DAY:.1f} days."
    )
    text = (
        head
        + "\n\n"
        + _render_one(model, work, b, header="Fastest plan there:", auto=_auto(args, system.chip))
        + "\n\nTried (bisection):\n"
        + tried
        + _optimizer_text(args, inputs.get("optimizer_default"))
    )
    return emit(
        args,
        NAME,
        {**inputs, "deadline": args.deadline},
        {**res.result.to_dict(), **res.to_dict()},
        text,
    )


def _system_for_plan(system, n: int):
    if n == system.n_chips:
        return system
    from roofline.training.planner import sub_slices

    for s in sub_slices(system, max_count=64):
        if s.n_chips == n:
            return s
    if not system.is_tpu:
        return system  # evaluate_plan says the plan uses another chip count
    raise PlanError(
        f"the plan uses {n} chips but {system.name} has {system.n_chips} and no sub-slice of {n} chips",
        rule="a plan's degrees multiply to the chip count of the system (or of a sub-slice)",
        fix="change the degrees, or give --system with a matching shape",
    )


def _assumed(args, model, system, work: Workload, inputs) -> int:
    est = assumed_run(model, system, work, args.assume_mfu, args.optimizer)
    return emit(args, NAME, inputs, est.to_dict(), _render_assumed(est))


def _render_assumed(est: AssumedRun) -> str:
    system, work, opt = est.system, est.workload, est.optimizer
    price, cost = system.usd_per_chip_hour, est.run_cost_usd
    rows = [
        (
            "total FLOPs",
            f"6 · {est.active_params:.4g} active params · {work.total_tokens:.3g} tokens = {est.total_flops:.3g}",
        ),
        (
            "time",
            f"{est.total_flops:.3g} / ({system.n_chips} chips · {est.peak_flops_per_s:.3g} FLOP/s · {est.mfu:g}) "
            f"= {est.run_time_s:.3g} s = {est.run_time_s / DAY:.1f} days",
        ),
        (
            "cost",
            "unknown (no price)" if cost is None else f"{fmt_usd(cost)} at ${price:g}/chip-hour",
        ),
        (
            "memory to train",
            f"params {opt.param_bytes:g} B + optimizer {opt.state_bytes:g} B per param + 4 bf16 checkpoints "
            f"of D per token per layer = {fmt_bytes(est.memory_needed_bytes)} -> at least "
            f"{est.min_chips_by_memory} chips of {fmt_bytes(system.chip.hbm_bytes)}",
        ),
    ]
    return "\n".join(
        [
            f"Back-of-envelope (book applied-training.md): {est.model.name} on {system.name}, "
            f"{fmt_count(work.total_tokens)} tokens",
            "",
            kv(rows),
            "",
            "This assumes the MFU; run without --assume-mfu to plan the parallelism and predict it.",
        ]
    )


def _breakdown(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {fmt_bytes(v)}" for k, v in d.items() if v > 0)


def _render_one(model, work: Workload, c: StepCost, header: str, auto: str | None = None) -> str:
    s = c.system
    d = c.to_dict()
    exposed = {k: v for k, v in c.exposed_time_s.items() if v > 1e-9}
    raw = {k: v for k, v in c.comm_time_s.items() if v > 1e-9}
    price = s.usd_per_chip_hour
    rows = [
        ("plan", c.plan.describe()),
        ("system", f"{s.name} ({s.n_chips} chips of {s.chip.name})"),
        (
            "step time",
            f"{fmt_time(c.step_time_s)}  = compute {fmt_time(c.compute_time_s)} + exposed comm "
            f"{fmt_time(c.exposed_comm_time_s)} + bubble {fmt_time(c.bubble_time_s)} + optimizer {fmt_time(c.optimizer_time_s)}"
            + (f" + overheads {fmt_time(c.overhead_time_s)}" if c.overhead_time_s else ""),
        ),
        ("MFU", _mfu_text(c)),
        (
            "tokens/s",
            f"{fmt_count(c.tokens_per_s)}  ({fmt_count(c.tokens_per_s / s.n_chips)} per chip)",
        ),
        (
            "memory per chip",
            f"{fmt_bytes(c.memory_per_chip_bytes)} of {fmt_bytes(s.chip.fit_hbm_bytes)} "
            f"({'fits' if c.fits else 'DOES NOT FIT'}): {_breakdown(dict(c.memory_breakdown))}",
        ),
        ("limited by", term_phrase(c.bottleneck)),
        ("communication", ", ".join(f"{k} {fmt_time(v)}" for k, v in raw.items()) or "none"),
        (
            "exposed",
            ", ".join(f"{k} {fmt_time(v)}" for k, v in exposed.items())
            or "none (all hidden behind compute)",
        ),
        ("pipeline bubble", f"{c.bubble_fraction:.1%}"),
    ]
    if work.total_tokens:
        cost = d["run_cost_usd"]
        rows.append(
            (
                "run",
                f"{fmt_count(work.total_tokens)} tokens in {c.run_time_s / DAY:.1f} days"
                + ("" if cost is None else f", {fmt_usd(cost)} at ${price:g}/chip-hour"),
            )
        )
    if not c.fits:
        rows.append(("why not", c.reason))
    e = c.efficiency
    notes = [
        f"Assumptions: {profile_assumptions(e, c.system.chip)}.",
        stack_note(c.framework, auto),
    ]
    return header + "\n\n" + kv(rows) + _pipeline_text(c) + "\n\n" + "\n".join(notes)


def _offload_doc(args: argparse.Namespace, model, c: StepCost) -> dict[str, Any]:
    """The plan with its optimizer state offloaded, when --offload-optimizer asks for it."""
    if not getattr(args, "offload_optimizer", False):
        return {}
    from roofline.training.offload import offload_optimizer

    return {"offload": offload_optimizer(model, c).to_dict()}


def _offload_text(args: argparse.Namespace, model, c: StepCost) -> str:
    if not getattr(args, "offload_optimizer", False):
        return ""
    from roofline.training.offload import offload_optimizer

    lines = offload_optimizer(model, c).explain()
    return "\n\noptimizer offload (ZeRO-Offload):\n" + "\n".join("  " + x for x in lines)


def _pipeline_text(c: StepCost) -> str:
    """The pipeline's hops and bytes per step (only for plans with a pipeline)."""
    if c.plan.degrees.pp <= 1:
        return ""
    lines = pipeline_traffic(c).explain()
    return "\n\npipeline communication per step:\n" + "\n".join("  " + x for x in lines)


def _mfu_text(c: StepCost) -> str:
    """MFU against the bf16 peak and, for fp8/fp4 plans, against the compute dtype's peak."""
    d = c.compute_dtype
    peak16 = c.system.chip.default_dtype
    out = f"{c.mfu:.1%} of the {peak16} peak"
    if d != peak16:
        out += f", {c.mfu_compute_dtype:.1%} of the {d} peak (the matmuls' compute dtype)"
    return (
        out
        + f"  (6·N·tokens / (step · chips · peak); HFU {c.hfu:.1%} counts recompute and attention)"
    )


def _render_search(model, system, work: Workload, res: PlanResult, auto: str | None = None) -> str:
    b = res.best
    params = count_params(model)
    head = (
        f"roofline train: {model.name} ({fmt_count(params.total)} params) on {system.name} ({system.n_chips} chips), "
        f"{fmt_count(work.batch_tokens)}-token batch of {work.seq_len}-token sequences, {fmt_count(work.total_tokens)} tokens"
    )
    rej = (
        ", ".join(f"{v:,} {k}" for k, v in sorted(res.rejected.items(), key=lambda x: -x[1]))
        or "none"
    )
    search = (
        f"Searched {res.candidates_enumerated:,} plans{precisions_phrase(res.precisions)} "
        f"({res.candidates_evaluated:,} costed) in {res.search_time_s:.2f} s; "
        f"rejected: {rej}."
    )
    if skipped(res.rejected):
        search += f" {skipped(res.rejected):,} plans the stack cannot launch were skipped."
    parts = [head, search]
    if res.sub_slice_note:
        parts.append("Note: " + res.sub_slice_note + ".")
    parts.append(_render_one(model, work, b, header=f"Best plan by {res.objective}:", auto=auto))
    parts.append("Why it wins: " + res.why + ".")
    if res.advice:
        parts.append("Advice: " + res.advice + ".")
    rows = []
    for i, c in enumerate(res.top, 1):
        rows.append(
            [
                i,
                c.plan.describe(),
                c.system.n_chips,
                fmt_time(c.step_time_s),
                f"{c.mfu:.1%}",
                fmt_bytes(c.memory_per_chip_bytes),
                term_phrase(c.bottleneck),
                f"{c.run_time_s / DAY:.1f}" if work.total_tokens else "-",
                fmt_usd(c.run_cost_usd) if c.run_cost_usd is not None else "-",
            ]
        )
    parts.append(
        "Top plans:\n"
        + table(
            rows,
            ["#", "plan", "chips", "step", "MFU", "mem/chip", "limited by", "days", "cost"],
            align="rllrrrlrr",
        )
    )
    if res.pareto:
        prow = [
            [
                p["chips"],
                fmt_time(p["step_time_s"]),
                "-"
                if p["usd_per_million_tokens"] is None
                else f"${p['usd_per_million_tokens']:.2f}",
                p["plan"],
            ]
            for p in res.pareto
        ]
        parts.append(
            "Pareto set (chips vs step time vs cost):\n"
            + table(prow, ["chips", "step", "$/M tokens", "plan"], align="rrrl")
        )
    return "\n\n".join(parts)
