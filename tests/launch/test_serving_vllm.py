"""`vllm serve` read and written: vLLM's own flag rules, its data-parallel semantics (replicas
for a dense model, attention-DP ranks for a MoE model), its defaults with their sources, and the
error paths (unknown flag -> the closest one named, bad value, no model)."""

from __future__ import annotations

import pytest

from roofline.launch import LaunchConfig, LaunchError, LaunchKind, LaunchWorkload, vllm


def read(line: str, **kw) -> LaunchConfig:
    return vllm.read(line, source="t.sh", **kw)


def test_flag_spellings_all_read_the_same():
    """-tp, --tensor-parallel-size, --tensor_parallel_size, --tensor-parallel-size=4 and an
    unambiguous prefix (argparse allow_abbrev) are one flag."""
    for flag in (
        "-tp 4",
        "--tensor-parallel-size 4",
        "--tensor_parallel_size 4",
        "--tensor-parallel-size=4",
        "--tensor-parallel 4",
    ):
        assert read(f"vllm serve meta-llama/Llama-3.1-70B-Instruct {flag}").serve_plan == {
            "tp": "4"
        }


def test_dense_model_data_parallel_ranks_are_replicas():
    cfg = read("vllm serve meta-llama/Llama-3.1-70B-Instruct -tp 2 -dp 4")
    assert cfg.serve_plan_text == "tp=2" and cfg.chips == 8


def test_moe_data_parallel_ranks_are_attention_dp_with_experts_over_all():
    cfg = read(
        "vllm serve mistralai/Mixtral-8x7B-Instruct-v0.1 -tp 2 -dp 4 --enable-expert-parallel"
    )
    assert cfg.serve_plan_text == "tp=2,dp=4,ep=8" and cfg.chips == 8
    # without EP the experts are tensor-parallel over all tp x dp GPUs: ep = 1
    assert (
        read("vllm serve mistralai/Mixtral-8x7B-Instruct-v0.1 -tp 2 -dp 4").serve_plan_text
        == "tp=2,dp=4"
    )


def test_unknown_model_dp_is_read_as_replicas_and_said_so():
    cfg = read("vllm serve acme/some-model -dp 2")
    assert cfg.chips == 2 and cfg.serve_plan_text == "tp=1"
    assert [p.key for p in cfg.problems] == ["--data-parallel-size"]


def test_the_model_may_follow_the_flags():
    """argparse takes a word no flag consumes as the positional model_tag."""
    assert read("vllm serve --port 8000 meta-llama/Llama-3.1-8B-Instruct -tp 2").model == (
        "meta-llama/Llama-3.1-8B-Instruct"
    )


def test_human_readable_lengths():
    """vLLM's human_readable_int: 32k = 32000, 32K = 32768."""
    assert read("vllm serve x --max-model-len 32k").workload.max_model_len == 32000
    assert read("vllm serve x --max-model-len 32K").workload.max_model_len == 32768
    assert read("vllm serve x --max-num-batched-tokens 1.5k").workload.max_batched_tokens == 1500


def test_defaults_are_filled_with_their_source():
    cfg = read("vllm serve meta-llama/Llama-3.1-8B-Instruct")
    by_key = {d.key: d for d in cfg.defaults}
    assert by_key["tensor_parallel_size"].value == 1
    assert by_key["max_num_seqs"].value[">=70GiB-not-A100"] == 1024
    assert by_key["max_num_batched_tokens"].value[">=70GiB-not-A100"] == 8192
    assert all("vllm-project/vllm v0.33.0 vllm/" in d.source for d in by_key.values())
    assert cfg.workload.max_num_seqs is None  # left to the engine profile


def test_quantization_and_kv_flags():
    cfg = read("vllm serve meta-llama/Llama-3.1-70B-Instruct -q fp8 --kv-cache-dtype fp8_e4m3")
    assert (cfg.options["weight_dtype"], cfg.options["compute_dtype"]) == ("fp8", "fp8")
    assert cfg.options["kv_dtype"] == "fp8"
    awq = read(
        "vllm serve hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4 --quantization awq_marlin"
    )
    assert (awq.options["weight_dtype"], awq.options["compute_dtype"]) == ("int4", "bf16")


def test_quantizing_at_load_leaves_the_kv_cache_in_the_models_dtype():
    """`-q fp8` on a bf16 checkpoint quantizes the weights at load; the KV cache stays bf16
    ('auto' follows the checkpoint). A ModelOpt FP8 checkpoint declares an FP8 cache."""
    assert read("vllm serve meta-llama/Llama-3.1-70B-Instruct -q fp8").options["kv_dtype"] == "bf16"
    assert read("vllm serve nvidia/Llama-3.3-70B-Instruct-FP8").options["kv_dtype"] == "fp8"


def test_checkpoint_name_gives_the_weights_when_no_flag_does():
    cfg = read("vllm serve nvidia/Llama-3.3-70B-Instruct-FP4")
    assert (cfg.options["weight_dtype"], cfg.options["compute_dtype"]) == ("nvfp4", "fp4")
    assert any(d.key == "weights" and "NVFP4" in d.source for d in cfg.defaults)


def test_speculative_config_spellings():
    json_form = read(
        """vllm serve x --speculative-config '{"method": "eagle3", "model": "y", "num_speculative_tokens": 4}'"""
    )
    dotted = read(
        "vllm serve x --speculative-config.method eagle3 --speculative-config.num_speculative_tokens 4"
    )
    legacy = read("vllm serve x --speculative-model y --num-speculative-tokens 4")
    assert {c.options["draft"] for c in (json_form, dotted, legacy)} == {"4"}


def test_mtp_without_a_count_takes_the_models_mtp_modules():
    cfg = read(
        """vllm serve deepseek-ai/DeepSeek-V3 -tp 8 --speculative-config '{"method": "deepseek_mtp"}'"""
    )
    assert cfg.options["draft"] == "1"  # DeepSeek-V3 has one MTP module (its config.json)


def test_an_abbreviation_several_value_flags_share_reads_with_a_problem():
    """A published line that ran under a release with fewer flags (`--max-num 8` when only one
    flag began so) is read, its word kept as written and named, not guessed."""
    cfg = read("vllm serve x --max-num 8")
    assert cfg.settings["--max-num"] == "8"
    assert [p.key for p in cfg.problems] == ["--max-num"]
    assert "--max-num-seqs" in cfg.problems[0].message


def test_switches_negate():
    cfg = read("vllm serve x --no-enable-prefix-caching --disable-chunked-prefill")
    assert cfg.settings["--enable-prefix-caching"] is False
    assert cfg.settings["--enable-chunked-prefill"] is False


def test_chunked_prefill_off_with_a_small_token_budget_is_a_problem():
    cfg = read(
        "vllm serve x --no-enable-chunked-prefill --max-num-batched-tokens 2048 --max-model-len 8192"
    )
    assert [p.key for p in cfg.problems] == ["--max-num-batched-tokens"]


def test_everything_else_is_named_never_dropped():
    cfg = read(
        "vllm serve x --port 8001 --gpu-memory-utilization 0.85 --block-size 32 --enforce-eager"
    )
    reasons = {u.key: u.reason for u in cfg.unsupported}
    assert "not a cost input" in reasons["--port"]
    assert "engine_profile" in reasons["--gpu-memory-utilization"]
    assert "has no input for" in reasons["--block-size"]
    assert "--enforce-eager" in reasons


def test_devices_given_hold_whole_servers_or_are_a_problem():
    more = read("vllm serve x -tp 8", chips=32)  # four copies of the TP8 server
    assert more.chips == 32 and not more.problems
    assert [(d.key, d.value) for d in more.defaults if d.key == "replicas"] == [("replicas", 4)]
    odd = read("vllm serve x -tp 8", chips=12)
    assert odd.chips == 8 and [p.key for p in odd.problems] == ["chips"]


@pytest.mark.parametrize(
    "line, words",
    [
        ("vllm serve x --tensor-paralel-size 8", ["unknown vLLM flag", "--tensor-parallel-size"]),
        ("vllm serve x --max-num-seq 8 --max-num-seqz 4", ["unknown", "--max-num-seqs"]),
        ("vllm serve x -tp eight", ["--tensor-parallel-size", "eight", "whole number"]),
        ("vllm serve x -tp 0", ["whole number from 1 to 2^30"]),
        ("vllm serve x -tp 8 4", ["given 2 values"]),
        ("vllm serve x --max-model-len 1e12", ["1e12"]),
        ("vllm serve x --kv-cache-dtype fp9", ["fp9", "closest known"]),
        ("vllm serve x --max-model-len", ["needs a value"]),
        ("vllm serve x --enforce-eager=yes", ["switch"]),
        ("vllm serve --port 8000", ["names no model"]),
        ("vllm serve x --speculative-config '{bad'", ["not a JSON object"]),
        ("python train.py --lr 1", ["no line runs vLLM"]),
        ("vllm serve x --kv-cache fp8", ["ambiguous", "--kv-cache-dtype", "--kv-cache-metrics"]),
    ],
)
def test_error_paths(line, words):
    with pytest.raises(LaunchError) as e:
        read(line)
    msg = str(e.value)
    assert all(w in msg for w in words), msg


def _config(model: str, plan: dict, chips: int, **options) -> LaunchConfig:
    return LaunchConfig(
        stack="vllm",
        kind=LaunchKind.SERVING,
        model=model,
        serve_plan=plan,
        chips=chips,
        options={"engine": "vllm", **options},
        workload=LaunchWorkload(max_num_seqs=256, max_batched_tokens=16384, max_model_len=32768),
    )


@pytest.mark.parametrize(
    "model, plan, chips, opts",
    [
        ("llama-3.1-70b", {"tp": "8"}, 8, {}),
        (
            "llama-3.1-70b",
            {"tp": "4"},
            16,
            {"weight_dtype": "fp8", "compute_dtype": "fp8", "kv_dtype": "fp8"},
        ),
        (
            "llama-3.1-70b",
            {"tp": "4", "pp": "2"},
            8,
            {"weight_dtype": "int4", "compute_dtype": "bf16"},
        ),
        ("mixtral-8x7b", {"tp": "2", "dp": "4", "ep": "8"}, 8, {}),
        ("mixtral-8x7b", {"tp": "4"}, 8, {}),  # 2 replicas of a MoE server: the header says so
        (
            "deepseek-v3",
            {"tp": "1", "dp": "8", "ep": "8"},
            8,
            {"weight_dtype": "fp8_block", "compute_dtype": "fp8", "draft": "2"},
        ),
        ("qwen3-8b", {"tp": "1"}, 1, {"draft": "3"}),
    ],
)
def test_written_plans_read_back(model, plan, chips, opts):
    cfg = _config(model, plan, chips, **opts)
    text = vllm.write(cfg)
    back = read(text)
    assert back.serve_plan == plan and back.chips == chips
    for k in ("weight_dtype", "compute_dtype", "draft"):
        assert back.options.get(k) == (
            {"weight_dtype": "bf16", "compute_dtype": "bf16"} | opts
        ).get(k), k
    assert (back.workload.max_num_seqs, back.workload.max_model_len) == (256, 32768)


def test_writer_names_what_vllm_cannot_express():
    with pytest.raises(LaunchError, match="ep=4"):
        vllm.write(_config("mixtral-8x7b", {"tp": "8", "ep": "4"}, 8))
    with pytest.raises(LaunchError, match="dense"):
        vllm.write(_config("llama-3.1-70b", {"tp": "4", "dp": "2"}, 8))
    with pytest.raises(LaunchError, match="quantization method"):
        vllm.write(
            _config("llama-3.1-70b", {"tp": "8"}, 8, weight_dtype="fp8", compute_dtype="fp4")
        )
    with pytest.raises(LaunchError, match="whole servers"):
        vllm.write(_config("llama-3.1-70b", {"tp": "8"}, 12))
