"""Disaggregated serving under load: the queueing terms of a request's way to its first token,
each against its closed form (the M/D/1 wait against a simulated queue, the closed loop's wait
against exact Mean Value Analysis and a simulated closed loop).

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
    closed_wait,
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


def test_the_link_queue_is_a_closed_queue_per_prefill_replica():
    """Each prefill replica's link carries X / replicas prompts a second, each holding it for
    P·kv / bw seconds: its wait is the closed loop's queue at that load (the M/D/1 wait at load
    ρ·(C − 1)/C), and it adds to the TTFT."""
    w, C = Workload(4096, 1024), np.array([64.0])
    slow = disaggregated(ideal(), ideal(), Disagg(2, 3, 4e9, 0.0, KV), w, C)
    busy = 4096 * KV / 4e9
    X = _f(slow["requests_per_s"])
    rho = X * busy / 2
    assert _f(slow["link_wait_s"]) == pytest.approx(float(md1_wait(busy, rho * 63 / 64)), rel=1e-12)
    assert _f(slow["link_wait_s"]) > 0.01 * busy  # a loaded link: the term is not vanishing
    fast = disaggregated(ideal(), ideal(), Disagg(2, 3, 4e12, 0.0, KV), w, C)
    assert _f(fast["link_wait_s"]) < 1e-6 * _f(slow["link_wait_s"])


# --------------------------------------------------------------------------------------
# The closed loop (benchmark client: N users, each sends its next request when the last ends)
# --------------------------------------------------------------------------------------


def _one_server_loop(N: int, Z: float, D: float, residual: float) -> tuple[float, float]:
    """(X, R) of N users cycling between a think time Z and one FCFS server of service D, with
    the server's wait from `closed_wait`: X·(Z + R) = N solved by bisection on X ≤ 1/D, and past
    the knee the loop's Little's law R = N/X − Z (as `disaggregated` closes it)."""
    lo, hi = 0.0, 1.0 / D
    for _ in range(200):
        X = (lo + hi) / 2
        R = D + float(closed_wait(D, X * D, N, residual))
        lo, hi = (X, hi) if X * (Z + R) < N else (lo, X)
    R = D + float(closed_wait(D, lo * D, N, residual))
    return lo, max(R, N / lo - Z)


def _exact_mva(N: int, Z: float, D: float) -> float:
    """Exact MVA (Reiser & Lavenberg 1980) of one exponential server: R(n) = D·(1 + Q(n − 1))."""
    Q = 0.0
    for n in range(1, N + 1):
        R = D * (1 + Q)
        Q = n / (Z + R) * R
    return R


def _simulated_loop(N: int, Z: float, D: float, n: int, seed: int) -> float:
    """Mean time at one FCFS server of fixed service D, N users thinking Exp(Z) between visits."""
    rng = np.random.default_rng(seed)
    back = sorted(rng.exponential(Z, N))  # when each user next arrives
    free, total = 0.0, 0.0
    for _ in range(n):
        a = back.pop(0)
        free = max(a, free) + D
        total += free - a
        back.insert(int(np.searchsorted(back, t := free + rng.exponential(Z))), t)
    return total / n


def test_the_closed_wait_has_the_open_queue_and_no_queue_as_its_limits():
    """N = 1 never waits (no one else is in the loop); N → ∞ is the open M/D/1 (Pollaczek–
    Khinchine) wait; an exponential server's residual doubles the fixed one's; a saturated server
    keeps a finite wait (ρ' ≤ (N − 1)/N), no load cap."""
    for rho in (0.1, 0.5, 0.9):
        assert float(closed_wait(2.0, rho, 1)) == 0.0
        assert float(closed_wait(2.0, rho, 1e9)) == pytest.approx(
            float(md1_wait(2.0, rho)), rel=1e-6
        )
        assert float(closed_wait(2.0, rho, 50, 1.0)) == pytest.approx(
            2 * float(closed_wait(2.0, rho, 50)), rel=1e-12
        )
    assert float(closed_wait(1.0, 1.0, 64)) == pytest.approx(0.5 * 63, rel=1e-12)
    assert float(closed_wait(1.0, 5.0, 64)) == float(closed_wait(1.0, 1.0, 64))


@pytest.mark.parametrize("N", [1, 2, 5, 20, 100, 1000])
def test_one_server_with_no_think_time_holds_everyone_in_its_queue(N):
    """Z = 0: the server never idles, X = 1/D and each request spends N·D there (both residuals)."""
    for residual in (0.5, 1.0):
        X, R = _one_server_loop(N, 0.0, 1.0, residual)
        assert X == pytest.approx(1.0, rel=1e-9) and R == pytest.approx(N, rel=1e-9)


@pytest.mark.parametrize("Z", [0.5, 5.0, 50.0])
def test_the_closed_loop_matches_exact_mva_and_its_asymptotes(Z):
    """With an exponential residual the approximation is within 13% of exact MVA (Schweitzer's
    error, largest at the knee N ≈ Z/D + 1); N = 1 is the bare service; far past the knee the
    server saturates (X → 1/D) and R = N/X − Z. A fixed service time waits less: between the
    deterministic bound max(D, N·D − Z) and the exponential exact value."""
    D = 1.0
    for N in (1, 2, 5, 20, 100, 1000):
        exact = _exact_mva(N, Z, D)
        _, R_exp = _one_server_loop(N, Z, D, 1.0)
        assert R_exp == pytest.approx(exact, rel=0.13)
        X, R = _one_server_loop(N, Z, D, 0.5)
        assert max(D, N * D - Z) - 1e-9 <= R <= exact * (1 + 1e-3)
        if N == 1:
            assert R == pytest.approx(D, rel=1e-9)
    X, R = _one_server_loop(10_000, Z, D, 0.5)
    assert X == pytest.approx(1 / D, rel=1e-3) and R == pytest.approx(10_000 / X - Z, rel=1e-9)
    assert _exact_mva(2, Z, D) == pytest.approx(D * (1 + D / (Z + D)), rel=1e-12)  # closed form


@pytest.mark.parametrize(("N", "Z"), [(2, 2.0), (5, 5.0), (10, 5.0), (20, 20.0), (40, 20.0)])
def test_the_closed_loop_with_a_fixed_service_matches_a_simulated_loop(N, Z):
    """Against a simulated closed loop (fixed service, exponential think): within 12% at the
    knee (N = Z/D), ≤ 4% elsewhere; exact MVA of an exponential server is further off there."""
    sim = _simulated_loop(N, Z, 1.0, 30_000, seed=11)
    _, R = _one_server_loop(N, Z, 1.0, 0.5)
    assert R == pytest.approx(sim, rel=0.12 if N == Z else 0.04)


def test_disaggregated_ttft_reduces_to_no_wait_for_one_user_and_to_littles_law_at_saturation():
    """N = 1: TTFT = prefill + KV transfer + hand-off, no queue anywhere. N far past the prefill
    pool's knee: X → the pool's capacity replicas / t_pf and TTFT = N/X − (G − 1)·TPOT."""
    d, G = Disagg(1, 4, 400e9, 1e-5, KV, handoff_s=0.1), 256
    w = Workload(8192, G)
    one = disaggregated(ideal(), ideal(), d, w, np.array([1.0]))
    lat = 1e-5 + 8192 * KV / 400e9 + 0.1
    assert _f(one["ttft_s"]) == pytest.approx(_f(one["prefill_s"]) + lat, rel=1e-12)
    for k in ("prefill_wait_s", "link_wait_s", "decode_wait_s"):
        assert _f(one[k]) == pytest.approx(0.0, abs=1e-12)
    mid = disaggregated(ideal(), ideal(), d, w, np.array([8.0]))  # loaded, below the knee
    cycle = _f(mid["ttft_s"]) + (G - 1) * _f(mid["tpot_s"])
    assert _f(mid["requests_per_s"]) * cycle == pytest.approx(8.0, rel=1e-9)  # the loop closes
    assert _f(mid["prefill_wait_s"]) > 0.01 * _f(mid["prefill_s"])
    many = disaggregated(ideal(), ideal(), d, w, np.array([2000.0]))
    X, tau, t_pf = (_f(many[k]) for k in ("requests_per_s", "tpot_s", "prefill_s"))
    assert X == pytest.approx(1 / t_pf, rel=2e-3)
    assert _f(many["ttft_s"]) == pytest.approx(2000 / X - (G - 1) * tau, rel=1e-9)
    assert _f(many["decode_wait_s"]) == 0.0  # the prefill pool, not the decode slots, binds


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
