"""The JSON Schemas of the user file kinds (roofline.specs.schema, `roofline schema KIND`).

Every shipped data file validates against its kind's schema; each kind's loader refuses an
unknown key (naming the closest known one) and a wrong type with a one-paragraph SpecError;
the schema's keys are the loader's keys (so the two cannot drift); and `jsonschema`, the
reference implementation of draft 2020-12, agrees with the project's own checker.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from roofline.cli import main
from roofline.errors import SpecError
from roofline.specs import efficiency, system
from roofline.specs.chip import Chip, chip_from_dict
from roofline.specs.efficiency import profile_from_dict
from roofline.specs.engines import EngineProfile, engine_from_dict
from roofline.specs.framework import framework_from_dict
from roofline.specs.model import MLASpec, ModelSpec, MoESpec, model_from_dict
from roofline.specs.schema import KINDS, check, schema, violation

SRC = Path(__file__).resolve().parents[1] / "src" / "roofline"
DIRS = {
    "chip": "specs/chips",
    "model": "specs/models",
    "system": "specs/systems",
    "framework": "specs/frameworks",
    "profile": "specs/profiles",
    "engine": "specs/engines",
}


def shipped() -> list[tuple[str, Path]]:
    out = [(k, f) for k, d in DIRS.items() for f in sorted((SRC / d).glob("*.toml"))]
    return out + [("runs", f) for f in sorted((SRC / "validate").glob("*.yaml"))]


def read(path: Path):
    if path.suffix == ".toml":
        return tomllib.loads(path.read_text())
    return yaml.safe_load(path.read_text())


def test_every_kind_has_a_shipped_file_and_a_draft_2020_12_schema():
    assert {k for k, _ in shipped()} == set(KINDS)
    for kind in KINDS:
        assert schema(kind)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("kind,path", shipped(), ids=lambda x: getattr(x, "name", x))
def test_every_shipped_file_validates(kind, path):
    check(kind, read(path), str(path))


@pytest.mark.parametrize("kind,path", shipped(), ids=lambda x: getattr(x, "name", x))
def test_jsonschema_accepts_every_shipped_file(kind, path):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(schema(kind))
    jsonschema.Draft202012Validator(schema(kind)).validate(read(path))


# -- the schema's keys are the loader's keys ---------------------------------------------


def keys(node: dict) -> set[str]:
    return set(node["properties"])


def test_chip_and_model_keys_are_the_dataclass_fields():
    assert keys(schema("chip")) == set(Chip.__dataclass_fields__) | {"base"}
    m = schema("model")
    assert keys(m) == {f.name for f in dataclasses.fields(ModelSpec)}
    assert keys(m["properties"]["moe"]) == {f.name for f in dataclasses.fields(MoESpec)}
    assert keys(m["properties"]["mla"]) == {f.name for f in dataclasses.fields(MLASpec)}


def test_system_keys_are_the_loaders():
    s = schema("system")
    assert keys(s) == system._TOML_KEYS
    assert keys(s["properties"]["dims"]["items"]) == system._DIM_KEYS


def test_engine_sections_hold_exactly_the_profile_fields():
    s = schema("engine")
    flat: list[str] = []
    for k, v in s["properties"].items():
        # a section's keys are fields; `before` (older releases' tables of them) is one field
        flat += list(v["properties"]) if "properties" in v else [k]
    assert sorted(flat) == sorted(f.name for f in dataclasses.fields(EngineProfile))


def test_profile_keys_are_the_loaders():
    s = schema("profile")
    extra = {"base", "family", "framework", "provenance", "param_sources"}
    assert keys(s) == efficiency._TOP_KEYS | extra
    assert keys(s["properties"]["family"]["additionalProperties"]) == efficiency._FAMILY_KEYS


def all_keys(node) -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        out |= set(node.get("properties", {}))
        for v in node.values():
            out |= all_keys(v)
    elif isinstance(node, list):
        for v in node:
            out |= all_keys(v)
    return out


def test_every_key_the_framework_reader_asks_for_is_in_the_schema():
    src = (SRC / "specs" / "framework.py").read_text()
    asked = set(
        re.findall(
            r"\bt\.(?:text|number|fraction|flag|enum|enums|texts|dtype|sub|get|source)"
            r'\(\s*"([A-Za-z0-9_-]+)"',
            src,
        )
    )
    assert len(asked) > 40  # the reader's accessors were found at all
    assert asked <= all_keys(schema("framework"))


# -- each kind refuses an unknown key and a wrong type, through its loader ---------------


def data_of(kind: str, name: str) -> dict:
    return read(SRC / DIRS[kind] / name)


LOADERS = {
    "chip": (chip_from_dict, "h100.toml", "hbm_bytes", "hbm_byts"),
    "model": (model_from_dict, "llama-3-8b.toml", "d_model", "d_modle"),
    "framework": (framework_from_dict, "megatron.toml", "title", "titel"),
    "profile": (profile_from_dict, "peak.toml", "matmul", "matmull"),
    "engine": (engine_from_dict, "vllm.toml", "display", "dispaly"),
}


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_loader_names_the_closest_key_for_an_unknown_one(kind):
    load, name, key, typo = LOADERS[kind]
    d = data_of(kind, name)
    d[typo] = d.pop(key)
    with pytest.raises(SpecError) as e:
        load(d, "f.toml")
    assert f"unknown key {typo!r}" in str(e.value) and f"did you mean {key!r}" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_loader_refuses_a_wrong_type_naming_the_key(kind):
    load, name, key, _ = LOADERS[kind]
    d = data_of(kind, name)
    d[key] = [1, 2]
    with pytest.raises(SpecError) as e:
        load(d, "f.toml")
    assert f"{key} = [1, 2]" in str(e.value)


def test_a_nested_unknown_key_is_named_with_its_table():
    d = data_of("model", "deepseek-v3.toml")
    d["moe"]["top_kk"] = d["moe"].pop("top_k")
    with pytest.raises(
        SpecError, match=r"unknown key 'top_kk' in \[moe\] \(did you mean 'top_k'\?\)"
    ):
        model_from_dict(d, "f.toml")


def test_a_wrong_type_deep_in_a_framework_names_the_key_path():
    d = data_of("framework", "megatron.toml")
    d["overlap"]["tensor"]["on"]["forward"] = "most"
    with pytest.raises(
        SpecError, match=r"overlap\.tensor\.on\.forward = 'most'\. Rule: .* a number"
    ):
        framework_from_dict(d, "f.toml")


def test_system_file_with_an_unknown_key(tmp_path):
    text = (SRC / DIRS["system"] / "example-custom.toml").read_text()
    f = tmp_path / "s.toml"
    f.write_text(text.replace("\nchip =", "\nchipp =", 1))
    with pytest.raises(SpecError, match=r"unknown key 'chipp' \(did you mean 'chip'\?\)"):
        system.parse_system(str(f))


def test_system_file_with_a_wrong_type(tmp_path):
    f = tmp_path / "s.toml"
    text = (SRC / DIRS["system"] / "example-custom.toml").read_text()
    f.write_text(text.replace("\nsharp = false", "\nsharp = 3", 1))
    with pytest.raises(SpecError, match=r"sharp = 3\. Rule: sharp is a boolean"):
        system.parse_system(str(f))


def test_runs_entry_with_a_misspelt_key_is_skipped_with_the_reason(tmp_path):
    from roofline.validate import load_runs, mapped_runs

    entries = read(SRC / "validate" / "measured_training.yaml")
    entries = entries if isinstance(entries, list) else entries["runs"]
    good = [r for r in mapped_runs(load_runs(SRC / "validate" / "measured_training.yaml"))]
    first = next(i for i, r in enumerate(good) if not r.skipped_reason)
    e = copy.deepcopy(entries[first])
    e["notez"] = "x"
    f = tmp_path / "runs.yaml"
    f.write_text(yaml.safe_dump([e]))
    (run,) = mapped_runs(load_runs(f))
    assert run.skipped_reason.startswith("schema: unknown key 'notez'")
    assert "did you mean 'notes'" in run.skipped_reason


def test_runs_schema_refuses_a_wrong_type_in_an_entry():
    entries = read(SRC / "validate" / "measured_inference.yaml")
    e = copy.deepcopy(entries[0] if isinstance(entries, list) else entries["runs"][0])
    e["id"] = 7
    err = violation("runs", e, "r.yaml", part="entry")
    assert err is not None and "id = 7" in str(err) and "is a string" in str(err)


# -- the project's checker agrees with jsonschema ------------------------------------------


def mutations(data, rng: random.Random, n: int):
    """Copies of `data` with one value swapped for one of another type, or one key misspelt."""
    paths: list[tuple] = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append((*path, k))
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node[:3]):
                walk(v, (*path, i))

    walk(data, ())
    for _ in range(n):
        d = copy.deepcopy(data)
        path = rng.choice(paths)
        parent = d
        for p in path[:-1]:
            parent = parent[p]
        if rng.random() < 0.5:
            parent[path[-1]] = rng.choice(["text", 3, 2.5, True, [1], {"a": 1}])
        else:
            parent[str(path[-1]) + "x"] = parent.pop(path[-1])
        yield d


@pytest.mark.parametrize("kind,path", shipped()[::3], ids=lambda x: getattr(x, "name", x))
def test_checker_agrees_with_jsonschema_on_mutated_files(kind, path):
    jsonschema = pytest.importorskip("jsonschema")
    ref = jsonschema.Draft202012Validator(schema(kind))
    rng = random.Random(path.name)
    verdicts = []
    for d in mutations(read(path), rng, 25):
        ours = violation(kind, d, "f") is None
        assert ours == ref.is_valid(d), (kind, path.name)
        verdicts.append(ours)
    assert False in verdicts  # the mutations did break something


# -- the command ----------------------------------------------------------------------------


def test_schema_command_prints_the_checked_schema(capsys):
    assert main(["schema", "chip"]) == 0
    assert json.loads(capsys.readouterr().out) == schema("chip")


def test_schema_command_writes_out(tmp_path, capsys):
    out = tmp_path / "framework.schema.json"
    assert main(["schema", "framework", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == schema("framework")


def test_schema_command_unwritable_out_is_one_paragraph(tmp_path, capsys):
    assert main(["schema", "model", "--out", str(tmp_path / "no" / "such" / "m.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot be written" in err and "Traceback" not in err


# -- docs/schemas.md shows real output ------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "schemas.md"


def test_docs_show_the_errors_the_loaders_print():
    doc = DOC.read_text()
    d = data_of("chip", "h100.toml")
    d["hbm_bw_bytes_per_sec"] = d.pop("hbm_bw_bytes_per_s")
    with pytest.raises(SpecError) as e:
        chip_from_dict(d, "my-chip.toml")
    assert f"\n{e.value}\n" in doc
    f = data_of("framework", "megatron.toml")
    f["overlap"]["tensor"]["on"]["forward"] = "most"
    with pytest.raises(SpecError) as e:
        framework_from_dict(f, "my-stack.toml")
    assert f"\n{e.value}\n" in doc


def test_docs_name_every_kind():
    doc = DOC.read_text()
    assert all(f"| `{k}`" in doc for k in KINDS)


def test_every_key_has_a_type():
    """A key the shipped files never use still has a type for the editor and the checker."""

    def untyped(node, path=""):
        if isinstance(node, dict):
            for k, v in node.get("properties", {}).items():
                if not v:
                    yield path + k
                yield from untyped(v, f"{path}{k}.")
            for key in ("items", "additionalProperties"):
                if isinstance(node.get(key), dict):
                    yield from untyped(node[key], path + "*.")
            for v in node.get("$defs", {}).values():
                yield from untyped(v, path)

    assert {k: list(untyped(schema(k))) for k in KINDS} == {k: [] for k in KINDS}


def test_a_null_in_a_runs_entry_is_not_a_schema_problem():
    """YAML writes an unknown value as `~`; the mappers judge it, as before the schema."""
    entries = read(SRC / "validate" / "measured_training.yaml")
    e = copy.deepcopy(entries[0] if isinstance(entries, list) else entries["runs"][0])
    e["notes"] = None
    e["parallelism"] = {k: None for k in e["parallelism"]}
    assert violation("runs", e, "r.yaml", part="entry") is None
