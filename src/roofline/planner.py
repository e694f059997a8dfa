"""The training planner: a declared search space, named filters with reasons, vectorised evaluation.

Search space (every legal combination): system or sub-slices × mesh factorisation
dp·fsdp·tp·sp·ep·pp = chips × microbatches × remat × ZeRO stage × pipeline schedule ×
Megatron sequence parallelism × collective matmul. Each factor's domain is declared with
the rule that bounds it (`SearchSpace.domains`); combinations are then rejected by named
filters (batch not divisible, mesh does not fit the topology, does not fit HBM), each
counted. Survivors are grouped by structure (which strategies are active) and costed by
`training.evaluate_plans` on numpy arrays: one algebra pass per structure, not per plan.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roofline.errors import PlanError
from roofline.memory import Remat, RematKind, parse_optimizer
from roofline.rules import Degrees, Strategy
from roofline.specs.efficiency import Efficiency, default_efficiency
from roofline.specs.model import ModelSpec
from roofline.specs.system import System, parse_system
from roofline.training import (
    Candidates,
    Plan,
    Schedule,
    StepCost,
    Structure,
    Workload,
    evaluate_plan,
    evaluate_plans,
)

MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)
REMATS = (Remat(RematKind.NONE), Remat(RematKind.MATMULS), Remat(RematKind.FULL))


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class SearchSpace:
    """What the planner may choose. `None` for a strategy list means all that apply to the model."""

    strategies: tuple[Strategy, ...] = tuple(Strategy)
    microbatches: tuple[int, ...] = MICROBATCHES
    remats: tuple[Remat, ...] = REMATS
    zero_stages: tuple[int, ...] = (1, 2)
    schedules: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.GPIPE)
    max_sp: int = 16
    max_pp: int = 64
    max_stage_imbalance: float = 1.10  # uneven pipeline stages: fullest / average layers per stage
    megatron_sp: tuple[bool, ...] = (False, True)
    collective_matmul: tuple[bool, ...] = (False, True)

    def domains(
        self, model: ModelSpec, workload: Workload, chips: int
    ) -> dict[Strategy, tuple[list[int], str]]:
        """Allowed degrees per strategy with the rule that bounds each (named, for the report)."""
        seqs = int(workload.sequences)
        on = set(self.strategies)
        dom: dict[Strategy, tuple[list[int], str]] = {}
        dom[Strategy.DP] = (
            [d for d in divisors(math.gcd(chips, seqs))] if Strategy.DP in on else [1],
            f"divides the {seqs} sequences of the batch",
        )
        dom[Strategy.FSDP] = (
            [d for d in divisors(math.gcd(chips, seqs))] if Strategy.FSDP in on else [1],
            f"divides the {seqs} sequences of the batch",
        )
        tp_lim = math.gcd(
            math.gcd(
                model.n_heads,
                model.d_ff if model.moe is None or model.n_dense_layers else model.moe.d_ff_expert,
            ),
            chips,
        )
        dom[Strategy.TP] = (
            divisors(tp_lim) if Strategy.TP in on else [1],
            f"divides heads={model.n_heads} and d_ff",
        )
        dom[Strategy.SP] = (
            [d for d in divisors(math.gcd(workload.seq_len, chips)) if d <= self.max_sp]
            if Strategy.SP in on
            else [1],
            f"divides seq={workload.seq_len}, at most {self.max_sp}",
        )
        experts = model.moe.n_experts if model.moe else 1
        dom[Strategy.EP] = (
            divisors(math.gcd(experts, chips)) if Strategy.EP in on and model.moe else [1],
            f"divides experts={experts}" if model.moe else "dense model: no experts",
        )
        L = model.n_layers
        dom[Strategy.PP] = (
            [
                d
                for d in divisors(chips)
                if d <= min(self.max_pp, L) and math.ceil(L / d) <= self.max_stage_imbalance * L / d
            ]
            if Strategy.PP in on
            else [1],
            f"at most min(layers={L}, {self.max_pp}); the fullest stage (ceil(L/pp) layers) at most "
            f"{self.max_stage_imbalance - 1:.0%} above the average",
        )
        return dom


@dataclass(frozen=True)
class Ranked:
    cost: StepCost
    score: float


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
    why: str
    systems: tuple[str, ...]
    requested_system: str = ""
    requested_chips: int = 0
    feasible_per_system: dict[str, int] = field(default_factory=dict)

    @property
    def best(self) -> StepCost:
        return self.top[0]

    @property
    def sub_slice_note(self) -> str:
        """Why the best plan does not use the whole requested system (empty if it does)."""
        b = self.best.system
        if self.requested_chips == 0:  # the user gave chip counts (--chips)
            counts = ", ".join(s_.split("(")[-1].split(" ")[0] for s_ in self.systems)
            return f"chip counts searched (--chips): {counts}; the best runs on {b.name} ({b.n_chips} chips)"
        if b.n_chips == self.requested_chips:
            return ""
        full = self.feasible_per_system.get(self.requested_system, 0)
        if full == 0:
            return (
                f"no legal plan uses all {self.requested_chips} chips of {self.requested_system} (every factorisation fails a "
                f"divisibility rule or HBM), so its sub-slices were searched; the best runs on {b.name} ({b.n_chips} chips)"
            )
        return (
            f"a {b.n_chips}-chip sub-slice ({b.name}) scores better on '{self.objective}' than the plans using all "
            f"{self.requested_chips} chips"
        )

    def to_dict(self) -> dict[str, Any]:
        b = self.best.to_dict()
        return {
            **b,
            "system_used": self.best.system.name,
            "chips_used": self.best.system.n_chips,
            "sub_slice_note": self.sub_slice_note,
            "feasible_per_system": dict(self.feasible_per_system),
            "candidates_evaluated": self.candidates_evaluated,
            "candidates_enumerated": self.candidates_enumerated,
            "rejected": dict(self.rejected),
            "domains": self.domains,
            "objective": self.objective,
            "why": self.why,
            "top": [c.to_dict() for c in self.top],
            "pareto": list(self.pareto),
            "search_time_s": self.search_time_s,
            "systems_considered": list(self.systems),
        }


def systems_for_counts(system: System, chips: Sequence[int] | tuple[int, int]) -> list[System]:
    """Systems of the same chip for a chip-count list [a, b, ...] or range (lo, hi).

    GPUs: clusters of exactly those counts (a range: every node·2^k in it, plus its ends when
    they are whole nodes). TPUs: the pod's sub-slices and 2, 4, 8 pods over DCN, kept when their
    count is listed or within the range. An empty result is an error naming what exists.
    """
    rng = isinstance(chips, tuple) and len(chips) == 2
    lo, hi = chips if rng else (min(chips), max(chips))
    node = system.chip.nvlink_domain or 8
    if not system.is_tpu:
        if rng:
            counts = {n for n in (lo, hi) if n % node == 0 or n < node}
            n = node
            while n <= hi:
                if n >= lo:
                    counts.add(n)
                n *= 2
        else:
            counts = set(chips)
        out = [
            parse_system(
                f"{system.chip.name}:{n}",
                usd_per_chip_hour=system.usd_per_chip_hour,
                sharp=system.sharp,
            )
            for n in sorted(counts)
        ]
    else:
        fam = scale_family(
            system,
            max_factor=max(2, 2 ** math.ceil(math.log2(max(1, hi / max(system.n_chips, 1))))),
        ) + [system]
        seen: dict[int, System] = {}
        for s_ in fam:
            keep = lo <= s_.n_chips <= hi if rng else s_.n_chips in set(chips)
            if keep and s_.n_chips not in seen:
                seen[s_.n_chips] = s_
        out = [seen[k] for k in sorted(seen)]
    if not out:
        raise PlanError(
            f"no {system.chip.name} system has {f'between {lo} and {hi}' if rng else list(chips)} chips",
            rule="TPU counts come from the pod's sub-slices and whole pods; GPU counts are whole nodes",
            fix="widen --chips or omit it",
        )
    return out


def sub_slices(system: System, max_count: int = 8) -> list[System]:
    """The system plus its largest sub-slices of distinct chip counts (TPU pods only).

    A batch of 2^k sequences rarely divides a 16x20x28 pod (8960 = 2^8·5·7), so the planner
    also considers slices like 16x16x16; each keeps the wraparound rules of its shape.
    """
    if not system.is_tpu or len(system.topology) < 2:
        return [system]
    slices = system.n_slices
    dims = system.topology
    choices = [
        sorted({d for d in (1, 2, *range(4, full + 1, 4)) if d <= full} | {full}) for full in dims
    ]
    best: dict[int, tuple[int, ...]] = {}
    for shape in itertools.product(*choices):
        n = math.prod(shape) * slices
        if n < system.n_chips // 8:
            continue
        cur = best.get(n)
        if cur is None or max(shape) - min(shape) < max(cur) - min(cur):
            best[n] = shape

    # for each odd part o (n = 2^a·o) keep the largest count; small odd parts factor best
    def odd(n: int) -> int:
        while n % 2 == 0:
            n //= 2
        return n

    by_odd: dict[int, int] = {}
    for n in best:
        o = odd(n)
        by_odd[o] = max(by_odd.get(o, 0), n)
    keep = sorted(by_odd.items())[:max_count]
    if system.n_chips not in {n for _, n in keep}:
        keep.append((odd(system.n_chips), system.n_chips))
    chosen = sorted(((n, best.get(n, dims)) for _, n in keep), reverse=True)
    out = []
    for n, shape in chosen:
        if n == system.n_chips:
            out.append(system)
            continue
        chip_name = system.chip.name
        try:
            prefix = f"{slices}x" if slices > 1 else ""
            out.append(
                parse_system(
                    f"{prefix}{chip_name}:{'x'.join(map(str, shape))}",
                    usd_per_chip_hour=system.usd_per_chip_hour,
                )
            )
        except Exception:  # noqa: BLE001 - a shape the system parser refuses is simply not offered
            continue
    return out


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
    chips: Sequence[int] | None = None,
    tie_tolerance: float = 0.01,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Search every legal plan; rank by `objective` ('time' = step time, 'cost' = $ per token)."""
    t0 = time.perf_counter()
    space = space or SearchSpace()
    eff = efficiency or default_efficiency(system.chip.vendor)
    opt = parse_optimizer(optimizer)
    if objective not in ("time", "cost"):
        raise PlanError(
            f"objective {objective!r}",
            rule="objective is 'time' or 'cost'",
            fix="write --objective time",
        )
    systems = sub_slices(system) if allow_sub_slices else [system]
    if chips:
        systems = systems_for_counts(system, chips)
    rejected: Counter[str] = Counter()
    domains_txt: dict[str, str] = {}
    seqs = int(workload.sequences)
    order = (Strategy.DP, Strategy.FSDP, Strategy.TP, Strategy.SP, Strategy.EP, Strategy.PP)
    facts = []
    for si, sysm in enumerate(systems):
        dom = space.domains(model, workload, sysm.n_chips)
        for st_, (vals, why) in dom.items():
            domains_txt[st_.value] = f"{vals[:12]}{'...' if len(vals) > 12 else ''}: {why}"
        facts += [(si, *f) for f in _factorisations(sysm.n_chips, dom)]
    if not facts:
        raise PlanError(
            f"no mesh factorisation of {system.n_chips} chips satisfies the divisibility rules",
            rule="; ".join(f"{k}: {v}" for k, v in domains_txt.items()),
            fix="try another chip count (--chips) or batch size",
        )
    F = np.array(facts, dtype=np.int64)  # columns: system, dp, fsdp, tp, sp, ep, pp
    IL = list(Schedule).index(Schedule.INTERLEAVED)
    # stage 1: mesh × microbatches × schedule, where the divisibility rules act
    mbs = np.array(space.microbatches)
    scheds = np.array([list(Schedule).index(x) for x in space.schedules])
    g1 = np.meshgrid(np.arange(len(F)), mbs, scheds, indexing="ij")
    fi, mb, sc = (x.reshape(-1) for x in g1)
    rows = F[fi]
    dp, fsdp, tp, sp_, ep, pp = (rows[:, 1 + j] for j in range(6))
    keep = (pp > 1) | (sc == scheds[0])  # the schedule matters only with a pipeline
    fi, mb, sc, rows = fi[keep], mb[keep], sc[keep], rows[keep]
    dp, fsdp, tp, sp_, ep, pp = (rows[:, 1 + j] for j in range(6))
    # how many full candidates each stage-1 row stands for (choices that apply to it)
    n_msp = np.where(tp > 1, len(space.megatron_sp), 1)
    n_cm = np.where(tp > 1, len(space.collective_matmul), 1)
    n_z = np.where(dp > 1, len(space.zero_stages), 1)
    weight = n_msp * n_cm * n_z * len(space.remats)
    enumerated = int(weight.sum())
    filters = [
        ("batch not divisible by dp·fsdp·ep·microbatches", seqs % (dp * fsdp * ep * mb) != 0),
        ("fewer microbatches than pipeline stages", (pp > 1) & (mb < pp)),
        (
            "layers not divisible by pp·virtual stages",
            (sc == IL) & (model.n_layers % (pp * 2) != 0),
        ),
    ]
    ok = np.ones(len(fi), dtype=bool)
    for name, bad in filters:
        bad = bad & ok
        if bad.any():
            rejected[name] += int(weight[bad].sum())
        ok &= ~bad
    fi, mb, sc, rows = fi[ok], mb[ok], sc[ok], rows[ok]
    # stage 2: expand the survivors with the choices that apply to each
    tp1 = rows[:, 3] > 1
    dp1 = rows[:, 1] > 1
    exp = []
    for msp_v in space.megatron_sp:
        for cm_v in space.collective_matmul:
            for z_v in space.zero_stages:
                m_ok = tp1 | (
                    (msp_v == space.megatron_sp[0]) & (cm_v == space.collective_matmul[0])
                )
                m_ok &= dp1 | (z_v == space.zero_stages[0])
                for ri_v in range(len(space.remats)):
                    idx = np.nonzero(m_ok)[0]
                    exp.append((idx, msp_v, cm_v, z_v, ri_v))
    sel_idx = np.concatenate([e[0] for e in exp])
    msp = np.concatenate([np.full(len(e[0]), e[1]) for e in exp]).astype(bool)
    cmv = np.concatenate([np.full(len(e[0]), e[2]) for e in exp]).astype(bool)
    zv = np.concatenate([np.full(len(e[0]), e[3]) for e in exp])
    ri = np.concatenate([np.full(len(e[0]), e[4]) for e in exp])
    fi, mb, sc, rows = fi[sel_idx], mb[sel_idx], sc[sel_idx], rows[sel_idx]
    dp, fsdp, tp, sp_, ep, pp = (rows[:, 1 + j] for j in range(6))
    kv_rep = (tp > 1) & (model.mla is None) & (model.n_kv_heads % np.maximum(tp, 1) != 0)
    # One structure for every mesh: a strategy of degree 1 is a mesh axis of size 1, which the
    # algebra already prices at zero (no split, no communication), so all candidates that share
    # the Megatron-SP flag and the KV-head replication are costed in one vectorised pass.
    # (tests/test_planner_equivalence checks this against the minimal structure of each plan.)
    present = [j for j in range(6) if (rows[:, 1 + j] > 1).any()]
    active_bits = np.full(len(rows), sum(1 << j for j in present), dtype=np.int64)
    gkey = active_bits * 4 + msp.astype(np.int64) * 2 + kv_rep.astype(np.int64)
    by_key = np.argsort(gkey, kind="stable")
    keys, starts = np.unique(gkey[by_key], return_index=True)
    ends = np.append(starts[1:], len(gkey))
    groups = []
    for key, a0, a1 in zip(keys, starts, ends, strict=True):
        sel = by_key[a0:a1]
        bits = int(key) // 4
        active = frozenset(order[j] for j in range(6) if bits >> j & 1)
        cand = Candidates(
            {order[j]: rows[sel, 1 + j] for j in range(6)},
            mb[sel],
            zv[sel],
            sc[sel],
            np.where(sc[sel] == list(Schedule).index(Schedule.INTERLEAVED), 2, 1),
            system_idx=rows[sel, 0],
            remat_idx=ri[sel],
            collective_matmul=cmv[sel],
        )
        st = Structure(active, space.remats[0], bool(int(key) >> 1 & 1), False, bool(int(key) & 1))
        groups.append((st, cand))
    summaries = _evaluate_groups(
        groups, model, systems, workload, eff, opt, list(space.remats), progress
    )
    results = [(st, cand, sm) for (st, cand), sm in zip(groups, summaries, strict=True)]
    # ---- rank (vectorised: one array over all groups) -----------------------------------
    price_s = np.array([sy.usd_per_chip_hour or np.nan for sy in systems])
    chips_s = np.array([sy.n_chips for sy in systems], dtype=float)
    cols = {k: [] for k in ("score", "g", "i", "step", "chips", "usd", "comm", "nstrat")}
    for gi, (_st, cand, r) in enumerate(results):
        for reason, cnt in r.rejected.items():
            rejected[reason] += cnt
        ok = ~r.infeasible
        n_chips = chips_s[cand.system_idx][ok]
        usd = (
            r.step_time_s[ok]
            * n_chips
            * price_s[cand.system_idx][ok]
            / 3600
            / workload.batch_tokens
        )
        step = r.step_time_s[ok]
        cols["score"].append(step if objective == "time" else usd)
        cols["g"].append(np.full(int(ok.sum()), gi))
        cols["i"].append(np.nonzero(ok)[0])
        cols["step"].append(step)
        cols["chips"].append(n_chips)
        cols["usd"].append(usd)
        cols["comm"].append(r.comm_total[ok])
        d = cand.deg
        n_strat = (
            ((d[Strategy.DP] > 1) | (d[Strategy.FSDP] > 1)).astype(int)
            + (d[Strategy.TP] > 1)
            + (d[Strategy.SP] > 1)
            + (d[Strategy.PP] > 1)
            + (d[Strategy.EP] > 1)
        )
        cols["nstrat"].append(np.asarray(n_strat)[ok])
    A = {k: np.concatenate(v) if v else np.array([]) for k, v in cols.items()}
    evaluated = sum(len(c) for _, c, _ in results)
    if not len(A["score"]):
        top_reason = rejected.most_common(1)[0][0] if rejected else "no candidates"
        raise PlanError(
            f"no plan fits: {evaluated} candidates evaluated, most rejected because {top_reason}",
            rule="a plan must divide the batch, fit the topology and fit HBM",
            fix="use more chips, a smaller batch or sequence, or a smaller model",
        )
    if objective == "cost" and np.all(np.isnan(A["score"])):
        raise PlanError(
            f"objective 'cost' needs a price, and {system.name} has none",
            rule="prices come from the chip file or --price",
            fix="give --price USD_PER_CHIP_HOUR or use --objective time",
        )
    score = np.nan_to_num(A["score"], nan=np.inf)
    # Rank by the objective; plans within `tie_tolerance` of the best are equivalent within the
    # model's accuracy, and among those the simpler one (fewer parallelism strategies; DP and
    # FSDP count as one) ranks first, then the one whose collectives take less time if nothing
    # overlapped (less reliance on perfect overlap).
    best_score = score.min()
    near = score <= best_score * (1 + tie_tolerance)
    order_idx = np.lexsort((A["step"], score, ~near))  # near first, then by score
    near_idx = order_idx[: int(near.sum())]
    near_idx = near_idx[np.lexsort((score[near_idx], A["comm"][near_idx], A["nstrat"][near_idx]))]
    ranked = np.concatenate([near_idx, order_idx[int(near.sum()) :][:200]])
    flat = [
        (
            float(score[j]),
            int(A["g"][j]),
            int(A["i"][j]),
            float(A["step"][j]),
            float(A["chips"][j]),
            float(A["usd"][j]),
            float(A["comm"][j]),
        )
        for j in ranked[:400]
    ]
    # top-k distinct meshes (variants of one mesh that differ only in ZeRO stage or a flag
    # are not listed twice; the best variant of each mesh is kept)
    top: list[StepCost] = []
    seen: set[tuple] = set()
    for _score, gi, i, *_ in flat:
        st, cand, _r = results[gi]
        plan = _plan_from(st, cand, i, space, opt)
        sysm = systems[int(cand.system_idx[i])]
        key = (plan.degrees.mesh_axes(), sysm.n_chips)
        if key in seen:
            continue
        seen.add(key)
        top.append(evaluate_plan(model, sysm, workload, plan, efficiency=eff))
        if len(top) >= top_k:
            break
    pareto = _pareto(A, results, space, opt)

    # the runner-up worth explaining: the best plan with another set of strategies or chip count
    # (variants of the winner's mesh differ by noise, not by a reason a user can act on)
    def shape(c: StepCost) -> tuple:
        # DP and FSDP are one family here (HSDP is a split of the same batch axis)
        d = c.plan.degrees
        return (d.tp > 1, d.sp > 1, d.pp > 1, d.ep > 1, c.system.n_chips)

    runner = next((c for c in top[1:] if shape(c) != shape(top[0])), None)
    if runner is None:
        # find it on the ranked arrays (shape from the degrees alone), then cost only that one
        want = shape(top[0])
        for _score, gi, i, *_ in flat[len(top) :]:
            st, cand, _r = results[gi]
            d = {s_: int(cand.deg[s_][i]) for s_ in Strategy}
            n = systems[int(cand.system_idx[i])].n_chips
            if (
                d[Strategy.TP] > 1,
                d[Strategy.SP] > 1,
                d[Strategy.PP] > 1,
                d[Strategy.EP] > 1,
                n,
            ) != want:
                plan = _plan_from(st, cand, i, space, opt)
                runner = evaluate_plan(
                    model, systems[int(cand.system_idx[i])], workload, plan, efficiency=eff
                )
                break
    why = _why(top[0], runner, objective, tie_tolerance)
    feasible = {sy.name: int(np.sum(A["chips"] == sy.n_chips)) for sy in systems}
    return PlanResult(
        tuple(top),
        evaluated,
        enumerated,
        dict(rejected),
        domains_txt,
        pareto,
        objective,
        time.perf_counter() - t0,
        why,
        tuple(f"{s.name} ({s.n_chips} chips)" for s in systems),
        system.name,
        0 if chips else system.n_chips,
        feasible,
    )


@dataclass(frozen=True)
class _Summary:
    """What ranking needs from one structure's evaluation (small enough to send between processes)."""

    step_time_s: np.ndarray
    comm_total: np.ndarray
    infeasible: np.ndarray
    rejected: dict[str, int]


def _summarise(r) -> _Summary:
    return _Summary(r.step_time_s, sum(r.comm.values()), r.infeasible, r.reason.counts())


def _evaluate_groups(
    groups, model, systems, workload, eff, opt, remats, progress
) -> list[_Summary]:
    """Evaluate every structure group: one vectorised algebra pass each.

    (Splitting the groups over processes was measured slower on the 2-core target, because
    each process rebuilds the shared caches; see benchmarks/.)
    """
    total = sum(len(c) for _, c in groups)
    out = []
    done = 0
    for st, cand in groups:
        out.append(
            _summarise(
                evaluate_plans(
                    model, systems, workload, st, cand, eff=eff, optimizer=opt, remats=remats
                )
            )
        )
        done += len(cand)
        if progress:
            progress(done, total)
    return out


def _factorisations(
    n: int, dom: dict[Strategy, tuple[list[int], str]]
) -> Iterable[tuple[int, ...]]:
    """All (dp, fsdp, tp, sp, ep, pp) from the domains whose product is n."""
    order = (Strategy.TP, Strategy.PP, Strategy.SP, Strategy.EP, Strategy.DP)
    fs = set(dom[Strategy.FSDP][0])

    def rec(i: int, rest: int, acc: dict[Strategy, int]) -> Iterable[tuple[int, ...]]:
        if i == len(order):
            if rest in fs:
                yield (
                    acc[Strategy.DP],
                    rest,
                    acc[Strategy.TP],
                    acc[Strategy.SP],
                    acc[Strategy.EP],
                    acc[Strategy.PP],
                )
            return
        s = order[i]
        for v in dom[s][0]:
            if rest % v == 0:
                acc[s] = v
                yield from rec(i + 1, rest // v, acc)
        acc.pop(s, None)

    yield from rec(0, n, {})


def _reason_key(reason: str) -> str:
    if reason.startswith("does not fit HBM"):
        return "does not fit HBM"
    if reason.startswith("mesh does not fit"):
        return "mesh does not fit the topology"
    return reason


def _plan_from(st: Structure, cand: Candidates, i: int, space: SearchSpace, opt) -> Plan:
    deg = Degrees(**{s.value: int(cand.deg[s][i]) for s in Strategy})
    return Plan(
        degrees=deg,
        microbatches=int(cand.microbatches[i]),
        remat=space.remats[int(cand.remat_idx[i])],
        zero=int(cand.zero[i]),
        schedule=list(Schedule)[int(cand.schedule[i])],
        virtual_stages=int(cand.virtual[i]),
        sequence_parallel=st.sequence_parallel,
        collective_matmul=bool(cand.collective_matmul[i]),
        overlap_ep=bool(cand.overlap_ep[i]) if cand.overlap_ep is not None else False,
        optimizer=opt,
    )


def _pareto(A: dict[str, np.ndarray], results, space, opt) -> tuple[dict[str, Any], ...]:
    """Plans not beaten on all of chips, step time and $ per token (vectorised sweep by chip count)."""
    out = []
    for chips in np.unique(A["chips"]):
        sel = np.nonzero(A["chips"] == chips)[0]
        j = sel[np.argmin(A["step"][sel])]
        if out and A["step"][j] >= out[-1][1]:
            continue
        out.append((j, float(A["step"][j])))
    rows = []
    for j, step in out:
        st, cand, _ = results[int(A["g"][j])]
        usd = float(A["usd"][j])
        rows.append(
            {
                "chips": int(A["chips"][j]),
                "step_time_s": step,
                "usd_per_million_tokens": usd * 1e6,
                "plan": _plan_from(st, cand, int(A["i"][j]), space, opt).describe(),
            }
        )
    return tuple(rows)


def _why(a: StepCost, b: StepCost | None, objective: str, tie: float = 0.01) -> str:
    """One paragraph: the winner against the best plan of a different shape, term by term."""
    if b is None:
        return "no plan of a different shape is feasible"

    def score(c: StepCost) -> float:
        return (
            c.step_time_s
            if objective == "time" or c.run_cost_usd is None
            else c.step_time_s * c.system.n_chips
        )

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
        f"{a.bottleneck}, the runner-up by {b.bottleneck}"
    )
    if terms:
        name, x, y = terms[0]
        s += f"; the biggest difference is {name} ({x:.3g} s vs {y:.3g} s per step)"
    if score(b) < score(a):
        ca, cb = sum(a.comm_time_s.values()), sum(b.comm_time_s.values())
        s += (
            f". The runner-up scores {1 - score(b) / score(a):.1%} better, within the model's {tie:.0%} tie tolerance, where the "
            f"simpler plan ranks first (then the one whose collectives would take less time without overlap: "
            f"{ca:.3g} s vs {cb:.3g} s)"
        )
    return s


def terminal_progress(stream=sys.stderr) -> Callable[[int, int], None] | None:
    if not stream.isatty():
        return None

    def show(done: int, total: int) -> None:
        stream.write(f"\r  evaluated {done}/{total} candidates")
        if done == total:
            stream.write("\n")
        stream.flush()

    return show


@dataclass(frozen=True)
class DeadlineResult:
    """The smallest system (of the family searched) whose best plan finishes the run in time."""

    deadline_s: float
    result: PlanResult | None  # the plan on the chosen system (None if even the largest misses)
    tried: tuple[
        tuple[str, int, float], ...
    ]  # (system, chips, best run time s) in the order searched

    def to_dict(self) -> dict[str, Any]:
        return {
            "deadline_s": self.deadline_s,
            "chips_needed": None if self.result is None else self.result.best.system.n_chips,
            "system_needed": None if self.result is None else self.result.best.system.name,
            "tried": [{"system": s, "chips": n, "run_time_s": t} for s, n, t in self.tried],
        }


def scale_family(system: System, max_factor: int = 8) -> list[System]:
    """Systems of the same chip, smallest first: GPU clusters of node·2^k GPUs up to `max_factor`
    × the given one; TPU sub-slices of the pod, then 2, 4, ... pods over DCN."""
    out: list[System] = []
    if system.is_tpu:
        base = sub_slices(
            system
            if system.n_slices == 1
            else parse_system(f"{system.chip.name}:{'x'.join(map(str, system.topology))}"),
            max_count=64,
        )
        pod = "x".join(map(str, system.topology))
        out = sorted(base, key=lambda s: s.n_chips)
        k = 2
        while k <= max_factor:
            out.append(
                parse_system(
                    f"{k}x{system.chip.name}:{pod}", usd_per_chip_hour=system.usd_per_chip_hour
                )
            )
            k *= 2
        return out
    node = system.chip.nvlink_domain or 8
    n = node
    while n <= system.n_chips * max_factor:
        out.append(
            parse_system(
                f"{system.chip.name}:{n}",
                usd_per_chip_hour=system.usd_per_chip_hour,
                sharp=system.sharp,
            )
        )
        n *= 2
    return out


def chips_for_deadline(
    model: ModelSpec, system: System, workload: Workload, deadline_s: float, **kw: Any
) -> DeadlineResult:
    """Bisect the system's scale family for the fewest chips whose fastest plan meets the deadline.

    Run time falls as chips grow (more chips never make the best plan slower, since a larger
    system can always run a smaller plan's mesh with wider data parallelism), so a bisection
    over the sorted family finds the boundary with a few planner calls.
    """
    if not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise PlanError(
            f"deadline {deadline_s!r} s",
            rule="a deadline is a positive duration",
            fix="write e.g. --deadline 30d",
        )
    if not workload.total_tokens:
        raise PlanError(
            "a deadline needs the run length",
            rule="run time = tokens / throughput",
            fix="give --tokens, e.g. 15T",
        )
    family = scale_family(system)
    tried: list[tuple[str, int, float]] = []
    cache: dict[int, PlanResult | None] = {}

    def best(i: int) -> PlanResult | None:
        if i not in cache:
            try:
                r = plan_training(
                    model, family[i], workload, objective="time", allow_sub_slices=False, **kw
                )
                tried.append((family[i].name, family[i].n_chips, r.best.run_time_s))
            except PlanError:
                r = None
                tried.append((family[i].name, family[i].n_chips, math.inf))
            cache[i] = r
        return cache[i]

    def ok(i: int) -> bool:
        r = best(i)
        return r is not None and r.best.run_time_s <= deadline_s

    lo, hi = 0, len(family) - 1
    if not ok(hi):
        return DeadlineResult(deadline_s, None, tuple(tried))
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return DeadlineResult(deadline_s, best(lo), tuple(tried))
