"""The steady-state fixed points stop once a sweep leaves their state unchanged to the last bit
(`serving.steady._settled`): the answer must be the full ITERATIONS-sweep answer, bit for bit.

Each case runs twice: as shipped, and with the stop disabled (every sweep runs). Cases cover a
mixed-batching engine (vLLM), a prefill-first engine under a Poisson rate (SGLang, no waves), no
engine, a KV-capped batch, arrays of concurrencies and a disaggregated deployment.
"""

from __future__ import annotations

import numpy as np
import pytest

import roofline.serving.steady as steady_mod
from roofline.serving.inference import Quant, ServePlan
from roofline.serving.steady import Disagg, Workload, disaggregated, steady_state
from roofline.serving.step import IdealStep
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import PEAK
from roofline.specs.engines import load_engine
from roofline.specs.model_catalog import load_model

LLAMA8 = load_model("llama-3.1-8b")
H100 = load_chip("h100")


def _step(tp: int = 1) -> IdealStep:
    return IdealStep(LLAMA8, H100, ServePlan(tp=tp), Quant(), PEAK)


def _fields(s) -> dict:
    if isinstance(s, dict):
        return {k: np.asarray(v, float) for k, v in s.items()}
    return {k: np.asarray(getattr(s, k), float) for k in s.__dataclass_fields__}


def _both(monkeypatch, run) -> tuple[dict, dict, list[int]]:
    """(answer with the stop, answer with every sweep, sweeps the stop let run)."""
    sweeps: list[int] = []
    real = steady_mod._settled

    def counting(state, new):
        sweeps.append(1)
        return real(state, new)

    monkeypatch.setattr(steady_mod, "_settled", counting)
    fast = _fields(run())
    monkeypatch.setattr(steady_mod, "_settled", lambda state, new: False)
    full = _fields(run())
    return fast, full, sweeps


CASES = {
    "vllm closed loop": lambda: steady_state(
        _step(), load_engine("vllm"), Workload(1024, 256), np.array([1.0, 8.0, 64.0, 512.0])
    ),
    "trtllm scalar": lambda: steady_state(
        _step(2), load_engine("trtllm"), Workload(2048, 512), 48.0
    ),
    "sglang at a rate": lambda: steady_state(
        _step(), load_engine("sglang"), Workload(4096, 256, rate=2.0), np.array([32.0])
    ),
    "no engine, KV-capped": lambda: steady_state(
        _step(), None, Workload(1024, 1024), np.array([16.0, 256.0]), batch_cap=64.0
    ),
    "disaggregated": lambda: disaggregated(
        _step(),
        _step(),
        Disagg(1, 2, 400e9, 0.0, 131072.0),
        Workload(2048, 256),
        np.array([4.0, 32.0]),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_stopping_at_a_settled_sweep_changes_no_bit(monkeypatch, name):
    fast, full, sweeps = _both(monkeypatch, CASES[name])
    assert fast.keys() == full.keys()
    for k in fast:
        assert np.array_equal(fast[k], full[k], equal_nan=True), k
    assert 0 < len(sweeps) <= steady_mod.ITERATIONS


def test_a_settled_sweep_is_reached_before_the_last(monkeypatch):
    """The stop saves work: a TensorRT-LLM closed loop settles before its 60 sweeps run out."""
    _, _, sweeps = _both(monkeypatch, CASES["trtllm scalar"])
    assert len(sweeps) < steady_mod.ITERATIONS


def test_settled_compares_every_element_bitwise():
    a = np.array([1.0, 2.0])
    assert steady_mod._settled((a, a), (a.copy(), a.copy()))
    assert not steady_mod._settled((a,), (np.nextafter(a, 3.0),))
    assert not steady_mod._settled((np.array([np.nan]),), (np.array([np.nan]),))
