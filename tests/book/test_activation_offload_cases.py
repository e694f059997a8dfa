"""Activation offload (issue 20 item 3): the saved activations of all but the last layer kept in
host memory between forward and backward (Megatron's --cpu-offloading, MaxText's
remat_policy minimal_offloaded), as the plan key `offload_activations=1`: HBM sheds
A = A_all·(L − 1)/L, the host link carries M·A each way per step, behind a third of the
compute on the way out and two thirds on the way back; host DRAM must hold A."""

from __future__ import annotations

import json

import pytest

from roofline.cli import main
from roofline.errors import PlanError
from roofline.launch.base import read_launch
from roofline.launch.lines import training_launch
from roofline.specs.efficiency import PEAK
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Remat, RematKind, Strategy
from roofline.specs.system import parse_system
from roofline.training.offload import (
    ActivationsOffloadedCost,
    activations_offloaded_cost,
    evaluate_offloaded,
    offload_activations,
)
from roofline.training.planner.search import plan_training
from roofline.training.planner.space import SearchSpace
from roofline.training.step import Workload, evaluate_plan, parse_plan

M8 = load_model("llama-3-8b")
H8 = parse_system("h100:8")
W = Workload(batch_tokens=8 * 16384, seq_len=8192)  # 16k tokens per chip: 73 GB saved, no remat


def _cost(plan: str, framework: str = "ideal"):
    return evaluate_plan(M8, H8, W, parse_plan(plan), efficiency=PEAK, framework=framework)


def test_the_plan_key_parses_prints_and_reads_back():
    p = parse_plan("fsdp=8,remat=none,offload_activations=1")
    assert p.offload_activations and "offload_activations=1" in str(p)
    assert parse_plan(str(p)) == p and p.to_dict()["offload_activations"] is True
    assert parse_plan("fsdp=8,offload_acts=on") == parse_plan("fsdp=8,offload_activations=1")
    assert not parse_plan("fsdp=8").offload_activations
    assert "offload_activations" not in str(parse_plan("fsdp=8"))
    with pytest.raises(PlanError, match="flags are 1/0"):
        parse_plan("fsdp=8,offload_activations=maybe")


@pytest.mark.parametrize("plan", ["fsdp=8,remat=none", "fsdp=8,remat=none,microbatch=2"])
def test_bytes_and_time_in_closed_form(plan):
    c = _cost(plan)
    o = offload_activations(M8, c)
    L, M = M8.n_layers, c.plan.microbatches
    A = c.memory_breakdown["activations"] * (L - 1) / L
    Wh = H8.host_bw_bytes_per_s
    assert o.activation_bytes == pytest.approx(A)
    assert o.bytes_out == o.bytes_in == pytest.approx(M * A)
    assert o.out_s == o.in_s == pytest.approx(M * A / Wh)
    Tc = c.compute_time_s
    exposed = max(0.0, M * A / Wh - Tc / 3) + max(0.0, M * A / Wh - 2 * Tc / 3)
    assert o.exposed_s == pytest.approx(exposed) and exposed > 0
    assert o.step_time_s == pytest.approx(c.step_time_s + exposed)
    assert o.memory_per_chip_bytes == pytest.approx(c.memory_per_chip_bytes - A)
    assert o.fits_host is (A <= H8.host_dram_bytes_per_chip)


def test_the_transfer_hides_when_the_compute_window_is_longer():
    """remat=full saves only the layer inputs (2·D bytes per token per layer): their copies
    hide behind the step's compute, nothing is exposed."""
    c = _cost("fsdp=8,remat=full")
    o = offload_activations(M8, c)
    assert o.out_s < c.compute_time_s / 3 and o.exposed_s == 0.0
    assert o.step_time_s == pytest.approx(c.step_time_s)


def test_a_plan_that_fits_only_with_it():
    c = _cost("fsdp=8,remat=none")
    assert not c.fits
    off = activations_offloaded_cost(M8, c)
    assert off.fits and not off.base.fits
    key = parse_plan("fsdp=8,remat=none,offload_activations=1")
    with pytest.raises(PlanError, match="evaluate_offloaded"):  # never costed as if in HBM
        evaluate_plan(M8, H8, W, key, efficiency=PEAK)
    same = evaluate_offloaded(M8, H8, W, key, efficiency=PEAK, framework="ideal")
    assert same.plan == key and same.step_time_s == pytest.approx(off.step_time_s)
    assert same.memory_per_chip_bytes == pytest.approx(off.memory_per_chip_bytes)
    bd = off.memory_breakdown
    assert bd["activations_host"] == pytest.approx(offload_activations(M8, c).activation_bytes)
    assert bd["activations"] == pytest.approx(c.memory_breakdown["activations"] / M8.n_layers)
    assert off.exposed_time_s["host_activations"] == pytest.approx(off.step_time_s - c.step_time_s)
    assert off.tokens_per_s == pytest.approx(c.tokens_per_s * c.step_time_s / off.step_time_s)


def test_the_planner_finds_it_where_nothing_else_fits():
    space = dict(
        remats=(Remat(RematKind.NONE),),
        microbatches=(1,),
        strategies=(Strategy.FSDP, Strategy.DP),
    )
    kw = dict(efficiency=PEAK, allow_sub_slices=False, efficient_size=False)
    with pytest.raises(PlanError, match="no plan fits"):
        plan_training(M8, H8, W, space=SearchSpace(**space), **kw)
    on = SearchSpace(**space, offload_activations=(False, True))
    best = plan_training(M8, H8, W, space=on, **kw).best
    assert isinstance(best, ActivationsOffloadedCost) and best.plan.offload_activations
    assert best.fits and not best.base.fits
    again = evaluate_offloaded(M8, H8, W, best.plan, efficiency=PEAK)
    assert best.step_time_s == pytest.approx(again.step_time_s)
    assert best.memory_per_chip_bytes == pytest.approx(again.memory_per_chip_bytes)


def test_pipelines_and_hosts_without_a_link_are_refused():
    c = evaluate_plan(M8, H8, W, parse_plan("fsdp=4,pp=2,remat=none"), efficiency=PEAK)
    with pytest.raises(PlanError, match="pipeline"):
        offload_activations(M8, c)


_OPT = {"megatron": "adam-fp32-master", "maxtext": "adam-fp32", "torchtitan": "adam-fp32"}


def _launch(stack: str, plan: str):
    plan += f",optimizer={_OPT.get(stack, 'adam-fp32-master')}"  # the stack's own
    return training_launch(
        stack, model="llama-3-8b", plan=parse_plan(plan), seq_len=8192, global_batch_sequences=16
    )


def test_megatron_round_trip():
    text = _launch("megatron", "fsdp=8,remat=none,offload_activations=1")["text"]
    assert "--cpu-offloading " in text and f"--cpu-offloading-num-layers {M8.n_layers - 1}" in text
    assert read_launch(text, stack="megatron").plan.offload_activations
    plain = _launch("megatron", "fsdp=8,remat=none")["text"]
    assert "cpu-offloading" not in plain
    assert not read_launch(plain, stack="megatron").plan.offload_activations
    refused = _launch("megatron", "fsdp=8,remat=full,offload_activations=1")
    assert refused["text"] is None and "recomputation" in refused["reason"]


def test_maxtext_round_trip():
    text = _launch("maxtext", "fsdp=8,remat=matmuls,offload_activations=1")["text"]
    assert "minimal_offloaded" in text
    back = read_launch(text, stack="maxtext", chips=8).plan
    assert back.offload_activations and back.remat.kind is RematKind.MATMULS
    refused = _launch("maxtext", "fsdp=8,remat=full,offload_activations=1")
    assert refused["text"] is None and "minimal_offloaded" in refused["reason"]
    for stack in ("torchtitan", "deepspeed"):
        out = _launch(stack, "fsdp=8,remat=full,offload_activations=1")
        assert out["text"] is None and "offload_activations=1" in out["reason"]


def test_cli_costs_the_key_and_prints_it(capsys):
    argv = "train --model llama-3-8b --system h100:8 --profile peak --framework ideal "
    argv += "--batch-tokens 131072 --seq 8192 --tokens 0 --json --plan "
    assert main([*argv.split(), "fsdp=8,remat=none,offload_activations=1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    best = doc["result"]["top"][0] if "result" in doc else doc["top"][0]
    off = activations_offloaded_cost(M8, _cost("fsdp=8,remat=none"))
    assert best["fits"] and best["step_time_s"] == pytest.approx(off.step_time_s)
    assert best["plan"]["offload_activations"] is True


def test_which_stacks_search_it():
    """Where the stack's launch file can say it (capabilities.toml `switches`), under the remat
    policies it goes with (`offload_remat`)."""
    from roofline.training.offload import remats_offloading, stack_can_offload_activations

    assert [stack_can_offload_activations(s) for s in ("ideal", "megatron", "maxtext")] == [
        True,
        True,
        True,
    ]
    assert not any(stack_can_offload_activations(s) for s in ("torchtitan", "deepspeed"))
    remats = [Remat(RematKind.NONE), Remat(RematKind.MATMULS), Remat(RematKind.FULL)]
    assert remats_offloading("megatron", remats).tolist() == [True, False, False]
    assert remats_offloading("maxtext", remats).tolist() == [False, True, False]
    assert remats_offloading("ideal", remats).tolist() == [True, True, True]


def test_the_planner_finds_it_on_megatron_without_recompute():
    space = SearchSpace(
        remats=(Remat(RematKind.NONE),),
        microbatches=(1,),
        strategies=(Strategy.FSDP, Strategy.DP),
        offload_activations=(False, True),
    )
    kw = dict(efficiency=PEAK, allow_sub_slices=False, efficient_size=False)
    best = plan_training(
        M8, H8, W, space=space, framework="megatron", optimizer="adam-fp32-master", **kw
    ).best
    assert isinstance(best, ActivationsOffloadedCost) and best.plan.remat.kind is RematKind.NONE
    text = _launch("megatron", best.plan.describe().replace(",optimizer=adam-fp32-master", ""))
    assert "--cpu-offloading" in text["text"]


def test_readers_note_what_they_cost_otherwise():
    text = _launch("megatron", "fsdp=8,remat=none,offload_activations=1")["text"]
    other = text.replace(
        f"--cpu-offloading-num-layers {M8.n_layers - 1}", "--cpu-offloading-num-layers 8"
    )
    cfg = read_launch(other.replace("--bf16", "--num-layers 32 --bf16"), stack="megatron")
    assert cfg.plan.offload_activations
    assert any("all but the last of 32" in u.reason for u in cfg.unsupported)
    mt = _launch("maxtext", "fsdp=8,remat=matmuls")["text"].replace("minimal", "qkv_proj_offloaded")
    cfg = read_launch(mt, stack="maxtext", chips=8)
    assert not cfg.plan.offload_activations
    assert any("q/k/v" in u.reason for u in cfg.unsupported)
