"""Chip: one accelerator's peak numbers, loaded from `specs/chips/<name>.toml`.

Every number in a chip file carries its source in a comment. Peak FLOP/s are *dense*
(spec sheets quoting "with sparsity" are halved). Achieved fractions do not live here:
they come from an efficiency profile (see `roofline.efficiency`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from roofline.errors import SpecError
from roofline.specs.catalog import DATA_DIR, read_toml, resolve
from roofline.units import DTYPE_BYTES, parse_dtype

CHIP_DIR = DATA_DIR / "chips"

# Dtypes whose peak falls back to another when a chip file does not list them.
_PEAK_FALLBACK = {
    "fp16": "bf16",
    "tf32": "fp32",
    "fp8": "int8",
    "int8": "fp8",
    "int4": "int8",
    "fp4": "fp8",
}


@dataclass(frozen=True)
class Chip:
    """One accelerator. Bandwidths are per chip, one direction unless named `_bidi_`.

    - `peak_flops_per_s`: dense peak by dtype (`bf16`, `fp32`, `fp8`, `int8`, `int4`, `fp4`).
    - `ici_link_bw_bytes_per_s`: TPU ICI, one way, per link (book `tpus.md` table).
    - `nvlink_bw_bytes_per_s`: GPU NVLink egress per GPU, one way (H100: 450e9).
    - `node_egress_bytes_per_s`: scale-out bandwidth of one node (H100 DGX: 400e9).
    """

    name: str
    vendor: str  # "google" | "nvidia"
    generation: str
    peak_flops_per_s: MappingProxyType
    hbm_bytes: float
    hbm_bw_bytes_per_s: float
    aliases: tuple[str, ...] = ()
    description: str = ""
    # on-chip memory
    vmem_bytes: float | None = None
    vmem_bw_bytes_per_s: float | None = None
    smem_bytes_per_sm: float | None = None
    register_bytes_per_sm: float | None = None
    l2_bytes: float | None = None
    l2_bw_bytes_per_s: float | None = None
    # compute units
    cores_per_chip: int = 1
    sm_count: int | None = None
    mxus_per_core: int | None = None
    tensor_cores: int | None = None
    clock_hz: float | None = None
    boost_clock_hz: float | None = None
    # TPU interconnect
    ici_link_bw_bytes_per_s: float | None = None
    ici_links_per_axis: int = 2
    ici_axes: int = 0
    ici_hop_latency_s: float = 1e-6
    wraparound: str = "none"  # "multiple_of_4" (v4p/v5p/7x), "size_16" (v5e/v6e), "none"
    pod_topology: tuple[int, ...] = ()
    host_topology: tuple[int, ...] = ()
    # GPU interconnect
    nvlink_bw_bytes_per_s: float | None = None
    nvlink_domain: int | None = None
    node_egress_bytes_per_s: float | None = None
    # host and datacenter network
    pcie_bw_bytes_per_s: float | None = None
    dcn_bw_bytes_per_s: float | None = None
    usd_per_hour: float | None = None
    price_source: str = ""
    sources: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        for k, v in self.peak_flops_per_s.items():
            _positive(self.name, f"peak_flops_per_s.{k}", v)
        _positive(self.name, "hbm_bytes", self.hbm_bytes)
        _positive(self.name, "hbm_bw_bytes_per_s", self.hbm_bw_bytes_per_s)
        if "bf16" not in self.peak_flops_per_s:
            raise SpecError(
                f"chip {self.name!r} has no bf16 peak",
                rule="every chip file gives peak_flops_per_s.bf16",
                fix="add `bf16 = ...` under [peak_flops_per_s]",
            )

    # -- derived -----------------------------------------------------------------
    def peak(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s for a compute dtype (falls back along fp16→bf16, fp8↔int8)."""
        d = parse_dtype(dtype)
        seen = set()
        while d not in self.peak_flops_per_s:
            seen.add(d)
            nxt = _PEAK_FALLBACK.get(d)
            if nxt is None or nxt in seen:
                raise SpecError(
                    f"chip {self.name!r} has no {dtype} peak",
                    rule="peaks listed: " + ", ".join(self.peak_flops_per_s),
                    fix=f"compute in one of those dtypes, or add {dtype} to the chip file",
                )
            d = nxt
        return float(self.peak_flops_per_s[d])

    def critical_intensity(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s over HBM bytes/s: the intensity above which an op is compute-bound."""
        return self.peak(dtype) / self.hbm_bw_bytes_per_s

    @property
    def is_tpu(self) -> bool:
        return self.vendor == "google"

    @property
    def ici_bidi_bw_bytes_per_s(self) -> float | None:
        """Both directions of one ICI link: the book's W_ici."""
        return None if self.ici_link_bw_bytes_per_s is None else 2 * self.ici_link_bw_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            out[k] = (
                dict(v)
                if isinstance(v, MappingProxyType)
                else (list(v) if isinstance(v, tuple) else v)
            )
        out["critical_intensity"] = {d: self.critical_intensity(d) for d in self.peak_flops_per_s}
        out["ici_bidi_bw_bytes_per_s"] = self.ici_bidi_bw_bytes_per_s
        return out


def _positive(chip: str, key: str, v: Any, origin: str | None = None) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        where = f"chip {chip!r}" + (f" (file {origin})" if origin else "")
        raise SpecError(
            f"{where}: {key} = {v!r}",
            rule=f"{key} is a positive finite number",
            fix="correct the value in the chip file",
        )


# Optional numbers that, when present, must be positive and finite (checked with the file named).
_POSITIVE_FIELDS = {
    "vmem_bytes",
    "vmem_bw_bytes_per_s",
    "smem_bytes_per_sm",
    "register_bytes_per_sm",
    "l2_bytes",
    "l2_bw_bytes_per_s",
    "cores_per_chip",
    "sm_count",
    "mxus_per_core",
    "tensor_cores",
    "clock_hz",
    "boost_clock_hz",
    "ici_link_bw_bytes_per_s",
    "ici_links_per_axis",
    "ici_hop_latency_s",
    "nvlink_bw_bytes_per_s",
    "nvlink_domain",
    "node_egress_bytes_per_s",
    "pcie_bw_bytes_per_s",
    "dcn_bw_bytes_per_s",
    "usd_per_hour",
    "hbm_bytes",
    "hbm_bw_bytes_per_s",
}
_WRAPAROUND = ("multiple_of_4", "size_16", "none")

_INT_FIELDS = {
    "cores_per_chip",
    "sm_count",
    "mxus_per_core",
    "tensor_cores",
    "ici_links_per_axis",
    "ici_axes",
    "nvlink_domain",
}


def chip_from_dict(d: dict, origin: str) -> Chip:
    """Build a Chip from a parsed TOML table; unknown keys are errors with a suggestion."""
    import difflib

    known = set(Chip.__dataclass_fields__)
    data = dict(d)
    unknown = [k for k in data if k not in known]
    if unknown:
        k = unknown[0]
        near = difflib.get_close_matches(k, sorted(known), n=1)
        raise SpecError(
            f"chip file {origin}: unknown key {k!r}"
            + (f" (did you mean {near[0]!r}?)" if near else ""),
            rule="keys are the fields of roofline.specs.chip.Chip",
            fix="rename or remove the key",
        )
    for req in (
        "name",
        "vendor",
        "generation",
        "peak_flops_per_s",
        "hbm_bytes",
        "hbm_bw_bytes_per_s",
    ):
        if req not in data:
            raise SpecError(
                f"chip file {origin} lacks {req!r}",
                rule="name, vendor, generation, peak_flops_per_s, hbm_bytes and hbm_bw_bytes_per_s are required",
                fix=f"add `{req} = ...`",
            )
    if not isinstance(data["peak_flops_per_s"], dict):
        raise SpecError(
            f"chip file {origin}: peak_flops_per_s must be a table",
            fix="write [peak_flops_per_s] with bf16 = ...",
        )
    name = str(data["name"])
    peaks = {}
    for k, v in data["peak_flops_per_s"].items():
        dt = parse_dtype(k)
        _positive(name, f"peak_flops_per_s.{k}", v, origin)
        peaks[dt] = float(v)
    for k in sorted(_POSITIVE_FIELDS & set(data)):
        _positive(name, k, data[k], origin)
    axes = data.get("ici_axes", 0)
    if isinstance(axes, bool) or axes not in (0, 1, 2, 3):
        raise SpecError(
            f"chip {name!r} (file {origin}): ici_axes = {axes!r}",
            rule="ici_axes is 0 (no ICI), 1, 2 or 3",
            fix="correct the value in the chip file",
        )
    if data.get("wraparound", "none") not in _WRAPAROUND:
        raise SpecError(
            f"chip {name!r} (file {origin}): wraparound = {data['wraparound']!r}",
            rule="wraparound is one of " + ", ".join(_WRAPAROUND),
            fix="correct the value in the chip file",
        )
    data["peak_flops_per_s"] = MappingProxyType(peaks)
    data["sources"] = MappingProxyType(dict(data.get("sources", {})))
    for k in ("aliases", "pod_topology", "host_topology"):
        if k in data:
            data[k] = tuple(data[k])
    for k in _INT_FIELDS & set(data):
        data[k] = int(data[k])
    return Chip(**data)


@cache
def _catalog() -> dict[str, tuple[Path, tuple[str, ...]]]:
    out = {}
    for p in sorted(CHIP_DIR.glob("*.toml")):
        raw = read_toml(p, "chip")
        out[raw["name"]] = (p, tuple(raw.get("aliases", ())))
    return out


def chip_names() -> list[str]:
    return list(_catalog())


@cache
def _load_named(key: str) -> Chip:
    path, _ = _catalog()[key]
    return chip_from_dict(read_toml(path, "chip"), str(path))


def load_chip(name_or_path: str | Path | Chip) -> Chip:
    """A Chip from a catalog name ('tpu-v5e', 'v5e', 'H100') or a path to a TOML file."""
    if isinstance(name_or_path, Chip):
        return name_or_path
    s = str(name_or_path)
    if s.endswith(".toml") or Path(s).is_file():
        return chip_from_dict(read_toml(Path(s), "chip"), s)
    key = resolve(s, {k: v[1] for k, v in _catalog().items()}, "chip")
    return _load_named(key)


__all__ = ["Chip", "load_chip", "chip_names", "chip_from_dict", "DTYPE_BYTES"]
