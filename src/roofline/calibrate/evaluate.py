"""Predicting many runs at many parameter values, fast: a cache keyed by what each run
depends on, and optionally a pool of worker processes.

A run's prediction depends only on the parameters whose scope covers it (its chip family's
deviation, its framework's overheads, the shared factors), so the cache key of a run is the
values of those parameters alone. A finite-difference Jacobian column of a family's
parameter then re-predicts that family's runs only, and a cross-validation fold that starts
from the full fit re-uses every prediction the full fit made at that point.

Predictions are exact (the step model runs for every new key); nothing is interpolated.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from roofline.specs.efficiency import Efficiency

# (profile, cases) -> predicted tokens/s per chip (NaN where a run cannot be predicted)
Predictor = Callable[[Efficiency, Sequence[Any]], np.ndarray]
# (base profile, values) -> the profile those values describe
Apply = Callable[[Efficiency, Mapping[str, float]], Efficiency]

# What forked workers read (set before the pool starts; fork copies it).
_STATE: dict[str, Any] = {}


def _work(task: tuple[dict[str, float], list[int]]) -> list[float]:
    values, idx = task
    st = _STATE
    prof = st["apply"](st["base"], values)
    return [float(x) for x in st["predictor"](prof, [st["cases"][i] for i in idx])]


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
    ) -> None:
        self.base, self.cases, self.predictor, self.apply = base, list(cases), predictor, apply
        self.masks = {n: np.asarray(m, bool) for n, m in masks.items()}
        self.jobs = jobs
        self.cache: dict[tuple, float] = {}
        self.evaluated = 0  # step-model calls made (cache misses)
        self._pool: Any = None

    def key(self, i: int, values: Mapping[str, float]) -> tuple:
        return (i, *((n, float(values[n])) for n, m in self.masks.items() if m[i] and n in values))

    def __call__(self, values: Mapping[str, float], idx: Sequence[int]) -> np.ndarray:
        keys = [self.key(int(i), values) for i in idx]
        missing = sorted({int(k[0]) for k in keys if k not in self.cache})
        if missing:
            pred = self._predict(dict(values), missing)
            for i, p in zip(missing, pred, strict=True):
                self.cache[self.key(i, values)] = float(p)
            self.evaluated += len(missing)
        return np.array([self.cache[k] for k in keys], float)

    def _predict(self, values: dict[str, float], idx: list[int]) -> list[float]:
        if self.jobs <= 1 or len(idx) < 2 or "fork" not in mp.get_all_start_methods():
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
