"""Every data file the package reads ships in the wheel: CI installs `pip install ".[test]"`
(not editable), so a TOML or template that `[tool.setuptools.package-data]` does not name
exists in the checkout but not in the installed package (the framework profiles once did
exactly that: every framework-aware command failed with "unknown framework 'ideal'")."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]
PKG = ROOT / "src" / "roofline"


def _globs() -> list[str]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return conf["tool"]["setuptools"]["package-data"]["roofline"]


def test_every_data_file_under_the_package_is_named_by_package_data():
    globs = _globs()
    data = [
        p.relative_to(PKG).as_posix()
        for p in PKG.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert data, "no data files found: the package layout moved"
    missing = [f for f in data if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missing, f"add to [tool.setuptools.package-data] in pyproject.toml: {missing}"


def test_package_data_globs_each_match_something():
    """A stale glob (a folder renamed) hides the next missing file behind a passing test."""
    files = [p.relative_to(PKG).as_posix() for p in PKG.rglob("*") if p.is_file()]
    for g in _globs():
        assert any(fnmatch.fnmatch(f, g) for f in files), g
