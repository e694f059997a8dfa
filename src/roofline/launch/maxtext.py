"""MaxText: a config YAML, or a `train` command line with `key=value` overrides.

Semantics (launch/defaults/maxtext.toml cites each default):

- the mesh: `ici_<axis>_parallelism` within a slice and `dcn_<axis>_parallelism` across
  slices, one `-1` per tier = the rest (`ici_fsdp` and `dcn_data` by default); data -> dp,
  fsdp and fsdp_transpose -> fsdp, sequence and context -> sp, tensor (incl. tensor_sequence,
  tensor_transpose) -> tp, expert -> ep, pipeline -> pp;
- batch: `per_device_batch_size` (may be a fraction) × devices = the sequences of one pass;
  × `gradient_accumulation_steps` = the global batch; a pipelined pass runs as
  `num_pipeline_microbatches` (default the stage count); `num_pipeline_repeats` > 1 is the
  circular (interleaved) pipeline, default layers / (stages × layers per stage);
- `remat_policy` by the maxtext profile's policies, `quantization` (fp8, int8, ...),
  `weight_dtype` (fp32 parameters by default), `num_slices`.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from roofline.errors import RooflineError
from roofline.launch.base import Default, LaunchConfig, LaunchError, LaunchKind
from roofline.launch.capable import capabilities
from roofline.launch.common import (
    Notes,
    check_devices,
    check_known,
    needs,
    precision_of,
    recipe_for,
    remat_of,
    resolve_rest,
    stack_defaults,
    workload,
    yaml_mapping,
)
from roofline.launch.shell import script
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import OPTIMIZERS, Degrees, Plan, RematKind, Schedule, parse_optimizer

STACK = "maxtext"
KIND = LaunchKind.TRAINING
PROFILE = "maxtext"
OPTIMIZER = capabilities(
    STACK
).optimizer  # the stack's own (capabilities.toml): an export's default
_TRAIN = re.compile(r"(MaxText|maxtext)\.[\w.$]*|\btrain\.py|train_compile")
_OVERRIDE = re.compile(r"^([a-z_][a-z0-9_]*)=(.*)$")
_AXES_SOURCE = "src/maxtext/configs/base.yml:659-684"


def sniff(text: str, path: str = "") -> int:
    if _TRAIN.search(text) and re.search(
        r"\b(ici|dcn)_\w+_parallelism=|per_device_batch_size=", text
    ):
        return 4
    if re.search(r"^\s*(ici|dcn)_\w+_parallelism\s*:|^\s*per_device_batch_size\s*:", text, re.M):
        return 3
    if re.search(r"^\s*(remat_policy|max_target_length|base_emb_dim)\s*:", text, re.M):
        return 2
    return 0


# ------------------------------------------------------------------------------ read


def _yaml(text: str, source: str) -> dict[str, Any]:
    data = yaml_mapping(text, source, "MaxText")
    if not isinstance(data, dict):
        raise LaunchError(
            f"{source} is not a YAML mapping of settings",
            rule="a MaxText config is a YAML mapping (or a train command line with key=value overrides)",
            fix="give the config YAML or the command line",
        )
    return data


def _scalar(text: str) -> Any:
    """A key=value override's value as YAML reads it; text YAML cannot read (a control
    character) stays the text, for the setting's own check to name."""
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool, str)) or value is None else text


def _command_settings(text: str, source: str) -> dict[str, Any]:
    """Settings of a `train` command line, read as a shell would (launch/shell.py expands
    the script's variables): the YAML it names (if next to the file), then its key=value
    overrides, in order."""
    out: dict[str, Any] = {}
    for words in script(text, _TRAIN).commands:
        for w in words:
            m = _OVERRIDE.match(w)
            if m:
                out[m.group(1)] = _scalar(m.group(2))
            elif w.endswith((".yml", ".yaml")) and not w.endswith("base.yml"):
                out = {**_yaml_next_to(w, source), **out}
    return out


def _yaml_next_to(name: str, source: str) -> dict[str, Any]:
    for base in (Path(source).parent, Path.cwd()):
        p = base / name
        if p.is_file():
            return _yaml(p.read_text(), str(p))
    if "models/" in name.replace("\\", "/"):
        return {}  # a model architecture file: the model comes from model_name or --model
    raise LaunchError(
        f"{source}: the command reads config {name}, which is not next to it",
        rule="settings of a config the command names are read from that file",
        fix=f"put {Path(name).name} next to {Path(source).name}, or import the YAML itself",
    )


def settings_of(text: str, source: str) -> dict[str, Any]:
    if _TRAIN.search(text) and re.search(r"(^|\s)[a-z_][a-z0-9_]*=\S", text, re.M):
        return _command_settings(text, source)
    return _yaml(text, source)


def read(text: str, *, source: str = "<text>", chips: int | None = None) -> LaunchConfig:
    notes = Notes(STACK, source, settings_of(text, source))
    check_known(notes, notes.settings, _read_keys(), near=0.9)
    deg, stages = _mesh(notes, chips)
    devices = deg.n_chips
    pass_seqs, accum = _batch(notes, devices)
    layers = _layers(notes) if deg.pp > 1 else 0
    virtual = _repeats(notes, deg.pp, layers)
    per_pass = _pipeline_microbatches(notes, deg.pp, pass_seqs)
    recipe, dtypes = _precision(notes)
    plan = Plan(
        degrees=deg,
        microbatches=accum * per_pass,
        remat=_remat(notes),
        offload_activations=_offloads(notes),
        zero=_zero(notes, deg.dp),
        schedule=Schedule.INTERLEAVED if virtual > 1 else Schedule.ONE_F_ONE_B,
        virtual_stages=virtual,
        optimizer=_optimizer(notes),
        dtypes=dtypes,
    )
    return notes.config(
        model=_model(notes),
        plan=plan,
        chips=devices,
        options={"framework": PROFILE, "precision": recipe},
        workload=workload(
            seq_len=notes.integer("max_target_length", notes.get("max_target_length")),
            global_seqs=pass_seqs * accum,
            micro=None,
            steps=notes.integer("steps", notes.get("steps")),
        ),
    )


def _zero(notes: Notes, dp: int) -> int:
    """ZeRO over the data axis: 1 with shard_optimizer_over_data, else whole optimizer states
    on every replica (0); with one replica the stage does not apply (the plan's default, 1)."""
    if dp == 1:
        return 1
    key = "shard_optimizer_over_data"
    return 1 if notes.flag(key, notes.get(key)) else 0


def _read_keys() -> list[str]:
    """The keys this reader reads: the defaults table's and every ici_/dcn_ axis."""
    t = stack_defaults(STACK)
    axes = [f"{tier}_{a}_parallelism" for tier in ("ici", "dcn") for a in t.data["axes"]]
    return [*t.values, *axes]


def _axis_default(tier: str, axis: str) -> int:
    return -1 if (tier, axis) in (("ici", "fsdp"), ("dcn", "data")) else 1


def _tier(notes: Notes, tier: str, devices: int | None) -> dict[str, int]:
    """{axis: degree} of one tier (ici or dcn), its -1 resolved against `devices`."""
    axes = stack_defaults(STACK).data["axes"]
    out: dict[str, int] = {}
    filled = []
    for axis in axes:
        key = f"{tier}_{axis}_parallelism"
        if notes.given(key):
            out[key] = notes.integer(key, notes.settings[key], allow_rest=True)
        elif _axis_default(tier, axis) == -1:
            out[key] = notes.integer(key, notes.get(key), allow_rest=True)
        else:
            out[key] = 1
            filled.append(key)
    if filled:
        notes.defaults.append(
            _default(f"{tier}_*_parallelism (the {len(filled)} not given)", 1, _AXES_SOURCE)
        )
    what = "--chips N or --system" if tier == "ici" else "num_slices"
    resolved = resolve_rest(notes, out, devices, what=what)
    return {axis: resolved[f"{tier}_{axis}_parallelism"] for axis in axes}


def _default(key: str, value: Any, where: str) -> Default:
    t = stack_defaults(STACK)
    return Default(key, value, f"{t.repo} {where} @{t.commit[:12]}")


def _slices(notes: Notes, chips: int | None) -> int:
    """`num_slices`, or (-1) what the mesh implies: devices / the ici product, else the
    product of the dcn degrees given (MaxText counts the slices at run time)."""
    key = "num_slices"
    if notes.given(key):
        n = notes.integer(key, notes.settings[key], allow_rest=True)
        if n != -1:
            return n
    ici = [notes.settings.get(f"ici_{a}_parallelism") for a in stack_defaults(STACK).data["axes"]]
    ici_known = notes.given("ici_fsdp_parallelism") and all(v != -1 for v in ici)
    if chips is not None and ici_known:
        return max(1, chips // math.prod(int(v) for v in ici if v is not None))
    dcn = [
        int(v)
        for a in stack_defaults(STACK).data["axes"]
        if (v := notes.settings.get(f"dcn_{a}_parallelism")) is not None and int(v) > 0
    ]
    if dcn and math.prod(dcn) > 1:
        return math.prod(dcn)
    return notes.integer(key, notes.get(key))


def _mesh(notes: Notes, chips: int | None) -> tuple[Degrees, int]:
    slices = _slices(notes, chips)
    per_slice = None if chips is None else chips // slices
    if chips is not None and chips % slices:
        notes.problem("num_slices", f"{chips} devices do not split into {slices} slices")
    ici = _tier(notes, "ici", per_slice)
    dcn = _tier(notes, "dcn", slices)
    sizes = {a: ici[a] * dcn[a] for a in ici}
    check_devices(notes, math.prod(sizes.values()), chips, launcher="--chips")
    by = {"dp": 1, "fsdp": 1, "tp": 1, "sp": 1, "ep": 1, "pp": 1}
    for axis, n in sizes.items():
        if n > 1:
            by[_strategy(notes, axis, n)] *= n
    return Degrees(**by), by["pp"]


def _strategy(notes: Notes, axis: str, n: int) -> str:
    strategy = stack_defaults(STACK).data["axes"][axis][0]
    key = f"ici/dcn_{axis}_parallelism"
    if not strategy:
        notes.unsupported_(
            key, n, f"the {axis} mesh axis has no plan strategy: costed as data parallel"
        )
        return "dp"
    if axis in ("tensor_sequence", "tensor_transpose", "fsdp_transpose"):
        notes.unsupported_(key, n, f"costed as {strategy}")
    return strategy


def _batch(notes: Notes, devices: int) -> tuple[int, int]:
    """(sequences of one pass, gradient-accumulation steps)."""
    key = "per_device_batch_size"
    pdbs = notes.get(key)
    if isinstance(pdbs, bool) or not isinstance(pdbs, (int, float)) or pdbs <= 0:
        raise notes.error(
            key,
            f"= {pdbs!r}",
            rule=f"{key} is a positive number (fractions allowed)",
            fix=f"write {key}=1",
        )
    seqs = int(devices * pdbs)  # configs/types.py:3464: int(num_devices * per_device_batch_size)
    if seqs < 1 or not math.isclose(seqs, devices * pdbs):
        notes.problem(
            key,
            f"{pdbs:g} sequences per device × {devices} devices = {devices * pdbs:g} is not a whole number of sequences; MaxText trains on {seqs}",
        )
    accum_key = "gradient_accumulation_steps"
    return max(1, seqs), notes.integer(accum_key, notes.get(accum_key))


def _layers(notes: Notes) -> int:
    if notes.given("base_num_decoder_layers"):
        return notes.integer("base_num_decoder_layers", notes.settings["base_num_decoder_layers"])
    name = notes.settings.get("model_name")
    if name and name != "default":
        try:
            return load_model(str(name)).n_layers
        except RooflineError:
            pass
    return notes.integer("base_num_decoder_layers", notes.get("base_num_decoder_layers"))


def _repeats(notes: Notes, pp: int, layers: int) -> int:
    if pp == 1:
        return 1
    per_stage = notes.integer(
        "num_layers_per_pipeline_stage", notes.get("num_layers_per_pipeline_stage")
    )
    key = "num_pipeline_repeats"
    r = notes.integer(key, notes.get(key), allow_rest=True)
    if r == -1:
        if layers % (pp * per_stage):
            notes.problem(
                key,
                f"{layers} layers do not split into {pp} stages of {per_stage} layers per repeat",
            )
        r = max(1, layers // (pp * per_stage))
    return r


def _pipeline_microbatches(notes: Notes, pp: int, pass_seqs: int) -> int:
    if pp == 1:
        return 1
    key = "num_pipeline_microbatches"
    n = notes.integer(key, notes.get(key), allow_rest=True)
    if n == -1:
        delay = notes.flag(
            "pipeline_delay_activation_forwarding",
            notes.get("pipeline_delay_activation_forwarding"),
        )
        n = 2 * pp if delay else pp
    if n % pp:
        notes.problem(key, f"{n} microbatches are not a multiple of {pp} stages")
    if pass_seqs % n:
        notes.problem(key, f"a pass of {pass_seqs} sequences is not a multiple of {n} microbatches")
    return n


def _offloads(notes: Notes) -> bool:
    """remat_policy minimal_offloaded is offload_activations=1 (the maxtext profile's
    `offloaded` policy; qkv_proj_offloaded offloads part of it: costed as not offloaded)."""
    policy = str(notes.get("remat_policy"))
    if policy == "qkv_proj_offloaded":
        notes.unsupported_("remat_policy", policy, "offloads only q/k/v: costed with them in HBM")
    return policy == "minimal_offloaded"


def _remat(notes: Notes) -> Any:
    key = "remat_policy"
    policy = str(notes.get(key))
    if policy in stack_defaults(STACK).data["remat"]["other"]:
        notes.unsupported_(
            key,
            policy,
            "a MaxText policy the maxtext profile does not list: costed as remat=matmuls",
        )
        return remat_of(notes, PROFILE, key, "minimal")
    remat = remat_of(notes, PROFILE, key, policy)
    if policy not in ("full", "minimal", "minimal_offloaded"):
        notes.unsupported_(
            key,
            policy,
            f"the plan names remat kinds, not MaxText's policies: costed as remat={remat}",
        )
    return remat


def _precision(notes: Notes) -> tuple[str, Any]:
    key = "quantization"
    q = str(notes.get(key) or "").strip().lower()
    table = stack_defaults(STACK).data["quantization"]
    if q not in table:
        notes.unsupported_(
            key, q, "a quantization the maxtext profile has no recipe for: costed as bf16"
        )
        q = ""
    elif table[q] != q and q:
        notes.unsupported_(key, q, f"costed as the profile's {table[q]} recipe")
    return precision_of(notes, PROFILE, key, table[q])


def _optimizer(notes: Notes) -> Any:
    opt = str(notes.get("opt_type")).lower()
    if opt not in ("adamw", "adam_pax"):
        notes.unsupported_("opt_type", opt, "an optimizer other than Adam: costed as Adam")
    w = str(notes.get("weight_dtype")).lower()
    g = str(notes.get("grad_dtype")).lower()
    if w == "float32" and g == "float32":
        return parse_optimizer("adam-fp32")
    notes.unsupported_("weight_dtype", w, f"{w} weights with {g} gradients: costed as adam-bf16")
    return OPTIMIZERS["adam-bf16"]


def _model(notes: Notes) -> str | None:
    name = notes.get("model_name")
    return None if str(name) == "default" else str(name)


# ------------------------------------------------------------------------------ write


def _expressible(plan: Plan) -> None:
    capabilities(STACK).refuse(plan)
    if plan.collective_matmul is False and plan.degrees.tp > 1:
        raise LaunchError(
            "MaxText's config cannot switch XLA's collective matmul off (collective_matmul=0)",
            rule="the collective matmul is a libtpu flag, on by default on TPU (the maxtext "
            "profile's default); MaxText turns it off only through LIBTPU_INIT_ARGS "
            "(DISABLE_COLLECTIVE_MATMUL = --xla_jf_spmd_threshold_for_windowed_einsum_mib="
            "1000000, benchmarks/xla_flags_library.py), which its command line does not carry, "
            "so the file would launch with the overlap the plan was costed without",
            fix="drop collective_matmul=0 (the default), or add that flag to LIBTPU_INIT_ARGS "
            "yourself when you launch",
        )


def write(config: LaunchConfig) -> str:
    plan, w = config.plan, config.workload
    needs(plan, STACK, "a training plan", "--plan")
    needs(w.seq_len, STACK, "a sequence length", "--seq")
    needs(w.global_batch_sequences, STACK, "a global batch", "--batch-tokens")
    _expressible(plan)
    d = plan.degrees
    name = _maxtext_model(config.model)
    out: dict[str, Any] = {"model_name": name} if name else {}
    out |= _batch_overrides(plan, w.global_batch_sequences)
    out["max_target_length"] = w.seq_len
    out["remat_policy"] = "minimal" if plan.remat.kind == RematKind.MATMULS else "full"
    if plan.offload_activations:  # capabilities.toml offload_remat: remat=matmuls only
        out["remat_policy"] = "minimal_offloaded"
    out |= {"opt_type": "adamw", "weight_dtype": "float32"}  # the stack's own (capabilities.toml)
    q = recipe_for(PROFILE, plan.dtypes, config.options.get("precision"), STACK)
    if q != "bf16":
        out["quantization"] = q
    out |= {
        "num_slices": 1,
        "dcn_data_parallelism": 1,
        "ici_data_parallelism": d.dp,
        "ici_fsdp_parallelism": d.fsdp,
        "ici_tensor_parallelism": d.tp,
        "ici_context_parallelism": d.sp,
        "ici_expert_parallelism": d.ep,
        "ici_pipeline_parallelism": d.pp,
    }
    if d.pp > 1:
        out |= _pipeline_overrides(config)
    if d.dp > 1 and plan.zero == 1:
        out["shard_optimizer_over_data"] = True
    if w.train_steps:
        out["steps"] = w.train_steps
    args = " ".join(f"{k}={_word(v)}" for k, v in out.items())
    unnamed = (
        ""
        if name or not config.model
        else f"# MaxText ships no model config for {config.model}: add its architecture settings\n"
    )
    return (
        f"# MaxText launch written by roofline: {plan.describe()}\n{unnamed}"
        f"python3 -m MaxText.train MaxText/configs/base.yml {args}\n"
    )


def _maxtext_model(model: str | None) -> str | None:
    """MaxText's model_name of a catalog model (launch/defaults/maxtext.toml [models])."""
    if not model:
        return None
    try:
        key = load_model(model).name
    except RooflineError:
        return None
    return stack_defaults(STACK).data["models"].get(key)


def _word(v: Any) -> str:
    return shlex.quote(str(v)) if not isinstance(v, float) else repr(v)


def _batch_overrides(plan: Plan, global_seqs: int) -> dict[str, Any]:
    d, m = plan.degrees, plan.microbatches
    if d.pp > 1:
        accum, per_pass = 1, m  # a multiple of the stages (capabilities.toml, refused before)
    else:
        accum, per_pass = m, 1
    pdbs = global_seqs / (d.n_chips * accum)
    if int(d.n_chips * pdbs) * accum != global_seqs or global_seqs % accum:
        raise LaunchError(
            f"MaxText cannot split {global_seqs} sequences over {d.n_chips} devices and {accum} accumulation steps",
            rule="per_device_batch_size × devices is a whole number of sequences",
            fix="change the batch or the microbatch count",
        )
    out: dict[str, Any] = {"per_device_batch_size": float(pdbs)}
    if accum > 1:
        out["gradient_accumulation_steps"] = accum
    if per_pass > 1:
        out["num_pipeline_microbatches"] = per_pass
    return out


def _pipeline_overrides(config: LaunchConfig) -> dict[str, Any]:
    plan = config.plan
    try:
        layers = load_model(str(config.model)).n_layers
    except RooflineError:
        raise LaunchError(
            f"MaxText's pipeline needs the model's layer count and model {config.model!r} cannot be loaded",
            rule="stages × repeats × layers per stage = the decoder layers",
            fix="give --model",
        ) from None
    per = plan.degrees.pp * plan.virtual_stages
    if layers % per:
        raise LaunchError(
            f"MaxText cannot split {layers} layers into {plan.degrees.pp} stages × {plan.virtual_stages} repeats",
            rule="stages × repeats × layers per stage = the decoder layers",
            fix="change pp or virtual",
        )
    return {
        "num_pipeline_repeats": plan.virtual_stages,
        "num_layers_per_pipeline_stage": layers // per,
    }
