"""The timeline is computed once per distinct choice of what it reads (`step._timeline_context`:
walk row, remat, ZeRO stage, plan flags, interleaved or not) and read out to the candidates:
candidates that differ only in their schedule or virtual-stage count share it; the walk's sums
are weighed per (row, remat) cell. Every field of the StepArrays must be what the per-candidate
timeline (a few candidates' paths, `step._LARGE`) gives, to the bit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import roofline.training.step as step_mod
from roofline.core.stack import stack_of
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Schedule, Workload, parse_optimizer
from roofline.specs.system import parse_system
from roofline.training.planner.space import SearchSpace, enumerate_plans
from roofline.training.step import comm_total, evaluate_plans

WORK = Workload(2**20, 4096)


def _widened(cand):
    """The family's candidates plus copies of its interleaved ones at 3 and 4 virtual stages
    and of its 1F1B ones under GPipe (what a searched virtual-stage axis adds)."""
    il = np.flatnonzero(cand.schedule == Schedule.INTERLEAVED.code)
    one = np.flatnonzero(cand.schedule == Schedule.ONE_F_ONE_B.code)
    idx = np.concatenate([np.arange(len(cand)), il, il, one])
    pick = lambda a: None if a is None else np.asarray(a)[idx]  # noqa: E731
    virtual = np.concatenate(
        [cand.virtual, np.full(len(il), 3), np.full(len(il), 4), cand.virtual[one]]
    ).astype(cand.virtual.dtype)
    schedule = np.concatenate(
        [
            cand.schedule,
            cand.schedule[il],
            cand.schedule[il],
            np.full(len(one), Schedule.GPIPE.code),
        ]
    ).astype(cand.schedule.dtype)
    return replace(
        cand,
        deg={s: v[idx] for s, v in cand.deg.items()},
        microbatches=cand.microbatches[idx],
        zero=cand.zero[idx],
        schedule=schedule,
        virtual=virtual,
        system_idx=pick(cand.system_idx),
        remat_idx=pick(cand.remat_idx),
        collective_matmul=pick(cand.collective_matmul),
        overlap_ep=pick(cand.overlap_ep),
        compiled=pick(cand.compiled),
    )


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize(
    ("model", "system", "stack"),
    [
        ("llama-3-8b", "h100:64", "megatron"),
        ("mixtral-8x7b", "h100:64", "megatron"),  # the combined-1F1B expert overlap
        ("llama-3-8b", "tpu-v5p:4x4x4", "maxtext"),
        ("llama-3-8b", "h100:64", "torchtitan"),
    ],
)
def test_shared_timeline_is_the_per_candidate_one(model, system, stack, monkeypatch):
    m, sy, st = load_model(model), parse_system(system), stack_of(stack)
    space = SearchSpace().for_stack(st, m)
    groups = enumerate_plans(m, WORK, [sy], space).groups
    widened = [
        (s, _widened(c)) for s, c in groups if (c.schedule == Schedule.INTERLEAVED.code).any()
    ]
    assert widened or stack == "maxtext"
    widened = widened[:3] or [(s, _widened(c)) for s, c in groups[:2]]
    shared_somewhere = False
    for s, cand in widened:
        kw = dict(optimizer=parse_optimizer("adam-bf16"), remats=list(space.remats), framework=st)
        with monkeypatch.context() as mp:  # every candidate set takes the large-set paths
            mp.setattr(step_mod, "_LARGE", 1)
            r = evaluate_plans(m, [sy], WORK, s, cand, **kw)
        inv = step_mod.distinct_rows_of(cand)
        ctx = step_mod._Context.of(cand, s, list(space.remats), inv, len(cand), st)
        shared_somewhere |= step_mod._timeline_context(ctx)[1] is not None
        with monkeypatch.context() as mp:
            mp.setattr(step_mod, "_timeline_context", lambda ctx: (ctx, None))
            mp.setattr(step_mod, "_LARGE", 10**9)  # per candidate, no tables, no memo
            ref = evaluate_plans(m, [sy], WORK, s, cand, **kw)
        for f in ("step_time_s", "compute_time_s", "exposed_comm_time_s", "bubble_time_s",
                  "bubble_fraction", "optimizer_time_s", "overhead_time_s", "memory_total",
                  "flops_per_chip", "mfu", "mfu_compute_dtype", "hfu", "tokens_per_s",
                  "infeasible"):  # fmt: skip
            assert _same(getattr(r, f), getattr(ref, f)), f
        for g in ("comm", "exposed", "memory", "terms"):
            a, b = getattr(r, g), getattr(ref, g)
            assert list(a) == list(b), g
            assert all(_same(a[k], b[k]) for k in b), g
        assert _same(comm_total(r), sum(ref.comm.values()))
        assert r.reason.counts() == ref.reason.counts()
        assert [r.reason[i] for i in range(len(cand))] == [ref.reason[i] for i in range(len(cand))]
    if stack != "maxtext":
        assert shared_somewhere


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n_varying", [0, 1, 5, 17])
def test_packed_condition_sets_are_np_unique(seed, n_varying):
    """`step._packed_sets` (constant conditions left out of the packing, the rest counted in
    a table) gives np.unique's sorted keys and inverse of every condition packed as bits."""
    rng = np.random.default_rng(seed)
    n = 3000
    names = tuple(f"c{j}" for j in range(n_varying + 4))
    cond = {k: rng.random(n) < 0.3 for k in names[:n_varying]}
    cond |= {names[n_varying]: np.ones(n, bool), names[n_varying + 1]: np.zeros(n, bool)}
    cond |= {names[n_varying + 2]: np.ones(n, bool), names[n_varying + 3]: rng.random(n) < 0.01}
    order = list(rng.permutation(len(names)))
    names = tuple(names[j] for j in order)
    packed = np.zeros(n, dtype=np.int64)
    for j, k in enumerate(names):
        packed |= cond[k].astype(np.int64) << j
    uniq, where = np.unique(packed, return_inverse=True)
    got_uniq, got_where = step_mod._packed_sets(cond, names, n)
    assert got_uniq.tolist() == uniq.tolist()
    assert got_where.tolist() == where.reshape(-1).tolist()
