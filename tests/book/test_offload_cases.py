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
    assert o.exposed_s == pytest.approx(
        max(0.0, o.host_transfer_s - c.compute_time_s) + o.host_adam_s
    )
    assert o.step_time_s == pytest.approx(c.step_time_s - c.optimizer_time_s + o.exposed_s)


def test_small_batches_expose_the_host_link():
    """256 tokens per chip of compute (~140 ms) cannot hide 276 ms of PCIe."""
    c = _cost(M70, "h100:8", "fsdp=8", batch=2048, seq=256)
    o = offload_optimizer(M70, c)
    assert o.host_transfer_s > c.compute_time_s
    assert o.exposed_s == pytest.approx(o.host_transfer_s - c.compute_time_s + o.host_adam_s)


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


def test_host_adam_is_a_roofline_on_the_hosts_dram_and_cpus():
    """The DGX H100's two Xeon 8480C (8 channels of DDR5-4800 each, 56 cores x 2.0 GHz x 64
    fp32 FLOP/clk) serve 8 GPUs: 76.8 GB/s and 1.792 TFLOP/s per GPU. adam-bf16's update
    moves a = g + 2·s + p = 2 + 2·8 + 2 = 20 bytes and does 16 FLOPs per parameter: DRAM-bound
    (20/76.8e9 = 260 ps against 16/1.792e12 = 8.9 ps), on the critical path in full."""
    sysm = parse_system("h100:8")
    assert sysm.host_dram_bw_bytes_per_s == pytest.approx(2 * 8 * 4800e6 * 8 / 8)
    assert sysm.host_flops_per_s == pytest.approx(2 * 56 * 2.0e9 * 64 / 8)
    c = _cost(M70, "h100:8", "fsdp=8")
    o = offload_optimizer(M70, c)
    assert o.host_adam_s_per_param == pytest.approx(20 / 76.8e9, rel=1e-12)
    assert o.host_adam_s == pytest.approx(o.params_offloaded * 20 / 76.8e9, rel=1e-12)
    assert 2.2 < o.host_adam_s < 2.4  # 8.8e9 parameters' update per GPU: seconds, not ms
    assert o.host_adam_reason is None
    # the break-even on the same scale as the link's: model FLOPs time = T_adam
    C = mfu_peak(sysm.chip)
    t_math = 6 * count_params(M70).active * o.adam_breakeven_tokens_per_chip / C
    assert t_math == pytest.approx(o.host_adam_s, rel=1e-9)
    assert any("host Adam: T_adam" in x for x in o.explain())


def test_fp32_master_state_is_read_and_written_on_the_host():
    """adam-fp32-master: a = 4 + 2·12 + 2 = 30 bytes per parameter of host DRAM traffic."""
    c = _cost(M8, "h100:8", "fsdp=8,optimizer=adam-fp32-master", batch=2**16, seq=1024)
    o = offload_optimizer(M8, c)
    assert o.host_adam_s_per_param == pytest.approx(30 / 76.8e9, rel=1e-12)


def test_a_host_without_dram_bandwidth_records_says_so():
    """TPU v5p's file gives the host link (the book's 1.6e10) but not the host's DRAM or CPUs:
    T_adam is not costed, and the explanation and JSON say why."""
    c = _cost(M8, "v5p:2x2x2", "fsdp=8", batch=2**16, seq=1024)
    o = offload_optimizer(M8, c)
    assert o.host_adam_s == 0.0 and "no host DRAM bandwidth" in o.host_adam_reason
    assert o.adam_breakeven_tokens_per_chip is None
    assert any("host Adam: not costed" in x for x in o.explain())
    assert o.exposed_s == pytest.approx(max(0.0, o.host_transfer_s - c.compute_time_s))


def test_a_system_file_sets_the_hosts_side(tmp_path):
    p = tmp_path / "fat-host.toml"
    p.write_text('base = "h100:8"\nhost_dram_bw_bytes_per_s = 1.536e11\n')
    sysm = parse_system(p)
    assert sysm.host_dram_bw_bytes_per_s == 1.536e11 and sysm.host_flops_per_s == 1.792e12
    c = evaluate_plan(
        M70, sysm, Workload(4096, 512), parse_plan("fsdp=8"), efficiency=PEAK, framework="ideal"
    )
    o = offload_optimizer(M70, c)
    assert o.host_adam_s_per_param == pytest.approx(20 / 1.536e11, rel=1e-12)


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
