"""The pricing context: what the walk asks the stack and the cost model, resolved once per
(stack, efficiency profile, chip) — issue 21 item 2.

The walk prices every op of every plan. It used to ask, per op and per plan, the stack for the
op's option policy, the remat kinds that rerun it and which of its collectives they rerun, and
the cost model (through the efficiency profile) for a GEMM's FLOP/s, the attention kernel's
and the vector units' rates. Those answers depend on the stack, the profile and the chip only
(and on the op's name, kind and per-chip shape), so `PricingContext` resolves each once and
keeps it; the walk reads them here and no longer climbs back up into `core.stack`, `core.cost`
or `specs.efficiency` for them.

`pricing_context(stack, eff, chip)` hands back the same context while the three objects are
the same (profiles, frameworks and stacks are cached records: `specs.filecache`,
`Efficiency.for_framework`, `stack_of`), so a planner search, a validation over many runs on
one chip and the top plans of a search share it. A profile built per call (`calibrate` moves
its parameters) gets a fresh context, as it must: every answer depends on it.

The rules themselves stay in their one home (`Stack.rerun_by`, `ComputeModel.flops_per_s`,
...); this module only remembers what they returned.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np

from roofline.core.collectives import CollectiveKind
from roofline.core.cost import ComputeModel
from roofline.core.ledger import Op
from roofline.core.sharding import GemmShape, OptionPolicy
from roofline.core.stack import Stack, policy_for_op
from roofline.memo import IdentityMemo
from roofline.specs.efficiency import Efficiency
from roofline.specs.framework import OverlapClass
from roofline.specs.plan import OpClass, RematKind

_NO_RERUN: frozenset[RematKind] = frozenset()


class PricingContext:
    """The stack's and the cost model's answers for one (stack, profile, chip), each computed
    on first use. `compute` is None for a walk priced without a profile (verify's rule)."""

    def __init__(self, stack: Stack, compute: ComputeModel | None) -> None:
        self.stack, self.compute = stack, compute
        self.launch_s = 0.0 if compute is None else compute.kernel_overhead_s
        # the stack's answers depend on the stack (and the chip) only: shared by every
        # context of the same stack and chip, whatever the profile (calibrate builds a profile
        # per parameter set; the stack's answers stay)
        chip = compute.chip if compute is not None else None
        shared = _stack_answers(stack, chip)
        self._policy: dict[tuple[int, str], tuple[OptionPolicy, OptionPolicy]] = shared[0]
        self._reruns: dict[tuple[str, Any], frozenset[RematKind]] = shared[1]
        self._rerun_coll: dict[tuple, frozenset[RematKind]] = shared[2]
        self._speed: dict[bool, float] = shared[3]
        self._rates: dict[tuple, Any] = {}

    # -- the stack ------------------------------------------------------------------------
    def policy(self, policy: OptionPolicy, op_name: str) -> OptionPolicy:
        """`policy_for_op(policy, op_name)` (the option policy the walk applies to the op)."""
        key = (id(policy), op_name)
        hit = self._policy.get(key)
        if hit is None or hit[0] is not policy:  # the policy object kept: its id stays its own
            hit = self._policy[key] = (policy, policy_for_op(policy, op_name))
        return hit[1]

    def rerun_by(self, op: Op) -> frozenset[RematKind]:
        """`Stack.rerun_by(op)`: it reads the op's name and kind only."""
        key = (op.name, op.kind)
        hit = self._reruns.get(key)
        if hit is None:
            hit = self._reruns[key] = self.stack.rerun_by(op)
        return hit

    def rerun_collective(
        self, reruns: frozenset[RematKind], cls: OverlapClass, kind: CollectiveKind
    ) -> frozenset[RematKind]:
        """The remat kinds of `reruns` that rerun a collective of class `cls` and `kind` inside
        an op they rerun (`Stack.reruns_collective`)."""
        if not reruns:
            return _NO_RERUN
        key = (reruns, cls, kind)
        hit = self._rerun_coll.get(key)
        if hit is None:
            hit = self._rerun_coll[key] = frozenset(
                k for k in reruns if self.stack.reruns_collective(k, cls, kind)
            )
        return hit

    def attention_speed(self, backward: bool) -> float:
        """The stack's attention kernel against the profile's reference kernel on the chip."""
        hit = self._speed.get(backward)
        if hit is None:
            chip = self.compute.chip if self.compute is not None else None
            hit = 1.0 if chip is None else self.stack.attention_speed(chip, backward)
            self._speed[backward] = hit
        return hit

    # -- the cost model -------------------------------------------------------------------
    def gemm_flops_per_s(self, op_class: OpClass, dtype: str, shape: GemmShape) -> Any:
        """`ComputeModel.flops_per_s` of a per-chip GEMM; remembered for a single plan's
        shapes (floats), computed for arrays of shapes (a family of plans)."""
        assert self.compute is not None
        dims = (shape.m, shape.n, shape.k, shape.count)
        if not all(isinstance(x, float | int) for x in dims):
            return self.compute.flops_per_s(op_class, dtype, shape)
        key = (op_class, dtype, *dims)
        hit = self._rates.get(key)
        if hit is None:
            hit = self._rates[key] = self.compute.flops_per_s(op_class, dtype, shape)
        return hit

    def gemm_rates(self, op_class: OpClass, dtype: str, shapes: GemmShape) -> np.ndarray:
        """`gemm_flops_per_s` of many single-plan shapes (`shapes` holds arrays) from one call
        of the efficiency curve: it is elementwise, so entry i is the rate a call for shape i
        alone returns, to the last bit (a test pins it)."""
        assert self.compute is not None
        rates = self.compute.flops_per_s(op_class, dtype, shapes)
        return np.broadcast_to(rates, np.shape(shapes.m))

    def matmul_peak(self, dtype: str) -> float:
        """A large GEMM's FLOP/s in `dtype` (what the algebra ranks options with)."""
        return self._rate(("matmul", dtype), lambda c: c.matmul_flops_per_s(dtype))

    def attention_flops_per_s(self, dtype: str, backward: bool, head_dim: float) -> Any:
        return self._rate(
            ("attention", dtype, backward, head_dim),
            lambda c: c.attention_flops_per_s(dtype, backward, head_dim),
        )

    def vector_flops_per_s(self, dtype: str) -> float:
        return self._rate(("vector", dtype), lambda c: c.vector_flops_per_s(dtype))

    def _rate(self, key: tuple, f) -> Any:
        hit = self._rates.get(key)
        if hit is None:
            assert self.compute is not None
            hit = self._rates[key] = f(self.compute)
        return hit


# (id(stack), id(chip)) -> (stack, chip, the stack's answers: policies, reruns, collective
# reruns, attention speeds), the objects kept so their ids stay their own
_STACK_ANSWERS: dict[tuple[int, int], tuple[Stack, Any, tuple[dict, dict, dict, dict]]] = {}


def _stack_answers(stack: Stack, chip: Any) -> tuple[dict, dict, dict, dict]:
    key = (id(stack), id(chip))
    hit = _STACK_ANSWERS.get(key)
    if hit is None or hit[0] is not stack or hit[1] is not chip:
        if len(_STACK_ANSWERS) >= _MAX_CONTEXTS:
            _STACK_ANSWERS.clear()
        hit = _STACK_ANSWERS[key] = (stack, chip, ({}, {}, {}, {}))
    return hit[2]


# (id(stack), id(eff), id(chip)) -> (stack, eff, chip, context): the objects kept, so an id
# cannot be reused by another object while its entry lives
_CONTEXTS: dict[tuple[int, int, int], tuple[Stack, Efficiency, Any, PricingContext]] = {}
_MAX_CONTEXTS = 64


def pricing_context(stack: Stack, eff: Efficiency, chip: Any) -> PricingContext:
    """The context of (stack, eff, chip), built once while these three objects live here."""
    key = (id(stack), id(eff), id(chip))
    hit = _CONTEXTS.get(key)
    if hit is not None and hit[0] is stack and hit[1] is eff and hit[2] is chip:
        return hit[3]
    if len(_CONTEXTS) >= _MAX_CONTEXTS:  # calibrate builds a profile per parameter set
        _CONTEXTS.clear()
    ctx = PricingContext(stack, ComputeModel(chip, eff))
    _CONTEXTS[key] = (stack, eff, chip, ctx)
    return ctx


# The profile's numbers a single-plan walk can be repriced under (`core.walk`): the GEMM
# fractions (the option choice's matmul rate, each GEMM's rate, the vector units' share of the
# matmul peak) and flash attention's; `sources` is prose.
GEMM_SIDE = frozenset({"mm_fraction"})
ATTENTION_SIDE = frozenset({"attn_fwd", "attn_bwd", "attn_softmax_flops", "attn_causal"})
REPRICED = GEMM_SIDE | ATTENTION_SIDE


def profile_key(eff: Efficiency, chip: Any) -> tuple[tuple, tuple, tuple]:
    """Every number of `eff` a walk on `chip` reads, by value, in three parts: (1) those not in
    `REPRICED` (every field of the chip's family but those — generically, so a field added
    later is in it — and the constants a chip no family covers takes); (2) the GEMM fractions;
    (3) flash attention's. Two profiles with the same key walk a plan to the same records;
    with the same first part, to records that differ only in the compute seconds the other
    two set. Remembered per (profile, chip) object."""
    return _PROFILE_KEYS((eff, chip), (), lambda: _profile_key(eff, chip))


def _profile_key(eff: Efficiency, chip: Any) -> tuple[tuple, tuple, tuple]:
    plain = (eff.matmul, eff.hbm, eff.link)
    fam = eff.family_for(chip)
    if fam is None:
        return plain, (), ()
    parts: tuple[list, list, list] = ([], [], [])
    for f in fields(fam):
        if f.name in ("sources", "_keys"):
            continue
        at = 1 if f.name in GEMM_SIDE else 2 if f.name in ATTENTION_SIDE else 0
        parts[at].append((f.name, _hashable(getattr(fam, f.name))))
    return (*plain, *parts[0]), tuple(parts[1]), tuple(parts[2])


def _hashable(v: Any) -> Any:
    return tuple(sorted(v.items())) if hasattr(v, "items") else v


_PROFILE_KEYS = IdentityMemo(256)


__all__ = ["REPRICED", "PricingContext", "pricing_context", "profile_key"]
