"""The engines' defaults tables hold together: every flag they name is a flag the engine takes,
every dtype is one the project knows, every default cites the engine's own source."""

from __future__ import annotations

import pytest

from roofline.launch.serving_common import _checkpoint_rules, load_table
from roofline.units import parse_dtype

ENGINES = ("vllm", "sglang", "trtllm")


@pytest.mark.parametrize("name", ENGINES)
def test_named_flags_are_flags_the_engine_takes(name):
    t = load_table(name)
    yaml_keys = set(t.raw.get("yaml", {}).get("keys", ()))
    assert t.inert <= t.known | yaml_keys, sorted(t.inert - t.known - yaml_keys)
    assert set(t.prefer) <= t.known
    assert set(t.aliases.values()) <= t.value_flags | t.switch_flags
    assert t.negatable <= t.switch_flags
    assert not (t.value_flags & t.switch_flags)


@pytest.mark.parametrize("name", ENGINES)
def test_dtypes_are_the_projects(name):
    t = load_table(name)
    for method, (weights, compute) in t.quantization.items():
        assert parse_dtype(weights) == weights and parse_dtype(compute) == compute, method
    for value, dtype in t.kv_cache_dtype.items():
        assert dtype == "" or parse_dtype(dtype) == dtype, value


@pytest.mark.parametrize("name", ENGINES)
def test_every_default_cites_the_engine(name):
    t = load_table(name)
    repo = {
        "vllm": "vllm-project/vllm",
        "sglang": "sgl-project/sglang",
        "trtllm": "NVIDIA/TensorRT-LLM",
    }
    assert t.defaults
    for key, (_, source) in t.defaults.items():
        assert source.startswith(repo[name]), key


def test_checkpoint_rules_name_known_dtypes_and_a_source():
    for pattern, c in _checkpoint_rules():
        assert parse_dtype(c.weights) == c.weights and parse_dtype(c.compute) == c.compute
        assert c.kv == "" or parse_dtype(c.kv) == c.kv
        assert c.source, pattern


@pytest.mark.parametrize("name", ENGINES)
def test_engine_settings_name_flags_and_profile_fields(name):
    from dataclasses import fields

    from roofline.specs.engines import EngineProfile

    t = load_table(name)
    profile_fields = {f.name for f in fields(EngineProfile)}
    yaml_keys = set(t.raw.get("yaml", {}).get("keys", ()))
    for key, (field_name, how) in t.raw["engine"].items():
        assert key in t.known if key.startswith("--") else key.split(".")[0] in yaml_keys, key
        assert field_name in profile_fields and how in ("fraction", "bool", "zero"), key
