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

The host's Adam update (`host_adam_s`): the host reads each gradient, reads and writes the
optimizer state, and writes the updated parameter, a = g + 2·s + p bytes per parameter of its
DRAM, and does 16 FLOPs on its CPUs (`core.limits.host_adam_s_per_param`, a roofline on the
host: the slower of host_dram_bw_bytes_per_s and host_flops_per_s, both the host's share per
chip in the chip or system file):

    T_adam = P_off · max(a / W_dram, 16 / C_host)

ZeRO-Offload's schedule (Ren et al. 2021, §4) runs the update on the CPU after the backward's
gradients arrive and before the next forward reads the parameters: it is on the critical path,
so the step pays it in full, `exposed = max(0, T_host − T_compute) + T_adam` (the paper's
one-step delayed update, which would overlap it, is not modelled; neither DeepSpeed's
`offload_optimizer` nor Megatron's `--optimizer-cpu-offload` turns it on). Where the records
give no host DRAM bandwidth or CPU rate, T_adam is not costed and the output says so.

Break-even: T_host equals the model FLOPs' time `6·N_active·(B/N)/C` at the per-chip batch
`core.limits.offload_min_tokens_per_chip(C, W_host)` = C/(3·W_host) scaled by the share of the
model whose state the chip holds, `P_off/N_active` (1 for pure data parallelism without ZeRO,
where every chip holds a whole replica's state; 1/N when the state is sharded over N chips, so
the whole batch B, not B/N, must exceed C/(3·W_host)); T_adam equals it at
`core.limits.offload_adam_min_tokens_per_chip` = C·t_adam/6 on the same scale.

The planner searches it (`SearchSpace.offload_optimizer`): a candidate that misses HBM only by
its optimizer state, which its host DRAM holds, is costed offloaded (`offload_terms` over the
family's arrays), and the plan it returns is an `OffloadedCost` (`offloaded_cost`). The
idealised machine searches it under `train --offload-optimizer`, and so do the stacks whose
framework record says `[data_parallel] optimizer_offload = true` (DeepSpeed ZeRO-Offload,
Megatron's `--optimizer-cpu-offload`); their launch writers write it.

Activation offload (`offload_activations`, the plan key `offload_activations=1`): the saved
activations a layer keeps for its backward pass (the plan's `activations` bytes, whatever the
remat policy saves) go to host DRAM as the forward produces them and come back as the backward
needs them — Megatron-LM's `--cpu-offloading` (megatron/core/transformer/transformer_config.py
`cpu_offloading`, Transformer Engine's `get_cpu_offload_context`: layer i's copy-out runs on a
side stream behind layer i+1's forward, its copy-in behind the backward of the layer above) and
MaxText's offloading remat policies (`remat_policy: custom` with `*: offload` names,
`save_and_offload_only_these_names` in MaxText/configs/base.yml). With one microbatch in flight
(no pipeline: Megatron refuses `cpu_offloading` with pipeline_model_parallel_size > 1) the
chip's activations A_all are one microbatch's. The last of the L layers is not offloaded: its
backward starts as its forward ends, so there is nothing to hide the copy behind (Megatron
requires cpu_offloading_num_layers < num_layers; its writer offloads L − 1):

    A = A_all · (L − 1)/L   moved from HBM to host DRAM
    out: M·A bytes during the forwards, in: M·A bytes during the backwards (2·M·A in all)
    T_out = M·A / W_host,  T_in = M·A / W_host
    exposed = max(0, T_out − T_compute/3) + max(0, T_in − 2·T_compute/3)

(the forward is a third of the step's model FLOPs and the backward two thirds, the book's
6·N·T split; the directions run in different passes, so full duplex does not merge them). HBM
sheds A; host DRAM must hold it (with any offloaded optimizer state).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from roofline.core.ledger import count_params
from roofline.core.limits import (
    host_adam_bytes_per_param,
    host_adam_s_per_param,
    offload_adam_min_tokens_per_chip,
    offload_min_tokens_per_chip,
)
from roofline.core.stack import stack_of
from roofline.errors import PlanError
from roofline.launch.capable import capabilities
from roofline.specs.framework import HostTraffic
from roofline.specs.model import ModelSpec
from roofline.training.step import StepCost, evaluate_plan, mfu_peak
from roofline.units import fmt_bytes, fmt_time


class _HostHeld:
    """What both offload records answer the same way: whether the chip's HBM holds what stays
    and host DRAM what moved (`host_held_bytes`), and their JSON with those verdicts."""

    memory_per_chip_bytes: float
    hbm_bytes: float
    host_dram_bytes_per_chip: float | None

    @property
    def host_held_bytes(self) -> float:
        raise NotImplementedError

    @property
    def fits(self) -> bool:
        return self.memory_per_chip_bytes <= self.hbm_bytes

    @property
    def fits_host(self) -> bool | None:
        h = self.host_dram_bytes_per_chip
        return None if h is None else self.host_held_bytes <= h

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["fits"], out["fits_host"] = self.fits, self.fits_host
        if self.fits_host is None:
            out["fits_host_reason"] = "no host DRAM size in the records"
        return out


@dataclass(frozen=True)
class Offloaded(_HostHeld):
    """One plan with its optimizer state in host memory (per chip unless named)."""

    params_offloaded: float  # P_off: parameters whose optimizer state this chip holds
    state_bytes: float  # moved from HBM to host DRAM
    grad_bytes_out: float  # per step, to the host
    param_bytes_in: float  # per step, back from the host
    host_bw_bytes_per_s: float
    host_transfer_s: float  # max of the two directions (full duplex)
    compute_time_s: float  # the window the traffic hides behind
    host_adam_s_per_param: float  # t_adam = max(a/W_dram, 16/C_host)
    host_adam_s: float  # T_adam, the host's update, on the critical path (0 when not costed)
    host_adam_reason: str | None  # why T_adam is not costed (None when it is)
    host_traffic: str  # the stack's schedule (HostTraffic): behind_compute or with_update
    exposed_s: float
    optimizer_time_saved_s: float  # the HBM update the chip no longer runs
    step_time_s: float
    memory_per_chip_bytes: float
    hbm_bytes: float
    host_dram_bytes_per_chip: float | None
    breakeven_tokens_per_chip: float
    adam_breakeven_tokens_per_chip: float | None
    tokens_per_chip: float
    base_step_time_s: float
    base_memory_per_chip_bytes: float

    @property
    def host_held_bytes(self) -> float:
        return self.state_bytes

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
            self._adam_line(),
            self._exposed_line(),
            f"step: {fmt_time(self.base_step_time_s)} − optimizer {fmt_time(self.optimizer_time_saved_s)}"
            f" + exposed {fmt_time(self.exposed_s)} = {fmt_time(self.step_time_s)}",
            f"break-even: B/N > C/(3·W_host) · P_off/N_active = "
            f"{self.breakeven_tokens_per_chip:.4g} tokens per chip "
            f"(asked {self.tokens_per_chip:.4g}: {side}; the limit counts model FLOPs, the "
            "step's compute window above adds recompute and attention)",
        ] + self._adam_breakeven_line()

    def _adam_line(self) -> str:
        if self.host_adam_reason:
            return f"host Adam: not costed ({self.host_adam_reason})"
        return (
            f"host Adam: T_adam = P_off·max(a/W_dram, 16/C_host) = "
            f"{self.params_offloaded:.4g} · {self.host_adam_s_per_param:.4g} s = "
            f"{fmt_time(self.host_adam_s)}"
        )

    def _exposed_line(self) -> str:
        h, a = fmt_time(self.host_transfer_s), fmt_time(self.host_adam_s)
        if self.host_traffic == HostTraffic.WITH_UPDATE:
            return (
                f"exposed (traffic at the step, pipelined with the host's update): "
                f"max(T_host, T_adam) = max({h}, {a}) = {fmt_time(self.exposed_s)}"
            )
        return (
            f"exposed (traffic behind compute, update on the critical path): max(0, T_host − "
            f"T_compute) + T_adam = max(0, {h} − {fmt_time(self.compute_time_s)}) + {a} = "
            f"{fmt_time(self.exposed_s)}"
        )

    def _adam_breakeven_line(self) -> list[str]:
        v = self.adam_breakeven_tokens_per_chip
        if v is None:
            return []
        side = "compute-dominated" if self.tokens_per_chip >= v else "host-Adam-bound"
        return [
            f"host Adam break-even: B/N > C·t_adam/6 · P_off/N_active = {v:.4g} tokens per chip "
            f"(asked {self.tokens_per_chip:.4g}: {side})"
        ]


def host_adam_per_param(system: Any, opt: Any) -> tuple[float, str | None]:
    """t_adam, the host's seconds per offloaded parameter (module docstring), and None — or 0.0
    and the reason it is not costed where the records lack the host's DRAM bandwidth or CPU
    rate."""
    W, Ch = system.host_dram_bw_bytes_per_s, system.host_flops_per_s
    if W is None or Ch is None:
        return 0.0, f"system {system.name} has no host DRAM bandwidth or host FLOP/s in the records"
    a = host_adam_bytes_per_param(opt.param_bytes, opt.grad_bytes, opt.state_bytes)
    return host_adam_s_per_param(a, W, Ch), None


def host_traffic_of(framework: Any) -> HostTraffic:
    """When the stack moves the offloaded optimizer's traffic: its framework record's
    `[data_parallel.optimizer_offload] host_traffic` (the idealised machine and a stack without
    the record: ZeRO-Offload's, behind compute)."""
    stack = stack_of(framework)
    off = None if stack.book else stack.framework.data_parallel.optimizer_offload
    return HostTraffic.BEHIND_COMPUTE if off is None else off.host_traffic


def offloads_with_fsdp(framework: Any) -> bool:
    """Whether the stack offloads on its fsdp axis too (its record's `with_fsdp`; the
    idealised machine does)."""
    stack = stack_of(framework)
    off = None if stack.book else stack.framework.data_parallel.optimizer_offload
    return off is None or off.with_fsdp


def stack_can_offload_activations(framework: Any) -> bool:
    """Whether the stack's launch file can keep activations on the host: the idealised machine
    can, a stack where launch/defaults/capabilities.toml's `switches` rule allows
    `offload_activations` (Megatron's --cpu-offloading, MaxText's offload remat policies)."""
    stack = stack_of(framework)
    if stack.book:
        return True
    caps = capabilities(stack.name)
    if caps is None:  # no launch file of ours says anything for it
        return False
    rule = caps.rules.get("switches")
    return rule is None or "offload_activations" in rule["allowed"]


def remats_offloading(framework: Any, remats: Any) -> np.ndarray:
    """Per remat policy of `remats`, whether the stack offloads activations under it (its
    capabilities.toml `offload_remat` rule; every policy where it has none)."""
    stack = stack_of(framework)
    caps = None if stack.book else capabilities(stack.name)
    rule = None if caps is None else caps.rules.get("offload_remat")
    return np.array([rule is None or r.kind.value in rule["allowed"] for r in remats], bool)


def offload_terms(
    opt: Any,
    state: Any,
    compute_s: Any,
    W_host: Any,
    adam_s_per_param: Any = 0.0,
    traffic: HostTraffic = HostTraffic.BEHIND_COMPUTE,
) -> tuple[Any, ...]:
    """Optimizer offload per chip, vectorised: (P_off, gradient bytes out, parameter bytes
    back, T_host, T_adam, exposed). T_host is a host-to-HBM load of one chip
    (`core.transfer.host_to_hbm`, bytes / W_host) for the larger direction (full duplex);
    T_adam = P_off·t_adam. ZeRO-Offload (`behind_compute`) streams the traffic behind compute
    and runs the update on the critical path: exposed = max(0, T_host − T_compute) + T_adam;
    Megatron's hybrid optimizer (`with_update`) moves it at the step, pipelined with the
    update: exposed = max(T_host, T_adam)."""
    state = np.asarray(state, float)
    p_off = state / opt.state_bytes if opt.state_bytes > 0 else np.zeros_like(state)
    g_out, p_in = opt.grad_bytes * p_off, opt.param_bytes * p_off
    t_host = np.maximum(g_out, p_in) / W_host
    t_adam = p_off * np.asarray(adam_s_per_param, float)
    if traffic is HostTraffic.WITH_UPDATE:
        exposed = np.maximum(t_host, t_adam)
    else:
        exposed = np.maximum(0.0, t_host - compute_s) + t_adam
    return p_off, g_out, p_in, t_host, t_adam, exposed


@dataclass(frozen=True, kw_only=True, repr=False)  # StepCost's one-line repr
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
    if cost.plan.degrees.fsdp > 1 and not offloads_with_fsdp(cost.framework):
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
    t_per, why = host_adam_per_param(system, opt)
    traffic = host_traffic_of(cost.framework)
    p_off, g_out, p_in, t_host, t_adam, exposed = (
        float(x) for x in offload_terms(opt, state, cost.compute_time_s, W, t_per, traffic)
    )
    n = system.n_chips
    active = count_params(model).active
    share = p_off / active if active > 0 else 0.0
    C = mfu_peak(system.chip)
    adam_be = None if why else offload_adam_min_tokens_per_chip(C, t_per) * share
    return Offloaded(
        params_offloaded=p_off,
        state_bytes=state,
        grad_bytes_out=g_out,
        param_bytes_in=p_in,
        host_bw_bytes_per_s=W,
        host_transfer_s=t_host,
        compute_time_s=cost.compute_time_s,
        host_adam_s_per_param=t_per,
        host_adam_s=t_adam,
        host_adam_reason=why,
        host_traffic=traffic.value,
        exposed_s=exposed,
        optimizer_time_saved_s=cost.optimizer_time_s,
        step_time_s=cost.step_time_s - cost.optimizer_time_s + exposed,
        memory_per_chip_bytes=cost.memory_per_chip_bytes - state,
        hbm_bytes=system.chip.fit_hbm_bytes,
        host_dram_bytes_per_chip=system.host_dram_bytes_per_chip,
        breakeven_tokens_per_chip=offload_min_tokens_per_chip(C, W) * share,
        adam_breakeven_tokens_per_chip=adam_be,
        tokens_per_chip=cost.workload.batch_tokens / n,
        base_step_time_s=cost.step_time_s,
        base_memory_per_chip_bytes=cost.memory_per_chip_bytes,
    )


@dataclass(frozen=True)
class ActivationsOffloaded(_HostHeld):
    """One plan with its saved activations in host memory (per chip; module docstring)."""

    activation_bytes: float  # A: one microbatch's saved activations, moved from HBM to host
    microbatches: int
    bytes_out: float  # M·A per step, HBM -> host during the forwards
    bytes_in: float  # M·A per step, host -> HBM during the backwards
    host_bw_bytes_per_s: float
    out_s: float
    in_s: float
    forward_window_s: float  # T_compute/3
    backward_window_s: float  # 2·T_compute/3
    exposed_s: float
    step_time_s: float
    memory_per_chip_bytes: float
    hbm_bytes: float
    host_bytes: float  # what host DRAM holds per chip: A plus any offloaded optimizer state
    host_dram_bytes_per_chip: float | None
    base_step_time_s: float
    base_memory_per_chip_bytes: float

    @property
    def host_held_bytes(self) -> float:
        return self.host_bytes

    def explain(self) -> list[str]:
        M, W = self.microbatches, self.host_bw_bytes_per_s
        host = (
            ""
            if self.fits_host is None
            else f"; host DRAM {fmt_bytes(self.host_dram_bytes_per_chip or 0.0)} per chip "
            + ("holds it" if self.fits_host else "DOES NOT hold it")
        )
        return [
            f"saved activations to host: A = {fmt_bytes(self.activation_bytes)} per chip{host}",
            f"memory per chip: {fmt_bytes(self.base_memory_per_chip_bytes)} - "
            f"{fmt_bytes(self.activation_bytes)} = {fmt_bytes(self.memory_per_chip_bytes)} of "
            f"{fmt_bytes(self.hbm_bytes)} ({'fits' if self.fits else 'DOES NOT FIT'})",
            f"host traffic per step: 2·M·A = 2 · {M} · {fmt_bytes(self.activation_bytes)} = "
            f"{fmt_bytes(self.bytes_out + self.bytes_in)}; each way M·A / W_host = "
            f"{fmt_bytes(self.bytes_out)} / {W:.3g} = {fmt_time(self.out_s)}",
            f"exposed: max(0, T_out − T_compute/3) + max(0, T_in − 2·T_compute/3) = "
            f"max(0, {fmt_time(self.out_s)} − {fmt_time(self.forward_window_s)}) + "
            f"max(0, {fmt_time(self.in_s)} − {fmt_time(self.backward_window_s)}) = "
            f"{fmt_time(self.exposed_s)}",
            f"step: {fmt_time(self.base_step_time_s)} + exposed {fmt_time(self.exposed_s)} = "
            f"{fmt_time(self.step_time_s)}",
        ]


def offloaded_activation_bytes(acts: Any, model: ModelSpec) -> Any:
    """A = A_all·(L − 1)/L: the saved activations offloaded (all but the last layer's)."""
    L = model.n_layers
    return np.asarray(acts, float) * (L - 1) / L if L > 0 else np.zeros_like(acts, float)


def activation_offload_terms(acts: Any, microbatches: Any, compute_s: Any, W_host: Any) -> tuple:
    """Activation offload per chip, vectorised: (bytes each way M·A, T_out, T_in, exposed)
    (module docstring)."""
    moved = np.asarray(acts, float) * microbatches
    t = moved / W_host
    compute = np.asarray(compute_s, float)
    exposed = np.maximum(0.0, t - compute / 3) + np.maximum(0.0, t - 2 * compute / 3)
    return moved, t, t, exposed


def offload_activations(model: ModelSpec, cost: StepCost) -> ActivationsOffloaded:
    """`cost` (a plan costed by `evaluate_plan`, its optimizer offloaded or not) with its saved
    activations kept in host memory (module docstring). `model` names the plan's model."""
    base = cost.base if isinstance(cost, ActivationsOffloadedCost) else cost
    system, plan = base.system, base.plan
    W = system.host_bw_bytes_per_s
    if W is None:
        raise PlanError(
            f"system {system.name} has no host-link bandwidth",
            rule="activation offload moves the saved activations over each chip's host link",
            fix="choose a chip whose file gives pcie_bw_bytes_per_s, or set host_bw_bytes_per_s "
            "in a system file",
        )
    if plan.degrees.pp > 1:
        raise PlanError(
            f"activation offload of {model.name} with pp={plan.degrees.pp}",
            rule="activation offload is costed with one microbatch's activations in flight "
            "(Megatron-LM refuses --cpu-offloading with pipeline parallelism, "
            "megatron/core/transformer/transformer_config.py)",
            fix="drop offload_activations=1 or pp",
        )
    acts = float(offloaded_activation_bytes(base.memory_breakdown.get("activations", 0.0), model))
    M = plan.microbatches
    moved, t_out, t_in, exposed = (
        float(x) for x in activation_offload_terms(acts, M, base.compute_time_s, W)
    )
    return ActivationsOffloaded(
        activation_bytes=acts,
        microbatches=M,
        bytes_out=moved,
        bytes_in=moved,
        host_bw_bytes_per_s=W,
        out_s=t_out,
        in_s=t_in,
        forward_window_s=base.compute_time_s / 3,
        backward_window_s=2 * base.compute_time_s / 3,
        exposed_s=exposed,
        step_time_s=base.step_time_s + exposed,
        memory_per_chip_bytes=float(base.memory_per_chip_bytes) - acts,
        hbm_bytes=system.chip.fit_hbm_bytes,
        host_bytes=acts + float(base.memory_breakdown.get("optimizer_host", 0.0)),
        host_dram_bytes_per_chip=system.host_dram_bytes_per_chip,
        base_step_time_s=base.step_time_s,
        base_memory_per_chip_bytes=base.memory_per_chip_bytes,
    )


@dataclass(frozen=True, kw_only=True, repr=False)  # StepCost's one-line repr
class ActivationsOffloadedCost(StepCost):
    """A plan costed with its saved activations in host memory (`offload_activations=1`): step
    time, memory and rates offloaded, the activations under `activations_host` in the
    breakdown, the exposed host traffic under `host_activations` in the exposed times; `base`
    is the plan as costed without it."""

    base: StepCost

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {
            "offload_activations": True,
            "offload_optimizer": isinstance(self.base, OffloadedCost),
        }


def activations_offloaded_cost(model: ModelSpec, cost: StepCost) -> ActivationsOffloadedCost:
    """`cost` with its saved activations in host memory, fitting or not (`fits` and `reason`
    say which, host DRAM included)."""
    off = offload_activations(model, cost)
    speed = cost.step_time_s / off.step_time_s if off.step_time_s > 0 else 1.0
    bd = dict(cost.memory_breakdown) | {
        "activations": float(cost.memory_breakdown.get("activations", 0.0)) - off.activation_bytes,
        "activations_host": off.activation_bytes,
    }
    fits = off.fits and off.fits_host is not False
    reason = "" if fits else _acts_reason(off)
    same = {f: getattr(cost, f) for f in StepCost.__dataclass_fields__}
    return ActivationsOffloadedCost(
        **same
        | {
            "step_time_s": off.step_time_s,
            "exposed_comm_time_s": cost.exposed_comm_time_s + off.exposed_s,
            "exposed_time_s": dict(cost.exposed_time_s) | {"host_activations": off.exposed_s},
            "memory_per_chip_bytes": off.memory_per_chip_bytes,
            "memory_breakdown": bd,
            "fits": fits,
            "reason": reason,
            "mfu": cost.mfu * speed,
            "hfu": cost.hfu * speed,
            "mfu_compute_dtype": cost.mfu_compute_dtype * speed,
            "tokens_per_s": cost.tokens_per_s * speed,
        },
        base=cost,
    )


def _acts_reason(off: ActivationsOffloaded) -> str:
    if not off.fits:
        return (
            f"needs {fmt_bytes(off.memory_per_chip_bytes)} per chip with its activations on the "
            f"host, HBM holds {fmt_bytes(off.hbm_bytes)}"
        )
    return (
        f"host DRAM {fmt_bytes(off.host_dram_bytes_per_chip or 0.0)} per chip cannot hold "
        f"{fmt_bytes(off.host_bytes)} of offloaded state"
    )


def evaluate_offloaded(
    model: ModelSpec, system: Any, workload: Any, plan: Any, **kw: Any
) -> StepCost:
    """`evaluate_plan` for any plan, `offload_activations=1` included: the plan costed with its
    activations in HBM, then with them in host memory (`activations_offloaded_cost`; its
    `fits` and `reason` say whether it fits so). `kw`: evaluate_plan's options."""
    if not plan.offload_activations:
        return evaluate_plan(model, system, workload, plan, **kw)
    cost = evaluate_plan(model, system, workload, replace(plan, offload_activations=False), **kw)
    return activations_offloaded_cost(model, replace(cost, plan=plan))
