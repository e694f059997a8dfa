"""Optimizer offload searched by the planner (issue 20): an axis of the search space that
rescues the candidates which miss HBM by no more than their optimizer state (host DRAM holding
it), costed as `train --offload-optimizer` costs one plan (ZeRO-Offload, training.offload)."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.cli import main
from roofline.errors import PlanError
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import parse_optimizer
from roofline.specs.system import parse_system
from roofline.training.offload import OffloadedCost, offload_optimizer, offload_terms
from roofline.training.planner.search import plan_training
from roofline.training.planner.space import SearchSpace
from roofline.training.step import Workload, evaluate_plan, parse_plan

M70 = load_model("llama-3-70b")
H8 = parse_system("h100:8")
W = Workload(batch_tokens=4096, seq_len=512)
ON = SearchSpace(offload_optimizer=(False, True))


def _search(space, model=M70, system=H8, work=W):
    return plan_training(
        model, system, work, space=space, allow_sub_slices=False, efficient_size=False
    )


def test_finds_plans_that_fit_only_with_offload():
    """LLaMA-3 70B's 10 bytes/param do not fit 8 H100s at any plan; with the state in host
    DRAM (250 GB per chip on the DGX) they do."""
    with pytest.raises(PlanError, match="no plan fits"):
        _search(SearchSpace())
    res = _search(ON)
    best = res.best
    assert isinstance(best, OffloadedCost) and best.fits
    base, off = best.base, offload_optimizer(M70, best)
    assert not base.fits
    state = base.memory_breakdown["optimizer"]
    assert best.memory_per_chip_bytes == pytest.approx(base.memory_per_chip_bytes - state)
    assert best.memory_per_chip_bytes <= H8.chip.fit_hbm_bytes
    assert best.memory_breakdown["optimizer_host"] == state <= H8.host_dram_bytes_per_chip
    # the step as ZeRO-Offload costs it: minus the HBM update, plus the exposed host traffic
    assert best.step_time_s == pytest.approx(
        base.step_time_s - base.optimizer_time_s + off.exposed_s
    )
    assert best.to_dict()["offload_optimizer"] is True
    # ranked by the offloaded times the search computed (near-ties within 1% go to simpler plans)
    assert best.step_time_s <= min(c.step_time_s for c in res.top) * (1 + res.tie_tolerance)


def test_offload_terms_are_the_single_plans():
    """The vectorised terms the search uses and the explained single plan are one formula."""
    c = evaluate_plan(M70, H8, W, parse_plan("fsdp=8,microbatch=1"))
    off = offload_optimizer(M70, c)
    opt = parse_optimizer("adam-bf16")
    p_off, g, p, t_host, t_adam, exposed = offload_terms(
        opt,
        np.array([off.state_bytes] * 2),
        np.array([c.compute_time_s] * 2),
        6.4e10,
        off.host_adam_s_per_param,
    )
    assert p_off[0] == pytest.approx(off.params_offloaded)
    assert t_host[1] == pytest.approx(off.host_transfer_s)
    assert t_host[0] == pytest.approx(max(g[0], p[0]) / 6.4e10)
    assert t_adam[0] == pytest.approx(off.host_adam_s) and off.host_adam_s > 0
    assert exposed[0] == pytest.approx(off.exposed_s)


def test_a_plan_that_fits_is_not_offloaded():
    """Where plans fit, the axis changes nothing: the same best plan, not offloaded."""
    m8 = load_model("llama-3-8b")
    work = Workload(batch_tokens=65536, seq_len=2048)
    a, b = _search(SearchSpace(), m8, H8, work), _search(ON, m8, H8, work)
    assert not isinstance(b.best, OffloadedCost)
    assert b.best.plan == a.best.plan and b.best.step_time_s == a.best.step_time_s


def test_host_dram_must_hold_the_state(tmp_path):
    """A host with 20 GB of DRAM per GPU cannot hold 70 GB of optimizer state: no rescue."""
    p = tmp_path / "small-host.toml"
    p.write_text('base = "h100:8"\nhost_dram_bytes_per_chip = 2e10\n')
    with pytest.raises(PlanError, match="no plan fits"):
        _search(ON, M70, parse_system(p), W)


def test_cli(capsys):
    argv = "train --model llama-3-70b --system h100:8 --framework ideal --profile peak "
    argv += "--batch-tokens 4096 --seq 512 --tokens 0 --no-sub-slices"
    assert main(argv.split()) == 2
    assert "no plan fits" in capsys.readouterr().err
    assert main([*argv.split(), "--offload-optimizer"]) == 0
    out = capsys.readouterr().out
    assert "optimizer_host 70.6 GB" in out and "exposed          host" in out
    assert "optimizer offload (ZeRO-Offload):" in out


def test_searched_on_the_stacks_whose_record_offloads():
    """DeepSpeed (ZeRO-Offload) and Megatron (--optimizer-cpu-offload) have
    [data_parallel.optimizer_offload] in their framework records; torchtitan does not: the axis
    stays off there."""
    from roofline.core.stack import stack_of

    for fw in ("megatron", "deepspeed"):
        assert ON.for_stack(stack_of(fw), M70).offload_optimizer == (False, True)
        assert SearchSpace().for_stack(stack_of(fw), M70).offload_optimizer == (False,)
    assert ON.for_stack(stack_of("torchtitan"), M70).offload_optimizer == (False,)
    assert ON.for_stack(stack_of(None), M70).offload_optimizer == (False, True)
