"""The planner's one hook into the stacks' launch configurations: with a stack named
(`train --framework megatron`, `export --to nemo`), the candidate plans its configuration
cannot say (launch/defaults/capabilities.toml, the rules its writer refuses by) are skipped
before costing and counted under `rejected` as "<stack> cannot launch: <why>"; with no stack
named (`--framework auto`, the library's default) nothing is filtered.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np

from roofline.launch.capable import PlanArrays, capabilities
from roofline.training.planner.space import Enumeration, SearchSpace
from roofline.training.step import Candidates

CANNOT_LAUNCH = "cannot launch"  # the words every skip's rejection key carries


def skipped(rejected: dict[str, int]) -> int:
    """How many plans of a search's `rejected` the named stack could not launch."""
    return sum(n for k, n in rejected.items() if f" {CANNOT_LAUNCH}: " in k)


def _take(cand: Candidates, keep: np.ndarray) -> Candidates:
    def cut(x):
        return None if x is None else np.asarray(x)[keep]

    return Candidates(
        {s: v[keep] for s, v in cand.deg.items()},
        cand.microbatches[keep],
        cand.zero[keep],
        cand.schedule[keep],
        cand.virtual[keep],
        system_idx=cut(cand.system_idx),
        remat_idx=cut(cand.remat_idx),
        collective_matmul=cut(cand.collective_matmul),
        overlap_ep=cut(cand.overlap_ep),
        compiled=cut(cand.compiled),
    )


def launch_space(space: SearchSpace, stack: str | None) -> SearchSpace:
    """`space` with the ZeRO stages over replicas and the virtual stages the named stack can
    launch: the space's own where the stack has some of them, else the stack's (torchtitan's
    DDP/HSDP replicas keep whole optimizer states, zero=0, which the default (1, 2) would never
    search; its looped schedules run 2 stages per rank, so its writer says no other count)."""
    cap = capabilities(stack) if stack else None
    if cap is None:
        return space
    for rule, field in (("replica_zero", "zero_stages"), ("virtual", "virtual_stages")):
        allowed = cap.rules.get(rule, {}).get("allowed")
        if allowed is not None:
            kept = tuple(x for x in getattr(space, field) if x in allowed)
            space = replace(space, **{field: kept or tuple(allowed)})
    if "tp_refuses_sp" in cap.rules:  # its file cannot say megatron_sp (MaxText)
        space = replace(space, megatron_sp=(False,))
    return space


def launchable(found: Enumeration, space: SearchSpace, stack: str | None) -> Enumeration:
    """`found` without the plans `stack` cannot launch (each counted under the first rule it
    breaks); `found` itself when no stack is named or the table does not hold it."""
    cap = capabilities(stack) if stack else None
    if cap is None:
        return found
    rejected = Counter(found.rejected)
    groups = []
    for structure, cand in found.groups:
        arrays = PlanArrays.of_candidates(cand, structure.sequence_parallel, space.remats)
        ok = np.ones(len(cand), dtype=bool)
        for name, mask, _ in cap.breaches(arrays):
            bad = mask & ok
            if bad.any():
                rejected[f"{cap.who} {CANNOT_LAUNCH}: {cap.rules[name]['why']}"] += int(bad.sum())
            ok &= ~mask
        if ok.any():
            groups.append((structure, _take(cand, ok)))
    return replace(found, groups=tuple(groups), rejected=rejected)


__all__ = ["CANNOT_LAUNCH", "launch_space", "launchable", "skipped"]
