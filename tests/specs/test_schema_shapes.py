"""Every schema types what it holds all the way down, and its enums are the loaders' (issue 21).

- every array says what its items are (`items`), every table what its values are
  (`properties` and/or `additionalProperties`), and a table with named keys is closed
  (`additionalProperties: false` or a schema for the rest), apart from the few open records
  listed in OPEN with the reason;
- every `enum` of a schema lists the values of the enum class its loader parses with, and the
  loader (schema check off) reads each listed value and refuses one outside the list.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

import roofline.specs.framework as fw_mod
import roofline.specs.model as model_mod
import roofline.specs.system as system_mod
from roofline.errors import SpecError
from roofline.specs.framework import HostTraffic
from roofline.specs.model import MLPKind
from roofline.specs.schema import KINDS, schema
from roofline.specs.system import DimKind

SPECS = Path(__file__).resolve().parents[2] / "src" / "roofline" / "specs"

# tables a schema leaves open, and why
OPEN = {
    ("profile", "/properties/provenance"): "written by `roofline calibrate`: what was fitted, "
    "from which runs (a record, not read back as physics)",
    ("profile", "/properties/param_sources"): "an old key the loader reads and ignores",
    ("runs", "/oneOf/1"): "a mapping with a `runs:` list; the loader ignores its other keys",
}
# a measured run's record sections keep whatever its source reported; the mappers read the keys
# the schema names and leave the rest (docs/validate.md)
OPEN_RUN_SECTIONS = "/$defs/entry/properties/"


def nodes(node, ptr=""):
    if isinstance(node, dict):
        yield ptr, node
        for k, v in node.items():
            yield from nodes(v, f"{ptr}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from nodes(v, f"{ptr}/{i}")


def _types(node: dict) -> list:
    t = node.get("type", [])
    return t if isinstance(t, list) else [t]


def _gaps(kind: str, doc: dict | None = None) -> list[str]:
    out = []
    for ptr, node in nodes(schema(kind) if doc is None else doc):
        if "array" in _types(node) and not isinstance(node.get("items"), dict):
            out.append(f"{ptr}: an array without items")
        if "object" not in _types(node) or (kind, ptr) in OPEN:
            continue
        extra = node.get("additionalProperties", True)
        if "properties" not in node and extra is True:
            out.append(f"{ptr}: a table that types nothing")
        open_section = kind == "runs" and ptr.startswith(OPEN_RUN_SECTIONS)
        if "properties" in node and extra is True and not open_section:
            out.append(f"{ptr}: a table with named keys open to any other")
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_every_array_and_table_types_its_contents(kind):
    assert _gaps(kind) == []


def test_the_check_finds_each_kind_of_gap():
    """Not vacuous: the framework schema's remat reruns once lacked `items`."""
    s = copy.deepcopy(schema("framework"))
    policy = s["properties"]["remat"]["properties"]["policies"]["additionalProperties"]
    del policy["properties"]["reruns"]["items"]
    del policy["additionalProperties"]
    s["properties"]["overheads"] = {"type": "object"}
    at = "/properties/remat/properties/policies/additionalProperties"
    assert _gaps("framework", s) == [
        f"{at}: a table with named keys open to any other",
        f"{at}/properties/reruns: an array without items",
        "/properties/overheads: a table that types nothing",
    ]


# -- enums --------------------------------------------------------------------------------

# (kind, schema pointer) -> (the loader's enum class, a shipped file, the data path to the value)
ENUMS = {
    ("model", "/properties/mlp"): (MLPKind, "models/llama-3-8b.toml", ("mlp",)),
    ("system", "/properties/dims/items/properties/kind"): (
        DimKind,
        "systems/example-custom.toml",
        ("dims", 0, "kind"),
    ),
    (
        "framework",
        "/properties/data_parallel/properties/optimizer_offload/properties/host_traffic",
    ): (
        HostTraffic,
        "frameworks/deepspeed.toml",
        ("data_parallel", "optimizer_offload", "host_traffic"),
    ),
}


def _node(kind: str, ptr: str) -> dict:
    node = schema(kind)
    for part in ptr.split("/")[1:]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def test_every_enum_of_every_schema_is_held_to_its_loaders_class():
    found = {(k, p) for k in KINDS for p, n in nodes(schema(k)) if "enum" in n}
    assert found == set(ENUMS)


@pytest.mark.parametrize("where", sorted(ENUMS), ids=lambda w: w[0])
def test_the_schema_enum_is_the_loaders_enum_class(where):
    cls = ENUMS[where][0]
    assert _node(*where)["enum"] == [m.value for m in cls]


def _load(kind: str, data: dict, origin: str):
    if kind == "model":
        return model_mod.model_from_dict(data, origin)
    if kind == "framework":
        return fw_mod.framework_from_dict(data, origin)
    system_mod.read_toml = lambda path, what: data
    return system_mod._system_from_toml(Path(origin), nodes_per_leaf=None)


@pytest.mark.parametrize("where", sorted(ENUMS), ids=lambda w: w[0])
def test_the_loader_reads_each_listed_value_and_refuses_another(where, monkeypatch):
    kind = where[0]
    cls, file, path = ENUMS[where]
    for mod in (model_mod, fw_mod, system_mod):
        monkeypatch.setattr(mod, "check_schema", lambda *a, **k: None)
    monkeypatch.setattr(system_mod, "read_toml", system_mod.read_toml)
    data = tomllib.loads((SPECS / file).read_text())

    def with_value(v):
        d = copy.deepcopy(data)
        t = d
        for p in path[:-1]:
            t = t[p]
        t[path[-1]] = v
        return d

    for v in _node(*where)["enum"]:
        _load(kind, with_value(v), "f.toml")
    with pytest.raises(SpecError, match=path[-1]):
        _load(kind, with_value("not-a-" + path[-1]), "f.toml")


def test_every_data_file_under_specs_is_of_a_kind_with_a_schema():
    """tests/test_schemas.py validates each kind's folder with jsonschema; no data file sits
    where that check would not reach it."""
    folders = {"chips", "models", "systems", "frameworks", "profiles", "engines"}
    data = [p for p in SPECS.rglob("*") if p.suffix in (".toml", ".yaml", ".yml", ".json")]
    assert {p.parent.name for p in data} == folders | {"schemas"}
    assert {p.name for p in data if p.parent.name == "schemas"} == {
        f"{k}.schema.json" for k in KINDS
    }
