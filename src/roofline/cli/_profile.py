"""`--profile NAME|FILE`: the one argument every predicting command takes for efficiency.

`add_profile_arg(parser)` adds it (and keeps `--efficiency FILE` as a deprecated alias);
`resolve_profile(args, chip, framework=None)` returns the profile: the named one, a file
written by `roofline calibrate`, or the default (`specs.efficiency.default_profile`).
Every prediction's output should carry `profile.to_dict()` (name, source, calibrated).
"""

from __future__ import annotations

import argparse
from typing import Any

from roofline.specs.efficiency import Efficiency, default_profile, load_profile, profile_names


def add_profile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help="efficiency profile: "
        + ", ".join(profile_names())
        + ", or a TOML file written by `roofline calibrate` (default: the vendor's documented default)",
    )
    p.add_argument("--efficiency", metavar="FILE", help=argparse.SUPPRESS)  # old spelling


def resolve_profile(
    args: argparse.Namespace, chip: Any = None, framework: str | None = None
) -> Efficiency:
    """The profile the user asked for (or the default for `chip`), for `framework` if given."""
    name = getattr(args, "profile", None) or getattr(args, "efficiency", None)
    prof = load_profile(name) if name else default_profile(chip)
    return prof.for_framework(framework)
