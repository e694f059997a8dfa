"""NeMo launcher / training YAML (NeMo 1.x `megatron_gpt_config.yaml` and the launcher's
`conf/training/<model>/<size>.yaml`): NeMo's names mapped onto Megatron's semantics.

`trainer.devices × trainer.num_nodes` GPUs; `model.tensor_model_parallel_size`,
`pipeline_model_parallel_size`, `virtual_pipeline_model_parallel_size`,
`context_parallel_size`, `expert_model_parallel_size`, `sequence_parallel`,
`micro_batch_size`, `global_batch_size`, `encoder_seq_length`,
`activations_checkpoint_granularity` / `_method` / `_num_layers` (with `recompute_modules`, the
Megatron-Core TransformerConfig field, other than core_attn: the plan's partial recompute), `fp8`,
`ub_tp_comm_overlap`, `fsdp`, `megatron_amp_O2`, `optim.name` (distributed_fused_adam = the
distributed optimizer), `optim.grad_sync_dtype` (bf16: bf16 gradients); `trainer.precision`. Hydra `${a.b}` references to the same file are resolved.
Defaults: launch/defaults/nemo.toml. The plan is built by `megatron.megatron_config`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from roofline.launch.base import LaunchConfig, LaunchError, LaunchKind
from roofline.launch.capable import capabilities
from roofline.launch.common import (
    Notes,
    costed_switches,
    flatten,
    needs,
    recipe_for,
    remat_of,
    to_state,
    yaml_mapping,
)
from roofline.launch.megatron import BF16_GRADS, MegatronSettings, megatron_config
from roofline.specs.plan import OPTIMIZERS, Plan, RematKind, parse_modules

STACK = "nemo"
KIND = LaunchKind.TRAINING
PROFILE = "megatron"
OPTIMIZER = capabilities(
    STACK
).optimizer  # the stack's own (capabilities.toml): an export's default
_REF = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def sniff(text: str, path: str = "") -> int:
    if re.search(
        r"^\s*(tensor_model_parallel_size|micro_batch_size)\s*:", text, re.M
    ) and re.search(r"^\s*trainer\s*:", text, re.M):
        return 4
    return 1 if re.search(r"^\s*tensor_model_parallel_size\s*:", text, re.M) else 0


def _resolve(flat: dict[str, Any], source: str) -> dict[str, Any]:
    """Hydra `${a.b}` references to keys of the same file (a leading `training.` dropped); a
    reference to a key outside the file stays as written, and is an error only where the
    reader reads that key (the value is then not a number)."""

    def value(key: str, v: Any, depth: int = 0) -> Any:
        if not isinstance(v, str) or "${" not in v or depth > 8:
            return v
        m = _REF.fullmatch(v.strip())
        if not m:
            return v  # a resolver (${multiply:...}) or text around a reference: kept as written
        ref = m.group(1)
        for cand in (ref, ref.removeprefix("training.")):
            if cand in flat:
                return value(cand, flat[cand], depth + 1)
        return v  # a launcher-level key (${data_dir}): kept as written; read, it is an error

    return {k: value(k, v) for k, v in flat.items()}


def _load(text: str, source: str) -> dict[str, Any]:
    raw = yaml_mapping(text, source, "NeMo")
    if not isinstance(raw, dict) or "model" not in raw:
        raise LaunchError(
            f"{source} has no `model:` section",
            rule="a NeMo training config holds trainer: and model: sections",
            fix="import the training config (conf/training/...yaml)",
        )
    return _resolve(flatten(raw), source)


def _opt_int(notes: Notes, key: str) -> int | None:
    v = notes.get(key)
    return None if v in (None, "none") else notes.integer(key, v)


def read(text: str, *, source: str = "<text>", chips: int | None = None) -> LaunchConfig:
    notes = Notes(STACK, source, _load(text, source))
    world = notes.integer("trainer.devices", notes.get("trainer.devices")) * notes.integer(
        "trainer.num_nodes", notes.get("trainer.num_nodes")
    )
    if chips is not None and chips != world:
        notes.problem(
            "trainer",
            f"the file asks for {world} GPUs (devices × num_nodes) but --chips gives {chips}",
        )
    s = MegatronSettings(
        tp=notes.integer(
            "model.tensor_model_parallel_size", notes.get("model.tensor_model_parallel_size")
        ),
        pp=notes.integer(
            "model.pipeline_model_parallel_size", notes.get("model.pipeline_model_parallel_size")
        ),
        cp=notes.integer("model.context_parallel_size", notes.get("model.context_parallel_size")),
        ep=notes.integer(
            "model.expert_model_parallel_size", notes.get("model.expert_model_parallel_size")
        ),
        micro=notes.integer("model.micro_batch_size", notes.get("model.micro_batch_size")),
        global_batch=_opt_int(notes, "model.global_batch_size"),
        seq=_seq(notes),
        iters=_opt_int(notes, "trainer.max_steps"),
        virtual=_opt_int(notes, "model.virtual_pipeline_model_parallel_size") or 1,
        sequence_parallel=notes.flag(
            "model.sequence_parallel", notes.get("model.sequence_parallel")
        ),
        tp_overlap=notes.stated_flag("model.ub_tp_comm_overlap"),
        ep_overlap=None,
        distributed_optimizer=str(notes.get("model.optim.name")) == "distributed_fused_adam",
        fsdp=notes.flag("model.fsdp", notes.get("model.fsdp")),
        recompute=_recompute(notes),
        recipe=_recipe(notes),
        optimizer=_optimizer(notes),
    )
    return megatron_config(notes, s, world, model=_model(notes))


def _seq(notes: Notes) -> int:
    if notes.given("model.seq_length"):
        return notes.integer("model.seq_length", notes.settings["model.seq_length"])
    return notes.integer("model.encoder_seq_length", notes.get("model.encoder_seq_length"))


def _recompute(notes: Notes) -> Any:
    key = "model.activations_checkpoint_granularity"
    gran = notes.get(key)
    if gran in (None, "none", "null"):
        return remat_of(notes, PROFILE, key, "none")
    if gran == "selective":
        return _selective(notes, key)
    if gran != "full":
        raise notes.error(
            key, f"= {gran!r}", rule="selective, full or null", fix=f"write {key}: full"
        )
    method = notes.get("model.activations_checkpoint_method")
    layers = notes.get("model.activations_checkpoint_num_layers")
    if method == "block" or (method == "uniform" and layers not in (1, None, "none")):
        notes.unsupported_(
            "model.activations_checkpoint_method",
            f"{method} {layers}",
            "part of the layers or groups of layers: costed as full",
        )
    return remat_of(notes, PROFILE, key, "full")


def _selective(notes: Notes, key: str) -> Any:
    """Megatron-Core's default selective module (core_attn) is the stack's `selective` policy;
    other `model.recompute_modules` are the plan's partial recompute (remat=a+b)."""
    mods = notes.settings.get("model.recompute_modules")  # absent: Megatron-Core core_attn
    words = mods if isinstance(mods, list) else str(mods or "").split()
    if not words or [str(w) for w in words] == ["core_attn"]:
        return remat_of(notes, PROFILE, key, "selective")
    remat = parse_modules(" ".join(str(w) for w in words))
    if remat is None:
        raise notes.error(
            "model.recompute_modules",
            f"= {mods!r}",
            rule="modules are core_attn, mla_up_proj, layernorm, mlp, moe, moe_act, shared_experts",
            fix="write e.g. recompute_modules: [mla_up_proj, moe_act]",
        )
    return remat


def _recipe(notes: Notes) -> str:
    if notes.flag("model.fp8", notes.get("model.fp8")):
        return "fp8-delayed"  # NeMo 1 runs Transformer Engine's delayed-scaling recipe
    precision = str(notes.get("trainer.precision")).lower()
    if precision in ("32", "32-true", "fp32"):
        notes.unsupported_("trainer.precision", precision, "fp32 training: costed as bf16")
    return "bf16"


def _optimizer(notes: Notes) -> str:
    if notes.given("model.megatron_amp_O2") and not notes.flag(
        "model.megatron_amp_O2", notes.settings["model.megatron_amp_O2"]
    ):
        return "adam-fp32"  # O1: fp32 parameters and gradients
    if str(notes.settings.get("model.optim.grad_sync_dtype")).lower() in ("bf16", "bfloat16"):
        return BF16_GRADS  # distributed_fused_adam's gradient buffers in bf16
    return "adam-fp32-master"


def _model(notes: Notes) -> str | None:
    for key in ("model.hf_model_name_or_path", "model.tokenizer.model", "run.name"):
        v = notes.settings.get(key)
        if (
            isinstance(v, str)
            and v
            and "${" not in v
            and not v.endswith((".model", ".json", ".txt"))
        ):
            return v
    return None


# ------------------------------------------------------------------------------ write


def write(config: LaunchConfig) -> str:
    plan, w = config.plan, config.workload
    needs(plan, STACK, "a training plan", "--plan")
    needs(w.seq_len, STACK, "a sequence length", "--seq")
    needs(w.global_batch_sequences, STACK, "a global batch", "--batch-tokens")
    _expressible(plan)
    d = plan.degrees
    n = d.n_chips
    per_node = 8 if n % 8 == 0 else n
    dp_all = d.dp * d.fsdp * d.ep
    micro = w.global_batch_sequences // (plan.microbatches * dp_all)
    if micro * plan.microbatches * dp_all != w.global_batch_sequences:
        raise LaunchError(
            f"NeMo cannot split {w.global_batch_sequences} sequences into {plan.microbatches} microbatches over {dp_all} data-parallel ranks",
            rule="global batch = micro batch × data-parallel size × microbatches",
            fix="change the batch or the microbatch count",
        )
    model: dict[str, Any] = {
        "micro_batch_size": micro,
        "global_batch_size": w.global_batch_sequences,
        "encoder_seq_length": w.seq_len,
        "tensor_model_parallel_size": d.tp,
        "pipeline_model_parallel_size": d.pp,
        "virtual_pipeline_model_parallel_size": plan.virtual_stages
        if plan.virtual_stages > 1
        else None,
        "context_parallel_size": d.sp,
        "expert_model_parallel_size": d.ep,
        "sequence_parallel": plan.sequence_parallel and d.tp > 1,
        # the plan's TP overlap; unset, the profile's default the step costs where NeMo's own
        # (false) differs: on with SP and tp > 1, as NVIDIA's recipes run it (None: left out)
        "ub_tp_comm_overlap": to_state(
            plan.collective_matmul,
            costed_switches(plan, PROFILE)["collective_matmul"],
            STACK,
            "model.ub_tp_comm_overlap",
        ),
        "fsdp": d.fsdp > 1,
        "megatron_amp_O2": True,
        "activations_checkpoint_granularity": _granularity(plan),
        "recompute_modules": list(plan.remat.modules) or None,
        "activations_checkpoint_method": "uniform" if plan.remat.kind == RematKind.FULL else None,
        "activations_checkpoint_num_layers": 1 if plan.remat.kind == RematKind.FULL else None,
        "fp8": recipe_for(PROFILE, plan.dtypes, config.options.get("precision"), "NeMo")
        == "fp8-delayed",
        "optim": _optim(plan),
    }
    if model["ub_tp_comm_overlap"] is None:  # NeMo's default is what was costed
        del model["ub_tp_comm_overlap"]
    if config.model:
        model["hf_model_name_or_path"] = config.model
    trainer: dict[str, Any] = {
        "devices": per_node,
        "num_nodes": n // per_node,
        "precision": "bf16-mixed",
    }
    if w.train_steps:
        trainer["max_steps"] = w.train_steps
    head = f"# NeMo training config written by roofline: {plan.describe()}\n"
    return head + yaml.safe_dump({"trainer": trainer, "model": model}, sort_keys=False)


def _granularity(plan: Plan) -> str | None:
    return {
        RematKind.MATMULS: "selective",
        RematKind.MODULES: "selective",
        RematKind.FULL: "full",
    }.get(plan.remat.kind)


def _optim(plan: Plan) -> dict[str, Any]:
    distributed = plan.zero == 1 and plan.degrees.dp > 1
    out: dict[str, Any] = {"name": "distributed_fused_adam" if distributed else "fused_adam"}
    if plan.optimizer == OPTIMIZERS[BF16_GRADS]:
        out["grad_sync_dtype"] = "bf16"
    return out


def _expressible(plan: Plan) -> None:
    recipe = recipe_for(PROFILE, plan.dtypes, None, "NeMo")
    capabilities(STACK).refuse(plan, recipe, fix="change the plan (or export to megatron)")
