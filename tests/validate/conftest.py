"""Shared fixtures: the public training report is computed once per session (~2 s)."""

from __future__ import annotations

import pytest

from roofline.validate import load_runs, validate


@pytest.fixture(scope="session")
def training_report():
    return validate("training")


@pytest.fixture(scope="session")
def training_entries():
    return {e["id"]: e for e in load_runs("training").entries}


@pytest.fixture(scope="session")
def serving_file():
    return load_runs("serving")


@pytest.fixture(scope="session")
def serving_entries(serving_file):
    return {e["id"]: e for e in serving_file.entries}
