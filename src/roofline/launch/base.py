"""The common record of a stack's launch file, the reader/writer protocols, and the registry.

Every reader (`roofline.launch.<stack>`) turns one native launch file — a torchtitan TOML, a
MaxText YAML with `key=value` overrides, a Megatron-LM argument list, a NeMo YAML, a DeepSpeed
JSON, a `vllm serve` line, ... — into one `LaunchConfig`: the plan in the project's own
vocabulary (`specs.plan.Plan` for training; the keys `serve --plan` takes for serving), the
workload, every default the stack filled (with the stack's source file and line), every
setting the plan vocabulary cannot express (named, never dropped) and the problems the file
has as written. Every writer takes a `LaunchConfig` and returns the native text; a round trip
`read(write(c))` gives back the same plan and workload.

Adding a stack is one line: its module name in `STACK_MODULES`. The module defines

- `STACK` (its name, as `--stack` and `--to` spell it), `KIND` ('training' | 'serving');
- `sniff(text, path) -> int`: how sure it is the text is its format (0 = not mine; the
  format detector picks the highest score);
- `read(text, *, source, chips=None) -> LaunchConfig` (`chips`: the device count the file
  runs on, when the caller knows it; `-1` degrees resolve against it);
- optionally `write(config) -> str` (a stack without it cannot be exported to), `PROFILE`
  (the framework or engine profile it is costed with) and `OPTIMIZER` (the optimizer policy
  the stack keeps when an export is not told one).

This module imports only `errors` and `specs.plan` and ranks just above `specs`; the training
stacks' modules read the stack profiles (`core.stack`) and rank after `core`
(tests/test_layering.py). docs/launch.md describes each stack's semantics.
"""

from __future__ import annotations

import difflib
import enum
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any, Protocol, runtime_checkable

from roofline.errors import RooflineError
from roofline.specs.plan import Plan

# The stack modules, one line each (module name under roofline.launch = the stack's name).
# Only modules that exist are listed; the serving readers (vllm, sglang, trtllm) add theirs.
STACK_MODULES: tuple[str, ...] = (
    "torchtitan",
    "maxtext",
    "megatron",
    "nemo",
    "deepspeed",
    "vllm",
    "sglang",
    "trtllm",
)


class LaunchError(RooflineError):
    """A launch file that cannot be read or a plan a stack cannot express (one paragraph)."""


class LaunchKind(enum.StrEnum):
    TRAINING = "training"
    SERVING = "serving"


@dataclass(frozen=True)
class Default:
    """A setting the file left out and the stack's documented default filled."""

    key: str  # as the stack spells it, e.g. 'parallelism.pipeline_parallel_microbatch_size'
    value: Any
    source: str  # 'repo path:line @commit' of the stack's own definition

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "source": self.source}


@dataclass(frozen=True)
class Unsupported:
    """A setting the file gives that the plan vocabulary cannot express (kept, not dropped)."""

    key: str
    value: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "reason": self.reason}


@dataclass(frozen=True)
class Problem:
    """Something wrong with the file as written (it still reads): a degree that does not divide
    the devices, a batch not divisible by the data-parallel degree, a launcher count mismatch."""

    key: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "message": self.message}


@dataclass(frozen=True)
class LaunchWorkload:
    """What the file runs. Training: sequence length and global batch in sequences (the
    microbatch in sequences per data-parallel replica where the stack states one). Serving:
    the engine's limits. None = the file does not say and the stack has no default."""

    seq_len: int | None = None
    global_batch_sequences: int | None = None
    micro_batch_sequences: int | None = None  # per data-parallel replica, per microbatch
    train_steps: int | None = None
    # serving
    max_model_len: int | None = None
    max_num_seqs: int | None = None  # sequences in flight per engine (per DP rank where stated)
    max_batched_tokens: int | None = None

    @property
    def batch_tokens(self) -> int | None:
        if self.seq_len is None or self.global_batch_sequences is None:
            return None
        return self.seq_len * self.global_batch_sequences

    @property
    def total_tokens(self) -> int | None:
        b = self.batch_tokens
        return None if b is None or self.train_steps is None else b * self.train_steps

    def to_dict(self) -> dict[str, Any]:
        names = (
            "seq_len",
            "global_batch_sequences",
            "micro_batch_sequences",
            "train_steps",
            "max_model_len",
            "max_num_seqs",
            "max_batched_tokens",
        )
        out = {n: getattr(self, n) for n in names}
        out["batch_tokens"] = self.batch_tokens
        out["total_tokens"] = self.total_tokens
        return out


def _frozen_map(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(m or {}))


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """One launch file in the project's vocabulary.

    `plan` is the training plan (kind 'training'); `serve_plan` the keys `serve --plan` takes
    (kind 'serving', e.g. {'tp': '8', 'ep': '8'}). `options` are the other inputs of `train`
    / `serve` the file sets, by their CLI names without dashes (e.g. 'precision': 'fp8',
    'framework': 'megatron', 'weight_dtype': 'fp8', 'kv_dtype': 'fp8', 'draft': '3').
    `settings` is what the file says, key -> value as written (after variable expansion).
    """

    stack: str
    kind: LaunchKind
    source: str = "<text>"  # the file (or '<text>')
    model: str | None = None  # the model reference as written (path, hub id or name)
    plan: Plan | None = None
    serve_plan: Mapping[str, str] = field(default_factory=dict)
    workload: LaunchWorkload = field(default_factory=LaunchWorkload)
    chips: int | None = None  # devices the file runs on (launcher count, or its degrees' product)
    options: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    defaults: tuple[Default, ...] = ()
    unsupported: tuple[Unsupported, ...] = ()
    problems: tuple[Problem, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", LaunchKind(self.kind))
        for name in ("serve_plan", "options", "settings"):
            object.__setattr__(self, name, _frozen_map(getattr(self, name)))
        for name in ("defaults", "unsupported", "problems"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.kind == LaunchKind.TRAINING and not isinstance(self.plan, Plan):
            raise LaunchError(
                f"{self.stack} launch config from {self.source} has no training plan",
                rule="a training launch config carries a specs.plan.Plan",
                fix="build it with plan=parse_plan(...)",
            )

    @property
    def serve_plan_text(self) -> str:
        """'tp=8,ep=8': the serving plan as `serve --plan` takes it."""
        return ",".join(f"{k}={v}" for k, v in self.serve_plan.items())

    def to_dict(self) -> dict[str, Any]:
        if self.plan is not None:
            plan: dict[str, Any] = self.plan.to_dict()
        else:
            plan = {"spec": self.serve_plan_text, **self.serve_plan}
        return {
            "stack": self.stack,
            "kind": self.kind.value,
            "source": self.source,
            "model": self.model,
            "chips": self.chips,
            "plan": plan,
            "options": dict(self.options),
            "workload": self.workload.to_dict(),
            "settings": dict(self.settings),
            "defaults": [d.to_dict() for d in self.defaults],
            "unsupported": [u.to_dict() for u in self.unsupported],
            "problems": [p.to_dict() for p in self.problems],
        }


# ------------------------------------------------------------------------------ protocols


@runtime_checkable
class Reader(Protocol):
    def __call__(self, text: str, *, source: str, chips: int | None = None) -> LaunchConfig: ...


@runtime_checkable
class Writer(Protocol):
    def __call__(self, config: LaunchConfig) -> str: ...


# ------------------------------------------------------------------------------ registry


def stack_module(stack: str) -> ModuleType:
    """The module of `stack` (imported on first use), or a LaunchError naming the closest."""
    name = str(stack).strip().lower()
    if name not in STACK_MODULES:
        raise LaunchError(
            f"unknown stack {stack!r}{closest_hint(name, STACK_MODULES)}",
            rule="stacks: " + ", ".join(STACK_MODULES),
            fix="write e.g. --stack torchtitan",
        )
    return importlib.import_module(f"roofline.launch.{name}")


class _Registry(Mapping[str, Any]):
    """stack name -> its `read` (or `write`), importing the module on first access."""

    def __init__(self, attr: str) -> None:
        self._attr = attr

    def __getitem__(self, stack: str) -> Any:
        fn = getattr(stack_module(stack), self._attr, None)
        if fn is None:
            raise LaunchError(
                f"stack {stack!r} has no {self._attr}r",
                rule=f"stacks with a {self._attr}r: " + ", ".join(self),
                fix="pick one of those",
            )
        return fn

    def __iter__(self):
        return iter(s for s in STACK_MODULES if hasattr(stack_module(s), self._attr))

    def __len__(self) -> int:
        return sum(1 for _ in self)


READERS: Mapping[str, Reader] = _Registry("read")
WRITERS: Mapping[str, Writer] = _Registry("write")


def detect_stack(text: str, path: str = "") -> str:
    """The stack whose format `text` is in (the highest `sniff` score), or a LaunchError."""
    scores = [(stack_module(s).sniff(text, path), s) for s in STACK_MODULES]
    best = max(scores, key=lambda t: t[0])
    tied = [s for sc, s in scores if sc == best[0]]
    if best[0] <= 0 or len(tied) > 1:
        why = "matches none" if best[0] <= 0 else "matches " + " and ".join(tied) + " equally"
        raise LaunchError(
            f"cannot tell which stack {path or 'the text'} is written for: its format {why}",
            rule="formats: " + ", ".join(STACK_MODULES),
            fix="name it with --stack, e.g. --stack torchtitan",
        )
    return best[1]


def read_launch(
    text: str, *, source: str = "<text>", stack: str | None = None, chips: int | None = None
) -> LaunchConfig:
    """Read one launch file: `stack` names the format (else it is detected). A file nested
    past the parsers' stack (YAML, JSON, TOML all recurse) is refused, not a traceback."""
    try:
        name = stack or detect_stack(text, source)
        return READERS[name](text, source=source, chips=chips)
    except RecursionError:
        raise LaunchError(
            f"cannot read {source}: it is nested too deeply to parse",
            rule="a launch file is a flat TOML, YAML, JSON or shell file a few levels deep",
            fix="give the stack's own launch file",
        ) from None


def write_launch(config: LaunchConfig, stack: str) -> str:
    """The native text of `config` in `stack`'s format (a LaunchError where it cannot say it)."""
    return WRITERS[stack](config)


# ------------------------------------------------------------------------------ helpers


def closest_hint(name: str, known: Sequence[str]) -> str:
    """' (closest known: X)' for a misspelt name, '' when nothing is close."""
    near = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return f" (closest known: {near[0]})" if near else ""


__all__ = [
    "Default",
    "LaunchConfig",
    "LaunchError",
    "LaunchKind",
    "LaunchWorkload",
    "Problem",
    "READERS",
    "Reader",
    "STACK_MODULES",
    "Unsupported",
    "WRITERS",
    "Writer",
    "closest_hint",
    "detect_stack",
    "read_launch",
    "stack_module",
    "write_launch",
]
