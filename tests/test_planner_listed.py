"""The planner costs the plans it lists (top, runner-up) together in multi-row walks
(`evaluate_plan_rows`); each must be exactly what `evaluate_plan` gives that plan alone."""

from __future__ import annotations

import json

import pytest

from roofline.core.stack import resolve_framework
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.planner import plan_training
from roofline.training.step import Workload, evaluate_plan


def _same(a, b) -> None:
    assert json.dumps(a.to_dict(), sort_keys=True, default=str) == json.dumps(
        b.to_dict(), sort_keys=True, default=str
    )


@pytest.mark.parametrize(
    ("model", "system", "framework"),
    [
        ("gpt-3-175b", "a100:1024", "auto"),  # sub-slices, several remats in one walk
        ("llama-3-8b", "tpu-v5e:16x16", "auto"),
        ("mixtral-8x7b", "h100:64", None),  # the idealised machine, experts
    ],
)
def test_listed_plans_equal_their_single_costing(model, system, framework):
    m, s = load_model(model), parse_system(system)
    fw = resolve_framework(framework, s.chip) if framework else None
    w = Workload(4 * 2**20, 4096, 1e12)
    res = plan_training(m, s, w, framework=fw, top_k=5)
    listed = [*res.top, *([res.runner_up] if res.runner_up is not None else [])]
    assert len(res.top) >= 2
    for c in listed:
        alone = evaluate_plan(m, c.system, w, c.plan, framework=fw)
        assert c.step_time_s == alone.step_time_s  # to the last digit
        _same(c, alone)
