"""Launch lines as people write them: scripts with variables, branches, here-documents, command
substitutions and containers, read the way the shell would run them as far as reading can know
(what it cannot know is named as a problem, never guessed silently)."""

from __future__ import annotations

from roofline.launch import sglang, trtllm, vllm
from roofline.launch.serving_common import heredocs, human_int


def test_human_int_is_the_engines_rule():
    assert [human_int(x) for x in ("8192", "32k", "32K", "1.5k", "2M", "1g")] == [
        8192,
        32000,
        32768,
        1500,
        2 * 2**20,
        10**9,
    ]


def test_variables_and_env_prefixes():
    text = (
        "MODEL=meta-llama/Llama-3.1-70B-Instruct\nTP=4\n"
        "CUDA_VISIBLE_DEVICES=0,1,2,3 VLLM_USE_V1=1 vllm serve $MODEL -tp ${TP}\n"
    )
    cfg = vllm.read(text)
    assert (cfg.model, cfg.serve_plan_text, cfg.chips) == (text.split("\n")[0][6:], "tp=4", 4)
    assert not cfg.problems


def test_a_variable_holding_several_flags_splits_into_them():
    text = 'ARGS="--tp-size 4 --dp-size 2"\npython -m sglang.launch_server --model-path x $ARGS\n'
    assert sglang.read(text).chips == 8


def test_arithmetic_with_the_scripts_integers():
    text = "DP=4\npython -m sglang.launch_server --model-path x --dp-size $DP --max-running-requests $((DP * 128))\n"
    assert sglang.read(text).workload.max_num_seqs == 512


def test_command_substitution_is_kept_as_one_word():
    line = "python -m sglang.launch_server --model-path x --tp 2 --cuda-graph-bs $(seq -s ' ' 1 64)"
    cfg = sglang.read(line)
    assert cfg.serve_plan_text == "tp=2"
    assert cfg.settings["--cuda-graph-bs"].startswith("$(seq -s")


def test_a_branch_does_not_override_the_value_set_outside_it():
    text = (
        'ARGS="--tensor-parallel-size 2"\n'
        'if [ -n "$DRAFT" ]; then\n'
        '    ARGS="$ARGS --num-speculative-tokens 3 --speculative-model d"\n'
        "fi\n"
        "vllm serve x $ARGS\n"
    )
    cfg = vllm.read(text)
    assert cfg.serve_plan_text == "tp=2" and "draft" not in cfg.options
    assert [p.key for p in cfg.problems] == ["$ARGS"]


def test_positional_parameters_are_not_guessed():
    text = "TP=8\nwhile [[ $# -gt 0 ]]; do\n  case $1 in\n    --tp) TP=$2 ;;\n  esac\ndone\nvllm serve x -tp $TP\n"
    assert vllm.read(text).serve_plan_text == "tp=8"


def test_the_vllm_container_image_runs_the_server():
    line = (
        "docker run --gpus all -p 8000:8000 --ipc=host vllm/vllm-openai:v0.10.1 "
        "--model Qwen/Qwen3-8B --tensor-parallel-size 2"
    )
    cfg = vllm.read(line)
    assert (cfg.model, cfg.chips) == ("Qwen/Qwen3-8B", 2)
    assert vllm.sniff(line) == 100


def test_here_documents_by_variable_name_and_quoting():
    text = (
        "CFG=/tmp/extra.yaml\n"
        "cat <<'EOF' > $CFG\nenable_attention_dp: true\nEOF\n"
        "trtllm-serve deepseek-ai/DeepSeek-R1 --tp_size 4 --extra_llm_api_options $CFG\n"
    )
    assert heredocs(text)[1] == {"extra.yaml": "enable_attention_dp: true\n"}
    assert trtllm.read(text).serve_plan_text == "tp=1,dp=4"


def test_the_first_line_that_runs_the_server_is_read():
    text = "# node 0\nvllm serve x -tp 8 -pp 2 --node-rank 0\n# node 1\nvllm serve x -tp 8 -pp 2 --node-rank 1 --headless\n"
    cfg = vllm.read(text)
    assert cfg.settings["--node-rank"] == "0" and cfg.chips == 16


def test_the_command_ends_at_a_pipe_or_redirect():
    cfg = vllm.read("vllm serve x -tp 2 2>&1 | tee log.txt && echo done")
    assert cfg.serve_plan_text == "tp=2" and not cfg.problems


def test_a_config_file_under_the_command_line(tmp_path):
    """`--config FILE` (vLLM and SGLang): the YAML's keys are flags, the command line wins."""
    (tmp_path / "serve.yaml").write_text(
        "model: deepseek-ai/DeepSeek-V3\ntensor-parallel-size: 4\ndata_parallel_size: 2\n"
        "enable-expert-parallel: true\nenable-prefix-caching: false\nmax-num-seqs: 128\n"
    )
    run = tmp_path / "run.sh"
    run.write_text("vllm serve --config serve.yaml --max-num-seqs 256\n")
    cfg = vllm.read(run.read_text(), source=str(run))
    assert (cfg.model, cfg.serve_plan_text, cfg.chips) == (
        "deepseek-ai/DeepSeek-V3",
        "tp=4,dp=2,ep=8",
        8,
    )
    assert cfg.workload.max_num_seqs == 256  # the command line's
    assert cfg.settings["--enable-prefix-caching"] is False


def test_an_sglang_config_in_a_here_document():
    text = (
        "cat > cfg.yaml <<EOF\ntp-size: 8\ndp-size: 8\nenable-dp-attention: true\nEOF\n"
        "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --config cfg.yaml\n"
    )
    assert sglang.read(text).serve_plan_text == "tp=1,dp=8"


def test_a_config_file_reading_cannot_find_is_a_problem():
    cfg = vllm.read("vllm serve x --config missing.yaml -tp 2")
    assert cfg.serve_plan_text == "tp=2" and [p.key for p in cfg.problems] == ["--config"]
