"""`roofline calibrate --from-runs serving`: the disaggregated hand-off (`disagg_handoff_s`).

- what the hand-off does in the serving model: pure latency while no pool saturates (TTFT moves
  by exactly h), absorbed into the queue where one does (a closed loop's cycle is set by its
  bottleneck), never prefill or decode capacity;
- the fit recovers a planted hand-off on synthetic runs despite queue-dominated outliers, and
  refuses with too few runs;
- `roofline serve`'s disaggregated view and validate's predictor read it from the profile;
- the command end to end on a few public runs, and the profile file it adds to.
"""

from __future__ import annotations

import contextlib
import io
import json
import tomllib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from roofline.calibrate import serving as cs
from roofline.cli import main
from roofline.errors import SpecError
from roofline.serving.inference import Quant, ServePlan
from roofline.serving.predict import predict_measured_run
from roofline.serving.steady import Disagg, Workload, disaggregated
from roofline.serving.step import IdealStep
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import PEAK, load_profile, profile_from_dict
from roofline.specs.model_catalog import load_model
from roofline.validate import map_serving_run

ROOT = Path(__file__).parents[2]
PUBLIC = ROOT / "src" / "roofline" / "validate" / "measured_serving_aic.yaml"
SHIPPED = ROOT / "src" / "roofline" / "specs" / "profiles" / "fitted.toml"
LLAMA8, H100 = load_model("llama-3.1-8b"), load_chip("h100")
KV = 2 * 32 * 8 * 128 * 2  # bf16 bytes per token of LLaMA-3.1 8B


def _ideal():
    return IdealStep(LLAMA8, H100, ServePlan(tp=1), Quant(), PEAK)


def _disagg(h: float, concurrency: float, decode_cap: float = np.inf) -> dict:
    d = Disagg(4, 1, 400e9, 10e-6, KV, handoff_s=h)
    w = Workload(1024, 256, first_wave_share=0.1)
    c = np.array([concurrency])
    return disaggregated(_ideal(), _ideal(), d, w, c, decode_cap=decode_cap)


# ---- the physics -------------------------------------------------------------------------------


def test_the_handoff_is_pure_latency_while_no_pool_saturates():
    h = 0.25
    a, b = _disagg(0.0, 4.0), _disagg(h, 4.0)
    assert b["prefill_utilisation"] < 0.5  # not saturated: the claim below is not vacuous
    assert b["ttft_s"] - a["ttft_s"] == pytest.approx(h, abs=1e-3)
    # latency, not capacity: the prefill pass and the KV transfer are unchanged
    assert b["prefill_s"] == a["prefill_s"] and b["kv_transfer_s"] == a["kv_transfer_s"]
    assert b["handoff_s"] == h and a["handoff_s"] == 0.0


def test_a_full_decode_pool_absorbs_the_handoff_into_its_queue():
    """Closed loop at a bottleneck (the decode pool full: requests wait for a KV slot): the cycle
    time C / X is the bottleneck's, so a delay elsewhere in the loop replaces queueing; only the
    first wave (share 0.1) still sees it."""
    h = 0.25
    a, b = _disagg(0.0, 1024.0, decode_cap=64), _disagg(h, 1024.0, decode_cap=64)
    assert a["decode_batch"] == 64  # at capacity: the claim below is not vacuous
    assert b["ttft_s"] - a["ttft_s"] == pytest.approx(0.1 * h, rel=0.05)
    assert b["requests_per_s"] == pytest.approx(a["requests_per_s"], rel=1e-6)


@pytest.fixture(scope="module")
def public_runs():
    _, runs = cs.load_serving_runs("serving")
    return {r.id: r for r in runs}


def test_the_identity_on_public_runs(public_runs):
    """TTFT(h) = TTFT(0) + h on a lightly loaded public run; less than h on a queue-bound one
    (so the fit caches exact predictions on a grid instead of assuming the identity)."""
    fitted = load_profile("fitted")
    light = public_runs["aic-kimik2_5_gb200_vllm_fp4_disagg_1024x1024_c4_cfg698"]
    heavy = public_runs["aic-dsr1_h200_sglang_fp8_disagg_8192x1024_c256_cfg434"]

    def ttft(run, h):
        return predict_measured_run(run, efficiency=replace(fitted, disagg_handoff_s=h))["ttft_s"]

    assert ttft(light, 0.3) - ttft(light, 0.0) == pytest.approx(0.3, abs=1e-3)
    assert ttft(heavy, 0.3) - ttft(heavy, 0.0) < 0.2  # near its prefill pool's knee: about half


def test_validate_notes_the_handoff(public_runs):
    run = public_runs["aic-kimik2_5_gb200_vllm_fp4_disagg_1024x1024_c4_cfg698"]
    eff = replace(load_profile("datasheet"), disagg_handoff_s=0.2)
    notes = " ".join(predict_measured_run(run, efficiency=eff)["notes"])
    assert "hand-off 200 ms" in notes
    assert "hand-off" not in " ".join(
        predict_measured_run(run, efficiency=load_profile("datasheet"))["notes"]
    )
    assert "hand-off 200 ms" in eff.describe() and eff.to_dict()["disagg_handoff_s"] == 0.2


def test_aggregated_predictions_do_not_read_the_handoff(public_runs):
    run = next(r for r in public_runs.values() if r.mapped and not r.disaggregated)
    p = load_profile("datasheet")
    a = predict_measured_run(run, efficiency=p)
    b = predict_measured_run(run, efficiency=replace(p, disagg_handoff_s=1.0))
    assert (a["ttft_s"], a["tpot_s"]) == (b["ttft_s"], b["tpot_s"])


def test_the_handoff_is_bounded():
    with pytest.raises(SpecError, match="disagg_handoff_s"):
        replace(PEAK, disagg_handoff_s=3.0)
    with pytest.raises(SpecError, match="disagg_handoff_s"):
        profile_from_dict({"base": "datasheet", "disagg_handoff_s": -0.1}, "x.toml")


# ---- the fit on synthetic runs -----------------------------------------------------------------


def _case(i: int, engine: str, family: str, measured: float, base_ttft: float, queued=False):
    run = SimpleNamespace(
        id=f"r{i}", engine=engine, chip_family=family, base=base_ttft, queued=queued
    )
    return cs.ServingCase(run, measured)


def _synthetic(h_true: float, rng: np.random.Generator):
    """20 runs whose model TTFT is base + h and measured TTFT is base + h_true (5% noise); 4 whose
    measured TTFT is a queue the model does not see (5-30 s against ~0.1 s, like TRT-LLM
    DeepSeek-R1 GB300 cfg392), and 2 the model predicts queue-bound (its TTFT ignores h there)
    — what the robust loss must shrug off."""
    cases = []
    engines, fams = ("trtllm", "sglang", "vllm"), ("GB200", "GB300", "H200")
    for i in range(20):
        base = float(rng.uniform(0.02, 0.6))
        meas = (base + h_true) * float(np.exp(rng.normal(0, 0.05)))
        cases.append(_case(i, engines[i % 3], fams[(i // 3) % 3], meas, base))
    for i in range(20, 24):
        meas = float(rng.uniform(5, 30))
        cases.append(_case(i, engines[i % 3], fams[i % 3], meas, 0.1))
    for i in range(24, 26):
        cases.append(_case(i, engines[i % 3], fams[i % 3], 3.0, 9.0, queued=True))
    return cases


def _predictor():
    def predict(run, *, efficiency):
        return {"ttft_s": run.base + (0.0 if run.queued else efficiency.disagg_handoff_s)}

    return predict


@pytest.mark.parametrize("h_true", [0.0, 0.18, 0.6])
def test_the_fit_recovers_a_planted_handoff(h_true):
    cases = _synthetic(h_true, np.random.default_rng(7))
    fit = cs.fit_cases(cases, PEAK, _predictor(), cv=True)
    assert fit.handoff_s == pytest.approx(h_true, abs=0.02)
    assert fit.interpolation_gap_s < 1e-9  # the synthetic TTFT is linear in h
    by = {cv.by: cv for cv in fit.cv}
    assert set(by) == {"engine", "chip family", cs.PAIR}
    for cv in fit.cv:
        assert all(f.handoff_s == pytest.approx(h_true, abs=0.05) for f in cv.folds)
        if h_true > 0.1:  # held-out runs get better with the fold's fit
            assert np.median(np.abs(cv.error_after)) < np.median(np.abs(cv.error_before))


def test_a_least_squares_fit_would_chase_the_queue_bound_runs():
    """Why the robust loss: with a plain squared loss the 4 queue-bound runs pull h far off."""
    cases = _synthetic(0.18, np.random.default_rng(7))
    curves = cs.ttft_curves(cases, PEAK, _predictor())
    meas = np.array([c.measured_ttft_s for c in cases])
    idx = list(range(len(cases)))
    sq = [np.sum(cs.log_residuals(curves, meas, idx, h) ** 2) for h in curves.grid]
    assert curves.grid[int(np.argmin(sq))] > 0.4
    assert cs.fit_handoff(curves, meas, idx) == pytest.approx(0.18, abs=0.02)


def test_the_fit_refuses_too_few_runs():
    cases = _synthetic(0.2, np.random.default_rng(1))[:2]
    with pytest.raises(SpecError, match=r"2 mapped disaggregated run\(s\).*< 3"):
        cs.fit_cases(cases, PEAK, _predictor())


def test_a_fold_with_too_few_training_runs_is_refused_not_fitted():
    cases = _synthetic(0.2, np.random.default_rng(1))[:4]
    cases = [replace(c, run=SimpleNamespace(**{**vars(c.run), "engine": "a"})) for c in cases]
    cases[0] = replace(cases[0], run=SimpleNamespace(**{**vars(cases[0].run), "engine": "b"}))
    fit = cs.fit_cases(cases, PEAK, _predictor(), cv=True)
    engine = next(cv for cv in fit.cv if cv.by == "engine")
    folds = {f.held_out: f for f in engine.folds}
    assert folds["a"].handoff_s is None and "< 3" in folds["a"].reason
    assert folds["b"].handoff_s == pytest.approx(0.2, abs=0.03)


def test_the_pair_grouping_holds_out_a_model_on_a_chip_family():
    """Leave-one-model×system-pair-out: a fold is one model on one chip family (issue 18: the
    points an unseen sample adds are mostly new pairs), keyed in TOML without the ×."""
    run = SimpleNamespace(model_name="DeepSeek-R1", chip_family="GB200", engine="sglang")
    case = cs.ServingCase(run, 1.0)
    assert case.group(cs.PAIR) == "DeepSeek-R1 on GB200"
    assert case.group("engine") == "sglang" and case.group("chip family") == "GB200"
    assert cs.cv_key(cs.PAIR) == "model_system_pair" and cs.cv_key("chip family") == "chip_family"


# ---- roofline serve ----------------------------------------------------------------------------


def test_serve_disaggregated_ttft_moves_by_the_profiles_handoff(tmp_path, capsys):
    """The view runs a closed loop at the plan's concurrency: the hand-off lengthens each
    request's cycle, so requests arrive a little slower and queue a little less for the
    prefill pool: TTFT grows by h less that relieved wait (here ~4%), never by more than h."""
    prof = tmp_path / "h.toml"
    prof.write_text('base = "datasheet"\nname = "h"\ndisagg_handoff_s = 0.3\n')
    args = ["serve", "--model", "llama-3-70b", "--system", "h100:64", "--json"]
    docs = []
    for extra in (["--profile", "datasheet"], ["--profile", str(prof)]):
        assert main([*args, *extra]) == 0
        docs.append(json.loads(capsys.readouterr().out)["disaggregated"])
    a, b = docs
    assert a["handoff_s"] == 0.0 and b["handoff_s"] == 0.3
    assert 0.9 * 0.3 < b["ttft_s"] - a["ttft_s"] <= 0.3
    assert b["prefill_replicas"] == a["prefill_replicas"] and b["tpot_s"] <= a["tpot_s"]
    assert main([*args[:-1], "--profile", str(prof)]) == 0
    assert "hand-off 300 ms" in capsys.readouterr().out


# ---- the profile file --------------------------------------------------------------------------


def test_the_serving_fit_adds_to_the_training_fits_file():
    """The training writer's file (the shipped one without a serving fit) plus this fit loads
    with everything the training fit wrote; adding again replaces, never duplicates."""
    training = cs.strip_serving(SHIPPED.read_text())
    assert "serving" not in training and cs.HANDOFF not in training
    prov = {"command": "roofline calibrate --from-runs serving", "fitted": {cs.HANDOFF: 0.21}}
    once = cs.add_serving(training, 0.21, prov)
    twice = cs.add_serving(cs.add_serving(training, 0.5, prov), 0.21, prov)
    assert once == twice
    a = profile_from_dict(tomllib.loads(training), str(SHIPPED))
    b = profile_from_dict(tomllib.loads(once), str(SHIPPED))
    assert b.disagg_handoff_s == 0.21 and a.disagg_handoff_s == 0.0
    assert b.provenance["serving"] == prov
    assert {k: v for k, v in b.provenance.items() if k != "serving"} == dict(a.provenance)
    assert b.families == a.families and dict(b.frameworks) == dict(a.frameworks)


def _public_entries() -> list:
    return yaml.load(PUBLIC.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@pytest.fixture(scope="module")
def small_serving(tmp_path_factory) -> Path:
    entries = _public_entries()
    pick = [e for e in entries if "cfg698" in e["id"]]  # vLLM Kimi-K2.5 GB200 disaggregated
    agg = [e for e in entries if "prefill" not in e.get("parallelism", {})]
    pick += [e for e in agg if map_serving_run(e, "serving").mapped][:2]
    assert len(pick) == 6
    path = tmp_path_factory.mktemp("runs") / "serving.yaml"
    path.write_text(yaml.safe_dump(pick))
    return path


def test_calibrate_serving_cli_round_trip(small_serving, tmp_path, monkeypatch):
    monkeypatch.setattr(cs, "GRID_S", (0.0, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0))
    out = tmp_path / "p.toml"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        argv = ["calibrate", "--from-runs", str(small_serving), "--no-cv", "--out", str(out)]
        assert main([*argv, "--json"]) == 0
    doc = json.loads(buf.getvalue())
    doc = doc.get("result", doc)
    h = doc["fitted_s"]
    assert 0.1 < h < 0.4 and len(doc["runs"]) == 4 and doc["cv"] == []
    assert doc["whole_file"]["aggregated"]["ttft"]["before"]["n"] == 2
    prof = load_profile(str(out))
    assert prof.disagg_handoff_s == h
    serving = prof.provenance["serving"]
    assert serving["fitted"] == {cs.HANDOFF: h} and serving["runs"] == 4
    assert serving["command"].endswith("--no-cv") and "--base fitted" in serving["command"]
    # over the default profile: everything else is the base's
    assert prof.families == load_profile("fitted").families
    run = cs.load_serving_runs(small_serving)[1][0]
    got = predict_measured_run(run, efficiency=prof)["ttft_s"]
    want = predict_measured_run(run, efficiency=replace(load_profile("fitted"), disagg_handoff_s=h))
    assert got == want["ttft_s"]


def test_calibrate_serving_cli_refuses_too_few_runs(tmp_path, capsys):
    entries = _public_entries()
    f = tmp_path / "two.yaml"
    f.write_text(yaml.safe_dump([e for e in entries if "cfg698" in e["id"]][:2]))
    assert main(["calibrate", "--from-runs", str(f), "--no-cv"]) == 2
    err = capsys.readouterr().err
    assert "2 mapped disaggregated run(s)" in err and "Traceback" not in err


def test_the_profile_writer_round_trips_the_handoff():
    from roofline.calibrate.write import profile_to_toml

    p = replace(load_profile("datasheet"), disagg_handoff_s=0.4)
    back = profile_from_dict(tomllib.loads(profile_to_toml(p)), "x.toml")
    assert back.disagg_handoff_s == 0.4 and back.families == p.families
    assert load_profile("datasheet").disagg_handoff_s == 0.0 == PEAK.disagg_handoff_s


def test_the_whole_file_with_the_handoff_held_out(small_serving):
    """The honest whole-file TTFT: aggregated runs as predicted, each disaggregated run with
    the error its fold (fitted without its group) gives it."""
    _, runs = cs.load_serving_runs(small_serving)
    prof = load_profile("fitted")
    n_dis = sum(r.disaggregated for r in runs)
    held = np.linspace(-0.5, 0.5, n_dis)
    fold = cs.Fold("vllm", 0, n_dis, None, held, held)
    whole = cs.whole_file(
        runs, prof, prof, predict_measured_run, (cs.ServingCV("engine", (fold,)),)
    )
    row = whole[cs.held_out_key("engine")]["ttft"]
    agg = whole["aggregated"]["ttft"]["before"]
    assert row["after"]["n"] == agg["n"] + n_dis == len(runs)
    assert row["before"] == whole["all"]["ttft"]["before"]
    # the disaggregated errors in it are the fold's, not the in-sample ones
    assert row["after"]["median_abs_error"] != whole["all"]["ttft"]["after"]["median_abs_error"]


# ---- each engine's per-request latency (request_latency_s@ENGINE) and the prior ---------------

SG = cs.latency_target("sglang")


def test_the_request_latency_is_bounded():
    """[0, 0.5] s: on the profile and under [framework.ENGINE]; the engine files keep 0."""
    from roofline.specs.engines import load_engine

    with pytest.raises(SpecError, match="request_latency_s"):
        replace(PEAK, request_latency_s=0.6)
    for engine, _ in cs.LATENCY_ENGINES:
        bad = {"base": "datasheet", "framework": {engine: {"request_latency_s": -0.01}}}
        with pytest.raises(SpecError, match="request_latency_s"):
            profile_from_dict(bad, "x.toml")
        assert load_engine(engine).request_latency_s == 0.0
        assert cs.latency_target(engine).bounds == cs.PRIOR_T.bounds == cs.OVERHEADS[cs.LATENCY]


def _latency_predictor():
    """TTFT = base + the profile's latency for the run's engine (read as predict does:
    for_framework, which falls back to the profile's own value, the prior)."""

    def predict(run, *, efficiency):
        return {"ttft_s": run.base + efficiency.for_framework(run.engine).request_latency_s}

    return predict


def _latency_cases(l_true: float, rng: np.random.Generator, engine: str = "sglang"):
    """18 aggregated runs of `engine` on 3 chip families and 6 models: measured = (base +
    l_true), 5% noise; 3 queue-dominated outliers the robust loss must shrug off."""
    cases = []
    for i in range(21):
        base = float(rng.uniform(0.05, 0.8))
        meas = (base + l_true) * float(np.exp(rng.normal(0, 0.05))) if i < 18 else 20.0
        run = SimpleNamespace(
            id=f"{engine}{i}",
            engine=engine,
            chip_family=("H200", "B200", "GB200")[i % 3],
            model_name=f"m{i % 6}",
            base=base,
            disaggregated=False,
            mapped=True,
            skipped_reason="",
            measured=SimpleNamespace(ttft_s=meas),
        )
        cases.append(cs.ServingCase(run, meas))
    return cases


@pytest.mark.parametrize("l_true", [0.0, 0.12, 0.3])
def test_the_fit_recovers_a_planted_request_latency(l_true):
    fit = cs.fit_cases(
        _latency_cases(l_true, np.random.default_rng(3)), PEAK, _latency_predictor(), p=SG
    )
    assert fit.handoff_s == pytest.approx(l_true, abs=0.02)
    assert fit.target.name == "request_latency_s@sglang"
    assert fit.interpolation_gap_s < 1e-9  # linear in the latency
    by = {cv.by: cv for cv in fit.cv}
    # an engine's own fit cannot hold its engine out: fit_latencies adds that fold (the prior)
    assert set(by) == {"chip family", cs.PAIR}
    for g in ("chip family", cs.PAIR):
        assert len(by[g].folds) == (3 if g == "chip family" else 6)
        assert all(f.handoff_s == pytest.approx(l_true, abs=0.04) for f in by[g].folds)
        if l_true > 0.1:
            assert np.median(np.abs(by[g].error_after)) < np.median(np.abs(by[g].error_before))


def test_a_latency_beyond_the_bound_is_flagged_at_its_bound():
    fit = cs.fit_cases(
        _latency_cases(0.9, np.random.default_rng(3)), PEAK, _latency_predictor(), p=SG, cv=False
    )
    assert fit.handoff_s == SG.bounds.hi == 0.5 and fit.at_bound
    assert "AT ITS BOUND" in "\n".join(cs.fit_text(fit))


PLANTED = {"sglang": 0.24, "vllm": 0.08, "trtllm": 0.03}


@pytest.fixture(scope="module")
def three_engines():
    """18 + 3 aggregated runs per engine, each with its own planted latency, fitted jointly."""
    rng = np.random.default_rng(5)
    runs = [c.run for e, v in PLANTED.items() for c in _latency_cases(v, rng, e)]
    return runs, cs.fit_latencies(runs, PEAK, _latency_predictor())


def test_each_engine_recovers_its_own_latency_and_the_prior_pools_them(three_engines):
    runs, (lat, skipped) = three_engines
    assert not skipped and not lat.notes
    got = {f.target.engine: f.handoff_s for f in lat.fits}
    assert got == pytest.approx(PLANTED, abs=0.02)
    assert min(PLANTED.values()) < lat.prior_s < max(PLANTED.values())
    # the prior is the pooled fit: the robust cost over every run is lowest there
    measured = np.array([r.measured.ttft_s for r in runs])
    base = np.array([r.base for r in runs])

    def cost(v):
        return cs.robust_cost(np.log((base + v) / measured))

    assert cost(lat.prior_s) <= min(cost(lat.prior_s + d) for d in (-0.01, 0.01))


def test_leave_one_engine_out_falls_back_to_the_prior_of_the_other_engines(three_engines):
    """The held-out engine's runs are predicted with one latency fitted on the other engines'
    runs together (what the model gives an engine without its own value)."""
    _, (lat, _) = three_engines
    for i, f in enumerate(lat.fits):
        eng = next(cv for cv in f.cv if cv.by == "engine")
        (fold,) = eng.folds
        others = [g for j, g in enumerate(lat.fits) if j != i]
        assert fold.held_out == f.target.engine
        assert fold.n_train == sum(len(g.cases) for g in others) and fold.n_test == len(f.cases)
        assert fold.handoff_s == cs.pooled_latency(others)
        lo, hi = sorted(PLANTED[g.target.engine] for g in others)
        assert lo - 0.02 < fold.handoff_s < hi + 0.02
        want = [c.run.base + fold.handoff_s for c in f.cases]
        measured = np.array([c.measured_ttft_s for c in f.cases])
        np.testing.assert_allclose(fold.error_after, np.array(want) / measured - 1, rtol=1e-12)
        assert "falls back to the prior" in fold.reason
    # SGLang's latency is the largest: the others' prior under-predicts it
    sg = next(f for f in lat.fits if f.target.engine == "sglang")
    assert np.median(next(cv for cv in sg.cv if cv.by == "engine").error_after) < -0.05


def test_the_latency_cv_folds_are_printed(three_engines):
    _, (lat, _) = three_engines
    text = "\n".join(t for f in lat.fits for t in cs.fit_text(f)) + "\n".join(lat.notes_text())
    for _, display in cs.LATENCY_ENGINES:
        for by in ("engine", "chip family", cs.PAIR):
            assert f"Leave-one-{by}-out (held-out aggregated {display} runs" in text
    assert "after = the prior request_latency_s fitted on the other engines' runs" in text
    assert "falls back to the prior" in text
    assert "request_latency_s@vllm over 3 folds" in text and "over 6 folds" in text
    assert "Prior request_latency_s (an engine without its own value" in text


def test_an_engine_with_too_few_runs_falls_back_to_the_prior(three_engines):
    runs, _ = three_engines
    keep = [r for r in runs if r.engine != "trtllm"] + [r for r in runs if r.engine == "trtllm"][:2]
    lat, _ = cs.fit_latencies(keep, PEAK, _latency_predictor(), cv=False)
    assert [f.target.engine for f in lat.fits] == ["sglang", "vllm"]
    (note,) = lat.notes
    assert "request_latency_s@trtllm not fitted: 2 mapped" in note and "the prior" in note
    prof = cs.with_latencies(cs.latency_target("trtllm").on(PEAK, 0.4), lat)
    assert prof.request_latency_s == lat.prior_s
    assert prof.for_framework("trtllm").request_latency_s == lat.prior_s  # the base's 0.4 gone
    assert prof.for_framework("vllm").request_latency_s == lat.fits[1].handoff_s


def test_predictions_read_the_latency_of_their_own_engine_only(public_runs):
    """Aggregated TTFT of an engine moves with its [framework.ENGINE] request_latency_s (by at
    most the latency: the closed loop's cycle lengthens too); other engines' and disaggregated
    runs do not."""
    base = load_profile("fitted")
    for t in cs.LATENCY_TS:  # the shipped one may carry fits
        base = t.on(base, 0.0)
    for t in cs.LATENCY_TS:
        prof = t.on(base, 0.2)
        seen = set()
        for r in public_runs.values():
            kind = ("own" if t.reads(r) else "other", r.disaggregated)
            if kind in seen or not r.mapped or not r.measured.ttft_s:
                continue
            a = predict_measured_run(r, efficiency=base)["ttft_s"]
            b = predict_measured_run(r, efficiency=prof)["ttft_s"]
            if kind[0] == "own":
                assert 0.0 < b - a <= 0.2 + 1e-9, (t.name, r.id)
            else:
                assert b == a, (t.name, r.id)
            seen.add(kind)
        assert seen == {("own", False), ("other", False), ("other", True)}, t.name


def test_the_serving_fit_writes_each_latency_under_its_framework_and_the_prior_on_top():
    training = cs.strip_serving(SHIPPED.read_text())
    prov = {"command": "roofline calibrate --from-runs serving", "fitted": {cs.HANDOFF: 0.2}}
    lat = {"": 0.09, "sglang": 0.11, "vllm": 0.07, "trtllm": 0.02}
    once = cs.add_serving(training, 0.2, prov, latency=lat)
    other = {"": 0.3, "sglang": 0.4, "vllm": 0.1}
    assert cs.add_serving(cs.add_serving(training, 0.3, prov, other), 0.2, prov, lat) == once
    assert cs.strip_serving(once) == training
    p = profile_from_dict(tomllib.loads(once), str(SHIPPED))
    assert p.request_latency_s == 0.09 and p.disagg_handoff_s == 0.2
    for t in cs.LATENCY_TS:
        assert t.value(p) == lat[t.engine] == p.for_framework(t.engine).request_latency_s
    assert p.for_framework("dynamo").request_latency_s == 0.09  # no value of its own: the prior
    # an SGLang-only fit (the format shipped before the other engines were fitted) loads too
    only = profile_from_dict(
        tomllib.loads(cs.add_serving(training, 0.2, prov, {"sglang": 0.11})), str(SHIPPED)
    )
    assert only.request_latency_s == 0.0 and only.for_framework("sglang").request_latency_s == 0.11
    assert only.for_framework("vllm").request_latency_s == 0.0
    shipped = load_profile("fitted")  # whichever of the two formats is shipped
    fitted = shipped.provenance["serving"]["fitted"]
    for t in (cs.PRIOR_T, *cs.LATENCY_TS):
        assert t.value(shipped) == fitted.get(t.name, 0.0), t.name


def test_calibrate_serving_writes_a_profile_that_predicts_with_the_fitted_latencies(
    tmp_path, monkeypatch
):
    """End to end on 4 disaggregated + 3 aggregated SGLang and 3 vLLM public runs: the written
    profile carries each latency under [framework.ENGINE] and the prior on top, and predicting
    with it gives the fits' exact in-sample errors; TensorRT-LLM (no runs) reads the prior."""
    entries = _public_entries()
    pick = [e for e in entries if "cfg698" in e["id"]]
    for engine in ("sglang", "vllm"):
        pick += [
            e
            for e in entries
            if "prefill" not in e.get("parallelism", {})
            and e.get("engine", {}).get("name", "").lower().startswith(engine)
            and map_serving_run(e, "serving").mapped
        ][:3]
    assert len(pick) == 10
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(pick))
    monkeypatch.setattr(cs, "GRID_S", (0.0, 0.2, 0.5, 2.0))
    monkeypatch.setattr(cs, "LATENCY_GRID_S", (0.0, 0.1, 0.2, 0.3, 0.5))
    out = tmp_path / "p.toml"
    res = cs.calibrate_serving(path, cv=False, out=str(out))
    lat = res.latency
    assert [(f.target.engine, len(f.cases)) for f in lat.fits] == [("sglang", 3), ("vllm", 3)]
    assert "request_latency_s@trtllm not fitted: 0 mapped" in lat.notes[0]
    prof = load_profile(str(out))
    serving = prof.provenance["serving"]
    assert serving["fitted"] == {
        cs.HANDOFF: res.fit.handoff_s,
        cs.LATENCY: lat.prior_s,
        **{f.target.name: f.handoff_s for f in lat.fits},
    }
    assert serving["latency_runs"] == 6 and serving["latency_vllm_runs"] == 3
    assert prof.request_latency_s == lat.prior_s
    assert prof.for_framework("trtllm").request_latency_s == lat.prior_s
    for f in lat.fits:
        assert f.target.value(prof) == f.handoff_s
        for c, err in zip(f.cases, f.error_after, strict=True):
            got = predict_measured_run(c.run, efficiency=prof)["ttft_s"]
            assert got / c.measured_ttft_s - 1 == pytest.approx(err, rel=1e-12)
    text = cs.runs_text(res)
    assert "request_latency_s@sglang" in text and "request_latency_s@vllm" in text
    assert res.to_dict()[cs.LATENCY]["engines"]["vllm"]["fitted_s"] == lat.fits[1].handoff_s


def test_an_overlays_framework_table_keeps_the_bases_other_keys():
    """The written profile sets [framework.sglang] request_latency_s over a base whose
    [framework.sglang] holds SGLang's kernel overrides (datasheet: expert_fixed_s): the overlay
    adds its key, key by key, and loses none of the base's (replacing the table wholesale moved
    SGLang's TPOT by up to 50 points)."""
    base = load_profile("datasheet")
    over = profile_from_dict(
        {"base": "datasheet", "framework": {"sglang": {"request_latency_s": 0.1}}}, "x.toml"
    )
    old, new = base.frameworks["sglang"], over.frameworks["sglang"]
    assert old["families"] and new["families"] == old["families"]
    assert new["request_latency_s"] == 0.1 and "request_latency_s" not in old
    a, b = base.for_framework("sglang"), over.for_framework("sglang")
    assert a.families == b.families and b.request_latency_s == 0.1
