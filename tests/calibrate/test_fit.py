"""The fitting machinery on synthetic measurements whose true parameters are known: the fit
recovers them, refuses what the data cannot identify (and says why), and cross-validates."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.calibrate.fit import Problem, cross_validate, fit, identify
from roofline.calibrate.kernels import Kernel, KernelKind, predict_time_s
from roofline.calibrate.params import apply_values, prior_of
from roofline.specs.chip import load_chip
from roofline.specs.efficiency import load_profile

H100 = load_chip("h100")
BASE = load_profile("datasheet")
TRUTH = {
    "mm_fraction.bf16": 0.72,
    "mm_fraction.fp8": 0.61,
    "k_half": 700.0,
    "kernel_fixed_s": 8e-6,
    "grouped_fraction": 0.7,
    "hbm": 0.82,
    "vector": 0.55,
    "attn_fwd": 0.8,
    "attn_bwd": 0.5,
    "attn_softmax_flops": 400.0,
    "attn_causal": 0.75,
}
NAMES = list(TRUTH)
PRIOR = prior_of(BASE, "hopper", NAMES)


def near_prior(**changes):
    """The datasheet values with a few parameters moved: the others are then exactly right."""
    return dict(PRIOR, **changes)


def mm(m, n, k, dtype="bf16", **kw):
    return Kernel(
        KernelKind.MATMUL, f"{dtype} {m}x{n}x{k}{' g' if kw else ''}", dtype, m, n, k, **kw
    )


def attn(hd, causal, bwd, t=4096):
    return Kernel(
        KernelKind.ATTENTION,
        f"attn d{hd} c{causal} b{bwd}",
        "bf16",
        batch=2,
        heads=4096 // hd,
        q_len=t,
        kv_len=t,
        head_dim=hd,
        causal=causal,
        backward=bwd,
    )


def sweep() -> list[Kernel]:
    ks = [mm(8192, 8192, k) for k in (256, 1024, 4096, 16384)]
    ks += [mm(8192, 8192, k, "fp8") for k in (512, 4096, 16384)]
    ks += [mm(m, 4096, 4096) for m in (128, 512)] + [mm(256, 256, 256), mm(512, 1024, 512)]
    ks += [
        mm(16384, 4096, 4096, groups=8, grouped=True),
        mm(32768, 2048, 7168, groups=16, grouped=True),
    ]
    ks += [
        Kernel(KernelKind.COPY, "copy", nbytes=2e9),
        Kernel(KernelKind.VECTOR, "norm", nbytes=1e9),
    ]
    ks += [attn(hd, c, b) for hd in (64, 128, 256) for c in (False, True) for b in (False, True)]
    return ks


def problem(kernels, truth=TRUTH, noise=0.0, labels=None) -> Problem:
    prof = apply_values(BASE, "hopper", truth)
    measured = predict_time_s(prof, H100, kernels)
    if noise:
        measured = measured * np.exp(np.random.default_rng(1).normal(0, noise, len(measured)))

    def predict(values, idx):
        return predict_time_s(apply_values(BASE, "hopper", values), H100, [kernels[i] for i in idx])

    prior = prior_of(BASE, "hopper", NAMES)
    return Problem(tuple(k.label for k in kernels), measured, predict, prior, labels or {})


def test_fit_recovers_the_true_parameters():
    r = fit(problem(sweep()), NAMES)
    assert r.refused == ()
    for n, v in TRUTH.items():
        assert r.values[n] == pytest.approx(v, rel=0.02), n
    assert np.max(np.abs(r.error_after)) < 1e-3 < np.median(np.abs(r.error_before))


def test_fit_with_noise_stays_close():
    r = fit(problem(sweep(), noise=0.01), NAMES)
    for n in (
        "mm_fraction.bf16",
        "mm_fraction.fp8",
        "hbm",
        "vector",
        "grouped_fraction",
        "attn_fwd",
    ):
        assert r.values[n] == pytest.approx(TRUTH[n], rel=0.05), n


def test_a_parameter_nothing_depends_on_is_refused_with_the_reason():
    no_attention = [k for k in sweep() if k.kind != KernelKind.ATTENTION]
    r = fit(problem(no_attention), NAMES)
    refused = {x.name: x.reason for x in r.refused}
    assert set(refused) == {"attn_fwd", "attn_bwd", "attn_softmax_flops", "attn_causal"}
    assert all("Jacobian column ~0" in why for why in refused.values())
    assert r.values["attn_fwd"] == r.values["attn_fwd"] == BASE.family_named("hopper").attn_fwd
    assert r.values["hbm"] == pytest.approx(TRUTH["hbm"], rel=0.02)  # the rest still fits


def test_collinear_parameters_are_refused():
    # every GEMM grouped: the data sees only mm_fraction x grouped_fraction
    only_grouped = [
        mm(16384, 4096, 4096, groups=8, grouped=True),
        mm(32768, 8192, 8192, groups=16, grouped=True),
        mm(65536, 8192, 8192, groups=8, grouped=True),
    ]
    p = problem(only_grouped, near_prior(**{"mm_fraction.bf16": 0.72, "grouped_fraction": 0.7}))
    ok, refused = identify(p, ["mm_fraction.bf16", "grouped_fraction"])
    assert ok == ("mm_fraction.bf16",)
    assert (
        refused[0].name == "grouped_fraction"
        and "collinear with mm_fraction.bf16" in refused[0].reason
    )
    # and only the product is pinned down
    r = fit(p, ["mm_fraction.bf16", "grouped_fraction"])
    prod = r.values["mm_fraction.bf16"] * r.values["grouped_fraction"]
    assert prod == pytest.approx(0.72 * 0.7, rel=0.01)


def test_causal_efficiency_needs_both_masks():
    only_causal = [attn(hd, True, b) for hd in (64, 128) for b in (False, True)]
    _, refused = identify(problem(only_causal), ["attn_fwd", "attn_bwd", "attn_causal"])
    assert [x.name for x in refused] == ["attn_causal"]


def test_cross_validation_leaves_each_group_out():
    ks = sweep() + [Kernel(KernelKind.COPY, f"copy {i}", nbytes=1e8 * (i + 1)) for i in range(3)]
    labels = {"source": [f"s{i % 3}" for i in range(len(ks))]}
    truth = near_prior(**{"mm_fraction.bf16": 0.7, "hbm": 0.8, "k_half": 900.0})
    cv = cross_validate(
        problem(ks, truth, labels=labels), ["mm_fraction.bf16", "hbm", "k_half"], "source"
    )
    assert [f.held_out for f in cv.folds] == ["s0", "s1", "s2"]
    assert sum(f.n_test for f in cv.folds) == len(ks)
    spread = cv.spread()
    assert spread["hbm"]["folds"] == 3 and spread["hbm"]["std"] < 1e-3
    assert spread["k_half"]["mean"] == pytest.approx(900.0, rel=0.01)
    assert np.max(np.abs(cv.error_after)) < 1e-3
    d = cv.to_dict()
    assert d["median_abs_error_after"] < d["median_abs_error_before"]
    # each held-out observation's error, by id: every id once, the fold's median from them
    per_run = {i: e for f in d["folds"] for i, e in f["errors_after"].items()}
    assert d["mean_abs_error_after"] == pytest.approx(np.mean(np.abs(list(per_run.values()))))
    assert sorted(per_run) == sorted(k.label for k in ks)
    for f in d["folds"]:
        med = np.median(np.abs(list(f["errors_after"].values())))
        assert f["median_abs_error_after"] == pytest.approx(med)


def test_held_out_error_is_honest_when_groups_differ():
    """Two 'sources' with different true HBM efficiency: leave-one-out error stays large."""
    copies = [Kernel(KernelKind.COPY, f"copy{i}", nbytes=1e9 * (i + 1)) for i in range(6)]
    pa, pb = problem(copies, near_prior(hbm=0.9)), problem(copies, near_prior(hbm=0.6))
    measured = np.concatenate([pa.measured[:3], pb.measured[3:]])
    both = Problem(pa.ids, measured, pa.predict, pa.prior, {"source": ["a"] * 3 + ["b"] * 3})
    cv = cross_validate(both, ["hbm"], "source")
    assert np.median(np.abs(cv.error_after)) > 0.3  # a fit on one source does not transfer
    assert fit(both, ["hbm"]).values["hbm"] == pytest.approx(
        np.sqrt(0.9 * 0.6), rel=0.05
    )  # log-residual middle


def test_problem_rejects_bad_measurements():
    with pytest.raises(ValueError):
        Problem(("a",), np.array([-1.0]), lambda v, i: np.ones(len(i)), {})


@pytest.mark.parametrize("k", [1, 3])
def test_a_pooled_parameter_moves_k_over_k_plus_one_of_the_way_from_its_pools_mean(k):
    # two groups of k observations, each moved only by its own parameter (log prediction
    # linear in it, sensitivity s); their truths differ by 2*delta: one pseudo-run at the pool's
    # mean leaves each k/(k+1) of the way from the mean to its own truth (k=3: 3/4), as a chip
    # family's GEMM deviation moves in log space
    from roofline.specs.efficiency import Param

    s, truth = 2.0, {"a": 0.3, "b": 0.1}
    names = ["a", "b"]
    group = np.array([0] * k + [1] * k)
    masks = {"a": group == 0, "b": group == 1}

    def predict(values, idx):
        v = np.array([values[names[g]] - truth[names[g]] for g in group[idx]])
        return np.exp(s * v)

    problem = Problem(
        tuple(f"r{i}" for i in range(2 * k)),
        np.ones(2 * k),
        predict,
        {"a": 0.2, "b": 0.2},
        scope=lambda n: masks[n],
        bounds=lambda n: Param(0.0, 1.0, "s", "a fixed time"),
        pools={n: ("overhead", np.where(masks[n], s, 0.0)) for n in names},
    )
    r = fit(problem, names)
    mean, delta = 0.2, 0.1
    assert r.values["a"] == pytest.approx(mean + delta * k / (k + 1), abs=1e-4)
    assert r.values["b"] == pytest.approx(mean - delta * k / (k + 1), abs=1e-4)
    unpooled = fit(
        Problem(
            problem.ids,
            problem.measured,
            predict,
            problem.prior,
            scope=problem.scope,
            bounds=problem.bounds,
        ),
        names,
    )
    assert unpooled.values["a"] == pytest.approx(0.3, abs=1e-4)
