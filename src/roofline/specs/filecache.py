"""Parsed spec files, built once per content: the loaders' cache (issue 21 item 2).

A profile, framework or engine file is parsed and checked into an immutable record; doing that
again for every costed plan was a quarter of `evaluate_plan`'s time. `cached(key, build)` keeps
what `build` returned together with the text of every file it read through `read_toml` here
(a profile's `base` files too), and hands it back while each of those files still holds the
same text. The check re-reads the files (microseconds; no parse), so a file rewritten between
two loads in one process — within the file system's timestamp granularity or not — is parsed
again; errors are raised by the rebuild exactly as an uncached load raises them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

from roofline.errors import RooflineError
from roofline.specs.catalog import parse_toml, read_text_file

T = TypeVar("T")

_MAX_ENTRIES = 256
# key -> (((path, what, text), ...), value)
_CACHE: dict[Hashable, tuple[tuple[tuple[Path, str, str], ...], Any]] = {}
# the files read by each build in progress (innermost last)
_FRAMES: list[list[tuple[Path, str, str]]] = []


def read_toml(path: str | Path, what: str) -> dict:
    """`catalog.read_toml`, recording the file's text for the build in progress."""
    text = read_text_file(path, what)
    if _FRAMES:
        _FRAMES[-1].append((Path(path), what, text))
    return parse_toml(text, path, what)


def _unchanged(files: tuple[tuple[Path, str, str], ...]) -> bool:
    for path, what, text in files:
        try:
            if read_text_file(path, what) != text:
                return False
        except RooflineError:
            return False
    return True


def cached(key: Hashable, build: Callable[[], T]) -> T:
    """`build()`, or the value it returned for `key` while the files it read are unchanged."""
    hit = _CACHE.get(key)
    if hit is not None and _unchanged(hit[0]):
        if _FRAMES:  # a build in progress depends on these files too
            _FRAMES[-1].extend(hit[0])
        return hit[1]
    _FRAMES.append([])
    try:
        value = build()
    finally:
        files = tuple(_FRAMES.pop())
    if _FRAMES:
        _FRAMES[-1].extend(files)
    if len(_CACHE) >= _MAX_ENTRIES:
        _CACHE.clear()
    _CACHE[key] = (files, value)
    return value


def clear() -> None:
    """Forget every parsed file (tests that patch a loader's directory)."""
    _CACHE.clear()


__all__ = ["cached", "clear", "read_toml"]
