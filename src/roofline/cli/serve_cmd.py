"""`roofline serve`: how fast a model serves, on how many chips, at what cost per token.

Two modes. With `--plan`, `--batch` and `--context` it costs one decode step (the book's
questions: memory per chip, step time, tokens/s, the bound, max batch). Otherwise it searches
topology × sharding × batch × quantisation for the load (`--concurrency` or `--rate`) under the
TTFT/TPOT targets and prints the best plan with its arithmetic, the top plans, the rejections by
name and the Pareto of tokens/s/user against tokens/s/chip.

TTFT and TPOT are defined as vLLM's benchmark defines them (TPOT excludes the first token).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import numpy as np

from roofline.cli._common import add_json, check_output_path, emit, int_flag
from roofline.cli._profile import add_profile_arg, resolve_profile
from roofline.errors import SpecError
from roofline.launch.lines import launch_text, serving_launch
from roofline.report.table import kv, table
from roofline.serving.inference import Quant, ServePlan, parse_serve_plan
from roofline.serving.search import Objective, ServeQuery, default_quants, search, step_report
from roofline.serving.steady import MAX_TOKENS, Workload, load_lengths
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import Efficiency
from roofline.specs.engines import EngineProfile, load_engine
from roofline.specs.model_catalog import load_model
from roofline.specs.system import System, parse_system
from roofline.units import fmt_bytes, fmt_time, parse_quantity

NAME = "serve"
HELP = "plan serving: chips, sharding, batch and quantisation under TTFT/TPOT targets; or cost one decode step"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="llama-3-70b", help="preset or config.json (default llama-3-70b)"
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--system", help="e.g. tpu-v5e:4x2, tpu-v5e:16x16, h100:64")
    g.add_argument("--chip", help="a chip name: search its slices (TPU pod) or up to 64 GPUs")
    p.add_argument("--prompt", default="1024", help="prompt tokens per request (default 1024)")
    p.add_argument("--gen", default="256", help="output tokens per request (default 256)")
    p.add_argument("--lengths", metavar="FILE", help="prompt,output lengths, one request a line")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", help="requests in flight over the deployment")
    load.add_argument("--rate", help="requests per second over the deployment (Poisson)")
    p.add_argument("--slo-ttft", help="time-to-first-token target, e.g. 2s or 500ms")
    p.add_argument("--slo-tpot", help="time-per-output-token target, e.g. 50ms")
    p.add_argument("--objective", choices=[o.value for o in Objective], default="cost")
    p.add_argument("--weight-dtype", help="bf16, fp8, int8, int4, nvfp4, mxfp4 (default: search)")
    p.add_argument("--kv-dtype", help="bf16, fp8, int8 (default: search)")
    p.add_argument("--compute-dtype", help="matmul dtype (default bf16; fp8/fp4 for W8A8/W4A4)")
    p.add_argument(
        "--plan",
        help="one replica's sharding, e.g. tp=8, tp=8,ep=8,dp=8, tp=16,kv=heads_batch, "
        "tp=8,kvseq=2 (any plan the search prints)",
    )
    p.add_argument("--batch", help="with --plan and --context: cost one decode step of this batch")
    p.add_argument("--context", help="KV length of that step (tokens)")
    p.add_argument("--prefix-hit", type=float, default=0.0, help="prefix-cache hit rate (0-1)")
    p.add_argument("--draft", type=int, help="one-step mode: speculative draft length γ")
    p.add_argument(
        "--acceptance", type=float, default=0.7, help="draft token acceptance α (default 0.7)"
    )
    p.add_argument(
        "--draft-cost",
        type=float,
        default=0.05,
        help="one draft step over one target decode pass (default 0.05: a small draft model)",
    )
    p.add_argument(
        "--engine",
        help="vllm, sglang, trtllm, jetstream or none (default: vllm on GPUs, jetstream on TPUs; none with --profile peak)",
    )
    add_profile_arg(p)  # --profile peak: the book's idealised rooflines
    _add_given_arguments(p)
    p.add_argument("--price", type=float, help="override USD per chip-hour")
    p.add_argument("--top", type=int, default=5, help="plans to list (default 5)")
    p.add_argument("--plot", metavar="FILE", help="write the Pareto chart (.png, .svg, .pdf)")
    add_json(p)


def _add_given_arguments(p: argparse.ArgumentParser) -> None:
    """Given (measured) step times: size a disaggregated deployment from them (serving.given)."""
    p.add_argument(
        "--prefill-step-s", help="given prefill pass time, e.g. 0.91s (with --decode-step-s)"
    )
    p.add_argument("--decode-step-s", help="given decode step time at --batch sequences, e.g. 19ms")
    p.add_argument(
        "--prefill-batch", default="1", help="prompts per given prefill pass (default 1)"
    )
    p.add_argument(
        "--steps",
        metavar="FILE",
        help="given step times from a TOML file (prefill_step_s, decode_step_s, batch; flags override)",
    )
    p.add_argument(
        "--kv-seq",
        help="with --batch and --context: shard each sequence's KV cache over this many chips "
        "(decode attention combined by AllReduce; --plan tp=N for the heads)",
    )


def parse_duration(text: str | None, what: str) -> float | None:
    """'2s', '500ms', '50 ms', '1.5', '200us' -> seconds."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(s|ms|us|µs)?\s*", str(text))
    if not m:
        raise SpecError(
            f"cannot read {what} {text!r}",
            rule="a duration is a number with s, ms or us",
            fix=f"write e.g. --{what} 50ms",
        )
    scale = {"s": 1.0, None: 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}[m.group(2)]
    v = float(m.group(1)) * scale
    if v <= 0:
        raise SpecError(
            f"{what} {text}", rule="targets are positive", fix=f"give a positive --{what}"
        )
    return v


def _system(args: argparse.Namespace) -> System:
    if args.system:
        return parse_system(args.system, usd_per_chip_hour=args.price)
    chip = load_chip(args.chip or "tpu-v5e")
    if chip.is_tpu and chip.pod_topology:
        return parse_system(
            f"{chip.name}:{'x'.join(map(str, chip.pod_topology))}", usd_per_chip_hour=args.price
        )
    return parse_system(f"{chip.name}:64", usd_per_chip_hour=args.price)


def _profile(args: argparse.Namespace, system: System, engine: EngineProfile | None) -> Efficiency:
    """The efficiency profile asked for (default: the chip's), with a calibrated profile's
    overrides for the serving engine applied."""
    return resolve_profile(args, system.chip, engine.name if engine else None)


def _engine(args: argparse.Namespace, system: System) -> EngineProfile | None:
    name = args.engine
    if name is None:
        if args.profile == "peak":
            return None
        name = "jetstream" if system.is_tpu else "vllm"
    return None if name.lower() == "none" else load_engine(name)


def _quants(args: argparse.Namespace, system: System, engine) -> tuple[Quant, ...]:
    return default_quants(
        system.chip,
        engine,
        weights=args.weight_dtype,
        kv=args.kv_dtype,
        compute=args.compute_dtype,
    )


def _workload(args: argparse.Namespace) -> Workload:
    if args.lengths:
        P, G = load_lengths(args.lengths)
    else:
        P, G = _tokens(args.prompt, "prompt", "8192"), _tokens(args.gen, "gen", "1024")
    conc = _size(args.concurrency, "concurrency", "requests in flight", "64", lo=0.0)
    rate = _size(args.rate, "rate", "requests per second", "10", lo=0.0)
    return Workload(P, G, concurrency=conc, rate=rate, prefix_hit=args.prefix_hit)


# Every size `serve` reads (tokens of a prompt, an output or a context; sequences in a batch;
# requests in flight or per second) is at most 2^30: beyond it no arithmetic is physical and
# float products overflow to inf (the fuzz tier's --context 5.9e152 printed NaN cost).
MAX_SIZE = MAX_TOKENS


def _tokens(text: str, flag: str, example: str) -> float:
    """A token count (prompt, output, context): a number from 1 to 2^30."""
    return _size(text, flag, "tokens", example, lo=1.0)


def _size(text: str | None, flag: str, unit: str, example: str, *, lo: float) -> Any:
    """A serving size within the one rule (None stays None): more than `lo` (at least 1 for
    token counts) and at most 2^30."""
    if text is None:
        return None
    v = parse_quantity(text, what=flag)
    if not (v >= lo if lo >= 1 else v > lo) or v > MAX_SIZE:
        raise SpecError(
            f"--{flag} {text}",
            rule=f"--{flag} counts {unit}: "
            + ("at least 1" if lo >= 1 else "more than 0")
            + f" and at most 2^30 = {MAX_SIZE:,} (beyond it nothing served is physical)",
            fix=f"give e.g. --{flag} {example}",
        )
    return v


def run(args: argparse.Namespace) -> int:
    check_output_path(args.plot, "--plot")  # '' was silently no chart
    model = load_model(args.model)
    system = _system(args)
    if args.steps or args.prefill_step_s is not None or args.decode_step_s is not None:
        return _run_given(args, model, system)
    step_mode = args.batch is not None or args.context is not None
    if args.kv_seq is not None or (step_mode and serve_plan(args.plan)[1] > 1):
        return _run_kv_seq(args, model, system)
    engine = _engine(args, system)
    eff = _profile(args, system, engine)
    if step_mode:
        return _run_step(args, model, system, eff, engine)
    doc, text = cost_serving(args, model, system, eff, engine)
    return emit(args, NAME, _inputs(args, model, system, eff, engine), doc, text)


def serve_namespace(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed by serve's own parser (serve's defaults for what it leaves out): how
    `roofline import` and `roofline export` run serve for a serving launch file."""
    p = argparse.ArgumentParser(prog="roofline serve")
    add_arguments(p)
    return p.parse_args(argv)


def cost_serving(
    args: argparse.Namespace, model, system: System, eff: Efficiency, engine: EngineProfile | None
) -> tuple[dict[str, Any], str]:
    """serve's search for the load (the plan fixed by `--plan` when given) as `serve` runs it:
    (the result document, the text). `roofline import` costs a serving launch file through
    this same function, with the engine's profile as the file sets it."""
    plan, kvseq = serve_plan(args.plan)
    if kvseq > 1 and engine is not None:
        raise SpecError(
            f"--plan {args.plan} with engine {engine.name}",
            rule="a sequence-sharded KV replica (kvseq) is costed without an engine model: the "
            "search lists it only with --engine none, and no engine launch expresses it",
            fix="add --engine none, or drop kvseq from --plan",
        )
    q = ServeQuery(
        model=model,
        system=system,
        workload=_workload(args),
        quants=_quants(args, system, engine),
        plan=plan,
        kvseq=kvseq,
        engine=engine,
        efficiency=eff,
        slo_ttft_s=parse_duration(args.slo_ttft, "slo-ttft"),
        slo_tpot_s=parse_duration(args.slo_tpot, "slo-tpot"),
        objective=Objective(args.objective),
    )
    res = search(q)
    doc = _search_doc(res, args)
    if args.plot:
        from roofline.report.serving_plots import pareto_chart

        m = res.evaluated.metrics
        ok = res.evaluated.reason == ""
        pareto_chart(
            np.where(ok, m["tokens_per_s_per_user"], np.nan),
            np.where(ok, m["tokens_per_s_per_chip"], np.nan),
            res.pareto,
            args.plot,
            title=f"{model.name} on {system.name}",
            best=res.best,
        )
    doc["launch"] = _launch(model, engine, doc.get("best"))
    return doc, _search_text(res, doc, args) + launch_text(doc["launch"])


def _launch(model, engine: EngineProfile | None, best: dict[str, Any] | None):
    """The best plan as the engine's launch line (`launch.lines`; None without a plan or a
    writer for the engine)."""
    if best is None or engine is None:
        return None
    return serving_launch(
        engine.name,
        model=model.name,
        plan=best["plan"],
        chips=int(best["chips_per_replica"] * round(best["replicas"])),
        quant=best["quant"],
    )


def _inputs(args, model, system, eff, engine) -> dict[str, Any]:
    return {
        "model": model.name,
        "system": system.name,
        "chips": system.n_chips,
        "prompt": args.prompt,
        "gen": args.gen,
        "concurrency": args.concurrency,
        "rate": args.rate,
        "objective": args.objective,
        "plan": args.plan,
        "profile": eff.to_dict() if hasattr(eff, "to_dict") else getattr(eff, "name", "custom"),
        "engine": engine.name if engine else None,
        "price": _price(args, system),
        "definitions": "TTFT, TPOT (first token excluded), ITL and E2EL as vLLM's benchmark_serving defines them",
    }


def _run_given(args, model, system: System) -> int:
    """Size a disaggregated deployment from given prefill and decode step times."""
    from roofline.core.ledger import kv_cache_bytes_per_token
    from roofline.serving.given import GivenSteps, explain, load_step_times, size_deployment
    from roofline.serving.steady import kv_link_bytes_per_s

    if args.steps:
        f = load_step_times(args.steps)
        for key, flag in (("prefill_step_s",) * 2, ("decode_step_s",) * 2, ("batch", "batch")):
            if getattr(args, flag) is None and key in f:
                setattr(args, flag, str(f[key]))
        if args.prefill_batch == "1" and "prefill_batch" in f:
            args.prefill_batch = str(f["prefill_batch"])
    if args.prefill_step_s is None or args.decode_step_s is None or args.batch is None:
        raise SpecError(
            "given step times need --prefill-step-s, --decode-step-s and --batch together",
            rule="a deployment is sized from a prefill pass time and a decode step time at a batch",
            fix="add e.g. --prefill-step-s 0.91s --decode-step-s 19ms --batch 32",
        )
    if args.concurrency is not None:
        raise SpecError(
            f"--concurrency {args.concurrency} with given step times",
            rule="given step times size the pools for an arrival rate (Little's law)",
            fix="give the load as --rate (requests per second), or drop it",
        )
    P, G = _tokens(args.prompt, "prompt", "8192"), _tokens(args.gen, "gen", "512")
    chips = parse_serve_plan(args.plan).chips if args.plan else system.n_chips
    g = GivenSteps(
        prefill_step_s=parse_duration(args.prefill_step_s, "prefill-step-s"),
        decode_step_s=parse_duration(args.decode_step_s, "decode-step-s"),
        decode_batch=_size(args.batch, "batch", "sequences", "32", lo=1.0),
        prompt=P,
        gen=G,
        kv_bytes_per_token=kv_cache_bytes_per_token(model, args.kv_dtype or "bf16", P + G),
        prefill_batch=_size(args.prefill_batch, "prefill-batch", "prompts", "1", lo=1.0),
        rate=_size(args.rate, "rate", "requests per second", "10", lo=0.0),
        kv_link_bytes_per_s=kv_link_bytes_per_s(system.chip) * chips,
    )
    s = size_deployment(g)
    head = (
        f"{model.name} disaggregated from given step times on {system.name}: prompt {P:g}, "
        f"output {G:g} tokens, {args.kv_dtype or 'bf16'} KV"
    )
    inputs = {"model": model.name, "system": system.name, "plan": args.plan}
    return emit(args, NAME, inputs, {"given_steps": s.to_dict()}, "\n".join([head, *explain(s)]))


def serve_plan(text: str | None) -> tuple[ServePlan | None, int]:
    """`--plan` as the search prints its rows: the replica's sharding (parse_serve_plan) and
    its `kvseq=K`, the chips each sequence's KV cache is split over (1 where not given)."""
    if not text:
        return None, 1
    items = str(text).split(",")
    kv = [p for p in items if p.partition("=")[0].strip().lower() == "kvseq"]
    plan = parse_serve_plan(",".join(p for p in items if p not in kv))
    if not kv:
        return plan, 1
    kvseq = int_flag(kv[-1].partition("=")[2].strip(), "plan kvseq", hi=MAX_SIZE, example="2")
    return _seq_sharded(plan, text), kvseq


def _seq_sharded(plan: ServePlan, text: str) -> ServePlan:
    if plan.chips != plan.tp or plan.ep > 1:
        raise SpecError(
            f"--plan {text} with a sequence-sharded KV cache (kvseq, --kv-seq)",
            rule="a sequence-sharded KV replica is tp × kvseq chips: heads over tensor, the "
            "context over kvseq (pp, dp and ep are not modelled with it)",
            fix=f"write --plan tp={plan.tp}",
        )
    return plan


def _kv_seq_tp(text: str | None) -> int:
    """The tensor degree of a sequence-sharded replica (its only other degree)."""
    plan, _ = serve_plan(text)
    return 1 if plan is None else _seq_sharded(plan, str(text)).tp


def _kv_seq_of(args) -> int:
    """--kv-seq, or the plan's kvseq (`--plan tp=8,kvseq=2` is `--plan tp=8 --kv-seq 2`)."""
    _, in_plan = serve_plan(args.plan)
    if args.kv_seq is None:
        return in_plan
    kvseq = int_flag(args.kv_seq, "kv-seq", hi=MAX_SIZE, example="4")
    if in_plan > 1 and in_plan != kvseq:
        raise SpecError(
            f"--plan {args.plan} with --kv-seq {args.kv_seq}",
            rule="the KV sequence degree is given once: kvseq in --plan or --kv-seq",
            fix="drop one of them",
        )
    return kvseq


def _run_kv_seq(args, model, system: System) -> int:
    """Decode attention with each sequence's KV cache sharded over --kv-seq chips."""
    from roofline.serving.seqkv import explain, sequence_sharded_decode

    if args.batch is None or args.context is None:
        raise SpecError(
            "--kv-seq needs --batch and --context",
            rule="a sequence-sharded KV cache is sized for a batch of sequences of a context",
            fix="add e.g. --batch 1 --context 1M",
        )
    tp = _kv_seq_tp(args.plan)
    kvseq = _kv_seq_of(args)
    batch = int_flag(args.batch, "batch", hi=MAX_SIZE, example="1")
    ctx = _tokens(args.context, "context", "1M")
    quant = Quant(
        args.weight_dtype or "bf16", args.kv_dtype or "bf16", args.compute_dtype or "bf16"
    )
    s = sequence_sharded_decode(
        model, system, tp=tp, kvseq=kvseq, batch=batch, context=ctx, quant=quant
    )
    head = (
        f"{model.name} decode with the KV cache sharded over the sequence: tp={tp} × "
        f"kvseq={kvseq} per replica on {system.name}, batch {batch}, context {ctx:g}, "
        f"{quant.weights} weights, {quant.kv} KV"
    )
    inputs = {"model": model.name, "system": system.name, "plan": args.plan, "kv_seq": kvseq}
    return emit(args, NAME, inputs, {"seq_kv": s.to_dict()}, "\n".join([head, *explain(s)]))


def _price(args, system) -> dict[str, Any]:
    """The chip-hour price every $ figure uses and its one stated source (issue 18 item 7)."""
    if args.price is not None:
        return {"usd_per_chip_hour": args.price, "source": "--price"}
    chip = system.chip
    return {"usd_per_chip_hour": system.usd_per_chip_hour, "source": chip.price_source or None}


def _cost_lines(b: dict, price: dict[str, Any]) -> list[tuple[str, str]]:
    """The best plan's bill per output token (what the cost objective ranks), its split between
    output and input tokens, and the price with its source."""
    cost = "-"
    if b["usd_per_million_output_tokens"] is not None:
        cost = (
            f"${b['usd_bill_per_million_output_tokens']:.3f} bill / M output "
            f"(${b['usd_per_million_output_tokens']:.3f} / M output + "
            f"${b['usd_per_million_input_tokens']:.3f} / M input)"
        )
    return [("cost", cost), ("price", _price_text(price))]


def _price_text(p: dict[str, Any]) -> str:
    if p["usd_per_chip_hour"] is None:
        return f"none ({p['source'] or 'no price known'}): give --price"
    return f"${p['usd_per_chip_hour']:.2f} / chip-hour ({p['source']})"


def _run_step(args, model, system, eff, engine) -> int:
    if not (args.plan and args.batch and args.context):
        raise SpecError(
            "the one-step mode needs --plan, --batch and --context together",
            rule="a decode step is a replica's sharding, a batch of sequences and their KV length",
            fix="add e.g. --plan tp=8 --batch 32 --context 8192",
        )
    plan = parse_serve_plan(args.plan)
    batch = int_flag(args.batch, "batch", hi=MAX_SIZE, example="32")
    ctx = _tokens(args.context, "context", "8192")
    quant = Quant(
        args.weight_dtype or "bf16", args.kv_dtype or "bf16", args.compute_dtype or "bf16"
    )
    prompt = _tokens(args.prompt, "prompt", "8192") if args.prompt != "1024" else None
    spec = None
    if args.draft:
        from roofline.serving.steady import Speculation

        spec = Speculation(args.draft, args.acceptance, args.draft_cost)
    r = step_report(
        model, system, plan, batch, ctx, quant, eff, prompt=prompt, engine=engine, speculation=spec
    )
    r["launch"] = (
        None
        if engine is None
        else serving_launch(
            engine.name,
            model=model.name,
            plan=plan.to_dict(),
            chips=plan.chips,
            quant={"weights": quant.weights, "kv": quant.kv, "compute": quant.compute},
            draft=args.draft,
        )
    )
    text = _step_text(r, model, system) + launch_text(r["launch"])
    return emit(args, NAME, _inputs(args, model, system, eff, engine), r, text)


def _step_text(r: dict, model, system) -> str:
    mem = r["memory"]
    lines = [
        f"{model.name} decode step on {system.name}: plan {r['plan']['spec']}, batch {r['batch']}, "
        f"context {r['context']:g}, {r['quant']['weights']} weights, {r['quant']['kv']} KV, "
        f"{r['quant']['compute']} compute, profile {r['efficiency']}",
        "",
        kv(
            [
                ("weights per chip", fmt_bytes(mem["weights_bytes"])),
                (
                    "KV cache per chip",
                    f"{fmt_bytes(mem['kv_bytes'])}  ({fmt_bytes(r['kv_cache_bytes_per_token'])}/token × batch × context / chips)",
                ),
                (
                    "memory per chip",
                    f"{fmt_bytes(r['memory_per_chip_bytes'])} of {fmt_bytes(mem['hbm_bytes'])} ({'fits' if mem['fits'] else 'DOES NOT FIT'})",
                ),
                ("max batch at this context", f"{r['max_batch']:g}"),
                ("HBM time (weights + KV read)", fmt_time(r["hbm_time_s"])),
                ("compute time", fmt_time(r["compute_time_s"])),
                ("kernel launches", fmt_time(r["launch_time_s"]) + "  (fixed time per kernel)"),
                ("collectives", fmt_time(r["comm_time_s"]) + "  (exposed, with per-hop latency)"),
                (
                    "engine host time",
                    fmt_time(r["engine_overhead_s"])
                    + f"  ({r['engine'] or 'no engine'}, per pass)",
                ),
                ("step time", f"{fmt_time(r['step_time_s'])}  ({r['bound']}-bound)"),
                (
                    "tokens/s",
                    f"{r['tokens_per_s']:,.0f}  ({r['tokens_per_s_per_chip']:,.1f} per chip, {r['tokens_per_s_per_user']:,.1f} per user)",
                ),
                ("prefill of the context (TTFT)", fmt_time(r["ttft_s"])),
                (
                    "$ / M output tokens",
                    "-"
                    if r["usd_per_million_output_tokens"] is None
                    else f"${r['usd_per_million_output_tokens']:.3f}",
                ),
            ]
        ),
    ]
    if "speculative" in r:
        sp = r["speculative"]
        lines.append(
            f"speculative decoding  γ={sp['draft_tokens']}, α={sp['acceptance']:g}: "
            f"{sp['tokens_per_verify']:.2f} tokens per verify pass, TPOT {fmt_time(sp['tpot_s'])} "
            f"({sp['speedup']:.2f}x)"
        )
    return "\n".join(lines)


def _search_doc(res, args) -> dict[str, Any]:
    ev = res.evaluated
    best = res.best
    rows = [res.row(int(i)) for i in res.order[: max(args.top, 1)]]
    doc: dict[str, Any] = {
        "candidates_evaluated": int(len(ev.cand)),
        "rejections": res.rejections(),
    }
    if best is None:
        doc.update({"plan": None, "top": [], "pareto": []})
        return doc
    b = res.row(best)
    for k in (
        "ttft_s",
        "tpot_s",
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_chip",
        "tokens_per_s_per_user",
        "max_batch",
        "memory_per_chip_bytes",
        "usd_per_million_output_tokens",
        "usd_per_million_input_tokens",
        "usd_bill_per_million_output_tokens",
    ):
        doc[k] = b[k]
    doc["plan"] = b["plan"]
    doc["best"] = b
    doc["bound"] = "memory" if b["step_time_s"] and b["tpot_s"] else None
    doc["kv_cache_bytes_per_token"] = _kv_tok(res, best)
    doc["top"] = rows
    from roofline.serving.search import disaggregated_view

    doc["disaggregated"] = disaggregated_view(res, best)
    doc["pareto"] = [
        {
            k: res.row(int(i))[k]
            for k in (
                "plan",
                "batch",
                "quant",
                "tokens_per_s_per_user",
                "tokens_per_s_per_chip",
                "ttft_s",
                "tpot_s",
            )
        }
        for i in res.pareto
    ]
    return doc


def _kv_tok(res, i: int) -> float:
    from roofline.core.ledger import kv_cache_bytes_per_token

    q = res.query
    quant = q.quants[int(res.evaluated.cand.quant[i])]
    return kv_cache_bytes_per_token(q.model, quant.kv, context=q.workload.max_context)


def _search_text(res, doc: dict, args) -> str:
    q = res.query
    head = (
        f"{q.model.name} on {q.system.name}: prompt {q.workload.prompt:g}, output {q.workload.gen:g} tokens, "
        f"objective {q.objective.value}; {doc['candidates_evaluated']} candidates"
    )
    rej = ", ".join(f"{k}: {v}" for k, v in doc["rejections"].items()) or "none"
    if res.best is None:
        return f"{head}\nno plan is feasible. Rejected: {rej}"
    b = doc["best"]
    best = [
        (
            "plan",
            f"{b['plan']['spec']} on {b['system']} × {b['replicas']:g} replica(s), {b['batch']:g} requests in flight each",
        ),
        (
            "quantisation",
            f"{b['quant']['weights']} weights, {b['quant']['kv']} KV, {b['quant']['compute']} compute",
        ),
        (
            "memory per chip",
            f"{fmt_bytes(b['weights_per_chip_bytes'])} weights + KV = {fmt_bytes(b['memory_per_chip_bytes'])} (max batch {b['max_batch']:g})",
        ),
        ("TTFT", fmt_time(b["ttft_s"])),
        (
            "TPOT",
            f"{fmt_time(b['tpot_s'])}  (decode pass {fmt_time(b['step_time_s'])}; prefill takes {100 * b['prefill_share']:.0f}% of the time)",
        ),
        (
            "throughput",
            f"{b['tokens_per_s']:,.0f} tok/s = {b['tokens_per_s_per_chip']:,.1f} per chip, {b['tokens_per_s_per_user']:,.1f} per user",
        ),
        *_cost_lines(b, _price(args, q.system)),
    ]
    top = table(
        [
            (
                r["plan"]["spec"],
                r["chips_per_replica"],
                f"{r['batch']:g}",
                "/".join(r["quant"][k] for k in ("weights", "kv", "compute")),
                fmt_time(r["ttft_s"]),
                fmt_time(r["tpot_s"]),
                f"{r['tokens_per_s_per_chip']:,.1f}",
                "-"
                if r["usd_bill_per_million_output_tokens"] is None
                else f"{r['usd_bill_per_million_output_tokens']:.3f}",
            )
            for r in doc["top"]
        ],
        ["plan", "chips", "batch", "w/kv/compute", "TTFT", "TPOT", "tok/s/chip", "bill $/M out"],
    )
    par = table(
        [
            (
                p["plan"]["spec"],
                f"{p['batch']:g}",
                p["quant"]["weights"],
                f"{p['tokens_per_s_per_user']:,.1f}",
                f"{p['tokens_per_s_per_chip']:,.1f}",
            )
            for p in doc["pareto"]
        ],
        ["plan", "batch", "weights", "tok/s/user", "tok/s/chip"],
    )
    dg = doc.get("disaggregated")
    if dg:
        best.append(
            (
                "disaggregated",
                f"{dg['prefill_replicas']} prefill : {dg['decode_replicas']} decode replicas "
                f"(balance {dg['prefill_decode_ratio']:.2f}:1): "
                f"TTFT {fmt_time(dg['ttft_s'])} (KV transfer {fmt_time(dg['kv_transfer_s'])}"
                + (f", hand-off {fmt_time(dg['handoff_s'])}" if dg.get("handoff_s") else "")
                + "), "
                f"TPOT {fmt_time(dg['tpot_s'])}",
            )
        )
    return "\n".join(
        [
            head,
            "",
            "best plan",
            kv(best),
            "",
            f"top {len(doc['top'])}",
            top,
            "",
            f"rejected: {rej}",
            "",
            "Pareto (tokens/s/user vs tokens/s/chip)",
            par,
        ]
    )
