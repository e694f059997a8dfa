"""Point-to-point transfers, many-to-one gathers, host-to-HBM loads and the network's capacities.

Book `tpus.md` (Q5, Q6) and `gpus.md` (Quiz 2-4), read on the same `System` records the
collectives use (each physical dim's per-chip one-way bandwidth, wraparound and hop latency):

- point to point on a TPU torus: the hops along each ICI axis are `|Δ|` on an open line and
  `min(|Δ|, n-|Δ|)` on a ring; the message splits over one link per axis it moves along (both
  directions of a ring when the peer is exactly half way round), so `T = bytes/(links·W)`
  and the first byte arrives after `hops·T_hop` (Q5: 1.7e7 B from (0,0) to (3,3) of a v5e 4x4:
  2 links x 4.5e10 -> ~188 µs, 6 hops -> ~6 µs);
- point to point on a GPU cluster: one NVSwitch hop inside the NVLink domain at the GPU's
  NVLink bandwidth, otherwise through the GPU's NIC at its scale-out share, one switch per
  tier climbed up and down;
- many-to-one: the receiver's ingress links bound it (Q6: 15 GB into a corner chip's 2 links
  of 4.5e10 -> 167 ms);
- host to HBM: each chip's host link (PCIe) carries its share, `T = bytes/(N·W_pcie)` (Q6:
  16 GB over 16 links of 1.6e10 -> 63 ms);
- between TPU slices (`slice:x,y` chips, or bare slice indices for whole slices): over the
  DCN, a chip's share of its host's DCN egress when every chip sends, `min(W_pcie,
  chips_per_host·W_dcn)` for one chip alone;
- capacities: per tier, the cable bandwidth (chips x per-chip bandwidth) and the bisection
  (book gpus.md Quiz 2: an 8-GPU H100 node has 8·450e9 = 3.6 TB/s of GPU egress and a 3.6 TB/s
  bisection, counting both directions across the cut).

Left out: routing contention from other traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from roofline.core.collectives import switch_capacity, switched_bw
from roofline.errors import PlanError
from roofline.specs.system import DimKind, PhysDim, System

_AXIS_NAMES = ("x", "y", "z", "w")


@dataclass(frozen=True)
class Transfer:
    """One transfer: its path, the links it splits over, and its times (seconds)."""

    kind: str  # "p2p", "gather", "host-load"
    bytes: float
    hops: int
    links: int
    bw_bytes_per_s: float  # total over the links
    t_first_byte_s: float
    t_bandwidth_s: float
    formula: str
    substitution: str
    path: str

    @property
    def time_s(self) -> float:
        """First byte plus the stream: `hops·T_hop + bytes/(links·W)`."""
        return self.t_first_byte_s + self.t_bandwidth_s

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["time_s"] = self.time_s
        return out


def _tpu_dims(system: System, *, slices: bool = False) -> list[PhysDim | None]:
    """The ICI dim of each topology axis (None for an axis of size 1); `slices`: a multi-slice
    system's ICI dims (the same in every slice)."""
    if not system.is_tpu or (system.n_slices > 1 and not slices):
        raise PlanError(
            f"system {system.name}: coordinates name chips of one TPU slice",
            rule="point-to-point coordinates are (x, y[, z]) inside one ICI slice",
            fix="give a single-slice TPU system, e.g. tpu-v5e:4x4, or GPU ranks for a GPU cluster",
        )
    by_name = {d.name: d for d in system.dims}
    return [by_name.get(_AXIS_NAMES[i]) for i in range(len(system.topology))]


def parse_coord(text: str | tuple[int, ...], system: System) -> tuple[int, ...]:
    """'3,3' -> (3, 3) for a TPU slice (one index per topology axis); '12' -> (12,) a GPU rank."""
    parts = (
        tuple(text)
        if isinstance(text, tuple)
        else tuple(p.strip() for p in str(text).replace("x", ",").split(",") if p.strip())
    )
    shape = tuple(system.topology) if system.is_tpu else (system.n_chips,)
    try:
        coord = tuple(int(p) for p in parts)
    except ValueError:
        coord = ()
    if len(coord) != len(shape) or any(not 0 <= c < n for c, n in zip(coord, shape, strict=False)):
        want = "x".join(str(n) for n in shape)
        raise PlanError(
            f"chip {text!r} on {system.name}",
            rule=f"a chip is {'one index per axis of' if system.is_tpu else 'a rank in'} {want}, counted from 0",
            fix=f"write e.g. {','.join('0' for _ in shape)}",
        )
    return coord


def point_to_point(system: System, src: Any, dst: Any, nbytes: float) -> Transfer:
    """Send `nbytes` from chip `src` to chip `dst` (coordinates or ranks, see `parse_coord`).

    On a multi-slice TPU system a chip is `slice:x,y[,z]` and a bare `slice` index stands for
    every chip of that slice (see `_dcn_transfer`)."""
    _check_bytes(nbytes)
    if system.is_tpu and system.n_slices > 1:
        return _multislice(system, src, dst, nbytes)
    a, b = parse_coord(src, system), parse_coord(dst, system)
    if system.is_tpu:
        return _tpu_p2p(system, a, b, nbytes)
    return _gpu_p2p(system, a[0], b[0], nbytes)


def _tpu_p2p(system: System, a: tuple[int, ...], b: tuple[int, ...], nbytes: float) -> Transfer:
    hops, links, lat, W, steps = 0, 0, 0.0, 0.0, []
    for i, d in enumerate(_tpu_dims(system, slices=True)):
        delta = abs(a[i] - b[i])
        if d is None or delta == 0:
            continue
        h = min(delta, d.size - delta) if d.wraparound else delta
        n_links = 2 if d.wraparound and 2 * delta == d.size else 1
        hops, links, lat = hops + h, links + n_links, lat + h * d.hop_latency_s
        W = d.bw_bytes_per_s
        steps.append(
            f"{d.name}: {h} hop{'s' * (h != 1)} ({'ring' if d.wraparound else 'open line'})"
        )
    if links == 0:
        return _same_chip(nbytes)
    bw = links * W
    return Transfer(
        "p2p",
        nbytes,
        hops,
        links,
        bw,
        lat,
        nbytes / bw,
        "T = hops·T_hop + bytes / (links·W_link)",
        f"{hops}·{lat / hops:.3g} + {nbytes:.4g} / ({links}·{W:.3g})",
        "; ".join(steps),
    )


def _slice_of(text: Any, system: System) -> tuple[int, str | None]:
    """'1:3,3' -> (1, '3,3'); '1' -> (1, None): slice index, then the chip inside it (or all)."""
    head, sep, rest = str(text).partition(":")
    try:
        s = int(head.strip())
    except ValueError:
        s = -1
    if not 0 <= s < system.n_slices:
        raise PlanError(
            f"chip {text!r} on {system.name}",
            rule=f"on {system.n_slices} slices a chip is slice:coordinates (slice 0 to "
            f"{system.n_slices - 1}), or a bare slice index for every chip of that slice",
            fix=f"write e.g. 0:{','.join('0' for _ in system.topology)} or 1",
        )
    chip = rest.strip() if sep else ""
    return s, chip or None


def _multislice(system: System, src: Any, dst: Any, nbytes: float) -> Transfer:
    (sa, ca), (sb, cb) = _slice_of(src, system), _slice_of(dst, system)
    if (ca is None) != (cb is None):
        raise PlanError(
            f"--from {src} --to {dst}",
            rule="both ends are chips (slice:coordinates) or both are whole slices (a slice index)",
            fix=f"write e.g. --from {sa} --to {sb}",
        )
    if ca is not None:
        a, b = parse_coord(ca, system), parse_coord(cb, system)
        if sa == sb:
            return _tpu_p2p(system, a, b, nbytes)
    elif sa == sb:
        return _same_chip(nbytes)
    return _dcn_transfer(system, sa, sb, ca, cb, nbytes)


def _dcn_transfer(
    system: System, sa: int, sb: int, ca: str | None, cb: str | None, nbytes: float
) -> Transfer:
    """Between slices over the data-center network (tpus.md: TPU -> PCIe -> host NIC -> DCN ->
    host -> PCIe -> HBM). Every chip of a slice sending its 1/n: each gets its share of its
    host's DCN egress (the dcn dim's per-chip bandwidth, as the collectives charge), bounded by
    its host link. One chip alone: its host link and its host's whole NIC (chips per host x
    that share), `min(W_pcie, chips_per_host·W_dcn)`. First byte: the DCN hop latency."""
    dcn = next(d for d in system.dims if d.kind is DimKind.DCN)
    pcie = system.host_bw_bytes_per_s or math.inf
    per_host = math.prod(system.chip.host_topology) if system.chip.host_topology else 1
    if ca is None:
        n = system.n_chips // system.n_slices
        w = min(dcn.bw_bytes_per_s, pcie)
        formula = "T = T_dcn + bytes / (chips·min(W_dcn, W_pcie))"
        sub = f"{dcn.hop_latency_s:.3g} + {nbytes:.4g} / ({n}·{w:.3g})"
        path = (
            f"slice {sa} -> slice {sb}: each of {n} chips sends its 1/{n} over its host's DCN share"
        )
        links, bw = n, n * w
    else:
        bw = min(pcie, per_host * dcn.bw_bytes_per_s)
        formula = "T = T_dcn + bytes / min(W_pcie, chips_per_host·W_dcn)"
        sub = f"{dcn.hop_latency_s:.3g} + {nbytes:.4g} / min({system.host_bw_bytes_per_s or math.inf:.3g}, {per_host}·{dcn.bw_bytes_per_s:.3g})"
        path = f"chip {sa}:{ca} -> chip {sb}:{cb}: host link, host NIC, DCN, host NIC, host link"
        links = 1
    return Transfer("dcn", nbytes, 1, links, bw, dcn.hop_latency_s, nbytes / bw, formula, sub, path)


def _same_chip(nbytes: float, kind: str = "p2p") -> Transfer:
    """Nothing crosses a link (bandwidth 0 stands for "no link used")."""
    return Transfer(
        kind, nbytes, 0, 0, 0.0, 0.0, 0.0, "T = 0", "the data is already there", "no link"
    )


def _gpu_coords(system: System, rank: int) -> list[int]:
    out = []
    for d in reversed(system.dims):
        out.append(rank % d.size)
        rank //= d.size
    return out[::-1]  # outermost first, as system.dims


def _gpu_p2p(system: System, a: int, b: int, nbytes: float) -> Transfer:
    if a == b:
        return _same_chip(nbytes)
    ca, cb = _gpu_coords(system, a), _gpu_coords(system, b)
    top = next(i for i, (x, y) in enumerate(zip(ca, cb, strict=True)) if x != y)
    crossed = system.dims[top:]  # the highest tier that differs, and everything below it
    d = system.dims[top]
    W = d.bw_bytes_per_s
    switches = 1 if d.kind is DimKind.NVLINK else 2 * (len(system.dims) - top) - 3
    lat = sum(t.hop_latency_s for t in crossed if t.kind is not DimKind.NVLINK or t is d)
    return Transfer(
        "p2p",
        nbytes,
        max(switches, 1),
        1,
        W,
        lat,
        nbytes / W,
        "T = T_first_byte + bytes / W_tier",
        f"{lat:.3g} + {nbytes:.4g} / {W:.3g}",
        f"through {d.name} ({max(switches, 1)} switch{'es' * (switches > 1)}), GPU {a} -> GPU {b}",
    )


def gather_to_one(system: System, dst: Any, nbytes_total: float) -> Transfer:
    """Every chip sends its 1/N of `nbytes_total` to chip `dst`: its ingress links bound it."""
    _check_bytes(nbytes_total)
    c = parse_coord(dst, system)
    if system.n_chips == 1:
        return _same_chip(nbytes_total, "gather")
    moved = nbytes_total * (system.n_chips - 1) / system.n_chips
    if not system.is_tpu:
        return _gpu_gather(system, moved, nbytes_total)
    links, W, far = 0, 0.0, 0
    for i, d in enumerate(_tpu_dims(system)):
        if d is None:
            continue
        edge = c[i] in (0, d.size - 1)
        links += 2 if d.wraparound or not edge else 1
        W = d.bw_bytes_per_s
        far += d.size // 2 if d.wraparound else max(c[i], d.size - 1 - c[i])
    lat = far * system.dims[-1].hop_latency_s
    return Transfer(
        "gather",
        nbytes_total,
        far,
        links,
        links * W,
        lat,
        moved / (links * W),
        "T = bytes·(N-1)/N / (ingress links·W_link)",
        f"{nbytes_total:.4g}·{system.n_chips - 1}/{system.n_chips} / ({links}·{W:.3g})",
        f"into chip {','.join(map(str, c))} over its {links} ICI link{'s' * (links > 1)}",
    )


def _gpu_gather(system: System, moved: float, total: float) -> Transfer:
    inner = system.dims[-1]
    N = system.n_chips
    local = total * (inner.size - 1) / N
    remote = moved - local
    t_local = local / inner.bw_bytes_per_s
    outer = system.dims[-2] if len(system.dims) > 1 else None
    t_remote = 0.0 if outer is None else remote / outer.bw_bytes_per_s
    t = max(t_local, t_remote)
    return Transfer(
        "gather",
        total,
        1,
        1,
        moved / t,
        sum(d.hop_latency_s for d in system.dims),
        t,
        "T = max(in-domain bytes / W_nvlink, off-domain bytes / W_nic)",
        f"{local:.4g} / {inner.bw_bytes_per_s:.3g}"
        if outer is None
        else f"max({local:.4g} / {inner.bw_bytes_per_s:.3g}, {remote:.4g} / {outer.bw_bytes_per_s:.3g})",
        "into one GPU: its NVLink ingress for its domain, its NIC for the rest",
    )


def host_to_hbm(system: System, nbytes: float, *, chips: int | None = None) -> Transfer:
    """Load `nbytes` from host memory into HBM, spread over `chips` (all by default), each over
    its own host link (PCIe): `T = bytes/(chips·W_pcie)`."""
    _check_bytes(nbytes)
    W = system.host_bw_bytes_per_s
    if W is None:
        raise PlanError(
            f"system {system.name} has no host-link bandwidth",
            rule="host-to-HBM loads need pcie_bw_bytes_per_s in the chip file (or host_bw_bytes_per_s in a system file)",
            fix="add it, or choose a chip whose file gives it",
        )
    n = system.n_chips if chips is None else chips
    if not 1 <= n <= system.n_chips:
        raise PlanError(
            f"{n} chips on {system.name}",
            rule=f"a host load spreads over 1 to {system.n_chips} chips",
            fix="give --chips within the system",
        )
    return Transfer(
        "host-load",
        nbytes,
        0,
        n,
        n * W,
        0.0,
        nbytes / (n * W),
        "T = bytes / (chips·W_pcie)",
        f"{nbytes:.4g} / ({n}·{W:.3g})",
        f"host memory -> HBM over {n} host link{'s' * (n > 1)}",
    )


@dataclass(frozen=True)
class TierCapacity:
    """One physical dim seen as a tier of the network."""

    name: str
    kind: str
    chips_below: int  # chips inside one group of this tier (and the tiers below)
    per_chip_bw_bytes_per_s: float
    cable_bw_bytes_per_s: float  # one group's chips x per-chip bandwidth, one way
    bisection_bw_bytes_per_s: float  # across a cut of one group in halves, both directions
    switch_bw_bytes_per_s: float | None = (
        None  # the switches of one group (None: not in the records)
    )
    # what a collective gets per chip at this tier: min(per-chip bandwidth, switches / chips)
    collective_bw_bytes_per_s: float = 0.0
    switch_bound: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def capacities(system: System) -> list[TierCapacity]:
    """Each tier's cable and bisection bandwidth, innermost first.

    Switched tiers (NVLink, scale-out, DCN) are fat trees: a cut of a group of n chips into
    halves carries n/2 chips' bandwidth each way (`n·W` both ways; H100 node: 8·450e9 = 3.6 TB/s,
    gpus.md Quiz 2), W capped by the group's switches, `min(w, S/n)` (a tapered tier, see
    core.collectives). An ICI axis of size n cut in half crosses the
    other axes' chips once (open line) or twice (ring) per direction.
    """
    out, below = [], 1
    for d in reversed(system.dims):
        below *= d.size
        cable = below * d.bw_bytes_per_s
        w, capped = switched_bw(system, d)
        if d.kind is DimKind.ICI:
            cross = below // d.size * (2 if d.wraparound else 1)
            bisect = 2 * cross * d.bw_bytes_per_s
        else:
            bisect = below * w
        sw = switch_capacity(system, d)
        out.append(
            TierCapacity(
                d.name,
                d.kind.value,
                below,
                d.bw_bytes_per_s,
                cable,
                bisect,
                sw,
                w,
                capped is not None,
            )
        )
    return out


def _check_bytes(nbytes: float) -> None:
    if not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes <= 0:
        raise PlanError(
            f"bytes = {nbytes!r}",
            rule="a transfer moves a positive finite number of bytes",
            fix="give e.g. --bytes 16e9",
        )
