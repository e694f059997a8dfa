"""`roofline chips`: the chip catalog as one table (peak, HBM, critical intensity, links, price)."""

from __future__ import annotations

import argparse
from typing import Any

from roofline.cli._common import add_json, emit
from roofline.report.table import table
from roofline.specs.chip import Chip, chip_names, load_chip
from roofline.units import GB, TB, fmt_rate

NAME = "chips"
HELP = "list the chip catalog: bf16 peak, HBM, critical intensity, interconnect, price"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_json(p)


def interconnect(chip: Chip) -> str:
    """One-line summary of a chip's fast interconnect, e.g. 'ICI 3D torus, 90 GB/s/link' or 'NVLink 450 GB/s x8'."""
    parts = []
    if chip.ici_link_bw_bytes_per_s is not None and chip.ici_axes:
        parts.append(
            f"ICI {chip.ici_axes}D torus, {fmt_rate(chip.ici_link_bw_bytes_per_s, 'B/s')}/link"
        )
    if chip.nvlink_bw_bytes_per_s is not None:
        dom = f" x{chip.nvlink_domain}" if chip.nvlink_domain else ""
        parts.append(f"{chip.scaleup_fabric} {fmt_rate(chip.nvlink_bw_bytes_per_s, 'B/s')}{dom}")
    return "; ".join(parts) or "-"


def no_bf16_reason(chip: Chip) -> str:
    return (
        f"{chip.name} has no bf16 units ({chip.generation}); its 16-bit peak is "
        f"{chip.default_dtype} (default_dtype_flops_per_s)"
    )


def summary(chip: Chip) -> dict[str, Any]:
    """The row of one chip in `roofline chips --json` (bf16 fields null with a reason on V100)."""
    bf16 = chip.peak_flops_per_s.get("bf16")
    out: dict[str, Any] = {
        "name": chip.name,
        "vendor": chip.vendor,
        "generation": chip.generation,
        "aliases": list(chip.aliases),
        "bf16_flops_per_s": bf16,
        "default_dtype": chip.default_dtype,
        "default_dtype_flops_per_s": chip.peak(chip.default_dtype),
        "hbm_bytes": chip.hbm_bytes,
        "hbm_bw_bytes_per_s": chip.hbm_bw_bytes_per_s,
        "critical_intensity_bf16": None if bf16 is None else chip.critical_intensity("bf16"),
        "interconnect": interconnect(chip),
        "ici_link_bw_bytes_per_s": chip.ici_link_bw_bytes_per_s,
        "nvlink_bw_bytes_per_s": chip.nvlink_bw_bytes_per_s,
        "nvlink_domain": chip.nvlink_domain,
        "node_egress_bytes_per_s": chip.node_egress_bytes_per_s,
        "usd_per_hour": chip.usd_per_hour,
        "price_source": chip.price_source,
    }
    if bf16 is None:
        out["bf16_flops_per_s_reason"] = out["critical_intensity_bf16_reason"] = no_bf16_reason(
            chip
        )
    if chip.usd_per_hour is None:
        out["usd_per_hour_reason"] = chip.price_source or "no price in the chip file"
    return out


def _row(c: Chip) -> list[str]:
    mark = "" if "bf16" in c.peak_flops_per_s else "*"
    return [
        c.name,
        f"{c.peak(c.default_dtype) / 1e12:,.0f}{mark}",
        f"{c.hbm_bytes / GB:,.0f}",
        f"{c.hbm_bw_bytes_per_s / TB:.2f}",
        f"{c.critical_intensity(c.default_dtype):,.0f}{mark}",
        interconnect(c),
        "-" if c.usd_per_hour is None else f"{c.usd_per_hour:.2f}",
    ]


def run(args: argparse.Namespace) -> int:
    chips = [load_chip(n) for n in chip_names()]
    headers = ["chip", "bf16 TFLOP/s", "HBM GB", "HBM TB/s", "FLOP/B bf16", "interconnect", "$/h"]
    text = table([_row(c) for c in chips], headers, align="lrrrrlr")
    text += "\n\nPeaks are dense. FLOP/B = bf16 peak / HBM bandwidth (critical intensity). GB = 1e9 bytes."
    if any("bf16" not in c.peak_flops_per_s for c in chips):
        text += "\n* fp16: the chip has no bf16 units (V100); its fp16 peak is shown."
    text += "\nDetails and sources: `roofline chip NAME`."
    return emit(args, NAME, {}, {"chips": [summary(c) for c in chips]}, text)
