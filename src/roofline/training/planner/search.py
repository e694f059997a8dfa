"""The search: cost every family of candidate plans in one vectorised pass of the walk each,
rank them, and cost the few plans the report lists one by one.
"""

from __future__ import annotations

import datetime
import enum
import functools
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from roofline.core.rules import Structure
from roofline.core.sharding import CHEAPEST, Cheapest, OptionPolicy
from roofline.core.stack import Stack, recipe_dtypes, stack_of
from roofline.core.walk import cheapest_at
from roofline.errors import PlanError
from roofline.report.text import (
    algebra_advice,
    precision_advice,
    sub_slice_note,
    why_it_wins,
)
from roofline.specs.efficiency import Efficiency
from roofline.specs.framework import Framework
from roofline.specs.model import ModelSpec
from roofline.specs.plan import ComputeDtypes, Plan, Workload, parse_optimizer
from roofline.specs.system import System
from roofline.training.offload import (
    ActivationsOffloadedCost,
    OffloadedCost,
    activations_offloaded_cost,
    offloaded_cost,
    remats_offloading,
)
from roofline.training.planner.launchable import launchable
from roofline.training.planner.rank import (
    Family,
    Ranked,
    candidates_of_plans,
    degrees_at,
    distinct_rows,
    pareto,
    plan_at,
    rank,
    runner_up_row,
    shape_key,
)
from roofline.training.planner.space import (
    SearchSpace,
    activation_offload_rescue,
    enumerate_plans,
    offload_rescue,
    stack_as_of,
)
from roofline.training.planner.systems import sub_slices, systems_for_counts
from roofline.training.step import (
    StepArrays,
    StepCost,
    distinct_rows_of,
    evaluate_plan,
    evaluate_plan_rows,
    evaluate_plans,
    family_step_cost,
    structure_of,
    training_profile,
    with_own_collectives,
)
from roofline.units import DAY


class SubsetReason(enum.StrEnum):
    """Why the best plan runs on fewer chips than the system given (data; report.text words it)."""

    NONE = ""  # it uses the whole system
    CHIP_COUNTS = "chip-counts"  # the user chose the counts (--chips)
    FULL_INFEASIBLE = "full-infeasible"  # no legal plan uses every chip
    SUBSET_BETTER = "subset-better"  # a smaller slice scores better on the objective


@dataclass(frozen=True)
class PlanResult:
    """What the search found: top-k plans, rejection counts by reason, Pareto set, timing."""

    top: tuple[StepCost, ...]
    candidates_evaluated: int
    candidates_enumerated: int
    rejected: dict[str, int]
    domains: dict[str, str]
    pareto: tuple[dict[str, Any], ...]
    objective: str
    search_time_s: float
    runner_up: StepCost | None
    searched: tuple[System, ...]
    requested: System
    chips_given: bool = False  # --chips chose the counts
    tie_tolerance: float = 0.01
    feasible_per_system: dict[str, int] = field(default_factory=dict)
    # the best plan with the algebra's cheapest options, where they beat the stack's
    algebra_alternative: StepCost | None = None
    # the best plan on a smaller cluster that runs a token for far fewer chip-hours
    efficient: StepCost | None = None
    # the compute precisions searched, as the user names them ("bf16", "fp8-delayed")
    precisions: tuple[str, ...] = ()
    # a faster recipe the stack does not document for pre-training, and the best plan in it
    precision_alternative: tuple[str, StepCost] | None = None

    def __repr__(self) -> str:  # one line: the best plan and how much was searched
        best = repr(self.top[0]) if self.top else "no plan"
        return (
            f"PlanResult({self.candidates_evaluated:,} plans costed, objective {self.objective}: "
            f"best {best})"
        )

    @property
    def best(self) -> StepCost:
        return self.top[0]

    @property
    def systems(self) -> tuple[str, ...]:
        return tuple(f"{s.name} ({s.n_chips} chips)" for s in self.searched)

    @property
    def subset_reason(self) -> SubsetReason:
        if self.chips_given:
            return SubsetReason.CHIP_COUNTS
        if self.best.system.n_chips == self.requested.n_chips:
            return SubsetReason.NONE
        if self.feasible_per_system.get(self.requested.name, 0) == 0:
            return SubsetReason.FULL_INFEASIBLE
        return SubsetReason.SUBSET_BETTER

    @property
    def sub_slice_note(self) -> str:
        """Why the best plan does not use the whole requested system, or that the system is far
        past the run's efficient size (empty if neither)."""
        return sub_slice_note(
            self.subset_reason.value, self.best, self.requested, self.searched, self.objective
        ) or efficient_size_note(self.best, self.efficient)

    @property
    def why(self) -> str:
        return why_it_wins(self.best, self.runner_up, self.objective, self.tie_tolerance)

    @property
    def advice(self) -> str:
        """Where the algebra finds a cheaper way to run the best plan than its stack does, and
        where a precision not searched by default would run it faster."""
        alt = self.precision_alternative
        said = (
            algebra_advice(self.best, self.algebra_alternative),
            precision_advice(self.best, alt[0], alt[1]) if alt else "",
        )
        return ". ".join(s for s in said if s)

    def to_dict(self) -> dict[str, Any]:
        b = self.best.to_dict()
        return {
            **b,
            "system_used": self.best.system.name,
            "chips_used": self.best.system.n_chips,
            "sub_slice_note": self.sub_slice_note,
            "subset_reason": self.subset_reason.value or None,
            "feasible_per_system": dict(self.feasible_per_system),
            "candidates_evaluated": self.candidates_evaluated,
            "candidates_enumerated": self.candidates_enumerated,
            "precisions_searched": list(self.precisions),
            "rejected": dict(self.rejected),
            "domains": self.domains,
            "objective": self.objective,
            "why": self.why,
            "advice": self.advice or None,
            "efficient_size": None if self.efficient is None else _brief(self.efficient),
            "top": [c.to_dict() for c in self.top],
            "pareto": list(self.pareto),
            "search_time_s": self.search_time_s,
            "systems_considered": list(self.systems),
        }


def _check_objective(objective: str) -> None:
    if objective not in ("time", "cost"):
        raise PlanError(
            f"objective {objective!r}",
            rule="objective is 'time' or 'cost'",
            fix="write --objective time",
        )


def _gc_paused(fn: Callable[..., PlanResult]) -> Callable[..., PlanResult]:
    """Run `fn` with Python's cyclic garbage collector paused (reference counting still frees
    everything that is not a cycle). A search allocates some 10^5 short-lived containers; the
    collections their count triggers rescan every long-lived object, the caches included (one
    full pass measured ~35 ms of a ~300 ms search, benchmarks/README.md). Nested calls leave
    the collector as the outermost found it."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> PlanResult:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return run


@_gc_paused
def plan_training(
    model: ModelSpec,
    system: System,
    workload: Workload,
    *,
    space: SearchSpace | None = None,
    objective: str = "time",
    top_k: int = 5,
    efficiency: Efficiency | None = None,
    optimizer: str = "adam-bf16",
    allow_sub_slices: bool = True,
    chips: Sequence[int] | tuple[int, int] | None = None,
    tie_tolerance: float = 0.01,
    progress: Callable[[int, int], None] | None = None,
    policy: OptionPolicy = CHEAPEST,
    framework: str | Framework | Stack | None = None,
    dtypes: ComputeDtypes | None = None,
    efficient_size: bool = True,
    launch_stack: str | None = None,
    compiled: bool | None = None,
    as_of: datetime.date | str | None = None,
) -> PlanResult:
    """Search every legal plan; rank by `objective` ('time' = step time, 'cost' = $ per token).

    `framework` is the stack the plans run on (None: the idealised machine) as of `as_of`
    ('YYYY-MM[-DD]', None: today): the search keeps only what it can run (strategies, schedules,
    remats, ZeRO stages, overlap switches) and costs what it does. `policy` overrides its option
    policy; `dtypes` pins the compute dtypes, else each precision the stack runs faster than 16-bit
    on the chip is searched beside its 16-bit one (`Stack.searchable_dtypes`). `efficient_size`:
    where the best plan on the whole system mostly does not compute, halvings of the system are
    costed too and the cheapest per token is named (`smaller_efficient`). `launch_stack`: the stack
    named to launch the plans (None: any), whose configuration must say them (`planner.launchable`).
    `compiled` pins compile as `dtypes` pins the precision: plans left unset and costed so
    (`Stack.compiling_by_default`; validate's planner mode states the run's); None searches it where
    the stack runs eager by default (`space.searches_compile`)."""
    t0 = time.perf_counter()
    stack, space = _searched(framework, space, compiled, model, as_of)
    eff = training_profile(efficiency)
    opt = parse_optimizer(optimizer)
    _check_objective(objective)
    workload.require_whole_sequences()
    if chips:
        systems = systems_for_counts(system, chips)
    else:
        systems = sub_slices(system) if allow_sub_slices else [system]
    found = launchable(enumerate_plans(model, workload, systems, space), space, launch_stack)
    if not found.groups:
        raise PlanError(
            f"no mesh factorisation of {system.n_chips} chips satisfies the divisibility rules",
            rule="; ".join(f"{k}: {v}" for k, v in found.domains.items()),
            fix="try another chip count (--chips) or batch size",
        )
    searched = (dtypes,) if dtypes is not None else stack.searchable_dtypes(system.chip)
    ctx = _Costing(model, systems, workload, eff, opt, space, policy, stack, searched, launch_stack)
    kept: dict[int, StepArrays] = {}
    families = _cost(found.groups, ctx, progress, kept)
    rejected = found.rejected
    for f in families:
        rejected.update(f.rejected)
    ranked = rank(
        families,
        systems,
        workload.batch_tokens,
        objective,
        tie_tolerance,
        lambda: rejected.most_common(1)[0][0] if rejected else "no candidates",
    )
    rows = distinct_rows(families, ranked, systems, top_k)
    runner_row = _runner_up_row(families, ranked, systems, rows)
    listed = _cost_rows(
        families, ranked, [*rows, *([] if runner_row is None else [runner_row])], ctx, kept
    )
    top = [listed[r] for r in rows]
    return PlanResult(
        top=tuple(top),
        candidates_evaluated=sum(len(f.cand) for f in families),
        candidates_enumerated=found.enumerated,
        rejected=dict(rejected),
        domains=found.domains,
        pareto=pareto(ranked, lambda j: plan_at(families, ranked, j, space, opt).describe()),
        objective=objective,
        search_time_s=time.perf_counter() - t0,
        runner_up=None if runner_row is None else listed[runner_row],
        searched=tuple(systems),
        requested=system,
        chips_given=bool(chips),
        tie_tolerance=tie_tolerance,
        feasible_per_system={sy.name: int((ranked.chips == sy.n_chips).sum()) for sy in systems},
        algebra_alternative=_algebra_alternative(
            top[0],
            ctx,
            _walked_as(families, ranked, rows[0], kept),
            _walked_cheapest(families, ranked, rows[0], kept),
        ),
        precisions=tuple(stack.precision_name(d, system.chip) for d in searched),
        precision_alternative=None if dtypes is not None else _precision_alternative(top[0], ctx),
        efficient=smaller_efficient(top[0], ctx, dtypes)
        if efficient_size and allow_sub_slices and not chips
        else None,
    )


def _searched(
    framework: Any, space: SearchSpace | None, compiled: bool | None, model: ModelSpec, as_of: Any
) -> tuple[Stack, SearchSpace]:
    """The stack and space a search runs on: compile pinned (`_pinned`), restricted to what the
    stack runs (`SearchSpace.for_stack`) as it stood at `as_of` (`space.stack_as_of`)."""
    stack, space = _pinned(stack_of(framework), space or SearchSpace(), compiled)
    return stack_as_of(space.for_stack(stack, model), stack, as_of)


def _pinned(stack: Stack, space: SearchSpace, compiled: bool | None) -> tuple[Stack, SearchSpace]:
    """The stack and space of a search with compile pinned (`compiled`; None: as given)."""
    if compiled is None:
        return stack, space
    return stack.compiling_by_default(compiled), replace(space, compile=(None,))


def _runner_up_row(families, ranked: Ranked, systems, rows: list[int]) -> int | None:
    """The row of the best plan with another set of strategies or chip count (variants of the
    winner's mesh differ by noise, not by a reason a user can act on): from the top list if it
    holds one, else found on the ranked arrays."""

    def shape(row: int) -> tuple:
        f, i, deg = degrees_at(families, ranked, row)
        return shape_key(deg, systems[int(f.cand.system_idx[i])].n_chips)

    found = next((r for r in rows[1:] if shape(r) != shape(rows[0])), None)
    if found is not None:
        return found
    return runner_up_row(families, ranked, systems, int(ranked.order[0]), len(rows))


def _cost_rows(
    families, ranked: Ranked, rows: list[int], ctx: _Costing, kept: dict[int, StepArrays]
) -> dict[int, StepCost]:
    """The StepCost of each ranked row the report lists: read off its family's arrays where
    `_cost` kept them (`family_step_cost`: the numbers and collectives the plan's own walk
    gives), else the plans that a single plan's walk would walk alike (the same strategies,
    sharding, dtypes and compilation; remat and the flags may differ) costed together in one
    multi-row walk (`evaluate_plan_rows`: the numbers `evaluate_plan` gives), with the
    optimizer offloaded where that made a plan fit."""
    groups: dict[tuple, list[tuple[int, Plan, int]]] = {}
    out: dict[int, StepCost] = {}
    inv: dict[int, Any] = {}
    eff = training_profile(ctx.eff).for_framework(ctx.stack.name)
    for r in dict.fromkeys(rows):
        fi = int(ranked.family[r])
        f = families[fi]
        plan = plan_at(families, ranked, r, ctx.space, ctx.opt)
        if fi in kept:
            i = int(ranked.index[r])
            if fi not in inv:
                inv[fi] = distinct_rows_of(f.cand)
            sysm = ctx.systems[int(f.cand.system_idx[i])]
            c = family_step_cost(
                kept[fi], i, int(inv[fi][i]), plan, sysm, ctx.workload, eff, ctx.stack
            )
            out[r] = c
            continue
        st = replace(structure_of(plan, ctx.model), remat=Structure.remat, collective_matmul=None)
        sys_i = int(f.cand.system_idx[int(ranked.index[r])])
        key = (st, plan.dtypes, plan.compiled, plan.cuda_graph)
        groups.setdefault(key, []).append((r, plan, sys_i))
    for (st, *_), members in groups.items():
        plans = [p for _, p, _ in members]
        cand = candidates_of_plans(plans, [i for _, _, i in members], ctx.space.remats)
        costs = evaluate_plan_rows(
            ctx.model, ctx.systems, ctx.workload, st, cand, plans, remats=list(ctx.space.remats),
            efficiency=ctx.eff, policy=ctx.policy, framework=ctx.stack,
        )  # fmt: skip
        for (r, _, _), c in zip(members, costs, strict=True):
            if not c.fits and True in ctx.space.offload_optimizer:  # as offload_rescue ranked it
                c = offloaded_cost(ctx.model, c) or c
            if not c.fits and True in ctx.space.offload_activations:  # activation_offload_rescue
                c = _activations_offloaded(ctx.model, c)
            out[r] = c
    return out


def _activations_offloaded(model: ModelSpec, c: StepCost) -> StepCost:
    """`c` with offload_activations=1 where that makes it fit (as the rescue ranked it)."""
    if c.plan.degrees.pp > 1 or c.system.host_bw_bytes_per_s is None:
        return c
    if not remats_offloading(c.framework, [c.plan.remat])[0]:
        return c
    on = replace(c, plan=replace(c.plan, offload_activations=True))
    off = activations_offloaded_cost(model, on)
    return off if off.fits else c


@dataclass(frozen=True)
class _Costing:
    """What every evaluation of one search shares."""

    model: ModelSpec
    systems: list[System]
    workload: Workload
    eff: Efficiency
    opt: Any
    space: SearchSpace
    policy: OptionPolicy
    stack: Stack
    dtypes: tuple[ComputeDtypes | None, ...]  # the precisions searched (None: the default)
    launch_stack: str | None = None  # the stack named to launch the plans


# the algebra's own choice among the options, never the stack's (advice only)
ALGEBRA = Cheapest("algebra")


def _walked_as(families, ranked: Ranked, row: int, kept: dict) -> Structure | None:
    """The structure of the family of a ranked row whose arrays `_cost` kept (else None)."""
    fi = int(ranked.family[row])
    return families[fi].structure if fi in kept else None


def _walked_cheapest(families, ranked: Ranked, row: int, kept: dict) -> bool:
    """Whether the family walk `_cost` kept for a ranked row chose, at the row's plan, the
    algebra's cheapest option for every einsum (`core.walk.cheapest_at`; False where the walk
    was not kept)."""
    fi = int(ranked.family[row])
    r = kept.get(fi)
    if r is None or r.walk is None:
        return False
    i = int(ranked.index[row])
    return cheapest_at(r.walk, int(distinct_rows_of(families[fi].cand)[i]))


def _algebra_alternative(
    best: StepCost, ctx: _Costing, family: Structure | None = None, cheapest: bool = False
) -> StepCost | None:
    """The best plan costed with the algebra's cheapest options instead of the stack's (None
    for the idealised machine, or when that is not cheaper): what report.text words as advice.
    `family`: the structure of the best plan's family where its listed plans were read off
    its arrays (`_keeps`): the plan is walked on it, whose einsums the family walk has
    derived already, and its collectives listed as its own walk lists them
    (`family_step_cost`); else on its own structure (`evaluate_plan`). `cheapest`: that family
    walk chose the algebra's cheapest option at every einsum of the plan (`_walked_cheapest`),
    so the algebra's walk of it is the same walk, no cheaper: None without walking it."""
    if ctx.stack.book or (family is not None and cheapest):
        return None
    plan = replace(best.plan, offload_activations=False)  # as `best` is, by _offloaded_like
    if family is None:
        alt = evaluate_plan(
            ctx.model, best.system, ctx.workload, plan, efficiency=ctx.eff, policy=ALGEBRA,
            framework=ctx.stack,
        )  # fmt: skip
    else:
        cand = candidates_of_plans([plan], [0], ctx.space.remats)
        st = replace(family, remat=Structure.remat, collective_matmul=None)
        (alt,) = evaluate_plan_rows(
            ctx.model, [best.system], ctx.workload, st, cand, [plan],
            remats=list(ctx.space.remats), efficiency=ctx.eff, policy=ALGEBRA,
            framework=ctx.stack,
        )  # fmt: skip
        alt = with_own_collectives(alt)
    alt = _offloaded_like(best, alt, ctx.model)
    return alt if alt.step_time_s < best.step_time_s * (1 - ALGEBRA_ADVICE_MARGIN) else None


def _offloaded_like(best: StepCost, alt: StepCost, model: ModelSpec) -> StepCost:
    """`alt` offloaded as `best` is (advice compares like with like)."""
    if isinstance(best, OffloadedCost) and not alt.fits:
        return offloaded_cost(model, alt) or alt
    if isinstance(best, ActivationsOffloadedCost):
        return activations_offloaded_cost(model, replace(alt, plan=best.plan))
    return alt


def _precision_alternative(best: StepCost, ctx: _Costing) -> tuple[str, StepCost] | None:
    """The best plan costed in the fastest recipe the stack runs on the chip but does not
    document for pre-training (`Stack.advised_recipe`), where that is faster: advice only."""
    r = ctx.stack.advised_recipe(best.system.chip)
    if r is None:
        return None
    plan = replace(best.plan, dtypes=recipe_dtypes(r), offload_activations=False)
    alt = evaluate_plan(
        ctx.model, best.system, ctx.workload, plan, efficiency=ctx.eff, policy=ctx.policy,
        framework=ctx.stack,
    )  # fmt: skip
    alt = _offloaded_like(best, alt, ctx.model)
    return (
        (r.name, alt) if alt.step_time_s < best.step_time_s * (1 - ALGEBRA_ADVICE_MARGIN) else None
    )


# below this relative gain the algebra's cheaper options are not worth a sentence
ALGEBRA_ADVICE_MARGIN = 0.03


# The most candidates whose family StepArrays (and walk) a search keeps for its listed plans
# (`_cost_rows`): ~60 arrays of 8 bytes a candidate, ~100 MB at this bound.
MAX_KEPT_CANDIDATES = 1 << 18


def _keeps(ctx: _Costing) -> bool:
    """Whether the listed plans are read off their families' arrays (`family_step_cost`):
    not for mixture-of-experts models, whose family walk (every strategy an axis) chooses
    other options for the router and expert einsums than a plan's own walk does (measured on
    DeepSeek-V3 and Mixtral 8x7B: step times differ by ~0.1-0.4%), and not where offload may
    rescue a plan (the listed plan is offloaded by `offloaded_cost`, not the arrays' rescue)."""
    return (
        ctx.model.moe is None
        and True not in ctx.space.offload_optimizer
        and True not in ctx.space.offload_activations
    )


def _cost(
    groups, ctx: _Costing, progress, kept: dict[int, StepArrays] | None = None
) -> list[Family]:
    """Evaluate every family: one vectorised walk each. `kept` (if given) receives, by family
    index, the StepArrays with their walk of the families whose listed plans `_cost_rows`
    reads off them (`_keeps`; at most `MAX_KEPT_CANDIDATES` candidates in all).

    (Splitting the families over processes was measured slower on the 2-core target, because
    each process rebuilds the shared caches; see benchmarks/.)
    """
    total = sum(len(c) for _, c in groups) * len(ctx.dtypes)
    out = []
    done = 0
    room = MAX_KEPT_CANDIDATES if kept is not None and _keeps(ctx) else 0
    for dt in ctx.dtypes:
        for st, cand in groups:
            keep = len(cand) <= room
            r = evaluate_plans(
                ctx.model,
                ctx.systems,
                ctx.workload,
                st,
                cand,
                eff=ctx.eff,
                optimizer=ctx.opt,
                remats=list(ctx.space.remats),
                policy=ctx.policy,
                framework=ctx.stack,
                dtypes=dt,
                keep_walk=keep,
            )
            if keep:
                assert kept is not None
                kept[len(out)] = r
                room -= len(cand)
            if True in ctx.space.offload_optimizer:  # plans that fit only with it (space.py)
                r = offload_rescue(ctx.systems, cand, r, ctx.opt, ctx.stack)
            if True in ctx.space.offload_activations:  # then with the activations on the host
                r = activation_offload_rescue(
                    ctx.systems, cand, r, ctx.model, remats_offloading(ctx.stack, ctx.space.remats)
                )
            out.append(Family.of(st, cand, r, dt))
            done += len(cand)
            if progress:
                progress(done, total)
    return out


# -- the efficient size (issue 22 item 14) -------------------------------------------------

# Below this share of the step spent computing, more than half of every chip-hour goes to
# communication, the pipeline bubble and fixed overheads. Halving the chips at most doubles the
# compute per chip and leaves the rest no larger, so a smaller cluster may run each token for
# fewer chip-hours: the planner then costs halvings of the requested system.
EFFICIENT_COMPUTE_SHARE = 0.5
# A smaller cluster is named when it needs at least this much fewer chip-hours per token
# (smaller gains are within the model's accuracy: docs/validate.md's median error is ~5%).
EFFICIENT_SAVING = 0.2
# Halvings costed at most (down to 1/16 of the requested chips).
EFFICIENT_HALVINGS = 4


def _chip_seconds_per_token(c: StepCost) -> float:
    return c.step_time_s * c.system.n_chips / c.workload.batch_tokens


def smaller_efficient(
    best: StepCost, ctx: _Costing, dtypes: ComputeDtypes | None
) -> StepCost | None:
    """The best plan on half, a quarter, ... of the requested system that needs at least
    `EFFICIENT_SAVING` fewer chip-seconds per token than `best`, when `best` computes for less
    than `EFFICIENT_COMPUTE_SHARE` of its step (None otherwise). Halving stops once a size is
    no cheaper per token than the one before it, or when no plan fits."""
    if best.compute_time_s >= EFFICIENT_COMPUTE_SHARE * best.step_time_s:
        return None
    found, cost = None, _chip_seconds_per_token(best)
    for k in range(1, EFFICIENT_HALVINGS + 1):
        n = best.system.n_chips >> k
        try:
            (sysm,) = systems_for_counts(best.system, [n])[:1]
            res = plan_training(
                ctx.model, sysm, ctx.workload, top_k=1, efficiency=ctx.eff,
                optimizer=ctx.opt.name, allow_sub_slices=False, policy=ctx.policy,
                framework=ctx.stack, dtypes=dtypes, space=ctx.space, efficient_size=False,
                launch_stack=ctx.launch_stack,
            )  # fmt: skip
        except (PlanError, ValueError):
            break
        c = _chip_seconds_per_token(res.best)
        if c >= cost:
            break
        found, cost = res.best, c
    if found is None or cost > (1 - EFFICIENT_SAVING) * _chip_seconds_per_token(best):
        return None
    return found


def efficient_size_note(best: StepCost, smaller: StepCost | None) -> str:
    """One sentence naming the smaller cluster that runs a token for far fewer chip-hours."""
    if smaller is None:
        return ""
    ratio = _chip_seconds_per_token(smaller) / _chip_seconds_per_token(best)
    money = ""
    if (
        best.run_cost_usd is not None
        and smaller.run_cost_usd is not None
        and best.workload.total_tokens
    ):
        money = (
            f" (${smaller.run_cost_usd / 1e6:.3g}M in {smaller.run_time_s / DAY:.3g} days instead"
            f" of ${best.run_cost_usd / 1e6:.3g}M in {best.run_time_s / DAY:.3g} days)"
        )
    return (
        f"{best.system.name} is far past this run's efficient size: its best plan computes for "
        f"{best.compute_time_s / best.step_time_s:.0%} of each step at {best.mfu:.1%} MFU; on "
        f"{smaller.system.n_chips} chips ({smaller.system.name}) the best plan runs at "
        f"{smaller.mfu:.1%} MFU and needs {1 - ratio:.0%} fewer chip-hours per token{money}, "
        f"{smaller.step_time_s / best.step_time_s:.2g}x the step time "
        f"({smaller.plan.describe()})"
    )


def _brief(c: StepCost) -> dict[str, Any]:
    return {
        "system": c.system.name,
        "chips": c.system.n_chips,
        "plan": c.plan.describe(),
        "step_time_s": c.step_time_s,
        "mfu": c.mfu,
        "run_time_s": c.run_time_s,
        "run_cost_usd": c.run_cost_usd,
        "chip_seconds_per_token": _chip_seconds_per_token(c),
    }
