"""Time of AllGather / ReduceScatter / AllReduce / AllToAll / permute over mesh axes.

`collective_cost(kind, bytes_per_chip, axes, mesh)` returns a frozen `CollectiveCost`
with the latency term, the bandwidth term (`time = max(latency, bandwidth)`, book
`sharding.md`: `T = max(T_min·ΣX_i/2, V/(W·M))`), the tier that bounds it, and the
arithmetic as a string.

Convention for `bytes_per_chip` (B below):
- AllGather: the gathered OUTPUT per chip (the book's V for an unsharded gather; for
  `AllGather_X([B_X, D_Y])` it is the full array / |Y|).
- ReduceScatter: the unreduced INPUT per chip. AllReduce: the buffer per chip.
- AllToAll: the per-chip buffer (the book's V is the whole array = N·B).
- Permute: the bytes each chip sends.
`bytes_per_chip` may be a numpy array: every time field is then an array (vectorised for
the planner). Cost is linear in bytes, so `seconds_per_byte` lets a caller re-price:
`time = max(latency_s, seconds_per_byte * bytes)`.

How a group's physical segments (innermost first, see `Mesh.segments`) become stages:
consecutive ICI segments form one torus stage (their bandwidths add, book `sharding.md`
"multiple axes"); every switched dim (NVLink, a scale-out tier, DCN) is its own stage,
combined hierarchically as in `gpus.md` ("a ring reduction at each layer, mostly
overlapped"): the bandwidth term is the max over stages, the latency the sum.

Switch capacity (gpus.md's SuperPod table, "Switch Bandwidth"; Quiz 4 Q4): every chip of a
switched tier's group runs its copy of the collective at once (SPMD), so the tier's switches
carry up to `P·w` (P chips in one group of that tier, w each); when the group's switches
carry less (`S < P·w`: a tapered or oversubscribed tier) each chip gets `min(w, S/P)` at that
tier. With the book's records the cables bind first (node 6.4 TB/s of NVSwitch over 3.6 TB/s
of GPU egress; leaf 25.6 over 12.8; spine 51.2 over 51.2); Appendix B's spine of 16 x 1.6 =
25.6 TB/s (`[switch_bw] spine = 25.6e12` in a system file) gives 25 GB/s per GPU there, and
Quiz 4 Q4's spine-level AllReduce `2DF/6.4e12`.

Left out: achieved-bandwidth efficiency (that comes from an efficiency profile, not here),
tree algorithms, contention between different collectives running at the same time.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from roofline.core.mesh import Mesh, Segment
from roofline.errors import SpecError
from roofline.memo import IdentityMemo
from roofline.specs.system import NODES_PER_SU, DimKind, PhysDim, System

# gpus.md: SHARP in practice gives ~30% more AllReduce bandwidth (NCCL 2.27.5, 8xH100:
# ~370 -> ~480 GB/s), not the theoretical ~75-100%. Pass sharp_speedup=SHARP_PRACTICAL_SPEEDUP
# to use it; the default (None) is the book's theoretical T = bytes / W per tier.
SHARP_PRACTICAL_SPEEDUP = 1.3


class CollectiveKind(enum.StrEnum):
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_REDUCE = "all-reduce"
    ALL_TO_ALL = "all-to-all"
    PERMUTE = "permute"


_KIND_ALIASES = {
    "allgather": CollectiveKind.ALL_GATHER,
    "ag": CollectiveKind.ALL_GATHER,
    "gather": CollectiveKind.ALL_GATHER,
    "reducescatter": CollectiveKind.REDUCE_SCATTER,
    "rs": CollectiveKind.REDUCE_SCATTER,
    "psumscatter": CollectiveKind.REDUCE_SCATTER,
    "allreduce": CollectiveKind.ALL_REDUCE,
    "ar": CollectiveKind.ALL_REDUCE,
    "psum": CollectiveKind.ALL_REDUCE,
    "alltoall": CollectiveKind.ALL_TO_ALL,
    "a2a": CollectiveKind.ALL_TO_ALL,
    "permute": CollectiveKind.PERMUTE,
    "ppermute": CollectiveKind.PERMUTE,
    "collectivepermute": CollectiveKind.PERMUTE,
    "p2p": CollectiveKind.PERMUTE,
    "sendrecv": CollectiveKind.PERMUTE,
}


def parse_collective_kind(name: str | CollectiveKind) -> CollectiveKind:
    """'all-gather', 'allgather', 'AG', 'reduce-scatter', 'RS', 'AR', 'A2A', 'permute', ..."""
    if isinstance(name, CollectiveKind):
        return name
    key = "".join(ch for ch in str(name).lower() if ch.isalnum())
    if key in _KIND_ALIASES:
        return _KIND_ALIASES[key]
    raise SpecError(
        f"unknown collective {name!r}",
        rule="collectives are all-gather (AG), reduce-scatter (RS), all-reduce (AR), all-to-all (A2A), permute",
        fix="write e.g. all-gather",
    )


@dataclass(frozen=True)
class TierTerm:
    """One stage of a collective: its bandwidth cost per byte of `bytes_per_chip` and its latency."""

    name: str  # e.g. "ici x+y (wraparound)", "nvlink", "leaf (node egress)", "dcn"
    kind: str  # DimKind value
    size: int  # members of the group at this stage (D_i)
    inner: int  # P_{i-1}: members of this collective's group below this stage
    seconds_per_byte: float
    latency_s: float
    detail: str  # the arithmetic of this stage

    @property
    def bytes_per_s(self) -> float:
        """Effective bandwidth of this stage: bytes_per_chip / time (inf if free)."""
        return math.inf if self.seconds_per_byte == 0 else 1.0 / self.seconds_per_byte

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "size": self.size,
            "inner": self.inner,
            "seconds_per_byte": self.seconds_per_byte,
            "bytes_per_s": self.bytes_per_s,
            "latency_s": self.latency_s,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class CollectiveCost:
    """Cost of one collective. Times are floats, or numpy arrays when bytes_per_chip is an array."""

    kind: CollectiveKind
    axes: tuple[str, ...]
    group_size: int
    bytes_per_chip: Any
    wire_bytes_per_chip: Any  # bytes each chip sends on the wire (originated, not forwarded)
    time_s: Any
    latency_s: float
    bandwidth_s: Any
    latency_bound: Any
    bottleneck: str
    seconds_per_byte: float
    formula: str
    tiers: tuple[TierTerm, ...] = ()

    @property
    def latency_bound_below_bytes(self) -> float:
        """bytes_per_chip below which the latency term wins (0 if there is no latency)."""
        if self.seconds_per_byte == 0:
            return math.inf if self.latency_s > 0 else 0.0
        return self.latency_s / self.seconds_per_byte

    @property
    def algo_bw_bytes_per_s(self) -> Any:
        """bytes_per_chip / time_s (the 'algorithm bandwidth' of NCCL tests)."""
        b = np.asarray(self.bytes_per_chip, dtype=float)
        t = np.asarray(self.time_s, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(t > 0, b / np.where(t > 0, t, 1.0), np.inf)
        return float(out) if out.ndim == 0 else out

    def time_for(self, bytes_per_chip: Any) -> Any:
        """Time for another size over the same group: max(latency, seconds_per_byte * bytes)."""
        if self.group_size == 1:
            return 0.0 if np.ndim(bytes_per_chip) == 0 else np.zeros(np.shape(bytes_per_chip))
        out = collective_time(self.latency_s, self.seconds_per_byte, bytes_per_chip)
        return float(out) if np.ndim(out) == 0 else out

    @property
    def unit(self) -> UnitCost:
        """This collective's group as a unit cost (to price other sizes)."""
        if not self.tiers:
            return UnitCost(0.0, 0.0)
        worst = max(self.tiers, key=lambda t: t.seconds_per_byte)
        return UnitCost(self.latency_s, self.seconds_per_byte, _TIER_OF_DIM[worst.kind])

    def to_dict(self) -> dict[str, Any]:
        def conv(x: Any) -> Any:
            if isinstance(x, np.ndarray):
                return x.tolist()
            if isinstance(x, np.generic):
                return x.item()
            return x

        return {
            "kind": self.kind.value,
            "axes": list(self.axes),
            "group_size": self.group_size,
            "bytes_per_chip": conv(self.bytes_per_chip),
            "wire_bytes_per_chip": conv(self.wire_bytes_per_chip),
            "time_s": conv(self.time_s),
            "latency_s": self.latency_s,
            "bandwidth_s": conv(self.bandwidth_s),
            "latency_bound": conv(self.latency_bound),
            "bottleneck": self.bottleneck,
            "seconds_per_byte": self.seconds_per_byte,
            "latency_bound_below_bytes": self.latency_bound_below_bytes,
            "formula": self.formula,
            "tiers": [t.to_dict() for t in self.tiers],
        }


def collective_time(latency_s: Any, seconds_per_byte: Any, bytes_per_chip: Any) -> Any:
    """The one formula for a collective's time (book sharding.md): T = max(T_latency, B · s/B).

    Vectorised over any argument; every caller that re-prices a collective uses this.
    """
    if (
        type(latency_s) is float
        and type(seconds_per_byte) is float
        and type(bytes_per_chip) is float
    ):
        bw = seconds_per_byte * bytes_per_chip  # floats (a single plan): numpy's maximum, NaN too
        return latency_s if latency_s >= bw or latency_s != latency_s else bw
    return np.maximum(latency_s, seconds_per_byte * np.asarray(bytes_per_chip, dtype=float))


# gpus.md, the DGX H100 SuperPod reference: InfiniBand switches of 64 ports, one port per GPU
# NIC (NDR: 50 GB/s, so 3.2 TB/s a switch), 8 leaf switches per scalable unit of 32 nodes, 16
# spine switches per 4 SUs. Other 8-GPU nodes take the same shape with ports as fast as their
# NICs (node egress / 8): a non-blocking fat tree whose cables bind first.
IB_PORTS_PER_SWITCH = 64
IB_SWITCH_BW_BYTES_PER_S = IB_PORTS_PER_SWITCH * 50e9  # the book's H100 number
IB_SWITCHES_PER_SU = {"leaf": 8, "spine": 4}


def _group_chips(system: System, d: PhysDim) -> int:
    """Chips in one group of tier `d`: its size times every dim inside it."""
    i = next(j for j, x in enumerate(system.dims) if x.name == d.name)
    return math.prod(x.size for x in system.dims[i:])


def switch_capacity(system: System, d: PhysDim) -> float | None:
    """Switch capacity of one group of tier `d`, one way (None: not in the records).

    A system file's `[switch_bw]` first; else the chip file's NVSwitches for the NVLink
    domain, and the SuperPod reference's InfiniBand switches for 8-GPU nodes (gpus.md, H100:
    node 6.4, scalable unit 25.6, 1024-GPU spine 51.2 TB/s).
    """
    given = dict(system.switch_bw)
    if d.name in given:
        return float(given[d.name])
    chip = system.chip
    if d.kind is DimKind.NVLINK:
        if chip.nvswitches_per_domain is None or chip.nvswitch_bw_bytes_per_s is None:
            return None
        return chip.nvswitches_per_domain * chip.nvswitch_bw_bytes_per_s
    if (
        d.kind is not DimKind.SCALEOUT
        or chip.nvlink_domain != 8
        or d.name not in IB_SWITCHES_PER_SU
    ):
        return None
    port = float(chip.node_egress_bytes_per_s or 0.0) / 8
    sus = _group_chips(system, d) / (8 * NODES_PER_SU)
    return IB_SWITCHES_PER_SU[d.name] * max(sus, 1.0) * IB_PORTS_PER_SWITCH * port or None


def switched_bw(system: System, d: PhysDim) -> tuple[float, float | None]:
    """(per-chip bandwidth a collective gets at tier `d`, the switch share S/P when it binds).

    `min(w, S/P)`: P chips of one group share its switches' capacity S (module doc).
    Remembered per (system, dim): every collective over the tier asks again (keyed by
    identity, System and PhysDim kept to check it; bounded)."""
    return _SWITCHED((system, d), (), lambda: _switched_bw(system, d))


def _switched_bw(system: System, d: PhysDim) -> tuple[float, float | None]:
    s = switch_capacity(system, d) if d.switched else None
    if s is None:
        return (d.bw_bytes_per_s, None)
    share = s / _group_chips(system, d)
    return (share, share) if share < d.bw_bytes_per_s else (d.bw_bytes_per_s, None)


_SWITCHED = IdentityMemo(4096)


# DimKind value of a tier -> the link tier name of the efficiency profile contract
_TIER_OF_DIM = {"ici": "ici", "nvlink": "nvlink", "scaleout": "scale_out", "dcn": "dcn"}


@dataclass(frozen=True)
class UnitCost:
    """What a collective over one group costs per byte: time = max(latency_s, seconds_per_byte · B).

    `tier` is the link tier that bounds the bandwidth term (ici, nvlink, scale_out, dcn), for
    the efficiency profile's `link_fraction`. A group of one chip costs nothing (all zero).
    """

    latency_s: float
    seconds_per_byte: float
    tier: str = "ici"

    def time_s(self, bytes_per_chip: Any) -> Any:
        return collective_time(self.latency_s, self.seconds_per_byte, bytes_per_chip)


def unit_cost(kind: CollectiveKind | str, axes: str | Iterable[str], mesh: Mesh) -> UnitCost:
    """The unit cost of a collective of `kind` over mesh `axes` (zero for a group of one):
    `collective_cost(...).unit` without its per-byte arrays and formula text."""
    k = parse_collective_kind(kind)
    names = mesh.resolve_axes(axes)
    sizes = mesh.sizes
    n = math.prod(sizes[a] for a in names)
    if n == 1:
        return UnitCost(0.0, 0.0)
    system = mesh.system
    terms = _stage_terms(
        k, system, mesh.segments(names), n, system.sharp, None, text=False,
        memo=_UNIT_TERMS((system,), (), dict),
    )  # fmt: skip
    worst = max(terms, key=lambda t: t.seconds_per_byte)
    latency = float(sum(t.latency_s for t in terms))
    return UnitCost(latency, worst.seconds_per_byte, _TIER_OF_DIM[worst.kind])


def moe_ragged_fraction(k: int, n: int, *, exact: bool = False) -> float:
    """Fraction of a dense AllToAll a top-k MoE dispatch over n shards sends.

    gpus.md: ≈ min(k/n, 1); the exact expectation with independent random choices is
    1 - ((n-1)/n)^k (expected distinct shards hit). Pass the result as `ragged_fraction`.
    """
    if k < 0 or n < 1:
        raise SpecError(
            f"moe_ragged_fraction(k={k}, n={n})",
            rule="k >= 0 experts per token over n >= 1 shards",
            fix="give valid counts",
        )
    if exact:
        return 1.0 - ((n - 1) / n) ** k
    return min(k / n, 1.0)


# -- per-segment ICI formulas (seconds per byte of B, for one segment alone) ---------------


def _w1(seg: Segment) -> float:
    """One-way per-chip bandwidth of a segment: a strided segment shares each link with `stride` groups."""
    return seg.dim.bw_bytes_per_s / seg.stride


def _ici_ag_t(seg: Segment) -> float:
    n = seg.size
    if seg.ring:
        # sharding.md: bidirectional ring, floor(N/2) hops of 2·B/N each way -> B/W_bidi (even N);
        # exactly: each chip receives ceil((N-1)/2) shards of B/N per incoming direction.
        return math.ceil((n - 1) / 2) / (n * _w1(seg))
    # sharding.md pop quiz 2 / tpus.md: no wraparound -> N-1 hops of B/N one way: (N-1)/N·B/W_1way ("typically doubles")
    return (n - 1) / (n * _w1(seg))


def _ici_hops(seg: Segment) -> int:
    # sharding.md: floor(N/2) hops around a ring, N-1 along an open line; a strided hop crosses `stride` links
    return (seg.size // 2 if seg.ring else seg.size - 1) * seg.stride


def _ici_a2a_t(seg: Segment) -> float:
    n = seg.size
    if seg.ring:
        # sharding.md: 1D bidirectional ring V/(4·W_bidi) = B·N/(8·W_1way); ND: V·max(X_i)/(4·N·W_bidi).
        # Per link (balanced split of the antipodal chunk): N²/8 chunks of V/N² (even N), (N²-1)/8 (odd N).
        return (n * n - (n % 2)) / (8 * n * _w1(seg))
    # open line (derived here; the book states only the ring): like its AllGather, the book models
    # no wraparound as a one-way ring, where AllToAll is half an AllGather (sharding.md Q10: N²(1-1/D)/2
    # scalars per link) -> per dim of size A: B·(A-1)/(2·W_1way); 4x the wraparound ring for large A
    return (n - 1) / (2 * _w1(seg))


def _ici_label(segs: list[Segment]) -> str:
    names = "+".join(
        s.dim.name
        + ("" if s.full else f"[{s.size}" + (f"/{s.stride}" if s.stride > 1 else "") + "]")
        for s in reversed(segs)
    )
    rings = [s.ring for s in segs]
    how = "wraparound" if all(rings) else ("open line" if not any(rings) else "mixed")
    return f"ici {names} ({how})"


def _per_dim(segs: list[Segment], fn) -> dict[str, float]:
    """Seconds per byte for each physical dim (segments sharing a dim run one after another)."""
    out: dict[str, float] = {}
    for s in segs:
        out[s.dim.name] = out.get(s.dim.name, 0.0) + fn(s)
    return out


def _switch_label(seg: Segment) -> str:
    d = seg.dim
    if d.kind is DimKind.SCALEOUT and d.name == "leaf":
        return "leaf (node egress)"
    return d.name


def _fmt_bw(x: float) -> str:
    return f"{x:.3g} B/s"


# -- stages ------------------------------------------------------------------------------


def _stages(segs: tuple[Segment, ...]) -> list[list[Segment]]:
    out: list[list[Segment]] = []
    for s in segs:
        if s.dim.kind is DimKind.ICI and out and out[-1][0].dim.kind is DimKind.ICI:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def _stage_terms(
    kind: CollectiveKind,
    system: System,
    segs: tuple[Segment, ...],
    n: int,
    sharp: bool,
    sharp_speedup: float | None,
    *,
    text: bool = True,
    memo: dict | None = None,
) -> list[TierTerm]:
    """Each stage's term; `text=False` leaves the labels and formula text empty (a unit cost
    reads only the numbers and the tier). `memo` (text=False only): `system`'s own table of
    switched stages' terms, which depend on the stage's dim, its size, the group size inside it
    and the whole group's (`_switched_term`), not on the rest of the group: a planner search
    prices hundreds of placements whose stages repeat (GPT-3 175B on a100:1024: 733 stages,
    115 distinct)."""
    terms: list[TierTerm] = []
    inner = 1
    for st in _stages(segs):
        d = math.prod(s.size for s in st)
        if st[0].dim.kind is DimKind.ICI:
            terms.append(_ici_term(kind, st, d, inner, n, text))
        elif memo is None or text:
            terms.append(
                _switched_term(kind, system, st[0], d, inner, n, sharp, sharp_speedup, text)
            )
        else:
            key = (kind, st[0].dim.name, d, inner, n, sharp, sharp_speedup)
            term = memo.get(key)
            if term is None:
                if len(memo) >= _MAX_UNIT_TERMS:
                    memo.clear()
                term = memo[key] = _switched_term(
                    kind, system, st[0], d, inner, n, sharp, sharp_speedup, False
                )
            terms.append(term)
        inner *= d
    return terms


# each system's switched stage terms without text, by (kind, dim name, stage size, inner group
# size, group size, SHARP, its speedup): by identity of the system (kept to check it); bounded
_UNIT_TERMS = IdentityMemo(256)
_MAX_UNIT_TERMS = 1 << 14


_REDUCTIONS = (
    CollectiveKind.ALL_GATHER,
    CollectiveKind.REDUCE_SCATTER,
    CollectiveKind.ALL_REDUCE,
)


def _ici_term(
    kind: CollectiveKind, st: list[Segment], d: int, inner: int, n: int, text: bool = True
) -> TierTerm:
    """One torus stage (consecutive ICI segments); `text`: with its label and formula text."""
    lat_hops = sum(_ici_hops(s) for s in st)
    hop_lat = sum(_ici_hops(s) * s.dim.hop_latency_s for s in st)
    if kind in _REDUCTIONS:
        # sharding.md: several axes at once -> bandwidths add: V/(M·W_ici); latency T_min·ΣX_i/2
        bw = sum(1.0 / t for t in _per_dim(st, _ici_ag_t).values())
        t = 1.0 / (inner * bw)
        lat = hop_lat
        detail = (
            f"B/{_fmt_bw(inner * bw)} over {len(st)} ICI segment(s), {lat_hops} hops"
            if text
            else ""
        )
        if kind is CollectiveKind.ALL_REDUCE:
            # sharding.md: AllReduce = ReduceScatter + AllGather = 2x
            t, lat = 2 * t, 2 * lat
            detail = "2 x (" + detail + ")" if text else ""
    elif kind is CollectiveKind.ALL_TO_ALL:
        frac = inner * d / n
        t = frac * max(_per_dim(st, _ici_a2a_t).values())
        lat = hop_lat
        detail = (
            f"max over dims of B·X/(8·W_1way) (ring) or B·(X-1)/(2·W_1way) (line), x {frac:.3g} in-group -> B/{_fmt_bw(1 / t)}"
            if text
            else ""
        )
    else:  # PERMUTE
        # one hop to the neighbour: bytes / W_1way + one hop latency
        t = max(1.0 / _w1(s) for s in st)
        lat = max(s.dim.hop_latency_s * s.stride for s in st)
        detail = f"B/{_fmt_bw(1 / t)} one hop" if text else ""
    label = _ici_label(st) if text else ""
    return TierTerm(label, DimKind.ICI.value, d, inner, t, lat, detail)


def _switched_term(
    kind: CollectiveKind,
    system: System,
    seg: Segment,
    d: int,
    inner: int,
    n: int,
    sharp: bool,
    sharp_speedup: float | None,
    text: bool = True,
) -> TierTerm:
    """One switched stage (NVLink, a scale-out tier, DCN), its per-chip bandwidth capped by
    the group's switches (module doc); `text`: with its label and formula text."""
    w, capped = switched_bw(system, seg.dim)
    ell = seg.dim.hop_latency_s
    if kind in _REDUCTIONS:
        # gpus.md: T = B·max_i (D_i-1)/(D_i·W_link,i), W_link,i = P_{i-1}·w_i for this collective's inner members
        t = (d - 1) / (d * inner * w)
        lat = (d - 1) * ell
        detail = f"B·({d}-1)/({d}·{inner}·{w:.3g})" if text else ""
        if kind is CollectiveKind.ALL_REDUCE:
            sharp_here = sharp and seg.dim.kind in (DimKind.NVLINK, DimKind.SCALEOUT)
            t, lat, detail = _all_reduce_stage(
                t, lat, detail, inner, w, ell, sharp_here, sharp_speedup
            )
    elif kind is CollectiveKind.ALL_TO_ALL:
        if seg.dim.kind is DimKind.NVLINK:
            # gpus.md: in-node AllToAll B_total·(N-1)/(W·N²) = B·(D-1)/(N·W): only in-domain traffic on NVLink
            frac = (inner * d - inner) / n
        else:
            # gpus.md: across M nodes B_total·(M-1)/(M²·W_node): everything leaving the inner group crosses this tier
            frac = (n - inner) / n
        t = frac / w
        lat = (d - 1) * ell
        detail = f"B·{frac:.4g}/{w:.3g}" if text else ""
    else:  # PERMUTE
        t, lat = 1.0 / w, ell
        detail = f"B/{w:.3g}" if text else ""
    if not text:
        return TierTerm("", seg.dim.kind.value, d, inner, t, lat, "")
    label = _switch_label(seg)
    if capped is not None:
        label += " (switch-bound)"
        detail += (
            f", w = S/P = {switch_capacity(system, seg.dim):.3g}/{_group_chips(system, seg.dim)}"
            f" = {w:.3g} < {seg.dim.bw_bytes_per_s:.3g}"
        )
    return TierTerm(label, seg.dim.kind.value, d, inner, t, lat, detail)


def _all_reduce_stage(
    t: float,
    lat: float,
    detail: str,
    inner: int,
    w: float,
    ell: float,
    sharp: bool,
    sharp_speedup: float | None,
) -> tuple[float, float, str]:
    """A switched stage's AllReduce from its ReduceScatter term: 2x, or SHARP's in-network reduction."""
    if sharp and sharp_speedup is None:
        # gpus.md: SHARP in-network reduction, T_AR = bytes / W (no (N-1)/N factor)
        return 1.0 / (inner * w), 2 * ell, f"SHARP: B/({inner}·{w:.3g})"
    if sharp:
        return 2 * t / sharp_speedup, 2 * ell, f"SHARP: 2·{detail}/{sharp_speedup:g}"
    return 2 * t, 2 * lat, "2·" + detail


def collective_cost(
    kind: CollectiveKind | str,
    bytes_per_chip: Any,
    axes: str | Iterable[str],
    mesh: Mesh,
    *,
    ragged_fraction: float = 1.0,
    sharp: bool | None = None,
    sharp_speedup: float | None = None,
) -> CollectiveCost:
    """Cost of a collective of `kind` over mesh `axes` with `bytes_per_chip` (see module doc).

    `ragged_fraction` (AllToAll only): fraction of the dense AllToAll actually sent, e.g.
    `moe_ragged_fraction(k, n)` for top-k MoE dispatch. `sharp`: in-network reduction for
    AllReduce on NVLink / scale-out tiers (default: `mesh.system.sharp`); `sharp_speedup`:
    None = theory (T_AR = bytes/W), or a measured gain over the ring AllReduce
    (`SHARP_PRACTICAL_SPEEDUP` = 1.3 per the book).
    """
    k = parse_collective_kind(kind)
    names = mesh.resolve_axes(axes)
    scalar = np.ndim(bytes_per_chip) == 0
    b = np.asarray(bytes_per_chip, dtype=float)
    _check_cost_args(k, b, bytes_per_chip, ragged_fraction, sharp_speedup)
    use_sharp = mesh.system.sharp if sharp is None else bool(sharp)
    n = mesh.size(names)

    def out(x: np.ndarray) -> Any:
        return float(x) if scalar else x

    if n == 1:
        zero = np.zeros_like(b)
        return CollectiveCost(
            k,
            names,
            1,
            bytes_per_chip,
            out(zero),
            out(zero),
            0.0,
            out(zero),
            False if scalar else np.zeros(b.shape, dtype=bool),
            "none",
            0.0,
            "group of 1: no communication",
            (),
        )
    segs = mesh.segments(names)
    terms = _stage_terms(k, mesh.system, segs, n, use_sharp, sharp_speedup)
    worst = max(terms, key=lambda t: t.seconds_per_byte)
    spb = worst.seconds_per_byte * (ragged_fraction if k is CollectiveKind.ALL_TO_ALL else 1.0)
    latency = float(sum(t.latency_s for t in terms))
    bandwidth = spb * b
    parts = "; ".join(f"{t.name}: {t.detail}" for t in terms)
    rag = f" x ragged {ragged_fraction:.3g}" if ragged_fraction != 1 else ""
    formula = (
        f"T = max(latency {latency * 1e6:.3g} µs, B x {spb:.4g} s/B{rag}) with bandwidth bound by {worst.name} "
        f"(max over stages of: {parts})"
    )
    return CollectiveCost(
        kind=k,
        axes=names,
        group_size=n,
        bytes_per_chip=bytes_per_chip,
        wire_bytes_per_chip=out(_wire_bytes(k, b, n, segs, use_sharp, ragged_fraction)),
        time_s=out(collective_time(latency, spb, b)),
        latency_s=latency,
        bandwidth_s=out(bandwidth),
        latency_bound=bool(latency > bandwidth) if scalar else latency > bandwidth,
        bottleneck=worst.name,
        seconds_per_byte=spb,
        formula=formula,
        tiers=tuple(terms),
    )


def _check_cost_args(
    k: CollectiveKind, b: np.ndarray, given: Any, ragged: float, sharp_speedup: float | None
) -> None:
    if not np.all(np.isfinite(b)) or np.any(b < 0):
        raise SpecError(
            f"bytes_per_chip = {given!r}",
            rule="a collective moves a finite, non-negative number of bytes",
            fix="give bytes >= 0",
        )
    if not (0 < ragged <= 1):
        raise SpecError(
            f"ragged_fraction = {ragged!r}",
            rule="a fraction in (0, 1]",
            fix="use e.g. moe_ragged_fraction(k, n)",
        )
    if ragged != 1 and k is not CollectiveKind.ALL_TO_ALL:
        raise SpecError(
            f"ragged_fraction = {ragged} for a {k.value}",
            rule="only AllToAll (MoE dispatch) can be ragged",
            fix="drop ragged_fraction",
        )
    if sharp_speedup is not None and not (sharp_speedup > 0):
        raise SpecError(
            f"sharp_speedup = {sharp_speedup!r}",
            rule="a positive factor",
            fix=f"use e.g. {SHARP_PRACTICAL_SPEEDUP}",
        )


def _wire_bytes(
    k: CollectiveKind, b: np.ndarray, n: int, segs, use_sharp: bool, ragged: float
) -> np.ndarray:
    """Bytes each chip sends on the wire (originated, not forwarded)."""
    if k in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER):
        return b * (n - 1) / n
    if k is CollectiveKind.ALL_REDUCE:
        all_sharp = use_sharp and all(
            s.dim.kind in (DimKind.NVLINK, DimKind.SCALEOUT) for s in segs
        )
        return b if all_sharp else 2 * b * (n - 1) / n
    if k is CollectiveKind.ALL_TO_ALL:
        return b * (n - 1) / n * ragged
    return b.copy()


__all__ = [
    "CollectiveKind",
    "CollectiveCost",
    "TierTerm",
    "collective_cost",
    "collective_time",
    "UnitCost",
    "unit_cost",
    "parse_collective_kind",
    "moe_ragged_fraction",
    "SHARP_PRACTICAL_SPEEDUP",
    "IB_SWITCH_BW_BYTES_PER_S",
    "switch_capacity",
    "switched_bw",
]
