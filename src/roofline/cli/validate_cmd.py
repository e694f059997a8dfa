"""`roofline validate`: predict published measured runs from their configs and score the error.

roofline validate --runs training                 # the public training runs (shipped)
roofline validate --runs my_runs.yaml --json      # any file in the same schema
roofline validate --runs serving --plot s.png     # TTFT / TPOT / throughput, separately
"""

from __future__ import annotations

import argparse
from typing import Any

from roofline.cli._common import add_json, emit
from roofline.report.table import table
from roofline.report.text import held_out_error

NAME = "validate"
HELP = "predict published measured runs (training, inference, serving) and report the error"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--runs",
        required=True,
        help="YAML file of measured runs (schema detected), or training | inference | serving "
        "for the public files shipped with roofline",
    )
    p.add_argument(
        "--framework",
        default="auto",
        help="framework profile for every run (auto: each run's own stack; none: no profile)",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="efficiency profile: default (the measured-calibrated 'fitted' profile, "
        "specs/profiles/fitted.toml, as roofline train), datasheet, peak, a name, or a TOML file",
    )
    p.add_argument(
        "--plot", metavar="FILE", help="predicted vs measured scatter (.png, .svg, .pdf)"
    )
    p.add_argument(
        "--planner",
        action="store_true",
        help="also let the planner choose a plan per run (slower: one search per run)",
    )
    p.add_argument(
        "--show-defaults", action="store_true", help="list every default filled, per run"
    )
    p.add_argument(
        "--analysis",
        action="store_true",
        help="training: print the error analysis (one scalar per group; regression on causes)",
    )
    add_json(p)


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _group_table(groups: dict[str, dict[str, Any]], label: str) -> str:
    rows = [
        [
            k,
            f"{s['n']}/{s['n_total']}",
            _pct(s["median_abs_error"]),
            _pct(s["bias"], True),
            _pct(s["within_10"]),
            _pct(s["within_20"]),
        ]
        for k, s in groups.items()
    ]
    return table(rows, [label, "covered", "median |err|", "bias", "within 10%", "within 20%"])


def _summary_line(s: dict[str, Any]) -> str:
    if not s["n"]:
        return f"covered 0/{s['n_total']}: nothing to score"
    return (
        f"covered {s['n']}/{s['n_total']} ({s['coverage']:.0%}); median |error| "
        f"{_pct(s['median_abs_error'])}, mean {_pct(s['mean_abs_error'])}; within 10% "
        f"{_pct(s['within_10'])}, within 20% {_pct(s['within_20'])}; bias {_pct(s['bias'], True)} "
        f"(median signed error; + = predicted too fast)"
    )


def _render_analysis(a: dict[str, Any]) -> list[str]:
    out = ["Error analysis (diagnostics only; nothing is fitted into the predictions):"]
    for key in ("one_scalar_per_chip_family", "one_scalar_per_stack", "one_scalar_per_source"):
        s = a[key]
        out.append(
            f"  {key.replace('_', ' ')}: median |error| {_pct(s['median_abs_error_before'])} -> "
            f"{_pct(s['median_abs_error_after'])}"
        )
    reg = a["regression"]
    if reg.get("factors"):
        out.append(
            f"  regression of log(predicted/measured) on causes ({reg['n']} runs; base case: "
            f"Megatron-family GPU, <=8k, no pipeline, dense, 10-100B, bf16): base x{reg['base_factor']:.2f}"
        )
        rows = [
            [k, v["runs"], f"x{v['factor']:.2f}", f"{v['se_log']:.2f}"]
            for k, v in reg["factors"].items()
        ]
        out += [
            "    " + line
            for line in table(rows, ["cause", "runs", "factor", "s.e. (log)"]).splitlines()
        ]
        out.append(
            f"  median |residual| of the fit: {_pct(reg['median_abs_error_of_fit_residual'])}"
        )
    return out + [""]


def _render_training(
    report, doc: dict[str, Any], show_defaults: bool, show_analysis: bool = False
) -> str:
    runs = doc["runs"]
    fw = doc["framework"] + (
        "" if doc["framework_applied"] else " (not applied: the core has no framework profiles yet)"
    )
    out = [f"Training runs: {len(runs)} ({doc['profile']}, framework {fw})", ""]
    rows = [
        [
            r["id"],
            r["source"],
            r["chip_family"],
            _num(r["predicted_tokens_per_s_per_chip"]),
            _num(r["measured_tokens_per_s_per_chip"]),
            _pct(r["error"], True),
            r["measured_metric"] or "",
        ]
        for r in runs
        if r["error"] is not None
    ]
    out.append(
        table(
            rows,
            ["run", "source", "chip", "predicted tok/s/chip", "measured", "error", "measured as"],
            align="lllrrrl",
        )
    )
    skipped = [r for r in runs if r["error"] is None]
    if skipped:
        out += ["", f"Not covered ({len(skipped)}):"]
        out += [f"  {r['id']}: {r['skipped_reason']}" for r in skipped]
    if show_defaults:
        out += ["", "Defaults filled per run:"]
        for r in runs:
            out.append(f"  {r['id']}: plan {r['plan'] or '-'}; system {r['system'] or '-'}")
            out += [f"    - {d}" for d in r["defaults"]]
    out += ["", "Summary: " + _summary_line(doc["summary"]), ""]
    out += ["By source:", _group_table(doc["by_source"], "source"), ""]
    out += ["By chip family:", _group_table(doc["by_chip_family"], "chip family"), ""]
    for cause, groups in doc["by_cause"].items():
        out += [f"By {cause.replace('_', ' ')}:", _group_table(groups, cause), ""]
    if show_analysis:
        out += _render_analysis(doc["analysis"])
    if doc.get("planner"):
        pl = doc["planner"]
        out.append(
            f"Planner: on {pl['n']} runs its best plan is predicted {_pct(pl['median_excess'], True)} "
            f"(median) above the measured throughput of the run's own plan; within 15%: "
            f"{_pct(pl['within_15'])}; search {pl['search_time_s']:.1f} s"
        )
        parts = [
            f"{name} runs {_pct(g['median_excess'], True)} ({g['n']})"
            for name, g in pl.get("by_precision", {}).items()
            if g["n"]
        ]
        if parts:
            out.append("  median excess by compute precision: " + ", ".join(parts))
    return "\n".join(out).rstrip()


def _render_serving(report, doc: dict[str, Any]) -> str:
    out = [
        f"{doc['schema'].capitalize()} runs: {doc['n_total']} ({doc['mapped']} mapped to the tool's inputs)"
    ]
    if not doc["predictor_available"]:
        out.append(
            f"The serving model ({doc['predictor']}) is not available yet: every mapped run is skipped."
        )
    out.append("")
    rows = []
    for m, s in doc["summary"].items():
        rows.append(
            [
                m,
                f"{s['n']}/{s['n_total']}",
                _pct(s["median_abs_error"]),
                _pct(s["bias"], True),
                _pct(s["within_10"]),
                _pct(s["within_20"]),
            ]
        )
    out += [
        "Per metric (errors never pooled):",
        table(rows, ["metric", "covered", "median |err|", "bias", "within 10%", "within 20%"]),
        "",
    ]
    for key, label in (("by_engine", "engine"), ("by_chip_family", "chip family")):
        for m, groups in doc[key].items():
            if any(g["n"] for g in groups.values()):
                out += [f"{m} by {label}:", _group_table(groups, label), ""]
    out.append("Not covered, by reason:")
    out += [f"  {n:4d}  {k}" for k, n in sorted(doc["skipped"].items(), key=lambda kv: -kv[1])]
    return "\n".join(out).rstrip()


def held_out(eff: Any, schema: str) -> dict[str, Any] | None:
    """The profile's held-out error for this schema's runs (report.text.held_out_error)."""
    return held_out_error(getattr(eff, "provenance", None) or {}, schema)


def _held_out_line(name: str, h: dict[str, Any]) -> str:
    parts = [
        f"{_pct(f['median_abs'])} {what}"
        + (f" over {f['n']} runs" if f.get("n") else "")
        + f" (bias {_pct(f['bias'], True)})"
        for what, f in h["folds"].items()
    ]
    return (
        f"Held out (the honest number): median |error| {'; '.join(parts)} — profile '{name}' "
        f"cross-validated on the runs of '{h['runs_file']}' it was fitted on ({h['runs']} runs; "
        "docs/calibration.md); the errors above are in-sample for those runs."
    )


def run(args: argparse.Namespace) -> int:
    from roofline.validate import ServingReport, load_profile, load_runs, profile_used, validate
    from roofline.validate.plot import plot_serving, plot_training

    rf = load_runs(args.runs)
    report = validate(rf, profile=args.profile, framework=args.framework, planner=args.planner)
    doc = report.to_dict()
    if args.plot:
        (plot_serving if isinstance(report, ServingReport) else plot_training)(report, args.plot)
    inputs = {
        "runs": rf.path,
        "schema": rf.schema.value,
        "framework": args.framework,
        "profile": args.profile or "default",
        "profile_used": profile_used(load_profile(args.profile)).to_dict(),
        "planner": args.planner,
    }
    text = (
        _render_serving(report, doc)
        if isinstance(report, ServingReport)
        else _render_training(report, doc, args.show_defaults, args.analysis)
    )
    if isinstance(report, ServingReport):
        used = inputs["profile_used"]
        text = f"Predicted with efficiency profile '{used['name']}' ({used['kind']})\n" + text
    h = held_out(profile_used(load_profile(args.profile)), rf.schema.value)
    doc["held_out"] = h
    if h:
        text += "\n\n" + _held_out_line(inputs["profile_used"]["name"], h)
    if args.plot and not args.json:
        text += f"\n\nPlot written to {args.plot}"
    return emit(args, NAME, inputs, doc, text)
