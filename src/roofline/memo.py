"""A bounded memo keyed partly on objects by identity.

The fast paths remember answers that are pure functions of immutable inputs (a system, a stack,
a walk, a profile) plus a few plain values. Hashing those records is slower than the work, so
they go by `id()`; the objects are kept in the entry so no other object can take their ids while
it lives, and a hit is checked against them. When the memo reaches its bound it starts afresh
(the callers' working sets are small and repeat: one search, one validate, one fit).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class IdentityMemo:
    """`memo(objs, key, make)`: `make()` once per (the objects in `objs` by identity, `key`).

    `bound`: the most entries kept, or a function giving it (read at each insertion, so a
    module constant stays the one place it is set)."""

    __slots__ = ("_entries", "_bound")

    def __init__(self, bound: int | Callable[[], int]) -> None:
        self._bound = bound
        self._entries: dict[tuple, tuple[tuple, Any]] = {}

    def get(self, objs: tuple, key: Hashable = ()) -> Any | None:
        hit = self._entries.get((tuple(map(id, objs)), key))
        if hit is None:
            return None
        for a, b in zip(hit[0], objs, strict=True):
            if a is not b:
                return None
        return hit[1]

    def put(self, objs: tuple, key: Hashable, value: Any) -> Any:
        bound = self._bound() if callable(self._bound) else self._bound
        if len(self._entries) >= bound:
            self._entries.clear()
        self._entries[(tuple(map(id, objs)), key)] = (objs, value)
        return value

    def __call__(self, objs: tuple, key: Hashable, make: Callable[[], Any]) -> Any:
        hit = self.get(objs, key)
        return hit if hit is not None else self.put(objs, key, make())

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
