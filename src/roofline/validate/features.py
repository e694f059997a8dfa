"""Structured descriptors of a mapped training run (sequence length, pipelining, MoE, model
size, compute dtype, context/tensor parallelism, remat, layout): the causes validate's
breakdowns and its error analysis group runs by."""

from __future__ import annotations

from typing import TYPE_CHECKING

from roofline.core.ledger import count_params

if TYPE_CHECKING:  # the record only; a runtime import would point up the order
    from roofline.validate.scoreboard import TrainingResult


def _size_bucket(params: float) -> str:
    if params < 10e9:
        return "<10B"
    if params < 100e9:
        return "10-100B"
    return ">=100B"


def _seq_bucket(seq: int) -> str:
    if seq <= 4096:
        return "<=4k"
    if seq <= 8192:
        return "8k"
    return ">8k"


def features(r: TrainingResult) -> dict[str, str]:
    """Structured descriptors of a run (only for mapped runs; {} otherwise)."""
    x = r.run.inputs
    if x is None:
        return {}
    d = x.plan.degrees
    m = x.model
    axes = (
        "+".join(s for s in ("dp", "fsdp", "tp", "sp", "ep", "pp") if getattr(d, s) > 1) or "single"
    )
    return {
        "seq_len": _seq_bucket(x.workload.seq_len),
        "pipeline": "pp>1" if d.pp > 1 else "pp=1",
        "moe": "moe" if m.moe is not None else "dense",
        "model_size": _size_bucket(count_params(m).total),
        "compute_dtype": x.compute_dtype,
        "context_parallel": "cp>1" if d.sp > 1 else "cp=1",
        "tensor_parallel": "tp>1" if d.tp > 1 else "tp=1",
        "remat": str(x.plan.remat),
        "layout": axes,
    }


CAUSES = (
    "seq_len",
    "pipeline",
    "moe",
    "model_size",
    "compute_dtype",
    "context_parallel",
    "tensor_parallel",
    "remat",
)
