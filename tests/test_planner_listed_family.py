"""The listed plans of a dense model's search are read off their family's arrays
(`training.step.family_step_cost`): each must be exactly what `evaluate_plan` gives that plan
alone, collectives included (the family's size-1 axes left out of their texts)."""

from __future__ import annotations

import json

import pytest

from roofline.core.sharding import Spec, without_axes_text
from roofline.core.stack import resolve_framework
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.planner import plan_training
from roofline.training.step import Workload, evaluate_plan, without_unit_axes


@pytest.mark.parametrize(
    ("model", "system"),
    [
        ("llama-3-70b", "tpu-v5p:16x16x16"),  # sub-slices: two families
        ("llama-3.1-405b", "h100:2048"),  # pipelines, interleaved
    ],
)
def test_listed_plans_read_off_the_family_equal_their_single_costing(model, system):
    m, s = load_model(model), parse_system(system)
    fw = resolve_framework("auto", s.chip)
    w = Workload(4 * 2**20, 4096, 1e12)
    res = plan_training(m, s, w, framework=fw, top_k=5)
    for c in [*res.top, *([res.runner_up] if res.runner_up is not None else [])]:
        alone = evaluate_plan(m, c.system, w, c.plan, framework=fw)
        assert json.dumps(c.to_dict(), sort_keys=True, default=str) == json.dumps(
            alone.to_dict(), sort_keys=True, default=str
        )


def test_a_spec_text_without_axes_is_the_spec_without_them():
    full = Spec(
        "dW", ("embed", "seq", "mlp"), (("fsdp",), ("seq", "tensor"), ("seq",)), ("data", "seq")
    )
    less = Spec("dW", ("embed", "seq", "mlp"), (("fsdp",), ("tensor",), ()), ("data",))
    assert without_axes_text(str(full), frozenset({"seq"})) == str(less)
    gone = Spec("x", ("batch",), (("data",),), ("seq",))
    assert without_axes_text(str(gone), frozenset({"seq"})) == "x[batch_{data}]"
    assert without_axes_text(str(gone), frozenset()) == str(gone)


def test_collectives_over_size_one_axes_only_are_dropped():
    row = {"axes": ["seq"], "time_s": 0.0, "before": "k[kv_seq_{seq}]", "after": "k[kv_seq]"}
    kept = {"axes": ["data", "seq"], "time_s": 1.0, "before": "g{U_{data,seq}}", "after": "g"}
    assert without_unit_axes((row, kept), frozenset({"seq"})) == (
        {"axes": ["data"], "time_s": 1.0, "before": "g{U_{data}}", "after": "g"},
    )
