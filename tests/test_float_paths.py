"""A single plan's walk runs on Python floats (no numpy call per number): its option costs
and choices must be exactly the vectorised walk's, ties, infinities and NaN included."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from roofline.core.sharding import _float_option_cost, argmin_allowed, option_cost

VALUES = st.sampled_from([0.0, 1.0, 2.0, 1e-3, math.inf, math.nan]) | st.floats(0, 10)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(VALUES, st.booleans()), min_size=1, max_size=8), st.booleans())
def test_argmin_of_floats_is_numpys(rows, masked):
    costs = tuple(float(c) for c, _ in rows)
    ok = [a for _, a in rows] if masked else None
    got = argmin_allowed(costs, ok)
    want = argmin_allowed(tuple(np.array([c]) for c in costs), ok)
    assert int(got) == int(want[0])


@settings(max_examples=300, deadline=None)
@given(VALUES, VALUES, VALUES)
def test_float_option_cost_is_numpys(c, m, k):
    got, want = _float_option_cost(c, m, k), float(option_cost(c, m, k))
    assert (math.isnan(got) and math.isnan(want)) or got == want


def test_ties_take_the_first_option():
    assert int(argmin_allowed((2.0, 1.0, 1.0))) == 1
    assert int(argmin_allowed((2.0, 1.0, 1.0), [True, False, True])) == 2
    assert int(argmin_allowed((2.0, 1.0), [False, False])) == 1  # none allowed: cheapest


@settings(max_examples=300, deadline=None)
@given(VALUES, VALUES, VALUES)
def test_collective_time_of_floats_is_numpys(lat, spb, b):
    from roofline.core.collectives import collective_time

    got = collective_time(float(lat), float(spb), float(b))
    with np.errstate(invalid="ignore"):  # 0 x inf
        want = float(np.maximum(np.array([lat]), spb * np.array([b]))[0])
    assert (math.isnan(got) and math.isnan(want)) or got == want


def test_unit_cost_is_the_collectives_unit():
    """`unit_cost` (no per-byte arrays, no formula text) equals `collective_cost(...).unit` for
    every kind over every set of axes, on a TPU torus and on an NVLink + scale-out cluster."""
    import itertools

    from roofline.core.collectives import CollectiveKind, collective_cost, unit_cost
    from roofline.core.mesh import make_mesh, place_mesh
    from roofline.specs.system import parse_system

    for system, axes in (
        ("tpu-v5p:8x8x16", (("data", 4), ("fsdp", 16), ("seq", 2), ("tensor", 8))),
        ("h100:256", (("data", 2), ("fsdp", 16), ("tensor", 8))),
        ("a100:1024", (("data", 32), ("fsdp", 16), ("tensor", 2))),
        # the same system again: its remembered switched stages (`_stage_terms`' memo) shared
        ("a100:1024", (("data", 8), ("stage", 4), ("seq", 4), ("tensor", 8))),
        ("a100:1024", (("data", 2), ("fsdp", 64), ("expert", 8))),
    ):
        s = parse_system(system)
        mesh = place_mesh(s, list(axes))
        assert mesh == make_mesh(s, axes)
        names = [a for a, _ in axes]
        for kind in CollectiveKind:
            for r in range(1, len(names) + 1):
                for group in itertools.combinations(names, r):
                    assert (
                        unit_cost(kind, group, mesh)
                        == collective_cost(kind, 1.0e6, group, mesh).unit
                    ), (system, kind, group)


def test_unique_rows_is_numpys_unique_by_rows():
    from roofline.core.cost import unique_rows

    rng = np.random.default_rng(0)
    for n, hi in ((0, 5), (1, 5), (7, 3), (3000, 9), (50, 2**40)):  # the last: numpy's path
        cols = rng.integers(0, hi, size=(n, 7)).astype(np.int64)
        rows, inv = unique_rows(cols)
        want, want_inv = np.unique(cols, axis=0, return_inverse=True)
        assert (rows == want).all() and (inv == want_inv.reshape(-1)).all()


def test_options_built_directly_equal_their_dataclasses():
    """`_numeric_all` fills each Comm's and Option's fields at once (`sharding._built`): every
    field is set and each equals (and hashes as) the object its `__init__` builds."""
    from dataclasses import fields

    from roofline.core.sharding import Comm, Option, parse_einsum, plan_einsum

    assert not hasattr(Comm, "__post_init__") and not hasattr(Option, "__post_init__")
    a, b, c = parse_einsum("A[I_X, J_Y] * B[J_Y, K] -> C[I_X, K]", ["X", "Y"])
    ep = plan_einsum(a, b, c, {"I": 64.0, "J": 128.0, "K": 32.0}, {"X": 2.0, "Y": 4.0},
                     lambda k, nbytes, axes: nbytes / 1e11)  # fmt: skip
    assert ep.options and any(o.comms for o in ep.options)
    for o in ep.options:
        assert set(o.__dict__) == {f.name for f in fields(Option)}
        same = Option(**{f.name: getattr(o, f.name) for f in fields(Option)})
        assert same == o and hash(same) == hash(o)
        for cm in o.comms:
            assert set(cm.__dict__) == {f.name for f in fields(Comm)}
            assert Comm(**{f.name: getattr(cm, f.name) for f in fields(Comm)}) == cm
