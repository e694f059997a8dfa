"""Inference and serving runs (measured_inference.yaml, measured_serving_aic.yaml) -> typed records.

A `ServingRun` holds what a serving model needs to re-predict one measurement: the model
(ModelSpec, with MoE/MLA and the attention notes), the chip and chip count, the
parallelism per role (aggregated: one worker layout; disaggregated: prefill and decode
workers), weight / activation / KV-cache precision, the engine (name, version), the
workload (mode, ISL, OSL, concurrency or request rate or batch) and the measured TTFT,
TPOT and output throughput — each kept separately, never folded into one number.

Skip rules (docs/validate.md, "Serving"): quality 'suspect'; GPU count unknown; chip not in
the catalog; model dims missing; linear-attention layers (Gated-DeltaNet hybrids) and DSA
sparse attention without a catalog model that gives their layer pattern and dims (or whose
dims disagree with the entry's), Mamba layers (not modelled); prompt/output lengths given only
as a dataset (ShareGPT) distribution; disaggregated entries without worker counts.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace
from typing import Any

from roofline.specs.chip import Chip
from roofline.specs.model import ModelSpec
from roofline.validate.dims import _int, build_model
from roofline.validate.systems import chip_for_family


class Metric(enum.StrEnum):
    TTFT = "ttft"  # request sent -> first token (s), queueing included
    TPOT = "tpot"  # decode time per output token after the first (s)
    THROUGHPUT = "throughput"  # output tokens/s of the whole deployment


@dataclass(frozen=True)
class Parallel:
    """One worker's layout (engine conventions: dp = attention data parallel, ep/moe_tp for experts)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    moe_tp: int = 1
    workers: int = 1  # replicas (aggregated) or workers of this role (disaggregated)
    batch: int | None = None  # per attention-DP rank
    gpus_per_worker: int | None = None


@dataclass(frozen=True)
class Precision:
    weights: str  # dense GEMM weights: bf16 | fp8 | fp8_block | nvfp4 | int8 | int4
    moe_weights: str  # expert weights (= weights for dense models)
    activations: str
    kv_cache: str
    as_published: str


@dataclass(frozen=True)
class ServingWorkload:
    mode: str  # offline | online-rate | concurrency | fixed-batch | aggregated | disaggregated
    isl: int | None = None
    osl: int | None = None
    concurrency: int | None = None
    request_rate_rps: float | None = None
    batch: int | None = None
    harness: str = ""  # the benchmark client that measured it (aiconfigurator | genai-perf | ...)


@dataclass(frozen=True)
class ServingMeasured:
    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens_per_s: float | None = None  # whole deployment
    statistic: str = "unknown"  # mean | median | unknown
    conversions: tuple[str, ...] = ()

    def value(self, metric: Metric) -> float | None:
        return {
            Metric.TTFT: self.ttft_s,
            Metric.TPOT: self.tpot_s,
            Metric.THROUGHPUT: self.output_tokens_per_s,
        }[metric]


@dataclass(frozen=True)
class ServingRun:
    id: str
    schema: str  # inference | serving
    engine: str  # trtllm | vllm | sglang | jetstream | nim | ...
    engine_version: str
    model_name: str
    model: ModelSpec | None
    attention: str  # the entry's attention note (MLA, sliding window, hybrid linear, ...)
    chip_family: str
    chip: Chip | None
    chips: int | None
    disaggregated: bool
    parallel: Parallel | None  # aggregated layout
    prefill: Parallel | None
    decode: Parallel | None
    precision: Precision
    workload: ServingWorkload
    measured: ServingMeasured
    defaults: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    skipped_reason: str = ""

    @property
    def mapped(self) -> bool:
        return not self.skipped_reason


def _pos(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if v > 0 else None


_ENGINES = (
    ("tensorrt", "trtllm"),
    ("trt-llm", "trtllm"),
    ("vllm", "vllm"),
    ("sglang", "sglang"),
    ("jetstream", "jetstream"),
    ("nim", "nim"),
)


def engine_key(name: str) -> str:
    low = name.lower()
    return next(
        (k for pat, k in _ENGINES if pat in low),
        re.sub(r"[^a-z0-9]+", "-", low).strip("-") or "unknown",
    )


def _dtype(text: str) -> str:
    low = str(text).lower()
    for pat, key in (
        ("nvfp4", "nvfp4"),
        ("mxfp4", "mxfp4"),
        ("fp4", "nvfp4"),
        ("fp8_block", "fp8_block"),
        ("block", "fp8_block"),
        ("fp8", "fp8"),
        ("int4", "int4"),
        ("int8", "int8"),
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("fp16", "fp16"),
    ):
        if pat in low:
            return key
    return ""


def _precision(pr: Any, model: ModelSpec | None, notes: list[str]) -> Precision:
    pr = pr if isinstance(pr, dict) else {}
    raw = "; ".join(f"{k}={v}" for k, v in pr.items())
    w = _dtype(pr.get("gemm_mode") or "") or _dtype(pr.get("weights") or "")
    if not w:
        w = "bf16"
        notes.append(f"weight precision unstated ({pr.get('weights', 'absent')!r}): bf16 assumed")
    moe = _dtype(pr.get("moe_mode") or "") or w
    note = str(pr.get("note", "")).lower()
    if "mxfp4" in note:
        moe = "mxfp4"
        notes.append("expert weights MXFP4 (checkpoint note)")
    if "bf16 attention" in note:
        # the checkpoint stores its attention (and shared experts) in BF16 and the engine loads
        # them as stored: the entry's GEMM label is the benchmark's, not the weights'
        w = "bf16"
        notes.append("dense weights BF16 (checkpoint note: only the routed experts are quantised)")
    act = _dtype(pr.get("activations") or "") or ("bf16" if w in ("int4", "int8", "mxfp4") else w)
    kv = _dtype(pr.get("kv_cache") or "")
    if not kv:
        kv = "bf16"
        notes.append(
            "KV-cache precision unstated: bf16 (the engines' 'auto' = model activation dtype)"
        )
    return Precision(w, moe if model and model.moe else w, act, kv, raw)


def _parallel(p: Any) -> Parallel:
    p = p if isinstance(p, dict) else {}
    return Parallel(
        tp=_int(p.get("tp")) or 1,
        pp=_int(p.get("pp")) or 1,
        dp=_int(p.get("dp")) or 1,
        ep=_int(p.get("ep")) or 1,
        moe_tp=_int(p.get("moe_tp")) or 1,
        workers=_int(p.get("workers")) or _int(p.get("replicas")) or 1,
        batch=_int(p.get("batch")) or _int(p.get("batch_per_replica")),
        gpus_per_worker=_int(p.get("gpus_per_worker")),
    )


_ID_LAYOUT = re.compile(r"_tp(\d+)_ep(\d+)_")


def _label_layout(
    rid: str, par: Parallel, chips: int | None, notes: list[str]
) -> tuple[Parallel, int | None]:
    """An aggregated entry whose tp field is its own id's tp label multiplied by the label's ep
    (`..._tp2_ep2_...` with tp 4 = 2·2, moe_tp 2, ep 2): the dump artefact the runs file's header
    names for its `gpus_per_worker_gt_node` flag ("tp or dp multiplied by ep"), here below the
    node size so unflagged. The launch the label names (TensorRT-LLM --tp_size 2 --ep_size 2)
    runs the experts over ep of the same tp GPUs, so the worker is tp·pp·dp chips of the label's
    tp. Entries whose fields agree with their label (or carry none) are left as stated."""
    hit = _ID_LAYOUT.search(rid)
    if hit is None:
        return par, chips
    tp, ep = int(hit.group(1)), int(hit.group(2))
    if ep < 2 or tp == par.tp or tp * ep != par.tp or tp % ep:
        return par, chips
    fixed = replace(par, tp=tp, ep=ep, moe_tp=tp // ep, gpus_per_worker=tp * par.pp * par.dp)
    gpus = tp * par.pp * par.dp * max(par.workers, 1)
    notes.append(
        f"tp {par.tp} = the id's tp{tp} × ep{ep} (dump artefact): tp={tp}, ep={ep} on "
        f"{gpus} GPUs, not {chips}"
    )
    return fixed, gpus


def _mode(text: str, disagg: bool) -> str:
    low = text.lower()
    if disagg or "disagg" in low:
        return "disaggregated"
    for pat, key in (
        ("aggregated", "aggregated"),
        ("offline", "offline"),
        ("poisson", "online-rate"),
        ("online", "online-rate"),
        ("concurrency", "concurrency"),
        ("fixed-batch", "fixed-batch"),
        ("latency", "fixed-batch"),
        ("serving benchmark", "batch"),
    ):
        if pat in low:
            return key
    return low or "unknown"


_HARNESSES = (
    ("genai-perf", "genai-perf"),
    ("perf_analyzer", "genai-perf"),
    ("bench_serving", "bench-serving"),
    ("benchmark_serving", "bench-serving"),
    ("vllm bench", "bench-serving"),
)


def _harness(text: str, schema: str) -> str:
    """The benchmark client named in the workload text; the serving file's header names its
    own (AIConfigurator's measured sample)."""
    if schema == "serving":
        return "aiconfigurator"
    low = text.lower()
    return next((key for pat, key in _HARNESSES if pat in low), "")


def _workload(w: Any, disagg: bool, schema: str = "") -> ServingWorkload:
    w = w if isinstance(w, dict) else {}
    rate = w.get("request_rate_rps")
    return ServingWorkload(
        mode=_mode(str(w.get("mode", "")), disagg),
        isl=_int(w.get("isl")),
        osl=_int(w.get("osl")),
        concurrency=_int(w.get("concurrency")),
        request_rate_rps=float(rate) if isinstance(rate, (int, float)) else None,
        batch=_int(w.get("batch_size")) or _int(w.get("batch")),
        harness=_harness(str(w.get("mode", "")), schema),
    )


def _measured(meas: Any, work: ServingWorkload, schema: str) -> ServingMeasured:
    m = meas if isinstance(meas, dict) else {}
    conv: list[str] = []
    stat = "mean (assumed, per the file header)" if schema == "serving" else "unknown"
    ttft = _pos(m.get("ttft_ms"))
    if (v := _pos(m.get("median_ttft_ms"))) is not None:
        ttft, stat = v, "median"
    tpot = _pos(m.get("median_tpot_ms")) or _pos(m.get("tpot_ms"))
    if tpot is None and (v := _pos(m.get("itl_ms"))) is not None:
        tpot = v
        conv.append("tpot = itl_ms (AIPerf inter_token_latency: per output token after the first)")
    thr = next(
        (
            v
            for k in (
                "total_output_tokens_per_sec",
                "output_tokens_per_sec",
                "throughput_tokens_per_sec",
            )
            if (v := _pos(m.get(k))) is not None
        ),
        None,
    )
    lat = _pos(m.get("mean_latency_ms"))
    if thr is None and lat and work.mode == "fixed-batch" and work.batch and work.osl:
        thr = work.batch * work.osl / (lat / 1000)
        conv.append(f"throughput = batch {work.batch} × osl {work.osl} / mean latency {lat:g} ms")
    return ServingMeasured(
        ttft / 1000 if ttft else None, tpot / 1000 if tpot else None, thr, stat, tuple(conv)
    )


def _skip_reason(
    e: dict,
    model_reason: str,
    chip: Chip | None,
    chip_why: str,
    chips: int | None,
    work: ServingWorkload,
    attention: str,
) -> str:
    mode = (e.get("workload") if isinstance(e.get("workload"), dict) else {}).get("mode", "")
    if not isinstance(mode, str):
        return f"workload mode {mode!r} is a {type(mode).__name__}, not a text such as 'offline'"
    if str(e.get("quality", "clean")).lower() == "suspect":
        return "quality flag 'suspect': " + ", ".join(map(str, e.get("flags") or [])) or "suspect"
    if model_reason:
        return model_reason
    if chip is None:
        return chip_why
    if not chips:
        return "GPU count unknown"
    if work.isl is None or work.osl is None:
        return "prompt/output lengths not given (a dataset distribution such as ShareGPT)"
    return ""


_LINEAR = "linear-attention layers (Gated-DeltaNet/Mamba hybrid)"
_DSA = "DSA sparse attention (top-k indexer)"


def _catalog_model(m: dict) -> ModelSpec | None:
    """The catalog model an entry names (its checkpoint, else its name), or None."""
    from roofline.errors import RooflineError
    from roofline.specs.model_catalog import load_model

    for key in (m.get("checkpoint"), m.get("name")):
        if isinstance(key, str) and key.strip() and not key.endswith((".toml", ".json")):
            try:
                return load_model(key.strip())
            except RooflineError:
                continue
    return None


def _disagreements(spec: ModelSpec, preset: ModelSpec, attention: str) -> list[str]:
    """Fields where the entry (its dims and its attention note's numbers) and the catalog
    model differ: a preset is used only for the model the entry measured."""
    out = [
        f
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "vocab", "mla")
        if getattr(spec, f) != getattr(preset, f)
    ]
    a, b = spec.moe, preset.moe
    for f in ("n_experts", "top_k", "d_ff_expert", "n_shared_experts", "dense_layers"):
        if (a is None) != (b is None) or (a and b and getattr(a, f) != getattr(b, f)):
            out.append(f"moe.{f}")
    low = attention.lower()
    lin, dsa = preset.linear, preset.dsa
    said = {
        "linear layers": (r"(\d+) gated-deltanet", lin and preset.n_linear_layers),
        "linear heads": (r"(\d+) k / \d+ v heads", lin and lin.n_key_heads),
        "linear value heads": (r"\d+ k / (\d+) v heads", lin and lin.n_value_heads),
        "index_topk": (r"index_topk (\d+)", dsa and dsa.index_topk),
    }
    for what, (pattern, want) in said.items():
        hit = re.search(pattern, low)
        if hit and int(hit.group(1)) != want:
            out.append(f"{what} ({hit.group(1)} in the note)")
    return out


def _attention_features(
    spec: ModelSpec | None, m: dict, attention: str, notes: list[str]
) -> tuple[ModelSpec | None, str]:
    """An entry whose attention note names linear-attention (Gated DeltaNet) layers or DSA:
    the catalog model of the same dims supplies the layer pattern, the DeltaNet heads and the
    DSA indexer (the entries transcribe only the dense dims); else a skip reason."""
    low = attention.lower()
    linear = any(w in low for w in ("linear", "deltanet", "mamba"))
    dsa = "dsa" in low or "sparse attention" in low
    if spec is None or not (linear or dsa):
        return spec, ""
    what = _LINEAR if linear else _DSA
    if "mamba" in low:
        return spec, f"{what}: Mamba layers are not modelled (Gated DeltaNet layers are)"
    preset = _catalog_model(m)
    if preset is None or (linear and preset.linear is None) or (dsa and preset.dsa is None):
        return spec, (
            f"{what}: no catalog model gives the layer pattern and dims of {spec.name!r} "
            "(add it to specs/models)"
        )
    diff = _disagreements(spec, preset, attention)
    if diff:
        return (
            spec,
            f"{what}: the entry's {', '.join(diff)} differ from catalog model {preset.name}",
        )
    notes.append(f"{what} from catalog model {preset.name} (entry dims agree; {preset.source})")
    return preset.with_(name=spec.name, source=spec.source, aliases=()), ""


def _notes_for(e: dict, attention: str) -> list[str]:
    out = []
    low = attention.lower()
    if "mtp" in low:
        out.append(
            "MTP layer in the checkpoint ignored (speculative decoding not recorded; AIC predicts with nextn=0)"
        )
    if "sinks" in low:
        out.append("attention sinks ignored (a few extra logits per head)")
    if "vision" in low:
        out.append("vision tower unused (text-only requests)")
    return out


def map_serving_run(e: Any, schema: str) -> ServingRun:
    """One inference/serving entry -> ServingRun (mapped, or with a skipped_reason)."""
    if not isinstance(e, dict):
        return _unmapped(str(e)[:40], schema, "entry is not a mapping")
    rid = str(e.get("id") or "?")
    eng = e.get("engine") if isinstance(e.get("engine"), dict) else {}
    hw = e.get("hardware") if isinstance(e.get("hardware"), dict) else {}
    m = e.get("model") if isinstance(e.get("model"), dict) else {}
    built = build_model(m, rid)
    notes = list(built.defaults)
    attention = str(m.get("attention") or "")
    notes += _notes_for(e, attention)
    spec, feature_reason = _attention_features(built.spec, m, attention, notes)
    fam = str(hw.get("chip_family") or hw.get("chip") or "")
    chip, chip_why = chip_for_family(fam)
    p = e.get("parallelism") if isinstance(e.get("parallelism"), dict) else {}
    disagg = "prefill" in p and "decode" in p
    work = _workload(e.get("workload"), disagg, schema)
    chips = _int(hw.get("chips"))
    par = None
    if not disagg:
        par, chips = _label_layout(rid, _parallel(p), chips, notes)
    reason = _skip_reason(e, built.reason or feature_reason, chip, chip_why, chips, work, attention)
    if (
        disagg
        and not reason
        and not (_int(p["prefill"].get("workers")) and _int(p["decode"].get("workers")))
    ):
        reason = "disaggregated entry without worker counts"
    return ServingRun(
        id=rid,
        schema=schema,
        engine=engine_key(str(eng.get("name", ""))),
        engine_version=str(eng.get("version", "")),
        model_name=str(m.get("name", "")),
        model=spec,
        attention=attention,
        chip_family=fam,
        chip=chip,
        chips=chips,
        disaggregated=disagg,
        parallel=par,
        prefill=_parallel(p.get("prefill")) if disagg else None,
        decode=_parallel(p.get("decode")) if disagg else None,
        precision=_precision(e.get("precision"), spec, notes),
        workload=work,
        measured=_measured(e.get("measured"), work, schema),
        defaults=tuple(notes),
        flags=tuple(str(f) for f in (e.get("flags") or [])),
        skipped_reason=reason,
    )


def _unmapped(rid: str, schema: str, reason: str) -> ServingRun:
    return ServingRun(
        rid,
        schema,
        "unknown",
        "",
        "",
        None,
        "",
        "",
        None,
        None,
        False,
        None,
        None,
        None,
        Precision("", "", "", "", ""),
        ServingWorkload("unknown"),
        ServingMeasured(),
        skipped_reason=reason,
    )
