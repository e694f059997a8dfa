"""`roofline model NAME|config.json`: the itemised ledger of a model (params, FLOPs, bytes).

Like nanoGPT's sizing notebook: one row per einsum with its share of parameters and
FLOPs, then totals with the arithmetic (6·N·tokens vs the ledger; 2·L·K·H·bytes KV).
With `--chip`, each row's roofline (time, bound) at the given batch × seq.
"""

from __future__ import annotations

import argparse
import math

from roofline.cli._common import add_json, emit, int_flag, model_source
from roofline.core.ledger import (
    Causal,
    DtypePolicy,
    OpKind,
    build_ledger,
    count_params,
    kv_cache_bytes_per_token,
)
from roofline.core.roofline import analyze_ledger
from roofline.errors import SpecError
from roofline.specs.chip import load_chip
from roofline.specs.model import ModelSpec
from roofline.specs.model_catalog import load_model
from roofline.units import dtype_bytes, fmt_bytes, fmt_count, fmt_flops, fmt_time

NAME = "model"
HELP = "Ledger of one model (preset or config.json): parameters, FLOPs and bytes per einsum, KV cache, roofline per op."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model", help="preset name (see `roofline models`), model TOML, or Hugging Face config.json"
    )
    p.add_argument(
        "--seq", default=None, help="query tokens per sequence T (default: min(4096, max_seq_len))"
    )
    p.add_argument("--batch", default="1", help="sequences B (default 1)")
    p.add_argument(
        "--kv-seq",
        default=None,
        help="key/value length S (default: = seq; decode: --seq 1 --kv-seq 8192)",
    )
    p.add_argument("--kv-dtype", default="bf16", help="KV-cache dtype (default bf16)")
    p.add_argument("--weight-dtype", default="bf16", help="weight dtype (default bf16)")
    p.add_argument(
        "--causal",
        choices=[c.value for c in Causal],
        default=Causal.HALF.value,
        help="attention FLOPs: half = only the unmasked half (default), full = the book's dense 12BT²NH",
    )
    p.add_argument(
        "--chip", default=None, help="also price every row on this chip (roofline time and bound)"
    )
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="with --chip: write a roofline chart of the rows (.png, .svg, .pdf)",
    )
    add_json(p)


MAX_SEQ = 1 << 30  # tokens in one sequence (1,073,741,824), as roofline.specs.model.MAX_SEQ
MAX_BATCH = 1 << 24  # sequences in one pass
MAX_TOKENS = 1 << 40  # B·T: beyond a trillion tokens in one pass nothing is physical


def _shape(args: argparse.Namespace, model: ModelSpec) -> tuple[int, int, int | None]:
    seq = (
        int_flag(args.seq, "seq", hi=MAX_SEQ, example="4096")
        if args.seq is not None
        else min(4096, model.max_seq_len)
    )
    batch = int_flag(args.batch, "batch", hi=MAX_BATCH, example="8")
    kv_seq = (
        int_flag(args.kv_seq, "kv-seq", hi=MAX_SEQ, example="8192")
        if args.kv_seq is not None
        else None
    )
    if batch * seq > MAX_TOKENS:
        raise SpecError(
            f"--batch {args.batch} × --seq {seq} = {batch * seq:,} tokens in one pass",
            rule=f"a pass holds at most {MAX_TOKENS:,} tokens (2^40)",
            fix="give a smaller batch or sequence",
        )
    return seq, batch, kv_seq


def _kv_formula(m: ModelSpec, kv_dtype: str) -> str:
    b = dtype_bytes(kv_dtype)
    L = m.n_attention_layers  # a hybrid's linear layers cache no tokens
    if m.mla is not None:
        a = m.mla
        idx = f" + {m.dsa.index_head_dim}·{L}·1 (DSA fp8 index key)" if m.dsa else ""
        text = (
            f"(kv_lora + rope)·L·bytes = ({a.kv_lora_rank} + {a.qk_rope_head_dim})·{L}·{b:g}{idx}"
        )
    else:
        text = f"2·L·K·H·bytes = 2·{L}·{m.n_kv_heads}·{m.d_head}·{b:g}"
    if m.linear is not None:
        text += f" over the {L} full-attention layers + the linear layers' fixed state / context"
    return text


def _ledger(
    model: ModelSpec,
    seq: int,
    batch: int,
    kv_seq: int | None,
    kv_dtype: str,
    weight_dtype: str,
    causal: Causal,
):
    return build_ledger(
        model,
        batch=batch,
        seq=seq,
        kv_seq=kv_seq,
        dtypes=DtypePolicy(weights=weight_dtype, kv=kv_dtype),
        causal=causal,
    )


def result(
    model: ModelSpec,
    *,
    seq: int,
    batch: int = 1,
    kv_seq: int | None = None,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
    causal: Causal = Causal.HALF,
    chip_name: str | None = None,
) -> dict:
    """Everything `model` reports, as plain data (per-token FLOPs are self-attention at length `seq`)."""
    led = _ledger(model, seq, batch, kv_seq, kv_dtype, weight_dtype, causal)
    pc = count_params(model)
    tokens = batch * seq
    rows = led.rows()
    tot_p, tot_f = led.params or 1.0, led.flops or 1.0
    for r in rows:
        r["params_share"] = r["params"] / tot_p
        r["flops_share"] = r["flops"] / tot_f
    # per token of this ledger (equals ledger.flops_per_token(model, seq) when kv_seq is None)
    fwd_tok = sum(o.flops for o in led if o.kind != OpKind.ELEMENTWISE) / tokens
    train_tok = 3 * fwd_tok
    matmul_params = sum(o.params for o in led if o.kind == OpKind.MATMUL)
    active_matmul = matmul_params - (pc.total - pc.active)
    attn_fwd = sum(o.flops for o in led if o.kind == OpKind.ATTENTION) / tokens
    kv_tok = kv_cache_bytes_per_token(model, kv_dtype, context=kv_seq or seq)
    out: dict = {
        "params": pc.total,
        "active_params": pc.active,
        **_conventions(model, pc),
        "params_breakdown": dict(pc.breakdown),
        "train_flops_per_token": train_tok,
        "forward_flops_per_token": fwd_tok,
        "kv_cache_bytes_per_token": kv_tok,
        "kv_cache_bytes": kv_tok * batch * (kv_seq or seq),
        "tokens": tokens,
        "kv_tokens": batch * (kv_seq or seq),
        "totals": {
            "ledger_params": led.params,
            "ledger_forward_flops": led.flops,
            "ledger_bytes": led.bytes,
            "active_matmul_params": active_matmul,
            "six_n_flops_per_token": 6 * active_matmul,
            "attention_train_flops_per_token": 3 * attn_fwd,
            "train_over_six_n": train_tok / (6 * active_matmul) if active_matmul else None,
        },
        "ledger": rows,
        "model": model.to_dict(),
    }
    if chip_name is not None:
        chip = load_chip(chip_name)
        priced = analyze_ledger(led, chip)
        out["roofline"] = {
            "chip": chip.name,
            "rows": [{"name": op.name, **r.to_dict()} for op, r in priced],
            "time_lower_s": sum(float(r.time_lower_s) for _, r in priced),
            "time_upper_s": sum(float(r.time_upper_s) for _, r in priced),
        }
    return out


ACTIVE_CONVENTION = (
    "active_params counts every weight a token uses: the input embedding table, attention, "
    "dense and shared-expert MLPs, the router, norms, the unembedding, and top_k of the "
    "n_experts routed experts (their parameters × k/E); active_params_without_embedding leaves "
    "out the input embedding table (a lookup, no FLOPs), as OpenAI's gpt-oss card counts. "
    "Publishers differ: compare like with like"
)


def _conventions(model: ModelSpec, pc) -> dict:
    """What the counts include: the MoE active-parameter convention and DeepSeek's MTP modules."""
    embed = pc.breakdown.get("embed", 0.0)  # 0 when tied: the table then serves the unembedding
    out: dict = {
        "active_params_without_embedding": pc.active - embed,
        "active_params_convention": ACTIVE_CONVENTION,
        "mtp_modules": model.n_mtp_modules,
    }
    if model.n_mtp_modules:
        out["mtp_params_excluded"] = model.n_mtp_modules * _mtp_module_params(model, pc)
        out["mtp_note"] = (
            f"params exclude the {model.n_mtp_modules} multi-token-prediction module(s) (MTP), "
            "as the published total does (DeepSeek-V3: 671B; the HF hub lists 685B = 671B + the "
            "MTP module's ~14B including its own embedding and head copies); mtp_params_excluded "
            "estimates one module as one more MoE layer plus its 2D×D projection and norms"
        )
    return out


def _mtp_module_params(model: ModelSpec, pc) -> float:
    """One DeepSeek MTP module: a Transformer layer like the last (MoE) one + a [2D, D] projection."""
    attn = sum(v for k, v in pc.breakdown.items() if k.startswith("attn/")) / model.n_layers
    if model.n_moe_layers:
        mlp = sum(v for k, v in pc.breakdown.items() if k.startswith("moe/")) / model.n_moe_layers
    else:
        mlp = pc.breakdown.get("mlp", 0.0) / max(model.n_dense_layers, 1)
    D = model.d_model
    return attn + mlp + 2 * D * D + (model.norms_per_layer + 2) * D


def _by_block(breakdown: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in breakdown.items():
        out[k.split("/")[0]] = out.get(k.split("/")[0], 0.0) + v
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _g(x: float | None, spec: str = ".4g") -> str:
    """A number for a table cell; '-' where there is none (an infinite intensity: no bytes)."""
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def _head(model: ModelSpec, seq: int, batch: int, kv_seq: int | None, causal: Causal) -> str:
    from roofline.report.table import kv

    arch = (
        f"{model.name}  (L={model.n_layers} D={model.d_model} F={model.d_ff} N={model.n_heads} "
        f"K={model.n_kv_heads} H={model.d_head} V={model.vocab}, {model.attention.value}"
        + (f", MoE {model.moe.n_experts}x top-{model.moe.top_k}" if model.moe else "")
        + ")"
    )
    shape = (
        f"B={batch} sequences × T={seq} tokens = {batch * seq:g} tokens"
        + (f", attending to S={kv_seq} keys" if kv_seq else "")
        + f"; causal attention counted {causal.value}"
    )
    return kv([("model", arch), ("shape", shape)])


def _ledger_table(res: dict) -> str:
    from roofline.report.table import table

    rows = [
        [
            r["name"],
            r["kind"],
            f"{r['count']:g}",
            fmt_count(r["params"]) if r["params"] else "-",
            _pct(r["params_share"]) if r["params"] else "-",
            fmt_flops(r["flops"]),
            _pct(r["flops_share"]),
            fmt_bytes(r["bytes"]),
            _g(r["intensity"]),
        ]
        for r in res["ledger"]
    ]
    t = res["totals"]
    rows.append(
        ["total", "", "", fmt_count(t["ledger_params"]), "100%", fmt_flops(t["ledger_forward_flops"]),
         "100%", fmt_bytes(t["ledger_bytes"]), ""]
    )  # fmt: skip
    headers = ["row", "kind", "count", "params", "% params", "fwd FLOPs", "% FLOPs", "HBM bytes"]
    return table(rows, [*headers, "FLOP/B"], align="llrrrrrrr")


def _totals_table(res: dict, model: ModelSpec, kv_dtype: str) -> str:
    from roofline.report.table import table

    t = res["totals"]
    N = t["active_matmul_params"]
    blocks = " + ".join(
        f"{k} {fmt_count(v)}" for k, v in _by_block(res["params_breakdown"]).items()
    )
    active = (
        "top-k of E routed experts counted, input embedding included; without it "
        f"{fmt_count(res['active_params_without_embedding'])}"
        if model.moe
        else "dense: = params"
    )
    attn = t["attention_train_flops_per_token"]
    rows = [
        ["params", fmt_count(res["params"]), "Σ rows' weights = " + blocks],
        ["active params", fmt_count(res["active_params"]), active],
        [
            "forward FLOPs/token",
            _g(res["forward_flops_per_token"]),
            f"Σ fwd FLOPs (no elementwise) / (B·T); matmuls 2·N = {2 * N:.4g}, attention {attn / 3:.4g}",
        ],
        ["train FLOPs/token", _g(res["train_flops_per_token"]), "3 × forward (2 fwd + 4 bwd per weight)"],
        [
            "6·N",
            _g(t["six_n_flops_per_token"]),
            f"6 × {fmt_count(N)} active matmul weights; ledger / 6·N = {_g(t['train_over_six_n'], '.4f')} "
            f"(attention dot products add {attn:.4g})",
        ],
        [f"KV cache/token ({kv_dtype})", fmt_bytes(res["kv_cache_bytes_per_token"]), _kv_formula(model, kv_dtype)],
        [f"KV cache (B·S = {res['kv_tokens']:g})", fmt_bytes(res["kv_cache_bytes"]), "per token × B·S"],
    ]  # fmt: skip
    return table(rows, ["total", "value", "arithmetic"], align="lrl")


def _roofline_table(rf: dict) -> list[str]:
    from roofline.report.table import table

    rows = [
        [
            r["name"],
            r["compute_dtype"],
            _g(r["intensity"]) if r["flops"] else "-",
            fmt_time(r["t_math_s"]),
            fmt_time(r["t_mem_s"]),
            fmt_time(r["time_lower_s"]),
            r["bound"],
        ]
        for r in rf["rows"]
    ]
    rows.append(
        ["total", "", "", "", "", fmt_time(rf["time_lower_s"]), f"(upper {fmt_time(rf['time_upper_s'])})"]
    )  # fmt: skip
    first = rf["rows"][0] if rf["rows"] else None
    crit = (
        f"{first['compute_dtype']} critical intensity {_g(first['critical_intensity'])} FLOP/B; "
        if first
        else ""
    )
    return [
        "",
        f"roofline on {rf['chip']} ({crit}T_lower = max(T_math, T_mem), one forward pass)",
        table(
            rows,
            ["row", "compute", "FLOP/B", "T_math", "T_mem", "T_lower", "bound"],
            align="llrrrrl",
        ),
    ]


def _text(
    res: dict,
    model: ModelSpec,
    seq: int,
    batch: int,
    kv_seq: int | None,
    kv_dtype: str,
    causal: Causal,
) -> str:
    parts = [
        _head(model, seq, batch, kv_seq, causal),
        "",
        _ledger_table(res),
        "",
        _totals_table(res, model, kv_dtype),
    ]
    if model.moe:
        parts += ["", "Active parameters: " + ACTIVE_CONVENTION + "."]
    if res.get("mtp_note"):
        excluded = fmt_count(res["mtp_params_excluded"])
        parts += ["", f"MTP: {res['mtp_note']} (≈ {excluded} not counted)."]
    if "roofline" in res:
        parts += _roofline_table(res["roofline"])
    if res.get("plot"):
        parts += ["", f"plot written to {res['plot']}"]
    return "\n".join(parts)


def run(args: argparse.Namespace) -> int:
    model = load_model(args.model)
    seq, batch, kv_seq = _shape(args, model)
    causal = Causal(args.causal)
    if args.plot and not args.chip:
        raise SpecError(
            "--plot needs --chip",
            rule="a roofline chart is drawn against one chip's peak and bandwidth",
            fix="add e.g. --chip tpu-v5e",
        )
    res = result(
        model,
        seq=seq,
        batch=batch,
        kv_seq=kv_seq,
        kv_dtype=args.kv_dtype,
        weight_dtype=args.weight_dtype,
        causal=causal,
        chip_name=args.chip,
    )
    if args.plot:
        from roofline.report.plots import roofline_chart

        chip = load_chip(args.chip)
        led = _ledger(model, seq, batch, kv_seq, args.kv_dtype, args.weight_dtype, causal)
        res["plot"] = str(
            roofline_chart(
                analyze_ledger(led, chip),
                chip,
                args.plot,
                title=f"{model.name} on {chip.name}, B={batch} T={seq}",
            )
        )
    inputs = {
        "model": model.name,
        **model_source(args.model),  # "preset" (catalog name) or "file" (TOML / config.json)
        "seq": seq,
        "batch": batch,
        "kv_seq": kv_seq,
        "kv_dtype": args.kv_dtype,
        "weight_dtype": args.weight_dtype,
        "causal": causal.value,
        "chip": args.chip,
    }
    return emit(
        args, NAME, inputs, res, _text(res, model, seq, batch, kv_seq, args.kv_dtype, causal)
    )
