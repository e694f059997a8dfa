"""Mixed prefill/decode engines (vLLM, TensorRT-LLM) whose closed loop drifts apart: each prefill
pass holds the prompts that arrived since the last one (serving/steady.py `arrival_batch`), not
the budget's cohort. Closed forms at both ends: λ → 0 gives one prompt's pass beside the running
decodes; λ large gives the budget's cohort, the lockstep model's answer."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from roofline.serving.inference import PassShape, Quant, ServePlan
from roofline.serving.steady import Workload, arrival_batch, steady_state
from roofline.serving.step import IdealStep
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import PEAK
from roofline.specs.engines import load_engine
from roofline.specs.model_catalog import load_model

STEP = IdealStep(load_model("llama-3.1-8b"), load_chip("h100"), ServePlan(tp=1), Quant(), PEAK)
VLLM = load_engine("vllm")
DRIFT = dataclasses.replace(VLLM, closed_loop_lockstep=False)
LOCK = dataclasses.replace(VLLM, closed_loop_lockstep=True)


def _pass(decode: float, prompts: float) -> float:
    shape = PassShape(
        decode=decode,
        context=1024 + 512,
        prefill_seqs=prompts,
        prefill_chunk=1024,
        prefill_context=1024,
    )
    return float(np.asarray(STEP.pass_time(shape).time_s).reshape(-1)[0])


def test_light_load_ttft_is_half_a_pass_plus_the_arrivals_pass():
    """Four 1024-token requests, 1024 output tokens, on vLLM drifted apart: λ = X·TPOT ≈ 0.004
    arrivals per pass, so a pass prefills λ / (1 − e^(−λ)) ≈ 1 prompt beside the running
    decodes. With the 8192-token budget holding all four nothing queues (the M/D/1 wait's
    closed-loop factor 1 − k/C is 0), so TTFT = half a decode pass + that pass, each with the
    engine's step overhead."""
    s = steady_state(STEP, DRIFT, Workload(1024, 1024), np.array([4.0]))
    lam = float(s.requests_per_s[0] * s.tpot_s[0])
    m = lam / -math.expm1(-lam)
    assert 1.0 < m < 1.01
    B, ovh = float(s.decode_batch[0]), DRIFT.step_overhead_s
    expect = (_pass(B, 0.0) + ovh) / 2 + _pass(B, m) + ovh
    assert s.ttft_s[0] == pytest.approx(expect, rel=1e-6)


def test_lambda_to_zero_is_one_prompts_pass_and_the_lockstep_cohort_is_four():
    """The λ → 0 end: the drifted TTFT sits within 1% of half a pass + ONE prompt's pass, while
    the lockstep model prefills the four that came back together in one pass (a 4096-token
    prefill: about four times the compute)."""
    w, C = Workload(1024, 1024), np.array([4.0])
    d = steady_state(STEP, DRIFT, w, C)
    lk = steady_state(STEP, LOCK, w, C)
    B, ovh = float(d.decode_batch[0]), DRIFT.step_overhead_s
    one = (_pass(B, 0.0) + ovh) / 2 + _pass(B, 1.0) + ovh
    assert d.ttft_s[0] == pytest.approx(one, rel=0.01)
    four = (_pass(B, 0.0) + ovh) / 2 + _pass(B, 4.0) + ovh
    assert lk.ttft_s[0] == pytest.approx(four, rel=0.01)
    assert lk.ttft_s[0] > 2.5 * d.ttft_s[0]


def test_lambda_large_is_the_budgets_cohort():
    """The λ-large end: 256 requests of two output tokens keep the budget full (λ = X·τ ≫ the
    cohort k), the arrival batch is clipped at k and the drifted steady state is the lockstep
    one to the last bit of the fixed point."""
    w, C = Workload(1024, 2), np.array([256.0])
    d = steady_state(STEP, DRIFT, w, C)
    lk = steady_state(STEP, LOCK, w, C)
    assert float(d.requests_per_s[0] * d.pass_s[0]) > 8.0
    assert d.ttft_s[0] == pytest.approx(lk.ttft_s[0], rel=1e-9)
    assert d.tpot_s[0] == pytest.approx(lk.tpot_s[0], rel=1e-9)


def test_between_the_ends_the_batch_grows_with_the_arrivals():
    """More arrivals per pass, larger passes: the drifted TTFT grows with concurrency and never
    exceeds the lockstep cohort's; the batch itself is monotone in λ (zero-truncated Poisson)."""
    C = np.array([4.0, 16.0, 64.0])
    w = Workload(1024, 256)
    d = steady_state(STEP, DRIFT, w, C)
    lk = steady_state(STEP, LOCK, w, C)
    assert np.all(np.diff(d.ttft_s) > 0)
    assert np.all(d.ttft_s <= lk.ttft_s * (1 + 1e-9))
    lam = np.array([0.01, 0.5, 1.0, 3.0, 10.0])
    assert np.all(np.diff(arrival_batch(lam, 64.0)) > 0)


@pytest.mark.parametrize("work", [Workload(1024, 256, rate=2.0), Workload([512, 1536], [256, 256])])
def test_poisson_rates_and_length_mixes_never_run_in_cohorts(work):
    """Nothing comes back together under a Poisson rate or a length distribution: a mixed
    engine's record flag `closed_loop_lockstep` does not change the answer there."""
    C = np.array([8.0, 32.0])
    d = steady_state(STEP, DRIFT, work, C)
    lk = steady_state(STEP, LOCK, work, C)
    np.testing.assert_array_equal(d.ttft_s, lk.ttft_s)
    np.testing.assert_array_equal(d.tpot_s, lk.tpot_s)


def test_the_shipped_records_vllm_drifts_and_tensorrt_llm_keeps_its_cohorts():
    """vLLM's record sets `closed_loop_lockstep = false` (its busy loop steps whatever arrived,
    record [drift]; its per-request latency is fitted beside it, request_latency_s@vllm), so a
    closed loop of fixed lengths on it is the drifted model; TensorRT-LLM's keeps `true` (record
    [step], measured) and is the lockstep cohort model."""
    vllm, trt = load_engine("vllm"), load_engine("trtllm")
    assert vllm.mixed_prefill_decode and not vllm.closed_loop_lockstep
    assert trt.mixed_prefill_decode and trt.closed_loop_lockstep
    w, C = Workload(1024, 1024), np.array([8.0])
    np.testing.assert_array_equal(
        steady_state(STEP, VLLM, w, C).ttft_s, steady_state(STEP, DRIFT, w, C).ttft_s
    )
    assert not np.array_equal(
        steady_state(STEP, VLLM, w, C).ttft_s, steady_state(STEP, LOCK, w, C).ttft_s
    )
    t = steady_state(STEP, trt, w, C).ttft_s
    trt_drift = dataclasses.replace(trt, closed_loop_lockstep=False)
    assert not np.array_equal(t, steady_state(STEP, trt_drift, w, C).ttft_s)
