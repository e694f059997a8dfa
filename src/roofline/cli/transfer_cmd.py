"""`roofline transfer --system tpu-v5e:4x4 --bytes 17M --from 0,0 --to 3,3` (and --gather-to,
--from host, --capacities): point-to-point, many-to-one and host-to-HBM transfers, tier capacities."""

from __future__ import annotations

import argparse
from typing import Any

from roofline.cli._common import add_json, emit, number_flag
from roofline.core.transfer import capacities, gather_to_one, host_to_hbm, point_to_point
from roofline.errors import SpecError
from roofline.specs.system import parse_system
from roofline.units import fmt_bytes, fmt_time

NAME = "transfer"
HELP = (
    "point-to-point transfer time and hops, many-to-one gathers, host-to-HBM loads over PCIe, "
    "and each network tier's cable, bisection and switch bandwidth"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", default="tpu-v5e:4x4", help="e.g. tpu-v5e:4x4, h100:1024")
    p.add_argument("--bytes", help="bytes to move (suffixes: 17M, 16G, 1Gi)")
    p.add_argument(
        "--from",
        dest="src",
        help='sending chip: TPU coordinates "0,0", "slice:x,y" on several slices (a bare slice '
        'index "1": every chip of that slice), or a GPU rank "12"; "host" loads from host memory',
    )
    p.add_argument("--to", dest="dst", help="receiving chip (for --from host: one chip only)")
    p.add_argument("--gather-to", help="every chip sends its 1/N of --bytes to this chip")
    p.add_argument(
        "--capacities",
        action="store_true",
        help="list each tier's cable, bisection and switch bandwidth",
    )
    add_json(p)


def _bytes(args: argparse.Namespace) -> float:
    if args.bytes is None:
        raise SpecError(
            "no --bytes given",
            rule="a transfer needs the number of bytes it moves",
            fix="give e.g. --bytes 16G",
        )
    return number_flag(args.bytes, "bytes", hi=1e18, example="16G")


def result(args: argparse.Namespace) -> dict[str, Any]:
    system = parse_system(args.system)
    out: dict[str, Any] = {"system": system.name}
    if args.capacities:
        out["capacities"] = [c.to_dict() for c in capacities(system)]
    t = _transfer(args, system)
    if t is not None:
        out["transfer"] = t.to_dict()
    if len(out) == 1:
        raise SpecError(
            "nothing to compute",
            rule="transfer needs --from/--to, --gather-to, --from host, or --capacities",
            fix="give e.g. --bytes 17M --from 0,0 --to 3,3",
        )
    return out


def _transfer(args: argparse.Namespace, system):
    if args.gather_to is not None:
        return gather_to_one(system, args.gather_to, _bytes(args))
    if args.src is None:
        return None
    if args.src == "host":
        return host_to_hbm(system, _bytes(args), chips=1 if args.dst is not None else None)
    if args.dst is None:
        raise SpecError(
            f"--from {args.src} without --to",
            rule="a point-to-point transfer names both chips",
            fix="add --to, e.g. --to 3,3",
        )
    return point_to_point(system, args.src, args.dst, _bytes(args))


def render(res: dict[str, Any]) -> str:
    lines = [f"system {res['system']}"]
    t = res.get("transfer")
    if t is not None and t["links"] == 0:
        lines.append(
            f"{t['kind']}: {fmt_bytes(t['bytes'])} — the data is already there, nothing moves"
        )
    elif t is not None:
        lines += [
            f"{t['kind']}: {fmt_bytes(t['bytes'])} — {t['path']}",
            f"  {t['formula']}",
            f"    = {t['substitution']} = {fmt_time(t['time_s'])}",
            (
                f"  first byte after {fmt_time(t['t_first_byte_s'])} ({t['hops']} hop"
                f"{'s' * (t['hops'] != 1)}); "
                if t["hops"]
                else "  "
            )
            + f"streaming {fmt_time(t['t_bandwidth_s'])} at "
            f"{t['bw_bytes_per_s']:.3g} B/s over {t['links']} link{'s' * (t['links'] != 1)}",
        ]
    if "capacities" in res and not res["capacities"]:
        lines.append("one chip: no network tiers")
    for c in res.get("capacities", []):
        sw = c["switch_bw_bytes_per_s"]
        lines.append(
            f"{c['name']} ({c['kind']}): groups of {c['chips_below']} chips, "
            f"{c['per_chip_bw_bytes_per_s']:.3g} B/s per chip; cable {c['cable_bw_bytes_per_s']:.3g} B/s, "
            f"bisection {c['bisection_bw_bytes_per_s']:.3g} B/s"
            + ("" if sw is None else f", switches {sw:.3g} B/s")
            + (
                f"; switch-bound: a collective gets S/chips = {c['collective_bw_bytes_per_s']:.3g} B/s per chip"
                if c["switch_bound"]
                else ""
            )
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    res = result(args)
    inputs = {
        "system": res["system"],
        "bytes": None if args.bytes is None else _bytes(args),
        "from": args.src,
        "to": args.dst,
        "gather_to": args.gather_to,
        "capacities": args.capacities,
    }
    return emit(args, NAME, inputs, res, render(res))
