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
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from roofline.errors import SpecError, UnknownNameError

DATA_DIR = Path(__file__).parent
PACKAGE_DIR = DATA_DIR.parent  # roofline's own files (catalog, public runs): always readable
_READ_ROOTS: tuple[str, ...] | None = None  # see restrict_reads

MAX_SPEC_FILE_BYTES = 4 * 2**20  # a spec file is a few kB; HF config.json files are < 100 kB
MAX_DATA_FILE_BYTES = 64 * 2**20  # a lengths file or a serve document (~1M requests)
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
        return readable(path) and stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError, TypeError):
        return False


def exists(path: str | Path) -> bool:
    """True if anything exists at `path` (file, directory, device); never raises."""
    try:
        os.stat(path)
        return readable(path)
    except (OSError, ValueError, TypeError):
        return False


def is_dir(path: str | Path) -> bool:
    """True if `path` names an existing directory; never raises (see is_file)."""
    try:
        return readable(path) and stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError, TypeError):
        return False


def restrict_reads(roots: Iterable[str | Path] | None) -> None:
    """From now on, read (and see) user-named files only under `roots` (None: anywhere).

    `roofline ui` calls this in the worker process that runs a request, with the upload
    folder and the --data-dir: a path in a URL then cannot open /etc/passwd, a FIFO or any file
    the user did not hand over. The package's own data (catalog, public runs) stays readable.
    """
    global _READ_ROOTS
    if roots is None:
        _READ_ROOTS = None
        return
    _READ_ROOTS = tuple(os.path.realpath(r) for r in (*roots, PACKAGE_DIR))


def reads_restricted() -> bool:
    return _READ_ROOTS is not None


def readable(path: str | Path) -> bool:
    """False when reads are restricted (restrict_reads) and `path` resolves outside the roots."""
    if _READ_ROOTS is None:
        return True
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError, TypeError):
        return False
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in _READ_ROOTS)


def _outside(what: str, shown: str) -> SpecError:
    return SpecError(
        f"{what} file {shown} is not among the files this server may read",
        rule="roofline ui reads only uploaded files and files inside the folder given to "
        "`roofline ui --data-dir DIR` (never a path a request names elsewhere)",
        fix="upload the file, or start `roofline ui --data-dir DIR` with the file in DIR "
        "and name it relative to DIR",
    )


def read_text_file(path: str | Path, what: str, *, max_bytes: int = MAX_SPEC_FILE_BYTES) -> str:
    """The UTF-8 text of a spec file, or a SpecError saying why it cannot be one.

    Refuses directories, devices and pipes (reading /dev/zero would never end), files over
    `max_bytes` (run files of measured data may pass a larger limit) and, when reads are
    restricted (restrict_reads), any file outside the allowed folders. The check and the read
    use one open descriptor (opened non-blocking), so a file swapped for a FIFO in between
    cannot block, and at most max_bytes + 1 bytes are ever read."""
    return _decode(read_bytes_file(path, what, max_bytes=max_bytes), what, _short(str(path)))


def read_bytes_file(path: str | Path, what: str, *, max_bytes: int = MAX_SPEC_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most max_bytes (see read_text_file)."""
    p = str(path)
    shown = _short(p)
    if not readable(p):
        raise _outside(what, shown)
    fd = _open(p, what, shown)
    try:
        _check_kind(os.fstat(fd), what, shown, max_bytes)
        data = _read_at_most(fd, max_bytes + 1, what, shown)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew after fstat
        raise _too_big(what, shown, f"more than {max_bytes:,}", max_bytes)
    return data


def _open(p: str, what: str, shown: str) -> int:
    try:
        return os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise SpecError(
            f"{what} file {shown} does not exist",
            fix="check the path, or use a catalog name",
        ) from None
    except IsADirectoryError:
        raise _directory(what, shown) from None
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SpecError(
            f"{what} file {shown} cannot be opened ({reason})",
            rule="a spec file is a readable file with a name of ordinary length",
            fix="check the path, or use a catalog name",
        ) from None


def _directory(what: str, shown: str) -> SpecError:
    return SpecError(
        f"{what} file {shown} is a directory",
        rule=f"a {what} file is one file, not a folder",
        fix="give the path of the file inside it",
    )


def _check_kind(st: os.stat_result, what: str, shown: str, max_bytes: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise _directory(what, shown)
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(
            f"{what} file {shown} is not a regular file (a device, pipe or socket)",
            rule=f"a {what} file is a regular file",
            fix="save the data to a file and give its path",
        )
    if st.st_size > max_bytes:
        raise _too_big(what, shown, f"{st.st_size:,}", max_bytes)


def _too_big(what: str, shown: str, size: str, max_bytes: int) -> SpecError:
    return SpecError(
        f"{what} file {shown} has {size} bytes",
        rule=f"a {what} file is at most {max_bytes / 2**20:g} MiB",
        fix=f"check that the path names the {what} file and not another data file",
    )


def _read_at_most(fd: int, limit: int, what: str, shown: str) -> bytes:
    chunks: list[bytes] = []
    got = 0
    try:
        while got < limit:
            b = os.read(fd, min(1 << 20, limit - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
    except OSError as e:
        raise SpecError(
            f"{what} file {shown} cannot be read ({e.strerror or e})",
            fix="check the file's permissions",
        ) from None
    return b"".join(chunks)


def _decode(data: bytes, what: str, shown: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(
            f"{what} file {shown} is not UTF-8 text (byte {e.start} is not)",
            rule=f"{what} files are UTF-8 text",
            fix="save the file as UTF-8 (not UTF-16 or a binary format)",
        ) from None


MAX_NESTING = 100  # brackets or indentation levels: spec and run files nest a few levels


def too_deep(what: str, shown: str) -> SpecError:
    return SpecError(
        f"{what} file {shown} nests too deeply",
        rule=f"a {what} file nests tables and lists a few levels (at most {MAX_NESTING})",
        fix=f"point at the {what} file itself",
    )


def check_nesting(text: str, what: str, path: str | Path) -> None:
    """Refuse text that nests deeper than MAX_NESTING (flow brackets, or block indentation),
    before a parser recurses on it: libyaml's C loader overflows the C stack (a segfault, not
    an exception) on a few thousand `[` or `- - - ...`."""
    depth = deepest = 0
    for c in re.sub(r"[^\[\]{}]", "", text):
        depth = max(depth + (1 if c in "[{" else -1), 0)
        deepest = max(deepest, depth)
    indent = max((len(m) for m in re.findall(r"(?m)^[ \t-]*", text)), default=0)
    if deepest > MAX_NESTING or indent > 4 * MAX_NESTING:
        raise too_deep(what, _short(str(path)))


def too_many_digits(e: BaseException) -> bool:
    """True for Python's int-conversion limit (a number of more than 4,300 digits)."""
    return isinstance(e, ValueError) and "integer string conversion" in str(e)


def huge_number_error(where: str) -> SpecError:
    """One paragraph for a number of thousands of digits (Python refuses to convert it)."""
    return SpecError(
        f"{where} holds a number of more than {sys.get_int_max_str_digits():,} digits",
        rule="every count and size in roofline is far below 10^18 (a physical quantity)",
        fix="correct that number",
    )


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
    except ValueError as e:  # an integer of more than 4,300 digits
        if too_many_digits(e):
            raise huge_number_error(f"{what} file {_short(str(path))}") from None
        raise
    except RecursionError:
        raise too_deep(what, _short(str(path))) from None


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
