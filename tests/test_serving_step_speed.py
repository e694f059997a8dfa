"""Speed changes to the sharded serving step (issue 21) that must change no bit.

The prefill table walks only the rows a pass reads from it (`ShardedStep._read_rows`: the rows
that are not token rows, plus the rows of a matmul's block before it): each read row must be the
whole ledger's walk of it to the last bit, for dense and MLA models, MoE layouts, pipelines,
replicated KV heads and several candidates.
"""

from __future__ import annotations

import bisect

import numpy as np
import pytest

from roofline.core.ledger import OpKind
from roofline.serving.inference import PassShape, Quant, ServePlan
from roofline.serving.step import _FIELDS, GRID, ShardedStep
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


# --------------------------------------------------------------------------------------
# pass_time against the row-by-row sum on Python floats (the same IEEE operations, one at a time)
# --------------------------------------------------------------------------------------


def _interp(values, B: float) -> float:
    """A grid row at B sequences: linear between grid points, affine past the end, 0 at 0."""
    if not B > 0:
        return 0.0
    x = max(B, float(GRID[0]))
    j = min(max(bisect.bisect_left(GRID.tolist(), x) - 1, 0), len(GRID) - 2)
    lo, hi = float(values[j]), float(values[j + 1])
    f = (x - float(GRID[j])) / (float(GRID[j + 1]) - float(GRID[j]))
    return lo + f * (hi - lo)


def _reference(step: ShardedStep, b: float, k: float, chunk: float, ctx: float, ctx_p: float):
    """(time_s, {row: seconds}) of one pass of b decodes and k prefill chunks, row by row."""
    tab = step._decode_tab(ctx if b > 0 else ctx_p)
    sizes = (b + (k * chunk if k > 0 else 0.0), b + k, b)
    parts = []  # (row name, its fields) part after part, in the step's order
    for (names, keep), B in zip(step._groups(tab.names), sizes, strict=True):
        for n, r in zip(names, keep, strict=True):
            parts.append((n, [_interp(tab.stacked[f, r, :, 0], B) for f in range(len(_FIELDS))]))
    if k > 0:
        t = step._prefill_tab(np.array([k]), chunk, ctx_p, np.array([0]))
        for n, r in zip(*step._groups(t.names)[2], strict=True):
            parts.append((n, [float(t.stacked[f, r, 0]) for f in range(len(_FIELDS))]))
    N, c, m, launch = step.even_split, 0, 1, _FIELDS.index("launch")
    per: dict[str, float] = {}
    comm = 0.0
    for n, v in parts:
        per[n] = per.get(n, 0.0) + (max(v[c], v[m]) / N + v[launch])
        comm = comm + v[_FIELDS.index("comm")] / N
    rows = 0.0
    for s in per.values():
        rows = rows + s
    pp = float(step.pp[0])
    over = 0.0 + step.overhead_s + step.efficiency.layer_overhead_s * step.model.n_layers
    return pp * (rows + comm) + over, {n: pp * s for n, s in per.items()}


SHAPES = [  # (decodes, prefill chunks, chunk, decode context, prefill context)
    (37.3, 0.0, 1.0, 1500.0, 1.0),
    (37.3, 3.0, 1024.0, 1500.0, 1536.0),
    (0.0, 2.7, 512.0, 1500.0, 3000.0),
    (1.0, 1.0, 8192.0, 9000.0, 8192.0),
    (0.4, 0.0, 1.0, 700.0, 1.0),  # below the grid's first point
    (90000.0, 0.0, 1.0, 700.0, 1.0),  # past the grid's end
]


@pytest.mark.parametrize("name", ["dense tp", "mla dp-attention ep", "dense pp", "moe tp ep"])
@pytest.mark.parametrize("even_split", [1.0, 8.0])
def test_pass_time_is_the_row_by_row_sum_to_the_bit(name, even_split):
    step = _step(name)
    step.even_split = even_split
    for b, k, chunk, ctx, ctx_p in SHAPES:
        one = step.pass_time(PassShape(b, ctx, k, chunk, ctx_p))
        time_s, rows = _reference(step, b, k, chunk, ctx, ctx_p)
        assert float(one.time_s[0]) == time_s, (b, k)
        assert list(one.breakdown) == list(rows)
        assert [float(v[0]) for v in one.breakdown.values()] == list(rows.values())


@pytest.mark.parametrize("name", ["dense tp", "mla tp"])
def test_a_shapes_array_is_each_shape_alone(name):
    """A one-plan step costs a 1-d array of shapes element by element: each element is the
    single shape's pass to the bit (the fixed points pair a decode pass with a prefill pass)."""
    step = _step(name)
    b = np.array([37.3, 37.3, 5.0, 0.0])
    k = np.array([0.0, 3.0, 1.0, 2.0])
    both = step.pass_time(PassShape(b, 1500.0, k, 1024.0, 1536.0))
    for i in range(len(b)):
        alone = step.pass_time(PassShape(b[i], 1500.0 if b[i] > 0 else 1.0, k[i], 1024.0, 1536.0))
        if b[i] > 0 or not np.any(b > 0):
            assert both.time_s[i] == alone.time_s[0]
            for f in ("compute_s", "memory_s", "kv_bytes_per_chip", "launch_s"):
                assert getattr(both, f)[i] == getattr(alone, f)[0]


def test_candidates_read_their_own_plans():
    """A step of several plans costs each candidate on its own plan's table: each is the
    one-plan step's answer to the bit."""
    many = _step("candidates")
    t = many.pass_time(PassShape(np.array([20.0, 20.0, 20.0]), 1500.0, 2.0, 1024.0, 1536.0))
    model, systems, plans, quant = CASES["candidates"]
    for i, (sys_name, plan) in enumerate(zip(systems.split(), plans, strict=True)):
        one = ShardedStep(
            load_model(model), [parse_system(sys_name)], [plan], quant, many.efficiency
        )
        alone = one.pass_time(PassShape(20.0, 1500.0, 2.0, 1024.0, 1536.0))
        assert t.time_s[i] == alone.time_s[0]
        assert t.flops_per_chip[i] == alone.flops_per_chip[0]
