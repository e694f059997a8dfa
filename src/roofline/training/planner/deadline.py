"""The fewest chips (of one chip type) whose fastest plan finishes a run by a deadline."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from roofline.errors import PlanError
from roofline.specs.model import ModelSpec
from roofline.specs.plan import Workload
from roofline.specs.system import System
from roofline.training.planner.search import PlanResult, plan_training
from roofline.training.planner.systems import scale_family


@dataclass(frozen=True)
class DeadlineResult:
    """The smallest system (of the family searched) whose best plan finishes the run in time."""

    deadline_s: float
    result: PlanResult | None  # the plan on the chosen system (None if even the largest misses)
    # (system, chips, best run time s) in the order searched
    tried: tuple[tuple[str, int, float], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "deadline_s": self.deadline_s,
            "chips_needed": None if self.result is None else self.result.best.system.n_chips,
            "system_needed": None if self.result is None else self.result.best.system.name,
            "tried": [
                {"system": s, "chips": n, "run_time_s": None if math.isinf(t) else t}
                for s, n, t in self.tried
            ],
        }


def chips_for_deadline(
    model: ModelSpec, system: System, workload: Workload, deadline_s: float, **kw: Any
) -> DeadlineResult:
    """Bisect the system's scale family for the fewest chips whose fastest plan meets the deadline.

    Run time falls as chips grow (more chips never make the best plan slower, since a larger
    system can always run a smaller plan's mesh with wider data parallelism), so a bisection
    over the sorted family finds the boundary with a few planner calls.
    """
    if not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise PlanError(
            f"deadline {deadline_s!r} s",
            rule="a deadline is a positive duration",
            fix="write e.g. --deadline 30d",
        )
    if not workload.total_tokens:
        raise PlanError(
            "a deadline needs the run length",
            rule="run time = tokens / throughput",
            fix="give --tokens, e.g. 15T",
        )
    family = scale_family(system)
    tried: list[tuple[str, int, float]] = []
    cache: dict[int, PlanResult | None] = {}

    def best(i: int) -> PlanResult | None:
        if i not in cache:
            try:
                r = plan_training(
                    model, family[i], workload, objective="time", allow_sub_slices=False, **kw
                )
                tried.append((family[i].name, family[i].n_chips, r.best.run_time_s))
            except PlanError:
                r = None
                tried.append((family[i].name, family[i].n_chips, math.inf))
            cache[i] = r
        return cache[i]

    def ok(i: int) -> bool:
        r = best(i)
        return r is not None and r.best.run_time_s <= deadline_s

    lo, hi = 0, len(family) - 1
    if not ok(hi):
        return DeadlineResult(deadline_s, None, tuple(tried))
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return DeadlineResult(deadline_s, best(lo), tuple(tried))
