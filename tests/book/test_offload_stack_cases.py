"""Optimizer offload in the stacks that have it (issue 20): DeepSpeed's ZeRO-Offload
(`zero_optimization.offload_optimizer`) and Megatron's hybrid device optimizer
(`--optimizer-cpu-offload`). Their framework records say so (`[data_parallel.optimizer_offload]`,
with the schedule of the host traffic), the planner searches offload on them, the step prices
each stack's schedule, and their launch writers write the switch."""

from __future__ import annotations

import json

import pytest

from roofline.cli import main
from roofline.core.stack import stack_of
from roofline.launch.lines import training_launch
from roofline.specs.framework import HostTraffic
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.offload import OffloadedCost, host_traffic_of, offload_optimizer
from roofline.training.planner.search import plan_training
from roofline.training.planner.space import SearchSpace
from roofline.training.step import Workload, evaluate_plan, parse_plan

M70 = load_model("llama-3-70b")
H8 = parse_system("h100:8")
W = Workload(batch_tokens=4096, seq_len=512)
ON = SearchSpace(offload_optimizer=(False, True))


def _record(fw: str):
    return stack_of(fw).framework.data_parallel.optimizer_offload


def test_records_name_the_switch_and_the_schedule():
    ds, mg = _record("deepspeed"), _record("megatron")
    assert ds.host_traffic is HostTraffic.BEHIND_COMPUTE and "offload_optimizer" in ds.switch
    assert mg.host_traffic is HostTraffic.WITH_UPDATE and "--optimizer-cpu-offload" in mg.switch
    assert "hybrid_optimizer.py" in mg.source and "offload_config.py" in ds.source
    assert _record("torchtitan") is None
    assert host_traffic_of(None) is HostTraffic.BEHIND_COMPUTE  # the idealised machine


def _offloaded(fw: str):
    c = evaluate_plan(M70, H8, W, parse_plan("tp=8,optimizer=adam-fp32-master"), framework=fw)
    return c, offload_optimizer(M70, c)


def test_megatron_moves_the_traffic_at_the_step_with_the_update():
    """HybridDeviceOptimizer copies gradients to the host at the step and each parameter back
    after its CPU Adam, on side streams: the copies hide behind the host's update, not behind
    compute: exposed = max(T_host, T_adam)."""
    c, o = _offloaded("megatron")
    assert o.host_traffic == "with_update"
    assert o.exposed_s == pytest.approx(max(o.host_transfer_s, o.host_adam_s))
    assert o.step_time_s == pytest.approx(c.step_time_s - c.optimizer_time_s + o.exposed_s)
    assert any("max(T_host, T_adam)" in x for x in o.explain())


def test_deepspeed_streams_the_traffic_behind_compute():
    c, o = _offloaded("deepspeed")
    assert o.host_traffic == "behind_compute"
    assert o.exposed_s == pytest.approx(
        max(0.0, o.host_transfer_s - c.compute_time_s) + o.host_adam_s
    )


@pytest.mark.parametrize("fw", ["megatron", "deepspeed"])
def test_the_planner_finds_plans_that_fit_only_with_offload_on_the_stack(fw):
    kw = dict(space=ON, allow_sub_slices=False, efficient_size=False, framework=fw)
    res = plan_training(M70, H8, W, optimizer="adam-fp32-master", **kw)
    best = res.best
    assert isinstance(best, OffloadedCost) and best.fits and not best.base.fits
    off = offload_optimizer(M70, best)
    assert best.step_time_s == pytest.approx(
        best.base.step_time_s - best.base.optimizer_time_s + off.exposed_s
    )


def _launch(stack: str, plan: str, offload: bool = True):
    return training_launch(
        stack,
        model="llama-3-70b",
        plan=parse_plan(plan),
        seq_len=512,
        global_batch_sequences=8,
        offload_optimizer=offload,
    )


def test_megatron_writer_writes_the_records_switch():
    text = _launch("megatron", "tp=8,optimizer=adam-fp32-master")["text"]
    for flag in _record("megatron").switch.split(" --"):
        assert "--" + flag.lstrip("-") in text
    plain = _launch("megatron", "tp=8,optimizer=adam-fp32-master", offload=False)["text"]
    assert "optimizer-cpu-offload" not in plain


def test_deepspeed_writer_writes_zero_offload():
    doc = json.loads(_launch("deepspeed", "fsdp=8,remat=none,optimizer=adam-fp32-master")["text"])
    assert doc["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
    }
    z0 = _launch("deepspeed", "dp=8,zero=0,remat=none,optimizer=adam-fp32-master")
    assert z0["text"] is None and "ZeRO stage 0" in z0["reason"]


def test_a_stack_without_the_record_writes_no_offloaded_launch():
    out = _launch("torchtitan", "fsdp=8")
    assert out["text"] is None and "optimizer_offload" in out["reason"]


def test_cli_search_on_megatron_writes_the_offload_flags(capsys):
    argv = "train --model llama-3-70b --system h100:8 --framework megatron --profile peak "
    argv += "--batch-tokens 4096 --seq 512 --tokens 0 --no-sub-slices --optimizer adam-fp32-master"
    assert main(argv.split()) == 2
    assert "no plan fits" in capsys.readouterr().err
    assert main([*argv.split(), "--offload-optimizer"]) == 0
    out = capsys.readouterr().out
    assert "max(T_host, T_adam)" in out and "--optimizer-cpu-offload" in out


def test_readers_take_the_switch_back():
    """What the writers write reads back as the offload option (`roofline import` costs it);
    DeepSpeed's NVMe offload is still not costed and says so."""
    from roofline.launch.base import read_launch

    ds = _launch("deepspeed", "fsdp=8,remat=none,optimizer=adam-fp32-master")["text"]
    assert read_launch(ds, stack="deepspeed", chips=8).options["offload_optimizer"] == "true"
    mg = _launch("megatron", "tp=8,optimizer=adam-fp32-master")["text"]
    assert read_launch(mg, stack="megatron").options["offload_optimizer"] == "true"
    nvme = json.loads(ds)
    nvme["zero_optimization"]["offload_optimizer"]["device"] = "nvme"
    cfg = read_launch(json.dumps(nvme), stack="deepspeed", chips=8)
    assert "offload_optimizer" not in cfg.options
    assert any("nvme" in u.reason for u in cfg.unsupported)


def test_megatron_offloads_no_fsdp_plan():
    """Megatron-FSDP's optimizer refuses --optimizer-cpu-offload (the record's with_fsdp =
    false): the search never offloads an fsdp plan there, and the writer refuses one."""
    assert _record("megatron").with_fsdp is False and _record("deepspeed").with_fsdp is True
    from roofline.training.offload import offloaded_cost

    c = evaluate_plan(
        M70, H8, W, parse_plan("fsdp=2,tp=4,optimizer=adam-fp32-master"), framework="megatron"
    )
    assert not c.fits and offloaded_cost(M70, c) is None
    kw = dict(space=ON, allow_sub_slices=False, efficient_size=False, framework="megatron")
    res = plan_training(M70, H8, W, optimizer="adam-fp32-master", top_k=10, **kw)
    assert all(p.plan.degrees.fsdp == 1 for p in res.top if isinstance(p, OffloadedCost))
    out = _launch("megatron", "fsdp=2,tp=4,optimizer=adam-fp32-master")
    assert out["text"] is None and "Megatron-FSDP" in out["reason"]
