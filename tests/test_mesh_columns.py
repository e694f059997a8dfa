"""A family's meshes placed one axis at a time (`mesh.auto_placed_columns`, the planner's
`walk._meshes`) are the meshes `place_mesh` builds one by one (issue 21: the planner's rate;
benchmarks/README.md, ninth pass): the same Segment tuples per axis, and collectives priced
from them cost what they cost on the whole meshes, to the bit."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import roofline.core.walk as walk
from roofline.core.collectives import CollectiveKind
from roofline.core.cost import CommModel
from roofline.core.mesh import auto_placed_columns, place_mesh
from roofline.errors import PlanError
from roofline.specs.efficiency import load_profile
from roofline.specs.plan import AXIS_ORDER
from roofline.specs.system import parse_system


def _factors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _degree_rows(n: int, rng, k: int) -> np.ndarray:
    """k random degree rows over the six axes: most multiply to n, one in ten does not."""
    rows = []
    while len(rows) < k:
        left, row = n, []
        for _ in AXIS_ORDER[1:]:
            d = int(rng.choice(_factors(left)))
            row.append(d)
            left //= d
        rows.append([left if rng.random() > 0.1 else 3 * left, *row])
    return np.array(rows, dtype=np.int64)


@pytest.mark.parametrize(
    "names", [("a100:1024", "a100:64"), ("tpu-v5p:16x16x16",), ("tpu-v5e:16x16", "h100:256")]
)
def test_columns_place_as_place_mesh(names):
    systems = [parse_system(n) for n in names]
    rng = np.random.default_rng(len(names))
    rows, sidx = [], []
    for i, s in enumerate(systems):
        r = _degree_rows(s.n_chips, rng, 300)
        rows.append(r)
        sidx += [i] * len(r)
    deg = np.concatenate(rows)
    columns = [(a, deg[:, k]) for k, a in enumerate(AXIS_ORDER)]
    placed, bad = auto_placed_columns(systems, np.array(sidx), columns)
    fits = 0
    for i, row in enumerate(deg.tolist()):
        items = [(a, d) for a, d in zip(AXIS_ORDER, row, strict=True) if d > 1]
        s = systems[sidx[i]]
        try:
            m = place_mesh(s, items) if items else None
        except PlanError:
            m = None
            if math.prod(row) == s.n_chips:
                assert bad[i]  # an axis the columns could not place either
        if m is None or math.prod(row) != s.n_chips:
            continue
        fits += 1
        assert not bad[i]
        for a, d in zip(AXIS_ORDER, row, strict=True):
            segs_list, idx = placed[a]
            if d == 1:
                assert idx[i] == -1
            else:
                si, segs = segs_list[idx[i]]
                assert si == sidx[i] and segs == m.placement[a]
    assert fits > 50


@pytest.mark.parametrize("system", ["a100:1024", "tpu-v5p:16x16x16"])
def test_comm_model_from_columns_prices_as_from_meshes(system, monkeypatch):
    from roofline.core.rules import Strategy
    from roofline.core.walk import MeshRows

    s = parse_system(system)
    rng = np.random.default_rng(7)
    deg = _degree_rows(s.n_chips, rng, 400)
    strategies = list(Strategy)
    by_axis = dict(zip(AXIS_ORDER, deg.T, strict=True))
    rows = MeshRows(
        np.zeros(len(deg), dtype=np.int64),
        {st: by_axis[walk.AXIS_OF[st]] for st in strategies},
        np.ones(len(deg), dtype=np.int64),
    )
    eff = load_profile("fitted")
    meshes, minv, reason, placed = walk._meshes([s], rows)
    assert placed is not None
    monkeypatch.setattr(walk, "_COLUMNS_FROM", 1 << 30)
    meshes2, minv2, reason2, placed2 = walk._meshes([s], rows)
    assert placed2 is None
    np.testing.assert_array_equal(minv, minv2)
    assert reason.tolist() == reason2.tolist()
    a = CommModel(minv, meshes, eff, placed=placed)
    b = CommModel(minv2, meshes2, eff)
    nbytes = rng.random(len(deg)) * 1e9
    for kind, axes in itertools.product(
        list(CollectiveKind), [("fsdp",), ("tensor",), ("data", "fsdp"), ("expert", "seq")]
    ):
        np.testing.assert_array_equal(a(kind, nbytes, axes), b(kind, nbytes, axes))
    assert (a(CollectiveKind.ALL_GATHER, nbytes, ("data", "fsdp")) > 0).sum() > 100


@pytest.mark.parametrize("system", ["a100:1024", "tpu-v5p:16x16x16", "tpu-v5e:16x16"])
def test_a_groups_own_mesh_prices_as_the_whole_mesh(system):
    """`CommModel` prices a group on a mesh of the group's own axes (`mesh.group_mesh`): every
    kind over every group of every mesh costs what it costs on the whole mesh."""
    from roofline.core.collectives import unit_cost
    from roofline.core.mesh import group_mesh

    s = parse_system(system)
    rng = np.random.default_rng(11)
    checked = 0
    for row in _degree_rows(s.n_chips, rng, 40).tolist():
        items = [(a, d) for a, d in zip(AXIS_ORDER, row, strict=True) if d > 1]
        try:
            m = place_mesh(s, items)
        except PlanError:
            continue
        names = [a for a, _ in items]
        for r in range(1, len(names) + 1):
            for group in itertools.combinations(names, r):
                own = group_mesh(s, {a: m.placement[a] for a in group})
                assert own.sizes == {a: m.sizes[a] for a in group}
                for kind in CollectiveKind:
                    assert unit_cost(kind, group, own) == unit_cost(kind, group, m)
                    checked += 1
    assert checked > 100
