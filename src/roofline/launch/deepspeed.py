"""DeepSpeed JSON configs: ZeRO stage and offload, the batch triple, bf16/fp16, AutoTP.

train_batch_size = micro batch per GPU × gradient accumulation steps × data-parallel world
size; two of the three give the third (deepspeed/runtime/config.py:942-988), and all three
give the data-parallel size. ZeRO stages 0-2 shard over dp (the plan's `zero`); stage 3 is
FSDP. `tensor_parallel.autotp_size` is tensor parallelism. Pipeline and sequence
parallelism live in the model code, not the JSON, so they are never read from it.
Activation checkpointing is called by the model code; the JSON's section only configures it.
Defaults: launch/defaults/deepspeed.toml.
"""

from __future__ import annotations

import json
import re
from typing import Any

from roofline.launch.base import LaunchConfig, LaunchError, LaunchKind
from roofline.launch.capable import capabilities
from roofline.launch.common import (
    Notes,
    check_known,
    needs,
    precision_of,
    recipe_for,
    remat_of,
    stack_defaults,
    workload,
)
from roofline.specs.plan import Degrees, Plan, parse_optimizer

STACK = "deepspeed"
KIND = LaunchKind.TRAINING
PROFILE = "deepspeed"
OPTIMIZER = capabilities(
    STACK
).optimizer  # the stack's own (capabilities.toml): an export's default
_DEVICES = "--chips N (the JSON gives only two of train_batch_size, micro batch and accumulation)"


def sniff(text: str, path: str = "") -> int:
    if not text.lstrip().startswith("{"):
        return 0
    return (
        4
        if re.search(r'"(zero_optimization|train_micro_batch_size_per_gpu|train_batch_size)"', text)
        else 0
    )


def _load(text: str, source: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise LaunchError(
            f"{source} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
            rule="a DeepSpeed config is a JSON object",
            fix="correct the line named",
        ) from None
    if not isinstance(raw, dict):
        raise LaunchError(
            f"{source} is not a JSON object",
            rule="a DeepSpeed config is a JSON object",
            fix="give the config file",
        )
    return raw


def _flat(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if isinstance(v, dict) and k in (
            "bf16",
            "fp16",
            "zero_optimization",
            "tensor_parallel",
            "bfloat16",
        ):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    if "bfloat16.enabled" in out and "bf16.enabled" not in out:
        out["bf16.enabled"] = out["bfloat16.enabled"]
    return out


def _maybe(notes: Notes, key: str, low: int = 1) -> int | None:
    v = notes.get(key)
    return None if v in (None, "none", "auto") else notes.integer(key, v, low=low)


def read(text: str, *, source: str = "<text>", chips: int | None = None) -> LaunchConfig:
    raw = _load(text, source)
    notes = Notes(STACK, source, _flat(raw))
    known = stack_defaults(STACK).data["known"]
    check_known(notes, raw, known["top"])
    if isinstance(raw.get("zero_optimization"), dict):
        check_known(
            notes,
            raw["zero_optimization"],
            known["zero_optimization"],
            where=" in zero_optimization",
        )
    tp = _maybe(notes, "tensor_parallel.autotp_size", low=0) or 1
    dp, micro, accum, train = _batch(notes, chips, tp)
    stage = notes.integer("zero_optimization.stage", notes.get("zero_optimization.stage"), low=0)
    if stage > 3:
        raise notes.error(
            "zero_optimization.stage",
            f"= {stage}",
            rule="ZeRO stages are 0, 1, 2 and 3",
            fix="write 0-3",
        )
    offload = _offload(notes)
    recipe, dtypes = _precision(notes)
    plan = Plan(
        degrees=Degrees(dp=1 if stage == 3 else dp, fsdp=dp if stage == 3 else 1, tp=tp),
        microbatches=accum,
        remat=_remat(notes),
        zero=stage if stage < 3 else 1,
        optimizer=parse_optimizer(_optimizer(notes)),
        dtypes=dtypes,
    )
    return notes.config(
        model=None,
        plan=plan,
        chips=dp * tp,
        options={"framework": PROFILE, "precision": recipe} | offload,
        workload=workload(seq_len=None, global_seqs=train, micro=micro),
    )


def _batch(notes: Notes, chips: int | None, tp: int) -> tuple[int, int, int, int]:
    """(data-parallel size, micro batch, accumulation steps, train batch)."""
    train = _maybe(notes, "train_batch_size")
    micro = _maybe(notes, "train_micro_batch_size_per_gpu")
    accum = _maybe(notes, "gradient_accumulation_steps")
    dp = None if chips is None else chips // tp
    if chips is not None and chips % tp:
        notes.problem(
            "tensor_parallel.autotp_size", f"autotp_size {tp} does not divide {chips} GPUs"
        )
    if train is not None and micro is not None and accum is not None:
        implied = train // (micro * accum)
        if train % (micro * accum):
            notes.problem(
                "train_batch_size",
                f"{train} is not micro {micro} × accumulation {accum} × a whole number of GPUs",
            )
        if dp is not None and dp != implied:
            notes.problem(
                "train_batch_size",
                f"the batch triple implies {implied} data-parallel GPUs but --chips gives {dp}",
            )
        return max(1, implied), micro, accum, train
    if dp is None:
        raise notes.error(
            "the device count",
            "is unknown",
            rule="train_batch_size = micro × accumulation × data-parallel GPUs",
            fix=f"give {_DEVICES}",
        )
    return _complete(notes, dp, train, micro, accum)


def _complete(
    notes: Notes, dp: int, train: int | None, micro: int | None, accum: int | None
) -> tuple[int, int, int, int]:
    """DeepSpeed's own completion of the batch triple (runtime/config.py:942-988)."""
    if train is not None and micro is not None:
        accum = max(1, train // micro // dp)
    elif train is not None and accum is not None:
        micro = max(1, train // dp // accum)
    elif micro is not None:
        accum = accum or 1
        train = micro * accum * dp
    elif train is not None:
        accum, micro = 1, max(1, train // dp)
    else:
        autos = [
            k
            for k in ("train_batch_size", "train_micro_batch_size_per_gpu")
            if notes.settings.get(k) == "auto"
        ]
        if autos:
            raise notes.error(
                " and ".join(autos),
                '= "auto": the Hugging Face Trainer fills it from its own arguments at launch',
                rule="roofline reads the batch from the config itself",
                fix="write the numbers the Trainer passes (per-device batch, accumulation)",
            )
        raise notes.error(
            "train_batch_size",
            "and train_micro_batch_size_per_gpu are both missing",
            rule="DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu",
            fix="add train_micro_batch_size_per_gpu",
        )
    if train != micro * accum * dp:
        notes.problem(
            "train_batch_size", f"{train} != micro {micro} × accumulation {accum} × {dp} GPUs"
        )
    return dp, int(micro), int(accum), int(train)


def _offload(notes: Notes) -> dict[str, str]:
    """The optimizer offloaded to the CPU is costed (`training.offload`); NVMe and parameter
    offload are not."""
    out: dict[str, str] = {}
    for key in ("zero_optimization.offload_optimizer", "zero_optimization.offload_param"):
        v = notes.get(key)
        device = str(v.get("device", "none")).lower() if isinstance(v, dict) else "none"
        if key.endswith("offload_optimizer") and device == "cpu":
            out["offload_optimizer"] = "true"
        elif device != "none":
            notes.unsupported_(
                key, v, f"offload to {v.get('device')}: costed as if the state stays in HBM"
            )
    return out


def _precision(notes: Notes) -> tuple[str, Any]:
    if notes.flag("bf16.enabled", notes.get("bf16.enabled")):
        return precision_of(notes, PROFILE, "bf16.enabled", "bf16")
    if notes.flag("fp16.enabled", notes.get("fp16.enabled")):
        return precision_of(notes, PROFILE, "fp16.enabled", "fp16")
    notes.unsupported_(
        "bf16.enabled", False, "fp32 training (neither bf16 nor fp16): costed with bf16 compute"
    )
    return precision_of(notes, PROFILE, "bf16.enabled", "bf16")


def _optimizer(notes: Notes) -> str:
    """fp32 parameters, gradients and Adam moments without bf16/fp16; else fp32 master copies."""
    mixed = notes.flag("bf16.enabled", notes.get("bf16.enabled")) or notes.flag(
        "fp16.enabled", notes.get("fp16.enabled")
    )
    return "adam-fp32-master" if mixed else "adam-fp32"


def _remat(notes: Notes) -> Any:
    section = notes.get("activation_checkpointing")
    if isinstance(section, dict):
        notes.unsupported_(
            "activation_checkpointing",
            section,
            "configures the checkpointing the model code calls; whether the code calls it is not in the JSON: costed as none",
        )
    return remat_of(notes, PROFILE, "activation_checkpointing", "none")


# ------------------------------------------------------------------------------ write


def _expressible(plan: Plan) -> None:
    capabilities(STACK).refuse(plan)


def write(config: LaunchConfig) -> str:
    plan, w = config.plan, config.workload
    needs(plan, STACK, "a training plan", "--plan")
    needs(w.global_batch_sequences, STACK, "a global batch", "--batch-tokens")
    _expressible(plan)
    d = plan.degrees
    dp = d.dp * d.fsdp
    micro = w.global_batch_sequences // (dp * plan.microbatches)
    if micro * dp * plan.microbatches != w.global_batch_sequences:
        raise LaunchError(
            f"DeepSpeed cannot split {w.global_batch_sequences} sequences into {plan.microbatches} accumulation steps over {dp} GPUs",
            rule="train_batch_size = micro × accumulation × data-parallel GPUs",
            fix="change the batch or the microbatch count",
        )
    recipe = recipe_for(PROFILE, plan.dtypes, config.options.get("precision"), STACK)
    doc: dict[str, Any] = {
        "train_batch_size": w.global_batch_sequences,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": plan.microbatches,
        "zero_optimization": {"stage": 3 if d.fsdp > 1 else plan.zero},
        "bf16": {"enabled": recipe == "bf16"},
        "fp16": {"enabled": recipe == "fp16"},
    }
    if config.options.get("offload_optimizer") == "true":
        doc["zero_optimization"]["offload_optimizer"] = _offload_section(doc)
    if d.tp > 1:
        doc["tensor_parallel"] = {"autotp_size": d.tp}
    return json.dumps(doc, indent=2) + "\n"


def _offload_section(doc: dict[str, Any]) -> dict[str, Any]:
    """ZeRO-Offload's section (the framework record's [data_parallel.optimizer_offload]):
    the optimizer state and its Adam step on the CPU, pinned host buffers."""
    if doc["zero_optimization"]["stage"] == 0:
        raise LaunchError(
            "DeepSpeed cannot offload the optimizer at ZeRO stage 0",
            rule="zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3",
            fix="use zero=1 (or 2, or fsdp) in the plan",
        )
    return {"device": "cpu", "pin_memory": True}
