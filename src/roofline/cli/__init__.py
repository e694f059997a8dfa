"""`roofline` command line: a registry of subcommands, one module each.

Each module `roofline.cli.<name>` defines `NAME`, `HELP`, `add_arguments(parser)` and
`run(args) -> int`. Commands are thin shells: parse, call one library function, render.
User errors (`RooflineError`) print as one paragraph on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from roofline.errors import RooflineError

# Order is the order shown in --help (data flow: specs, ledger, roofline, comms, training, verify).
COMMANDS = (
    "chips",
    "chip",
    "models",
    "model",
    "op",
    "system",
    "collective",
    "matmul",
    "limits",
    "transfer",
    "train",
    "serve",
    "import",
    "export",
    "verify",
    "validate",
    "calibrate",
    "schema",
    "report",
    "ui",
)


def build_parser(only: str | None = None, *, listing: bool = False) -> argparse.ArgumentParser:
    """The argument parser; with `only`, just that subcommand's module is imported.

    Each command module imports what it computes with, so building every subparser would load
    the planner, numpy and matplotlib for `roofline chips`. `main` passes the command named on
    the command line; `--help` and unknown commands build them all. With `listing` (what
    `main` asks for when no command is named) each command is listed by the `NAME` and `HELP`
    its module states, read from the module's source without importing it (`_listed`): the
    top-level help and the unknown-command error then cost no more than `roofline chips`.
    """
    parser = argparse.ArgumentParser(
        prog="roofline",
        description="Compute, don't guess: rooflines, sharding, communication and training plans for Transformers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        modname = f"roofline.cli.{name}_cmd"
        spec = importlib.util.find_spec(modname)
        if spec is None:
            continue
        stated = _listed(spec.origin) if listing else None
        if stated is not None:
            sub.add_parser(stated[0], help=stated[1], description=stated[1])
            continue
        mod = importlib.import_module(modname)
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _listed(origin: str | None) -> tuple[str, str] | None:
    """A command module's `NAME` and `HELP` as its source states them (string constants at the
    top level), or None where it computes them (then the module is imported)."""
    import ast

    if origin is None:
        return None
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), origin)
    except (OSError, SyntaxError, ValueError):
        return None
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("NAME", "HELP"):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    return None
                if isinstance(value, str):
                    found[target.id] = value
    if "NAME" not in found or "HELP" not in found:
        return None
    return found["NAME"], found["HELP"]


def _command_in(argv: list[str]) -> str | None:
    """The subcommand named by the first positional argument, if it is one of COMMANDS."""
    for a in argv:
        if not a.startswith("-"):
            return a if a in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command_in(argv)
    parser = build_parser(command, listing=command is None)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    from roofline.progress import allowed

    try:
        with allowed(not getattr(args, "json", False)):  # no progress bar beside a document
            return int(args._run(args) or 0)
    except RooflineError as e:
        print(f"roofline {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # Python's int-conversion limit, wherever a huge number was read
        from roofline.specs.catalog import huge_number_error, too_many_digits

        if not too_many_digits(e):
            raise
        print(f"roofline {args.command}: error: {huge_number_error('an input')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `roofline ... | head`: the reader left; say nothing more
        _silence_stdout()
        return 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (captured)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
