"""The model catalog: presets by name or alias, model TOML files and Hugging Face config.json
files, each loaded into a `ModelSpec` (specs/model.py holds the record; specs/hf.py reads
config.json). It sits above both so neither imports the other."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from roofline.errors import SpecError
from roofline.specs.catalog import exists, is_dir, is_file, read_toml, resolve
from roofline.specs.hf import load_hf_config
from roofline.specs.model import MODEL_DIR, ModelSpec, model_from_dict


@cache
def _catalog() -> dict[str, tuple[Path, tuple[str, ...]]]:
    out = {}
    for p in sorted(MODEL_DIR.glob("*.toml")):
        raw = read_toml(p, "model")
        out[raw["name"]] = (p, tuple(raw.get("aliases", ())))
    return out


def model_names() -> list[str]:
    return list(_catalog())


@cache
def _load_named(key: str) -> ModelSpec:
    path, _ = _catalog()[key]
    return model_from_dict(read_toml(path, "model"), str(path))


def load_model(name_or_path: str | Path | ModelSpec) -> ModelSpec:
    """A ModelSpec from a preset name, a model TOML file, or a Hugging Face config.json."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    if not isinstance(name_or_path, (str, Path)):
        raise SpecError(
            f"model {name_or_path!r} is a {type(name_or_path).__name__}",
            rule="a model is a ModelSpec, a preset name, a model TOML file or a HF config.json",
            fix='pass e.g. "llama-3-8b" or a path',
        )
    s = str(name_or_path)
    if s.endswith(".json") or (is_dir(s) and is_file(Path(s) / "config.json")):
        return load_hf_config(s)
    if is_dir(s):
        raise SpecError(
            f"model path {s[:200]!r} is a directory without a config.json",
            rule="a model is a preset name, a model TOML file, a HF config.json or a directory holding one",
            fix="point at the config.json or the TOML file itself",
        )
    if s.endswith(".toml") or exists(s):
        return model_from_dict(read_toml(s, "model"), s)
    key = resolve(s, {k: v[1] for k, v in _catalog().items()}, "model")
    return _load_named(key)


__all__ = ["load_model", "model_names"]
