"""Megatron's EP-overlap schedule (--overlap-moe-expert-parallel-comm, plan overlap_ep=1),
costed phase by phase (training.step._combined_1f1b): one microbatch's forward layer runs beside
another's backward layer, each all-to-all beside one compute phase of the other microbatch
(NVIDIA/Megatron-LM@d98e8a64 megatron/core/models/common/model_chunk_schedule_plan.py:243-245);
a phase takes the longer of its streams, the compute slowed by the SMs DeepEP's kernels hold
(megatron.toml [expert_parallel] dispatch_sms); warm-up and flush passes run unpaired
(megatron/core/pipeline_parallel/schedules.py:964-970)."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from roofline.errors import SpecError
from roofline.specs.framework import FRAMEWORK_DIR, framework_from_dict, load_framework
from roofline.specs.model import ModelSpec, MoESpec
from roofline.specs.plan import Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.training.step import evaluate_plan

MEGATRON = load_framework("megatron")
# a wide MoE model: every phase's compute is longer than its all-to-all inside one NVLink node
WIDE = ModelSpec(
    name="wide-moe-test",
    n_layers=8,
    d_model=8192,
    d_ff=8192,
    n_heads=64,
    n_kv_heads=8,
    d_head=128,
    vocab=32768,
    moe=MoESpec(n_experts=8, top_k=2, d_ff_expert=8192),
)
SEQ = 8192


def _sms(n: int):
    ep = dataclasses.replace(
        MEGATRON.expert_parallel, dispatch_sms=n, dispatch_sms_source="test" if n else ""
    )
    return dataclasses.replace(MEGATRON, expert_parallel=ep)


def _cost(plan: str, fw=MEGATRON, chips: int = 8, seqs: int = 128, model=WIDE):
    return evaluate_plan(
        model,
        parse_system(f"h100:{chips}"),
        Workload(seqs * SEQ, SEQ),
        parse_plan(plan),
        framework=fw,
    )


def test_compute_bound_phases_show_only_the_unpaired_passes():
    """Without a pipeline the first forward and the last backward run alone (1 of M passes
    each): with every phase longer than its all-to-all and no SMs held, one microbatch's
    all-to-alls show, whatever M is."""
    for m in (4, 8):
        c = _cost(f"ep=8,microbatch={m},remat=none,overlap_ep=1", _sms(0))
        assert c.exposed_time_s["ep"] == pytest.approx(c.comm_time_s["ep"] / m, rel=1e-9)


def test_the_dispatcher_sms_slow_the_compute_beside_it():
    """DeepEP's kernels hold dispatch_sms of the chip's SMs: a compute-bound phase with X
    seconds of all-to-all beside it lasts C + share·X."""
    m = 8
    c = _cost(f"ep=8,microbatch={m},remat=none,overlap_ep=1")
    share = MEGATRON.expert_parallel.dispatch_sms / parse_system("h100:8").chip.sm_count
    assert share == pytest.approx(20 / 132)
    want = c.comm_time_s["ep"] * (1 / m + (1 - 1 / m) * share)
    assert c.exposed_time_s["ep"] == pytest.approx(want, rel=1e-9)


def test_interleaved_warm_up_passes_run_alone():
    """pp=2, v=2 (4 layers per virtual stage): W = 2(pp-1) + (v-1)·pp + 1 = 5 of the M·v
    virtual-stage passes are warm-up forwards (and as many flush backwards)."""
    m, pp, v = 8, 2, 2
    plan = f"ep=4,pp={pp},microbatch={m},remat=none,schedule=interleaved,virtual={v},overlap_ep=1"
    c = _cost(plan, _sms(0))
    w = 2 * (pp - 1) + (v - 1) * pp + 1
    assert c.exposed_time_s["ep"] == pytest.approx(c.comm_time_s["ep"] * w / (m * v), rel=1e-9)


def test_overlap_never_loses_and_comm_bound_phases_show_their_excess():
    """Across nodes (EP over 2 nodes of 8, a narrow model) the all-to-alls outlast their
    phases: the schedule still shows no more than the serial all-to-alls, and more than the
    SM share alone."""
    narrow = dataclasses.replace(
        WIDE,
        d_ff=512,
        n_heads=16,
        n_kv_heads=2,
        moe=MoESpec(n_experts=64, top_k=8, d_ff_expert=128),
    )
    on = _cost("ep=16,microbatch=8,remat=none,overlap_ep=1", chips=16, model=narrow)
    off = _cost("ep=16,microbatch=8,remat=none,overlap_ep=0", chips=16, model=narrow)
    share = 20 / 132
    assert (
        on.exposed_time_s["ep"] < off.exposed_time_s["ep"] == pytest.approx(off.comm_time_s["ep"])
    )
    assert on.exposed_time_s["ep"] > on.comm_time_s["ep"] * (1 / 8 + (1 - 1 / 8) * share) * 1.01
    assert on.step_time_s < off.step_time_s


def test_dispatch_sms_is_the_stacks_setting_with_its_source():
    """A count without the setting it restates, or beyond any GPU, is refused."""
    raw = tomllib.loads((FRAMEWORK_DIR / "megatron.toml").read_text())
    raw["expert_parallel"].pop("dispatch_sms_source")
    with pytest.raises(SpecError, match="dispatch_sms"):
        framework_from_dict(raw, "megatron-test")
    raw["expert_parallel"]["dispatch_sms_source"] = "x"
    raw["expert_parallel"]["dispatch_sms"] = 10_000
    with pytest.raises(SpecError, match="dispatch_sms"):
        framework_from_dict(raw, "megatron-test")
