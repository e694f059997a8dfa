"""Pricing: what one op and one collective cost on a system, for many candidate meshes at once.

The walk (`walk.py`) asks two questions for every record it yields, and this module is the
one place that answers them:

- compute: seconds for an op's FLOPs and HBM bytes on the chip, through the efficiency
  profile contract (`specs/efficiency.py`: `matmul_fraction` of the per-chip GEMM shape,
  `attention_fraction`, `hbm_fraction`, `vector_fraction`): `ComputeModel`;
- communication: seconds for a collective of given bytes over given mesh axes, on each
  candidate's own mesh placement (`collectives.unit_cost` priced once per distinct placement,
  scaled by `link_fraction` of the bounding tier): `CommModel`.

A constant profile (no chip family covers the chip) gives scalar fractions, so the walk skips
the per-shape arithmetic; a physics profile prices every GEMM by its shape and dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from roofline.core.collectives import CollectiveKind, UnitCost, collective_time, unit_cost
from roofline.core.mesh import Mesh, Segment, group_mesh, place_mesh
from roofline.core.rules import Structure as Structure  # re-exported: the walk's family of plans
from roofline.core.sharding import GemmShape
from roofline.errors import PlanError
from roofline.specs.chip import Chip
from roofline.specs.efficiency import Efficiency
from roofline.specs.plan import OpClass
from roofline.specs.system import System

# Elementwise work runs on the vector units, about 1/20 of the matrix units' FLOP/s (book
# tpus.md: the VPU vs the MXU); the chip's large-GEMM efficiency applies on top.
VECTOR_SHARE_OF_MATMUL_PEAK = 0.05


def shape_dependent(eff: Efficiency, chip: Chip) -> bool:
    """True when the profile has physics for this chip, so efficiency depends on the GEMM
    shape (the walk then computes each op's per-chip GEMM; constant profiles skip that)."""
    return eff.family_for(chip) is not None


class ComputeModel:
    """Seconds of an op's compute and memory traffic on one chip under an efficiency profile."""

    def __init__(self, chip: Chip, eff: Efficiency) -> None:
        self.chip, self.eff = chip, eff
        self.shape_dependent = shape_dependent(eff, chip)
        self.hbm_bytes_per_s = chip.hbm_bw_bytes_per_s * eff.hbm_fraction(chip)
        # memory-bound elementwise / norm kernels reach their own fraction of HBM bandwidth
        self.vector_hbm_bytes_per_s = chip.hbm_bw_bytes_per_s * eff.vector_fraction(chip)
        # fixed memory-side time per routed expert a grouped expert GEMM touches
        self.expert_overhead_s = float(eff.expert_overhead_s(chip))
        # fixed time per MoE layer pass of a 4-bit-expert MoE path's extra kernels
        self.w4_moe_overhead_s = float(eff.w4_moe_overhead_s(chip))
        # fixed time per kernel launch, added once per op per pass (0 for constant profiles)
        self.kernel_overhead_s = float(eff.kernel_overhead_s(chip))
        self._large: dict[str, float] = {}  # a large GEMM's fraction by dtype, resolved once
        self._peaks: dict[str, float] = {}  # the chip's peak by dtype, resolved once

    def peak(self, dtype: str) -> float:
        """The chip's dense peak in `dtype`; bf16 on a chip without bf16 units (V100) runs in
        its 16-bit dtype."""
        hit = self._peaks.get(dtype)
        if hit is None:
            fallback = self.chip.default_dtype if dtype == "bf16" else None
            hit = self._peaks[dtype] = self.chip.peak(dtype, fallback=fallback)
        return hit

    def large_gemm_fraction(self, dtype: str) -> float:
        """The fraction a large, well-shaped GEMM reaches (the algebra ranks options with it)."""
        hit = self._large.get(dtype)
        if hit is None:
            hit = self._large[dtype] = self.eff.for_chip(self.chip, dtype).matmul
        return hit

    def matmul_flops_per_s(
        self, dtype: str, shape: GemmShape | None = None, grouped: bool = False
    ) -> Any:
        """Achieved FLOP/s of a GEMM (dense or grouped expert GEMM) in `dtype`."""
        if shape is None or not self.shape_dependent:
            return self.peak(dtype) * self.large_gemm_fraction(dtype)
        f = self.eff.matmul_fraction(self.chip, dtype, shape.m, shape.n, shape.k, grouped=grouped)
        return self.peak(dtype) * f

    def attention_flops_per_s(self, dtype: str, backward: bool, head_dim: float) -> Any:
        """Flash attention's achieved FLOP/s (causal kernel)."""
        if not self.shape_dependent:
            return self.peak(dtype) * self.large_gemm_fraction(dtype)
        f = self.eff.attention_fraction(self.chip, dtype, backward, head_dim, True)
        return self.peak(dtype) * float(f)

    def vector_flops_per_s(self, dtype: str) -> Any:
        """Elementwise FLOP/s: the vector units' share of the matrix peak."""
        return self.peak(dtype) * self.large_gemm_fraction(dtype) * VECTOR_SHARE_OF_MATMUL_PEAK

    def flops_per_s(self, op_class: OpClass, dtype: str, shape: GemmShape | None = None) -> Any:
        if op_class in (OpClass.DENSE_GEMM, OpClass.EXPERT_GEMM):
            return self.matmul_flops_per_s(dtype, shape, op_class == OpClass.EXPERT_GEMM)
        if op_class == OpClass.ATTENTION:
            return self.attention_flops_per_s(dtype, False, 0.0)
        return self.vector_flops_per_s(dtype)


# -- collectives on candidate meshes --------------------------------------------------------

# Caches keyed by object identity (System and Mesh hold read-only mappings, so they are not
# hashable); the cached objects are kept alive by the caches themselves.
_UNIT_CACHE: dict[tuple, UnitCost] = {}
_MESH_CACHE: dict[tuple, tuple[System, Mesh | str]] = {}
# Without SHARP a ReduceScatter costs an AllGather and an AllReduce two (book: AR = RS + AG),
# so those units are derived from the AllGather's and cached with it.
_DERIVED = {CollectiveKind.REDUCE_SCATTER: 1.0, CollectiveKind.ALL_REDUCE: 2.0}


def mesh_for(system: System, axes: tuple[tuple[str, int], ...]) -> Mesh | str:
    """The mesh of `axes` placed on `system`, or the reason it does not fit (cached)."""
    key = (id(system), axes)
    hit = _MESH_CACHE.get(key)
    if hit is None or hit[0] is not system:
        try:
            m: Mesh | str = place_mesh(system, list(axes))  # axes from mesh_axes_of
        except PlanError as e:
            m = f"mesh does not fit the topology ({e.what})"
        hit = _MESH_CACHE[key] = (system, m)
    return hit[1]


def unique_rows(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(cols, axis=0, return_inverse=True)` of non-negative integer rows, through one
    mixed-radix integer per row where it fits in 62 bits (the same sorted rows, ~10x faster)."""
    radix = cols.max(axis=0) + 1 if len(cols) else np.ones(cols.shape[1], np.int64)
    if float(np.prod(radix.astype(float))) >= 2.0**62 or (len(cols) and cols.min() < 0):
        rows, inv = np.unique(cols, axis=0, return_inverse=True)
        return rows, inv.reshape(-1)
    flat = np.zeros(len(cols), dtype=np.int64)
    for j in range(cols.shape[1]):
        flat = flat * int(radix[j]) + cols[:, j]
    _, first, inv = np.unique(flat, return_index=True, return_inverse=True)
    return cols[first], inv.reshape(-1)


def _unit(
    kind: CollectiveKind,
    present: tuple[str, ...],
    ukey: tuple,
    system: System,
    mesh: Callable[[], Mesh],
) -> UnitCost:
    """The unit cost of `kind` over the group placed as `ukey` says on `system`, priced on
    `mesh()` (built only where a unit is not remembered)."""
    hit = _UNIT_CACHE.get(ukey)
    if hit is not None:
        return hit
    if kind in _DERIVED and not system.sharp:
        agkey = (CollectiveKind.ALL_GATHER, ukey[1])
        ag = _UNIT_CACHE.get(agkey)
        if ag is None:
            ag = _UNIT_CACHE[agkey] = unit_cost(CollectiveKind.ALL_GATHER, present, mesh())
        f = _DERIVED[kind]
        hit = UnitCost(ag.latency_s * f, ag.seconds_per_byte * f, ag.tier)
    else:
        hit = unit_cost(kind, present, mesh())
    _UNIT_CACHE[ukey] = hit
    return hit


class CommModel:
    """comm_fn for the algebra: per-candidate collective times from each candidate's mesh.

    A collective's cost depends only on where its axes sit on the system, so meshes are
    grouped by that placement (interned per axis as an integer) and `unit_cost` runs once
    per distinct placement, not once per mesh. `inverse` maps each row to its mesh.
    """

    def __init__(
        self,
        inverse: np.ndarray,
        meshes: Sequence[Mesh | None],
        eff: Efficiency,
        floats: bool = False,
        placed: tuple[Mapping[str, tuple[list, np.ndarray]], Sequence[System], list[int]]
        | None = None,
    ) -> None:
        """`placed`: the meshes' placements already found column by column
        (`core.mesh.auto_placed_columns`: per axis the distinct (system index, segments) and
        each mesh's index into them), the systems, and the meshes placed on their own instead
        (their placements read from the Mesh objects); None: every mesh read from its object."""
        self.inv, self.meshes, self.eff = inverse, meshes, eff
        self.single = floats and len(inverse) == 1  # one row asked as floats (`__call__`)
        self.scalar: dict[tuple[CollectiveKind, tuple[str, ...]], tuple[float, float]] = {}
        self._links: dict[tuple[str, str], float] = {}
        self.cache: dict[tuple[CollectiveKind, tuple[str, ...]], tuple[np.ndarray, np.ndarray]] = {}
        self._groups: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, list[tuple]]] = {}
        self.pid: dict[str, np.ndarray] = {}
        self.sig_of: list[tuple] = []
        self.segs_of: list[tuple[System, tuple[Segment, ...]]] = []  # by interned id
        # (latency, seconds per byte over the link fraction) by (kind, interned placements):
        # a group's placement recurs under other axes (absent axes add nothing to it)
        self._priced: dict[tuple[CollectiveKind, tuple[int, ...]], tuple[float, float]] = {}
        self._gmeshes: dict[tuple, Mesh] = {}  # `_group_mesh` by (axes, placements)
        intern: dict[tuple, int] = {}
        # the placements' segment tuples are shared between meshes (`core.mesh._auto_placed`
        # remembers each step), so a tuple seen before (alive in its mesh) is not read again
        seen: dict[tuple[int, int], int] = {}

        def interned(system: System, segs: tuple[Segment, ...]) -> int:
            j = seen.get((id(system), id(segs)))
            if j is None:
                sig = (id(system), tuple((g.dim.name, g.size, g.full, g.stride) for g in segs))
                j = intern.get(sig)
                if j is None:
                    j = intern[sig] = len(self.sig_of)
                    self.sig_of.append(sig)
                    self.segs_of.append((system, segs))
                seen[(id(system), id(segs))] = j
            return j

        own: Sequence[int] = range(len(meshes))
        if placed is not None:
            columns, systems, own = placed
            for a, (segs_list, idx) in columns.items():
                if not segs_list:
                    continue
                ids = np.array([interned(systems[si], segs) for si, segs in segs_list] + [-1])
                self.pid[a] = ids[idx]  # -1 (absent) reads the appended -1
        axes = sorted({a for i in own if (m := meshes[i]) is not None for a in m.placement})
        for a in axes:
            ids = self.pid.get(a)
            if ids is None:
                ids = self.pid[a] = np.full(len(meshes), -1, dtype=np.int64)
            for i in own:
                m = meshes[i]
                if m is None or a not in m.placement:
                    continue
                ids[i] = interned(m.system, m.placement[a])

    def link(self, chip: Chip, tier: str) -> float:
        """The profile's link fraction for a chip and tier (looked up once per search)."""
        key = (chip.name, tier)
        hit = self._links.get(key)
        if hit is None:
            hit = self._links[key] = self.eff.link_fraction(chip, tier)
        return hit

    def coef(self, kind: CollectiveKind, axes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(latency_s, seconds_per_byte) per row for a collective of `kind` over `axes`."""
        key = (kind, axes)
        if key not in self.cache:
            self.cache[key] = self._coef(kind, axes)
        return self.cache[key]

    def _coef(self, kind: CollectiveKind, axes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.meshes)
        if n == 1:  # one mesh (a single plan): no grouping of rows to do
            return self._coef_one(kind, axes)
        lat, spb = np.zeros(n), np.zeros(n)
        groups = self._groups.get(axes)
        if groups is None:
            groups = self._groups[axes] = self._placements(axes)
        vidx, where, placed = groups
        if placed:
            mine = self._priced
            vals = []
            for present, sigs, js in placed:
                hit = mine.get((kind, js))
                if hit is None:
                    ukey = (kind, sigs)
                    system = self.segs_of[js[0]][0]
                    u = _UNIT_CACHE.get(ukey)
                    if u is None:
                        u = _unit(
                            kind,
                            present,
                            ukey,
                            system,
                            lambda p=present, j=js: self._group_mesh(p, j),
                        )
                    link = self.link(system.chip, u.tier)
                    hit = mine[(kind, js)] = (u.latency_s, u.seconds_per_byte / link)
                vals.append(hit)
            v = np.array(vals)
            lat[vidx] = v[where, 0]
            spb[vidx] = v[where, 1]
        return lat[self.inv], spb[self.inv]

    def _group_mesh(self, present: tuple[str, ...], js: tuple[int, ...]) -> Mesh:
        """The mesh of a group's own axes (`present`, placed as the interned placements `js`):
        what `unit_cost` reads of any mesh holding that placement (`core.mesh.group_mesh`),
        so a group is priced without placing a whole mesh; one per (axes, placements)."""
        hit = self._gmeshes.get((present, js))
        if hit is None:
            system = self.segs_of[js[0]][0]
            segs = {a: self.segs_of[j][1] for a, j in zip(present, js, strict=True)}
            hit = self._gmeshes[(present, js)] = group_mesh(system, segs)
        return hit

    def _placements(self, axes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
        """The meshes' distinct placements of a group over `axes` (the same for every kind of
        collective over them, so found once per axes): the meshes where the group spans any
        axis, each one's placement index, and per placement (its axes present, their segment
        signatures, their interned ids)."""
        n = len(self.meshes)
        # an axis of size 1 is absent from a mesh (pid -1): it adds nothing to the group
        cols = np.stack([self.pid.get(a, np.full(n, -1, dtype=np.int64)) for a in axes], axis=1)
        valid = np.any(cols >= 0, axis=1)
        if not valid.any():
            return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp), []
        combos, where = unique_rows(cols[valid] + 1)  # absent (-1) as 0
        combos = combos - 1
        vidx = np.nonzero(valid)[0]
        placed = []
        for combo in combos.tolist():  # Python ints
            present = tuple(a for a, j in zip(axes, combo, strict=True) if j >= 0)
            js = tuple(j for j in combo if j >= 0)
            placed.append((present, tuple(self.sig_of[j] for j in js), js))
        return vidx, where, placed

    def _coef_one(
        self, kind: CollectiveKind, axes: tuple[str, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        """`_coef` of a single mesh: the same unit cost and link fraction, without the
        grouping of rows by placement."""
        lat, spb = np.zeros(1), np.zeros(1)
        ids = [(a, int(self.pid[a][0])) for a in axes if a in self.pid]
        combo = [(a, j) for a, j in ids if j >= 0]
        m = self.meshes[0]
        if combo and m is not None:
            ukey = (kind, tuple(self.sig_of[j] for _, j in combo))
            u = _unit(kind, tuple(a for a, _ in combo), ukey, m.system, lambda: m)
            lat[0], spb[0] = u.latency_s, u.seconds_per_byte / self.link(m.system.chip, u.tier)
        return lat[self.inv], spb[self.inv]

    def __call__(self, kind: CollectiveKind, nbytes: Any, axes: tuple[str, ...]) -> Any:
        if self.single and (type(nbytes) is float or np.ndim(nbytes) == 0):  # one plan: floats
            key = (kind, tuple(axes))
            one = self.scalar.get(key)
            if one is None:
                lat, spb = self.coef(*key)
                one = self.scalar[key] = (float(lat[0]), float(spb[0]))
            return float(collective_time(one[0], one[1], nbytes)) if one[1] > 0 else 0.0
        lat, spb = self.coef(kind, tuple(axes))
        return np.where(spb > 0, collective_time(lat, spb, nbytes), 0.0)
