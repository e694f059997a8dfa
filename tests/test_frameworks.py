"""Framework profiles (specs/frameworks/*.toml): they load, every entry is sourced, bad files
give one-paragraph errors, the vocabulary matches the rest of the code, and the published runs
map to a profile whose recipe and remat names they use."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from roofline.core.collectives import CollectiveKind
from roofline.core.ledger import build_ledger
from roofline.core.memory import LAST_PROJECTIONS, RematKind
from roofline.core.rules import AXIS_OF
from roofline.errors import RooflineError, SpecError, UnknownNameError
from roofline.specs.framework import (
    COLLECTIVE_KINDS,
    FRAMEWORK_DIR,
    MODULE_RERUNS,
    REMAT_MEMORY_KINDS,
    RERUN_GROUPS,
    AxisRole,
    Family,
    Framework,
    Move,
    Overhead,
    OverlapClass,
    OverlapMode,
    Pass,
    Per,
    Regather,
    Requirement,
    family_of,
    framework_for_source,
    framework_from_dict,
    framework_names,
    load_framework,
)
from roofline.specs.model_catalog import load_model
from roofline.specs.plan import RECOMPUTE_MODULES
from roofline.training.step import Schedule as PlanSchedule

RUNS = Path("/work/shared/reference/measured_training.yaml")
REQUIRED = {"ideal", "megatron", "torchtitan", "deepspeed", "maxtext"}
STACKS = sorted(set(framework_names()) - {"ideal"})
# a source names a file with a line, a commit, a document, or a URL; or says "no source"
CITATION = re.compile(
    r"https?://|\.(py|md|rst|yml|toml|yaml|sh):?\d*|@[0-9a-f]{7}|^no source|BOOK "
)


def _sourced(obj, path="profile"):
    """Yield (path, record) for every dataclass in a profile that carries a `source`."""
    if dataclasses.is_dataclass(obj):
        if any(f.name == "source" for f in dataclasses.fields(obj)):
            yield path, obj
        for f in dataclasses.fields(obj):
            yield from _sourced(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, dict) or hasattr(obj, "items"):
        for k, v in obj.items():
            yield from _sourced(v, f"{path}[{k}]")


def _raw(name: str) -> dict:
    with open(FRAMEWORK_DIR / f"{name}.toml", "rb") as f:
        return tomllib.load(f)


def _error(raw: dict) -> str:
    with pytest.raises(SpecError) as e:
        framework_from_dict(raw, "bad.toml")
    msg = str(e.value)
    assert "\n" not in msg and "bad.toml" in msg and "Rule:" in msg and "Fix:" in msg, msg
    return msg


# ---------------------------------------------------------------------------------------
# the shipped profiles
# ---------------------------------------------------------------------------------------


def test_required_profiles_ship():
    assert REQUIRED <= set(framework_names())


@pytest.mark.parametrize("name", framework_names())
def test_profile_loads_with_every_class_and_default(name):
    fw = load_framework(name)
    assert isinstance(fw, Framework) and fw.name == name
    assert set(OverlapClass) - {OverlapClass.OTHER} <= set(fw.overlap)
    assert (
        fw.remat.policy().name == fw.remat.default or fw.remat.default in fw.remat.policy().aliases
    )
    assert fw.precision.recipe() is fw.precision.recipes[fw.precision.default]
    for ov in fw.overlap.values():
        for mode in (ov.on, ov.off):
            assert 0.0 <= mode.fraction(Pass.FORWARD) <= 1.0
            assert 0.0 <= mode.fraction(Pass.BACKWARD) <= 1.0


@pytest.mark.parametrize("name", framework_names())
def test_every_entry_has_a_citation(name):
    records = list(_sourced(load_framework(name)))
    assert len(records) >= 20  # options, dp, fsdp, 12 overlap modes, remat, ... each sourced
    for path, rec in records:
        assert rec.source.strip(), path
        assert CITATION.search(rec.source), f"{name} {path}: {rec.source!r} cites nothing"


@pytest.mark.parametrize("name", framework_names())
def test_no_source_never_carries_a_number(name):
    """'no source' is allowed, but then the entry asserts nothing: no value, no hidden fraction."""
    for path, rec in _sourced(load_framework(name)):
        if not rec.source.lower().startswith("no source"):
            continue
        if isinstance(rec, Overhead):
            assert rec.value_s is None, path
        elif isinstance(rec, OverlapMode):
            assert rec.forward == rec.backward == 0.0, path
        else:
            pytest.fail(f"{name} {path}: only overheads and overlap modes may be unsourced")


def test_docs_describe_every_profile():
    doc = (Path(__file__).parents[1] / "docs" / "frameworks.md").read_text()
    for name in framework_names():
        assert f"### `{name}`" in doc, f"docs/frameworks.md has no section for {name}"


def test_names_and_aliases_resolve():
    assert load_framework("NeMo").name == "megatron"
    assert load_framework("Megatron-Bridge").name == "megatron"
    assert load_framework("jax").name == "maxtext"
    assert load_framework("MPT").name == "llm-foundry"
    assert load_framework(FRAMEWORK_DIR / "deepspeed.toml").name == "deepspeed"
    with pytest.raises(UnknownNameError) as e:
        load_framework("megatorn-lm")
    msg = str(e.value)
    assert "megatron" in msg and "\n" not in msg and "Fix:" in msg


# ---------------------------------------------------------------------------------------
# vocabulary shared with the step model
# ---------------------------------------------------------------------------------------


def test_vocabulary_matches_the_code():
    assert {a.value for a in AxisRole} <= set(AXIS_OF.values())
    assert set(COLLECTIVE_KINDS) == {k.value for k in CollectiveKind}
    # a partial recompute's memory follows from its modules (MODULE_RERUNS), not a class a
    # profile's policy names
    assert set(REMAT_MEMORY_KINDS) == {k.value for k in RematKind} - {"modules"}
    assert set(MODULE_RERUNS) == set(RECOMPUTE_MODULES)
    assert all(g in RERUN_GROUPS for groups, _ in MODULE_RERUNS.values() for g in groups)


@functools.cache
def _op_names() -> frozenset[str]:
    names: set[str] = set()
    for m in ("llama-3-8b", "deepseek-v3", "mixtral-8x7b", "gemma-2-9b", "qwen2.5-72b"):
        names |= {op.name for op in build_ledger(load_model(m), batch=1, seq=4096)}
    # an unfused attention kernel's softmax and dropout rows (2021/2022 Megatron-LM)
    unfused = build_ledger(load_model("llama-3-8b"), batch=1, seq=4096, flash=False)
    names |= {op.name for op in unfused}
    # the dropping path's dispatch/combine einsums (a capacity factor: MaxText's dense_matmul)
    mx = load_model("mixtral-8x7b")
    dropping = dataclasses.replace(mx, moe=dataclasses.replace(mx.moe, capacity_factor=1.25))
    return frozenset(names | {op.name for op in build_ledger(dropping, batch=1, seq=4096)})


def test_rerun_groups_and_families_name_real_ledger_ops():
    names = _op_names()
    for group, patterns in RERUN_GROUPS.items():
        for p in patterns:
            assert any(re.fullmatch(p.replace("*", ".*"), n) for n in names), (group, p)
    layer = {n for n in names if load_framework("ideal").remat.policy("full").reruns_op(n)}
    assert set(LAST_PROJECTIONS) <= layer and "embed" not in layer and "unembed" not in layer
    fams = {n: family_of(n) for n in names}
    assert fams["attn/scores"] == fams["attn/context"] == Family.ATTENTION
    assert fams["moe/up"] == Family.EXPERT and fams["moe/shared/up"] == Family.DENSE
    assert fams["moe/router"] == Family.DENSE and fams["embed"] == fams["unembed"] == Family.VOCAB
    assert fams["attn/q"] == fams["mlp/down"] == fams["norms"] == Family.DENSE


@pytest.mark.parametrize("name", framework_names())
def test_remat_reruns_name_real_ops(name):
    names = _op_names()
    for pol in load_framework(name).remat.policies.values():
        for p in pol.patterns():
            assert any(re.fullmatch(p.replace("*", ".*"), n) for n in names), (pol.name, p)


# ---------------------------------------------------------------------------------------
# what the profiles say (sourced facts the step model will rely on)
# ---------------------------------------------------------------------------------------


def test_ideal_keeps_todays_step_model():
    fw = load_framework("ideal")
    assert all(fw.move(f, a) == Move.CHEAPEST for f in Family for a in AxisRole)
    assert set(fw.pipeline.schedules) == {s.value for s in PlanSchedule}
    assert fw.fsdp.when(False) == (Regather.WITH_REMAT, Per.MICROBATCH, Per.MICROBATCH)
    assert fw.data_parallel.grad_reduce.per == Per.STEP
    assert fw.overlap_fraction("tensor", "forward") == 0.0
    assert fw.overlap_fraction("tensor", "forward", enabled=True) == 1.0
    assert fw.overlap[OverlapClass.TENSOR].plan_key == "collective_matmul"
    assert fw.overlap[OverlapClass.EXPERT].plan_key == "overlap_ep"
    assert fw.remat.policy().memory == RematKind.FULL.value
    assert fw.overheads.step.value_s == 0.0


@pytest.mark.parametrize("name", STACKS)
def test_real_stacks_gather_weights_over_fsdp(name):
    """Issue 9 cause 2: FSDP in every stack gathers the weights, never the activations."""
    fw = load_framework(name)
    assert fw.move(Family.DENSE, AxisRole.FSDP) == Move.WEIGHTS
    assert fw.move(Family.EXPERT, AxisRole.EXPERT) in (Move.TOKENS, Move.CHEAPEST)


def test_full_recompute_differs_by_stack():
    """Issue 9 cause 3: Megatron/torch rerun the whole layer; XLA drops the last projection."""
    mega, mt = load_framework("megatron"), load_framework("maxtext")
    assert mega.remat.policy("full").reruns_last_projection
    assert OverlapClass.TENSOR in mega.remat.policy("full").reruns_collectives
    assert not mt.remat.policy("full").reruns_last_projection
    sel = mega.remat.policy("selective")
    assert sel.reruns_op("attn/scores") and not sel.reruns_op("mlp/act")
    # Megatron's plain selective recompute is its default module list, ["core_attn"]
    assert sel.reruns == MODULE_RERUNS["core_attn"][0]


def test_gradient_reduction_timing():
    """Issue 9 cause 1: the replica gradient sum is paid once per step where the stack says so."""
    assert load_framework("megatron").data_parallel.grad_reduce_per(1) == Per.STEP
    ds = load_framework("deepspeed").data_parallel
    assert ds.grad_reduce_per(1) == Per.STEP and ds.grad_reduce_per(2) == Per.MICROBATCH
    tt = load_framework("torchtitan").fsdp
    assert tt.when(False) == (Regather.ALWAYS, Per.MICROBATCH, Per.MICROBATCH)
    assert tt.when(True) == (Regather.NEVER, Per.STEP, Per.STEP)


def test_conditional_defaults():
    ds = load_framework("deepspeed").overlap[OverlapClass.GRAD_REDUCE]
    assert ds.mode().backward == 0.0
    assert ds.mode(conditions=frozenset({"zero3"})).backward == 1.0
    tp = load_framework("megatron").overlap[OverlapClass.TENSOR]
    assert tp.mode(conditions=frozenset({"sequence_parallel"})).forward == 0.0  # tp=1
    both = frozenset({"sequence_parallel", "tensor_parallel"})
    assert tp.mode(conditions=both).forward == 1.0 and not tp.missing(both)
    assert tp.mode(enabled=False, conditions=both).backward == pytest.approx(0.67)
    assert tp.missing(frozenset({"tensor_parallel"})) == (Requirement.SEQUENCE_PARALLEL,)


# ---------------------------------------------------------------------------------------
# malformed files: one paragraph naming the file, the rule and a fix
# ---------------------------------------------------------------------------------------


def _mutate(path: tuple, value=None, delete=False) -> dict:
    raw = copy.deepcopy(_raw("megatron"))
    d = raw
    for k in path[:-1]:
        d = d[k]
    if delete:
        del d[path[-1]]
    else:
        d[path[-1]] = value
    return raw


@pytest.mark.parametrize(
    "path,value,delete,expect",
    [
        (("overlap", "tensor", "on", "forward"), 1.5, False, "[0, 1]"),
        (("overlap", "tensor", "on", "window"), "sometimes", False, "own_matmul"),
        (("overlap", "tensor", "on", "source"), "  ", False, "source"),
        (("overlap", "tensor", "on", "sauce"), "x", False, "sauce"),
        (("overlap", "pipeline"), None, True, "pipeline"),
        (("overlap", "tensor", "default"), "sometimes", False, "sequence_parallel"),
        (("fsdp", "gather_dtype"), "bf17", False, "bf16"),
        (("fsdp", "regather"), 1, False, "str"),
        (("fsdp", "supported"), "yes", False, "bool"),
        (("remat", "default"), "everything", False, "policies"),
        (("remat", "policies", "full", "reruns"), ["the-mlp"], False, "attention_core"),
        (("remat", "policies", "full", "memory"), "most", False, "matmuls"),
        (("pipeline", "default"), "gpipe", False, "schedules"),
        (("expert_parallel", "default"), "carrier-pigeon", False, "all_to_all"),
        (("precision", "recipes", "bf16", "attention"), "bf24", False, "attention"),
        (("data_parallel", "zero_stages"), [1, 4], False, "ZeRO"),
        (("options", "dense", "fsdp"), "both", False, "weights"),
        (("overheads", "step", "value_s"), 0.01, False, "source"),
        (("schema",), 2, False, "schema"),
        (("fsdp",), "yes", False, "table"),
        (("overlap", "tensor", "on", "forward"), True, False, "number"),
    ],
)
def test_malformed_profile_errors(path, value, delete, expect):
    msg = _error(_mutate(path, value, delete))
    assert expect in msg, msg


def test_bad_toml_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.toml"
    bad.write_text("schema = 1\nname = 'x\n")
    with pytest.raises(RooflineError) as e:
        load_framework(bad)
    assert "broken.toml" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------
# the published runs map to a profile
# ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not RUNS.exists(), reason="measured_training.yaml not available")
def test_every_published_run_maps_to_a_profile_and_its_names():
    runs = yaml.safe_load(RUNS.read_text())
    unmapped, unknown = [], []
    for r in runs:
        src = r["source"]
        name = framework_for_source(
            " ".join(str(src.get(k, "")) for k in ("title", "url", "location"))
        )
        if name is None:
            unmapped.append(r["id"])
            continue
        fw, par = load_framework(name), r.get("parallelism", {})
        for key, find in (("precision", fw.precision.recipe), ("remat", fw.remat.policy)):
            text = str(par.get(key, ""))
            if text and not text.startswith("not given"):
                try:
                    find(text)
                except SpecError:
                    unknown.append((r["id"], key, text))
    assert not unmapped and not unknown, (unmapped, unknown)
