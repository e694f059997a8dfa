"""Prose: the sentences reports say about results. Computing code returns data; this module
words it (docs/architecture.md). It imports nothing from roofline, so any stage may call it;
the objects it reads (`StepCost`, `PlanResult`) are duck-typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TERM_WORDS = {
    "compute": "compute",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer update",
    "overhead": "fixed overheads",
}


def term_phrase(key: str) -> str:
    """Words for a step-time term key ("compute", "exposed:tp", ...; see StepCost.terms)."""
    if key.startswith("exposed:"):
        return f"exposed {key.split(':', 1)[1]} communication"
    return _TERM_WORDS.get(key, key)


def _score(c: Any, objective: str) -> float:
    if objective == "time" or c.run_cost_usd is None:
        return c.step_time_s
    return c.step_time_s * c.system.n_chips


def why_it_wins(a: Any, b: Any | None, objective: str, tie: float = 0.01) -> str:
    """One paragraph: the winner against the best plan of a different shape, term by term."""
    if b is None:
        return "no plan of a different shape is feasible"
    terms = [
        ("compute", a.compute_time_s, b.compute_time_s),
        ("exposed communication", a.exposed_comm_time_s, b.exposed_comm_time_s),
        ("pipeline bubble", a.bubble_time_s, b.bubble_time_s),
        ("optimizer update", a.optimizer_time_s, b.optimizer_time_s),
    ]
    terms = [t for t in terms if abs(t[1] - t[2]) > 1e-9]
    terms.sort(key=lambda t: -abs(t[1] - t[2]))
    cost = ""
    if (
        objective == "cost"
        and a.run_cost_usd is not None
        and b.run_cost_usd is not None
        and a.workload.total_tokens
    ):
        cost = f" and ${a.run_cost_usd / 1e6:.3g}M vs ${b.run_cost_usd / 1e6:.3g}M for the run"
    s = (
        f"{a.plan.describe()} on {a.system.n_chips} chips takes {a.step_time_s:.3g} s/step{cost}; the best plan of another "
        f"shape, {b.plan.describe()} on {b.system.n_chips} chips (runner-up), takes {b.step_time_s:.3g} s. The winner is limited by "
        f"{term_phrase(a.bottleneck)}, the runner-up by {term_phrase(b.bottleneck)}"
    )
    if terms:
        name, x, y = terms[0]
        s += f"; the biggest difference is {name} ({x:.3g} s vs {y:.3g} s per step)"
    if _score(b, objective) < _score(a, objective):
        ca, cb = sum(a.comm_time_s.values()), sum(b.comm_time_s.values())
        s += (
            f". The runner-up scores {1 - _score(b, objective) / _score(a, objective):.1%} better, within the model's {tie:.0%} tie tolerance, where the "
            f"simpler plan ranks first (then the one whose collectives would take less time without overlap: "
            f"{ca:.3g} s vs {cb:.3g} s)"
        )
    return s


def sub_slice_note(reason: str, best: Any, requested: Any, searched: tuple, objective: str) -> str:
    """Why the best plan does not use the whole requested system (empty if it does).

    `reason` is the planner's `SubsetReason` value; `searched` the systems searched.
    """
    b = best.system
    if reason == "chip-counts":
        counts = ", ".join(str(s.n_chips) for s in searched)
        return f"chip counts searched (--chips): {counts}; the best runs on {b.name} ({b.n_chips} chips)"
    if reason == "full-infeasible":
        smaller = "sub-slices" if requested.is_tpu else "clusters of fewer whole nodes"
        return (
            f"no legal plan uses all {requested.n_chips} chips of {requested.name} (every factorisation fails a "
            f"divisibility rule or HBM), so its {smaller} were searched; the best runs on {b.name} ({b.n_chips} chips)"
        )
    if reason == "subset-better":
        return (
            f"a {b.n_chips}-chip sub-slice ({b.name}) scores better on '{objective}' than the plans using all "
            f"{requested.n_chips} chips"
        )
    return ""


def money(usd: float | None) -> str | None:
    """None for a missing or non-finite amount (a chip without a price), else the number."""
    if usd is None or usd != usd or usd in (float("inf"), float("-inf")):
        return None
    return f"{usd}"


def _moves(c: Any) -> dict[tuple[str, str], set[str]]:
    """What each (op, einsum) of a costed plan moves: 'all-gather W over fsdp', ..."""
    out: dict[tuple[str, str], set[str]] = {}
    for r in c.collectives:
        if not r["counted"]:
            continue
        out.setdefault((r["op"], r["einsum"]), set()).add(
            f"{r['kind']} {r['tensor']} over {'+'.join(r['axes'])}"
        )
    return out


def algebra_advice(best: Any, alt: Any | None, *, limit: int = 2) -> str:
    """One sentence where the algebra's cheapest options beat what the plan's stack does
    (empty when they do not): how much faster and the first differing choices."""
    if alt is None:
        return ""
    gain = best.step_time_s / alt.step_time_s - 1
    a, b = _moves(best), _moves(alt)
    diffs = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, set()) != b.get(key, set()):
            theirs = ", ".join(sorted(a.get(key, set()))) or "no collective"
            ours = ", ".join(sorted(b.get(key, set()))) or "no collective"
            diffs.append(f"{key[0]} ({key[1]}): {ours} instead of {theirs}")
    detail = "; ".join(diffs[:limit]) + (
        f"; and {len(diffs) - limit} more" if len(diffs) > limit else ""
    )
    return (
        f"the algebra finds {best.plan.describe()} {gain:.0%} faster ({alt.step_time_s:.3g} s vs "
        f"{best.step_time_s:.3g} s per step) than what {best.framework} does"
        + (f": {detail}" if detail else "")
    )


def precisions_phrase(names: list[str] | tuple[str, ...]) -> str:
    """Which compute precisions a search covered, for the "Searched N plans" line."""
    if not names:
        return ""
    words = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f" in {words}"


def precision_advice(best: Any, recipe: str, alt: Any | None) -> str:
    """One sentence where a faster precision the stack does not document for pre-training
    (so not searched by default) would run the best plan faster (empty without one)."""
    if alt is None:
        return ""
    return (
        f"{recipe} would run this plan {best.step_time_s / alt.step_time_s - 1:.0%} faster "
        f"({alt.step_time_s:.3g} s vs {best.step_time_s:.3g} s per step), but {best.framework} does "
        f"not document it for production pre-training, so it is not the pick (--precision {recipe} "
        "searches it)"
    )


def stack_note(framework: str, auto: str | None = None) -> str:
    """One line on what the costed stack does (the old idealised-machine note for `ideal`).

    `auto`: why `--framework auto` chose this stack (e.g. 'tpu → maxtext'), said in the line."""
    flag = (
        f"(auto: {auto}; --framework ideal for the book's idealised machine)"
        if auto
        else f"(--framework {framework or 'ideal'})"
    )
    if framework in ("", "ideal"):
        return (
            f"Stack: the idealised machine {flag}: the algebra's cheapest option per "
            "einsum; FSDP gathers and gradient reductions hidden behind compute, tensor "
            "collectives exposed unless collective_matmul=1, expert all-to-alls unless "
            "overlap_ep=1, sequence and other activation collectives exposed; the replicas' "
            "gradient sum once per step."
        )
    return (
        f"Stack: {framework} {flag}: its option policy, remat semantics, "
        "gradient timing, overlap per collective class and pipeline layout as its profile "
        "states them (docs/frameworks.md)."
    )


def family_physics(params: Any) -> str:
    """A chip family's efficiency physics in words, from its flattened parameters
    (`FamilyPhysics.params()`, or the same keys in a JSON document): the large-GEMM fraction per
    dtype, flash attention per pass, HBM and the link tiers."""

    def listed(prefix: str) -> str:
        return ", ".join(
            f"{k.split('.', 1)[1]} {v:.2f}" for k, v in params.items() if k.startswith(prefix)
        )

    parts = [
        f"GEMMs by per-chip shape up to {listed('mm_fraction.')} of the dtype's peak",
        f"flash attention {params.get('attn_fwd', 0):.2f} forward / "
        f"{params.get('attn_bwd', 0):.2f} backward",
        f"HBM {params.get('hbm', 0):.2f}",
    ]
    if listed("link."):
        parts.append(f"links {listed('link.')}")
    return "; ".join(parts)


def profile_assumptions(eff: Any, chip: Any) -> str:
    """One sentence on the efficiency a training prediction assumed on `chip` (without the
    serving-only disaggregated hand-off): a physics profile's
    family numbers (GEMMs by shape up to their large-GEMM fraction, flash attention, HBM, links,
    fixed overheads), else a constant profile's three fractions."""
    fam = eff.family_for(chip) if hasattr(eff, "family_for") else None
    if fam is None:
        return (
            f"{eff.describe(handoff=False)} (matmul {eff.matmul:g}, HBM {eff.hbm:g}, links {eff.link:g} of "
            f"peak; {eff.source})"
        )
    parts = [family_physics(fam.params())]
    ovh = [
        f"{eff.step_overhead_s * 1e3:.3g} ms per step" if eff.step_overhead_s else "",
        f"{eff.layer_overhead_s * 1e3:.3g} ms per layer pass" if eff.layer_overhead_s else "",
    ]
    if any(ovh):
        parts.append("fixed " + " + ".join(x for x in ovh if x))
    return (
        f"{eff.describe(handoff=False)} on {fam.family}: " + "; ".join(parts) + f" ({eff.source})"
    )


# Where a calibrated profile's provenance keeps its cross-validated error (the honest number the
# README quotes), per schema: (provenance table, [(key, what was held out)]).
HELD_OUT_KEYS: dict[str, tuple[tuple[str, ...], list[tuple[str, str]]]] = {
    "training": (
        (),
        [("cv_source_after", "by source"), ("cv_chip_family_after", "by chip family")],
    ),
    "serving": (
        ("serving",),
        [
            # the serving fits (the disaggregated hand-off, SGLang's request latency) held out
            # by model×system pair first: the honest number for a deployment not seen
            (
                "all_ttft_held_out_by_model_system_pair",
                "TTFT, the fits held out by model×system pair",
            ),
            ("all_ttft_held_out_by_chip_family", "TTFT, held out by chip family"),
            # an engine's own parameter cannot be fitted without its runs: its fold keeps 0
            ("all_ttft_held_out_by_engine", "TTFT, held out by engine"),
        ],
    ),
}


def held_out_error(provenance: Mapping[str, Any], schema: str) -> dict[str, Any] | None:
    """A calibrated profile's held-out (leave-one-group-out) error for this schema's runs, as
    its [provenance] records it (`roofline calibrate --from-runs`; a profile's `provenance`, or
    the same table in a JSON document), or None where it records none (datasheet, peak, a
    hand-written file)."""
    if schema not in HELD_OUT_KEYS:
        return None
    path, keys = HELD_OUT_KEYS[schema]
    prov: Any = provenance or {}
    for key in path:
        prov = prov.get(key) or {}
    folds = {what: dict(prov[k]) for k, what in keys if isinstance(prov.get(k), Mapping)}
    if not folds:
        return None
    runs = prov.get("runs")
    if isinstance(runs, int) and isinstance(prov.get("latency_runs"), int):
        runs += prov["latency_runs"]  # the serving fits' two disjoint sets of runs
    return {"runs_file": prov.get("runs_file"), "runs": runs, "folds": folds}
