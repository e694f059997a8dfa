"""Optimizer-state offload (ZeRO-Offload) as an option on a costed training plan.

ZeRO-Offload (Ren et al. 2021; not a book formula) keeps each chip's optimizer shard — the fp32
master weights and Adam moments, the plan's `optimizer` bytes — in host DRAM and runs the
update on the host. Each step every chip sends the gradients of its shard to the host and
receives the updated parameters back, over its own host link (full duplex: the two directions
overlap, so the link is busy for the larger one):

    P_off = optimizer bytes per chip / state bytes per parameter   (the chip's shard)
    T_host = max(grad_bytes, param_bytes) · P_off / W_host          (`offload_terms`)

The traffic streams while the step computes (gradients as the backward produces them, the
parameters back behind the next forward), so the step pays `max(0, T_host − T_compute)` and no
longer runs the optimizer update through HBM. HBM sheds the optimizer bytes; host DRAM must
hold them (`host_dram_bytes_per_chip`).

Break-even: T_host equals the model FLOPs' time `6·N_active·(B/N)/C` at the per-chip batch
`core.limits.offload_min_tokens_per_chip(C, W_host)` = C/(3·W_host) scaled by the share of the
model whose state the chip holds, `P_off/N_active` (1 for pure data parallelism without ZeRO,
where every chip holds a whole replica's state; 1/N when the state is sharded over N chips, so
the whole batch B, not B/N, must exceed C/(3·W_host)).

The planner searches it (`SearchSpace.offload_optimizer`): a candidate that misses HBM only by
its optimizer state, which its host DRAM holds, is costed offloaded (`offload_terms` over the
family's arrays), and the plan it returns is an `OffloadedCost` (`offloaded_cost`).

Not modelled: the host's Adam time (no host DRAM bandwidth or CPU rate in the records; under
ZeRO-Offload's one-step delayed update it overlaps the next step), activation offload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from roofline.core.ledger import count_params
from roofline.core.limits import offload_min_tokens_per_chip
from roofline.errors import PlanError
from roofline.specs.model import ModelSpec
from roofline.training.step import StepCost, mfu_peak
from roofline.units import fmt_bytes, fmt_time


@dataclass(frozen=True)
class Offloaded:
    """One plan with its optimizer state in host memory (per chip unless named)."""

    params_offloaded: float  # P_off: parameters whose optimizer state this chip holds
    state_bytes: float  # moved from HBM to host DRAM
    grad_bytes_out: float  # per step, to the host
    param_bytes_in: float  # per step, back from the host
    host_bw_bytes_per_s: float
    host_transfer_s: float  # max of the two directions (full duplex)
    compute_time_s: float  # the window the traffic hides behind
    exposed_s: float
    optimizer_time_saved_s: float  # the HBM update the chip no longer runs
    step_time_s: float
    memory_per_chip_bytes: float
    hbm_bytes: float
    host_dram_bytes_per_chip: float | None
    breakeven_tokens_per_chip: float
    tokens_per_chip: float
    base_step_time_s: float
    base_memory_per_chip_bytes: float

    @property
    def fits(self) -> bool:
        return self.memory_per_chip_bytes <= self.hbm_bytes

    @property
    def fits_host(self) -> bool | None:
        h = self.host_dram_bytes_per_chip
        return None if h is None else self.state_bytes <= h

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["fits"], out["fits_host"] = self.fits, self.fits_host
        if self.fits_host is None:
            out["fits_host_reason"] = "no host DRAM size in the records"
        return out

    def explain(self) -> list[str]:
        W = self.host_bw_bytes_per_s
        side = "above" if self.tokens_per_chip >= self.breakeven_tokens_per_chip else "below"
        host = (
            ""
            if self.fits_host is None
            else f"; host DRAM {fmt_bytes(self.host_dram_bytes_per_chip or 0.0)} per chip "
            + ("holds it" if self.fits_host else "DOES NOT hold it")
        )
        return [
            f"optimizer state to host: {fmt_bytes(self.state_bytes)} per chip "
            f"(P_off = {self.params_offloaded:.4g} parameters){host}",
            f"memory per chip: {fmt_bytes(self.base_memory_per_chip_bytes)} - "
            f"{fmt_bytes(self.state_bytes)} = {fmt_bytes(self.memory_per_chip_bytes)} of "
            f"{fmt_bytes(self.hbm_bytes)} ({'fits' if self.fits else 'DOES NOT FIT'})",
            f"host traffic per step: T_host = max(grads, params)·P_off / W_host = "
            f"max({fmt_bytes(self.grad_bytes_out)}, {fmt_bytes(self.param_bytes_in)}) / "
            f"{W:.3g} = {fmt_time(self.host_transfer_s)}",
            f"exposed: max(0, T_host − T_compute) = max(0, {fmt_time(self.host_transfer_s)} − "
            f"{fmt_time(self.compute_time_s)}) = {fmt_time(self.exposed_s)}",
            f"step: {fmt_time(self.base_step_time_s)} − optimizer {fmt_time(self.optimizer_time_saved_s)}"
            f" + exposed {fmt_time(self.exposed_s)} = {fmt_time(self.step_time_s)}",
            f"break-even: B/N > C/(3·W_host) · P_off/N_active = "
            f"{self.breakeven_tokens_per_chip:.4g} tokens per chip "
            f"(asked {self.tokens_per_chip:.4g}: {side}; the limit counts model FLOPs, the "
            "step's compute window above adds recompute and attention)",
        ]


def offload_terms(opt: Any, state: Any, compute_s: Any, W_host: Any) -> tuple[Any, ...]:
    """ZeRO-Offload per chip, vectorised: (P_off, gradient bytes out, parameter bytes back,
    T_host, exposed). T_host is a host-to-HBM load of one chip (`core.transfer.host_to_hbm`,
    bytes / W_host) for the larger direction (full duplex); the step pays what outlasts its
    compute, max(0, T_host − T_compute)."""
    state = np.asarray(state, float)
    p_off = state / opt.state_bytes if opt.state_bytes > 0 else np.zeros_like(state)
    g_out, p_in = opt.grad_bytes * p_off, opt.param_bytes * p_off
    t_host = np.maximum(g_out, p_in) / W_host
    return p_off, g_out, p_in, t_host, np.maximum(0.0, t_host - compute_s)


@dataclass(frozen=True, kw_only=True)
class OffloadedCost(StepCost):
    """A plan costed with its optimizer state in host memory (what the planner returns for a
    plan that fits only so): step time, memory and rates offloaded, the state under
    `optimizer_host` in the breakdown, the exposed host traffic under `host` in the exposed
    times; `base` is the plan as `evaluate_plan` costs it."""

    base: StepCost

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {"offload_optimizer": True}


def offloaded_cost(model: ModelSpec, cost: StepCost) -> OffloadedCost | None:
    """`cost` with its optimizer state offloaded, when that makes it fit HBM and host DRAM
    holds the state (None otherwise, or where the records lack host DRAM or the host link)."""
    if cost.system.host_bw_bytes_per_s is None:
        return None
    off = offload_optimizer(model, cost)
    if not (off.fits and off.fits_host):
        return None
    speed = cost.step_time_s / off.step_time_s
    bd = dict(cost.memory_breakdown) | {"optimizer": 0.0, "optimizer_host": off.state_bytes}
    same = {f: getattr(cost, f) for f in StepCost.__dataclass_fields__}
    return OffloadedCost(
        **same
        | {
            "step_time_s": off.step_time_s,
            "exposed_comm_time_s": cost.exposed_comm_time_s + off.exposed_s,
            "exposed_time_s": dict(cost.exposed_time_s) | {"host": off.exposed_s},
            "optimizer_time_s": 0.0,
            "memory_per_chip_bytes": off.memory_per_chip_bytes,
            "memory_breakdown": bd,
            "fits": True,
            "reason": "",
            "mfu": cost.mfu * speed,
            "hfu": cost.hfu * speed,
            "mfu_compute_dtype": cost.mfu_compute_dtype * speed,
            "tokens_per_s": cost.tokens_per_s * speed,
        },
        base=cost,
    )


def offload_optimizer(model: ModelSpec, cost: StepCost) -> Offloaded:
    """`cost` (a plan of `model` costed by `evaluate_plan`) with its optimizer state offloaded
    to host memory (module docstring); an `OffloadedCost` is explained from its base."""
    cost = cost.base if isinstance(cost, OffloadedCost) else cost
    system, plan = cost.system, cost.plan
    W = system.host_bw_bytes_per_s
    if W is None:
        raise PlanError(
            f"system {system.name} has no host-link bandwidth",
            rule="optimizer offload moves gradients and parameters over each chip's host link",
            fix="choose a chip whose file gives pcie_bw_bytes_per_s, or set host_bw_bytes_per_s "
            "in a system file",
        )
    opt = plan.optimizer
    state = float(cost.memory_breakdown.get("optimizer", 0.0))
    p_off, g_out, p_in, t_host, exposed = (
        float(x) for x in offload_terms(opt, state, cost.compute_time_s, W)
    )
    n = system.n_chips
    active = count_params(model).active
    share = p_off / active if active > 0 else 0.0
    C = mfu_peak(system.chip)
    return Offloaded(
        params_offloaded=p_off,
        state_bytes=state,
        grad_bytes_out=g_out,
        param_bytes_in=p_in,
        host_bw_bytes_per_s=W,
        host_transfer_s=t_host,
        compute_time_s=cost.compute_time_s,
        exposed_s=exposed,
        optimizer_time_saved_s=cost.optimizer_time_s,
        step_time_s=cost.step_time_s - cost.optimizer_time_s + exposed,
        memory_per_chip_bytes=cost.memory_per_chip_bytes - state,
        hbm_bytes=system.chip.fit_hbm_bytes,
        host_dram_bytes_per_chip=system.host_dram_bytes_per_chip,
        breakeven_tokens_per_chip=offload_min_tokens_per_chip(C, W) * share,
        tokens_per_chip=cost.workload.batch_tokens / n,
        base_step_time_s=cost.step_time_s,
        base_memory_per_chip_bytes=cost.memory_per_chip_bytes,
    )
