"""Issue 19: the overlap flags a stack can default are tri-state plan keys — left out, the stack's
default (its profile's overlap `default` under the plan's conditions); 1, the mechanism on; 0,
off. Before, the flag was a bool ORed with the default, so `collective_matmul=0` could not turn
a stack's default TP overlap off (validate worked around it with `Stack.without_overlap`)."""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType

import pytest

from roofline.cli import main
from roofline.core.stack import stack_of
from roofline.errors import PlanError
from roofline.specs.framework import OverlapClass
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import (
    FLAG_OFF,
    FLAG_ON,
    FLAG_UNSET,
    TRISTATE_FLAGS,
    Plan,
    flag_code,
    flag_codes,
    flag_of_code,
    parse_plan,
)
from roofline.specs.system import parse_system
from roofline.training.planner import SearchSpace
from roofline.training.step import Workload, evaluate_plan

DENSE = load_model("llama-3-70b")
TP_PLAN = "fsdp=8,tp=8,megatron_sp=1,remat=full,microbatch=4"
W = Workload(2**21, 4096)


def _three(model, system, base: str, key: str, framework) -> dict[str, object]:
    """The StepCost of `base` with `key` left out, =0 and =1."""
    return {
        v: evaluate_plan(
            model,
            system,
            W,
            parse_plan(base + ("" if v == "unset" else f",{key}={v}")),
            framework=framework,
        )  # fmt: skip
        for v in ("unset", "0", "1")
    }


@pytest.mark.parametrize(
    "framework,system,plan",
    [
        ("megatron", "h100:64", TP_PLAN),  # default "sequence_parallel": on with megatron_sp=1
        ("maxtext", "tpu-v5p:4x4x4", "fsdp=16,tp=4,megatron_sp=1,remat=full,microbatch=4"),
    ],
)
def test_zero_switches_off_a_stack_default_that_is_on(framework, system, plan):
    c = _three(DENSE, parse_system(system), plan, "collective_matmul", framework)
    # unset is the stack's default, which is on: exactly what =1 costs
    assert c["unset"].step_time_s == c["1"].step_time_s
    assert c["unset"].exposed_time_s["tp"] == c["1"].exposed_time_s["tp"]
    # =0 switches it off: the TP collectives exposed as the stack's off mode has them
    assert c["0"].exposed_time_s["tp"] > 2 * c["1"].exposed_time_s["tp"]
    assert c["0"].step_time_s - c["1"].step_time_s == pytest.approx(
        c["0"].exposed_time_s["tp"] - c["1"].exposed_time_s["tp"], rel=1e-9
    )


def test_zero_is_the_off_mode_the_old_workaround_gave():
    """`collective_matmul=0` on Megatron costs what the stack with its TP overlap off by
    default (`Stack.without_overlap`, validate's former workaround) costs with the flag unset."""
    s = parse_system("h100:64")
    old = stack_of("megatron").without_overlap(OverlapClass.TENSOR, "test: an older version")
    flag = evaluate_plan(
        DENSE, s, W, parse_plan(TP_PLAN + ",collective_matmul=0"), framework="megatron"
    )
    work = evaluate_plan(DENSE, s, W, parse_plan(TP_PLAN), framework=old)
    assert flag.step_time_s == work.step_time_s
    assert dict(flag.exposed_time_s) == dict(work.exposed_time_s)


@pytest.mark.parametrize("framework", ["torchtitan", "ideal"])
def test_one_switches_on_a_stack_default_that_is_off(framework):
    c = _three(DENSE, parse_system("h100:64"), TP_PLAN, "collective_matmul", framework)
    assert c["unset"].step_time_s == c["0"].step_time_s  # the default is off
    assert c["1"].exposed_time_s["tp"] < c["0"].exposed_time_s["tp"]
    if framework == "ideal":  # the idealised machine hides all of it (exposed: none)
        assert c["1"].exposed_time_s["tp"] == 0.0 < c["0"].exposed_time_s["tp"]


def _expert_default(default: str):
    """Megatron's profile with the expert all-to-all overlap defaulting to `default`."""
    fw = stack_of("megatron").framework
    ov = replace(fw.overlap[OverlapClass.EXPERT], default=default)
    return replace(fw, overlap=MappingProxyType({**fw.overlap, OverlapClass.EXPERT: ov}))


def test_overlap_ep_is_tri_state_too():
    """The expert overlap (no shipped stack defaults it on): on a profile whose default is
    on, overlap_ep=0 switches it off; on one whose default is off, =1 switches it on."""
    moe, s = load_model("mixtral-8x7b"), parse_system("h100:64")
    plan = "fsdp=8,ep=8,remat=none,microbatch=4"
    on = _three(moe, s, plan, "overlap_ep", _expert_default("on"))
    off = _three(moe, s, plan, "overlap_ep", _expert_default("off"))
    assert on["unset"].exposed_time_s["ep"] == on["1"].exposed_time_s["ep"]
    assert on["0"].exposed_time_s["ep"] > on["1"].exposed_time_s["ep"] > 0
    assert off["unset"].exposed_time_s["ep"] == off["0"].exposed_time_s["ep"]
    assert off["1"].exposed_time_s["ep"] == on["1"].exposed_time_s["ep"]
    assert off["0"].exposed_time_s["ep"] == on["0"].exposed_time_s["ep"]


@pytest.mark.parametrize("key", TRISTATE_FLAGS)
@pytest.mark.parametrize("value", [None, True, False])
def test_the_text_form_keeps_unset_apart_from_zero(key, value):
    plan = replace(parse_plan("dp=2,tp=2,ep=2,megatron_sp=1"), **{key: value})
    text = plan.describe()
    written = {None: None, True: f"{key}=1", False: f"{key}=0"}[value]
    assert (written in text.split(",")) if written else (key not in text)
    back = parse_plan(text)
    assert back == plan and getattr(back, key) is value
    assert plan.to_dict()[key] is value
    assert flag_of_code(flag_code(value)) is value


def test_flag_codes():
    assert list(flag_codes([None, False, True])) == [FLAG_UNSET, FLAG_OFF, FLAG_ON]
    assert flag_codes([]).dtype.itemsize == 1


@pytest.mark.parametrize("text", ["collective_matmul=2", "cm=maybe", "overlap_ep=-1"])
def test_a_bad_tri_state_value_is_one_paragraph(text):
    with pytest.raises(PlanError) as e:
        parse_plan("tp=2," + text)
    msg = str(e.value)
    key = text.split("=")[0]
    assert "\n" not in msg and key in msg
    assert "stack's own default" in msg and f"{key}=0" in msg and f"{key}=1" in msg


@pytest.mark.parametrize("value", [2, -1, "1", 0.5])
def test_a_plan_built_with_a_bad_flag_is_refused(value):
    with pytest.raises(PlanError, match="tri-state"):
        Plan(collective_matmul=value)


def test_train_json_keeps_unset_apart_from_zero(capsys):
    got = {}
    for suffix in ("", ",collective_matmul=0", ",collective_matmul=1"):
        args = ["train", "--model", "llama-3-8b", "--system", "h100:8", "--framework", "megatron"]
        assert main([*args, "--plan", "tp=8,megatron_sp=1" + suffix, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        got[suffix] = (doc["plan"]["collective_matmul"], doc["plan"]["spec"], doc["step_time_s"])
    assert got[""][0] is None and "collective_matmul" not in got[""][1]
    assert (
        got[",collective_matmul=0"][0] is False
        and "collective_matmul=0" in got[",collective_matmul=0"][1]
    )
    assert got[",collective_matmul=1"][0] is True
    assert got[""][2] == got[",collective_matmul=1"][2] < got[",collective_matmul=0"][2]


def test_the_planner_searches_what_it_searched_before():
    """Unset (the stack's default) and on where the stack has the switch; never 'off'."""
    moe = load_model("mixtral-8x7b")
    for name, cm, oe in (
        ("megatron", (None, True), (None, True)),
        ("torchtitan", (None, True), (None, True)),
        ("deepspeed", (None,), (None,)),
    ):
        space = SearchSpace().for_stack(stack_of(name), moe)
        assert (space.collective_matmul, space.overlap_ep) == (cm, oe), name


def _round_trip(stack: str, spec: str):
    from roofline.launch import LaunchConfig, LaunchKind, LaunchWorkload, read_launch, write_launch

    w = LaunchWorkload(seq_len=4096, global_batch_sequences=1024, train_steps=100)
    c = LaunchConfig(
        stack=stack,
        kind=LaunchKind.TRAINING,
        model="llama-3.1-70b",
        plan=parse_plan(spec),
        workload=w,
    )
    text = write_launch(c, stack)
    return c.plan, read_launch(text, source=f"<{stack} export>").plan, text


@pytest.mark.parametrize(
    "stack,base,key",
    [
        ("nemo", "dp=32,tp=8,megatron_sp=1,microbatch=4,remat=full,zero=1,optimizer=adam-fp32-master", "ub_tp_comm_overlap"),
        ("torchtitan", "fsdp=64,tp=8,megatron_sp=1,microbatch=4,remat=full,optimizer=adam-fp32", "enable_async_tensor_parallel"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("value", ["", ",collective_matmul=0", ",collective_matmul=1"])
def test_a_launch_file_keeps_unset_apart_from_zero(stack, base, key, value):
    """Formats that can state the switch off (NeMo's YAML, torchtitan's TOML) write 0 as off and
    1 as on. An unset switch is left out where the tool's own default is what the step costs
    (torchtitan: async TP off), so it reads back unset; where they differ it is written as
    costed (NeMo with SP: the megatron profile's TP overlap on, NeMo's own default off)."""
    plan, back, text = _round_trip(stack, base + value)
    written_unset = stack == "nemo"  # costed on, NeMo's ub_tp_comm_overlap defaults to false
    if plan.collective_matmul is None and written_unset:
        assert f"{key}: true" in text and back == replace(plan, collective_matmul=True)
    else:  # torchtitan's async TP also writes compile on (it takes effect only compiled)
        compiled = True if stack == "torchtitan" and plan.collective_matmul else plan.compiled
        assert back == replace(plan, compiled=compiled)
        assert (key in text) == (plan.collective_matmul is not None)


def test_megatron_writes_the_switch_only_when_on():
    """Megatron-LM's --tp-comm-overlap is a store_true switch: a launch line says it where the
    step costs the overlap on — 1, or unset with SP (the profile's default; Megatron-LM's own
    is off) — and 0 writes nothing, which imports as unset (the file states no value)."""
    for value, back_value in (
        ("", True),
        (",collective_matmul=1", True),
        (",collective_matmul=0", None),
    ):
        plan, back, text = _round_trip(
            "megatron", "dp=4,tp=8,megatron_sp=1,zero=1,optimizer=adam-fp32-master" + value
        )
        assert ("--tp-comm-overlap" in text) == (back_value is True)
        assert back.collective_matmul is back_value
