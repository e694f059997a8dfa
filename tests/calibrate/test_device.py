"""`roofline calibrate --device --quick` on the CPU backend (what CI runs): the profile it
writes loads, says it is measured, and moves predictions toward the measurements."""

from __future__ import annotations

import json

import numpy as np
import pytest

from roofline.calibrate.device import plan
from roofline.calibrate.kernels import KernelKind, predict_time_s
from roofline.cli import main
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import load_profile

pytest.importorskip("jax")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "local.toml"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["calibrate", "--device", "--quick", "--json", "--out", str(out)])
    assert rc == 0
    return out, json.loads(buf.getvalue())


def test_writes_a_loadable_measured_profile(run):
    out, doc = run
    prof = load_profile(str(out))
    assert prof.calibrated and prof.name == "host-cpu-measured"
    assert "JAX" in prof.source and "calibrate --device --quick" in prof.source
    assert doc["profile"]["kind"] == "measured-calibrated"
    chip = load_chip(str(out.with_name("local.chip.toml")))
    assert prof.family_for(chip) is not None
    assert load_profile("datasheet").family_for(chip) is None  # the host is not a catalog chip


def test_fit_moves_predictions_toward_measurements(run):
    out, doc = run
    ks = doc["kernels"]
    before = np.array([abs(k["error_before"]) for k in ks])
    after = np.array([abs(k["error_after"]) for k in ks])
    assert np.median(after) < np.median(before)
    assert doc["fit"]["median_abs_error_after"] < doc["fit"]["median_abs_error_before"]
    # the kernel the datasheet got most wrong moves toward its measurement
    worst = ks[int(np.argmax(before))]
    assert abs(worst["predicted_after_s"] - worst["measured_s"]) < abs(
        worst["predicted_before_s"] - worst["measured_s"]
    )


def test_reloaded_profile_reproduces_the_fitted_predictions(run):
    """The file round-trips: its predictions are the ones the command printed."""
    out, doc = run
    prof = load_profile(str(out))
    chip = load_chip(str(out.with_name("local.chip.toml")))
    kernels = plan("cpu", ("fp32",), True, 1)
    assert [k.label for k in kernels] == [k["label"] for k in doc["kernels"]]
    pred = predict_time_s(prof, chip, kernels)
    want = np.array([k["predicted_after_s"] for k in doc["kernels"]])
    np.testing.assert_allclose(pred, want, rtol=1e-4)


def test_every_kind_is_benchmarked_and_refusals_are_explained(run):
    _, doc = run
    kinds = {k["kind"] for k in doc["kernels"]}
    assert {"matmul", "copy", "vector", "attention"} <= kinds
    assert any(k["grouped"] for k in doc["kernels"])
    for r in doc["fit"]["refused"]:
        assert r["reason"]


def test_plan_sizes_an_accelerator_and_adds_collectives():
    ks = plan("gpu", ("bf16", "fp8"), False, 8)
    assert {k.dtype for k in ks if k.kind == KernelKind.MATMUL} == {"bf16", "fp8"}
    ar = [k for k in ks if k.kind == KernelKind.ALL_REDUCE]
    assert ar and all(k.devices == 8 and k.tier == "nvlink" for k in ar)
    assert {k.head_dim for k in ks if k.kind == KernelKind.ATTENTION} == {64, 128}
    assert not [k for k in plan("cpu", ("fp32",), True, 8) if k.kind == KernelKind.ALL_REDUCE]
