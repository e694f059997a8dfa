"""Optimizer-state offload (ZeRO-Offload, issue 20 item 3/5's plan option): the host traffic
over each chip's host link, its overlap with the step's compute, the HBM it frees, and the
break-even batch `core.limits` states (C/(3·W_host) per chip when a chip holds a whole replica's
state, 1/N of it when ZeRO shards the state over N chips)."""

from __future__ import annotations

import json

import pytest

from roofline.cli import main
from roofline.core.ledger import count_params
from roofline.core.limits import offload_min_tokens_per_chip
from roofline.errors import PlanError
from roofline.specs.efficiency import PEAK
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.offload import offload_optimizer
from roofline.training.step import Workload, evaluate_plan, mfu_peak, parse_plan

M70 = load_model("llama-3-70b")
M8 = load_model("llama-3-8b")


def _cost(model, system, plan, batch=4096, seq=512):
    return evaluate_plan(
        model,
        parse_system(system),
        Workload(batch, seq),
        parse_plan(plan),
        efficiency=PEAK,
        framework="ideal",
    )


def test_fsdp_state_moves_to_host_and_the_plan_fits():
    c = _cost(M70, "h100:8", "fsdp=8")
    o = offload_optimizer(M70, c)
    assert not c.fits and o.fits
    total = count_params(M70).total
    assert o.params_offloaded == pytest.approx(total / 8, rel=1e-9)
    assert o.state_bytes == pytest.approx(8 * total / 8, rel=1e-9)  # adam-bf16: 8 B/param
    assert o.memory_per_chip_bytes == pytest.approx(c.memory_per_chip_bytes - o.state_bytes)
    assert o.fits_host is True


def test_host_traffic_is_two_bytes_per_param_each_way_over_the_host_link():
    c = _cost(M70, "h100:8", "fsdp=8")
    o = offload_optimizer(M70, c)
    W = parse_system("h100:8").host_bw_bytes_per_s
    assert o.host_transfer_s == pytest.approx(2 * o.params_offloaded / W)
    assert o.exposed_s == pytest.approx(max(0.0, o.host_transfer_s - c.compute_time_s))
    assert o.step_time_s == pytest.approx(c.step_time_s - c.optimizer_time_s + o.exposed_s)


def test_small_batches_expose_the_host_link():
    """256 tokens per chip of compute (~140 ms) cannot hide 276 ms of PCIe."""
    c = _cost(M70, "h100:8", "fsdp=8", batch=2048, seq=256)
    o = offload_optimizer(M70, c)
    assert o.exposed_s > 0
    assert o.exposed_s == pytest.approx(o.host_transfer_s - c.compute_time_s)


def test_breakeven_is_where_the_model_flops_time_equals_the_host_traffic():
    c = _cost(M70, "h100:8", "fsdp=8")
    o = offload_optimizer(M70, c)
    C = mfu_peak(parse_system("h100:8").chip)
    t_math = 6 * count_params(M70).active * o.breakeven_tokens_per_chip / C
    assert t_math == pytest.approx(o.host_transfer_s, rel=1e-9)


def test_unsharded_state_is_the_limits_per_chip_formula():
    """Pure DP without ZeRO: every chip holds a whole replica's state, so the break-even is
    core.limits' C/(3·W_host) tokens per chip (up to active vs total parameters)."""
    c = _cost(M8, "h100:8", "dp=8,zero=0,microbatch=8", batch=2**17, seq=1024)
    o = offload_optimizer(M8, c)
    sysm = parse_system("h100:8")
    limit = offload_min_tokens_per_chip(mfu_peak(sysm.chip), sysm.host_bw_bytes_per_s)
    p = count_params(M8)
    assert o.breakeven_tokens_per_chip == pytest.approx(limit * p.total / p.active, rel=1e-9)
    # ZeRO-1 over the 8 replicas: each chip holds 1/8 of the state, the limit falls 8x
    z1 = offload_optimizer(M8, _cost(M8, "h100:8", "dp=8,zero=1,microbatch=8", 2**17, 1024))
    assert z1.breakeven_tokens_per_chip == pytest.approx(o.breakeven_tokens_per_chip / 8)


def test_a_system_without_a_host_link_is_refused():
    c = _cost(M8, "gb300:8", "fsdp=8", batch=2**16, seq=1024)
    with pytest.raises(PlanError, match="host-link"):
        offload_optimizer(M8, c)


def test_cli(capsys):
    args = ["train", "--model", "llama-3-70b", "--system", "h100:8", "--framework", "ideal"]
    args += ["--plan", "fsdp=8", "--batch-tokens", "4096", "--seq", "512", "--tokens", "0"]
    assert main(args) == 0
    assert "optimizer offload" not in capsys.readouterr().out
    assert main([*args, "--offload-optimizer"]) == 0
    out = capsys.readouterr().out
    assert "optimizer offload (ZeRO-Offload):" in out and "(fits)" in out
    assert main([*args, "--offload-optimizer", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"] is False and doc["offload"]["fits"] is True
