"""What a training stack's launch configuration can say of a plan, and the stack's own
optimizer default: `launch/defaults/capabilities.toml`, read by both the
writers (`refuse`: the one paragraph an export gives) and train's planner (`launchable`:
the candidate plans a named stack cannot launch, skipped and counted).

Each rule is one vectorised predicate over a `PlanArrays` (one entry per candidate plan, or
one for a single `Plan`) with its data (`allowed`, `why`) from the table, so the planner's
filter and the writer's refusal are the same test.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from roofline.launch.base import LaunchError
from roofline.specs.plan import FLAG_ON, SCHEDULE_OF_CODE, Plan, Remat, Strategy

TABLE = Path(__file__).parent / "defaults" / "capabilities.toml"
SWITCHES = ("megatron_sp", "collective_matmul", "overlap_ep", "offload_activations")
# schedule name by the planner's Schedule.code (specs.plan.SCHEDULE_OF_CODE)
_SCHEDULE_NAMES = np.array([SCHEDULE_OF_CODE[c].value for c in sorted(SCHEDULE_OF_CODE)])


@dataclass(frozen=True)
class PlanArrays:
    """Candidate plans as arrays (one entry each): degrees by strategy name, ZeRO stage,
    schedule name, remat kind and its plan text, the three switches; `optimizer` and `recipe`
    are one value for them all (None: not judged, as in the planner)."""

    deg: Mapping[str, np.ndarray]
    zero: np.ndarray
    schedule: np.ndarray
    remat_kind: np.ndarray
    remat_text: np.ndarray
    virtual: np.ndarray
    microbatches: np.ndarray
    switch: Mapping[str, np.ndarray]
    optimizer: str | None = None
    recipe: str | None = None

    @classmethod
    def of(cls, plan: Plan, recipe: str | None = None) -> PlanArrays:
        """One plan (with its optimizer and, where the rule needs it, its recipe)."""
        return replace(cls.of_plans([plan]), optimizer=plan.optimizer.name, recipe=recipe)

    @classmethod
    def of_plans(cls, plans: Sequence[Plan]) -> PlanArrays:
        """Many plans, judged without their optimizer or recipe (as the planner judges)."""

        def col(get) -> np.ndarray:
            return np.array([get(p) for p in plans])

        return cls(
            deg={s.value: col(lambda p, s=s: getattr(p.degrees, s.value)) for s in Strategy},
            zero=col(lambda p: p.zero),
            schedule=col(lambda p: p.schedule.value),
            remat_kind=col(lambda p: p.remat.kind.value),
            remat_text=col(lambda p: str(p.remat)),
            virtual=col(lambda p: p.virtual_stages),
            microbatches=col(lambda p: p.microbatches),
            switch={
                "megatron_sp": col(lambda p: p.sequence_parallel),
                "collective_matmul": col(lambda p: p.collective_matmul is True),
                "overlap_ep": col(lambda p: p.overlap_ep is True),
                "offload_activations": col(lambda p: p.offload_activations),
            },
        )

    @classmethod
    def of_candidates(cls, cand: Any, sequence_parallel: bool, remats: Sequence[Remat]):
        """The planner's Candidates of one family (`sequence_parallel`: the family's flag,
        `remats`: the space's list `remat_idx` points into)."""
        n = len(cand)
        ri = cand.remat_idx if cand.remat_idx is not None else np.zeros(n, dtype=int)

        def flag(x) -> np.ndarray:  # a switch asked on (a tri-state flag's code FLAG_ON)
            return np.zeros(n, dtype=bool) if x is None else np.asarray(x) == FLAG_ON

        return cls(
            deg={s.value: np.asarray(cand.deg[s]) for s in Strategy},
            zero=np.asarray(cand.zero),
            schedule=_SCHEDULE_NAMES[np.asarray(cand.schedule, dtype=int)],
            remat_kind=np.array([r.kind.value for r in remats])[ri],
            remat_text=np.array([str(r) for r in remats])[ri],
            virtual=np.asarray(cand.virtual),
            microbatches=np.asarray(cand.microbatches),
            switch={
                "megatron_sp": np.full(n, sequence_parallel),
                "collective_matmul": flag(cand.collective_matmul),
                "overlap_ep": flag(cand.overlap_ep),
                "offload_activations": flag(None),  # offload is added after (space.py)
            },
        )


# A rule: (its table entry, the arrays) -> (refused mask, the text of entry i's breach).
Verdict = tuple[np.ndarray, Callable[[int], str]]


def _strategies(r: Mapping, a: PlanArrays) -> Verdict:
    bad = {n: a.deg[n] > 1 for n in a.deg if n not in r["allowed"]}
    mask = np.logical_or.reduce([*bad.values(), np.zeros_like(a.zero, dtype=bool)])
    text = lambda i: "; ".join(  # noqa: E731
        f"{n}={a.deg[n][i]} ({r['why']})" for n, m in bad.items() if m[i]
    )
    return mask, text


def _dp_with_fsdp(r: Mapping, a: PlanArrays) -> Verdict:
    return (a.deg["dp"] > 1) & (a.deg["fsdp"] > 1), lambda i: f"dp and fsdp together ({r['why']})"


def _replica_zero(r: Mapping, a: PlanArrays) -> Verdict:
    mask = (a.deg["dp"] > 1) & ~np.isin(a.zero, r["allowed"])
    return mask, lambda i: f"zero={a.zero[i]} over dp ({r['why']})"


def _remat(r: Mapping, a: PlanArrays) -> Verdict:
    mask = ~np.isin(a.remat_kind, r["allowed"])
    return mask, lambda i: f"remat={a.remat_text[i]} ({r['why']})"


def _schedules(r: Mapping, a: PlanArrays) -> Verdict:
    mask = (a.deg["pp"] > 1) & ~np.isin(a.schedule, r["allowed"])
    return mask, lambda i: f"schedule={a.schedule[i]} ({r['why']})"


def _virtual(r: Mapping, a: PlanArrays) -> Verdict:
    mask = (a.deg["pp"] > 1) & (a.schedule == "interleaved") & ~np.isin(a.virtual, r["allowed"])
    return mask, lambda i: f"virtual={a.virtual[i]} ({r['why']})"


def _stage_microbatches(r: Mapping, a: PlanArrays) -> Verdict:
    mask = (a.deg["pp"] > 1) & (a.microbatches % a.deg["pp"] != 0)
    return mask, lambda i: f"microbatch={a.microbatches[i]} on pp={a.deg['pp'][i]} ({r['why']})"


def _tp_needs_sp(r: Mapping, a: PlanArrays) -> Verdict:
    mask = (a.deg["tp"] > 1) & ~a.switch["megatron_sp"]
    return mask, lambda i: f"tensor parallelism without sequence-parallel norms ({r['why']})"


def _tp_refuses_sp(r: Mapping, a: PlanArrays) -> Verdict:
    mask = (a.deg["tp"] > 1) & a.switch["megatron_sp"]
    return mask, lambda i: f"tp={a.deg['tp'][i]} with megatron_sp ({r['why']})"


def _switches(r: Mapping, a: PlanArrays) -> Verdict:
    bad = {n: np.asarray(a.switch[n], dtype=bool) for n in SWITCHES if n not in r["allowed"]}
    mask = np.logical_or.reduce([*bad.values(), np.zeros_like(a.zero, dtype=bool)])
    text = lambda i: ", ".join(f"{n}=1" for n, m in bad.items() if m[i]) + f" ({r['why']})"  # noqa: E731
    return mask, text


def _offload_remat(r: Mapping, a: PlanArrays) -> Verdict:
    mask = np.asarray(a.switch["offload_activations"], dtype=bool) & ~np.isin(
        a.remat_kind, r["allowed"]
    )
    return mask, lambda i: f"offload_activations=1 with remat={a.remat_text[i]} ({r['why']})"


def _bf16_grads_need_zero1(r: Mapping, a: PlanArrays) -> Verdict:
    on = a.optimizer == "adam-fp32-master-bf16-grads"  # None (the planner): not judged
    mask = on & ~((a.zero == 1) & (a.deg["dp"] > 1))
    return mask, lambda i: f"bf16 gradients without the distributed optimizer ({r['why']})"


def _scalar(field: str, key: str) -> Callable[[Mapping, PlanArrays], Verdict]:
    """A rule on one value for every candidate (`field` of PlanArrays; None: not judged)."""

    def rule(r: Mapping, a: PlanArrays) -> Verdict:
        v = getattr(a, field)
        bad = v is not None and v not in r["allowed"]
        return np.full(len(a.zero), bad), lambda i: f"{key}={v} ({r['why']})"

    return rule


RULES: dict[str, Callable[[Mapping, PlanArrays], Verdict]] = {
    "strategies": _strategies,
    "dp_with_fsdp": _dp_with_fsdp,
    "replica_zero": _replica_zero,
    "remat": _remat,
    "schedules": _schedules,
    "virtual": _virtual,
    "stage_microbatches": _stage_microbatches,
    "tp_needs_sp": _tp_needs_sp,
    "tp_refuses_sp": _tp_refuses_sp,
    "switches": _switches,
    "offload_remat": _offload_remat,
    "bf16_grads_need_zero1": _bf16_grads_need_zero1,
    "optimizers": _scalar("optimizer", "optimizer"),
    "recipes": _scalar("recipe", "precision"),
}


@dataclass(frozen=True)
class Capabilities:
    """One stack's table (with the table it extends merged under it)."""

    stack: str
    who: str
    rules: Mapping[str, Mapping[str, Any]]
    optimizer: str
    optimizer_source: str

    def breaches(self, a: PlanArrays) -> list[tuple[str, np.ndarray, Callable[[int], str]]]:
        """(rule, refused mask, text of entry i) for every rule of the stack."""
        return [(name, *RULES[name](r, a)) for name, r in self.rules.items()]

    def lacks(self, plan: Plan, recipe: str | None = None) -> list[str]:
        """What the stack's configuration cannot say of `plan`, each named ([] when it can)."""
        return [text(0) for _, mask, text in self.breaches(PlanArrays.of(plan, recipe)) if mask[0]]

    def refuse(self, plan: Plan, recipe: str | None = None, fix: str | None = None) -> None:
        """The one paragraph an export gives for a plan the stack cannot say (nothing when
        it can)."""
        lacks = self.lacks(plan, recipe)
        if lacks:
            raise LaunchError(
                f"{self.who} cannot express " + "; ".join(lacks),
                rule="an export writes only what the stack's own configuration can say "
                "(launch/defaults/capabilities.toml)",
                fix=fix or "change the plan (or export to a stack that has it)",
            )

    def launchable(self, a: PlanArrays) -> np.ndarray:
        """Which of the candidates the stack can launch."""
        ok = np.ones(len(a.zero), dtype=bool)
        for _, mask, _ in self.breaches(a):
            ok &= ~mask
        return ok


@cache
def _raw() -> dict[str, Any]:
    return tomllib.loads(TABLE.read_text())


def stacks() -> tuple[str, ...]:
    """The stacks the table describes."""
    return tuple(_raw())


@cache
def capabilities(stack: str) -> Capabilities | None:
    """The stack's capabilities and defaults, or None for a stack the table does not hold
    (`ideal`, `llm-foundry`: nothing is filtered, the book's defaults stand)."""
    raw = _raw()
    if stack not in raw:
        return None
    own = raw[stack]
    base = capabilities(own["extends"]) if "extends" in own else None
    merged = {**(base.rules if base else {}), **own.get("rules", {})}
    for name in merged:
        if name not in RULES:  # a typo in the table: a bug here, caught by the tests
            raise KeyError(f"capabilities.toml [{stack}.rules.{name}] is not a rule")

    def pick(key: str) -> Any:
        return own[key] if key in own else getattr(base, key)

    return Capabilities(
        stack=stack,
        who=own["who"],
        rules=merged,
        optimizer=pick("optimizer"),
        optimizer_source=pick("optimizer_source"),
    )


__all__ = ["RULES", "Capabilities", "PlanArrays", "capabilities", "stacks"]
