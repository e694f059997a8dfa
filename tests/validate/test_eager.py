"""Eager vs compiled kernels (issue 19 item 2): the plan's `compile` flag, the torchtitan
profile's [eager] traffic (read off torchtitan's model code), its readers and the mapping."""

from __future__ import annotations

import numpy as np
import pytest

from roofline.core.stack import stack_of
from roofline.launch import read_launch
from roofline.specs.framework import load_framework
from roofline.specs.model_catalog import load_model
from roofline.specs.system import parse_system
from roofline.training.step import (
    Workload,
    _evaluate_one,
    evaluate_plan,
    parse_plan,
    training_profile,
)

MODEL = load_model("llama-3-8b")


def _bytes(walk) -> dict:
    return {
        (r.op, r.pass_): float(np.asarray(r.hbm_bytes_per_chip, float).reshape(-1)[0])
        for r in walk.ops
    }


def _walk(plan: str, fw: str):
    s, w = parse_system("h100:8"), Workload(2**15, 4096)
    eff = training_profile(None).for_framework(fw)
    return _evaluate_one(MODEL, s, w, parse_plan(plan), eff, keep=True, fw=stack_of(fw)).walk


def test_compile_is_a_plan_flag_that_prints_and_parses_back():
    p = parse_plan("fsdp=8,compile=0")
    assert not p.compiled and "compile=0" in p.describe()
    assert parse_plan(p.describe()) == p
    on = parse_plan("fsdp=8,compile=1")
    assert on.compiled and "compile=1" in on.describe() and parse_plan(on.describe()) == on
    # tri-state: left out is the stack's default (None; JSON null), not "compiled"
    unset = parse_plan("fsdp=8")
    assert unset.compiled is None and "compile" not in unset.describe()
    assert unset.to_dict()["compiled"] is None


def test_eager_rows_move_the_bytes_of_torchtitans_eager_kernels():
    """torchtitan's eager RMSNorm (norms.py:96-101 @9dec370) moves 36 bytes per element against
    the fused kernel's 4: 9x; its eager SwiGLU (model.py:253) 10 against 6. Matmuls, attention
    and the other rows are unchanged, forward and backward alike."""
    eager = _bytes(_walk("fsdp=8,remat=none,compile=0", "torchtitan"))
    fused = _bytes(_walk("fsdp=8,remat=none,compile=1", "torchtitan"))
    assert eager.keys() == fused.keys()
    want = {"norms": 9.0, "mlp/act": 10 / 6}
    for (op, pass_), b in fused.items():
        assert eager[(op, pass_)] == pytest.approx(b * want.get(op, 1.0), rel=1e-6), (op, pass_)
    assert {op for op, _ in fused} >= set(want)


def test_a_stack_without_an_eager_table_is_fused_either_way():
    """Megatron's kernels are Transformer Engine's / Apex's fused ones: compile=0 changes nothing."""
    assert load_framework("megatron").eager is None
    s, w = parse_system("h100:8"), Workload(2**16, 4096)
    a = evaluate_plan(MODEL, s, w, parse_plan("dp=8,compile=0"), framework="megatron")
    b = evaluate_plan(MODEL, s, w, parse_plan("dp=8"), framework="megatron")
    assert a.step_time_s == b.step_time_s


def test_eager_is_slower_and_the_gap_is_the_extra_elementwise_traffic():
    s, w = parse_system("h100:8"), Workload(2**16, 4096)
    eager = evaluate_plan(MODEL, s, w, parse_plan("fsdp=8,compile=0"), framework="torchtitan")
    fused = evaluate_plan(MODEL, s, w, parse_plan("fsdp=8,compile=1"), framework="torchtitan")
    assert eager.step_time_s > fused.step_time_s
    assert eager.memory_per_chip_bytes == fused.memory_per_chip_bytes


def test_torchtitan_reader_takes_compile_enable_and_its_default():
    """[compile] enable defaults to false (torchtitan config/configs.py CompileConfig): a job
    config without it runs eager (the plan's compile unset, the profile's compiled_by_default
    false); the writer writes the plan's flag back."""
    base = """
[parallelism]
data_parallel_shard_degree = 8
[training]
local_batch_size = 1
seq_len = 4096
"""
    eager = read_launch(base, source="tt.toml", stack="torchtitan", chips=8)
    # unstated: the plan leaves compile unset, which the torchtitan profile costs eager
    assert eager.plan.compiled is None and stack_of("torchtitan").compiled(None) is False
    assert any(d.key == "compile.enable" for d in eager.defaults)
    compiled = read_launch(
        base + "[compile]\nenable = true\n", source="tt.toml", stack="torchtitan", chips=8
    )
    assert compiled.plan.compiled


def test_torchtitan_eager_runs_are_mapped_eager(training_entries):
    from roofline.validate.training_runs import map_training_run

    for rid, compiled in (
        ("tt-h100-llama3.1-8b-fsdp-eager-8gpu", False),
        ("tt-h100-llama3.1-8b-fsdp-eager-128gpu", False),
        ("tt-h100-llama3.1-8b-fsdp-compile-8gpu", True),
        ("llama3-405b-h100-8192gpu-cp1", True),  # Meta's own stack: not torchtitan's default
    ):
        assert map_training_run(training_entries[rid]).inputs.plan.compiled is compiled, rid


def test_a_stated_compile_becomes_the_stacks_default_for_the_planner():
    """validate's planner mode searches with the run's compile pinned (the planner otherwise
    searches it where the stack runs eager by default): torchtitan made compiling by default
    costs an unset plan exactly as compile=1, eager torchtitan exactly as compile=0; a stack
    without an [eager] table, or one already defaulting so, is returned as it is."""
    from roofline.training.planner import plan_training

    tt = stack_of("torchtitan")
    on = tt.compiling_by_default(True)
    assert (tt.compiled(None), on.compiled(None), on.compiled(False)) == (False, True, False)
    assert tt.compiling_by_default(False) is tt
    mg = stack_of("megatron")
    assert mg.compiling_by_default(True) is mg
    s, w = parse_system("h100:8"), Workload(2**15, 4096)
    unset = parse_plan("fsdp=8")
    t = {
        name: evaluate_plan(MODEL, s, w, p, framework=fw).step_time_s
        for name, p, fw in (
            ("unset-on", unset, on),
            ("compiled", parse_plan("fsdp=8,compile=1"), tt),
            ("unset-eager", unset, tt),
            ("eager", parse_plan("fsdp=8,compile=0"), tt),
        )
    }
    assert t["unset-on"] == t["compiled"] < t["unset-eager"] == t["eager"]
    # pinned as validate pins it (plan_training(compiled=)): plans left unset, costed so;
    # unpinned the planner searches compile on torchtitan and lists compile=1 where it wins
    best = {
        k: plan_training(MODEL, s, w, top_k=1, framework=tt, compiled=c).best
        for k, c in (("on", True), ("eager", False), ("searched", None))
    }
    assert best["on"].step_time_s < best["eager"].step_time_s
    assert best["on"].plan.compiled is None and best["eager"].plan.compiled is None
    assert best["searched"].plan.compiled is True
    assert best["searched"].step_time_s == best["on"].step_time_s
