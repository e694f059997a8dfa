"""The shared check of one book case's answers against what the public API computed."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest


def check_answers(
    case_id: str,
    case: Mapping,
    got: Mapping,
    book_differs: Mapping,
    documented_only: frozenset = frozenset(),
) -> None:
    """Every answer key is computed; formulas (strings) are confirmed by numbers (True); numbers
    match the book within the case tolerance. Where the book's printed number is not the exact
    one (`book_differs`: key -> (exact, rel, why)), the exact value is asserted too, and keys in
    `documented_only` are checked against the exact value alone."""
    tol = max(float(case["tolerance"]), 1e-9)
    for key, want in case["answer"].items():
        assert key in got, f"{case_id}: no computation for answer {key!r}"
        if isinstance(want, str):
            assert got[key] is True, f"{case_id}: formula {key} = {want!r} not confirmed by numbers"
            continue
        if (case_id, key) in book_differs:
            exact, rel, _why = book_differs[(case_id, key)]
            assert got[key] == pytest.approx(exact, rel=rel)
            if (case_id, key) in documented_only:
                continue
        assert math.isfinite(got[key])
        assert got[key] == pytest.approx(want, rel=tol), (
            f"{case_id}: {key} = {got[key]:.6g}, book {want}"
        )
