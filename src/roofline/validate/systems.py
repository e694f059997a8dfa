"""A run's hardware block -> a catalog chip and a System of that many chips.

- Chip: the run's `chip_family` looked up in the chip catalog (names and aliases); a family
  the catalog lacks is a skip ("chip not in catalog"), never a substitute chip.
- GPUs: `CHIP:N`, the catalog's node (NVLink domain) and scale-out tiers (specs/system.py).
- TPUs: `slices` slices of the most cubic (3D torus) or most square (2D) shape with that
  many chips that fits the pod (ties: axes that are multiples of 4, which wrap around). Cloud TPU slice shapes (4x4x4, 4x4x8, 4x8x8, 16x16, ...) are
  of this form; the assumed topology is reported per run.
- A published power limit below the part's board power (torchtitan's Grand Teton H100s run at
  500 W): the SM clock, so every compute peak, falls with it (`power_limited`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from roofline.errors import RooflineError
from roofline.specs.chip import Chip, load_chip
from roofline.specs.system import System, gpu_cluster, tpu_slice


@dataclass(frozen=True)
class SystemChoice:
    system: System | None
    assumed: str  # the topology assumed, in words
    reason: str = ""  # why no system


def chip_for_family(family: str) -> tuple[Chip | None, str]:
    try:
        return load_chip(family), ""
    except RooflineError as e:
        return None, f"chip not in catalog: {family} ({e.what})"


@dataclass(frozen=True)
class PowerCurve:
    """Clock fraction of a die against its board power: datasheet points of parts that share
    the die and differ only in power limit and clock, (watts, dense peak / the catalog part's
    dense peak), interpolated linearly between them and held at the ends."""

    points: tuple[tuple[float, float], ...]
    source: str

    def fraction(self, watts: float) -> float:
        watts_at, fractions = zip(*self.points, strict=True)
        return float(np.interp(watts, watts_at, fractions))


# H100: the NVL part is the same 132-SM GH100 die at 350-400 W, bf16 1,671 TFLOP/s with
# sparsity (835.5 dense) against the SXM part's 1,979 (989.5 dense) at 700 W; fp8 halves alike,
# so one fraction scales every peak. torchtitan's 500 W part: 835.5 + (989.5 - 835.5) x
# 100/300 = 886.8 TFLOP/s (0.896 of SXM), inside the bound the benchmark itself states
# ("the actual peak TFLOPs number is between SXM and NVL", pytorch/torchtitan
# benchmarks/llama3_h100_202412_torchtitan.md footnote 2, @9dec370a). Dynamic power ~ f^3
# under DVFS gives (500/700)^(1/3) = 0.894, the same to 0.3%.
POWER_CURVES: dict[str, PowerCurve] = {
    "h100": PowerCurve(
        ((400.0, 835.5 / 989.5), (700.0, 1.0)),
        "NVIDIA H100 datasheet (SXM 700 W: bf16 1,979 TFLOP/s with sparsity; NVL 350-400 W: 1,671)",
    ),
}

# What the SM clock sets: the Tensor Core and vector peaks and the on-chip bandwidths. HBM and
# link bandwidths have their own clocks.
_CLOCKED = ("smem_bw_bytes_per_s", "l2_bw_bytes_per_s", "clock_hz", "boost_clock_hz")


def power_limited(chip: Chip, watts: float) -> tuple[Chip, float]:
    """The chip run under a `watts` power limit and the clock fraction applied (1.0 and the
    chip unchanged where the catalog has no power curve for it or the limit is its board
    power)."""
    curve = POWER_CURVES.get(chip.name)
    f = curve.fraction(watts) if curve else 1.0
    if f >= 1.0:
        return chip, 1.0
    scaled = {k: getattr(chip, k) * f for k in _CLOCKED if getattr(chip, k) is not None}
    return replace(
        chip,
        peak_flops_per_s=MappingProxyType({k: v * f for k, v in chip.peak_flops_per_s.items()}),
        vector_ops_per_s=MappingProxyType({k: v * f for k, v in chip.vector_ops_per_s.items()}),
        **scaled,
    ), f


def tpu_shape(chip: Chip, n: int) -> tuple[int, ...] | None:
    """The most balanced slice shape of n chips that fits the pod (None if none does)."""
    pod = sorted(chip.pod_topology or (), reverse=True)
    axes = chip.ici_axes or len(pod)
    if axes < 1:
        return None
    best: tuple[tuple, tuple[int, ...]] | None = None
    divs = [d for d in range(1, n + 1) if n % d == 0]
    for shape in itertools.product(divs, repeat=axes):
        if math.prod(shape) != n or list(shape) != sorted(shape):
            continue
        if pod and any(a > b for a, b in zip(sorted(shape, reverse=True), pod, strict=False)):
            continue
        key = (max(shape) / min(shape), sum(d % 4 != 0 and d > 1 for d in shape))
        if best is None or key < best[0]:
            best = (key, shape)
    return best[1] if best else None


def system_for(chip: Chip, chips: int, slices: int = 1) -> SystemChoice:
    """A System of `chips` chips (TPU: `slices` DCN-joined slices), built from the chip object
    itself, not its name (a run's published memory variant stays)."""
    tpu = chip.is_tpu or bool(chip.ici_axes)
    shape = None
    if tpu:
        if slices < 1 or chips % slices:
            return SystemChoice(None, "", f"{chips} chips do not split into {slices} equal slices")
        shape = tpu_shape(chip, chips // slices)
        if shape is None:
            return SystemChoice(
                None, "", f"no {chip.name} slice of {chips // slices} chips fits the pod"
            )
        spec = ("" if slices == 1 else f"{slices}x") + f"{chip.name}:{'x'.join(map(str, shape))}"
    else:
        spec = f"{chip.name}:{chips}"
    try:
        system = tpu_slice(chip, shape, slices=slices) if shape else gpu_cluster(chip, chips)
    except RooflineError as e:
        return SystemChoice(None, "", f"no {chip.name} system of {chips} chips: {e.what}")
    return SystemChoice(system, f"{spec} ({system.description})")
