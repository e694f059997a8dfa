"""Serving-engine profiles: every shipped file loads, carries sources, and bad files are refused."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from roofline.errors import SpecError
from roofline.specs.engines import ENGINE_DIR, engine_names, load_engine


def test_the_four_engines_load():
    assert set(engine_names()) == {"vllm", "sglang", "trtllm", "jetstream"}
    for n in engine_names():
        e = load_engine(n)
        assert e.max_num_batched_tokens >= 1024 and 0 < e.memory_fraction <= 1


@pytest.mark.parametrize(
    "alias,name", [("vLLM", "vllm"), ("TensorRT-LLM", "trtllm"), ("SGLang", "sglang")]
)
def test_aliases(alias, name):
    assert load_engine(alias).name == name


def test_every_number_has_a_source_comment():
    """Each numeric line of an engine file ends with a comment naming its source (or 'estimate')."""
    for p in ENGINE_DIR.glob("*.toml"):
        for line in p.read_text().splitlines():
            if re.match(r"^\w+\s*=\s*[0-9]", line):
                assert "#" in line, f"{p.name}: {line!r} has no source"


def test_budget_and_graph_caps_follow_the_hardware():
    sg = load_engine("sglang")
    assert sg.token_budget(80e9) == 8192 and sg.token_budget(180e9) == 16384
    assert sg.graph_batch(2) == 256 and sg.graph_batch(8) == 512


def test_kv_memory_under_both_fraction_rules():
    v, t = load_engine("vllm"), load_engine("trtllm")
    # the runtime's own memory comes off the chip's total before either fraction applies
    rv, rt = v.runtime_memory_bytes, t.runtime_memory_bytes
    assert v.kv_memory_bytes(80e9, 16e9, 2e9) == pytest.approx((80e9 - rv) * 0.9 - 18e9)
    assert t.kv_memory_bytes(80e9, 16e9, 2e9) == pytest.approx((80e9 - rt - 18e9) * 0.9)
    # the collectives' buffers only where the replica spans chips (vectorised over ranks)
    both = t.kv_memory_bytes(80e9, 16e9, 2e9, np.array([1, 8]))
    assert both[0] - both[1] == pytest.approx(t.collective_memory_bytes * 0.9)
    assert t.collective_memory_bytes > 0 and rt > rv > 0  # TRT-LLM sizes from what is free
    # SGLang's mem_fraction_static holds the weights and the KV pool: the workspace is outside it
    g = load_engine("sglang")
    assert g.memory_fraction_of == "static"
    want = (80e9 - g.runtime_memory_bytes) * g.memory_fraction - 16e9
    assert g.kv_memory_bytes(80e9, 16e9, 2e9) == pytest.approx(want)


def test_runtime_memory_is_a_byte_count(tmp_path):
    path = write(
        tmp_path, lambda s: s.replace("runtime_memory_bytes = 0.58e9", "runtime_memory_bytes = -1")
    )
    with pytest.raises(SpecError, match="runtime_memory_bytes"):
        load_engine(path)


def write(tmp: Path, body: str) -> str:
    src = (ENGINE_DIR / "vllm.toml").read_text()
    p = tmp / "e.toml"
    p.write_text(body(src) if callable(body) else body)
    return str(p)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (
            lambda s: s.replace("memory_fraction = 0.9 ", "memory_fraction = 1.5 "),
            "memory_fraction",
        ),
        (lambda s: s.replace("max_num_seqs = 1024", "max_num_seqs = 0"), "max_num_seqs"),
        (
            lambda s: s.replace("step_overhead_s = 0.0006", "step_overhead_s = -1"),
            "step_overhead_s",
        ),
        (lambda s: s.replace("kv_block_tokens = 16", "kv_blocks = 16"), "kv_blocks"),
        (
            lambda s: s.replace(
                "step_overhead_s = 0.0006", "request_latency_s = -0.1\nstep_overhead_s = 0.0006"
            ),
            "request_latency_s",
        ),
        (
            lambda s: s.replace(
                "step_overhead_s = 0.0006", "seq_overhead_s = -1e-5\nstep_overhead_s = 0.0006"
            ),
            "seq_overhead_s",
        ),
        (
            lambda s: s.replace('memory_fraction_of = "total"', 'memory_fraction_of = "x"'),
            "memory_fraction_of",
        ),
        (
            lambda s: re.sub(r"closed_loop_lockstep = \w+", 'closed_loop_lockstep = "yes"', s),
            "closed_loop_lockstep",
        ),
        (lambda s: re.sub(r"closed_loop_lockstep = \w+", "", s), "closed_loop_lockstep"),
    ],
)
def test_bad_files_are_refused_with_the_key_named(tmp_path, edit, needle):
    with pytest.raises(SpecError, match=needle):
        load_engine(write(tmp_path, edit))


def test_caps_hold_per_scheduler():
    """Issue 18 item 2: with attention DP each vLLM / TensorRT-LLM rank runs its own scheduler
    (the cap on running sequences and the token budget hold per rank); SGLang divides its token
    budget over the ranks (it holds per replica), but its default cap on running requests is
    sized by each rank's own request pool (model_runner_kv_cache_mixin.init_memory), so it holds
    per rank; a replica-wide cap is still expressible."""
    from dataclasses import replace

    v, t, sg = load_engine("vllm"), load_engine("trtllm"), load_engine("sglang")
    assert v.seq_cap(8) == 8 * v.max_num_seqs and t.seq_cap(32) == 32 * t.max_num_seqs
    assert v.token_budget(80e9, 8) == 8 * 8192
    assert sg.seq_cap(8) == 8 * sg.max_num_seqs and sg.token_budget(80e9, 8) == 8192
    assert replace(sg, max_num_seqs_per_dp_rank=False).seq_cap(8) == sg.max_num_seqs
    assert replace(sg, max_num_seqs_per_dp_rank=None).seq_cap(8) == sg.max_num_seqs
    assert list(t.seq_cap(np.array([1, 4]))) == [t.max_num_seqs, 4 * t.max_num_seqs]


def test_an_attention_dp_replica_admits_a_cap_per_rank():
    """A replica of 8 attention-DP ranks with a cap of 4 running sequences per scheduler holds
    32 in decode at concurrency 32 (TensorRT-LLM's per-rank scheduler), 4 when the cap is the
    replica's (SGLang's division); per worker it queued 28 of 32 requests."""
    from dataclasses import replace

    from roofline.serving.inference import Quant, ServePlan
    from roofline.serving.steady import Workload, steady_state
    from roofline.serving.step import ShardedStep
    from roofline.specs.efficiency import PEAK
    from roofline.specs.model_catalog import load_model
    from roofline.specs.system import parse_system

    step = ShardedStep(
        load_model("tiny-llama"), [parse_system("h100:8")], [ServePlan(dp=8)], Quant(), PEAK
    )
    work = Workload(256, 64)
    per_rank = replace(load_engine("trtllm"), max_num_seqs=4)
    per_replica = replace(per_rank, scheduler_per_dp_rank=False)
    a = steady_state(step, per_rank, work, 32.0)
    b = steady_state(step, per_replica, work, 32.0)
    assert float(np.ravel(a.decode_batch)[0]) > 8 and not bool(np.ravel(a.capped)[0])
    assert float(np.ravel(b.decode_batch)[0]) == pytest.approx(4, rel=1e-6)
    assert float(np.ravel(b.ttft_s)[0]) > 5 * float(np.ravel(a.ttft_s)[0])


def test_vllm_releases_before_0_14_schedule_synchronously():
    """vllm.toml describes the current release (async scheduling on, PR #27614); its
    [before."0.14"] table restores the synchronous scheduler for older releases, and a version
    without X.Y ('not stated', a nightly build) gets the current defaults."""
    v = load_engine("vllm")
    assert v.overlap_scheduling
    for old in ("0.12.0", "v0.11.2", "0.13.1"):
        assert not v.at_version(old).overlap_scheduling
    for new in ("0.14.0", "0.19.0", "1.0", "not stated", "nightly-5b8c30d62b754b57", ""):
        assert v.at_version(new) is v
    assert v.at_version("0.12.0").step_overhead_s == v.step_overhead_s
    # an engine without [before] tables is every release's
    assert load_engine("trtllm").at_version("0.1.0") is load_engine("trtllm")


def test_an_older_table_overrides_a_newer_one(tmp_path):
    body = lambda s: s + '\n[before."0.10"]\nmax_num_seqs = 256        # test\n'  # noqa: E731
    e = load_engine(write(tmp_path, body))
    assert e.at_version("0.9.2").max_num_seqs == 256
    assert not e.at_version("0.9.2").overlap_scheduling  # the 0.14 table applies too
    assert e.at_version("0.12.0").max_num_seqs == e.max_num_seqs


@pytest.mark.parametrize(
    "table,needle",
    [
        ('[before."0.14"]\nno_such_field = 1   # x\n', "no_such_field"),
        ('[before."recent"]\nmax_num_seqs = 1   # x\n', "recent"),
        ('[before."0.15"]\nmax_num_seqs = 0   # x\n', "max_num_seqs"),
    ],
)
def test_bad_before_tables_are_refused(tmp_path, table, needle):
    path = write(tmp_path, lambda s: s.split('[before."0.14"]')[0] + table)
    with pytest.raises(SpecError, match=needle):
        load_engine(path)
