"""Routed experts under tensor parallelism: ETP = TP (Megatron-LM's default) vs ETP = 1.

With expert_tensor_parallel_size 1 each tensor rank routes only its sequence-parallel slice of
the tokens and holds whole experts (core.rules.moe_rules): every activation of a MoE layer is then
split over the tensor axis, the expert weights are replicated over it (their gradients summed once
per step, their optimizer state sharded over the larger expert-data-parallel group)."""

from __future__ import annotations

import math

import pytest

from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.training.step import evaluate_plan

MODEL = load_model("mixtral-8x7b")
SYSTEM = parse_system("h100:16")
SEQ = 4096
SEQS = 128  # global batch in sequences
WORK = Workload(SEQS * SEQ, SEQ)
M = 8  # microbatches
BASE = f"ep=8,microbatch={M},remat=none"


def _cost(extra: str):
    return evaluate_plan(MODEL, SYSTEM, WORK, parse_plan(f"{BASE},{extra}"), framework="megatron")


def test_plan_flag_round_trips():
    p = parse_plan("ep=8,tp=2,megatron_sp=1,expert_tp=0")
    assert not p.expert_tp
    assert "expert_tp=0" in p.describe()
    assert parse_plan(p.describe()) == p
    assert parse_plan("ep=8,tp=2").expert_tp  # Megatron's default: ETP = TP
    assert "expert_tp" not in parse_plan("ep=16,expert_tp=0").describe()  # no tensor axis


def test_etp1_splits_every_activation_over_tp():
    """Megatron with sequence parallelism keeps 1/t of every activation (Korthikanti 2022,
    sbh·34/t): at ETP = 1 tp=2 with twice the tokens per chip holds exactly what tp=1 holds."""
    tp2 = _cost("tp=2,megatron_sp=1,expert_tp=0").memory_breakdown["activations"]
    tp1 = _cost("dp=2").memory_breakdown["activations"]
    assert tp2 == pytest.approx(tp1, rel=1e-9)


def test_etp_tp_keeps_the_dispatched_tokens_whole():
    """ETP = TP: the routed tokens xe [tokens·k, D] the expert GEMMs keep are whole on each
    tensor rank; ETP = 1 halves them at tp=2. Closed form of the difference, per chip:
    (tokens per microbatch per chip · k · D · 2 bytes) · (1 − 1/tp) · layers (the down
    projection's output is not kept: see test_expert_output_not_saved)."""
    etp_tp = _cost("tp=2,megatron_sp=1").memory_breakdown["activations"]
    etp_1 = _cost("tp=2,megatron_sp=1,expert_tp=0").memory_breakdown["activations"]
    moe = MODEL.moe
    assert moe is not None
    tokens = SEQS / 8 / M * SEQ  # sequences over the expert (batch) axis, per microbatch
    xe = tokens * moe.top_k * MODEL.d_model * 2.0
    want = xe * (1 - 1 / 2) * MODEL.n_moe_layers
    assert etp_tp - etp_1 == pytest.approx(want, rel=1e-9)


def test_etp1_replicates_expert_weights_and_shards_their_state():
    """Whole experts on each tensor rank: expert parameters and gradients double at tp=2; ZeRO-1
    shards their optimizer state over the expert-data-parallel group, now tp ranks wider, so the
    optimizer bytes are unchanged."""
    a = _cost("tp=2,megatron_sp=1").memory_breakdown
    b = _cost("tp=2,megatron_sp=1,expert_tp=0").memory_breakdown
    moe = MODEL.moe
    assert moe is not None
    # the router weight [D, E] is a dense weight, replicated over the expert axis (Megatron's
    # TopKRouter is not expert-parallel), so the wider expert-data-parallel group shards nothing
    # further: the optimizer bytes are equal
    assert a["optimizer"] == pytest.approx(b["optimizer"], rel=1e-12)
    assert b["params"] > a["params"]
    gated = 3  # gate, up, down
    experts_local = moe.n_experts / 8 * gated * MODEL.d_model * moe.d_ff_expert
    want = experts_local / 2 * MODEL.n_moe_layers * 2.0  # the other half, bf16
    assert b["params"] - a["params"] == pytest.approx(want, rel=1e-6)


def test_etp1_expert_collectives():
    """ETP = 1: no tensor-axis activation collective in the expert matmuls (Megatron skips the
    ETP all-gather / reduce-scatter at size 1); the expert weight gradients are summed over the
    tensor ranks once per step; each rank dispatches its own sequence slice either way (ETP = TP
    gathers over the tensor ranks after the all-to-all), so the dispatched bytes are the same."""

    def expert_comms(extra):
        # one node: no dispatcher deduplication across nodes (see the next test)
        plan = parse_plan(f"ep=4,tp=2,microbatch={M},remat=none,megatron_sp=1{extra}")
        cost = evaluate_plan(MODEL, parse_system("h100:8"), WORK, plan, framework="megatron")
        return [c for c in cost.collectives if c["op"] in ("moe/gate", "moe/up", "moe/down")]

    etp1 = expert_comms(",expert_tp=0")
    etp_tp = expert_comms("")
    tensor = [c for c in etp1 if "tensor" in c["axes"]]
    assert tensor and all(c["tensor"].startswith("dW") for c in tensor)
    assert all(c["overlap"] == "grad_step" for c in tensor)
    a2a = {c["bytes_per_chip"] for c in etp1 if c["kind"] == "all-to-all"}
    a2a_tp = {c["bytes_per_chip"] for c in etp_tp if c["kind"] == "all-to-all"}
    assert len(a2a) == len(a2a_tp) == 1
    assert math.isclose(a2a.pop(), a2a_tp.pop())


def test_expert_output_not_saved():
    """The routed experts' down projection feeds only the weighted sum back into the residual
    stream (Megatron-Core applies the router probabilities before it): like the dense MLP's last
    projection its output is not kept for the backward pass; its input is."""
    from roofline.core.memory import saved_tensors
    from roofline.core.walk import ledger_for
    from roofline.specs.plan import Phase, Remat, RematKind

    led = ledger_for(MODEL, Phase.TRAIN, SEQ, training_rows=True)
    for kind in (RematKind.NONE, RematKind.MATMULS):
        kept = {(op.name, t.name) for op, t in saved_tensors(led, Remat(kind))}
        assert ("moe/down", "ye") not in kept
    kept = {(op.name, t.name) for op, t in saved_tensors(led, Remat(RematKind.NONE))}
    assert {("moe/gate", "xe"), ("moe/down", "he")} <= kept


def test_etp1_without_sequence_parallelism_is_refused():
    """Each tensor rank routes its own sequence slice only under sequence parallelism."""
    from roofline.errors import PlanError

    with pytest.raises(PlanError, match="megatron_sp=1"):
        _cost("tp=2,expert_tp=0")


def test_etp1_expert_groups_are_consecutive_ranks():
    """DeepEP sends a token once per node its experts sit on. With ETP = 1 Megatron's expert
    groups are consecutive ranks (parallel_state.py: RankGenerator(tp=expert_tensor_parallel_size,
    ep=...)): EP=64 spans 8 H100 nodes, not 16 as with the tensor ranks interleaved. DeepSeek-V3
    routes each token to at most 4 of its 8 expert groups (node-limited routing): distinct nodes
    per token R·(1 − (1 − 1/R)^k) with R = min(nodes, 4·max(1, nodes/8)), k = 8."""
    ds = load_model("deepseek-v3")
    system = parse_system("h100:1024")
    work = Workload(8192 * 4096, 4096)
    base = "tp=2,ep=64,pp=8,microbatch=128,megatron_sp=1,remat=full,schedule=1f1b"

    def dispatched(extra: str) -> float:
        c = evaluate_plan(ds, system, work, parse_plan(base + extra), framework="megatron")
        (b,) = {x["bytes_per_chip"] for x in c.collectives if x["einsum"] == "dispatch"}
        return b

    def distinct(nodes: float) -> float:
        r = min(nodes, 4 * max(1.0, nodes / 8))
        return r * (1 - (1 - 1 / r) ** 8)

    # ETP = TP: the whole routed tokens on each rank, 1/tp of them dispatched, over 16 nodes;
    # ETP = 1: half the routed tokens on each rank, all dispatched, over 8 nodes
    ratio = dispatched(",expert_tp=0") / dispatched("")
    assert ratio == pytest.approx(distinct(8) / distinct(16), rel=1e-9)
