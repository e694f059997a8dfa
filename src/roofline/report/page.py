"""The proposal page's content, read off the CLI's `--json` documents (no arithmetic of its own).

`ReportDocuments` holds the documents of one report (`roofline train`, `model`, `system`,
`chip`, and optionally `serve`). The functions below turn them into rows and chart data
that both renderers (`page_html`, `page_md`) and the charts (`page_charts`) share. They
format and select; every number shown is a field of a document. Where a document lacks a
field (an older or newer schema), the row says so instead of guessing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roofline.report.text import precisions_phrase
from roofline.units import DAY, fmt_bytes, fmt_count, fmt_flops, fmt_rate, fmt_time, fmt_usd

Row = tuple[str, str]


@dataclass(frozen=True)
class ReportDocuments:
    """The documents one report is made of, exactly as `roofline <command> --json` prints them."""

    train: Mapping[str, Any]
    model: Mapping[str, Any]
    system: Mapping[str, Any]
    chip: Mapping[str, Any]
    serve: Mapping[str, Any] | None = None
    commands: Mapping[str, str] = field(default_factory=dict)
    version: str = "0.0.0"

    def as_dict(self) -> dict[str, Any]:
        docs = {"train": self.train, "model": self.model, "system": self.system, "chip": self.chip}
        if self.serve is not None:
            docs["serve"] = self.serve
        return {"roofline_version": self.version, "commands": dict(self.commands), **docs}


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if x in ("inf", "-inf"):
        return float(x)
    return None


def fmt(value: Any, kind: str) -> str:
    """One document value in the CLI's units (`time`, `bytes`, `count`, `usd`, `pct`, `flops`)."""
    v = _num(value)
    if v is None:
        return "—" if value is None else str(value)
    if not math.isfinite(v):
        return str(value)
    return {
        "time": fmt_time,
        "bytes": fmt_bytes,
        "count": fmt_count,
        "usd": fmt_usd,
        "flops": fmt_flops,
        "rate": fmt_rate,
        "pct": lambda x: f"{x:.1%}",
        "days": lambda x: f"{x / DAY:.1f} days",
        "g": lambda x: f"{x:.4g}",
    }[kind](v)


def title(docs: ReportDocuments) -> str:
    i = docs.train.get("inputs", {})
    return f"{i.get('model', '?')} on {i.get('system', '?')}"


def chosen(docs: ReportDocuments) -> Mapping[str, Any] | None:
    """The chosen plan's cost document (the search's best, or the one `--plan`), if there is one."""
    return docs.train if "step_time_s" in docs.train else None


def plan_spec(cost: Mapping[str, Any]) -> str:
    p = cost.get("plan")
    return str(p.get("spec", "?")) if isinstance(p, Mapping) else str(p)


def plan_chips(cost: Mapping[str, Any]) -> int | None:
    """Chips of a plan: the product of its mesh axes (as the document lists them)."""
    p = cost.get("plan")
    axes = p.get("mesh_axes") if isinstance(p, Mapping) else None
    if not axes:
        return None
    return math.prod(int(size) for _, size in axes)


def input_rows(docs: ReportDocuments) -> list[Row]:
    i = dict(docs.train.get("inputs", {}))
    rows: list[Row] = [
        (k.replace("_", " "), _profile_name(v) if k == "profile" else _plain(v))
        for k, v in i.items()
        if v is not None
    ]
    s, c = docs.system, docs.chip
    rows.append(("chip", f"{c.get('name')} ({c.get('generation', c.get('vendor', ''))})"))
    rows.append(
        ("price", f"${s['usd_per_chip_hour']:g}/chip-hour" if s.get("usd_per_chip_hour") else "—")
    )
    rows.append(("roofline version", docs.version))
    return rows


def _plain(v: Any) -> str:
    n = _num(v)
    if n is not None and math.isfinite(n) and n >= 1e5:
        return f"{fmt_count(n)} ({n:.6g})"
    return str(v)


def summary_rows(docs: ReportDocuments) -> list[Row]:
    """The chosen plan's key figures, as `roofline train` prints them."""
    c = chosen(docs)
    if c is None:  # e.g. --assume-mfu: the document's own scalars, the formula among them
        skip = {"schema_version", "command"}
        return [
            (k.replace("_", " "), v if isinstance(v, str) else fmt(v, "g"))
            for k, v in docs.train.items()
            if k not in skip and (_num(v) is not None or isinstance(v, str))
        ]
    rows: list[Row] = [
        ("plan", plan_spec(c)),
        ("system", str(docs.train.get("system_used", docs.train["inputs"].get("system")))),
        ("chips", str(plan_chips(c) or docs.train.get("chips_used", "?"))),
        ("step time", fmt(c.get("step_time_s"), "time")),
        ("MFU", fmt(c.get("mfu"), "pct") + f" (HFU {fmt(c.get('hfu'), 'pct')})"),
        ("tokens/s", fmt(c.get("tokens_per_s"), "count")),
        ("memory per chip", _memory_line(c)),
        ("limited by", str(c.get("bottleneck", "—"))),
        ("run", _run_line(c)),
    ]
    return rows


def _memory_line(c: Mapping[str, Any]) -> str:
    fits = "fits" if c.get("fits") else "DOES NOT FIT"
    cap = c.get("hbm_fit_bytes") or c.get("hbm_bytes")
    return f"{fmt(c.get('memory_per_chip_bytes'), 'bytes')} of {fmt(cap, 'bytes')} ({fits})"


def _run_line(c: Mapping[str, Any]) -> str:
    days = fmt(c.get("run_time_s"), "days") if c.get("run_time_s") else "—"
    cost = c.get("run_cost_usd")
    return days + ("" if cost is None else f", {fmt(cost, 'usd')}")


# --- the step timeline and memory of the listed plans -------------------------------------

TIMELINE_ORDER = ("compute", "exposed", "bubble", "optimizer", "overheads", "other")


def timeline_segments(cost: Mapping[str, Any]) -> list[dict[str, Any]]:
    """compute, exposed communication per kind, bubble, optimizer, the profile's and stack's fixed
    overheads (and any remainder) in seconds.

    The parts are the document's own fields; if they do not add up to `step_time_s` (a newer
    step model with more terms), the remainder is shown as "other" rather than dropped.
    """
    parts = [("compute", "compute", cost.get("compute_time_s"))]
    for kind, t in (cost.get("exposed_time_s") or {}).items():
        parts.append(("exposed", f"exposed {kind}", t))
    parts += [
        ("bubble", "pipeline bubble", cost.get("bubble_time_s")),
        ("optimizer", "optimizer", cost.get("optimizer_time_s")),
        ("overheads", "fixed overheads (step, per layer)", cost.get("overhead_time_s")),
    ]
    segs = [
        {"group": g, "part": name, "seconds": float(t)} for g, name, t in parts if _num(t) and t > 0
    ]
    step = _num(cost.get("step_time_s")) or 0.0
    rest = step - sum(s["seconds"] for s in segs)
    if rest > 1e-6 * max(step, 1e-30):
        segs.append({"group": "other", "part": "other (step − listed parts)", "seconds": rest})
    return segs


def listed_plans(docs: ReportDocuments) -> list[Mapping[str, Any]]:
    top = list(docs.train.get("top") or [])
    c = chosen(docs)
    if c is not None and (not top or plan_spec(top[0]) != plan_spec(c)):
        top.insert(0, c)
    return top


def plan_label(rank: int, cost: Mapping[str, Any]) -> str:
    return f"#{rank} {plan_spec(cost)}"


def timeline_data(docs: ReportDocuments) -> list[dict[str, Any]]:
    out = []
    for rank, c in enumerate(listed_plans(docs), 1):
        for j, s in enumerate(timeline_segments(c)):
            out.append(
                {
                    **s,
                    "plan": plan_label(rank, c),
                    "rank": rank,
                    "index": j,
                    "time": fmt_time(s["seconds"]),
                }
            )
    return out


def memory_data(docs: ReportDocuments) -> list[dict[str, Any]]:
    out = []
    for rank, c in enumerate(listed_plans(docs), 1):
        for part, b in (c.get("memory_breakdown") or {}).items():
            if _num(b):
                out.append(
                    {
                        "plan": plan_label(rank, c),
                        "rank": rank,
                        "part": part,
                        "bytes": float(b),
                        "size": fmt_bytes(b),
                    }
                )
    return out


def hbm_bytes(docs: ReportDocuments) -> float | None:
    c = chosen(docs)
    if c:
        return _num(c.get("hbm_fit_bytes") or c.get("hbm_bytes"))
    return _num(docs.chip.get("hbm_bytes"))


def top_plan_rows(docs: ReportDocuments) -> list[list[str]]:
    rows = []
    for rank, c in enumerate(listed_plans(docs), 1):
        rows.append(
            [
                str(rank),
                plan_spec(c),
                str(plan_chips(c) or "?"),
                fmt(c.get("step_time_s"), "time"),
                fmt(c.get("mfu"), "pct"),
                fmt(c.get("memory_per_chip_bytes"), "bytes"),
                str(c.get("bottleneck", "")),
                fmt(c.get("run_time_s"), "days") if c.get("run_time_s") else "—",
                fmt(c.get("run_cost_usd"), "usd"),
            ]
        )
    return rows


TOP_PLAN_HEADER = ["#", "plan", "chips", "step", "MFU", "mem/chip", "limited by", "run", "cost"]


def top_plan_points(docs: ReportDocuments) -> list[dict[str, Any]]:
    """The listed plans as (chips, step time) points."""
    return [
        {
            "chips": plan_chips(c),
            "step_time_s": c.get("step_time_s"),
            "plan": plan_spec(c),
            "step": fmt(c.get("step_time_s"), "time"),
            "rank": rank,
        }
        for rank, c in enumerate(listed_plans(docs), 1)
        if plan_chips(c) and _num(c.get("step_time_s"))
    ]


def pareto_data(docs: ReportDocuments) -> list[dict[str, Any]]:
    out = []
    for p in docs.train.get("pareto") or []:
        out.append(
            {
                "chips": p.get("chips"),
                "step_time_s": p.get("step_time_s"),
                "usd_per_million_tokens": p.get("usd_per_million_tokens"),
                "plan": p.get("plan"),
                "step": fmt(p.get("step_time_s"), "time"),
                "cost": fmt(p.get("usd_per_million_tokens"), "usd") + "/M tokens",
            }
        )
    return out


def comm_rows(cost: Mapping[str, Any]) -> list[list[str]]:
    """Per kind: communication time per step, and the time left exposed after overlap.

    The two dictionaries need not share keys (exposure is kept per overlap group, e.g.
    `fsdp+grad`); a kind missing from one side shows "—".
    """
    raw = cost.get("comm_time_s") or {}
    exposed = cost.get("exposed_time_s") or {}
    rows = []
    for k in dict.fromkeys([*raw, *exposed]):
        r, e = raw.get(k), exposed.get(k)
        if _num(r) or _num(e) or k not in raw:
            rows.append(
                [k, "—" if r is None else fmt(r, "time"), "—" if e is None else fmt(e, "time")]
            )
    return rows


def collective_rows(cost: Mapping[str, Any]) -> list[list[str]]:
    return [
        [
            str(c.get("op")),
            str(c.get("phase")),
            str(c.get("kind")),
            ",".join(c.get("axes") or []),
            fmt(c.get("bytes_per_chip"), "bytes"),
            fmt(c.get("time_s"), "time"),
            f"{c.get('before', '')} → {c.get('after', '')}",
        ]
        for c in cost.get("collectives") or []
    ]


def rejected_rows(docs: ReportDocuments) -> list[list[str]]:
    rej = docs.train.get("rejected") or {}
    return [[reason, f"{int(n):,}"] for reason, n in sorted(rej.items(), key=lambda kv: -kv[1])]


def search_line(docs: ReportDocuments) -> str:
    t = docs.train
    if "candidates_enumerated" not in t:
        return f"{t.get('candidates_evaluated', 1):,} plan costed (given with --plan)."
    return (
        f"Searched {t['candidates_enumerated']:,} plans{precisions_phrase(t.get('precisions_searched') or [])}"
        f" ({t.get('candidates_evaluated', 0):,} costed)"
        f" in {fmt(t.get('search_time_s'), 'time')}, objective {t.get('objective', '?')}."
    )


def assumption_rows(docs: ReportDocuments) -> list[Row]:
    c = chosen(docs) or {}
    e = c.get("efficiency") or {}
    rows: list[Row] = []
    if e:
        rows.append(("efficiency profile", _profile_physics(e, docs.chip)))
        rows.append(("its source", str(e.get("source", "—"))))
        bar = _error_bar(e.get("provenance") or {})
        if bar:
            rows.append(("its error bar", bar))
        cal = e.get("calibrated")
        rows.append(
            (
                "calibrated",
                "not stated by the profile (datasheet defaults)"
                if cal is None
                else ("yes" if cal else "no (datasheet defaults)"),
            )
        )
    fw = c.get("framework") or docs.train.get("framework")
    rows.append(("framework profile", _framework(fw, docs.train.get("inputs", {}))))
    rows.append(("optimizer", str(docs.train.get("inputs", {}).get("optimizer", "—"))))
    return rows


def _profile_name(v: Any) -> str:
    """An efficiency profile as an input: its name and kind (the document holds the whole
    profile; the assumptions section states its numbers)."""
    if isinstance(v, Mapping):
        kind = v.get("kind") or ("measured-calibrated" if v.get("calibrated") else "datasheet-only")
        return f"{v.get('name', '?')} ({kind})"
    return _plain(v)


def _family_of(e: Mapping[str, Any], chip: Mapping[str, Any]) -> tuple[str, Mapping] | None:
    """The profile family (as the document holds it) that covers the document's chip."""
    from roofline.specs.efficiency import chip_matches

    for fam, t in (e.get("families") or {}).items():
        if chip_matches(
            t.get("match", ()),
            chip.get("name", ""),
            chip.get("generation", ""),
            chip.get("aliases", ()),
        ):
            return fam, t
    return None


def _profile_physics(e: Mapping[str, Any], chip: Mapping[str, Any]) -> str:
    """What the profile assumes on this chip: a physics family's GEMM, attention, HBM and link
    fractions (GEMMs reach them at large shapes), or a constant profile's three fractions."""
    head = _profile_name(e)
    fam = _family_of(e, chip)
    if fam is None:
        fr = ", ".join(
            f"{k} {e[k]:g}" for k in ("matmul", "hbm", "link") if _num(e.get(k)) is not None
        )
        return f"{head}: {fr} of peak"
    from roofline.report.text import family_physics

    name, t = fam
    return f"{head} on {name}: {family_physics(t)}"


def _error_bar(prov: Mapping[str, Any]) -> str:
    """A calibrated profile's held-out error, as its provenance records it (docs/calibration.md)."""
    src, fam = prov.get("cv_source_after") or {}, prov.get("cv_chip_family_after") or {}
    if not src:
        return ""
    out = (
        f"training throughput on runs held out by source: median |error| "
        f"{src['median_abs']:.1%}, bias {src['bias']:+.1%}"
    )
    if fam:
        out += f"; held out by chip family: {fam['median_abs']:.1%}, bias {fam['bias']:+.1%}"
    return out + f" ({prov.get('runs', '?')} public runs; docs/calibration.md)"


def _framework(fw: Any, inputs: Mapping[str, Any] | None = None) -> str:
    from roofline.core.stack import is_auto

    if fw is None:
        return "none named (the algebra's cheapest legal options)"
    name = str(fw.get("name", fw)) if isinstance(fw, Mapping) else str(fw)
    if is_auto((inputs or {}).get("framework")):
        name += (
            " (chosen automatically, --framework auto: the chip's reference stack; "
            "--framework ideal for the book's idealised machine)"
        )
    return name


# --- the model's ledger and its roofline -----------------------------------------------

LEDGER_HEADER = [
    "row",
    "kind",
    "count",
    "params",
    "% params",
    "fwd FLOPs",
    "% FLOPs",
    "HBM bytes",
    "FLOP/B",
]


def ledger_rows(docs: ReportDocuments) -> list[list[str]]:
    rows = []
    for r in docs.model.get("ledger") or []:
        rows.append(
            [
                str(r.get("name")),
                str(r.get("kind")),
                f"{r.get('count', 1):g}",
                fmt(r.get("params"), "count") if r.get("params") else "-",
                fmt(r.get("params_share"), "pct") if r.get("params") else "-",
                fmt(r.get("flops"), "flops"),
                fmt(r.get("flops_share"), "pct"),
                fmt(r.get("bytes"), "bytes"),
                fmt(r.get("intensity"), "g"),
            ]
        )
    t = docs.model.get("totals") or {}
    rows.append(
        [
            "total",
            "",
            "",
            fmt(t.get("ledger_params"), "count"),
            "100%",
            fmt(t.get("ledger_forward_flops"), "flops"),
            "100%",
            fmt(t.get("ledger_bytes"), "bytes"),
            "",
        ]
    )
    return rows


def ledger_total_rows(docs: ReportDocuments) -> list[list[str]]:
    m = docs.model
    t = m.get("totals") or {}
    n = t.get("active_matmul_params")
    return [
        ["params", fmt(m.get("params"), "count"), "Σ rows' weights"],
        [
            "active params",
            fmt(m.get("active_params"), "count"),
            "top-k of E routed experts counted for MoE; dense: = params",
        ],
        [
            "forward FLOPs/token",
            fmt(m.get("forward_flops_per_token"), "g"),
            "Σ forward FLOPs (no elementwise) / tokens",
        ],
        [
            "train FLOPs/token",
            fmt(m.get("train_flops_per_token"), "g"),
            "3 × forward (2 forward + 4 backward per weight)",
        ],
        [
            "6·N",
            fmt(t.get("six_n_flops_per_token"), "g"),
            f"6 × {fmt(n, 'count')} active matmul weights; ledger / 6·N = {fmt(t.get('train_over_six_n'), 'g')}",
        ],
        [
            "KV cache/token",
            fmt(m.get("kv_cache_bytes_per_token"), "bytes"),
            f"{m.get('inputs', {}).get('kv_dtype', '')} keys and values of every layer",
        ],
    ]


def ledger_shape(docs: ReportDocuments) -> str:
    i = docs.model.get("inputs", {})
    return f"forward pass of {i.get('batch', 1)} sequence(s) of {i.get('seq', '?')} tokens"


def roofline_points(docs: ReportDocuments) -> tuple[list[dict[str, Any]], list[str]]:
    """Ledger rows with a place on log-log axes, and the names of those without (no FLOPs)."""
    placed, skipped = [], []
    for r in (docs.model.get("roofline") or {}).get("rows") or []:
        x, y = _num(r.get("intensity")), _num(r.get("achieved_flops_per_s"))
        if not x or not y or x <= 0 or y <= 0:
            skipped.append(str(r.get("name")))
            continue
        placed.append(
            {
                "op": r.get("name"),
                "intensity": x,
                "flops_per_s": y,
                "bound": r.get("bound"),
                "dtype": r.get("compute_dtype"),
                "flops": fmt(r.get("flops"), "flops"),
                "bytes": fmt(r.get("bytes"), "bytes"),
                "time": fmt(r.get("time_lower_s"), "time"),
            }
        )
    return placed, skipped


def roof_lines(docs: ReportDocuments, x_lo: float, x_hi: float) -> list[dict[str, Any]]:
    """The chip's roofs: the HBM slope up to each dtype's ridge, then its flat peak.

    Corners only: (x_lo, x_lo·W), (ridge, peak), (x_hi, peak) with W and peak from the chip
    document and the ridge its `critical_intensity` — the chart draws the lines between them.
    """
    c = docs.chip
    bw = _num(c.get("hbm_bw_bytes_per_s"))
    peaks = dict(c.get("peak_flops_per_s") or {})
    used = {r.get("compute_dtype") for r in (docs.model.get("roofline") or {}).get("rows") or []}
    if used & set(peaks):  # one roof per compute dtype the ops use (as `--plot` draws it)
        peaks = {d: v for d, v in peaks.items() if d in used}
    out = []
    for dtype, peak in peaks.items():
        ridge = _num((c.get("critical_intensity") or {}).get(dtype))
        if not bw or not ridge:
            continue
        for x, y in ((x_lo, x_lo * bw), (ridge, peak), (max(x_hi, ridge * 4), peak)):
            out.append({"dtype": dtype, "intensity": x, "flops_per_s": y, "ridge": ridge})
    return out


# --- serving (a `roofline serve --json` document, when given) -------------------------

SERVE_FIELDS = (
    ("plan", "plan", None),
    ("TTFT", "ttft_s", "time"),
    ("TPOT", "tpot_s", "time"),
    ("step time", "step_time_s", "time"),
    ("tokens/s", "tokens_per_s", "count"),
    ("tokens/s per chip", "tokens_per_s_per_chip", "count"),
    ("tokens/s per user", "tokens_per_s_per_user", "count"),
    ("max batch", "max_batch", "g"),
    ("KV cache per token", "kv_cache_bytes_per_token", "bytes"),
    ("memory per chip", "memory_per_chip_bytes", "bytes"),
    ("bound", "bound", None),
    ("$ per M output tokens", "usd_per_million_output_tokens", "usd"),
    ("$ per M input tokens", "usd_per_million_input_tokens", "usd"),
    ("candidates evaluated", "candidates_evaluated", "g"),
)


def serve_rows(serve: Mapping[str, Any]) -> list[Row]:
    """The serving document's chosen plan: TTFT/TPOT at its concurrency, throughput, cost."""
    best = serve.get("best") if isinstance(serve.get("best"), Mapping) else {}
    inputs = serve.get("inputs") or {}
    rows: list[Row] = []
    for label, key, kind in SERVE_FIELDS:
        if key not in serve:
            continue
        v = serve[key]
        rows.append(
            (label, plan_spec(serve) if key == "plan" else (fmt(v, kind) if kind else str(v)))
        )
    extra = [
        ("concurrency", inputs.get("concurrency")),
        ("request rate", inputs.get("rate")),
        ("batch (requests in flight per replica)", best.get("batch")),
        ("quantisation", _flat(best.get("quant"))),
        ("replica", best.get("system")),
        ("engine", inputs.get("engine")),
    ]
    at = 1 if rows and rows[0][0] == "plan" else 0
    rows[at:at] = [(k, str(v)) for k, v in extra if v not in (None, "")]
    rows += serve_profile_rows(serve)
    if inputs.get("definitions"):
        rows.append(("definitions", str(inputs["definitions"])))
    return rows


def serve_profile_rows(serve: Mapping[str, Any]) -> list[Row]:
    """The serving prediction's efficiency profile as the training assumptions state it: its
    name and kind, the physics on the serving chip, its error bar and the disaggregated hand-off
    (the document holds the whole profile; the page states what it assumed, not the dict)."""
    e = (serve.get("inputs") or {}).get("profile")
    if not isinstance(e, Mapping):
        return [("efficiency profile", _plain(e))] if e not in (None, "") else []
    rows: list[Row] = [("efficiency profile", _profile_physics(e, _serve_chip(serve)))]
    bar = _serving_error_bar(e.get("provenance") or {})
    if bar:
        rows.append(("its error bar", bar))
    handoff = _num(e.get("disagg_handoff_s"))
    if handoff:
        rows.append(
            ("disaggregated hand-off", f"{fmt(handoff, 'time')} per request (the profile's)")
        )
    return rows


def _serving_error_bar(prov: Mapping[str, Any]) -> str:
    """The profile's held-out serving error (TTFT over the public serving runs, the fitted
    hand-off held out), else its training one: what the serving numbers may be off by."""
    from roofline.report.text import held_out_error

    h = held_out_error(prov, "serving")
    if h is None:
        return _error_bar(prov)
    parts = [
        f"{what}: median |error| {f['median_abs']:.1%}, bias {f['bias']:+.1%}"
        + (f" over {f['n']} runs" if f.get("n") else "")
        for what, f in h["folds"].items()
    ]
    return "; ".join(parts) + " (public serving runs; docs/calibration.md)"


def _serve_chip(serve: Mapping[str, Any]) -> Mapping[str, Any]:
    """The serving system's chip as a profile family's `match` reads it; empty when the
    document's system cannot be read here (the profile's constant fractions are shown then)."""
    from roofline.errors import RooflineError
    from roofline.specs.system import parse_system

    try:
        chip = parse_system(str((serve.get("inputs") or {}).get("system", ""))).chip
    except RooflineError:
        return {}
    return {"name": chip.name, "generation": chip.generation, "aliases": chip.aliases}


def _flat(v: Any) -> Any:
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {x}" for k, x in v.items())
    return v


def serve_rejected_rows(serve: Mapping[str, Any]) -> list[list[str]]:
    rej = serve.get("rejections") or serve.get("rejected") or {}
    return [[reason, f"{int(n):,}"] for reason, n in sorted(rej.items(), key=lambda kv: -kv[1])]


def serve_pareto(serve: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in serve.get("pareto") or []:
        user, chip = _num(p.get("tokens_per_s_per_user")), _num(p.get("tokens_per_s_per_chip"))
        if user is None or chip is None:
            continue
        point = {k: plan_spec(p) if k == "plan" else _flat(v) for k, v in p.items()}
        point = {k: v for k, v in point.items() if _num(v) is not None or isinstance(v, str)}
        out.append({**point, "tokens_per_s_per_user": user, "tokens_per_s_per_chip": chip})
    return out


def serve_chosen_point(serve: Mapping[str, Any]) -> dict[str, Any] | None:
    user, chip = _num(serve.get("tokens_per_s_per_user")), _num(serve.get("tokens_per_s_per_chip"))
    if user is None or chip is None:
        return None
    label = f"{plan_spec(serve)}: TTFT {fmt(serve.get('ttft_s'), 'time')}, TPOT {fmt(serve.get('tpot_s'), 'time')}"
    return {"tokens_per_s_per_user": user, "tokens_per_s_per_chip": chip, "label": label}


# --- the launch lines (`launch` of `roofline train --json` / `serve --json`) ------------


def launch_blocks(docs: ReportDocuments) -> list[dict[str, Any]]:
    """The chosen plans' launch lines as the documents carry them: {'id', 'title', 'text',
    'reason'} for the training plan and the serving plan (text None with the writer's reason
    when the stack cannot say the plan; nothing for a stack without a writer)."""
    out = []
    for kind, doc in (("train", docs.train), ("serve", docs.serve or {})):
        launch = doc.get("launch")
        if not isinstance(launch, Mapping):
            continue
        what = "Training" if kind == "train" else "Serving"
        out.append(
            {
                "id": f"launch-{kind}",
                "title": f"{what} launch ({launch.get('stack')}, as roofline export writes it)",
                "text": launch.get("text"),
                "reason": launch.get("reason"),
            }
        )
    return out
