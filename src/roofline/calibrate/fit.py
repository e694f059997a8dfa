"""Fit physical efficiency parameters to measurements, refuse what the data cannot identify,
and cross-validate by held-out groups.

The interface is small on purpose: a `Problem` is a list of observations (each with its
measured value and labels such as source and chip family) and a function from parameter
values to the predicted value of a subset of the observations. The same machinery fits the
local accelerator's microbenchmarks (`calibrate --device`) and published training runs
(`calibrate --from-runs`).

- Residuals are log(predicted / measured): a relative error, symmetric in over/under.
- Parameters are searched in [0, 1] over their physical bounds (`efficiency.bounds_of`; a
  name may carry its chip family, 'hopper/mm_fraction.bf16'; a problem may bring its own
  `bounds`), by scipy's `least_squares` (trust-region reflective).
- A parameter may carry a prior weight `w`: the residual w * log(value / prior) joins the
  observations' log errors, i.e. the prior counts as w^2 observations at the prior value
  (partial pooling: a chip family's deviation from a shared scale is pulled towards 1 as if
  by one more run, unless its runs say otherwise).
- A parameter may belong to a pool (`Problem.pools`: its group and, per observation, how much
  log(prediction) moves per unit of it): the residual w * (value - the group's mean) joins
  the log errors, w = `pool_runs`^0.5 x the median sensitivity of the parameter's fitted
  observations — the group's mean counts as `pool_runs` typical runs of that parameter
  (partial pooling in the parameter's own units, for parameters whose natural value may be 0,
  such as a framework's fixed overhead; the mean, `scales.pool_mean`, is the unweighted one
  over the group's members in the fit, the value a member without observations takes).
- A parameter moves only the observations of its `scope`; one whose scope holds fewer than
  `min_rows` fitted observations is refused ("k runs of ... in the fit").
- Identifiability, before fitting: the Jacobian of the residuals in those unit coordinates
  (central differences at the prior). A parameter whose column is ~0 moves no prediction
  (refused: "the runs do not depend on it"); one whose column lies in the span of the
  parameters already accepted (|cos| above `COLLINEAR_COS`) cannot be told apart from them
  (refused: "collinear with ..."). Parameters are tried in the order given (the primary,
  best-sourced physics first). No more parameters than observations are fitted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from roofline.calibrate.scales import pool_mean
from roofline.specs.efficiency import Param
from roofline.specs.efficiency import bounds_of as _bounds


def bounds_of(name: str) -> Param:
    """Bounds of a candidate; 'hopper/mm_fraction.bf16' names a family's parameter."""
    return _bounds(name.rsplit("/", 1)[-1])


# A column whose largest entry is below this moves no prediction by more than ~0.1% across
# the parameter's whole bound range (linearised).
FLAT_TOL = 1e-3
# Two unit-normalised Jacobian columns with |cos| above this are the same direction.
COLLINEAR_COS = 0.995
_STEP = 0.02  # finite-difference step in unit coordinates


@dataclass(frozen=True)
class Problem:
    """Observations with measured values and a model `predict(values, idx) -> predicted[idx]`."""

    ids: tuple[str, ...]
    measured: np.ndarray
    predict: Callable[[Mapping[str, float], np.ndarray], np.ndarray]
    prior: Mapping[str, float]
    labels: Mapping[str, Sequence[str]] = field(default_factory=dict)
    quantity: str = "time_s"
    # which observations a parameter can move (None: all); lets the Jacobian perturb parameters
    # with disjoint scopes (different chip families) in one evaluation
    scope: Callable[[str], np.ndarray] | None = None
    # a parameter's bounds (None: the efficiency profile's PARAMS / OVERHEADS)
    bounds: Callable[[str], Param] | None = None
    # prior weight per parameter (w * log(value / prior) is a residual: w^2 pseudo-observations)
    prior_weight: Mapping[str, float] = field(default_factory=dict)
    # fewest fitted observations in a parameter's scope (what each scope is called, for reasons)
    min_rows: int = 1
    scope_name: Callable[[str], str] | None = None
    # {parameter: partner}: in the parameter's scope the observations depend on the two only
    # through their product (a family's deviation and a shared scale), so its Jacobian column
    # is the partner's, rescaled: no model evaluation for it
    products: Mapping[str, str] = field(default_factory=dict)
    # values a fit could not identify, derived from those it did (fill(values, fitted)): a
    # cross-validation fold's held-out group takes them instead of the prior
    fill: Callable[[Mapping[str, float], Sequence[str]], Mapping[str, float]] | None = None
    # {parameter: (group, |d log(pred) / d value| per observation)}: shrunk towards its group's
    # mean by `pool_runs` pseudo-runs of its typical sensitivity (see the module docstring)
    pools: Mapping[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    pool_runs: float = 1.0

    def __post_init__(self) -> None:
        m = np.asarray(self.measured, float)
        if m.shape != (len(self.ids),) or not np.all(np.isfinite(m)) or np.any(m <= 0):
            raise ValueError("measured: one positive finite value per observation")
        object.__setattr__(self, "measured", m)

    @property
    def n(self) -> int:
        return len(self.ids)

    def mask(self, name: str) -> np.ndarray:
        return np.ones(self.n, bool) if self.scope is None else np.asarray(self.scope(name), bool)

    def bound(self, name: str) -> Param:
        return bounds_of(name) if self.bounds is None else self.bounds(name)

    def errors(self, values: Mapping[str, float], idx: np.ndarray | None = None) -> np.ndarray:
        """Signed relative error predicted / measured - 1 of observations `idx`."""
        idx = np.arange(self.n) if idx is None else idx
        return np.asarray(self.predict(values, idx), float) / self.measured[idx] - 1.0


@dataclass(frozen=True)
class Refusal:
    name: str
    reason: str


@dataclass(frozen=True)
class FitResult:
    values: dict[str, float]  # every candidate: fitted, or the prior if refused
    fitted: tuple[str, ...]
    refused: tuple[Refusal, ...]
    at_bound: tuple[str, ...]
    error_before: np.ndarray  # predicted / measured - 1 at the prior (fit observations)
    error_after: np.ndarray
    prior: dict[str, float] = field(default_factory=dict)  # the starting values
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": self.values,
            "prior": self.prior,
            "fitted": list(self.fitted),
            "refused": [{"name": r.name, "reason": r.reason} for r in self.refused],
            "at_bound": list(self.at_bound),
            "median_abs_error_before": _med(self.error_before),
            "median_abs_error_after": _med(self.error_after),
        }


class _Unit:
    """Map parameter values to and from unit coordinates over their physical bounds."""

    def __init__(self, names: Sequence[str], bound: Callable[[str], Param] = bounds_of) -> None:
        self.names = tuple(names)
        b = [bound(n) for n in names]
        self.lo = np.array([x.lo for x in b], float)
        self.hi = np.array([x.hi for x in b], float)
        # fractions are open at 0: keep the search off it
        self.lo = np.where([x.unit == "fraction" for x in b], np.maximum(self.lo, 1e-3), self.lo)

    def to_z(self, values: Mapping[str, float]) -> np.ndarray:
        x = np.array([values[n] for n in self.names], float)
        return np.clip((x - self.lo) / (self.hi - self.lo), 0.0, 1.0)

    def to_values(self, z: np.ndarray, base: Mapping[str, float]) -> dict[str, float]:
        out = dict(base)
        out.update(zip(self.names, (self.lo + z * (self.hi - self.lo)).tolist(), strict=True))
        return out


def _residuals(
    problem: Problem, unit: _Unit, base: Mapping[str, float], idx: np.ndarray, priors: bool = True
):
    """log(predicted / measured) of observations `idx`, then the prior terms of `unit`'s names."""
    pri = [n for n in unit.names if n in problem.prior_weight] if priors else []
    pools = pool_weights(problem, unit.names, idx) if priors else {}

    def fun(z: np.ndarray) -> np.ndarray:
        values = unit.to_values(z, base)
        pred = np.asarray(problem.predict(values, idx), float)
        r = np.log(np.maximum(pred, 1e-300) / problem.measured[idx])
        if not pri and not pools:
            return r
        w = problem.prior_weight
        p = [w[n] * np.log(values[n] / problem.prior[n]) for n in pri]
        return np.concatenate([r, p, _pool_residuals(problem, pools, values)])

    return fun


def pool_weights(problem: Problem, names: Sequence[str], idx: np.ndarray) -> dict[str, float]:
    """Pool weight of each of `names` in a pool, on observations `idx`: sqrt(pool_runs) x the
    median |d log(pred)/d value| of its observations there (none without any)."""
    out = {}
    for n in names:
        if n in problem.pools:
            rows = idx[problem.mask(n)[idx]]
            if len(rows):
                sens = np.abs(np.asarray(problem.pools[n][1], float)[rows])
                out[n] = float(np.sqrt(problem.pool_runs) * np.median(sens))
    return out


def _pool_residuals(
    problem: Problem, weights: Mapping[str, float], values: Mapping[str, float]
) -> np.ndarray:
    groups: dict[str, list[str]] = {}
    for n in weights:
        groups.setdefault(problem.pools[n][0], []).append(n)
    out = []
    for members in groups.values():
        mean = pool_mean(values, members)
        out += [weights[n] * (values[n] - mean) for n in members]
    return np.array(out, float)


def _colors(problem: Problem, names: Sequence[str], idx: np.ndarray) -> list[list[int]]:
    """Groups of parameters whose scopes (on `idx`) do not overlap: perturbed together."""
    masks = [problem.mask(n)[idx] for n in names]
    groups: list[tuple[list[int], np.ndarray]] = []
    for j, m in enumerate(masks):
        for members, used in groups:
            if not np.any(used & m):
                members.append(j)
                used |= m
                break
        else:
            groups.append(([j], m.copy()))
    return [g for g, _ in groups]


def jacobian(
    problem: Problem, names: Sequence[str], idx: np.ndarray, base: Mapping[str, float]
) -> np.ndarray:
    """d log(pred) / d z for each candidate (columns), by central differences in unit space."""
    unit = _Unit(names, problem.bound)
    fun = _residuals(problem, unit, base, idx, priors=False)
    z0 = unit.to_z(base)
    J = np.zeros((len(idx), len(names)))
    for group in _colors(problem, names, idx):
        za, zb = z0.copy(), z0.copy()
        for j in group:
            za[j], zb[j] = max(z0[j] - _STEP, 0.0), min(z0[j] + _STEP, 1.0)
        diff = fun(zb) - fun(za)
        for j in group:
            rows = problem.mask(names[j])[idx]
            J[rows, j] = diff[rows] / (zb[j] - za[j])
    return J


def identify(
    problem: Problem,
    names: Sequence[str],
    idx: np.ndarray | None = None,
    base: Mapping[str, float] | None = None,
) -> tuple[tuple[str, ...], tuple[Refusal, ...]]:
    """Which of `names` the observations `idx` can identify (in order), and why the rest not."""
    idx = np.arange(problem.n) if idx is None else idx
    base = dict(problem.prior if base is None else base)
    J = jacobian(problem, names, idx, base)
    J = np.vstack([J, _prior_rows(problem, names, base)])
    accepted: list[int] = []
    refused: list[Refusal] = []
    for j, name in enumerate(names):
        col = J[: len(idx), j]
        b = problem.bound(name)
        support = int(np.sum(problem.mask(name)[idx]))
        if support < problem.min_rows:
            where = problem.scope_name(name) if problem.scope_name else "observations"
            refused.append(
                Refusal(
                    name,
                    f"{support} {where} in the fit (< {problem.min_rows}): too few to identify it; it keeps its starting value",
                )
            )
            continue
        if np.max(np.abs(col), initial=0.0) < FLAT_TOL:
            refused.append(
                Refusal(
                    name,
                    f"Jacobian column ~0: moving {name} across its bounds [{b.lo:g}, {b.hi:g}] {b.unit} changes no prediction by more than {FLAT_TOL:.1%} — the observations do not depend on it",
                )
            )
            continue
        if len(accepted) >= len(idx):
            refused.append(Refusal(name, f"only {len(idx)} observations for more parameters"))
            continue
        partner = _collinear_with(J, accepted, j)
        if partner:
            refused.append(
                Refusal(
                    name,
                    f"collinear with {', '.join(names[p] for p in partner)}: every observation moves with them in the same proportion (|cos| > {COLLINEAR_COS}), so the data cannot tell them apart",
                )
            )
            continue
        accepted.append(j)
    return tuple(names[j] for j in accepted), tuple(refused)


def _prior_rows(problem: Problem, names: Sequence[str], base: Mapping[str, float]) -> np.ndarray:
    """d(prior residual)/dz per parameter with a prior (one row each; none without priors)."""
    unit = _Unit(names, problem.bound)
    rows = []
    for j, n in enumerate(names):
        if n in problem.prior_weight:
            row = np.zeros(len(names))
            row[j] = problem.prior_weight[n] * (unit.hi[j] - unit.lo[j]) / base[n]
            rows.append(row)
    return np.array(rows).reshape(len(rows), len(names))


def _collinear_with(J: np.ndarray, accepted: list[int], j: int) -> list[int]:
    """The accepted columns that span column j (empty if j adds a new direction)."""
    if not accepted:
        return []
    A = J[:, accepted] / np.linalg.norm(J[:, accepted], axis=0)
    c = J[:, j] / np.linalg.norm(J[:, j])
    coef, *_ = np.linalg.lstsq(A, c, rcond=None)
    resid = np.linalg.norm(c - A @ coef)
    if resid > np.sqrt(1 - COLLINEAR_COS**2):
        return []
    order = np.argsort(-np.abs(coef))
    return [accepted[i] for i in order if abs(coef[i]) > 0.05 * np.max(np.abs(coef))]


def fit(
    problem: Problem,
    names: Sequence[str],
    idx: np.ndarray | None = None,
    *,
    loss: str = "linear",
    start: Mapping[str, float] | None = None,
    tol: float = 1e-8,
    diff_step: float | None = None,
) -> FitResult:
    """Least-squares fit of the identifiable `names` on observations `idx` (all by default).

    Identifiability is judged at the prior; the search starts at `start` (e.g. the fit on all
    observations, for a cross-validation fold) or the prior. `tol` is scipy's ftol (xtol is
    its square root: a unit-coordinate step); `diff_step` its finite-difference step (unit
    coordinates; None: scipy's default, ~1e-8).
    """
    idx = np.arange(problem.n) if idx is None else np.asarray(idx)
    base = dict(problem.prior)
    missing = [n for n in names if n not in base]
    if missing:
        raise KeyError(f"no prior value for {missing}")
    ok, refused = identify(problem, names, idx, base)
    before = problem.errors(base, idx)
    if not ok:
        return FitResult(
            base, (), refused, (), before, before, dict(base), "nothing identifiable to fit"
        )
    values, at_bound, messages = dict(base), [], []
    for names_c, rows_c in _components(problem, ok, idx):
        unit = _Unit(names_c, problem.bound)
        jac: Any = "2-point"
        if any(problem.products.get(n) in names_c for n in names_c):
            jac = _linked_jacobian(problem, unit, base, rows_c, diff_step or 1e-6)
        sol = least_squares(
            _residuals(problem, unit, base, rows_c),
            unit.to_z({**base, **(start or {})}),
            jac=jac,
            bounds=(0.0, 1.0),
            loss=loss,
            f_scale=0.1,
            x_scale=1.0,
            xtol=max(np.sqrt(tol), 1e-8),
            ftol=tol,
            diff_step=diff_step,
        )
        values.update(unit.to_values(sol.x, {}))
        at_bound += [n for n, z in zip(names_c, sol.x, strict=True) if z <= 1e-6 or z >= 1 - 1e-6]
        messages.append(sol.message)
    after = problem.errors(values, idx)
    msg = "; ".join(dict.fromkeys(messages))
    return FitResult(values, ok, refused, tuple(at_bound), before, after, dict(base), msg)


def _linked_jacobian(
    problem: Problem, unit: _Unit, base: Mapping[str, float], idx: np.ndarray, h: float
) -> Callable[[np.ndarray], np.ndarray]:
    """Forward differences in unit coordinates, except for a parameter whose column follows
    from its product partner's (`Problem.products`) and its prior term (analytic)."""
    fun = _residuals(problem, unit, base, idx)
    names = unit.names
    pos = {n: j for j, n in enumerate(names)}
    linked = {
        j: pos[problem.products[n]] for j, n in enumerate(names) if problem.products.get(n) in pos
    }
    masks = [problem.mask(n)[idx] for n in names]
    pri = [n for n in names if n in problem.prior_weight]
    width = unit.hi - unit.lo
    n_obs = len(idx)

    def jac(z: np.ndarray) -> np.ndarray:
        f0 = fun(z)
        J = np.zeros((len(f0), len(names)))
        for j in range(len(names)):
            if j not in linked:
                step = h if z[j] + h <= 1.0 else -h
                zj = z.copy()
                zj[j] += step
                J[:, j] = (fun(zj) - f0) / step
        v = unit.lo + z * width
        for j, s in linked.items():
            # d log(pred)/d log(v_j) = d log(pred)/d log(v_s) in j's scope; z-units convert
            J[:n_obs, j] = np.where(masks[j], J[:n_obs, s] * v[s] / width[s] * width[j] / v[j], 0.0)
            if names[j] in pri:
                J[n_obs + pri.index(names[j]), j] = problem.prior_weight[names[j]] * width[j] / v[j]
        return J

    return jac


def _components(
    problem: Problem, names: Sequence[str], idx: np.ndarray
) -> list[tuple[list[str], np.ndarray]]:
    """Independent sub-fits: parameters linked by the observations they share (e.g. one chip
    family's) or by a pool, each with its observations. One component when a parameter moves
    every row."""
    masks = [problem.mask(n)[idx] for n in names]
    comps: list[tuple[list[str], np.ndarray]] = []
    pool = {n: problem.pools[n][0] for n in names if n in problem.pools}
    for n, m in zip(names, masks, strict=True):
        hit = [
            c
            for c in comps
            if np.any(c[1] & m) or (n in pool and any(pool.get(x) == pool[n] for x in c[0]))
        ]
        merged_names, merged = [n], m.copy()
        for c in hit:
            merged_names = c[0] + merged_names
            merged |= c[1]
            comps.remove(c)
        comps.append((merged_names, merged))
    order = {n: i for i, n in enumerate(names)}
    return [(sorted(ns, key=order.get), idx[m]) for ns, m in comps]


@dataclass(frozen=True)
class Fold:
    held_out: str
    n_train: int
    n_test: int
    test_ids: tuple[str, ...]  # the held-out observations, in the order of the errors
    error_before: np.ndarray  # held-out observations at the prior
    error_after: np.ndarray  # held-out observations at this fold's fit
    values: dict[str, float]
    fitted: tuple[str, ...]
    refused: tuple[str, ...]


@dataclass(frozen=True)
class CrossValidation:
    by: str
    folds: tuple[Fold, ...]
    names: tuple[str, ...]

    @property
    def error_before(self) -> np.ndarray:
        return np.concatenate([f.error_before for f in self.folds]) if self.folds else np.zeros(0)

    @property
    def error_after(self) -> np.ndarray:
        return np.concatenate([f.error_after for f in self.folds]) if self.folds else np.zeros(0)

    def spread(self) -> dict[str, dict[str, float]]:
        """Each parameter's value across the folds that fitted it: min, max, mean, std."""
        out = {}
        for n in self.names:
            v = [f.values[n] for f in self.folds if n in f.fitted]
            if v:
                out[n] = spread_of(v)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "median_abs_error_before": _med(self.error_before),
            "median_abs_error_after": _med(self.error_after),
            "mean_abs_error_after": _mean(self.error_after),
            "folds": [
                {
                    "held_out": f.held_out,
                    "n_train": f.n_train,
                    "n_test": f.n_test,
                    "median_abs_error_before": _med(f.error_before),
                    "median_abs_error_after": _med(f.error_after),
                    "errors_after": {
                        i: float(e) for i, e in zip(f.test_ids, f.error_after, strict=True)
                    },
                    "fitted": {n: f.values[n] for n in f.fitted},
                    "refused": list(f.refused),
                }
                for f in self.folds
            ],
            "spread": self.spread(),
        }


def spread_of(values: Sequence[float]) -> dict[str, float]:
    """A parameter's values across cross-validation folds: how many, min, max, mean, std."""
    v = np.asarray(values, float)
    return {
        "folds": len(v),
        "min": float(v.min()),
        "max": float(v.max()),
        "mean": float(v.mean()),
        "std": float(v.std()),
    }


def cross_validate(
    problem: Problem,
    names: Sequence[str],
    by: str,
    *,
    loss: str = "linear",
    start: Mapping[str, float] | None = None,
    tol: float = 1e-8,
    diff_step: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> CrossValidation:
    """Leave-one-`by`-out: fit on the other groups, measure the error on the held-out one."""
    labels = np.asarray(problem.labels[by], dtype=object)
    from roofline.progress import track

    folds = []
    for g in track(sorted(set(labels.tolist())), f"calibrate: folds by {by}", unit="fold"):
        test = np.flatnonzero(labels == g)
        train = np.flatnonzero(labels != g)
        if len(train) == 0:
            continue
        if progress:
            progress(f"  fold: {by} {g} held out ({len(test)} observations)")
        r = fit(problem, names, train, loss=loss, start=start, tol=tol, diff_step=diff_step)
        values = dict(problem.fill(r.values, r.fitted)) if problem.fill else r.values
        folds.append(
            Fold(
                str(g),
                len(train),
                len(test),
                tuple(problem.ids[i] for i in test),
                problem.errors(problem.prior, test),
                problem.errors(values, test),
                values,
                r.fitted,
                tuple(x.name for x in r.refused),
            )
        )
    return CrossValidation(by, tuple(folds), tuple(names))


def _mean(e: np.ndarray) -> float | None:
    return float(np.mean(np.abs(e))) if len(e) else None


def _med(e: np.ndarray) -> float | None:
    return float(np.median(np.abs(e))) if len(e) else None
