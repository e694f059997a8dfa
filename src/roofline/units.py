"""Units: SI constants, dtype sizes, parsing of human quantities, and formatting.

Everything inside `roofline` is a float in SI base units with the unit in the name
(`hbm_bw_bytes_per_s`, `step_time_s`). This module is the only place units convert.
GB = 1e9 bytes, GiB = 2**30 bytes; outputs say which one they use.
"""

from __future__ import annotations

import math
import re

from roofline.errors import SpecError

KB, MB, GB, TB, PB = 1e3, 1e6, 1e9, 1e12, 1e15
KiB, MiB, GiB, TiB = 2.0**10, 2.0**20, 2.0**30, 2.0**40
US, MS = 1e-6, 1e-3
HOUR, DAY, YEAR = 3600.0, 86400.0, 365.0 * 86400.0

# Bytes per element as stored in HBM, block-scale overhead included. Book convention: bf16 = 2,
# fp32 = 4, int8/fp8 = 1, int4/fp4 = 0.5 (the plain formats carry no per-block scale).
# Block-scaled formats store one scale per block of values (OCP Microscaling Formats (MX) v1.0
# spec, 2023: MX blocks of 32 with an 8-bit E8M0 scale; NVIDIA NVFP4: blocks of 16 with an FP8
# E4M3 scale, plus one fp32 per tensor, negligible; DeepSeek-V3 report arXiv 2412.19437 §3.3:
# fp8 weights in 128x128 blocks with one fp32 scale each):
#   nvfp4     = 4 bits + 8 bits / 16 values  = 0.5 + 1/16    = 0.5625 B
#   mxfp4     = 4 bits + 8 bits / 32 values  = 0.5 + 1/32    = 0.53125 B
#   mxfp8     = 8 bits + 8 bits / 32 values  = 1 + 1/32      = 1.03125 B
#   fp8_block = 8 bits + 32 bits / (128·128) = 1 + 4/16384   = 1.000244 B (weights)
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "fp4": 0.5,
    "int4": 0.5,
    "nvfp4": 0.5 + 1 / 16,
    "mxfp4": 0.5 + 1 / 32,
    "mxfp8": 1.0 + 1 / 32,
    "fp8_block": 1.0 + 4 / (128 * 128),
}
# The arithmetic a block-scaled format runs at: its element format's tensor-core peak.
_COMPUTE_FORMAT = {"nvfp4": "fp4", "mxfp4": "fp4", "mxfp8": "fp8", "fp8_block": "fp8"}
_DTYPE_ALIASES = {
    "f32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "f16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "f8": "fp8",
    "float8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "i8": "int8",
    "s8": "int8",
    "u8": "int8",
    "i4": "int4",
    "s4": "int4",
    "f4": "fp4",
    "e2m1": "fp4",
    "fp8block": "fp8_block",
    "fp8-block": "fp8_block",
    "fp8_blockwise": "fp8_block",
    "mx-fp4": "mxfp4",
    "mx-fp8": "mxfp8",
}


def parse_dtype(name: str) -> str:
    """Canonical dtype name (`bf16`, `fp32`, `int8`, `nvfp4`, ...) or a SpecError naming the choices."""
    if not isinstance(name, str):
        raise SpecError(
            f"dtype {name!r} is a {type(name).__name__}, not a name",
            rule="dtypes are one of " + ", ".join(DTYPE_BYTES),
            fix="write e.g. bf16, fp32, fp8, int8 or nvfp4",
        )
    key = name.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise SpecError(
            f"unknown dtype {name[:40]!r}",
            rule="dtypes are one of " + ", ".join(DTYPE_BYTES),
            fix="write e.g. bf16, fp32, fp8, int8 or nvfp4",
        )
    return key


def dtype_bytes(name: str) -> float:
    """Bytes per element in memory, block scales included (nvfp4: 0.5625)."""
    return DTYPE_BYTES[parse_dtype(name)]


def compute_format(name: str) -> str:
    """The element format whose peak a dtype computes at: nvfp4/mxfp4 -> fp4, mxfp8/fp8_block -> fp8."""
    d = parse_dtype(name)
    return _COMPUTE_FORMAT.get(d, d)


def block_scale_overhead(name: str) -> float:
    """Scale bytes per element of a block-scaled dtype (nvfp4: 1/16 B); 0 for plain formats."""
    d = parse_dtype(name)
    return DTYPE_BYTES[d] - DTYPE_BYTES[_COMPUTE_FORMAT.get(d, d)]


_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_BIN_SUFFIX = {"ki": KiB, "mi": MiB, "gi": GiB, "ti": TiB}


def parse_quantity(text: str | float | int, *, what: str = "value") -> float:
    """Parse '15T', '4M', '4Mi', '2.5e6', '1_000' into a float (decimal suffixes unless 'i')."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).strip().replace("_", "").replace(",", "")
        m = re.fullmatch(r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]{0,2})", s)
        if not m:
            raise SpecError(
                f"cannot read {what} {text!r}",
                rule="a number with an optional suffix k, M, B/G, T, P (decimal) or Ki, Mi, Gi, Ti (binary)",
                fix=f"write e.g. {what}=15T or {what}=4e6",
            )
        num, suf = float(m.group(1)), m.group(2).lower()
        if suf in _BIN_SUFFIX:
            value = num * _BIN_SUFFIX[suf]
        elif suf in _SUFFIX:
            value = num * _SUFFIX[suf]
        else:
            raise SpecError(
                f"unknown suffix {m.group(2)!r} in {what} {text!r}",
                rule="suffixes are k, M, B/G, T, P or Ki, Mi, Gi, Ti",
                fix=f"write e.g. {what}=15T",
            )
    if not math.isfinite(value):
        raise SpecError(
            f"{what} is {value}", rule="values must be finite numbers", fix="give a finite number"
        )
    return value


def _fmt(value: float, unit: str, base: float, prefixes: tuple[str, ...]) -> str:
    if value == 0 or not math.isfinite(value):
        return f"{value:g} {unit}"
    exp = min(max(int(math.floor(math.log(abs(value), base))), 0), len(prefixes) - 1)
    return f"{value / base**exp:.3g} {prefixes[exp]}{unit}"


def fmt_bytes(n: float, binary: bool = False) -> str:
    """1.23 GB (decimal) or 1.15 GiB (binary=True)."""
    if binary:
        return _fmt(n, "B", 1024.0, ("", "Ki", "Mi", "Gi", "Ti", "Pi"))
    return _fmt(n, "B", 1000.0, ("", "k", "M", "G", "T", "P", "E"))


def fmt_flops(n: float) -> str:
    return _fmt(n, "FLOP", 1000.0, ("", "k", "M", "G", "T", "P", "E", "Z", "Y"))


def fmt_rate(n: float, unit: str = "FLOP/s") -> str:
    return _fmt(n, unit, 1000.0, ("", "k", "M", "G", "T", "P", "E", "Z"))


def fmt_count(n: float) -> str:
    return _fmt(n, "", 1000.0, ("", "k", "M", "B", "T", "P")).strip()


def fmt_time(seconds: float) -> str:
    """Human time: ns/µs/ms/s/min/h/days."""
    s = float(seconds)
    if not math.isfinite(s):
        return str(s)
    a = abs(s)
    if a < 1e-6:
        return f"{s * 1e9:.3g} ns"
    if a < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if a < 1:
        return f"{s * 1e3:.3g} ms"
    if a < 120:
        return f"{s:.3g} s"
    if a < 7200:
        return f"{s / 60:.3g} min"
    if a < 2 * DAY:
        return f"{s / HOUR:.3g} h"
    return f"{s / DAY:.3g} days"


def fmt_usd(x: float) -> str:
    if abs(x) >= 1e6:
        return f"${x / 1e6:,.3g}M"
    return f"${x:,.0f}" if abs(x) >= 100 else f"${x:,.2f}"
