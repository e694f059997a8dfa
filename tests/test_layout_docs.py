"""The README's layout section and docs/architecture.md match the tree (issue 21 item 1).

Every package and loose module of src/roofline is named in the README's layout block, and
every module or attribute docs/architecture.md names in backticks (`core.walk.overlap_class`,
`training/step.py`) exists, so neither can go stale after a move or a rename.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SRC = ROOT / "src" / "roofline"
PACKAGES = (
    "core",
    "training",
    "serving",
    "specs",
    "validate",
    "calibrate",
    "verify",
    "report",
    "web",
    "cli",
)


def _layout_block() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Layout")
    a = text.index("```", start) + 3
    return text[a : text.index("```", a)]


def test_readme_layout_names_every_package_and_loose_module():
    block = _layout_block()
    for p in sorted(SRC.iterdir()):
        if p.is_dir() and (p / "__init__.py").exists():
            assert f"{p.name}/" in block, f"README layout does not name the package {p.name}/"
        elif p.suffix == ".py" and p.stem not in ("__init__", "__main__"):
            assert p.name in block, f"README layout does not name the module {p.name}"
    for sub in sorted((SRC / "training").iterdir()):
        if sub.is_dir() and (sub / "__init__.py").exists():
            assert f"{sub.name}/" in block


def test_readme_layout_names_nothing_that_is_gone():
    block = _layout_block()
    left = "\n".join(re.split(r"\s{2,}", line.strip())[0] for line in block.splitlines())
    for name in re.findall(r"\b([a-z_]+)/", left):
        if name in (
            "src",
            "roofline",
            "benchmarks",
            "docs",
            "tests",
            "book",
            "fuzz",
            "web",
            "profiles",
            "frameworks",
            "engines",
        ):
            continue
        hits = list(SRC.rglob(name))
        assert any(h.is_dir() for h in hits), (
            f"README layout names {name}/, which is not in src/roofline"
        )


@cache
def _top_level_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def _resolve(ref: str) -> str | None:
    """None when `ref` (dotted, from a package) names a module and, if any, a top-level name in it."""
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        base = SRC.joinpath(*parts[:i])
        mod = base.with_suffix(".py") if not base.is_dir() else base / "__init__.py"
        if mod.exists():
            rest = parts[i:]
            if rest and rest[0] not in _top_level_names(mod) and rest[0] != "*":
                return f"{'.'.join(parts[:i])} has no top-level name {rest[0]!r}"
            return None
    return f"no module {ref}"


def _architecture_refs() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    refs = set()
    for m in re.finditer(r"`([a-z_]+(?:[./][A-Za-z_*][\w]*)+)`", text):
        ref = m.group(1).removesuffix(".py").replace("/", ".")
        if ref.split(".")[0] in PACKAGES:
            refs.add(ref)
    return sorted(refs)


@pytest.mark.parametrize("ref", _architecture_refs())
def test_architecture_names_what_exists(ref):
    assert _resolve(ref) is None, f"docs/architecture.md names `{ref}`: {_resolve(ref)}"


def test_the_doc_check_can_fail():
    assert _resolve("core.walk") is None
    assert _resolve("core.nothing_here") is not None
    assert _resolve("core.walk.no_such_function") is not None
    assert len(_architecture_refs()) > 30
