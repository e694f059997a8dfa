"""The family walk's fast paths give exactly what the plain numpy definitions give (issue 21:
the planner's rate; benchmarks/README.md): `choose_rows` is `np.choose` over the broadcast
options, value for value and dtype for dtype."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.core.sharding import argmin_allowed, choose_rows
from roofline.core.walk import _chosen_options


def _options(rng, n: int, k: int) -> list:
    """k options: arrays of n rows, numpy and Python scalars, NaN and inf among them."""
    out: list = []
    for i in range(k):
        kind = i % 4
        if kind == 0:
            a = rng.random(n)
            a[rng.random(n) < 0.1] = np.nan
            out.append(a)
        elif kind == 1:
            out.append(np.float64(rng.random()))
        elif kind == 2:
            out.append(float(i) if i % 8 else np.inf)
        else:
            out.append(rng.integers(0, 100, n).astype(float))
    return out


@pytest.mark.parametrize("n", [1, 2, 5, 64, 2799])
@pytest.mark.parametrize("k", [1, 2, 7, 30])
@pytest.mark.parametrize("used", [1, 3, 30])
def test_choose_rows_is_numpys_choose(n, k, used):
    rng = np.random.default_rng(n * 1000 + k * 10 + used)
    values = _options(rng, n, k)
    choice = rng.integers(0, min(k, used), n)
    want = np.choose(choice, np.broadcast_arrays(*values))
    got = choose_rows(choice, values)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # NaN where numpy has NaN, the same bits else


def test_choose_rows_keeps_integer_dtypes_and_falls_back_on_odd_shapes():
    choice = np.array([1, 0, 1])
    ints = [np.array([1, 2, 3]), 7]
    want = np.choose(choice, np.broadcast_arrays(*ints))
    got = choose_rows(choice, ints)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    unsigned = np.array([1, 0, 1], dtype=np.uint8)  # not a signed index: numpy's own choose
    np.testing.assert_array_equal(
        choose_rows(unsigned, ints), np.choose(unsigned, np.broadcast_arrays(*ints))
    )
    two_d = [np.ones((2, 3)), np.zeros((2, 3))]  # not one value per row: numpy's own choose
    np.testing.assert_array_equal(
        choose_rows(choice, two_d), np.choose(choice, np.broadcast_arrays(*two_d))
    )


def test_choose_rows_raises_as_numpy_does_for_an_index_out_of_range():
    with pytest.raises(ValueError):
        np.choose(np.array([0, 2]), np.broadcast_arrays(np.zeros(2), np.ones(2)))
    with pytest.raises(ValueError):
        choose_rows(np.array([0, 2]), [np.zeros(2), np.ones(2)])
    with pytest.raises(ValueError):
        choose_rows(np.array([0, -1]), [np.zeros(2), np.ones(2)])


def _argmin_definition(costs, ok=None):
    """The plain definition: stack the broadcast costs, mask what `ok` forbids, argmin."""
    stacked = np.stack(np.broadcast_arrays(*costs))
    if ok is not None and any(ok):
        keep = np.array(ok).reshape((-1,) + (1,) * (stacked.ndim - 1))
        stacked = np.where(keep, stacked, np.inf)
    return np.argmin(stacked, axis=0)


@pytest.mark.parametrize("n", [1, 3, 64, 2799])
@pytest.mark.parametrize("k", [2, 7, 30])
@pytest.mark.parametrize("mask", [None, "none", "some"])
def test_argmin_allowed_is_the_stacked_argmin(n, k, mask):
    rng = np.random.default_rng(7 * n + k)
    costs = tuple(_options(rng, n, k))
    costs = costs[:1] + (costs[0],) + costs[2:]  # an exact tie: the first wins
    ok = None if mask is None else [bool(mask == "some" and i % 3 == 1) for i in range(k)]
    got = argmin_allowed(costs, ok)
    want = _argmin_definition(costs, ok)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_argmin_allowed_of_other_shapes_is_the_definition():
    costs = (np.ones((2, 3)), np.zeros((2, 3)), 0.5)  # two-dimensional: the stacked path
    np.testing.assert_array_equal(argmin_allowed(costs), _argmin_definition(costs))
    ints = (np.array([3, 1, 2]), np.array([2, 2, 2]))  # integer costs: the stacked path
    np.testing.assert_array_equal(argmin_allowed(ints), _argmin_definition(ints))


@pytest.mark.parametrize("n_rows", [1, 5, 2799])
@pytest.mark.parametrize("n_opts", [1, 4, 30])
def test_chosen_options_are_those_some_row_names_in_order(n_rows, n_opts):
    rng = np.random.default_rng(n_rows + n_opts)
    choice = rng.integers(0, n_opts, n_rows)
    want = [oi for oi in range(n_opts) if np.any(choice == oi)]  # the walk's loop before
    assert _chosen_options(choice, n_opts) == want
    assert _chosen_options(np.intp(n_opts - 1), n_opts) == [n_opts - 1]


def _family_steps(model: str, system: str, monkeypatch, memo: bool):
    """The step arrays of every family of a default-stack search space, walked with the
    einsums' sized quantities shared (`SizedMemo`) or each einsum sizing its own."""
    from roofline.core import walk
    from roofline.core.stack import resolve_framework, stack_of
    from roofline.specs.model_catalog import load_model
    from roofline.specs.plan import Workload
    from roofline.specs.system import parse_system
    from roofline.training.planner.space import SearchSpace, enumerate_plans
    from roofline.training.step import evaluate_plans

    monkeypatch.setattr(walk, "SIZED_MEMO_ROWS", 64 if memo else 10**9)
    m, s = load_model(model), parse_system(system)
    stack = stack_of(resolve_framework("auto", s.chip))
    w = Workload(4 * 2**20, 4096)
    space = SearchSpace().for_stack(stack, m)
    found = enumerate_plans(m, w, [s], space)
    return [
        evaluate_plans(m, [s], w, st, cand, remats=list(space.remats), framework=stack)
        for st, cand in found.groups
    ]


@pytest.mark.parametrize(
    ("model", "system"), [("gpt-3-175b", "a100:1024"), ("mixtral-8x7b", "h100:256")]
)
def test_a_family_walk_sizing_once_gives_the_same_steps(model, system, monkeypatch):
    shared = _family_steps(model, system, monkeypatch, memo=True)
    own = _family_steps(model, system, monkeypatch, memo=False)
    assert len(shared) == len(own) > 0
    for a, b in zip(shared, own, strict=True):
        assert len(a.step_time_s) > 64  # a family: the memo applies
        for f in ("step_time_s", "compute_time_s", "exposed_comm_time_s", "memory_total", "mfu"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        for f in ("comm", "exposed", "memory"):
            assert getattr(a, f).keys() == getattr(b, f).keys()
            for k in getattr(a, f):
                np.testing.assert_array_equal(getattr(a, f)[k], getattr(b, f)[k])
