"""Training step cost: the sharding algebra applied to every ledger row, forward and backward.

A plan (mesh degrees + rule set + schedule) turns each ledger op into three sharded
einsums (forward, d_lhs, d_rhs; book training.md Appendix A). The algebra picks each
einsum's collectives; this module only adds them up on a timeline:

- compute: per-op roofline max(FLOPs/(peak·eff), bytes/(HBM·eff)), remat recompute added;
- FSDP weight gathers are prefetched a layer ahead and weight-gradient reductions run
  behind the backward pass: exposed = max(0, their time − compute);
- tensor/sequence-parallel and expert all-to-all collectives sit on the critical path
  (unless collective matmul overlaps TP with its matmul);
- data-parallel gradient reduction happens once per step, behind the last microbatch's backward;
- pipeline: bubble (p−1)/v over M microbatches (GPipe / 1F1B / interleaved) plus p2p hops;
- the optimizer update streams params, grads and state once through HBM.

All arithmetic is vectorised over candidate plans (numpy arrays, one entry per
candidate) so the planner evaluates thousands at once; `evaluate_plan` is the
one-candidate case with the details kept.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.cost import Reasons, Structure, layer_terms
from roofline.errors import PlanError, RooflineError
from roofline.ledger import Causal, count_params
from roofline.memory import OptimizerPolicy, Remat, RematKind, parse_optimizer, parse_remat
from roofline.rules import Degrees, Strategy, parse_degrees
from roofline.specs.efficiency import Efficiency, default_efficiency
from roofline.specs.model import ModelSpec
from roofline.specs.system import System
from roofline.units import DAY


class Schedule(enum.StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


@dataclass(frozen=True)
class Plan:
    """How to run a step: strategy degrees, microbatches, remat, ZeRO stage, pipeline schedule."""

    degrees: Degrees
    microbatches: int = 1
    remat: Remat = field(default_factory=Remat)
    zero: int = 1  # ZeRO stage over the `data` axis (the `fsdp` axis is stage 3 by definition)
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1  # interleaved schedule: model chunks per pipeline stage
    sequence_parallel: bool = False  # Megatron SP: TP AllReduce -> ReduceScatter + AllGather
    collective_matmul: bool = False  # overlap TP collectives with their matmuls
    overlap_ep: bool = False  # hide the expert all-to-alls behind compute (DeepSeek's DualPipe)
    optimizer: OptimizerPolicy = field(default_factory=lambda: parse_optimizer("adam-bf16"))

    def describe(self) -> str:
        d = self.degrees
        parts = [
            f"{s.value}={getattr(d, s.value)}" for s in Strategy if getattr(d, s.value) > 1
        ] or ["dp=1"]
        parts.append(f"microbatch={self.microbatches}")
        parts.append(f"remat={self.remat}")
        if d.dp > 1:
            parts.append(f"zero={self.zero}")
        if d.pp > 1:
            parts.append(
                f"schedule={self.schedule.value}"
                + (
                    f",virtual={self.virtual_stages}"
                    if self.schedule == Schedule.INTERLEAVED
                    else ""
                )
            )
        if self.sequence_parallel:
            parts.append("megatron_sp=1")
        if self.collective_matmul:
            parts.append("collective_matmul=1")
        if self.overlap_ep:
            parts.append("overlap_ep=1")
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = self.degrees
        return {
            "spec": self.describe(),
            **{s.value: getattr(d, s.value) for s in Strategy},
            "microbatches": self.microbatches,
            "remat": str(self.remat),
            "zero": self.zero,
            "schedule": self.schedule.value,
            "virtual_stages": self.virtual_stages,
            "sequence_parallel": self.sequence_parallel,
            "collective_matmul": self.collective_matmul,
            "overlap_ep": self.overlap_ep,
            "optimizer": self.optimizer.name,
            "mesh_axes": [list(a) for a in d.mesh_axes()],
        }


def parse_plan(text: str) -> Plan:
    """'fsdp=1024,tp=4,sp=2,microbatch=4,remat=full' -> Plan (unknown keys are errors)."""
    deg, rest = parse_degrees(text)
    kw: dict[str, Any] = {}
    for k, v in rest.items():
        try:
            if k in ("microbatch", "microbatches", "mb", "accum", "grad_accum"):
                kw["microbatches"] = int(v)
            elif k == "remat":
                kw["remat"] = parse_remat(v)
            elif k == "zero":
                kw["zero"] = int(v)
            elif k == "schedule":
                kw["schedule"] = Schedule(v.lower())
            elif k in ("virtual", "virtual_stages", "v"):
                kw["virtual_stages"] = int(v)
            elif k in ("megatron_sp", "sequence_parallel", "seqpar"):
                kw["sequence_parallel"] = v.lower() in ("1", "true", "yes", "on")
            elif k in ("collective_matmul", "cm"):
                kw["collective_matmul"] = v.lower() in ("1", "true", "yes", "on")
            elif k in ("overlap_ep", "dualpipe"):
                kw["overlap_ep"] = v.lower() in ("1", "true", "yes", "on")
            elif k in ("optimizer", "opt"):
                kw["optimizer"] = parse_optimizer(v)
            else:
                raise PlanError(
                    f"unknown plan key {k!r}",
                    rule="plan keys: dp, fsdp, tp, sp, ep, pp, microbatch, remat, zero, schedule, virtual, megatron_sp, collective_matmul, overlap_ep, optimizer",
                    fix='write e.g. --plan "fsdp=256,tp=4,microbatch=4,remat=full"',
                )
        except ValueError:
            raise PlanError(
                f"plan value {k}={v!r} cannot be read",
                rule="numbers are integers; schedule is gpipe, 1f1b or interleaved",
                fix=f"correct {k}",
            ) from None
    if kw.get("microbatches", 1) < 1:
        raise PlanError(
            f"microbatch={kw['microbatches']}",
            rule="at least one microbatch",
            fix="write microbatch=1 or more",
        )
    if kw.get("zero", 1) not in (0, 1, 2, 3):
        raise PlanError(
            f"zero={kw['zero']}", rule="ZeRO stages are 0, 1, 2 or 3", fix="write zero=1"
        )
    if kw.get("zero") == 3 and deg.dp > 1:  # ZeRO-3 over the data axis is FSDP
        deg = replace(deg, fsdp=deg.fsdp * deg.dp, dp=1)
    return Plan(deg, **kw)


@dataclass(frozen=True)
class Workload:
    """Global batch (tokens per optimizer step), sequence length, and run length in tokens."""

    batch_tokens: float
    seq_len: int
    total_tokens: float = 0.0
    causal: Causal = Causal.HALF

    def __post_init__(self) -> None:
        if self.seq_len <= 0 or self.batch_tokens <= 0 or self.total_tokens < 0:
            raise RooflineError(
                f"batch_tokens={self.batch_tokens}, seq_len={self.seq_len}, tokens={self.total_tokens}",
                rule="batch and sequence length are positive, run tokens non-negative",
                fix="give positive sizes",
            )
        if self.batch_tokens < self.seq_len:
            raise RooflineError(
                f"batch of {self.batch_tokens:g} tokens is shorter than one {self.seq_len}-token sequence",
                rule="a batch holds at least one sequence",
                fix="raise --batch-tokens or lower --seq",
            )
        for name, v, cap in (
            ("batch_tokens", self.batch_tokens, 1e13),
            ("seq_len", self.seq_len, 1e9),
            ("tokens", self.total_tokens, 1e18),
        ):
            if not math.isfinite(v) or v > cap:
                raise RooflineError(
                    f"{name} = {v:g} is beyond any training run",
                    rule=f"{name} is at most {cap:g}",
                    fix=f"check the units of {name} (e.g. 4M tokens per step, 15T tokens per run)",
                )

    @property
    def sequences(self) -> float:
        return self.batch_tokens / self.seq_len


# --------------------------------------------------------------------------------------
# Vectorised evaluation
# --------------------------------------------------------------------------------------


@dataclass
class Candidates:
    """Arrays (one entry per candidate) of the numeric plan choices within one Structure."""

    deg: dict[Strategy, np.ndarray]
    microbatches: np.ndarray
    zero: np.ndarray
    schedule: np.ndarray  # 0 gpipe, 1 1f1b, 2 interleaved
    virtual: np.ndarray
    system_idx: np.ndarray | None = (
        None  # which of several systems (sub-slices) each candidate runs on
    )
    remat_idx: np.ndarray | None = None  # index into the remat list given to evaluate_plans
    collective_matmul: np.ndarray | None = None  # bool per candidate
    overlap_ep: np.ndarray | None = None  # bool per candidate (default: exposed)

    def __len__(self) -> int:
        return len(self.microbatches)


@dataclass(frozen=True)
class StepArrays:
    """Per-candidate step results (arrays). Times in seconds, memory in bytes per chip."""

    step_time_s: np.ndarray
    compute_time_s: np.ndarray
    exposed_comm_time_s: np.ndarray
    bubble_time_s: np.ndarray
    bubble_fraction: np.ndarray
    optimizer_time_s: np.ndarray
    comm: Mapping[str, np.ndarray]  # raw time per bucket per step
    exposed: Mapping[str, np.ndarray]
    memory: Mapping[str, np.ndarray]
    memory_total: np.ndarray
    flops_per_chip: np.ndarray  # executed (incl. recompute) per step
    model_flops: float  # 6·N·tokens per step
    mfu: np.ndarray
    hfu: np.ndarray
    tokens_per_s: np.ndarray
    infeasible: np.ndarray  # bool
    reason: Any  # reason[i] -> str ("" if feasible); .counts() -> {reason: count}
    einsums: tuple = ()  # (op name, forward, d_lhs, d_rhs) EinsumPlans — kept for single plans
    terms: Mapping[str, np.ndarray] = field(
        default_factory=dict
    )  # raw per-step terms by phase (see step_terms)


def evaluate_plans(
    model: ModelSpec,
    system: System | list[System],
    workload: Workload,
    structure: Structure,
    cand: Candidates,
    *,
    eff: Efficiency | None = None,
    optimizer: OptimizerPolicy | None = None,
    keep_einsums: bool = False,
    merge_reductions: bool = True,
    remats: list[Remat] | None = None,
    ops: tuple[str, ...] | None = None,
) -> StepArrays:
    """Evaluate every candidate of one Structure at once (numpy arrays in, arrays out).

    `system` may be a list (sub-slices of one pod, same chip): `cand.system_idx` picks one
    per candidate. `remats` (with `cand.remat_idx`) and `cand.collective_matmul` vary those
    choices per candidate too; otherwise `structure.remat` / `structure.collective_matmul` apply.

    Two phases: the algebra runs once per distinct (system, mesh, microbatch) — the only
    inputs the einsums see — and the timeline then combines its sums with each candidate's
    remat, ZeRO stage, schedule and overlap choices.
    """
    systems = list(system) if isinstance(system, (list, tuple)) else [system]
    system = systems[0]
    eff = eff or default_efficiency(system.chip.vendor)
    opt = optimizer or parse_optimizer("adam-bf16")
    chip = system.chip
    n = len(cand)
    ones = np.ones(n)
    sys_idx = cand.system_idx if cand.system_idx is not None else np.zeros(n, dtype=int)
    remat_list = remats or [structure.remat]
    r_idx = cand.remat_idx if cand.remat_idx is not None else np.zeros(n, dtype=int)
    cm = (
        cand.collective_matmul
        if cand.collective_matmul is not None
        else np.full(n, structure.collective_matmul)
    )
    order = (Strategy.DP, Strategy.FSDP, Strategy.TP, Strategy.SP, Strategy.EP, Strategy.PP)
    key_mat = np.column_stack(
        [sys_idx] + [cand.deg.get(s, ones) for s in order] + [cand.microbatches]
    ).astype(np.int64)
    # distinct rows via one mixed-radix integer per row (much faster than unique(axis=0))
    radix = key_mat.max(axis=0) + 1
    flat_key = np.zeros(n, dtype=np.int64)
    for j in range(key_mat.shape[1]):
        flat_key = flat_key * int(radix[j]) + key_mat[:, j]
    _, first, inv = np.unique(flat_key, return_index=True, return_inverse=True)
    uniq = key_mat[first]
    inv = inv.reshape(-1)
    core = layer_terms(
        model,
        systems,
        workload,
        structure,
        uniq,
        eff,
        keep_einsums,
        merge_reductions,
        remat_list,
        ops,
    )

    def g(name: str) -> np.ndarray:
        return core[name][inv]

    deg = {s: cand.deg.get(s, ones).astype(float) for s in Strategy}
    M = cand.microbatches.astype(float)
    pp = deg[Strategy.PP]
    dp = deg[Strategy.DP]
    rc_all = np.array([r.kind in (RematKind.FULL, RematKind.CHECKPOINTS) for r in remat_list])[
        r_idx
    ].astype(float)
    rc_mm = np.array([r.kind == RematKind.MATMULS for r in remat_list])[r_idx].astype(float)
    reuse = np.array([r.kind == RematKind.NONE for r in remat_list])[r_idx]
    rc_ae = np.maximum(
        rc_all, rc_mm
    )  # attention + elementwise rerun under both FULL and MATMULS remat

    # ---- per microbatch (one pipeline stage) ------------------------------------------
    compute = (
        g("tf_mm") * (1 + rc_all)
        + g("tf_last")
        + g("tf_ae") * (1 + rc_ae)
        + g("tf_other")
        + g("tb")
    )
    compute_bwd = g("tb")
    flops_mb = (
        g("ff_mm") * (1 + rc_all)
        + g("ff_last")
        + g("ff_ae") * (1 + rc_ae)
        + g("ff_other")
        + g("fb")
    )
    tp = g("tp_f") * (1 + rc_all) + g("tp_f_last") + g("tp_b")
    act = g("act_f") * (1 + rc_all) + g("act_f_last") + g("act_b")
    sp = (
        g("sp_base") * 2 * (2 + rc_ae)
    )  # K and V: gathered forward (+ remat), reduce-scattered backward
    ep = g("ep_base") * (2 * (1 + rc_all) + 2)  # dispatch + combine, forward (+ remat) and backward
    # FSDP gathers weights again for the backward pass under remat; without remat the forward's
    # gathered weights are kept (XLA without scan does this; PyTorch FSDP and scanned stacks
    # re-gather: docs/verify.md names the difference)
    fsdp = g("fsdp_f") + g("fsdp_b") - np.where(reuse, g("fsdp_b_dup"), 0.0)
    hidden = fsdp + g("grad_mb")
    fsdp_exposed = np.maximum(0.0, hidden - compute)
    tp_exposed = np.where(cm, np.maximum(0.0, tp - compute), tp)
    oe = cand.overlap_ep if cand.overlap_ep is not None else np.zeros(n, dtype=bool)
    ep_exposed = np.where(oe, np.maximum(0.0, ep - compute), ep)
    t_mb = compute + tp_exposed + sp + ep_exposed + act + fsdp_exposed

    # ---- pipeline and step -------------------------------------------------------------
    v = np.where(cand.schedule == 2, cand.virtual, 1).astype(float)
    fill = np.where(pp > 1, (pp - 1) / v, 0.0)
    bubble_frac = fill / (M + fill)
    t_pipe = t_mb * (M + fill)
    bubble_t = t_mb * fill
    p2p = 2 * g("hop") * np.maximum(pp - 1, 0)
    grad_step_exposed = np.maximum(0.0, g("grad_step") - compute_bwd)

    # ---- memory per chip -----------------------------------------------------------------
    z = cand.zero
    params_local = g("params_local")
    p_bytes = params_local * opt.param_bytes
    g_bytes = params_local * opt.grad_bytes / np.where(z >= 2, dp, 1)
    o_bytes = params_local * opt.state_bytes / np.where(z >= 1, dp, 1)
    act_layer = np.choose(r_idx, [core[f"saved_{i}"][inv] for i in range(len(remat_list))])
    in_flight = np.where(pp > 1, np.where(cand.schedule == 0, M, np.minimum(M, pp)), 1.0)
    acts = act_layer * np.ceil(model.n_layers / pp) * in_flight  # the fullest stage
    # without remat the forward's gathered weights stay alive until their backward pass
    temps = np.where(reuse, g("gathered_all"), g("one_layer") + g("gathered")) + g("logits")
    mem = {
        "params": p_bytes,
        "grads": g_bytes,
        "optimizer": o_bytes,
        "activations": acts,
        "temporaries": temps,
    }
    mem_total = p_bytes + g_bytes + o_bytes + acts + temps
    opt_t = (p_bytes * 2 + g_bytes + o_bytes * 2) / (chip.hbm_bw_bytes_per_s * eff.hbm)

    step = t_pipe + p2p + grad_step_exposed + opt_t
    exposed_comm = (tp_exposed + sp + ep_exposed + act + fsdp_exposed) * M + p2p + grad_step_exposed
    n_chips = np.array([s.n_chips for s in systems], dtype=float)[sys_idx]
    model_flops = 6.0 * count_params(model).active * workload.batch_tokens
    peak = chip.peak("bf16")
    mfu = model_flops / (step * n_chips * peak)
    hfu = flops_mb * M / (step * peak)
    comm_step = {
        "fsdp": fsdp * M,
        "grad_mb": g("grad_mb") * M,
        "grad_step": g("grad_step"),
        "tp": tp * M,
        "sp": sp * M,
        "ep": ep * M,
        "act": act * M,
        "pp": p2p,
    }
    exposed = {
        "fsdp+grad": fsdp_exposed * M,
        "grad_step": grad_step_exposed,
        "tp": tp_exposed * M,
        "sp": sp * M,
        "ep": ep_exposed * M,
        "act": act * M,
        "pp": p2p,
    }

    mesh_bad = core["mesh_bad"][inv]
    over = (mem_total > chip.hbm_bytes) & ~mesh_bad
    infeasible = mesh_bad | over
    reason = Reasons(core["reason"], inv, mesh_bad, over, mem_total, chip.hbm_bytes)
    pk = chip.peak("bf16") * eff.matmul
    terms = {
        "t_math_forward_s": (g("ff_mm") + g("ff_last") + g("ff_ae") + g("ff_other")) * M / pk,
        "t_math_backward_s": g("fb") * M / pk,
        "t_math_recompute_s": (g("ff_mm") * rc_all + g("ff_ae") * rc_ae) * M / pk,
        "fsdp_forward_s": g("fsdp_f") * M,
        "tp_forward_s": (g("tp_f") + g("tp_f_last")) * M,
        # the first forward pass; remat's second forward runs inside the backward pass
        "comm_forward_s": (
            g("tp_f")
            + g("tp_f_last")
            + g("fsdp_f")
            + g("act_f")
            + g("act_f_last")
            + 2 * g("sp_base")
            + 2 * g("ep_base")
        )
        * M,
        "comm_backward_s": (
            g("tp_f") * rc_all
            + g("act_f") * rc_all
            + 2 * g("sp_base") * (1 + rc_ae)
            + 2 * g("ep_base") * (1 + rc_all)
            + g("tp_b")
            + g("act_b")
            + g("grad_mb")
        )
        * M
        + (g("fsdp_b") - np.where(reuse, g("fsdp_b_dup"), 0.0)) * M
        + g("grad_step"),
    }
    return StepArrays(
        step,
        compute * M,
        exposed_comm,
        bubble_t,
        bubble_frac,
        opt_t,
        comm_step,
        exposed,
        mem,
        mem_total,
        flops_mb * M,
        model_flops,
        mfu,
        hfu,
        workload.batch_tokens / step,
        infeasible,
        reason,
        core["einsums"],
        terms,
    )


# --------------------------------------------------------------------------------------
# One plan, with the details
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """One plan's training step: time, memory per chip (breakdown), MFU, run time and cost."""

    plan: Plan
    system: System
    workload: Workload
    step_time_s: float
    compute_time_s: float
    exposed_comm_time_s: float
    bubble_time_s: float
    bubble_fraction: float
    optimizer_time_s: float
    comm_time_s: Mapping[str, float]
    exposed_time_s: Mapping[str, float]
    memory_per_chip_bytes: float
    memory_breakdown: Mapping[str, float]
    fits: bool
    reason: str
    mfu: float
    hfu: float
    tokens_per_s: float
    flops_per_chip: float
    model_flops: float
    efficiency: Efficiency
    collectives: tuple[dict, ...] = ()

    @property
    def bottleneck(self) -> str:
        """The largest term of the step: compute, a communication bucket, bubble, or optimizer."""
        terms = {
            "compute": self.compute_time_s,
            "pipeline bubble": self.bubble_time_s,
            "optimizer update": self.optimizer_time_s,
        }
        for k, v in self.exposed_time_s.items():
            terms[f"exposed {k} communication"] = v
        return max(terms, key=lambda k: terms[k])

    @property
    def run_time_s(self) -> float:
        return self.workload.total_tokens / self.tokens_per_s if self.workload.total_tokens else 0.0

    @property
    def run_cost_usd(self) -> float | None:
        price = self.system.usd_per_chip_hour
        return None if price is None else self.run_time_s / 3600 * self.system.n_chips * price

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "step_time_s": self.step_time_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tokens_per_s": self.tokens_per_s,
            "memory_per_chip_bytes": self.memory_per_chip_bytes,
            "memory_breakdown": dict(self.memory_breakdown),
            "hbm_bytes": self.system.chip.hbm_bytes,
            "fits": self.fits,
            "reason": self.reason,
            "compute_time_s": self.compute_time_s,
            "exposed_comm_time_s": self.exposed_comm_time_s,
            "comm_time_s": dict(self.comm_time_s),
            "exposed_time_s": dict(self.exposed_time_s),
            "bubble_fraction": self.bubble_fraction,
            "bubble_time_s": self.bubble_time_s,
            "optimizer_time_s": self.optimizer_time_s,
            "bottleneck": self.bottleneck,
            "run_time_s": self.run_time_s,
            "run_time_days": self.run_time_s / DAY,
            "run_cost_usd": self.run_cost_usd,
            "flops_per_chip_per_step": self.flops_per_chip,
            "model_flops_per_step": self.model_flops,
            "efficiency": {
                "name": self.efficiency.name,
                "matmul": self.efficiency.matmul,
                "hbm": self.efficiency.hbm,
                "link": self.efficiency.link,
                "source": self.efficiency.source,
            },
            "collectives": list(self.collectives),
        }


def structure_of(plan: Plan, model: ModelSpec) -> Structure:
    active = frozenset(s for s in Strategy if getattr(plan.degrees, s.value) > 1)
    kv_rep = plan.degrees.tp > 1 and model.mla is None and model.n_kv_heads % plan.degrees.tp != 0
    return Structure(active, plan.remat, plan.sequence_parallel, plan.collective_matmul, kv_rep)


def candidates_of(plan: Plan) -> Candidates:
    d = plan.degrees
    return Candidates(
        {s: np.array([getattr(d, s.value)]) for s in Strategy},
        np.array([plan.microbatches]),
        np.array([plan.zero]),
        np.array([list(Schedule).index(plan.schedule)]),
        np.array([plan.virtual_stages]),
        overlap_ep=np.array([plan.overlap_ep]),
    )


def check_plan(model: ModelSpec, system: System, workload: Workload, plan: Plan) -> list[str]:
    """Reasons (possibly none) why a plan cannot run, before costing it."""
    d = plan.degrees
    out = []
    if d.n_chips != system.n_chips:
        out.append(
            f"plan uses {d.n_chips} chips ({plan.describe()}) but the system has {system.n_chips}"
        )
    seqs = workload.sequences
    batch_ways = d.dp * d.fsdp * d.ep
    if seqs != int(seqs) or int(seqs) % (batch_ways * plan.microbatches):
        out.append(
            f"batch of {seqs:g} sequences is not divisible by dp·fsdp·ep·microbatches = {batch_ways * plan.microbatches}"
        )
    if workload.seq_len % d.sp:
        out.append(f"sequence length {workload.seq_len} is not divisible by sp={d.sp}")
    if model.n_heads % d.tp:
        out.append(f"heads={model.n_heads} are not divisible by tp={d.tp}")
    if model.d_ff % d.tp:
        out.append(f"d_ff={model.d_ff} is not divisible by tp={d.tp}")
    if d.pp > model.n_layers:
        out.append(f"pp={d.pp} is more pipeline stages than layers={model.n_layers}")
    if d.ep > 1 and (model.moe is None or model.moe.n_experts % d.ep):
        out.append(
            "ep>1 needs a MoE model"
            if model.moe is None
            else f"experts={model.moe.n_experts} are not divisible by ep={d.ep}"
        )
    if (
        d.pp > 1
        and plan.schedule == Schedule.INTERLEAVED
        and model.n_layers % (d.pp * plan.virtual_stages)
    ):
        out.append(
            f"layers={model.n_layers} are not divisible by pp·virtual={d.pp * plan.virtual_stages}"
        )
    return out


def step_terms(
    model: ModelSpec,
    system: System,
    workload: Workload,
    plan: Plan,
    *,
    efficiency: Efficiency | None = None,
    ops: tuple[str, ...] | None = None,
) -> dict[str, float]:
    """Raw per-step terms of one plan, before any overlap: `t_math_s` (FLOPs / peak, the book's
    T_math) and the communication time of each bucket (fsdp, grad_mb, grad_step, tp, sp, ep, act, pp).

    No divisibility checks: the book's closed forms are continuous in the batch.
    """
    from roofline.specs.efficiency import PEAK

    eff = efficiency or PEAK
    r = evaluate_plans(
        model,
        system,
        workload,
        structure_of(plan, model),
        candidates_of(plan),
        eff=eff,
        optimizer=plan.optimizer,
        ops=ops,
    )
    out = {
        "t_math_s": float(r.flops_per_chip[0]) / (system.chip.peak("bf16") * eff.matmul),
        "compute_time_s": float(r.compute_time_s[0]),
    }
    out.update({k: float(v[0]) for k, v in r.terms.items()})
    out.update({k: float(v[0]) for k, v in r.comm.items()})
    out["comm_time_s"] = sum(float(v[0]) for v in r.comm.values())
    return out


def balance_batch(
    model: ModelSpec,
    system: System,
    plan: Plan,
    *,
    seq: int = 1,
    buckets: tuple[str, ...] | None = None,
    phase: str = "step",
    ops: tuple[str, ...] | None = None,
    efficiency: Efficiency | None = None,
    probe_tokens: float = 2.0**20,
) -> float:
    """Global batch (tokens) at which T_math equals the communication time (below it: comms-bound).

    `phase`: "forward" compares forward FLOPs with forward collectives (the book's FSDP and TP
    rooflines), "backward" backward FLOPs with backward collectives incl. gradient reductions
    (the book's DP roofline), "step" the whole step; `buckets` restricts the communication to
    some buckets (e.g. ("grad_step",) for the DCN data-parallel reduction). Both sides are
    affine in the batch for the book's strategies (weights move a fixed amount, activations an
    amount ∝ B), so two evaluations of the algebra give the crossing exactly.
    """
    if phase not in ("forward", "backward", "step"):
        raise PlanError(
            f"phase {phase!r}",
            rule="phase is forward, backward or step",
            fix="write phase='forward'",
        )

    def terms(b: float) -> tuple[float, float]:
        t = step_terms(model, system, Workload(b, seq), plan, efficiency=efficiency, ops=ops)
        if buckets is not None:
            comm = sum(t[k] for k in buckets)
        else:
            comm = t["comm_time_s"] if phase == "step" else t[f"comm_{phase}_s"]
        math_t = t["t_math_s"] if phase == "step" else t[f"t_math_{phase}_s"]
        return math_t, comm

    b1, b2 = probe_tokens, 2 * probe_tokens
    m1, c1 = terms(b1)
    m2, c2 = terms(b2)
    dm, dc = (m2 - m1) / (b2 - b1), (c2 - c1) / (b2 - b1)
    if dm <= dc:
        return math.inf  # communication grows as fast as compute: never compute-bound
    return max(0.0, (c1 - m1) / (dm - dc) + b1)


def evaluate_plan(
    model: ModelSpec,
    system: System,
    workload: Workload,
    plan: Plan,
    *,
    efficiency: Efficiency | None = None,
    assume_mfu: float | None = None,
) -> StepCost:
    """Cost one plan. Raises PlanError if it cannot run at all (indivisible, wrong chip count)."""
    problems = check_plan(model, system, workload, plan)
    if problems:
        raise PlanError(
            f"plan {plan.describe()} cannot run: " + "; ".join(problems),
            rule="every sharded dimension splits evenly and the mesh uses every chip",
            fix="change the degrees (e.g. run `roofline train` without --plan to search)",
        )
    eff = efficiency or default_efficiency(system.chip.vendor)
    r = evaluate_plans(
        model,
        system,
        workload,
        structure_of(plan, model),
        candidates_of(plan),
        eff=eff,
        optimizer=plan.optimizer,
        keep_einsums=True,
    )

    def f(a: Any) -> float:
        return float(np.asarray(a).reshape(-1)[0])

    step = f(r.step_time_s)
    tokens_s = f(r.tokens_per_s)
    mfu = f(r.mfu)
    if assume_mfu is not None:
        if not 0 < assume_mfu <= 1:
            raise PlanError(
                f"--assume-mfu {assume_mfu}",
                rule="MFU is a fraction in (0, 1]",
                fix="write e.g. --assume-mfu 0.4",
            )
        step = r.model_flops / (system.n_chips * system.chip.peak("bf16") * assume_mfu)
        tokens_s = workload.batch_tokens / step
        mfu = assume_mfu
    colls = _collective_rows(r.einsums)
    reason = r.reason[0]
    return StepCost(
        plan,
        system,
        workload,
        step,
        f(r.compute_time_s),
        f(r.exposed_comm_time_s),
        f(r.bubble_time_s),
        f(r.bubble_fraction),
        f(r.optimizer_time_s),
        MappingProxyType({k: f(v) for k, v in r.comm.items()}),
        MappingProxyType({k: f(v) for k, v in r.exposed.items()}),
        f(r.memory_total),
        MappingProxyType({k: f(v) for k, v in r.memory.items()}),
        not bool(r.infeasible[0]),
        reason,
        mfu,
        f(r.hfu) if assume_mfu is None else assume_mfu,
        tokens_s,
        f(r.flops_per_chip),
        r.model_flops,
        eff,
        colls,
    )


def _collective_rows(einsums: tuple) -> tuple[dict, ...]:
    rows = []
    for name, *plans in einsums:
        for p in plans:
            for c in p.best.comms:
                rows.append(
                    {
                        "op": name,
                        "phase": c.phase,
                        "kind": c.kind.value,
                        "axes": list(c.axes),
                        "tensor": c.tensor,
                        "bytes_per_chip": float(np.asarray(c.bytes_per_chip).reshape(-1)[0]),
                        "time_s": float(np.asarray(c.time_s).reshape(-1)[0]),
                        "before": c.before,
                        "after": c.after,
                    }
                )
    return tuple(rows)


def assumed_mfu_run(
    model: ModelSpec, workload: Workload, n_chips: int, peak_flops_per_s: float, mfu: float
) -> dict[str, float]:
    """Back-of-envelope run: 6·N·tokens / (chips · peak · MFU) (book applied-training.md)."""
    flops = 6.0 * count_params(model).total * workload.total_tokens
    t = flops / (n_chips * peak_flops_per_s * mfu)
    return {"total_flops": flops, "run_time_s": t, "run_time_days": t / DAY}
