"""Limits as queries: the book's closed forms for where each strategy turns compute-bound.

Every limit is a number from the same records the rest of the model reads: the chip's peak
FLOP/s (C) and HBM bandwidth, the model's D and F, and the per-chip bandwidth W of the mesh
axis a strategy communicates over, which is what the collectives module charges per byte of
an AllGather over that axis (`W = 1 / seconds_per_byte`: the torus axes it spans, whether
they close into rings, the NVLink / scale-out tier that binds, and each ring's (N-1)/N).
The book's `M_X·W_ici` is the large-N limit of that W, so where the book drops a ring's
(N-1)/N this module keeps it and says so in the limit's note.

Closed forms (book chapter in brackets; B = global batch in tokens, N chips):

| limit | formula | chapter |
|---|---|---|
| FSDP / DP compute-bound | `B/N > C/W_X` (× E/k for expert layers) | training.md, gpus.md |
| TP width | `Y < F·W_Y/C` | training.md, gpus.md, inference.md |
| FSDP+TP compute-bound | `B/N > C²/(W_X·W_Y·F)`, `X_opt = sqrt(B·N·W_X/(F·W_Y))` | training.md |
| ZeRO-3 + pipelining | `B/N > C/(P·W_X)` | gpus.md Quiz 5 Q2 |
| decode compute-bound | `B > β·C/W_hbm` (×E/k for MoE) | inference.md |
| decode TP (memory-bound) | `Y < w·F·W_Y/(a·B·W_hbm)` | inference.md |
| DP over DCN | `B/slice > C/W_dcn` | training.md |
| weights from host | `B > C/W_pcie` | tpus.md Q3 |
| optimizer offload | `B/N > C/(3·W_host)` | ZeRO-Offload (not the book) |
| host Adam under offload | `B/N > C·t_adam/6`, `t_adam = max(a/W_dram, 16/C_host)` | ZeRO-Offload (not the book) |
| 2D weight-stationary | `N > 2·(F/D)·(W_1D/W_2D)²` | inference.md Q7 |
| EP over nodes (AllToAll) | `F > α·(Z−G)·min(G·k/Z, 1)/k`, `F > G·α`, α = C/W_node | gpus.md |
| EP + FSDP of the experts | `B/N > (E/(k·Z))·C/W_X` | gpus.md's E/k with E/Z experts a chip |

Left out: attention's own intensity (a per-op roofline, `roofline op`); EP on TPU slices (the
gpus.md forms count NVLink nodes; `train` prices a TPU's expert AllToAll from the algebra).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from typing import Any

from roofline.core.collectives import CollectiveKind, collective_cost, switched_bw
from roofline.core.mesh import Mesh, make_mesh
from roofline.core.roofline import critical_batch
from roofline.errors import PlanError, RooflineError
from roofline.specs.model import ModelSpec
from roofline.specs.plan import DEFAULT_OPTIMIZER, OPTIMIZERS, Degrees
from roofline.specs.system import DimKind, System
from roofline.units import DTYPE_BYTES, parse_dtype

# ----------------------------------------------------------------------------- closed forms
# One home for each formula; every function is plain arithmetic (numbers in, number out).


def fsdp_min_tokens_per_chip(C: float, W_X: float) -> float:
    """training.md: FSDP (and DP) is compute-bound iff B/X > C/W_X."""
    return C / W_X


def tp_max_degree(F: float, C: float, W_Y: float) -> float:
    """training.md: TP is compute-bound iff Y < F·W_Y/C (independent of the batch)."""
    return F * W_Y / C


def mixed_min_tokens_per_chip(C: float, W_X: float, W_Y: float, F: float) -> float:
    """training.md: FSDP+TP at its optimum X is compute-bound iff B/N > C²/(W_X·W_Y·F)."""
    return C * C / (W_X * W_Y * F)


def mixed_x_opt(B: float, N: float, F: float, W_X: float, W_Y: float) -> float:
    """training.md: the FSDP degree that equalises T_FSDP and T_TP, sqrt((B/F)(W_X/W_Y)N)."""
    return math.sqrt(B * N * W_X / (F * W_Y))


def zero3_pp_min_tokens_per_chip(C: float, W_X: float, P: float) -> float:
    """gpus.md Quiz 5 Q2: P pipeline stages cut each chip's weight gathers P-fold: C/(P·W_X)."""
    return C / (P * W_X)


def decode_tp_max_degree(
    F: float, W_Y: float, B: float, W_hbm: float, w_bytes: float = 2.0, a_bytes: float = 2.0
) -> float:
    """inference.md: in memory-bound decode the activation gathers (a·B·D/W_Y) outgrow the
    weight reads (w·D·F/(Y·W_hbm)) beyond Y = w·F·W_Y/(a·B·W_hbm) (book: F/(B·β), β ≈ 8)."""
    return w_bytes * F * W_Y / (a_bytes * B * W_hbm)


def two_d_x_opt(N: float, D: float, F: float) -> float:
    """inference.md Q7: the X of 2D weight-stationary that minimises 2BD/(X·W) + 4BF·X/(N·W)."""
    return math.sqrt(D * N / (2 * F))


def two_d_coefficient(D: float, F: float) -> float:
    """inference.md Q7: at X_opt, T_2D = k·B·D/(sqrt(N)·W) with k = 4·sqrt(2F/D) (F=4D: 11.3)."""
    return 4 * math.sqrt(2 * F / D)


def two_d_breakeven_chips(D: float, F: float, W_1d: float, W_2d: float) -> float:
    """inference.md Q7: 2D beats 1D (T_1D = 4BD/W_1d) when N > 2(F/D)(W_1d/W_2d)² (book: 72)."""
    return 2 * F / D * (W_1d / W_2d) ** 2


def offload_min_tokens_per_chip(C: float, W_host: float) -> float:
    """ZeRO-Offload (Ren et al. 2021, not the book): each step a chip's 2-byte gradients go to
    host memory while its 2-byte parameters come back (full duplex: 2 bytes/param one way),
    against 6 FLOPs per parameter per token: hidden iff B/N > C/(3·W_host)."""
    return C / (3 * W_host)


# Adam's arithmetic per parameter (bias corrections are per-step scalars):
# m ← β1·m + (1−β1)·g (3), v ← β2·v + (1−β2)·g² (4), p ← p − lr·(m̂/(sqrt(v̂)+ε) + λ·p)
# with m̂, v̂ (2), sqrt, +ε, ÷ (3), +λ·p (2), ×lr, − (2): 16 FLOPs
ADAM_FLOPS_PER_PARAM = 16.0


def host_adam_bytes_per_param(param_bytes: float, grad_bytes: float, state_bytes: float) -> float:
    """The host DRAM traffic of one parameter's Adam update under optimizer offload: the
    gradient read, the optimizer state (moments, master copy if any) read and written, the
    updated parameter written for the trip back: a = g + 2·s + p."""
    return grad_bytes + 2 * state_bytes + param_bytes


def host_adam_s_per_param(a_bytes: float, W_dram: float, C_host: float) -> float:
    """Seconds per parameter of the host's Adam update: a roofline on the host, the slower of
    its DRAM (a bytes at W_dram) and its CPUs (16 FLOPs at C_host); both per chip served."""
    return max(a_bytes / W_dram, ADAM_FLOPS_PER_PARAM / C_host)


def offload_adam_min_tokens_per_chip(C: float, t_adam: float) -> float:
    """The batch per chip at which the chip's 6 FLOPs per parameter per token take as long as
    the host's Adam update of that parameter (t_adam seconds): B/N = C·t_adam/6."""
    return C * t_adam / 6


def ep_min_d_ff(alpha: float, Z: float, G: float, k: float) -> float:
    """gpus.md: EP over Z GPUs in nodes of G keeps its two AllToAlls
    (4·B·D·(Z−G)/(W_node·Z)·min(G·k/Z, 1)) under the expert matmuls (4·B·k·D·F/(Z·C)) iff
    F > α·(Z−G)·min(G·k/Z, 1)/k, α = C/W_node; the batch cancels."""
    return alpha * max(Z - G, 0.0) * min(G * k / Z, 1.0) / k


def ep_max_degree(F: float, alpha: float, G: float, k: float) -> float:
    """The widest EP that `ep_min_d_ff` allows (inf when F ≥ G·α): (Z−G)·min(G·k/Z, 1)/k
    grows with Z towards G, so Z < G + k·F/α while Z ≤ G·k, else Z < G²/(G − F/α)."""
    r = F / alpha
    if r >= G:
        return math.inf
    if r <= G * (k - 1) / k:
        return G + k * r
    return G * G / (G - r)


def ep_alltoall_time(B: float, D: float, Z: float, G: float, k: float, W_node: float) -> float:
    """gpus.md: the two AllToAlls of one MoE layer, B tokens over Z-way EP, nodes of G GPUs."""
    return 4 * B * D * max(Z - G, 0.0) / (W_node * Z) * min(G * k / Z, 1.0)


def ep_fsdp_min_tokens_per_chip(C: float, W_X: float, E: float, k: float, Z: float) -> float:
    """gpus.md's MoE DP limit (E/k)·C/W_X with each chip holding E/Z of the experts."""
    return fsdp_min_tokens_per_chip(C, W_X) * E / (k * Z)


def max_chips_for_batch(B: float, min_tokens_per_chip: float) -> float:
    """The most chips a batch of B tokens keeps compute-bound: B over the per-chip limit."""
    return B / min_tokens_per_chip


# ----------------------------------------------------------------------------- records


class LimitStrategy(enum.StrEnum):
    FSDP = "fsdp"
    TP = "tp"
    FSDP_TP = "fsdp+tp"
    ZERO3_PP = "zero3+pp"
    DECODE = "decode"
    EP = "ep"


_STRATEGY_ALIASES = {
    "fsdp": "fsdp",
    "dp": "fsdp",
    "zero3": "fsdp",
    "tp": "tp",
    "mixed": "fsdp+tp",
    "fsdp+tp": "fsdp+tp",
    "fsdptp": "fsdp+tp",
    "zero3+pp": "zero3+pp",
    "fsdp+pp": "zero3+pp",
    "pp": "zero3+pp",
    "decode": "decode",
    "inference": "decode",
    "ep": "ep",
    "expert": "ep",
    "moe": "ep",
}


def parse_strategy(text: str | LimitStrategy) -> LimitStrategy:
    if isinstance(text, LimitStrategy):
        return text
    key = str(text).strip().lower().replace(" ", "")
    if key in _STRATEGY_ALIASES:
        return LimitStrategy(_STRATEGY_ALIASES[key])
    raise PlanError(
        f"limits strategy {text!r}",
        rule="the strategies with closed-form limits are "
        + ", ".join(s.value for s in LimitStrategy),
        fix="write e.g. --strategy fsdp+tp",
    )


@dataclass(frozen=True)
class AxisBandwidth:
    """What one collective axis gives a chip: W = 1/seconds_per_byte of an AllGather over it."""

    axis: str
    size: int
    bytes_per_s: float
    placement: str
    bottleneck: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "axis": self.axis,
            "size": self.size,
            "bytes_per_s": self.bytes_per_s,
            "placement": self.placement,
            "bottleneck": self.bottleneck,
        }


def axis_bandwidth(mesh: Mesh, axis: str) -> AxisBandwidth:
    """The per-chip AllGather bandwidth of a mesh axis, as the collectives module prices it."""
    c = collective_cost(CollectiveKind.ALL_GATHER, 1.0e9, (axis,), mesh)
    if c.group_size == 1 or c.seconds_per_byte == 0:
        raise PlanError(
            f"mesh axis {axis!r} has one chip",
            rule="a bandwidth limit needs an axis of two or more chips",
            fix="give the strategy a degree of 2 or more (--plan)",
        )
    segs = "*".join(s.describe() for s in reversed(mesh.placement[axis]))
    return AxisBandwidth(axis, mesh.axis_size(axis), 1.0 / c.seconds_per_byte, segs, c.bottleneck)


@dataclass(frozen=True)
class Limit:
    """One closed-form limit: formula, the numbers put in, the value and the regime each side.

    `at` is where the asked configuration sits on the same scale (tokens per chip, degree,
    chips), `side` the regime it is in ("compute-bound" or "communication-bound"/...).
    """

    key: str
    title: str
    formula: str
    substitution: str
    value: float
    unit: str
    below: str
    above: str
    note: str = ""
    at: float | None = None
    side: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class LimitsReport:
    model: str
    system: str
    strategy: str
    plans: dict[str, str]
    compute_flops_per_s: float
    bandwidths: dict[str, AxisBandwidth]
    limits: tuple[Limit, ...]
    skipped: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Limit:
        for lim in self.limits:
            if lim.key == key:
                return lim
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "system": self.system,
            "strategy": self.strategy,
            "plans": dict(self.plans),
            "compute_flops_per_s": self.compute_flops_per_s,
            "bandwidths": {k: v.to_dict() for k, v in self.bandwidths.items()},
            "limits": {lim.key: lim.to_dict() for lim in self.limits},
            "skipped": dict(self.skipped),
        }


def _side(at: float | None, value: float, below: str, above: str) -> str | None:
    if at is None:
        return None
    return above if at >= value else below


# ----------------------------------------------------------------------------- assembly

_COMM = "communication-bound"
_COMP = "compute-bound"


@dataclass(frozen=True)
class _Ctx:
    """What every limit reads: the model's letters, the chip's C and HBM W, the asked batch."""

    model: ModelSpec
    system: System
    C: float
    D: float
    F: float
    batch: float | None
    w_bytes: float
    a_bytes: float
    degrees: Degrees | None

    @property
    def N(self) -> int:
        return self.system.n_chips

    @property
    def per_chip(self) -> float | None:
        return None if self.batch is None else self.batch / self.N


def natural_tp_degree(system: System) -> int:
    """Where TP goes by default: the NVLink domain of a GPU system, the innermost ICI axis of a TPU."""
    if not system.dims:
        return 1
    inner = system.dims[-1]
    if inner.kind in (DimKind.NVLINK, DimKind.ICI):
        return inner.size
    return 1


def _mesh(system: System, deg: Degrees) -> Mesh:
    if deg.n_chips != system.n_chips:
        raise PlanError(
            f"plan {deg.describe()} uses {deg.n_chips} chips, system {system.name} has {system.n_chips}",
            rule="the plan's degrees multiply to the system's chip count",
            fix="give --plan degrees whose product is the chip count",
        )
    return make_mesh(system, deg.mesh_axes())


def _plan_for(ctx: _Ctx, want: dict[str, int], needs: tuple[str, ...]) -> Degrees:
    """The asked plan when it uses every strategy in `needs`, else the default `want`."""
    d = ctx.degrees
    if d is not None and all(getattr(d, k) > 1 for k in needs):
        return d
    short = [k for k in needs if want.get(k, 1) < 2]
    if short:
        raise PlanError(
            f"{'+'.join(needs)} limits on {ctx.system.name}: the default plan "
            f"{Degrees(**want).describe()} leaves {short[0]} a single chip",
            rule="a strategy's bandwidth limit needs its axis to span 2 or more chips (by default TP "
            "takes the innermost axis and FSDP the rest)",
            fix=f"give --plan with {', '.join(f'{k}=...' for k in needs)} of 2 or more each, "
            "or a larger system",
        )
    bad = [f"{k}={v}" for k, v in want.items() if v < 1 or ctx.N % max(v, 1)]
    if bad or math.prod(want.values()) != ctx.N:
        raise PlanError(
            f"no default {'+'.join(needs)} plan on {ctx.system.name} ({', '.join(bad) or want})",
            rule="the default plan puts TP on the innermost axis and the rest on the other strategy",
            fix=f"give --plan with {', '.join(f'{k}=...' for k in needs)} multiplying to {ctx.N}",
        )
    return Degrees(**want)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _w_note(bw: AxisBandwidth, letter: str) -> str:
    return (
        f"{letter} = {_fmt(bw.bytes_per_s)} B/s: AllGather bandwidth per chip over {bw.axis}={bw.size} "
        f"on {bw.placement} (bound by {bw.bottleneck}), as the collectives module prices it; the "
        "book quotes its large-N value M·W (a ring's (N-1)/N dropped)"
    )


@dataclass
class _Part:
    plans: dict[str, str] = field(default_factory=dict)
    bandwidths: dict[str, AxisBandwidth] = field(default_factory=dict)
    limits: list[Limit] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _fsdp_limit(ctx: _Ctx, part: _Part) -> float:
    deg = _plan_for(ctx, {"fsdp": ctx.N}, ("fsdp",))
    bw = axis_bandwidth(_mesh(ctx.system, deg), "fsdp")
    part.plans["fsdp"] = deg.describe()
    part.bandwidths["W_X(fsdp)"] = bw
    v = fsdp_min_tokens_per_chip(ctx.C, bw.bytes_per_s)
    part.limits.append(
        Limit(
            "fsdp_min_tokens_per_chip",
            "FSDP / DP: smallest batch per chip that stays compute-bound",
            "B/N > C / W_X",
            f"{_fmt(ctx.C)} / {_fmt(bw.bytes_per_s)}",
            v,
            "tokens per chip",
            _COMM + " (weight AllGathers / gradient reductions outlast the matmuls)",
            _COMP,
            _w_note(bw, "W_X") + "; DP's AllReduce moves twice the bytes in a pass with twice "
            "the FLOPs, so the same ratio holds",
            ctx.per_chip,
            _side(ctx.per_chip, v, _COMM, _COMP),
        )
    )
    return v


def _max_chips(ctx: _Ctx, part: _Part, key: str, what: str, per_chip: float, formula: str) -> None:
    if ctx.batch is None:
        return
    v = max_chips_for_batch(ctx.batch, per_chip)
    part.limits.append(
        Limit(
            key,
            f"{what}: most chips a {ctx.batch:.4g}-token batch keeps compute-bound",
            formula,
            f"{ctx.batch:.4g} / {_fmt(per_chip)}",
            v,
            "chips",
            _COMP,
            _COMM,
            "the bandwidth is the asked mesh's; another chip count can place the axes on other links",
            float(ctx.N),
            _side(float(ctx.N), v, _COMP, _COMM),
        )
    )


def _part_fsdp(ctx: _Ctx) -> _Part:
    part = _Part()
    v = _fsdp_limit(ctx, part)
    _moe_limit(ctx, part, v)
    _max_chips(ctx, part, "fsdp_max_chips", "FSDP", v, "N < B·W_X / C")
    _dcn_limit(ctx, part)
    _offload_limit(ctx, part)
    _offload_adam_limit(ctx, part)
    return part


def _offload_limit(ctx: _Ctx, part: _Part) -> None:
    W = ctx.system.host_bw_bytes_per_s
    if W is None:
        part.skipped["offload_min_tokens_per_chip"] = "no host-link bandwidth in the records"
        return
    v = offload_min_tokens_per_chip(ctx.C, W)
    part.limits.append(
        Limit(
            "offload_min_tokens_per_chip",
            "optimizer offload (ZeRO-Offload): smallest batch per chip that hides the host traffic",
            "B/N > C / (3·W_host)",
            f"{_fmt(ctx.C)} / (3·{_fmt(W)})",
            v,
            "tokens per chip",
            "host-link-bound (gradients out, parameters back each step)",
            _COMP,
            "2 bytes/param each way over the full-duplex host link vs 6 FLOPs/param/token; "
            "ZeRO-Offload (Ren et al. 2021), not a book formula; the host link is the system's "
            "host_bw_bytes_per_s",
            ctx.per_chip,
            _side(ctx.per_chip, v, "host-link-bound", _COMP),
        )
    )


def _offload_adam_limit(ctx: _Ctx, part: _Part) -> None:
    sysm = ctx.system
    W, Ch = sysm.host_dram_bw_bytes_per_s, sysm.host_flops_per_s
    if W is None or Ch is None:
        part.skipped["offload_adam_min_tokens_per_chip"] = (
            "no host DRAM bandwidth or host FLOP/s in the records"
        )
        return
    opt = OPTIMIZERS[DEFAULT_OPTIMIZER]
    a = host_adam_bytes_per_param(opt.param_bytes, opt.grad_bytes, opt.state_bytes)
    t = host_adam_s_per_param(a, W, Ch)
    v = offload_adam_min_tokens_per_chip(ctx.C, t)
    part.limits.append(
        Limit(
            "offload_adam_min_tokens_per_chip",
            "optimizer offload: batch per chip at which the host's Adam update takes as long as "
            "the chip's compute",
            "B/N > C·t_adam/6, t_adam = max(a/W_dram, 16/C_host)",
            f"{_fmt(ctx.C)}·max({a:g}/{_fmt(W)}, 16/{_fmt(Ch)})/6",
            v,
            "tokens per chip",
            "host-Adam-bound (the host's update outlasts the step's compute)",
            "compute-dominated (the update adds less than the compute time)",
            f"a = g + 2·s + p = {a:g} bytes per parameter ({opt.name}); W_dram and C_host are "
            "the host's DRAM bandwidth and fp32 FLOP/s per chip (host_dram_bw_bytes_per_s, "
            "host_flops_per_s); ZeRO-Offload runs the update between backward and the next "
            "forward, so `train --offload-optimizer` adds it to the step whatever the batch",
            ctx.per_chip,
            _side(ctx.per_chip, v, "host-Adam-bound", "compute-dominated"),
        )
    )


def _moe_limit(ctx: _Ctx, part: _Part, dense: float) -> None:
    moe = ctx.model.moe
    if moe is None:
        return
    v = dense * moe.n_experts / moe.top_k
    part.limits.append(
        Limit(
            "moe_fsdp_min_tokens_per_chip",
            "FSDP / DP of the expert layers: smallest batch per chip that stays compute-bound",
            "B/N > (E/k) · C / W_X",
            f"({moe.n_experts}/{moe.top_k}) · {_fmt(dense)}",
            v,
            "tokens per chip",
            _COMM + " (every expert's weights move, only k of E compute per token)",
            _COMP,
            "gpus.md: E/k times the dense limit (k=4, E=128: 32·2475 = 79,200 across H100 nodes)",
            ctx.per_chip,
            _side(ctx.per_chip, v, _COMM, _COMP),
        )
    )


def _dcn_limit(ctx: _Ctx, part: _Part) -> None:
    outer = ctx.system.dims[0]
    if outer.kind is not DimKind.DCN or outer.size < 2:
        return
    S = outer.size
    deg = Degrees(dp=S, fsdp=ctx.N // S)
    bw = axis_bandwidth(_mesh(ctx.system, deg), "data")
    v = fsdp_min_tokens_per_chip(ctx.C, bw.bytes_per_s)
    part.bandwidths["W_dcn(data)"] = bw
    at = None if ctx.batch is None else ctx.batch / S
    part.limits.append(
        Limit(
            "dcn_min_tokens_per_slice",
            "DP over DCN: smallest batch per slice that hides the cross-slice gradient reduction",
            "B/slices > C / W_dcn",
            f"{_fmt(ctx.C)} / {_fmt(bw.bytes_per_s)}",
            v,
            "tokens per slice",
            _COMM,
            _COMP,
            _w_note(bw, "W_dcn")
            + " (2 slices: the book's 71,360 for v5p is C/W_dcn without the 1/2)",
            at,
            _side(at, v, _COMM, _COMP),
        )
    )


def _tp_limit(ctx: _Ctx, part: _Part, key: str = "tp_max_degree") -> tuple[AxisBandwidth, Degrees]:
    T = natural_tp_degree(ctx.system)
    deg = _plan_for(ctx, {"dp": ctx.N // max(T, 1), "tp": T}, ("tp",))
    bw = axis_bandwidth(_mesh(ctx.system, deg), "tensor")
    part.plans["tp"] = deg.describe()
    part.bandwidths["W_Y(tensor)"] = bw
    v = tp_max_degree(ctx.F, ctx.C, bw.bytes_per_s)
    part.limits.append(
        Limit(
            key,
            "TP: widest tensor parallelism that stays compute-bound (any batch)",
            "Y < F · W_Y / C",
            f"{ctx.F:g} · {_fmt(bw.bytes_per_s)} / {_fmt(ctx.C)}",
            v,
            "TP degree",
            _COMP,
            _COMM + " (activation AllGather + ReduceScatter outlast the matmuls)",
            _w_note(bw, "W_Y"),
            float(deg.tp),
            _side(float(deg.tp), v, _COMP, _COMM),
        )
    )
    fmin = deg.tp * ctx.C / bw.bytes_per_s
    part.limits.append(
        Limit(
            "tp_min_d_ff",
            f"TP: smallest F that keeps {deg.tp}-way TP compute-bound",
            "F > Y · C / W_Y",
            f"{deg.tp} · {_fmt(ctx.C)} / {_fmt(bw.bytes_per_s)}",
            fmin,
            "d_ff",
            _COMM,
            _COMP,
            "the same inequality solved for F",
            ctx.F,
            _side(ctx.F, fmin, _COMM, _COMP),
        )
    )
    return bw, deg


def _part_tp(ctx: _Ctx) -> _Part:
    part = _Part()
    _tp_limit(ctx, part)
    return part


def _mixed_bandwidths(ctx: _Ctx, part: _Part) -> tuple[Degrees, float, float]:
    T = natural_tp_degree(ctx.system)
    deg = _plan_for(ctx, {"fsdp": ctx.N // max(T, 1), "tp": T}, ("fsdp", "tp"))
    mesh = _mesh(ctx.system, deg)
    bx, by = axis_bandwidth(mesh, "fsdp"), axis_bandwidth(mesh, "tensor")
    part.plans["fsdp+tp"] = deg.describe()
    part.bandwidths["W_X(fsdp, mixed)"] = bx
    part.bandwidths["W_Y(tensor, mixed)"] = by
    return deg, bx.bytes_per_s, by.bytes_per_s


def _part_mixed(ctx: _Ctx) -> _Part:
    part = _Part()
    deg, WX, WY = _mixed_bandwidths(ctx, part)
    v = mixed_min_tokens_per_chip(ctx.C, WX, WY, ctx.F)
    part.limits.append(
        Limit(
            "mixed_min_tokens_per_chip",
            "FSDP+TP: smallest batch per chip that stays compute-bound at the best split",
            "B/N > C² / (W_X · W_Y · F)",
            f"{_fmt(ctx.C)}² / ({_fmt(WX)} · {_fmt(WY)} · {ctx.F:g})",
            v,
            "tokens per chip",
            _COMM,
            _COMP,
            f"plan {deg.describe()}; the book's α²/(M_X·M_Y·F) with α = C/W_ici",
            ctx.per_chip,
            _side(ctx.per_chip, v, _COMM, _COMP),
        )
    )
    if ctx.batch is not None:
        x = mixed_x_opt(ctx.batch, ctx.N, ctx.F, WX, WY)
        part.limits.append(
            Limit(
                "mixed_x_opt",
                "FSDP+TP: the FSDP degree that balances weight and activation traffic",
                "X_opt = sqrt(B · N · W_X / (F · W_Y))",
                f"sqrt({ctx.batch:.4g} · {ctx.N} · {_fmt(WX)} / ({ctx.F:g} · {_fmt(WY)}))",
                x,
                "FSDP degree",
                "activation (TP) traffic dominates: raise X",
                "weight (FSDP) traffic dominates: lower X",
                f"Y = N / X_opt = {ctx.N / x:.4g}; round to degrees the mesh allows",
                float(deg.fsdp),
                _side(float(deg.fsdp), x, "TP-heavy", "FSDP-heavy"),
            )
        )
        _max_chips(ctx, part, "mixed_max_chips", "FSDP+TP", v, "N < B·W_X·W_Y·F / C²")
    _improvement(ctx, part, v)
    return part


def _improvement(ctx: _Ctx, part: _Part, mixed: float) -> None:
    pure = _Part()
    f = _fsdp_limit(dataclass_replace(ctx, degrees=None), pure)
    part.bandwidths.update(pure.bandwidths)
    part.plans.setdefault("fsdp", pure.plans["fsdp"])
    part.limits.append(
        Limit(
            "mixed_over_fsdp_factor",
            "FSDP+TP over pure FSDP: how much smaller a per-chip batch stays compute-bound",
            "(C / W_X,fsdp) / (C² / (W_X · W_Y · F))",
            f"{_fmt(f)} / {_fmt(mixed)}",
            f / mixed,
            "x",
            "FSDP+TP is no better than pure FSDP",
            "FSDP+TP keeps this many times smaller batches compute-bound",
            "both limits on this system, pure FSDP over every chip (book v5p: ~850 vs ~100)",
        )
    )


def _part_pp(ctx: _Ctx) -> _Part:
    part = _Part()
    d = ctx.degrees
    P = d.pp if d is not None and d.pp > 1 else 8
    if ctx.N < 2 * P:
        raise PlanError(
            f"ZeRO-3 with {P} pipeline stages on {ctx.N} chips leaves fewer than 2 per stage",
            rule="the limit is about the ZeRO-3 (fsdp) axis inside each stage: N >= 2·P",
            fix=f"give a system of at least {2 * P} chips, or --plan with fewer stages (pp=...)",
        )
    deg = _plan_for(ctx, {"fsdp": ctx.N // P, "pp": P}, ("fsdp", "pp"))
    bw = axis_bandwidth(_mesh(ctx.system, deg), "fsdp")
    part.plans["zero3+pp"] = deg.describe()
    part.bandwidths["W_X(fsdp, pipelined)"] = bw
    v = zero3_pp_min_tokens_per_chip(ctx.C, bw.bytes_per_s, deg.pp) / deg.tp
    part.limits.append(
        Limit(
            "zero3_pp_min_tokens_per_chip",
            f"ZeRO-3 with {deg.pp} pipeline stages: smallest batch per chip that stays compute-bound",
            "B/N > C / (P · Y · W_X)",
            f"{_fmt(ctx.C)} / ({deg.pp} · {deg.tp} · {_fmt(bw.bytes_per_s)})",
            v,
            "tokens per chip",
            _COMM,
            _COMP,
            _w_note(bw, "W_X") + "; a stage gathers only its 1/P of the weights (1/(P·Y) with "
            "TP); the book's gpus.md Q2 writes C/(P·W) = 990e12/(8·400e9) = 309",
            ctx.per_chip,
            _side(ctx.per_chip, v, _COMM, _COMP),
        )
    )
    return part


def _decode_crit(ctx: _Ctx, part: _Part, wd: str, ad: str) -> None:
    moe = ctx.model.moe
    base = critical_batch(ctx.system.chip, wd, ad)
    scale = moe.n_experts / moe.top_k if moe is not None else 1.0
    v = base * scale
    part.limits.append(
        Limit(
            "decode_critical_batch",
            "decode: batch above which the weight matmuls turn compute-bound",
            "B > w·C / (2·W_hbm)" + (" · E/k" if moe is not None else ""),
            f"{DTYPE_BYTES[wd]:g} · {_fmt(ctx.system.chip.peak(_wider(wd, ad)))} / "
            f"(2 · {_fmt(ctx.system.chip.hbm_bw_bytes_per_s)})"
            + (f" · {moe.n_experts}/{moe.top_k}" if moe is not None else ""),
            v,
            "tokens per model replica",
            "memory-bound (weight reads dominate)",
            _COMP,
            f"{wd} weights, {ad} activations (β = weight/activation bits, inference.md: 240 "
            "bf16 / 120 int8 on v5e); the exact crossover at given D, F is `roofline op`'s",
            ctx.batch,
            _side(ctx.batch, v, "memory-bound", _COMP),
        )
    )


def _wider(a: str, b: str) -> str:
    return a if DTYPE_BYTES[a] >= DTYPE_BYTES[b] else b


def _decode_tp(ctx: _Ctx, part: _Part, bw: AxisBandwidth, deg: Degrees) -> None:
    if ctx.batch is None:
        part.skipped["decode_tp_max_degree"] = "needs a batch (--batch): the bound falls as 1/B"
        return
    W_hbm = ctx.system.chip.hbm_bw_bytes_per_s
    v = decode_tp_max_degree(ctx.F, bw.bytes_per_s, ctx.batch, W_hbm, ctx.w_bytes, ctx.a_bytes)
    Y = float(deg.tp)
    part.limits.append(
        Limit(
            "decode_tp_max_degree",
            "decode: widest TP before the activation gathers outlast the weight reads",
            "Y < w·F·W_Y / (a·B·W_hbm)",
            f"{ctx.w_bytes:g}·{ctx.F:g}·{_fmt(bw.bytes_per_s)} / ({ctx.a_bytes:g}·{ctx.batch:.4g}·{_fmt(W_hbm)})",
            v,
            "TP degree",
            "HBM-bound (weight reads dominate)",
            "communication-bound (activation gathers dominate)",
            "book inference.md: F/(B·β) with β = W_hbm/W_ici ≈ 8 on v5e/v6e",
            Y,
            _side(Y, v, "HBM-bound", _COMM),
        )
    )


def _two_d(ctx: _Ctx, part: _Part, w2: AxisBandwidth) -> None:
    w1 = axis_bandwidth(_mesh(ctx.system, Degrees(tp=ctx.N)), "tensor")
    part.bandwidths["W_1D(all chips)"] = w1
    v = two_d_breakeven_chips(ctx.D, ctx.F, w1.bytes_per_s, w2.bytes_per_s)
    k = two_d_coefficient(ctx.D, ctx.F)
    x = two_d_x_opt(ctx.N, ctx.D, ctx.F)
    part.limits.append(
        Limit(
            "two_d_breakeven_chips",
            "2D weight-stationary decode beats 1D TP above this many chips",
            "N > 2·(F/D)·(W_1D/W_2D)²   (T_2D = k·B·D/(sqrt(N)·W_2D), k = 4·sqrt(2F/D))",
            f"2·({ctx.F:g}/{ctx.D:g})·({_fmt(w1.bytes_per_s)}/{_fmt(w2.bytes_per_s)})²",
            v,
            "chips",
            "1D TP moves fewer bytes",
            "2D weight-stationary moves fewer bytes",
            f"k = {k:.4g}; optimal split X = sqrt(D·N/(2F)) = {x:.4g}, YZ = N/X = {ctx.N / x:.4g}; "
            "book inference.md Q7: N > 32·(F/D)·(3/4)² = 72 for F = 4D with 3 axes for 1D",
            float(ctx.N),
            _side(float(ctx.N), v, "1D better", "2D better"),
        )
    )


def _host_weights(ctx: _Ctx, part: _Part) -> None:
    W = ctx.system.chip.pcie_bw_bytes_per_s
    if W is None:
        return
    v = ctx.C / W * ctx.w_bytes / 2
    part.limits.append(
        Limit(
            "host_weights_min_batch",
            "weights streamed from host memory over PCIe: batch that hides the transfer",
            "B > w·C / (2·W_pcie)",
            f"{ctx.w_bytes:g}·{_fmt(ctx.C)} / (2·{_fmt(W)})",
            v,
            "tokens per model replica",
            "PCIe-bound",
            _COMP,
            "each chip streams its shard of the weights over its own host link and does its "
            "share of the FLOPs, so the chip count cancels; tpus.md Q3: 8BD²/C > 8D²/W_pcie gives "
            "B > C/W_pcie (v6e: 57,500 with 1.6e10) for bf16 weights",
            ctx.batch,
            _side(ctx.batch, v, "PCIe-bound", _COMP),
        )
    )


def _part_decode(ctx: _Ctx, wd: str, ad: str) -> _Part:
    part = _Part()
    _decode_crit(ctx, part, wd, ad)
    _host_weights(ctx, part)
    if ctx.N < 2:
        part.skipped["decode_tp_max_degree"] = "one chip: no tensor parallelism to bound"
        return part
    bw, deg = _tp_limit(ctx, part)
    _decode_tp(ctx, part, bw, deg)
    _two_d(ctx, part, bw)
    return part


@dataclass(frozen=True)
class _EP:
    """What gpus.md's EP limits read: Z-way EP, nodes of G GPUs, W_node, the MoE's E and k."""

    deg: Degrees
    Z: int
    G: int
    W_node: float
    E: int
    k: int
    tier: str

    def alpha(self, C: float) -> float:
        return C / self.W_node


def _ep_setup(ctx: _Ctx, part: _Part) -> _EP:
    moe, sys_ = ctx.model.moe, ctx.system
    if moe is None:
        raise PlanError(
            f"EP limits for {ctx.model.name}, a dense model",
            rule="expert parallelism shards the experts of a mixture-of-experts model",
            fix="give an MoE model, e.g. --model deepseek-v3",
        )
    inner = sys_.dims[-1]
    if inner.kind is not DimKind.NVLINK or len(sys_.dims) < 2:
        raise PlanError(
            f"EP limits on {sys_.name}",
            rule="gpus.md's EP limits count NVLink nodes under a scale-out network (a GPU "
            "cluster of 2 or more nodes)",
            fix="give a multi-node GPU system, e.g. h100:2048; `train` prices EP on any system",
        )
    deg = _plan_for(
        ctx,
        {"fsdp": ctx.N // math.gcd(moe.n_experts, ctx.N), "ep": math.gcd(moe.n_experts, ctx.N)},
        ("ep",),
    )
    mesh = _mesh(sys_, deg)
    top = mesh.placement["expert"][0].dim  # the highest tier the EP axis reaches
    tier = top if top.kind is not DimKind.NVLINK else sys_.dims[-2]
    w, _ = switched_bw(sys_, tier)
    part.plans["ep"] = deg.describe()
    return _EP(deg, deg.ep, inner.size, inner.size * w, moe.n_experts, moe.top_k, tier.name)


def _part_ep(ctx: _Ctx) -> _Part:
    part = _Part()
    ep = _ep_setup(ctx, part)
    a = ep.alpha(ctx.C)
    w_note = (
        f"W_node = {ep.G} · {_fmt(ep.W_node / ep.G)} = {_fmt(ep.W_node)} B/s: a node's egress at "
        f"the {ep.tier} tier (the system's per-GPU scale-out share, capped by its switches)"
    )
    v = ep_min_d_ff(a, ep.Z, ep.G, ep.k)
    part.limits.append(
        Limit(
            "ep_min_d_ff",
            f"EP over {ep.Z} GPUs: smallest expert F that hides the two AllToAlls (any batch)",
            "F > α·(Z−G)·min(G·k/Z, 1)/k,  α = C/W_node",
            f"{_fmt(a)}·({ep.Z}−{ep.G})·min({ep.G}·{ep.k}/{ep.Z}, 1)/{ep.k}",
            v,
            "d_ff",
            _COMM + " (the dispatch and combine AllToAlls outlast the expert matmuls)",
            _COMP,
            w_note + "; gpus.md: T_comms = 4BD(Z−G)/(W_node·Z)·min(Gk/Z, 1) vs "
            "T_math = 4BkDF/(ZC), the batch cancels",
            ctx.F,
            _side(ctx.F, v, _COMM, _COMP),
        )
    )
    wide = ep.G * a
    part.limits.append(
        Limit(
            "ep_wide_d_ff",
            "EP: expert F above which EP stays compute-bound over any number of nodes",
            "F > G · C / W_node",
            f"{ep.G} · {_fmt(ctx.C)} / {_fmt(ep.W_node)}",
            wide,
            "d_ff",
            "EP spans 1-2 nodes (see ep_max_degree)",
            "EP can span up to E-way",
            "gpus.md's takeaway: 8·C/W_node (H100: 8·2475 = 19,800)",
            ctx.F,
            _side(ctx.F, wide, "narrow EP", "wide EP"),
        )
    )
    _ep_max(ctx, part, ep, a)
    _ep_time(ctx, part, ep)
    _ep_fsdp(ctx, part, ep)
    return part


def _ep_max(ctx: _Ctx, part: _Part, ep: _EP, a: float) -> None:
    z = ep_max_degree(ctx.F, a, ep.G, ep.k)
    bounded = math.isfinite(z)
    part.limits.append(
        Limit(
            "ep_max_degree",
            "EP: widest expert parallelism that stays compute-bound (any batch)",
            "Z < G + k·F/α (Z ≤ G·k),  Z < G²/(G − F/α) (Z > G·k)",
            _ep_max_substitution(ctx.F, a, ep),
            z if bounded else float(ep.E),
            "EP degree",
            _COMP,
            _COMM if bounded else _COMP,
            "ep_min_d_ff solved for Z ((Z−G)·min(Gk/Z, 1)/k grows with Z towards G): "
            + (
                "F < G·α bounds it (gpus.md: EP spans 1-2 nodes)"
                if bounded
                else f"F ≥ G·α, no bandwidth bound: up to E = {ep.E}-way"
            ),
            float(ep.Z),
            _side(float(ep.Z), z, _COMP, _COMM) if bounded else _COMP,
        )
    )


def _ep_max_substitution(F: float, a: float, ep: _EP) -> str:
    r = F / a
    if r >= ep.G:
        return f"F/α = {F:g}/{_fmt(a)} = {r:.4g} ≥ G = {ep.G}"
    if r <= ep.G * (ep.k - 1) / ep.k:
        return f"{ep.G} + {ep.k}·{F:g}/{_fmt(a)}"
    return f"{ep.G}²/({ep.G} − {F:g}/{_fmt(a)})"


def _ep_time(ctx: _Ctx, part: _Part, ep: _EP) -> None:
    if ctx.batch is None:
        part.skipped["ep_alltoall_s_per_layer"] = "needs a batch (--batch)"
        return
    Bg = ctx.batch * ep.Z / ctx.N  # tokens one EP group routes
    t = ep_alltoall_time(Bg, ctx.D, ep.Z, ep.G, ep.k, ep.W_node)
    t_math = 4 * Bg * ep.k * ctx.D * ctx.F / (ep.Z * ctx.C)
    part.limits.append(
        Limit(
            "ep_alltoall_s_per_layer",
            f"EP: the two AllToAlls of one MoE layer ({Bg:.4g} tokens per EP group)",
            "T_comms = 4·B·D·(Z−G)/(W_node·Z)·min(G·k/Z, 1)",
            f"4·{Bg:.4g}·{ctx.D:g}·({ep.Z}−{ep.G})/({_fmt(ep.W_node)}·{ep.Z})·min({ep.G}·{ep.k}/{ep.Z}, 1)",
            t,
            "s",
            _COMM,
            _COMP,
            f"asked = T_math = 4·B·k·D·F/(Z·C) = {t_math:.4g} s (forward; the backward doubles both)",
            t_math,
            _side(t_math, t, _COMM, _COMP),
        )
    )


def _ep_fsdp(ctx: _Ctx, part: _Part, ep: _EP) -> None:
    if ep.deg.fsdp < 2:
        part.skipped["ep_fsdp_min_tokens_per_chip"] = "no FSDP / DP axis beside EP in the plan"
        return
    bw = axis_bandwidth(_mesh(ctx.system, ep.deg), "fsdp")
    part.bandwidths["W_X(fsdp, beside ep)"] = bw
    v = ep_fsdp_min_tokens_per_chip(ctx.C, bw.bytes_per_s, ep.E, ep.k, ep.Z)
    part.limits.append(
        Limit(
            "ep_fsdp_min_tokens_per_chip",
            f"EP={ep.Z} with FSDP / DP of the experts: smallest batch per chip that stays compute-bound",
            "B/N > (E/(k·Z)) · C / W_X",
            f"({ep.E}/({ep.k}·{ep.Z})) · {_fmt(ctx.C)} / {_fmt(bw.bytes_per_s)}",
            v,
            "tokens per chip",
            _COMM + " (the experts' weight gathers / gradient reductions)",
            _COMP,
            _w_note(bw, "W_X") + "; gpus.md's (E/k)·C/W with each chip holding E/Z experts",
            ctx.per_chip,
            _side(ctx.per_chip, v, _COMM, _COMP),
        )
    )


def limits(
    model: ModelSpec,
    system: System,
    *,
    strategy: str | LimitStrategy | None = None,
    batch_tokens: float | None = None,
    plan: str | Degrees | None = None,
    weight_dtype: str | None = None,
    activation_dtype: str | None = None,
) -> LimitsReport:
    """Every closed-form limit of `strategy` (all of them when None) for `model` on `system`.

    `batch_tokens` is the global batch (training) or the decode batch per replica; with it each
    limit also says on which side the asked configuration sits. `plan` ("fsdp=256,tp=16")
    fixes the degrees a strategy is evaluated at; by default TP takes the innermost axis (the
    NVLink domain, or the innermost ICI axis) and FSDP the rest, pipelining 8 stages.
    With all strategies, one that cannot be built on this system is listed in `skipped`.
    """
    ctx = _context(model, system, batch_tokens, plan, weight_dtype, activation_dtype)
    wd = parse_dtype(weight_dtype or system.chip.default_dtype)
    ad = parse_dtype(activation_dtype or system.chip.default_dtype)
    builders = {
        LimitStrategy.FSDP: lambda: _part_fsdp(ctx),
        LimitStrategy.TP: lambda: _part_tp(ctx),
        LimitStrategy.FSDP_TP: lambda: _part_mixed(ctx),
        LimitStrategy.ZERO3_PP: lambda: _part_pp(ctx),
        LimitStrategy.DECODE: lambda: _part_decode(ctx, wd, ad),
        LimitStrategy.EP: lambda: _part_ep(ctx),
    }
    chosen = [parse_strategy(strategy)] if strategy is not None else list(LimitStrategy)
    total, skipped = _Part(), {}
    for s in chosen:
        try:
            part = builders[s]()
        except RooflineError as e:
            if strategy is not None:
                raise
            skipped[s.value] = str(e)
            continue
        total.plans.update(part.plans)
        total.bandwidths.update(part.bandwidths)
        total.limits.extend(x for x in part.limits if x.key not in {y.key for y in total.limits})
        skipped.update(part.skipped)
    return LimitsReport(
        model.name,
        system.name,
        strategy if strategy is None else parse_strategy(strategy).value,
        total.plans,
        ctx.C,
        total.bandwidths,
        tuple(total.limits),
        skipped,
    )


def _context(
    model: ModelSpec,
    system: System,
    batch: float | None,
    plan: str | Degrees | None,
    weight_dtype: str | None,
    activation_dtype: str | None,
) -> _Ctx:
    from roofline.specs.plan import parse_degrees

    if batch is not None and (not math.isfinite(batch) or batch <= 0):
        raise PlanError(
            f"batch = {batch!r} tokens",
            rule="a batch is a positive finite number of tokens",
            fix="give e.g. --batch 4M",
        )
    deg = plan if isinstance(plan, Degrees) or plan is None else parse_degrees(plan)[0]
    if deg is not None:
        _mesh(system, deg)  # a plan that does not fit the system is the caller's error
    chip = system.chip
    wd = parse_dtype(weight_dtype or chip.default_dtype)
    ad = parse_dtype(activation_dtype or chip.default_dtype)
    F = float(model.moe.d_ff_expert if model.moe is not None else model.d_ff)
    return _Ctx(
        model,
        system,
        chip.peak(_wider(wd, ad)),
        float(model.d_model),
        F,
        batch,
        DTYPE_BYTES[wd],
        DTYPE_BYTES[ad],
        deg,
    )
