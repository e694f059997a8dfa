"""A written launch file launches what was costed (issues 19/21 follow-up).

A plan switch left unset is costed with the stack profile's default under the plan's
conditions (Megatron: TP overlap on with SP, as NVIDIA's recipes run it), but the tools' own
defaults can differ (Megatron-LM's --tp-comm-overlap and NeMo's ub_tp_comm_overlap are off).
The writers state the costed value wherever the tool's default differs, resolved by the rule
the step uses (core.stack.Stack.plan_overlap / Stack.compiled), so the file does not launch a
job without the overlap it was costed with; where the tool's default is what was costed the
switch is left out and reads back unset.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from roofline.core.stack import stack_of
from roofline.launch import LaunchConfig, LaunchKind, LaunchWorkload, read_launch, write_launch
from roofline.launch.common import costed_switches, stack_defaults
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import parse_plan
from roofline.specs.system import parse_system
from roofline.training.step import Workload, evaluate_plan

MODEL = load_model("llama-3.1-8b")
W = LaunchWorkload(seq_len=4096, global_batch_sequences=512, train_steps=10)
PROFILE = {"megatron": "megatron", "nemo": "megatron", "torchtitan": "torchtitan"}


def _export(stack: str, spec: str):
    plan = parse_plan(spec)
    c = LaunchConfig(
        stack=stack, kind=LaunchKind.TRAINING, model="llama-3.1-8b", plan=plan, workload=W
    )
    text = write_launch(c, stack)
    return plan, text, read_launch(text, source=f"<{stack} export>").plan


def _step(plan, stack: str) -> float:
    s = parse_system(f"h100:{plan.degrees.n_chips}")
    work = Workload(W.global_batch_sequences * W.seq_len, W.seq_len)
    return evaluate_plan(MODEL, s, work, plan, framework=PROFILE[stack]).step_time_s


SP = "dp=8,tp=8,megatron_sp=1,microbatch=4,remat=full,zero=1,optimizer=adam-fp32-master"


@pytest.mark.parametrize(
    "stack,switch",
    [("megatron", "--tp-comm-overlap"), ("nemo", "ub_tp_comm_overlap: true")],
)
def test_an_unset_tp_overlap_costed_on_is_written_on(stack, switch):
    """Megatron with SP costs an unset collective_matmul with the TP overlap on (the profile's
    default `sequence_parallel`); the tools' own default is off, so the file says it on."""
    assert stack_defaults(stack).value(
        "tp-comm-overlap" if stack == "megatron" else "model.ub_tp_comm_overlap"
    ) is False  # fmt: skip
    plan, text, back = _export(stack, SP)
    assert plan.collective_matmul is None and switch in text
    assert back == replace(plan, collective_matmul=True)
    on = _step(replace(plan, collective_matmul=True), stack)
    off = _step(replace(plan, collective_matmul=False), stack)
    assert _step(plan, stack) == on == _step(back, stack) < off  # what ran is what was costed


@pytest.mark.parametrize("stack", ["megatron", "nemo"])
def test_an_unset_tp_overlap_costed_off_is_left_out(stack):
    """Without SP the profile's TP overlap is off by default, as the tools': nothing written,
    and the file reads back unset (which costs the same)."""
    plan, text, back = _export(stack, SP.replace("megatron_sp=1", "megatron_sp=0"))
    assert costed_switches(plan, "megatron")["collective_matmul"] is False
    assert "tp-comm-overlap" not in text and "ub_tp_comm_overlap" not in text
    assert back == plan and _step(back, stack) == _step(plan, stack)


def test_megatron_cannot_say_off_and_writes_nothing_for_zero():
    """Megatron-LM's --tp-comm-overlap has no off form: collective_matmul=0 writes nothing,
    which launches with Megatron-LM's default (off), as costed. The import of that file leaves
    the switch unset (the reader keeps an unstated switch to the profile, as validate's
    snippets need), so re-costing the imported file assumes the overlap on."""
    plan, text, back = _export("megatron", SP + ",collective_matmul=0")
    assert "--tp-comm-overlap" not in text
    assert back.collective_matmul is None
    assert costed_switches(back, "megatron")["collective_matmul"] is True


@pytest.mark.parametrize(
    "spec,async_tp,compile_",
    [
        # unset: async TP off and eager, as torchtitan's own defaults; nothing written
        ("fsdp=8,tp=8,megatron_sp=1,remat=full,optimizer=adam-fp32", None, None),
        ("fsdp=8,tp=8,megatron_sp=1,remat=full,compile=1,optimizer=adam-fp32", None, "true"),
        ("fsdp=8,tp=8,megatron_sp=1,remat=full,compile=0,optimizer=adam-fp32", None, "false"),
        (
            "fsdp=8,tp=8,megatron_sp=1,remat=full,collective_matmul=0,optimizer=adam-fp32",
            "false",
            None,
        ),
    ],
)
def test_torchtitan_states_what_its_defaults_do_not(spec, async_tp, compile_):
    plan, text, back = _export("torchtitan", spec)
    for key, value in (("enable_async_tensor_parallel", async_tp), ("enable", compile_)):
        assert (f"{key} = {value}" in text) if value else (f"{key} =" not in text), key
    assert back == plan and _step(back, "torchtitan") == _step(plan, "torchtitan")


def test_the_writers_resolution_is_the_steps():
    """Stack.plan_overlap (what writers state) says on exactly where the step costs the unset
    plan as it costs the switch on (and off where as off), on stacks defaulting on and off."""
    s = parse_system("h100:64")
    cases = [
        ("megatron", SP, True),
        ("megatron", SP.replace("megatron_sp=1", "megatron_sp=0"), False),
        ("torchtitan", "fsdp=8,tp=8,megatron_sp=1,remat=full,optimizer=adam-fp32", False),
        ("ideal", SP, False),
    ]
    work = Workload(2**21, 4096)
    for fw, spec, want in cases:
        plan = parse_plan(spec)
        got = stack_of(fw).plan_overlap(plan, frozenset({"gpu"}))["collective_matmul"]
        assert got is want, (fw, spec)
        cost = {
            v: evaluate_plan(MODEL, s, work, replace(plan, collective_matmul=v), framework=fw)
            for v in (None, want)
        }
        assert cost[None].exposed_time_s["tp"] == cost[want].exposed_time_s["tp"], (fw, spec)
    # on TPU MaxText's collective matmul is on by default (XLA's windowed einsum)
    tpu = parse_plan("fsdp=16,tp=4,megatron_sp=1,remat=full")
    assert stack_of("maxtext").plan_overlap(tpu, frozenset({"tpu"}))["collective_matmul"]
    assert not stack_of("maxtext").plan_overlap(tpu, frozenset({"gpu"}))["collective_matmul"]


def test_torchtitan_unset_compile_costs_eager():
    """`train --framework torchtitan` without compile= is costed as torchtitan runs it: eager
    ([compile] enable = false by default); stacks without an [eager] table are fused either way."""
    s, w = parse_system("h100:8"), Workload(2**16, 4096)

    def step(spec: str, fw: str) -> float:
        return evaluate_plan(MODEL, s, w, parse_plan(spec), framework=fw).step_time_s

    assert stack_of("torchtitan").compiled(None) is False
    unset, eager, fused = (
        step(f"fsdp=8{c}", "torchtitan") for c in ("", ",compile=0", ",compile=1")
    )
    assert unset == eager > fused
    assert stack_of("megatron").compiled(None) is True
    assert step("dp=8", "megatron") == step("dp=8,compile=1", "megatron")
    assert parse_plan("fsdp=8").to_dict()["compiled"] is None  # JSON null for unset


@pytest.mark.parametrize(
    "spec,flags",
    [
        # ZeRO-1 replicas: the gradient reduction and the parameter gather both overlapped
        ("dp=8,tp=8,megatron_sp=1,zero=1", {"--overlap-grad-reduce", "--overlap-param-gather"}),
        # no distributed optimizer: no parameter gather to overlap
        ("dp=8,tp=8,megatron_sp=1,zero=0", {"--overlap-grad-reduce"}),
        ("tp=8,megatron_sp=1", set()),  # no data parallelism
    ],
)
def test_megatron_states_the_data_parallel_overlaps_it_costs(spec, flags):
    """The megatron profile costs the gradient reduction (and the distributed optimizer's
    parameter gather) overlapped with data parallelism; Megatron-LM's store_true switches
    default off, so the launch line says them. The reader takes them as the profile's default."""
    plan, text, back = _export("megatron", spec + ",optimizer=adam-fp32-master")
    written = {f for f in ("--overlap-grad-reduce", "--overlap-param-gather") if f in text}
    assert written == flags
    assert back == replace(plan, collective_matmul=True)  # tp=8 with SP: costed on, stated
    for key in ("overlap-grad-reduce", "overlap-param-gather"):
        assert stack_defaults("megatron").value(key) is False


def test_maxtext_refuses_to_write_collective_matmul_off():
    """XLA's collective matmul is on by default on TPU and MaxText's command line has no switch
    for it: a plan costed with it off cannot be written (it would launch with it on); unset is
    written as is (the default, as costed)."""
    from roofline.launch.base import LaunchError

    with pytest.raises(LaunchError, match="collective matmul off"):
        _export("maxtext", "fsdp=16,tp=4,remat=full,collective_matmul=0,optimizer=adam-fp32")
    plan, text, back = _export("maxtext", "fsdp=16,tp=4,remat=full,optimizer=adam-fp32")
    assert back == plan and back.collective_matmul is None
