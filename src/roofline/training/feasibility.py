"""Feasibility: the rules a plan must satisfy before it is costed, shared by the planner and
the single-plan check (docs/architecture.md, "Feasibility").

Each rule is vectorised over candidate plans (numpy arrays of degrees) and names itself:
the planner counts its rejections under `Rule.name`, and `plan_problems` words the same rule
for one plan. The divisibility bounds (what tp, sp and ep must divide) are also what the
planner's search space enumerates the divisors of, so a degree outside them is never tried.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from roofline.specs.model import ModelSpec
from roofline.specs.plan import Plan, RematKind, Schedule, Strategy, Workload


def tp_must_divide(model: ModelSpec) -> int:
    """What tensor parallelism splits: the query heads, the dense MLP width (if the model has
    dense layers) and the expert and shared-expert widths (MoE). tp must divide all of them;
    KV heads may be replicated instead (rules.kv_heads_replicated)."""
    widths = [model.n_heads]
    if model.moe is None or model.n_dense_layers:
        widths.append(model.d_ff)
    if model.moe is not None:
        widths.append(model.moe.d_ff_expert)
        if model.moe.n_shared_experts:
            widths.append(
                (model.moe.d_ff_shared or model.moe.d_ff_expert) * model.moe.n_shared_experts
            )
    return math.gcd(*widths)


def ep_must_divide(model: ModelSpec) -> int:
    """Expert parallelism splits the routed experts (1 for a dense model: no ep)."""
    return model.moe.n_experts if model.moe is not None else 1


@dataclass(frozen=True)
class Arrays:
    """Candidate plans as arrays (one entry per candidate)."""

    deg: Mapping[Strategy, np.ndarray]
    microbatches: np.ndarray
    schedule: np.ndarray  # Schedule.code
    virtual: np.ndarray

    @staticmethod
    def of(plan: Plan) -> Arrays:
        return Arrays(
            {s: np.array([plan.degrees.of(s)]) for s in Strategy},
            np.array([plan.microbatches]),
            np.array([plan.schedule.code]),
            np.array([plan.virtual_stages]),
        )


@dataclass(frozen=True)
class Rule:
    """A named feasibility rule: `bad(model, workload, arrays)` is a mask of violating plans;
    `message(model, workload, arrays, i)` words the violation of plan i."""

    name: str
    bad: Callable[[ModelSpec, Workload, Arrays], np.ndarray]
    message: Callable[[ModelSpec, Workload, Arrays, int], str]


def _batch_ways(a: Arrays) -> np.ndarray:
    return a.deg[Strategy.DP] * a.deg[Strategy.FSDP] * a.deg[Strategy.EP] * a.microbatches


def _batch_bad(m: ModelSpec, w: Workload, a: Arrays) -> np.ndarray:
    seqs = w.sequences
    if not float(seqs).is_integer():
        return np.ones(len(a.microbatches), dtype=bool)
    return int(seqs) % _batch_ways(a) != 0


def _batch_message(m: ModelSpec, w: Workload, a: Arrays, i: int) -> str:
    out = (
        f"batch of {w.sequences:g} sequences is not divisible by "
        f"dp·fsdp·ep·microbatches = {int(_batch_ways(a)[i])}"
    )
    if not w.whole_sequences:
        near = ", ".join(f"{b:.0f}" for b in w.nearest_whole_batches())
        out += f" (a batch is a whole number of sequences: try --batch-tokens {near})"
    return out


def _interleaved_bad(m: ModelSpec, w: Workload, a: Arrays) -> np.ndarray:
    pp = a.deg[Strategy.PP]
    il = a.schedule == Schedule.INTERLEAVED.code
    return (pp > 1) & il & (m.n_layers % (pp * np.where(il, a.virtual, 1)) != 0)


def _tp_bad(m: ModelSpec, w: Workload, a: Arrays) -> np.ndarray:
    return tp_must_divide(m) % a.deg[Strategy.TP] != 0


def _ep_bad(m: ModelSpec, w: Workload, a: Arrays) -> np.ndarray:
    ep = a.deg[Strategy.EP]
    return (ep > 1) & (ep_must_divide(m) % ep != 0)


def _ep_message(m: ModelSpec, w: Workload, a: Arrays, i: int) -> str:
    ep = int(a.deg[Strategy.EP][i])
    if m.moe is None:
        return "ep>1 needs a MoE model"
    return f"experts={m.moe.n_experts} are not divisible by ep={ep}"


def _tp_message(m: ModelSpec, w: Workload, a: Arrays, i: int) -> str:
    tp = int(a.deg[Strategy.TP][i])
    if m.n_heads % tp:
        return f"heads={m.n_heads} are not divisible by tp={tp}"
    return (
        f"the MLP widths (d_ff={m.d_ff}"
        + (f", d_ff_expert={m.moe.d_ff_expert})" if m.moe else ")")
        + f" are not divisible by tp={tp}"
    )


RULES: tuple[Rule, ...] = (
    Rule("batch not divisible by dp·fsdp·ep·microbatches", _batch_bad, _batch_message),
    Rule(
        "sequence not divisible by sp",
        lambda m, w, a: w.seq_len % a.deg[Strategy.SP] != 0,
        lambda m, w, a, i: (
            f"sequence length {w.seq_len} is not divisible by sp={int(a.deg[Strategy.SP][i])}"
        ),
    ),
    Rule("heads or MLP width not divisible by tp", _tp_bad, _tp_message),
    Rule(
        "more pipeline stages than layers",
        lambda m, w, a: a.deg[Strategy.PP] > m.n_layers,
        lambda m, w, a, i: (
            f"pp={int(a.deg[Strategy.PP][i])} is more pipeline stages than layers={m.n_layers}"
        ),
    ),
    Rule("experts not divisible by ep", _ep_bad, _ep_message),
    Rule(
        "layers not divisible by pp·virtual stages",
        _interleaved_bad,
        lambda m, w, a, i: (
            f"layers={m.n_layers} are not divisible by pp·virtual="
            f"{int(a.deg[Strategy.PP][i] * a.virtual[i])}"
        ),
    ),
)


def _uneven_bad(m: ModelSpec, w: Workload, a: Arrays) -> np.ndarray:
    """A stack that lays out uneven stages still needs a layer (or the embedding / the loss,
    counted as one layer each) for every virtual stage."""
    pp = a.deg[Strategy.PP]
    il = a.schedule == Schedule.INTERLEAVED.code
    return (pp > 1) & il & (m.n_layers + EDGE_LAYERS < pp * np.where(il, a.virtual, 1))


# the embedding and the loss, counted as one layer each when a stack balances uneven stages
EDGE_LAYERS = 2

UNEVEN_RULE = Rule(
    "fewer layers than pp·virtual stages",
    _uneven_bad,
    lambda m, w, a, i: (
        f"layers={m.n_layers} (+ the embedding and the loss) are fewer than pp·virtual="
        f"{int(a.deg[Strategy.PP][i] * a.virtual[i])} stages"
    ),
)


def rules_for(uneven_stages: bool) -> tuple[Rule, ...]:
    """The rules a stack's plans satisfy: where the stack lays out uneven pipeline stages
    (Megatron's first/last or layout, torchtitan's balanced split) layers need not divide
    pp·virtual; every stage still needs work."""
    if not uneven_stages:
        return RULES
    return tuple(
        UNEVEN_RULE if r.name == "layers not divisible by pp·virtual stages" else r for r in RULES
    )


def violations(
    model: ModelSpec, workload: Workload, a: Arrays, rules=RULES
) -> list[tuple[Rule, Any]]:
    """(rule, mask of violating candidates) for every rule."""
    return [(r, np.asarray(r.bad(model, workload, a), dtype=bool)) for r in rules]


def _absent_modules(model: ModelSpec, plan: Plan) -> list[str]:
    """Partial recompute names only modules the model has (Megatron's TransformerConfig refuses
    mla_up_proj without multi-latent attention and the MoE modules on a dense model)."""
    has = {
        "mla_up_proj": model.mla is not None,
        "moe": model.moe is not None,
        "moe_act": model.moe is not None,
        "shared_experts": model.moe is not None and model.moe.n_shared_experts > 0,
    }
    missing = [m for m in plan.remat.modules if not has.get(m, True)]
    if plan.remat.kind != RematKind.MODULES or not missing:
        return []
    return [
        f"remat={plan.remat} recomputes {', '.join(missing)}, which {model.name} does not have "
        "(mla_up_proj needs multi-latent attention, moe/moe_act a MoE model, shared_experts "
        "shared experts); drop them from the remat list"
    ]


def plan_problems(
    model: ModelSpec, n_chips: int, workload: Workload, plan: Plan, *, uneven_stages: bool = False
) -> list[str]:
    """Why one plan cannot run on `n_chips` (empty: it can), one sentence per broken rule
    (`uneven_stages`: the stack lays out uneven pipeline stages, see `rules_for`)."""
    out = []
    if plan.degrees.n_chips != n_chips:
        out.append(
            f"plan uses {plan.degrees.n_chips} chips ({plan.describe()}) but the system has {n_chips}"
        )
    if not plan.expert_tp and plan.degrees.tp > 1 and not plan.sequence_parallel and model.moe:
        out.append(
            "expert_tp=0 (routed experts whole on every tensor rank) needs megatron_sp=1: each "
            "tensor rank routes only its own slice of the sequence (Megatron-LM asserts sequence "
            "parallelism for MoE under tensor parallelism); add megatron_sp=1 or drop expert_tp=0"
        )
    out += _absent_modules(model, plan)
    a = Arrays.of(plan)
    for rule, bad in violations(model, workload, a, rules_for(uneven_stages)):
        if bad[0]:
            out.append(rule.message(model, workload, a, 0))
    return out
