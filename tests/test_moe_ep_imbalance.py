"""The expert-parallel load imbalance of a routed expert GEMM (ledger.expert_parallel_imbalance)
in closed form, and the serving step's routed rows paying it only where experts are split over
ranks (ep > 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from roofline.core.ledger import expected_max_std_normal, expert_parallel_imbalance
from roofline.serving.inference import Quant, parse_serve_plan
from roofline.serving.step import GRID, ShardedStep
from roofline.specs.efficiency import PEAK
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system


def test_expected_max_of_normals_closed_forms():
    assert expected_max_std_normal(1) == 0.0
    assert expected_max_std_normal(2) == pytest.approx(1.0 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max_std_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-9)
    # n = 5: 5/(4·√π) + 15/(2π^1.5)·asin(1/3) (the order-statistic closed form)
    e5 = 5 / (4 * math.sqrt(math.pi)) + 15 / (2 * math.pi**1.5) * math.asin(1 / 3)
    assert expected_max_std_normal(5) == pytest.approx(e5, rel=1e-9)


def test_imbalance_closed_form():
    """Two ranks, DeepSeek-V3's routing (E = 256, k = 8), 4096 tokens: the busier rank's share
    is 1 + (1/√π)·sqrt(2·(E − k) / (T·k·(E − 1)))."""
    E, k, T = 256, 8, 4096.0
    want = 1 + math.sqrt(2 * (E - k) / (T * k * (E - 1))) / math.sqrt(math.pi)
    assert expert_parallel_imbalance(E, k, T, 2) == pytest.approx(want, rel=1e-9)
    assert expert_parallel_imbalance(E, k, T, 1) == 1.0
    # more tokens: the spread over the mean falls as 1/sqrt(T)
    a = expert_parallel_imbalance(E, k, T, 8) - 1
    b = expert_parallel_imbalance(E, k, 4 * T, 8) - 1
    assert b == pytest.approx(a / 2, rel=1e-9)


def test_imbalance_cap():
    """One token, k = 4 of E = 8 experts, one expert per rank over 8 ranks: a rank takes at most
    1 of the token's 4 experts against a mean of 4/8, so the ratio is capped at 2 (the normal
    approximation alone would give 1 + e_8·sqrt(8·4/(4·7)) > 2)."""
    e8 = expected_max_std_normal(8)
    assert 1 + e8 * math.sqrt(8 * 4 / (4 * 7)) > 2
    assert expert_parallel_imbalance(8, 4, 1.0, 8) == pytest.approx(2.0)
    # below the cap, one token over 8 ranks of DeepSeek's routing is the normal approximation
    want = 1 + e8 * math.sqrt(8 * 248 / (8 * 255))
    assert expert_parallel_imbalance(256, 8, 1.0, 8) == pytest.approx(want, rel=1e-12)


def test_step_routed_rows_pay_the_imbalance_under_ep():
    """tp=8 (each expert split over the ranks) and tp=8,ep=8 (whole experts per rank) walk the
    same per-chip FLOPs; the ep plan's routed expert GEMMs take the imbalance times longer, every
    other row the same."""
    model = load_model("deepseek-v3")
    q = Quant(weights="fp8", kv="fp8", compute="fp8")
    sys = [parse_system("h200:8")]
    tabs = {
        p: ShardedStep(model, sys, [parse_serve_plan(p)], q, PEAK)._decode_tab(2048.0)
        for p in ("tp=8", "tp=8,ep=8")
    }
    a, b = tabs["tp=8"], tabs["tp=8,ep=8"]
    assert a.names == b.names
    f = expert_parallel_imbalance(model.moe.n_experts, model.moe.top_k, GRID, 8)
    for i, n in enumerate(a.names):
        ratio = b.compute[i, :, 0] / np.maximum(a.compute[i, :, 0], 1e-300)
        want = f if n in ("moe/gate", "moe/up", "moe/down") else np.ones_like(f)
        np.testing.assert_allclose(
            ratio[a.compute[i, :, 0] > 0], want[a.compute[i, :, 0] > 0], rtol=1e-9
        )


def test_imbalance_against_simulated_uniform_routing():
    """A measurement: 400 passes of 256 tokens, each routed to 4 distinct of 64 experts uniformly
    at random, 8 experts a rank over 8 ranks; the mean busiest-rank load over the mean load is
    the closed form's within 5% of its excess over 1 (measured 1.1210 against 1.1228: the
    normal approximation's error plus the sampling error)."""
    rng = np.random.default_rng(0)
    E, k, T, ep, trials = 64, 4, 256, 8, 400
    picks = np.argpartition(rng.random((trials, T, E)), k, axis=2)[:, :, :k]
    loads = np.stack([np.sum(picks // (E // ep) == r, axis=(1, 2)) for r in range(ep)], axis=1)
    measured = float(np.mean(loads.max(axis=1)) / (T * k / ep))
    want = expert_parallel_imbalance(E, k, float(T), ep)
    assert measured - 1 == pytest.approx(want - 1, rel=0.05)


def test_uniform_spread_is_a_lower_bound_under_group_limited_routing():
    """A measurement: DeepSeek-V3's group-limited router (256 experts in 8 groups of 32, a group
    scored by its top-2 expert scores, the top 4 groups kept, the top 8 experts inside them;
    deepseek-ai/DeepSeek-V3 config.json n_group = 8, topk_group = 4) with independent uniform
    scores, at ep = 8 (one group a rank): one token's count per rank varies more than under
    uniform routing (the variance the imbalance uses), so the imbalance is a lower bound."""
    rng = np.random.default_rng(1)
    N, E, G, k = 4000, 256, 8, 8
    g = E // G
    s = rng.random((N, E))
    group_score = np.sort(s.reshape(N, G, g), axis=2)[:, :, -2:].sum(axis=2)
    keep = np.zeros((N, G), bool)
    np.put_along_axis(keep, np.argsort(group_score, axis=1)[:, -4:], True, axis=1)
    chosen = np.argsort(np.where(np.repeat(keep, g, axis=1), s, -1.0), axis=1)[:, -k:]
    counts = np.stack([np.sum(chosen // g == r, axis=1) for r in range(G)], axis=1)
    uniform = k * (1 / G) * (1 - 1 / G) * (E - k) / (E - 1)
    assert np.allclose(counts.sum(axis=1), k)
    assert counts.var(axis=0).mean() > 1.3 * uniform
