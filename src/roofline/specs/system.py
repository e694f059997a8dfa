"""System: how many chips, and how they are connected (the physical dims of the network).

A `System` is a chip plus an ordered list of physical dims, OUTERMOST first:

- TPU slice `tpu-v5p:16x20x28` -> dims `x(16), y(20), z(28)` (ICI torus axes, as written;
  the last one is the innermost, where the last/fastest mesh axis lands), each with the
  wraparound the book allows (`tpus.md`: v5e/v6e only on axes of size 16, v4p/v5p/7x on
  axes that are multiples of 4; otherwise an open line).
- Multi-slice `2xtpu-v5p:16x20x28` -> an outer `dcn(2)` dim (data-center network).
- GPU cluster `h100:1024` -> `spine(4), leaf(32), nvlink(8)`: NVLink domains ("nodes") of
  `chip.nvlink_domain` GPUs, grouped into scalable units (SUs, 32 nodes under one leaf
  tier for 8-GPU nodes, `gpus.md` DGX SuperPod), SUs joined by the spine.
  `gb200-nvl72:N` -> 72-GPU NVLink domains (node egress 3.6 TB/s per domain). Racks may be
  partly used: N that is not a multiple of 72 spreads over equal domains of whole 4-GPU
  trays (`gb200:256` = 4 domains of 64; the chip's `gpus_per_tray`), the most GPUs per domain
  that divides N.
- AMD `mi300x:N` (and mi325x, mi355x) -> 8-GPU nodes fully connected by Infinity Fabric, a dim
  named `xgmi` of kind NVLINK (any peer one hop away; bandwidth = all 7 links together).
- Sizes are bounded where they stop being physical: at most MAX_CHIPS = 2^20 chips.

Every dim carries a per-chip, one-direction bandwidth (`bw_bytes_per_s`):

| kind     | bw_bytes_per_s (per chip, one direction)                                   |
|----------|-----------------------------------------------------------------------------|
| ICI      | one link one way (`chip.ici_link_bw_bytes_per_s`); the ring formula decides |
|          | whether both directions / both neighbours are used                          |
| NVLINK   | the GPU's NVLink egress (`chip.nvlink_bw_bytes_per_s`, H100 450e9)          |
| SCALEOUT | node egress / GPUs per node (rail-optimised: H100 400e9/8 = 50e9 per GPU)   |
| DCN      | per-chip DCN egress (`chip.dcn_bw_bytes_per_s`, v5p 6.25e9)                 |

The spine defaults to the same per-GPU bandwidth as the leaf (the book's SuperPod table:
a fat tree with "constant bandwidth between any two pairs of nodes", 51.2 TB/s). The
book's Appendix B / Quiz 4 Q4 instead count 25.6 TB/s of spine *switch* capacity (25 GB/s
per GPU): pass `tier_bw={"spine": 25e9}` for that reading (digest §14 item 10).

Hop latencies (`hop_latency_s`, one ring step): ICI from the chip file (book: ~1 µs per hop).
For GPUs the book gives none; the defaults below follow NCCL's own cost model
(`src/graph/tuning.cc`, `hwLat`: a ring step costs ~0.6 µs (LL) to ~1.9 µs (LL128) on NVLink
and ~2.7-4 µs over the network), rounded to 1 µs (NVLink) and 3 µs (scale-out). DCN uses
10 µs, a documented guess (the book gives no DCN latency).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roofline.errors import SpecError
from roofline.specs.catalog import (
    DATA_DIR,
    check_bool,
    check_int,
    check_name_length,
    check_number,
    check_str,
    is_file,
    read_toml,
)
from roofline.specs.chip import Chip, load_chip
from roofline.specs.schema import check as check_schema
from roofline.units import parse_quantity

SYSTEM_DIR = DATA_DIR / "systems"

NVLINK_HOP_LATENCY_S = 1e-6  # NCCL tuning.cc hwLat NVLink ring step 0.6-1.9 µs -> 1 µs
SCALEOUT_HOP_LATENCY_S = 3e-6  # NCCL tuning.cc hwLat network ring step 2.7-4 µs -> 3 µs
DCN_HOP_LATENCY_S = 10e-6  # documented guess; the book gives no DCN latency
NODES_PER_SU = 32  # gpus.md: DGX H100 SuperPod scalable unit = 32 nodes of 8 GPUs (256 GPUs)
NVL72_RACKS_PER_SU = 8  # NVIDIA GB200 SuperPod: 8 NVL72 racks (576 GPUs) per scalable unit
# Upper bounds where a size stops being physical: the largest clusters announced hold a few
# hundred thousand accelerators, so 2^20 chips (and a DCN of 4096 slices) is far beyond any.
MAX_CHIPS = 1 << 20
MAX_SLICES = 4096
MAX_BW_BYTES_PER_S = 1e15  # per chip, one way: ~1000x any link built
# The name of a GPU system's scale-up dim, by the chip's fabric.
_SCALEUP_DIM = {"NVLink": "nvlink", "Infinity Fabric": "xgmi"}


class DimKind(enum.StrEnum):
    """What a physical dim is made of."""

    ICI = "ici"  # TPU torus axis (nearest-neighbour links, ring or open line)
    NVLINK = "nvlink"  # GPU NVLink domain behind NVSwitches (all-to-all within the domain)
    SCALEOUT = "scaleout"  # GPU scale-out fat tree tier (InfiniBand/Ethernet leaf or spine)
    DCN = "dcn"  # data-center network between TPU slices


@dataclass(frozen=True)
class PhysDim:
    """One physical dimension of the network.

    `bw_bytes_per_s` is per chip, one direction (see the module table). `wraparound` only
    means something for ICI dims (a ring instead of an open line); switched dims reach any
    member in one step.
    """

    name: str
    kind: DimKind
    size: int
    bw_bytes_per_s: float
    wraparound: bool = False
    hop_latency_s: float = 1e-6

    def __post_init__(self) -> None:
        if (
            not isinstance(self.size, int)
            or isinstance(self.size, bool)
            or not 1 <= self.size <= MAX_CHIPS
        ):
            raise SpecError(
                f"physical dim {self.name!r}: size = {self.size!r}",
                rule=f"a dim size is a whole number from 1 to {MAX_CHIPS:,}",
                fix="give a size of 1 or more",
            )
        for key in ("bw_bytes_per_s", "hop_latency_s"):
            v = getattr(self, key)
            if (
                not isinstance(v, (int, float))
                or isinstance(v, bool)
                or not math.isfinite(v)
                or v < 0
                or (key == "bw_bytes_per_s" and not 0 < v <= MAX_BW_BYTES_PER_S)
                or (key == "hop_latency_s" and v > 1.0)
            ):
                bound = (
                    f"at most {MAX_BW_BYTES_PER_S:g}" if key == "bw_bytes_per_s" else "at most 1 s"
                )
                raise SpecError(
                    f"physical dim {self.name!r}: {key} = {v!r}",
                    rule=f"{key} is a positive finite number, {bound}",
                    fix=f"correct {key}",
                )
        object.__setattr__(self, "kind", DimKind(self.kind))

    @property
    def switched(self) -> bool:
        """True for switched tiers (NVLink, scale-out, DCN): any member is one step away."""
        return self.kind is not DimKind.ICI

    def describe(self) -> str:
        if self.kind is DimKind.ICI:
            return f"ici {self.name} ({'wraparound' if self.wraparound else 'open line'})"
        if self.kind is DimKind.SCALEOUT:
            return f"{self.name} (node egress)" if self.name == "leaf" else self.name
        return self.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind.value,
            "size": self.size,
            "bw_bytes_per_s": self.bw_bytes_per_s,
            "wraparound": self.wraparound,
            "hop_latency_s": self.hop_latency_s,
        }


@dataclass(frozen=True)
class System:
    """A set of chips and their network: `dims` ordered OUTERMOST -> INNERMOST.

    `usd_per_chip_hour` comes from the chip file unless overridden (None if unknown).
    `sharp`: switches do in-network reductions (NVIDIA SHARP / NVLS), see collectives.
    """

    name: str
    chip: Chip
    n_chips: int
    dims: tuple[PhysDim, ...]
    usd_per_chip_hour: float | None = None
    sharp: bool = False
    n_slices: int = 1
    topology: tuple[int, ...] = ()  # the ICI shape as written (TPU) or (nodes, gpus per node)
    description: str = ""
    # host memory, per chip: the host link (PCIe, one way) and the host DRAM behind it; default
    # from the chip file, a system file may set its own (host_bw_bytes_per_s, host_dram_bytes_per_chip)
    host_bw_bytes_per_s: float | None = None
    host_dram_bytes_per_chip: float | None = None
    # the host's DRAM bandwidth and CPU FLOP/s per chip (its Adam update under optimizer
    # offload); default from the chip file, a system file may set its own
    host_dram_bw_bytes_per_s: float | None = None
    host_flops_per_s: float | None = None
    # switch capacity of one group of a tier, one way, by dim name (a system file's [switch_bw]);
    # tiers not named take the chip file's NVSwitches / the SuperPod reference (core.collectives)
    switch_bw: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(self.dims))
        if self.host_bw_bytes_per_s is None:
            object.__setattr__(self, "host_bw_bytes_per_s", self.chip.pcie_bw_bytes_per_s)
        for k in ("host_dram_bytes_per_chip", "host_dram_bw_bytes_per_s", "host_flops_per_s"):
            if getattr(self, k) is None:
                object.__setattr__(self, k, getattr(self.chip, k))
        if not isinstance(self.n_chips, int) or self.n_chips < 1:
            raise SpecError(
                f"system {self.name!r}: n_chips = {self.n_chips!r}",
                rule="a system has a positive whole number of chips",
                fix="give at least one chip",
            )
        if self.n_chips > MAX_CHIPS:
            raise SpecError(
                f"system {self.name!r} has {self.n_chips:,} chips",
                rule=f"a system has at most {MAX_CHIPS:,} chips (2^20; the largest clusters "
                "announced hold a few hundred thousand)",
                fix="give a smaller chip count",
            )
        names = [d.name for d in self.dims]
        if len(set(names)) != len(names):
            raise SpecError(
                f"system {self.name!r}: dim names {names} repeat",
                rule="each physical dim has its own name",
                fix="rename the repeated dim",
            )
        prod = math.prod(d.size for d in self.dims)
        if prod != self.n_chips:
            raise SpecError(
                f"system {self.name!r}: dims {', '.join(f'{d.name}={d.size}' for d in self.dims)} hold {prod} chips but n_chips = {self.n_chips}",
                rule="the sizes of the physical dims multiply to the chip count",
                fix="correct a dim size or n_chips",
            )
        if self.usd_per_chip_hour is not None and (
            not isinstance(self.usd_per_chip_hour, (int, float))
            or isinstance(self.usd_per_chip_hour, bool)
            or not math.isfinite(self.usd_per_chip_hour)
            or self.usd_per_chip_hour < 0
        ):
            raise SpecError(
                f"system {self.name!r}: usd_per_chip_hour = {self.usd_per_chip_hour!r}",
                rule="a price is a finite number >= 0",
                fix="correct the price",
            )

    # -- helpers -----------------------------------------------------------------
    def __repr__(self) -> str:  # short: the name parse_system reads and what it holds
        return f"System({self.name!r}: {self.n_chips} x {self.chip.name})"

    def dim(self, name: str) -> PhysDim:
        for d in self.dims:
            if d.name == name:
                return d
        raise SpecError(
            f"system {self.name!r} has no physical dim {name!r}",
            rule="dims are " + ", ".join(d.name for d in self.dims),
            fix="use one of those names",
        )

    @property
    def is_tpu(self) -> bool:
        return self.chip.is_tpu

    @property
    def usd_per_hour(self) -> float | None:
        """Price of the whole system per hour (None if the chip has no price)."""
        return None if self.usd_per_chip_hour is None else self.usd_per_chip_hour * self.n_chips

    def with_options(self, **changes: Any) -> System:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "chip": self.chip.name,
            "n_chips": self.n_chips,
            "n_slices": self.n_slices,
            "topology": list(self.topology),
            "sharp": self.sharp,
            "usd_per_chip_hour": self.usd_per_chip_hour,
            "usd_per_hour": self.usd_per_hour,
            "dims": [d.to_dict() for d in self.dims],
            "description": self.description,
            "host_bw_bytes_per_s": self.host_bw_bytes_per_s,
            "host_dram_bytes_per_chip": self.host_dram_bytes_per_chip,
            "host_dram_bw_bytes_per_s": self.host_dram_bw_bytes_per_s,
            "host_flops_per_s": self.host_flops_per_s,
            "switch_bw": dict(self.switch_bw),
        }


# -- parsing -----------------------------------------------------------------------

_SPEC_RE = re.compile(
    r"^\s*(?:(?P<slices>\d+)\s*x\s*(?=\D))?(?P<chip>[^:+]+?)\s*(?::\s*(?P<shape>[^+]+?))?\s*(?P<opts>(?:\+\s*[a-z_-]+\s*)*)$",
    re.I,
)
_NVL_RE = re.compile(r"^(?P<base>.+?)-nvl(?P<n>\d+)$", re.I)


def parse_system(
    spec: str | Path | System,
    *,
    sharp: bool | None = None,
    usd_per_chip_hour: float | None = None,
    wraparound: bool | None = None,
    tier_bw: Mapping[str, float] | None = None,
    nodes_per_leaf: int | None = None,
) -> System:
    """A System from a spec string, a TOML file, or a System (options then apply on top).

    Spec strings: `tpu-v5p:16x20x28`, `v5e:4x4`, `2xtpu-v5p:16x20x28` (2 slices over DCN),
    `h100:1024`, `a100:64`, `gb200-nvl72:576`, with an optional `+sharp` suffix. A chip name
    alone means the full TPU pod or one GPU node.

    Options: `sharp` (in-network reductions), `usd_per_chip_hour` (price override),
    `wraparound` (True/False forces every ICI dim to a ring / an open line, e.g. the book's
    "ideal" bidirectional ring on a v5e 4x4), `tier_bw` ({dim name: per-chip bytes/s},
    e.g. `{"spine": 25e9}`), `nodes_per_leaf` (GPU nodes per scalable unit).
    """
    nodes_per_leaf = _option_int("nodes_per_leaf", nodes_per_leaf)
    if isinstance(spec, System):
        system = spec
    else:
        if not isinstance(spec, (str, Path)):
            raise SpecError(
                f"system {spec!r} is a {type(spec).__name__}",
                rule="a system is a spec string (h100:1024, tpu-v5p:16x20x28), a path to a TOML file, or a System",
                fix='pass e.g. "h100:64"',
            )
        s = str(spec).strip()
        check_name_length(s, "system")
        if s.endswith(".toml") or (("/" in s or "\\" in s) and is_file(s)):
            system = _system_from_toml(Path(s), nodes_per_leaf=nodes_per_leaf)
        elif ":" not in s and is_file(SYSTEM_DIR / f"{s}.toml"):
            system = _system_from_toml(SYSTEM_DIR / f"{s}.toml", nodes_per_leaf=nodes_per_leaf)
        else:
            system = _parse_spec_string(s, nodes_per_leaf=nodes_per_leaf)
    return _apply_options(
        system,
        sharp=sharp,
        usd_per_chip_hour=usd_per_chip_hour,
        wraparound=wraparound,
        tier_bw=tier_bw,
    )


def _option_int(name: str, v: Any) -> int | None:
    if v is None:
        return None
    return check_int("parse_system option", name, v, 1, MAX_CHIPS)


def _option_bool(name: str, v: Any) -> bool | None:
    return None if v is None else check_bool("parse_system option", name, v)


def _option_tier_bw(tier_bw: Any) -> dict[str, float] | None:
    if tier_bw is None:
        return None
    if not isinstance(tier_bw, Mapping):
        raise SpecError(
            f"tier_bw = {tier_bw!r} is a {type(tier_bw).__name__}",
            rule="tier_bw maps dim names to per-chip one-way bandwidths in bytes/s",
            fix='pass e.g. tier_bw={"spine": 25e9}',
        )
    return {
        str(k): check_number("tier_bw", str(k), v, hi=MAX_BW_BYTES_PER_S)
        for k, v in tier_bw.items()
    }


def _apply_options(
    system: System,
    *,
    sharp: bool | None,
    usd_per_chip_hour: float | None,
    wraparound: bool | None,
    tier_bw: Mapping[str, float] | None,
) -> System:
    changes: dict[str, Any] = {}
    sharp, wraparound = _option_bool("sharp", sharp), _option_bool("wraparound", wraparound)
    tier_bw = _option_tier_bw(tier_bw)
    if sharp is not None:
        changes["sharp"] = sharp
    if usd_per_chip_hour is not None:
        changes["usd_per_chip_hour"] = check_number(
            "price", "usd_per_chip_hour", usd_per_chip_hour, lo=0.0, lo_open=False, hi=1e5
        )
    dims = list(system.dims)
    if wraparound is not None:
        dims = [
            dataclasses.replace(d, wraparound=bool(wraparound) and d.size > 2)
            if d.kind is DimKind.ICI
            else d
            for d in dims
        ]
    if tier_bw:
        _check_dim_names("tier_bw", tier_bw, system)
        dims = [
            dataclasses.replace(d, bw_bytes_per_s=float(tier_bw[d.name]))
            if d.name in tier_bw
            else d
            for d in dims
        ]
    if dims != list(system.dims):
        changes["dims"] = tuple(dims)
    return dataclasses.replace(system, **changes) if changes else system


def _check_dim_names(key: str, table: Mapping[str, float], system: System) -> None:
    names = [d.name for d in system.dims]
    for k in table:
        if k not in names:
            raise SpecError(
                f"{key} names dim {k!r}, which system {system.name!r} does not have",
                rule="dims are " + ", ".join(names),
                fix="use one of those names",
            )


def _parse_spec_string(s: str, *, nodes_per_leaf: int | None) -> System:
    m = _SPEC_RE.match(s)
    if not m or not m.group("chip").strip():
        raise SpecError(
            f"cannot read system {s!r}",
            rule="a system is CHIP:TOPOLOGY (TPU, e.g. tpu-v5p:16x20x28), SLICESxCHIP:TOPOLOGY (multi-slice), CHIP:N (GPUs, e.g. h100:1024), optionally +sharp, or a path to a TOML file",
            fix="write e.g. tpu-v5e:16x16, 2xtpu-v5p:16x20x28 or h100:1024",
        )
    opts = [o.strip().lower() for o in re.findall(r"\+\s*([a-z_-]+)", m.group("opts") or "", re.I)]
    sharp = False
    for o in opts:
        if o == "sharp":
            sharp = True
        else:
            raise SpecError(
                f"system {s!r}: unknown option +{o}",
                rule="the only suffix option is +sharp",
                fix="remove it, or use parse_system keyword options",
            )
    chip_name = m.group("chip").strip()
    domain_override = None
    try:
        chip = load_chip(chip_name)
    except SpecError:
        nm = _NVL_RE.match(chip_name)
        if not nm:
            raise
        chip = load_chip(nm.group("base"))
        domain_override = _bounded_int(s, nm.group("n"), "NVLink domain size", 1, MAX_CHIPS)
    slices = _bounded_int(s, m.group("slices") or "1", "slice count", 1, MAX_SLICES)
    shape = m.group("shape")
    if chip.is_tpu or chip.ici_axes:
        system = _tpu_system(s, chip, shape, slices)
    else:
        if slices != 1:
            raise SpecError(
                f"system {s!r}: a slice count prefix on a GPU",
                rule="SLICESx... is for TPU slices joined by DCN",
                fix=f"give the total GPU count instead, e.g. {chip.name}:{slices * (chip.nvlink_domain or 8)}",
            )
        system = _gpu_system(s, chip, shape, domain_override, nodes_per_leaf)
    return dataclasses.replace(system, sharp=sharp) if sharp else system


def _bounded_int(s: str, digits: str, what: str, lo: int, hi: int) -> int:
    """int(digits) within [lo, hi], or one paragraph (also for 5000-digit input)."""
    v = int(digits) if len(digits) <= 12 else hi + 1
    if not lo <= v <= hi:
        raise SpecError(
            f"system {s[:80]!r}: {what} {digits[:20]}{'...' if len(digits) > 20 else ''}",
            rule=f"the {what} is a whole number from {lo} to {hi:,}",
            fix=f"give a {what} in that range",
        )
    return v


def _parse_topology(s: str, shape: str) -> tuple[int, ...]:
    parts = re.split(r"\s*[x×*]\s*", shape.strip().lower())
    if not all(re.fullmatch(r"\d+", p) for p in parts):
        raise SpecError(
            f"cannot read topology {shape!r} in system {s!r}",
            rule="a TPU topology is axis sizes joined by x, e.g. 4x4x4",
            fix="write e.g. tpu-v5p:4x4x4",
        )
    if len(parts) > 4:
        raise SpecError(
            f"system {s[:80]!r}: topology {shape[:40]!r} has {len(parts)} axes",
            rule="a TPU topology has at most 3 axes (4 with a DCN prefix)",
            fix="write e.g. tpu-v5p:4x4x4",
        )
    out = tuple(int(p) if len(p) <= 12 else MAX_CHIPS + 1 for p in parts)
    if any(v > MAX_CHIPS for v in out):
        raise SpecError(
            f"system {s[:80]!r}: topology {shape[:40]!r} has an axis over {MAX_CHIPS:,}",
            rule=f"a system has at most {MAX_CHIPS:,} chips",
            fix="give smaller axis sizes",
        )
    if any(v <= 0 for v in out):
        raise SpecError(
            f"system {s!r}: topology {shape!r} has an axis of size 0",
            rule="topology axes are positive whole numbers",
            fix="give every axis a size of 1 or more",
        )
    return out


def _wraps(chip: Chip, size: int) -> bool:
    # tpus.md: wraparound on v5e/v6e only on axes of size 16; on v4p/v5p/7x on multiples of 4
    rule = chip.wraparound
    if rule == "size_16":
        return size == 16
    if rule == "multiple_of_4":
        return size % 4 == 0
    return False


def _tpu_system(s: str, chip: Chip, shape: str | None, slices: int) -> System:
    topo = _parse_topology(s, shape) if shape else tuple(chip.pod_topology)
    return _tpu_slice(s, chip, topo, slices)


def _tpu_slice(s: str, chip: Chip, topo: tuple[int, ...], slices: int) -> System:
    if chip.ici_link_bw_bytes_per_s is None or not chip.ici_axes:
        raise SpecError(
            f"system {s!r}: chip {chip.name!r} has no ICI numbers",
            rule="TPU topologies need ici_link_bw_bytes_per_s and ici_axes in the chip file",
            fix="add them to the chip file",
        )
    pod = tuple(chip.pod_topology)
    if not topo:
        raise SpecError(
            f"system {s!r}: no topology given and chip {chip.name!r} has no pod_topology",
            rule="TPU systems are CHIP:AxB(xC)",
            fix=f"write e.g. {chip.name}:4x4",
        )
    if len(topo) != chip.ici_axes:
        padded = (
            "x".join(str(v) for v in (*topo, *([1] * (chip.ici_axes - len(topo)))))
            if len(topo) < chip.ici_axes
            else None
        )
        raise SpecError(
            f"system {s!r}: topology {'x'.join(map(str, topo))} has {len(topo)} axes but {chip.name} has a {chip.ici_axes}D torus",
            rule=f"a {chip.name} topology lists {chip.ici_axes} axis sizes"
            + (f" (pod {'x'.join(map(str, pod))})" if pod else ""),
            fix=(f"write {chip.name}:{padded}" if padded else f"give {chip.ici_axes} sizes"),
        )
    if pod:
        big, pod_sorted = sorted(topo, reverse=True), sorted(pod, reverse=True)
        if any(a > b for a, b in zip(big, pod_sorted, strict=True)):
            raise SpecError(
                f"system {s!r}: topology {'x'.join(map(str, topo))} ({math.prod(topo)} chips) does not fit in one {chip.name} pod {'x'.join(map(str, pod))} ({math.prod(pod)} chips)",
                rule="a slice is at most the pod in every axis",
                fix=f"use a smaller slice, or several slices over DCN, e.g. {max(2, -(-math.prod(topo) // math.prod(pod)))}x{chip.name}:{'x'.join(map(str, pod))}",
            )
    names = ("x", "y", "z", "w")
    dims: list[PhysDim] = []
    if slices > 1:
        if chip.dcn_bw_bytes_per_s is None:
            raise SpecError(
                f"system {s!r}: {slices} slices but chip {chip.name!r} has no dcn_bw_bytes_per_s",
                rule="multi-slice systems need the per-chip DCN bandwidth",
                fix="add dcn_bw_bytes_per_s to the chip file",
            )
        dims.append(
            PhysDim(
                "dcn", DimKind.DCN, slices, float(chip.dcn_bw_bytes_per_s), False, DCN_HOP_LATENCY_S
            )
        )
    for i, n in enumerate(topo):
        if n > 1:
            dims.append(
                PhysDim(
                    names[i],
                    DimKind.ICI,
                    n,
                    float(chip.ici_link_bw_bytes_per_s),
                    _wraps(chip, n),
                    float(chip.ici_hop_latency_s),
                )
            )
    n = math.prod(topo) * slices
    wrap = [d.name for d in dims if d.wraparound]
    desc = (
        (f"{slices} slices of " if slices > 1 else "")
        + f"{chip.name} {'x'.join(map(str, topo))}"
        + (f", wraparound on {'/'.join(wrap)}" if wrap else ", no wraparound")
    )
    return System(
        name=s,
        chip=chip,
        n_chips=n,
        dims=tuple(dims),
        usd_per_chip_hour=chip.usd_per_hour,
        n_slices=slices,
        topology=topo,
        description=desc,
    )


def _largest_divisor_at_most(n: int, cap: int, step: int = 1) -> int:
    """The largest d <= cap dividing n with step | d (0 if none); O(sqrt n), no trial list."""
    best, i = 0, 1
    while i * i <= n:
        if n % i == 0:
            for d in (i, n // i):
                if d <= cap and d % step == 0 and d > best:
                    best = d
        i += 1
    return best


def _gpu_count(s: str, chip: Chip, shape: str | None, node: int) -> int:
    if shape is None:
        return node
    try:
        v = parse_quantity(shape, what="GPU count")
    except SpecError:
        v = float("nan")
    if not math.isfinite(v) or v != int(v):
        raise SpecError(
            f"cannot read GPU count {shape[:40]!r} in system {s[:80]!r}",
            rule="a GPU system is CHIP:N with N a whole number",
            fix=f"write e.g. {chip.name}:1024",
        )
    if v <= 0:
        raise SpecError(
            f"system {s!r}: {int(v)} GPUs",
            rule="a system has at least one GPU",
            fix=f"write e.g. {chip.name}:{node}",
        )
    if v > MAX_CHIPS:
        raise SpecError(
            f"system {s[:80]!r}: {v:,.0f} GPUs",
            rule=f"a system has at most {MAX_CHIPS:,} chips (2^20; the largest clusters announced "
            "hold a few hundred thousand)",
            fix=f"write e.g. {chip.name}:16384",
        )
    return int(v)


def _gpus_per_domain(s: str, chip: Chip, n: int, node: int) -> tuple[int, str]:
    """GPUs used in each scale-up domain, and a note when domains are partly used.

    HGX-style nodes are whole (8 GPUs). Rack-scale domains (GB200/GB300 NVL72, trays of 4)
    may be partly used: N GPUs spread evenly over ceil-ish N/72 racks, whole trays each.
    """
    if n % node == 0:
        return node, ""
    tray = chip.gpus_per_tray
    per = _largest_divisor_at_most(n, node, tray) if tray else 0
    if per:
        racks = n // per
        return per, (
            f" ({racks} {node}-GPU domains with {per} GPUs ({per // tray} trays of {tray}) in use each)"
        )
    lo, hi = (n // node) * node, (n // node + 1) * node
    if tray:
        lo, hi = (n // tray) * tray, (n // tray + 1) * tray
        raise SpecError(
            f"system {s!r}: {n} GPUs is not a whole number of {tray}-GPU trays",
            rule=f"{chip.name} domains of {node} are built from trays of {tray} GPUs; a system "
            "larger than one domain uses the same number of whole trays in each",
            fix=f"use {lo} or {hi} GPUs, or at most {node} for one domain",
        )
    raise SpecError(
        f"system {s!r}: {n} GPUs is not a whole number of {node}-GPU {chip.scaleup_fabric} nodes",
        rule=f"GPU systems larger than one node are whole nodes of {node} ({chip.name})",
        fix=f"use {lo} or {hi} GPUs, or at most {node} for one node",
    )


def _scaleup_dim(chip: Chip, size: int) -> PhysDim:
    return PhysDim(
        _SCALEUP_DIM.get(chip.scaleup_fabric, "scaleup"),
        DimKind.NVLINK,
        size,
        float(chip.nvlink_bw_bytes_per_s),  # type: ignore[arg-type]
        False,
        NVLINK_HOP_LATENCY_S,
    )


def _gpu_system(
    s: str, chip: Chip, shape: str | None, domain_override: int | None, nodes_per_leaf: int | None
) -> System:
    if chip.nvlink_bw_bytes_per_s is None:
        raise SpecError(
            f"system {s!r}: chip {chip.name!r} has neither ICI nor NVLink numbers",
            rule="a system needs the chip's interconnect",
            fix="add nvlink_bw_bytes_per_s (GPU) or ici_link_bw_bytes_per_s (TPU) to the chip file",
        )
    node = domain_override or chip.nvlink_domain or 8
    return _gpu_cluster(s, chip, _gpu_count(s, chip, shape, node), node, nodes_per_leaf)


def _gpu_cluster(s: str, chip: Chip, n: int, node: int, nodes_per_leaf: int | None) -> System:
    fabric = chip.scaleup_fabric
    if n <= node:
        desc = f"{n} {chip.name} in one {fabric} domain"
        if n > 1 and node % n:
            desc += f" (a partial {node}-GPU node)"
        return System(
            name=s,
            chip=chip,
            n_chips=n,
            dims=(_scaleup_dim(chip, n),),
            usd_per_chip_hour=chip.usd_per_hour,
            topology=(1, n),
            description=desc,
        )
    per, partial = _gpus_per_domain(s, chip, n, node)
    if chip.node_egress_bytes_per_s is None:
        raise SpecError(
            f"system {s!r}: {n // per} nodes but chip {chip.name!r} has no node_egress_bytes_per_s",
            rule="multi-node GPU systems need the node's scale-out bandwidth",
            fix="add node_egress_bytes_per_s to the chip file",
        )
    nodes = n // per
    # gpus.md: rail-optimised, the node's egress is shared by its GPUs (a partly used
    # rack keeps one NIC per GPU, so the per-GPU share is that of a full domain)
    per_gpu = float(chip.node_egress_bytes_per_s) / node
    cap = nodes_per_leaf or (NODES_PER_SU if node <= 8 else NVL72_RACKS_PER_SU)
    leaf = nodes if nodes <= cap else _largest_divisor_at_most(nodes, cap)
    if leaf == 1:  # a prime node count above one SU: one fat-tree tier (same per-GPU bandwidth)
        leaf = nodes
    spine = nodes // leaf
    dims: list[PhysDim] = []
    if spine > 1:
        dims.append(
            PhysDim("spine", DimKind.SCALEOUT, spine, per_gpu, False, SCALEOUT_HOP_LATENCY_S)
        )
    if leaf > 1:
        dims.append(PhysDim("leaf", DimKind.SCALEOUT, leaf, per_gpu, False, SCALEOUT_HOP_LATENCY_S))
    dims.append(_scaleup_dim(chip, per))
    desc = f"{nodes} nodes of {per} {chip.name}" + partial
    if spine > 1:
        desc += f"; {spine} scalable units of {leaf} nodes under a spine"
        if leaf < cap:
            desc += f" ({nodes} nodes is not a multiple of {cap}: the leaf tier groups {leaf})"
    elif nodes > cap:
        desc += f" ({nodes} nodes has no divisor up to {cap}: modelled as one fat-tree tier)"
    return System(
        name=s,
        chip=chip,
        n_chips=n,
        dims=tuple(dims),
        usd_per_chip_hour=chip.usd_per_hour,
        topology=(nodes, per),
        description=desc,
    )


def tpu_slice(
    chip: Chip | str,
    topology: tuple[int, ...],
    *,
    slices: int = 1,
    usd_per_chip_hour: float | None = None,
) -> System:
    """A TPU slice (or `slices` of them over DCN) as an object: what `parse_system("2xtpu-v5p:4x4x8")`
    gives, without formatting and re-parsing a string (the planner builds sub-slices this way)."""
    chip = load_chip(chip)
    if not isinstance(topology, (tuple, list)) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in topology
    ):
        raise SpecError(
            f"tpu_slice topology {topology!r}",
            rule="a topology is a tuple of whole axis sizes, e.g. (4, 4, 8)",
            fix="pass e.g. topology=(4, 4, 8)",
        )
    topo = tuple(topology)
    slices = check_int("tpu_slice", "slices", slices, 1, MAX_SLICES)
    name = ("" if slices == 1 else f"{slices}x") + f"{chip.name}:{'x'.join(map(str, topo))}"
    for v in topo:
        check_int(f"system {name!r}", "topology axis", v, 1, MAX_CHIPS)
    if not (chip.is_tpu or chip.ici_axes):
        raise SpecError(
            f"tpu_slice: chip {chip.name!r} is not a TPU",
            rule="a TPU slice needs a chip with ICI (ici_axes, ici_link_bw_bytes_per_s)",
            fix=f"use gpu_cluster({chip.name!r}, n_gpus) for GPUs",
        )
    system = _tpu_slice(name, chip, topo, slices)
    return _apply_options(
        system, sharp=None, usd_per_chip_hour=usd_per_chip_hour, wraparound=None, tier_bw=None
    )


def gpu_cluster(
    chip: Chip | str,
    n_gpus: int,
    *,
    sharp: bool = False,
    usd_per_chip_hour: float | None = None,
    nodes_per_leaf: int | None = None,
) -> System:
    """A GPU cluster of `n_gpus` as an object: what `parse_system("h100:1024")` gives (same
    checks, names and tiers), without formatting and re-parsing a string."""
    chip = load_chip(chip)
    n = check_int("gpu_cluster", "n_gpus", n_gpus, 1, MAX_CHIPS)
    nodes_per_leaf = _option_int("nodes_per_leaf", nodes_per_leaf)
    name = f"{chip.name}:{n}"
    if chip.is_tpu or chip.ici_axes:
        raise SpecError(
            f"gpu_cluster: chip {chip.name!r} is a TPU",
            rule="TPU systems are slices with a topology",
            fix=f"use tpu_slice({chip.name!r}, topology) for TPUs",
        )
    if chip.nvlink_bw_bytes_per_s is None:
        return _gpu_system(name, chip, str(n), None, nodes_per_leaf)  # raises the chip's error
    system = _gpu_cluster(name, chip, n, chip.nvlink_domain or 8, nodes_per_leaf)
    return _apply_options(
        system,
        sharp=_option_bool("sharp", sharp),
        usd_per_chip_hour=usd_per_chip_hour,
        wraparound=None,
        tier_bw=None,
    )


# the schema's keys (tests/test_schemas.py pins them equal); the schema refuses any other
_TOML_KEYS = {
    "host_bw_bytes_per_s",
    "host_dram_bytes_per_chip",
    "host_dram_bw_bytes_per_s",
    "host_flops_per_s",
    "name",
    "base",
    "chip",
    "usd_per_chip_hour",
    "sharp",
    "wraparound",
    "tier_bw",
    "switch_bw",
    "nodes_per_leaf",
    "dims",
    "description",
}
_DIM_KEYS = {"name", "kind", "size", "bw_bytes_per_s", "wraparound", "hop_latency_s"}


def _check_toml_values(raw: dict, where: str) -> dict:
    """Range-check the scalar keys of a system file (before any arithmetic); their types, the
    booleans and `dims` being a list of tables are the schema's, checked before this."""
    out = dict(raw)
    for k in ("name", "description", "base", "chip"):
        if k in out:
            out[k] = check_str(where, k, out[k])
    if "nodes_per_leaf" in out:
        out["nodes_per_leaf"] = check_int(
            where, "nodes_per_leaf", out["nodes_per_leaf"], 1, MAX_CHIPS
        )
    for k, hi in (
        ("host_bw_bytes_per_s", MAX_BW_BYTES_PER_S),
        ("host_dram_bytes_per_chip", 1e15),
        ("host_dram_bw_bytes_per_s", MAX_BW_BYTES_PER_S),
        ("host_flops_per_s", 1e16),
    ):
        if k in out:
            out[k] = check_number(where, k, out[k], hi=hi)
    if "usd_per_chip_hour" in out:
        out["usd_per_chip_hour"] = check_number(
            where, "usd_per_chip_hour", out["usd_per_chip_hour"], lo=0.0, lo_open=False, hi=1e5
        )
    _check_bw_tables(out, where)
    return out


def _check_bw_tables(out: dict, where: str) -> None:
    """[tier_bw] (per-chip bandwidth) and [switch_bw] (one group's switches), by dim name: tables
    of numbers (the schema checked that), each bandwidth in range."""
    for key, hi in (("tier_bw", MAX_BW_BYTES_PER_S), ("switch_bw", MAX_BW_BYTES_PER_S * MAX_CHIPS)):
        table = out.get(key)
        if table is not None:
            out[key] = {k: check_number(where, f"{key}.{k}", v, hi=hi) for k, v in table.items()}


def _toml_dim(d: dict, i: int, chip: Chip, where: str) -> PhysDim:
    # the dim's keys and types are the schema's; presence, kind and ranges are checked here
    for req in ("name", "kind", "size", "bw_bytes_per_s"):
        if req not in d:
            raise SpecError(
                f"{where}: dims[{i}] lacks {req!r}",
                rule="every dim has name, kind, size and bw_bytes_per_s",
                fix=f"add {req}",
            )
    at = f"{where}: dims[{i}]"
    name = check_str(at, "name", d["name"], max_chars=64)
    kinds = ", ".join(k.value for k in DimKind)
    kind_text = check_str(at, "kind", d["kind"], max_chars=64).lower()
    if kind_text not in {k.value for k in DimKind}:
        raise SpecError(
            f"{at} kind = {d['kind']!r}", rule="kind is one of " + kinds, fix="use one of those"
        )
    kind = DimKind(kind_text)
    default_lat = {
        DimKind.ICI: chip.ici_hop_latency_s,
        DimKind.NVLINK: NVLINK_HOP_LATENCY_S,
        DimKind.SCALEOUT: SCALEOUT_HOP_LATENCY_S,
        DimKind.DCN: DCN_HOP_LATENCY_S,
    }[kind]
    return PhysDim(
        name,
        kind,
        check_int(at, "size", d["size"], 1, MAX_CHIPS),
        check_number(at, "bw_bytes_per_s", d["bw_bytes_per_s"], hi=MAX_BW_BYTES_PER_S),
        d.get("wraparound", False),
        check_number(
            at, "hop_latency_s", d.get("hop_latency_s", default_lat), lo_open=False, hi=1.0
        ),
    )


def _system_from_toml(path: Path, *, nodes_per_leaf: int | None) -> System:
    """Read a user system file; see specs/systems/example-custom.toml for the keys."""
    origin = str(path)
    raw = read_toml(path, "system")
    check_schema("system", raw, origin)  # keys (_TOML_KEYS, _DIM_KEYS), types and tables
    where = f"system file {origin}"
    raw = _check_toml_values(raw, where)
    if "base" in raw:
        if "dims" in raw:
            raise SpecError(
                f"{where} has both base and [[dims]]",
                rule="a system file either starts from a base spec or lists every dim",
                fix="keep one of them",
            )
        system = _parse_spec_string(
            raw["base"], nodes_per_leaf=raw.get("nodes_per_leaf", nodes_per_leaf)
        )
    else:
        if "chip" not in raw or "dims" not in raw:
            raise SpecError(
                f"{where} lacks {'chip' if 'chip' not in raw else 'dims'!r}",
                rule='a system file gives `base = "h100:1024"` or both `chip` and a [[dims]] list',
                fix="add it",
            )
        chip = load_chip(raw["chip"])
        if not raw["dims"]:
            raise SpecError(
                f"{where}: dims is empty",
                rule="a system has at least one dim",
                fix="add a [[dims]] block",
            )
        dims = [_toml_dim(d, i, chip, where) for i, d in enumerate(raw["dims"])]
        dims = [d for d in dims if d.size > 1] or dims[:1]
        n = math.prod(d.size for d in dims)
        slices = math.prod(d.size for d in dims if d.kind is DimKind.DCN)
        system = System(
            name=raw.get("name", path.stem),
            chip=chip,
            n_chips=n,
            dims=tuple(dims),
            usd_per_chip_hour=chip.usd_per_hour,
            n_slices=slices,
            topology=tuple(d.size for d in dims),
        )
    keys = (
        "name",
        "description",
        "host_bw_bytes_per_s",
        "host_dram_bytes_per_chip",
        "host_dram_bw_bytes_per_s",
        "host_flops_per_s",
    )
    changes: dict[str, Any] = {k: raw[k] for k in keys if k in raw}
    if raw.get("switch_bw"):
        _check_dim_names("switch_bw", raw["switch_bw"], system)
        changes["switch_bw"] = tuple(sorted(raw["switch_bw"].items()))
    if changes:
        system = dataclasses.replace(system, **changes)
    return _apply_options(
        system,
        sharp=raw.get("sharp"),
        usd_per_chip_hour=raw.get("usd_per_chip_hour"),
        wraparound=raw.get("wraparound"),
        tier_bw=raw.get("tier_bw"),
    )


def system_files() -> list[Path]:
    """Example system files shipped with the package."""
    return sorted(SYSTEM_DIR.glob("*.toml"))


__all__ = [
    "DimKind",
    "PhysDim",
    "System",
    "parse_system",
    "tpu_slice",
    "gpu_cluster",
    "system_files",
    "NVLINK_HOP_LATENCY_S",
    "SCALEOUT_HOP_LATENCY_S",
    "DCN_HOP_LATENCY_S",
]
