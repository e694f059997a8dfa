"""Name lookup for the data catalogs: forgiving names, closest matches in the error."""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path

from roofline.errors import SpecError, UnknownNameError

DATA_DIR = Path(__file__).parent


def normalize(name: str) -> str:
    """'meta-llama/Meta-Llama-3-70B' -> 'metallama370b'; case, '-', '_', '.', ' ' ignored."""
    s = str(name).strip().lower()
    s = s.rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9]", "", s)


def read_toml(path: Path, what: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise SpecError(
            f"{what} file {str(path)!r} does not exist", fix="check the path, or use a catalog name"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(
            f"{what} file {str(path)!r} is not valid TOML ({e})",
            rule="data files are TOML",
            fix="fix the syntax at the line named",
        ) from None


def resolve(name: str, entries: dict[str, Iterable[str]], what: str) -> str:
    """Return the canonical key of `entries` ({key: aliases}) that `name` names.

    Matching ignores case and punctuation and a leading 'org/' and 'meta-' style prefix.
    """
    want = normalize(name)
    table: dict[str, str] = {}
    for key, aliases in entries.items():
        for a in (key, *aliases):
            table[normalize(a)] = key
    if want in table:
        return table[want]
    for prefix in ("meta", "google", "nvidia", "tpu"):
        if want.startswith(prefix) and want[len(prefix) :] in table:
            return table[want[len(prefix) :]]
    close = difflib.get_close_matches(want, list(table), n=4, cutoff=0.5)
    names = sorted({table[c] for c in close})
    hint = ("closest: " + ", ".join(names)) if names else "none is close"
    raise UnknownNameError(
        f"unknown {what} {name!r} ({hint})",
        rule=f"a {what} is a catalog name or a path to a TOML file",
        fix=f"run `roofline {what}s` for the list" + (f", e.g. {names[0]}" if names else ""),
    )
