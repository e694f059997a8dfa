"""The steady-state fixed points stop once a sweep leaves their state unchanged to the last bit
(`serving.steady._settled`): the answer must be the full ITERATIONS-sweep answer, bit for bit.

Each case runs twice: as shipped, and with the stop disabled (every sweep runs). Cases cover a
mixed-batching engine (vLLM), a prefill-first engine under a Poisson rate (SGLang, no waves), no
engine, a KV-capped batch and arrays of concurrencies (a disaggregated deployment solves its
closed loop by bisection, tests/test_steady_fixed_point.py, with no settled-sweep stop).

Mixed-batching engines cost each sweep's decode pass and the cohort's prefill pass beside it in
one `pass_time` call on a one-plan ShardedStep (`serving.steady._decode_and_cohort`): each
element must be the separate call's to the last bit, and the whole steady state the two-call
answer.
"""

from __future__ import annotations

import numpy as np
import pytest

import roofline.serving.steady as steady_mod
from roofline.serving.inference import PassShape, Quant, ServePlan
from roofline.serving.steady import Workload, steady_state
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


# -- a decode pass and the cohort's prefill pass in one call --------------------------------


def _sharded(tp: int = 2):
    from roofline.serving.step import ShardedStep
    from roofline.specs.system import parse_system

    plan = ServePlan(tp=tp)
    return ShardedStep(LLAMA8, [parse_system(f"h100:{tp}")], [plan], Quant(), PEAK)


@pytest.mark.parametrize("make", [_step, _sharded], ids=["ideal", "sharded"])
@pytest.mark.parametrize(
    "B, seqs, chunk, P, Pn",
    [
        (1.0, 1.0, 1024.0, 1024.0, 1024.0),
        (37.3, 3.0, 2048.0, 2048.0, 2048.0),
        (np.array([180.25]), np.array(1.0), 4096.0, 8192.0, 8192.0),  # chunked prompt
        (900.0, 1.0, 512.0, 4096.0, 1024.0),  # a cached prefix
    ],
)
def test_one_call_for_both_passes_gives_each_to_the_last_bit(make, B, seqs, chunk, P, Pn):
    step, ctx = make(), P + 128.0
    calls: list[int] = []
    real = step.pass_time
    step.pass_time = lambda shape: (calls.append(1), real(shape))[1]
    dec, pf = steady_mod._decode_and_cohort(step, B, ctx, seqs, chunk, P, Pn)
    assert len(calls) == (1 if make is _sharded else 2)  # a one-plan ShardedStep: one call
    step.pass_time = real
    alone_dec = real(PassShape(decode=B, context=ctx)).time_s
    alone_pf = steady_mod._cohort_pass(step, B, ctx, seqs, chunk, P, Pn)
    assert np.shape(dec) == np.shape(alone_dec) and np.shape(pf) == np.shape(alone_pf)
    assert np.array_equal(dec, alone_dec) and np.array_equal(pf, alone_pf)
    assert np.all(pf > dec)  # the prefill chunk costs something
    alone = steady_mod._cohort_alone(step, ctx, seqs, chunk, P, Pn, paired=True)
    single = steady_mod._cohort_pass(step, 0.0, ctx, seqs, chunk, P, Pn)
    assert np.shape(alone) == np.shape(single) and np.array_equal(alone, single)


def test_arrays_of_candidates_take_two_calls():
    step = _step()
    B = np.array([4.0, 64.0])
    dec, pf = steady_mod._decode_and_cohort(
        step, B, 1100.0, np.array([1.0, 2.0]), 1024.0, 1024.0, 1024.0
    )
    assert dec.shape == pf.shape == (2,)
    assert np.array_equal(dec, step.pass_time(PassShape(decode=B, context=1100.0)).time_s)


@pytest.mark.parametrize("engine, C", [("vllm", 24.0), ("trtllm", 300.0), ("vllm", 1.0)])
def test_a_sharded_closed_loop_is_the_two_call_answer(monkeypatch, engine, C):
    """The whole steady state on a one-plan ShardedStep (what validate runs per point): the
    one-call passes against two calls per sweep, every field bit for bit."""

    def run():
        return _fields(steady_state(_sharded(), load_engine(engine), Workload(3000, 200), C))

    one = run()

    def two_calls(step, B, ctx, seqs, chunk, P, Pn):
        return (
            step.pass_time(PassShape(decode=B, context=ctx)).time_s,
            steady_mod._cohort_pass(step, B, ctx, seqs, chunk, P, Pn),
        )

    monkeypatch.setattr(steady_mod, "_decode_and_cohort", two_calls)
    two = run()
    for k in one:
        assert np.array_equal(one[k], two[k], equal_nan=True), k
