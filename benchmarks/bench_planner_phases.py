"""Where the planner's first search spends its CPU time, phase by phase, against a baseline
tree (issue 21 item 3): each tree runs in fresh processes, interleaved round by round; a
process warms up on LLaMA-3 8B on a100:64 (as `bench_ratios.py planner` does), then times the
first search of `--model` on `--system` with the default stack, each phase on
`time.process_time` around the planner's own functions. The figure kept per tree and phase is
the best round (phases of one tree may come from different rounds).

    git worktree add /tmp/base 494a97b
    python benchmarks/bench_planner_phases.py --base /tmp/base [--system tpu-v5p:16x16x16
        --model llama-3-70b] [--rounds 6]

Phases: `enumerate_plans` (the mesh factorisations and the named rules), `_cost` (the family
walks and their timelines), of it `walk._meshes` (placing the meshes) and `_step` (every
timeline of the search, the listed plans' too), `_cost_rows` (the listed plans costed again),
`_algebra_alternative`, `rank`. A phase a tree does not have prints as `-`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

CHILD = """
import functools, json, sys, time
import roofline.training.planner.search as S
import roofline.training.step as ST
import roofline.core.walk as W
from roofline.core.stack import resolve_framework
try:
    from roofline.specs.model_catalog import load_model
except ImportError:  # trees before the import-cycle fix (494a97b)
    from roofline.specs.model import load_model
from roofline.specs.system import parse_system
acc = {}
def wrap(mod, name, label):
    f = getattr(mod, name, None)
    if f is None:
        return
    @functools.wraps(f)
    def g(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] = acc.get(label, 0.0) + time.process_time() - t
    setattr(mod, name, g)
for n in ("enumerate_plans", "_cost", "_cost_rows", "_algebra_alternative", "rank"):
    wrap(S, n, n)
wrap(ST, "_step", "_step")
wrap(W, "_meshes", "walk._meshes")
system, model = sys.argv[1], sys.argv[2]
kw = {"framework": resolve_framework("auto", parse_system("a100:64").chip)}
S.plan_training(load_model("llama-3-8b"), parse_system("a100:64"),
                ST.Workload(2**20, 4096, 1e12), **kw)
s = parse_system(system)
kw = {"framework": resolve_framework("auto", s.chip)}
acc.clear()
t = time.process_time()
r = S.plan_training(load_model(model), s, ST.Workload(4 * 2**20, 4096, 15e12), **kw)
acc["search"] = time.process_time() - t
print(json.dumps({"costed": r.candidates_evaluated, **acc}))
"""

PHASES = (
    "search",
    "enumerate_plans",
    "_cost",
    "walk._meshes",
    "_step",
    "_cost_rows",
    "_algebra_alternative",
    "rank",
)


def once(tree: Path, system: str, model: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    p = subprocess.run(
        [sys.executable, "-c", CHILD, system, model],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if p.returncode != 0:
        raise SystemExit(f"{tree}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="worktree of the baseline commit")
    ap.add_argument("--system", default="a100:1024")
    ap.add_argument("--model", default="gpt-3-175b")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    trees = {"this": HERE, "base": args.base.resolve()}
    got: dict[str, list[dict]] = {t: [] for t in trees}
    for _ in range(max(args.rounds, 1)):
        for t, path in trees.items():
            got[t].append(once(path, args.system, args.model))
    print(f"{args.model} on {args.system}: best of {args.rounds} first searches, CPU ms")
    print(f"{'':6s}" + "".join(f"{p[:16]:>17s}" for p in PHASES) + f"{'plans':>9s}")
    for t, rounds in got.items():
        cells = []
        for p in PHASES:
            vals = [r[p] for r in rounds if p in r]
            cells.append(f"{1e3 * min(vals):17.1f}" if vals else f"{'-':>17s}")
        print(f"{t:6s}" + "".join(cells) + f"{rounds[0]['costed']:9d}")


if __name__ == "__main__":
    main()
