"""Efficiency profiles: the achieved fractions of a chip's peaks, as physics with sources.

Peaks come from the chip file (per dtype); what real kernels and collectives achieve comes
from a profile, never from a per-run fudge factor. A profile answers, vectorised over numpy
arrays:

- `matmul_fraction(chip, dtype, m, n, k, grouped=False)`: the fraction of `chip.peak(dtype)`
  a GEMM of per-chip shape (m, n, k) reaches: the large-GEMM ceiling of the chip family and
  dtype, times tile quantisation (the output is computed in whole tiles), wave quantisation
  (tiles are spread over the SMs / TensorCores in whole waves), small-dimension roll-off
  (fixed per-tile cost, Hockney's half-performance length) and, for expert GEMMs (m = the
  mean tokens per expert), the partial token tiles of every expert's own count (Poisson around
  the mean, `expected_tiles`) and a grouped-GEMM factor. A fixed time per kernel launch is
  separate: `kernel_overhead_s(chip)`.
- `attention_fraction(chip, dtype, backward, head_dim, causal)`: flash attention's matmul
  FLOPs over time, with the softmax's non-matmul work per score element as a fixed cost.
- `hbm_fraction(chip)`, `vector_fraction(chip)` (memory-bound elementwise / norm kernels, as
  a fraction of HBM bandwidth), `link_fraction(chip, tier)` for tier in `TIERS`.
- `kernel_overhead_s(chip)`: fixed seconds per kernel launch, whatever bounds the kernel.
- `step_overhead_s`, `layer_overhead_s` (per layer per microbatch pass), `name`, `source`,
  `calibrated` (measured-calibrated vs datasheet-only).

A *constant* profile (`Efficiency(name, matmul, hbm, link, source)`, e.g. `PEAK` or the
vendor `DEFAULTS`) has no chip families: every method returns its constants. A *physics*
profile carries one `FamilyPhysics` per chip family (matched by chip name, alias or
generation) and falls back to its constants for chips no family matches. Named profiles
live in `specs/profiles/*.toml` (`load_profile`); `calibrate` writes the same format.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from roofline.errors import SpecError, UnknownNameError
from roofline.specs.catalog import (
    DATA_DIR,
    check_name_length,
    is_file,
    normalize,
    resolve,
)
from roofline.specs.filecache import cached
from roofline.specs.filecache import read_toml as stamped_toml
from roofline.specs.schema import check as check_schema
from roofline.units import parse_dtype

PROFILE_DIR = DATA_DIR / "profiles"
TIERS = ("ici", "nvlink", "scale_out", "dcn")

# A dtype without its own large-GEMM fraction uses the next one along this chain.
_DTYPE_FALLBACK = {
    "fp16": "bf16",
    "tf32": "bf16",
    "fp32": "bf16",
    "int8": "fp8",
    "fp8": "bf16",
    "fp4": "fp8",
    "int4": "int8",
    # block-scaled formats compute at their element format
    "nvfp4": "fp4",
    "mxfp4": "fp4",
    "mxfp8": "fp8",
    "fp8_block": "fp8",
}

# Matmul FLOPs per attention score element (book transformers.md; FlashAttention-2 §3.1):
# forward QK^T and PV = 2 * 2 * head_dim; backward recomputes QK^T and forms dV, dP, dQ, dK = 5 * 2 * head_dim.
_ATTN_MM_FLOPS_PER_SCORE = {False: 4.0, True: 10.0}
# The share of those FLOPs whose contraction runs over head_dim: QK^T (forward); the recomputed
# QK^T and dP = dO·V^T (backward). The others contract over a sequence block.
_ATTN_HD_CONTRACTION = {False: 2.0 / 4.0, True: 4.0 / 10.0}


@dataclass(frozen=True)
class Param:
    """One fittable physical parameter: its bounds, unit and meaning."""

    lo: float
    hi: float
    unit: str
    meaning: str


# The physical parameters of one chip family. Keys with a ".dtype" / ".tier" suffix are families of
# parameters (`mm_fraction.bf16`, `link.nvlink`); `bounds_of` resolves them.
PARAMS: dict[str, Param] = {
    "mm_fraction": Param(
        0.2,
        1.0,
        "fraction",
        "large, well-shaped GEMM throughput over the dtype's dense peak (clocks under power, issue overhead)",
    ),
    "m_half": Param(
        0.0, 4096.0, "elements", "half-performance length of the GEMM's m (rows streamed per tile)"
    ),
    "n_half": Param(0.0, 4096.0, "elements", "half-performance length of the GEMM's n"),
    "k_half": Param(
        0.0, 4096.0, "elements", "per-tile prologue/epilogue cost in elements of the k loop"
    ),
    "kernel_fixed_s": Param(0.0, 50e-6, "s", "fixed time per kernel launch (ramp-up and tail)"),
    "grouped_fraction": Param(
        0.2, 1.0, "fraction", "grouped expert GEMM throughput over a dense GEMM of the same shape"
    ),
    "expert_fixed_s": Param(
        0.0,
        2e-6,
        "s",
        "fixed memory-side time per routed expert a grouped expert GEMM touches (weight stream start)",
    ),
    "w4_moe_fixed_s": Param(
        0.0,
        2e-4,
        "s",
        "fixed time per MoE layer pass of an engine's 4-bit-expert MoE path beyond the walked rows "
        "(routing sort, ragged metadata, gather/scatter kernels)",
    ),
    "mla_decode": Param(
        0.1,
        1.0,
        "fraction",
        "achieved bandwidth of the engine's MLA decode attention kernel (absorbed, latent cache "
        "read) over the family's hbm copy bandwidth, at tensor-parallel head counts",
    ),
    "attn_fwd": Param(
        0.2, 1.0, "fraction", "flash-attention forward matmul efficiency at infinite head dim"
    ),
    "attn_bwd": Param(
        0.2, 1.0, "fraction", "flash-attention backward matmul efficiency at infinite head dim"
    ),
    "attn_softmax_flops": Param(
        0.0,
        2048.0,
        "matmul FLOP per score",
        "softmax work (exp, max, rescale) per score element not hidden under the matmuls, in matmul-FLOP time",
    ),
    "attn_causal": Param(
        0.3,
        1.0,
        "fraction",
        "causal kernel efficiency relative to full (masked diagonal blocks, imbalance)",
    ),
    "hbm": Param(0.3, 1.0, "fraction", "achieved HBM copy bandwidth over peak"),
    "vector": Param(
        0.1,
        1.0,
        "fraction",
        "memory-bound elementwise/norm kernel bandwidth over peak HBM bandwidth",
    ),
    "link": Param(0.2, 1.0, "fraction", "achieved collective bandwidth over the link tier's peak"),
}
OVERHEADS: dict[str, Param] = {
    "step_overhead_s": Param(
        0.0, 10.0, "s", "fixed time per training step (optimizer launch, data, logging)"
    ),
    "layer_overhead_s": Param(
        0.0, 10e-3, "s", "fixed time per layer per microbatch pass (launches, syncs)"
    ),
    # no published number: fitted only by `roofline calibrate --from-runs serving`
    # (docs/calibration.md has its cross-validated error)
    "disagg_handoff_s": Param(
        0.0,
        2.0,
        "s",
        "latency added to every disaggregated request's time to first token: the hand-off "
        "router -> prefill worker -> KV-ready notification -> the decode worker's first step "
        "(pure latency: it holds no prefill or decode capacity)",
    ),
    # no published number either (candidate causes in specs/engines/{sglang,vllm,trtllm}.toml):
    # set per engine under [framework.ENGINE] by `calibrate --from-runs serving`, and on the
    # profile itself as the prior an engine without its own value falls back to
    "request_latency_s": Param(
        0.0,
        0.5,
        "s",
        "latency every aggregated request pays outside any pass (API server, tokenisation, "
        "the scheduler's admission, detokenisation, first token back to the client), on top "
        "of the engine file's own value",
    ),
}


def bounds_of(key: str) -> Param:
    """The Param of a flattened key: 'mm_fraction.fp8' -> PARAMS['mm_fraction']."""
    base = key.split(".", 1)[0]
    if base in PARAMS:
        return PARAMS[base]
    if base in OVERHEADS:
        return OVERHEADS[base]
    raise SpecError(
        f"unknown efficiency parameter {key!r}",
        rule="parameters: " + ", ".join([*PARAMS, *OVERHEADS]),
        fix="use one of those names (dtype or tier after a dot: mm_fraction.fp8, link.nvlink)",
    )


def _check(where: str, key: str, v: Any) -> float:
    p = bounds_of(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or not (p.lo <= v <= p.hi) or (p.unit == "fraction" and v <= 0):
        raise SpecError(
            f"{where}: {key} = {v!r}",
            rule=f"{key} is {p.meaning}, a number in [{p.lo:g}, {p.hi:g}] {p.unit}",
            fix=f"set {key} within those bounds",
        )
    return float(v)


@dataclass(frozen=True)
class FamilyPhysics:
    """The efficiency physics of one chip family (every number has a meaning in PARAMS)."""

    family: str
    match: tuple[str, ...]  # chip names, aliases or generations this family covers
    tile: tuple[int, int, int]  # output tile (m, n) and k step of the family's GEMM kernels
    mm_fraction: Mapping[str, float]  # dtype -> large-GEMM fraction of that dtype's peak
    m_half: float = 0.0
    n_half: float = 0.0
    k_half: float = 0.0
    kernel_fixed_s: float = 0.0
    grouped_fraction: float = 1.0
    expert_fixed_s: float = 0.0
    w4_moe_fixed_s: float = 0.0
    mla_decode: float = 1.0
    attn_fwd: float = 1.0
    attn_bwd: float = 1.0
    attn_softmax_flops: float = 0.0
    attn_causal: float = 1.0
    hbm: float = 1.0
    vector: float = 1.0
    link: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    wave_units: int | None = None  # None: the chip's sm_count (GPU) or cores_per_chip (TPU)
    # the smallest token tile a GEMM library picks for small m (None: tile[0]); see _shape_factor
    tile_m_min: int | None = None
    # the side a flash-attention kernel's head_dim is padded to: a TPU's systolic MXU (book
    # tpus.md: operands padded to 128, 256 on v6e, in every dimension); None on GPUs, whose
    # tensor-core instructions tile head_dim in steps of 8-16 (see `_head_dim_fill`)
    head_dim_tile: int | None = None
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    _keys: frozenset = field(init=False, repr=False, compare=False, default=frozenset())

    def params(self) -> dict[str, float]:
        """Flattened fittable parameters: {'mm_fraction.bf16': 0.78, 'k_half': 128, 'link.nvlink': .8, ...}."""
        out = {f"mm_fraction.{d}": v for d, v in self.mm_fraction.items()}
        for k in PARAMS:
            if k not in ("mm_fraction", "link"):
                out[k] = float(getattr(self, k))
        out.update({f"link.{t}": v for t, v in self.link.items()})
        return out

    def with_params(self, values: Mapping[str, float]) -> FamilyPhysics:
        """A copy with some flattened parameters replaced (bounds checked)."""
        mm, link, plain = dict(self.mm_fraction), dict(self.link), {}
        for key, v in values.items():
            v = _check(f"family {self.family!r}", key, v)
            base, _, sub = key.partition(".")
            if base == "mm_fraction":
                mm[parse_dtype(sub)] = v
            elif base == "link":
                link[_tier(sub)] = v
            elif base in OVERHEADS:
                raise SpecError(
                    f"family {self.family!r}: {key} is a profile-level overhead",
                    fix="set it on the profile, not on a chip family",
                )
            else:
                plain[base] = v
        return replace(self, mm_fraction=MappingProxyType(mm), link=MappingProxyType(link), **plain)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_keys", frozenset(normalize(m) for m in self.match))

    def __hash__(self) -> int:  # mappings hashed by content, so profiles can key caches
        return hash(
            (
                self.family,
                self.match,
                self.tile,
                self.tile_m_min,
                self.head_dim_tile,
                tuple(sorted(self.params().items())),
            )
        )

    def covers(self, chip: Any) -> bool:
        keys = _chip_keys(
            chip.name, getattr(chip, "generation", ""), tuple(getattr(chip, "aliases", ()))
        )
        return not self._keys.isdisjoint(keys)

    def mm_ceiling(self, dtype: str) -> float:
        d, seen = parse_dtype(dtype), set()
        while d not in self.mm_fraction:
            seen.add(d)
            d = _DTYPE_FALLBACK.get(d, "bf16")
            if d in seen:
                return max(self.mm_fraction.values())
        return float(self.mm_fraction[d])


# Per-profile lookup memos live beside the records, not in them: a profile stays a plain
# frozen record (`replace`, `__dict__` round trips and equality see only its fields).
_MEMOS: dict[tuple[int, str], dict] = {}


def _memo(obj: Any, name: str) -> dict:
    """The memo `name` of `obj`, dropped when `obj` is collected."""
    key = (id(obj), name)
    memo = _MEMOS.get(key)
    if memo is None:
        memo = _MEMOS[key] = {}
        weakref.finalize(obj, _MEMOS.pop, key, None)
    return memo


@dataclass(frozen=True)
class Efficiency:
    """An efficiency profile. `Efficiency(name, matmul, hbm, link, source)` is a constant one.

    `matmul`, `hbm` and `link` are the constants for chips no family covers (and, for a
    constant profile, for every chip). `families` holds the per-chip-family physics;
    `frameworks` holds per-framework overrides fitted on measured runs (see `for_framework`).
    """

    name: str
    matmul: float
    hbm: float
    link: float
    source: str = ""
    calibrated: bool = False
    step_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    disagg_handoff_s: float = 0.0  # seconds per disaggregated request (see OVERHEADS)
    request_latency_s: float = 0.0  # seconds per aggregated request (see OVERHEADS)
    families: tuple[FamilyPhysics, ...] = ()
    frameworks: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    framework: str = ""  # the framework whose overrides are applied ("" = none)
    # how a measured-calibrated profile was made (date, command, runs file and its sha256,
    # the fitted parameters, the cross-validated error): the file's [provenance] table
    provenance: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __hash__(self) -> int:
        plain = (self.name, self.matmul, self.hbm, self.link, self.source, self.calibrated)
        ovh = (self.step_overhead_s, self.layer_overhead_s, self.disagg_handoff_s, self.framework)
        return hash(
            (*plain, *ovh, self.request_latency_s, self.families, tuple(sorted(self.frameworks)))
        )

    def __post_init__(self) -> None:
        for f in ("matmul", "hbm", "link"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
                raise SpecError(
                    f"efficiency profile {self.name!r}: {f} = {v!r}",
                    rule="efficiencies are fractions in (0, 1]",
                    fix=f"set {f} to e.g. 0.8",
                )
        for f in OVERHEADS:
            _check(f"efficiency profile {self.name!r}", f, getattr(self, f))

    # -- lookup --------------------------------------------------------------------
    def family_for(self, chip: Any) -> FamilyPhysics | None:
        """The family physics that covers `chip`, or None (the profile's constants apply);
        looked up once per chip name (the walk asks for every op)."""
        key = (chip.name, getattr(chip, "generation", ""), tuple(getattr(chip, "aliases", ())))
        memo = _memo(self, "family")
        if key not in memo:
            memo[key] = next((fam for fam in self.families if fam.covers(chip)), None)
        return memo[key]

    def family_named(self, family: str) -> FamilyPhysics:
        for fam in self.families:
            if normalize(fam.family) == normalize(family):
                return fam
        raise SpecError(
            f"efficiency profile {self.name!r} has no chip family {family!r}",
            rule="families: "
            + (", ".join(f.family for f in self.families) or "none (constant profile)"),
            fix="name one of those families",
        )

    # -- the contract ----------------------------------------------------------------
    def matmul_fraction(
        self, chip: Any, dtype: str, m: Any, n: Any, k: Any, grouped: Any = False
    ) -> np.ndarray:
        """Fraction of `chip.peak(dtype)` a GEMM of per-chip shape (m, n, k) reaches (array)."""
        m, n, k, grouped = np.broadcast_arrays(
            np.asarray(m, float),
            np.asarray(n, float),
            np.asarray(k, float),
            np.asarray(grouped, bool),
        )
        fam = self.family_for(chip)
        if fam is None:
            return np.full(m.shape, float(self.matmul))
        eta = fam.mm_ceiling(dtype) * _shape_factor(fam, chip, dtype, m, n, k)
        if np.any(grouped):
            eta = np.where(grouped, eta * _routed_tile_factor(fam, m), eta)
        return np.where(grouped, eta * fam.grouped_fraction, eta)

    def _family_value(self, chip: Any, name: str, default: float) -> float:
        """A family field of `chip`'s family as a float; `default` for a chip no family covers."""
        fam = self.family_for(chip)
        return default if fam is None else float(getattr(fam, name))

    def kernel_overhead_s(self, chip: Any) -> float:
        """Fixed seconds per kernel launch (ramp-up and tail), added once per kernel whatever
        bounds it: a GEMM, a grouped expert GEMM (one launch for all experts), an attention or
        an elementwise kernel. Not inside the fractions, so a memory-bound kernel pays it too."""
        return self._family_value(chip, "kernel_fixed_s", 0.0)

    def attention_fraction(
        self, chip: Any, dtype: str, backward: Any, head_dim: Any, causal: Any
    ) -> np.ndarray:
        """Fraction of `chip.peak(dtype)` flash attention's matmul FLOPs reach (array)."""
        bwd, hd, cz = np.broadcast_arrays(
            np.asarray(backward, bool), np.asarray(head_dim, float), np.asarray(causal, bool)
        )
        fam = self.family_for(chip)
        if fam is None:
            return np.full(hd.shape, float(self.matmul))
        mm = np.where(bwd, _ATTN_MM_FLOPS_PER_SCORE[True], _ATTN_MM_FLOPS_PER_SCORE[False]) * hd
        # FlashAttention-3 §3: the softmax's exponentials run on the slow special-function units;
        # what is not hidden under the matmuls costs attn_softmax_flops per score element.
        eta = np.where(bwd, fam.attn_bwd, fam.attn_fwd) * mm / (mm + fam.attn_softmax_flops)
        eta = np.where(cz, eta * fam.attn_causal, eta)
        return eta * _dtype_ratio(fam, dtype) * _head_dim_fill(fam, hd, bwd)

    def hbm_fraction(self, chip: Any) -> float:
        fam = self.family_for(chip)
        return float(self.hbm if fam is None else fam.hbm)

    def expert_overhead_s(self, chip: Any) -> float:
        """Fixed seconds per routed expert a grouped expert GEMM touches, on the memory side (each
        touched expert's weight stream starts cold; datasheet.toml derives it from fused-MoE
        kernel times at decode). Hidden under the compute of a compute-bound grouped GEMM."""
        return self._family_value(chip, "expert_fixed_s", 0.0)

    def w4_moe_overhead_s(self, chip: Any) -> float:
        """Fixed seconds per MoE layer pass an engine's 4-bit-expert MoE path spends beyond the
        walked rows (datasheet.toml [framework.trtllm]: TensorRT-LLM's Triton MoE backend on
        Hopper, its routing and ragged-metadata kernels). 0 unless a profile sets it."""
        return self._family_value(chip, "w4_moe_fixed_s", 0.0)

    def mla_decode_fraction(self, chip: Any) -> float:
        """The engine's MLA decode kernel's achieved latent-cache bandwidth over the family's
        hbm copy bandwidth (1 where no kernel number is listed: it reads at the hbm rate);
        datasheet.toml's per-engine entries hold the published kernel timings it comes from."""
        return self._family_value(chip, "mla_decode", 1.0)

    def vector_fraction(self, chip: Any) -> float:
        """Fraction of HBM bandwidth memory-bound elementwise / norm kernels reach."""
        fam = self.family_for(chip)
        return float(self.hbm if fam is None else fam.vector)

    def link_fraction(self, chip: Any, tier: str) -> float:
        t = _tier(tier)
        fam = self.family_for(chip)
        if fam is None:
            return float(self.link)
        return float(fam.link.get(t, self.link))

    # -- derived profiles --------------------------------------------------------------
    def for_framework(self, framework: str | None) -> Efficiency:
        """This profile with the overrides fitted for `framework` applied (itself if none);
        built once per framework name."""
        if not framework or self.framework == framework:
            return self
        over = self.frameworks.get(framework)
        if over is None:
            return self
        memo = _memo(self, "framework")
        if framework not in memo:
            memo[framework] = self._with_overrides(framework, over)
        return memo[framework]

    def _with_overrides(self, framework: str, over: Mapping[str, Any]) -> Efficiency:
        fams = []
        for fam in self.families:
            vals = over.get("families", {}).get(fam.family)
            fams.append(fam.with_params(vals) if vals else fam)
        ovh = {k: over[k] for k in OVERHEADS if k in over}
        return replace(
            self,
            families=tuple(fams),
            framework=framework,
            calibrated=bool(over.get("calibrated", self.calibrated)),
            **ovh,
        )

    def for_chip(self, chip: Any, dtype: str = "bf16") -> Efficiency:
        """A constant profile with this one's large-GEMM, HBM and fastest-link fractions on `chip`
        (for callers that still read `.matmul/.hbm/.link`)."""
        fam = self.family_for(chip)
        if fam is None:
            return self
        tier = "ici" if getattr(chip, "vendor", "") == "google" else "nvlink"
        return replace(
            self,
            matmul=fam.mm_ceiling(dtype),
            hbm=fam.hbm,
            link=self.link_fraction(chip, tier),
            families=(),
            frameworks=MappingProxyType({}),
        )

    def with_family(self, fam: FamilyPhysics) -> Efficiency:
        """A copy with `fam` replacing the family of the same name (or appended)."""
        if any(f.family == fam.family for f in self.families):
            fams = tuple(fam if f.family == fam.family else f for f in self.families)
        else:
            fams = (*self.families, fam)
        return replace(self, families=fams)

    def to_dict(self) -> dict[str, Any]:
        """Identity and numbers, for every prediction's output."""
        return {
            "name": self.name,
            "source": self.source,
            "calibrated": self.calibrated,
            "kind": self.kind,
            "framework": self.framework or None,
            **({"provenance": _plain(self.provenance)} if self.provenance else {}),
            "matmul": self.matmul,
            "hbm": self.hbm,
            "link": self.link,
            "step_overhead_s": self.step_overhead_s,
            "layer_overhead_s": self.layer_overhead_s,
            "disagg_handoff_s": self.disagg_handoff_s,
            "request_latency_s": self.request_latency_s,
            "families": {
                f.family: {
                    "match": list(f.match),
                    "tile": list(f.tile),
                    "tile_m_min": f.tile_m_min,
                    "head_dim_tile": f.head_dim_tile,
                    **f.params(),
                }
                for f in self.families
            },
        }

    def describe(self, handoff: bool = True) -> str:
        """One line for a report: which profile, measured or datasheet (`handoff=False`: leave
        out the serving-only disaggregated hand-off, for training output)."""
        kind = "measured-calibrated" if self.calibrated else "datasheet-only"
        fw = f", framework {self.framework}" if self.framework else ""
        h = self.disagg_handoff_s if handoff else 0.0
        hand = f", disaggregated hand-off {h * 1e3:.0f} ms" if h else ""
        return f"efficiency profile '{self.name}' ({kind}{fw}{hand})"

    @property
    def kind(self) -> str:
        """'measured-calibrated' or 'datasheet-only' (what every prediction's output says)."""
        return "measured-calibrated" if self.calibrated else "datasheet-only"


@lru_cache(maxsize=4096)
def _chip_keys(name: str, generation: str, aliases: tuple[str, ...]) -> frozenset:
    return frozenset(normalize(x) for x in (name, generation, *aliases))


def chip_matches(match: Any, name: str, generation: str = "", aliases: Any = ()) -> bool:
    """Whether a family's `match` list covers a chip given by name, generation and aliases (the
    rule of `FamilyPhysics.covers`, for callers holding a chip or a profile as JSON)."""
    keys = _chip_keys(str(name), str(generation), tuple(str(a) for a in aliases))
    return not {normalize(str(m)) for m in match}.isdisjoint(keys)


def _tier(tier: str) -> str:
    t = str(tier).strip().lower().replace("-", "_")
    if t not in TIERS:
        raise SpecError(
            f"unknown link tier {tier!r}",
            rule="tiers: " + ", ".join(TIERS),
            fix="name one of those tiers",
        )
    return t


def _wave_units(fam: FamilyPhysics, chip: Any) -> int:
    if fam.wave_units:
        return int(fam.wave_units)
    if getattr(chip, "sm_count", None):
        return int(chip.sm_count)
    return int(getattr(chip, "cores_per_chip", 1) or 1)


def _shape_factor(
    fam: FamilyPhysics, chip: Any, dtype: str, m: np.ndarray, n: np.ndarray, k: np.ndarray
) -> np.ndarray:
    """Tile quantisation, work quantisation over the chip's units and small-dimension roll-off.

    - Tiles: the output is computed in whole (tile_m x tile_n) tiles and k in whole k steps
      (NVIDIA, "Matrix Multiplication Background User's Guide", tile quantization).
    - Waves: the work items (tiles x k steps) are spread over the SMs / TensorCores in whole
      waves; k-splitting (stream-K, Osama et al. 2023; cuBLAS and CUTLASS on Hopper) makes the
      items the k steps, not the tiles, so small-m GEMMs still fill the chip.
    - Roll-off: a fixed per-tile cost (pipeline fill, epilogue) is Hockney's half-performance
      length per dimension; `k_half` is in bf16 k elements and scales with the dtype's rate.
    - Small m (decode: a few tokens per GEMM, or per expert): libraries pick a kernel whose
      token tile fits, down to `tile_m_min` (the tensor-core instruction's smallest side with
      the operands swapped, e.g. Hopper wgmma N = 8): the m tile is the power of two >= m
      between tile_m_min and tile[0].
    """
    tm, tn, tk = fam.tile
    if fam.tile_m_min is not None:
        tm = np.clip(2.0 ** np.ceil(np.log2(np.maximum(m, 1.0))), fam.tile_m_min, tm)
    m, n, k = np.maximum(m, 1.0), np.maximum(n, 1.0), np.maximum(k, 1.0)
    tiles_m, tiles_n, steps_k = np.ceil(m / tm), np.ceil(n / tn), np.ceil(k / tk)
    tile_q = (m * n * k) / (tiles_m * tm * tiles_n * tn * steps_k * tk)
    units = _wave_units(fam, chip)
    items = tiles_m * tiles_n * steps_k
    wave_q = items / (np.ceil(items / units) * units)
    k_half = fam.k_half * chip.peak(dtype) / _reference_peak(chip)
    roll = (m / (m + fam.m_half)) * (n / (n + fam.n_half)) * (k / (k + k_half))
    return tile_q * wave_q * roll


def _token_tile(fam: FamilyPhysics, m: np.ndarray) -> np.ndarray:
    """The token (m) tile a GEMM of m rows computes in (see `_shape_factor`)."""
    tm = float(fam.tile[0])
    if fam.tile_m_min is None:
        return np.full(np.shape(m), tm)
    return np.clip(2.0 ** np.ceil(np.log2(np.maximum(m, 1.0))), fam.tile_m_min, tm)


def expected_tiles(mean: Any, tile: Any) -> np.ndarray:
    """E[ceil(X / tile)] for the tokens X an expert receives, X ~ Poisson(mean).

    A router that balances its experts sends each of the T·k routed tokens to a given expert
    with probability 1/E: the expert's count is Binomial(T·k, 1/E) ~ Poisson(T·k/E) (a lower
    bound on the spread of real routers). Summed over the pmf where the mean is at most
    `EXACT_POISSON_MEAN`; above it, sum_{j>=0} P(X > j·t) with the normal approximation (with
    continuity correction) for j >= 1 — an expert no token chose runs no tile (j = 0 term
    1 − e^(−λ)). Evaluated once per distinct (mean, tile) pair."""
    lam, t = np.broadcast_arrays(
        np.maximum(np.asarray(mean, float), 0.0), np.maximum(np.asarray(tile, float), 1.0)
    )
    pairs, inv = np.unique(np.stack([lam.ravel(), t.ravel()], axis=1), axis=0, return_inverse=True)
    vals = np.array([_tiles(float(a), float(b)) for a, b in pairs])
    return vals[inv.reshape(-1)].reshape(lam.shape) if lam.size else np.zeros(lam.shape)


EXACT_POISSON_MEAN = 600.0  # above it the normal approximation is within 0.3% (tested)


@lru_cache(maxsize=1 << 16)
def _tiles(lam: float, t: float) -> float:
    if lam <= 0.0:
        return 0.0
    sd = math.sqrt(lam)
    if lam <= EXACT_POISSON_MEAN:  # the pmf within 12 standard deviations of the mean
        lo, hi = max(1, int(lam - 12 * sd)), int(lam + 12 * sd) + 20
        log_lam = math.log(lam)
        return sum(
            math.ceil(x / t) * math.exp(x * log_lam - lam - math.lgamma(x + 1))
            for x in range(lo, hi + 1)
        )
    j0 = max(math.floor((lam - 8 * sd) / t), 0)  # P(X > j·t) = 1 for j <= j0
    total = -math.expm1(-lam) + j0
    for j in range(j0 + 1, j0 + math.ceil(16 * sd / t) + 3):  # past it the terms vanish
        total += 0.5 * math.erfc((j * t + 0.5 - lam) / (math.sqrt(2.0) * sd))
    return total


def _routed_tile_factor(fam: FamilyPhysics, m: np.ndarray) -> np.ndarray:
    """The mean tile fill of a grouped expert GEMM over its experts' token counts, relative to
    the fill of the mean count `_shape_factor` prices: each expert's tokens are computed in
    whole token tiles (vLLM fused_moe pads every expert's tokens to the block size,
    moe_align_block_size; CUTLASS grouped GEMMs tile each group), and the counts vary around
    the mean m (`expected_tiles`), so a mean that fills its tiles exactly still pays the
    partial tiles of the experts above and below it."""
    tm = _token_tile(fam, m)
    mean_fill = m / (np.ceil(np.maximum(m, 1.0) / tm) * tm)
    fill = m / (np.maximum(expected_tiles(m, tm), 1e-12) * tm)
    return np.minimum(fill / np.maximum(mean_fill, 1e-12), 1.0)


def _head_dim_fill(fam: FamilyPhysics, hd: np.ndarray, bwd: np.ndarray) -> np.ndarray:
    """The speed of a flash-attention kernel's matmuls at head dim `hd` on a systolic MXU,
    relative to a head dim that fills it.

    A systolic array of side w holds a (k x w) tile of one operand and streams the other through
    it (book tpus.md: "weight matrices need to be padded to at least size 128 (256 on TPU v6) in
    all dimensions to fill up the MXU"; Appendix B, the weights stay in the array). Which operand
    stays is the compiler's choice, so an output side as small as head_dim can be the streamed
    one, but a contraction over head_dim fills only hd / (ceil(hd / w) w) of the array: QK^T in
    the forward (2 of its 4·hd matmul FLOPs per score), the recomputed QK^T and dP = dO·V^T in
    the backward (4 of 10·hd). Those FLOPs run at the fill, the rest at full rate. Families
    without `head_dim_tile` (GPUs: the tensor-core instruction steps by 8-16) lose nothing."""
    w = fam.head_dim_tile
    if not w:
        return np.ones(np.shape(hd))
    h = np.maximum(hd, 1.0)
    fill = h / (np.ceil(h / w) * w)
    share = np.where(bwd, _ATTN_HD_CONTRACTION[True], _ATTN_HD_CONTRACTION[False])
    return 1.0 / ((1.0 - share) + share / fill)


def _reference_peak(chip: Any) -> float:
    """The 16-bit peak `k_half` is measured against (bf16; fp16 on chips without bf16)."""
    try:
        return chip.peak("bf16")
    except SpecError:
        return chip.peak("fp16")


def _dtype_ratio(fam: FamilyPhysics, dtype: str) -> float:
    """Attention in a low-precision dtype keeps the family's bf16 kernel efficiency scaled by
    how well GEMMs in that dtype reach their own peak (FlashAttention-3 fp8 vs fp16)."""
    return fam.mm_ceiling(dtype) / fam.mm_ceiling("bf16")


# -- the constants kept for old callers --------------------------------------------------

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


# The profile a prediction uses when none is named (train, validate, report, serve): the
# measured-calibrated `fitted` profile (specs/profiles/fitted.toml, written by `roofline
# calibrate --from-runs training`; its cross-validated error is in docs/calibration.md).
# None would mean the vendor constants above.
DEFAULT_PROFILE: str | None = "fitted"


def default_profile(chip: Any) -> Efficiency:
    """The profile used when the user names none (see DEFAULT_PROFILE)."""
    if DEFAULT_PROFILE is None:
        return default_efficiency(getattr(chip, "vendor", "nvidia"))
    return load_profile(DEFAULT_PROFILE)


# -- files -------------------------------------------------------------------------

_TOP_KEYS = {f.name for f in fields(Efficiency)} - {
    "families",
    "frameworks",
    "framework",
    "provenance",
}
_FAMILY_KEYS = {f.name for f in fields(FamilyPhysics)} - {"family", "_keys"}
_MAX_BASE_DEPTH = 4


def _plain(x: Any) -> Any:
    """Mappings (and proxies) as plain dicts, for JSON."""
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def profile_from_dict(raw: Mapping[str, Any], origin: str, _depth: int = 0) -> Efficiency:
    """Build a profile from a parsed TOML table (see specs/profiles/*.toml for the format).

    `base = "NAME|FILE"` starts from that profile: top-level keys, [family.X] tables (only the
    keys given; a family the base lacks needs match, tile and mm_fraction) and [framework.X]
    tables (only the keys given) then override it (how `calibrate` writes a fitted profile:
    only what it fitted).
    `[provenance]` records how a calibrated profile was made."""
    # keys (top level and [family.X]: the loader's own, tests/test_schemas.py) and types are the
    # schema's; the rules below are ranges, presence and the base chain
    check_schema("profile", raw, origin)
    data = dict(raw)
    fams_raw = data.pop("family", {})
    fw_raw = data.pop("framework", {})
    data.pop("param_sources", None)
    prov = data.pop("provenance", {})
    base_ref = data.pop("base", None)
    data.setdefault("name", Path(origin).stem)
    base = None if base_ref is None else _base_profile(base_ref, origin, _depth)
    fams = _families(fams_raw, base, origin)
    frameworks = dict(base.frameworks) if base is not None else {}
    for fw, t in fw_raw.items():  # key by key over the base's, as [family.X] tables are
        new = _framework_from_dict(fw, t, fams, origin)
        frameworks[fw] = MappingProxyType(_merge_framework(frameworks.get(fw, {}), new))
    if base is not None:
        data = {k: getattr(base, k) for k in _TOP_KEYS if k != "name"} | data
    try:
        return Efficiency(
            **data,
            families=fams,
            frameworks=MappingProxyType(frameworks),
            provenance=MappingProxyType(dict(prov)),
        )
    except TypeError as e:
        raise SpecError(
            f"efficiency file {origin}: {e}",
            rule="matmul, hbm and link are required",
            fix="add the missing keys",
        ) from None


def _base_profile(ref: Any, origin: str, depth: int) -> Efficiency:
    """The profile a file's `base` names: a catalog name, or a TOML path (relative to the file)."""
    if not isinstance(ref, str) or depth >= _MAX_BASE_DEPTH:
        raise SpecError(
            f"efficiency file {origin}: base = {ref!r}",
            rule=f"base names one profile (a catalog name or a TOML file), at most {_MAX_BASE_DEPTH} deep",
            fix='e.g. base = "datasheet"',
        )
    near = Path(origin).parent / ref
    if ref.endswith(".toml") and is_file(str(near)):
        ref = str(near)
    if ref.endswith(".toml") or is_file(ref):
        return profile_from_dict(stamped_toml(Path(ref), "efficiency profile"), ref, depth + 1)
    check_name_length(ref, "profile")
    key = resolve(ref, {n: () for n in profile_names()}, "profile")
    path = PROFILE_DIR / f"{key}.toml"
    return profile_from_dict(stamped_toml(path, "efficiency profile"), str(path), depth + 1)


def _families(
    fams_raw: Mapping[str, Any], base: Efficiency | None, origin: str
) -> tuple[FamilyPhysics, ...]:
    """The base's families with the file's tables applied (new families appended)."""
    fams = list(base.families) if base is not None else []
    for name, t in fams_raw.items():
        old = next((i for i, f in enumerate(fams) if f.family == name), None)
        if old is None:
            fams.append(_family_from_dict(name, t, origin))
        else:
            fams[old] = _family_over(fams[old], t, origin)
    return tuple(fams)


def _family_over(fam: FamilyPhysics, t: Mapping[str, Any], origin: str) -> FamilyPhysics:
    """`fam` with the keys of a partial [family.X] table replaced."""
    where = f"efficiency file {origin}, family {fam.family!r}"
    plain: dict[str, Any] = {k: t[k] for k in _FAMILY_KEYS - set(PARAMS) if k in t}
    if "match" in t:
        plain["match"] = tuple(str(x) for x in t["match"])
    if "tile" in t:
        plain["tile"] = _tile(t["tile"], where)
    for side in _TILE_SIDES:
        if side in t:
            plain[side] = _tile_side(t[side], where, side)
    if "sources" in t:
        plain["sources"] = MappingProxyType({**fam.sources, **dict(t["sources"])})
    out = replace(fam, **plain) if plain else fam
    values = {f"mm_fraction.{d}": v for d, v in t.get("mm_fraction", {}).items()}
    values.update({f"link.{tier}": v for tier, v in t.get("link", {}).items()})
    values.update({k: t[k] for k in PARAMS if k in t and k not in ("mm_fraction", "link")})
    return out.with_params(values)


def _tile(raw: Any, where: str) -> tuple[int, int, int]:
    tile = tuple(int(x) for x in raw)
    if len(tile) != 3 or min(tile) < 1:
        raise SpecError(
            f"{where}: tile = {raw!r}",
            rule="tile is [m, n, k], positive integers",
            fix="e.g. tile = [128, 256, 64]",
        )
    return tile  # type: ignore[return-value]


def _family_from_dict(name: str, t: Mapping[str, Any], origin: str) -> FamilyPhysics:
    where = f"efficiency file {origin}, family {name!r}"
    for req in ("match", "tile", "mm_fraction"):
        if req not in t:
            raise SpecError(
                f"{where} lacks {req!r}",
                rule="match, tile and mm_fraction are required",
                fix=f"add `{req} = ...`",
            )
    base = FamilyPhysics(
        family=name,
        match=tuple(str(x) for x in t["match"]),
        tile=_tile(t["tile"], where),
        mm_fraction=MappingProxyType({}),
        wave_units=t.get("wave_units"),
        tile_m_min=_tile_side(t.get("tile_m_min"), where),
        head_dim_tile=_tile_side(t.get("head_dim_tile"), where, "head_dim_tile"),
        sources=MappingProxyType(dict(t.get("sources", {}))),
    )
    values = {f"mm_fraction.{d}": v for d, v in t["mm_fraction"].items()}
    values.update({f"link.{tier}": v for tier, v in t.get("link", {}).items()})
    values.update({k: t[k] for k in PARAMS if k in t and k not in ("mm_fraction", "link")})
    return base.with_params(values)


_TILE_SIDES = {
    "tile_m_min": "the smallest token tile of the family's GEMM kernels",
    "head_dim_tile": "the matrix-unit side a flash-attention kernel pads head_dim to",
}


def _tile_side(v: Any, where: str, key: str = "tile_m_min") -> int | None:
    """A family's tile side (`tile_m_min`, `head_dim_tile`): None or an integer 1..4096."""
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 4096:
        raise SpecError(
            f"{where}: {key} = {v!r}",
            rule=f"{key} is {_TILE_SIDES[key]}, an integer 1..4096",
            fix=f"e.g. {key} = {128 if key == 'head_dim_tile' else 8}",
        )
    return v


def _framework_from_dict(
    fw: str, t: Mapping[str, Any], fams: tuple[FamilyPhysics, ...], origin: str
) -> dict[str, Any]:
    """[framework.NAME] holds overheads and [framework.NAME.family.FAMILY] flattened overrides."""
    out: dict[str, Any] = {"families": {}}
    for k, v in t.items():
        if k == "family":
            for fam_name, vals in v.items():
                if fam_name not in {f.family for f in fams}:
                    raise SpecError(
                        f"efficiency file {origin}: framework {fw!r} overrides unknown family {fam_name!r}",
                        fix="define [family." + fam_name + "] first",
                    )
                for key, val in vals.items():
                    _check(f"efficiency file {origin}, framework {fw!r}", key, val)
                out["families"][fam_name] = dict(vals)
        elif k in OVERHEADS:
            out[k] = _check(f"efficiency file {origin}, framework {fw!r}", k, v)
        elif k in ("calibrated", "source"):
            out[k] = v
        else:
            raise SpecError(
                f"efficiency file {origin}: framework {fw!r}: unknown key {k!r}",
                rule="framework keys: " + ", ".join(OVERHEADS) + ", calibrated, source, [family.*]",
                fix="remove or rename the key",
            )
    return out


def _merge_framework(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A [framework.X] table over the base's: its keys win, per chip family too (an overlay
    that sets SGLang's request latency keeps the base's SGLang kernel overrides)."""
    fams = {k: dict(v) for k, v in old.get("families", {}).items()}
    for fam, vals in new.get("families", {}).items():
        fams[fam] = {**fams.get(fam, {}), **vals}
    return {**old, **new, "families": fams}


def load_efficiency(path: str | Path) -> Efficiency:
    """A profile from a TOML file (constant or physics; `calibrate` writes this format), parsed
    once while the file and its bases hold the same text (specs.filecache)."""
    origin = str(path)

    def build() -> Efficiency:
        return profile_from_dict(stamped_toml(Path(origin), "efficiency profile"), origin)

    return cached(("efficiency", origin), build)


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name_or_path: str | Path | Efficiency) -> Efficiency:
    """A profile by catalog name ('peak', 'datasheet', ...) or a path to a TOML file."""
    if isinstance(name_or_path, Efficiency):
        return name_or_path
    s = str(name_or_path)
    if s.endswith(".toml") or is_file(s):
        return load_efficiency(s)
    return load_efficiency(PROFILE_DIR / f"{_profile_key(s)}.toml")


@lru_cache(maxsize=256)
def _profile_key(s: str) -> str:
    """The catalog profile `s` names (resolved once per name)."""
    check_name_length(s, "profile")
    try:
        return resolve(s, {n: () for n in profile_names()}, "profile")
    except UnknownNameError as e:
        raise UnknownNameError(
            e.what,
            rule="a profile is a name in specs/profiles ("
            + ", ".join(profile_names())
            + ") or a TOML file",
            fix="name one of those profiles, or give the path of a file written by `roofline calibrate`",
        ) from None


__all__ = [
    "Efficiency",
    "FamilyPhysics",
    "PARAMS",
    "OVERHEADS",
    "TIERS",
    "PEAK",
    "DEFAULTS",
    "default_efficiency",
    "default_profile",
    "DEFAULT_PROFILE",
    "chip_matches",
    "load_efficiency",
    "load_profile",
    "profile_names",
    "profile_from_dict",
    "bounds_of",
]
