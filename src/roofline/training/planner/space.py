"""The planner's search space: what it may choose, every bound a named field, and the
enumeration of candidate plans into families the walk costs in one pass each.

Search space (every legal combination): system or sub-slices × mesh factorisation
dp·fsdp·tp·sp·ep·pp = chips × microbatches × remat × ZeRO stage × pipeline schedule (and, for
the interleaved one, its virtual stages per rank) × Megatron sequence parallelism × collective matmul × compile × optimizer offload. Degrees come from the divisors of the
bounds `feasibility` checks (a degree outside them is never tried); combinations are then
rejected by the named rules of `feasibility.RULES` and the space's own bounds, each counted.

Optimizer offload (`offload_optimizer`, off by default; `train --offload-optimizer` turns it
on, on the idealised machine and on the stacks whose framework record has
`[data_parallel.optimizer_offload]`: DeepSpeed, Megatron) is an axis that applies only where it changes the answer: a candidate that misses HBM
by no more than its optimizer state, which its host DRAM holds, is costed with that state in
host memory (ZeRO-Offload, `training.offload`) instead of rejected (`offload_rescue`). A plan
that fits without offload is costed as it is (offload would only add host traffic to it).
Activation offload (`offload_activations`, `train --offload-activations`; the stacks whose
launch file can say it, launch/defaults/capabilities.toml) is the same kind of axis, after the
optimizer's: a candidate without a pipeline that still misses HBM by no more than its saved
activations (all but the last layer's) is costed with them in host memory
(`activation_offload_rescue`, `training.offload.offload_activations`).

A stack's date (`as_of`: `train --stack-date`, and validate's planner mode with each run's
date) narrows the space to what the stack had shipped by then: the features its framework
record dates later (`[features]`, `Framework.lacks`) are left out, each choice it gates named
on `Feature`; gradient accumulation without a pipeline and replicas beside FSDP are bounds
(named rules, counted like the others).
"""

from __future__ import annotations

import datetime
import itertools
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from roofline.core.rules import Structure, kv_heads_replicated
from roofline.core.stack import Stack
from roofline.specs.framework import Feature, FeatureSince, Move, OverlapClass, parse_stack_date
from roofline.specs.model import ModelSpec
from roofline.specs.plan import Remat, RematKind, Schedule, Strategy, Workload, flag_code
from roofline.specs.system import System
from roofline.training.feasibility import (
    EDGE_LAYERS,
    Arrays,
    Rule,
    ep_must_divide,
    rules_for,
    tp_must_divide,
    violations,
)
from roofline.training.offload import (
    activation_offload_terms,
    host_adam_per_param,
    host_traffic_of,
    offload_terms,
    offloaded_activation_bytes,
    offloads_with_fsdp,
    stack_can_offload_activations,
)
from roofline.training.step import Candidates, StepArrays

MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)
PIPELINE_MICROBATCHES = (128, 256, 512)
# The virtual stages (model chunks per pipeline rank) the interleaved schedule tries: every
# count from 2 to 12, the most any published plan uses (NeMo's Nemotron-4 340B: 96 layers on
# pp=8, one layer per chunk; the others use 3 to 10: validate's measured_training.yaml). The
# timeline credits every count with a shorter fill, (p − 1)/v of a stage's time, and charges
# nothing for the chunk boundaries a microbatch then crosses (2·(p·v − 1) hops, docs/book.md:
# the step exposes the fill and drain's 2·(p − 1); counting 2·(p·v − 1) was measured worse
# held out, benchmarks/README.md), so more chunks never cost more in the model: among plans
# within the tie tolerance the ranking names the fewest (`rank.rank_order`), and this bound is
# where the search stops: past 12 the fill shrinks by under 1/156 of (p − 1) stages per
# count. The feasibility rules keep the counts a model's layers allow (pp·v dividing them, or
# at most layers + 2 on a stack that lays out uneven stages: `feasibility.rules_for`), the
# space's bound the counts whose chunks are about equal (`unequal_chunks`). Only the pipeline
# timeline reads v (the fill, the interleaved warm-up's activations, the combined-1F1B
# warm-up, uneven-stage rounding, the P2P overlap's condition), never the walk: the extra
# candidates share their family's walk rows (`step._distinct_rows`: system, degrees,
# microbatches).
MAX_VIRTUAL_STAGES = 12
VIRTUAL_STAGES = tuple(range(2, MAX_VIRTUAL_STAGES + 1))
REMATS = (Remat(RematKind.NONE), Remat(RematKind.MATMULS), Remat(RematKind.FULL))


def microbatch_counts(counts: tuple[int, ...], workload: Workload) -> tuple[int, ...]:
    """The microbatch counts tried: the space's (powers of two), and where the batch holds an
    odd factor o > 1 (3840 sequences = 15·2^8) also o·2^k up to the largest count, so that a
    pipeline over such a batch finds as many microbatches as stages (DeepSeek-V3's 15Mi-token
    batch on pp=16 needs 30 or 60)."""
    seqs = int(workload.sequences)
    odd = seqs
    while odd and odd % 2 == 0:
        odd //= 2
    top = max(counts)
    extra = []
    if odd > 1:
        m = odd
        while m <= top:
            extra.append(m)
            m *= 2
    return tuple(sorted(set(counts) | set(extra)))


def _stack_runs(stack: Stack, s: Strategy) -> bool:
    """Whether a stack implements a strategy (data parallelism always)."""
    fw = stack.framework
    if s == Strategy.FSDP:
        return fw.fsdp.supported
    if s == Strategy.PP:
        return bool(fw.pipeline.schedules)
    if s == Strategy.SP:
        return bool(fw.context_parallel.methods)
    if s == Strategy.EP:
        return bool(fw.expert_parallel.dispatch)
    if s == Strategy.TP:
        return any(fw.move(f, "tensor") != Move.CHEAPEST for f in ("dense", "expert", "vocab"))
    return True


def searches_compile(stack: Stack) -> bool:
    """Whether compiling is a choice the planner makes on `stack`: it runs eager by default
    (its profile's [eager] table, `Stack.compiled`), so compile=1 costs differently from the
    default (a stack compiled by default, or without an [eager] table, has nothing to search)."""
    return stack.framework.eager is not None and not stack.compiled(None)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _few_microbatches(m: ModelSpec, w: Workload, a: Arrays) -> np.ndarray:
    pp = a.deg[Strategy.PP]
    return (pp > 1) & (a.microbatches < pp)


# A bound of the search, not a rule of feasibility: with fewer microbatches than stages most
# of a pipeline idles (a plan may still do it; the planner does not search it).
FEWER_MICROBATCHES_THAN_STAGES = Rule(
    "fewer microbatches than pipeline stages",
    _few_microbatches,
    lambda m, w, a, i: "fewer microbatches than pipeline stages",
)


@dataclass(frozen=True)
class SearchSpace:
    """What the planner may choose. Every bound is a field with its reason."""

    strategies: tuple[Strategy, ...] = tuple(Strategy)
    # gradient accumulation steps tried (powers of two up to 64: more only shrinks microbatches)
    microbatches: tuple[int, ...] = MICROBATCHES
    # counts tried only under a pipeline, where more microbatches shrink the bubble: published
    # Megatron plans run 63-512 (Korthikanti et al. 2022: 530B pp=35 with 280, 1T pp=64 with
    # 512; Megatron-Bridge's 405B 192); without a pipeline more than 64 only shrinks the matmuls
    pipeline_microbatches: tuple[int, ...] = PIPELINE_MICROBATCHES
    remats: tuple[Remat, ...] = REMATS
    zero_stages: tuple[int, ...] = (1, 2)  # over the data axis (fsdp is ZeRO-3 by definition)
    schedules: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.GPIPE)
    # model chunks per stage the interleaved schedule tries (VIRTUAL_STAGES: 2 to 12)
    virtual_stages: tuple[int, ...] = VIRTUAL_STAGES
    # context parallelism beyond 16-way spends more on K/V gathers than it saves
    max_sp: int = 16
    # deeper pipelines than 64 stages are not run in practice (bubble and p2p latency)
    max_pp: int = 64
    # uneven pipeline stages (and the interleaved schedule's chunks): fullest / average layers
    max_stage_imbalance: float = 1.10
    megatron_sp: tuple[bool, ...] = (False, True)
    # tri-state overlap flags searched (specs.plan.TRISTATE_FLAGS): None, the stack's default,
    # and True, the mechanism on where the stack has the switch
    collective_matmul: tuple[bool | None, ...] = (None, True)
    overlap_ep: tuple[bool | None, ...] = (None,)  # expert all-to-alls behind compute (MoE)
    # compile (torch.compile) searched like the overlap flags: None, the stack's default, and
    # True, where the stack runs eager by default (its profile's [eager] table; torchtitan,
    # whose launch writer says [compile] enable); pinned to (None,) elsewhere (`for_stack`)
    compile: tuple[bool | None, ...] = (None, True)
    # the stack lays out uneven pipeline stages (layers need not divide pp·virtual)
    uneven_stages: bool = False
    # optimizer state in host memory (ZeRO-Offload) for plans that fit HBM only so
    offload_optimizer: tuple[bool, ...] = (False,)
    # saved activations in host memory for plans that fit HBM only so (after any optimizer
    # offload): `training.offload.offload_activations`, the plan key offload_activations=1
    offload_activations: tuple[bool, ...] = (False,)
    # search-space bounds applied as named rules (counted like feasibility rules)
    bounds: tuple[Rule, ...] = field(default=(FEWER_MICROBATCHES_THAN_STAGES,))

    def for_stack(self, stack: Stack, model: ModelSpec) -> SearchSpace:
        """This space restricted to what `stack` can run: its strategies, schedules, remat
        policies, ZeRO stages and overlap switches (the idealised machine keeps everything)."""
        if stack.book:
            return replace(self, compile=(None,))
        fw = stack.framework
        strategies = [s for s in self.strategies if _stack_runs(stack, s)]
        remats = tuple(r for r in self.remats if stack.remat_policy(r.kind) is not None)
        zeros = tuple(z for z in self.zero_stages if z in fw.data_parallel.zero_stages)
        tensor = stack.overlap(OverlapClass.TENSOR)
        sp_with_tp = "sequence_parallel" in {r.value for r in tensor.requires}
        expert = stack.overlap(OverlapClass.EXPERT)
        return replace(
            self,
            strategies=tuple(strategies),
            remats=remats or (Remat(RematKind.NONE),),
            zero_stages=zeros or (fw.data_parallel.default_zero,),
            schedules=tuple(s for s in self.schedules if stack.supports_schedule(s))
            or (Schedule.ONE_F_ONE_B,),
            # a stack that always splits the sequence under TP searches it on, unless the space
            # asks it off (`launch_space`: MaxText's launch file cannot say megatron_sp)
            megatron_sp=(True,)
            if sp_with_tp or (fw.options.tp_shards_sequence and True in self.megatron_sp)
            else (False,),
            collective_matmul=(None, True) if tensor.plan_key else (None,),
            overlap_ep=(None, True) if expert.plan_key and model.moe is not None else (None,),
            uneven_stages=stack.spreads_uneven_stages,
            compile=self.compile if searches_compile(stack) else (None,),
            # searched where the stack's record says it offloads (and its launch writer writes it)
            offload_optimizer=self.offload_optimizer
            if fw.data_parallel.optimizer_offload is not None
            else (False,),
            # searched where the stack's launch file can say it (capabilities.toml switches)
            offload_activations=self.offload_activations
            if stack_can_offload_activations(stack)
            else (False,),
        )

    def domains(
        self, model: ModelSpec, workload: Workload, chips: int
    ) -> dict[Strategy, tuple[list[int], str]]:
        """Allowed degrees per strategy with the rule that bounds each (named, for the report)."""
        seqs = int(workload.sequences)
        on = set(self.strategies)

        def pick(s: Strategy, values: list[int]) -> list[int]:
            return values if s in on else [1]

        dom: dict[Strategy, tuple[list[int], str]] = {}
        batch = divisors(math.gcd(chips, seqs))
        dom[Strategy.DP] = (pick(Strategy.DP, batch), f"divides the {seqs} sequences of the batch")
        dom[Strategy.FSDP] = (
            pick(Strategy.FSDP, batch),
            f"divides the {seqs} sequences of the batch",
        )
        dom[Strategy.TP] = (
            pick(Strategy.TP, divisors(math.gcd(tp_must_divide(model), chips))),
            f"divides heads={model.n_heads} and the MLP widths",
        )
        sp = [d for d in divisors(math.gcd(workload.seq_len, chips)) if d <= self.max_sp]
        dom[Strategy.SP] = (
            pick(Strategy.SP, sp),
            f"divides seq={workload.seq_len}, at most {self.max_sp}",
        )
        experts = ep_must_divide(model)
        dom[Strategy.EP] = (
            pick(Strategy.EP, divisors(math.gcd(experts, chips))) if model.moe else [1],
            f"divides experts={experts}" if model.moe else "dense model: no experts",
        )
        L = model.n_layers
        pp = [
            d
            for d in divisors(chips)
            if d <= min(self.max_pp, L) and math.ceil(L / d) <= self.max_stage_imbalance * L / d
        ]
        dom[Strategy.PP] = (
            pick(Strategy.PP, pp),
            f"at most min(layers={L}, {self.max_pp}); the fullest stage (ceil(L/pp) layers) at most "
            f"{self.max_stage_imbalance - 1:.0%} above the average",
        )
        return dom


def factorisations(n: int, dom: dict[Strategy, tuple[list[int], str]]) -> np.ndarray:
    """All degree tuples (rows, in `Strategy` order) from the domains whose product is n: the
    rows of nested loops over tp, pp, sp, ep and dp (each over its domain in order, keeping the
    degrees that divide what is left), fsdp taking the rest where its domain holds it. Built
    degree by degree on arrays (~5x faster than the recursion it replaced)."""
    order = (Strategy.TP, Strategy.PP, Strategy.SP, Strategy.EP, Strategy.DP)
    cols = np.zeros((1, 0), dtype=np.int64)
    rest = np.array([n], dtype=np.int64)
    for s in order:
        vals = np.asarray(dom[s][0], dtype=np.int64)
        r, v = np.nonzero(rest[:, None] % vals[None, :] == 0)  # row-major: loop order
        cols = np.column_stack([cols[r], vals[v]])
        rest = rest[r] // vals[v]
    keep = np.isin(rest, np.asarray(dom[Strategy.FSDP][0], dtype=np.int64))
    full = {s: cols[keep, j] for j, s in enumerate(order)} | {Strategy.FSDP: rest[keep]}
    return np.column_stack([full[s] for s in Strategy]).reshape(-1, len(Strategy))


@dataclass(frozen=True)
class Enumeration:
    """The candidate families (one Structure each, with their Candidates), the number of plans
    the space holds, the rejections by named rule, and the domains as text for the report."""

    groups: tuple[tuple[Structure, Candidates], ...]
    enumerated: int
    rejected: Counter
    domains: dict[str, str]


def _meshes(model, workload, systems, space) -> tuple[np.ndarray, dict[str, str]]:
    """Rows of (system index, degrees in Strategy order) over every system, and the domains."""
    domains_txt: dict[str, str] = {}
    facts = [np.zeros((0, 1 + len(Strategy)), dtype=np.int64)]
    for si, sysm in enumerate(systems):
        dom = space.domains(model, workload, sysm.n_chips)
        for st_, (vals, why) in dom.items():
            domains_txt[st_.value] = f"{vals[:12]}{'...' if len(vals) > 12 else ''}: {why}"
        f = factorisations(sysm.n_chips, dom)
        facts.append(np.column_stack([np.full(len(f), si, dtype=np.int64), f]))
    return np.concatenate(facts), domains_txt


def enumerate_plans(
    model: ModelSpec, workload: Workload, systems: list[System], space: SearchSpace
) -> Enumeration:
    """Every plan of the space, filtered by the named rules, grouped into Structures."""
    F, domains_txt = _meshes(model, workload, systems, space)
    # stage 1: mesh × microbatches × schedule (× virtual stages), where the divisibility rules act
    mb, sc, virtual, rows = _stage_one(F, workload, space)
    deg = {s: rows[:, 1 + j] for j, s in enumerate(Strategy)}
    # how many full candidates each stage-1 row stands for (choices that apply to it)
    tp1, dp1 = deg[Strategy.TP] > 1, deg[Strategy.DP] > 1
    ep1 = deg[Strategy.EP] > 1
    weight = (
        np.where(tp1, len(space.megatron_sp) * len(space.collective_matmul), 1)
        * np.where(dp1, len(space.zero_stages), 1)
        * np.where(ep1, len(space.overlap_ep), 1)
        * len(space.remats)
        * len(space.compile)
    )
    arrays = Arrays(deg, mb, sc, virtual)
    rejected: Counter = Counter()
    ok = np.ones(len(mb), dtype=bool)
    for rule, bad in violations(model, workload, arrays, rules=_searched_rules(space)):
        bad = bad & ok
        if bad.any():
            rejected[rule.name] += int(weight[bad].sum())
        ok &= ~bad
    groups = _expand(model, space, rows[ok], mb[ok], sc[ok], virtual[ok])
    return Enumeration(tuple(groups), int(weight.sum()), rejected, domains_txt)


def pipeline_choices(space: SearchSpace) -> tuple[np.ndarray, np.ndarray]:
    """(schedule code, virtual stages) of every pipeline choice of the space, in order: each
    schedule with 1, the interleaved one with each of `space.virtual_stages` instead."""
    pairs = [
        (s.code, v)
        for s in space.schedules
        for v in (space.virtual_stages if s == Schedule.INTERLEAVED else (1,))
    ]
    sc, v = zip(*pairs, strict=True)
    return np.array(sc), np.array(v)


def _stage_one(F: np.ndarray, workload: Workload, space: SearchSpace) -> tuple[np.ndarray, ...]:
    """(microbatches, schedule code, virtual stages, mesh row) of every mesh × microbatch count
    × pipeline choice (`pipeline_choices`), in that nested order, the choices only where there
    is a pipeline (elsewhere the first): the schedule matters only with one; the counts above
    the plain ones (`pipeline_microbatches`) also only there."""
    counts = (*space.microbatches, *space.pipeline_microbatches)
    mbs = np.array(microbatch_counts(counts, workload))
    scheds, virt = pipeline_choices(space)
    pp = F[:, 1 + list(Strategy).index(Strategy.PP)]
    per = np.where(pp > 1, len(scheds), 1)  # pipeline choices tried per mesh
    count = per * len(mbs)
    fi = np.repeat(np.arange(len(F)), count)
    k = np.arange(len(fi)) - np.repeat(np.cumsum(count) - count, count)  # index within the mesh
    per = per[fi]
    j = k % per
    mb = mbs[k // per]
    # beyond the plain counts only under a pipeline (`SearchSpace.pipeline_microbatches`)
    keep = (mb <= max(space.microbatches)) | (pp[fi] > 1)
    return mb[keep], scheds[j][keep], virt[j][keep], F[fi[keep]]


def _searched_rules(space: SearchSpace) -> tuple[Rule, ...]:
    """The feasibility rules the domains do not already guarantee (the batch split and the
    interleaved stages), with the space's own bounds between them and, last, the bound on
    unequal virtual stages (`unequal_chunks`). A rejected plan is counted under the first rule
    it breaks, in this order."""
    rules = rules_for(space.uneven_stages)
    return (rules[0], *space.bounds, rules[-1], unequal_chunks(space))


def chunk_imbalance(units: int, chunks: np.ndarray) -> np.ndarray:
    """The fullest of `chunks` equal-as-can-be parts of `units` layers against the average:
    ceil(units/chunks) / (units/chunks)."""
    return np.ceil(units / chunks) * chunks / units


def unequal_chunks(space: SearchSpace) -> Rule:
    """A bound of the search on the interleaved schedule's virtual stages, the pipeline
    degree's own bound (`max_stage_imbalance`) one level down: the fullest model chunk at most
    that much above the average. The timeline prices the fill as p − 1 chunks of a stage's
    time / v, exact for equal chunks; with unequal ones it runs at the pace of the fullest
    (96 layers on pp=8 in v=8 chunks of 1 or 2 layers fills like v=6), which it does not
    price, so the planner does not search them (a plan may still say them). A stack that lays
    out uneven stages splits the layers with the embedding and the loss as one each
    (`feasibility.EDGE_LAYERS`), whichever of the two splits is more equal."""
    lim = space.max_stage_imbalance

    def bad(m: ModelSpec, w: Workload, a: Arrays) -> np.ndarray:
        pp = a.deg[Strategy.PP]
        il = np.nonzero((a.schedule == Schedule.INTERLEAVED.code) & (pp > 1))[0]
        out = np.zeros(len(pp), dtype=bool)
        if not len(il):
            return out
        n = pp[il] * a.virtual[il]  # chunks: judged once per distinct count, then looked up
        counts = np.arange(int(n.max()) + 1)
        counts[0] = 1
        worst = chunk_imbalance(m.n_layers, counts)
        if space.uneven_stages:
            worst = np.minimum(worst, chunk_imbalance(m.n_layers + EDGE_LAYERS, counts))
        out[il] = (worst > lim)[n]
        return out

    return Rule(
        UNEQUAL_CHUNKS,
        bad,
        lambda m, w, a, i: (
            f"{UNEQUAL_CHUNKS} (pp·virtual={int(a.deg[Strategy.PP][i] * a.virtual[i])})"
        ),
    )


UNEQUAL_CHUNKS = "virtual stages more unequal than the stage bound"


def _expand(model, space: SearchSpace, rows, mb, sc, virtual) -> list[tuple[Structure, Candidates]]:
    """Stage 2: each surviving row × the choices that apply to it (Megatron-SP and collective
    matmul only with tp, ZeRO stages only with dp, every remat and compile), grouped into
    Structures."""
    j = {s: 1 + i for i, s in enumerate(Strategy)}
    tp1, dp1 = rows[:, j[Strategy.TP]] > 1, rows[:, j[Strategy.DP]] > 1
    ep1 = rows[:, j[Strategy.EP]] > 1
    parts = []
    for msp_v in space.megatron_sp:
        for cm_v in space.collective_matmul:
            for z_v in space.zero_stages:
                for oe_v in space.overlap_ep:
                    m_ok = tp1 | (
                        (msp_v == space.megatron_sp[0]) & (cm_v == space.collective_matmul[0])
                    )
                    m_ok &= dp1 | (z_v == space.zero_stages[0])
                    m_ok &= ep1 | (oe_v == space.overlap_ep[0])
                    idx = np.nonzero(m_ok)[0]
                    cm_c, oe_c = flag_code(cm_v), flag_code(oe_v)
                    for ri_v, co_v in itertools.product(range(len(space.remats)), space.compile):
                        parts.append((idx, msp_v, cm_c, z_v, ri_v, oe_c, flag_code(co_v)))
    sel = np.concatenate([p[0] for p in parts])

    sizes = [len(p[0]) for p in parts]

    def col(k: int, dtype=None):  # each part's choice k, once per row of the part
        return np.repeat(np.array([p[k] for p in parts], dtype=dtype or int), sizes)

    msp, cmv, zv, ri, oev = col(1, bool), col(2, np.int8), col(3), col(4), col(5, np.int8)
    cov = col(6, np.int8)
    # the surviving rows' columns, each contiguous, read out per family by `take` (not the
    # rows copied out whole per candidate first); every row is in the first part, whose
    # choices apply to all, so the columns hold the values the candidates have
    R = np.ascontiguousarray(rows.T)
    tp = R[j[Strategy.TP]].take(sel)
    kv_rep = kv_heads_replicated(model.n_kv_heads, model.mla is not None, tp)
    # One structure for every mesh: a strategy of degree 1 is a mesh axis of size 1, which the
    # algebra already prices at zero (no split, no communication), so all candidates that share
    # the Megatron-SP flag and the KV-head replication are costed in one vectorised pass.
    # (tests/test_training.py checks this against the minimal structure of each plan.)
    active = frozenset(s for s in Strategy if (R[j[s]] > 1).any())
    # a family shares the Megatron-SP flag, the KV-head replication and compile (one walk
    # costs one compile setting: Candidates.compile_flag)
    gkey = ((cov.astype(np.int64) + 1) * 2 + msp) * 2 + np.asarray(kv_rep, dtype=np.int64)
    groups = []
    for key in np.unique(gkey):
        g = np.nonzero(gkey == key)[0]
        src = sel.take(g)  # the family's candidates' rows of stage one
        cand = Candidates(
            {s: R[j[s]].take(src) for s in Strategy},
            mb.take(src),
            zv[g],
            sc.take(src),
            virtual.take(src),
            system_idx=R[0].take(src),
            remat_idx=ri[g],
            collective_matmul=cmv[g],
            overlap_ep=oev[g],
            compiled=cov[g] if len(space.compile) > 1 else None,
        )
        st = Structure(active, space.remats[0], bool(key >> 1 & 1), None, bool(key & 1))
        groups.append((st, cand))
    return groups


class _Rescued:
    """The family's rejection reasons less the candidates optimizer offload made fit."""

    def __init__(self, base: Any, ok: np.ndarray) -> None:
        self.base, self.ok = base, ok

    @property
    def over(self) -> np.ndarray:  # still missing HBM (another offload may rescue them)
        return np.asarray(self.base.over, bool) & ~self.ok

    def __getitem__(self, i: int) -> str:
        return "" if self.ok[i] else self.base[i]

    def counts(self) -> dict[str, int]:
        out = dict(self.base.counts())
        n = int(self.ok.sum())
        if n:
            out["does not fit HBM"] -= n
            if not out["does not fit HBM"]:
                del out["does not fit HBM"]
        return out


def _host_links(systems: list[System], cand: Candidates) -> tuple[np.ndarray, ...]:
    """Per candidate: its system's index, host-link bandwidth and host DRAM per chip (NaN:
    unknown)."""
    si = np.zeros(len(cand), int) if cand.system_idx is None else cand.system_idx
    W = np.array([s.host_bw_bytes_per_s or np.nan for s in systems], float)[si]
    dram = np.array([s.host_dram_bytes_per_chip or np.nan for s in systems], float)[si]
    return si, W, dram


def _rescued(
    r: StepArrays, ok: Any, step: Any, exposed: Any, moved: Any, **more: Any
) -> StepArrays:
    """`r` with the rescued candidates (`ok`) at their new step time, `exposed` host traffic
    added, `moved` bytes out of HBM, and the rates scaled by the speed-up; `more` fields as given."""
    speed = r.step_time_s / step
    return replace(
        r,
        step_time_s=step,
        exposed_comm_time_s=np.where(ok, r.exposed_comm_time_s + exposed, r.exposed_comm_time_s),
        memory_total=np.where(ok, r.memory_total - moved, r.memory_total),
        mfu=r.mfu * speed,
        hfu=r.hfu * speed,
        mfu_compute_dtype=r.mfu_compute_dtype * speed,
        tokens_per_s=r.tokens_per_s * speed,
        infeasible=r.infeasible & ~ok,
        reason=_Rescued(r.reason, ok),
        **more,
    )


def offload_rescue(
    systems: list[System], cand: Candidates, r: StepArrays, opt: Any, stack: Stack
) -> StepArrays:
    """Candidates that miss HBM by no more than their optimizer state, which their host DRAM
    holds, costed with it offloaded: step − HBM optimizer update + exposed host traffic
    (`training.offload.offload_terms`); the rest as they were."""
    over = np.asarray(r.reason.over, bool)
    if not over.any():
        return r
    si, W, dram = _host_links(systems, cand)
    adam = np.array([host_adam_per_param(s, opt)[0] for s in systems], float)[si]
    state = np.asarray(r.memory["optimizer"], float)
    traffic = host_traffic_of(stack)
    *_, exposed = offload_terms(opt, state, r.compute_time_s, W, adam, traffic)
    with np.errstate(invalid="ignore"):
        ok = over & (r.memory_total - state <= systems[0].chip.fit_hbm_bytes) & (state <= dram)
    if not offloads_with_fsdp(stack):
        ok &= np.asarray(cand.deg[Strategy.FSDP]) <= 1
    step = np.where(ok, r.step_time_s - r.optimizer_time_s + exposed, r.step_time_s)
    return _rescued(
        r,
        ok,
        step,
        exposed,
        state,
        optimizer_time_s=np.where(ok, 0.0, r.optimizer_time_s),
        # what host DRAM holds (activation_offload_rescue adds to it)
        memory=dict(r.memory) | {"optimizer_host": np.where(ok, state, 0.0)},
    )


def activation_offload_rescue(
    systems: list[System], cand: Candidates, r: StepArrays, model: ModelSpec, remats_ok: Any
) -> StepArrays:
    """Candidates without a pipeline that still miss HBM by no more than their saved
    activations, which their host DRAM holds, costed with them in host memory: step + exposed
    host traffic (`training.offload.activation_offload_terms`); the rest as they were.
    `remats_ok`: per remat policy of the space, whether the stack offloads under it."""
    over = np.asarray(r.reason.over, bool)
    if not over.any():
        return r
    _, W, dram = _host_links(systems, cand)
    acts = offloaded_activation_bytes(r.memory["activations"], model)
    host = acts + np.asarray(r.memory.get("optimizer_host", 0.0), float)
    _, _, _, exposed = activation_offload_terms(acts, cand.microbatches, r.compute_time_s, W)
    with np.errstate(invalid="ignore"):
        ok = over & (r.memory_total - acts <= systems[0].chip.fit_hbm_bytes) & (host <= dram)
    ri = np.zeros(len(cand), int) if cand.remat_idx is None else cand.remat_idx
    ok &= (np.asarray(cand.deg[Strategy.PP]) <= 1) & np.asarray(remats_ok, bool)[ri]
    step = np.where(ok, r.step_time_s + exposed, r.step_time_s)
    return _rescued(r, ok, step, exposed, acts)


# ---- a stack's date ------------------------------------------------------------------------

# the strategy each dated feature is (context parallelism is the seq mesh axis, Strategy.SP)
_STRATEGY_FEATURE = {
    Strategy.FSDP: Feature.FSDP,
    Strategy.PP: Feature.PIPELINE,
    Strategy.SP: Feature.CONTEXT_PARALLEL,
    Strategy.EP: Feature.EXPERT_PARALLEL,
}


def _lacking(name: str, feature: Feature, since: FeatureSince, bad) -> Rule:
    """A bound of a dated stack: plans that need `feature`, which shipped only at `since`."""
    why = f"{name} before {since.since.isoformat()} had no {feature.value.replace('_', ' ')}"
    return Rule(why, lambda m, w, a: bad(a), lambda m, w, a, i: why)


def _accumulates_without_pipeline(a: Arrays) -> np.ndarray:
    return (a.deg[Strategy.PP] <= 1) & (a.microbatches > 1)


def _replicates_beside_fsdp(a: Arrays) -> np.ndarray:
    return (a.deg[Strategy.DP] > 1) & (a.deg[Strategy.FSDP] > 1)


def stack_as_of(
    space: SearchSpace, stack: Stack, when: datetime.date | str | None
) -> tuple[Stack, SearchSpace]:
    """`stack` and `space` (already `for_stack`) as they stood at `when` (None: today, both
    unchanged): every feature the stack's framework record dates after `when` leaves the
    search — a strategy, ZeRO-1 over the data axis (zero=0 stays), selective recompute
    (remat=matmuls), Megatron sequence parallelism, the interleaved schedule — and the TP and
    expert overlap mechanisms are off in the stack (`Stack.without_overlap`: that version had
    none) and not searched; gradient accumulation without a pipeline and replicas beside FSDP
    become bounds rejecting the plans that need them. The idealised machine and features
    without a recorded date are never gated. `when`: a date or 'YYYY-MM[-DD]'."""
    when = None if when is None else parse_stack_date(when)  # a bad date is an error anywhere
    if when is None or stack.book:
        return stack, space
    gone = stack.framework.lacks(when)
    if not gone:
        return stack, space
    name = stack.framework.name
    strategies = tuple(s for s in space.strategies if _STRATEGY_FEATURE.get(s) not in gone)
    remats = space.remats
    if Feature.SELECTIVE_RECOMPUTE in gone:
        remats = tuple(r for r in remats if r.kind != RematKind.MATMULS) or (Remat(RematKind.NONE),)
    zeros = space.zero_stages
    if Feature.DISTRIBUTED_OPTIMIZER in gone:
        zeros = tuple(z for z in zeros if z != 1) or (0,)
    schedules = space.schedules
    if Feature.INTERLEAVED_PIPELINE in gone:
        schedules = tuple(s for s in schedules if s != Schedule.INTERLEAVED) or (
            Schedule.ONE_F_ONE_B,
        )
    cm, oe = space.collective_matmul, space.overlap_ep
    for feature, cls in (
        (Feature.TP_COMM_OVERLAP, OverlapClass.TENSOR),
        (Feature.EP_OVERLAP, OverlapClass.EXPERT),
    ):
        if feature in gone:
            f = gone[feature]
            stack = stack.without_overlap(cls, f"{name} before {f.since.isoformat()}: {f.source}")
            if cls == OverlapClass.TENSOR:
                cm = (None,)
            else:
                oe = (None,)
    bounds = list(space.bounds)
    for feature, bad in (
        (Feature.GRADIENT_ACCUMULATION, _accumulates_without_pipeline),
        (Feature.HYBRID_SHARDING, _replicates_beside_fsdp),
    ):
        if feature in gone:
            bounds.append(_lacking(name, feature, gone[feature], bad))
    return stack, replace(
        space,
        strategies=strategies,
        remats=remats,
        zero_stages=zeros,
        schedules=schedules,
        megatron_sp=(False,) if Feature.SEQUENCE_PARALLEL in gone else space.megatron_sp,
        collective_matmul=cm,
        overlap_ep=oe,
        bounds=tuple(bounds),
    )
