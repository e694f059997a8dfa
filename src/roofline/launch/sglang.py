"""`python -m sglang.launch_server ...` (or `sglang serve`) read into the serving plan vocabulary,
and written back out.

SGLang's semantics (sgl-project/sglang v0.4.10 python/sglang/srt/server_args.py, tp_worker.py;
v0.5.23 arg_groups/fields/parallel.py):

- `--tp-size T` (`--tp`, an argparse abbreviation) is the server's GPU count per pipeline stage;
- `--dp-size D --enable-dp-attention` (v0.5.23: `--attn-dp-size D`) runs attention D ways data
  parallel inside those T GPUs, each rank with T/D attention-TP GPUs (T % D == 0), while the MLP /
  experts stay over all T: the plan's tp = T/D, dp = D;
- `--dp-size D` without DP attention runs D copies of the server behind SGLang's router;
- `--ep-size E` (`--ep`) splits the experts E ways over the T GPUs; the v0.4 switches
  `--enable-ep-moe` / `--enable-deepep-moe` set E = T;
- `--max-running-requests N` and `--chunked-prefill-size C` are per server and divided by D
  under DP attention (tp_worker.py:127-133, server_args.py:423 at v0.4.10);
- `--speculative-algorithm EAGLE|EAGLE3|NEXTN --speculative-num-steps S` drafts S tokens a step.

Defaults, flags and dtype tables: launch/defaults/sglang.toml.
"""

from __future__ import annotations

import re

from roofline.launch.base import Default, LaunchConfig, LaunchError, Unsupported
from roofline.launch.serving_common import (
    Reading,
    ServingPlan,
    is_moe,
    kv_value,
    load_table,
    model_spec,
    quant_method,
    read_command_line,
    replicas_comment,
    replicas_in,
    serving_config,
    serving_plan,
    shell_line,
)

STACK = "sglang"
KIND = "serving"
_RUNS = re.compile(r"sglang\.launch_server|(^|[\s/])sglang\s+serve\b", re.M)


def sniff(text: str, path: str = "") -> int:
    """100 for a file that starts SGLang's server, else 0."""
    return 100 if _RUNS.search(text) else 0


def read(text: str, *, source: str = "<text>", chips: int | None = None) -> LaunchConfig:
    """The serving LaunchConfig of the first SGLang server line in `text`."""
    r, positionals = read_command_line(text, STACK, source)
    r.model = _model(r, positionals)
    _parallel(r, replicas_in(text))
    _limits(r)
    r.quantization("--quantization", r.take("--quantization"))
    r.kv_dtype("--kv-cache-dtype", r.take("--kv-cache-dtype"))
    _speculative(r)
    r.check_moe_split("--ep-size")
    return serving_config(r, STACK, chips=chips)


def _model(r: Reading, positionals: list[str]) -> str:
    model = r.take("--model-path")
    if not model:
        raise LaunchError(
            f"{r.source}: the SGLang server line names no model",
            rule="SGLang takes the model (a hub id or a path) as --model-path (or --model)",
            fix="add --model-path MODEL, e.g. --model-path deepseek-ai/DeepSeek-V3",
        )
    if positionals:
        r.unsupported.append(
            Unsupported("arguments", " ".join(positionals), "words SGLang's parser would reject")
        )
    return str(model)


def _attention_dp(r: Reading, dp: int) -> tuple[int, int]:
    """(attention-DP degree, server copies): `--attn-dp-size A` (with `--dp-size D` copies), or
    `--dp-size D` with `--enable-dp-attention` (one server), or `--dp-size D` alone (D copies)."""
    attn = r.take("--attn-dp-size")
    if attn is not None:
        return r.integer("--attn-dp-size", attn), dp
    on = r.take("--enable-dp-attention")
    if on is None:
        r.fill("enable_dp_attention")
    return (dp, 1) if on else (1, dp)


def _parallel(r: Reading, replicas: int | None) -> None:
    """The degrees of one server and the copies of it."""
    tp_size = r.degree("tp_size", "--tp-size")
    r.pp = r.degree("pp_size", "--pp-size")
    attn, copies = _attention_dp(r, r.degree("dp_size", "--dp-size"))
    if tp_size % attn:
        raise LaunchError(
            f"{r.source}: attention data parallel {attn} does not divide --tp-size {tp_size}",
            rule="SGLang runs attention-DP ranks inside the TP group: tp_size % dp_size == 0 "
            "(server_args.py:420 at v0.4.10)",
            fix=f"use a dp size in {[d for d in range(1, tp_size + 1) if tp_size % d == 0]}",
        )
    r.tp, r.dp = tp_size // attn, attn
    r.replicas = copies * (replicas or 1)
    r.ep = _experts(r, tp_size)


def _experts(r: Reading, tp_size: int) -> int:
    ep = r.take("--ep-size")
    whole = r.take("--enable-ep-moe", "--enable-deepep-moe")
    if whole:
        return tp_size
    if ep is None:
        r.fill("ep_size")
        return 1
    return r.integer("--ep-size", ep)


def _per_rank(r: Reading, flag: str, value: object) -> int:
    """A per-server limit as SGLang applies it to each attention-DP rank."""
    n = r.integer(flag, value, human=True)
    return max(n // r.dp, 1)


def _limits(r: Reading) -> None:
    ctx = r.take("--context-length")
    if ctx is None:
        r.fill("context_length")
    else:
        r.max_model_len = r.integer("--context-length", ctx, human=True)
    running = r.take("--max-running-requests")
    if running is None:
        r.fill("max_running_requests")
    else:
        r.max_num_seqs = _per_rank(r, "--max-running-requests", running)
    chunk = r.take("--chunked-prefill-size")
    if chunk is None:
        r.fill("chunked_prefill_size")
    elif r.integer("--chunked-prefill-size", chunk, lo=-1) == -1:
        r.unsupported.append(
            Unsupported("--chunked-prefill-size", chunk, "chunked prefill off: whole prompts")
        )
    else:
        r.max_batched_tokens = _per_rank(r, "--chunked-prefill-size", chunk)


def _speculative(r: Reading) -> None:
    algo = r.take("--speculative-algorithm")
    steps = r.take("--speculative-num-steps")
    drafts = r.take("--speculative-num-draft-tokens")
    if algo is None:
        return
    if steps is not None:
        r.draft = r.integer("--speculative-num-steps", steps)
    elif drafts is not None:
        r.draft = max(r.integer("--speculative-num-draft-tokens", drafts) - 1, 1)
    else:
        spec = model_spec(r.model)
        arch = "DeepseekV3ForCausalLM" if getattr(spec, "family", "") == "deepseek" else "other"
        value, source = r.table.defaults["speculative_num_steps"]
        r.draft = int(value[arch])
        r.defaults.append(Default("speculative_num_steps", r.draft, source))
    if str(algo).upper() in ("EAGLE", "EAGLE3", "NEXTN") and r.max_num_seqs is None:
        if "--max-running-requests" not in r.used:
            r.max_num_seqs = max(48 // r.dp, 1)
            r.defaults.append(
                Default(
                    "max_running_requests",
                    48,
                    "sgl-project/sglang v0.4.10 python/sglang/srt/server_args.py:495-496 "
                    "(EAGLE speculative decoding caps the running requests at 48)",
                )
            )
    r.take("--speculative-eagle-topk", "--speculative-draft-model-path")
    r.unsupported.append(
        Unsupported("--speculative-algorithm", algo, "the draft's cost is serve's --draft-cost")
    )


# ------------------------------------------------------------------------------ writing


def write(config: LaunchConfig) -> str:
    """The SGLang server line of a serving plan (with a replicas header when it runs copies)."""
    table = load_table(STACK)
    p = serving_plan(config, STACK)
    words = ["python", "-m", "sglang.launch_server", "--model-path", p.model]
    words += ["--tp-size", str(p.tp * p.dp)]
    header, dp_words = _data_parallel(p)
    words += dp_words
    words += ["--pp-size", str(p.pp)] if p.pp > 1 else []
    words += ["--ep-size", str(p.ep)] if p.ep > 1 else []
    q, kv = quant_method(p, table, STACK), kv_value(p, table, STACK)
    words += ["--quantization", q] if q else []
    words += ["--kv-cache-dtype", kv] if kv else []
    words += _limit_words(config, p)
    words += _draft_words(p)
    return header + shell_line(words)


def _data_parallel(p: ServingPlan) -> tuple[str, list[str]]:
    if p.dp > 1:
        words = ["--dp-size", str(p.dp), "--enable-dp-attention"]
    elif p.replicas > 1 and is_moe(p.model) is False:
        return "", ["--dp-size", str(p.replicas)]
    else:
        words = []
    gpus = p.replicas * p.tp * p.pp * p.dp
    return (replicas_comment(p.replicas, gpus) if p.replicas > 1 else ""), words


def _limit_words(config: LaunchConfig, p: ServingPlan) -> list[str]:
    w = config.workload
    out: list[str] = []
    if w.max_model_len is not None:
        out += ["--context-length", str(w.max_model_len)]
    if w.max_num_seqs is not None:
        out += ["--max-running-requests", str(w.max_num_seqs * p.dp)]
    if w.max_batched_tokens is not None:
        out += ["--chunked-prefill-size", str(w.max_batched_tokens * p.dp)]
    return out


def _draft_words(p: ServingPlan) -> list[str]:
    """EAGLE over the model's own MTP modules (NEXTN), else n-gram lookup (no draft model)."""
    if not p.draft:
        return []
    spec = model_spec(p.model)
    if spec is not None and getattr(spec, "n_mtp_modules", 0):
        return [
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-num-steps",
            str(p.draft),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(p.draft + 1),
        ]
    return ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(p.draft + 1)]


__all__ = ["KIND", "STACK", "read", "sniff", "write"]
