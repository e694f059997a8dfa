"""JSON Schemas (draft 2020-12) of the user file kinds, and the check every loader runs first.

The schemas are data, one file per kind under `specs/schemas/KIND.schema.json`: the same
document `roofline schema KIND` prints for editors (docs/schemas.md) is the one a loader checks
a parsed file against, before its own hand checks of ranges and cross-field rules. The first
violation becomes a one-paragraph `SpecError` naming the file, the key path, the rule and a fix
(for an unknown key, the closest known one).

The checker reads the subset of JSON Schema these files use (`type`, `properties`,
`additionalProperties`, `items`, `required`, `enum`, `oneOf`, `if`/`then`/`else`, local `$ref`;
a file with a `base` inherits what it omits, so the keys a base-less file must give sit under
`else` of `"if": {"required": ["base"]}`); it is pure Python
with no import cost beyond `json`, where `jsonschema` would pull in `referencing` and `rpds`
on every `roofline chips`. tests/test_schemas.py checks that `jsonschema` agrees with it.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from roofline.errors import SpecError

_DIR = Path(__file__).parent / "schemas"  # package data (pyproject: specs/schemas/*.json)

KINDS = ("model", "chip", "system", "framework", "profile", "engine", "runs")

# what a kind's files are called in error messages (as the loaders name them)
_NOUN = {"profile": "efficiency", "runs": "runs"}

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list, tuple),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}

_RENAME = "rename or remove the key (`roofline schema KIND` lists every key)"

_SAYS = {
    "object": "a table ([name] or {...})",
    "array": "a list ([...])",
    "string": 'a string ("...")',
    "number": "a number",
    "integer": "an integer",
    "boolean": "a boolean (true/false)",
    "null": "null",
}


@cache
def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of one file kind (a dict; `KINDS` lists them)."""
    if kind not in KINDS:
        raise SpecError(
            f"no schema for file kind {kind!r}",
            rule="schemas exist for " + ", ".join(KINDS),
            fix="name one of those kinds",
        )
    text = (_DIR / f"{kind}.schema.json").read_text("utf-8")
    return json.loads(text)


def check(kind: str, data: Any, origin: str) -> None:
    """Raise a one-paragraph SpecError at the first place `data` breaks `kind`'s schema."""
    err = violation(kind, data, origin)
    if err is not None:
        raise err


def violation(kind: str, data: Any, origin: str, part: str = "") -> SpecError | None:
    """The first place `data` breaks `kind`'s schema as a SpecError (not raised), or None.

    `part` names a `$defs` entry to check against instead of the whole schema (a runs file's
    `entry`: validate skips one bad entry with the reason instead of refusing the file)."""
    root = schema(kind)
    where = f"{_NOUN.get(kind, kind)} file {origin}"
    problem = _first_violation(data, root["$defs"][part] if part else root, root, ())
    if problem is None:
        return None
    path, what, rule, fix = problem
    if what.startswith("lacks"):  # as the loaders word it: "[moe] lacks 'top_k'"
        at = f": {_table(path)} " if path else " "
        return SpecError(f"{where}{at}{what}", rule=rule, fix=fix)
    at = f" {_dotted(path)}" if path and what[0] == "=" else ""
    return SpecError(f"{where}:{at} {what}", rule=rule, fix=fix.replace("KIND", kind))


def _dotted(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _table(path: tuple) -> str:
    """'[moe]' for a table, 'dims[0]' for a list's entry (the loaders' names for them)."""
    return _dotted(path) if isinstance(path[-1], int) else f"[{_dotted(path)}]"


def _is(value: Any, typ: str) -> bool:
    if isinstance(value, bool) and typ not in ("boolean",):
        return False
    return isinstance(value, _TYPES[typ])


def _lookup(ref: str, root: dict) -> dict:
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _first_violation(value: Any, node: dict, root: dict, path: tuple) -> tuple | None:
    """(path, what, rule, fix) of the first violation under `node`, or None."""
    if "$ref" in node:
        return _first_violation(value, _lookup(node["$ref"], root), root, path)
    if "oneOf" in node:
        return _one_of(value, node["oneOf"], root, path)
    bad = _type_violation(value, node, path)
    if bad is not None:
        return bad
    if isinstance(value, dict):
        bad = _object_violation(value, node, root, path)
        if bad is not None:
            return bad
    if isinstance(value, (list, tuple)) and "items" in node:
        for i, item in enumerate(value):
            bad = _first_violation(item, node["items"], root, (*path, i))
            if bad is not None:
                return bad
    return _conditional(value, node, root, path)


def _conditional(value: Any, node: dict, root: dict, path: tuple) -> tuple | None:
    """`then` where `value` meets `if`, else `else` (each checked on top of `node`)."""
    if "if" not in node:
        return None
    met = _first_violation(value, node["if"], root, path) is None
    branch = node.get("then" if met else "else")
    return None if branch is None else _first_violation(value, branch, root, path)


def _one_of(value: Any, options: list, root: dict, path: tuple) -> tuple | None:
    problems = [_first_violation(value, opt, root, path) for opt in options]
    if any(p is None for p in problems):
        return None
    # report the option whose type matched (its problem lies deeper), else the first
    deeper = [p for p in problems if len(p[0]) > len(path)]
    return (deeper or problems)[0]


def _type_violation(value: Any, node: dict, path: tuple) -> tuple | None:
    key = _dotted(path) or "the file"
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not any(_is(value, t) for t in types):
            says = " or ".join(_SAYS[t] for t in types)
            return path, f"= {value!r}", f"{key} is {says}", f"write {key} as {says}"
    if "enum" in node and value not in node["enum"]:
        allowed = ", ".join(repr(v) for v in node["enum"])
        return path, f"= {value!r}", f"{key} is one of {allowed}", f"write one of {allowed}"
    return None


def _object_violation(value: dict, node: dict, root: dict, path: tuple) -> tuple | None:
    """An unknown key first (a misspelt key is why a needed one is missing), then a missing
    needed key, then the first violation inside a value."""
    props = node.get("properties", {})
    extra = node.get("additionalProperties", True)
    if extra is False:
        for k in value:
            if k not in props:
                return _unknown(k, props, path)
    required = node.get("required", ())
    for k in required:
        if k not in value:
            at = _table(path) if path else "the file"
            under = f" under {at}" if path else ""
            rule = f"{at} needs " + ", ".join(required)
            return path, f"lacks {k!r}", rule, f"add `{k} = ...`{under}"
    for k, v in value.items():
        sub = props.get(k, extra)
        if isinstance(sub, dict):
            bad = _first_violation(v, sub, root, (*path, k))
            if bad is not None:
                return bad
    return None


def _unknown(key: Any, props: dict, path: tuple) -> tuple:
    import difflib

    near = difflib.get_close_matches(str(key), sorted(props), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    known = ", ".join(sorted(props))
    inside = f" in [{_dotted(path)}]" if path else ""
    return path, f"unknown key {key!r}{inside}{hint}", f"keys{inside} are {known}", _RENAME
