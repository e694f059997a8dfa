"""`vllm serve MODEL ...` read into the serving plan vocabulary, and written back out.

vLLM's semantics (vllm-project/vllm v0.33.0; docs serving/data_parallel_deployment.md and
serving/expert_parallel_deployment.md):

- `--tensor-parallel-size T` (`-tp`) and `--pipeline-parallel-size P` (`-pp`) split one engine;
- `--data-parallel-size D` (`-dp`) runs D engines. For a dense model they are D replicas; for a
  MoE model they are D attention-data-parallel ranks of one server whose expert layers span all
  T x D GPUs — tensor-parallel by default, expert-parallel with `--enable-expert-parallel`
  (`-ep`), which splits the experts over all T x D GPUs (the plan's `ep = tp x dp`);
- `--max-num-seqs` and `--max-num-batched-tokens` are per engine (per DP rank);
- `--speculative-config '{"method": ..., "num_speculative_tokens": N}'` drafts N tokens
  (`--speculative-config.num_speculative_tokens N`, `--spec-tokens N` and the v0.7
  `--num-speculative-tokens N` say the same).

Defaults, flags and dtype tables: launch/defaults/vllm.toml.
"""

from __future__ import annotations

import json
import re
from typing import Any

from roofline.launch.base import Default, LaunchConfig, LaunchError, Problem, Unsupported
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

STACK = "vllm"
KIND = "serving"
_RUNS = re.compile(
    r"(^|[\s/])vllm\s+serve\b|vllm\.entrypoints\.openai\.api_server|\svllm/vllm-openai\b", re.M
)


def sniff(text: str, path: str = "") -> int:
    """100 for a file that runs `vllm serve` (or vLLM's OpenAI server module), else 0."""
    return 100 if _RUNS.search(text) else 0


def read(text: str, *, source: str = "<text>", chips: int | None = None) -> LaunchConfig:
    """The serving LaunchConfig of the first `vllm serve` line in `text`."""
    r, positionals = read_command_line(text, STACK, source)
    r.model = _model(r, positionals)
    _parallel(r, replicas_in(text))
    _limits(r)
    r.quantization("--quantization", r.take("--quantization"))
    r.kv_dtype("--kv-cache-dtype", r.take("--kv-cache-dtype"))
    _speculative(r)
    _context_parallel(r)
    return serving_config(r, STACK, chips=chips)


def _model(r: Reading, positionals: list[str]) -> str:
    flag = r.take("--model")
    if positionals and flag is not None and positionals[0] != flag:
        r.problems.append(
            Problem("--model", f"two models: {positionals[0]} (positional) and {flag} (--model)")
        )
    model = positionals[0] if positionals else flag
    if not model:
        raise LaunchError(
            f"{r.source}: `vllm serve` names no model",
            rule="vllm serve takes the model (a hub id or a path) as its first argument",
            fix="write `vllm serve MODEL ...` (e.g. vllm serve meta-llama/Llama-3.1-70B-Instruct)",
        )
    if len(positionals) > 1:
        r.problems.append(
            Problem("arguments", f"words vLLM would reject: {' '.join(positionals[1:])}")
        )
    return str(model)


def _parallel(r: Reading, replicas: int | None) -> None:
    """Degrees: tp, pp, and the DP ranks as attention-DP (a MoE model) or replicas (dense)."""
    r.tp = r.degree("tensor_parallel_size", "--tensor-parallel-size")
    r.pp = r.degree("pipeline_parallel_size", "--pipeline-parallel-size")
    dp = r.degree("data_parallel_size", "--data-parallel-size")
    ep_flag = r.take("--enable-expert-parallel")
    if ep_flag is None:
        r.fill("enable_expert_parallel")
    moe = True if ep_flag else is_moe(r.model)
    if dp > 1 and moe:
        r.dp = dp
    else:
        r.replicas = dp
        if dp > 1 and moe is None:
            r.problems.append(
                Problem(
                    "--data-parallel-size",
                    f"the catalog does not know {r.model}: its {dp} data-parallel ranks are read "
                    "as replicas (a dense model); for a MoE model they are attention-DP ranks",
                )
            )
    r.ep = r.tp * r.dp if ep_flag else 1
    r.replicas *= replicas or 1


def _limits(r: Reading) -> None:
    for attr, flag, key in (
        ("max_model_len", "--max-model-len", "max_model_len"),
        ("max_num_seqs", "--max-num-seqs", "max_num_seqs"),
        ("max_batched_tokens", "--max-num-batched-tokens", "max_num_batched_tokens"),
    ):
        v = r.take(flag)
        if v is None:
            r.fill(key)
        else:
            setattr(r, attr, r.integer(flag, v, human=True))
    chunked = r.take("--enable-chunked-prefill")
    if chunked is False and r.max_batched_tokens and r.max_model_len:
        if r.max_batched_tokens < r.max_model_len:
            r.problems.append(
                Problem(
                    "--max-num-batched-tokens",
                    f"{r.max_batched_tokens} tokens per step cannot hold a {r.max_model_len}-token "
                    "prompt with chunked prefill off (vLLM refuses to start)",
                )
            )


def _spec_config(r: Reading) -> dict[str, Any]:
    raw = r.take("--speculative-config")
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        cfg = json.loads(raw)
    except (json.JSONDecodeError, TypeError):
        cfg = None
    if not isinstance(cfg, dict):
        raise LaunchError(
            f"{r.source}: --speculative-config {str(raw)[:80]!r} is not a JSON object",
            rule="vLLM's --speculative-config is JSON, e.g. "
            '\'{"method": "eagle3", "model": "...", "num_speculative_tokens": 3}\'',
            fix="quote the JSON in single quotes, keys in double quotes",
        )
    return cfg


def _speculative(r: Reading) -> None:
    cfg = _spec_config(r)
    method = r.take("--spec-method") or cfg.get("method")
    tokens = r.take("--spec-tokens", "--num-speculative-tokens")
    tokens = tokens if tokens is not None else cfg.get("num_speculative_tokens")
    legacy_model = r.take("--speculative-model")
    if tokens is None and (method or legacy_model or cfg):
        spec = model_spec(r.model)
        n = getattr(spec, "n_mtp_modules", 0) if spec is not None else 0
        if not (method and "mtp" in str(method) and n):
            raise LaunchError(
                f"{r.source}: speculative decoding without a draft length",
                rule="vLLM needs num_speculative_tokens (MTP methods default to the model's "
                "MTP module count, which the catalog does not know here)",
                fix='add "num_speculative_tokens": N to --speculative-config',
            )
        tokens = n
        r.defaults.append(
            Default(
                "speculative_config.num_speculative_tokens",
                n,
                "vllm-project/vllm v0.33.0 vllm/config/speculative.py: MTP methods default "
                "num_speculative_tokens to the model's num_nextn_predict_layers",
            )
        )
    if tokens is not None:
        r.draft = r.integer("num_speculative_tokens", tokens)
    if method:
        r.unsupported.append(
            Unsupported("speculative method", method, "the draft's cost is serve's --draft-cost")
        )


def _context_parallel(r: Reading) -> None:
    for flag in ("--decode-context-parallel-size", "--prefill-context-parallel-size"):
        v = r.take(flag)
        if v is not None and r.integer(flag, v) > 1:
            r.unsupported.append(
                Unsupported(flag, v, "context parallelism: `serve --plan` has no such degree")
            )


# ------------------------------------------------------------------------------ writing


def write(config: LaunchConfig) -> str:
    """The `vllm serve` line of a serving plan (with a replicas header when it runs copies)."""
    table = load_table(STACK)
    p = serving_plan(config, STACK)
    words = ["vllm", "serve", p.model, "--tensor-parallel-size", str(p.tp)]
    if p.pp > 1:
        words += ["--pipeline-parallel-size", str(p.pp)]
    header, dp = _data_parallel(p)
    if dp > 1:
        words += ["--data-parallel-size", str(dp)]
    if p.ep > 1:
        words.append("--enable-expert-parallel")
    q, kv = quant_method(p, table, STACK), kv_value(p, table, STACK)
    words += ["--quantization", q] if q else []
    words += ["--kv-cache-dtype", kv] if kv else []
    words += _limit_words(config)
    if p.draft:
        words += ["--speculative-config", json.dumps(_draft_config(p))]
    return header + shell_line(words)


def _data_parallel(p: ServingPlan) -> tuple[str, int]:
    """(replicas header, --data-parallel-size), or a LaunchError for a split vLLM lacks."""
    moe = is_moe(p.model)
    if p.ep > 1 and p.ep != p.tp * p.dp:
        raise LaunchError(
            f"vLLM cannot express ep={p.ep} with tp={p.tp}, dp={p.dp}",
            rule="vLLM splits a MoE model's experts over all tp x dp GPUs "
            "(--enable-expert-parallel) or none (tensor-parallel experts)",
            fix=f"use ep={p.tp * p.dp} or ep=1",
        )
    if p.dp > 1 and moe is False:
        raise LaunchError(
            f"vLLM cannot express attention data parallelism (dp={p.dp}) for the dense {p.model}",
            rule="vLLM's data-parallel ranks of a dense model are independent replicas",
            fix="export the plan with dp=1 over more GPUs (replicas), or a MoE model",
        )
    if p.dp == 1 and moe is False and p.replicas > 1:
        return "", p.replicas
    header = replicas_comment(p.replicas, p.replicas * p.tp * p.pp * p.dp) if p.replicas > 1 else ""
    return header, p.dp


def _limit_words(config: LaunchConfig) -> list[str]:
    w = config.workload
    out: list[str] = []
    for flag, v in (
        ("--max-model-len", w.max_model_len),
        ("--max-num-seqs", w.max_num_seqs),
        ("--max-num-batched-tokens", w.max_batched_tokens),
    ):
        if v is not None:
            out += [flag, str(v)]
    return out


def _draft_config(p: ServingPlan) -> dict[str, Any]:
    """MTP for a model with MTP modules, else n-gram lookup (no draft model to name)."""
    spec = model_spec(p.model)
    if spec is not None and getattr(spec, "n_mtp_modules", 0):
        return {"method": "mtp", "num_speculative_tokens": p.draft}
    return {"method": "ngram", "num_speculative_tokens": p.draft, "prompt_lookup_max": 4}


__all__ = ["KIND", "STACK", "read", "sniff", "write"]
