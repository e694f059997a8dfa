"""Speed changes to the sharded serving step (issue 21) that must change no bit.

The prefill table walks only the rows a pass reads from it (`ShardedStep._read_rows`: the rows
that are not token rows, plus the rows of a matmul's block before it): each read row must be the
whole ledger's walk of it to the last bit, for dense and MLA models, MoE layouts, pipelines,
replicated KV heads and several candidates.
"""

from __future__ import annotations

import numpy as np
import pytest

from roofline.core.ledger import OpKind
from roofline.serving.inference import Quant, ServePlan
from roofline.serving.step import ShardedStep
from roofline.specs.efficiency import default_efficiency
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system

CASES = {
    "dense tp": ("llama-3-70b", "h100:8", [ServePlan(tp=8)], Quant()),
    "dense tp > K (heads copied)": ("llama-3-70b", "tpu-v5e:4x4", [ServePlan(tp=16)], Quant()),
    "dense odd tp (KV replicated)": ("llama-3-8b", "h100:3", [ServePlan(tp=3)], Quant()),
    "dense pp": ("llama-3.1-8b", "h100:4", [ServePlan(tp=2, pp=2)], Quant(weights="fp8")),
    "mla dp-attention ep": ("deepseek-v3", "h200:16", [ServePlan(tp=1, dp=16, ep=16)], Quant()),
    "mla tp": ("deepseek-v3", "h200:16", [ServePlan(tp=16, ep=16)], Quant(weights="fp8")),
    "moe tp ep": ("mixtral-8x7b", "h100:8", [ServePlan(tp=4, dp=2, ep=8)], Quant()),
    "hybrid moe": ("qwen3-next-80b-a3b", "h100:4", [ServePlan(tp=4, ep=4)], Quant()),
    "candidates": (
        "llama-3-70b",
        "h100:8 h100:16 h100:16",
        [ServePlan(tp=8), ServePlan(tp=8, pp=2), ServePlan(tp=8, dp=2)],
        Quant(),
    ),
}


def _step(name: str) -> ShardedStep:
    model, system, plans, quant = CASES[name]
    systems = [parse_system(s) for s in system.split()]
    eff = default_efficiency(systems[0].chip.vendor)
    return ShardedStep(load_model(model), systems, plans, quant, eff)


def _read(step: ShardedStep, seqs, chunk: float, context: float) -> tuple:
    sel = np.arange(len(seqs)) % step.n
    t = step._prefill_tab(np.asarray(seqs, float), chunk, context, sel)
    names, keep = step._groups(t.names)[2]
    return names, t.stacked[:, keep]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize(("seqs", "chunk", "context"), [([3.0, 0.0, 1.0], 512.0, 2048.0)])
def test_prefill_rows_walked_alone_are_the_whole_walks(monkeypatch, name, seqs, chunk, context):
    names, part = _read(_step(name), seqs, chunk, context)
    monkeypatch.setattr(ShardedStep, "_read_rows", lambda self, ledger: ledger)
    whole_names, whole = _read(_step(name), seqs, chunk, context)
    assert names == whole_names and names  # the same rows, attention at least
    assert part.shape == whole.shape
    assert np.array_equal(part, whole)  # every field of every read row, to the bit


def test_the_sub_ledger_keeps_a_matmul_s_block_before_it():
    """MLA's prefill decompression (attn/kv_b) is a matmul that is not a token row: the rows of
    its block before it are walked too (they may gather its input once for the block); the
    rows after it and the other blocks are not."""
    step = _step("mla tp")
    from roofline.core.ledger import build_ledger

    led = build_ledger(step.walked, batch=1, seq=512, kv_seq=2048, dtypes=step.quant.policy)
    sub = [o.name for o in step._read_rows(led)]
    assert sub == ["attn/q_a", "attn/q_b", "attn/kv_a", "attn/kv_b", "attn/scores", "attn/context"]
    dense = _step("dense tp")
    led = build_ledger(dense.walked, batch=1, seq=512, kv_seq=2048, dtypes=dense.quant.policy)
    read = dense._read_rows(led)
    assert [o.name for o in read] == ["attn/scores", "attn/context"]
    assert all(o.kind == OpKind.ATTENTION for o in read)
