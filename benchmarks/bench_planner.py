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
import time

from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.planner import plan_training
from roofline.training.step import Workload, evaluate_plan

CASES = (
    ("llama-3.1-405b", "h100:16384", 16 * 2**20, 8192),
    ("llama-3.1-405b", "2xtpu-v5p:16x20x28", 16 * 2**20, 8192),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--loop-sample",
        type=int,
        default=40,
        help="plans timed one by one for the Python-loop baseline",
    )
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
        # baseline: the same candidates' code path, one plan at a time (the top plans, repeated)
        sample = [(c.plan, c.system) for c in result.top]
        plans = (sample * (args.loop_sample // len(sample) + 1))[: args.loop_sample]
        t1 = time.perf_counter()
        for plan, sysm in plans:
            evaluate_plan(model, sysm, work, plan)
        loop_rate = len(plans) / (time.perf_counter() - t1)
        best = result.best
        print(
            f"{model_name} on {system_name}: {dt:.2f} s end to end, {n} configurations evaluated "
            f"({n / dt:,.0f}/s vectorised vs {loop_rate:,.0f}/s one plan at a time, {n / dt / loop_rate:,.0f}x); "
            f"best {best.plan.describe()} on {best.system.n_chips} chips, step {best.step_time_s:.2f} s, MFU {best.mfu:.1%}"
        )


if __name__ == "__main__":
    main()
