"""docs/book.md: every console block is the output of the command it shows (the planner's
search time, which differs run to run, compared as `<time>`: test_docs_fresh's TIMINGS)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from roofline.cli import main

sys_path = Path(__file__).parents[1]
if str(sys_path) not in sys.path:
    sys.path.insert(0, str(sys_path))
from test_docs_fresh import TIMINGS  # noqa: E402

DOC = Path(__file__).parents[2] / "docs" / "book.md"
BLOCK = re.compile(r"```console\n\$ (roofline [^\n]+)\n(.*?)\n```", re.S)
BLOCKS = BLOCK.findall(DOC.read_text())


def test_the_page_has_examples():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("command,shown", BLOCKS, ids=[c for c, _ in BLOCKS])
def test_console_block_is_the_commands_output(command, shown, capsys):
    assert main(shlex.split(command)[1:]) == 0
    assert _untimed(capsys.readouterr().out.rstrip("\n")) == _untimed(shown)


def _untimed(text: str) -> str:
    for pat in TIMINGS:
        text = pat.sub(r"\1<time>", text)
    return text
