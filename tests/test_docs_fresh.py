"""Docs that cannot go stale (issue 22 item 11): every ```text block in README.md and docs/*.md
whose first line is `$ roofline ...` is run and its output compared with the block.

The policy, so that a block can show part of a long output and still be checked exactly:

- every line is compared exactly (trailing spaces aside), numbers included;
- except timings, which differ run to run: the seconds in "Searched N plans (M costed) in X s"
  and "compiled in X s" are replaced by `<time>` on both sides (TIMINGS); the counts around them
  are still compared;
- a line that is exactly `...` stands for zero or more lines left out;
- a line that ends in ` ...` stands for one line that starts with the text before it;
- a block may hold several commands, each starting with a `$ roofline` line; stdout and stderr
  are compared together (an error example shows the error paragraph).

`ROOFLINE_UPDATE_DOCS=1 python -m pytest tests/test_docs_fresh.py` rewrites the blocks that
differ from what the tool prints now (keeping their `...` elisions where the output's shape is
unchanged; review the diff), then fails so that the rewrite is never silent.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROMPT = "$ roofline "
SKIP = "..."
TIMINGS = (
    re.compile(r"(Searched [\d,]+ plans (?:in [^(]+ )?\([\d,]+ costed\) in )[\d.]+ (?:s|ms|µs)"),
    re.compile(r"(compiled in )[\d.]+ s"),
)
UPDATE = os.environ.get("ROOFLINE_UPDATE_DOCS") == "1"


@dataclass(frozen=True)
class Example:
    """One `$ roofline ...` command of a doc block and the output lines the block shows."""

    doc: Path
    line: int  # 1-based line of the `$` in the doc
    command: str
    expected: tuple[str, ...]


def _fences(text: str) -> list[tuple[int, list[str]]]:
    """(first content line index, content lines) of every ```text block."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```text":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            out.append((i + 1, lines[i + 1 : j]))
            i = j
        i += 1
    return out


def examples(doc: Path) -> list[Example]:
    out: list[Example] = []
    for start, body in _fences(doc.read_text(encoding="utf-8")):
        if not body or not body[0].startswith(PROMPT):
            continue
        cmds = [k for k, line in enumerate(body) if line.startswith(PROMPT)]
        for a, b in zip(cmds, [*cmds[1:], len(body)], strict=True):
            shown = [x.rstrip() for x in body[a + 1 : b]]
            while shown and not shown[-1]:
                shown.pop()
            out.append(Example(doc, start + a + 1, body[a][len(PROMPT) :], tuple(shown)))
    return out


ALL = [e for d in DOCS for e in examples(d)]


def normalize(line: str) -> str:
    line = line.rstrip()
    for t in TIMINGS:
        line = t.sub(lambda m: m.group(1) + "<time>", line)
    return line


def line_matches(shown: str, actual: str) -> bool:
    shown, actual = normalize(shown), normalize(actual)
    if shown.endswith(" " + SKIP):
        return actual.startswith(shown[: -len(SKIP)].rstrip())
    return shown == actual


def matches(shown: list[str], actual: list[str]) -> bool:
    """Whether the block's lines describe the output (`...` lines skip, see the module doc)."""

    @cache
    def go(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(actual)
        if shown[i] == SKIP:
            return any(go(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and line_matches(shown[i], actual[j]) and go(i + 1, j + 1)

    return go(0, 0)


def _shape(line: str) -> str:
    """A line with its numbers blanked: how regeneration finds a shown line in new output."""
    return re.sub(r"[\d][\d.,]*", "#", line.rstrip())


def _cut_like(shown: str, actual: str) -> str:
    """`actual` cut after as many words as `shown` kept before its ` ...`."""
    words = len(shown[: -len(SKIP)].split())
    m = re.match(r"\s*(?:\S+\s+){" + str(max(words - 1, 0)) + r"}\S+", actual)
    return (m.group(0) if m else actual) + " " + SKIP


def regenerate(shown: list[str], actual: list[str]) -> list[str]:
    """The block rewritten from `actual`: the whole output when the block elides nothing, else
    each shown line replaced by the next output line of the same shape (numbers aside)."""
    if SKIP not in shown and not any(x.endswith(" " + SKIP) for x in shown):
        return actual
    out, j = [], 0
    for line in shown:
        if line == SKIP:
            out.append(line)
            continue
        prefix = line[: -len(SKIP)].rstrip() if line.endswith(" " + SKIP) else line
        key = _shape(prefix).split("#")[0] or _shape(prefix)
        k = next((k for k in range(j, len(actual)) if _shape(actual[k]).startswith(key)), None)
        if k is None and j < len(actual) and out and out[-1] != SKIP:
            k = j  # no line of that shape (a rule that changed width): the next line in order
        if k is None:
            out.append(line)
            continue
        out.append(_cut_like(line, actual[k]) if prefix != line else actual[k])
        j = k + 1
    return out


def run_example(command: str) -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    for k in ("XLA_FLAGS", "JAX_PLATFORMS"):
        env.pop(k, None)
    p = subprocess.run(
        [sys.executable, "-m", "roofline", *shlex.split(command)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    lines = (p.stdout + p.stderr).rstrip("\n").splitlines()
    return p.returncode, [x.rstrip() for x in lines]


def _rewrite(ex: Example, new: list[str]) -> None:
    lines = ex.doc.read_text(encoding="utf-8").split("\n")
    start = lines.index(PROMPT + ex.command) + 1  # found again: an earlier rewrite moves lines
    lines[start : start + len(ex.expected)] = new
    ex.doc.write_text("\n".join(lines), encoding="utf-8")


def _param(ex: Example):
    marks = [pytest.mark.hlo] if ex.command.split()[0] == "verify" else []
    name = f"{ex.doc.name}:{ex.line}:{ex.command.split()[0] if ex.command else 'roofline'}"
    return pytest.param(ex, id=name, marks=marks)


def test_the_docs_have_examples():
    """The collector finds the README's examples (a parser that found none would pass)."""
    cmds = [e.command.split()[0] for e in ALL if e.doc.name == "README.md"]
    for name in ("train", "serve", "matmul", "collective", "op", "verify"):
        assert name in cmds, name


@pytest.mark.slow
@pytest.mark.parametrize("ex", [_param(e) for e in ALL])
def test_example_output_is_what_the_tool_prints(ex: Example):
    if ex.command.startswith("verify"):
        pytest.importorskip("jax")
    rc, actual = run_example(ex.command)
    assert "Traceback" not in "\n".join(actual), "\n".join(actual)
    if matches(list(ex.expected), actual):
        return
    if UPDATE:
        _rewrite(ex, regenerate(list(ex.expected), actual))
    shown = "\n".join(ex.expected)
    pytest.fail(
        f"{ex.doc.name} line {ex.line}: `roofline {ex.command}` (exit {rc}) no longer prints "
        f"what the doc shows{' (rewritten: review the diff)' if UPDATE else ''}.\n"
        f"--- shown\n{shown}\n--- printed\n" + "\n".join(actual)
    )


# --- the matcher itself: each rule can fail ----------------------------------------------


def test_numbers_are_compared_exactly_but_timings_are_not():
    assert matches(
        ["Searched 1,000 plans (10 costed) in 0.95 s; x"],
        ["Searched 1,000 plans (10 costed) in 3.2 s; x"],
    )
    assert not matches(
        ["Searched 1,000 plans (10 costed) in 0.95 s"],
        ["Searched 1,001 plans (10 costed) in 0.95 s"],
    )
    assert matches(
        ["Searched 1,000 plans in bf16 and fp8 (10 costed) in 0.95 s; x"],
        ["Searched 1,000 plans in bf16 and fp8 (10 costed) in 3.2 s; x"],
    )
    assert not matches(
        ["Searched 1,000 plans in bf16 (10 costed) in 0.95 s; x"],
        ["Searched 1,000 plans in bf16 and fp8 (10 costed) in 0.95 s; x"],
    )
    assert not matches(["TTFT  109 ms"], ["TTFT  347 ms"])
    assert matches(["mesh x; compiled in 6.3 s; y"], ["mesh x; compiled in 21.8 s; y"])


def test_elisions():
    out = ["a 1", "b 2", "c 3", "d 4"]
    assert matches(["a 1", SKIP, "d 4"], out)
    assert matches(["a 1", "b ...", SKIP], out)
    assert not matches(["a 1", "b 2"], out)  # the end is not elided unless it says so
    assert not matches(["a 1", "x ...", SKIP], out)
    assert not matches(["b 2", SKIP], out)  # nor the start
    assert matches([SKIP, "c 3", "d 4"], out)


def test_regenerate_keeps_elisions_and_takes_new_numbers():
    shown = ["head 1", "TTFT  109 ms (KV 429 µs)", "long line 1 with ...", SKIP]
    actual = [
        "head 1",
        "TTFT  347 ms (KV 429 µs, hand-off 263 ms)",
        "long line 9 with more words",
        "tail",
    ]
    new = regenerate(shown, actual)
    assert new == ["head 1", actual[1], "long line 9 with ...", SKIP]
    assert matches(new, actual)
    # a table rule that changed width has no line of its shape: the next line in order is taken
    assert regenerate(["a 1", "-----", "b 2"], ["a 1", "---", "b 3"]) == ["a 1", "---", "b 3"]


# --- other statements the issue found stale -------------------------------------------------


def test_the_package_docstring_names_files_that_exist():
    import roofline

    named = re.findall(r"[\w./-]+\.md", roofline.__doc__ or "")
    assert named
    for path in named:
        assert (ROOT / path).is_file(), path


def test_the_profile_help_states_the_default_the_tool_uses(capsys):
    from roofline.cli import main
    from roofline.specs.chip import load_chip
    from roofline.specs.efficiency import default_profile

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    name = default_profile(load_chip("h100")).name
    assert f"(default: {name}, specs/profiles/{name}.toml)" in help_text


def test_training_output_names_no_serving_hand_off(capsys):
    from roofline.cli import main

    assert main(["train", "--model", "llama-3-8b", "--system", "h100:64"]) == 0
    out = capsys.readouterr().out
    assert "Assumptions: efficiency profile" in out and "hand-off" not in out
