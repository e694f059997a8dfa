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
from roofline.specs.catalog import (
    DATA_DIR,
    check_int,
    check_number,
    check_str,
    check_str_list,
    is_file,
    read_toml,
    resolve,
)
from roofline.specs.schema import check as check_schema
from roofline.units import DTYPE_BYTES, compute_format, parse_dtype

CHIP_DIR = DATA_DIR / "chips"

# Dtypes whose peak falls back to another when a chip file does not list them. bf16 has no
# fallback: a chip without bf16 units (V100) cannot compute in bf16 (see Chip.peak).
_PEAK_FALLBACK = {
    "fp16": "bf16",
    "tf32": "fp32",
    "fp8": "int8",
    "int8": "fp8",
    "int4": "int8",
    "fp4": "fp8",
}
# The 16-bit dtypes a chip may train in, in order of preference (Chip.default_dtype).
_HALF_DTYPES = ("bf16", "fp16")


@dataclass(frozen=True)
class Chip:
    """One accelerator. Bandwidths are per chip, one direction unless named `_bidi_`.

    - `peak_flops_per_s`: dense peak by dtype (`bf16`, `fp32`, `fp8`, `int8`, `int4`, `fp4`).
    - `ici_link_bw_bytes_per_s`: TPU ICI, one way, per link (book `tpus.md` table).
    - `nvlink_bw_bytes_per_s`: GPU NVLink egress per GPU, one way (H100: 450e9).
    - `node_egress_bytes_per_s`: scale-out bandwidth of one node (H100 DGX: 400e9).
    - `scaleup_fabric`: what the `nvlink_*` fields describe: "NVLink" (NVIDIA, switched) or
      "Infinity Fabric" (AMD: xGMI links, fully connected inside an 8-GPU node).
    - `gpus_per_tray`: GPUs on one compute tray of a rack-scale NVLink domain (GB200/GB300
      NVL72: 4); a partly used domain holds whole trays.
    - `vector_ops_per_s`: the vector units (TPU VPU, GPU CUDA cores / AMD SIMD, not the matrix
      units) by dtype, in operations per second: one add, multiply or FMA per lane per clock
      (the book's count: H100 fp32 132·128·1.98e9 = 3.35e13; an FMA is 2 FLOPs, so the spec
      sheets' "FP32 67 TFLOP/s" is twice this). Dtypes not listed compute in fp32.
    - On-chip memories, per chip unless named per SM/core: `vmem_*` (TPU VMEM), `vreg_bytes_per_core`
      (TPU vector registers), `smem_*` (GPU shared memory: size per SM, bandwidth of all SMs),
      `register_bytes_per_sm`, `l2_*`.
    """

    name: str
    vendor: str  # "google" | "nvidia"
    generation: str
    peak_flops_per_s: MappingProxyType
    hbm_bytes: float
    hbm_bw_bytes_per_s: float
    # the HBM a process can allocate (what CUDA or the TPU runtime reports), where it differs
    # from the marketed `hbm_bytes` (80 GB on an 80 GiB part); see `fit_hbm_bytes`
    usable_hbm_bytes: float | None = None
    aliases: tuple[str, ...] = ()
    description: str = ""
    # on-chip memory
    vmem_bytes: float | None = None
    vmem_bw_bytes_per_s: float | None = None
    smem_bytes_per_sm: float | None = None
    smem_bw_bytes_per_s: float | None = None
    vreg_bytes_per_core: float | None = None
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
    scaleup_fabric: str = "NVLink"
    gpus_per_tray: int | None = None
    nvswitches_per_domain: int | None = None
    nvswitch_bw_bytes_per_s: float | None = None  # one switch: its NVLink ports x port bandwidth
    # host and datacenter network
    pcie_bw_bytes_per_s: float | None = None
    host_dram_bytes_per_chip: float | None = None
    # the host's side of offload, per chip (the host's total over the chips it serves): DRAM
    # bandwidth and fp32 FLOP/s of its CPUs, which price the host's Adam update
    host_dram_bw_bytes_per_s: float | None = None
    host_flops_per_s: float | None = None
    dcn_bw_bytes_per_s: float | None = None
    usd_per_hour: float | None = None
    price_source: str = ""
    sources: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    vector_ops_per_s: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        for k, v in self.peak_flops_per_s.items():
            _positive(self.name, f"peak_flops_per_s.{k}", v)
        _positive(self.name, "hbm_bytes", self.hbm_bytes)
        _positive(self.name, "hbm_bw_bytes_per_s", self.hbm_bw_bytes_per_s)
        if not any(d in self.peak_flops_per_s for d in _HALF_DTYPES):
            raise SpecError(
                f"chip {self.name!r} has no 16-bit peak",
                rule="every chip file gives peak_flops_per_s.bf16 (or fp16 for chips without bf16, e.g. V100)",
                fix="add `bf16 = ...` under [peak_flops_per_s]",
            )

    def __repr__(self) -> str:  # short: the catalog name (`roofline chip NAME` shows the rest)
        return f"Chip({self.name!r})"

    # -- derived -----------------------------------------------------------------
    @property
    def fit_hbm_bytes(self) -> float:
        """The capacity a plan must fit in: the allocatable HBM where the chip file gives it,
        else the marketed `hbm_bytes` (the book's worked answers use the marketed value).

        The one home for "the bytes a chip holds" as a capacity: training's fit check and
        serving's KV capacity both read it. The serving engines size their KV pools from what
        the device reports (vLLM `gpu_memory_utilization` x `torch.cuda.mem_get_info`'s total,
        SGLang `mem_fraction_static` x the free memory at start-up, TensorRT-LLM
        `free_gpu_memory_fraction` x what is free after the model), i.e. from this figure, not the
        marketed one (H200: 143771 MiB = 150.75e9 B, not 141e9), less the runtime's own memory
        that each engine file gives (`EngineProfile.kv_memory_bytes`): CUDA's total is itself
        below nvidia-smi's by the driver's reservation (H100: 79.11 GiB vs 81559 MiB)."""
        return self.usable_hbm_bytes if self.usable_hbm_bytes is not None else self.hbm_bytes

    @property
    def default_dtype(self) -> str:
        """The 16-bit dtype this chip trains in: bf16, or fp16 where there is no bf16 (V100)."""
        return next(d for d in _HALF_DTYPES if d in self.peak_flops_per_s)

    def peak(self, dtype: str = "bf16", *, fallback: str | None = None) -> float:
        """Dense peak FLOP/s for a compute dtype.

        Falls back along fp16→bf16, tf32→fp32, fp8↔int8, int4→int8, fp4→fp8; block-scaled
        formats compute at their element format (nvfp4, mxfp4 → fp4; mxfp8, fp8_block → fp8).
        A dtype the chip cannot compute in (bf16 on V100) is a SpecError, unless the caller
        names a `fallback` dtype to price it at instead (e.g. `peak("bf16", fallback="fp16")`).
        """
        d = compute_format(dtype)
        seen = set()
        while d not in self.peak_flops_per_s:
            seen.add(d)
            nxt = _PEAK_FALLBACK.get(d)
            if nxt is None or nxt in seen:
                if fallback is not None:
                    return self.peak(fallback)
                raise self._no_peak(dtype)
            d = nxt
        return float(self.peak_flops_per_s[d])

    def _no_peak(self, dtype: str) -> SpecError:
        listed = ", ".join(self.peak_flops_per_s)
        if parse_dtype(dtype) == "bf16":
            return SpecError(
                f"chip {self.name!r} has no bf16 peak ({self.generation} has no bf16 units)",
                rule=f"a chip computes only in the dtypes its file lists: {listed}",
                fix=f"compute in {self.default_dtype} on {self.name} (e.g. fp16[...] operands, or a "
                f"{self.default_dtype} compute dtype), or price bf16 at the {self.default_dtype} rate "
                f"explicitly with chip.peak('bf16', fallback='{self.default_dtype}')",
            )
        return SpecError(
            f"chip {self.name!r} has no {dtype} peak",
            rule="peaks listed: " + listed,
            fix=f"compute in one of those dtypes, or add {dtype} to the chip file",
        )

    def critical_intensity(self, dtype: str = "bf16", *, fallback: str | None = None) -> float:
        """Peak FLOP/s over HBM bytes/s: the intensity above which an op is compute-bound."""
        return self.peak(dtype, fallback=fallback) / self.hbm_bw_bytes_per_s

    def vector_peak(self, dtype: str = "fp32") -> float:
        """Vector-unit operations per second for an elementwise op in `dtype` (one op per lane
        per clock); a dtype the file does not list runs at the fp32 rate (the VPU computes in
        fp32, book tpus.md)."""
        table = self.vector_ops_per_s
        if not table:
            raise SpecError(
                f"chip {self.name!r} lists no vector-unit peak",
                rule="elementwise ops are priced on the vector units, [vector_ops_per_s] in the chip file",
                fix="add [vector_ops_per_s] fp32 = ... (lanes x clock) to the chip file",
            )
        d = parse_dtype(dtype)
        return float(table[d] if d in table else table.get("fp32", max(table.values())))

    def memory_levels(self) -> list[tuple[str, float | None, float]]:
        """(name, capacity bytes or None, bandwidth B/s) of each memory level the file gives a
        bandwidth for, slowest first: host memory over PCIe, HBM, L2, VMEM / SMEM."""
        out: list[tuple[str, float | None, float]] = []
        if self.pcie_bw_bytes_per_s is not None:
            out.append(("host", self.host_dram_bytes_per_chip, self.pcie_bw_bytes_per_s))
        out.append(("hbm", self.hbm_bytes, self.hbm_bw_bytes_per_s))
        if self.l2_bw_bytes_per_s is not None:
            out.append(("l2", self.l2_bytes, self.l2_bw_bytes_per_s))
        if self.vmem_bw_bytes_per_s is not None:
            out.append(("vmem", self.vmem_bytes, self.vmem_bw_bytes_per_s))
        if self.smem_bw_bytes_per_s is not None:
            smem = (
                None
                if self.smem_bytes_per_sm is None
                else self.smem_bytes_per_sm * (self.sm_count or 0)
            )
            out.append(("smem", smem or None, self.smem_bw_bytes_per_s))
        return out

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
        out["memory_levels"] = [
            {"level": n, "bytes": b, "bw_bytes_per_s": w} for n, b, w in self.memory_levels()
        ]
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


# Optional numbers that, when present, must be positive, finite and below a physical bound
# (checked with the file named). Bounds are generous: 100x beyond any chip announced.
_NUMBER_BOUNDS = {
    "vmem_bytes": 1e12,
    "vmem_bw_bytes_per_s": 1e16,
    "smem_bytes_per_sm": 1e9,
    "smem_bw_bytes_per_s": 1e16,
    "vreg_bytes_per_core": 1e9,
    "register_bytes_per_sm": 1e9,
    "l2_bytes": 1e12,
    "l2_bw_bytes_per_s": 1e16,
    "clock_hz": 1e11,
    "boost_clock_hz": 1e11,
    "ici_link_bw_bytes_per_s": 1e14,
    "ici_hop_latency_s": 1.0,
    "nvlink_bw_bytes_per_s": 1e14,
    "node_egress_bytes_per_s": 1e16,
    "pcie_bw_bytes_per_s": 1e14,
    "nvswitch_bw_bytes_per_s": 1e16,
    "host_dram_bytes_per_chip": 1e15,
    "host_dram_bw_bytes_per_s": 1e14,
    "host_flops_per_s": 1e16,
    "dcn_bw_bytes_per_s": 1e14,
    "usd_per_hour": 1e5,
    "hbm_bytes": 1e15,
    "usable_hbm_bytes": 1e15,
    "hbm_bw_bytes_per_s": 1e16,
}
# usable_hbm_bytes / hbm_bytes: GiB vs GB is 1.074; a runtime's reserve takes a few percent
USABLE_HBM_RANGE = (0.75, 1.1)
_PEAK_BOUND = 1e19  # FLOP/s per chip: ~1000x the largest announced
_INT_BOUNDS = {
    "cores_per_chip": (1, 1024),
    "sm_count": (1, 100_000),
    "mxus_per_core": (1, 1024),
    "tensor_cores": (1, 1_000_000),
    "ici_links_per_axis": (1, 64),
    "ici_axes": (0, 3),
    "nvlink_domain": (1, 1_000_000),
    "gpus_per_tray": (1, 1024),
    "nvswitches_per_domain": (1, 1024),
}
_STR_FIELDS = {"name", "vendor", "generation", "description", "price_source", "scaleup_fabric"}
_TOPOLOGY_FIELDS = ("pod_topology", "host_topology")
_WRAPAROUND = ("multiple_of_4", "size_16", "none")
_REQUIRED = ("name", "vendor", "generation", "peak_flops_per_s", "hbm_bytes", "hbm_bw_bytes_per_s")


def _peaks(data: dict, name: str, origin: str, key: str = "peak_flops_per_s") -> MappingProxyType:
    peaks = {}
    for k, v in data[key].items():  # a table of numbers: the schema checked it
        dt = parse_dtype(k)
        check_number(f"chip {name!r} (file {origin})", f"{key}.{k}", v, hi=_PEAK_BOUND)
        peaks[dt] = float(v)
    return MappingProxyType(peaks)


def _typed_fields(data: dict, where: str) -> None:
    """Check and convert every scalar field in place (strings, numbers, ints, lists)."""
    for k in _STR_FIELDS & set(data):
        check_str(where, k, data[k])
    for k in sorted(_NUMBER_BOUNDS.keys() & set(data)):
        data[k] = check_number(where, k, data[k], hi=_NUMBER_BOUNDS[k])
    for k in sorted(_INT_BOUNDS.keys() & set(data)):
        lo, hi = _INT_BOUNDS[k]
        data[k] = check_int(where, k, data[k], lo, hi)
    if "aliases" in data:
        data["aliases"] = check_str_list(where, "aliases", data["aliases"])
    for k in _TOPOLOGY_FIELDS:
        if k in data:
            v = data[k]
            if len(v) > 4:  # a list (the schema checked it) of at most 4 axes
                raise SpecError(
                    f"{where}: {k} = {str(v)[:40]}",
                    rule=f"{k} is a list of up to 4 whole numbers (axis sizes)",
                    fix=f"write e.g. {k} = [16, 16]",
                )
            data[k] = tuple(check_int(where, f"{k}[{i}]", x, 1, 4096) for i, x in enumerate(v))


def _check_usable_hbm(data: dict, where: str) -> None:
    u, hbm = data.get("usable_hbm_bytes"), data["hbm_bytes"]
    if u is not None and not USABLE_HBM_RANGE[0] <= u / hbm <= USABLE_HBM_RANGE[1]:
        raise SpecError(
            f"{where}: usable_hbm_bytes = {u:.4g} against hbm_bytes = {hbm:.4g}",
            rule="the allocatable HBM differs from the marketed capacity by units (GB vs GiB) "
            f"and reserved memory only: {USABLE_HBM_RANGE[0]}-{USABLE_HBM_RANGE[1]} of it",
            fix="give both in bytes (80 GiB = 85899345920), or leave usable_hbm_bytes out",
        )


def chip_from_dict(d: dict, origin: str) -> Chip:
    """Build a Chip from a parsed TOML table; unknown keys are errors with a suggestion.

    A variant file names a catalog chip in `base` and gives only what differs (A100 40GB:
    `base = "a100"` with its own name, memory and bandwidth).
    """
    # keys, types and tables are the schema's; the rules below are ranges and cross-field ones
    check_schema("chip", d, origin)
    data = dict(d)
    if "base" in data:
        base = check_str(f"chip file {origin}", "base", data.pop("base"))
        parent = load_chip(base)
        merged = {
            k: v
            for k, v in parent.__dict__.items()
            if v is not None and k not in ("aliases", "sources", "description")
        }
        if "hbm_bytes" in data and "usable_hbm_bytes" not in data:
            merged.pop(
                "usable_hbm_bytes", None
            )  # the parent's allocatable HBM is not the variant's
        merged["peak_flops_per_s"] = dict(parent.peak_flops_per_s)
        merged.update({k: v for k, v in data.items() if k != "peak_flops_per_s"})
        merged["peak_flops_per_s"].update(data.get("peak_flops_per_s", {}))
        merged["vector_ops_per_s"] = dict(parent.vector_ops_per_s)
        merged["vector_ops_per_s"].update(data.get("vector_ops_per_s", {}))
        for k in _TOPOLOGY_FIELDS:
            merged[k] = list(merged.get(k, ()))
        data = merged
    for req in _REQUIRED:
        if req not in data:
            raise SpecError(
                f"chip file {origin} lacks {req!r}",
                rule="name, vendor, generation, peak_flops_per_s, hbm_bytes and hbm_bw_bytes_per_s are required",
                fix=f"add `{req} = ...`",
            )
    name = check_str(f"chip file {origin}", "name", data["name"], max_chars=256)
    where = f"chip {name!r} (file {origin})"
    data["peak_flops_per_s"] = _peaks(data, name, origin)
    if "vector_ops_per_s" in data:
        data["vector_ops_per_s"] = _peaks(data, name, origin, "vector_ops_per_s")
    _typed_fields(data, where)
    _check_usable_hbm(data, where)
    axes = data.get("ici_axes", 0)
    if axes not in (0, 1, 2, 3):
        raise SpecError(
            f"{where}: ici_axes = {axes!r}",
            rule="ici_axes is 0 (no ICI), 1, 2 or 3",
            fix="correct the value in the chip file",
        )
    if data.get("wraparound", "none") not in _WRAPAROUND:
        raise SpecError(
            f"{where}: wraparound = {data['wraparound']!r}",
            rule="wraparound is one of " + ", ".join(_WRAPAROUND),
            fix="correct the value in the chip file",
        )
    data["sources"] = MappingProxyType(dict(data.get("sources", {})))
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
    if not isinstance(name_or_path, (str, Path)):
        raise SpecError(
            f"chip {name_or_path!r} is a {type(name_or_path).__name__}",
            rule="a chip is a Chip, a catalog name or a path to a chip TOML file",
            fix='pass e.g. "h100" or "tpu-v5e"',
        )
    s = str(name_or_path)
    if s.endswith(".toml") or is_file(s):
        return chip_from_dict(read_toml(s, "chip"), s)
    key = resolve(s, {k: v[1] for k, v in _catalog().items()}, "chip")
    return _load_named(key)


__all__ = ["Chip", "load_chip", "chip_names", "chip_from_dict", "DTYPE_BYTES"]
