"""SGLang's server line read and written: argparse abbreviations (`--tp`, `--dp`), attention DP
in both spellings (`--dp-size D --enable-dp-attention`, v0.5's `--attn-dp-size`), the v0.4 EP
switches, per-rank limits, EAGLE defaults, and the error paths."""

from __future__ import annotations

import pytest

from roofline.launch import LaunchConfig, LaunchError, LaunchKind, LaunchWorkload, sglang

M = "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3"


def read(line: str, **kw) -> LaunchConfig:
    return sglang.read(line, source="t.sh", **kw)


def test_tp_and_dp_are_abbreviations_of_the_size_flags():
    a = read(f"{M} --tp 8 --dp 2")
    b = read(f"{M} --tp-size 8 --dp-size 2")
    c = read(f"{M} --tensor-parallel-size 8 --data-parallel-size 2")
    assert a.serve_plan == b.serve_plan == c.serve_plan == {"tp": "8"}
    assert a.chips == b.chips == c.chips == 16  # two copies behind the router


def test_dp_attention_both_spellings():
    old = read(f"{M} --tp 8 --dp 4 --enable-dp-attention")
    new = read(f"{M} --tp 8 --attn-dp-size 4")
    assert old.serve_plan_text == new.serve_plan_text == "tp=2,dp=4"
    assert old.chips == new.chips == 8
    # v0.5: --attn-dp-size inside each of --dp-size copies
    assert read(f"{M} --tp 8 --attn-dp-size 4 --dp-size 2").chips == 16


def test_ep_spellings():
    assert read(f"{M} --tp 8 --ep 8").serve_plan["ep"] == "8"
    assert read(f"{M} --tp 8 --expert-parallel-size 4").serve_plan["ep"] == "4"
    assert read(f"{M} --tp 8 --enable-ep-moe").serve_plan["ep"] == "8"  # v0.4: ep = tp
    assert (
        read(f"{M} --tp 16 --enable-deepep-moe --dp 16 --enable-dp-attention").serve_plan_text
        == "tp=1,dp=16,ep=16"
    )


def test_limits_are_per_attention_dp_rank():
    """max_running_requests and chunked_prefill_size are divided by dp under DP attention
    (tp_worker.py:127-133, server_args.py:423 at v0.4.10)."""
    cfg = read(
        f"{M} --tp 8 --dp 8 --enable-dp-attention --max-running-requests 512 --chunked-prefill-size 16384 --context-length 65536"
    )
    assert (cfg.workload.max_num_seqs, cfg.workload.max_batched_tokens) == (64, 2048)
    assert cfg.workload.max_model_len == 65536
    plain = read(f"{M} --tp 8 --max-running-requests 512")
    assert plain.workload.max_num_seqs == 512


def test_chunked_prefill_off_is_named():
    cfg = read(f"{M} --tp 8 --chunked-prefill-size -1")
    assert cfg.workload.max_batched_tokens is None
    assert any(u.key == "--chunked-prefill-size" for u in cfg.unsupported)


def test_eagle_without_steps_takes_the_architecture_default():
    ds = read(f"{M} --tp 8 --speculative-algorithm EAGLE")
    assert ds.options["draft"] == "3"  # (3, 1, 4) for DeepSeek
    llama = read(
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --speculative-algorithm EAGLE --speculative-draft-model-path x"
    )
    assert llama.options["draft"] == "5"
    assert llama.workload.max_num_seqs == 48
    tokens = read(f"{M} --tp 8 --speculative-algorithm EAGLE --speculative-num-draft-tokens 4")
    assert tokens.options["draft"] == "3"


def test_an_argument_form_with_equals():
    cfg = read(
        "python -m sglang.launch_server --model-path=/models/Qwen3-8B --tp=2 --mem-fraction-static=0.8"
    )
    assert cfg.model == "/models/Qwen3-8B" and cfg.serve_plan == {"tp": "2"}


def test_the_new_cli_entry_point():
    assert read("sglang serve --model-path deepseek-ai/DeepSeek-V3 --tp 8").chips == 8


@pytest.mark.parametrize(
    "line, words",
    [
        (f"{M} --tp 8 --dp 3 --enable-dp-attention", ["does not divide", "--tp-size 8"]),
        (f"{M} --tp 8 --enable-dp-atention", ["unknown SGLang flag", "--enable-dp-attention"]),
        (f"{M} --allow x", ["ambiguous", "--allow-auto-truncate", "--allowed-media-domains"]),
        (f"{M} --tp 8 --kv-cache-dtype fp8", ["'fp8'", "fp8_e4m3, fp8_e5m2"]),
        ("python -m sglang.launch_server --tp 8", ["names no model"]),
        (f"{M} --tp 8 --max-running-requests many", ["--max-running-requests", "whole number"]),
    ],
)
def test_error_paths(line, words):
    with pytest.raises(LaunchError) as e:
        read(line)
    msg = str(e.value)
    assert all(w in msg for w in words), msg


def test_an_abbreviation_later_flags_made_ambiguous_reads_as_it_was_meant():
    """`--pp` abbreviates --pp-size and the later --pp-max-micro-batch-size: read as --pp-size (what
    it meant when the line was written) and named as a problem."""
    cfg = read(f"{M} --tp 8 --pp 2")
    assert cfg.serve_plan_text == "tp=8,pp=2" and cfg.chips == 16
    assert "--pp-max-micro-batch-size" in cfg.problems[0].message
    assert "read as --pp-size" in cfg.problems[0].message


def test_an_expert_split_that_does_not_divide_is_a_problem():
    cfg = read(f"{M} --tp 8 --ep 3")
    assert [p.key for p in cfg.problems] == ["--ep-size"]


def _config(model, plan, chips, **options) -> LaunchConfig:
    return LaunchConfig(
        stack="sglang",
        kind=LaunchKind.SERVING,
        model=model,
        serve_plan=plan,
        chips=chips,
        options={"engine": "sglang", **options},
        workload=LaunchWorkload(max_num_seqs=64, max_batched_tokens=4096, max_model_len=16384),
    )


@pytest.mark.parametrize(
    "model, plan, chips, opts",
    [
        (
            "deepseek-ai/DeepSeek-V3",
            {"tp": "1", "dp": "8", "ep": "8"},
            8,
            {"weight_dtype": "fp8_block", "compute_dtype": "fp8", "draft": "2"},
        ),
        (
            "deepseek-ai/DeepSeek-V3",
            {"tp": "8", "dp": "2"},
            16,
            {"weight_dtype": "fp8_block", "compute_dtype": "fp8"},
        ),
        (
            "llama-3.1-70b",
            {"tp": "4"},
            16,
            {"weight_dtype": "fp8", "compute_dtype": "fp8", "kv_dtype": "fp8"},
        ),
        ("llama-3.1-70b", {"tp": "4", "pp": "2"}, 8, {"draft": "4"}),
        ("mixtral-8x7b", {"tp": "2", "dp": "2", "ep": "2"}, 8, {}),
    ],
)
def test_written_plans_read_back(model, plan, chips, opts):
    back = read(sglang.write(_config(model, plan, chips, **opts)))
    assert back.serve_plan == plan and back.chips == chips
    for k in ("weight_dtype", "compute_dtype", "draft"):
        assert back.options.get(k) == (
            {"weight_dtype": "bf16", "compute_dtype": "bf16"} | opts
        ).get(k), k
    assert (back.workload.max_num_seqs, back.workload.max_batched_tokens) == (64, 4096)
