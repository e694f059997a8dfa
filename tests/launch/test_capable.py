"""What a stack can launch is one table (launch/defaults/capabilities.toml): the writers refuse
by it and the planner, with a stack named, skips by it; export(search) imports back to the same
plan for every stack, and every restated launch file survives import -> export -> import."""

from __future__ import annotations

import argparse
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from roofline.cli import export_cmd
from roofline.cli.train_cmd import stack_optimizer
from roofline.core.stack import stack_of
from roofline.launch import (
    WRITERS,
    LaunchConfig,
    LaunchError,
    LaunchKind,
    LaunchWorkload,
    read_launch,
    write_launch,
)
from roofline.launch.base import stack_module
from roofline.launch.capable import RULES, PlanArrays, capabilities, stacks
from roofline.launch.lines import SERVING_STACKS
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Plan, Workload, parse_plan
from roofline.specs.system import parse_system
from roofline.training.planner import SearchSpace, plan_training
from roofline.training.planner.launchable import launch_space, launchable, skipped
from roofline.training.planner.rank import candidate_plan
from roofline.training.planner.space import enumerate_plans

from .test_real_configs import CASES as EXAMPLES
from .test_real_configs import load
from .test_roundtrip import stated

TRAINING = [s for s in WRITERS if s not in SERVING_STACKS]
TOP = 4  # the search's best plan and three others


def canonical(plan: Plan) -> Plan:
    """The plan as its spec says it (a field that does not apply, e.g. zero with dp=1 or the
    schedule with pp=1, takes the vocabulary's default)."""
    return parse_plan(f"{plan.describe()},optimizer={plan.optimizer.name}")


# ------------------------------------------------------------------------------ the table


def test_every_training_writer_has_a_table_of_known_rules():
    assert set(TRAINING) <= set(stacks())
    for s in stacks():
        cap = capabilities(s)  # a rule name outside RULES raises here
        assert set(cap.rules) <= set(RULES)
        assert cap.optimizer == stack_module(s).OPTIMIZER  # the export default is the table's
        assert "@" in cap.optimizer_source  # cited at a commit


def test_nemo_extends_megatron_with_its_own_limits():
    meg, nemo = capabilities("megatron"), capabilities("nemo")
    assert set(meg.rules) < set(nemo.rules) and nemo.optimizer == meg.optimizer
    plan = parse_plan("dp=8,ep=2,overlap_ep=1,optimizer=adam-fp32-master")
    assert meg.lacks(plan) == []
    assert nemo.lacks(plan) == ["overlap_ep=1 (NeMo 1.x has no expert-parallel overlap setting)"]


@pytest.mark.parametrize(
    "stack,spec,said",
    [
        ("torchtitan", "dp=4,fsdp=2,zero=2", "zero=2 over dp (replicas are DDP"),
        ("nemo", "dp=2,fsdp=4", "dp and fsdp together (hybrid sharding"),
        ("maxtext", "fsdp=8,tp=2,megatron_sp=1", "tp=2 with megatron_sp"),
        ("deepspeed", "dp=8,sp=2,ep=2", "sp=2 (it lives in the model code, not the JSON); ep=2"),
        ("megatron", "dp=4,pp=2,microbatch=4,schedule=gpipe", "schedule=gpipe"),
    ],
)
def test_the_writers_refusal_is_the_tables_text(stack, spec, said):
    plan = parse_plan(spec + f",optimizer={stack_module(stack).OPTIMIZER}")
    config = LaunchConfig(
        stack=stack,
        kind=LaunchKind.TRAINING,
        model="llama-3.1-8b",
        plan=plan,
        workload=LaunchWorkload(seq_len=4096, global_batch_sequences=64),
    )
    with pytest.raises(LaunchError) as e:
        write_launch(config, stack)
    assert f"{capabilities(stack).who} cannot express " in str(e.value)
    assert said in str(e.value)
    assert any(said in x for x in capabilities(stack).lacks(plan))


def test_many_plans_are_judged_as_each_alone():
    specs = ["dp=8,zero=1", "dp=8,zero=0", "fsdp=8,tp=2,megatron_sp=1", "fsdp=8,tp=2"]
    specs += ["dp=2,fsdp=4", "fsdp=4,pp=2,microbatch=4,schedule=gpipe", "fsdp=8,remat=ckpt4"]
    plans = [parse_plan(s) for s in specs]
    for s in TRAINING:
        cap = capabilities(s)
        alone = [not cap.lacks(replace(p, optimizer=stack_optimizer_of(s))) for p in plans]
        assert cap.launchable(PlanArrays.of_plans(plans)).tolist() == alone, s


# ------------------------------------------------------------------------------ the planner


def _plan_of(cand, structure, space, i: int, stack: str) -> Plan:
    """Candidate i of a family as a Plan (as the planner's `plan_at` rebuilds it), with the
    stack's own optimizer (the search's input)."""
    return candidate_plan(cand, structure, i, space, stack_optimizer_of(stack))


@pytest.mark.parametrize("stack", ["torchtitan", "megatron", "maxtext", "deepspeed"])
def test_the_planner_skips_exactly_the_plans_the_writer_refuses(stack):
    model = load_model("mixtral-8x7b")
    work = Workload(2**20, 4096)
    systems = [parse_system("h100:32")]
    space = SearchSpace().for_stack(stack_of(stack), model)
    found = enumerate_plans(model, work, systems, space)
    kept = launchable(found, space, stack)
    cap = capabilities(stack)
    n_all = sum(len(c) for _, c in found.groups)
    n_kept = sum(len(c) for _, c in kept.groups)
    assert n_all - n_kept == skipped(kept.rejected)
    judged = {True: 0, False: 0}
    for structure, cand in found.groups:
        for i in range(len(cand)):
            judged[not cap.lacks(_plan_of(cand, structure, space, i, stack))] += 1
    assert judged[True] == n_kept and judged[False] == n_all - n_kept
    for structure, cand in kept.groups:  # and the kept ones are exactly the sayable ones
        assert all(
            not cap.lacks(_plan_of(cand, structure, space, i, stack)) for i in range(len(cand))
        )


def test_with_no_stack_named_nothing_is_skipped():
    model = load_model("llama-3.1-8b")
    work = Workload(2**20, 4096)
    systems = [parse_system("h100:64")]
    space = SearchSpace().for_stack(stack_of("torchtitan"), model)
    found = enumerate_plans(model, work, systems, space)
    assert launchable(found, space, None) is found
    assert launchable(found, space, "llm-foundry") is found  # a stack without a table


def _search(stack: str, named: bool, space: SearchSpace | None = None):
    return plan_training(
        load_model("llama-3.1-8b"),
        parse_system("h100:64"),
        Workload(2**20, 4096),
        framework=stack,
        optimizer=capabilities(stack).optimizer,
        allow_sub_slices=False,
        top_k=2,
        space=space,
        launch_stack=stack if named else None,
    )


def test_train_with_a_named_stack_says_how_many_it_skipped(capsys):
    from roofline.cli import main

    # DeepSpeed's JSON sets no sp, ep or pp and calls no remat, which its profile costs
    named, free = _search("deepspeed", True), _search("deepspeed", False)
    n = skipped(named.rejected)
    assert n > 0 and skipped(free.rejected) == 0
    assert named.candidates_enumerated == free.candidates_enumerated
    # each candidate is costed once per precision searched
    assert free.candidates_evaluated - named.candidates_evaluated == n * len(free.precisions)
    assert not any(capabilities("deepspeed").lacks(c.plan) for c in named.top)
    argv = ["train", "--model", "llama-3.1-8b", "--system", "h100:64", "--batch-tokens", "1Mi"]
    argv += ["--top", "2", "--no-sub-slices"]
    assert main([*argv, "--framework", "deepspeed"]) == 0
    out = capsys.readouterr().out
    assert f"{n:,} plans the stack cannot launch were skipped." in out
    assert "DeepSpeed's JSON cannot launch: it lives in the model code, not the JSON" in out
    assert main([*argv, "--framework", "auto"]) == 0  # auto: megatron on GPUs, unfiltered
    assert "cannot launch" not in capsys.readouterr().out


def test_megatrons_hybrid_sharding_is_searched_and_launched():
    """dp with fsdp is Megatron-FSDP's HSDP (--num-distributed-optimizer-instances): nothing
    the megatron space holds is skipped, and every listed plan exports."""
    named = _search("megatron", True)
    assert skipped(named.rejected) == 0
    assert not any(capabilities("megatron").lacks(c.plan) for c in named.top)


def test_torchtitans_replicas_are_searched_as_it_runs_them():
    """torchtitan's replicas keep whole optimizer states: the space's ZeRO-1/2 over dp would
    all be skipped, so with torchtitan named the replicas are searched at zero=0 instead; its
    looped schedules run 2 stages per rank, so only that virtual-stage count is searched."""
    assert SearchSpace().zero_stages == (1, 2)
    space = launch_space(SearchSpace(), "torchtitan")
    assert space.zero_stages == (0,) and space.virtual_stages == (2,)
    megatron = launch_space(SearchSpace(), "megatron")
    assert megatron.zero_stages == (1,) and megatron.virtual_stages == SearchSpace().virtual_stages
    assert launch_space(SearchSpace(), None) == SearchSpace()
    free, skipping, named = (
        _search("torchtitan", False, replace(SearchSpace(), virtual_stages=(2,))),
        _search("torchtitan", True),
        _search("torchtitan", True, space),
    )
    assert skipped(skipping.rejected) > 0 and skipped(named.rejected) == 0
    assert named.candidates_evaluated == free.candidates_evaluated  # zero 0 for 2, one for one
    assert not any(capabilities("torchtitan").lacks(c.plan) for c in named.top)


def test_the_default_optimizer_is_the_stacks_own():
    for name, want in (("megatron", "adam-fp32-master"), ("maxtext", "adam-fp32")):
        args = argparse.Namespace(optimizer=None)
        assert stack_optimizer(args, stack_of(name)) is not None and args.optimizer == want
    args = argparse.Namespace(optimizer="sgd-bf16")
    assert stack_optimizer(args, stack_of("megatron")) is None and args.optimizer == "sgd-bf16"
    args = argparse.Namespace(optimizer=None)
    assert stack_optimizer(args, stack_of("ideal")) is None and args.optimizer == "adam-bf16"


# ------------------------------------------------------------------------------ round trips


@cache
def _searched(stack: str) -> tuple[tuple[Plan, ...], Workload]:
    """export's own search (no --plan: its default model, system and batch) for `stack`."""
    p = argparse.ArgumentParser()
    export_cmd.add_arguments(p)
    args = p.parse_args(["--to", stack, "--top", str(TOP)])
    args.system = "tpu-v5p:16x20x28"  # as export.run defaults it
    work = export_cmd._workload(args)
    return tuple(export_cmd._plans(args, load_model(args.model), work)), work


@pytest.mark.parametrize("rank", range(TOP))
@pytest.mark.parametrize("stack", TRAINING)
def test_the_default_searchs_plans_export_and_import_back(stack, rank):
    plans, work = _searched(stack)
    assert len(plans) == TOP
    plan = plans[rank]
    config = LaunchConfig(
        stack=stack,
        kind=LaunchKind.TRAINING,
        model="llama-3-70b",
        plan=plan,
        workload=LaunchWorkload(seq_len=work.seq_len, global_batch_sequences=int(work.sequences)),
    )
    back = read_launch(write_launch(config, stack), source=f"<{stack} export>")
    assert back.stack == stack and back.problems == ()
    # an unset switch the step costs otherwise than the tool's default is written as costed
    assert back.plan == stated(stack, canonical(plan))
    assert back.plan.describe() == stated(stack, plan).describe()
    assert back.plan.optimizer == plan.optimizer == stack_optimizer_of(stack)
    assert back.workload.global_batch_sequences == int(work.sequences)
    assert back.workload.seq_len in (work.seq_len, None)  # DeepSpeed's JSON has none


def stack_optimizer_of(stack: str):
    return parse_plan(f"dp=1,optimizer={capabilities(stack).optimizer}").optimizer


@pytest.mark.parametrize("case", EXAMPLES, ids=[c[0] for c in EXAMPLES])
def test_every_example_imports_exports_and_imports_the_same(case):
    name, chips, stack = case[:3]
    first = load(name, chips)
    again = read_launch(write_launch(first, first.stack), source="<export>", chips=chips)
    assert again.stack == first.stack == stack
    assert again.plan == first.plan
    assert again.workload == first.workload
    assert again.model == first.model
    assert again.chips == first.chips
    assert again.options == first.options


def test_zero_stage_text_is_from_the_numbers():
    a = PlanArrays.of_plans([parse_plan("dp=4,zero=2"), parse_plan("dp=4,zero=1")])
    mask, text = [
        (m, t) for n, m, t in capabilities("torchtitan").breaches(a) if n == "replica_zero"
    ][0]
    assert mask.tolist() == [True, True] and text(1).startswith("zero=1 over dp")
    assert np.array_equal(capabilities("megatron").launchable(a), [False, True])


@pytest.mark.parametrize(
    "stack,said",
    [
        ("torchtitan", ['dtype = "float32"', 'mixed_precision_reduce = "float32"', "AdamW"]),
        ("maxtext", ["opt_type=adamw", "weight_dtype=float32"]),
        ("megatron", ["--bf16", "--optimizer adam"]),
        ("deepspeed", ['"bf16": {\n    "enabled": true']),
    ],
)
def test_export_writes_the_stacks_own_optimizer(stack, said):
    plan = parse_plan(f"fsdp=8,remat=full,optimizer={capabilities(stack).optimizer}")
    if stack == "deepspeed":
        plan = replace(plan, remat=parse_plan("dp=1,remat=none").remat)
    config = LaunchConfig(
        stack=stack,
        kind=LaunchKind.TRAINING,
        model="llama-3.1-8b",
        plan=plan,
        workload=LaunchWorkload(seq_len=4096, global_batch_sequences=64),
    )
    text = write_launch(config, stack)
    assert all(s in text for s in said), text
    assert read_launch(text, source="<export>").plan.optimizer == plan.optimizer


HSDP = "torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py --micro-batch-size 1 --bf16 "


@pytest.mark.parametrize(
    "flags,dp,fsdp,zero",
    [
        ("--use-megatron-fsdp --num-distributed-optimizer-instances 4", 4, 8, 0),
        (
            "--use-megatron-fsdp --num-distributed-optimizer-instances 2 "
            "--outer-dp-sharding-strategy optim",
            2,
            16,
            1,
        ),
        ("--use-megatron-fsdp", 1, 32, 1),
    ],
)
def test_megatron_fsdp_instances_are_hsdp_replicas(flags, dp, fsdp, zero):
    c = read_launch(HSDP + flags, source="<run.sh>")
    d = c.plan.degrees
    assert (d.dp, d.fsdp, c.plan.zero) == (dp, fsdp, zero) and c.unsupported == ()


def test_distributed_optimizer_instances_without_fsdp_are_named():
    c = read_launch(
        HSDP + "--use-distributed-optimizer --num-distributed-optimizer-instances 4",
        source="<run.sh>",
    )
    assert c.plan.degrees.dp == 32 and c.plan.zero == 1
    assert [u.key for u in c.unsupported] == ["num-distributed-optimizer-instances"]
    with pytest.raises(LaunchError, match="does not divide the 32 data-parallel ranks"):
        read_launch(
            HSDP + "--use-megatron-fsdp --num-distributed-optimizer-instances 5",
            source="<run.sh>",
        )


def test_torchtitans_looped_schedule_runs_two_stages_per_rank():
    cap = capabilities("torchtitan")
    spec = "fsdp=4,pp=4,microbatch=8,schedule=interleaved,megatron_sp=1,optimizer=adam-fp32"
    assert cap.lacks(parse_plan(spec + ",virtual=2")) == []
    (said,) = cap.lacks(parse_plan(spec + ",virtual=4"))
    assert said.startswith("virtual=4 (torchtitan's looped schedules run 2 stages per rank")
    megatron = parse_plan(spec.replace("adam-fp32", "adam-fp32-master") + ",virtual=4")
    assert capabilities("megatron").lacks(megatron) == []  # Megatron's interleaving takes any


def test_maxtexts_pipeline_microbatches_are_a_multiple_of_the_stages():
    cap = capabilities("maxtext")
    spec = "fsdp=4,pp=4,remat=full,optimizer=adam-fp32,microbatch="
    assert cap.lacks(parse_plan(spec + "8")) == []
    assert cap.lacks(parse_plan(spec + "6")) == [
        "microbatch=6 on pp=4 (num_pipeline_microbatches is a multiple of the stage count)"
    ]
    assert (
        capabilities("megatron").lacks(parse_plan(spec.replace("fp32", "fp32-master") + "6")) == []
    )
