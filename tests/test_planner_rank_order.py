"""`rank.rank_order` sorts only the rows it can keep: the same order, row for row, as sorting
every row (near-ties first by strategies, communication and score; then the rest by score and
step time), with ties, NaN step times and infinite scores."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.training.planner.rank import KEEP_AFTER_TIES, SCAN_LIMIT, rank_order


def _full_sort(score, step, comm, nstrat, near):
    order_idx = np.lexsort((step, score, ~near))
    n_near = int(near.sum())
    near_idx = order_idx[:n_near]
    near_idx = near_idx[np.lexsort((score[near_idx], comm[near_idx], nstrat[near_idx]))]
    return np.concatenate([near_idx, order_idx[n_near:][:KEEP_AFTER_TIES]])[:SCAN_LIMIT]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("n", [1, 50, 250, 5000])
def test_rank_order_is_the_full_sort(seed, n):
    rng = np.random.default_rng(seed)
    levels = rng.integers(2, 40)  # few distinct values: many ties at the cut
    score = rng.integers(0, levels, n).astype(float)
    if seed % 3 == 0:
        score[rng.random(n) < 0.1] = np.inf
    step = rng.integers(0, 5, n).astype(float)
    if seed % 2:
        step[rng.random(n) < 0.1] = np.nan
    comm = rng.integers(0, 3, n).astype(float)
    nstrat = rng.integers(1, 4, n)
    tol = [0.0, 0.05, 0.5, 2.0][seed % 4]
    near = score <= score.min() * (1 + tol)
    got = rank_order(score, step, comm, nstrat, near)
    assert got.tolist() == _full_sort(score, step, comm, nstrat, near).tolist()


def test_near_ties_name_the_fewer_chunks_per_stage():
    import numpy as np

    from roofline.training.planner.rank import rank_order

    # three near-tied plans of two strategies: 12, 4 and 1 chunks per stage; the 12-chunk
    # plan is the fastest and communicates least, yet the 1-chunk (1F1B) plan is named first
    score = np.array([1.000, 1.004, 1.008, 1.5])
    comm = np.array([0.1, 0.2, 0.3, 0.0])
    nstrat = np.array([2, 2, 2, 1])
    chunks = np.array([12, 4, 1, 1])
    near = score <= score.min() * 1.01
    order = rank_order(score, score, comm, nstrat, near, chunks)
    assert list(order[:3]) == [2, 1, 0]
    assert list(rank_order(score, score, comm, nstrat, near)[:3]) == [0, 1, 2]
