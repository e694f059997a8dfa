"""Checks the chip, engine, profile, system, framework and model loaders leave to their JSON
Schemas (issue 21): a table that is not a table, a list that is not a list, a flag that is not a
boolean, an unknown key inside a section. Each is still refused through the loader with one
paragraph naming the file, the key, the rule and a fix; the range rules the loaders keep still
fire after the schema.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from roofline.errors import SpecError
from roofline.specs.chip import chip_from_dict
from roofline.specs.efficiency import profile_from_dict
from roofline.specs.engines import engine_from_dict
from roofline.specs.framework import framework_from_dict
from roofline.specs.model import model_from_dict
from roofline.specs.system import parse_system

SRC = Path(__file__).resolve().parents[1] / "src" / "roofline" / "specs"


def _chip() -> dict:
    return tomllib.loads((SRC / "chips" / "h100.toml").read_text())


def _engine() -> dict:
    return tomllib.loads((SRC / "engines" / "vllm.toml").read_text())


def _refused(load, data: dict) -> str:
    with pytest.raises(SpecError) as e:
        load(data, "my.toml")
    text = str(e.value)
    assert "\n" not in text and "my.toml" in text and "Rule:" in text and "Fix:" in text
    return text


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("peak_flops_per_s", 1e15, "peak_flops_per_s is a table"),
        ("vector_ops_per_s", [1e12], "vector_ops_per_s is a table"),
        ("sources", "a datasheet", "sources is a table"),
        ("pod_topology", 16, "pod_topology is a list"),
        ("aliases", "h100-sxm", "aliases is a list"),
    ],
)
def test_chip_shapes_are_the_schemas(key, value, says):
    d = _chip()
    d[key] = value
    text = _refused(chip_from_dict, d)
    assert f"{key} = {value!r}" in text and says in text


def test_chip_unknown_key_is_the_schemas_with_the_closest_key():
    d = _chip()
    d["hbm_bw_bytes_per_sec"] = d.pop("hbm_bw_bytes_per_s")
    text = _refused(chip_from_dict, d)
    assert "unknown key 'hbm_bw_bytes_per_sec' (did you mean 'hbm_bw_bytes_per_s'?)" in text


def test_chip_ranges_stay_the_loaders():
    d = _chip()
    d["pod_topology"] = [2, 2, 2, 2, 2]
    assert "up to 4 whole numbers" in _refused(chip_from_dict, d)
    d = _chip()
    d["sm_count"] = 0
    assert "sm_count" in _refused(chip_from_dict, d)


@pytest.mark.parametrize(
    "section, key, value, says",
    [
        ("features", None, "yes", "features is a table"),
        ("features", "prefix_caching", "yes", "features.prefix_caching is a boolean"),
        ("scheduler", "chunked_prefill", 1, "scheduler.chunked_prefill is a boolean"),
        ("graphs", "cuda_graphs", 0.0, "graphs.cuda_graphs is a boolean"),
    ],
)
def test_engine_shapes_are_the_schemas(section, key, value, says):
    d = _engine()
    if key is None:
        d[section] = value
    else:
        d[section][key] = value
    assert says in _refused(engine_from_dict, d)


def test_engine_unknown_key_in_a_section_names_the_section():
    d = _engine()
    d["scheduler"]["max_num_seq"] = d["scheduler"].pop("max_num_seqs")
    text = _refused(engine_from_dict, d)
    assert "unknown key 'max_num_seq' in [scheduler] (did you mean 'max_num_seqs'?)" in text


def test_engine_ranges_stay_the_loaders():
    d = _engine()
    d["scheduler"]["max_num_seqs"] = 0
    assert "max_num_seqs is a positive whole number" in _refused(engine_from_dict, d)
    d = _engine()
    d["memory"]["memory_fraction"] = 1.5
    assert "memory_fraction is in (0, 1]" in _refused(engine_from_dict, d)


def test_profile_unknown_keys_are_the_schemas_at_the_top_and_in_a_family():
    d = tomllib.loads((SRC / "profiles" / "datasheet.toml").read_text())
    d["matmull"] = d.pop("matmul")
    text = _refused(profile_from_dict, d)
    assert "unknown key 'matmull' (did you mean 'matmul'?)" in text
    d = tomllib.loads((SRC / "profiles" / "datasheet.toml").read_text())
    fam = next(iter(d["family"]))
    d["family"][fam]["attn_fwdd"] = d["family"][fam].pop("attn_fwd")
    text = _refused(profile_from_dict, d)
    assert f"unknown key 'attn_fwdd' in [family.{fam}] (did you mean 'attn_fwd'?)" in text


# ---- system files (specs/system.py): keys, booleans and table/list shapes are the schema's


def _system_refused(tmp_path, old: str, new: str) -> str:
    text = (SRC / "systems" / "example-custom.toml").read_text()
    assert old in text
    f = tmp_path / "my.toml"
    f.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError) as e:
        parse_system(str(f))
    msg = str(e.value)
    assert "\n" not in msg and str(f) in msg and "Rule:" in msg and "Fix:" in msg
    return msg


@pytest.mark.parametrize(
    "old, new, says",
    [
        ("\nsharp = false", '\nsharp = "no"', "sharp is a boolean"),
        ("\nsharp = false", "\nsharp = false\nwraparound = 1", "wraparound is a boolean"),
        ("\nsharp = false", "\nsharp = false\ntier_bw = 25e9", "tier_bw is a table"),
        ("\nsharp = false", '\nsharp = false\nswitch_bw = "big"', "switch_bw is a table"),
        ("hop_latency_s = 3e-6", "hop_latency_s = 3e-6\nwraparound = 0", "wraparound is a boolean"),
    ],
)
def test_system_shapes_are_the_schemas(tmp_path, old, new, says):
    assert says in _system_refused(tmp_path, old, new)


def test_system_dims_not_a_list_of_tables_is_the_schemas(tmp_path):
    text = (SRC / "systems" / "example-custom.toml").read_text()
    head = text.split("\n[[dims]]")[0]  # the header comments name [[dims]] too
    f = tmp_path / "my.toml"
    f.write_text(head.replace("\nsharp = false", '\nsharp = false\ndims = ["leaf", "nvlink"]', 1))
    with pytest.raises(SpecError) as e:
        parse_system(str(f))
    msg = str(e.value)
    assert str(f) in msg and "Rule:" in msg and "Fix:" in msg and "dims[0]" in msg
    assert "is a table" in msg


def test_system_unknown_keys_are_the_schemas_at_the_top_and_in_a_dim(tmp_path):
    text = _system_refused(tmp_path, "\nsharp = false", "\nsharpp = false")
    assert "unknown key 'sharpp' (did you mean 'sharp'?)" in text
    text = _system_refused(tmp_path, "bw_bytes_per_s = 25e9", "bw_bytes_per_sec = 25e9")
    assert "unknown key 'bw_bytes_per_sec'" in text and "dims[0]" in text


def test_system_ranges_stay_the_loaders(tmp_path):
    text = _system_refused(tmp_path, "\nsharp = false", "\nsharp = false\n[tier_bw]\nleaf = -1.0")
    assert "tier_bw.leaf" in text
    assert "size" in _system_refused(tmp_path, "size = 2", "size = 0")
    assert "lacks 'kind'" in _system_refused(tmp_path, 'kind = "scaleout"\n', "")


# ---- framework files (specs/framework.py): keys, types and tables are the schema's


def _framework() -> dict:
    return tomllib.loads((SRC / "frameworks" / "megatron.toml").read_text())


@pytest.mark.parametrize(
    "path, value, says",
    [
        (("fsdp",), 3, "fsdp = 3. Rule: fsdp is a table"),
        (("versions",), "0.9", "versions = '0.9'. Rule: versions is a list"),
        (("fsdp", "supported"), "yes", "fsdp.supported = 'yes'. Rule: fsdp.supported is a boolean"),
        (("data_parallel", "zero_stages"), 1, "data_parallel.zero_stages is a list"),
        (("title",), 7, "title is a string"),
        (("overlap", "tensor", "on", "forward"), "all", "overlap.tensor.on.forward is a number"),
    ],
)
def test_framework_shapes_are_the_schemas(path, value, says):
    d = _framework()
    table = d
    for k in path[:-1]:
        table = table[k]
    table[path[-1]] = value
    assert says in _refused(framework_from_dict, d)


def test_framework_unknown_keys_are_the_schemas_at_the_top_and_in_a_table():
    d = _framework()
    d["titel"] = d.pop("title")
    assert "unknown key 'titel' (did you mean 'title'?)" in _refused(framework_from_dict, d)
    d = _framework()
    d["fsdp"]["supportd"] = d["fsdp"].pop("supported")
    text = _refused(framework_from_dict, d)
    assert "unknown key 'supportd' in [fsdp] (did you mean 'supported'?)" in text


def test_framework_ranges_stay_the_loaders_and_reruns_items_are_the_schemas():
    d = _framework()
    name, policy = next(iter(d["remat"]["policies"].items()))
    policy["reruns"] = [3]  # the schema types reruns' items (it left them untyped before)
    text = _refused(framework_from_dict, d)
    assert (
        f"remat.policies.{name}.reruns[0] = 3. Rule: remat.policies.{name}.reruns[0] is a string"
        in text
    )
    d = _framework()
    next(iter(d["remat"]["policies"].values()))["layer_fraction"] = 0.0
    assert "layer_fraction is in (0, 1]" in _refused(framework_from_dict, d)
    d = _framework()
    d["overlap"]["tensor"]["on"]["forward"] = 1.5
    assert "overlap fractions are in [0, 1]" in _refused(framework_from_dict, d)


# ---- model files (specs/model.py): keys and sub-table shapes are the schema's


def _model() -> dict:
    return tomllib.loads((SRC / "models" / "deepseek-v3.toml").read_text())


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("moe", 8, "moe = 8. Rule: moe is a table"),
        ("mla", "yes", "mla = 'yes'. Rule: mla is a table"),
        ("linear", [1], "linear is a table"),
        ("aliases", "dsv3", "aliases is a list"),
    ],
)
def test_model_shapes_are_the_schemas(key, value, says):
    d = _model()
    d[key] = value
    assert says in _refused(model_from_dict, d)


def test_model_unknown_keys_are_the_schemas_at_the_top_and_in_a_subtable():
    d = _model()
    d["d_modle"] = d.pop("d_model")
    assert "unknown key 'd_modle' (did you mean 'd_model'?)" in _refused(model_from_dict, d)
    d = _model()
    d["moe"]["n_expert"] = d["moe"].pop("n_experts")
    text = _refused(model_from_dict, d)
    assert "unknown key 'n_expert' in [moe] (did you mean 'n_experts'?)" in text


def test_model_presence_and_ranges_stay_the_loaders():
    d = _model()
    del d["moe"]["top_k"]
    assert "[moe] lacks 'top_k'" in _refused(model_from_dict, d)
    d = _model()
    del d["vocab"]
    assert "lacks 'vocab'" in _refused(model_from_dict, d)
    d = _model()
    d["d_model"] = 0
    assert "d_model" in _refused(model_from_dict, d)
