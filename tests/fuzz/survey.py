"""Survey: run many fuzz cases per family and list every distinct failure (not a test).

    PYTHONPATH=src python tests/fuzz/survey.py [N per family] [family ...]

The pytest tier stops at the first failing case of a family (and shrinks it); this script keeps
going and groups failures by cause, which is how docs/fuzz-findings.md is written.
"""

from __future__ import annotations

import collections
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2]))

import fuzz_cases  # noqa: E402
from fuzz_harness import run_cli  # noqa: E402
from hypothesis import Phase, given, settings  # noqa: E402
from hypothesis.errors import NonInteractiveExampleWarning  # noqa: E402


def _cause(outcome) -> str:
    if outcome.crash:
        lines = outcome.crash.strip().splitlines()
        where = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
        return f"{lines[-1][:120]} @ {where[-1] if where else '?'}"
    return "; ".join(outcome.problems())[:160]


def _draw(strat, n: int) -> list[list[str]]:
    """n argv lists drawn by Hypothesis's real engine (`.example()` is not representative)."""
    out: list[list[str]] = []

    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None)
    @given(strat)
    def collect(argv):
        out.append(argv)

    collect()
    return out


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    families = [a for a in sys.argv[2:] if a != "-v"] or list(fuzz_cases.FAMILIES)
    warnings.simplefilter("ignore", NonInteractiveExampleWarning)
    for fam in families:
        strat = fuzz_cases.FAMILIES[fam]
        causes: dict[str, list] = collections.defaultdict(list)
        t0, slow, answered = time.perf_counter(), 0.0, 0
        refusals: collections.Counter = collections.Counter()
        argvs = _draw(strat, n)
        for argv in argvs:
            out = run_cli(argv, timeout_s=10.0)
            slow = max(slow, out.seconds)
            answered += out.rc == 0
            if out.rc == 2:
                refusals[out.err.split(": error: ")[-1].split("Rule:")[0][:70]] += 1
            if out.problems():
                causes[_cause(out)].append(argv)
        dt = time.perf_counter() - t0
        bad = sum(len(v) for v in causes.values())
        print(
            f"== {fam}: {len(argvs)} cases, {answered} answered, {bad} failing, {dt:.1f} s "
            f"({1000 * dt / max(len(argvs), 1):.0f} ms/case, max {slow:.2f} s)"
        )
        if "-v" in sys.argv:
            for msg, k in refusals.most_common(6):
                print(f"  refused [{k}] {msg}")
        for cause, argvs in sorted(causes.items(), key=lambda kv: -len(kv[1])):
            print(f"  [{len(argvs)}] {cause}")
            print(
                f"      e.g. roofline {' '.join(repr(a) if ' ' in a or not a else a for a in argvs[0])}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
