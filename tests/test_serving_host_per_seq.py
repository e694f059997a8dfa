"""An engine's exposed host time per running sequence (`seq_overhead_s`, TensorRT-LLM's
TorchSampler request loop: specs/engines/trtllm.toml [sampler]): paid once per pass for each
sequence of an attention-DP rank, by streamed serving only, never by an offline run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from roofline.serving.inference import Quant, ServePlan
from roofline.serving.steady import Workload, engine_overhead_s, host_per_seq_s, steady_state
from roofline.serving.step import IdealStep
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import PEAK
from roofline.specs.engines import load_engine
from roofline.specs.model_catalog import load_model

MODEL, CHIP = load_model("llama-3.1-8b"), load_chip("h100")
TRT = load_engine("trtllm")
NONE = dataclasses.replace(TRT, seq_overhead_s=0.0)


def _step(dp: int = 1) -> IdealStep:
    return IdealStep(MODEL, CHIP, ServePlan(tp=1, dp=dp), Quant(), PEAK)


def test_trtllm_records_a_per_sequence_host_time_inside_its_sources_bracket():
    assert 1.4e-5 <= TRT.seq_overhead_s <= 3.4e-5
    assert load_engine("vllm").seq_overhead_s == 0.0 and load_engine("sglang").seq_overhead_s == 0.0


def test_per_sequence_time_is_linear_in_the_sequences_of_one_rank():
    B = np.array([1.0, 64.0, 512.0])
    assert host_per_seq_s(_step(), TRT, B) == pytest.approx(TRT.seq_overhead_s * B, rel=1e-12)
    # four attention-DP ranks run their loops side by side, each over a quarter
    assert host_per_seq_s(_step(4), TRT, B) == pytest.approx(TRT.seq_overhead_s * B / 4)
    assert host_per_seq_s(_step(), None, B) == 0.0 and host_per_seq_s(_step(), NONE, B) == 0.0
    # engine_overhead_s adds it to the step's exposed host time; `running` overrides the count
    got = engine_overhead_s(_step(), TRT, 64.0, running=8.0)
    assert got == pytest.approx(TRT.step_overhead_s + 8 * TRT.seq_overhead_s, rel=1e-12)


def test_a_streamed_closed_loop_pays_it_every_pass_an_offline_run_does_not():
    """At concurrency 64 of 1024/1024 requests the streamed loop's TPOT is the one without the
    per-sequence time plus about 64 sequences' worth each pass (a little more: longer passes
    admit the same prefill work at a larger share); offline (whole outputs) pays nothing."""
    C = np.array([64.0])
    base = steady_state(_step(), NONE, Workload(1024, 1024), C)
    with_it = steady_state(_step(), TRT, Workload(1024, 1024), C)
    offline = steady_state(_step(), TRT, Workload(1024, 1024, streaming=False), C)
    extra = float(with_it.tpot_s[0] - base.tpot_s[0])
    assert extra == pytest.approx(64 * TRT.seq_overhead_s, rel=0.05)
    assert float(offline.tpot_s[0]) == pytest.approx(float(base.tpot_s[0]), rel=1e-12)
