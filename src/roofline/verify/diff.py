"""Predicted vs observed: the algebra's collectives and FLOPs against what XLA emitted.

`diff(prediction, observed)` groups both sides by (collective kind, mesh axes) and sums
bytes per device x count; each row is predicted, observed, ratio and a status:

* **agree** — within the tolerance of the prediction (default 5% of the predicted bytes,
  10% of the predicted FLOPs), or a difference under 0.1% of all the bytes XLA moves in
  the step (a 4-byte loss all-reduce does not fail a row);
* **named** — the difference is accounted for by NAMED deviations, each recognised from
  the data with its excess bytes (observed minus predicted, + = XLA moves more);
* **disagree** — what is left over is larger than the tolerance; the leftover is reported
  as `xla-moves-more-bytes` / `xla-moves-fewer-bytes` with the amount.

Deviations recognised (see `DEVIATIONS` for the explanation each one prints):

| name | recognised from |
|---|---|
| equal-cost-alternative | re-planning one einsum with another option the algebra costed (`EinsumPlan.options`) removes the difference |
| allreduce-plus-slice-for-reducescatter | an all-reduce over the same axes and bytes where the algebra has a reduce-scatter |
| separate-qkv-backward-allreduce | an extra reduction of dx in the attention block, the size of the one the algebra merged (`cost.add_comms`) |
| separate-gate-up-backward-allreduce | the same in the MLP block (W_gate and W_up are two matmuls) |
| fsdp-regather-in-backward | a weight all-gathered again (size of a predicted weight gather) — no remat, under scan, or XLA's choice |
| fsdp-reuse-in-backward | a predicted backward weight gather that XLA skipped (kept the forward's) |
| gshard-dispatch-combine | collectives of the program's one-hot dispatch/combine einsums and top-k routing vs the training cost's 4 all-to-alls |
| indivisible-dim-replicated | collectives over an axis the program could not shard a dim on (program notes) |
| norm-and-loss-collectives | norm-scale [D] and scalar-loss collectives (not ledger matmul rows) |
| f32-collective-for-bf16 | (final HLO only) a bf16 collective done in f32 on CPU: twice the bytes |
| collective-permute-for-alltoall | collective-permutes where the algebra has an all-to-all (the partitioner's "involuntary rematerialization" reshard) |
| same-bytes-other-pieces | the same bytes in the row, moved as different pieces (e.g. x gathered once instead of K and V) |
| sp-redundant-kv-projection, remat-skips-dead-recompute, gshard-dispatch-combine-einsums | FLOPs per program einsum (op_name) against the ledger rows |

The diff is against the post-SPMD HLO by default (`final=False`): it keeps the program's
dtypes and one instruction per logical collective.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from roofline.verify.hlo import Observed, ObservedCollective, multiplicities, parse_module
from roofline.verify.predict import PredictedCollective, Prediction

BYTES_TOL = 0.05
FLOPS_TOL = 0.10
# a row whose difference is under 0.1% of all the bytes XLA moves in the step agrees
ABS_FLOOR = 0.001

RowKey = tuple[str, tuple[str, ...]]

DEVIATIONS: dict[str, str] = {
    "equal-cost-alternative": "XLA took another option the algebra costed about as cheap for this einsum (listed in EinsumPlan.options)",
    "costlier-alternative": "XLA took an option the algebra priced higher for this einsum (by the ratio given): the policy that chose it is not the compiler's",
    "allreduce-plus-slice-for-reducescatter": "XLA emitted an all-reduce (plus a slice the reader could not see) where the algebra "
    "has a reduce-scatter of the same buffer: the CPU partitioner's form of reduce-scatter; same bytes per device by convention",
    "separate-qkv-backward-allreduce": "XLA reduces the partial dx of Q, K and V separately; the training cost sums them and "
    "reduces once (a fused QKV projection avoids it)",
    "separate-gate-up-backward-allreduce": "XLA reduces the partial dx of W_gate and W_up separately; the training cost sums them "
    "and reduces once (a fused [D, 2F] projection would avoid it)",
    "separate-expert-backward-allreduce": "XLA reduces the partial dx of the expert gate and up matmuls separately",
    "fsdp-regather-in-backward": "XLA all-gathers the weight again in the backward pass; the training cost keeps the forward's "
    "gathered weight when nothing is rematerialised",
    "fsdp-reuse-in-backward": "XLA kept the forward's gathered weight for the backward pass where the training cost gathers again",
    "gshard-dispatch-combine": "the program routes tokens with GShard one-hot einsums (dispatch gsec,gsd->egcd, combine "
    "gsec,egcd->gsd) and top-k; XLA moves routing masks/probabilities and gathers tokens for them, where the training cost "
    "counts 4 all-to-alls of the dispatched tokens",
    "indivisible-dim-replicated": "the program could not shard a dim over this axis (see program notes) and replicated it; "
    "XLA gathers around it",
    "norm-and-loss-collectives": "norm scales [D] and the scalar loss are not ledger matmul rows: the algebra predicts no "
    "collectives for them",
    "f32-collective-for-bf16": "the final CPU HLO does bf16 collectives in f32 (twice the bytes)",
    "same-bytes-other-pieces": "the same bytes per device in this row, moved as different pieces",
    "collective-permute-for-alltoall": "XLA reshards with collective-permutes (device reorder) where the algebra moves a "
    "subscript with an all-to-all",
    "xla-moves-more-bytes": "UNEXPLAINED: XLA moves more bytes than the algebra predicts",
    "xla-moves-fewer-bytes": "UNEXPLAINED: XLA moves fewer bytes than the algebra predicts",
    "sp-redundant-kv-projection": "under sequence parallelism XLA gathers x along the sequence and computes K and V for the "
    "whole sequence on every device; the training cost gathers K and V",
    "remat-skips-dead-recompute": "under remat XLA does not recompute a forward matmul whose output the backward pass does "
    "not read (the layer's last projection), nor its collectives",
    "gshard-dispatch-combine-einsums": "FLOPs of the program's one-hot dispatch/combine einsums, which are not ledger rows",
    "xla-flops-differ": "UNEXPLAINED: XLA's dot FLOPs differ from the ledger rows'",
}
UNEXPLAINED = ("xla-moves-more-bytes", "xla-moves-fewer-bytes", "xla-flops-differ")


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Deviation:
    """One named deviation: what XLA did differently and how many bytes (or FLOPs) it cost."""

    name: str
    explanation: str
    excess: float  # observed - predicted per device per step (bytes, or FLOPs for the FLOPs row)
    by_row: tuple[tuple[str, tuple[str, ...], float], ...] = ()  # (kind, axes, excess bytes)
    detail: str = ""  # which tensors / ops
    unit: str = "B"  # "B" (bytes per device per step) or "FLOPs"

    @property
    def unexplained(self) -> bool:
        return self.name in UNEXPLAINED

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "explanation": self.explanation,
            "excess": self.excess,
            "unit": self.unit,
            "detail": self.detail,
            "unexplained": self.unexplained,
            "by_row": [{"kind": k, "axes": list(a), "excess_bytes": e} for k, a, e in self.by_row],
        }


@dataclass(frozen=True)
class Row:
    """Predicted vs observed bytes per device per step for one (collective kind, mesh axes)."""

    kind: str
    axes: tuple[str, ...]
    predicted_bytes: float
    observed_bytes: float
    predicted_count: float
    observed_count: int
    status: str  # "agree" | "named" | "disagree"
    deviations: tuple[tuple[str, float], ...]  # (name, excess bytes in this row)
    unexplained_bytes: float

    @property
    def ratio(self) -> float:
        if self.predicted_bytes:
            return self.observed_bytes / self.predicted_bytes
        return math.inf if self.observed_bytes else 1.0

    def label(self) -> str:
        if self.status == "agree" and not any(
            e or n == "same-bytes-other-pieces" for n, e in self.deviations
        ):
            return "agree"
        parts = [
            f"{n} ({_signed(e)})" for n, e in self.deviations if e or n == "same-bytes-other-pieces"
        ]
        head = (
            "agree" if self.status == "agree" else ("DISAGREE" if self.status == "disagree" else "")
        )
        return (head + (": " if head and parts else "") + ", ".join(parts)) or head

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "axes": list(self.axes),
            "predicted_bytes": self.predicted_bytes,
            "observed_bytes": self.observed_bytes,
            "predicted_count": self.predicted_count,
            "observed_count": self.observed_count,
            "ratio": self.ratio,
            "status": self.status,
            "deviations": [{"name": n, "excess_bytes": e} for n, e in self.deviations],
            "unexplained_bytes": self.unexplained_bytes,
        }


@dataclass(frozen=True)
class FlopsRow:
    predicted: float  # the algebra's choice (ledger rows, per device, per step)
    observed: float  # dot FLOPs of the final HLO (loop-corrected)
    observed_cost_analysis: float  # cost_analysis (includes elementwise), loop-corrected
    status: str
    deviations: tuple[tuple[str, float], ...]
    unexplained: float
    by_group: tuple[
        tuple[str, float, float], ...
    ] = ()  # (group, predicted after alternatives, observed)

    @property
    def ratio(self) -> float:
        return (
            self.observed / self.predicted
            if self.predicted
            else (math.inf if self.observed else 1.0)
        )

    def label(self) -> str:
        row = Row(
            "",
            (),
            self.predicted,
            self.observed,
            0,
            0,
            self.status,
            self.deviations,
            self.unexplained,
        )
        return row.label()

    def to_dict(self) -> dict[str, Any]:
        return {
            "predicted": self.predicted,
            "observed": self.observed,
            "observed_cost_analysis": self.observed_cost_analysis,
            "ratio": self.ratio,
            "status": self.status,
            "unexplained": self.unexplained,
            "deviations": [{"name": n, "excess_flops": e} for n, e in self.deviations],
            "by_group": [{"group": g, "predicted": p, "observed": o} for g, p, o in self.by_group],
        }


@dataclass(frozen=True)
class Alternative:
    """An einsum re-planned with another of the algebra's options because XLA did that."""

    op: str
    einsum: str
    chosen: str
    taken: str
    cost_ratio: float  # the taken option's collective time / the chosen one's
    flops_ratio: float  # the taken option's FLOPs per chip / the chosen one's

    def describe(self) -> str:
        cost = (
            f"costed {self.cost_ratio:.2f}x the chosen option's collective time"
            if math.isfinite(self.cost_ratio)
            else "costed more"
        )
        fl = "" if abs(self.flops_ratio - 1) < 1e-9 else f", {self.flops_ratio:.2f}x its FLOPs"
        return f"{self.op} {self.einsum}: XLA took [{self.taken}] where the algebra chose [{self.chosen}] ({cost}{fl})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "einsum": self.einsum,
            "chosen": self.chosen,
            "taken": self.taken,
            "cost_ratio": self.cost_ratio,
            "flops_ratio": self.flops_ratio,
        }


@dataclass(frozen=True)
class Diff:
    program: str
    source: str  # "post-spmd" | "final"
    mesh: Mapping[str, int]
    rows: tuple[Row, ...]
    flops: FlopsRow
    deviations: tuple[Deviation, ...]
    alternatives: tuple[Alternative, ...]
    bytes_tol: float
    flops_tol: float
    prediction: Prediction
    notes: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        statuses = [r.status for r in self.rows] + [self.flops.status]
        if "disagree" in statuses:
            return "disagree"
        if "named" in statuses:
            return "agree-with-named-deviations"
        return "agree"

    @property
    def ok(self) -> bool:
        return self.verdict != "disagree"

    def deviation_names(self) -> set[str]:
        """Names of the deviations that matter: those that explain a row or FLOPs beyond the tolerance."""
        out = set()
        for r in (*self.rows, self.flops):
            if r.status != "agree":
                out.update(n for n, e in r.deviations if e)
        return out

    def all_deviation_names(self) -> set[str]:
        return {d.name for d in self.deviations}

    def row(self, kind: str, axes: str | Sequence[str]) -> Row:
        ax = tuple(axes.split(",")) if isinstance(axes, str) else tuple(axes)
        for r in self.rows:
            if r.kind == kind and r.axes == ax:
                return r
        raise KeyError((kind, ax))

    def verdict_line(self) -> str:
        n = {s: sum(1 for r in self.rows if r.status == s) for s in ("agree", "named", "disagree")}
        head = {
            "agree": "AGREE",
            "agree-with-named-deviations": "AGREE WITH NAMED DEVIATIONS",
            "disagree": "DISAGREE",
        }[self.verdict]
        flops = {"agree": "FLOPs agree", "named": "FLOPs explained", "disagree": "FLOPs DISAGREE"}[
            self.flops.status
        ]
        names = sorted(self.deviation_names() - set(UNEXPLAINED))
        tail = f"; deviations: {', '.join(names)}" if names else ""
        return (
            f"verdict: {head} — {n['agree']} rows agree, {n['named']} explained by named deviations, "
            f"{n['disagree']} unexplained; {flops}{tail}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "source": self.source,
            "mesh": dict(self.mesh),
            "verdict": self.verdict,
            "verdict_line": self.verdict_line(),
            "tolerance": {"bytes": self.bytes_tol, "flops": self.flops_tol},
            "rows": [r.to_dict() for r in self.rows],
            "flops": self.flops.to_dict(),
            "deviations": [d.to_dict() for d in self.deviations],
            "alternatives": [a.to_dict() for a in self.alternatives],
            "prediction": self.prediction.to_dict(),
            "notes": list(self.notes),
        }

    def table(self) -> str:
        from roofline.report.table import table

        rows = []
        for r in self.rows:
            rows.append(
                [
                    r.kind,
                    ",".join(r.axes) or "-",
                    f"{r.predicted_bytes:,.0f}",
                    _count(r.predicted_count),
                    f"{r.observed_bytes:,.0f}",
                    str(r.observed_count),
                    _ratio(r.ratio),
                    r.label(),
                ]
            )
        f = self.flops
        rows.append(
            [
                "FLOPs (dot)",
                "",
                f"{f.predicted:,.0f}",
                "",
                f"{f.observed:,.0f}",
                "",
                _ratio(f.ratio),
                f.label(),
            ]
        )
        head = [
            "collective",
            "mesh axes",
            "predicted B/dev",
            "count",
            "observed B/dev",
            "count",
            "ratio",
            "status",
        ]
        out = [table(rows, head, align="llrrrrrl")]
        out.append(
            f"cost_analysis FLOPs/device {f.observed_cost_analysis:,.0f} (includes elementwise work; not compared)"
        )
        if self.alternatives:
            out.append("")
            out.append("XLA took an alternative the algebra costed:")
            out += [f"  {a.describe()}" for a in self.alternatives]
        devs = [
            d
            for d in self.deviations
            if d.excess or d.name == "same-bytes-other-pieces" or any(e for *_, e in d.by_row)
        ]
        if devs:
            out.append("")
            out.append("deviations (excess = observed - predicted, per device per step):")
            for d in devs:
                out.append(
                    f"  {d.name}: {_signed(d.excess)} {d.unit} — {d.explanation}"
                    + (f" [{d.detail}]" if d.detail else "")
                )
        if self.notes:
            out.append("")
            out += [f"note: {n}" for n in self.notes]
        out.append("")
        out.append(self.verdict_line())
        return "\n".join(out)


def _signed(x: float) -> str:
    return f"{x:+,.0f}"


def _count(x: float) -> str:
    return f"{x:g}"


def _ratio(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.3f}"


# ----------------------------------------------------------------------------- items


@dataclass
class _Item:
    kind: str
    axes: tuple[str, ...]
    dtype: str
    nbytes: float
    count: int
    info: str
    shape: tuple[int, ...] = ()
    tensor: str = ""
    op: str = ""
    einsum: str = ""

    @property
    def key(self) -> RowKey:
        return (self.kind, self.axes)


def _p_items(cs: Iterable[PredictedCollective]) -> list[_Item]:
    out = []
    for c in cs:
        n = int(round(c.count))
        if n > 0:
            out.append(
                _Item(
                    c.kind,
                    tuple(c.axes),
                    c.dtype,
                    float(c.bytes_per_device),
                    n,
                    f"{c.op} {c.einsum} {c.tensor}",
                    tensor=c.tensor,
                    op=c.op,
                    einsum=c.einsum,
                )
            )
    return out


def _o_items(cs: Iterable[ObservedCollective]) -> list[_Item]:
    return [
        _Item(
            c.kind,
            tuple(c.mesh_axes),
            c.dtype,
            float(c.bytes_per_device),
            int(c.count),
            c.op_name,
            tuple(c.shape),
        )
        for c in cs
        if c.count > 0
    ]


class _Acc:
    """Deviation excess per (name, row), plus detail strings."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[RowKey, float]] = {}
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, name: str, key: RowKey, excess: float, detail: str = "") -> None:
        r = self.rows.setdefault(name, {})
        r[key] = r.get(key, 0.0) + excess
        if detail:
            d = self.counts.setdefault(name, {})
            d[detail] = d.get(detail, 0) + 1

    def detail(self, name: str) -> str:
        return "; ".join(
            k + (f" (x{n})" if n > 1 else "") for k, n in self.counts.get(name, {}).items()
        )


def _take(items: list[_Item], pred, limit: int | None = None) -> list[tuple[_Item, int]]:
    """Consume up to `limit` executions from the items matching `pred`; returns (item, n) taken."""
    out = []
    for it in items:
        if limit is not None and limit <= 0:
            break
        if it.count <= 0 or not pred(it):
            continue
        n = it.count if limit is None else min(it.count, limit)
        it.count -= n
        if limit is not None:
            limit -= n
        out.append((it, n))
    return out


@dataclass(frozen=True)
class _Context:
    d_model: int = 0
    n_layers: int = 1
    dtype: str = "bf16"
    final: bool = False
    moe: bool = False
    remat: bool = False
    fused_qkv: bool = False
    notes: tuple[str, ...] = ()
    tol: float = BYTES_TOL
    # (kind, axes, bytes) of the post-SPMD bf16 collectives (final mode)
    bf16_sigs: frozenset = frozenset()


@dataclass
class _Match:
    """The working state of one comparison: the predicted (P) and observed (O) items still
    unmatched (copies: the passes consume their counts), the named excess so far, the context."""

    pred: Prediction
    P: list[_Item]
    O: list[_Item]
    acc: _Acc
    ctx: _Context


def _analyze(
    pred: Prediction, observed: Sequence[ObservedCollective], ctx: _Context
) -> tuple[_Acc, dict[RowKey, float]]:
    """Match predicted and observed collectives; name what differs. Returns the named excess
    per deviation and row, and the unexplained leftover per row (observed - predicted).

    The passes run in the order of `_PASSES`; each consumes the executions it explains, so an
    earlier pass takes precedence (e.g. norm-scale collectives before exact matching).
    """
    P = _p_items(pred.collectives)
    if ctx.fused_qkv:
        P = _fuse_qkv(P)
    m = _Match(pred, P, _o_items(observed), _Acc(), ctx)
    for step in _PASSES:
        step(m)
    return m.acc, _leftover(m)


def _norms_and_loss(m: _Match) -> None:
    """Norm scales and the scalar loss: not ledger matmul rows."""
    D = m.ctx.d_model

    def is_norm_or_loss(o: _Item) -> bool:
        if o.shape == () or o.nbytes <= 8:
            return True
        return (
            bool(D)
            and len(o.shape) <= 2
            and o.shape[-1] == D
            and math.prod(o.shape[:-1]) in (1, m.ctx.n_layers)
        )

    for it, n in _take(m.O, is_norm_or_loss):
        what = "scalar loss" if it.shape == () else f"norm scale {list(it.shape)}"
        m.acc.add("norm-and-loss-collectives", it.key, it.nbytes * n, what)


def _f32_for_bf16(m: _Match) -> None:
    """Final HLO: a bf16 collective done in f32 (twice the bytes); the post-SPMD module says
    which collectives were bf16 (genuinely f32 ones are left alone)."""
    if not (m.ctx.final and m.ctx.bf16_sigs):
        return
    for o in m.O:
        if o.count > 0 and o.dtype == "f32" and (o.kind, o.axes, o.nbytes / 2) in m.ctx.bf16_sigs:
            what = f"{list(o.shape)} {o.nbytes / 2:,.0f} B as f32"
            m.acc.add("f32-collective-for-bf16", o.key, o.nbytes / 2 * o.count, what)
            o.nbytes /= 2
            o.dtype = "bf16"


_SEPARATE_DX = (
    ("attn/qkv", "separate-qkv-backward-allreduce"),
    ("mlp/gate+up", "separate-gate-up-backward-allreduce"),
    ("moe/gate+up", "separate-expert-backward-allreduce"),
)


def _separate_dx_reductions(m: _Match) -> None:
    """Partial dx reduced per projection where the walk merged them: per block, the backward
    reductions of dx XLA emitted beyond those the prediction counts."""
    for group, name in _SEPARATE_DX:
        merged = [
            q
            for q in m.pred.counted_once
            if q.tensor.startswith("dx")
            and q.kind in ("all-reduce", "reduce-scatter")
            and _group_of_row(q.op) == group
        ]
        if not merged:
            continue
        q = merged[0]
        counted = sum(
            int(round(c.count))
            for c in m.pred.collectives
            if c.tensor.startswith("dx")
            and c.kind == q.kind
            and c.axes == q.axes
            and _group_of_row(c.op) == group
        )

        def mine(o: _Item, q=q, group=group) -> bool:
            return (
                o.kind == q.kind
                and o.axes == q.axes
                and abs(o.nbytes - q.bytes_per_device) < 0.5
                and "transpose(" in o.info
                and _PROGRAM_EINSUMS.get(_einsum_of(o.info)) == group
            )

        extra = sum(o.count for o in m.O if mine(o)) - counted
        limit = min(extra, sum(int(round(x.count)) for x in merged))
        if limit > 0:
            for o, n in _take(m.O, mine, limit):
                what = f"d{group.split('/')[0]} via {_einsum_of(o.info)} {o.nbytes:,.0f} B"
                m.acc.add(name, o.key, o.nbytes * n, what)


def _remat_dead_recompute(m: _Match) -> None:
    """Remat: the recompute of the layer's last projection (and its collectives) is dead code."""
    if not m.ctx.remat:
        return
    for p in m.P:
        group = _group_of_row(p.op)
        if p.count < 2 or p.einsum != "forward" or _is_weight(p.tensor):
            continue
        if group not in ("mlp/down", "moe/down"):
            continue
        seen = sum(
            o.count
            for o in m.O
            if o.key == p.key
            and abs(o.nbytes - p.nbytes) < 0.5
            and "transpose(" not in o.info
            and _PROGRAM_EINSUMS.get(_einsum_of(o.info)) == group
        )
        n = min(p.count - seen, p.count // 2)
        if n > 0:
            p.count -= n
            what = f"{p.tensor} ({p.op} forward recompute)"
            m.acc.add("remat-skips-dead-recompute", p.key, -p.nbytes * n, what)


def _exact(m: _Match) -> None:
    """Exact matches (kind, axes, bytes)."""
    _match_exact(m.P, m.O)


def _allreduce_for_reducescatter(m: _Match) -> None:
    """An all-reduce where the algebra reduce-scatters the same buffer."""
    for p in m.P:
        if p.count <= 0 or p.kind != "reduce-scatter":
            continue

        def same_buffer(o: _Item, p=p) -> bool:
            return o.kind == "all-reduce" and o.axes == p.axes and abs(o.nbytes - p.nbytes) < 0.5

        for o, n in _take(m.O, same_buffer, p.count):
            p.count -= n
            what = f"{p.tensor} ({p.op})"
            m.acc.add("allreduce-plus-slice-for-reducescatter", p.key, -p.nbytes * n, what)
            m.acc.add("allreduce-plus-slice-for-reducescatter", o.key, o.nbytes * n, what)


def _fsdp_weight_keys(m: _Match) -> dict[tuple, str]:
    """(axes, bytes) of every predicted FSDP weight gather -> the tensors it gathers."""
    weights = [
        c
        for c in _p_items(
            [*m.pred.collectives, *(replace(c, count=max(c.count, 1)) for c in m.pred.counted_once)]
        )
        if c.kind == "all-gather" and _is_weight(c.tensor) and "fsdp" in c.axes
    ]
    if m.ctx.fused_qkv:
        weights = _fuse_qkv(weights)
    wkeys: dict[tuple, str] = {}
    for c in weights:
        k = (c.axes, c.nbytes)
        if c.tensor not in wkeys.get(k, "").split("/"):
            wkeys[k] = (wkeys[k] + "/" if k in wkeys else "") + c.tensor
    return wkeys


def _fsdp_backward_gathers(m: _Match) -> None:
    """FSDP weights gathered again (or not) in the backward pass."""
    wkeys = _fsdp_weight_keys(m)
    where = " (scanned layers: re-gathered in the backward loop)" if m.ctx.n_layers > 1 else ""
    for o in m.O:
        t = wkeys.get((o.axes, o.nbytes)) if o.kind == "all-gather" else None
        if o.count > 0 and t:
            n, o.count = o.count, 0
            what = f"{t} {o.nbytes:,.0f} B{where}"
            m.acc.add("fsdp-regather-in-backward", o.key, o.nbytes * n, what)
    # weight gathers of one size are interchangeable to the exact match, which may leave a
    # forward gather over rather than the backward one XLA skipped: any left over are reuse, up
    # to as many of that size as the backward pass predicts
    budget: Counter[tuple] = Counter()
    for c in _p_items(m.pred.collectives):
        if c.kind == "all-gather" and _is_weight(c.tensor) and "fsdp" in c.axes:
            budget[(c.axes, c.nbytes)] += c.count if c.einsum != "forward" else 0
    for p in m.P:
        size = (p.axes, p.nbytes)
        if p.count > 0 and p.kind == "all-gather" and _is_weight(p.tensor) and budget[size] > 0:
            n = min(p.count, budget[size])
            budget[size] -= n
            p.count -= n
            what = f"{p.tensor} {p.nbytes:,.0f} B"
            m.acc.add("fsdp-reuse-in-backward", p.key, -p.nbytes * n, what)


def _moe_routing(m: _Match) -> None:
    """MoE routing: the program's dispatch/combine einsums and top-k vs the walk's all-to-alls."""
    if not m.ctx.moe:
        return
    taken_o = _take(m.O, lambda o: bool(_GSHARD.search(o.info)))
    taken_p = _take(m.P, lambda p: p.einsum in ("dispatch", "combine"))
    for it, n in taken_o:
        what = _einsum_of(it.info) or it.info.rsplit("/", 2)[-2]
        m.acc.add("gshard-dispatch-combine", it.key, it.nbytes * n, what)
    for it, n in taken_p:
        what = f"predicted {it.einsum} all-to-all of {it.tensor}"
        m.acc.add("gshard-dispatch-combine", it.key, -it.nbytes * n, what)


def _indivisible_replicated(m: _Match) -> None:
    """Dims the program replicated because they do not divide (the program's notes)."""
    rep_axes = {
        a
        for n in m.ctx.notes
        for a in re.findall(r"'(\w+)'", n.split("mesh axes", 1)[-1])
        if "not divisible" in n
    }
    if not rep_axes:
        return
    for it, n in _take(m.O, lambda o: set(o.axes) <= rep_axes):
        m.acc.add("indivisible-dim-replicated", it.key, it.nbytes * n, f"{list(it.shape)}")
    for it, n in _take(m.P, lambda p: set(p.axes) <= rep_axes):
        m.acc.add("indivisible-dim-replicated", it.key, -it.nbytes * n, it.tensor)


def _permute_for_alltoall(m: _Match) -> None:
    """Resharding by collective-permute where the algebra moves a subscript with an all-to-all."""
    for p in m.P:
        if p.count <= 0 or p.kind != "all-to-all":
            continue

        def permute(o: _Item, p=p) -> bool:
            return o.kind == "collective-permute" and set(p.axes) <= set(o.axes)

        for o, n in _take(m.O, permute):
            what = f"{list(o.shape)} x{n}"
            m.acc.add("collective-permute-for-alltoall", o.key, o.nbytes * n, what)
        n, p.count = p.count, 0
        what = f"{p.tensor} ({p.op} {p.einsum}) x{n}"
        m.acc.add("collective-permute-for-alltoall", p.key, -p.nbytes * n, what)


def _leftover(m: _Match) -> dict[RowKey, float]:
    """What is left: per row, the same bytes in other pieces, or unexplained."""
    left: dict[RowKey, float] = {}
    keys = {it.key for it in (*m.P, *m.O) if it.count > 0}
    for k in keys:
        po = sum(p.nbytes * p.count for p in m.P if p.key == k)
        ob = sum(o.nbytes * o.count for o in m.O if o.key == k)
        if po and ob and abs(ob - po) <= m.ctx.tol * po:
            m.acc.add("same-bytes-other-pieces", k, ob - po, _pieces(m.P, m.O, k))
        elif ob != po:
            left[k] = ob - po
    return left


# The matching passes, in order (an earlier pass takes precedence over a later one).
_PASSES = (
    _norms_and_loss,
    _f32_for_bf16,
    _separate_dx_reductions,
    _remat_dead_recompute,
    _exact,
    _allreduce_for_reducescatter,
    _fsdp_backward_gathers,
    _moe_routing,
    _indivisible_replicated,
    _permute_for_alltoall,
)


_GSHARD = re.compile(r"gsec|gske|gskc|top_k")
_EINSUM = re.compile(r"([a-z]+(?:,[a-z]+)+->[a-z]+)")


def _einsum_of(op_name: str) -> str:
    m = _EINSUM.search(op_name or "")
    return m.group(1) if m else ""


def _is_weight(tensor: str) -> bool:
    return tensor.startswith(("W", "w_"))


def _pieces(P: list[_Item], O: list[_Item], k: RowKey) -> str:
    ps = [f"{p.tensor} {p.nbytes:,.0f}x{p.count}" for p in P if p.key == k and p.count]
    os_ = [f"{list(o.shape)} {o.nbytes:,.0f}x{o.count}" for o in O if o.key == k and o.count]
    return f"{k[0]} {','.join(k[1])}: predicted {', '.join(ps)}; observed {', '.join(os_)}"


_QKV = {
    "W_q": "W_qkv",
    "W_k": "W_qkv",
    "W_v": "W_qkv",
    "dW_q": "dW_qkv",
    "dW_k": "dW_qkv",
    "dW_v": "dW_qkv",
}


def _fuse_qkv(P: list[_Item]) -> list[_Item]:
    """The fused-QKV program holds W_q, W_k and W_v as one array: one collective of their sum."""
    out: list[_Item] = []
    fused: dict[tuple, _Item] = {}
    for p in P:
        t = _QKV.get(p.tensor)
        if t is None:
            out.append(p)
            continue
        k = (t, p.kind, p.axes, p.einsum, p.count)
        if k in fused:
            fused[k].nbytes += p.nbytes
        else:
            fused[k] = _Item(
                p.kind,
                p.axes,
                p.dtype,
                p.nbytes,
                p.count,
                f"attn/qkv {p.einsum} {t}",
                tensor=t,
                op="attn/qkv",
                einsum=p.einsum,
            )
            out.append(fused[k])
    return out


def _match_exact(P: list[_Item], O: list[_Item]) -> None:
    for p in P:
        for o in O:
            if p.count <= 0:
                break
            if o.count > 0 and o.key == p.key and abs(o.nbytes - p.nbytes) < 0.5:
                n = min(p.count, o.count)
                p.count -= n
                o.count -= n


# ----------------------------------------------------------------------------- alternatives


def _labels(pred: Prediction) -> tuple[str, ...]:
    return ("forward",) if pred.kind == "matmul" else ("forward", "d_lhs", "d_rhs")


def _choice_of(ep: Any) -> int:
    import numpy as np

    return int(np.asarray(ep.choice).reshape(-1)[0])


def _search_alternatives(
    pred: Prediction, observed: Sequence[ObservedCollective], ctx: _Context, max_steps: int = 12
) -> tuple[Prediction, list[tuple[tuple[Alternative, ...], Prediction, Prediction]]]:
    """Greedy: re-plan einsums with other options the algebra costed while that lowers the
    unexplained bytes by more than half a percent of what XLA moved, and by at least half of
    the bytes the move changes (so that a move is kept only when it explains what XLA did)."""
    if pred.repredict is None or not pred.einsums:
        return pred, []
    total = sum(c.total_bytes_per_device for c in observed) or 1.0
    thresh = max(0.005 * total, 1.0)

    def cost(p: Prediction) -> float:
        _, left = _analyze(p, observed, ctx)
        return sum(abs(v) for v in left.values())

    cur, cur_cost = pred, cost(pred)
    chosen: dict[tuple[str, str], int] = {}
    steps: list[tuple[tuple[Alternative, ...], Prediction, Prediction]] = []
    tried: set[tuple] = set()
    for _ in range(max_steps):
        if cur_cost <= 0:
            break
        best = None
        for move in _candidates(cur):
            trial = {**chosen, **move}
            sig = tuple(sorted(trial.items()))
            if sig in tried:
                continue
            tried.add(sig)
            p2 = pred.repredict(trial)
            gain = cur_cost - cost(p2)
            t1, t2 = cur.totals(), p2.totals()
            moved = sum(abs(t2.get(k, 0.0) - t1.get(k, 0.0)) for k in set(t1) | set(t2))
            if gain < max(thresh, 0.5 * moved):
                continue
            if best is None or gain > best[0]:
                best = (gain, trial, p2, move)
        if best is None:
            break
        gain, trial, p2, move = best
        plans = {
            (op, lab): ep
            for op, *eps in cur.einsums
            for lab, ep in zip(_labels(cur), eps, strict=True)
        }
        alts = []
        for (op, lab), i in move.items():
            ep = plans[(op, lab)]
            now = _choice_of(ep)
            if i == now:
                continue
            a, b = ep.options[now], ep.options[i]
            ct_a, ct_b = _num(a.comm_time_s), _num(b.comm_time_s)
            fa, fb = _num(a.flops_per_chip), _num(b.flops_per_chip)
            alts.append(
                Alternative(
                    op,
                    lab,
                    a.describe(),
                    b.describe(),
                    (ct_b / ct_a) if ct_a else (1.0 if not ct_b else math.inf),
                    (fb / fa) if fa else 1.0,
                )
            )
        steps.append((tuple(alts), cur, p2))
        cur, cur_cost, chosen = p2, cur_cost - gain, trial
    return cur, steps


def _candidates(pred: Prediction):
    """Moves {(op, label): option}: one einsum at a time; einsums of one block with the same
    sharded shapes together (gate and up); and "gather the weights" (XLA's FSDP habit: the
    option that gathers no activation) for each such group over all three einsums, and for
    every einsum at once."""
    groups: dict[tuple, list[tuple[tuple[str, str], Any]]] = {}
    by_op: dict[tuple, list[tuple[tuple[str, str], Any]]] = {}
    for op, *eps in pred.einsums:
        for label, ep in zip(_labels(pred), eps, strict=True):
            groups.setdefault((op.rsplit("/", 1)[0], label, _shape_sig(ep)), []).append(
                ((op, label), ep)
            )
            by_op.setdefault((op.rsplit("/", 1)[0], _shape_sig(eps[0])), []).append(
                ((op, label), ep)
            )
    for members in groups.values():
        sets = [[m] for m in members] + ([members] if len(members) > 1 else [])
        for ms in sets:
            ep = ms[0][1]
            now = _choice_of(ep)
            sig_now = ep.options[now].describe()
            for i, o in enumerate(ep.options):
                if i == now or o.describe() == sig_now:
                    continue
                if any(len(m[1].options) <= i or _choice_of(m[1]) != now for m in ms):
                    continue
                yield {k: i for k, _ in ms}
    everything: dict[tuple[str, str], int] = {}
    for members in by_op.values():
        move = {k: _weight_gathering(ep) for k, ep in members}
        move = {k: i for k, i in move.items() if i is not None}
        everything.update(move)
        if move:
            yield move
    if everything:
        yield everything


def _weight_gathering(ep: Any) -> int | None:
    """The option that gathers no activation (only weights, and reduces outputs), cheapest first."""
    best = None
    for i, o in enumerate(ep.options):
        act = sum(
            _num(c.bytes_per_chip)
            for c in o.comms
            if c.kind.value == "all-gather" and not _is_weight(c.tensor)
        )
        a2a = sum(_num(c.bytes_per_chip) for c in o.comms if c.kind.value == "all-to-all")
        key = (act + a2a, _num(o.comm_time_s))
        if best is None or key < best[0]:
            best = (key, i)
    return None if best is None else best[1]


def _shape_sig(ep: Any) -> tuple:
    return tuple((s.dims, s.axes) for s in (ep.lhs, ep.rhs, ep.out))


def _num(x: Any) -> float:
    import numpy as np

    return float(np.asarray(x, float).reshape(-1)[0])


# ----------------------------------------------------------------------------- FLOPs by program einsum

# The verify program's einsums (roofline.verify.program) and the ledger rows they compute.
_PROGRAM_EINSUMS: dict[str, str] = {
    "btd,dnh->btnh": "attn/qkv",
    "btd,dkh->btkh": "attn/qkv",
    "btd,dkjh->btkjh": "attn/qkv",
    "btkgh,bskh->bkgts": "attn/scores+context",
    "bkgts,bskh->btkgh": "attn/scores+context",
    "btnh,nhd->btd": "attn/out",
    "btd,df->btf": "mlp/gate+up",
    "btf,fd->btd": "mlp/down",
    "gsd,de->gse": "moe/router",
    "egcd,edf->egcf": "moe/gate+up",
    "egcf,efd->egcd": "moe/down",
}
_ROW_GROUP = {
    "attn/q": "attn/qkv",
    "attn/k": "attn/qkv",
    "attn/v": "attn/qkv",
    "attn/out": "attn/out",
    "mlp/gate": "mlp/gate+up",
    "mlp/up": "mlp/gate+up",
    "mlp/down": "mlp/down",
    "moe/router": "moe/router",
    "moe/gate": "moe/gate+up",
    "moe/up": "moe/gate+up",
    "moe/down": "moe/down",
    "matmul": "matmul",
}


def _group_of_row(op: str) -> str:
    if op.startswith(("attn/scores", "attn/context")):
        return "attn/scores+context"
    return _ROW_GROUP.get(op, op)


def dot_flops_by_einsum(hlo_text: str) -> dict[str, float]:
    """Dot FLOPs per device per step of the final HLO, keyed by the jax einsum in each dot's
    op_name ("" for dots without one), times the loop multiplicities."""
    from roofline.verify.hlo import dot_flops_of

    mod = parse_module(hlo_text)
    mult, _ = multiplicities(mod)
    out: dict[str, float] = {}
    for comp, instrs in mod.computations.items():
        k_mult = mult.get(comp, 0)
        for ins in instrs if k_mult else ():
            f = dot_flops_of(mod, ins)
            if f is None:
                continue
            m = re.search(r'op_name="([^"]*)"', ins.line)
            key = _einsum_of(m.group(1)) if m else ""
            out[key] = out.get(key, 0.0) + f * k_mult
    return out


def _flops_groups(pred: Prediction, observed: Observed) -> dict[str, tuple[float, float]]:
    # attributed on the post-SPMD module: the final one drops op_names on fused dots
    text = observed.hlo_text_post_spmd or observed.hlo_text_final
    by_e = dot_flops_by_einsum(text) if text else {}
    groups: dict[str, list[float]] = {}
    for op, f in pred.flops_by_op.items():
        groups.setdefault(_group_of_row(op), [0.0, 0.0])[0] += f
    for e, f in by_e.items():
        if pred.kind == "matmul":
            g = "matmul"
        elif e in _PROGRAM_EINSUMS:
            g = _PROGRAM_EINSUMS[e]
        elif _GSHARD.search(e):
            g = "moe/dispatch+combine"
        else:
            g = "other"
        groups.setdefault(g, [0.0, 0.0])[1] += f
    return {g: (v[0], v[1]) for g, v in groups.items()}


# ----------------------------------------------------------------------------- diff


def diff(
    prediction: Prediction,
    observed: Observed,
    *,
    bytes_tol: float = BYTES_TOL,
    flops_tol: float = FLOPS_TOL,
    final: bool = False,
    search_alternatives: bool = True,
    program_notes: Sequence[str] = (),
) -> Diff:
    """Compare a Prediction with an Observed compile (post-SPMD collectives unless `final`)."""
    obs_colls = observed.collectives_final if final else observed.collectives
    notes = tuple(program_notes)
    ctx = _context_of(prediction, observed, final, bytes_tol, notes)
    base = prediction
    cur, steps = _search_alternatives(base, obs_colls, ctx) if search_alternatives else (base, [])
    acc, left = _analyze(cur, obs_colls, ctx)
    _add_alternative_moves(acc, steps)
    alternatives = tuple(a for alts, _, _ in steps for a in alts)
    rows = _rows(base, obs_colls, acc, left, bytes_tol)
    frow, fdevs = _flops_row(base, cur, steps, observed, ctx, flops_tol)
    deviations = _deviations(acc, left, alternatives) + fdevs
    deviations.sort(key=lambda d: (d.unexplained, -abs(d.excess)))
    all_notes = tuple(prediction.notes) + tuple(f"program: {n}" for n in notes)
    return Diff(
        prediction.name,
        "final" if final else "post-spmd",
        dict(prediction.mesh),
        tuple(rows),
        frow,
        tuple(deviations),
        alternatives,
        bytes_tol,
        flops_tol,
        base,
        all_notes,
    )


def _context_of(
    prediction: Prediction, observed: Observed, final: bool, bytes_tol: float, notes: tuple
) -> _Context:
    inp = prediction.inputs
    bf16_sigs = (
        frozenset(
            (c.kind, tuple(c.mesh_axes), float(c.bytes_per_device))
            for c in observed.collectives
            if c.dtype == "bf16"
        )
        if final
        else frozenset()
    )
    return _Context(
        d_model=int(inp.get("d_model", 0) or 0),
        n_layers=int(inp.get("n_layers", 1) or 1),
        dtype=str(inp.get("dtype", "bf16")),
        final=final,
        moe=bool(inp.get("moe", False)),
        remat=bool(inp.get("remat", False)),
        fused_qkv=bool(inp.get("fused_qkv", False)),
        notes=notes,
        tol=bytes_tol,
        bf16_sigs=bf16_sigs,
    )


# An alternative whose collective time the algebra priced within this factor of its choice is
# "equal cost"; above it the deviation says how much higher (issue 9 cause 2: 3-8x byte
# differences must not pass as equal cost).
EQUAL_COST_RATIO = 1.25


def alternative_name(alts) -> str:
    """The deviation a step of alternatives is named by: equal cost, or costlier by N×."""
    worst = max((a.cost_ratio for a in alts), default=1.0)
    return "costlier-alternative" if worst > EQUAL_COST_RATIO else "equal-cost-alternative"


def _add_alternative_moves(acc: _Acc, steps) -> None:
    """Alternatives: the change each move made to the predicted rows (FLOPs: see _flops_row)."""
    for alts, before, after in steps:
        tb, ta = before.totals(), after.totals()
        name = alternative_name(alts)
        for k in set(tb) | set(ta):
            d = ta.get(k, 0.0) - tb.get(k, 0.0)
            if d:
                what = "; ".join(f"{a.op} {a.einsum}" for a in alts)
                acc.add(name, k, d, what)


def _rows(base: Prediction, obs_colls, acc: _Acc, left: dict, bytes_tol: float) -> list[Row]:
    """One row per (kind, axes): predicted vs observed bytes and counts, status, deviations."""
    pt, pc = base.totals(), base.counts()
    floor = ABS_FLOOR * sum(c.total_bytes_per_device for c in obs_colls)
    ot: dict[RowKey, float] = {}
    oc: dict[RowKey, int] = {}
    for c in obs_colls:
        k = (c.kind, tuple(c.mesh_axes))
        ot[k] = ot.get(k, 0.0) + c.total_bytes_per_device
        oc[k] = oc.get(k, 0) + int(c.count)
    rows = []
    for k in sorted(set(pt) | set(ot), key=lambda k: (k[0], k[1])):
        p, o = pt.get(k, 0.0), ot.get(k, 0.0)
        devs = [(name, r[k]) for name, r in acc.rows.items() if k in r]
        lo = left.get(k, 0.0)
        if lo > 0:
            devs.append(("xla-moves-more-bytes", lo))
        elif lo < 0:
            devs.append(("xla-moves-fewer-bytes", lo))
        tol = max(bytes_tol * p, floor)  # "within 5%" of the prediction
        status = "agree" if abs(o - p) <= tol else ("named" if abs(lo) <= tol else "disagree")
        devs.sort(key=lambda x: -abs(x[1]))
        rows.append(Row(k[0], k[1], p, o, pc.get(k, 0.0), oc.get(k, 0), status, tuple(devs), lo))
    return rows


def _deviations(acc: _Acc, left: dict, alternatives: tuple) -> list[Deviation]:
    deviations = []
    for name, r in acc.rows.items():
        by_row = tuple((k[0], k[1], v) for k, v in sorted(r.items()))
        detail = acc.detail(name)
        if name in ("equal-cost-alternative", "costlier-alternative"):
            mine = [a for a in alternatives if alternative_name((a,)) == name] or list(alternatives)
            detail = "; ".join(a.describe() for a in mine)
            if name == "costlier-alternative":
                worst = max(a.cost_ratio for a in mine)
                by = f"up to {worst:.1f}x higher" if math.isfinite(worst) else "higher"
                detail = f"XLA took options the algebra priced {by} than its choice: " + detail
        deviations.append(Deviation(name, DEVIATIONS[name], sum(r.values()), by_row, detail))
    for k, v in sorted(left.items()):
        name = "xla-moves-more-bytes" if v > 0 else "xla-moves-fewer-bytes"
        deviations.append(
            Deviation(
                name,
                DEVIATIONS[name],
                v,
                ((k[0], k[1], v),),
                f"{k[0]} over {','.join(k[1]) or '-'}",
            )
        )
    return deviations


def _flops_row(
    base: Prediction, cur: Prediction, steps, observed: Observed, ctx: _Context, tol: float
) -> tuple[FlopsRow, list[Deviation]]:
    obs = float(observed.dot_flops_per_device)
    p0 = float(base.flops_per_device)
    devs: list[tuple[str, float, str]] = []
    d_alt = float(cur.flops_per_device) - p0
    if d_alt:
        devs.append(
            (
                alternative_name([a for alts, _, _ in steps for a in alts]),
                d_alt,
                "; ".join(f"{a.op} {a.einsum}" for alts, _, _ in steps for a in alts),
            )
        )
    groups = _flops_groups(cur, observed)
    sp = "seq" in base.mesh and base.mesh.get("seq", 1) > 1
    named = 0.0
    for g, (pg, og) in sorted(groups.items()):
        r = og - pg
        if not r:
            continue
        if g == "moe/dispatch+combine":
            devs.append(("gshard-dispatch-combine-einsums", r, g))
        elif g == "attn/qkv" and sp and r > 0:
            devs.append(("sp-redundant-kv-projection", r, g))
        elif ctx.remat and r < 0 and g in ("mlp/down", "moe/down", "attn/out"):
            devs.append(("remat-skips-dead-recompute", r, g))
        else:
            continue
        named += r
    left = obs - float(cur.flops_per_device) - named
    if abs(left) > 1e-4 * max(obs, 1.0):
        devs.append(
            (
                "xla-flops-differ",
                left,
                "per group: "
                + ", ".join(
                    f"{g} {o - p:+,.0f}"
                    for g, (p, o) in sorted(groups.items())
                    if abs(o - p) > 1e-6 * max(obs, 1.0)
                ),
            )
        )
    scale = p0
    if abs(obs - p0) <= tol * scale:
        status = "agree"
    elif abs(left) <= tol * scale:
        status = "named"
    else:
        status = "disagree"
    merged: dict[str, float] = {}
    for n, e, _ in devs:
        merged[n] = merged.get(n, 0.0) + e
    row = FlopsRow(
        p0,
        obs,
        float(observed.flops_per_device),
        status,
        tuple(sorted(merged.items(), key=lambda x: -abs(x[1]))),
        left,
        tuple((g, p, o) for g, (p, o) in sorted(groups.items())),
    )
    out = [Deviation(n, DEVIATIONS[n], e, (), d, "FLOPs") for n, e, d in devs]
    return row, out


# ----------------------------------------------------------------------------- one call


@dataclass(frozen=True)
class VerifyResult:
    prediction: Prediction
    observed: Observed
    diff: Diff
    program_notes: tuple[str, ...] = field(default_factory=tuple)
    seconds: float = 0.0


def verify_train_step(
    model: Any,
    plan: Any,
    *,
    batch: int = 8,
    seq: int = 64,
    dtype: str = "bf16",
    n_layers: int = 1,
    remat: bool = False,
    fused_qkv: bool = False,
    capacity_factor: float = 1.0,
    system: str | None = None,
    final: bool = False,
    bytes_tol: float = BYTES_TOL,
    flops_tol: float = FLOPS_TOL,
    framework: str | None = None,
) -> VerifyResult:
    """Build the program, compile it once (`observe`), predict (with `framework`'s option
    policy, e.g. "maxtext" for XLA's habits), and diff."""
    import time

    from roofline.verify.hlo import observe
    from roofline.verify.predict import predict_train_step
    from roofline.verify.program import build_train_step

    t = time.time()
    # the program and the prediction take the same description of the step
    step = dict(
        batch=batch,
        seq=seq,
        dtype=dtype,
        n_layers=n_layers,
        remat=remat,
        fused_qkv=fused_qkv,
        capacity_factor=capacity_factor,
    )
    prog = build_train_step(model, plan, **step)
    obs = observe(prog)
    pred = predict_train_step(model, plan, **step, system=system, framework=framework)
    return _result(prog, obs, pred, t, final=final, bytes_tol=bytes_tol, flops_tol=flops_tol)


def _result(prog, obs, pred: Prediction, t0: float, **kw: Any) -> VerifyResult:
    """The diff of a compiled program's collectives with their prediction, timed from t0."""
    import time

    d = diff(pred, obs, program_notes=prog.notes, **kw)
    return VerifyResult(pred, obs, d, tuple(prog.notes), time.time() - t0)


def verify_matmul(
    expr: str,
    *,
    sizes: Mapping[str, int] | None = None,
    mesh_shape: Mapping[str, int] | None = None,
    dtype: str = "bf16",
    system: str | None = None,
    final: bool = False,
    bytes_tol: float = BYTES_TOL,
    flops_tol: float = FLOPS_TOL,
) -> VerifyResult:
    import time

    from roofline.verify.hlo import observe
    from roofline.verify.predict import predict_matmul
    from roofline.verify.program import build_matmul

    t = time.time()
    prog = build_matmul(expr, sizes=sizes, mesh_shape=mesh_shape, dtype=dtype)
    obs = observe(prog)
    pred = predict_matmul(expr, sizes=sizes, mesh_shape=mesh_shape, dtype=dtype, system=system)
    return _result(prog, obs, pred, t, final=final, bytes_tol=bytes_tol, flops_tol=flops_tol)


__all__ = [
    "BYTES_TOL",
    "FLOPS_TOL",
    "DEVIATIONS",
    "EQUAL_COST_RATIO",
    "Alternative",
    "alternative_name",
    "Deviation",
    "Diff",
    "FlopsRow",
    "Row",
    "VerifyResult",
    "diff",
    "dot_flops_by_einsum",
    "verify_matmul",
    "verify_train_step",
]
