"""The data flow of DESIGN.md, enforced: a lower stage never imports a higher one.

specs -> ledger -> roofline -> sharding/communication -> training/planner -> verify -> report -> cli
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src" / "roofline"

# stage of each module (dotted name under roofline); subpackages inherit their prefix's stage
STAGES = {
    "units": 0,
    "errors": 0,
    "specs": 1,
    "ledger": 2,
    "memory": 2,
    "roofline": 3,
    "opexpr": 3,
    "rules": 4,
    "mesh": 4,
    "collectives": 4,
    "sharding": 4,
    "cost": 5,
    "training": 6,
    "planner": 6,
    "verify": 7,
    "validate": 7,
    "calibrate": 7,
    "report": 8,
    # plain formatting helpers that import nothing from roofline: usable at any stage
    "report.table": 0,
    "report.jsonout": 0,
    "cli": 9,
    "web": 9,  # the UI: a consumer like the CLI (runs its commands for their documents)
    "__main__": 9,
    "__init__": 10,
}


def stage_of(dotted: str) -> int:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in STAGES:
            return STAGES[key]
    raise KeyError(f"module roofline.{dotted} has no stage in tests/test_layering.py: add it")


def modules() -> list[tuple[str, Path]]:
    out = []
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC).with_suffix("")
        dotted = ".".join(rel.parts)
        if dotted.endswith(".__init__") and dotted != "__init__":
            dotted = dotted[: -len(".__init__")]
        out.append((dotted, p))
    return out


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("roofline"):
            found.add(node.module[len("roofline.") :] if node.module != "roofline" else "__init__")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("roofline."):
                    found.add(a.name[len("roofline.") :])
    return found


@pytest.mark.parametrize("dotted,path", modules(), ids=[m for m, _ in modules()])
def test_no_upward_import(dotted, path):
    mine = stage_of(dotted)
    for imp in imports_of(path):
        theirs = stage_of(imp)
        assert theirs <= mine, (
            f"roofline.{dotted} (stage {mine}) imports roofline.{imp} (stage {theirs}): a lower stage may not import a higher one"
        )


def test_every_module_has_a_stage():
    for dotted, _ in modules():
        stage_of(dotted)


def test_the_rule_can_fail():
    """The checker itself: an upward import is caught."""
    assert stage_of("specs.chip") < stage_of("planner")
    assert stage_of("training") > stage_of("sharding")


def test_public_api_doctest():
    import doctest

    import roofline

    result = doctest.testmod(roofline, verbose=False)
    assert result.attempted >= 2 and result.failed == 0
