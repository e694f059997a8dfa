"""roofline: compute, don't guess, the performance of large Transformers.

Public API (re-exports only; docs/api.md shows it at work, docs/architecture.md the data flow
specs -> ledger -> sharding -> cost -> training -> planner -> report/cli):

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
    # what the CLI does, as functions with typed results (docs/api.md); not named `validate`
    # or `calibrate`: those are subpackages, whose import would replace the attribute
    "Answer": "roofline.api",
    "Calibration": "roofline.api",
    "collective_query": "roofline.api",
    "limits_query": "roofline.api",
    "op_query": "roofline.api",
    "serve_query": "roofline.api",
    "train_query": "roofline.api",
    "transfer_query": "roofline.api",
    "Score": "roofline.api",
    "ServeChoice": "roofline.api",
    "ServeSearch": "roofline.api",
    "ServeStep": "roofline.api",
    "Validation": "roofline.api",
    "calibrate_profile": "roofline.api",
    "serve_search": "roofline.api",
    "serve_step": "roofline.api",
    "validate_runs": "roofline.api",
    "ServePlan": "roofline.serving.inference",
    "parse_serve_plan": "roofline.serving.inference",
    "CollectiveCost": "roofline.core.collectives",
    "CollectiveKind": "roofline.core.collectives",
    "collective_cost": "roofline.core.collectives",
    "PlanError": "roofline.errors",
    "RooflineError": "roofline.errors",
    "ShardingError": "roofline.errors",
    "SpecError": "roofline.errors",
    "Ledger": "roofline.core.ledger",
    "Op": "roofline.core.ledger",
    "build_ledger": "roofline.core.ledger",
    "count_params": "roofline.core.ledger",
    "flops_per_token": "roofline.core.ledger",
    "kv_cache_bytes_per_token": "roofline.core.ledger",
    "parse_optimizer": "roofline.core.memory",
    "parse_remat": "roofline.core.memory",
    "Mesh": "roofline.core.mesh",
    "make_mesh": "roofline.core.mesh",
    "limits": "roofline.core.limits",
    "point_to_point": "roofline.core.transfer",
    "gather_to_one": "roofline.core.transfer",
    "host_to_hbm": "roofline.core.transfer",
    "capacities": "roofline.core.transfer",
    "analyze_levels": "roofline.core.roofline",
    "analyze_vector": "roofline.core.roofline",
    "pipeline_traffic": "roofline.training.pipecomm",
    "offload_optimizer": "roofline.training.offload",
    "offload_activations": "roofline.training.offload",
    "evaluate_offloaded": "roofline.training.offload",
    "GivenSteps": "roofline.serving.given",
    "size_deployment": "roofline.serving.given",
    "sequence_sharded_decode": "roofline.serving.seqkv",
    "PlanResult": "roofline.training.planner",
    "plan_training": "roofline.training.planner",
    "analyze": "roofline.core.roofline",
    "analyze_op": "roofline.core.roofline",
    "critical_batch": "roofline.core.roofline",
    "parse_degrees": "roofline.core.rules",
    "rules_for": "roofline.core.rules",
    "EinsumPlan": "roofline.core.sharding",
    "Spec": "roofline.core.sharding",
    "parse_einsum": "roofline.core.sharding",
    "parse_spec": "roofline.core.sharding",
    "plan_einsum": "roofline.core.sharding",
    "Chip": "roofline.specs.chip",
    "load_chip": "roofline.specs.chip",
    "Efficiency": "roofline.specs.efficiency",
    "ModelSpec": "roofline.specs.model",
    "load_model": "roofline.specs.model_catalog",
    "System": "roofline.specs.system",
    "parse_system": "roofline.specs.system",
    "Plan": "roofline.training.step",
    "StepCost": "roofline.training.step",
    "Workload": "roofline.training.step",
    "balance_batch": "roofline.training.step",
    "evaluate_plan": "roofline.training.step",
    "parse_plan": "roofline.training.step",
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
    from roofline.api import Calibration as Calibration
    from roofline.api import Score as Score
    from roofline.api import ServeChoice as ServeChoice
    from roofline.api import ServeSearch as ServeSearch
    from roofline.api import ServeStep as ServeStep
    from roofline.api import Validation as Validation
    from roofline.api import calibrate_profile as calibrate_profile
    from roofline.api import serve_search as serve_search
    from roofline.api import serve_step as serve_step
    from roofline.api import validate_runs as validate_runs
    from roofline.core.collectives import CollectiveCost as CollectiveCost
    from roofline.core.collectives import CollectiveKind as CollectiveKind
    from roofline.core.collectives import collective_cost as collective_cost
    from roofline.core.ledger import Ledger as Ledger
    from roofline.core.ledger import Op as Op
    from roofline.core.ledger import build_ledger as build_ledger
    from roofline.core.ledger import count_params as count_params
    from roofline.core.ledger import flops_per_token as flops_per_token
    from roofline.core.ledger import kv_cache_bytes_per_token as kv_cache_bytes_per_token
    from roofline.core.limits import limits as limits
    from roofline.core.memory import parse_optimizer as parse_optimizer
    from roofline.core.memory import parse_remat as parse_remat
    from roofline.core.mesh import Mesh as Mesh
    from roofline.core.mesh import make_mesh as make_mesh
    from roofline.core.roofline import analyze as analyze
    from roofline.core.roofline import analyze_levels as analyze_levels
    from roofline.core.roofline import analyze_op as analyze_op
    from roofline.core.roofline import analyze_vector as analyze_vector
    from roofline.core.roofline import critical_batch as critical_batch
    from roofline.core.rules import parse_degrees as parse_degrees
    from roofline.core.rules import rules_for as rules_for
    from roofline.core.sharding import EinsumPlan as EinsumPlan
    from roofline.core.sharding import Spec as Spec
    from roofline.core.sharding import parse_einsum as parse_einsum
    from roofline.core.sharding import parse_spec as parse_spec
    from roofline.core.sharding import plan_einsum as plan_einsum
    from roofline.core.transfer import capacities as capacities
    from roofline.core.transfer import gather_to_one as gather_to_one
    from roofline.core.transfer import host_to_hbm as host_to_hbm
    from roofline.core.transfer import point_to_point as point_to_point
    from roofline.errors import PlanError as PlanError
    from roofline.errors import RooflineError as RooflineError
    from roofline.errors import ShardingError as ShardingError
    from roofline.errors import SpecError as SpecError
    from roofline.serving.given import GivenSteps as GivenSteps
    from roofline.serving.given import size_deployment as size_deployment
    from roofline.serving.inference import ServePlan as ServePlan
    from roofline.serving.inference import parse_serve_plan as parse_serve_plan
    from roofline.serving.seqkv import sequence_sharded_decode as sequence_sharded_decode
    from roofline.specs.chip import Chip as Chip
    from roofline.specs.chip import load_chip as load_chip
    from roofline.specs.efficiency import Efficiency as Efficiency
    from roofline.specs.model import ModelSpec as ModelSpec
    from roofline.specs.model_catalog import load_model as load_model
    from roofline.specs.system import System as System
    from roofline.specs.system import parse_system as parse_system
    from roofline.training.offload import offload_optimizer as offload_optimizer
    from roofline.training.pipecomm import pipeline_traffic as pipeline_traffic
    from roofline.training.planner import PlanResult as PlanResult
    from roofline.training.planner import plan_training as plan_training
    from roofline.training.step import Plan as Plan
    from roofline.training.step import StepCost as StepCost
    from roofline.training.step import Workload as Workload
    from roofline.training.step import balance_batch as balance_batch
    from roofline.training.step import evaluate_plan as evaluate_plan
    from roofline.training.step import parse_plan as parse_plan
