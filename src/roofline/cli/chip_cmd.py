"""`roofline chip NAME|PATH`: every number of one chip, with units and derived intensities."""

from __future__ import annotations

import argparse
from typing import Any

from roofline.cli._common import add_json, emit
from roofline.cli.chips_cmd import interconnect
from roofline.report.table import table
from roofline.specs.catalog import is_file
from roofline.specs.chip import CHIP_DIR, Chip, load_chip
from roofline.units import HOUR, fmt_bytes, fmt_rate, fmt_time, fmt_usd

NAME = "chip"
HELP = "show one chip (catalog name, alias, or path to a chip TOML): peaks, memory, links, price"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name",
        metavar="NAME",
        help="catalog name or alias (tpu-v5e, v5p, h100-sxm, ironwood) or a .toml path",
    )
    add_json(p)


def _source_file(arg: str, chip: Chip) -> str | None:
    if arg.endswith(".toml") or is_file(arg):
        return arg
    f = CHIP_DIR / f"{chip.name}.toml"
    return str(f) if f.is_file() else None


def chip_result(chip: Chip) -> dict[str, Any]:
    """The JSON result of `roofline chip`: the record plus derived numbers."""
    out = chip.to_dict()
    # Link bandwidths, named the same way everywhere (one way unless `_bidi_`).
    out["ici_link_bw_bytes_per_s"] = chip.ici_link_bw_bytes_per_s
    out["ici_bidi_bw_bytes_per_s"] = chip.ici_bidi_bw_bytes_per_s
    out["flops_per_usd"] = (
        None
        if chip.usd_per_hour is None
        else {d: chip.peak(d) * HOUR / chip.usd_per_hour for d in chip.peak_flops_per_s}
    )
    out["interconnect"] = interconnect(chip)
    out["default_dtype"] = chip.default_dtype
    if chip.usd_per_hour is None:
        out["usd_per_hour_reason"] = out["flops_per_usd_reason"] = (
            chip.price_source or "no price in the chip file"
        )
    return out


def _opt(v: float | None, f) -> str | None:
    return None if v is None else f(v)


def _rows(chip: Chip) -> list[tuple[str, str]]:
    bps = lambda v: fmt_rate(v, "B/s")  # noqa: E731
    rows: list[tuple[str, str | None]] = []
    for d, v in chip.peak_flops_per_s.items():
        unit = "OP/s" if d.startswith("int") else "FLOP/s"
        rows.append((f"peak {d} (dense)", fmt_rate(v, unit)))
    for d, v in chip.vector_ops_per_s.items():
        rows.append((f"vector units {d}", fmt_rate(v, "OP/s") + " (one op per lane per clock)"))
    for d in chip.peak_flops_per_s:
        unit = "OP/B" if d.startswith("int") else "FLOP/B"
        rows.append((f"critical intensity {d}", f"{chip.critical_intensity(d):,.0f} {unit}"))
    rows += [
        ("HBM", f"{fmt_bytes(chip.hbm_bytes)} ({fmt_bytes(chip.hbm_bytes, binary=True)})"),
        ("HBM bandwidth", bps(chip.hbm_bw_bytes_per_s)),
        ("VMEM", _opt(chip.vmem_bytes, lambda v: fmt_bytes(v, binary=True))),
        ("VMEM bandwidth", _opt(chip.vmem_bw_bytes_per_s, bps)),
        ("VREGs per core", _opt(chip.vreg_bytes_per_core, lambda v: fmt_bytes(v, binary=True))),
        ("SMEM per SM", _opt(chip.smem_bytes_per_sm, fmt_bytes)),
        ("SMEM bandwidth", _opt(chip.smem_bw_bytes_per_s, bps)),
        ("registers per SM", _opt(chip.register_bytes_per_sm, fmt_bytes)),
        ("L2", _opt(chip.l2_bytes, fmt_bytes)),
        ("L2 bandwidth", _opt(chip.l2_bw_bytes_per_s, bps)),
        ("cores per chip", str(chip.cores_per_chip) if chip.is_tpu else None),
        ("MXUs per core", _opt(chip.mxus_per_core, str)),
        ("SMs", _opt(chip.sm_count, str)),
        ("Tensor Cores", _opt(chip.tensor_cores, str)),
        ("clock", _opt(chip.clock_hz, lambda v: fmt_rate(v, "Hz"))),
        ("boost clock", _opt(chip.boost_clock_hz, lambda v: fmt_rate(v, "Hz"))),
    ]
    if chip.ici_link_bw_bytes_per_s is not None:
        rows += [
            ("ICI per link, one way", bps(chip.ici_link_bw_bytes_per_s)),
            ("ICI per link, bidirectional", bps(chip.ici_bidi_bw_bytes_per_s)),
            (
                "ICI topology",
                f"{chip.ici_axes}D torus, {chip.ici_links_per_axis} links per axis, wraparound: {chip.wraparound}",
            ),
            ("ICI hop latency", fmt_time(chip.ici_hop_latency_s)),
            ("pod", "x".join(map(str, chip.pod_topology)) or None),
            ("host", "x".join(map(str, chip.host_topology)) or None),
        ]
    rows += [
        (f"{chip.scaleup_fabric} per GPU, one way", _opt(chip.nvlink_bw_bytes_per_s, bps)),
        (f"{chip.scaleup_fabric} domain", _opt(chip.nvlink_domain, lambda v: f"{v} GPUs")),
        ("GPUs per tray", _opt(chip.gpus_per_tray, str)),
        (
            "node egress",
            _opt(
                chip.node_egress_bytes_per_s, lambda v: f"{bps(v)} per {chip.scaleup_fabric} domain"
            ),
        ),
        ("PCIe, one way", _opt(chip.pcie_bw_bytes_per_s, bps)),
        ("host DRAM per chip", _opt(chip.host_dram_bytes_per_chip, fmt_bytes)),
        ("DCN per chip", _opt(chip.dcn_bw_bytes_per_s, bps)),
        ("price", _opt(chip.usd_per_hour, lambda v: f"{fmt_usd(v)}/h")),
        ("price source", chip.price_source or None),
    ]
    if chip.usd_per_hour is not None:
        d = chip.default_dtype
        rows.append((f"{d} FLOPs per $", f"{chip.peak(d) * HOUR / chip.usd_per_hour:.3g}"))
    return [(k, v) for k, v in rows if v is not None]


def run(args: argparse.Namespace) -> int:
    chip = load_chip(args.name)
    src = _source_file(args.name, chip)
    inputs = {"chip": args.name, "resolved": chip.name, "file": src}
    head = f"{chip.name} — {chip.generation} ({chip.vendor})"
    if chip.description:
        head += f"\n{chip.description}"
    if chip.aliases:
        head += f"\naliases: {', '.join(chip.aliases)}"
    text = "\n".join([head, "", table(_rows(chip), ["quantity", "value"], align="ll")])
    text += "\n\nCritical intensity = peak / HBM bandwidth: ops per HBM byte above which a kernel is compute-bound."
    text += (
        "\nBandwidths are per chip, one way unless marked bidirectional. GB = 1e9 B, GiB = 2^30 B."
    )
    if src:
        text += f"\nSources: comments in {src}"
    return emit(args, NAME, inputs, chip_result(chip), text)
