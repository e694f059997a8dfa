"""Ranking the costed candidates: one flat array over every family, the objective, near-ties
broken towards simpler plans, the top plans of distinct shapes, the runner-up of another
shape, and the Pareto set of chips vs step time vs cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from roofline.errors import PlanError
from roofline.specs.plan import ComputeDtypes, Plan, Schedule, Strategy, flag_codes
from roofline.specs.system import System
from roofline.training.step import Candidates, StepArrays, Structure, comm_total, run_cost_usd

# Plans beyond the near-ties kept in rank order for the top list and the runner-up search
# (the top list needs at most top_k distinct shapes; 200 more rows always hold them).
KEEP_AFTER_TIES = 200
# Ranked rows rebuilt into plans at most (top list + runner-up scan): bounds the Python work.
SCAN_LIMIT = 400


@dataclass(frozen=True)
class Family:
    """One costed family: its Structure, its Candidates, and what ranking needs of their step
    results (kept small: the full StepArrays of every family would not fit a laptop)."""

    structure: Structure
    cand: Candidates
    step_time_s: np.ndarray
    comm_s: np.ndarray  # the collectives' time per step if nothing overlapped
    infeasible: np.ndarray
    rejected: dict[str, int]
    dtypes: ComputeDtypes | None = None  # the compute dtypes it was costed in (None: default)

    @staticmethod
    def of(
        structure: Structure, cand: Candidates, r: StepArrays, dtypes: ComputeDtypes | None = None
    ) -> Family:
        return Family(
            structure,
            cand,
            r.step_time_s,
            comm_total(r),
            r.infeasible,
            r.reason.counts(),
            dtypes,
        )


@dataclass(frozen=True)
class Ranked:
    """Every feasible candidate as flat arrays, and the rank order."""

    score: np.ndarray  # the objective (step time, or $ per token)
    family: np.ndarray  # which Family
    index: np.ndarray  # index within the family's Candidates
    step: np.ndarray
    chips: np.ndarray
    usd_per_token: np.ndarray  # NaN without a price
    comm: np.ndarray  # the collectives' time if nothing overlapped
    n_strategies: np.ndarray  # parallelism strategies used (DP and FSDP count as one)
    order: np.ndarray  # rows in rank order (near-ties first, simpler first among them)

    def __len__(self) -> int:
        return len(self.score)


def _columns(
    families: list[Family], systems: list[System], batch_tokens: float, objective: str
) -> dict[str, np.ndarray]:
    price = np.array(
        [np.nan if sy.usd_per_chip_hour is None else sy.usd_per_chip_hour for sy in systems]
    )
    chips = np.array([sy.n_chips for sy in systems], dtype=float)
    cols: dict[str, list] = {
        k: [] for k in ("score", "g", "i", "step", "chips", "usd", "comm", "nstrat", "chunks")
    }
    for gi, f in enumerate(families):
        ok = ~f.infeasible
        sidx = f.cand.system_idx
        n_chips = chips[sidx][ok]
        step = f.step_time_s[ok]
        usd = run_cost_usd(step, n_chips, price[sidx][ok]) / batch_tokens
        d = f.cand.deg
        n_strat = ((d[Strategy.DP] > 1) | (d[Strategy.FSDP] > 1)).astype(int) + sum(
            (d[s] > 1).astype(int) for s in (Strategy.TP, Strategy.SP, Strategy.PP, Strategy.EP)
        )
        cols["score"].append(step if objective == "time" else usd)
        cols["g"].append(np.full(int(ok.sum()), gi))
        cols["i"].append(np.nonzero(ok)[0])
        cols["step"].append(step)
        cols["chips"].append(n_chips)
        cols["usd"].append(usd)
        cols["comm"].append(f.comm_s[ok])
        cols["nstrat"].append(np.asarray(n_strat)[ok])
        # model chunks per pipeline stage: the interleaved schedule's virtual stages, else 1
        il = np.asarray(f.cand.schedule) == Schedule.INTERLEAVED.code
        cols["chunks"].append(np.where(il, np.asarray(f.cand.virtual), 1)[ok])
    return {k: np.concatenate(v) if v else np.array([]) for k, v in cols.items()}


def rank(
    families: list[Family],
    systems: list[System],
    batch_tokens: float,
    objective: str,
    tie_tolerance: float,
    why_none: Callable[[], str],
) -> Ranked:
    """Rank by `objective`; plans within `tie_tolerance` of the best are equivalent within the
    model's accuracy, and among those the simpler one (fewer parallelism strategies; DP and
    FSDP count as one) ranks first, then the one whose collectives take less time if nothing
    overlapped (less reliance on perfect overlap)."""
    A = _columns(families, systems, batch_tokens, objective)
    if not len(A["score"]):
        raise PlanError(
            f"no plan fits: {sum(len(f.cand) for f in families)} candidates evaluated, most rejected because {why_none()}",
            rule="a plan must divide the batch, fit the topology and fit HBM",
            fix="use more chips, a smaller batch or sequence, or a smaller model",
        )
    if objective == "cost" and np.all(np.isnan(A["score"])):
        raise PlanError(
            f"objective 'cost' needs a price, and {systems[0].name} has none",
            rule="prices come from the chip file or --price",
            fix="give --price USD_PER_CHIP_HOUR or use --objective time",
        )
    score = np.nan_to_num(A["score"], nan=np.inf)
    near = score <= score.min() * (1 + tie_tolerance)
    order = rank_order(score, A["step"], A["comm"], A["nstrat"], near, A["chunks"])
    return Ranked(
        score, A["g"], A["i"], A["step"], A["chips"], A["usd"], A["comm"], A["nstrat"], order
    )


def rank_order(
    score: np.ndarray,
    step: np.ndarray,
    comm: np.ndarray,
    nstrat: np.ndarray,
    near: np.ndarray,
    chunks: np.ndarray | None = None,
) -> np.ndarray:
    """The rows in rank order, at most SCAN_LIMIT: the near-ties first, the fewer strategies
    first among them, then the fewer model chunks per pipeline stage (`chunks`: the
    interleaved schedule's virtual stages; the step model charges nothing per chunk, so within
    the model's accuracy the simpler schedule is named), then the less communication, then the
    score; then the other rows by score, then step time, at most KEEP_AFTER_TIES of them (ties
    in row order).

    Of the others only those within the KEEP_AFTER_TIES-th lowest score are sorted: lexsort
    is stable, so sorting a subset orders it as sorting every row does."""
    near_idx = np.flatnonzero(near)
    near_idx = near_idx[np.lexsort((step[near_idx], score[near_idx]))]
    keys = (score[near_idx], comm[near_idx], nstrat[near_idx])
    if chunks is not None:
        keys = (*keys[:2], chunks[near_idx], keys[2])
    near_idx = near_idx[np.lexsort(keys)]
    rest = np.flatnonzero(~near)
    if len(rest) > KEEP_AFTER_TIES:
        s_rest = score[rest]
        rest = rest[s_rest <= np.partition(s_rest, KEEP_AFTER_TIES - 1)[KEEP_AFTER_TIES - 1]]
    rest = rest[np.lexsort((step[rest], score[rest]))][:KEEP_AFTER_TIES]
    return np.concatenate([near_idx, rest])[:SCAN_LIMIT]


def shape_key(deg: dict[Strategy, int], n_chips: int) -> tuple:
    """What makes two plans different shapes for a reader: which strategies beyond the batch
    split they use, and how many chips (DP and FSDP are one family: HSDP re-splits one axis)."""
    return (
        deg[Strategy.TP] > 1,
        deg[Strategy.SP] > 1,
        deg[Strategy.PP] > 1,
        deg[Strategy.EP] > 1,
        n_chips,
    )


def listing_key(deg: dict[Strategy, int], n_chips: int) -> tuple:
    """Two plans list as one row of the top table when they differ only by how the batch is
    split between dp and fsdp (HSDP re-splits, near-identical in time), by a flag or by the
    ZeRO stage: the better one is listed."""
    return (deg[Strategy.TP], deg[Strategy.SP], deg[Strategy.PP], deg[Strategy.EP], n_chips)


def candidates_of_plans(plans: list[Plan], system_idx: list[int], remats) -> Candidates:
    """Candidates holding `plans` (plan i on system `system_idx[i]`, its remat an index into
    `remats`): the listed plans of a search, costed again together."""
    return Candidates(
        {s: np.array([p.degrees.of(s) for p in plans]) for s in Strategy},
        np.array([p.microbatches for p in plans]),
        np.array([p.zero for p in plans]),
        np.array([p.schedule.code for p in plans]),
        np.array([p.virtual_stages for p in plans]),
        system_idx=np.array(system_idx),
        remat_idx=np.array([list(remats).index(p.remat) for p in plans]),
        collective_matmul=flag_codes(p.collective_matmul for p in plans),
        overlap_ep=flag_codes(p.overlap_ep for p in plans),
        compiled=flag_codes(p.compiled for p in plans),
    )


def degrees_at(
    families: list[Family], ranked: Ranked, row: int
) -> tuple[Family, int, dict[Strategy, int]]:
    f = families[int(ranked.family[row])]
    i = int(ranked.index[row])
    return f, i, {s: int(f.cand.deg[s][i]) for s in Strategy}


def distinct_rows(
    families: list[Family], ranked: Ranked, systems: list[System], k: int
) -> list[int]:
    """The first `k` ranked rows of distinct listing keys."""
    out: list[int] = []
    seen: set[tuple] = set()
    for row in ranked.order:
        f, i, deg = degrees_at(families, ranked, row)
        key = listing_key(deg, systems[int(f.cand.system_idx[i])].n_chips)
        if key in seen:
            continue
        seen.add(key)
        out.append(int(row))
        if len(out) >= k:
            break
    return out


def runner_up_row(
    families: list[Family], ranked: Ranked, systems: list[System], best_row: int, start: int
) -> int | None:
    """The best-ranked row (from rank position `start`) whose shape differs from the winner's."""
    f, i, deg = degrees_at(families, ranked, best_row)
    want = shape_key(deg, systems[int(f.cand.system_idx[i])].n_chips)
    for row in ranked.order[start:]:
        f, i, deg = degrees_at(families, ranked, row)
        if shape_key(deg, systems[int(f.cand.system_idx[i])].n_chips) != want:
            return int(row)
    return None


def pareto(ranked: Ranked, describe: Callable[[int], str]) -> tuple[dict[str, Any], ...]:
    """Plans not beaten on all of chips, step time and $ per token (vectorised sweep by chip count)."""
    out = []
    for chips in np.unique(ranked.chips):
        sel = np.nonzero(ranked.chips == chips)[0]
        j = sel[np.argmin(ranked.step[sel])]
        if out and ranked.step[j] >= out[-1][1]:
            continue
        out.append((j, float(ranked.step[j])))
    rows = []
    for j, step in out:
        usd = float(ranked.usd_per_token[j])
        rows.append(
            {
                "chips": int(ranked.chips[j]),
                "step_time_s": step,
                # None without a price (JSON null, never NaN)
                "usd_per_million_tokens": None if np.isnan(usd) else usd * 1e6,
                "plan": describe(int(j)),
            }
        )
    return tuple(rows)


def plan_at(families: list[Family], ranked: Ranked, row: int, space, opt) -> Plan:
    """The Plan of a ranked row, rebuilt from the search arrays by keyword."""
    f, i, deg = degrees_at(families, ranked, row)
    return candidate_plan(f.cand, f.structure, i, space, opt, deg, f.dtypes)


def candidate_plan(c, structure, i: int, space, opt, deg=None, dtypes=None) -> Plan:
    """Candidate `i` of a family's arrays (`c`, its Structure) as a Plan, by keyword; `deg` its
    degrees where the caller has them already (else read off the arrays)."""
    from roofline.specs.plan import SCHEDULE_OF_CODE, Degrees, flag_of_code

    if deg is None:
        deg = {s: int(v[i]) for s, v in c.deg.items()}
    return Plan(
        degrees=Degrees(**{s.value: v for s, v in deg.items()}),
        microbatches=int(c.microbatches[i]),
        remat=space.remats[int(c.remat_idx[i])],
        zero=int(c.zero[i]),
        schedule=SCHEDULE_OF_CODE[int(c.schedule[i])],
        virtual_stages=int(c.virtual[i]),
        sequence_parallel=structure.sequence_parallel,
        collective_matmul=flag_of_code(c.collective_matmul[i]),
        overlap_ep=flag_of_code(c.overlap_ep[i]) if c.overlap_ep is not None else None,
        compiled=flag_of_code(c.compiled[i]) if c.compiled is not None else None,
        optimizer=opt,
        **({} if dtypes is None else {"dtypes": dtypes}),
    )
