"""`roofline schema KIND`: the JSON Schema of a user file kind, for editor completion.

The document printed is the one the loaders check files against (roofline.specs.schema); save
it and point the editor at it (docs/schemas.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from roofline.errors import SpecError
from roofline.specs.schema import KINDS, schema

NAME = "schema"
HELP = (
    "print the JSON Schema of a file kind (model, chip, system, framework, profile, engine, runs)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=KINDS, help="which file kind")
    p.add_argument("--out", metavar="FILE", help="write the schema to FILE instead of stdout")


def run(args: argparse.Namespace) -> int:
    text = json.dumps(schema(args.kind), indent=2) + "\n"
    if not args.out:
        print(text, end="")
        return 0
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as e:
        raise SpecError(
            f"--out {args.out!r} cannot be written ({e.strerror})",
            rule="--out names a writable file",
            fix="pick a path in an existing, writable folder",
        ) from None
    print(f"wrote {args.out}")
    return 0
