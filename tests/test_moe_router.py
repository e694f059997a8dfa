"""The MoE router stays in 16 bits under a low-precision recipe: Megatron-Core runs it as a
bf16 GEMM with fp32 logits (moe_utils.py RouterGatingLinearFunction), never through Transformer
Engine's fp8 layers, so its ledger row computes in the LM head's dtype (`vocab`), not the
experts'."""

from __future__ import annotations

import numpy as np

from roofline.core.rules import Structure, rules_of
from roofline.core.walk import AlgebraPricing, WalkOptions, ledger_for, walk_ledger
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import ComputeDtype, ComputeDtypes, OpClass, Phase

ONE_CHIP = {"data": 1.0, "fsdp": 1.0, "tensor": 1.0, "seq": 1.0, "expert": 1.0, "stage": 1.0}
FREE = AlgebraPricing(lambda kind, b, axes: 0.0 * np.asarray(b, float), None, 1.0, 1.0)


def test_router_computes_in_the_16_bit_dtype_of_an_fp8_recipe():
    d = ComputeDtypes(matmul="fp8", experts="fp8")
    assert d.for_op("moe/router", OpClass.EXPERT_GEMM) == ComputeDtype.BF16
    assert d.for_op("moe/up", OpClass.EXPERT_GEMM) == ComputeDtype.FP8
    assert d.for_op("unembed", OpClass.DENSE_GEMM) == ComputeDtype.BF16


def test_the_walk_prices_the_router_in_bf16_and_the_experts_in_fp8():
    model = load_model("mixtral-8x7b")
    led = ledger_for(model, Phase.TRAIN, 4096)
    rules = rules_of(Structure(frozenset()), model)
    opts = WalkOptions(dtypes=ComputeDtypes(matmul="fp8", experts="fp8"))
    w = walk_ledger(model, led, rules, ONE_CHIP, np.array([1.0]), pricing=FREE, options=opts)
    dtypes = {r.op: r.dtype for r in w.ops if r.op in ("moe/router", "moe/up")}
    assert dtypes == {"moe/router": "bf16", "moe/up": "fp8"}
