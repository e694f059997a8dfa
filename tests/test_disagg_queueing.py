"""Disaggregated serving under load: the queueing terms of a request's way to its first token,
each against its closed form (and the M/D/1 wait against a simulated queue).

A request's TTFT in steady state is its prefill, the wait for its prefill replica, the KV
transfer, the wait for its link, the hand-off and, when every decode slot is taken, the wait for
one (Little's law on the closed loop).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from roofline.serving.inference import Quant, ServePlan
from roofline.serving.predict import predict_measured_run, ttft_pieces
from roofline.serving.steady import (
    RHO_MAX,
    Disagg,
    Workload,
    _decode,
    disaggregated,
    md1_wait,
)
from roofline.serving.step import IdealStep
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import PEAK
from roofline.specs.model_catalog import load_model

LLAMA8 = load_model("llama-3.1-8b")
H100 = load_chip("h100")
KV = 2 * 32 * 8 * 128 * 2  # bf16 KV bytes per token of LLaMA-3.1 8B


def ideal():
    return IdealStep(LLAMA8, H100, ServePlan(tp=1), Quant(), PEAK)


def _f(x):
    return float(np.ravel(x)[0])


def _simulated_md1_wait(rho: float, service: float, n: int, seed: int) -> float:
    """Mean wait of a FIFO single server with Poisson arrivals and a fixed service time, by
    Lindley's recursion W[i+1] = max(0, W[i] + S − A[i+1])."""
    gaps = np.random.default_rng(seed).exponential(service / rho, n)
    w, total = 0.0, 0.0
    for a in gaps:
        w = max(0.0, w + service - a)
        total += w
    return total / n


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.8])
def test_the_md1_wait_is_pollaczek_khinchine_and_matches_a_simulated_queue(rho):
    assert md1_wait(2.0, rho) == pytest.approx(2.0 * rho / (2 * (1 - rho)), rel=1e-15)
    sim = _simulated_md1_wait(rho, 1.0, 200_000, seed=7)
    assert sim == pytest.approx(float(md1_wait(1.0, rho)), rel=0.06)


def test_the_md1_wait_stops_at_the_load_bound():
    """Past RHO_MAX the closed loop's Little's law prices the wait, not the open queue."""
    at_bound = float(md1_wait(1.0, RHO_MAX))
    assert float(md1_wait(1.0, 3.0)) == at_bound == pytest.approx(RHO_MAX / (2 * (1 - RHO_MAX)))
    assert float(md1_wait(1.0, 0.0)) == 0.0


def test_steady_ttft_is_the_sum_of_its_pieces():
    """With no first wave, TTFT = prefill + prefill queue + KV transfer + link queue + hand-off
    + decode-slot wait: the decomposition `roofline validate` prints is complete."""
    d = Disagg(2, 3, 4e9, 1e-5, KV, handoff_s=0.2)
    r = disaggregated(ideal(), ideal(), d, Workload(4096, 256), np.array([64.0]))
    parts = ("prefill_s", "prefill_wait_s", "kv_transfer_s", "link_wait_s", "handoff_s")
    total = sum(_f(r[k]) for k in parts) + _f(r["decode_wait_s"])
    assert _f(r["ttft_s"]) == pytest.approx(total, rel=1e-12)
    note = ttft_pieces(r, 0.0)
    assert f"prefill {_f(r['prefill_s']) * 1e3:.0f} ms" in note and "hand-off 200 ms" in note


def test_the_link_queue_is_md1_per_prefill_replica():
    """Each prefill replica's link carries X / replicas prompts a second, each holding it for
    P·kv / bw seconds: its wait is the M/D/1 wait at that load, and it adds to the TTFT."""
    w, C = Workload(4096, 256), np.array([64.0])
    slow = disaggregated(ideal(), ideal(), Disagg(2, 3, 4e9, 0.0, KV), w, C)
    busy = 4096 * KV / 4e9
    X = _f(slow["requests_per_s"])
    assert _f(slow["link_wait_s"]) == pytest.approx(float(md1_wait(busy, X * busy / 2)), rel=1e-12)
    assert _f(slow["link_wait_s"]) > 0.01 * busy  # a loaded link: the term is not vanishing
    fast = disaggregated(ideal(), ideal(), Disagg(2, 3, 4e12, 0.0, KV), w, C)
    assert _f(fast["link_wait_s"]) < 1e-6 * _f(slow["link_wait_s"])


def test_a_full_decode_pool_queues_arrivals_in_ttft():
    """C above the decode slots (here the KV capacity `decode_cap`): the pool decodes `slots`
    sequences per replica, so X = W·slots / ((G − 1)·τ(slots)) and every request waits
    TTFT = C/X − (G − 1)·τ (Little's law): the TTFT grows by 1/X per added request while TPOT
    stays put."""
    G, W, slots = 256, 2, 8.0
    d = Disagg(4, W, 400e9, 0.0, KV)
    C = np.array([48.0, 64.0])
    r = disaggregated(ideal(), ideal(), d, Workload(1024, G), C, decode_cap=slots)
    tau = _f(_decode(ideal(), np.array([slots]), 1024 + G / 2, 0.0))
    X = W * slots / ((G - 1) * tau)
    assert np.allclose(r["decode_batch"], slots)
    assert np.allclose(r["requests_per_s"], X, rtol=1e-3)
    assert np.allclose(r["ttft_s"], C / X - (G - 1) * tau, rtol=1e-3)
    assert np.diff(r["ttft_s"])[0] == pytest.approx(16 / X, rel=1e-3)
    assert np.all(r["decode_wait_s"] > 0)
    roomy = disaggregated(ideal(), ideal(), d, Workload(1024, G), C)
    assert np.all(roomy["decode_wait_s"] < 1e-9) and np.all(roomy["ttft_s"] < r["ttft_s"])


def test_the_qwen3_32b_sglang_c528_point_is_bound_by_its_decode_kv_not_a_queue():
    """The +3661% point (Qwen3-32B FP8, SGLang, H100, 5 prefill + 11 decode single-GPU workers,
    batch 48 per decode worker, C = 528 inferred as 11 × 48 — the row records no concurrency):
    with the KV cache in the engine's default bf16 a decode worker holds 25 sequences of
    ISL + OSL, not 48, so
    the model decodes 11 × 25 and queues the rest in TTFT (Little's law), while the measured TTFT
    and TPOT put ~515 sequences in decode at once. In fp8 the stated batch fits. A mapping
    question (KV dtype unstated, concurrency inferred), not a queueing-model error."""
    from roofline.calibrate.serving import load_serving_runs
    from roofline.serving.predict import engine_of, quant_of, replica_capacity, replica_step
    from roofline.specs.efficiency import load_profile
    from roofline.validate.serving_bounds import decoding_at_once

    _, runs = load_serving_runs("serving")
    run = next(r for r in runs if r.id.startswith("aic-qwen3_32b_qwen3_32b_h100_sxm_sglang_disagg"))
    assert run.workload.concurrency == 528 and run.decode.batch == 48
    eng, eff = engine_of(run), load_profile("fitted")
    q = quant_of(run, eng)
    assert q.kv == "bf16"
    ctx = run.workload.isl + run.workload.osl
    bf16 = replica_capacity(replica_step(run, run.decode, eff, q), eng, ctx)
    fp8 = replica_capacity(replica_step(run, run.decode, eff, replace(q, kv="fp8")), eng, ctx)
    assert bf16 < run.decode.batch <= fp8
    assert decoding_at_once(run) / run.decode.workers > bf16  # the measurement decoded more
    out = predict_measured_run(run, efficiency=eff)
    assert f"decode slots {bf16:g} per worker" in " ".join(out["notes"])
    pieces = next(n for n in out["notes"] if n.startswith("TTFT = "))
    wait_ms = float(pieces.split("decode-slot wait ")[1].split(" ms")[0])
    assert wait_ms > 0.9 * out["ttft_s"] * 1e3  # the slot wait is nearly all of the TTFT
