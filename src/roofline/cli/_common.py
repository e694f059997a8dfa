"""Shared CLI helpers: --json flag, output, parsing of `K=V,...` lists."""

from __future__ import annotations

import argparse
from typing import Any

from roofline.errors import SpecError
from roofline.report.jsonout import dumps
from roofline.units import parse_quantity


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json", action="store_true", help="print a versioned JSON document instead of tables"
    )


def add_wraparound(p: argparse.ArgumentParser) -> None:
    """--wraparound / --no-wraparound: force rings or open lines on every ICI axis (default: the book's rule)."""
    wrap = p.add_mutually_exclusive_group()
    wrap.add_argument(
        "--wraparound",
        dest="wraparound",
        action="store_true",
        default=None,
        help="force a ring on every ICI axis",
    )
    wrap.add_argument(
        "--no-wraparound",
        dest="wraparound",
        action="store_false",
        help="force open lines on every ICI axis",
    )


def emit(
    args: argparse.Namespace,
    command: str,
    inputs: dict[str, Any],
    result: dict[str, Any],
    text: str,
) -> int:
    print(dumps(command, inputs, result) if getattr(args, "json", False) else text)
    return 0


def parse_assignments(text: str, *, what: str, integer: bool = True) -> dict[str, float]:
    """'B=256,D=8192' -> {'B': 256, 'D': 8192}; values accept suffixes (4k, 1M)."""
    out: dict[str, float] = {}
    if not text:
        return out
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise SpecError(
                f"cannot read {what} item {part!r}",
                rule=f"{what} is a comma-separated list of NAME=VALUE",
                fix=f"write e.g. --{what} B=256,D=8192",
            )
        k, v = part.split("=", 1)
        val = parse_quantity(v, what=k.strip())
        if integer:
            if val != int(val) or val <= 0:
                raise SpecError(
                    f"{what} {k.strip()}={v.strip()}",
                    rule="sizes are positive whole numbers",
                    fix=f"give {k.strip()} a positive integer",
                )
            val = int(val)
        out[k.strip()] = val
    return out
