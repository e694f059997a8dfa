"""Pipeline communication per training step, read off a costed plan (issue 20 item 5).

The walk prices one microbatch's hop — its activations `x[batch, seq, embed]` (its local
shard) permuted to the next stage over the `stage` axis — as one collective record, and the
timeline (`training.step`) charges the pipeline's hops as the step's `pp` term. This module
adds no formula for either: it reads the hop's bytes and time from the plan's collective rows
and the exposed time from the step's `pp` term, and counts what a step sends:

- a microbatch crosses every boundary between consecutive model chunks twice (activations
  forward, their gradients backward): `2·(p·v − 1)` hops, `v` chunks per stage (interleaved);
- each chip sends its shard once forward and once backward per microbatch and chunk it holds:
  `2·M·v` sends per step (an interior stage; the first and last send one direction each);
- the step model exposes the hops it cannot hide behind other microbatches' compute (the
  fill and drain); the rest overlap.

The book (gpus.md) writes the pipeline's communication as `T_PP = 2BD/(W·N_MB)·(N_MB + N_stages
− 2)`: a hop of one microbatch's `2BD/N_MB` bytes, `N_MB + N_stages − 2` of them in a row.
Here that is the walk's hop time times the same count (`book_t_pp_s`), and equals the closed form
where the hop is bandwidth-bound and the activations are not sharded (tests/book).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from roofline.training.step import StepCost
from roofline.units import fmt_bytes, fmt_time

_PIPELINE_CLASS = "pp"


@dataclass(frozen=True)
class PipelineTraffic:
    """What one training step sends between pipeline stages (per chip unless named)."""

    stages: int  # p
    virtual_stages: int  # v: model chunks per stage
    microbatches: int  # M
    hop_bytes_per_chip: float  # one microbatch's activation shard (the walk's record)
    hop_time_s: float  # the walk's price of that permute
    hops_per_microbatch: int  # 2·(p·v − 1): forward and backward across every chunk boundary
    sends_per_chip: int  # 2·M·v per step (an interior stage)
    bytes_per_chip: float  # sends_per_chip · hop_bytes_per_chip
    send_time_s: float  # sends_per_chip · hop_time_s: if nothing overlapped
    exposed_time_s: float  # the step model's pp term
    exposed_hops: float  # exposed_time_s / hop_time_s
    book_hops: int  # N_MB + N_stages − 2 (gpus.md)
    book_t_pp_s: float  # hop_time_s · book_hops

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def explain(self) -> list[str]:
        """Book-style lines: each count's formula, the numbers, the result."""
        if self.stages <= 1:
            return ["no pipeline (pp=1): nothing crosses a stage boundary"]
        p, v, m = self.stages, self.virtual_stages, self.microbatches
        hop = fmt_time(self.hop_time_s)
        return [
            f"one hop: a microbatch's activations x[batch, seq, embed] to the next stage, "
            f"{fmt_bytes(self.hop_bytes_per_chip)} per chip in {hop} (permute over stage)",
            f"hops per microbatch: 2·(p·v − 1) = 2·({p}·{v} − 1) = {self.hops_per_microbatch} "
            "(activations forward, gradients backward)",
            f"sends per chip per step: 2·M·v = 2·{m}·{v} = {self.sends_per_chip} -> "
            f"{fmt_bytes(self.bytes_per_chip)}, {fmt_time(self.send_time_s)} if none overlapped",
            f"exposed in the step: {self.exposed_hops:.3g} hops · {hop} = "
            f"{fmt_time(self.exposed_time_s)} (fill and drain; the rest hides behind compute)",
            f"book gpus.md: T_PP = T_hop·(N_MB + N_stages − 2) = {hop}·({m} + {p} − 2) = "
            f"{fmt_time(self.book_t_pp_s)}",
        ]


def _hop_row(cost: StepCost) -> dict[str, Any] | None:
    rows = [c for c in cost.collectives if c["overlap"] == _PIPELINE_CLASS and c["counted"]]
    return rows[0] if rows else None


def pipeline_traffic(cost: StepCost) -> PipelineTraffic:
    """The pipeline traffic of a plan costed by `evaluate_plan` (its collective rows kept)."""
    plan = cost.plan
    p, v, m = plan.degrees.pp, plan.virtual_stages, plan.microbatches
    row = _hop_row(cost) if p > 1 else None
    b = float(row["bytes_per_chip"]) if row else 0.0
    t = float(row["time_s"]) if row else 0.0
    exposed = float(cost.comm_time_s.get(_PIPELINE_CLASS, 0.0))
    piped = row is not None
    sends = 2 * m * v if piped else 0
    book_hops = m + p - 2 if piped else 0
    return PipelineTraffic(
        stages=p,
        virtual_stages=v,
        microbatches=m,
        hop_bytes_per_chip=b,
        hop_time_s=t,
        hops_per_microbatch=2 * (p * v - 1) if piped else 0,
        sends_per_chip=sends,
        bytes_per_chip=sends * b,
        send_time_s=sends * t,
        exposed_time_s=exposed,
        exposed_hops=exposed / t if t > 0 else 0.0,
        book_hops=book_hops,
        book_t_pp_s=book_hops * t,
    )
