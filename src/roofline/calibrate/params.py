"""Between flat parameter vectors (what the fit moves) and profiles (what predictions read)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from roofline.specs.efficiency import OVERHEADS, Efficiency, FamilyPhysics


def prior_of(profile: Efficiency, family: str, names: Iterable[str]) -> dict[str, float]:
    """The profile's current value of each flattened name (family parameters and overheads)."""
    fam = profile.family_named(family).params()
    out = {}
    for n in names:
        if n in OVERHEADS:
            out[n] = float(getattr(profile, n))
        elif n in fam:
            out[n] = fam[n]
        elif n.startswith("mm_fraction."):
            out[n] = profile.family_named(family).mm_ceiling(n.split(".", 1)[1])
        elif n.startswith("link."):
            out[n] = float(profile.link)
        else:
            raise KeyError(f"family {family!r} has no parameter {n!r}")
    return out


def apply_values(profile: Efficiency, family: str, values: Mapping[str, float]) -> Efficiency:
    """`profile` with `family`'s parameters and the profile overheads set from `values`."""
    fam_vals = {k: v for k, v in values.items() if k not in OVERHEADS}
    ovh = {k: float(v) for k, v in values.items() if k in OVERHEADS}
    fam = profile.family_named(family).with_params(fam_vals)
    return replace(profile.with_family(fam), **ovh)


def family_or_default(profile: Efficiency, chip: Any) -> FamilyPhysics:
    """The family covering `chip`, or a new one started from the profile's constants."""
    fam = profile.family_for(chip)
    if fam is not None:
        return fam
    dtypes = {d: float(profile.matmul) for d in chip.peak_flops_per_s}
    return FamilyPhysics(
        family=chip.name,
        match=(chip.name,),
        tile=(16, 16, 16),
        mm_fraction=MappingProxyType(dtypes),
        hbm=float(profile.hbm),
        vector=float(profile.hbm),
        link=MappingProxyType({}),
        wave_units=getattr(chip, "sm_count", None) or os.cpu_count() or 1,
        sources=MappingProxyType(
            {"mm_fraction": f"profile {profile.name!r} constants (no family covered {chip.name})"}
        ),
    )
