"""Planner speed: LLaMA-3.1 405B on h100:16384 and on two tpu-v5p:16x20x28 slices.

Target (issue 4): under 2 s each, end to end (model and system loading, search, ranking,
the detailed re-evaluation of the top plans), on a 2-core machine. Printed alongside:
configurations evaluated per second, and the same figure for a plain per-plan Python
loop (`evaluate_plan` on each candidate, one at a time) measured in the same run on a
sample of the same candidates.

Run: python benchmarks/bench_planner.py [--loop-sample N]
"""

from __future__ import annotations

import argparse
import random
import time

from roofline.planner import plan_training
from roofline.specs.model import load_model
from roofline.specs.system import parse_system
from roofline.training import Workload, evaluate_plan, parse_plan

CASES = (
    ("llama-3.1-405b", "h100:16384", 16 * 2**20, 8192),
    ("llama-3.1-405b", "2xtpu-v5p:16x20x28", 16 * 2**20, 8192),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loop-sample", type=int, default=40, help="plans timed one by one for the Python-loop baseline")
    args = ap.parse_args()
    # warm caches that any first call pays (module imports, chip/model catalogs)
    load_model("llama-3-8b")
    for model_name, system_name, batch, seq in CASES:
        t0 = time.perf_counter()
        model = load_model(model_name)
        system = parse_system(system_name)
        work = Workload(batch, seq, 15e12)
        result = plan_training(model, system, work)
        dt = time.perf_counter() - t0
        n = result.candidates_evaluated
        # baseline: one plan at a time through the same code, on a sample of ranked plans
        sample = [p["plan"] for p in result.pareto] + [c.plan.describe() for c in result.top]
        random.seed(0)
        plans = (sample * (args.loop_sample // max(len(sample), 1) + 1))[: args.loop_sample]
        t1 = time.perf_counter()
        done = 0
        for spec in plans:
            for s in [system] if "@" not in spec else []:
                pass
            try:
                evaluate_plan(model, system if parse_plan(spec).degrees.n_chips == system.n_chips else
                              _system_for(result, spec), work, parse_plan(spec))
                done += 1
            except Exception:  # noqa: BLE001 - a sample plan on a sub-slice we did not rebuild
                pass
        loop_rate = done / (time.perf_counter() - t1) if done else float("nan")
        best = result.best
        print(f"{model_name} on {system_name}: {dt:.2f} s end to end, {n} configurations evaluated "
              f"({n / dt:,.0f}/s vectorised vs {loop_rate:,.0f}/s one plan at a time, {n / dt / loop_rate:,.0f}x); "
              f"best {best.plan.describe()} on {best.system.n_chips} chips, step {best.step_time_s:.2f} s, MFU {best.mfu:.1%}")


def _system_for(result, spec):
    for c in result.top:
        if c.plan.describe() == spec:
            return c.system
    n = parse_plan(spec).degrees.n_chips
    for c in result.top:
        if c.system.n_chips == n:
            return c.system
    return result.best.system


if __name__ == "__main__":
    main()
