"""Training runs in the schema of `measured_training.yaml` -> the tool's inputs and a measurement.

One entry maps to: a ModelSpec (dims.py), a System (systems.py), a Workload (global batch in
sequences × seq_len), a plan string in the tool's plan vocabulary (degrees, microbatches,
remat, ZeRO, schedule, sequence parallelism, collective matmul, optimizer), the stack's
framework profile, the run's compute dtype (recorded; the plan vocabulary gains it in issue 9)
and the measured tokens/s per chip (conventions.py). Whatever the entry does not state is
filled from the stack's documented defaults (sources.py), each default written into
`defaults`. An entry that cannot be mapped gets a `skipped_reason` and no inputs.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from roofline.core.ledger import count_params
from roofline.errors import RooflineError
from roofline.specs.model import ModelSpec
from roofline.specs.plan import RECOMPUTE_MODULES, parse_optimizer
from roofline.specs.system import System
from roofline.training.step import Plan, Workload, evaluate_plan, parse_plan
from roofline.units import compute_format
from roofline.validate.conventions import (
    CONVENTIONS,
    DOCUMENT_CONVENTION,
    MFU_AT_COMPUTE_PEAK,
    Measured,
    convention_model,
    direct_tokens,
    from_flops,
)
from roofline.validate.dims import build_model
from roofline.validate.sources import (
    DOCUMENTS,
    Source,
    StackDefaults,
    defaults_for,
    identify,
    recipe_for,
    stack_date,
)
from roofline.validate.systems import chip_for_family, power_limited, system_for


@dataclass(frozen=True)
class Inputs:
    """What the tool is given for one run."""

    model: ModelSpec
    system: System
    workload: Workload
    plan: Plan
    plan_text: str
    framework: str
    compute_dtype: str
    topology: str
    # the stack as this document ran it where it differs from the profile (an older version)
    stack: Any = None


@dataclass(frozen=True)
class TrainingRun:
    id: str
    source: Source
    chip_family: str
    chips: int | None
    compute_dtype: str  # bf16 | fp16 | fp8 | fp4 | unknown
    precision: str  # as published
    seq_len: int | None
    measured: Measured | None
    inputs: Inputs | None
    defaults: tuple[str, ...] = ()
    skipped_reason: str = ""
    checks: tuple[dict[str, Any], ...] = ()  # the other published metrics, converted
    params: float | None = None  # parameter count used by conventions (published or counted)
    layout_defaulted: bool = False  # the layout is the stack's default (not published)
    # the date of the stack the run ran on (sources.stack_date; None: its source names none),
    # where it was read; the planner searches only what the stack had shipped by then
    stack_date: datetime.date | None = None
    stack_date_from: str = ""

    @property
    def mapped(self) -> bool:
        return self.inputs is not None and self.measured is not None and not self.skipped_reason


class _Skip(Exception):
    """An entry cannot be mapped; the message is the reason."""


MAX_COUNT = 1 << 40  # a published batch, degree or chip count is far below 10^12


def _num(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    n = None
    if isinstance(v, int):
        n = v
    elif isinstance(v, float) and v.is_integer():
        n = int(v)
    elif isinstance(v, str) and re.fullmatch(r"\s*\d{1,18}\s*", v):
        n = int(v)
    if n is not None and abs(n) > MAX_COUNT:
        raise _Skip(f"count {v!r} is beyond any physical run (at most 2^40)")
    return n


def _num_or_none(v: Any) -> int | None:
    try:
        return _num(v)
    except _Skip:
        return None


def compute_dtype(text: str) -> str:
    """'FP8 (Transformer Engine)' -> 'fp8'; 'NVFP4' -> 'fp4'; 'amp_bf16' -> 'bf16'; else 'unknown'."""
    low = text.lower()
    if "fp4" in low:
        return "fp4"
    if "fp8" in low or "float8" in low:
        return "fp8"
    if "bf16" in low or "bfloat16" in low:
        return "bf16"
    if "fp16" in low:
        return "fp16"
    return "unknown"


def published_remat(text: str) -> str | None:
    """The tool's remat policy for a published description, None if it cannot be read.

    Megatron 'selective', torchtitan 'selective (op)' and MaxText 'minimal' keep the matmul
    outputs and rerun the rest -> `matmuls`; Megatron's recompute modules other than core_attn
    named ('selective: mla_up_proj, mlp') -> that partial recompute (`mla_up_proj+mlp`); 'full'
    in any stack -> `full`.
    """
    low = text.lower()
    mods = [m for m in RECOMPUTE_MODULES if re.search(rf"\b{m}\b", low)]
    if mods and mods != ["core_attn"]:
        return "+".join(mods)
    if "selective" in low or low.strip() == "minimal":
        return "matmuls"
    if "full" in low:
        return "full"
    if low.strip() in ("none", "off", "no", "false"):
        return "none"
    return None


def _global_batch(p: dict, seq: int, ways: int, notes: list[str]) -> int:
    if (g := _num(p.get("global_batch_seqs"))) is not None and g > 0:
        return g
    gt = p.get("global_batch_tokens")
    if gt is not None:
        v = float(gt) if isinstance(gt, (int, float)) else None
        if v is None:
            m = re.fullmatch(r"\s*([0-9.]+)\s*([KMG])\s*", str(gt))
            if not m:
                raise _Skip(f"global batch {gt!r} cannot be read")
            num, suf = float(m.group(1)), m.group(2)
            dec, binary = (
                num * {"K": 1e3, "M": 1e6, "G": 1e9}[suf],
                num * {"K": 2**10, "M": 2**20, "G": 2**30}[suf],
            )
            v = dec if (dec / seq).is_integer() else binary
            if v == binary:
                notes.append(
                    f"global batch {gt} read as {int(binary)} tokens (binary M: a whole number of {seq}-token sequences)"
                )
        if not (v / seq).is_integer():
            raise _Skip(
                f"global batch of {v:g} tokens is not a whole number of {seq}-token sequences"
            )
        return int(v / seq)
    if (mb := _num(p.get("microbatch"))) is not None:
        notes.append(
            f"global batch unstated: microbatch {mb} × {ways} data-parallel ranks = {mb * ways} sequences"
        )
        return mb * ways
    raise _Skip("global batch not published")


_LAYOUT_KEYS = ("dp", "tp", "pp", "cp", "ep", "fsdp", "fsdp_column", "dcn_dp")


@dataclass
class _Layout:
    deg: dict[str, int]
    defaulted: bool  # the layout is the stack's default, not published
    fsdp_note: str = ""


def _fsdp_degree(p: dict, notes: list[str]) -> int:
    if (f := _num(p.get("fsdp"))) is not None:
        return max(f, 1)
    if (f := _num(p.get("fsdp_column"))) is not None:
        return max(f, 1)  # Megatron-Bridge FSDP column: 0 = DDP, N = FSDP over N GPUs
    if isinstance(p.get("fsdp"), str):
        notes.append(f"fsdp {p['fsdp']!r} has no degree: weights are not sharded (see zero)")
    return 1


def _layout(
    p: dict, hw: dict, chips: int, st: StackDefaults, stack: str, notes: list[str]
) -> _Layout:
    if not any(k in p for k in _LAYOUT_KEYS):
        slices = _num(hw.get("slices")) or 1
        if stack == "maxtext":
            deg = {"dp": slices, "fsdp": chips // slices}
        elif stack in ("torchtitan", "llm-foundry"):
            deg = {"fsdp": chips}
        elif stack == "megatron":
            deg = {"dp": chips}
        else:
            raise _Skip("parallel layout (tp/pp/dp) not published")
        notes.append(f"layout unstated: {st.layout_why}")
        return _Layout({"tp": 1, "pp": 1, "sp": 1, "ep": 1, "dp": 1, "fsdp": 1, **deg}, True)
    deg = {
        "tp": _num(p.get("tp")) or 1,
        "pp": _num(p.get("pp")) or 1,
        "sp": _num(p.get("cp")) or 1,
        "ep": _num(p.get("ep")) or 1,
        "fsdp": _fsdp_degree(p, notes),
    }
    if (d := _num(p.get("dcn_dp"))) is not None:
        deg["dp"] = d  # MaxText: FSDP/TP inside a slice, data parallel across slices over DCN
    elif (d := _num(p.get("dp"))) is not None:
        if st.ep_from_dp and deg["ep"] > 1:
            d //= deg["ep"]
            notes.append("expert parallelism carved out of the data-parallel ranks (Megatron)")
        deg["dp"] = d
    else:
        rest = chips / math.prod(deg.values())
        if not rest.is_integer() or rest < 1:
            raise _Skip(f"degrees {deg} do not divide {chips} chips")
        deg["dp"] = int(rest)
        if rest > 1:
            notes.append(f"dp unstated: chips / (tp·pp·cp·ep·fsdp) = {int(rest)}")
    n = math.prod(deg.values())
    if n != chips:
        raise _Skip(f"published degrees {deg} use {n} chips, the run has {chips}")
    return _Layout(deg, False)


# Stacks whose pipeline schedule splits the per-rank batch into a default number of
# microbatches when a run does not say (the whole batch is one microbatch otherwise).
PIPELINE_MICROBATCHES = {
    "torchtitan": (
        "pipeline microbatches unstated: the pipeline degree (torchtitan@9dec370a "
        "torchtitan/parallelisms/pipeline_llama.py: n_microbatches = "
        "experimental.pipeline_parallel_microbatches or the pipeline degree)"
    ),
}


def _microbatches(
    p: dict, gbs: int, ways: int, st: StackDefaults, notes: list[str], pp: int = 1
) -> int:
    if (ga := _num(p.get("grad_accum"))) is not None and ga > 0:
        mb = _num(p.get("microbatch"))
        if mb and gbs != ways * mb * ga:
            notes.append(f"global batch {gbs} != ranks {ways} × microbatch {mb} × grad_accum {ga}")
        return ga
    if "microbatch_per_chip" in p:
        return 1  # MaxText per_device_batch_size; gradient_accumulation_steps 1
    mbs = _num(p.get("microbatch"))
    why = PIPELINE_MICROBATCHES.get(st.framework)
    if st.microbatch_size == 0 and pp > 1 and why is not None and (gbs // ways) % pp == 0:
        notes.append(why)  # the per-rank (local) batch is split by the pipeline schedule
        return pp
    if mbs is None:
        if st.microbatch_size == 0:
            return 1
        mbs = st.microbatch_size
        notes.append(st.microbatch_why)
    if mbs < 1 or gbs % (ways * mbs):
        raise _Skip(f"global batch {gbs} does not split into {ways} ranks × microbatch {mbs}")
    return gbs // (ways * mbs)


def _schedule(
    p: dict, pp: int, layers: int, framework: str, notes: list[str], over: Any = None
) -> str:
    from roofline.core.stack import stack_of

    if pp <= 1:
        return ""
    uneven = stack_of(framework).uneven_stages
    v = _num(p.get("vp")) or 1
    if v == 1 and "vp" not in p and over is not None and over.virtual:
        v = over.virtual  # the document's own schedule where its table leaves it out
        notes.append(over.virtual_why)
    if (k := _num(p.get("vp_layers_per_virtual_stage"))) and layers % (pp * k) == 0:
        v = layers // (pp * k)
    if v > 1 and (layers % (pp * v) == 0 or uneven):
        if layers % (pp * v):
            notes.append(
                f"vp={v}: {layers} layers over pp·vp = {pp * v} virtual stages are uneven; "
                f"{framework} lays them out (the embedding and the loss count as a layer each)"
            )
        return f"schedule=interleaved,virtual={v}"
    if v > 1:
        notes.append(
            f"interleaved schedule vp={v} needs layers ({layers}) divisible by pp·vp = {pp * v} "
            f"in {framework}: 1F1B assumed"
        )
    return "schedule=1f1b"


def _text_of(*blocks: Any) -> str:
    return " ".join(str(v) for b in blocks if isinstance(b, dict) for v in b.values()).lower()


def _remat(p: dict, st: StackDefaults, notes: list[str]) -> str:
    raw = p.get("remat")
    if raw is not None:
        r = published_remat(str(raw))
        if r is not None:
            return r
        notes.append(f"remat {raw!r} not recognised: {st.remat} ({st.remat_why})")
        return st.remat
    notes.append(st.remat_why)
    return st.remat


def _compiled(p: dict, st: StackDefaults, notes: list[str]) -> list[str]:
    """The plan's `compile` on a stack with an [eager] table, always stated (the plan's unset
    is the profile's compiled_by_default): 0 where the run ran eager PyTorch kernels — the row
    says so (`compile: false`, or 'eager' in its precision), or says nothing on a stack that
    is eager by default (StackDefaults.compiled) — else 1."""
    from roofline.core.stack import stack_of

    eager = stack_of(st.framework).framework.eager if st.framework else None
    if eager is None:
        return []
    if "compile" in p:
        return ["compile=1"] if p["compile"] is True else ["compile=0"]
    if "eager" in str(p.get("precision") or "").lower():
        notes.append("the row's precision says eager: no torch.compile")
        return ["compile=0"]
    if st.compiled:  # a stack other than torchtitan's own configs (e.g. Meta's): as compiled
        return ["compile=1"]
    notes.append(f"compile unstated: eager, the stack's default ({eager.flag})")
    return ["compile=0"]


def _flags(p: dict, hw: dict, tp: int, st: StackDefaults, doc: str, notes: list[str]) -> list[str]:
    over = DOCUMENTS.get(doc)
    out = []
    if tp > 1:
        sp = st.sequence_parallel_with_tp
        if over and over.sequence_parallel is not None:
            sp = over.sequence_parallel
        elif sp:
            notes.append(st.sp_why)
        out.append(f"megatron_sp={int(sp)}")
        out += _collective_matmul(p, hw, st, over, notes)
    return out


def _collective_matmul(p: dict, hw: dict, st: StackDefaults, over: Any, notes: list[str]) -> list:
    """The plan's tri-state `collective_matmul` for a TP run: 1 where the run (async TP,
    --tp-comm-overlap) or the stack's recipes switch it on, 0 where the document's version had
    none, and unset (the framework profile's default) otherwise."""
    if p.get("async_tp") is True or "--tp-comm-overlap" in _text_of(p, hw):
        return ["collective_matmul=1"]
    if over and over.collective_matmul is not None:
        return [f"collective_matmul={int(over.collective_matmul)}"]
    if st.collective_matmul:
        notes.append(st.cm_why)
        return ["collective_matmul=1"]
    return []


def _measure(
    entry: dict,
    src: Source,
    model: ModelSpec,
    chips: int,
    seq: int,
    gbs: int,
    params: float | None,
    peak: float,
) -> tuple[Measured, tuple[dict[str, Any], ...]]:
    meas = entry.get("measured") if isinstance(entry.get("measured"), dict) else {}
    conv = CONVENTIONS.get(DOCUMENT_CONVENTION.get(src.document, ""))
    candidates: list[Measured] = []
    if (d := direct_tokens(meas, chips, gbs * seq)) is not None:
        candidates.append(d)
    if conv is not None:
        counted, why = convention_model(src.document, model)
        for key in ("tflops_per_chip", "mfu_pct"):
            f = (
                from_flops({key: meas[key]}, conv, counted, seq, params, peak)
                if key in meas
                else None
            )
            if f is not None:
                candidates.append(replace(f, conversion=f"{f.conversion}; {why}") if why else f)
    if not candidates:
        why = (
            "no measured token rate, and the source's FLOP convention is unknown"
            if conv is None
            else "no measured metric the tool can convert (tokens/s, step time, TFLOP/s or MFU)"
        )
        raise _Skip(why)
    primary = candidates[0]
    checks = tuple(
        {
            "metric": c.metric,
            "tokens_per_s_per_chip": c.tokens_per_s_per_chip,
            "vs_used": c.tokens_per_s_per_chip / primary.tokens_per_s_per_chip - 1,
            "conversion": c.conversion,
        }
        for c in candidates[1:]
        if c.tokens_per_s_per_chip
    )
    return primary, checks


def _params_for(
    src: Source, built_params: float | None, model: ModelSpec, notes: list[str]
) -> float | None:
    conv = CONVENTIONS.get(DOCUMENT_CONVENTION.get(src.document, ""))
    counted = count_params(model).total
    if built_params is not None and abs(counted / built_params - 1) > 0.10:
        notes.append(
            f"dims give {counted / 1e9:.3g}B parameters, the entry states {built_params / 1e9:.3g}B"
        )
    if conv is not None and conv.needs_params and built_params is None:
        notes.append(f"N_p for {conv.key}: {counted / 1e9:.4g}B counted from the dims")
        return counted
    return built_params


def map_training_run(entry: Any) -> TrainingRun:
    """One measured-training entry -> TrainingRun (mapped, or with a skipped_reason)."""
    if not isinstance(entry, dict):
        return TrainingRun(
            str(entry)[:40],
            identify(None),
            "",
            None,
            "unknown",
            "",
            None,
            None,
            None,
            skipped_reason="entry is not a mapping",
        )
    rid = str(entry.get("id") or "?")
    src, stack_note = own_stack(identify(entry.get("source")), entry)
    hw = entry.get("hardware") if isinstance(entry.get("hardware"), dict) else {}
    p = entry.get("parallelism") if isinstance(entry.get("parallelism"), dict) else {}
    fam = str(hw.get("chip_family") or hw.get("chip") or "")
    chips = _num_or_none(hw.get("chips"))
    prec = str(p.get("precision") or "")
    dtype = compute_dtype(prec)
    m = entry.get("model") if isinstance(entry.get("model"), dict) else {}
    seq = _num_or_none(m.get("seq_len"))
    base = dict(
        id=rid,
        source=src,
        chip_family=fam,
        chips=chips,
        compute_dtype=dtype,
        precision=prec,
        seq_len=seq,
    )
    notes: list[str] = [stack_note] if stack_note else []
    try:
        inputs, measured, checks, params, defaulted = _map(
            entry, src, hw, p, m, chips, dtype, notes
        )
    except _Skip as e:
        return TrainingRun(
            **base, measured=None, inputs=None, defaults=tuple(notes), skipped_reason=str(e)
        )
    when, when_from = stack_date(entry)
    return TrainingRun(
        **{**base, "seq_len": inputs.workload.seq_len},
        measured=measured,
        inputs=inputs,
        defaults=tuple(notes),
        checks=checks,
        params=params,
        layout_defaulted=defaulted,
        stack_date=when,
        stack_date_from=when_from,
    )


# Stacks a run's own text can name inside a source family that usually runs another one
# (DGX Cloud and NeMo publish MaxText/JAX recipes for GPUs beside their Megatron ones).
_NAMED_STACKS = ((r"\bmaxtext\b", "maxtext"), (r"\btorchtitan\b", "torchtitan"))


def own_stack(src: Source, entry: dict) -> tuple[Source, str]:
    """The source with the stack the entry names (its `framework`, or its source text: a
    MaxText recipe on GPUs is costed as MaxText, not as the family's Megatron), and the note
    saying so (empty when the family's stack stands)."""
    block = entry.get("source")
    text = (
        " ".join(str(block.get(k, "")) for k in ("title", "url", "location"))
        if isinstance(block, dict)
        else str(block or "")
    )
    text = f"{entry.get('framework') or ''} {text}".lower()
    for pattern, stack in _NAMED_STACKS:
        if stack != src.stack and re.search(pattern, text):
            return replace(src, stack=stack), (
                f"the run names {stack}: costed on the {stack} stack, not {src.family}'s {src.stack}"
            )
    return src, ""


def _basics(entry, src, hw, m, chips, notes):
    """Model, chip and sequence length, or _Skip."""
    built = build_model(m, str(entry.get("id")))
    notes.extend(built.defaults)
    if built.spec is None:
        raise _Skip(built.reason)
    if not chips:
        _num(hw.get("chips"))  # a count beyond any run says so
        raise _Skip("chip count not published")
    chip, why = chip_for_family(str(hw.get("chip_family") or hw.get("chip") or ""))
    if chip is None:
        raise _Skip(why)
    chip = _chip_variant(hw, chip, notes)
    over = DOCUMENTS.get(src.document)
    seq = _num(m.get("seq_len"))
    if seq is None and (staged := stage_seq_len(str(entry.get("notes") or ""))) is not None:
        seq = staged
        notes.append(f"sequence length unstated: {seq}, the stage the entry's notes name")
    if seq is None:
        if over is None or over.seq_len is None:
            raise _Skip("sequence length not published")
        seq = over.seq_len
        notes.append(over.why)
    return built, chip, seq


def stage_seq_len(notes: str) -> int | None:
    """The sequence length of a training stage an entry's notes name ('8K stage', '128K
    stage', '131K context stage'): K tokens read as the power of two nearest n·1000 or n·1024
    (sequence lengths are powers of two: 8K = 8192, 128K = 131K = 131072). None if none."""
    hit = re.search(r"(\d+)\s*k\b[\w\s-]{0,20}?\bstage", notes.lower())
    if hit is None:
        return None
    n = int(hit.group(1))
    if n <= 0:
        return None
    p = 2 ** round(math.log2(n * 1012))  # between n·1000 and n·1024
    return p if abs(p / (n * 1012) - 1) < 0.05 else n * 1024


def _chip_variant(hw: dict, chip: Any, notes: list[str]) -> Any:
    """The catalog chip with the memory the run's source publishes for it, when that differs by
    more than 5% (torchtitan's Grand Teton H100s: "96GB HBM2e ... 2.4 TB/s" against the SXM
    part's 80 GB and 3.35 TB/s): capacity decides what fits, bandwidth prices every memory-bound
    kernel. A stated power limit ("500 W power limit") lowers the SM clock, so every compute
    peak (systems.power_limited); what the text does not state stays the catalog's."""
    text = str(hw.get("chip") or "")
    chip = _power_variant(text, chip, notes)
    got: dict[str, float] = {}
    if (mt := re.search(r"(\d+(?:\.\d+)?)\s*GB\b", text)) and abs(
        float(mt.group(1)) * 1e9 / chip.hbm_bytes - 1
    ) > 0.05:
        got["hbm_bytes"] = float(mt.group(1)) * 1e9
    if (bw := re.search(r"(\d+(?:\.\d+)?)\s*TB/s", text)) and abs(
        float(bw.group(1)) * 1e12 / chip.hbm_bw_bytes_per_s - 1
    ) > 0.05:
        got["hbm_bw_bytes_per_s"] = float(bw.group(1)) * 1e12
    if not got:
        return chip
    said = ", ".join(
        f"{v / 1e9:.0f} GB" if k == "hbm_bytes" else f"{v / 1e12:.2f} TB/s" for k, v in got.items()
    )
    notes.append(
        f"published chip {text!r}: {chip.name} with the source's memory ({said}); "
        "the rest (links; peaks unless a power limit is stated) is the catalog's"
    )
    if "hbm_bytes" in got:  # the catalog part's allocatable HBM is not this part's
        got["usable_hbm_bytes"] = None
    return replace(chip, **got)


def _power_variant(text: str, chip: Any, notes: list[str]) -> Any:
    """The catalog chip under the power limit the published chip text states, if any."""
    if not (mw := re.search(r"(\d+(?:\.\d+)?)\s*W power limit", text, re.IGNORECASE)):
        return chip
    limited, f = power_limited(chip, float(mw.group(1)))
    if f < 1.0:
        notes.append(
            f"published chip {text!r}: a {mw.group(1)} W power limit runs the SMs at "
            f"{f:.3f} of {chip.name}'s clock, so every compute peak (validate/systems.py POWER_CURVES)"
        )
    return limited


def _zero(p: dict, deg: dict[str, int], st: StackDefaults, over: Any, notes: list[str]) -> int:
    """ZeRO stage over `dp`: a numeric `zero_stage` as published (3 = FSDP over dp), else the
    document's or the stack's default."""
    if (z := _num(p.get("zero_stage"))) is not None and 0 <= z <= 3:
        return z
    if over and over.zero is not None:
        return over.zero
    if deg["dp"] > 1:
        notes.append(st.zero_why)
    return st.zero


def _plan_text(p, hw, deg, gbs, model, st, src, notes) -> str:
    over = DOCUMENTS.get(src.document)
    ways = deg["dp"] * deg["fsdp"] * deg["ep"]
    mb = _microbatches(p, gbs, ways, st, notes, deg["pp"])
    remat = _remat(p, st, notes)
    zero = _zero(p, deg, st, over, notes)
    parts = [f"{k}={deg[k]}" for k in ("dp", "fsdp", "tp", "sp", "ep", "pp") if deg[k] > 1] or [
        "dp=1"
    ]
    parts += [f"microbatch={mb}", f"remat={remat}", f"zero={zero}"]
    if sched := _schedule(p, deg["pp"], model.n_layers, st.framework, notes, over):
        parts.append(sched)
    parts += _flags(p, hw, deg["tp"], st, src.document, notes)
    parts += _compiled(p, st, notes)
    parts.append(f"optimizer={_optimizer(over, st, notes)}")
    return ",".join(parts)


def _optimizer(over: Any, st: StackDefaults, notes: list[str]) -> str:
    """The optimizer policy: the table's own where its runs differ from the stack's default."""
    if over is None or over.optimizer is None:
        return st.optimizer
    notes.append(over.optimizer_why)
    return over.optimizer


def _document_optimizer(imported: _Imported, document: str, text: str, notes: list[str]) -> Plan:
    """An imported plan with the document's optimizer policy where its snippet left the
    gradient dtype to the importer's (present-day) default, e.g. fp16 Megatron-LM's 16-bit
    gradients where today's Megatron reduces in fp32."""
    plan, over = imported.plan, DOCUMENTS.get(document)
    defaulted = {d.key for d in imported.config.defaults}
    stated = any(f"--{k}" in text for k in _GRAD_DTYPE_KEYS)
    if over is None or over.optimizer is None or stated or not defaulted & set(_GRAD_DTYPE_KEYS):
        return plan
    notes.append(over.optimizer_why)
    return replace(plan, optimizer=parse_optimizer(over.optimizer))


def _document_tp_overlap(plan: Plan, document: str) -> Plan:
    """An imported plan whose snippet leaves the TP overlap to the stack (unset) with the
    document's own setting where its version differs (2021/2022 Megatron-LM: none)."""
    over = DOCUMENTS.get(document)
    if plan.collective_matmul is not None or over is None or over.collective_matmul is None:
        return plan
    return replace(plan, collective_matmul=over.collective_matmul if plan.degrees.tp > 1 else None)


# Megatron settings that decide the gradient dtype (the importer fills the first by default)
_GRAD_DTYPE_KEYS = ("grad-reduce-in-bf16", "accumulate-allreduce-grads-in-fp32")


def _document_stack(framework: str, document: str, p: dict, notes: list[str]) -> Any:
    """The stack as a document ran it where its version differs from the profile (None: the
    profile itself), e.g. 2021 Megatron-LM without a flash attention kernel, TP communication
    overlap, or (with its local DDP) a gradient all-reduce overlapped with the backward pass."""
    over = DOCUMENTS.get(document)
    if over is None:
        return None
    from roofline.core.stack import stack_of
    from roofline.specs.framework import AttentionKernel, OverlapClass

    stack = stack_of(framework)
    if over.attention_kernel is not None:
        notes.append(over.kernel_why)
        stack = stack.with_attention_kernel(AttentionKernel(over.attention_kernel), over.kernel_why)
    if over.collective_matmul is False:
        # the plan says collective_matmul=0 (_flags): the TP overlap off; a version whose TP
        # collectives also ran outside any GEMM when off (no async path) has a stack of its own
        why = over.tp_serial_why or over.why
        if over.tp_serial_why:
            stack = stack.without_overlap(OverlapClass.TENSOR, why, serial=True)
        if why not in notes:
            notes.append(why)
    if over.ddp is not None and str(p.get("ddp_impl") or over.ddp).lower() in over.ddp_serial:
        notes.append(over.ddp_why)
        stack = stack.without_overlap(OverlapClass.GRAD_REDUCE, over.ddp_why)
    changed = over.attention_kernel is not None or bool(over.tp_serial_why)
    return stack if changed or over.ddp is not None else None


# words of published precision strings in the profiles' vocabulary
_PRECISION_WORDS = {"float8": "fp8", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def _words(text: str) -> list[str]:
    return [_PRECISION_WORDS.get(w, w) for w in re.findall(r"[a-z0-9]+", text.lower())]


def read_recipe(stack: Any, precision: str) -> Any:
    """The stack's precision recipe a published string names: by name or alias, else by the
    format it computes in (`compute_dtype`: "Float8 linears (torchao) + bf16" is fp8), choosing
    among the stack's recipes of that format the one whose name shares most words with the
    string (rowwise, current, blockwise, mx...; the profile's first on a tie). None when the
    string names no format the stack has a recipe for."""
    try:
        return stack.recipe(precision)
    except RooflineError:
        pass
    words = _words(precision)
    fmt = compute_dtype(precision)
    cands = [
        r
        for r in stack.framework.precision.recipes.values()
        if compute_format(r.dtype("dense")) == fmt
    ]

    def shared(r: Any) -> int:
        return len(set(words) & {w for a in (r.name, *r.aliases) for w in _words(a)})

    return max(cands, key=shared, default=None)  # max keeps the first of equals


def _document_precision(document: str, precision: str, hw: dict, notes: list[str]) -> str:
    """The stack recipe a document's precision label stands for on the run's chip family
    (`DocumentOverride.precisions`), else the label itself."""
    over = DOCUMENTS.get(document)
    family = str(hw.get("chip_family") or "")
    for label, chips, recipe in over.precisions if over else ():
        if re.fullmatch(label, precision.strip(), re.I) and re.fullmatch(chips, family, re.I):
            notes.append(over.precision_why)
            return recipe
    return precision


def _dtypes_text(precision: str, framework: str, notes: list[str]) -> str:
    """The compute dtypes of the run's precision recipe in its stack's profile (e.g. NeMo FP8:
    dense and expert matmuls fp8, attention and the LM head bf16), as plan keys."""
    from roofline.core.stack import stack_of

    if not precision.strip():
        return ""
    st = stack_of(framework)
    recipe = read_recipe(st, precision)
    if recipe is None:
        notes.append(f"precision {precision!r} is not a recipe of {framework}: bf16 assumed")
        return ""
    keys = st.dtypes(recipe.name).describe()
    if keys:
        notes.append(
            f"precision {precision!r} = {framework} recipe {recipe.name!r}: {', '.join(keys)}"
        )
    return "".join("," + k for k in keys)


def _recipe_text(src: Source, m: dict, hw: dict, p: dict, notes: list[str]) -> str:
    """Plan keys the benchmark's own recipe sets beyond the stack's defaults (sources.RECIPES)."""
    r = recipe_for(
        src.family,
        str(m.get("name") or ""),
        str(hw.get("chip_family") or ""),
        str(p.get("precision") or ""),
    )
    if r is None:
        return ""
    if "remat=" in r.plan and not p.get("remat"):  # the recipe states what the row leaves out
        notes[:] = [n for n in notes if n != defaults_for(src.stack).remat_why]
    notes.append(r.why)
    return "," + r.plan


@dataclass(frozen=True)
class _Imported:
    config: Any  # launch.LaunchConfig
    plan: Plan
    framework: str


def _imported(entry: dict, chips: int, hand: str, notes: list[str]) -> _Imported | None:
    """The run's `config:` snippet (`{stack, text}`: the stack's own launch settings as its
    source prints them) read by the stack's importer (`launch.read_launch`); its plan, batch
    and sequence length win over the hand-mapped fields. None without a snippet."""
    snippet = entry.get("config")
    if snippet is None:
        return None
    from roofline.launch import read_launch

    if not isinstance(snippet, dict) or not snippet.get("stack") or not snippet.get("text"):
        raise _Skip("config: is a mapping with `stack` and `text` (the stack's own settings)")
    try:
        config = read_launch(
            str(snippet["text"]),
            source=f"{entry.get('id')} config",
            stack=str(snippet["stack"]),
            chips=chips,
        )
    except RooflineError as e:
        raise _Skip(f"config snippet: {e}") from None
    if config.plan is None:
        raise _Skip(f"config snippet: a {config.kind.value} launch, not a training run")
    spec = config.plan.describe()
    notes.append(
        f"plan imported from the run's {config.stack} settings: {spec}"
        + ("" if parse_plan(hand) == config.plan else f" (hand-mapped: {hand})")
    )
    notes.extend(f"{config.stack} default {d.key} = {d.value!r}" for d in config.defaults)
    notes.extend(f"{u.key} = {u.value!r}: {u.reason}" for u in config.unsupported)
    framework = config.options.get("framework") or snippet["stack"]
    return _Imported(config, config.plan, str(framework))


MAXTEXT_BATCHES = (12, 8, 4, 2, 1)  # per_device_batch_size: base.yml default 12, then halving


def _default_maxtext_batch(
    p, hw, deg, chips, seq, model, system, st, src, notes
) -> tuple[int, str]:
    """MaxText layout unpublished: the largest per-device batch <= the default 12 whose plan fits."""
    for b in MAXTEXT_BATCHES:
        trial: list[str] = []
        text = _plan_text(p, hw, deg, b * chips, model, st, src, trial)
        cost = evaluate_plan(model, system, Workload(float(b * chips * seq), seq), parse_plan(text))
        if cost.fits or b == MAXTEXT_BATCHES[-1]:
            notes.extend(trial)
            notes.append(
                f"global batch unstated: per_device_batch_size {b} × {chips} chips (MaxText default 12, "
                + ("the default" if b == 12 else "halved until the plan fits HBM")
                + ")"
            )
            return b * chips, text
    raise AssertionError("unreachable")


def _map(entry, src, hw, p, m, chips, dtype, notes):
    st = defaults_for(src.stack)
    built, chip, seq = _basics(entry, src, hw, m, chips, notes)
    model = built.spec
    lay = _layout(p, hw, chips, st, src.stack, notes)
    choice = system_for(chip, chips, _num(hw.get("slices")) or 1)
    if choice.system is None:
        raise _Skip(choice.reason)
    try:
        if lay.defaulted and src.stack == "maxtext":
            gbs, plan_text = _default_maxtext_batch(
                p, hw, lay.deg, chips, seq, model, choice.system, st, src, notes
            )
        else:
            gbs = _global_batch(p, seq, lay.deg["dp"] * lay.deg["fsdp"] * lay.deg["ep"], notes)
            plan_text = _plan_text(p, hw, lay.deg, gbs, model, st, src, notes)
    except _Skip as e:
        if lay.defaulted:
            raise _Skip(
                f"parallel layout not published, and the stack default ({st.layout_why}) fails: {e}"
            ) from None
        raise
    precision = _document_precision(src.document, str(p.get("precision") or ""), hw, notes)
    plan_text += _dtypes_text(precision, st.framework, notes)
    plan_text += _recipe_text(src, m, hw, p, notes)
    try:
        plan = parse_plan(plan_text)
    except RooflineError as e:
        raise _Skip(f"plan {plan_text} cannot be expressed: {e}") from None
    framework = st.framework
    if (imported := _imported(entry, chips, plan_text, notes)) is not None:
        plan = _document_optimizer(imported, src.document, _text_of(entry.get("config")), notes)
        plan = _document_tp_overlap(plan, src.document)
        plan_text, framework = plan.describe(), imported.framework
        gbs = imported.config.workload.global_batch_sequences or gbs
        seq = imported.config.workload.seq_len or seq
    work = Workload(float(gbs * seq), seq)
    if dtype == "unknown":
        notes.append(
            f"precision {'unstated' if not p.get('precision') else repr(p.get('precision'))}: bf16 assumed"
        )
    params = _params_for(src, built.published_params, model, notes)
    peak_dtype = (
        dtype if src.document in MFU_AT_COMPUTE_PEAK and dtype in ("fp8", "fp4") else "bf16"
    )
    measured, checks = _measure(entry, src, model, chips, seq, gbs, params, chip.peak(peak_dtype))
    inputs = Inputs(
        model,
        choice.system,
        work,
        plan,
        plan_text,
        framework,
        dtype if dtype != "unknown" else "bf16",
        choice.assumed,
        _document_stack(framework, src.document, p, notes),
    )
    return inputs, measured, checks, params, lay.defaulted
