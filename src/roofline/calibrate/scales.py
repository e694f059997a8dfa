"""The parameters `calibrate --from-runs` fits, and how they set a profile's physics.

End-to-end training runs cannot separate the kernel-level physics a microbenchmark sees
(k roll-off, kernel launch time, tiles: `calibrate --device`'s job). What they can speak to
is a handful of factors, each with a physical meaning and bounds, that multiply the
datasheet physics of the runs' chip families, plus fixed costs per framework:

- `gemm_scale`: GEMM throughput inside a training step over the datasheet's large-GEMM
  fraction (every dtype). Shared by every chip family: sustained clocks under a training
  step's power draw, shapes and fusions short of the microbenchmark's best. A family's own
  deviation `gemm_scale@FAMILY` multiplies it, pulled towards 1 as if by `POOL_RUNS` more
  runs at the shared value (partial pooling: few runs move a family only part of the way
  from the shared value; a family with no runs keeps the shared one).
- `lowp_scale`: fp8/fp4 GEMMs beyond that (per-tensor scaling, amax and cast kernels, block
  scales), scoped to runs that compute dense GEMMs in a low-precision dtype.
- `attn_scale`: flash attention's forward and backward efficiency over the datasheet's.
- `vector_scale`: memory-bound elementwise and norm kernels over the datasheet's.
- `layer_overhead_s@FRAMEWORK`, `step_overhead_s@FRAMEWORK`: fixed time per layer per
  microbatch pass and per step of a framework (launches, host syncs, the optimizer's Python
  loop), on top of the framework profile's sourced overheads; stored as the framework's
  overrides in the profile (`profile.for_framework`). Each kind is partially pooled across
  frameworks (`fit.Problem.pools`): a framework's value is pulled towards the mean of the
  fitted frameworks' values as if by `OVERHEAD_POOL_RUNS` more of its typical runs measured
  there (in seconds rather than the families' log space because an overhead's natural value
  may be 0). What a framework's runs barely
  constrain (which of its per-step and per-layer costs a lump of time is) then comes from the
  typical framework rather than from the noise. A framework no run covers (in a cross-validation fold: the held-out one) takes the
  mean of the fitted frameworks' values of each kind (`pooled_overheads`): the pool's value,
  the typical framework's fixed cost, not the idealised machine's zero.

Factors apply to a family's values and are clipped to the physical bounds of what they scale
(`specs.efficiency.PARAMS`: a fraction never exceeds 1), and a low-precision GEMM's fraction
of its own peak never exceeds the family's bf16 fraction of bf16's (`family_values`): fp8's
GEMM speed-up over bf16 is at most the datasheet's peak ratio (H100 SXM 1979 / 989 dense
TFLOPS = 2.0x, NVIDIA H100 Tensor Core GPU datasheet; B200 4.5 / 2.25 PFLOPS = 2.0x), which
no measurement exceeds: the best fp8 GEMM the family's microbenchmark source found runs at a
lower fraction of its peak than bf16 does (`[mamf]` in profiles/datasheet.toml: H100 SXM
0.709 vs 0.803, B200 0.763 vs 0.776), and in a training step fp8 also pays the casts and
amax/scale kernels bf16 does not. `lowp_scale` above that ratio moves no prediction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.specs.efficiency import OVERHEADS, PARAMS, Efficiency, FamilyPhysics, Param

# Compute dtypes whose GEMMs `lowp_scale` moves (block-scaled formats compute at their element format).
LOW_PRECISION = ("fp8", "fp4", "int8", "int4", "nvfp4", "mxfp4", "mxfp8", "fp8_block")
# Partial pooling: a chip family's deviation from the shared GEMM scale counts this many
# pseudo-runs at the shared value (one: a family with 3 runs moves 3/4 of the way to its own).
POOL_RUNS = 1.0
# A framework overhead's pool counts this many pseudo-runs of the framework's typical run
# (fit.Problem.pool_runs). Chosen by nested cross-validation: for each held-out source, the
# leave-one-source-out error on the other sources (mean |error|) preferred 4 over 1 (the chip
# families' POOL_RUNS) in 7 of 9 outer folds (llm-foundry's and maxtext's within 1e-4 of a tie);
# the nested estimate, held out by source: median 4.8%, mean 8.2% (1 throughout: 5.1%, 8.2%).
# Nested by chip family the inner CV chose 4 in 6 of 7 folds (held out: 8.2%, 13.1%).
OVERHEAD_POOL_RUNS = 4.0
# Fewest fitted frameworks whose overheads pool into a value for a framework without runs.
POOL_MIN_FRAMEWORKS = 2


@dataclass(frozen=True)
class Kind:
    bounds: Param
    start: float  # the value that leaves the base profile unchanged
    pooled: bool = False  # family deviations get a prior spread


KINDS: dict[str, Kind] = {
    "gemm_scale": Kind(
        Param(
            0.4,
            1.25,
            "factor",
            "GEMM throughput inside a training step over the datasheet's large-GEMM fraction (every dtype)",
        ),
        1.0,
        pooled=True,
    ),
    "lowp_scale": Kind(
        Param(
            0.5,
            1.25,
            "factor",
            "fp8/fp4 GEMMs beyond gemm_scale (scaling, amax and cast kernels, block scales)",
        ),
        1.0,
    ),
    "attn_scale": Kind(
        Param(0.4, 1.25, "factor", "flash-attention efficiency over the datasheet's"), 1.0
    ),
    "vector_scale": Kind(
        Param(0.4, 1.25, "factor", "memory-bound elementwise/norm kernels over the datasheet's"),
        1.0,
    ),
    "layer_overhead_s": Kind(OVERHEADS["layer_overhead_s"], 0.0),
    "step_overhead_s": Kind(OVERHEADS["step_overhead_s"], 0.0),
}
# What `calibrate --from-runs` fits by default. `vector_scale` is left out: on the public runs
# it runs to its lower bound (elementwise kernels at a third of HBM bandwidth), standing in for
# time the other terms miss rather than measuring elementwise kernels.
DEFAULT_KINDS = (
    "gemm_scale",
    "lowp_scale",
    "layer_overhead_s@",
    "gemm_scale@",
    "attn_scale",
    "step_overhead_s@",
)
# Order the fit tries them in (fit.identify keeps the first of collinear ones).
ORDER = (*DEFAULT_KINDS, "vector_scale")


@dataclass(frozen=True)
class FitParam:
    """One candidate: a kind, scoped to a chip family and/or a framework ('' = every one)."""

    kind: str
    family: str = ""
    framework: str = ""

    @property
    def name(self) -> str:
        where = self.family or self.framework
        return f"{self.kind}@{where}" if where else self.kind

    @property
    def key(self) -> str:
        """Its entry in `ORDER` / `DEFAULT_KINDS`: 'gemm_scale', 'gemm_scale@', ..."""
        return f"{self.kind}@" if (self.family or self.framework) else self.kind

    @property
    def bounds(self) -> Param:
        return KINDS[self.kind].bounds

    @property
    def start(self) -> float:
        return KINDS[self.kind].start

    def scope_name(self) -> str:
        if self.family:
            return f"runs of chip family {self.family}"
        if self.framework:
            return f"runs of framework {self.framework}"
        if self.kind == "lowp_scale":
            return "runs computing GEMMs in fp8/fp4"
        return "runs"

    def covers(self, family: str, framework: str, dtype: str) -> bool:
        if self.family and family != self.family:
            return False
        if self.framework and framework != self.framework:
            return False
        return self.kind != "lowp_scale" or dtype in LOW_PRECISION


def parse(name: str, families: Sequence[str] = ()) -> FitParam:
    """'gemm_scale@hopper' -> FitParam('gemm_scale', family='hopper')."""
    kind, _, where = name.partition("@")
    if not where:
        return FitParam(kind)
    if kind in OVERHEADS:
        return FitParam(kind, framework=where)
    return FitParam(kind, family=where)


def candidates(families: Sequence[str], frameworks: Sequence[str]) -> list[FitParam]:
    """Every candidate for runs of these families and frameworks, in `ORDER`."""
    out: list[FitParam] = []
    for key in ORDER:
        kind = key.rstrip("@")
        if not key.endswith("@"):
            out.append(FitParam(kind))
        elif kind in OVERHEADS:
            out += [FitParam(kind, framework=fw) for fw in sorted(set(frameworks))]
        else:
            out += [FitParam(kind, family=f) for f in sorted(set(families))]
    return out


def pool_mean(values: Mapping[str, float], members: Sequence[str]) -> float:
    """A pool's value: the mean of its members' values (the hierarchical mean `fit` shrinks
    them towards and a member without runs takes)."""
    return float(np.mean([values[m] for m in members]))


def pools(params: Sequence[FitParam]) -> dict[str, str]:
    """{framework overhead: its kind}: the pool (fit.Problem.pools) each framework's value is
    shrunk towards (the sensitivities are the runs', `runs.build_problem`)."""
    return {p.name: p.kind for p in params if p.framework and p.kind in OVERHEADS}


def prior_weights(params: Sequence[FitParam]) -> dict[str, float]:
    """Prior weights (fit.Problem.prior_weight): a family's deviation from a pooled shared scale."""
    w = float(np.sqrt(POOL_RUNS))
    return {p.name: w for p in params if p.family and KINDS[p.kind].pooled}


def products(params: Sequence[FitParam]) -> dict[str, str]:
    """{family deviation: its shared scale}: a family's runs see only their product."""
    shared = {p.kind for p in params if not p.family and not p.framework}
    return {
        p.name: p.kind for p in params if p.family and p.kind in shared and KINDS[p.kind].pooled
    }


def pooled_overheads(
    values: Mapping[str, float], fitted: Sequence[str], frameworks: Sequence[str]
) -> dict[str, float]:
    """`KIND@FW` for each framework in `frameworks` whose KIND was not fitted: the mean of the
    fitted frameworks' values of that kind (the pool the fit shrinks each towards,
    `pool_mean`; none when fewer than `POOL_MIN_FRAMEWORKS` were)."""
    out: dict[str, float] = {}
    for kind in OVERHEADS:
        got = [n for n in fitted if n.partition("@")[0] == kind and "@" in n]
        if len(got) < POOL_MIN_FRAMEWORKS:
            continue
        pooled = pool_mean(values, got)
        out.update({f"{kind}@{fw}": pooled for fw in frameworks if f"{kind}@{fw}" not in fitted})
    return out


def fill_unfitted(values: Mapping[str, float], fitted: Sequence[str]) -> dict[str, float]:
    """A fit's values with the framework overheads it could not fit (no runs of that framework
    in its observations, e.g. a cross-validation fold's held-out framework) set to the pool."""
    frameworks = sorted({parse(n).framework for n in values} - {""})
    return {**values, **pooled_overheads(values, fitted, frameworks)}


# -- values -> profile ---------------------------------------------------------------------


def _factor(values: Mapping[str, float], kind: str, family: str) -> float:
    return float(values.get(kind, 1.0)) * float(values.get(f"{kind}@{family}", 1.0))


def _clip(key: str, v: float) -> float:
    b = PARAMS[key.split(".", 1)[0]]
    return float(np.clip(v, max(b.lo, 1e-6), b.hi))


def family_values(fam: FamilyPhysics, values: Mapping[str, float]) -> dict[str, float]:
    """The family's physics the factors in `values` change (flattened keys, clipped)."""
    g = _factor(values, "gemm_scale", fam.family)
    low = _factor(values, "lowp_scale", fam.family)
    a = _factor(values, "attn_scale", fam.family)
    v = _factor(values, "vector_scale", fam.family)
    out: dict[str, float] = {}
    if g != 1.0 or low != 1.0:
        bf16 = fam.mm_fraction.get("bf16")
        for d, x in fam.mm_fraction.items():
            frac = x * g
            if d in LOW_PRECISION:
                # fp8's speed-up over bf16 is at most the peak ratio (module docstring)
                frac = x * g * low if bf16 is None else min(x * g * low, max(bf16, x) * g)
            out[f"mm_fraction.{d}"] = _clip("mm_fraction", frac)
    if a != 1.0:
        out["attn_fwd"] = _clip("attn_fwd", fam.attn_fwd * a)
        out["attn_bwd"] = _clip("attn_bwd", fam.attn_bwd * a)
    if v != 1.0:
        out["vector"] = _clip("vector", fam.vector * v)
    return out


def framework_values(values: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """Per-framework overheads in `values`: {framework: {'layer_overhead_s': ...}}."""
    out: dict[str, dict[str, float]] = {}
    for name, v in values.items():
        kind, _, fw = name.partition("@")
        if fw and kind in OVERHEADS:
            out.setdefault(fw, {})[kind] = float(v)
    return out


def apply(base: Efficiency, values: Mapping[str, float]) -> Efficiency:
    """`base` with the factors in `values` applied to every family and the per-framework
    overheads set as framework overrides (marked calibrated)."""
    fams = []
    for fam in base.families:
        vals = family_values(fam, values)
        fams.append(fam.with_params(vals) if vals else fam)
    frameworks = dict(base.frameworks)
    for fw, ovh in framework_values(values).items():
        old: dict[str, Any] = dict(frameworks.get(fw, {}))
        old.setdefault("families", {})
        frameworks[fw] = MappingProxyType({**old, **ovh, "calibrated": True})
    return replace(base, families=tuple(fams), frameworks=MappingProxyType(frameworks))


__all__ = [
    "DEFAULT_KINDS",
    "FitParam",
    "KINDS",
    "LOW_PRECISION",
    "OVERHEAD_POOL_RUNS",
    "POOL_RUNS",
    "apply",
    "candidates",
    "family_values",
    "fill_unfitted",
    "framework_values",
    "parse",
    "pool_mean",
    "pooled_overheads",
    "pools",
    "prior_weights",
    "products",
]
