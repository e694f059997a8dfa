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
        parts.append(f"NVLink {fmt_rate(chip.nvlink_bw_bytes_per_s, 'B/s')}{dom}")
    return "; ".join(parts) or "-"


def summary(chip: Chip) -> dict[str, Any]:
    """The row of one chip in `roofline chips --json`."""
    return {
        "name": chip.name,
        "vendor": chip.vendor,
        "generation": chip.generation,
        "aliases": list(chip.aliases),
        "bf16_flops_per_s": chip.peak("bf16"),
        "hbm_bytes": chip.hbm_bytes,
        "hbm_bw_bytes_per_s": chip.hbm_bw_bytes_per_s,
        "critical_intensity_bf16": chip.critical_intensity("bf16"),
        "interconnect": interconnect(chip),
        "ici_link_bw_bytes_per_s": chip.ici_link_bw_bytes_per_s,
        "nvlink_bw_bytes_per_s": chip.nvlink_bw_bytes_per_s,
        "nvlink_domain": chip.nvlink_domain,
        "node_egress_bytes_per_s": chip.node_egress_bytes_per_s,
        "usd_per_hour": chip.usd_per_hour,
        "price_source": chip.price_source,
    }


def run(args: argparse.Namespace) -> int:
    chips = [load_chip(n) for n in chip_names()]
    rows = []
    for c in chips:
        rows.append(
            [
                c.name,
                f"{c.peak('bf16') / 1e12:,.0f}",
                f"{c.hbm_bytes / GB:,.0f}",
                f"{c.hbm_bw_bytes_per_s / TB:.2f}",
                f"{c.critical_intensity('bf16'):,.0f}",
                interconnect(c),
                "-" if c.usd_per_hour is None else f"{c.usd_per_hour:.2f}",
            ]
        )
    headers = ["chip", "bf16 TFLOP/s", "HBM GB", "HBM TB/s", "FLOP/B bf16", "interconnect", "$/h"]
    text = table(rows, headers, align="lrrrrlr")
    text += "\n\nPeaks are dense. FLOP/B = bf16 peak / HBM bandwidth (critical intensity). GB = 1e9 bytes."
    text += "\nDetails and sources: `roofline chip NAME`."
    return emit(args, NAME, {}, {"chips": [summary(c) for c in chips]}, text)
