"""Inference/serving files: schema detection, typed records, skip rules, per-metric scoring."""

from __future__ import annotations

import copy

import pytest

from roofline.validate import load_runs, validate
from roofline.validate.runfile import Schema, entry_schema
from roofline.validate.serving_runs import Metric, map_serving_run
from roofline.validate.serving_score import ServingPrediction


def test_schemas_are_detected_from_content(serving_file):
    assert load_runs("training").schema == Schema.TRAINING
    assert load_runs("inference").schema == Schema.INFERENCE
    assert serving_file.schema == Schema.SERVING


def test_aggregated_aic_entry(serving_entries):
    rid = next(i for i, e in serving_entries.items() if "llama-3.1-70b" == e["model"]["family"])
    r = map_serving_run(serving_entries[rid], "serving")
    assert r.mapped and r.model is not None and r.model.n_layers == 80
    assert (
        r.parallel is not None
        and r.parallel.tp * r.parallel.pp * r.parallel.dp * r.parallel.workers == r.chips
    )
    assert r.workload.isl and r.workload.osl and r.workload.concurrency
    e = serving_entries[rid]["measured"]
    assert r.measured.ttft_s == pytest.approx(e["ttft_ms"] / 1000)
    assert r.measured.tpot_s == pytest.approx(e["tpot_ms"] / 1000)
    assert r.measured.output_tokens_per_s is None  # AIC's throughput is derived, not measured


def test_disaggregated_entry_keeps_both_roles(serving_entries):
    rid = next(
        i
        for i, e in serving_entries.items()
        if e["workload"]["mode"] == "disaggregated" and e["hardware"]["chip_family"] == "H200"
    )
    r = map_serving_run(serving_entries[rid], "serving")
    assert r.disaggregated and r.prefill is not None and r.decode is not None and r.parallel is None
    p = serving_entries[rid]["parallelism"]
    assert (r.decode.workers, r.decode.tp) == (p["decode"]["workers"], p["decode"]["tp"])


def test_mla_moe_model_is_built(serving_entries):
    rid = next(i for i, e in serving_entries.items() if e["model"]["family"] == "deepseek-v3")
    r = map_serving_run(serving_entries[rid], "serving")
    assert r.model.mla is not None and r.model.moe is not None and r.model.moe.n_experts == 256
    assert any("MTP" in d for d in r.defaults)


@pytest.mark.parametrize("family,feature", [("qwen3.5-397b-a17b", "linear"), ("glm-5", "dsa")])
def test_hybrid_and_sparse_attention_map_through_the_catalog_model(
    serving_entries, family, feature
):
    rid = next(i for i, e in serving_entries.items() if e["model"]["family"] == family)
    r = map_serving_run(serving_entries[rid], "serving")
    assert r.mapped and getattr(r.model, feature) is not None
    assert any("from catalog model" in d for d in r.defaults)


@pytest.mark.parametrize(
    "family,change,reason",
    [
        ("qwen3.5-397b-a17b", {"layers": 64}, "n_layers differ from catalog model"),
        ("glm-5", {"name": "GLM-9", "checkpoint": "zai-org/GLM-9"}, "no catalog model gives"),
        (
            "glm-5",
            {"attention": "MLA + DSA sparse attention (index_topk 1024)"},
            "index_topk (1024",
        ),
        ("qwen3.5-397b-a17b", {"attention": "hybrid: Mamba layers"}, "Mamba layers are not"),
    ],
)
def test_attention_the_catalog_cannot_vouch_for_is_skipped(serving_entries, family, change, reason):
    e = copy.deepcopy(next(e for e in serving_entries.values() if e["model"]["family"] == family))
    e["model"].update(change)
    assert reason in map_serving_run(e, "serving").skipped_reason


def test_suspect_quality_is_skipped(serving_entries):
    e = copy.deepcopy(next(iter(serving_entries.values())))
    e["quality"], e["flags"] = "suspect", ["tp_not_divisor_of_heads"]
    assert "suspect" in map_serving_run(e, "serving").skipped_reason


def test_inference_file_conversions():
    runs = {e["id"]: map_serving_run(e, "inference") for e in load_runs("inference").entries}
    nim = runs["nim180-h100x2-fp8-tp2-llama3.3-70b-5000-500-c25"]
    assert nim.measured.tpot_s == pytest.approx(
        0.03875
    ) and nim.measured.output_tokens_per_s == pytest.approx(623.4)
    lat = runs["vllm-ci9523-a100-latency_llama8B_tp1"]
    assert lat.measured.output_tokens_per_s == pytest.approx(8 * 128 / 1.57927)
    share = runs["sglang060bench-vllm-a100-tp1-8b-rps4"]
    assert "ShareGPT" in share.skipped_reason or "lengths not given" in share.skipped_reason
    assert share.measured.tpot_s == pytest.approx(0.01414)  # median_tpot, not the 129 ms chunk ITL


def test_metrics_are_scored_separately(serving_file):
    """A predictor +50% on TTFT and −50% on TPOT: the two errors must not cancel anywhere."""

    def fake(run, *, efficiency):
        m = run.measured
        return ServingPrediction(
            ttft_s=m.ttft_s * 1.5 if m.ttft_s else None,
            tpot_s=m.tpot_s * 0.5 if m.tpot_s else None,
            output_tokens_per_s=m.output_tokens_per_s,
        )

    rf = serving_file
    small = type(rf)(rf.path, rf.schema, rf.entries[:40])
    s = validate(small, predictor=fake).to_dict()["summary"]
    assert s["ttft"]["bias"] == pytest.approx(0.5) and s["tpot"]["bias"] == pytest.approx(-0.5)
    assert s["ttft"]["median_abs_error"] == pytest.approx(0.5) and s["ttft"]["n"] > 0
    assert s["throughput"]["n"] == 0  # AIC measures no throughput


def test_serving_plot_has_one_panel_per_metric(serving_file, tmp_path):
    from roofline.validate.plot import plot_serving

    def fake(run, *, efficiency):
        m = run.measured
        return {
            "ttft_s": m.ttft_s and m.ttft_s * 1.1,
            "tpot_s": m.tpot_s,
            "output_tokens_per_s": None,
        }

    small = type(serving_file)(serving_file.path, serving_file.schema, serving_file.entries[:30])
    out = plot_serving(validate(small, predictor=fake), tmp_path / "s.png")
    assert out.stat().st_size > 10_000


def test_entry_schema_of_non_mappings():
    assert entry_schema(3) is None and entry_schema({"id": "x"}) == Schema.TRAINING
    assert Metric("tpot") is Metric.TPOT


def test_the_first_wave_weight_is_the_benchmark_clients():
    """GenAI-Perf (NIM's runs) reports a stable steady-state window: no first wave; the
    AIConfigurator sample assumes 10×concurrency requests: 1/10; a client not named: 1/10.
    The weight moves TTFT only (the closed loop's throughput and TPOT do not read it)."""
    from roofline.serving.predict import first_wave_share, predict_measured_run

    inf = {e["id"]: map_serving_run(e, "inference") for e in load_runs("inference").entries}
    nim = inf["nim180-h100x2-fp8-tp2-llama3.3-70b-5000-500-c50"]
    aic = map_serving_run(load_runs("serving").entries[0], "serving")
    assert nim.workload.harness == "genai-perf" and first_wave_share(nim) == 0.0
    assert aic.workload.harness == "aiconfigurator" and first_wave_share(aic) == 0.1
    bare = copy.deepcopy(load_runs("inference").entries[-10])
    bare["workload"]["mode"] = "fixed concurrency (closed loop)"
    assert first_wave_share(map_serving_run(bare, "inference")) == 0.1
    steady = predict_measured_run(nim)
    assert "first-wave share 0 (genai-perf)" in steady["notes"]
    burst = dict(nim.workload.__dict__, harness="")
    from dataclasses import replace as _r

    with_wave = predict_measured_run(_r(nim, workload=type(nim.workload)(**burst)))
    assert with_wave["ttft_s"] > 1.5 * steady["ttft_s"]  # c=50: the burst doubles the mean
    assert with_wave["tpot_s"] == pytest.approx(steady["tpot_s"])


def test_checkpoint_notes_set_the_dense_weights(serving_entries):
    """gpt-oss stores MXFP4 experts beside BF16 attention and Kimi-K2.5 INT4 experts beside BF16
    attention: the entries' GEMM labels (nvfp4, int4_wo) are the benchmark's, the engines load the
    dense layers as stored (issue 18 item 5), and those GEMMs run in bf16 on every chip."""
    from roofline.serving.step import gemm_format
    from roofline.specs.chip import load_chip

    oss = "aic-2026_04_06_gpt_oss_120b_h200_sxm_trtllm_fp4_agg_1024x8192_c32_tp2_ep1_168"
    r = map_serving_run(serving_entries[oss], "serving")
    assert (r.precision.weights, r.precision.moe_weights) == ("bf16", "mxfp4")
    kimi = next(e for i, e in serving_entries.items() if "kimi" in i and "int4" in i)
    k = map_serving_run(kimi, "serving")
    assert (k.precision.weights, k.precision.moe_weights) == ("bf16", "int4")
    b200 = load_chip("b200")
    assert gemm_format("bf16", "nvfp4", b200) == "bf16"  # 16-bit weights: not requantised
    assert gemm_format("nvfp4", "nvfp4", b200) == "fp4"
    assert gemm_format("mxfp4", "nvfp4", load_chip("h200")) == "bf16"  # W4A16 on Hopper
    # a Hopper run labelled fp8 keeps fp8 math for its MXFP4 experts: TensorRT-LLM's TRITON MoE
    # backend on H200 runs MXFP8 activations x MXFP4 weights (NVIDIA/TensorRT-LLM pull request
    # #10283, deployment-guide-for-gpt-oss-on-trtllm.md), where its older gpt_oss README said bf16
    assert gemm_format("mxfp4", "fp8", load_chip("h100")) == "fp8"


def test_a_tp_field_multiplied_by_ep_is_read_from_the_id_label(serving_entries):
    """`..._tp2_ep2_...` exported with tp 4 = 2·2, moe_tp 2, ep 2 on 4 GPUs: the artefact the
    file header names for gpus_per_worker_gt_node, below the node size. The launch the label
    names is tp 2 with the experts over ep 2 of the same 2 GPUs; the TPOT the sweep measured
    is its tp2 twins' (5.90 / 6.84 / 8.70 / 11.08 / 14.12 ms vs 5.85 / 6.83 / 8.90 / 11.37 /
    14.07 ms at C 4 ... 64), not a 4-GPU deployment's. A label the fields agree with (Kimi's
    tp4_ep4 = tp 4, ep 4) and an entry without one are kept as stated."""
    oss = "aic-2026_04_06_gpt_oss_120b_h200_sxm_trtllm_fp4_agg_1024x1024_c64_tp2_ep2_993"
    e = serving_entries[oss]
    assert (e["parallelism"]["tp"], e["hardware"]["chips"]) == (4, 4)
    r = map_serving_run(e, "serving")
    assert r.mapped and r.chips == 2
    assert (r.parallel.tp, r.parallel.ep, r.parallel.moe_tp) == (2, 2, 1)
    assert any("dump artefact" in n for n in r.defaults)
    kimi = next(e for i, e in serving_entries.items() if "kimi" in i and "_tp4_ep4_" in i)
    k = map_serving_run(kimi, "serving")
    assert (k.parallel.tp, k.parallel.ep, k.chips) == (4, 4, kimi["hardware"]["chips"])
    odd = copy.deepcopy(e)
    odd["id"] = "aic-no-layout-label"
    assert map_serving_run(odd, "serving").parallel.tp == 4


def test_a_run_its_stated_layout_cannot_hold_is_flagged_not_scored(serving_entries):
    """Little's law on the measured TTFT/TPOT gives the sequences decoding at once; on a pure
    tensor-parallel MLA replica every chip keeps every sequence's latent, so 1,906 sequences of
    ≥8,192 tokens need 1906 × 8192 × 61 layers × 576 × ½ B = 274 GB per GB200 even at 4 bits:
    the run cannot have run as labelled (its twins in the source are a disaggregated deployment
    of that many GPUs). The same measurement on 32 attention-DP ranks fits, and so does every
    other run of the file."""
    from dataclasses import replace

    from roofline.validate.serving_bounds import (
        KV_CAPACITY_FLAG,
        decoding_at_once,
        kv_capacity_violation,
    )
    from roofline.validate.serving_score import find_predictor, predict_serving_run

    rid = "aic-2026_04_06_deepseek_r1_gb200_trtllm_fp4_agg_8192x1024_c2150_tp32_ep1_121"
    r = map_serving_run(serving_entries[rid], "serving")
    m = r.measured
    B = 2150 * 1023 * m.tpot_s / (m.ttft_s + 1023 * m.tpot_s)
    assert decoding_at_once(r) == pytest.approx(B) and round(B) == 1906
    why = kv_capacity_violation(r)
    # the room is the allocatable HBM (189471 MiB = 198.7 GB per GB200) less the weights
    assert why and "274 GB per chip" in why and "leave 187 GB" in why and KV_CAPACITY_FLAG in why
    res = predict_serving_run(r, find_predictor(), None)
    assert res.skipped_reason == why and not res.errors and KV_CAPACITY_FLAG in res.run.flags
    adp = replace(r, parallel=replace(r.parallel, tp=1, dp=32, ep=32, moe_tp=1))
    assert kv_capacity_violation(adp) is None
    others = [map_serving_run(e, "serving") for i, e in serving_entries.items() if i != rid]
    assert not [o.id for o in others if o.mapped and kv_capacity_violation(o)]


def test_the_sweep_of_an_impossible_run_is_not_scored(serving_file):
    """The c2150 run above breaks the bound, so its sweep's layout labels are not the layouts
    that ran; its sibling c538 ("tp 64", attention TP over 64 GB200s) is not scored either: as
    labelled each chip would read every sequence's whole latent every step, 474 decoding
    (Little's law) × 8,704 tokens × 61 layers × 576 B = 145 GB of FP8 KV cache (the engine's
    KV dtype for an NVFP4 checkpoint) at 8 TB/s = 18 ms, where the measured TPOT is 10.07 ms.
    Runs of other sweeps, and a sweep without an impossible run, are scored as stated."""
    from roofline.validate import mapped_runs
    from roofline.validate.serving_bounds import (
        SWEEP_REASON,
        mislabelled_sweeps,
        sibling_violation,
        sweep_key,
    )

    runs = {r.id: r for r in mapped_runs(serving_file)}
    bad = "aic-2026_04_06_deepseek_r1_gb200_trtllm_fp4_agg_8192x1024_c2150_tp32_ep1_121"
    sib = "aic-2026_04_06_deepseek_r1_gb200_trtllm_fp4_agg_8192x1024_c538_tp64_ep1_113"
    assert sweep_key(runs[bad]) == sweep_key(runs[sib])
    assert runs[bad].mapped  # the impossible run itself is flagged when scored (test above)
    assert runs[sib].skipped_reason.startswith(SWEEP_REASON) and bad in runs[sib].skipped_reason
    assert [r for r in runs.values() if r.skipped_reason.startswith(SWEEP_REASON)] == [runs[sib]]
    fresh = {e["id"]: map_serving_run(e, "serving") for e in serving_file.entries}
    sweeps = mislabelled_sweeps(fresh.values())
    assert sweeps == {sweep_key(runs[bad]): bad}
    assert sibling_violation(fresh[bad], sweeps) is None
    assert sibling_violation(fresh[sib], sweeps)
    m = runs[sib].measured
    B = 538 * 1023 * m.tpot_s / (m.ttft_s + 1023 * m.tpot_s)
    kv_read_s = B * (8192 + 512) * 61 * 576 / 8e12
    assert round(B) == 474 and kv_read_s > 1.7 * m.tpot_s


def test_a_layout_the_bound_cannot_size_is_left_to_the_predictor(serving_entries, monkeypatch):
    """Where the serving model refuses to size a run's layout (a RooflineError from the memory
    model), the bound does not judge it: the predictor's own error then names the run."""
    import roofline.validate.serving_bounds as sb
    from roofline.errors import SpecError

    def refuse(*a, **k):
        raise SpecError("no layout", rule="test", fix="none")

    rid = "aic-2026_04_06_deepseek_r1_gb200_trtllm_fp4_agg_8192x1024_c2150_tp32_ep1_121"
    r = map_serving_run(serving_entries[rid], "serving")
    assert sb.kv_capacity_violation(r)
    sb._per_chip.cache_clear()
    monkeypatch.setattr(sb, "memory_per_chip", refuse)
    assert sb.kv_capacity_violation(r) is None
    sb._per_chip.cache_clear()


def test_a_run_faster_than_its_prefill_chips_peak_is_not_scored(serving_entries):
    """The prefill-compute bound (validate.serving_bounds): Qwen3-32B FP8 disaggregated on
    H100 (5 prefill GPUs, 528 users, 4000-token prompts) finishes X = 528 / (TTFT + 999·TPOT)
    requests/s by Little's law, each needing 2 × 32.76 B × 4000 FLOPs of matmuls: 61% of the
    five H100s' dense FP8 peak (1,979 TFLOP/s each), so the run is scored. The same run measured
    twice as fast (TTFT and TPOT halved) needs 122%: it could not have run as stated, and is
    listed with the arithmetic instead of scored. No run of the public file breaks the bound."""
    from dataclasses import replace

    from roofline.validate import load_runs, mapped_runs
    from roofline.validate.serving_bounds import (
        PREFILL_COMPUTE_FLAG,
        physical_violation,
        prefill_compute_violation,
    )
    from roofline.validate.serving_score import find_predictor, predict_serving_run

    rid = "aic-qwen3_32b_qwen3_32b_h100_sxm_sglang_disagg_4000x1000_c_tpnone_epnone_1"
    r = map_serving_run(serving_entries[rid], "serving")
    m = r.measured
    X = 528 / (m.ttft_s + 999 * m.tpot_s)
    share = X * 2 * 32.762106880e9 * 4000 / (5 * 1979e12)
    assert share == pytest.approx(0.612, abs=1e-3)
    assert prefill_compute_violation(r) is None
    fast = replace(r, measured=replace(m, ttft_s=m.ttft_s / 2, tpot_s=m.tpot_s / 2))
    why = prefill_compute_violation(fast)
    assert why and PREFILL_COMPUTE_FLAG in why and "its 5 prefilling h100 chips" in why
    assert physical_violation(fast) == (why, PREFILL_COMPUTE_FLAG)
    res = predict_serving_run(fast, find_predictor(), None)
    assert res.skipped_reason == why and not res.errors and PREFILL_COMPUTE_FLAG in res.run.flags
    runs = mapped_runs(load_runs("serving"))
    assert not [o.id for o in runs if o.mapped and prefill_compute_violation(o)]
