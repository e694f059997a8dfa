"""Survey: run many fuzz cases per family and list every distinct failure (not a test).

    PYTHONPATH=src python tests/fuzz/survey.py [N per family] [family ...]
    ROOFLINE_FUZZ_SEED=20261202 ... survey.py 480     # a fresh run that can be repeated

The pytest tier stops at the first failing case of a family (and shrinks it); this script keeps
going and groups failures by cause, which is how docs/fuzz-findings.md is written.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2]))

import fuzz_cases  # noqa: E402
from fuzz_harness import run_cli, run_request  # noqa: E402
from hypothesis import Phase, given, seed, settings  # noqa: E402
from hypothesis.errors import NonInteractiveExampleWarning  # noqa: E402


def _cause(outcome) -> str:
    if outcome.crash:
        lines = outcome.crash.strip().splitlines()
        where = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
        return f"{lines[-1][:120]} @ {where[-1] if where else '?'}"
    return "; ".join(outcome.problems())[:160]


SEED = os.environ.get("ROOFLINE_FUZZ_SEED")  # a fresh run: any integer, recorded with it


def _draw(strat, n: int) -> list[list[str]]:
    """n argv lists drawn by Hypothesis's real engine (`.example()` is not representative)."""
    out: list[list[str]] = []

    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None)
    @given(strat)
    def collect(argv):
        out.append(argv)

    if SEED is not None:
        collect = seed(int(SEED))(collect)
    collect()
    return out


def _run(fam: str, case):
    """One case: a CLI argv, or (family `ui`) a request to the UI's app in-process."""
    if fam == "ui":
        return run_request(fuzz_cases.ui_app(), case, timeout_s=20.0)
    return run_cli(case, timeout_s=10.0)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    families = [a for a in sys.argv[2:] if a != "-v"] or [*fuzz_cases.FAMILIES, "ui"]
    warnings.simplefilter("ignore", NonInteractiveExampleWarning)
    for fam in families:
        strat = fuzz_cases.ui_request() if fam == "ui" else fuzz_cases.FAMILIES[fam]
        causes: dict[str, list] = collections.defaultdict(list)
        t0, slow, answered = time.perf_counter(), 0.0, 0
        refusals: collections.Counter = collections.Counter()
        argvs = _draw(strat, n)
        for argv in argvs:
            out = _run(fam, argv)
            slow = max(slow, out.seconds)
            answered += getattr(out, "rc", getattr(out, "status", None)) in (0, 200)
            if getattr(out, "rc", None) == 2:
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
            case = argvs[0]
            shown = (
                case if fam == "ui" else " ".join(repr(a) if " " in a or not a else a for a in case)
            )
            print(f"      e.g. roofline {shown}"[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
