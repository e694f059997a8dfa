"""`trtllm-serve MODEL ...` and its LLM-API options YAML read into the serving plan vocabulary,
and written back out (the YAML as a here-document in front of the command).

TensorRT-LLM's semantics (NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py, llmapi/llm_args.py,
mapping.py; docs "trtllm-serve" and the DeepSeek-R1 / Llama recipes):

- `--tp_size T --pp_size P` (YAML `tensor_parallel_size`, `pipeline_parallel_size`) run T x P
  GPUs; the YAML given by `--extra_llm_api_options FILE` (`--config FILE` later) overrides the
  options it repeats;
- `enable_attention_dp: true` runs attention T ways data parallel (one sequence batch per GPU):
  the plan's tp = 1, dp = T;
- `--ep_size E` (`moe_expert_parallel_size`) splits the experts E ways over the T GPUs; left out
  (and `moe_tensor_parallel_size` too) the experts are tensor-parallel (mapping.py: E = 1);
- `--max_batch_size` (per attention-DP rank), `--max_num_tokens`, `--max_seq_len`;
- `kv_cache_config: {dtype: fp8}`; `speculative_config: {decoding_type: MTP,
  num_nextn_predict_layers: N}` (Eagle / NGram / DraftTarget: `max_draft_len: N`).

A script that writes the YAML with `cat > FILE <<EOF` is read whole; a YAML named but not in the
script is read from beside the script when it is there, else named as a problem.

Defaults, options, YAML keys and dtype tables: launch/defaults/trtllm.toml.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from roofline.launch.base import LaunchConfig, LaunchError, Problem, Unsupported, closest_hint
from roofline.launch.serving_common import (
    Reading,
    ServingPlan,
    checkpoint_quant,
    command_words,
    companion_file,
    kv_value,
    load_table,
    model_spec,
    parse_args,
    replicas_comment,
    replicas_in,
    serving_config,
    serving_plan,
    shell_line,
)

STACK = "trtllm"
KIND = "serving"
YAML_NAME = "extra_llm_api_options.yaml"
_RUNS = re.compile(r"(^|[\s/])trtllm-serve\b", re.M)
# keys only the LLM-API options YAML has (no other stack's YAML carries them)
_YAML_MARKS = (
    "enable_attention_dp",
    "kv_cache_config",
    "cuda_graph_config",
    "moe_config",
    "moe_expert_parallel_size",
    "disable_overlap_scheduler",
    "print_iter_log",
    "use_cuda_graph",
)


def sniff(text: str, path: str = "") -> int:
    """100 for a `trtllm-serve` script, 60 for an LLM-API options YAML, else 0."""
    if _RUNS.search(text):
        return 100
    doc = _yaml_or_none(text)
    if isinstance(doc, dict) and any(k in doc for k in _YAML_MARKS):
        return 60
    return 0


def _yaml_or_none(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def read(text: str, *, source: str = "<text>", chips: int | None = None) -> LaunchConfig:
    """The serving LaunchConfig of a `trtllm-serve` script (with its YAML) or of the YAML alone."""
    table = load_table(STACK)
    r = Reading(table, source)
    doc = _yaml_or_none(text)
    if not isinstance(doc, dict) and (_RUNS.search(text) or not isinstance(doc, list)):
        words, notes = command_words(text, table, source)
        args = parse_args(words, table, source)
        r.options, r.problems = dict(args.options), notes + args.problems
        r.model = _model(r, args.positionals)
        r.options.update(_extra_options(r, text))
    else:
        r.options = _yaml_options(r, text)
        model = r.take("model")
        if model is not None and not isinstance(model, str):
            raise LaunchError(
                f"{source}: model: {model!r}",
                rule="the LLM API's model is a hub id or a checkpoint path (a string)",
                fix="write model: deepseek-ai/DeepSeek-R1",
            )
        r.model = model
    _parallel(r, replicas_in(text))
    _limits(r)
    r.quantization("quantization", None)
    kv = _kv_dtype(r, r.take("kv_cache_config"))
    old = r.take("kv_cache_dtype")  # TorchLlmArgs.kv_cache_dtype before kv_cache_config.dtype
    r.kv_dtype("kv_cache_config.dtype", kv if kv is not None else old)
    _speculative(r)
    r.check_moe_split("--ep_size")
    return serving_config(r, STACK, chips=chips)


def _model(r: Reading, positionals: list[str]) -> str:
    if not positionals:
        raise LaunchError(
            f"{r.source}: `trtllm-serve` names no model",
            rule="trtllm-serve takes the model (a hub id, checkpoint or engine path) first",
            fix="write `trtllm-serve MODEL ...`",
        )
    if len(positionals) > 1:
        r.problems.append(Problem("arguments", f"extra words: {' '.join(positionals[1:])}"))
    return positionals[0]


def _yaml_options(r: Reading, text: str) -> dict[str, Any]:
    """The options YAML as a mapping of known keys, or a LaunchError naming the closest."""
    doc = _yaml_or_none(text)
    if doc is None and text.strip():
        raise LaunchError(
            f"{r.source}: not YAML",
            rule="TensorRT-LLM's LLM-API options are a YAML mapping",
            fix="check the indentation and colons",
        )
    if not isinstance(doc, dict):
        raise LaunchError(
            f"{r.source}: the options YAML is a {type(doc).__name__}, not a mapping",
            rule="TensorRT-LLM's LLM-API options are a YAML mapping of option: value",
            fix="write e.g. `enable_attention_dp: true`",
        )
    keys = r.table.raw["yaml"]["keys"]
    for k in doc:
        if k not in keys:
            raise LaunchError(
                f"{r.source}: unknown TensorRT-LLM option {k!r}{closest_hint(str(k), keys)}",
                rule="keys are the LLM API's arguments (launch/defaults/trtllm.toml [yaml])",
                fix="correct or drop the key",
            )
    return dict(doc)


def _extra_options(r: Reading, text: str) -> dict[str, Any]:
    """The YAML `--extra_llm_api_options` names: from the script's here-document, from beside
    the script, or (neither) a problem."""
    name = r.take("--extra_llm_api_options")
    if name is None:
        return {}
    body = companion_file(text, r.source, str(name))
    if body is None:
        r.problems.append(
            Problem("--extra_llm_api_options", f"{name} is not in the script: its options not read")
        )
        return {}
    yaml_options = _yaml_options(r, body)
    for flag, key in (
        ("--tp_size", "tensor_parallel_size"),
        ("--ep_size", "moe_expert_parallel_size"),
    ):
        if (
            flag in r.options
            and key in yaml_options
            and str(r.options[flag]) != str(yaml_options[key])
        ):
            r.problems.append(
                Problem(
                    key, f"the YAML's {key}: {yaml_options[key]} overrides {flag} {r.options[flag]}"
                )
            )
    return yaml_options


def _parallel(r: Reading, replicas: int | None) -> None:
    tp_size = r.degree("tp_size", "tensor_parallel_size", "--tp_size")
    r.pp = r.degree("pp_size", "pipeline_parallel_size", "--pp_size")
    adp = r.take("enable_attention_dp")
    if adp is None:
        r.fill("enable_attention_dp")
    if not isinstance(adp, (bool, type(None))):
        raise LaunchError(
            f"{r.source}: enable_attention_dp: {adp!r}",
            rule="enable_attention_dp is true or false",
            fix="write enable_attention_dp: true",
        )
    r.tp, r.dp = (1, tp_size) if adp else (tp_size, 1)
    r.ep = _experts(r, tp_size)
    r.replicas = replicas or 1
    cp = r.take("context_parallel_size")
    if cp is not None and r.integer("context_parallel_size", cp) > 1:
        r.unsupported.append(
            Unsupported(
                "context_parallel_size", cp, "context parallelism: no `serve --plan` degree"
            )
        )


def _experts(r: Reading, tp_size: int) -> int:
    ep = r.take("moe_expert_parallel_size", "--ep_size")
    if ep is not None:
        return r.integer("--ep_size", ep)
    moe_tp = r.take("moe_tensor_parallel_size")
    if moe_tp is not None:
        return max(tp_size // r.integer("moe_tensor_parallel_size", moe_tp), 1)
    r.fill("ep_size")
    return 1


def _limits(r: Reading) -> None:
    for attr, keys, default in (
        ("max_num_seqs", ("max_batch_size", "--max_batch_size"), "max_batch_size"),
        ("max_batched_tokens", ("max_num_tokens", "--max_num_tokens"), "max_num_tokens"),
        ("max_model_len", ("max_seq_len", "--max_seq_len"), "max_seq_len"),
    ):
        v = r.take(*keys)
        if v is None:
            r.fill(default)
        else:
            setattr(r, attr, r.integer(keys[1], v))


def _kv_dtype(r: Reading, kv_config: Any) -> Any:
    if kv_config is None:
        return None
    if not isinstance(kv_config, dict):
        raise LaunchError(
            f"{r.source}: kv_cache_config is a {type(kv_config).__name__}",
            rule="kv_cache_config is a mapping, e.g. {dtype: fp8, free_gpu_memory_fraction: 0.9}",
            fix="write kv_cache_config:\\n  dtype: fp8",
        )
    for k, v in kv_config.items():
        if k != "dtype":
            key = f"kv_cache_config.{k}"
            reason = (
                "serve has no flag for it: engine_profile(config) puts it in the engine's profile"
                if key in r.table.raw.get("engine", {})
                else "not a `serve` input"
            )
            r.unsupported.append(Unsupported(key, v, reason))
    return kv_config.get("dtype")


def _speculative(r: Reading) -> None:
    cfg = r.take("speculative_config")
    if cfg is None:
        return
    kinds = r.table.raw["speculative"]
    kind = cfg.get("decoding_type") if isinstance(cfg, dict) else None
    key = r.choice("speculative_config.decoding_type", kind, kinds)
    n = cfg.get(key)
    if n is None and key == "num_nextn_predict_layers":
        n = 1  # MTPDecodingConfig.num_nextn_predict_layers default (llm_args.py)
    if n is None:
        raise LaunchError(
            f"{r.source}: speculative_config ({kind}) without {key}",
            rule=f"TensorRT-LLM's {kind} decoding needs {key}, the tokens drafted a step",
            fix=f"add `{key}: 3` under speculative_config",
        )
    r.draft = r.integer(f"speculative_config.{key}", n)
    r.unsupported.append(
        Unsupported("speculative_config.decoding_type", kind, "draft cost: --draft-cost")
    )


# ------------------------------------------------------------------------------ writing


def write(config: LaunchConfig) -> str:
    """A script: the LLM-API options YAML as a here-document, then the `trtllm-serve` line."""
    table = load_table(STACK)
    p = serving_plan(config, STACK)
    _check_quant(p)
    if p.dp > 1 and p.tp > 1:
        raise LaunchError(
            f"TensorRT-LLM cannot express tp={p.tp} with attention dp={p.dp}",
            rule="TensorRT-LLM's attention DP runs attention one GPU per rank (tp = 1) "
            "over all tp_size GPUs",
            fix=f"use tp=1,dp={p.tp * p.dp} or tp={p.tp * p.dp},dp=1",
        )
    options = _yaml_doc(config, p, table)
    words = ["trtllm-serve", p.model, "--tp_size", str(p.tp * p.dp), "--pp_size", str(p.pp)]
    words += ["--ep_size", str(p.ep)] if p.ep > 1 else []
    words += ["--extra_llm_api_options", YAML_NAME]
    header = replicas_comment(p.replicas, p.replicas * p.tp * p.pp * p.dp) if p.replicas > 1 else ""
    body = yaml.safe_dump(options, sort_keys=False)
    return f"{header}cat > {YAML_NAME} <<'EOF'\n{body}EOF\n" + shell_line(words)


def _check_quant(p: ServingPlan) -> None:
    own = checkpoint_quant(p.model)
    weights, compute = (own.weights, own.compute) if own else ("bf16", "bf16")
    if (p.weights, p.compute) != (weights, compute):
        raise LaunchError(
            f"TensorRT-LLM serves {p.model} in its checkpoint's own format ({weights} weights), "
            f"not {p.weights} weights with {p.compute} compute",
            rule="trtllm-serve reads the quantization from the checkpoint (hf_quant_config.json); "
            "it has no flag to quantize at load",
            fix="name a checkpoint in that format (e.g. nvidia/...-FP8 or -FP4), or export the "
            "checkpoint's own dtype",
        )


def _yaml_doc(config: LaunchConfig, p: ServingPlan, table: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if p.dp > 1:
        doc["enable_attention_dp"] = True
    w = config.workload
    for key, v in (
        ("max_batch_size", w.max_num_seqs),
        ("max_num_tokens", w.max_batched_tokens),
        ("max_seq_len", w.max_model_len),
    ):
        if v is not None:
            doc[key] = v
    kv = kv_value(p, table, STACK)
    if kv:
        doc["kv_cache_config"] = {"dtype": kv}
    if p.draft:
        doc["speculative_config"] = _draft(p)
    return doc


def _draft(p: ServingPlan) -> dict[str, Any]:
    spec = model_spec(p.model)
    if spec is not None and getattr(spec, "n_mtp_modules", 0):
        return {"decoding_type": "MTP", "num_nextn_predict_layers": p.draft}
    return {"decoding_type": "NGram", "max_draft_len": p.draft, "max_matching_ngram_size": 4}


__all__ = ["KIND", "STACK", "YAML_NAME", "read", "sniff", "write"]
