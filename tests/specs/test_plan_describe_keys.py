"""Plan.describe writes each option under its canonical plan key (the first of the key and its
aliases in specs.plan), so a described plan reads back as itself; parse_plan still reads every
alias (issue 21: `experts_dtype` was written where `expert_dtype` is the key)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from roofline.specs import plan as P
from roofline.specs.plan import ComputeDtype, ComputeDtypes, parse_plan

RICH = (
    "dp=2,tp=2,pp=2,microbatch=4,remat=matmuls,zero=2,schedule=interleaved,virtual=2,"
    "megatron_sp=1,collective_matmul=1,overlap_ep=1,offload_activations=1,compile=0,expert_tp=0"
)
FIELDS = ("matmul", "attention", "experts", "vocab")
NON_DEFAULT = [d for d in ComputeDtype if d != ComputeDtypes().matmul]


def test_every_key_describe_writes_is_canonical():
    """Every option set away from its default, each dtype too: each written key is the first
    of its field's keys, never an alias."""
    dtypes = ComputeDtypes(**dict.fromkeys(FIELDS, NON_DEFAULT[0]))
    text = replace(parse_plan(RICH), dtypes=dtypes).describe()
    written = [item.split("=")[0] for item in text.split(",")]
    canonical = set(P._CANONICAL_KEY.values()) | set(P.STRATEGY_NAMES)
    assert len(written) == 18  # 3 degrees, 11 options, 4 dtypes: all of them were written
    assert [k for k in written if k not in canonical] == []
    assert "expert_dtype" in written and "experts_dtype" not in written


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("dtype", NON_DEFAULT, ids=str)
def test_a_described_plan_reads_back_as_itself(field, dtype):
    plan = replace(parse_plan(RICH), dtypes=ComputeDtypes(**{field: dtype}))
    assert parse_plan(plan.describe()) == plan


def test_parse_reads_the_alias_and_the_canonical_key_alike():
    a = parse_plan("tp=8,expert_dtype=fp8")
    assert a == parse_plan("tp=8,experts_dtype=fp8")
    assert a.dtypes.experts == ComputeDtype("fp8")
    assert a.describe().endswith(",expert_dtype=fp8")
