"""The MoE router weight is replicated over the expert-parallel ranks (issue 19).

Megatron-Core's TopKRouter weight [E, D] is an ordinary (not expert-parallel) parameter: every
expert-parallel rank holds it whole, and its gradient is summed over the whole data-parallel
group (which for dense parameters includes the expert ranks) once per step, like any dense
weight (NVIDIA/Megatron-LM megatron/core/transformer/moe/router.py, Router.__init__ registers
`weight` without `allreduce=False`, the expert parameters' mark); the inference engines
replicate it too (vLLM's ReplicatedLinear gate). The walk used to shard it over the expert axis
and all-gather it in each pass. Closed form per chip and MoE layer (Mixtral 8x7B, D = 4096,
E = 8): no all-gather of W_router; one all-reduce of dW_router, D·E·2 bytes (bf16 gradients),
over the data and expert axes, per step.
"""

from __future__ import annotations

import numpy as np
import pytest

from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.training.step import evaluate_plan

MODEL = load_model("mixtral-8x7b")
MOE = MODEL.moe
assert MOE is not None
SEQ = 4096
WORK = Workload(128 * SEQ, SEQ)


def _router_colls(plan: str, chips: int, framework: str = "megatron") -> list[dict]:
    cost = evaluate_plan(
        MODEL, parse_system(f"h100:{chips}"), WORK, parse_plan(plan), framework=framework
    )
    return [c for c in cost.collectives if c.get("tensor") in ("W_router", "dW_router")]


@pytest.mark.parametrize("plan", ["dp=2,ep=8,tp=2,megatron_sp=1", "dp=4,ep=8"])
def test_router_weight_is_not_gathered_over_the_expert_axis(plan):
    colls = _router_colls(f"{plan},microbatch=4,remat=none", 32)
    assert all(c["tensor"] != "W_router" for c in colls)
    (grad,) = colls
    assert grad["kind"] == "all-reduce"
    assert grad["overlap"] == "grad_step"
    assert set(grad["axes"]) == {"data", "expert"}
    assert float(np.ravel(grad["bytes_per_chip"])[0]) == MODEL.d_model * MOE.n_experts * 2.0


def test_router_weight_counts_as_a_dense_parameter():
    """Its parameter bytes per chip do not shrink with ep: ep=8 and ep=4 (same tp, pp) differ
    only in the routed experts' share, E/ep · 3 · D · F per layer in bf16."""
    base = "tp=2,megatron_sp=1,microbatch=8,remat=none"
    p8 = evaluate_plan(
        MODEL, parse_system("h100:16"), WORK, parse_plan(f"ep=8,{base}"), framework="megatron"
    ).memory_breakdown["params"]
    p4 = evaluate_plan(
        MODEL, parse_system("h100:16"), WORK, parse_plan(f"dp=2,ep=4,{base}"), framework="megatron"
    ).memory_breakdown["params"]
    experts = MOE.n_experts * 3 * MODEL.d_model * MOE.d_ff_expert / 2  # ETP = TP = 2
    want = experts * (1 / 4 - 1 / 8) * MODEL.n_moe_layers * 2.0
    assert p4 - p8 == pytest.approx(want, rel=1e-9)
