"""Microbenchmark kernels as records, and their predicted time under an efficiency profile.

A kernel's FLOPs and HBM bytes come from the ledger's `Op` (one home for "2 x output x
contracting dims" and "every operand read, the output written"); its time is the roofline
of `roofline.RooflineResult` with the profile's achieved peaks: compute at
`chip.peak(dtype) * fraction`, memory at `chip.hbm_bw * hbm_fraction`. Collectives are priced
by `collectives.collective_cost` with the link tier's fraction on the bandwidth term. Every
other kernel adds the profile's fixed time per launch (`kernel_overhead_s`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from roofline.core.collectives import collective_cost
from roofline.core.ledger import Causal, Op, OpKind, Tensor, _causal_factor
from roofline.core.mesh import make_mesh
from roofline.core.roofline import analyze
from roofline.specs.chip import Chip
from roofline.specs.efficiency import Efficiency
from roofline.specs.system import parse_system


class KernelKind(enum.StrEnum):
    MATMUL = "matmul"
    ATTENTION = "attention"
    COPY = "copy"
    VECTOR = "vector"
    ALL_REDUCE = "all_reduce"


@dataclass(frozen=True)
class Kernel:
    """One microbenchmark. Sizes are per device; `label` names it in tables.

    - matmul: [m, k] x [groups?, k, n] -> [m, n]; `grouped` = a ragged expert GEMM whose m
      rows are split evenly over `groups` experts.
    - attention: batch x heads, q_len queries over kv_len keys, head_dim; `backward` = the
      training step's forward plus backward (what `jax.grad` runs).
    - copy / vector: `nbytes` moved through HBM (read + write).
    - all_reduce: `nbytes` per device over `devices` devices on link `tier`.
    """

    kind: KernelKind
    label: str
    dtype: str = "bf16"
    m: int = 0
    n: int = 0
    k: int = 0
    groups: int = 1
    grouped: bool = False
    batch: int = 1
    heads: int = 0
    q_len: int = 0
    kv_len: int = 0
    head_dim: int = 0
    causal: bool = False
    backward: bool = False
    nbytes: float = 0.0
    devices: int = 1
    tier: str = ""
    topology: str = ""  # all_reduce on a TPU: the local slice, e.g. "2x2x1" (GPUs: the count)

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in self.__dict__.items()}


def matmul_op(kr: Kernel) -> Op:
    """The ledger row of a (possibly grouped) GEMM: FLOPs 2mnk, bytes of x, w and out."""
    sizes = {"m": kr.m, "n": kr.n, "k": kr.k, "g": kr.groups}
    w_dims = ("g", "k", "n") if kr.grouped else ("k", "n")
    x, w = Tensor("x", ("m", "k"), kr.dtype), Tensor("w", w_dims, kr.dtype, is_param=True)
    return Op(kr.label, OpKind.MATMUL, (x, w), Tensor("y", ("m", "n"), kr.dtype), sizes)


def attention_ops(kr: Kernel) -> tuple[Op, Op]:
    """Flash attention as the ledger's two rows: scores q.k (kept on chip) and context p.v."""
    sizes = {"b": kr.batch, "h": kr.heads, "t": kr.q_len, "s": kr.kv_len, "d": kr.head_dim}
    f = _causal_factor(kr.q_len, kr.kv_len, None, Causal.HALF if kr.causal else Causal.FULL)
    q, kk = Tensor("q", ("b", "h", "t", "d"), kr.dtype), Tensor("k", ("b", "h", "s", "d"), kr.dtype)
    sc = Tensor("p", ("b", "h", "t", "s"), kr.dtype, on_chip=True)
    v, o = Tensor("v", ("b", "h", "s", "d"), kr.dtype), Tensor("o", ("b", "h", "t", "d"), kr.dtype)
    score = Op("scores", OpKind.ATTENTION, (q, kk), sc, sizes, flop_factor=f)
    ctx = Op("context", OpKind.ATTENTION, (sc, v), o, sizes, flop_factor=f)
    return score, ctx


def predict_time_s(profile: Efficiency, chip: Chip, kernels: list[Kernel]) -> np.ndarray:
    """Predicted seconds of each kernel under `profile` on `chip`."""
    return np.array([_time(profile, chip, kr) for kr in kernels])


def kernel_flops(kr: Kernel) -> float:
    """FLOPs the kernel does by the ledger's count (attention backward: 2x forward)."""
    if kr.kind == KernelKind.MATMUL:
        return matmul_op(kr).flops
    if kr.kind == KernelKind.ATTENTION:
        fwd = sum(op.flops for op in attention_ops(kr))
        return fwd * (3.0 if kr.backward else 1.0)
    return 0.0


def _time(profile: Efficiency, chip: Chip, kr: Kernel) -> float:
    """The kernel's roofline time plus the profile's fixed time per launch."""
    if kr.kind == KernelKind.ALL_REDUCE:
        return _all_reduce_s(profile, chip, kr)  # its latency term is the fixed cost
    launches = 2 if (kr.kind == KernelKind.ATTENTION and kr.backward) else 1
    return _roofline_time(profile, chip, kr) + launches * profile.kernel_overhead_s(chip)


def _roofline_time(profile: Efficiency, chip: Chip, kr: Kernel) -> float:
    hbm = profile.hbm_fraction(chip)
    if kr.kind == KernelKind.MATMUL:
        op = matmul_op(kr)
        m = kr.m / kr.groups if kr.grouped else kr.m
        # a grouped GEMM's shape physics is that of one expert's rows (m / groups)
        frac = float(profile.matmul_fraction(chip, kr.dtype, m, kr.n, kr.k, grouped=kr.grouped))
        return _roofline_s(op.flops, op.bytes, chip, kr.dtype, frac, hbm)
    if kr.kind == KernelKind.ATTENTION:
        return _attention_s(profile, chip, kr, hbm)
    if kr.kind == KernelKind.COPY:
        return kr.nbytes / (chip.hbm_bw_bytes_per_s * hbm)
    return kr.nbytes / (chip.hbm_bw_bytes_per_s * profile.vector_fraction(chip))


def _roofline_s(
    flops: float, nbytes: float, chip: Chip, dtype: str, frac: float, hbm: float
) -> float:
    r = analyze(flops, nbytes, chip, dtype)
    return float(np.maximum(r.t_math_s / frac, r.t_mem_s / hbm))


def _attention_s(profile: Efficiency, chip: Chip, kr: Kernel, hbm: float) -> float:
    ops = attention_ops(kr)
    fwd_flops = sum(op.flops for op in ops)
    fwd_bytes = sum(op.bytes for op in ops)
    f_fwd = float(profile.attention_fraction(chip, kr.dtype, False, kr.head_dim, kr.causal))
    t = _roofline_s(fwd_flops, fwd_bytes, chip, kr.dtype, f_fwd, hbm)
    if kr.backward:  # the ledger's backward: 2x forward FLOPs; reads q,k,v,o,dO, writes dq,dk,dv
        f_bwd = float(profile.attention_fraction(chip, kr.dtype, True, kr.head_dim, kr.causal))
        t += _roofline_s(2 * fwd_flops, 2 * fwd_bytes, chip, kr.dtype, f_bwd, hbm)
    return t


def _all_reduce_s(profile: Efficiency, chip: Chip, kr: Kernel) -> float:
    if kr.devices <= 1:
        return 0.0
    system = parse_system(f"{chip.name}:{kr.topology or kr.devices}")
    mesh = make_mesh(system, {"x": kr.devices})
    cost = collective_cost("all_reduce", kr.nbytes, "x", mesh)
    return float(max(cost.latency_s, cost.bandwidth_s / profile.link_fraction(chip, kr.tier)))
