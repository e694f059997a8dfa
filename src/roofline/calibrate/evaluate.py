"""Predicting many runs at many parameter values, fast: a cache keyed by what each run
depends on, and optionally a pool of worker processes.

A run's prediction depends only on the parameters whose scope covers it (its chip family's
deviation, its framework's overheads, the shared factors), so the cache key of a run is the
values of those parameters alone. A finite-difference Jacobian column of a family's
parameter then re-predicts that family's runs only, and a cross-validation fold that starts
from the full fit re-uses every prediction the full fit made at that point.

A fixed time per step is added to the step the model predicts with the overhead at its
starting value (`additive`: the step model adds it after everything else,
`training._step`), so a per-step overhead never re-runs the model: tokens/s per chip =
tokens per step per chip / step time. A fixed time per layer per microbatch pass
(`per_layer`) enters the step linearly too, at a slope each run's pipeline sets (layers on the
fullest stage x 2 passes x (microbatches + fill)) unless the uneven-stage rule changes
sides: the slope is measured once per run, by the model at the starting values, one small
step up and at the top of the overhead's bounds, and where the two slopes agree the overhead
never re-runs the model either (a run whose slopes differ keeps running it). `check_additive` re-runs the model at given values and reports the
largest difference (the command checks it on the final fit and, if a run's pipeline left the
linear piece, fits again without the per-layer shortcut; a test pins it).

Otherwise predictions are exact (the step model runs for every new key).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from roofline.specs.efficiency import OVERHEADS, Efficiency

# (profile, cases) -> predicted tokens/s per chip (NaN where a run cannot be predicted)
Predictor = Callable[[Efficiency, Sequence[Any]], np.ndarray]
# (base profile, values) -> the profile those values describe
Apply = Callable[[Efficiency, Mapping[str, float]], Efficiency]

# The step of a per-layer overhead (seconds) its slope is measured over, and how close that
# slope and the one across the overhead's whole range must be for the shortcut.
SLOPE_STEP = 1e-4
LINEAR_RTOL = 1e-7


def scales_top(name: str) -> float:
    """The upper bound of a per-layer overhead parameter ('layer_overhead_s@megatron')."""
    return float(OVERHEADS[name.split("@", 1)[0]].hi)


# What forked workers read (set before the pool starts; fork copies it).
_STATE: dict[str, Any] = {}


def _work(task: tuple[dict[str, float], list[int]]) -> list[float]:
    values, idx = task
    st = _STATE
    prof = st["apply"](st["base"], values)
    return [float(x) for x in st["predictor"](prof, [st["cases"][i] for i in idx])]


def can_fork() -> bool:
    """Worker processes are forked: only where fork exists and no multithreaded runtime that
    forbids it is loaded (JAX warns of deadlocks after fork; `calibrate --device` loads it)."""
    return "fork" in mp.get_all_start_methods() and "jax" not in sys.modules


def default_jobs() -> int:
    """Worker processes: the machine's cores, at most 2 (CI has 2)."""
    return max(1, min(2, os.cpu_count() or 1))


class Evaluator:
    """`evaluator(values, idx)` -> predictions of cases `idx` at parameter `values`."""

    def __init__(
        self,
        base: Efficiency,
        cases: Sequence[Any],
        masks: Mapping[str, np.ndarray],
        predictor: Predictor,
        apply: Apply,
        jobs: int = 1,
        additive: Mapping[str, float] | None = None,
        step_tokens: Sequence[float] | None = None,
        per_layer: Mapping[str, float] | None = None,
    ) -> None:
        self.base, self.cases, self.predictor, self.apply = base, list(cases), predictor, apply
        self.masks = {n: np.asarray(m, bool) for n, m in masks.items()}
        self.jobs = jobs
        # per-step seconds added after the model: {name: starting value}; needs the tokens
        # each chip processes per step to turn tokens/s into step time
        ok = step_tokens is not None and all(t and np.isfinite(t) for t in step_tokens)
        self.additive = dict(additive or {}) if ok else {}
        self.step_tokens = np.asarray(step_tokens if ok else [], float)
        # seconds of step per unit of each additive parameter, per run (1 for a per-step
        # overhead; a per-layer one's measured here: `_linear_slope`)
        self.slopes = {n: np.ones(len(self.cases)) for n in self.additive}
        self.cache: dict[tuple, float] = {}
        self.evaluated = 0  # step-model calls made (cache misses)
        self._pool: Any = None
        for n, start in (per_layer or {}).items() if ok else ():
            slope = self._linear_slope(n, start)
            if slope is not None:  # else the model runs at each of its values
                self.additive[n], self.slopes[n] = start, slope

    def key(self, i: int, values: Mapping[str, float]) -> tuple:
        return (i, *((n, float(values[n])) for n, m in self.masks.items() if m[i] and n in values))

    def __call__(self, values: Mapping[str, float], idx: Sequence[int]) -> np.ndarray:
        ix = np.asarray(idx, int)
        pred = np.zeros(len(ix))
        # the model runs each run with its additive parameters at their starts (a per-layer
        # overhead only where the run is on its line: `slopes` nonzero)
        own = [tuple(n for n in self.additive if n in values and self.slopes[n][i]) for i in ix]
        for names in dict.fromkeys(own):
            at = np.array([o == names for o in own])
            model_values = {**values, **{n: self.additive[n] for n in names}}
            pred[at] = self.model(model_values, ix[at].tolist())
        extra = self._extra_s(values, idx)
        if extra is None:
            return pred
        tok = self.step_tokens[np.asarray(idx, int)]
        return tok / (tok / pred + extra)

    def model(self, values: Mapping[str, float], idx: Sequence[int]) -> np.ndarray:
        """The step model's predictions (cached by each run's parameters)."""
        keys = [self.key(int(i), values) for i in idx]
        missing = sorted({int(k[0]) for k in keys if k not in self.cache})
        if missing:
            pred = self._predict(dict(values), missing)
            for i, p in zip(missing, pred, strict=True):
                self.cache[self.key(i, values)] = float(p)
            self.evaluated += len(missing)
        return np.array([self.cache[k] for k in keys], float)

    def _extra_s(self, values: Mapping[str, float], idx: Sequence[int]) -> np.ndarray | None:
        """Per-step seconds beyond the starting values of the additive overheads."""
        if not self.additive:
            return None
        ix = np.asarray(idx, int)
        extra = np.zeros(len(ix))
        for n, start in self.additive.items():
            if n in values and values[n] != start:
                moved = (float(values[n]) - start) * self.slopes[n][ix]
                extra += np.where(self.masks[n][ix], moved, 0.0)
        return extra

    def _linear_slope(self, name: str, start: float) -> np.ndarray | None:
        """Step seconds per second of per-layer overhead `name`, per run (0 outside its
        scope), with every parameter at its start: the model there, one `SLOPE_STEP` up and at
        the top of the overhead's bounds. 0 where the two slopes differ (the run's pipeline
        leaves a line: the uneven-stage rule takes the smaller of two lines), and the model runs
        that run at each value of the overhead; None where no run is on a line (or none is in its
        scope, or its start leaves no range above it)."""
        idx = [int(i) for i in np.flatnonzero(self.masks[name])]
        top = scales_top(name)
        if not idx or top <= start + SLOPE_STEP:
            return None
        slope = np.zeros(len(self.cases))
        t = self.step_tokens[idx]
        base = {**self.additive, name: start}
        t0 = t / np.asarray(self._predict(base, idx), float)
        t1 = t / np.asarray(self._predict({**base, name: start + SLOPE_STEP}, idx), float)
        t2 = t / np.asarray(self._predict({**base, name: top}, idx), float)
        self.evaluated += 3 * len(idx)
        near, far = (t1 - t0) / SLOPE_STEP, (t2 - t0) / (top - start)
        on_line = np.isclose(near, far, rtol=LINEAR_RTOL, atol=0.0) & (near > 0)
        if not np.any(on_line):
            return None
        slope[idx] = np.where(on_line, near, 0.0)
        return slope

    def check_additive(self, values: Mapping[str, float], idx: Sequence[int]) -> float:
        """Largest |relative difference| between the additive shortcut and the step model run
        with the overheads in `values` (0 when nothing is additive)."""
        if not self.additive:
            return 0.0
        ix = [int(i) for i in idx]
        fast = self(values, ix)
        prof = self.apply(self.base, dict(values))
        slow = np.asarray(self.predictor(prof, [self.cases[i] for i in ix]), float)
        return float(np.max(np.abs(fast / slow - 1.0)))

    def _predict(self, values: dict[str, float], idx: list[int]) -> list[float]:
        if self.jobs <= 1 or len(idx) < 2 or not can_fork():
            prof = self.apply(self.base, values)
            return [float(x) for x in self.predictor(prof, [self.cases[i] for i in idx])]
        pool = self._ensure_pool()
        chunks = [idx[j :: self.jobs * 2] for j in range(self.jobs * 2)]
        chunks = [c for c in chunks if c]
        out: dict[int, float] = {}
        for c, res in zip(chunks, pool.map(_work, [(values, c) for c in chunks]), strict=True):
            out.update(zip(c, res, strict=True))
        return [out[i] for i in idx]

    def _ensure_pool(self) -> Any:
        if self._pool is None:
            _STATE.update(
                base=self.base, cases=self.cases, predictor=self.predictor, apply=self.apply
            )
            self._pool = mp.get_context("fork").Pool(self.jobs)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None
            _STATE.clear()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Evaluator", "Predictor", "default_jobs"]
