"""docs/schemas.md links every kind's schema file (for an editor in a checkout) and shows the
missing-key error the model loader prints."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from roofline.errors import SpecError
from roofline.specs.model import model_from_dict
from roofline.specs.schema import KINDS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "schemas.md"


def test_the_docs_link_every_kinds_schema_file_and_the_links_resolve():
    links = dict(
        re.findall(r"\[(\w+)\]\((\.\./src/roofline/specs/schemas/[\w.]+)\)", DOC.read_text())
    )
    assert sorted(links) == sorted(KINDS)
    for kind, rel in links.items():
        assert (
            DOC.parent / rel
        ).resolve() == ROOT / "src/roofline/specs/schemas" / f"{kind}.schema.json"
        assert (DOC.parent / rel).is_file()


def test_the_docs_show_the_missing_key_error():
    d = tomllib.loads((ROOT / "src/roofline/specs/models/deepseek-v3.toml").read_text())
    del d["moe"]["top_k"]
    with pytest.raises(SpecError) as e:
        model_from_dict(d, "my-model.toml")
    assert f"\n{e.value}\n" in DOC.read_text()
