"""`trtllm-serve` and its LLM-API options YAML read and written: attention DP over tp_size, the
experts' default split (tensor-parallel), the YAML overriding the command line, here-documents,
and the error paths (unknown option or YAML key -> the closest one named, bad values)."""

from __future__ import annotations

import pytest

from roofline.launch import LaunchConfig, LaunchError, LaunchKind, LaunchWorkload, trtllm

M = "trtllm-serve deepseek-ai/DeepSeek-R1"


def read(text: str, **kw) -> LaunchConfig:
    return trtllm.read(text, source="t.sh", **kw)


def script(yaml_body: str, flags: str) -> str:
    return f"cat > opts.yml <<EOF\n{yaml_body}EOF\n{M} {flags} --extra_llm_api_options opts.yml\n"


def test_tp_alone_splits_experts_tensor_parallel():
    """mapping.py: moe_ep_size and moe_tp_size both unset give ep = 1 (experts TP over tp_size)."""
    cfg = read(f"{M} --tp_size 8")
    assert cfg.serve_plan_text == "tp=8" and cfg.chips == 8
    assert any(d.key == "ep_size" for d in cfg.defaults)


def test_attention_dp_runs_one_gpu_per_rank():
    cfg = read(script("enable_attention_dp: true\n", "--tp_size 8 --ep_size 8"))
    assert cfg.serve_plan_text == "tp=1,dp=8,ep=8" and cfg.chips == 8


def test_moe_tp_gives_the_expert_split():
    cfg = read("tensor_parallel_size: 8\nmoe_tensor_parallel_size: 2\n")
    assert cfg.serve_plan_text == "tp=8,ep=4"


def test_the_yaml_overrides_the_command_line_and_says_so():
    cfg = read(script("tensor_parallel_size: 4\n", "--tp_size 8"))
    assert cfg.serve_plan == {"tp": "4"}
    assert [p.key for p in cfg.problems] == ["tensor_parallel_size"]


def test_a_yaml_the_script_does_not_hold_is_a_problem(tmp_path):
    cfg = read(f"{M} --tp_size 8 --extra_llm_api_options elsewhere.yml")
    assert [p.key for p in cfg.problems] == ["--extra_llm_api_options"]
    (tmp_path / "opts.yml").write_text("enable_attention_dp: true\n")
    (tmp_path / "run.sh").write_text(f"{M} --tp_size 8 --extra_llm_api_options opts.yml\n")
    beside = trtllm.read((tmp_path / "run.sh").read_text(), source=str(tmp_path / "run.sh"))
    assert beside.serve_plan_text == "tp=1,dp=8" and not beside.problems


def test_the_later_config_flag_is_the_same_option():
    cfg = read(
        f"cat > c.yml <<'EOF'\nenable_attention_dp: true\nEOF\n{M} --tp_size 4 --config c.yml\n"
    )
    assert cfg.serve_plan_text == "tp=1,dp=4"


@pytest.mark.parametrize(
    "spec, draft",
    [
        ("{decoding_type: MTP, num_nextn_predict_layers: 3}", "3"),
        ("{decoding_type: MTP}", "1"),  # MTPDecodingConfig default
        ("{decoding_type: Eagle, max_draft_len: 4, speculative_model_dir: x}", "4"),
        ("{decoding_type: NGram, max_draft_len: 2}", "2"),
    ],
)
def test_speculative_configs(spec, draft):
    assert read(f"tensor_parallel_size: 8\nspeculative_config: {spec}\n").options["draft"] == draft


def test_the_earlier_top_level_kv_cache_dtype_reads_too():
    cfg = read("tensor_parallel_size: 8\nkv_cache_dtype: fp8\nuse_cuda_graph: true\n")
    assert cfg.options["kv_dtype"] == "fp8"


def test_defaults_cite_the_serve_command():
    cfg = read(f"{M} --tp_size 8")
    by_key = {d.key: d for d in cfg.defaults}
    assert by_key["max_batch_size"].value == 2048 and by_key["max_num_tokens"].value == 8192
    assert "tensorrt_llm/commands/serve.py" in by_key["max_batch_size"].source


@pytest.mark.parametrize(
    "text, words",
    [
        (f"{M} --tp-size 8", ["unknown TensorRT-LLM flag --tp-size", "--tp_size"]),
        (f"{M} --tp 8", ["unknown", "--tp_size"]),  # click: no abbreviations
        (
            "tensor_parallel_size: 8\nenable_attention_db: true\n",
            ["enable_attention_db", "enable_attention_dp"],
        ),
        (
            "tensor_parallel_size: 8\nspeculative_config: {decoding_type: Medussa}\n",
            ["Medussa", "Medusa"],
        ),
        (
            "tensor_parallel_size: 8\nspeculative_config: {decoding_type: Eagle}\n",
            ["max_draft_len"],
        ),
        ("tensor_parallel_size: 8\nenable_attention_dp: maybe\n", ["true or false"]),
        ("tensor_parallel_size: 8\nkv_cache_config: fp8\n", ["kv_cache_config is a mapping"]),
        ("tensor_parallel_size: 8\nkv_cache_config: {dtype: fp16x}\n", ["fp16x"]),
        ("- just\n- a list\n", ["not a mapping"]),
        ("trtllm-serve --tp_size 8", ["names no model"]),
    ],
)
def test_error_paths(text, words):
    with pytest.raises(LaunchError) as e:
        read(text)
    msg = str(e.value)
    assert all(w in msg for w in words), msg


def _config(model, plan, chips, **options) -> LaunchConfig:
    return LaunchConfig(
        stack="trtllm",
        kind=LaunchKind.SERVING,
        model=model,
        serve_plan=plan,
        chips=chips,
        options={"engine": "trtllm", **options},
        workload=LaunchWorkload(max_num_seqs=128, max_batched_tokens=8192, max_model_len=4096),
    )


@pytest.mark.parametrize(
    "model, plan, chips, opts",
    [
        (
            "deepseek-ai/DeepSeek-R1",
            {"tp": "1", "dp": "8", "ep": "8"},
            8,
            {"weight_dtype": "fp8_block", "compute_dtype": "fp8", "kv_dtype": "fp8", "draft": "3"},
        ),
        (
            "nvidia/DeepSeek-R1-FP4",
            {"tp": "4", "ep": "4"},
            8,
            {"weight_dtype": "nvfp4", "compute_dtype": "fp4", "kv_dtype": "fp8"},
        ),
        ("llama-3.1-70b", {"tp": "4", "pp": "2"}, 8, {"draft": "2"}),
    ],
)
def test_written_plans_read_back(model, plan, chips, opts):
    text = trtllm.write(_config(model, plan, chips, **opts))
    back = read(text)
    assert back.serve_plan == plan and back.chips == chips
    for k in ("weight_dtype", "compute_dtype", "kv_dtype", "draft"):
        if k in opts:
            assert back.options.get(k) == opts[k], k
    assert (back.workload.max_num_seqs, back.workload.max_model_len) == (128, 4096)


def test_writer_names_what_trtllm_cannot_express():
    with pytest.raises(LaunchError, match="checkpoint's own format"):
        trtllm.write(
            _config("llama-3.1-70b", {"tp": "8"}, 8, weight_dtype="fp8", compute_dtype="fp8")
        )
    with pytest.raises(LaunchError, match="attention dp"):
        trtllm.write(
            _config(
                "deepseek-ai/DeepSeek-R1",
                {"tp": "2", "dp": "4"},
                8,
                weight_dtype="fp8_block",
                compute_dtype="fp8",
            )
        )
