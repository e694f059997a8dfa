"""Runs of one deployment share one step (`serving.predict.replica_step`), so the tables a step
walks are walked once for all of them: the answer must be the unshared one to the last bit."""

from __future__ import annotations

import collections
import dataclasses

import pytest

import roofline.serving.predict as predict_mod
from roofline.serving.predict import _profile, predict_measured_run, quant_of, replica_step
from roofline.validate import load_runs
from roofline.validate.serving_runs import map_serving_run


@pytest.fixture(scope="module")
def same_deployment():
    """Two mapped serving runs of one deployment (same model, chip and layout and precision) at different
    concurrencies or lengths, whose models differ only in their `source` label."""
    by = collections.defaultdict(list)
    for e in load_runs("serving").entries:
        r = map_serving_run(e, "serving")
        if r.mapped and not r.disaggregated:
            key = (
                dataclasses.replace(r.model, source=""),
                r.chip.name,
                r.parallel,
                quant_of(r, None),
            )
            by[key].append(r)
    pairs = [rs for rs in by.values() if len(rs) > 1 and rs[0].workload != rs[1].workload]
    assert pairs, "the serving runs hold deployments measured at several workloads"
    return pairs[0][0], pairs[0][1]


def test_runs_of_one_deployment_share_a_step(same_deployment, monkeypatch):
    monkeypatch.setattr(predict_mod, "_STEPS", {})
    a, b = same_deployment
    assert a.model.source != b.model.source  # validate labels each run's model with its id
    eff = _profile(None, a.chip)
    qa, qb = quant_of(a, None), quant_of(b, None)
    assert replica_step(a, a.parallel, eff, qa) is replica_step(b, b.parallel, eff, qb)
    other = dataclasses.replace(qa, kv="fp8" if qa.kv != "fp8" else "bf16")
    assert replica_step(a, a.parallel, eff, other) is not replica_step(a, a.parallel, eff, qa)


def test_a_shared_step_changes_no_bit(same_deployment, monkeypatch):
    a, b = same_deployment
    monkeypatch.setattr(predict_mod, "_STEPS", {})
    alone = predict_measured_run(b)  # b on a step of its own
    monkeypatch.setattr(predict_mod, "_STEPS", {})
    predict_measured_run(a)
    shared = predict_measured_run(b)  # b on a's step, holding a's tables too
    assert len(predict_mod._STEPS) == 1
    assert shared == alone


def test_the_cache_keeps_the_most_recent_deployments(same_deployment, monkeypatch):
    a, _ = same_deployment
    monkeypatch.setattr(predict_mod, "_STEPS", {})
    monkeypatch.setattr(predict_mod, "_STEPS_MAX", 1)
    eff = _profile(None, a.chip)
    q = quant_of(a, None)
    first = replica_step(a, a.parallel, eff, q)
    replica_step(a, a.parallel, eff, dataclasses.replace(q, kv="fp8" if q.kv != "fp8" else "bf16"))
    assert len(predict_mod._STEPS) == 1
    assert replica_step(a, a.parallel, eff, q) is not first  # dropped, built again


def test_profiles_apart_only_in_the_hand_off_share_a_step(same_deployment, monkeypatch):
    """The disaggregated hand-off is added by the predictor, never read by a step: calibrate
    --from-runs serving predicts each run at many hand-offs on one step."""
    monkeypatch.setattr(predict_mod, "_STEPS", {})
    a, _ = same_deployment
    eff, q = _profile(None, a.chip), quant_of(a, None)
    step = replica_step(a, a.parallel, eff, q)
    for h in (0.0, 0.25, 1.5):
        assert replica_step(a, a.parallel, dataclasses.replace(eff, disagg_handoff_s=h), q) is step
    slower = dataclasses.replace(eff, layer_overhead_s=eff.layer_overhead_s + 1e-6)
    assert replica_step(a, a.parallel, slower, q) is not step  # a step reads this one
