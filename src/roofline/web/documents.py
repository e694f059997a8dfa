"""The CLI's `--json` documents, obtained by running the subcommand itself in-process.

The report page and the web UI never recompute anything: they ask `roofline <command> ...
--json` for its document (the same bytes the terminal would print) and render that. Inputs
arrive as a {name: value} mapping (a query string, a form, or a parsed namespace) and are
turned into the command's own argv through its own argparse definition, so every flag the
command gains is accepted here too, and every bad value gets the command's own message.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from roofline.errors import SpecError
from roofline.report.page import ReportDocuments

# flags that write files or pick the output format: never taken from a form or a URL
NOT_INPUTS = frozenset({"help", "json", "plot"})
# commands that write files or serve pages rather than print a document
NOT_DOCUMENTS = frozenset({"report", "ui"})
_TRUE = frozenset({"1", "true", "on", "yes"})
_LOCK = threading.Lock()  # the run swaps sys.stdout: one command at a time


def tool_version() -> str:
    try:
        return version("roofline")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "0.0.0"


def has_command(command: str) -> bool:
    from roofline.cli import COMMANDS

    return (
        command in COMMANDS and importlib.util.find_spec(f"roofline.cli.{command}_cmd") is not None
    )


@functools.cache
def command_parser(command: str) -> argparse.ArgumentParser:
    """A parser with exactly the arguments of `roofline <command>` (from its own module)."""
    if not has_command(command):
        raise SpecError(
            f"unknown command {command!r}",
            rule="the documents are those of the `roofline` subcommands",
            fix="use one of: " + ", ".join(_commands()),
        )
    mod = importlib.import_module(f"roofline.cli.{command}_cmd")
    p = argparse.ArgumentParser(prog=f"roofline {command}", add_help=False)
    mod.add_arguments(p)
    return p


def _commands() -> tuple[str, ...]:
    from roofline.cli import COMMANDS

    return COMMANDS


def input_actions(command: str) -> dict[str, argparse.Action]:
    """The command's inputs by dest name (`batch_tokens`), without --json/--plot/--help."""
    return {
        a.dest: a
        for a in command_parser(command)._actions
        if a.dest not in NOT_INPUTS and a.dest != argparse.SUPPRESS
    }


def input_default(command: str, name: str) -> Any:
    return input_actions(command)[name].default


def _flag(a: argparse.Action) -> str:
    return next((s for s in a.option_strings if s.startswith("--")), a.option_strings[0])


def argv_for(command: str, values: Mapping[str, Any]) -> list[str]:
    """{input: value} -> argv of `roofline <command>`; blank values mean the default.

    Names may use dashes or underscores (`batch-tokens`, `batch_tokens`). Switches
    (`--no-sub-slices`) are on for 1/true/on/yes. An unknown name is a SpecError.
    """
    actions = input_actions(command)
    positional: list[str] = []
    flags: list[str] = []
    for raw, value in values.items():
        name = str(raw).replace("-", "_")
        if name not in actions:
            raise SpecError(
                f"roofline {command} has no input {raw!r}",
                rule="inputs are the options of `roofline " + command + " --help`",
                fix="use one of: " + ", ".join(sorted(actions)),
            )
        a = actions[name]
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if not a.option_strings:
            positional.append(str(value))
        elif a.nargs == 0:  # store_true / store_false switches
            if str(value).strip().lower() in _TRUE or value is True:
                flags.append(_flag(a))
        else:
            flags += [_flag(a), str(value)]
    return positional + flags


def values_from_namespace(command: str, ns: argparse.Namespace) -> dict[str, Any]:
    """The inputs of `command` that `ns` sets away from their defaults (a report's train part)."""
    out: dict[str, Any] = {}
    for name, a in input_actions(command).items():
        v = getattr(ns, name, a.default)
        if v != a.default and v is not None:
            out[name] = v
    return out


def document(command: str, argv: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`roofline <command> <argv> --json`, parsed: exactly what the terminal would print."""
    if command in NOT_DOCUMENTS or not has_command(command):
        raise SpecError(
            f"unknown command {command!r}",
            rule="documents come from the `roofline` subcommands that print one with --json",
            fix="use one of: " + ", ".join(c for c in _commands() if c not in NOT_DOCUMENTS),
        )
    return json.loads(_document_text(command, tuple(str(a) for a in argv)))


@functools.lru_cache(maxsize=256)
def _document_text(command: str, argv: tuple[str, ...]) -> str:
    from roofline.cli import build_parser

    parser = build_parser(command)  # only that command's module is imported
    out, err = io.StringIO(), io.StringIO()
    with _LOCK, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = parser.parse_args([command, *argv, "--json"])
        except SystemExit:
            raise _usage_error(command, argv, err.getvalue()) from None
        args._run(args)
    return out.getvalue()


def _in_process(command: str, argv: list[str]) -> dict[str, Any]:
    return document(command, argv)


def _usage_error(command: str, argv: tuple[str, ...], stderr: str) -> SpecError:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    msg = lines[-1] if lines else "the inputs could not be read"
    msg = msg.split(": error: ", 1)[-1]
    return SpecError(
        f"roofline {command} {' '.join(argv)}: {msg}".replace("  ", " "),
        rule=f"the inputs are those of `roofline {command} --help`",
        fix="correct or remove that input",
    )


def report_documents(
    train_values: Mapping[str, Any],
    serve: Mapping[str, Any] | None = None,
    serve_argv: list[str] | None = None,
    run_document: Callable[[str, list[str]], dict[str, Any]] | None = None,
) -> ReportDocuments:
    """Every document a report shows: train, then the model ledger, system and chip it used.

    The serving section comes from `serve` (a `roofline serve --json` document already made)
    or from running `roofline serve <serve_argv>` (the report's model unless it names one).
    `run_document` makes one document (default: in this process; the UI passes its bounded,
    cached worker, so the page and /api/<command> show the very same document).
    """
    document = run_document or _in_process
    argv = argv_for("train", train_values)
    train = document("train", argv)
    system = document("system", [train["inputs"]["system"]])
    chip = document("chip", [system["chip"]])
    model_arg = _value(train_values, "model") or input_default("train", "model")
    seq = train["inputs"].get("seq_len", train["inputs"].get("seq"))
    model_argv = [model_arg, "--seq", str(seq), "--chip", chip["name"]]
    model = document("model", model_argv)
    commands = {
        "train": _shell("train", argv),
        "model": _shell("model", model_argv),
        "chip": _shell("chip", [chip["name"]]),
    }
    if serve_argv is not None:
        serve_argv = _with_model(serve_argv, str(model_arg))
        serve = document("serve", serve_argv)
        commands["serve"] = _shell("serve", serve_argv)
    return ReportDocuments(
        train=train,
        model=model,
        system=system,
        chip=chip,
        serve=dict(serve) if serve else None,
        commands=commands,
        version=tool_version(),
    )


def _with_model(argv: list[str], model: str) -> list[str]:
    named = any(a == "--model" or a.startswith("--model=") for a in argv)
    return list(argv) if named else ["--model", model, *argv]


def _value(values: Mapping[str, Any], name: str) -> Any:
    for k, v in values.items():
        if str(k).replace("-", "_") == name and v not in (None, ""):
            return v
    return None


def _shell(command: str, argv: list[str]) -> str:
    import shlex

    return " ".join(["roofline", command, *(shlex.quote(a) for a in argv), "--json"])
