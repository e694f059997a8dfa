"""The schemas' `required` and `enum` lists are the loaders' (issue 21), found by asking the
loaders, not by reading their source:

- required: in every shipped file without a `base` (a file with one inherits what it omits),
  each key is deleted in turn and the file loaded with the schema check switched off. The keys
  the loader's own code then refuses as missing, at each table of the schema, must be exactly
  that table's `required` (for the kinds with a `base`, the one under `else` of
  `"if": {"required": ["base"]}`). A key refused in one file and accepted in another would be
  a rule the schema cannot state; there are none.
- enum: each `enum` of a schema is the value list of the enum class its loader parses with.

So a key the loader starts to need, or stops needing, fails here until the schema says so.
"""

from __future__ import annotations

import copy
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import roofline.specs.chip as chip_mod
import roofline.specs.efficiency as eff_mod
import roofline.specs.engines as engine_mod
import roofline.specs.framework as fw_mod
import roofline.specs.model as model_mod
import roofline.specs.system as system_mod
from roofline.errors import SpecError
from roofline.specs.schema import KINDS, schema

SPECS = Path(__file__).resolve().parents[2] / "src" / "roofline" / "specs"
DIRS = {
    "chip": "chips",
    "model": "models",
    "system": "systems",
    "framework": "frameworks",
    "profile": "profiles",
    "engine": "engines",
}


def _system_loader(data: dict, origin: str) -> Any:
    system_mod.read_toml = lambda path, what: data  # the file's text is `data`
    return system_mod._system_from_toml(Path(origin), nodes_per_leaf=None)


LOADERS = {
    "chip": lambda d, o: chip_mod.chip_from_dict(d, o),
    "model": lambda d, o: model_mod.model_from_dict(d, o),
    "system": _system_loader,
    "framework": lambda d, o: fw_mod.framework_from_dict(d, o),
    "profile": lambda d, o: eff_mod.profile_from_dict(d, o),
    "engine": lambda d, o: engine_mod.engine_from_dict(d, o),
}
SCHEMA_CHECKED = (chip_mod, model_mod, system_mod, fw_mod, eff_mod, engine_mod)


def baseless_files(kind: str) -> list[tuple[Path, dict]]:
    out = []
    for f in sorted((SPECS / DIRS[kind]).glob("*.toml")):
        data = tomllib.loads(f.read_text())
        if "base" not in data:
            out.append((f, data))
    return out


def _merge(a: dict, b: dict) -> dict:
    """`b`'s required keys and nested tables laid over `a` (what a base-less file must meet)."""
    out = dict(a)
    for k, v in b.items():
        if k == "required":
            out[k] = list(dict.fromkeys([*a.get(k, ()), *v]))
        elif k == "properties":
            props = dict(a.get(k, {}))
            for name, sub in v.items():
                props[name] = _merge(props.get(name, {}), sub)
            out[k] = props
        elif k == "additionalProperties" and isinstance(v, dict):
            out[k] = _merge(a.get(k) if isinstance(a.get(k), dict) else {}, v)
        else:
            out[k] = v
    return out


def baseless_schema(kind: str) -> dict:
    """The kind's schema as a file without `base` meets it: `else` merged into the root."""
    root = {k: v for k, v in schema(kind).items() if k not in ("if", "then", "else")}
    return _merge(root, schema(kind).get("else", {}))


def _child(node: dict, key: Any) -> tuple[str, dict] | None:
    if isinstance(key, int):
        return ("/items", node["items"]) if isinstance(node.get("items"), dict) else None
    if key in node.get("properties", {}):
        return f"/properties/{key}", node["properties"][key]
    extra = node.get("additionalProperties")
    return ("/additionalProperties", extra) if isinstance(extra, dict) else None


def tables(data: Any, node: dict, ptr: str = "", path: tuple = ()):
    """(schema pointer, schema node, data path) of every table in `data` the schema describes
    (the first two entries of a list of tables)."""
    if isinstance(data, dict):
        yield ptr, node, path
        items = data.items()
    elif isinstance(data, list):
        items = list(enumerate(data[:2]))
    else:
        return
    for k, v in items:
        child = _child(node, k)
        if child is not None:
            yield from tables(v, child[1], ptr + child[0], (*path, k))


def _says_missing(msg: str, key: str, node: dict) -> bool:
    """The loader refused the file for lacking `key`, or a key inside table `key` (a table
    whose every entry is needed, as an engine's [scheduler])."""
    inner = _child(node, key)
    names = [key, *(inner[1].get("properties", {}) if inner else ())]
    pats = ("lacks {!r}", "has no {!r}", "argument: {!r}", "has no entry for {}")
    return any(p.format(n) in msg for p in pats for n in names)


def _refused_as_missing(kind: str, data: dict, path: tuple, key: str, node: dict, origin: str):
    d = copy.deepcopy(data)
    table = d
    for p in path:
        table = table[p]
    del table[key]
    try:
        LOADERS[kind](d, origin)
    except SpecError as e:
        return _says_missing(str(e), key, node)
    return False


def observed(kind: str) -> tuple[dict, dict]:
    """({schema pointer: keys the loader refused as missing}, {pointer: keys it accepted
    without}) over every base-less shipped file of the kind, the schema check switched off."""
    root = baseless_schema(kind)
    refused, accepted = defaultdict(set), defaultdict(set)
    with pytest.MonkeyPatch.context() as mp:
        for mod in SCHEMA_CHECKED:
            mp.setattr(mod, "check_schema", lambda *a, **k: None)
        mp.setattr(system_mod, "read_toml", system_mod.read_toml)  # restored after
        for f, data in baseless_files(kind):
            for ptr, node, path in tables(data, root):
                table = data
                for p in path:
                    table = table[p]
                for key in list(table):
                    out = _refused_as_missing(kind, data, path, key, node, f.name)
                    (refused if out else accepted)[ptr].add(key)
    return refused, accepted


def _node(root: dict, ptr: str) -> dict:
    node = root
    for part in ptr.split("/")[1:]:
        node = node[part]
    return node


def _required_pointers(node: Any, ptr: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        if node.get("required"):
            out.add(ptr)
        for k, v in node.items():
            if k in ("properties",):
                out |= {
                    p
                    for name, sub in v.items()
                    for p in _required_pointers(sub, f"{ptr}/properties/{name}")
                }
            elif k in ("items", "additionalProperties"):
                out |= _required_pointers(v, f"{ptr}/{k}")
    return out


TOML_KINDS = sorted(DIRS)


@pytest.fixture(scope="module", params=TOML_KINDS)
def seen(request):
    return request.param, *observed(request.param)


def test_every_toml_kind_has_a_base_less_file_and_runs_is_the_rest():
    assert set(TOML_KINDS) | {"runs"} == set(KINDS)
    assert all(baseless_files(k) for k in TOML_KINDS)


def test_the_schemas_required_keys_are_the_loaders(seen):
    kind, refused, accepted = seen
    root = baseless_schema(kind)
    always = {p: refused[p] - accepted[p] for p in refused}
    stated = {p: set(_node(root, p).get("required", ())) for p in set(refused) | set(accepted)}
    assert {p: sorted(v) for p, v in always.items() if v} == {
        p: sorted(v) for p, v in stated.items() if v
    }


def test_no_key_is_needed_in_one_file_and_not_another(seen):
    """The schema states presence per table; a key only some files must give could not be."""
    kind, refused, accepted = seen
    assert {p: sorted(refused[p] & accepted[p]) for p in refused if refused[p] & accepted[p]} == {}


def test_every_required_list_was_put_to_the_loader(seen):
    """No `required` sits where no shipped file reaches (it would be checked against nothing)."""
    kind, refused, accepted = seen
    assert _required_pointers(baseless_schema(kind)) <= set(refused) | set(accepted)


BASED = {
    "chip": "chips/a100-40gb.toml",
    "system": "systems/dgx-h100-superpod-tapered-spine.toml",
    "profile": "profiles/fitted.toml",
}


@pytest.mark.parametrize("kind", sorted(BASED))
def test_a_file_with_a_base_may_omit_what_a_file_without_one_must_give(kind):
    """`if base / else required`: the project's checker and jsonschema agree both ways."""
    jsonschema = pytest.importorskip("jsonschema")
    from roofline.specs.schema import violation

    data = tomllib.loads((SPECS / BASED[kind]).read_text())
    ref = jsonschema.Draft202012Validator(schema(kind))
    assert violation(kind, data, "f") is None and ref.is_valid(data)
    without = {k: v for k, v in data.items() if k != "base"}
    err = violation(kind, without, "f.toml")
    assert err is not None and " lacks " in str(err) and not ref.is_valid(without)
