"""Shared CLI helpers: --json flag, output, parsing of `K=V,...` lists."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from roofline.errors import SpecError
from roofline.report.jsonout import dumps
from roofline.units import parse_quantity

MAX_DIM = 1 << 40  # one named dim of an op or array: beyond 1e12 elements nothing is physical


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


def int_flag(text: str | float, flag: str, *, lo: int = 1, hi: int, example: str = "") -> int:
    """A whole-number flag value (suffixes allowed: 4k, 1Mi) within [lo, hi], or one paragraph."""
    v = parse_quantity(text, what=flag)
    if v != int(v) or not lo <= v <= hi:
        why = " (larger is not a physical size)" if v > hi else ""
        raise SpecError(
            f"--{flag} {text}",
            rule=(
                f"--{flag} is a positive whole number up to {hi:,}{why}"
                if lo == 1
                else f"--{flag} is a whole number from {lo:,} to {hi:,}{why}"
            ),
            fix=f"give e.g. --{flag} {example or max(lo, 1)}",
        )
    return int(v)


def number_flag(
    text: str | float,
    flag: str,
    *,
    lo: float = 0.0,
    hi: float,
    lo_open: bool = True,
    example: str = "",
) -> float:
    """A finite number flag within (lo, hi] (or [lo, hi] with lo_open=False), or one paragraph."""
    v = parse_quantity(text, what=flag)
    if (v <= lo if lo_open else v < lo) or v > hi:
        op = ">" if lo_open else ">="
        raise SpecError(
            f"--{flag} {text}",
            rule=f"--{flag} is a number {op} {lo:g} and at most {hi:g}",
            fix=f"give e.g. --{flag} {example or 1}",
        )
    return v


def model_source(arg: str) -> dict[str, str | None]:
    """How a --model argument was resolved, for `inputs`: a catalog preset or a file.

    {"model_source": "preset" | "file", "model_arg": arg, "model_file": path or None}
    (issue 12: inputs.model must say which one was used). Every command taking a model can
    merge this into its `inputs`.
    """
    from roofline.specs.catalog import exists

    is_file = str(arg).endswith((".toml", ".json")) or exists(str(arg))
    return {
        "model_source": "file" if is_file else "preset",
        "model_arg": str(arg),
        "model_file": str(arg) if is_file else None,
    }


def check_output_path(path: str | None, flag: str) -> Path | None:
    """The path a command will write, checked before any work starts (None: not asked for).

    Refuses an empty path (it would silently mean the working directory), a directory, a
    missing folder and a folder this user cannot write, each as one paragraph, so a long fit
    or search never ends in a crash at the write."""
    import os

    if path is None:
        return None
    p = Path(path)
    if not str(path).strip():
        raise SpecError(
            f"{flag} ''",
            rule=f"{flag} names the file to write",
            fix=f"give a file name, e.g. {flag} out/result",
        )
    if p.is_dir():
        raise SpecError(
            f"{flag} {path}: it is a folder",
            rule=f"{flag} names a file to write, not a folder",
            fix=f"name a file inside it, e.g. {flag} {p / 'result'}",
        )
    parent = p.parent
    if not parent.is_dir():
        raise SpecError(
            f"{flag} {path}: folder {str(parent)!r} does not exist",
            rule="the file is written into an existing folder",
            fix="create the folder or choose another path",
        )
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise SpecError(
            f"{flag} {path}: this user cannot write there",
            rule="the file is written with your permissions",
            fix="choose a path in a folder you can write",
        )
    return p


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
            if val != int(val) or val <= 0 or val > MAX_DIM:
                raise SpecError(
                    f"{what} {k.strip()}={v.strip()}",
                    rule=f"sizes are positive whole numbers up to {MAX_DIM:,} (2^40)",
                    fix=f"give {k.strip()} a positive integer",
                )
            val = int(val)
        out[k.strip()] = val
    return out
