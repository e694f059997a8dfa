"""`roofline --help` costs no more than `roofline chips` (issue 21 item 3: it took 1.3 s against
0.17 s when it imported every command): beyond the standard library, what `--help` imports is a
subset of what `chips` imports, and no command module. (benchmarks/bench_ratios.py times the
two; this holds the cause, which a timed test on a shared machine could not.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PROBE = """
import sys
from roofline.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write("\\n@@" + " ".join(sorted(sys.modules)))
"""


def imported(*argv: str) -> set[str]:
    """Modules a fresh interpreter holds after `roofline ARGV`, the standard library left out."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    p = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, timeout=120
    )
    names = p.stderr.rsplit("@@", 1)[1].split()
    return {n for n in names if n.split(".")[0] not in sys.stdlib_module_names}


def test_help_imports_no_more_than_chips():
    help_, chips = imported("--help"), imported("chips")
    assert "roofline.cli" in help_ and "roofline.cli.chips_cmd" in chips  # the probe works
    assert not [m for m in help_ if m.endswith("_cmd")]
    assert help_ <= chips, sorted(help_ - chips)


def test_an_unknown_command_imports_no_command_either():
    assert not [m for m in imported("no-such-command") if m.endswith("_cmd")]
