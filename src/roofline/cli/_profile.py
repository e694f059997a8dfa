"""`--profile NAME|FILE`: the one argument every predicting command takes for efficiency.

`add_profile_arg(parser)` adds it (and keeps `--efficiency FILE` as a deprecated alias);
`resolve_profile(args, chip, framework=None)` returns the profile: the named one, a file
written by `roofline calibrate`, or the default (`specs.efficiency.default_profile`).
Every prediction's output should carry `profile.to_dict()` (name, source, calibrated).
"""

from __future__ import annotations

import argparse
from typing import Any

from roofline.specs.efficiency import (
    DEFAULT_PROFILE,
    Efficiency,
    default_profile,
    load_profile,
    profile_names,
)


def default_text() -> str:
    """What --profile defaults to, in words (from specs.efficiency.DEFAULT_PROFILE)."""
    if DEFAULT_PROFILE is None:
        return "the vendor's datasheet default"
    return f"{DEFAULT_PROFILE}, specs/profiles/{DEFAULT_PROFILE}.toml"


def add_profile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help="efficiency profile: "
        + ", ".join(profile_names())
        + f", or a TOML file written by `roofline calibrate` (default: {default_text()})",
    )
    p.add_argument("--efficiency", metavar="FILE", help=argparse.SUPPRESS)  # old spelling


def resolve_profile(
    args: argparse.Namespace, chip: Any = None, framework: str | None = None
) -> Efficiency:
    """The profile the user asked for (or the default for `chip`), for `framework` if given."""
    name = getattr(args, "profile", None) or getattr(args, "efficiency", None)
    prof = load_profile(name) if name else default_profile(chip)
    return prof.for_framework(framework)
