"""roofline: compute, don't guess, the performance of large Transformers.

Public API (re-exports only; see DESIGN.md for the data flow specs -> ledger -> sharding ->
cost -> training -> planner -> report/cli):

>>> import roofline as rl
>>> round(rl.load_chip("tpu-v5e").critical_intensity("bf16"))
240
>>> round(rl.count_params(rl.load_model("llama-3-70b")).total / 1e9, 2)
70.55
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Public name -> the module that defines it. Imported on first use (PEP 562), so `import
# roofline` and the CLI's trivial commands (`roofline chips`) do not pay for numpy, the planner
# or jax; tests/fuzz/test_cli_fuzz.py::test_trivial_commands_import_little checks this.
_LAZY: dict[str, str] = {
    "CollectiveCost": "roofline.collectives",
    "CollectiveKind": "roofline.collectives",
    "collective_cost": "roofline.collectives",
    "PlanError": "roofline.errors",
    "RooflineError": "roofline.errors",
    "ShardingError": "roofline.errors",
    "SpecError": "roofline.errors",
    "Ledger": "roofline.ledger",
    "Op": "roofline.ledger",
    "build_ledger": "roofline.ledger",
    "count_params": "roofline.ledger",
    "flops_per_token": "roofline.ledger",
    "kv_cache_bytes_per_token": "roofline.ledger",
    "parse_optimizer": "roofline.memory",
    "parse_remat": "roofline.memory",
    "Mesh": "roofline.mesh",
    "make_mesh": "roofline.mesh",
    "PlanResult": "roofline.planner",
    "plan_training": "roofline.planner",
    "analyze": "roofline.roofline",
    "analyze_op": "roofline.roofline",
    "critical_batch": "roofline.roofline",
    "parse_degrees": "roofline.rules",
    "rules_for": "roofline.rules",
    "EinsumPlan": "roofline.sharding",
    "Spec": "roofline.sharding",
    "parse_einsum": "roofline.sharding",
    "parse_spec": "roofline.sharding",
    "plan_einsum": "roofline.sharding",
    "Chip": "roofline.specs.chip",
    "load_chip": "roofline.specs.chip",
    "Efficiency": "roofline.specs.efficiency",
    "ModelSpec": "roofline.specs.model",
    "load_model": "roofline.specs.model",
    "System": "roofline.specs.system",
    "parse_system": "roofline.specs.system",
    "Plan": "roofline.training",
    "StepCost": "roofline.training",
    "Workload": "roofline.training",
    "balance_batch": "roofline.training",
    "evaluate_plan": "roofline.training",
    "parse_plan": "roofline.training",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name == "__version__":  # importlib.metadata is slow to import: only when asked
        globals()[name] = _version()
        return globals()[name]
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'roofline' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("roofline")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


if TYPE_CHECKING:  # static re-exports for type checkers and IDEs
    from roofline.collectives import CollectiveCost as CollectiveCost
    from roofline.collectives import CollectiveKind as CollectiveKind
    from roofline.collectives import collective_cost as collective_cost
    from roofline.errors import PlanError as PlanError
    from roofline.errors import RooflineError as RooflineError
    from roofline.errors import ShardingError as ShardingError
    from roofline.errors import SpecError as SpecError
    from roofline.ledger import Ledger as Ledger
    from roofline.ledger import Op as Op
    from roofline.ledger import build_ledger as build_ledger
    from roofline.ledger import count_params as count_params
    from roofline.ledger import flops_per_token as flops_per_token
    from roofline.ledger import kv_cache_bytes_per_token as kv_cache_bytes_per_token
    from roofline.memory import parse_optimizer as parse_optimizer
    from roofline.memory import parse_remat as parse_remat
    from roofline.mesh import Mesh as Mesh
    from roofline.mesh import make_mesh as make_mesh
    from roofline.planner import PlanResult as PlanResult
    from roofline.planner import plan_training as plan_training
    from roofline.roofline import analyze as analyze
    from roofline.roofline import analyze_op as analyze_op
    from roofline.roofline import critical_batch as critical_batch
    from roofline.rules import parse_degrees as parse_degrees
    from roofline.rules import rules_for as rules_for
    from roofline.sharding import EinsumPlan as EinsumPlan
    from roofline.sharding import Spec as Spec
    from roofline.sharding import parse_einsum as parse_einsum
    from roofline.sharding import parse_spec as parse_spec
    from roofline.sharding import plan_einsum as plan_einsum
    from roofline.specs.chip import Chip as Chip
    from roofline.specs.chip import load_chip as load_chip
    from roofline.specs.efficiency import Efficiency as Efficiency
    from roofline.specs.model import ModelSpec as ModelSpec
    from roofline.specs.model import load_model as load_model
    from roofline.specs.system import System as System
    from roofline.specs.system import parse_system as parse_system
    from roofline.training import Plan as Plan
    from roofline.training import StepCost as StepCost
    from roofline.training import Workload as Workload
    from roofline.training import balance_batch as balance_batch
    from roofline.training import evaluate_plan as evaluate_plan
    from roofline.training import parse_plan as parse_plan
