"""Error statistics: closed forms on small sets."""

from __future__ import annotations

import pytest

from roofline.validate.stats import breakdown, relative_error, summarize


def test_relative_error_sign():
    assert relative_error(120, 100) == pytest.approx(0.2)  # optimistic: predicted too fast
    assert relative_error(80, 100) == pytest.approx(-0.2)


def test_summary_closed_form():
    s = summarize([0.05, -0.15, 0.30, 0.10], total=5)
    assert s["n"] == 4 and s["coverage"] == pytest.approx(0.8)
    assert s["median_abs_error"] == pytest.approx((0.10 + 0.15) / 2)
    assert s["mean_abs_error"] == pytest.approx(0.15)
    assert s["within_10"] == pytest.approx(0.5)  # 0.05 and 0.10 (inclusive)
    assert s["within_20"] == pytest.approx(0.75)
    assert s["bias"] == pytest.approx((0.05 + 0.10) / 2)  # median signed
    assert s["mean_error"] == pytest.approx(0.075)


def test_errors_of_opposite_sign_do_not_cancel_in_the_abs_statistics():
    s = summarize([0.5, -0.5])
    assert s["median_abs_error"] == pytest.approx(0.5) and s["bias"] == pytest.approx(0.0)


def test_empty_summary_is_null_not_nan():
    s = summarize([], total=3)
    assert (
        s["n"] == 0 and s["coverage"] == 0 and s["median_abs_error"] is None and s["bias"] is None
    )


def test_breakdown_groups_and_counts_uncovered():
    items = [("a", 0.1), ("a", None), ("b", -0.3)]
    out = breakdown(items, key=lambda i: i[0], error=lambda i: i[1])
    assert out["a"]["n"] == 1 and out["a"]["n_total"] == 2
    assert out["b"]["bias"] == pytest.approx(-0.3)
