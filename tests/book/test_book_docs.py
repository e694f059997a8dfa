"""docs/book.md: every console block is the output of the command it shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from roofline.cli import main

DOC = Path(__file__).parents[2] / "docs" / "book.md"
BLOCK = re.compile(r"```console\n\$ (roofline [^\n]+)\n(.*?)\n```", re.S)
BLOCKS = BLOCK.findall(DOC.read_text())


def test_the_page_has_examples():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("command,shown", BLOCKS, ids=[c for c, _ in BLOCKS])
def test_console_block_is_the_commands_output(command, shown, capsys):
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out.rstrip("\n") == shown
