"""The closed-loop steady states (aggregated and disaggregated) are the fixed points of their
sweeps, not points of an orbit about them (`serving.steady.Damping`).

Where prefill nears the replica's capacity (τ = τ_d/(1 − ρ)) the map X -> X_new is steeper than
−3 and plain half steps orbit a two-cycle: 60 and 61 sweeps gave TPOTs up to 8× apart
(Llama-3.1-70B on 4 H100 under TensorRT-LLM, ISL 4096, OSL 128, C 128-512). The answer after
ITERATIONS sweeps must be the converged one (1000 sweeps) and must not depend on the sweep count.
"""

from __future__ import annotations

import numpy as np
import pytest

import roofline.serving.steady as steady_mod
from roofline.serving.inference import Quant, ServePlan
from roofline.serving.steady import Damping, Disagg, Workload, disaggregated, steady_state
from roofline.serving.step import IdealStep
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import PEAK
from roofline.specs.engines import load_engine
from roofline.specs.model_catalog import load_model

C = np.geomspace(8, 2048, 9)


def _step() -> IdealStep:
    return IdealStep(load_model("llama-3.1-70b"), load_chip("h100"), ServePlan(tp=4), Quant(), PEAK)


def _answer(monkeypatch, sweeps: int, engine: str, P: int, G: int) -> np.ndarray:
    monkeypatch.setattr(steady_mod, "ITERATIONS", sweeps)
    s = steady_state(_step(), load_engine(engine), Workload(P, G), C)
    return np.array([s.tpot_s, s.ttft_s, s.requests_per_s], float)


def _disagg(monkeypatch, sweeps: int, engine: str, pools: tuple[int, int]) -> np.ndarray:
    monkeypatch.setattr(steady_mod, "ITERATIONS", sweeps)
    d = Disagg(*pools, 5e10, kv_bytes_per_token=1.6e5, handoff_s=0.05)
    r = disaggregated(_step(), _step(), d, Workload(2048, 64), C, engine=load_engine(engine))
    return np.array([r["tpot_s"], r["ttft_s"], r["requests_per_s"]], float)


@pytest.mark.parametrize("engine", ["trtllm", "vllm", "sglang"])
@pytest.mark.parametrize(("P", "G"), [(4096, 128), (8192, 128), (2048, 64)])
def test_the_sweeps_reach_the_fixed_point(monkeypatch, engine, P, G):
    shipped = _answer(monkeypatch, steady_mod.ITERATIONS, engine, P, G)
    one_more = _answer(monkeypatch, steady_mod.ITERATIONS + 1, engine, P, G)
    converged = _answer(monkeypatch, 1000, engine, P, G)
    np.testing.assert_allclose(shipped, converged, rtol=1e-4)
    np.testing.assert_allclose(one_more, shipped, rtol=1e-4)


@pytest.mark.parametrize("engine", ["trtllm", "vllm"])
@pytest.mark.parametrize("pools", [(1, 1), (2, 1), (1, 3)])
def test_the_disaggregated_sweeps_reach_the_fixed_point(monkeypatch, engine, pools):
    """The disaggregated fixed point had the same orbit (vLLM, ISL 2048, OSL 64, 1:1 pools: 60
    plain half steps left TPOT/TTFT up to 60% from the converged answer)."""
    shipped = _disagg(monkeypatch, steady_mod.ITERATIONS, engine, pools)
    converged = _disagg(monkeypatch, 1000, engine, pools)
    np.testing.assert_allclose(shipped, converged, rtol=1e-4)


def test_damping_halves_on_an_overshoot_and_regrows_to_a_half():
    d = Damping(np.zeros(2))
    d.step((np.zeros(2),), (np.array([1.0, 1.0]),))  # first step: no history, a = 1/2
    np.testing.assert_array_equal(d.a, [0.5, 0.5])
    d.step((np.zeros(2),), (np.array([-1.0, 1.0]),))  # the first candidate turns back
    np.testing.assert_array_equal(d.a, [0.25, 0.5])
    (x,) = d.step((np.zeros(2),), (np.array([-2.0, 2.0]),))  # keeps its sign: regrows, capped
    np.testing.assert_array_equal(d.a, [0.25 * steady_mod.GROW, 0.5])
    np.testing.assert_array_equal(x, [-2.0 * 0.25 * steady_mod.GROW, 1.0])
