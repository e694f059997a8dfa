"""What every training stack's reader and writer shares: the cited defaults tables, the
notes a reading collects, `-1` = the rest, the checks every file gets, the stack profile's
remat policies and precision recipes, and model references.

A stack's defaults live in `launch/defaults/<stack>.toml`: `[meta]` names the repository and
commit read, `[defaults."<key>"]` gives `value` and `source` (file:line of the stack's own
definition) for every setting a reader fills when a file leaves it out.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from roofline.core.stack import plan_conditions, recipe_dtypes, stack_of
from roofline.errors import RooflineError
from roofline.launch.base import (
    Default,
    LaunchConfig,
    LaunchError,
    LaunchKind,
    LaunchWorkload,
    Problem,
    Unsupported,
    closest_hint,
)
from roofline.specs.framework import OverlapClass, load_framework
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import ComputeDtypes, Plan, RematKind, parse_remat

DEFAULTS_DIR = Path(__file__).parent / "defaults"

# A stack profile's remat policy memory class -> the plan's remat kind.
_KIND_OF_MEMORY = {
    "none": RematKind.NONE,
    "matmuls": RematKind.MATMULS,
    "full": RematKind.FULL,
}


# ------------------------------------------------------------------------------ defaults


@dataclass(frozen=True)
class StackDefaults:
    stack: str
    repo: str
    commit: str
    values: Mapping[str, Any]
    sources: Mapping[str, str]
    data: Mapping[str, Any]  # the table's other sections (stack-specific lookup tables)

    def source(self, key: str) -> str:
        return f"{self.repo} {self.sources[key]} @{self.commit[:12]}"

    def value(self, key: str) -> Any:
        if key not in self.values:  # a reader asking for a key its table lacks: a bug here
            raise KeyError(f"launch/defaults/{self.stack}.toml has no default for {key!r}")
        return self.values[key]


@cache
def stack_defaults(stack: str) -> StackDefaults:
    path = DEFAULTS_DIR / f"{stack}.toml"
    raw = tomllib.loads(path.read_text())
    meta = raw.pop("meta")
    table = raw.pop("defaults", {})
    return StackDefaults(
        stack=stack,
        repo=meta["repo"],
        commit=meta["commit"],
        values={k: v["value"] for k, v in table.items()},
        sources={k: v["source"] for k, v in table.items()},
        data=raw,
    )


# ------------------------------------------------------------------------------ notes


@dataclass
class Notes:
    """What one reading collects (a local of one `read` call, frozen into the LaunchConfig)."""

    stack: str
    source: str
    settings: Mapping[str, Any]
    defaults: list[Default] = field(default_factory=list)
    unsupported: list[Unsupported] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def table(self) -> StackDefaults:
        return stack_defaults(self.stack)

    def get(self, key: str, *aliases: str) -> Any:
        """The file's value of `key` (or an older spelling), else the stack's default (noted)."""
        for k in (key, *aliases):
            if k in self.settings:
                return self.settings[k]
        value = self.table.value(key)
        self.defaults.append(Default(key, value, self.table.source(key)))
        return value

    def given(self, key: str, *aliases: str) -> bool:
        return any(k in self.settings for k in (key, *aliases))

    def stated_flag(self, key: str) -> bool | None:
        """A switch as the file states it; None where it does not (its default is noted), so a
        plan's tri-state flag (specs.plan.TRISTATE_FLAGS) keeps the stack profile's default."""
        value = self.flag(key, self.get(key))
        return value if self.given(key) else None

    def unsupported_(self, key: str, value: Any, reason: str) -> None:
        self.unsupported.append(Unsupported(key, value, reason))

    def problem(self, key: str, message: str) -> None:
        self.problems.append(Problem(key, message))

    def error(self, key: str, what: str, *, rule: str, fix: str) -> LaunchError:
        return LaunchError(f"{self.source}: {key} {what}", rule=rule, fix=fix)

    def integer(self, key: str, value: Any, *, low: int = 1, allow_rest: bool = False) -> int:
        """`value` of `key` as a whole number >= low (or -1 = the rest where allowed)."""
        ok = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(value, float) and value.is_integer():
            value, ok = int(value), True
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value, ok = int(value.strip()), True
        if ok and (value >= low or (allow_rest and value == -1)):
            return value
        rest = " or -1 (the rest of the devices)" if allow_rest else ""
        raise self.error(
            key,
            f"= {value!r}",
            rule=f"{key} is a whole number of at least {low}{rest}",
            fix=f"write {key} = {max(low, 1)}",
        )

    def flag(self, key: str, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in ("true", "1", "yes", "on"):
            return True
        if s in ("false", "0", "no", "off", "", "none", "null"):
            return False
        raise self.error(
            key, f"= {value!r}", rule=f"{key} is true or false", fix=f"write {key}: true"
        )

    def config(self, **kw: Any) -> LaunchConfig:
        return LaunchConfig(
            stack=self.stack,
            kind=LaunchKind.TRAINING,
            source=self.source,
            settings=dict(self.settings),
            defaults=tuple(self.defaults),
            unsupported=tuple(self.unsupported),
            problems=tuple(self.problems),
            **kw,
        )


def yaml_mapping(text: str, source: str, what: str) -> Any:
    """The YAML document of a launch file, or a LaunchError naming the line (`what`: the
    config kind, for the rule). The caller checks the document's shape."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise LaunchError(
            f"{source} is not valid YAML: {e}".replace("\n", " "),
            rule=f"a {what} config is a YAML mapping",
            fix="correct the line named",
        ) from None


def check_known(
    notes: Notes,
    keys: Iterable[str],
    known: Iterable[str],
    *,
    where: str = "",
    near: float | None = None,
) -> None:
    """A LaunchError for the first key that is a misspelling of a known one (a key close to
    none of them is kept in `settings`, outside what the plan reads). `known` is the stack's
    whole vocabulary, or (with `near`, a similarity cutoff) just the keys the reader reads,
    where only a near miss that is not a longer or shorter spelling of it is an error."""
    known = list(known)
    for k in keys:
        if k in known:
            continue
        if near is not None:
            close = difflib.get_close_matches(k, known, n=1, cutoff=near)
            hint = (
                f" (closest known: {close[0]})"
                if close and close[0] not in k and k not in close[0]
                else ""
            )
        else:
            hint = closest_hint(k, known)
        if hint:
            raise notes.error(
                k,
                f"is not a {notes.stack} setting{where}{hint}",
                rule=f"{notes.stack} reads only the settings its own configuration defines",
                fix="correct the name (the closest known one is given)",
            )


# ------------------------------------------------------------------------------ degrees


def resolve_rest(
    notes: Notes, degrees: Mapping[str, int], devices: int | None, *, what: str
) -> dict[str, int]:
    """Degrees with one `-1` replaced by the devices the others leave (`what`: the flag or
    setting that gives the device count)."""
    out = dict(degrees)
    rest = [k for k, v in out.items() if v == -1]
    if len(rest) > 1:
        raise notes.error(
            " and ".join(rest),
            "are all -1",
            rule="at most one degree is -1 (the rest of the devices)",
            fix=f"give all but one of {', '.join(rest)} a number",
        )
    if not rest:
        return out
    known = math.prod(v for v in out.values() if v != -1)
    if devices is None:
        raise notes.error(
            rest[0],
            "= -1 (the rest of the devices) but the device count is unknown",
            rule="-1 takes the devices the other degrees leave, so the device count must be known",
            fix=f"give {what}",
        )
    if devices % known:
        raise notes.error(
            rest[0],
            f"= -1 cannot take the rest: the other degrees multiply to {known}, which does not divide {devices} devices",
            rule="the degrees multiply to the device count",
            fix=f"change the degrees, or give {what} with a multiple of {known}",
        )
    out[rest[0]] = devices // known
    return out


def check_devices(notes: Notes, used: int, devices: int | None, *, launcher: str) -> None:
    """A problem when the degrees do not multiply to the devices the launcher starts."""
    if devices is not None and devices != used:
        notes.problem(
            launcher,
            f"the parallelism degrees multiply to {used} devices but {launcher} gives {devices}",
        )


def microbatch_count(
    notes: Notes, *, global_seqs: int, per_replica: int, replicas: int, key: str
) -> int:
    """Gradient-accumulation steps: global batch / (sequences per replica per pass × replicas);
    a problem (and the floor, at least 1) when it does not divide."""
    per_pass = per_replica * replicas
    if global_seqs % per_pass:
        notes.problem(
            key,
            f"the global batch of {global_seqs} sequences is not a multiple of "
            f"{per_replica} per replica × {replicas} data-parallel replicas = {per_pass}",
        )
    return max(1, global_seqs // per_pass)


# ------------------------------------------------------------------------------ profile


def remat_of(notes: Notes, profile: str, key: str, policy: str) -> Any:
    """The plan remat of the stack's policy name (its memory class in the stack profile),
    with an `unsupported` note when the policy is not exactly that kind."""
    try:
        pol = load_framework(profile).remat.policy(policy)
    except RooflineError:
        raise notes.error(
            key,
            f"= {policy!r} is not a {notes.stack} activation-checkpointing policy",
            rule="policies: " + ", ".join(load_framework(profile).remat.policies),
            fix="write one of those",
        ) from None
    kind = _KIND_OF_MEMORY[pol.memory]
    layer_fraction = getattr(pol, "layer_fraction", 1.0)
    if layer_fraction not in (None, 1.0):
        notes.unsupported_(
            key,
            policy,
            f"checkpoints {layer_fraction:g} of the layers; the plan's remat applies to every "
            f"layer, costed as remat={kind.value}",
        )
    return parse_remat(kind.value)


def precision_of(notes: Notes, profile: str, key: str, recipe: str) -> tuple[str, ComputeDtypes]:
    """(recipe name, compute dtypes) of the stack's precision recipe `recipe`."""
    try:
        r = stack_of(profile).recipe(recipe)
    except RooflineError:
        names = list(load_framework(profile).precision.recipes)
        raise notes.error(
            key,
            f"= {recipe!r} is not a {notes.stack} precision recipe the profile knows"
            + closest_hint(recipe, names),
            rule="recipes: " + ", ".join(names),
            fix="write one of those",
        ) from None
    return r.name, recipe_dtypes(r)


def recipe_for(profile: str, dtypes: ComputeDtypes, preferred: str | None, stack: str) -> str:
    """The stack's recipe whose compute dtypes are `dtypes` (`preferred` first), or an error."""
    fw = load_framework(profile)
    names = ([preferred] if preferred else []) + [fw.precision.default, *fw.precision.recipes]
    for n in names:
        try:
            r = stack_of(profile).recipe(n)
            if recipe_dtypes(r) == dtypes:
                return r.name
        except RooflineError:  # a recipe outside the plan's compute dtypes (DeepSpeed's fp32)
            continue
    raise LaunchError(
        f"{stack} has no precision recipe that computes {', '.join(dtypes.describe()) or 'bf16'}",
        rule=f"{stack}'s recipes: " + ", ".join(fw.precision.recipes),
        fix="export a plan with one of those recipes' dtypes (e.g. --precision fp8 with train)",
    )


# ------------------------------------------------------------------------------ workload


# the chip-level requirement every GPU stack's launch file holds (core.stack.chip_requirements)
GPU = frozenset({"gpu"})


def costed_switches(plan: Plan, profile: str, held: frozenset[str] = GPU) -> dict[str, bool]:
    """The overlap switches the step model costs `plan` with on stack profile `profile`, by
    plan key (collective_matmul, overlap_ep): the plan's tri-state flag where set, else the
    profile's default under the plan's conditions (core.stack.Stack.plan_overlap, the rule
    the step uses). A writer states these where the tool's own default differs, so the file
    launches the overlap that was costed."""
    return stack_of(profile).plan_overlap(plan, held)


def to_state(plan_value: bool | None, costed: bool, stack: str, key: str) -> bool | None:
    """What a writer states for a switch `key` of `stack`: the plan's value where the plan sets
    one; for an unset one the value the step costs (`costed`) where the tool's own default
    (launch/defaults/<stack>.toml) differs from it; None where the tool's default is what was
    costed, so the file leaves the switch out and reads back unset."""
    if plan_value is not None:
        return plan_value
    return costed if costed != bool(stack_defaults(stack).value(key)) else None


def costed_overlap(plan: Plan, profile: str, cls: OverlapClass, held: frozenset[str] = GPU) -> bool:
    """Whether the step costs overlap class `cls` on for `plan` where no plan key switches it
    (the data-parallel gradient reduction, the parameter gather): the profile's default under
    the plan's conditions (core.stack.plan_conditions, Stack.default_on)."""
    stack = stack_of(profile)
    return stack.default_on(cls, plan_conditions(stack, plan, held))


def costed_compiled(plan: Plan, profile: str) -> bool:
    """Whether the step model costs `plan` compiled on stack profile `profile`: its compile
    flag where set, else the profile's [eager] compiled_by_default (core.stack.Stack.compiled)."""
    return stack_of(profile).compiled(plan.compiled)


def workload(
    *,
    seq_len: int | None,
    global_seqs: int | None,
    micro: int | None = None,
    steps: int | None = None,
) -> LaunchWorkload:
    return LaunchWorkload(
        seq_len=seq_len,
        global_batch_sequences=global_seqs,
        micro_batch_sequences=micro,
        train_steps=steps,
    )


def needs(value: Any, stack: str, what: str, flag: str) -> None:
    """A LaunchError when a writer lacks `what` (the plan's workload or model)."""
    if value is None:
        raise LaunchError(
            f"cannot write a {stack} file without {what}",
            rule=f"a {stack} launch file states {what}",
            fix=f"give {flag}",
        )


def flatten(raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config (TOML tables, YAML mappings) as dotted keys: {"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


__all__ = [
    "flatten",
    "Notes",
    "StackDefaults",
    "check_devices",
    "check_known",
    "microbatch_count",
    "needs",
    "precision_of",
    "recipe_for",
    "remat_of",
    "resolve_model",
    "resolve_rest",
    "stack_defaults",
    "workload",
]


# ------------------------------------------------------------------------------ model


def model_candidates(ref: str, source: str) -> list[str]:
    """Where a file's model reference may point: a config.json path (as written, or next to
    the file), then catalog names (the reference, its last path part, 'name flavor' joined)."""
    base = Path(source).parent if source and not source.startswith("<") else Path.cwd()
    paths = [Path(ref), base / ref]
    out: list[str] = []
    for p in paths:
        if (p / "config.json").is_file():
            out.append(str(p / "config.json"))
        elif p.suffix == ".json" and p.is_file():
            out.append(str(p))
    name = ref.rstrip("/").rsplit("/", 1)[-1]
    out += [ref, name, name.replace(" ", "-").replace("_", "-")]
    return list(dict.fromkeys(out))


def resolve_model(ref: str | None, source: str, flag: str = "--model") -> Any:
    """The ModelSpec a launch file names (catalog or config.json), or a LaunchError naming `flag`."""
    if ref:
        for cand in model_candidates(ref, source):
            try:
                return load_model(cand)
            except RooflineError:
                continue
    said = (
        f"names model {ref!r}, which is neither in the catalog nor a config.json"
        if ref
        else "names no model"
    )
    raise LaunchError(
        f"{source} {said}",
        rule="the model comes from the file (a catalog name, a hub id, or a directory with config.json) or from the command line",
        fix=f"give {flag} (a preset name such as llama-3.1-8b, or a config.json path)",
    )
