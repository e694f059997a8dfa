"""Per-chip costs of a MoE layer in the serving step and the training walk, against closed forms.

DeepSeek-V3 (D = 7168, E = 256 routed experts of width F = 2048, top_k = 8, one shared expert
of width F_sh = 2048) prefilling T tokens, per chip and per MoE layer (peak profile: FLOPs and
bytes are the ledger's, not the profile's):

| op             | tp=8 (ep=1 or 8)  | tp=1, dp=8, ep=8       | tp=8, dp=8, ep=8 (64 chips) |
|----------------|-------------------|------------------------|-----------------------------|
| router         | 2·T·D·E           | 2·(T/8)·D·E            | 2·(T/8)·D·E                 |
| routed g/u/d   | 2·T·k·D·F/8 each  | 2·T·k·D·F/8 each       | 2·T·k·D·F/64 each           |
| shared g/u/d   | 2·T·D·F_sh/8 each | 2·(T/8)·D·F_sh each    | 2·(T/8)·D·F_sh/8 each       |
| tensor AR      | T·D·2 once        | none                   | (T/8)·D·2 once              |
| dispatch, comb.| none              | (T/8)·k·D·b each       | (T/8)·k·D·b each            |
| combine pass   | (T·k + T)·D·2     | (T·k/8 + T/8)·D·2      | (T·k/8 + T/8)·D·2           |

(b: the activations' bytes, 1 for fp8 compute; the all-reduce sums the 16-bit hidden states.
The combine pass reads each token's top_k expert outputs and writes their weighted sum, in 16
bits: vLLM's ops.moe_sum, TensorRT-LLM's finalizeMoeRouting.)

How the engines shard it: vLLM's fused_moe under tp splits every expert's intermediate width
over the tensor ranks (w13 [E, 2F/tp, D], w2 [E, D, F/tp]), sums each token's top_k outputs
with the router weights and adds the shared expert's partial output, then all-reduces the
[tokens, D] result once (vllm-project/vllm vllm/model_executor/models/deepseek_v2.py,
DeepseekV2MoE.forward; SGLang's DeepseekV2MoE and TensorRT-LLM's fused MoE do the same); with
attention data parallel + expert parallel (SGLang --enable-dp-attention --enable-ep-moe, vLLM
--data-parallel-size with --enable-expert-parallel, DeepEP) the top_k copies of each token go
to the experts' ranks by an all-to-all and come back by another. vLLM's EP inside a tensor
group (tp=8, ep=8, no attention dp) keeps every token on every rank, runs each rank's 32 experts
on the tokens routed to them and all-reduces the combined output: the same FLOPs, expected
weight bytes and one all-reduce per chip as tp=8, so the walk prices it as tp=8.
"""

from __future__ import annotations

import numpy as np
import pytest

from roofline.core.collectives import CollectiveKind
from roofline.core.ledger import build_ledger
from roofline.serving.inference import Quant, parse_serve_plan, serving_ledger
from roofline.serving.step import ShardedStep
from roofline.specs.efficiency import PEAK
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Phase
from roofline.specs.system import parse_system
from roofline.units import dtype_bytes

MODEL = load_model("deepseek-v3")
MOE = MODEL.moe
assert MOE is not None
D, E, K, F = MODEL.d_model, MOE.n_experts, MOE.top_k, MOE.d_ff_expert
F_SH = (MOE.d_ff_shared or MOE.d_ff_expert) * MOE.n_shared_experts
T = 8192.0
QUANT = Quant(weights="fp8", kv="fp8", compute="fp8")
ROUTED = ("moe/gate", "moe/up", "moe/down")
SHARED = ("moe/shared/gate", "moe/shared/up", "moe/shared/down")
STREAM = dtype_bytes("bf16")  # the hidden states the MoE output is summed in


def _walk(plan: str, chips: int):
    step = ShardedStep(
        MODEL, [parse_system(f"h200:{chips}")], [parse_serve_plan(plan)], QUANT, PEAK
    )
    led = serving_ledger(build_ledger(step.walked, batch=1, seq=T, kv_seq=T, dtypes=QUANT.policy))
    walk = step._walk(led, Phase.PREFILL, np.array([1.0]), np.array([0]))
    flops = {r.op: float(np.ravel(r.flops_per_chip)[0]) for r in walk.ops}
    flops["combine bytes"] = next(
        float(np.ravel(r.hbm_bytes_per_chip)[0]) for r in walk.ops if r.op == "moe/unpermute"
    )
    colls = [c for c in walk.collectives if c.op.startswith("moe/") and c.tensor != "W_router"]
    act = dtype_bytes(next(o for o in led if o.name == "moe/down").out.dtype)
    return flops, colls, act


def _bytes(c) -> float:
    return float(np.ravel(c.bytes_per_chip)[0])


@pytest.mark.parametrize("plan", ["tp=8", "tp=8,ep=8"])
def test_tensor_parallel_moe_layer(plan):
    """tp=8: expert width split over the tensor ranks, every token on every rank; one AllReduce
    of the combined output [T, D] per layer (not of the top_k outputs [T·k, D] before the
    combine, and none for the shared expert, whose partial sum joins it)."""
    flops, colls, b = _walk(plan, 8)
    assert flops["moe/router"] == pytest.approx(2 * T * D * E, rel=1e-12)
    for op in ROUTED:
        assert flops[op] == pytest.approx(2 * T * K * D * F / 8, rel=1e-12)
    for op in SHARED:
        assert flops[op] == pytest.approx(2 * T * D * F_SH / 8, rel=1e-12)
    assert [(c.op, c.kind, c.axes) for c in colls] == [
        ("moe/down", CollectiveKind.ALL_REDUCE, ("tensor",))
    ]
    assert _bytes(colls[0]) == pytest.approx(T * D * STREAM, rel=1e-12)
    assert colls[0].dtype == "bf16" and b == 1.0  # fp8 GEMMs, a 16-bit sum
    assert flops["combine bytes"] == pytest.approx((T * K + T) * D * STREAM, rel=1e-12)


def test_ep_within_tp_costs_what_tp_costs():
    """vLLM's EP inside the tensor group: the walk prices tp=8,ep=8 as tp=8 (module doc)."""
    a, ca, _ = _walk("tp=8", 8)
    b, cb, _ = _walk("tp=8,ep=8", 8)
    assert a == b
    assert [_bytes(c) for c in ca] == [_bytes(c) for c in cb]


def test_attention_dp_expert_parallel_moe_layer():
    """tp=1, dp=8, ep=8: T/8 tokens per rank outside the experts, 32 whole experts per rank
    inside (balanced routing: T·k/8 routed tokens each), the shared expert whole on every rank;
    the top_k copies of each rank's tokens dispatched and combined by an AllToAll each, no
    tensor reduction."""
    flops, colls, b = _walk("tp=1,dp=8,ep=8", 8)
    assert flops["moe/router"] == pytest.approx(2 * (T / 8) * D * E, rel=1e-12)
    for op in ROUTED:
        assert flops[op] == pytest.approx(2 * T * K * D * F / 8, rel=1e-12)
    for op in SHARED:
        assert flops[op] == pytest.approx(2 * (T / 8) * D * F_SH, rel=1e-12)
    kinds = sorted((c.einsum, c.kind, c.axes) for c in colls)
    assert kinds == [
        ("combine", CollectiveKind.ALL_TO_ALL, ("expert",)),
        ("dispatch", CollectiveKind.ALL_TO_ALL, ("expert",)),
    ]
    for c in colls:
        assert _bytes(c) == pytest.approx((T / 8) * K * D * b, rel=1e-12)
    assert flops["combine bytes"] == pytest.approx((T * K + T) / 8 * D * STREAM, rel=1e-12)


def test_tp_and_attention_dp_expert_parallel_moe_layer():
    """tp=8, dp=8, ep=8 on 64 chips: experts over the 8 expert ranks and each expert's width
    over the 8 tensor ranks; the combined output of the rank's T/8 tokens all-reduced once
    over the tensor axis."""
    flops, colls, b = _walk("tp=8,dp=8,ep=8", 64)
    for op in ROUTED:
        assert flops[op] == pytest.approx(2 * T * K * D * F / 64, rel=1e-12)
    for op in SHARED:
        assert flops[op] == pytest.approx(2 * (T / 8) * D * F_SH / 8, rel=1e-12)
    ar = [c for c in colls if c.kind == CollectiveKind.ALL_REDUCE]
    assert [(c.op, c.einsum, c.axes) for c in ar] == [("moe/down", "combine", ("tensor",))]
    assert _bytes(ar[0]) == pytest.approx((T / 8) * D * STREAM, rel=1e-12)
    a2a = [c for c in colls if c.kind == CollectiveKind.ALL_TO_ALL]
    assert len(a2a) == 2
    for c in a2a:
        assert _bytes(c) == pytest.approx((T / 8) * K * D * b, rel=1e-12)
    assert flops["combine bytes"] == pytest.approx((T * K + T) / 8 * D * STREAM, rel=1e-12)


def test_combine_reduce_is_one_top_k_th_of_the_expanded_reduce():
    """The serving AllReduce moves 1/top_k of the bytes the routed outputs [T·k, D] (in the same
    16-bit dtype) would."""
    _, colls, _ = _walk("tp=8", 8)
    assert _bytes(colls[0]) * K == pytest.approx(T * K * D * STREAM, rel=1e-12)


# -- the training walk (Megatron's option policy, sequence parallel under tp) ----------------


def _train(plan: dict, chips: int, seqs: float):
    """Per-chip FLOPs by (op, pass) and the MoE collectives of one training microbatch."""
    from roofline.core.rules import Structure
    from roofline.core.stack import stack_of
    from roofline.core.walk import MeshRows, WalkOptions, ledger_for, walk_rows
    from roofline.specs.plan import Strategy

    deg = {s: float(plan.get(s.value, 1)) for s in Strategy}
    active = frozenset(s for s in Strategy if deg[s] > 1)
    rows = MeshRows(np.array([0]), {s: np.array([v]) for s, v in deg.items()}, np.array([1.0]))
    stack = stack_of("megatron")
    walk = walk_rows(
        MODEL,
        [parse_system(f"h100:{chips}")],
        Structure(active=active, sequence_parallel=Strategy.TP in active),
        rows,
        seqs,
        ledger_for(MODEL, Phase.TRAIN, int(S)),
        PEAK,
        phase=Phase.TRAIN,
        options=WalkOptions(stack=stack, policy=stack.policy),
    )
    flops = {(r.op, r.pass_.value): float(np.ravel(r.flops_per_chip)[0]) for r in walk.ops}
    colls = [c for c in walk.collectives if c.op.startswith("moe/")]
    return flops, colls


S = 4096.0


@pytest.mark.parametrize(
    ("plan", "chips", "routed_ways", "shared_tokens_ways", "shared_width_ways"),
    [
        ({"tp": 8}, 8, 8, 1, 8),  # ETP = TP: expert width over the tensor ranks
        ({"ep": 8, "dp": 8}, 64, 64, 64, 1),  # whole experts, tokens over data × expert
        ({"tp": 8, "ep": 8}, 64, 64, 8, 8),
    ],
)
def test_training_moe_flops_per_chip(
    plan, chips, routed_ways, shared_tokens_ways, shared_width_ways
):
    """Forward, input-gradient and weight-gradient FLOPs of every expert matmul per chip: the
    routed ones 2·N·k·D·F over the chips sharing the experts' work, the shared expert's
    2·N·D·F_sh over its token and width splits (N = tokens of the microbatch); never the full
    width on a tensor rank (Megatron's policy moves activations, not weights, over tp)."""
    seqs = 8.0
    N = seqs * S
    flops, colls = _train(plan, chips, seqs)
    for op in ROUTED:
        for p in ("forward", "d_lhs", "d_rhs"):
            assert flops[(op, p)] == pytest.approx(2 * N * K * D * F / routed_ways, rel=1e-12)
    for op in SHARED:
        for p in ("forward", "d_lhs", "d_rhs"):
            want = 2 * N / shared_tokens_ways * D * F_SH / shared_width_ways
            assert flops[(op, p)] == pytest.approx(want, rel=1e-12)
    gathered = [c.tensor for c in colls if "tensor" in c.axes and c.tensor.startswith("W")]
    assert gathered == []
