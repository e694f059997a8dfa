"""Single-chip rooflines: time = max(T_math, T_mem) (lower) or their sum (upper).

Book roofline.md: T_math = FLOPs / peak, T_comms = bytes / bandwidth; an op is
compute-bound iff its arithmetic intensity (FLOPs/byte) exceeds the chip's critical
intensity peak/bandwidth. Mixed precision (book §2, inference.md): an op computes in the
wider of its input dtypes (int8 weights × bf16 activations run on the bf16 units) while
every operand is moved at its own width, so B_crit = β·C/W with β = weight bits /
activation bits.

Every function here is plain arithmetic and accepts numpy arrays.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from roofline.core.ledger import Ledger, Op, OpKind
from roofline.specs.chip import Chip
from roofline.units import DTYPE_BYTES, parse_dtype


class Bound(enum.StrEnum):
    COMPUTE = "compute"
    MEMORY = "memory"


def compute_dtype(dtypes: Sequence[str]) -> str:
    """The dtype an op's FLOPs run in: the widest input (ties keep the first)."""
    canon = [parse_dtype(d) for d in dtypes]
    return max(canon, key=lambda d: DTYPE_BYTES[d])


@dataclass(frozen=True)
class RooflineResult:
    """Roofline of one op (or a sum of ops) on one chip. Times in seconds."""

    flops: Any
    bytes: Any
    compute_dtype: str
    peak_flops_per_s: float
    hbm_bw_bytes_per_s: float

    @property
    def intensity(self) -> Any:
        return (
            np.divide(
                self.flops,
                self.bytes,
                out=np.full_like(np.asarray(self.flops, float), np.inf),
                where=np.asarray(self.bytes) > 0,
            )
            if np.ndim(self.flops)
            else (self.flops / self.bytes if self.bytes else float("inf"))
        )

    @property
    def critical_intensity(self) -> float:
        return self.peak_flops_per_s / self.hbm_bw_bytes_per_s

    @property
    def t_math_s(self) -> Any:
        return self.flops / self.peak_flops_per_s

    @property
    def t_mem_s(self) -> Any:
        return self.bytes / self.hbm_bw_bytes_per_s

    @property
    def time_lower_s(self) -> Any:
        return np.maximum(self.t_math_s, self.t_mem_s)

    @property
    def time_upper_s(self) -> Any:
        return self.t_math_s + self.t_mem_s

    @property
    def bound(self) -> Bound:
        # at exactly the critical intensity both times are equal; call it compute-bound
        return Bound.COMPUTE if self.t_math_s >= self.t_mem_s else Bound.MEMORY

    @property
    def achieved_flops_per_s(self) -> Any:
        return self.flops / self.time_lower_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops": self.flops,
            "bytes": self.bytes,
            "intensity": self.intensity,
            "critical_intensity": self.critical_intensity,
            "compute_dtype": self.compute_dtype,
            "bound": self.bound.value,
            "t_math_s": self.t_math_s,
            "t_mem_s": self.t_mem_s,
            "time_lower_s": self.time_lower_s,
            "time_upper_s": self.time_upper_s,
            "achieved_flops_per_s": self.achieved_flops_per_s,
        }


def analyze(flops: Any, nbytes: Any, chip: Chip, dtype: str = "bf16") -> RooflineResult:
    """Roofline of `flops` FLOPs moving `nbytes` HBM bytes on `chip`, computing in `dtype`."""
    d = parse_dtype(dtype)
    return RooflineResult(flops, nbytes, d, chip.peak(d), chip.hbm_bw_bytes_per_s)


def analyze_vector(flops: Any, nbytes: Any, chip: Chip, dtype: str = "fp32") -> RooflineResult:
    """Roofline of an elementwise op on the vector units (TPU VPU, GPU CUDA cores), not the
    matrix units: book gpus.md, an fp32 vector add on H100 has intensity 1/12 against the vector
    units' critical intensity ~10 (3.35e13 / 3.35e12)."""
    d = parse_dtype(dtype)
    return RooflineResult(flops, nbytes, d, chip.vector_peak(d), chip.hbm_bw_bytes_per_s)


def analyze_op(op: Op, chip: Chip) -> RooflineResult:
    """Roofline of one ledger row; compute dtype = widest input dtype."""
    return analyze(op.flops, op.bytes, chip, compute_dtype([t.dtype for t in op.inputs]))


def analyze_on_units(op: Op, chip: Chip) -> RooflineResult:
    """`analyze_op`, with elementwise ops on the vector units (`analyze_vector`) and
    contractions on the matrix units (what `roofline op` reports)."""
    if op.kind == OpKind.ELEMENTWISE:
        return analyze_vector(op.flops, op.bytes, chip, compute_dtype([t.dtype for t in op.inputs]))
    return analyze_op(op, chip)


@dataclass(frozen=True)
class LevelRoofline:
    """The roofline of one op with its operands in one memory level (HBM, L2, VMEM, SMEM).

    `fits` says whether the op's bytes fit in the level at once (None when its size is not
    in the chip file): an op streamed through a small level still moves at its bandwidth.
    """

    level: str
    capacity_bytes: float | None
    result: RooflineResult

    @property
    def fits(self) -> bool | None:
        return (
            None if self.capacity_bytes is None else bool(self.result.bytes <= self.capacity_bytes)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
            "bw_bytes_per_s": self.result.hbm_bw_bytes_per_s,
            **self.result.to_dict(),
        }


def analyze_levels(op: Op, chip: Chip) -> list[LevelRoofline]:
    """The op's roofline against every memory level the chip file gives a bandwidth for
    (book tpus.md: a matmul from VMEM at ~22x HBM bandwidth turns compute-bound near B ≈ 11
    instead of 240), on the vector units for elementwise ops."""
    base = analyze_on_units(op, chip)
    return [
        LevelRoofline(
            name,
            cap,
            RooflineResult(base.flops, base.bytes, base.compute_dtype, base.peak_flops_per_s, bw),
        )
        for name, cap, bw in chip.memory_levels()
    ]


def analyze_ledger(ledger: Ledger, chip: Chip) -> list[tuple[Op, RooflineResult]]:
    return [(op, analyze_op(op, chip)) for op in ledger]


def critical_batch(
    chip: Chip,
    weight_dtype: str = "bf16",
    activation_dtype: str = "bf16",
    bandwidth_bytes_per_s: float | None = None,
) -> float:
    """Token batch above which X[B,D]·W[D,F] is compute-bound when B ≪ D, F.

    B_crit = β · C/W_hbm with β = weight bytes / activation bytes... precisely: FLOPs
    2BDF over bytes ≈ DF·w_bytes gives intensity 2B/w_bytes > C/W  ⇒  B > w_bytes·C/(2W).
    (bf16: 240 on v5e; int8 weights + bf16 compute: 120; int8 × int8: 240.) With
    `bandwidth_bytes_per_s` the weights stream from another level (VMEM, SMEM, host memory).
    """
    cd = compute_dtype([weight_dtype, activation_dtype])
    W = chip.hbm_bw_bytes_per_s if bandwidth_bytes_per_s is None else bandwidth_bytes_per_s
    return DTYPE_BYTES[parse_dtype(weight_dtype)] * chip.peak(cd) / (2 * W)


def matmul_crossover_batch(
    chip: Chip, D: float, F: float, weight_dtype: str = "bf16", activation_dtype: str = "bf16"
) -> float:
    """Exact B where T_math = T_mem for X[B,D]·W[D,F]→[B,F] (solves 2BDF/C = bytes/W)."""
    w, a = DTYPE_BYTES[parse_dtype(weight_dtype)], DTYPE_BYTES[parse_dtype(activation_dtype)]
    C = chip.peak(compute_dtype([weight_dtype, activation_dtype]))
    W = chip.hbm_bw_bytes_per_s
    # 2BDF/C = (a·BD + w·DF + a·BF)/W  ⇒  B (2DF/C − a(D+F)/W) = w·DF/W
    denom = 2 * D * F / C - a * (D + F) / W
    return float("inf") if denom <= 0 else (w * D * F / W) / denom
