"""Megatron-LM: the `pretrain_gpt.py` argument list of a launch script.

The script is read as a shell would (launch/shell.py: `NAME=value`, arrays, `${X:-d}`,
simple `if [[ ... ]]`), the launcher's device count from `torchrun --nproc_per_node N
--nnodes M` (or `#SBATCH --nodes` / `--gpus-per-node`, or `WORLD_SIZE`), then Megatron's
semantics (launch/defaults/megatron.toml cites each default):

- data-parallel size = world / (TP × PP × CP) (arguments.py:442-448); expert parallelism
  borrows its ranks from it, so dp = that / EP; Megatron FSDP (`--use-megatron-fsdp`,
  `--use-torch-fsdp2`) shards over the same ranks (fsdp instead of dp), and with
  `--num-distributed-optimizer-instances R` Megatron-FSDP runs HSDP: dp = R replicas of an
  fsdp group of the rest (`--outer-dp-sharding-strategy optim`: ZeRO-1 over the replicas);
- microbatches = global batch / (micro batch × data-parallel size); the global batch
  defaults to micro × data-parallel size;
- virtual pipeline stages from `--num-layers-per-virtual-pipeline-stage` (with
  `--num-layers`) or `--num-virtual-stages-per-pipeline-rank` (the interleaved schedule);
- `--recompute-granularity` full | selective (`--recompute-activations` = selective; with
  `--recompute-modules` other than core_attn, the plan's partial recompute), fp8
  (`--fp8-format` + `--fp8-recipe`), fp4, `--bf16`/`--fp16`, `--use-distributed-optimizer`
  (ZeRO-1), `--grad-reduce-in-bf16` (bf16 gradients), `--sequence-parallel`, `--tp-comm-overlap`,
  `--overlap-moe-expert-parallel-comm`.

`nemo.py` maps NeMo's YAML names onto the same semantics (`megatron_plan`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from roofline.launch.base import Default, LaunchConfig, LaunchError, LaunchKind
from roofline.launch.capable import capabilities
from roofline.launch.common import (
    Notes,
    check_known,
    costed_overlap,
    costed_switches,
    microbatch_count,
    needs,
    precision_of,
    recipe_for,
    remat_of,
    stack_defaults,
    to_state,
    workload,
)
from roofline.launch.shell import script
from roofline.specs.framework import OverlapClass
from roofline.specs.plan import (
    OPTIMIZERS,
    Degrees,
    Plan,
    RematKind,
    Schedule,
    parse_modules,
    parse_optimizer,
)

STACK = "megatron"
KIND = LaunchKind.TRAINING
PROFILE = "megatron"
OPTIMIZER = capabilities(STACK).optimizer  # the stack's own (capabilities.toml): export's default
BF16_GRADS = "adam-fp32-master-bf16-grads"  # the same with --grad-reduce-in-bf16
# arguments that take several words (argparse nargs='*'): megatron/training/arguments.py
# --recompute-modules
_MULTI = ("recompute-modules",)
_SCRIPT = re.compile(r"pretrain_\w+\.py")
_NOT_LAUNCH = ("echo", "printf", "ls", "test", "[", "[[", "cat", "cp", "if")
# the arguments this reader reads (a near miss of one is an error naming it)
_READ = (
    "tensor-model-parallel-size",
    "pipeline-model-parallel-size",
    "context-parallel-size",
    "expert-model-parallel-size",
    "expert-tensor-parallel-size",
    "micro-batch-size",
    "global-batch-size",
    "seq-length",
    "train-iters",
    "num-layers",
    "num-layers-per-virtual-pipeline-stage",
    "num-virtual-stages-per-pipeline-rank",
    "sequence-parallel",
    "tp-comm-overlap",
    "overlap-moe-expert-parallel-comm",
    "overlap-grad-reduce",
    "overlap-param-gather",
    "use-distributed-optimizer",
    "use-megatron-fsdp",
    "use-torch-fsdp2",
    "data-parallel-sharding-strategy",
    "num-distributed-optimizer-instances",
    "outer-dp-sharding-strategy",
    "recompute-granularity",
    "recompute-method",
    "recompute-num-layers",
    "recompute-activations",
    "recompute-modules",
    "grad-reduce-in-bf16",
    "checkpoint-activations",
    "activations-checkpoint-method",
    "activations-checkpoint-num-layers",
    "fp8-format",
    "fp8-recipe",
    "fp4-format",
    "bf16",
    "fp16",
    "zero-stage",
    "rampup-batch-size",
    "cpu-offloading",
    "cpu-offloading-num-layers",
)
_ENVIRONMENT = {
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "PWD",
    "HOME",
    "USER",
    "HOSTNAME",
    "SLURM_JOB_ID",
    "SLURM_NODEID",
    "SLURM_PROCID",
}
_DEVICES = "--chips N (the script's launcher does not say how many GPUs it starts)"


def sniff(text: str, path: str = "") -> int:
    if _SCRIPT.search(text):
        return 4
    return 2 if re.search(r"--tensor-model-parallel-size|--micro-batch-size", text) else 0


@dataclass(frozen=True)
class MegatronSettings:
    """Megatron's settings in its own terms, whichever file spelled them (Megatron or NeMo)."""

    tp: int
    pp: int
    cp: int
    ep: int
    micro: int
    global_batch: int | None
    seq: int | None
    iters: int | None
    virtual: int  # model chunks per pipeline rank (1 = not interleaved)
    sequence_parallel: bool
    tp_overlap: bool | None  # None: unstated (the plan leaves it to the stack's default)
    ep_overlap: bool | None
    distributed_optimizer: bool
    fsdp: bool
    recompute: Any  # the plan Remat
    recipe: str  # the megatron profile's precision recipe
    optimizer: str
    zero_stage: int | None = None  # Megatron-DeepSpeed's --zero-stage (None: not given)
    # Megatron-FSDP's HSDP: the replicas of the sharded group, and whether they shard the
    # optimizer state (outer-dp-sharding-strategy optim)
    replicas: int = 1
    outer_shard: bool = False
    # routed experts split over the tensor ranks: --expert-tensor-parallel-size unset (Megatron
    # sets it to the TP size) or above 1; False for 1 (rules.moe_rules)
    expert_tp: bool = True


# ------------------------------------------------------------------------------ read


def _command(notes_source: str, text: str) -> tuple[list[str], list[str], dict[str, Any]]:
    """(launcher words, pretrain arguments, shell facts) of the script's pretrain command."""
    sh = script(text, _SCRIPT)
    cmds = [c for c in sh.commands if c and c[0] not in _NOT_LAUNCH]
    found = [c for c in cmds if any(_SCRIPT.search(w) for w in c)]
    if not found:
        raise LaunchError(
            f"{notes_source} runs no pretrain_*.py command",
            rule="a Megatron-LM launch script runs pretrain_gpt.py (or another pretrain_*.py) with its arguments",
            fix="import the script that launches training, or name the stack with --stack",
        )
    cmd = found[-1]
    at = next(i for i, w in enumerate(cmd) if _SCRIPT.search(w))
    facts = {"world": sh.get("WORLD_SIZE"), "unknown": sorted(sh.unknown), "guessed": sh.guessed}
    return cmd[:at], cmd[at + 1 :], facts


def parse_args(words: list[str]) -> dict[str, Any]:
    """`--name value`, `--name=value` and bare `--flag` (True); names without the dashes."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            i += 1
            continue
        name, eq, value = w[2:].partition("=")
        if eq:
            out[name] = value
        elif name in _MULTI:  # every word up to the next --flag
            vals = []
            while i + 1 < len(words) and not words[i + 1].startswith("--"):
                vals.append(words[i + 1])
                i += 1
            out[name] = " ".join(vals) if vals else True
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            out[name] = words[i + 1]
            i += 1
        else:
            out[name] = True
        i += 1
    return out


def _world(launcher: list[str], text: str, facts: dict[str, Any]) -> int | None:
    """GPUs the script starts: the launcher's per-node count × nodes (either may come from
    the script's #SBATCH lines), else WORLD_SIZE."""
    args = parse_args(launcher)
    per = str(args.get("nproc_per_node", args.get("nproc-per-node", "")))
    nodes = str(args.get("nnodes", "")).split(":")[-1]
    g = re.search(r"#SBATCH\s+--(?:gpus-per-node[= ]|gres[= ]gpu:)(\d+)", text)
    n = re.search(r"#SBATCH\s+(?:-N\s*|--nodes[= ])(\d+)", text)
    per_node = int(per) if per.isdigit() else (int(g.group(1)) if g else None)
    if nodes.isdigit():
        n_nodes: int | None = int(nodes)
    else:
        n_nodes = int(n.group(1)) if n else (1 if per.isdigit() and not nodes else None)
    if per_node is not None and n_nodes is not None:
        return per_node * n_nodes
    world = facts.get("world")
    return int(world) if world and str(world).isdigit() else None


def read(text: str, *, source: str = "<text>", chips: int | None = None) -> LaunchConfig:
    launcher, words, facts = _command(source, text)
    notes = Notes(STACK, source, parse_args(words))
    check_known(notes, notes.settings, _READ, near=0.9)
    world = _world(launcher, text, facts)
    _unresolved(notes, facts)
    if world is not None and chips is not None and world != chips:
        notes.problem("launcher", f"the launcher starts {world} GPUs but --chips gives {chips}")
    s = _settings(notes)
    return megatron_config(notes, s, chips if chips is not None else world, model=_model(notes))


def _unresolved(notes: Notes, facts: dict[str, Any]) -> None:
    used = " ".join(str(v) for v in notes.settings.values())
    for name in sorted(set(facts["unknown"]) - _ENVIRONMENT):
        if f"${name}" in used or f"${{{name}" in used:
            notes.problem(f"${name}", f"the script reads ${name}, which it never sets")
    for cond in facts["guessed"]:
        notes.unsupported_(
            "if", cond, "a shell test roofline cannot decide: its first branch was read"
        )


def _int(notes: Notes, key: str) -> int | None:
    v = notes.get(key)
    return None if v in (None, "none") else notes.integer(key, v)


def _settings(notes: Notes) -> MegatronSettings:
    tp = _int(notes, "tensor-model-parallel-size") or 1
    pp = _int(notes, "pipeline-model-parallel-size") or 1
    return MegatronSettings(
        tp=tp,
        pp=pp,
        cp=_int(notes, "context-parallel-size") or 1,
        ep=_int(notes, "expert-model-parallel-size") or 1,
        micro=_micro(notes),
        global_batch=_int(notes, "global-batch-size"),
        seq=_int(notes, "seq-length"),
        iters=_int(notes, "train-iters"),
        virtual=_virtual(notes, pp),
        sequence_parallel=notes.flag("sequence-parallel", notes.get("sequence-parallel")),
        tp_overlap=notes.stated_flag("tp-comm-overlap"),
        ep_overlap=notes.stated_flag("overlap-moe-expert-parallel-comm"),
        distributed_optimizer=notes.flag(
            "use-distributed-optimizer", notes.get("use-distributed-optimizer")
        ),
        fsdp=_fsdp(notes),
        recompute=_recompute(notes),
        recipe=_recipe(notes),
        optimizer=_optimizer(notes),
        expert_tp=_int(notes, "expert-tensor-parallel-size") != 1,
        zero_stage=notes.integer("zero-stage", notes.settings["zero-stage"], low=0)
        if notes.given("zero-stage")
        else None,
        **_hsdp(notes),
    )


def _hsdp(notes: Notes) -> dict[str, Any]:
    """Megatron-FSDP's replicas (`--num-distributed-optimizer-instances`; mcore_fsdp_adapter.py
    runs HSDP when it is above 1) and their optimizer sharding; read only when given."""
    key = "num-distributed-optimizer-instances"
    if not notes.given(key):
        return {}
    outer = str(notes.get("outer-dp-sharding-strategy"))
    return {"replicas": notes.integer(key, notes.settings[key]), "outer_shard": outer == "optim"}


def _offload_option(notes: Notes) -> dict[str, str]:
    """--optimizer-cpu-offload: the optimizer on the host (`training.offload`, the framework
    record's [data_parallel.optimizer_offload]); a fraction below 1 is costed as all of it."""
    if not notes.given("optimizer-cpu-offload") or not notes.flag(
        "optimizer-cpu-offload", notes.settings["optimizer-cpu-offload"]
    ):
        return {}
    frac = notes.settings.get("optimizer-offload-fraction")
    if frac is not None and float(frac) != 1.0:
        notes.unsupported_(
            "optimizer-offload-fraction", frac, "part of the update on the GPU: costed as all of it"
        )
    return {"offload_optimizer": "true"}


def _cpu_offloading(notes: Notes) -> bool:
    """--cpu-offloading: the saved activations on the host (offload_activations=1, costed for
    all but the last layer, `training.offload`)."""
    if not notes.given("cpu-offloading") or not notes.flag(
        "cpu-offloading", notes.settings["cpu-offloading"]
    ):
        return False
    n = notes.settings.get("cpu-offloading-num-layers")
    layers = notes.settings.get("num-layers")
    if n is not None and layers is not None and int(n) != int(layers) - 1:
        notes.unsupported_(
            "cpu-offloading-num-layers", n, f"costed as all but the last of {layers} layers"
        )
    return True


def _micro(notes: Notes) -> int:
    v = notes.get("micro-batch-size")
    if v in (None, "none"):
        raise notes.error(
            "--micro-batch-size",
            "is not given",
            rule="Megatron-LM needs the micro batch (sequences per data-parallel rank per pass)",
            fix="add --micro-batch-size to the script",
        )
    return notes.integer("micro-batch-size", v)


def _virtual(notes: Notes, pp: int) -> int:
    if notes.given("num-virtual-stages-per-pipeline-rank"):
        return notes.integer(
            "num-virtual-stages-per-pipeline-rank",
            notes.settings["num-virtual-stages-per-pipeline-rank"],
        )
    key = "num-layers-per-virtual-pipeline-stage"
    if not notes.given(key):
        notes.get("virtual-pipeline")
        return 1
    per = notes.integer(key, notes.settings[key])
    if not notes.given("num-layers"):
        raise notes.error(
            f"--{key}",
            "is given without --num-layers",
            rule="model chunks per pipeline rank = layers / (pipeline size × layers per virtual stage)",
            fix="add --num-layers, or write --num-virtual-stages-per-pipeline-rank",
        )
    layers = notes.integer("num-layers", notes.settings["num-layers"])
    if layers % (pp * per):
        notes.problem(
            key, f"{layers} layers do not split into {pp} stages of chunks of {per} layers"
        )
    return max(1, layers // (pp * per))


def _fsdp(notes: Notes) -> bool:
    on = any(notes.given(k) for k in ("use-megatron-fsdp", "use-torch-fsdp2", "use-custom-fsdp"))
    if not on:
        return False
    key = "data-parallel-sharding-strategy"
    strategy = notes.get(key)
    if strategy != "optim_grads_params":
        notes.unsupported_(
            key,
            strategy,
            "sharding less than parameters, gradients and optimizer state: costed as full FSDP",
        )
    return True


def _checkpoint_method(notes: Notes) -> Any:
    """Megatron-LM's 2021-22 spelling (NVIDIA/Megatron-LM megatron/model/transformer.py:678
    @6985e58938, arguments.py:411-423): any `--activations-checkpoint-method` checkpoints
    the Transformer layers' inputs (full recompute), `--activations-checkpoint-num-layers`
    (default 1) layers per chunk; renamed `--recompute-method` / `--recompute-num-layers`."""
    key, per = "activations-checkpoint-method", "activations-checkpoint-num-layers"
    method = notes.get(key)
    if per in notes.settings:
        layers = notes.settings[per]
    else:  # gone from the [meta] commit's arguments: the default of the release that had it
        layers = 1
        notes.defaults.append(
            Default(per, 1, "NVIDIA/Megatron-LM megatron/arguments.py:419 @6985e58938")
        )
    if method == "block" or str(layers) != "1":
        notes.unsupported_(
            key,
            f"{method} {layers}",
            "recomputes part of the layers (block) or checkpoints groups of layers (uniform): costed as full",
        )
    return remat_of(notes, PROFILE, key, "full")


def _recompute(notes: Notes) -> Any:
    key = "recompute-granularity"
    if notes.given("checkpoint-activations"):  # the older spelling of full recompute
        return remat_of(notes, PROFILE, "checkpoint-activations", "full")
    if notes.given("activations-checkpoint-method"):
        return _checkpoint_method(notes)
    gran = "selective" if notes.given("recompute-activations") else notes.get(key)
    if gran in (None, "none"):
        return remat_of(notes, PROFILE, key, "none")
    if gran == "selective":
        return _selective(notes, key)
    if gran != "full":
        raise notes.error(
            key, f"= {gran!r}", rule="full or selective", fix="write --recompute-granularity full"
        )
    method = notes.get("recompute-method")
    layers = notes.get("recompute-num-layers")
    if method == "block" or (method == "uniform" and str(layers) not in ("1", "none")):
        notes.unsupported_(
            "recompute-method",
            f"{method} {layers}",
            "recomputes part of the layers (block) or checkpoints groups of layers (uniform): costed as full",
        )
    return remat_of(notes, PROFILE, key, "full")


def _selective(notes: Notes, key: str) -> Any:
    """Selective recompute: Megatron's default module (core_attn) is the stack's `selective`
    policy; other `--recompute-modules` are the plan's partial recompute (remat=a+b)."""
    mods = notes.get("recompute-modules")
    if mods in (None, True) or str(mods).split() == ["core_attn"]:
        return remat_of(notes, PROFILE, key, "selective")
    remat = parse_modules(str(mods))
    if remat is None:
        raise notes.error(
            "recompute-modules",
            f"= {mods!r}",
            rule="modules are core_attn, mla_up_proj, layernorm, mlp, moe, moe_act, shared_experts",
            fix="write e.g. --recompute-modules mla_up_proj moe_act",
        )
    return remat


def _recipe(notes: Notes) -> str:
    fp8 = notes.get("fp8-format")
    fp4 = notes.get("fp4-format")
    if fp4 not in (None, "none"):
        return "nvfp4"
    if fp8 not in (None, "none"):
        recipe = str(notes.get("fp8-recipe"))
        table = stack_defaults(STACK).data["fp8_recipes"]
        if recipe not in table:
            raise notes.error(
                "fp8-recipe",
                f"= {recipe!r}",
                rule="recipes: " + ", ".join(table),
                fix="write --fp8-recipe delayed",
            )
        return table[recipe]
    if notes.given("fp16") or notes.flag("bf16", notes.get("bf16")):
        return "bf16"
    notes.unsupported_("bf16", False, "fp32 training (neither --bf16 nor --fp16): costed as bf16")
    return "bf16"


def _optimizer(notes: Notes) -> str:
    for key in ("rampup-batch-size", "step-batch-size-schedule"):
        if notes.given(key):
            notes.unsupported_(
                key, notes.settings[key], "a batch-size ramp: costed at the final global batch"
            )
    for key in ("use-precision-aware-optimizer",):
        if notes.given(key):
            notes.unsupported_(
                key,
                notes.settings[key],
                "changes the bytes of gradients or optimizer state: costed as fp32 main params, grads and Adam moments",
            )
    if str(notes.settings.get("optimizer", "adam")) != "adam":
        notes.unsupported_(
            "optimizer", notes.settings["optimizer"], "an optimizer other than Adam: costed as Adam"
        )
    if notes.flag("grad-reduce-in-bf16", notes.get("grad-reduce-in-bf16")):
        return BF16_GRADS  # the gradient buffer in the parameters' bf16 (param_and_grad_buffer.py)
    return OPTIMIZER


def _model(notes: Notes) -> str | None:
    for key in ("hf-model", "tokenizer-model"):
        v = notes.settings.get(key)
        if isinstance(v, str) and v and v.upper() != "MOCK":
            return v
    return None


def megatron_config(
    notes: Notes, s: MegatronSettings, world: int | None, *, model: str | None
) -> LaunchConfig:
    """The launch config of Megatron settings on `world` devices (None: unknown)."""
    if world is None:
        raise notes.error(
            "the device count",
            "is unknown",
            rule="Megatron derives the data-parallel size from the devices: world / (TP × PP × CP)",
            fix=f"give {_DEVICES}",
        )
    model_par = s.tp * s.pp * s.cp
    if world % model_par:
        notes.problem("world", f"TP × PP × CP = {model_par} does not divide the {world} GPUs")
    dp_all = max(1, world // model_par)
    ep = s.ep
    if dp_all % ep:
        notes.unsupported_(
            "expert-model-parallel-size",
            ep,
            f"expert ranks beyond the {dp_all} data-parallel ranks: costed with ep={math.gcd(ep, dp_all)}",
        )
        ep = math.gcd(ep, dp_all)
    dp, fsdp = _data_axes(notes, s, dp_all // ep)
    deg = Degrees(dp=dp, fsdp=fsdp, tp=s.tp, sp=s.cp, ep=ep, pp=s.pp)
    global_batch = s.global_batch if s.global_batch is not None else s.micro * dp_all
    m = microbatch_count(
        notes,
        global_seqs=global_batch,
        per_replica=s.micro,
        replicas=dp_all,
        key="global-batch-size",
    )
    if s.pp > 1 and m < s.pp:
        notes.problem(
            "global-batch-size", f"{m} microbatches are fewer than the {s.pp} pipeline stages"
        )
    recipe, dtypes = precision_of(notes, PROFILE, "precision", s.recipe)
    plan = Plan(
        degrees=deg,
        microbatches=m,
        remat=s.recompute,
        zero=(int(s.outer_shard) if s.fsdp else _zero(notes, s)) if deg.dp > 1 else 1,
        schedule=Schedule.INTERLEAVED if s.virtual > 1 else Schedule.ONE_F_ONE_B,
        virtual_stages=s.virtual,
        sequence_parallel=s.sequence_parallel and s.tp > 1,
        # tri-state: as the file states it, else (None) the stack profile's default
        collective_matmul=s.tp_overlap if s.tp > 1 else None,
        overlap_ep=s.ep_overlap if ep > 1 else None,
        offload_activations=_cpu_offloading(notes),
        expert_tp=s.expert_tp or s.tp == 1,
        optimizer=parse_optimizer(s.optimizer),
        dtypes=dtypes,
    )
    return notes.config(
        model=model,
        plan=plan,
        chips=world,
        options={"framework": PROFILE, "precision": recipe} | _offload_option(notes),
        workload=workload(seq_len=s.seq, global_seqs=global_batch, micro=s.micro, steps=s.iters),
    )


def _data_axes(notes: Notes, s: MegatronSettings, rest: int) -> tuple[int, int]:
    """(dp, fsdp) of the data-parallel ranks left beside EP: replicas, or the FSDP group, or
    Megatron-FSDP's HSDP (replicas of an FSDP group)."""
    if not s.fsdp:
        if s.replicas > 1:
            notes.unsupported_(
                "num-distributed-optimizer-instances",
                s.replicas,
                "the distributed optimizer sharded within each of that many instances: costed as "
                "ZeRO-1 over all the data-parallel ranks",
            )
        return rest, 1
    if rest % s.replicas:
        raise notes.error(
            "num-distributed-optimizer-instances",
            f"= {s.replicas} does not divide the {rest} data-parallel ranks",
            rule="HSDP replicates an FSDP group: the instances divide the data-parallel size",
            fix="give a divisor of the data-parallel size",
        )
    return s.replicas, rest // s.replicas


def _zero(notes: Notes, s: MegatronSettings) -> int:
    if s.zero_stage is None:
        return 1 if s.distributed_optimizer else 0
    if s.zero_stage == 3:
        notes.unsupported_(
            "zero-stage", 3, "ZeRO-3 beside Megatron's own parallelism: costed as ZeRO-2"
        )
    return min(s.zero_stage, 2)


# ------------------------------------------------------------------------------ write


def expressible(plan: Plan, stack: str = STACK) -> None:
    """A LaunchError naming what Megatron-LM (or NeMo, `stack`) lacks for `plan`."""
    capabilities(stack).refuse(plan)


def _args(config: LaunchConfig) -> list[tuple[str, Any]]:
    plan, w = config.plan, config.workload
    d = plan.degrees
    dp_all = d.dp * d.fsdp * d.ep
    micro = w.global_batch_sequences // (plan.microbatches * dp_all)
    if micro * plan.microbatches * dp_all != w.global_batch_sequences:
        raise LaunchError(
            f"Megatron-LM cannot split {w.global_batch_sequences} sequences into {plan.microbatches} microbatches over {dp_all} data-parallel ranks",
            rule="global batch = micro batch × data-parallel size × microbatches",
            fix="change the batch or the microbatch count",
        )
    out: list[tuple[str, Any]] = [
        ("tensor-model-parallel-size", d.tp),
        ("pipeline-model-parallel-size", d.pp),
        ("context-parallel-size", d.sp),
        ("expert-model-parallel-size", d.ep),
        ("micro-batch-size", micro),
        ("global-batch-size", w.global_batch_sequences),
        ("seq-length", w.seq_len),
    ]
    if plan.virtual_stages > 1:
        out.append(("num-virtual-stages-per-pipeline-rank", plan.virtual_stages))
    if not plan.expert_tp and d.tp > 1:
        out.append(("expert-tensor-parallel-size", 1))
    if w.train_steps:
        out.append(("train-iters", w.train_steps))
    return out + _flags(config)


_SELECTIVE = (RematKind.MATMULS, RematKind.MODULES)


def _flags(config: LaunchConfig) -> list[tuple[str, Any]]:
    plan = config.plan
    out: list[tuple[str, Any]] = []
    # the overlap the step costs (an unset flag: the profile's default, e.g. TP overlap on with
    # SP as NVIDIA's recipes run it, where Megatron-LM's own default is off); its store_true
    # switches have no off form, so an overlap costed off is written as nothing
    costed = costed_switches(plan, PROFILE)
    for on, name in (
        (plan.sequence_parallel and plan.degrees.tp > 1, "sequence-parallel"),
        (_stated(plan, costed, "collective_matmul", "tp-comm-overlap"), "tp-comm-overlap"),
        (
            _stated(plan, costed, "overlap_ep", "overlap-moe-expert-parallel-comm"),
            "overlap-moe-expert-parallel-comm",
        ),
        (plan.zero == 1 and plan.degrees.dp > 1, "use-distributed-optimizer"),
        (plan.degrees.fsdp > 1, "use-megatron-fsdp"),
        *_data_parallel_overlaps(plan),
    ):
        if on:
            out.append((name, True))
    d = plan.degrees
    if d.dp > 1 and d.fsdp > 1:  # HSDP: dp replicas of the fsdp group
        outer = "optim" if plan.zero == 1 else "no_shard"
        out += [
            ("num-distributed-optimizer-instances", d.dp),
            ("outer-dp-sharding-strategy", outer),
        ]
    out += _offload_flags(config)
    if plan.remat.kind != RematKind.NONE:
        kind = "selective" if plan.remat.kind in _SELECTIVE else "full"
        out.append(("recompute-granularity", kind))
        if kind == "full":
            out += [("recompute-method", "uniform"), ("recompute-num-layers", 1)]
        if plan.remat.kind == RematKind.MODULES:
            out.append(("recompute-modules", " ".join(plan.remat.modules)))
    if plan.optimizer == OPTIMIZERS[BF16_GRADS]:
        out.append(("grad-reduce-in-bf16", True))
    recipe = recipe_for(PROFILE, plan.dtypes, config.options.get("precision"), "Megatron-LM")
    out += [("bf16", True), ("optimizer", "adam")]  # the stack's own (capabilities.toml)
    inverse = {v: k for k, v in stack_defaults(STACK).data["fp8_recipes"].items()}
    if recipe in inverse:
        out += [("fp8-format", "hybrid"), ("fp8-recipe", inverse[recipe])]
    elif recipe == "nvfp4":
        out.append(("fp4-format", "e2m1"))
    return out


def _data_parallel_overlaps(plan: Plan) -> list[tuple[bool, str]]:
    """--overlap-grad-reduce / --overlap-param-gather where the step costs the gradient
    reduction / the distributed optimizer's parameter gather overlapped (the megatron profile's
    default with data parallelism; Megatron-LM's own is off)."""
    return [
        (to_state(None, costed_overlap(plan, PROFILE, cls), STACK, key) is True, key)
        for cls, key in (
            (OverlapClass.GRAD_REDUCE, "overlap-grad-reduce"),
            (OverlapClass.WEIGHT_GATHER, "overlap-param-gather"),
        )
    ]


def _stated(plan: Plan, costed: dict[str, bool], flag: str, key: str) -> bool:
    """A store_true overlap switch written: on where the plan sets it on, or leaves it to the
    profile's default that the step costs on (launch.common.to_state)."""
    return to_state(getattr(plan, flag), costed[flag], STACK, key) is True


def _offload_flags(config: LaunchConfig) -> list[tuple[str, Any]]:
    """The optimizer on the host (--optimizer-cpu-offload) and the activations
    (--cpu-offloading) where the plan offloads them (`training.offload`)."""
    plan = config.plan
    out: list[tuple[str, Any]] = []
    if config.options.get("offload_optimizer") == "true":
        if plan.degrees.fsdp > 1:
            raise LaunchError(
                "Megatron-LM does not offload the optimizer of a Megatron-FSDP plan",
                rule="--optimizer-cpu-offload is refused by Megatron-FSDP's optimizer "
                "(the framework record's [data_parallel.optimizer_offload] with_fsdp = false)",
                fix="use a plan without fsdp (dp with the distributed optimizer, tp, pp)",
            )
        # the framework record's [data_parallel.optimizer_offload] switch: the hybrid optimizer
        # needs the precision-aware path; all of the update on the host, copies overlapped
        out += [
            ("optimizer-cpu-offload", True),
            ("optimizer-offload-fraction", 1.0),
            ("overlap-cpu-optimizer-d2h-h2d", True),
            ("use-precision-aware-optimizer", True),
        ]
    if plan.offload_activations:
        # Transformer Engine's CPU offload context (TransformerConfig.cpu_offloading); it
        # takes fewer layers than the model has: all but the last (training.offload)
        out += [("cpu-offloading", True), ("cpu-offloading-num-layers", _layers_less_one(config))]
    return out


def _layers_less_one(config: LaunchConfig) -> int:
    from roofline.specs.model_catalog import load_model

    if config.model is None:
        raise LaunchError(
            "Megatron-LM's --cpu-offloading-num-layers needs the model's layer count",
            rule="activation offload writes the layers offloaded, all but the last",
            fix="name the model (--model)",
        )
    return load_model(config.model).n_layers - 1


def write(config: LaunchConfig) -> str:
    plan, w = config.plan, config.workload
    needs(plan, STACK, "a training plan", "--plan")
    needs(w.seq_len, STACK, "a sequence length", "--seq")
    needs(w.global_batch_sequences, STACK, "a global batch", "--batch-tokens")
    expressible(plan)
    n = plan.degrees.n_chips
    per_node = 8 if n % 8 == 0 else n
    lines = [
        "#!/bin/bash",
        f"# Megatron-LM launch written by roofline: {plan.describe()}",
        f"GPUS_PER_NODE={per_node}",
        f"NUM_NODES={n // per_node}",
        "",
        "torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES pretrain_gpt.py \\",
    ]
    args = _args(config)
    if config.model:
        args += [("tokenizer-type", "HuggingFaceTokenizer"), ("tokenizer-model", config.model)]
    body = [f"    --{k}" + ("" if v is True else f" {v}") for k, v in args]
    return "\n".join(lines + [" \\\n".join(body)]) + "\n"
