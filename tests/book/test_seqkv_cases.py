"""Sequence-sharded KV caches (issue 20 item 5): decode attention with the context split over
a mesh axis. The KV per chip is the book's `2·S·L·K·H·bytes` per sequence (transformers.md)
over tp·kvseq; the algebra's collective is an AllReduce of the `B·N·H/tp` attention output."""

from __future__ import annotations

import json

import pytest

from roofline.cli import main
from roofline.core.collectives import CollectiveKind, collective_cost
from roofline.core.mesh import make_mesh
from roofline.errors import PlanError
from roofline.serving.seqkv import explain, sequence_sharded_decode
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system

M70 = load_model("llama-3-70b")  # L=80, K=8, N=64, H=128
S = 2**20


def _layout(system="h100:32", tp=8, kvseq=4, batch=1, context=S):
    return sequence_sharded_decode(
        M70, parse_system(system), tp=tp, kvseq=kvseq, batch=batch, context=context
    )


def test_kv_per_chip_is_the_books_cache_over_tp_and_kvseq():
    s = _layout(batch=2)
    total = 2 * S * 80 * 8 * 128 * 2 * 2  # 2·S·L·K·H·bf16, two sequences
    assert s.kv_bytes_tp_only == pytest.approx(total / 8)
    assert s.kv_bytes == pytest.approx(total / (8 * 4))
    assert s.kv_read_s == pytest.approx(s.kv_bytes / 3.35e12)


def test_the_algebra_derives_one_allreduce_of_the_output():
    s = _layout(batch=2)
    scores, output = s.einsums
    assert scores["collectives"] == []
    (c,) = output["collectives"]
    assert c["kind"] == "all-reduce" and c["axes"] == ["kvseq"]
    assert c["bytes"] == pytest.approx(2 * 64 * 128 * 2 / 8)  # B·N·H/tp bf16
    mesh = make_mesh(parse_system("h100:32"), [("replica", 1), ("kvseq", 4), ("tensor", 8)])
    want = collective_cost(CollectiveKind.ALL_REDUCE, c["bytes"], ("kvseq",), mesh).time_s
    assert s.out_allreduce_s == pytest.approx(want)
    stats = collective_cost(CollectiveKind.ALL_REDUCE, 2 * 4 * 2 * 64 / 8, ("kvseq",), mesh)
    assert s.stats_allreduce_s == pytest.approx(stats.time_s)
    assert s.extra_comm_s == pytest.approx(80 * (s.out_allreduce_s + s.stats_allreduce_s))


def test_breakeven_context_is_where_the_saved_read_equals_the_extra_collectives():
    s = _layout()
    at = _layout(context=s.breakeven_context)
    saved = at.kv_read_tp_only_s - at.kv_read_s
    assert saved == pytest.approx(at.extra_comm_s, rel=1e-9)
    assert (
        _layout(context=2 * s.breakeven_context).kv_read_tp_only_s
        - _layout(context=2 * s.breakeven_context).kv_read_s
        > s.extra_comm_s
    )


def test_one_shard_is_the_tensor_parallel_layout():
    s = _layout(system="h100:8", kvseq=1)
    assert s.kv_bytes == s.kv_bytes_tp_only and s.extra_comm_s == 0
    assert s.breakeven_context is None
    assert "breakeven_context_reason" in s.to_dict()


def test_more_kv_heads_than_tp_ways_put_tensor_on_the_query_groups():
    """tp=16 > K=8: the KV heads replicate (memory_per_chip) and the queries split over tensor."""
    s = _layout(system="h100:64", tp=16, kvseq=4)
    assert "G_{tensor}" in s.einsums[0]["expr"]
    assert s.kv_bytes_tp_only == pytest.approx(2 * S * 80 * 8 * 128 * 2 * 2 / 16)


def test_a_layout_that_does_not_divide_the_system_is_refused():
    with pytest.raises(PlanError, match="tp·kvseq"):
        _layout(kvseq=3)


def test_long_context_fits_only_sharded():
    """8M tokens of LLaMA-3 70B KV (2.7 TB bf16): not on 8 H100s, on 8 × 8 with 8-way kvseq."""
    assert not _layout(system="h100:8", kvseq=1, context=2**23).fits
    assert _layout(system="h100:64", kvseq=8, context=2**23).fits
    assert "DOES NOT FIT" in "\n".join(explain(_layout(system="h100:8", kvseq=1, context=2**23)))


def test_cli(capsys):
    args = ["serve", "--system", "h100:32", "--plan", "tp=8", "--kv-seq", "4", "--batch", "1"]
    assert main([*args, "--context", "1Mi"]) == 0
    out = capsys.readouterr().out
    assert "by the sharded-einsum algebra" in out and "all-reduce_{kvseq}" in out
    assert main([*args, "--context", "1Mi", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["seq_kv"]
    assert doc["kvseq"] == 4 and doc["kv_bytes"] == pytest.approx(_layout().kv_bytes)
    assert main(args) == 2
    assert "--context" in capsys.readouterr().err


def test_cli_refuses_other_degrees(capsys):
    args = ["serve", "--system", "h100:32", "--plan", "tp=4,pp=2", "--kv-seq", "4"]
    assert main([*args, "--batch", "1", "--context", "1Mi"]) == 2
    assert "tp × kvseq" in capsys.readouterr().err
