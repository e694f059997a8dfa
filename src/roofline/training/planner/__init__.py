"""The training planner: a declared search space, named filters with reasons, vectorised evaluation.

Split by job (docs/architecture.md, "The planner"):

- `planner.systems`: which systems are searched (the given one, its sub-slices, `--chips`),
  built as objects;
- `planner.space`: the search space (every bound a named field) and the enumeration of
  candidates into families, filtered by `feasibility`'s named rules;
- `planner.search`: every family costed in one vectorised pass of the walk, then ranked;
- `planner.rank`: ranking, distinct shapes, the runner-up, the Pareto set;
- `planner.deadline`: the fewest chips that finish a run by a deadline.
"""

from __future__ import annotations

from roofline.training.planner.deadline import DeadlineResult as DeadlineResult
from roofline.training.planner.deadline import chips_for_deadline as chips_for_deadline
from roofline.training.planner.search import PlanResult as PlanResult
from roofline.training.planner.search import SubsetReason as SubsetReason
from roofline.training.planner.search import plan_training as plan_training
from roofline.training.planner.space import MICROBATCHES as MICROBATCHES
from roofline.training.planner.space import REMATS as REMATS
from roofline.training.planner.space import SearchSpace as SearchSpace
from roofline.training.planner.space import divisors as divisors
from roofline.training.planner.systems import SubsetSearch as SubsetSearch
from roofline.training.planner.systems import scale_family as scale_family
from roofline.training.planner.systems import sub_slices as sub_slices
from roofline.training.planner.systems import systems_for_counts as systems_for_counts
