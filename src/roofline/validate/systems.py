"""A run's hardware block -> a catalog chip and a System of that many chips.

- Chip: the run's `chip_family` looked up in the chip catalog (names and aliases); a family
  the catalog lacks is a skip ("chip not in catalog"), never a substitute chip.
- GPUs: `CHIP:N`, the catalog's node (NVLink domain) and scale-out tiers (specs/system.py).
- TPUs: `slices` slices of the most cubic (3D torus) or most square (2D) shape with that
  many chips that fits the pod (ties: axes that are multiples of 4, which wrap around). Cloud TPU slice shapes (4x4x4, 4x4x8, 4x8x8, 16x16, ...) are
  of this form; the assumed topology is reported per run.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

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
