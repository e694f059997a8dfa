"""Physical bounds every measured serving run is checked against before it is scored.

A measurement that its own stated deployment could not have produced is a data problem, not a
model error: scoring it would fit the model to a mislabelled run. One bound, applied to every
run alike, from the measured numbers and the stated layout only (no fitted parameter):

KV capacity. In a closed loop of C requests, Little's law on the measured latencies gives the
requests in flight per second, X = C / (TTFT + (G − 1)·TPOT), and the sequences decoding at any
moment, B = X·(G − 1)·TPOT (each spends (G − 1)·TPOT after its first token). Each holds at least
its P prompt tokens of KV cache. On the stated layout a chip keeps its share of every one of its
attention-DP rank's sequences (the tensor axis splits the KV heads and replicates them beyond K;
an MLA latent is one shared head, so a pure tensor-parallel MLA replica keeps every sequence's
whole latent on every chip: TensorRT-LLM docs features/parallel-strategy.md, vLLM and SGLang
alike). The bound prices that cache at 4 bits per element — below any KV dtype the engines
ship — and gives it all the HBM the weights leave (no workspace, no engine memory fraction). A
run whose B sequences still do not fit could not have run as stated (`KV_CAPACITY_FLAG`).

Prefill compute. The same law gives the requests finished per second, X. Each brought a prompt of
P tokens that some chip prefilled: at least 2·N·P FLOPs, N the parameters one token is multiplied
through (the active ones of an MoE; attention, the output head and every overhead left out). The
chips that prefill — a disaggregated deployment's prefill workers, every chip of an aggregated
one — can do at most their dense peak in the fastest format the run computes in (its weight,
expert or activation format), all of the time, with no decode work. A run whose X·2·N·P exceeds
that could not have served the stated workload (`PREFILL_COMPUTE_FLAG`): its concurrency or its
prompts were not what the file says (e.g. prompts repeated, which an engine's prefix cache then
serves without computing them). The bound judges that run alone: it names no layout label wrong.

Its sweep. A run that breaks the KV bound shows that the layout labels of its sweep -- the runs
of one engine (and version), model, chip, mode, prompt/output lengths and published precision,
measured at several concurrencies and labelled layouts -- are not the layouts that ran: the
export wrote something else into them (DeepSeek-R1 on GB200 with TensorRT-LLM: `tp` 28 ... 72
over one sweep, GPU counts of disaggregated deployments, most of which no attention-head count
divides). Its siblings are not scored either (`mislabelled_sweeps`, `sibling_violation`), as
unmapped with the reason and the impossible run named; a sweep with no impossible run is
scored as stated.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from roofline.errors import RooflineError
from roofline.serving.inference import Quant, ServePlan, memory_per_chip, params_active
from roofline.serving.predict import plan_of, quant_of
from roofline.specs.model import ModelSpec

KV_CAPACITY_FLAG = "beyond_kv_capacity"
PREFILL_COMPUTE_FLAG = "beyond_prefill_compute"
FLOOR_KV_DTYPE = "fp4"  # the smallest KV element any engine stores (NVFP4 KV on Blackwell)
REASON = "physically impossible as stated"  # the skip reason's key in validate's listing


@functools.lru_cache(maxsize=512)
def _per_chip(
    model: ModelSpec, plan: ServePlan, quant: Quant, prompt: float
) -> tuple[float, float]:
    """(weight bytes per chip, floor KV bytes per chip of one sequence of `prompt` tokens)."""
    floor = Quant(quant.weights, FLOOR_KV_DTYPE, quant.compute, quant.experts, quant.embeddings)
    m = memory_per_chip(model, plan, floor, 1, prompt)
    return float(np.ravel(m.weights_bytes)[0]), float(np.ravel(m.kv_bytes)[0])


def finished_per_s(run: Any) -> float | None:
    """Requests the closed loop finishes per second by Little's law on the measured TTFT and
    TPOT, X = C / (TTFT + (G − 1)·TPOT), or None when the run lacks what the law needs."""
    w, m = run.workload, run.measured
    if not (w.concurrency and w.osl and w.osl > 1 and m.ttft_s and m.tpot_s):
        return None
    return w.concurrency / (m.ttft_s + (w.osl - 1) * m.tpot_s)


def decoding_at_once(run: Any) -> float | None:
    """Sequences in decode at any moment by Little's law (whole deployment): X·(G − 1)·TPOT,
    or None when the run lacks what the law needs."""
    X = finished_per_s(run)
    return None if X is None else X * (run.workload.osl - 1) * run.measured.tpot_s


def _decode_layout(run: Any) -> tuple[Any, int] | None:
    """(the decode workers' layout, how many of them) as the run states it."""
    if run.disaggregated:
        return (run.decode, max(run.decode.workers, 1)) if run.decode else None
    if run.parallel is None:
        return None
    replicas = max(run.parallel.workers, 1)
    if run.chips and plan_of(run.parallel).chips * replicas != run.chips:
        replicas = max(run.chips // plan_of(run.parallel).chips, 1)
    return run.parallel, replicas


def kv_capacity_violation(run: Any) -> str | None:
    """The reason a run's measured decodes cannot fit its stated layout's HBM (module doc), or
    None when they can (or the run lacks the numbers to tell: a layout the serving model cannot
    size is left to the predictor, whose own error then names it)."""
    try:
        return _violation(run)
    except RooflineError:
        return None


def _violation(run: Any) -> str | None:
    B = decoding_at_once(run)
    layout = _decode_layout(run) if B is not None else None
    if layout is None or run.model is None or run.chip is None or not run.workload.isl:
        return None
    par, workers = layout
    plan = plan_of(par)
    P = float(run.workload.isl)
    weights, per_seq = _per_chip(run.model, plan, quant_of(run), P)
    seqs_per_chip = B / workers / plan.dp  # attention DP splits a worker's sequences
    need, room = seqs_per_chip * per_seq, run.chip.fit_hbm_bytes - weights
    if need <= room:
        return None
    return (
        f"{REASON}: Little's law on the measured TTFT and TPOT puts {B:.0f} sequences in decode "
        f"at once, {B / workers:.0f} per worker of {plan.describe()}; at ≥{P:g} tokens each their "
        f"KV cache needs {need / 1e9:.0f} GB per chip even at 4 bits, where {run.chip.name}'s "
        f"{run.chip.fit_hbm_bytes / 1e9:.0f} GB leave {max(room, 0) / 1e9:.0f} GB after the weights "
        f"({KV_CAPACITY_FLAG})"
    )


def _fastest_peak(chip: Any, quant: Quant) -> float:
    """The chip's dense peak FLOP/s in the fastest format the run's matmuls may compute in."""
    peaks = []
    for d in {quant.compute, quant.weights, quant.experts or quant.weights}:
        try:
            peaks.append(chip.peak(d))
        except RooflineError:  # a storage format the chip cannot compute in (weight-only int4)
            continue
    return max(peaks, default=chip.peak(chip.default_dtype))


def _prefill_chips(run: Any) -> int | None:
    """The chips that prefill as the run states them (module doc), or None when unstated."""
    if run.disaggregated:
        par = run.prefill
        return plan_of(par).chips * max(par.workers, 1) if par is not None else None
    layout = _decode_layout(run)
    if layout is None:
        return None
    par, replicas = layout
    return plan_of(par).chips * replicas


def prefill_compute_violation(run: Any) -> str | None:
    """The reason a run's measured throughput needs more prefill FLOP/s than its stated chips'
    peak (module doc, "Prefill compute"), or None when it does not (or the run lacks the
    numbers to tell)."""
    try:
        return _compute_violation(run)
    except RooflineError:
        return None


def _compute_violation(run: Any) -> str | None:
    w = run.workload
    X = finished_per_s(run)
    if X is None or not w.isl or run.model is None or run.chip is None:
        return None
    chips = _prefill_chips(run)
    if not chips:
        return None
    n_active = params_active(run.model)
    need = X * 2.0 * n_active * float(w.isl)
    peak = _fastest_peak(run.chip, quant_of(run))
    room = chips * peak
    if need <= room:
        return None
    return (
        f"{REASON}: Little's law on the measured TTFT and TPOT finishes {X:.1f} requests/s at "
        f"concurrency {w.concurrency:g}; their {w.isl:g}-token prompts need at least "
        f"{need / 1e15:.2f} PFLOP/s of matmuls (2 × {n_active / 1e9:.1f} B active "
        f"parameters × {w.isl:g} tokens each), where its {chips} prefilling {run.chip.name} chips "
        f"peak at {room / 1e15:.2f} PFLOP/s ({peak / 1e12:.0f} TFLOP/s each): the concurrency or "
        f"the prompts were not as stated ({PREFILL_COMPUTE_FLAG})"
    )


def physical_violation(run: Any) -> tuple[str, str] | None:
    """(reason, flag) of the first physical bound a run breaks (KV capacity, then prefill
    compute), or None."""
    why = kv_capacity_violation(run)
    if why:
        return why, KV_CAPACITY_FLAG
    why = prefill_compute_violation(run)
    return (why, PREFILL_COMPUTE_FLAG) if why else None


SWEEP_REASON = "sweep labelled impossibly"  # a sibling's skip reason key in validate's listing


def sweep_key(run: Any) -> tuple:
    """What the runs of one measured sweep share (everything but concurrency and layout)."""
    w = run.workload
    return (
        run.schema,
        run.engine,
        run.engine_version,
        run.model_name,
        run.chip_family,
        run.disaggregated,
        w.mode,
        w.isl,
        w.osl,
        run.precision.as_published,
    )


def mislabelled_sweeps(runs: Any) -> dict[tuple, str]:
    """The sweeps (`sweep_key`) holding a mapped run its stated layout cannot hold, each with the
    id of the first such run."""
    out: dict[tuple, str] = {}
    for r in runs:
        if r.mapped and sweep_key(r) not in out and kv_capacity_violation(r):
            out[sweep_key(r)] = r.id
    return out


def sibling_violation(run: Any, sweeps: dict[tuple, str]) -> str | None:
    """Why a mapped run is not scored because another run of its sweep breaks the bound (module
    doc), or None (the run is that one itself: it is flagged and listed when it is scored)."""
    bad = sweeps.get(sweep_key(run)) if run.mapped else None
    if bad is None or bad == run.id:
        return None
    return (
        f"{SWEEP_REASON}: run {bad} of the same sweep (engine, model, chip, lengths and "
        f"precision) is {REASON} ({KV_CAPACITY_FLAG}), so the sweep's layout labels are not the "
        "layouts that ran; fix the export's parallel fields to score it"
    )


__all__ = [
    "KV_CAPACITY_FLAG",
    "PREFILL_COMPUTE_FLAG",
    "SWEEP_REASON",
    "decoding_at_once",
    "kv_capacity_violation",
    "mislabelled_sweeps",
    "physical_violation",
    "prefill_compute_violation",
    "sibling_violation",
    "sweep_key",
]
