"""Profiles (and a calibrated host chip) to TOML in the format `load_profile` reads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from roofline.specs.chip import Chip
from roofline.specs.efficiency import OVERHEADS, PARAMS, Efficiency, FamilyPhysics


def _v(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return repr(float(f"{x:.6g}"))
    if isinstance(x, str):
        return json.dumps(x)  # a TOML basic string
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_v(i) for i in x) + "]"
    if isinstance(x, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_v(v)}" for k, v in x.items()) + " }"
    raise TypeError(type(x))


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _family(fam: FamilyPhysics) -> list[str]:
    lines = [
        f"\n[family.{_key(fam.family)}]",
        f"match = {_v(list(fam.match))}",
        f"tile = {_v(list(fam.tile))}",
    ]
    lines.append(f"mm_fraction = {_v(dict(fam.mm_fraction))}")
    for k in PARAMS:
        if k not in ("mm_fraction", "link"):
            lines.append(f"{k} = {_v(float(getattr(fam, k)))}")
    if fam.link:
        lines.append(f"link = {_v(dict(fam.link))}")
    if fam.wave_units:
        lines.append(f"wave_units = {int(fam.wave_units)}")
    if fam.tile_m_min:
        lines.append(f"tile_m_min = {int(fam.tile_m_min)}")
    if fam.head_dim_tile:
        lines.append(f"head_dim_tile = {int(fam.head_dim_tile)}")
    if fam.sources:
        lines.append(f"[family.{_key(fam.family)}.sources]")
        lines += [f"{_key(k)} = {_v(v)}" for k, v in fam.sources.items()]
    return lines


def profile_to_toml(p: Efficiency, header: str = "") -> str:
    """The TOML text of a profile (families and per-framework overrides included)."""
    lines = [f"# {h}" for h in header.splitlines()] if header else []
    lines += [
        f"name = {_v(p.name)}",
        f"source = {_v(p.source)}",
        f"calibrated = {_v(p.calibrated)}",
    ]
    lines += [f"{k} = {_v(float(getattr(p, k)))}" for k in ("matmul", "hbm", "link", *OVERHEADS)]
    for fam in p.families:
        lines += _family(fam)
    for fw, over in p.frameworks.items():
        lines.append(f"\n[framework.{_key(fw)}]")
        lines += [f"{k} = {_v(v)}" for k, v in over.items() if k != "families"]
        for fam_name, vals in over.get("families", {}).items():
            lines.append(f"[framework.{_key(fw)}.family.{_key(fam_name)}]")
            lines += [f"{_key(k)} = {_v(float(v))}" for k, v in vals.items()]
    return "\n".join(lines) + "\n"


toml_value, toml_key = _v, _key


def chip_to_toml(c: Chip, header: str = "") -> str:
    """A chip file for a chip the catalog does not have (the calibrated host CPU)."""
    lines = [f"# {h}" for h in header.splitlines()] if header else []
    for k in (
        "name",
        "vendor",
        "generation",
        "description",
        "hbm_bytes",
        "hbm_bw_bytes_per_s",
        "sm_count",
    ):
        v = getattr(c, k)
        if v not in (None, ""):
            lines.append(f"{k} = {_v(v)}")
    lines.append("\n[peak_flops_per_s]")
    lines += [f"{d} = {_v(float(v))}" for d, v in c.peak_flops_per_s.items()]
    return "\n".join(lines) + "\n"
