"""A stack whose tensor parallelism always splits the residual stream over the sequence
(MaxText's logical axis rules) is searched with megatron_sp=1 only, as validate's mapping
costs its runs; a stack with a switch (Megatron: its TP overlap needs --sequence-parallel)
or without the layout (DeepSpeed) keeps its own rule."""

from __future__ import annotations

from roofline.core.stack import stack_of
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Strategy, Workload
from roofline.specs.system import parse_system
from roofline.training.planner.space import SearchSpace, enumerate_plans


def _space(name: str) -> SearchSpace:
    return SearchSpace().for_stack(stack_of(name), load_model("llama-3-8b"))


def test_record_says_which_stacks_split_the_sequence_under_tp():
    assert stack_of("maxtext").framework.options.tp_shards_sequence
    assert not stack_of("deepspeed").framework.options.tp_shards_sequence
    assert not stack_of("megatron").framework.options.tp_shards_sequence


def test_searched_megatron_sp_follows_the_record():
    assert _space("maxtext").megatron_sp == (True,)
    assert _space("megatron").megatron_sp == (True,)  # its TP overlap requires it
    assert _space("deepspeed").megatron_sp == (False,)


def test_maxtext_tp_candidates_carry_megatron_sp():
    model, workload = load_model("llama-3-70b"), Workload(2**22, 2048)
    space = SearchSpace().for_stack(stack_of("maxtext"), model)
    found = enumerate_plans(model, workload, [parse_system("tpu-v5e:16x16")], space)
    with_tp = [st for st, cand in found.groups if (cand.deg[Strategy.TP] > 1).any()]
    assert with_tp
    assert all(st.sequence_parallel for st in with_tp)


def test_a_launch_file_that_cannot_say_megatron_sp_searches_it_off():
    from roofline.training.planner.launchable import launch_space

    space = launch_space(SearchSpace(), "maxtext").for_stack(
        stack_of("maxtext"), load_model("llama-3-8b")
    )
    assert space.megatron_sp == (False,)


def test_maxtext_partial_pipeline_keeps_equal_chunks():
    # its partial pipeline runs leftover layers outside it: the planner keeps pp·v | layers
    assert stack_of("maxtext").uneven_stages and not stack_of("maxtext").spreads_uneven_stages
    assert stack_of("megatron").spreads_uneven_stages
    model = load_model("llama-3-70b")  # 80 layers
    space = SearchSpace().for_stack(stack_of("maxtext"), model)
    found = enumerate_plans(model, Workload(2**22, 4096), [parse_system("tpu-v5p:8x8x8")], space)
    for _, cand in found.groups:
        pp = cand.deg[Strategy.PP] * cand.virtual
        assert (model.n_layers % pp == 0).all()
