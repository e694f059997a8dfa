"""torchtitan TOML job configs: read into the plan vocabulary, and write plans back out.

Semantics (launch/defaults/torchtitan.toml cites each default):

- degrees: `data_parallel_replicate_degree` (DDP replicas -> dp), `data_parallel_shard_degree`
  (FSDP, `-1` = the devices the others leave -> fsdp), `tensor_parallel_degree` (tp, always
  with sequence-parallel norms), `context_parallel_degree` (sp), `pipeline_parallel_degree`
  (pp); `expert_parallel_degree` borrows its ranks from the FSDP dimension, so fsdp =
  shard / ep;
- batch: `local_batch_size` sequences per data-parallel rank, `global_batch_size` (`-1` =
  local × replicas); gradient accumulation = global / (local × replicas); with pipeline
  parallelism each local batch runs as local / `pipeline_parallel_microbatch_size`
  microbatches (files of the older generation set `pipeline_parallel_microbatches`, default
  the number of stages);
- `activation_checkpoint.mode` none | full | selective (`selective_ac_option` "op" or every
  N-th layer), `model.converters` float8 / mx (the recipe of `quantize.linear.float8`),
  `training.dtype` (fp32 parameters by default), async TP, `compile.enable` (false: eager
  kernels, the profile's [eager] traffic; the plan's compile=0).
"""

from __future__ import annotations

import math
import re
import tomllib
from typing import Any

from roofline.launch.base import LaunchConfig, LaunchError, LaunchKind
from roofline.launch.capable import capabilities
from roofline.launch.common import (
    Notes,
    check_devices,
    check_known,
    costed_compiled,
    costed_switches,
    flatten,
    microbatch_count,
    needs,
    precision_of,
    recipe_for,
    remat_of,
    resolve_rest,
    stack_defaults,
    to_state,
    workload,
)
from roofline.specs.plan import (
    OPTIMIZERS,
    Degrees,
    Plan,
    RematKind,
    Schedule,
    parse_optimizer,
)

STACK = "torchtitan"
KIND = LaunchKind.TRAINING
PROFILE = "torchtitan"
OPTIMIZER = capabilities(
    STACK
).optimizer  # the stack's own (capabilities.toml): an export's default
_DEVICES = "--chips N or --system (data_parallel_shard_degree = -1 takes the devices left)"
# training.dtype -> the optimizer policy's bytes (fp32: fp32 params, grads and Adam moments)
_OPTIMIZER_OF_DTYPE = {"float32": "adam-fp32"}
_SECTIONS_READ = ("training", "parallelism", "activation_checkpoint")
# spellings only the older generation (before #980 / #1073) used
_OLD_GENERATION = (
    "experimental.pipeline_parallel_degree",
    "training.data_parallel_shard_degree",
    "experimental.pipeline_parallel_microbatches",
)


def sniff(text: str, path: str = "") -> int:
    """3 for a TOML with torchtitan's sections, 0 otherwise."""
    if not re.search(r"^\s*\[(parallelism|training|activation_checkpoint|job)\]", text, re.M):
        return 0
    return 3 if re.search(r"(local_batch_size|data_parallel_shard_degree|flavor)", text) else 1


# ------------------------------------------------------------------------------ read


def _load(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LaunchError(
            f"{source} is not valid TOML: {e}",
            rule="a torchtitan job config is a TOML file",
            fix="correct the line named",
        ) from None


def _settings(raw: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(dotted keys with the older spellings renamed to the current ones, whether the file is
    of the older generation that set the pipeline microbatch count)."""
    renamed = stack_defaults(STACK).data["renamed"]
    flat = flatten(raw)
    old = any(k in flat for k in _OLD_GENERATION)
    return {renamed.get(k, k): v for k, v in flat.items()}, old


def _check_names(notes: Notes, raw: dict[str, Any]) -> None:
    known = stack_defaults(STACK).data["known"]
    check_known(notes, raw, known["sections"], where=" section")
    for section in _SECTIONS_READ:
        if isinstance(raw.get(section), dict):
            check_known(notes, raw[section], known[section], where=f" in [{section}]")


def read(text: str, *, source: str = "<text>", chips: int | None = None) -> LaunchConfig:
    raw = _load(text, source)
    settings, old_generation = _settings(raw)
    notes = Notes(STACK, source, settings)
    _check_names(notes, raw)
    deg, replicas = _degrees(notes, chips)
    local = notes.integer("training.local_batch_size", notes.get("training.local_batch_size"))
    global_seqs = _global_batch(notes, local, replicas)
    accum = microbatch_count(
        notes,
        global_seqs=global_seqs,
        per_replica=local,
        replicas=replicas,
        key="training.global_batch_size",
    )
    schedule, virtual = _schedule(notes, deg.pp)
    per_pass = _pipeline_microbatches(notes, local, deg.pp, virtual, old_generation)
    recipe, dtypes = _precision(notes)
    plan = Plan(
        degrees=deg,
        microbatches=accum * per_pass,
        remat=_remat(notes),
        zero=0 if deg.dp > 1 else 1,
        schedule=schedule,
        virtual_stages=virtual,
        sequence_parallel=deg.tp > 1,
        collective_matmul=_async_tp(notes, deg.tp),
        compiled=notes.stated_flag("compile.enable"),  # unset: the profile's default, eager
        optimizer=_optimizer(notes),
        dtypes=dtypes,
    )
    _notes_unsupported(notes)
    return notes.config(
        model=_model(notes),
        plan=plan,
        chips=deg.n_chips,
        options={"framework": PROFILE, "precision": recipe},
        workload=workload(
            seq_len=notes.integer("training.seq_len", notes.get("training.seq_len")),
            global_seqs=global_seqs,
            micro=local // per_pass,
            steps=notes.integer("training.steps", notes.get("training.steps")),
        ),
    )


def _degrees(notes: Notes, chips: int | None) -> tuple[Degrees, int]:
    keys = (
        "parallelism.data_parallel_replicate_degree",
        "parallelism.data_parallel_shard_degree",
        "parallelism.tensor_parallel_degree",
        "parallelism.pipeline_parallel_degree",
        "parallelism.context_parallel_degree",
    )
    d = {k: notes.integer(k, notes.get(k), allow_rest=(k == keys[1])) for k in keys}
    d = resolve_rest(notes, d, chips, what=_DEVICES)
    check_devices(notes, math.prod(d.values()), chips, launcher="--chips")
    rep, shard, tp, pp, cp = (d[k] for k in keys)
    ep = _expert_degree(notes, shard, tp)
    return Degrees(dp=rep, fsdp=shard // ep, tp=tp, sp=cp, ep=ep, pp=pp), rep * shard


def _expert_degree(notes: Notes, shard: int, tp: int) -> int:
    key = "parallelism.expert_parallel_degree"
    ep = notes.integer(key, notes.get(key))
    if ep > 1 and shard % ep:
        use = math.gcd(ep, shard)
        notes.unsupported_(
            key,
            ep,
            f"expert ranks that span context or tensor ranks: the plan's ep borrows from the "
            f"FSDP dimension ({shard}), costed as ep={use}",
        )
        ep = use
    etp_key = "parallelism.expert_tensor_parallel_degree"
    etp = notes.integer(etp_key, notes.get(etp_key))
    if ep > 1 and tp > 1 and etp != tp:
        notes.unsupported_(
            etp_key, etp, f"routed experts without tensor parallelism (tp={tp}); costed with tp"
        )
    return ep


def _global_batch(notes: Notes, local: int, replicas: int) -> int:
    key = "training.global_batch_size"
    g = notes.integer(key, notes.get(key), allow_rest=True)
    return local * replicas if g == -1 else g


def _schedule(notes: Notes, pp: int) -> tuple[Schedule, int]:
    if pp == 1:
        return Schedule.ONE_F_ONE_B, 1
    key = "parallelism.pipeline_parallel_schedule"
    name = str(notes.get(key))
    table = stack_defaults(STACK).data["schedules"]
    found = table.get(name.lower())
    if found is None:
        raise notes.error(
            key,
            f"= {name!r} is not a pipeline schedule roofline can cost",
            rule="schedules: 1F1B, GPipe, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV",
            fix="write one of those",
        )
    kind, per_rank = Schedule(found[0]), int(found[1])
    if name.lower() in ("zbvzerobubble", "dualpipev"):
        notes.unsupported_(
            key, name, "a V-shaped schedule: costed as interleaved with 2 stages per rank"
        )
    lps = "parallelism.pipeline_parallel_layers_per_stage"
    if notes.given(lps):
        notes.unsupported_(
            lps,
            notes.settings[lps],
            f"stages per rank from layers per stage: costed with the schedule's default {per_rank}",
        )
    return kind, per_rank


def _pipeline_microbatches(notes: Notes, local: int, pp: int, virtual: int, old: bool) -> int:
    """Microbatches each local batch runs as (1 without pipeline parallelism)."""
    if pp == 1:
        return 1
    count = "experimental.pipeline_parallel_microbatches"
    if old or notes.given(count):
        n = notes.get(count)
        n = pp * virtual if n == "stages" else notes.integer(count, n)
        if local % n:
            notes.problem(
                count, f"the local batch of {local} is not a multiple of {n} microbatches"
            )
        return n
    key = "parallelism.pipeline_parallel_microbatch_size"
    size = notes.integer(key, notes.get(key))
    if local % size:
        notes.problem(
            key, f"the local batch of {local} is not a multiple of microbatch size {size}"
        )
    n = max(1, local // size)
    if n < pp * virtual:
        notes.problem(key, f"{n} microbatches are fewer than the {pp * virtual} pipeline stages")
    return n


def _remat(notes: Notes) -> Any:
    key = "activation_checkpoint.mode"
    mode = str(notes.get(key)).lower()
    if mode in ("none", "full"):
        return remat_of(notes, PROFILE, key, mode)
    if mode == "memory_budget":
        notes.unsupported_(
            key, mode, "a memory budget for the compiler's choice: costed as selective op"
        )
        return remat_of(notes, PROFILE, key, "selective-op")
    if mode != "selective":
        raise notes.error(
            key,
            f"= {mode!r}",
            rule="modes: none, full, selective, memory_budget",
            fix="write one of those",
        )
    opt_key = "activation_checkpoint.selective_ac_option"
    option = str(notes.get(opt_key)).strip().lower()
    if option == "op":
        return remat_of(notes, PROFILE, opt_key, "selective-op")
    every = notes.integer(opt_key, option)
    if every == 1:
        return remat_of(notes, PROFILE, opt_key, "full")
    if every != 2:
        notes.unsupported_(
            opt_key, option, "every N-th layer for N other than 2: costed as every 2nd"
        )
    return remat_of(notes, PROFILE, opt_key, "selective-layer")


def _precision(notes: Notes) -> tuple[str, Any]:
    converters = notes.get("model.converters")
    if isinstance(converters, str):
        converters = [c for c in converters.split(",") if c.strip()]
    names = " ".join(str(c).lower() for c in converters)
    if "float8" in names:
        key = "quantize.linear.float8.recipe_name"
        recipe = str(notes.get(key) or "tensorwise").lower()
        if recipe == "rowwise_with_gw_hp":
            notes.unsupported_(
                key, recipe, "rowwise with a bf16 weight gradient: costed as rowwise"
            )
            recipe = "rowwise"
        return precision_of(notes, PROFILE, key, f"float8-{recipe}")
    if re.search(r"\bmx\b|\.mx\b|mxfp8", names):
        return precision_of(notes, PROFILE, "model.converters", "mxfp8")
    return precision_of(notes, PROFILE, "model.converters", "bf16")


def _async_tp(notes: Notes, tp: int) -> bool | None:
    """Async TP as the file states it with tp > 1, else None (the stack's default)."""
    key = "parallelism.enable_async_tensor_parallel"
    stated = notes.stated_flag(key)
    on = stated if tp > 1 else None
    if on and not notes.flag("compile.enable", notes.get("compile.enable")):
        notes.problem(key, "async tensor parallelism takes effect only with compile.enable = true")
    return on


def _optimizer(notes: Notes) -> Any:
    key = "training.dtype"
    dtype = str(notes.get(key)).lower()
    if dtype in _OPTIMIZER_OF_DTYPE:
        return parse_optimizer(_OPTIMIZER_OF_DTYPE[dtype])
    notes.unsupported_(
        key,
        dtype,
        "bf16 parameters, gradients and optimizer state: costed as adam-bf16 (fp32 moments)",
    )
    return OPTIMIZERS["adam-bf16"]


def _notes_unsupported(notes: Notes) -> None:
    if notes.flag("training.enable_cpu_offload", notes.get("training.enable_cpu_offload")):
        notes.unsupported_(
            "training.enable_cpu_offload", True, "host offload of parameters and optimizer state"
        )


def _model(notes: Notes) -> str:
    path = notes.settings.get("model.hf_assets_path")  # (a tokenizer_path names no model)
    if path:
        return str(path)
    return f"{notes.get('model.name')}-{notes.get('model.flavor')}"


# ------------------------------------------------------------------------------ write


def _expressible(plan: Plan) -> None:
    capabilities(STACK).refuse(plan)


def _batch_split(plan: Plan, global_seqs: int) -> tuple[int, int, int]:
    """(local batch, global batch, pipeline microbatch size) for the plan's microbatches."""
    d = plan.degrees
    replicas = d.dp * d.fsdp * d.ep
    m = plan.microbatches
    if global_seqs % (replicas * m):
        raise LaunchError(
            f"torchtitan cannot split a batch of {global_seqs} sequences into {m} microbatches "
            f"over {replicas} data-parallel ranks",
            rule="the global batch is a whole number of sequences per rank per microbatch",
            fix="change the batch or the microbatch count",
        )
    if d.pp > 1:
        local = global_seqs // replicas
        return local, global_seqs, local // m
    return global_seqs // (replicas * m), global_seqs, 1


def write(config: LaunchConfig) -> str:
    plan, w = config.plan, config.workload
    needs(plan, STACK, "a training plan", "--plan")
    needs(w.seq_len, STACK, "a sequence length", "--seq")
    needs(w.global_batch_sequences, STACK, "a global batch", "--batch-tokens")
    _expressible(plan)
    local, global_seqs, mbs = _batch_split(plan, w.global_batch_sequences)
    d = plan.degrees
    async_tp = to_state(
        plan.collective_matmul,
        costed_switches(plan, PROFILE)["collective_matmul"],
        STACK,
        "parallelism.enable_async_tensor_parallel",
    )
    sections: dict[str, dict[str, Any]] = {
        "model": _model_section(config),
        "training": {
            "local_batch_size": local,
            "global_batch_size": global_seqs,
            "seq_len": w.seq_len,
            # the stack's own optimizer (capabilities.toml): fp32 parameters, bf16 compute, fp32
            # gradient reduction, AdamW
            "dtype": "float32",
            "mixed_precision_param": "bfloat16",
            "mixed_precision_reduce": "float32",
        },
        "optimizer": {"name": "AdamW"},
        "parallelism": {
            "data_parallel_replicate_degree": d.dp,
            "data_parallel_shard_degree": d.fsdp * d.ep,
            "tensor_parallel_degree": d.tp,
            "enable_async_tensor_parallel": async_tp,  # None: left out (below)
            "pipeline_parallel_degree": d.pp,
            "pipeline_parallel_schedule": _schedule_name(plan),
            "pipeline_parallel_microbatch_size": mbs,
            "context_parallel_degree": d.sp,
            "expert_parallel_degree": d.ep,
            "expert_tensor_parallel_degree": d.tp if d.ep > 1 else 1,
        },
        "activation_checkpoint": _remat_section(plan),
        "compile": {"enable": _compile(plan, async_tp)},
    }
    for section, key in (("parallelism", "enable_async_tensor_parallel"), ("compile", "enable")):
        if sections[section][key] is None:  # torchtitan's own default is what was costed
            del sections[section][key]
    if not sections["compile"]:
        del sections["compile"]
    if w.train_steps:
        sections["training"]["steps"] = w.train_steps
    recipe = recipe_for(PROFILE, plan.dtypes, config.options.get("precision"), STACK)
    if recipe.startswith("float8"):
        sections["model"]["converters"] = ["quantize.linear.float8"]
        sections["quantize.linear.float8"] = {"recipe_name": recipe.split("-", 1)[1]}
    elif recipe == "mxfp8":
        sections["model"]["converters"] = ["quantize.linear.mx"]
    return _toml(sections, header=f"# torchtitan job config written by roofline: {plan.describe()}")


def _compile(plan: Plan, async_tp: bool | None) -> bool | None:
    """[compile] enable as written: the plan's compile, or unset the profile's default that the
    step costs where torchtitan's own differs (launch.common.to_state; None: left out); on
    wherever async TP is, which takes effect only compiled."""
    stated = to_state(plan.compiled, costed_compiled(plan, PROFILE), STACK, "compile.enable")
    return True if async_tp else stated


def _model_section(config: LaunchConfig) -> dict[str, Any]:
    return {"hf_assets_path": config.model} if config.model else {}


def _schedule_name(plan: Plan) -> str:
    if plan.degrees.pp == 1 or plan.schedule == Schedule.ONE_F_ONE_B:
        return "1F1B"
    if plan.schedule == Schedule.GPIPE:
        return "GPipe"
    return "Interleaved1F1B"  # 2 stages per rank (capabilities.toml [torchtitan.rules.virtual])


def _remat_section(plan: Plan) -> dict[str, Any]:
    kind = plan.remat.kind
    if kind == RematKind.MATMULS:
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": kind.value}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml(sections: dict[str, dict[str, Any]], header: str) -> str:
    lines = [header]
    for name, body in sections.items():
        if not body:
            continue
        lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"
