"""import(export(plan)) == plan for every stack, over plans each stack can express."""

from __future__ import annotations

from dataclasses import replace

import pytest

from roofline.core.stack import stack_of
from roofline.launch import LaunchConfig, LaunchKind, LaunchWorkload, read_launch, write_launch
from roofline.launch.base import LaunchError
from roofline.specs.plan import Plan, parse_plan

W = LaunchWorkload(seq_len=4096, global_batch_sequences=1024, train_steps=100)

PLANS = {
    "torchtitan": [
        ("fsdp=64,tp=8,megatron_sp=1,microbatch=4,remat=full,optimizer=adam-fp32", None),
        ("dp=2,fsdp=32,zero=0,microbatch=2,remat=matmuls,optimizer=adam-fp32", None),
        (
            "fsdp=16,tp=4,pp=4,megatron_sp=1,microbatch=16,remat=none,schedule=interleaved,virtual=2,optimizer=adam-fp32",
            None,
        ),
        (
            "fsdp=8,sp=4,ep=4,tp=2,megatron_sp=1,collective_matmul=1,optimizer=adam-fp32",
            "float8-rowwise",
        ),
        ("fsdp=32,pp=8,microbatch=8,schedule=gpipe,optimizer=adam-fp32", "mxfp8"),
    ],
    "maxtext": [
        ("fsdp=256,microbatch=1,remat=full,optimizer=adam-fp32", None),
        # ZeRO-1 over the data axis: shard_optimizer_over_data=true (base.yml:690)
        ("dp=4,fsdp=16,tp=4,zero=1,microbatch=2,remat=full,optimizer=adam-fp32", None),
        ("dp=4,fsdp=64,tp=4,zero=0,microbatch=4,remat=matmuls,optimizer=adam-fp32", "fp8"),
        ("fsdp=8,sp=2,ep=4,optimizer=adam-fp32", "int8"),
        ("fsdp=16,pp=4,microbatch=8,remat=full,optimizer=adam-fp32", None),
        ("fsdp=16,pp=4,microbatch=8,schedule=interleaved,virtual=4,optimizer=adam-fp32", None),
    ],
    "megatron": [
        (
            "dp=64,tp=8,megatron_sp=1,microbatch=4,remat=matmuls,zero=1,optimizer=adam-fp32-master",
            "fp8-delayed",
        ),
        (
            "dp=16,tp=8,pp=4,microbatch=32,remat=full,zero=0,schedule=interleaved,virtual=5,optimizer=adam-fp32-master",
            None,
        ),
        (
            "dp=8,tp=4,sp=2,ep=8,megatron_sp=1,collective_matmul=1,overlap_ep=1,microbatch=2,zero=1,optimizer=adam-fp32-master",
            "fp8-current",
        ),
        ("fsdp=128,microbatch=2,remat=full,optimizer=adam-fp32-master", "nvfp4"),
        # --expert-tensor-parallel-size 1 (Megatron's default is the TP size)
        (
            "dp=4,tp=2,ep=8,megatron_sp=1,expert_tp=0,microbatch=2,zero=1,optimizer=adam-fp32-master",
            None,
        ),
        ("dp=32,pp=8,microbatch=16,remat=none,zero=1,optimizer=adam-fp32-master", "mxfp8"),
        # Megatron-FSDP's HSDP: 4 replicas of a 32-way FSDP group, whole or ZeRO-1 optimizer
        ("dp=4,fsdp=32,microbatch=2,remat=full,zero=0,optimizer=adam-fp32-master", None),
        ("dp=4,fsdp=16,tp=2,megatron_sp=1,zero=1,optimizer=adam-fp32-master", None),
        (
            "dp=4,ep=8,pp=8,microbatch=32,remat=mla_up_proj+mlp,zero=1,schedule=interleaved,"
            "virtual=2,optimizer=adam-fp32-master-bf16-grads",
            "mxfp8",
        ),
    ],
    "nemo": [
        (
            "dp=64,tp=4,pp=4,megatron_sp=1,microbatch=16,remat=none,zero=1,schedule=interleaved,virtual=20,optimizer=adam-fp32-master",
            None,
        ),
        (
            "dp=32,tp=8,megatron_sp=1,microbatch=4,remat=full,zero=0,optimizer=adam-fp32-master",
            "fp8-delayed",
        ),
        ("fsdp=64,tp=2,ep=2,microbatch=8,remat=matmuls,optimizer=adam-fp32-master", None),
        (
            "dp=16,tp=8,pp=8,megatron_sp=1,microbatch=16,remat=layernorm+moe_act,zero=1,"
            "schedule=interleaved,virtual=4,optimizer=adam-fp32-master-bf16-grads",
            None,
        ),
    ],
    "deepspeed": [
        ("dp=256,microbatch=4,remat=none,zero=1,optimizer=adam-fp32-master", None),
        ("fsdp=512,microbatch=2,remat=none,optimizer=adam-fp32-master", None),
        ("dp=64,tp=4,microbatch=16,remat=none,zero=2,optimizer=adam-fp32-master", "fp16"),
    ],
}
PROFILE = {"nemo": "megatron"}
CASES = [(s, p, r) for s, plans in PLANS.items() for p, r in plans]


def config_of(
    stack: str, spec: str, recipe: str | None, model: str = "llama-3.1-70b"
) -> LaunchConfig:
    plan = parse_plan(spec)
    if recipe:
        plan = replace(plan, dtypes=stack_of(PROFILE.get(stack, stack)).dtypes(recipe))
    return LaunchConfig(stack=stack, kind=LaunchKind.TRAINING, model=model, plan=plan, workload=W)


def stated(stack: str, plan: Plan) -> Plan:
    """The plan as its launch file states it. A switch the plan leaves unset is written where
    the step costs it otherwise than the tool's own default: Megatron-LM and NeMo write the TP
    overlap their profile assumes with SP and tp > 1 (on, as NVIDIA's recipes run it; the
    tools' default is off); torchtitan's async TP writes compile on (it takes effect only
    compiled). Everything else reads back as it was."""
    tp_sp = plan.sequence_parallel and plan.degrees.tp > 1
    if stack in ("megatron", "nemo") and plan.collective_matmul is None and tp_sp:
        return replace(plan, collective_matmul=True)
    if stack == "torchtitan" and plan.collective_matmul and plan.compiled is None:
        return replace(plan, compiled=True)
    return plan


@pytest.mark.parametrize("stack,spec,recipe", CASES, ids=[f"{s}:{p}" for s, p, _ in CASES])
def test_round_trip_is_the_identity(stack, spec, recipe):
    c = config_of(stack, spec, recipe)
    text = write_launch(c, stack)
    back = read_launch(text, source=f"<{stack} export>")
    assert back.stack == stack  # the format is detected, not named
    assert back.plan == stated(stack, c.plan)
    assert back.workload.seq_len in (W.seq_len, None)  # DeepSpeed's JSON has no sequence length
    assert back.workload.global_batch_sequences == W.global_batch_sequences
    assert back.problems == ()
    assert back.chips == c.plan.degrees.n_chips


@pytest.mark.parametrize(
    "stack,spec,lacks",
    [
        ("torchtitan", "fsdp=8,remat=ckpt4,optimizer=adam-fp32", "remat=ckpt4"),
        ("torchtitan", "fsdp=8,remat=moe_act,optimizer=adam-fp32", "remat=moe_act"),
        ("maxtext", "fsdp=8,remat=mlp,optimizer=adam-fp32", "remat=mlp"),
        ("deepspeed", "dp=8,remat=mlp,optimizer=adam-fp32-master", "remat=mlp"),
        ("torchtitan", "dp=8,zero=1,optimizer=adam-fp32", "zero=1 over dp"),
        ("torchtitan", "fsdp=8,tp=2,optimizer=adam-fp32", "sequence-parallel"),
        ("torchtitan", "fsdp=8,optimizer=adam-bf16", "optimizer=adam-bf16"),
        ("maxtext", "fsdp=8,remat=none,optimizer=adam-fp32", "remat=none"),
        ("maxtext", "fsdp=8,tp=2,megatron_sp=1,optimizer=adam-fp32", "megatron_sp"),
        ("nemo", "dp=2,fsdp=4,optimizer=adam-fp32-master", "hybrid sharding"),
        ("megatron", "dp=8,pp=2,microbatch=4,schedule=gpipe,optimizer=adam-fp32-master", "GPipe"),
        ("megatron", "dp=8,optimizer=adam-bf16", "optimizer=adam-bf16"),
        ("nemo", "dp=8,ep=2,overlap_ep=1,optimizer=adam-fp32-master", "overlap_ep"),
        ("nemo", "dp=8,zero=0,optimizer=adam-fp32-master-bf16-grads", "bf16 gradients"),
        ("deepspeed", "dp=8,pp=2,remat=none,optimizer=adam-fp32-master", "pp=2"),
        ("deepspeed", "dp=8,remat=full,optimizer=adam-fp32-master", "remat=full"),
    ],
)
def test_export_names_what_the_stack_lacks(stack, spec, lacks):
    with pytest.raises(LaunchError, match="cannot express") as e:
        write_launch(config_of(stack, spec, None), stack)
    assert lacks in str(e.value)


def test_export_refuses_an_uneven_batch_split():
    c = config_of("megatron", "dp=24,microbatch=5,optimizer=adam-fp32-master", None)
    with pytest.raises(LaunchError, match="cannot split 1024 sequences into 5 microbatches"):
        write_launch(c, "megatron")


def test_export_refuses_a_recipe_the_stack_lacks():
    c = config_of("deepspeed", "dp=8,remat=none,optimizer=adam-fp32-master", None)
    c = replace(c, plan=replace(c.plan, dtypes=stack_of("megatron").dtypes("fp8-delayed")))
    with pytest.raises(LaunchError, match="no precision recipe that computes matmul_dtype=fp8"):
        write_launch(c, "deepspeed")


def test_maxtext_export_names_maxtexts_own_model_config():
    from roofline.launch.common import resolve_model

    text = write_launch(config_of("maxtext", "fsdp=8,optimizer=adam-fp32", None), "maxtext")
    assert "model_name=llama3.1-70b " in text
    back = read_launch(text, source="<maxtext export>")
    assert resolve_model(back.model, "<maxtext export>").name == "llama-3.1-70b"
    other = write_launch(
        config_of("maxtext", "fsdp=8,optimizer=adam-fp32", None, model="qwen2.5-72b"), "maxtext"
    )
    assert "model_name" not in other and "ships no model config for qwen2.5-72b" in other
