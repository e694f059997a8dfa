"""The planner's fast paths give what the plain definitions give: the degree tuples of a
mesh factorisation (arrays, not a recursion), auto-placed meshes (steps remembered per system),
switch-bound bandwidths (remembered per system and dim)."""

from __future__ import annotations

import itertools
import math

import pytest

from roofline.core import collectives
from roofline.core.mesh import Mesh, _Placer, place_mesh
from roofline.errors import PlanError
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Strategy, Workload, mesh_axes_of
from roofline.specs.system import parse_system
from roofline.training.planner.space import SearchSpace, factorisations


def _nested_loops(n: int, dom) -> list[tuple[int, ...]]:
    """The definition: nested loops over tp, pp, sp, ep, dp, fsdp taking the rest."""
    order = (Strategy.TP, Strategy.PP, Strategy.SP, Strategy.EP, Strategy.DP)
    out = []
    for vals in itertools.product(*(dom[s][0] for s in order)):
        p = math.prod(vals)
        if n % p or n // p not in dom[Strategy.FSDP][0]:
            continue
        deg = dict(zip(order, vals, strict=True)) | {Strategy.FSDP: n // p}
        out.append(tuple(deg[s] for s in Strategy))
    return out


@pytest.mark.parametrize("model", ["gpt-3-175b", "mixtral-8x7b", "deepseek-v3", "tiny-llama"])
@pytest.mark.parametrize("chips", [1, 6, 64, 96, 1024, 3072])
@pytest.mark.parametrize("sequences", [1, 3, 1024, 3840])
def test_factorisations_are_the_nested_loops_in_their_order(model, chips, sequences):
    dom = SearchSpace().domains(load_model(model), Workload(sequences * 4096, 4096), chips)
    got = [tuple(int(x) for x in row) for row in factorisations(chips, dom)]
    assert got == _nested_loops(chips, dom)
    assert all(math.prod(row) == chips for row in got)


def _placed_fresh(sys_, items) -> dict:
    """Every axis placed by a new `_Placer`, innermost first (no remembered steps)."""
    placer = _Placer(sys_)
    return {a: placer.take(a, s, list(reversed(sys_.dims))) for a, s in reversed(items)}


@pytest.mark.parametrize("system", ["a100:1024", "tpu-v5p:16x16x16", "h100:96", "tpu-v5e:16x16"])
def test_auto_placement_equals_a_fresh_placer(system):
    sys_ = parse_system(system)
    dom = SearchSpace().domains(load_model("gpt-3-175b"), Workload(2**22, 4096), sys_.n_chips)
    placed = 0
    for row in factorisations(sys_.n_chips, dom):
        items = list(mesh_axes_of(tuple(int(x) for x in row)))
        try:
            want = _placed_fresh(sys_, items)
        except PlanError as e:
            with pytest.raises(PlanError) as got:
                place_mesh(sys_, items)
            assert str(got.value) == str(e)
            continue
        m = place_mesh(sys_, items)
        assert isinstance(m, Mesh) and dict(m.placement) == want
        placed += 1
    assert placed > 10


def test_remembered_steps_are_per_system_object():
    """The same axes on two systems (and on a new object of the first) are each placed on
    that system's own dims."""
    for sys_ in (parse_system("a100:64"), parse_system("h100:64"), parse_system("a100:64")):
        items = [("data", 8), ("tensor", 8)]
        m = place_mesh(sys_, items)
        assert dict(m.placement) == _placed_fresh(sys_, items)
        assert all(seg.dim in sys_.dims for segs in m.placement.values() for seg in segs)


def test_switched_bandwidth_remembered_equals_a_fresh_system():
    for name in ("h100:1024", "a100:4096", "gb200:144", "tpu-v5p:8x8x8"):
        s = parse_system(name)
        for d in s.dims:
            first = collectives.switched_bw(s, d)
            again = collectives.switched_bw(s, d)
            fresh = parse_system(name)
            d2 = next(x for x in fresh.dims if x.name == d.name)
            assert first == again == collectives.switched_bw(fresh, d2)


@pytest.mark.parametrize("model,chips", [("llama-3.1-405b", 2048), ("gpt-3-175b", 96)])
@pytest.mark.parametrize("sequences", [1024, 3840])
def test_stage_one_rows_are_the_grid_with_schedules_only_under_a_pipeline(model, chips, sequences):
    """Every mesh × microbatch count × pipeline choice (each schedule, the interleaved one with
    each virtual-stage count) in nested order, a choice other than the first and a count above
    the plain ones (`pipeline_microbatches`) only where pp > 1: the meshgrid of the three,
    filtered."""
    import numpy as np

    from roofline.training.planner.space import _stage_one, microbatch_counts, pipeline_choices

    w = Workload(sequences * 4096, 4096)
    space = SearchSpace()
    dom = space.domains(load_model(model), w, chips)
    F = np.column_stack([np.zeros(len(f := factorisations(chips, dom)), dtype=np.int64), f])
    counts = (*space.microbatches, *space.pipeline_microbatches)
    mbs = np.array(microbatch_counts(counts, w))
    scheds, virt = pipeline_choices(space)
    assert len(scheds) == len(space.schedules) - 1 + len(space.virtual_stages)
    fi, mb, pc = (
        x.reshape(-1)
        for x in np.meshgrid(np.arange(len(F)), mbs, np.arange(len(scheds)), indexing="ij")
    )
    piped = F[fi, 1 + list(Strategy).index(Strategy.PP)] > 1
    keep = piped | ((pc == 0) & (mb <= max(space.microbatches)))
    got = _stage_one(F, w, space)
    assert (F[fi, 1 + list(Strategy).index(Strategy.PP)] > 1).any()  # pipelines present
    want = (mb[keep], scheds[pc][keep], virt[pc][keep], F[fi][keep])
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)
