"""Which systems the planner searches: the one given, its sub-slices, or chosen chip counts.

Systems are built as objects (`specs.system.tpu_slice`, `gpu_cluster`), never by formatting
a spec string and parsing it again.

- A TPU pod of 16x20x28 = 8960 = 2^8·5·7 chips rarely divides a batch of 2^k sequences, so
  the planner also searches the pod's largest sub-slices of distinct chip counts (16x16x16,
  ...), each keeping the wraparound rules of its shape.
- A GPU cluster whose node count is not a power of two (h100:1000 = 125 nodes) is searched
  with its largest subsets of whole nodes the same way (64 nodes, 120 nodes, ...).
- `--chips` names counts or a range: TPU sub-slices of any size in it and 2, 4, 8 pods over
  DCN; GPU clusters of those counts, within the given cluster (a single node stands for the
  chip type: any count).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from roofline.errors import PlanError, SpecError
from roofline.specs.system import System, gpu_cluster, tpu_slice


@dataclass(frozen=True)
class SubsetSearch:
    """The bounds of the automatic sub-slice search (every one named, with its reason)."""

    # Sub-slices below this fraction of the system waste most of what was asked for; the
    # automatic search stops there (`--chips` may ask for any size).
    min_fraction: float = 1 / 8
    # Distinct sizes kept, by the odd part of the chip count (n = 2^a·o; small odd parts
    # factor best into the batch's powers of two): the smallest odd parts, largest n each.
    max_sizes: int = 8
    # The largest GPU count a --chips range searches: beyond the largest clusters built,
    # and a range to 1e9 would otherwise plan millions of GPUs.
    max_gpus_in_range: int = 1 << 17
    # Whole pods over DCN a --chips range may add to a TPU pod (2, 4, ... up to this many).
    max_pods: int = 8


DEFAULT_SEARCH = SubsetSearch()


def _odd(n: int) -> int:
    while n % 2 == 0:
        n //= 2
    return n


def _by_odd_part(counts: Sequence[int], max_sizes: int, full: int | None = None) -> list[int]:
    """The largest count for each of the `max_sizes` smallest odd parts (plus `full`), largest first."""
    by_odd: dict[int, int] = {}
    for n in counts:
        o = _odd(n)
        by_odd[o] = max(by_odd.get(o, 0), n)
    keep = {n for _, n in sorted(by_odd.items())[:max_sizes]}
    if full is not None:
        keep.add(full)
    return sorted(keep, reverse=True)


def tpu_shapes(system: System, lo: int, hi: int) -> dict[int, tuple[int, ...]]:
    """Sub-slice shapes of a pod with chip counts in [lo, hi], the most cube-like per count.

    Each axis takes 1, 2, a multiple of 4, or the pod's full size (the slice shapes TPU
    pods are cut into)."""
    dims = system.topology
    choices = [
        sorted({d for d in (1, 2, *range(4, full + 1, 4)) if d <= full} | {full}) for full in dims
    ]
    best: dict[int, tuple[int, ...]] = {}
    for shape in itertools.product(*choices):
        n = math.prod(shape) * system.n_slices
        if not lo <= n <= hi:
            continue
        cur = best.get(n)
        if cur is None or max(shape) - min(shape) < max(cur) - min(cur):
            best[n] = tuple(shape)
    return best


def _tpu(system: System, shape: tuple[int, ...], slices: int | None = None) -> System | None:
    """The slice of `shape` (None when the system's rules refuse that shape)."""
    if slices is None:
        slices = system.n_slices
    if shape == system.topology and slices == system.n_slices:
        return system
    try:
        return tpu_slice(
            system.chip, shape, slices=slices, usd_per_chip_hour=system.usd_per_chip_hour
        )
    except SpecError:
        return None


def _gpus(system: System, n: int) -> System | None:
    """A cluster of `n` GPUs like `system` (None when n is no valid cluster size)."""
    if n == system.n_chips:
        return system
    try:
        return gpu_cluster(
            system.chip, n, sharp=system.sharp, usd_per_chip_hour=system.usd_per_chip_hour
        )
    except SpecError:
        return None


def _node(system: System) -> int:
    return system.chip.nvlink_domain or 8


def _granule(system: System) -> int:
    """The GPUs a cluster grows by: a tray on rack-scale systems (NVL72), else a node."""
    return getattr(system.chip, "gpus_per_tray", None) or _node(system)


def _built(systems) -> list[System]:
    return [s for s in systems if s is not None]


def sub_slices(
    system: System, max_count: int | None = None, search: SubsetSearch = DEFAULT_SEARCH
) -> list[System]:
    """The system plus its largest sub-slices of distinct chip counts, largest first.

    TPU pods: slices of the pod (see `tpu_shapes`). GPU clusters: subsets of whole nodes when
    the node count is not a power of two (a power-of-two cluster is searched as it is).
    """
    max_sizes = search.max_sizes if max_count is None else max_count
    floor = int(system.n_chips * search.min_fraction)
    if system.is_tpu:
        if len(system.topology) < 2:
            return [system]
        shapes = tpu_shapes(system, floor, system.n_chips)
        keep = _by_odd_part(list(shapes), max_sizes, system.n_chips)
        return _built(_tpu(system, shapes.get(n, system.topology)) for n in keep)
    if _odd(system.n_chips) == 1:  # a power of two: searched as it is
        return [system]
    g = _granule(system)
    counts = [k * g for k in range(1, system.n_chips // g + 1) if k * g >= floor]
    return _built(_gpus(system, n) for n in _by_odd_part(counts, max_sizes, system.n_chips))


def systems_for_counts(
    system: System, chips: Sequence[int] | tuple[int, int], search: SubsetSearch = DEFAULT_SEARCH
) -> list[System]:
    """Systems of the same chip for a chip-count list [a, b, ...] or range (lo, hi).

    GPUs: clusters of exactly those counts (a range: every node·2^k in it, plus its ends when
    they are whole nodes), at most the given cluster's size unless it is a single node (then
    it stands for the chip type). TPUs: the pod's sub-slices and 2, 4, 8 pods over DCN, kept
    when their count is listed or within the range. An empty result is an error naming what
    exists.
    """
    rng = isinstance(chips, tuple) and len(chips) == 2
    lo, hi = chips if rng else (min(chips), max(chips))
    counts = (lo, hi) if rng else tuple(chips)
    out = (
        _tpu_counts(system, counts, rng, search)
        if system.is_tpu
        else _gpu_counts(system, counts, rng, search)
    )
    if not out:
        raise PlanError(
            f"no {system.chip.name} system has {f'between {lo} and {hi}' if rng else list(chips)} chips",
            rule="TPU counts come from the pod's sub-slices and whole pods; GPU counts are whole nodes",
            fix="widen --chips or omit it",
        )
    return out


def _gpu_counts(system: System, counts, rng: bool, search: SubsetSearch) -> list[System]:
    node = _node(system)
    cap = search.max_gpus_in_range if system.n_chips <= node else system.n_chips
    if not rng:
        over = [n for n in counts if n > cap]
        if over:
            bigger = over[0] <= search.max_gpus_in_range
            raise PlanError(
                f"--chips {over[0]:g} on {system.name} ({system.n_chips} GPUs)",
                rule="--chips picks counts within the given cluster (a single node stands for any count up to "
                f"{search.max_gpus_in_range})",
                fix=(f"give --system {system.chip.name}:{over[0]} or " if bigger else "give ")
                + f"a count up to {cap}",
            )
        return _built(_gpus(system, n) for n in sorted(set(counts)))
    lo, hi = counts[0], min(counts[1], cap)
    found = {n for n in (lo, hi) if lo <= n <= hi and (n % node == 0 or n < node)}
    n = node
    while n <= hi:
        if n >= lo:
            found.add(n)
        n *= 2
    return _built(_gpus(system, n) for n in sorted(found))


def _tpu_counts(system: System, counts, rng: bool, search: SubsetSearch) -> list[System]:
    lo, hi = (counts[0], counts[1]) if rng else (min(counts), max(counts))
    pod = system if system.n_slices == 1 else tpu_slice(system.chip, system.topology)
    found: dict[int, System | None] = {}
    shapes = tpu_shapes(pod, lo, hi)
    # a range keeps the largest slice per odd part (as the automatic search does), without its floor
    wanted = _by_odd_part(list(shapes), 64) if rng else [n for n in shapes if n in counts]
    for n in wanted:
        found[n] = _tpu(pod, shapes[n], 1)
    k = 2
    while k <= search.max_pods:
        n = pod.n_chips * k
        if (lo <= n <= hi) if rng else n in counts:
            found[n] = system if n == system.n_chips else _tpu(pod, pod.topology, k)
        k *= 2
    if system.n_chips in found:
        found[system.n_chips] = system
    return _built(found[k] for k in sorted(found))


def scale_family(system: System, max_factor: int = 8) -> list[System]:
    """Systems of the same chip, smallest first: GPU clusters of node·2^k GPUs up to `max_factor`
    × the given one; TPU sub-slices of the pod, then 2, 4, ... pods over DCN."""
    if system.is_tpu:
        pod = system if system.n_slices == 1 else tpu_slice(system.chip, system.topology)
        out = sorted(sub_slices(pod, max_count=64), key=lambda s: s.n_chips)
        k = 2
        while k <= max_factor:
            out += _built([_tpu(pod, pod.topology, k)])
            k *= 2
        return out
    node = _node(system)
    counts = []
    n = node
    while n <= system.n_chips * max_factor:
        counts.append(n)
        n *= 2
    return _built(_gpus(system, n) for n in counts)
