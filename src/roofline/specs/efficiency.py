"""Efficiency profiles: the achieved fractions of a chip's peaks.

Peaks come from the chip file; what real kernels and collectives achieve comes from
here, never from a per-run fudge factor. Defaults are documented from the book; the
`calibrate` stage (a later issue) writes a profile measured on the user's own chip,
which `load_efficiency(path)` reads (TOML with the same keys).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from roofline.errors import SpecError
from roofline.specs.catalog import read_toml


@dataclass(frozen=True)
class Efficiency:
    """Fractions (0, 1] of peak: matmul FLOP/s, HBM bandwidth, interconnect bandwidth."""

    name: str
    matmul: float
    hbm: float
    link: float
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("matmul", "hbm", "link"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and 0 < v <= 1):
                raise SpecError(
                    f"efficiency profile {self.name!r}: {f} = {v!r}",
                    rule="efficiencies are fractions in (0, 1]",
                    fix=f"set {f} to e.g. 0.8",
                )


# Book roofline.md: "H100/B200 ~80-85% of peak in practice, TPUs closer to 95%";
# gpus.md: 8xH100 AllReduce reaches ~370 of 450 GB/s (0.82); sharding.md: v5e AllGather ~95% of peak.
DEFAULTS = {
    "google": Efficiency(
        "tpu-default",
        matmul=0.9,
        hbm=0.9,
        link=0.9,
        source="book roofline.md (TPUs ~95% of peak matmul) and sharding.md (ICI AllGather ~95%), rounded down to 0.9",
    ),
    "nvidia": Efficiency(
        "gpu-default",
        matmul=0.8,
        hbm=0.9,
        link=0.8,
        source="book roofline.md (H100/B200 80-85% of peak) and gpus.md (AllReduce ~370/450 GB/s)",
    ),
}
PEAK = Efficiency("peak", 1.0, 1.0, 1.0, "no losses: the book's idealised rooflines")


def default_efficiency(vendor: str) -> Efficiency:
    return DEFAULTS.get(vendor, DEFAULTS["nvidia"])


def load_efficiency(path: str | Path) -> Efficiency:
    raw = read_toml(Path(path), "efficiency profile")
    known = {f.name for f in fields(Efficiency)}
    bad = [k for k in raw if k not in known]
    if bad:
        raise SpecError(
            f"efficiency file {path}: unknown key {bad[0]!r}",
            rule="keys: " + ", ".join(sorted(known)),
            fix="remove or rename the key",
        )
    raw.setdefault("name", Path(path).stem)
    try:
        return Efficiency(**raw)
    except TypeError as e:
        raise SpecError(
            f"efficiency file {path}: {e}",
            rule="matmul, hbm and link are required",
            fix="add the missing keys",
        ) from None
