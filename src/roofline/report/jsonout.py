"""Versioned JSON output shared by every CLI command (`--json`); the schema is docs/json.md.

Every document has `schema_version`, `command`, `inputs` (the resolved inputs) and the
command's result keys at top level. Bump SCHEMA_VERSION on any breaking change.

Numbers stay numbers: a numeric field is a JSON number or `null`, never a string. Where a
value is missing or not finite (an infinite intensity, an unknown price), the field is `null`
and a sibling string field `<name>_reason` says why. A command may set the reason itself
(`result["usd_per_hour_reason"] = "no public price"`); otherwise the writer adds a generic
one for a non-finite float ("infinite", "not a number"). In a list of numbers a non-finite
entry becomes `null` and the list's sibling `<name>_reason` says which entries.
"""

from __future__ import annotations

import enum
import json
import math
import os
from dataclasses import fields, is_dataclass
from types import MappingProxyType
from typing import Any

SCHEMA_VERSION = "1.1"  # 1.1: non-finite numbers are null with a `<name>_reason` (was "inf")

REASON_SUFFIX = "_reason"


def _nonfinite_reason(x: float) -> str:
    if math.isnan(x):
        return "not a number (the quantity is undefined for these inputs)"
    return f"{'+' if x > 0 else '-'}infinite (the quantity has no finite value for these inputs)"


def _scalar(x: Any) -> Any:
    """numpy scalars and 0-d arrays -> Python scalars; sized arrays -> lists."""
    if hasattr(x, "tolist") and callable(x.tolist) and not isinstance(x, (list, tuple, str)):
        return x.tolist()
    if hasattr(x, "item") and callable(x.item):
        return x.item()
    return x


def _is_bad_float(x: Any) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def _dict(x: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    for k, v in x.items():
        key = str(k)
        v = to_jsonable(v)
        if _is_bad_float(v):
            reasons[key + REASON_SUFFIX] = _nonfinite_reason(v)
            v = None
        elif isinstance(v, list) and any(_is_bad_float(e) for e in v):
            bad = [i for i, e in enumerate(v) if _is_bad_float(e)]
            reasons[key + REASON_SUFFIX] = (
                f"entries {bad[:20]} are null: {_nonfinite_reason(v[bad[0]])}"
            )
            v = [None if _is_bad_float(e) else e for e in v]
        out[key] = v
    for k, r in reasons.items():
        out.setdefault(k, r)  # a reason the command gave wins
    return out


def to_jsonable(x: Any) -> Any:
    """Plain JSON data; non-finite floats inside dicts become null with a sibling reason.

    A bare non-finite float (not inside a dict) is returned as is for the enclosing dict to
    replace; `dumps` refuses any that survive, so invalid JSON (NaN, Infinity) is never written.
    """
    if is_dataclass(x) and not isinstance(x, type):
        if hasattr(x, "to_dict"):
            return to_jsonable(x.to_dict())
        return _dict({f.name: getattr(x, f.name) for f in fields(x)})
    if isinstance(x, (dict, MappingProxyType)):
        return _dict(x)
    if isinstance(x, (list, tuple)):
        return [_list_item(v) for v in x]
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return to_jsonable(_scalar(x)) if hasattr(x, "item") or hasattr(x, "tolist") else x


def _list_item(v: Any) -> Any:
    out = to_jsonable(v)
    # a list nested in a list (a table's rows) cannot carry a sibling reason: null it here
    if isinstance(out, list):
        return [None if _is_bad_float(e) else e for e in out]
    return out


def document(command: str, inputs: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return _dict(
        {
            "schema_version": SCHEMA_VERSION,
            "command": command,
            "inputs": inputs,
            **result,
        }
    )


def dumps(command: str, inputs: dict[str, Any], result: dict[str, Any]) -> str:
    return json.dumps(document(command, inputs, result), indent=2, allow_nan=False)
