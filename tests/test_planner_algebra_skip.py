"""The algebra's alternative to a search's best plan is not walked where the family walk chose
the algebra's cheapest option at every einsum of that plan (`planner.search._walked_cheapest`):
that walk under `Cheapest` would make the same choices, so it is the same walk. Checked here
against the walk it skips: wherever the skip applies, the skipped walk's step time is the best
plan's to the bit (so the alternative, never cheaper, is None either way)."""

from __future__ import annotations

import numpy as np
import pytest

import roofline.training.planner.search as search
from roofline.core.sharding import CHEAPEST, Spec, chooses_cheapest, plan_einsum
from roofline.core.stack import resolve_framework
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.step import Workload


@pytest.mark.parametrize(
    ("model", "system", "framework"),
    [
        ("llama-3-8b", "a100:64", "megatron"),
        ("llama-3-8b", "h100:64", "deepspeed"),
        ("llama-3-8b", "tpu-v5e:16x16", "maxtext"),
        ("llama-3-8b", "h100:64", "torchtitan"),
    ],
)
def test_a_skipped_alternative_is_the_best_plan_itself(monkeypatch, model, system, framework):
    seen = []
    walk_it = search._algebra_alternative

    def both(best, ctx, family=None, cheapest=False):
        monkeypatch.setattr(search, "ALGEBRA_ADVICE_MARGIN", -np.inf)  # always built
        walked = walk_it(best, ctx, family, False)
        monkeypatch.setattr(search, "ALGEBRA_ADVICE_MARGIN", 0.03)
        seen.append((family is not None and cheapest, best.step_time_s, walked.step_time_s))
        return walk_it(best, ctx, family, cheapest)

    monkeypatch.setattr(search, "_algebra_alternative", both)
    s = parse_system(system)
    search.plan_training(
        load_model(model),
        s,
        Workload(2**20, 4096, 1e12),
        framework=resolve_framework(framework, s.chip),
        efficient_size=False,
    )
    assert seen
    for skipped, best_s, walked_s in seen:
        if skipped:
            assert walked_s == best_s


def test_chooses_cheapest_reads_the_costs_the_choice_was_made_on():
    x = Spec("x", ("batch", "embed"), (("data",), ()))
    w = Spec("w", ("embed", "mlp"), ((), ("tensor",)))
    y = Spec("y", ("batch", "mlp"), (("data",), ("tensor",)))
    sizes = {"batch": 64.0, "embed": 1024.0, "mlp": 4096.0}
    mesh = {"data": np.array([2.0, 4.0]), "tensor": np.array([4.0, 2.0])}

    def comm(kind, nbytes, axes):
        return np.asarray(nbytes, float) * 1e-9

    ep = plan_einsum(x, w, y, sizes, mesh, comm, policy=CHEAPEST)
    assert len(ep.costs) == len(ep.options)
    assert all(chooses_cheapest(ep, r) for r in range(2))
    if len(ep.options) > 1:  # another option pinned: no longer the cheapest, costs dropped
        other = ep.with_choice((int(np.asarray(ep.choice)[0]) + 1) % len(ep.options))
        assert not chooses_cheapest(other, 0)
