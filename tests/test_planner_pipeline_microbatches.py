"""More than 64 microbatches are searched only under a pipeline, where they shrink the bubble
(published Megatron plans run up to 512): Korthikanti et al. 2022's 530B plan (pp=35 with 280
microbatches, 35 x 2^3 from its 2,240-sequence batch) is in the space."""

from __future__ import annotations

import numpy as np

from roofline.core.stack import stack_of
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import Strategy, Workload
from roofline.specs.system import parse_system
from roofline.training.planner.space import MICROBATCHES, SearchSpace, enumerate_plans


def _candidates(model, workload, system):
    space = SearchSpace().for_stack(stack_of("megatron"), model)
    found = enumerate_plans(model, workload, [parse_system(system)], space)
    mb = np.concatenate([c.microbatches for _, c in found.groups])
    pp = np.concatenate([c.deg[Strategy.PP] for _, c in found.groups])
    return mb, pp


def test_counts_above_the_plain_ones_only_under_a_pipeline():
    mb, pp = _candidates(load_model("gpt-3-175b"), Workload(4 * 2**20, 4096), "a100:1024")
    many = mb > max(MICROBATCHES)
    assert many.any()
    assert (pp[many] > 1).all()
    assert {128, 256}.issubset(set(mb[pp > 1].tolist()))


def test_odd_batch_factor_reaches_the_published_280():
    # 2,240 sequences of 2,048 = 35 x 64: 35, 70, 140, 280 are tried beside the powers of two
    mb, pp = _candidates(load_model("gpt-3-175b"), Workload(2240 * 2048, 2048), "a100:280")
    assert ((mb == 280) & (pp == 35)).any()
    assert not ((mb == 280) & (pp == 1)).any()
