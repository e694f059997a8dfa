"""`roofline system NAME`: the physical dims of a system, their bandwidths, wraparound and price."""

from __future__ import annotations

import argparse
from typing import Any

from roofline.cli._common import add_json, add_wraparound, emit
from roofline.core.collectives import CollectiveKind, collective_cost
from roofline.core.mesh import make_mesh
from roofline.report.table import kv, table
from roofline.specs.system import DimKind, System, parse_system, system_files
from roofline.units import fmt_rate, fmt_time, fmt_usd

NAME = "system"
HELP = "show a system (tpu-v5p:16x20x28, 2xtpu-v5e:16x16, h100:1024, gb200-nvl72:576, +sharp, or a .toml): dims, bandwidth, price"

_FORMS = [
    ("tpu-v5e:16x16", "one TPU slice; axes as written, the last is innermost"),
    ("2xtpu-v5p:16x20x28", "two slices joined by DCN (an outer 'dcn' dim)"),
    ("h100:1024", "GPUs: NVLink nodes, leaf (scalable units of 32 nodes), spine"),
    ("gb200-nvl72:576", "72-GPU NVLink domains (gb300 too)"),
    ("gb200:256", "partly used racks: 4 domains of 64 GPUs (whole trays of 4)"),
    ("mi300x:64", "AMD: 8-GPU nodes over Infinity Fabric (dim xgmi)"),
    ("h100:1024+sharp", "switches reduce in-network (SHARP)"),
    ("path/to/system.toml", "your own system file"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name", nargs="?", metavar="NAME", help="system spec or .toml path (omit to list the forms)"
    )
    p.add_argument(
        "--sharp",
        action="store_true",
        default=None,
        help="switches do in-network reductions (NVIDIA SHARP)",
    )
    p.add_argument(
        "--price", type=float, default=None, metavar="USD", help="override the price per chip-hour"
    )
    add_wraparound(p)
    add_json(p)


def dim_rows(system: System) -> list[dict[str, Any]]:
    """One row per physical dim, outermost first, with the AllGather bandwidth over the whole dim."""
    names = [d.name for d in system.dims]
    rows = []
    if not system.dims:
        return rows
    mesh = make_mesh(
        system,
        {n: d.size for n, d in zip(names, system.dims, strict=True)},
        placement={n: n for n in names},
    )
    for d in system.dims:
        ag = collective_cost(CollectiveKind.ALL_GATHER, 1.0, (d.name,), mesh)
        row = d.to_dict()
        row["allgather_bytes_per_s"] = ag.tiers[0].bytes_per_s if ag.tiers else None
        row["label"] = ag.bottleneck if ag.tiers else d.name
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> int:
    if not args.name:
        text = "System specs:\n" + table(_FORMS, ["spec", "meaning"], align="ll")
        files = system_files()
        if files:
            text += "\n\nExample system files:\n" + "\n".join(f"  {f}" for f in files)
        return emit(
            args,
            NAME,
            {},
            {"forms": [f for f, _ in _FORMS], "files": [str(f) for f in files]},
            text,
        )
    system = parse_system(
        args.name, sharp=args.sharp, usd_per_chip_hour=args.price, wraparound=args.wraparound
    )
    rows = dim_rows(system)
    result = system.to_dict()
    result["dims"] = rows
    inputs = {
        "system": args.name,
        "sharp": args.sharp,
        "price": args.price,
        "wraparound": args.wraparound,
    }
    bps = lambda v: fmt_rate(v, "B/s")  # noqa: E731
    head = kv(
        [
            ("system", system.name),
            ("chip", system.chip.name),
            (
                "chips",
                f"{system.n_chips:,}"
                + (f" ({system.n_slices} slices)" if system.n_slices > 1 else ""),
            ),
            ("layout", system.description or "-"),
            ("in-network reduction", "SHARP" if system.sharp else "no"),
            (
                "price",
                "unknown"
                if system.usd_per_chip_hour is None
                else f"{fmt_usd(system.usd_per_chip_hour)}/chip-hour, {fmt_usd(system.usd_per_hour)}/hour",
            ),
        ]
    )
    trows = []
    for r in rows:
        kind = DimKind(r["kind"])
        wrap = ("ring" if r["wraparound"] else "open line") if kind is DimKind.ICI else "switched"
        trows.append(
            (
                r["name"],
                kind.value,
                r["size"],
                bps(r["bw_bytes_per_s"]),
                wrap,
                fmt_time(r["hop_latency_s"]),
                "-" if r["allgather_bytes_per_s"] is None else bps(r["allgather_bytes_per_s"]),
            )
        )
    text = (
        head
        + "\n\nPhysical dims, outermost first:\n"
        + table(
            trows,
            [
                "dim",
                "kind",
                "size",
                "bw/chip one way",
                "wraparound",
                "hop latency",
                "AllGather B/s",
            ],
        )
    )
    text += (
        "\n\nbw/chip: ICI = one link one way; NVLink = GPU egress; leaf/spine = node egress / GPUs per node; "
        "dcn = per chip.\nAllGather B/s = bytes per chip / time for an AllGather over the whole dim alone."
    )
    return emit(args, NAME, inputs, result, text)
