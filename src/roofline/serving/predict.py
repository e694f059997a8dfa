"""Predict a published serving measurement from its configuration (for `roofline validate`).

`predict_measured_run(run, efficiency=...)` reads the typed record `roofline.validate` builds from
measured_inference.yaml / measured_serving_aic.yaml (model, chip, parallelism per role, precision,
engine, workload) and returns TTFT, TPOT and the deployment's output tokens/s from the serving
model — the same step costs and steady state as `roofline serve`, never fitted to a run.

How each workload mode is simulated:
- aggregated / concurrency: closed loop at `concurrency` over the replicas; the reported TTFT
  averages in the first wave (all requests start together) with the weight the benchmark client
  gives it (`FIRST_WAVE_SHARE`, by the run's harness): 1/10 for AIConfigurator's measured sample
  (it assumes about 10×concurrency requests, sdk/backends/*_backend.py run_agg), 0 for GenAI-Perf
  (its perf_analyzer measures in time windows and repeats them until the values are stable, so the
  start-up burst is not in the reported window);
- disaggregated: prefill workers (one prompt per pass) and decode workers joined by the KV
  transfer over NVLink (inside an NVL72 rack) or the node's scale-out NIC;
- offline: all requests queued: the engine runs at its largest batch (KV capacity, max_num_seqs);
- online-rate: open loop at `request_rate_rps`: the closed-loop concurrency that carries that rate;
- fixed-batch: one static batch of `batch` requests (prefill together, then decode together).
Throughput is output tokens/s of the whole deployment (Little's law: C·OSL / E2E).
"""

from __future__ import annotations

from dataclasses import replace
from math import gcd
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.core.ledger import kv_cache_bytes_per_token
from roofline.errors import RooflineError, SpecError
from roofline.serving.inference import (
    PassShape,
    Quant,
    ServePlan,
    StepModel,
    memory_per_chip,
)
from roofline.serving.steady import (
    Disagg,
    Workload,
    disaggregated,
    kv_link_bytes_per_s,
    seq_cap_of,
    steady_state,
)
from roofline.serving.step import IdealStep, ShardedStep
from roofline.specs.efficiency import Efficiency, default_efficiency
from roofline.specs.engines import EngineProfile, engine_names, load_engine
from roofline.specs.system import parse_system
from roofline.units import parse_dtype

# The weight of the all-at-once first wave in a closed-loop benchmark's reported mean TTFT, by the
# client that measured it (validate.serving_runs names it from the workload text).
FIRST_WAVE_SHARE = {
    # 1 / (requests per concurrency slot): AIConfigurator assumes 10×concurrency requests
    # (ai-dynamo/aiconfigurator sdk/backends/*_backend.py run_agg; docs/dynamo_deployment_guide.md
    # @ 095f58a5: "we use concurrency * 10 as num_requests"). Its generated bench_run.sh.j2 uses
    # 20× (aiperf waits out the 2×C warmup, so the profiling phase opens with a burst: 0.05);
    # which one the sample was measured with is not recorded. 0.05 scores TTFT 34.6% vs 26.2%
    # (docs/serving.md): the sample's TTFT grows with C like a first wave of weight ~0.1.
    "aiconfigurator": 0.1,
    # perf_analyzer "measures the throughput and latency over a time window, and then repeats the
    # measurements until it gets stable values" (triton-inference-server docs/perf_analyzer.md):
    # the reported window is steady state
    "genai-perf": 0.0,
}
DEFAULT_FIRST_WAVE_SHARE = 0.1  # a client not named: assume AIConfigurator's 10 waves
_DTYPE_FALLBACK = {
    "fp8_block": "fp8",
    "mxfp4": "fp4",
    "nvfp4": "fp4",
    "mxfp8": "fp8",
}  # older units
_ENGINE_OF = {"nim": "trtllm"}  # NIM LLM serves Llama through TensorRT-LLM


def _f(x: Any) -> float:
    """A scalar out of a one-candidate array."""
    return float(np.asarray(x, float).reshape(-1)[0])


def _dtype(name: str | None, default: str = "bf16") -> str:
    if not name:
        return default
    try:
        return parse_dtype(name)
    except SpecError:
        return parse_dtype(_DTYPE_FALLBACK.get(str(name).lower(), default))


def quant_of(run: Any, engine: EngineProfile | None = None) -> Quant:
    """Weights in the GEMM mode, experts in the MoE mode, compute in the activation dtype; the
    embeddings and the output head stay bf16 in quantised checkpoints (ModelOpt, DeepSeek FP8).
    An unstated KV-cache dtype is the engine's default for the checkpoint (`kv_dtype_for`)."""
    p = run.precision
    w = _dtype(p.weights)
    unstated = any("KV-cache precision unstated" in n for n in getattr(run, "defaults", ()))
    kv = engine.kv_dtype_for(w) if (engine is not None and unstated) else _dtype(p.kv_cache)
    return Quant(
        weights=w,
        kv=kv,
        compute=_dtype(p.activations, w),
        experts=_dtype(p.moe_weights, w),
        embeddings="bf16",
    )


def engine_of(run: Any) -> EngineProfile | None:
    """The run's engine as its stated release ships it (`EngineProfile.at_version`)."""
    key = _ENGINE_OF.get(run.engine, run.engine)
    if key not in engine_names():
        return None
    return load_engine(key).at_version(getattr(run, "engine_version", "") or "")


def plan_of(par: Any) -> ServePlan:
    tp, dp, pp = max(par.tp, 1), max(par.dp, 1), max(par.pp, 1)
    ep = gcd(max(par.ep, 1), tp * dp)
    return ServePlan(tp=tp, pp=pp, dp=dp, ep=ep)


def _profile(eff: Efficiency | None, chip: Any) -> Efficiency:
    if eff is not None:
        return eff
    try:
        from roofline.specs.efficiency import default_profile  # type: ignore[attr-defined]

        return default_profile(chip)
    except ImportError:
        return default_efficiency(chip.vendor)


def replica_capacity(step: StepModel, engine: EngineProfile | None, context: float) -> float:
    """Sequences of `context` tokens one replica's KV memory holds under the engine's policy.

    A measured run ran (issue 18 item 6): where the engine's default memory fraction
    (--gpu-memory-utilization, --mem-fraction-static, free_gpu_memory_fraction) leaves no room
    for one sequence, the run was launched with a larger one — the runs file does not record
    the flags — so its KV pool is what the HBM leaves after the weights and the workspace. Only
    a replica whose weights and workspace exceed the HBM itself is refused."""
    m = memory_per_chip(step.model, step.plan, step.quant, 1, context, workspace_tokens=8192)
    hbm = step.chip.fit_hbm_bytes
    held = _f(m.weights_bytes) + _f(m.activation_bytes)
    per_seq = _f(m.kv_bytes)
    usable = (
        _f(engine.kv_memory_bytes(hbm, m.weights_bytes, m.activation_bytes, step.plan.chips))
        if engine
        else 0
    )
    if usable < per_seq:
        usable = hbm - held
    if usable < per_seq:
        raise SpecError(
            f"the weights and workspace need {held / 1e9:.1f} GB per chip of {hbm / 1e9:.0f} GB",
            rule="a replica holds its weights plus at least one sequence's KV cache",
            fix="more chips per replica or lower-precision weights",
        )
    return float(np.floor(usable / per_seq)) * step.plan.dp


def predict_measured_run(run: Any, *, efficiency: Efficiency | None = None) -> dict[str, Any]:
    """TTFT (s), TPOT (s) and output tokens/s of the deployment for one measured run."""
    if run.model is None or run.chip is None:
        raise SpecError(f"run {run.id}: model or chip not mapped", fix="see the run's skip reason")
    w = run.workload
    engine = engine_of(run)
    eff = _profile(efficiency, run.chip)
    if engine is not None and hasattr(eff, "for_framework"):
        eff = eff.for_framework(engine.name)  # a calibrated profile's per-engine overrides
    quant = quant_of(run, engine)
    notes = [f"engine profile {engine.name if engine else 'none'}", f"quant {quant.describe()}"]
    if run.disaggregated:
        out = _disagg(run, eff, engine, quant)
    elif w.mode == "offline":
        out = _offline(run, eff, engine, quant)
    elif w.mode == "fixed-batch":
        out = _fixed_batch(run, eff, engine, quant)
    elif w.mode == "online-rate":
        out = _rate(run, eff, engine, quant)
    else:
        out = _closed_loop(run, eff, engine, quant)
    out["notes"] = tuple(notes + list(out.pop("notes", ())))
    return out


def _lengths(run: Any) -> tuple[float, float]:
    w = run.workload
    if not w.isl or not w.osl:
        raise SpecError(
            f"run {run.id}: prompt/output lengths unknown",
            rule="the serving model needs ISL and OSL",
            fix="give the lengths (a dataset name is not enough)",
        )
    return float(w.isl), float(w.osl)


def replica_step(run: Any, par: Any, eff: Efficiency, quant: Quant) -> StepModel:
    """The walk's sharded step for one worker of `par` on the run's chip (the book's perfectly
    sharded bound where the chip count has no system, e.g. a TPU count that is not a slice).

    Shared by every run of the same deployment (`_STEPS`): a step is a pure function of
    (model, chip, plan, quant, profile) and caches the tables it walks, so the runs of one
    deployment (400 serving points, 249 deployments) walk each table once."""
    plan = plan_of(par)
    # the model's `source` is a label (validate writes the run's id there; nothing in the walk,
    # the step or the steady state reads it), and the profile's disaggregated hand-off is read
    # by `_disagg`, never by a step (calibrate --from-runs serving predicts each run at many);
    # a Chip holds mappings (unhashable): keyed by identity, the entry keeps it alive
    # (nor the per-request latency, nor the per-engine overrides once applied: steady_state reads
    # the latency from the profile, calibrate predicts each run at many)
    if getattr(eff, "disagg_handoff_s", 0.0) or getattr(eff, "request_latency_s", 0.0):
        eff_key = replace(eff, disagg_handoff_s=0.0, request_latency_s=0.0)
    else:
        eff_key = eff
    if getattr(eff, "framework", "") and eff_key.frameworks:
        eff_key = replace(eff_key, frameworks=MappingProxyType({}))
    key = (replace(run.model, source=""), id(run.chip), plan, quant, eff_key)
    hit = _STEPS.pop(key, None)
    if hit is None:
        hit = (run.chip, _new_replica_step(run, plan, eff, quant))
    _STEPS[key] = hit  # most recently used last
    while len(_STEPS) > _STEPS_MAX:
        del _STEPS[next(iter(_STEPS))]
    return hit[1]


_STEPS: dict[tuple, tuple[Any, StepModel]] = {}
_STEPS_MAX = 512  # deployments kept (each a few walked tables); least recently used dropped


def _new_replica_step(run: Any, plan: ServePlan, eff: Efficiency, quant: Quant) -> StepModel:
    try:
        system = parse_system(f"{run.chip.name}:{plan.chips}")
    except RooflineError:
        return IdealStep(run.model, run.chip, plan, quant, eff)
    return ShardedStep(run.model, [system], [plan], quant, eff)


def _aggregated_step(run: Any, eff: Efficiency, quant: Quant) -> tuple[StepModel, int]:
    par = run.parallel
    plan = plan_of(par)
    replicas = max(par.workers, 1)
    if run.chips and plan.chips * replicas != run.chips:
        replicas = max(run.chips // plan.chips, 1)
    return replica_step(run, par, eff, quant), replicas


def first_wave_share(run: Any) -> float:
    """The first wave's weight in the run's reported TTFT (`FIRST_WAVE_SHARE` by harness)."""
    return FIRST_WAVE_SHARE.get(getattr(run.workload, "harness", ""), DEFAULT_FIRST_WAVE_SHARE)


def _wave_note(run: Any) -> str:
    h = getattr(run.workload, "harness", "") or "harness not named"
    return f"first-wave share {first_wave_share(run):g} ({h})"


def _closed_loop(run, eff, engine, quant, concurrency: float | None = None) -> dict[str, Any]:
    P, G = _lengths(run)
    step, replicas = _aggregated_step(run, eff, quant)
    C = float(concurrency or run.workload.concurrency or 1) / replicas
    work = Workload(P, G, first_wave_share=first_wave_share(run))
    cap = replica_capacity(step, engine, P + G)
    s = steady_state(step, engine, work, C, batch_cap=max(cap, 1.0), request_latency_s=_lat(eff))
    rps = _f(s.requests_per_s) * replicas
    return {
        "ttft_s": _f(s.ttft_s),
        "tpot_s": _f(s.tpot_s),
        "output_tokens_per_s": C * replicas * G / _f(s.e2e_s),
        "requests_per_s": rps,
        "notes": (
            f"replica batch cap {cap:g}",
            f"decode batch {_f(s.decode_batch):.1f}",
            _wave_note(run),
        ),
    }


def _lat(eff: Any) -> float:
    """The profile's per-request latency for the engine it was specialised to (for_framework)."""
    return float(getattr(eff, "request_latency_s", 0.0))


def _offline(run, eff, engine, quant) -> dict[str, Any]:
    P, G = _lengths(run)
    step, replicas = _aggregated_step(run, eff, quant)
    cap = replica_capacity(step, engine, P + G)
    if engine:
        cap = min(cap, engine.seq_cap(step.degree("dp")))
    work = Workload(P, G, streaming=False)  # offline throughput: whole outputs, no streaming
    s = steady_state(step, engine, work, cap, batch_cap=cap, request_latency_s=_lat(eff))
    return {
        "ttft_s": None,
        "tpot_s": None,
        "output_tokens_per_s": _f(s.requests_per_s) * G * replicas,
        "notes": (f"offline: the engine's largest batch {cap:g}",),
    }


def _rate(run, eff, engine, quant) -> dict[str, Any]:
    """Open loop at λ: the closed-loop concurrency whose throughput is λ (bisection)."""
    P, G = _lengths(run)
    lam = run.workload.request_rate_rps
    if not lam:
        raise SpecError(f"run {run.id}: no request rate", fix="give request_rate_rps")
    step, replicas = _aggregated_step(run, eff, quant)
    cap = replica_capacity(step, engine, P + G)
    work = Workload(P, G, rate=lam)
    grid = np.unique(np.geomspace(0.05, max(cap, 1.0), 64))
    s = steady_state(step, engine, work, grid, batch_cap=max(cap, 1.0), request_latency_s=_lat(eff))
    X = np.asarray(s.requests_per_s) * replicas
    if lam > X.max():
        raise SpecError(
            f"run {run.id}: {lam} requests/s exceeds the predicted capacity {X.max():.2f}",
            rule="an open loop above capacity has no steady state",
        )
    i = int(np.searchsorted(X, lam))
    j = max(i - 1, 0)
    f = 0.0 if i == j else (lam - X[j]) / (X[i] - X[j])
    pick = lambda a: float(np.asarray(a)[j] + f * (np.asarray(a)[i] - np.asarray(a)[j]))  # noqa: E731
    return {
        "ttft_s": pick(s.ttft_s),
        "tpot_s": pick(s.tpot_s),
        "output_tokens_per_s": lam * G,
    }


def _fixed_batch(run, eff, engine, quant) -> dict[str, Any]:
    """One static batch: the B prompts prefill in one pass, then G − 1 decode passes at the mean
    context P + G/2 (vLLM's benchmark_latency)."""
    P, G = _lengths(run)
    B = float(run.workload.batch or run.workload.concurrency or 1)
    step, _ = _aggregated_step(run, eff, quant)
    pre = _f(step.pass_time(PassShape(prefill_seqs=B, prefill_chunk=P, prefill_context=P)).time_s)
    dec = _f(step.pass_time(PassShape(decode=B, context=P + G / 2)).time_s)
    ovh = engine.step_overhead_s if engine else 0.0
    total = pre + ovh + (G - 1) * (dec + ovh)
    tpot = dec + ovh if G > 1 else None
    return {"ttft_s": pre + ovh, "tpot_s": tpot, "output_tokens_per_s": B * G / total}


def _disagg(run, eff, engine, quant) -> dict[str, Any]:
    P, G = _lengths(run)
    pre_p, dec_p = run.prefill, run.decode
    if pre_p is None or dec_p is None:
        raise SpecError(f"run {run.id}: disaggregated run without worker layouts")
    pre = replica_step(run, pre_p, eff, quant)
    dec = replica_step(run, dec_p, eff, quant)
    kv_tok = kv_cache_bytes_per_token(run.model, quant.kv, context=P)
    # the prefill worker's chips each send their shard of the cache in parallel
    bw = kv_link_bytes_per_s(run.chip) * plan_of(pre_p).chips
    per_pass = max(pre_p.batch or 1, 1) * max(pre_p.dp, 1)
    d = Disagg(
        max(pre_p.workers, 1),
        max(dec_p.workers, 1),
        bw,
        10e-6,
        kv_tok,
        per_pass,
        handoff_s=float(getattr(eff, "disagg_handoff_s", 0.0)),
    )
    cap = replica_capacity(dec, engine, P + G)
    C = float(run.workload.concurrency or 1)
    work = Workload(P, G, first_wave_share=first_wave_share(run))
    r = disaggregated(pre, dec, d, work, C, decode_cap=max(cap, 1.0), engine=engine)
    return {
        "ttft_s": _f(r["ttft_s"]),
        "tpot_s": _f(r["tpot_s"]),
        "output_tokens_per_s": C * G / _f(r["e2e_s"]),
        "notes": (
            f"KV transfer {_f(r['kv_transfer_s']) * 1e3:.2f} ms per request",
            *_handoff_note(d),
            f"decode slots {min(cap, _f(seq_cap_of(dec, engine))):g} per worker (KV at ISL + OSL,"
            f" the engine's cap), decode batch {_f(r['decode_batch']):.1f}",
            ttft_pieces(r, work.first_wave_share),
            _wave_note(run),
        ),
    }


def ttft_pieces(r: dict[str, Any], share: float) -> str:
    """A disaggregated prediction's TTFT as its pieces (steady state, then the first wave)."""
    ms = lambda k: _f(r[k]) * 1e3  # noqa: E731
    handoff = f" + hand-off {r['handoff_s'] * 1e3:.0f} ms" if r["handoff_s"] else ""
    return (
        f"TTFT = prefill {ms('prefill_s'):.0f} ms + prefill queue {ms('prefill_wait_s'):.0f} ms"
        f" + KV transfer {ms('kv_transfer_s'):.1f} ms + link queue {ms('link_wait_s'):.1f} ms"
        f"{handoff} + decode-slot wait"
        f" {ms('decode_wait_s'):.0f} ms in steady state (X {_f(r['requests_per_s']):.2f}"
        f" requests/s, prefill utilisation {_f(r['prefill_utilisation']):.2f}); first wave"
        f" {ms('first_wave_s'):.0f} ms at share {share:g}"
    )


def _handoff_note(d: Disagg) -> tuple[str, ...]:
    if not d.handoff_s:
        return ()
    return (
        f"disaggregated hand-off {d.handoff_s * 1e3:.0f} ms per request "
        "(profile's disagg_handoff_s, fitted by calibrate --from-runs serving)",
    )
