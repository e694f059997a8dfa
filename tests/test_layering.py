"""The data flow of docs/architecture.md, enforced: a module never imports a later one.

Every module has its own rank (its place in `ORDER`, the order docs/architecture.md reads the
package in); a module may import only modules of lower rank. A new module gets a line here,
where its imports put it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src" / "roofline"

ORDER = (
    # plain helpers: no roofline imports beyond errors, usable at any stage
    "errors",
    "units",
    "memo",
    "progress",
    "report.table",
    "report.jsonout",
    "report.text",
    # specs: inputs as validated frozen records
    "specs.catalog",
    "specs.filecache",
    "specs.schema",
    "specs.chip",
    "specs.system",
    "specs.efficiency",
    "specs.model",
    "specs.hf",
    "specs.model_catalog",
    "specs.plan",
    "specs.engines",
    "specs.framework",
    "specs",
    # the stacks' own launch files, read into (and written from) the plan vocabulary
    "launch.base",
    "launch.serving_common",
    "launch.vllm",
    "launch.sglang",
    "launch.trtllm",
    "launch",
    # the ledger and what it alone decides
    "core.ledger",
    "core.memory",
    "core.roofline",
    "core.opexpr",
    # the algebra and its pricing
    "core.rules",
    "core.mesh",
    "core.collectives",
    "core.sharding",
    "core.stack",
    "core.cost",
    "core.pricing",
    "core.walk",
    "core.matmul",
    "core.limits",
    "core.transfer",
    "core",
    # the training stacks' readers and writers (they read the stack profiles via core.stack)
    "launch.shell",
    "launch.common",
    "launch.capable",
    "launch.torchtitan",
    "launch.maxtext",
    "launch.megatron",
    "launch.nemo",
    "launch.deepspeed",
    "launch.lines",
    "training.feasibility",
    # readers of the walk
    "training.step",
    "training.pipecomm",
    "training.offload",
    "training.planner.systems",
    "training.planner.space",
    "training.planner.launchable",
    "training.planner.rank",
    "training.planner.search",
    "training.planner.deadline",
    "training.planner",
    "training",
    "serving.inference",
    "serving.steady",
    "serving.given",
    "serving.seqkv",
    "serving.step",
    "serving.predict",
    "serving.search",
    "serving",
    "verify.hlo",
    "verify.program",
    "verify.predict",
    "verify.diff",
    "verify.decode",
    "verify.distributed",
    "verify",
    "validate.stats",
    "validate.sources",
    "validate.runfile",
    "validate.dims",
    "validate.conventions",
    "validate.systems",
    "validate.training_runs",
    "validate.serving_runs",
    "validate.serving_bounds",
    "validate.serving_score",
    "validate.features",
    "validate.analysis",
    "validate.scoreboard",
    "validate.calibration",
    "validate.plot",
    "validate",
    "calibrate",
    "calibrate.params",
    "calibrate.scales",
    "calibrate.fit",
    "calibrate.evaluate",
    "calibrate.kernels",
    "calibrate.write",
    "calibrate.render",
    "calibrate.device",
    "calibrate.runs",
    "calibrate.ship",
    "calibrate.serving",
    # presentation and the command line
    "report.plots",
    "report.serving_plots",
    "report",
    "report.page",
    "report.page_charts",
    "report.page_html",
    "report.page_md",
    "cli._common",
    "cli._profile",
    "cli.chips_cmd",
    "cli.schema_cmd",
    "cli.chip_cmd",
    "cli.models_cmd",
    "cli.model_cmd",
    "cli.op_cmd",
    "cli.system_cmd",
    "cli.collective_cmd",
    "cli.matmul_cmd",
    "cli.limits_cmd",
    "cli.transfer_cmd",
    "cli.train_cmd",
    "cli.verify_cmd",
    "cli.serve_cmd",
    "cli.import_cmd",
    "cli.export_cmd",
    "cli.validate_cmd",
    "cli.calibrate_cmd",
    "cli",
    "web",
    "web.documents",
    "web.worker",
    "web.security",
    "web.form",
    "web.app",
    "cli.report_cmd",
    "cli.ui_cmd",
    "api",
    "__main__",
    "__init__",
)
STAGES = {name: rank for rank, name in enumerate(ORDER)}


def stage_of(dotted: str) -> int:
    if dotted in STAGES:
        return STAGES[dotted]
    raise KeyError(
        f"module roofline.{dotted} has no rank in tests/test_layering.py: add it to ORDER"
    )


def modules() -> list[tuple[str, Path]]:
    out = []
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC).with_suffix("")
        dotted = ".".join(rel.parts)
        if dotted.endswith(".__init__") and dotted != "__init__":
            dotted = dotted[: -len(".__init__")]
        out.append((dotted, p))
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (annotations only, never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def imports_of(path: Path) -> set[str]:
    """The roofline modules a file imports when it runs (module or function level)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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


def _graph() -> dict[str, set[str]]:
    known = {m for m, _ in modules()}
    return {m: {i for i in imports_of(p) if i in known and i != m} for m, p in modules()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (a list of modules, first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles():
    """No module reaches itself through the imports that run (module or function level)."""
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(f"roofline.{m}" for m in cycle)


def test_the_cycle_check_can_fail():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_has_a_stage():
    for dotted, _ in modules():
        stage_of(dotted)


def test_every_rank_is_one_module_and_the_note_exists():
    assert len(set(ORDER)) == len(ORDER)
    doc = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    assert "tests/test_layering.py" in doc


def test_the_rule_can_fail():
    """The checker itself: an upward import is caught."""
    assert stage_of("specs.chip") < stage_of("training.planner")
    assert stage_of("training.step") > stage_of("core.sharding")


def test_public_api_doctest():
    import doctest

    import roofline

    result = doctest.testmod(roofline, verbose=False)
    assert result.attempted >= 2 and result.failed == 0
