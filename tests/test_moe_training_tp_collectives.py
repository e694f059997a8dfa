"""The routed experts' tensor-parallel collectives in the training walk, Megatron ETP = TP
(issue 19, item 1), against the alltoall token dispatcher's closed form.

Megatron-Core's MoEAlltoAllTokenDispatcher with tensor parallelism (sequence parallel, as
Megatron requires for MoE under TP) dispatches each rank's N/tp sequence-parallel tokens (N
tokens per microbatch on the chip's tensor group), top_k copies each, by an all-to-all over the
expert group, then all-gathers the received rows over the tensor group
(gather_from_sequence_parallel_region in token_dispatch), so each tensor rank runs its local
experts' width slice on all N·k rows; the combine reduce-scatters the N·k expert-output rows
over the tensor group before the all-to-all back and the weighted unpermute
(reduce_scatter_to_sequence_parallel_region in token_combine; NVIDIA/Megatron-LM
megatron/core/transformer/moe/token_dispatcher.py). Backward mirrors it. Per chip, MoE layer
and microbatch, over the tensor axis: forward AG + RS of N·k·D·2 bytes, backward RS + AG of
the same: one all-reduce's worth each way. The walk prices it as an all-reduce of the routed
outputs ye [N·k, D] forward (moe/down) and of dxe [N·k, D] backward (moe/gate's d_lhs), the
same bytes on the wire; the top_k× volume is what this dispatcher really moves (the reduction
happens before the combine). The combine-then-reduce path (WalkOptions.moe_combine_reduce,
[N, D]) is the inference engines', not this dispatcher's.

The Megatron stack's default dispatcher, flex/DeepEP (specs/frameworks/megatron.toml), has no
separate tensor collective: MoEFlexTokenDispatcher._initialize_metadata replicates each token's
routing over the tensor group (routing_map.reshape(T, ep, 1, E/ep).expand(-1, -1, tp, -1):
"each TP ranks in a TP group should receive the same tokens"), so one all-to-all over the
tp·ep ranks sends every one of the rank's N/tp tokens to the tp ranks of each of its k experts
(N·k rows), and the combine sums the tp partial outputs and the k experts at the token's rank
inside the all-to-all back. Wire bytes per chip and pass: 2·N·k·D·2·(1 − 1/(tp·ep)). The walk's
all-to-all of N·k/tp rows over ep plus all-reduce of N·k rows over tp moves
2·(N·k/tp)·(ep−1)/ep + 2·N·k·(tp−1)/tp = 2·N·k·(1 − 1/(tp·ep)) rows: the same (tested below).
What differs is where it is charged: the walk's reduction is tensor-class traffic, DeepEP's is
inside the expert all-to-all (hidden with it under the EP-overlap schedule).

Mixtral 8x7B (D = 4096, k = 2) on 8 H100 (one NVLink domain), ep=4, tp=2, 8 microbatches of
a 128×4096-token batch: N = 128/4/8 · 4096 = 16384 tokens.
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
N = 128 / 4 / 8 * SEQ
ROWS = N * MOE.top_k * MODEL.d_model * 2.0  # N·k rows of D bf16 values


@pytest.fixture(scope="module")
def colls() -> dict[tuple[str, str, str], dict]:
    cost = evaluate_plan(
        MODEL,
        parse_system("h100:8"),
        Workload(128 * SEQ, SEQ),
        parse_plan("ep=4,tp=2,megatron_sp=1,microbatch=8,remat=none"),
        framework="megatron",
    )
    return {
        (c["op"], c["einsum"], c["kind"]): c
        for c in cost.collectives
        if c["op"] in ("moe/gate", "moe/up", "moe/down") and c.get("counted", True)
    }


def _bytes(c: dict) -> float:
    return float(np.ravel(c["bytes_per_chip"])[0])


def test_forward_reduces_the_top_k_expert_outputs_over_the_tensor_axis(colls):
    c = colls[("moe/down", "forward", "all-reduce")]
    assert c["axes"] == ["tensor"]
    assert _bytes(c) == pytest.approx(ROWS, rel=1e-12)


def test_backward_reduces_the_dispatched_rows_gradient_once(colls):
    ar = [k for k in colls if k[2] == "all-reduce" and k[1] == "d_lhs"]
    assert ar == [("moe/gate", "d_lhs", "all-reduce")]  # gate and up share one reduction of dx
    assert _bytes(colls[ar[0]]) == pytest.approx(ROWS, rel=1e-12)


def test_dispatch_moves_each_ranks_sequence_slice(colls):
    """The all-to-all moves the rank's N/tp tokens' k copies (one NVLink domain: no DeepEP
    node dedup), forward dispatch and combine."""
    for name in ("dispatch", "combine"):
        c = colls[("moe/up", name, "all-to-all")]
        assert c["axes"] == ["expert"]
        assert _bytes(c) == pytest.approx(ROWS / 2, rel=1e-12)


def test_wire_bytes_equal_the_flex_dispatchers(colls):
    """Ring all-reduce moves 2·(tp−1)/tp of its buffer per chip, an all-to-all (ep−1)/ep: the
    walk's forward per chip equals DeepEP's one tp·ep all-to-all each way."""
    tp, ep = 2, 4
    a2a = sum(_bytes(colls[("moe/up", n, "all-to-all")]) for n in ("dispatch", "combine"))
    ar = _bytes(colls[("moe/down", "forward", "all-reduce")])
    walk = a2a * (ep - 1) / ep + ar * 2 * (tp - 1) / tp
    assert walk == pytest.approx(2 * ROWS * (1 - 1 / (tp * ep)), rel=1e-12)
