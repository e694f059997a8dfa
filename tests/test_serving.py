"""Serving: the continuous-batching steady state, speculative decoding, disaggregation, cost, the
Pareto, the planner and validate's predictor.

Properties are checked against their closed forms: Little's law at the fixed point, the
speculative-decoding expectation, the bill split between input and output tokens, domination for
the Pareto set.
"""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roofline.cli import main
from roofline.errors import SpecError
from roofline.serving.inference import PassShape, Quant, ServePlan
from roofline.serving.predict import predict_measured_run
from roofline.serving.search import Objective, ServeQuery, search
from roofline.serving.steady import (
    Disagg,
    Speculation,
    Workload,
    arrival_batch,
    deployment_metrics,
    disaggregated,
    load_lengths,
    pareto_front,
    speculative_tpot,
    steady_state,
)
from roofline.serving.step import IdealStep
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import PEAK
from roofline.specs.engines import load_engine
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system

LLAMA8 = load_model("llama-3.1-8b")
H100 = load_chip("h100")


ONE = ServePlan(tp=1)


def ideal(plan=ONE, model=LLAMA8):
    return IdealStep(model, H100, plan, Quant(), PEAK)


# ---- workload -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"prompt_tokens": 0},
        {"gen_tokens": [1, 2], "prompt_tokens": [1, 2, 3]},
        {"prefix_hit": 1.0},
        {"concurrency": -1},
        {"prompt_tokens": 4.9e242, "gen_tokens": 4.9e242},
        {"prompt_tokens": float("nan")},
    ],
)
def test_bad_workloads_are_refused(kw):
    with pytest.raises(SpecError):
        Workload(**kw)


def test_length_distribution_context_is_time_weighted(tmp_path):
    f = tmp_path / "lens.csv"
    f.write_text("prompt,output\n100,10\n1000,100\n")
    P, G = load_lengths(str(f))
    w = Workload(P, G)
    # E[G·(P + G/2)] / E[G]: long requests decode longer, so they weigh more
    assert w.decode_context == pytest.approx((10 * 105 + 100 * 1050) / 110)
    with pytest.raises(SpecError):
        bad = tmp_path / "bad.csv"
        bad.write_text("1,2\nx,y\n")
        load_lengths(str(bad))


# ---- steady state -------------------------------------------------------------------------------


def test_littles_law_holds_at_the_fixed_point():
    C = np.array([1.0, 8.0, 64.0, 256.0])
    s = steady_state(ideal(), load_engine("vllm"), Workload(1024, 256), C)
    assert np.all(~s.capped)
    assert s.requests_per_s * (s.steady_ttft_s + 255 * s.tpot_s) == pytest.approx(C, rel=1e-6)


def test_more_concurrency_more_throughput_slower_tokens():
    C = np.array([1.0, 4.0, 16.0, 64.0, 256.0])
    s = steady_state(ideal(), load_engine("trtllm"), Workload(2048, 512), C)
    assert np.all(np.diff(s.output_tokens_per_s) > 0)
    assert np.all(np.diff(s.tpot_s) >= 0)


def test_a_full_kv_cache_queues_requests():
    """Beyond the batch the KV memory holds, extra requests wait: TTFT grows with C, throughput
    saturates (Little's law on the waiting line)."""
    C = np.array([128.0, 256.0, 512.0])
    s = steady_state(ideal(), None, Workload(1024, 1024), C, batch_cap=64.0)
    assert np.all(s.capped) and s.decode_batch == pytest.approx(64.0)
    assert s.output_tokens_per_s[2] == pytest.approx(s.output_tokens_per_s[1], rel=0.02)
    assert s.ttft_s[2] > 1.8 * s.ttft_s[1]


def test_prefill_first_engines_space_out_decode_passes():
    """Under Poisson arrivals SGLang runs prefill batches between decode passes:
    TPOT = decode pass / (1 − prefill share)."""
    w = Workload(4096, 256, rate=1.0)
    s = steady_state(ideal(), load_engine("sglang"), w, np.array([32.0]))
    dec = ideal().pass_time(PassShape(decode=s.decode_batch, context=4096 + 128)).time_s
    assert s.tpot_s == pytest.approx(dec / (1 - s.prefill_share), rel=1e-6)


def test_prefill_first_engines_run_closed_loops_in_waves():
    """A closed loop of fixed lengths on a prefill-first engine whose cohorts stay aligned: the
    32 prompts run in 16 prefill batches of 2 (8192-token budget on an 80 GB chip) before anyone
    decodes, then all 32 decode in lockstep, finish together and come back together (every wave
    is a first wave)."""
    lockstep = dataclasses.replace(load_engine("sglang"), closed_loop_lockstep=True)
    s = steady_state(ideal(), lockstep, Workload(4096, 256), np.array([32.0]))
    t_b = ideal().pass_time(PassShape(prefill_seqs=2, prefill_chunk=4096, prefill_context=4096))
    tau = ideal().pass_time(PassShape(decode=32, context=4096 + 128)).time_s
    assert s.ttft_s == pytest.approx((16 + 1) / 2 * t_b.time_s, rel=1e-9)
    assert s.tpot_s == pytest.approx(tau + (16 - 1) / 2 * t_b.time_s / 255, rel=1e-9)
    assert s.requests_per_s == pytest.approx(32 / (16 * t_b.time_s + 255 * tau), rel=1e-9)


def test_sglang_closed_loops_drift_into_the_staggered_steady_state():
    """SGLang's cohorts drift apart (engine record [drift]): a closed loop of fixed lengths is
    served like staggered arrivals, prefill batches spacing out the decode passes
    (TPOT = decode pass / (1 − prefill share)), and at 1024-token prompts and concurrency 128 the
    mean TTFT is far below the lockstep wave's (8 prefill batches of 16k tokens one after
    another)."""
    sg = load_engine("sglang")
    assert sg.closed_loop_lockstep is False
    assert load_engine("jetstream").closed_loop_lockstep is True
    w, C = Workload(1024, 1024), np.array([128.0])
    s = steady_state(ideal(), sg, w, C)
    dec = ideal().pass_time(PassShape(decode=s.decode_batch, context=1024 + 512)).time_s
    assert s.tpot_s == pytest.approx(dec / (1 - s.prefill_share), rel=1e-6)
    lock = steady_state(ideal(), dataclasses.replace(sg, closed_loop_lockstep=True), w, C)
    assert s.ttft_s < 0.5 * lock.ttft_s
    # never less than half a pass plus the cohort's own prefill
    t_pf = ideal().pass_time(PassShape(prefill_seqs=1, prefill_chunk=1024, prefill_context=1024))
    assert s.ttft_s > t_pf.time_s


def test_a_staggered_prefill_batch_holds_the_arrivals_of_one_pass():
    """A prefill-first engine in the staggered steady state runs a prefill batch only when a
    prompt waits and admits whoever waits then: with λ = X·τ arrivals per pass interval the
    batch holds λ / (1 − e^(−λ)) prompts (zero-truncated Poisson), 2·ln 2 at λ = ln 2, one as
    λ → 0, never more than the budget's cohort."""
    assert arrival_batch(math.log(2.0), 16.0) == pytest.approx(2 * math.log(2.0), rel=1e-12)
    assert arrival_batch(1e-9, 16.0) == pytest.approx(1.0, rel=1e-6)
    assert arrival_batch(50.0, 16.0) == 16.0
    assert arrival_batch(0.0, 16.0) == pytest.approx(1.0)


def test_sglang_light_load_ttft_is_half_a_pass_its_batch_and_the_front_end():
    """Four 1024-token requests in a closed loop on SGLang (an 8192-token budget holds all four,
    so no cohort queues behind another): TTFT = half a decode pass + the prefill of the
    λ / (1 − e^(−λ)) prompts that arrived in one pass interval (λ = X·TPOT) + the per-request
    latency outside the passes (the engine file keeps 0; the profile's fitted value, passed as
    request_latency_s, adds to it)."""
    sg, w, C = load_engine("sglang"), Workload(1024, 1024), np.array([4.0])
    lat = 0.15
    s = steady_state(ideal(), sg, w, C, request_latency_s=lat)
    lam = float(s.requests_per_s[0] * s.tpot_s[0])
    m = lam / (1 - math.exp(-lam))
    assert 1.0 < m < 1.1  # four requests spread over ~1000 passes: nearly always one at a time
    t_pf = ideal().pass_time(PassShape(prefill_seqs=m, prefill_chunk=1024, prefill_context=1024))
    dec = ideal().pass_time(PassShape(decode=s.decode_batch, context=1024 + 512)).time_s
    expect = dec / 2 + t_pf.time_s + sg.request_latency_s + lat
    assert s.ttft_s == pytest.approx(expect, rel=1e-6)
    assert sg.request_latency_s == 0.0 == load_engine("vllm").request_latency_s


def test_a_mixed_engines_first_wave_decodes_beside_its_prefills():
    """All 32 requests arrive together; vLLM (decode-first, one 4096-token prompt per pass on
    an 8192-token budget beside the running decodes) prefills them in 32 passes, the j-th pass
    also decoding the j requests before it: the wave's mean TTFT is (32 + 1)/2 passes at
    (32 − 1)/3 decodes (pass time affine in its decodes). SGLang runs the waiting prompts
    before any decode: (n + 1)/2 passes with nothing beside them."""
    vl, w, C = load_engine("vllm"), Workload(4096, 256), np.array([32.0])
    s = steady_state(ideal(), vl, w, C)
    shape = dict(prefill_seqs=1, prefill_chunk=4096, prefill_context=4096)
    t_j = ideal().pass_time(PassShape(decode=31 / 3, context=4096, **shape)).time_s
    assert s.first_wave_ttft_s == pytest.approx(33 / 2 * (t_j + vl.step_overhead_s), rel=1e-9)
    t_0 = ideal().pass_time(PassShape(**shape)).time_s
    assert s.first_wave_ttft_s > 33 / 2 * (t_0 + vl.step_overhead_s)
    sg = load_engine("sglang")  # 4096-token prompts: two per 8192-token prefill batch
    g = steady_state(ideal(), sg, w, C)
    t_b = ideal().pass_time(PassShape(prefill_seqs=2, prefill_chunk=4096, prefill_context=4096))
    # plus the engine's per-request latency outside the passes (engine record [front])
    lat = sg.request_latency_s
    assert g.first_wave_ttft_s == pytest.approx((16 + 1) / 2 * t_b.time_s + lat, rel=1e-9)


def test_prefix_cache_hits_cut_ttft():
    """One request alone: a 75% hit computes a quarter of the prompt (over the full context)."""
    a = steady_state(ideal(), load_engine("vllm"), Workload(8192, 128), np.array([1.0]))
    b = steady_state(
        ideal(), load_engine("vllm"), Workload(8192, 128, prefix_hit=0.75), np.array([1.0])
    )
    assert b.ttft_s < 0.5 * a.ttft_s


# ---- speculative decoding ----------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(g=st.integers(1, 8), a=st.floats(0.0, 0.99))
def test_tokens_per_verify_is_the_geometric_sum(g, a):
    s = Speculation(draft_tokens=g, acceptance=a)
    assert s.tokens_per_verify == pytest.approx(sum(a**i for i in range(g + 1)))
    assert 1.0 <= s.tokens_per_verify <= g + 1


def test_speculation_speeds_up_memory_bound_decode():
    spec = Speculation(draft_tokens=4, acceptance=0.8, draft_cost=0.05)
    r = speculative_tpot(ideal(), spec, np.array([1.0, 256.0]), 2048)
    assert r["speedup"][0] > 2.0  # batch 1: the verify pass costs about one decode pass
    assert r["speedup"][1] < r["speedup"][0]  # a big batch is nearer compute-bound
    assert Speculation(4, 0.0).tokens_per_verify == 1.0


# ---- disaggregation, cost, Pareto -------------------------------------------------------------


def test_disaggregated_ttft_carries_the_kv_transfer():
    w = Workload(4096, 256)
    kv = 2 * 32 * 8 * 128 * 2  # bf16 bytes per token of LLaMA-3.1 8B
    fast = disaggregated(ideal(), ideal(), Disagg(1, 1, 400e9, 0.0, kv), w, np.array([8.0]))
    slow = disaggregated(ideal(), ideal(), Disagg(1, 1, 4e9, 0.0, kv), w, np.array([8.0]))
    assert slow["kv_transfer_s"] == pytest.approx(4096 * kv / 4e9)
    # the transfer and the wait for the link it loads (tests/test_disagg_queueing.py)
    assert slow["ttft_s"] - fast["ttft_s"] == pytest.approx(
        slow["kv_transfer_s"] + slow["link_wait_s"] - fast["kv_transfer_s"] - fast["link_wait_s"],
        rel=0.05,
    )
    assert fast["prefill_decode_ratio"] > 0


def test_a_prefill_server_running_several_prompts_a_pass_is_busy_for_their_share():
    """A prefill pass of `per` prompts (one per attention-DP rank) takes t_pf and finishes `per`
    prompts: at X prompts/s the pool is busy X·t_pf/per server-seconds a second, not X·t_pf."""
    kv = 2 * 32 * 8 * 128 * 2
    w, C = Workload(1024, 256), np.array([4.0])
    r = disaggregated(ideal(), ideal(), Disagg(2, 1, 400e9, 0.0, kv, prefill_batch=4), w, C)
    busy = r["requests_per_s"] * r["prefill_s"] / 4
    assert r["prefill_utilisation"] == pytest.approx(busy / 2, rel=1e-12)
    n_dec = r["requests_per_s"] * 255 * r["tpot_s"] / r["decode_batch"]
    assert r["prefill_decode_ratio"] == pytest.approx(busy / n_dec, rel=1e-12)


def test_a_chunking_prefill_worker_shares_its_token_budget_among_its_prompts():
    """SGLang's chunked_prefill_size (16384 on a >= 160 GB GPU) is the replica's, so a prefill
    worker of 8 attention-DP ranks, one 8192-token prompt on each, runs every prompt as four
    2048-token chunks; TensorRT-LLM (no chunked prefill) runs it whole; a prompt that fits the
    budget is one pass. The disaggregated prefill time is the chunks' passes end to end."""
    from roofline.serving.steady import _cohort_pass, prefill_chunks

    gb200 = load_chip("gb200")
    pre = IdealStep(LLAMA8, gb200, ServePlan(dp=8), Quant(), PEAK)
    sg, trt = load_engine("sglang"), load_engine("trtllm")
    assert prefill_chunks(pre, sg, 8.0, 8192.0) == (4.0, 2048.0)
    assert prefill_chunks(pre, sg, 8.0, 1024.0) == (1.0, 1024.0)
    assert prefill_chunks(pre, trt, 8.0, 8192.0) == (1.0, 8192.0)
    assert prefill_chunks(pre, None, 8.0, 8192.0) == (1.0, 8192.0)
    kv = 2 * 32 * 8 * 128 * 2
    d = Disagg(1, 1, 400e9, 0.0, kv, prefill_batch=8)
    r = disaggregated(pre, pre, d, Workload(8192, 64), np.array([8.0]), engine=sg)
    one = _cohort_pass(pre, 0.0, 8192 + 32, 8.0, 2048.0, 8192.0, 8192.0)
    assert r["prefill_s"] == pytest.approx(4 * float(np.ravel(one)[0]), rel=1e-12)


def test_the_bill_splits_between_input_and_output_tokens():
    w = Workload(2048, 256)
    s = steady_state(ideal(ServePlan(tp=2)), load_engine("vllm"), w, np.array([16.0, 128.0]))
    m = deployment_metrics(s, w, 2, 3, 10.8)
    bill = 10.8 * 6 / 3600
    paid = (m.usd_per_million_input_tokens * m.input_tokens_per_s) / 1e6 + (
        m.usd_per_million_output_tokens * m.output_tokens_per_s
    ) / 1e6
    assert paid == pytest.approx(bill)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 100), st.floats(0.1, 100)), min_size=1, max_size=40))
def test_pareto_front_is_exactly_the_undominated_points(pts):
    u = np.array([p[0] for p in pts])
    c = np.array([p[1] for p in pts])
    front = set(pareto_front(u, c).tolist())
    for i in range(len(pts)):
        dominated = any(
            (u[j] >= u[i] and c[j] >= c[i]) and (u[j] > u[i] or c[j] > c[i])
            for j in range(len(pts))
        )
        if dominated:
            assert i not in front
    # every undominated value pair is represented
    kept = {(u[i], c[i]) for i in front}
    for i in range(len(pts)):
        if not any(
            (u[j] >= u[i] and c[j] >= c[i]) and (u[j] > u[i] or c[j] > c[i])
            for j in range(len(pts))
        ):
            assert (u[i], c[i]) in kept


# ---- the planner --------------------------------------------------------------------------------


def test_search_names_its_rejections_and_keeps_them_out():
    q = ServeQuery(
        load_model("llama-3-70b"),
        parse_system("h100:16"),
        Workload(1024, 256, concurrency=64),
        quants=(Quant(), Quant("fp8", "fp8", "fp8")),
        engine=load_engine("vllm"),
        slo_tpot_s=0.05,
        objective=Objective.COST,
    )
    r = search(q)
    rej = r.rejections()
    assert "does not fit HBM" in rej and "misses the TPOT target" in rej
    best = r.row(r.best)
    assert best["reason"] == "" and best["tpot_s"] <= 0.05
    assert best["deploy_chips"] <= 16
    for i in r.order:
        assert r.evaluated.reason[i] == ""


def test_serve_search_cli_json(tmp_path, capsys):
    png = tmp_path / "p.png"
    argv = [
        "serve",
        "--model",
        "llama-3.1-8b",
        "--system",
        "h100:8",
        "--concurrency",
        "32",
        "--slo-ttft",
        "2s",
        "--json",
        "--plot",
        str(png),
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in (
        "plan",
        "ttft_s",
        "tpot_s",
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_chip",
        "tokens_per_s_per_user",
        "max_batch",
        "kv_cache_bytes_per_token",
        "memory_per_chip_bytes",
        "bound",
        "usd_per_million_output_tokens",
        "usd_per_million_input_tokens",
        "pareto",
        "candidates_evaluated",
    ):
        assert key in doc, key
    assert doc["ttft_s"] <= 2 and png.stat().st_size > 1000
    assert "TPOT (first token excluded)" in doc["inputs"]["definitions"]


def test_the_disaggregated_view_sizes_its_prefill_pool_to_the_balance(capsys):
    """The best plan run disaggregated gets as many prefill replicas per decode replica as the
    balancing ratio asks: its prefill pool keeps up, so its TTFT is a prefill pass, the KV
    transfer and a bounded wait (a 1:1 layout whose prefill pool saturates reports a queue)."""
    assert main(["serve", "--model", "llama-3-70b", "--system", "tpu-v5e:16x16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    dg = doc["disaggregated"]
    ratio = dg["prefill_decode_ratio"]
    assert ratio > 1  # prefill-heavy here, so the pool size below is not vacuous
    assert dg["prefill_replicas"] == math.ceil(ratio) and dg["decode_replicas"] == 1
    assert dg["kv_transfer_s"] < dg["ttft_s"] < doc["ttft_s"] / 5


def test_serve_cli_errors_are_one_paragraph(capsys):
    assert main(["serve", "--plan", "tp=8", "--batch", "8"]) == 2
    assert "needs --plan, --batch and --context" in capsys.readouterr().err
    assert main(["serve", "--slo-tpot", "fast"]) == 2


# ---- validate's predictor ----------------------------------------------------------------------


def run(mode="aggregated", **kw):
    par = SimpleNamespace(
        tp=2, pp=1, dp=1, ep=1, moe_tp=1, workers=1, batch=None, gpus_per_worker=2
    )
    base = dict(
        id="synthetic",
        engine="vllm",
        model=LLAMA8,
        chip=H100,
        chips=2,
        disaggregated=mode == "disaggregated",
        parallel=par,
        prefill=par,
        decode=par,
        precision=SimpleNamespace(
            weights="fp8", moe_weights="fp8", activations="fp8", kv_cache="bf16"
        ),
        workload=SimpleNamespace(
            mode=mode, isl=1024, osl=256, concurrency=16, request_rate_rps=2.0, batch=8
        ),
        defaults=("KV-cache precision unstated",),
    )
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.mark.parametrize(
    "mode", ["aggregated", "disaggregated", "offline", "online-rate", "fixed-batch"]
)
def test_predictor_covers_every_mode(mode):
    p = predict_measured_run(run(mode), efficiency=PEAK)
    assert p["output_tokens_per_s"] > 0
    if mode != "offline":
        assert p["tpot_s"] > 0 and p["ttft_s"] > 0


def test_predictor_uses_the_engines_kv_default():
    """A ModelOpt FP8 checkpoint runs an FP8 KV cache when the run does not say otherwise."""
    p = predict_measured_run(run(), efficiency=PEAK)
    assert any("kv=fp8" in n for n in p["notes"])


def test_predictor_refuses_unknown_lengths():
    with pytest.raises(SpecError):
        predict_measured_run(
            run(
                workload=SimpleNamespace(
                    mode="aggregated",
                    isl=None,
                    osl=None,
                    concurrency=4,
                    request_rate_rps=None,
                    batch=None,
                )
            ),
            efficiency=PEAK,
        )


def test_narrow_weightscompute_on_in_bf16_where_the_chip_lacks_the_units():
    """fp4 weights on Hopper run weight-only (W4A16) kernels: the GEMMs compute in bf16; on
    Blackwell they compute in fp4; fp8 computes in fp8 on Hopper and bf16 on Ampere."""
    from roofline.serving.step import compute_on

    assert compute_on("nvfp4", H100) == "bf16"
    assert compute_on("nvfp4", load_chip("b200")) == "fp4"
    assert compute_on("fp8", H100) == "fp8"
    assert compute_on("fp8", load_chip("a100")) == "bf16"
    assert compute_on("int4", H100) == "bf16"


@pytest.mark.parametrize(
    "extra",
    [
        ["--plan", "tp=8", "--batch", "1", "--context", "5.9e152"],  # the fuzz tier's finding
        ["--plan", "tp=8", "--batch", "1e40", "--context", "8192"],
        ["--plan", "tp=8", "--batch", "1", "--context", "8192", "--prompt", "1e12"],
        ["--concurrency", "1e300"],
        ["--rate", "0"],
        ["--gen", "0"],
    ],
)
def test_every_serve_size_is_bounded_by_one_rule(extra, capsys):
    """Tokens, sequences and requests are at most 2^30 (and at least 1, or above 0 for loads):
    one paragraph naming the flag and the rule, never a NaN or an inf in a report."""
    assert main(["serve", "--model", "tiny-llama", "--chip", "h100", *extra]) == 2
    err = capsys.readouterr().err
    assert "2^30" in err or "whole number up to 1,073,741,824" in err
    assert "nan" not in err.lower().split("rule")[0]


@pytest.mark.parametrize("conc", [64.0, 100.0])
def test_the_cheapest_plan_is_on_its_pareto_front_at_the_load_it_serves(conc):
    """h4's report finding: the chosen plan sat below the front and showed a batch (the most a
    replica was sized for) that was not the load. Cost is now the whole bill per output token
    (equal chip prices: the most tokens/s per chip, which nothing on the front beats) and
    `batch` is the requests in flight per replica (concurrency / replicas)."""
    q = ServeQuery(
        load_model("llama-3-70b"),
        parse_system("h100:16"),
        Workload(1024, 256, concurrency=conc),
        quants=(Quant(), Quant("fp8", "fp8", "fp8")),
        engine=load_engine("vllm"),
        objective=Objective.COST,
    )
    res = search(q)
    b = res.row(res.best)
    front = [res.row(int(i)) for i in res.pareto]
    assert not any(
        p["tokens_per_s_per_chip"] > b["tokens_per_s_per_chip"]
        and p["tokens_per_s_per_user"] > b["tokens_per_s_per_user"]
        for p in front
    )
    assert max(p["tokens_per_s_per_chip"] for p in front) == pytest.approx(
        b["tokens_per_s_per_chip"]
    )
    assert b["batch"] * b["replicas"] == pytest.approx(conc)
    assert b["batch"] <= b["batch_cap"]


def test_decode_first_budgets_chunk_a_prompt_as_long_as_the_budget():
    """vLLM schedules the running decodes first (one token each of the 8192-token budget), so an
    8192-token prompt arriving while others decode is prefilled over two passes: TTFT rises by
    about a pass over the prompt alone; a lone request (nobody decoding) takes one pass."""
    eng = load_engine("vllm")
    one = steady_state(ideal(), eng, Workload(8192, 256), np.array([1.0]))
    busy = steady_state(ideal(), eng, Workload(8192, 256), np.array([16.0]))
    solo = ideal().pass_time(PassShape(prefill_seqs=1, prefill_chunk=8192, prefill_context=8192))
    assert one.ttft_s == pytest.approx(solo.time_s + one.pass_s / 2, rel=0.02)
    assert busy.ttft_s > one.ttft_s + busy.pass_s


def test_the_chunks_of_a_chunked_prompt_sum_to_the_prompt():
    """Issue 18: an 8192-token prompt beside 16 decodes is two chunks that sum to 8192 tokens
    (the budget's 8192 − 16 first, the rest next), not two passes of 8176 tokens each. Priced as
    two equal chunks at the mean of their end positions, the prefill work is exactly the two real
    halves' (attention is affine in the keys at a fixed chunk), and the TTFT is the lone prompt's
    prefill plus at most about three passes (half a pass waiting, the second chunk's pass, the
    decodes riding along), where pricing each chunk as the whole prompt gave twice the prefill."""
    from roofline.serving.steady import _cohort_pass

    step = ideal()
    halves = [
        step.pass_time(PassShape(prefill_seqs=1, prefill_chunk=4096, prefill_context=c)).time_s
        for c in (4096, 8192)
    ]
    mean_pass = _cohort_pass(step, 0.0, 8192.0, 1.0, 4096.0, 8192.0, 8192.0)
    assert 2 * mean_pass == pytest.approx(sum(halves), rel=1e-9)
    busy = steady_state(step, load_engine("vllm"), Workload(8192, 256), np.array([16.0]))
    solo = step.pass_time(PassShape(prefill_seqs=1, prefill_chunk=8192, prefill_context=8192))
    assert solo.time_s < float(busy.ttft_s[0]) < solo.time_s + 3 * float(busy.pass_s[0])


def test_a_disaggregated_first_wave_queues_for_the_prefill_pool():
    """All C requests of a benchmark start together: the first wave queues for the prefill pool's
    passes (one prompt per pass here), and its share of the requests weighs into the mean TTFT."""
    kv = 2 * 32 * 8 * 128 * 2  # bf16 bytes per token of LLaMA-3.1 8B
    d = Disagg(1, 1, 400e9, 0.0, kv)
    C = np.array([16.0])
    base = disaggregated(ideal(), ideal(), d, Workload(1024, 256), C)
    wave = disaggregated(ideal(), ideal(), d, Workload(1024, 256, first_wave_share=0.1), C)
    xfer = 1024 * kv / 400e9
    first = (16 + 1) / 2 * base["prefill_s"] + xfer
    assert wave["ttft_s"] == pytest.approx(0.9 * base["ttft_s"] + 0.1 * first, rel=1e-9)


def test_a_run_that_ran_fits():
    """Issue 18 item 6: DeepSeek-V3 FP8 on a 4-GB200 DP-attention worker (weights ~182 GB of
    the 198.7 GB = 189471 MiB CUDA sees per chip) ran under SGLang, whose default 0.88 fraction
    of the HBM leaves nothing for the KV cache: the run's flags gave it a larger fraction, so its
    pool is what the HBM leaves after the weights and the workspace. A replica whose weights
    exceed the HBM is still refused."""
    from roofline.serving.inference import memory_per_chip
    from roofline.serving.predict import replica_capacity
    from roofline.serving.step import ShardedStep

    ds, gb200 = load_model("deepseek-v3"), parse_system("gb200:4")
    q = Quant(weights="fp8", kv="fp8", compute="fp8", experts="fp8")
    sg = load_engine("sglang")
    plan = ServePlan(tp=1, dp=4, ep=4)
    step = ShardedStep(ds, [gb200], [plan], q, PEAK)
    m = memory_per_chip(ds, plan, q, 1, 2048, workspace_tokens=8192)
    hbm = gb200.chip.fit_hbm_bytes
    assert sg.kv_memory_bytes(hbm, m.weights_bytes, m.activation_bytes) < 0
    left = hbm - float(m.weights_bytes) - float(m.activation_bytes)
    want = math.floor(left / float(np.ravel(m.kv_bytes)[0])) * 4
    assert replica_capacity(step, sg, 2048) == want > 0
    h200 = ShardedStep(ds, [parse_system("h200:4")], [plan], q, PEAK)
    with pytest.raises(SpecError, match="weights and workspace need"):
        replica_capacity(h200, sg, 2048)


def test_the_kv_pool_is_the_engines_fraction_of_what_cuda_reports():
    """Issue 18 item 6: vLLM sizes its KV pool as gpu_memory_utilization x the total
    torch.cuda.mem_get_info reports (SGLang and TensorRT-LLM likewise from the device's
    total), so an H200 holds 0.9 x (143771 MiB less the runtime's own memory: the driver's
    reservation, and NCCL's at tp 2) less the weights and the workspace, not 0.9 x the marketed
    141 GB: the capacity in closed form, larger than the marketed one's."""
    from roofline.serving.inference import memory_per_chip
    from roofline.serving.predict import replica_capacity
    from roofline.serving.search import memory_arrays
    from roofline.serving.step import ShardedStep

    m70, h200 = load_model("llama-3-70b"), parse_system("h200:2")
    assert (h200.chip.hbm_bytes, h200.chip.fit_hbm_bytes) == (141e9, 143771 * 2**20)
    q, plan, ctx = Quant("bf16", "bf16", "bf16"), ServePlan(tp=2), 9216
    vllm = load_engine("vllm")
    assert vllm.memory_fraction_of == "total"
    m = memory_per_chip(m70, plan, q, 1, ctx, workspace_tokens=8192)
    held, per_seq = float(m.weights_bytes) + float(m.activation_bytes), float(m.kv_bytes)

    runtime = vllm.runtime_memory_bytes + vllm.collective_memory_bytes  # tp 2: NCCL's too
    assert 0 < runtime < 2e9

    def seqs(total):
        return math.floor((vllm.memory_fraction * (total - runtime) - held) / per_seq)

    step = ShardedStep(m70, [h200], [plan], q, PEAK)
    assert replica_capacity(step, vllm, ctx) == seqs(143771 * 2**20) > seqs(141e9) > 0
    # the search's memory columns read the same bytes (no workspace there: weights only)
    work = Workload(prompt_tokens=8192, gen_tokens=1024, concurrency=128)
    query = ServeQuery(m70, h200, work, quants=(q,), batches=(128,), engine=vllm)
    from roofline.serving.search import candidates

    c = candidates(query)
    sel = np.flatnonzero((c.tp == 2) & (c.chips == 2) & (c.pp == 1))[:1]
    mem = memory_arrays(query, c, 0, sel)
    want = vllm.memory_fraction * (143771 * 2**20 - runtime) - float(mem["weights"][0])
    assert float(mem["usable"][0]) == pytest.approx(want, rel=1e-12)


def test_the_one_step_mode_pays_the_engines_host_time(capsys):
    """Issue 18 item 8: `serve --plan --batch --context --engine E` prices the step as E's steady
    state does — its exposed host time per pass (TensorRT-LLM: overlap scheduler, and its
    per-sequence host time for each of the batch's sequences) plus eager launches beyond its
    largest CUDA graph (512-batch graphs; 1024 sequences run eagerly)."""

    def step(engine: str, batch: int) -> dict:
        argv = ["serve", "--model", "llama-3-70b", "--system", "h200:8", "--plan", "tp=8"]
        argv += ["--batch", str(batch), "--context", "2048", "--engine", engine, "--json"]
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)

    trt = load_engine("trtllm")
    llama = load_model("llama-3-70b")
    for batch, eager in ((256, 0.0), (1024, trt.eager_launch_s_per_layer * llama.n_layers)):
        a, b = step("trtllm", batch), step("none", batch)
        want = trt.step_overhead_s + trt.seq_overhead_s * batch + eager
        assert a["engine_overhead_s"] == pytest.approx(want, abs=1e-12)
        assert a["step_time_s"] - b["step_time_s"] == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert a["engine"] == "trtllm" and b["engine_overhead_s"] == 0.0
    v = step("vllm", 256)
    assert v["engine_overhead_s"] == pytest.approx(load_engine("vllm").step_overhead_s)


def test_the_default_blackwell_search_tries_nvfp4_and_pins_fill_consistently():
    """Issue 18 item 7: NVFP4 checkpoints (nvfp4 weights, FP8 KV, FP4 math) are in the default
    search where the chip has FP4 units, not on Hopper; pinning only the weights makes the
    compute follow them where the chip computes that format (else bf16, weight-only) and the
    KV cache the engine's default for those weights."""
    from roofline.serving.search import default_quants

    b200, trt = load_chip("b200"), load_engine("trtllm")
    assert Quant("nvfp4", "fp8", "nvfp4") in default_quants(b200)
    assert all("fp4" not in q.weights for q in default_quants(H100))
    (q,) = default_quants(b200, trt, weights="nvfp4")
    assert (q.weights, q.kv, q.compute) == ("nvfp4", "fp8", "fp4")
    (q,) = default_quants(H100, trt, weights="nvfp4")
    assert q.compute == "bf16"  # Hopper has no FP4 units: W4A16
    (q,) = default_quants(b200, None, weights="fp8", compute="bf16")
    assert (q.kv, q.compute) == ("bf16", "bf16")  # what is pinned stays pinned


def test_the_cost_objective_ranks_the_bill_column_it_shows(capsys):
    """Issue 18 item 7: under --objective cost the rows are ranked by the whole bill per output
    token, and that is the table's $ column (the output/input split rewarded long prefills)."""
    argv = ["serve", "--model", "deepseek-v3", "--system", "b200:8", "--prompt", "1024"]
    argv += ["--gen", "256", "--concurrency", "256", "--weight-dtype", "nvfp4", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    bills = [r["usd_bill_per_million_output_tokens"] for r in doc["top"]]
    assert bills == sorted(bills) and len(bills) >= 3
    price = load_chip("b200").usd_per_hour
    b = doc["best"]
    want = price * b["deploy_chips"] / 3600 / b["tokens_per_s"] * 1e6
    assert b["usd_bill_per_million_output_tokens"] == pytest.approx(want, rel=1e-9)
    split = b["usd_per_million_output_tokens"] + b["usd_per_million_input_tokens"] * 4
    assert split == pytest.approx(want, rel=1e-9)  # the split still sums to the bill
    assert doc["best"]["quant"]["compute"] == "fp4"


def test_the_readme_search_example_is_the_tools_output(capsys):
    """README's `roofline serve` search block is this command's best-plan section, verbatim."""
    from pathlib import Path

    cmd = "serve --model llama-3-70b --system h100:64 --prompt 1024 --gen 256 --concurrency 256"
    cmd += " --slo-ttft 2s --slo-tpot 50ms"
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split(f"$ roofline {cmd}\n", 1)[1].split("```", 1)[0]
    assert main(cmd.split()) == 0
    out = capsys.readouterr().out
    shown = block.strip().removesuffix("...").strip()  # a closing "..." elides the rest
    assert shown and shown in out
