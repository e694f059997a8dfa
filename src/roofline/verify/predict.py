"""What the algebra predicts for a `roofline verify` program: collectives and FLOPs per device.

The prediction is read off the *same* walk the training cost reads (`roofline.core.walk`): every
matmul row of `build_ledger(model)` under `rules_of(structure_of(plan))`, the forward, d_lhs
and d_rhs options the algebra chose, which of their collectives are paid here or with
another row (x gathered once for Q, K and V; the partial dx of one block reduced once; an
FSDP weight gathered once per step when nothing is rematerialised), the context-parallel K/V
gathers and the MoE dispatch/combine all-to-alls. Each collective record's count is its
copies times the multiplicity remat gives it (`rerun_by`), exactly as the timeline counts
it. Nothing here re-derives a formula.

Differences from the training cost, all because the verify program is one Transformer
layer (or a scanned stack) and nothing else:

* the `embed` and `unembed` rows are left out (the program's input is the layer input x,
  its loss is mean(out²));
* attention FLOPs are counted dense (`Causal.FULL`): the program computes the whole T×T
  score matrix and masks it;
* dtypes of weights, activations and K/V are the program's dtype (the training cost's
  ledger is bf16);
* the algebra prices collectives with bandwidth only (no latency floor) on an 8-GPU
  NVLink node (`h100:N`) by default: the program's dims are tiny, and a latency floor
  would make every option cost the same.

Bytes follow the shared convention: all-gather = gathered output per device,
reduce-scatter = unreduced input per device, all-reduce / all-to-all = the buffer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from roofline.core.collectives import CollectiveKind, unit_cost
from roofline.core.ledger import Causal, DtypePolicy, build_ledger
from roofline.core.mesh import make_mesh as make_cost_mesh
from roofline.core.rules import AXIS_OF, AXIS_ORDER, Degrees, Strategy, parse_degrees, rules_of
from roofline.core.sharding import EinsumPlan, Spec, plan_einsum
from roofline.core.stack import Stack, stack_of
from roofline.core.walk import AlgebraPricing, CollectiveRecord, Walk, WalkOptions, walk_ledger
from roofline.errors import VerifyError
from roofline.specs.framework import Regather
from roofline.specs.model import ModelSpec
from roofline.specs.plan import OpClass, Plan, Remat, RematKind
from roofline.specs.system import System, parse_system
from roofline.training.step import structure_of

# CollectiveKind (algebra) -> HLO opcode name (observed side)
HLO_KIND = {
    CollectiveKind.ALL_GATHER: "all-gather",
    CollectiveKind.REDUCE_SCATTER: "reduce-scatter",
    CollectiveKind.ALL_REDUCE: "all-reduce",
    CollectiveKind.ALL_TO_ALL: "all-to-all",
    CollectiveKind.PERMUTE: "collective-permute",
}

_SKIPPED_ROWS = ("embed", "unembed")


@dataclass(frozen=True)
class PredictedCollective:
    """One collective of the prediction: which ledger row and einsum it comes from, and how often."""

    op: str  # ledger row ("attn/q", "mlp/down", "moe/up", "attn/scores", or "matmul")
    einsum: str  # "forward" | "d_lhs" | "d_rhs" | "kv-gather" | "dispatch" | ...
    phase: str  # "forward" | "backward"
    # HLO name: all-gather | reduce-scatter | all-reduce | all-to-all | collective-permute
    kind: str
    axes: tuple[str, ...]  # mesh axes, in mesh order
    tensor: str
    dtype: str
    bytes_per_device: float  # one execution (shared convention)
    count: float  # executions per step
    before: str = ""
    after: str = ""
    why: str = ""

    @property
    def total_bytes_per_device(self) -> float:
        return self.bytes_per_device * self.count

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "einsum": self.einsum,
            "phase": self.phase,
            "kind": self.kind,
            "axes": list(self.axes),
            "tensor": self.tensor,
            "dtype": self.dtype,
            "bytes_per_device": self.bytes_per_device,
            "count": self.count,
            "total_bytes_per_device": self.total_bytes_per_device,
            "before": self.before,
            "after": self.after,
            "why": self.why,
        }


@dataclass(frozen=True)
class Prediction:
    """Predicted collectives and FLOPs per device for one verify program."""

    name: str
    kind: str  # "train_step" | "matmul"
    mesh: Mapping[str, int]
    collectives: tuple[PredictedCollective, ...]
    flops_per_device: float  # matmul + attention FLOPs per device per step (dot FLOPs)
    flops_by_op: Mapping[str, float]
    counted_once: tuple[
        PredictedCollective, ...
    ] = ()  # chosen by the algebra, counted once with another row
    einsums: tuple[tuple[str, EinsumPlan, ...], ...] = ()  # (op, fwd[, d_lhs, d_rhs]) EinsumPlans
    inputs: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    repredict: Callable[[Mapping[Any, int]], Prediction] | None = field(
        default=None, repr=False, compare=False
    )

    def totals(self) -> dict[tuple[str, tuple[str, ...]], float]:
        """Total bytes per device per step by (kind, mesh axes)."""
        out: dict[tuple[str, tuple[str, ...]], float] = {}
        for c in self.collectives:
            k = (c.kind, c.axes)
            out[k] = out.get(k, 0.0) + c.total_bytes_per_device
        return out

    def counts(self) -> dict[tuple[str, tuple[str, ...]], float]:
        out: dict[tuple[str, tuple[str, ...]], float] = {}
        for c in self.collectives:
            k = (c.kind, c.axes)
            out[k] = out.get(k, 0.0) + c.count
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "mesh": dict(self.mesh),
            "flops_per_device": self.flops_per_device,
            "flops_by_op": dict(self.flops_by_op),
            "collectives": [c.to_dict() for c in self.collectives],
            "counted_once": [c.to_dict() for c in self.counted_once],
            "inputs": dict(self.inputs),
            "notes": list(self.notes),
        }


# ----------------------------------------------------------------------------- pricing


class BandwidthCost:
    """comm_fn for the algebra: bytes x seconds-per-byte of `collective_cost` on a system mesh.

    No latency floor (the verify dims are tiny, so every option would cost the latency).
    `scale` multiplies every time (compute-first pricing uses 1e12: picoseconds).
    """

    def __init__(self, system: System, mesh_axes: Mapping[str, int], scale: float = 1.0) -> None:
        live = {a: int(n) for a, n in mesh_axes.items() if int(n) > 1} or {"X": 1}
        self.mesh = make_cost_mesh(system, live)
        self.live = set(live)
        self.scale = scale
        self._spb: dict[tuple[CollectiveKind, tuple[str, ...]], float] = {}

    def __call__(self, kind: CollectiveKind, nbytes: Any, axes: tuple[str, ...]) -> Any:
        axes = tuple(a for a in axes if a in self.live)
        if not axes:
            return 0.0 * np.asarray(nbytes, float)
        key = (kind, axes)
        if key not in self._spb:
            self._spb[key] = unit_cost(kind, axes, self.mesh).seconds_per_byte * self.scale
        return self._spb[key] * np.asarray(nbytes, float)


@dataclass(frozen=True)
class Pricing:
    """How the algebra ranks an einsum's options here: comm_fn, peak FLOP/s, HBM bytes/s.

    `compute-first` (default): FLOPs per chip decide first (1 FLOP/s), then collective
    bandwidth time (bytes x seconds-per-byte on an 8-GPU NVLink node, in picoseconds), HBM
    bytes not at all. That is the regime of the training sizes the cost model is for: at
    the verify program's tiny dims a real chip is communication-bound, and the algebra
    would rather gather an activation and a weight and compute the whole matmul on every
    device than all-reduce its output (the option XLA's partitioner never takes for a
    layer). `system=` prices on that system's chip instead (bandwidth only, no latency).
    """

    comm: BandwidthCost
    peak_flops_per_s: float
    hbm_bw_bytes_per_s: float
    label: str


def make_pricing(
    mesh_axes: Mapping[str, int], dtype: str, system: str | System | None = None
) -> Pricing:
    """The Pricing for a mesh (see `Pricing`); `system` None = compute-first."""
    n = math.prod(int(v) for v in mesh_axes.values()) or 1
    if system is None:
        sys_ = parse_system(f"h100:{n}")
        return Pricing(
            BandwidthCost(sys_, mesh_axes, 1e12),
            1.0,
            1e300,
            f"compute-first (collectives priced on {sys_.name})",
        )
    sys_ = _system_for(n, system)
    return Pricing(
        BandwidthCost(sys_, mesh_axes),
        _peak(sys_, dtype),
        sys_.chip.hbm_bw_bytes_per_s,
        f"{sys_.name} (bandwidth only)",
    )


def _system_for(n_devices: int, system: str | System | None) -> System:
    if isinstance(system, System):
        return system
    return parse_system(system or f"h100:{n_devices}")


def _f(x: Any) -> float:
    return float(np.asarray(x, float).reshape(-1)[0])


def _mesh_axes_order(axes: tuple[str, ...], order: tuple[str, ...]) -> tuple[str, ...]:
    rank = {a: i for i, a in enumerate(order)}
    return tuple(sorted(dict.fromkeys(axes), key=lambda a: rank.get(a, len(rank))))


# ----------------------------------------------------------------------------- train step


def _as_degrees(plan: str | Degrees | Mapping[str, int]) -> Degrees:
    if isinstance(plan, Degrees):
        return plan
    deg, rest = parse_degrees(plan)
    if rest:
        raise VerifyError(
            f"plan keys {sorted(rest)} are not strategies",
            rule="verify compiles degrees only: dp, fsdp, tp, sp, ep",
            fix='write e.g. --plan "fsdp=4,tp=2" (use --remat for rematerialisation)',
        )
    return deg


def predict_train_step(
    model: ModelSpec,
    plan: str | Degrees | Mapping[str, int],
    *,
    batch: int = 8,
    seq: int = 64,
    dtype: str = "bf16",
    n_layers: int = 1,
    remat: bool = False,
    fused_qkv: bool = False,
    capacity_factor: float = 1.0,
    system: str | None = None,
    choices: Mapping[tuple[str, str], int] | None = None,
    framework: str | None = None,
) -> Prediction:
    """Collectives and FLOPs per device the training cost predicts for `build_train_step(...)`.

    Same arguments as `roofline.verify.program.build_train_step` (the optimizer does not
    matter: its update is local). `fused_qkv` changes nothing here: the walk already reduces
    the partial dx of Q, K and V once. `system`: see `Pricing`. `choices` overrides the
    algebra's pick for some einsums, {(ledger row, "forward" | "d_lhs" | "d_rhs"): option
    index} (how `diff` tests whether XLA took one of the alternatives the algebra costed).
    `framework`: the stack whose option policy picks among the algebra's options and whose
    FSDP regather rule applies (e.g. "maxtext" for XLA; None: the algebra's cheapest option).
    """
    deg = _as_degrees(plan)
    _check_program(model, deg, n_layers)
    dt = _dtype_name(dtype)
    choices = dict(choices or {})
    stack = stack_of(framework)
    w, pricing, kv_rep = _walk_program(
        model, deg, int(batch), int(seq), dt, int(n_layers), bool(remat), system, choices, stack
    )
    rk = RematKind.FULL if remat else RematKind.NONE
    keeps = stack.fsdp_when(False)[0] != Regather.ALWAYS
    colls, once = _predicted(w, rk, dt, deg, keeps_gathers=keeps)
    notes = _notes(model, deg, stack, keeps, kv_rep)
    flops = _dot_flops(w, rk)
    inputs = {
        "model": model.name,
        "plan": _plan_str(deg),
        "batch": batch,
        "seq": seq,
        "dtype": dt,
        "n_layers": n_layers,
        "remat": remat,
        "fused_qkv": fused_qkv,
        "capacity_factor": capacity_factor,
        "pricing": pricing.label,
        "d_model": model.d_model,
        "moe": model.moe is not None,
        "choices": {f"{k[0]}:{k[1]}": v for k, v in choices.items()},
        "framework": stack.name,
    }
    name = (
        f"{model.name}:{_plan_str(deg)}"
        + (f":L{n_layers}" if n_layers > 1 else "")
        + (":remat" if remat else "")
        + (":fusedqkv" if fused_qkv else "")
        + f":{dt}"
    )

    def again(ch: Mapping[tuple[str, str], int]) -> Prediction:
        return predict_train_step(
            model,
            plan,
            batch=batch,
            seq=seq,
            dtype=dtype,
            n_layers=n_layers,
            remat=remat,
            fused_qkv=fused_qkv,
            capacity_factor=capacity_factor,
            system=system,
            choices=ch,
            framework=framework,
        )

    return Prediction(
        name,
        "train_step",
        dict(deg.mesh_axes()),
        tuple(colls),
        float(sum(flops.values())),
        flops,
        tuple(once),
        w.einsums,
        inputs,
        tuple(notes),
        again,
    )


def _notes(model: ModelSpec, deg: Degrees, stack: Stack, keeps: bool, kv_rep: bool) -> list[str]:
    notes = [
        "ledger rows embed and unembed left out: the program is the layer stack only",
        "norm scales (ledger row 'norms', elementwise) carry no predicted collectives",
    ]
    if not stack.book:
        notes.append(
            f"options chosen by the {stack.name} profile's policy; backward FSDP re-gathers "
            + ("kept" if not keeps else "skipped without remat")
        )
    if kv_rep:
        notes.append(
            f"kv_heads={model.n_kv_heads} not divisible by tp={deg.tp}: K/V projections replicated (rules.rules_of)"
        )
    return notes


def _check_program(model: ModelSpec, deg: Degrees, n_layers: int) -> None:
    if deg.pp > 1:
        raise VerifyError(
            f"pp={deg.pp}",
            rule="the verify program is one layer (or a scanned stack) without pipeline stages",
            fix="verify dp, fsdp, tp, sp and ep; pipeline costs are bubbles and hops, not collectives of a layer",
        )
    if model.mla is not None or model.linear is not None:
        raise VerifyError(
            f"model {model.name!r} uses {'MLA' if model.mla is not None else 'linear-attention layers'}",
            rule="the verify program builds GQA/MHA layers",
            fix="use a GQA model",
        )
    if int(n_layers) < 1:
        raise VerifyError(
            f"n_layers={n_layers}", rule="a program has at least one layer", fix="use --layers 1"
        )


def _walk_program(
    model: ModelSpec,
    deg: Degrees,
    batch: int,
    seq: int,
    dt: str,
    n_layers: int,
    remat: bool,
    system: str | None,
    choices: Mapping[tuple[str, str], int],
    stack: Stack,
) -> tuple[Walk, Pricing, bool]:
    """The walk of the program's layers: its dtype, dense attention, no embedding rows, the
    verify pricing, and the algebra's checks on (specs from rules, but tiny dims)."""
    m = model.with_(n_layers=n_layers)
    rk = Remat(RematKind.FULL) if remat else Remat(RematKind.NONE)
    structure = structure_of(Plan(degrees=deg, remat=rk), m)
    mesh_axes = dict(deg.mesh_axes())
    pricing = make_pricing(mesh_axes, dt, system)
    led = build_ledger(m, batch=1, seq=seq, causal=Causal.FULL, dtypes=DtypePolicy(dt, dt, dt))
    led = replace(led, ops=tuple(o for o in led.ops if o.name not in _SKIPPED_ROWS))
    mesh_sizes = {AXIS_OF[s]: float(deg.of(s)) for s in Strategy}
    algebra = AlgebraPricing(
        pricing.comm, None, pricing.peak_flops_per_s, pricing.hbm_bw_bytes_per_s
    )
    opts = WalkOptions(
        keep_einsums=True,
        trusted=False,
        choices=choices,
        remats=(rk,),
        policy=stack.policy,
        stack=stack,
    )
    w = walk_ledger(
        m, led, rules_of(structure, m), mesh_sizes, float(batch), pricing=algebra, options=opts
    )
    return w, pricing, structure.kv_replicated


def _predicted(
    w: Walk, remat: RematKind, dt: str, deg: Degrees, *, keeps_gathers: bool = True
) -> tuple[list[PredictedCollective], list[PredictedCollective]]:
    """The walk's chosen collectives: those paid here, and those counted with another row
    (`keeps_gathers`: without remat the backward pass reuses the forward's FSDP gathers)."""
    order = tuple(a for a in AXIS_ORDER if a in dict(deg.mesh_axes()))
    colls: list[PredictedCollective] = []
    once: list[PredictedCollective] = []
    for c in w.collectives:
        if not _b(c.chosen):
            continue
        copies = _f(c.copies)
        if not _b(c.counted):
            once.append(_pc(c, copies, order, _ONCE_WHY.get(c.kind, "counted once")))
        elif _b(c.reusable) and remat == RematKind.NONE and keeps_gathers:
            once.append(
                _pc(c, copies, order, "gathered weight kept from the forward pass (no remat)")
            )
        else:
            colls.append(_pc(c, copies * (1 + (remat in c.rerun_by)), order))
    return colls, once


def _dot_flops(w: Walk, remat: RematKind) -> dict[str, float]:
    """Matmul and attention FLOPs per device per step by ledger row (remat's reruns included)."""
    flops: dict[str, float] = {}
    for r in w.ops:
        if r.op_class in (OpClass.ELEMENTWISE, OpClass.EMBEDDING):
            continue
        mult = 1 + (remat in r.rerun_by)
        flops[r.op] = flops.get(r.op, 0.0) + _f(r.copies) * _f(r.flops_per_chip) * mult
    return flops


_ONCE_WHY = {
    CollectiveKind.ALL_GATHER: "the same array gathered the same way once per phase (walk.SharedCollectives)",
    CollectiveKind.ALL_REDUCE: "partial input-gradients of one block summed, then reduced once (walk.SharedCollectives)",
    CollectiveKind.REDUCE_SCATTER: "partial input-gradients of one block summed, then reduced once (walk.SharedCollectives)",
}


def _b(x: Any) -> bool:
    return bool(np.asarray(x).reshape(-1)[0])


def _peak(system: System, dt: str) -> float:
    """The chip's peak in the program's dtype (priced at bf16 where the chip lists none)."""
    return system.chip.peak(dt, fallback="bf16")


def _pc(
    c: CollectiveRecord, count: float, order: tuple[str, ...], why: str = ""
) -> PredictedCollective:
    return PredictedCollective(
        c.op,
        c.einsum,
        "forward" if c.pass_.value == "forward" else "backward",
        HLO_KIND[c.kind],
        _mesh_axes_order(tuple(c.axes), order),
        c.tensor,
        hlo_dtype(c.dtype),
        _f(c.bytes_per_chip),
        count,
        c.before,
        c.after,
        why or c.why,
    )


def hlo_dtype(name: str) -> str:
    """Ledger dtype name -> HLO element type (fp32 -> f32, fp16 -> f16, bf16 stays)."""
    return {"fp32": "f32", "fp16": "f16", "fp8": "f8e4m3fn", "int8": "s8"}.get(name, name)


def _plan_str(deg: Degrees) -> str:
    return deg.describe(empty="single")


def _dtype_name(dtype: Any) -> str:
    s = str(getattr(dtype, "name", dtype)).lower()
    table = {
        "bf16": "bf16",
        "bfloat16": "bf16",
        "f32": "fp32",
        "float32": "fp32",
        "fp32": "fp32",
        "f16": "fp16",
        "fp16": "fp16",
        "float16": "fp16",
    }
    if s not in table:
        raise VerifyError(
            f"dtype {dtype!r}", rule="verify programs use bf16, f16 or f32", fix="use --dtype bf16"
        )
    return table[s]


# ----------------------------------------------------------------------------- matmul


def predict_matmul(
    expr: str,
    *,
    sizes: Mapping[str, int] | None = None,
    mesh_shape: Mapping[str, int] | None = None,
    dtype: str = "bf16",
    system: str | None = None,
    choices: Mapping[tuple[str, str], int] | None = None,
    framework: str | None = None,
) -> Prediction:
    """The algebra's plan for one of the book's sharded matmuls (`build_matmul`'s arguments).

    The output defaults as in `build_matmul` (free dims keep their input sharding, an
    axis used twice is dropped). Every option the algebra costed is kept in `einsums`.
    """
    from roofline.verify.program import MatmulSpec

    ms = MatmulSpec.parse(expr)
    axes = ms.mesh_axes()
    if mesh_shape is None:
        mesh_shape = ms.default_mesh()
    mesh_int = {a: int(n) for a, n in mesh_shape.items()}
    missing = [a for a in axes if a not in mesh_int]
    if missing:
        raise VerifyError(
            f"mesh axes {missing} have no size",
            rule="every axis in the notation needs a size",
            fix="add them to --mesh, e.g. --mesh X=8",
        )
    dims = {d for op in (ms.lhs, ms.rhs) for d, _ in op}
    sz = {d: float((sizes or {}).get(d, 256)) for d in dims}
    dt = _dtype_name(dtype)

    def spec(name: str, op: tuple) -> Spec:
        return Spec(name, tuple(d for d, _ in op), tuple(tuple(a) for _, a in op), (), dt)

    lhs, rhs, out = spec("A", ms.lhs), spec("B", ms.rhs), spec("C", ms.out)
    pricing = make_pricing(mesh_int, dt, system)
    ep = plan_einsum(
        lhs,
        rhs,
        out,
        sz,
        {a: float(v) for a, v in mesh_int.items()},
        pricing.comm,
        peak_flops_per_s=pricing.peak_flops_per_s,
        hbm_bw_bytes_per_s=pricing.hbm_bw_bytes_per_s,
    )
    pick = dict(choices or {}).get(("matmul", "forward"))
    ep = ep if pick is None else ep.with_choice(pick)
    order = tuple(mesh_int)
    colls = tuple(
        PredictedCollective(
            "matmul",
            "forward",
            c.phase,
            HLO_KIND[c.kind],
            _mesh_axes_order(tuple(c.axes), order),
            c.tensor,
            hlo_dtype(dt),
            _f(c.bytes_per_chip),
            1.0,
            c.before,
            c.after,
            c.why,
        )
        for c in ep.best.comms
    )
    fl = _f(ep.flops_per_chip)
    return Prediction(
        f"matmul:{expr}",
        "matmul",
        mesh_int,
        colls,
        fl,
        {"matmul": fl},
        (),
        (("matmul", ep),),
        {
            "expr": expr,
            "sizes": {k: int(v) for k, v in sz.items()},
            "mesh": mesh_int,
            "dtype": dt,
            "pricing": pricing.label,
            "case": ep.case,
            "strategy": ep.best.describe(),
            "choices": {f"{k[0]}:{k[1]}": v for k, v in dict(choices or {}).items()},
        },
        (f"book case {ep.case}",),
        lambda ch: predict_matmul(
            expr, sizes=sizes, mesh_shape=mesh_shape, dtype=dtype, system=system, choices=ch
        ),
    )


__all__ = [
    "BandwidthCost",
    "HLO_KIND",
    "PredictedCollective",
    "Prediction",
    "predict_matmul",
    "predict_train_step",
]
