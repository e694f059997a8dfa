"""Versioned JSON output shared by every CLI command (`--json`).

Every document has `schema_version`, `command`, `inputs` (the resolved inputs) and the
command's result keys at top level. Bump SCHEMA_VERSION on any breaking change.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import fields, is_dataclass
from types import MappingProxyType
from typing import Any

SCHEMA_VERSION = "1.0"


def to_jsonable(x: Any) -> Any:
    if is_dataclass(x) and not isinstance(x, type):
        if hasattr(x, "to_dict"):
            return to_jsonable(x.to_dict())
        return {f.name: to_jsonable(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, (dict, MappingProxyType)):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, enum.Enum):
        return x.value
    if hasattr(x, "item") and callable(x.item):  # numpy scalar
        return to_jsonable(x.item())
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def document(command: str, inputs: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "inputs": to_jsonable(inputs),
        **to_jsonable(result),
    }


def dumps(command: str, inputs: dict[str, Any], result: dict[str, Any]) -> str:
    return json.dumps(document(command, inputs, result), indent=2)
