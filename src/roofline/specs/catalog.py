"""Name lookup and file reading for the data catalogs, and the typed field checks they share.

Every input file (chip, model, system, efficiency TOML; HF config.json) is read through
`read_text_file`, so a directory, a device, a file too large to be a spec, undecodable bytes
or an over-long path all give one paragraph (what, rule, fix) instead of an OSError. The
`check_*` helpers type- and range-check one field of a parsed file before any arithmetic.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from roofline.errors import SpecError, UnknownNameError

DATA_DIR = Path(__file__).parent

MAX_SPEC_FILE_BYTES = 4 * 2**20  # a spec file is a few kB; HF config.json files are < 100 kB
MAX_NAME_CHARS = 256  # catalog names and aliases are short; longer input is a mistake


def normalize(name: str) -> str:
    """'meta-llama/Meta-Llama-3-70B' -> 'metallama370b'; case, '-', '_', '.', ' ' ignored."""
    s = str(name).strip().lower()
    s = s.rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9]", "", s)


def _short(text: object, n: int = 80) -> str:
    """repr() of a value, cut to about n characters (a 5000-character name stays readable)."""
    r = repr(text)
    return r if len(r) <= n else r[: n - 5] + "...'" + f" ({len(str(text))} characters)"


def is_file(path: str | Path) -> bool:
    """True if `path` names an existing regular file; False for anything unusable as one.

    Unlike Path.is_file this never raises: an over-long name (ENAMETOOLONG), an embedded NUL,
    a permission problem are all 'not a file'.
    """
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError, TypeError):
        return False


def exists(path: str | Path) -> bool:
    """True if anything exists at `path` (file, directory, device); never raises."""
    try:
        os.stat(path)
        return True
    except (OSError, ValueError, TypeError):
        return False


def is_dir(path: str | Path) -> bool:
    """True if `path` names an existing directory; never raises (see is_file)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError, TypeError):
        return False


def read_text_file(path: str | Path, what: str, *, max_bytes: int = MAX_SPEC_FILE_BYTES) -> str:
    """The UTF-8 text of a spec file, or a SpecError saying why it cannot be one.

    Refuses directories, devices and pipes (reading /dev/zero would never end) and files over
    `max_bytes` (run files of measured data may pass a larger limit)."""
    p = str(path)
    shown = _short(p)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise SpecError(
            f"{what} file {shown} does not exist",
            fix="check the path, or use a catalog name",
        ) from None
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SpecError(
            f"{what} file {shown} cannot be opened ({reason})",
            rule="a spec file is a readable file with a name of ordinary length",
            fix="check the path, or use a catalog name",
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError(
            f"{what} file {shown} is a directory",
            rule=f"a {what} file is one file, not a folder",
            fix="give the path of the file inside it",
        )
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(
            f"{what} file {shown} is not a regular file (a device, pipe or socket)",
            rule=f"a {what} file is a regular file",
            fix="save the spec to a file and give its path",
        )
    if st.st_size > max_bytes:
        raise SpecError(
            f"{what} file {shown} has {st.st_size:,} bytes",
            rule=f"a {what} file is at most {max_bytes / 2**20:g} MiB",
            fix="check that the path names the spec file and not a data file",
        )
    try:
        data = Path(p).read_bytes()
    except OSError as e:
        raise SpecError(
            f"{what} file {shown} cannot be read ({e.strerror or e})",
            fix="check the file's permissions",
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(
            f"{what} file {shown} is not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r})",
            rule="spec files are UTF-8 text",
            fix="save the file as UTF-8 (not UTF-16 or a binary format)",
        ) from None


def read_toml(path: str | Path, what: str) -> dict:
    """A parsed TOML table from a spec file (see read_text_file for what can go wrong)."""
    return parse_toml(read_text_file(path, what), path, what)


def parse_toml(text: str, path: str | Path, what: str) -> dict:
    """The TOML table of a spec file's text (`path` and `what` name it in the error)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(
            f"{what} file {_short(str(path))} is not valid TOML ({e})",
            rule="data files are TOML",
            fix="fix the syntax at the line named",
        ) from None


def check_name_length(name: str, what: str) -> None:
    if len(name) > MAX_NAME_CHARS:
        raise SpecError(
            f"{what} name {_short(name)} is too long",
            rule=f"a {what} is a catalog name (at most {MAX_NAME_CHARS} characters) or a path to a file",
            fix=f"run `roofline {what}s` for the names, or give the path of an existing file",
        )


def resolve(name: str, entries: dict[str, Iterable[str]], what: str) -> str:
    """Return the canonical key of `entries` ({key: aliases}) that `name` names.

    Matching ignores case and punctuation and a leading 'org/' and 'meta-' style prefix.
    """
    if not isinstance(name, str):
        raise SpecError(
            f"{what} {_short(name)} is a {type(name).__name__}",
            rule=f"a {what} is a catalog name or a path to a file (a string)",
            fix=f"pass the {what}'s name as a string, e.g. run `roofline {what}s` for the list",
        )
    check_name_length(name, what)
    want = normalize(name)
    table: dict[str, str] = {}
    for key, aliases in entries.items():
        for a in (key, *aliases):
            table[normalize(a)] = key
    if want in table:
        return table[want]
    for prefix in ("meta", "google", "nvidia", "amd", "tpu"):
        if want.startswith(prefix) and want[len(prefix) :] in table:
            return table[want[len(prefix) :]]
    close = difflib.get_close_matches(want, list(table), n=4, cutoff=0.5)
    names = sorted({table[c] for c in close})
    hint = ("closest: " + ", ".join(names)) if names else "none is close"
    raise UnknownNameError(
        f"unknown {what} {_short(name)} ({hint})",
        rule=f"a {what} is a catalog name or a path to a TOML file",
        fix=f"run `roofline {what}s` for the list" + (f", e.g. {names[0]}" if names else ""),
    )


# -- typed field checks (one paragraph per bad value, before any arithmetic) ---------------------


def _bad(where: str, key: str, v: Any, rule: str, fix: str | None = None) -> SpecError:
    return SpecError(
        f"{where}: {key} = {_short(v)}" + ("" if _plain(v) else f" (a {_type_name(v)})"),
        rule=rule,
        fix=fix or f"correct {key}",
    )


def _plain(v: Any) -> bool:
    return isinstance(v, (int, float, str)) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    return {
        list: "list",
        dict: "table",
        bool: "boolean",
        str: "string",
        float: "float",
        int: "integer",
    }.get(type(v), type(v).__name__)


def check_str(where: str, key: str, v: Any, *, max_chars: int = 4096) -> str:
    if not isinstance(v, str):
        raise _bad(where, key, v, f"{key} is a string", f'write {key} = "..." (quoted)')
    if len(v) > max_chars:
        raise _bad(where, key, v, f"{key} has at most {max_chars} characters")
    return v


def check_str_list(where: str, key: str, v: Any, *, max_items: int = 256) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
        raise _bad(
            where, key, v, f"{key} is a list of strings", f'write {key} = ["name1", "name2"]'
        )
    if len(v) > max_items:
        raise _bad(where, key, v, f"{key} has at most {max_items} entries")
    for a in v:
        check_name_length(a, key)
    return tuple(v)


def check_bool(where: str, key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _bad(where, key, v, f"{key} is true or false", f"write {key} = true or {key} = false")
    return v


def check_int(where: str, key: str, v: Any, lo: int = 1, hi: int | None = None) -> int:
    """An integer in [lo, hi]; a float with an integral value (8.0) is an error too (TOML typo)."""
    span = f">= {lo}" if hi is None else f"in [{lo}, {hi:,}]"
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(
            where,
            key,
            v,
            f"{key} is a whole number {span}",
            f"write {key} as a whole number without quotes or a decimal point, e.g. {key} = {max(lo, 1)}",
        )
    if v < lo or (hi is not None and v > hi):
        why = " (larger is not a physical size)" if hi is not None and v > hi else ""
        raise _bad(where, key, v, f"{key} is a whole number {span}{why}")
    return v


def check_number(
    where: str,
    key: str,
    v: Any,
    *,
    lo: float = 0.0,
    hi: float | None = None,
    lo_open: bool = True,
) -> float:
    """A finite real number with lo < v (or lo <= v if not lo_open) and v <= hi."""
    op = ">" if lo_open else ">="
    span = f"{op} {lo:g}" + ("" if hi is None else f" and <= {hi:g}")
    rule = f"{key} is a finite number {span}"
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise _bad(where, key, v, rule, f"write {key} as a number without quotes, e.g. {key} = 1e9")
    x = float(v) + 0.0  # -0.0 -> 0.0 (a price of "-0.00" reads as negative)
    if not math.isfinite(x) or (x <= lo if lo_open else x < lo) or (hi is not None and x > hi):
        raise _bad(where, key, v, rule)
    return x
