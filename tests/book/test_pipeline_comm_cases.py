"""Pipeline communication per training step (issue 20 item 5): gpus.md's PP closed forms.

The hop is the walk's record and the exposed time the timeline's `pp` term; these tests hold
them to the book: one hop moves one microbatch's `2·B·D/N_MB` bytes (B tokens per replica), in
`bytes/W` at the link's bandwidth, and `T_PP = 2BD/(W·N_MB)·(N_MB + N_stages − 2)`.
"""

from __future__ import annotations

import json

import pytest

from roofline.cli import main
from roofline.specs.efficiency import PEAK
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.pipecomm import pipeline_traffic
from roofline.training.step import Workload, evaluate_plan, parse_plan

MODEL = load_model("llama-3-8b")
BATCH = 1048576  # tokens per step


def _cost(system: str, plan: str, seq: int = 4096):
    return evaluate_plan(
        MODEL,
        parse_system(system),
        Workload(BATCH, seq),
        parse_plan(plan),
        efficiency=PEAK,
        framework="ideal",
    )


def test_hop_bytes_and_time_are_the_books():
    """h100:16, dp=4 x pp=4 inside a node: a hop is 2·(B/dp)·D/M bytes over one NVLink egress."""
    sysm = parse_system("h100:16")
    c = _cost("h100:16", "dp=4,pp=4,microbatch=8")
    t = pipeline_traffic(c)
    per_replica, M, p = BATCH / 4, 8, 4
    hop_bytes = 2 * per_replica * MODEL.d_model / M
    assert t.hop_bytes_per_chip == pytest.approx(hop_bytes)
    w = sysm.chip.nvlink_bw_bytes_per_s
    assert t.hop_time_s == pytest.approx(hop_bytes / w)
    book = 2 * per_replica * MODEL.d_model / (w * M) * (M + p - 2)
    assert t.book_t_pp_s == pytest.approx(book)
    assert t.book_hops == M + p - 2


def test_counts_per_microbatch_and_per_step():
    t = pipeline_traffic(_cost("h100:16", "dp=4,pp=4,microbatch=8"))
    assert (t.stages, t.microbatches, t.virtual_stages) == (4, 8, 1)
    assert t.hops_per_microbatch == 2 * (4 - 1)
    assert t.sends_per_chip == 2 * 8
    assert t.bytes_per_chip == pytest.approx(16 * t.hop_bytes_per_chip)
    assert t.send_time_s == pytest.approx(16 * t.hop_time_s)


def test_exposed_is_the_step_models_pp_term():
    """The exposed time is the timeline's own term (fill and drain: 2·(p − 1) hops)."""
    c = _cost("h100:16", "dp=4,pp=4,microbatch=8")
    t = pipeline_traffic(c)
    assert t.exposed_time_s == c.comm_time_s["pp"] > 0
    assert t.exposed_hops == pytest.approx(2 * (4 - 1))


def test_interleaved_chunks_multiply_the_boundaries():
    t = pipeline_traffic(_cost("h100:16", "dp=4,pp=4,microbatch=8,schedule=interleaved,virtual=2"))
    assert t.hops_per_microbatch == 2 * (4 * 2 - 1)
    assert t.sends_per_chip == 2 * 8 * 2


def test_tensor_parallel_shards_the_hop_only_with_sequence_parallelism():
    """Megatron SP keeps the block boundary's activations split over tensor: the hop shrinks by tp."""
    plain = pipeline_traffic(_cost("h100:16", "tp=2,dp=2,pp=4,microbatch=8"))
    sp = pipeline_traffic(_cost("h100:16", "tp=2,dp=2,pp=4,microbatch=8,megatron_sp=1"))
    assert plain.hop_bytes_per_chip == pytest.approx(2 * (BATCH / 2) * MODEL.d_model / 8)
    assert sp.hop_bytes_per_chip == pytest.approx(plain.hop_bytes_per_chip / 2)


def test_no_pipeline_sends_nothing():
    t = pipeline_traffic(_cost("h100:8", "fsdp=8"))
    assert t.stages == 1 and t.sends_per_chip == 0 and t.bytes_per_chip == 0
    assert t.explain() == ["no pipeline (pp=1): nothing crosses a stage boundary"]


def test_train_prints_and_writes_it(capsys):
    args = ["train", "--model", "llama-3-8b", "--system", "h100:16", "--framework", "ideal"]
    args += ["--plan", "dp=4,pp=4,microbatch=8", "--batch-tokens", str(BATCH)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "pipeline communication per step:" in out
    assert "hops per microbatch: 2·(p·v − 1) = 2·(4·1 − 1) = 6" in out
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    pc = doc["pipeline_comm"]
    assert pc["sends_per_chip"] == 16 and pc["hops_per_microbatch"] == 6
    assert pc["exposed_time_s"] == pytest.approx(doc["comm_time_s"]["pp"])


def test_train_without_a_pipeline_prints_no_block(capsys):
    args = ["train", "--model", "llama-3-8b", "--system", "h100:8", "--plan", "fsdp=8"]
    assert main([*args, "--batch-tokens", str(BATCH)]) == 0
    assert "pipeline communication" not in capsys.readouterr().out
