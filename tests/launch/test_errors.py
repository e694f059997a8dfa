"""Bad launch files get one paragraph naming the file, the key, the rule and a fix."""

from __future__ import annotations

import pytest

from roofline.errors import RooflineError
from roofline.launch import detect_stack, read_launch
from roofline.launch.base import LaunchError, stack_module
from roofline.launch.common import resolve_model


def paragraph(e: RooflineError) -> str:
    s = str(e)
    assert "\n" not in s and "Rule:" in s and "Fix:" in s
    return s


@pytest.mark.parametrize(
    "stack,text,chips,needle",
    [
        (
            "torchtitan",
            "[parallelism]\ntensor_paralel_degree = 2\n",
            8,
            "closest known: tensor_parallel_degree",
        ),
        (
            "torchtitan",
            "[paralelism]\ntensor_parallel_degree = 2\n",
            8,
            "closest known: parallelism",
        ),
        ("torchtitan", "[training\n", 8, "not valid TOML"),
        (
            "torchtitan",
            "[parallelism]\ntensor_parallel_degree = 2\n",
            None,
            "give --chips N or --system",
        ),
        (
            "torchtitan",
            "[parallelism]\ntensor_parallel_degree = 3\n",
            8,
            "does not divide 8 devices",
        ),
        (
            "torchtitan",
            "[parallelism]\ntensor_parallel_degree = 0\n",
            8,
            "tensor_parallel_degree = 0",
        ),
        (
            "torchtitan",
            '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "Zigzag"\n',
            8,
            "not a pipeline schedule",
        ),
        (
            "torchtitan",
            '[activation_checkpoint]\nmode = "partial"\n',
            8,
            "modes: none, full, selective",
        ),
        ("maxtext", "ici_fsdp_parallelism: -1\nici_tensor_parallelism: -1\n", 8, "are all -1"),
        (
            "maxtext",
            "remat_policy: save_everything\n",
            8,
            "not a maxtext activation-checkpointing policy",
        ),
        ("maxtext", "per_device_batch_size: -2\n", 8, "per_device_batch_size"),
        ("maxtext", "- a list\n", 8, "not a YAML mapping"),
        (
            "maxtext",
            "python3 -m MaxText.train other.yml ici_fsdp_parallelism=8\n",
            8,
            "not next to it",
        ),
        (
            "megatron",
            "echo nothing here --micro-batch-size 1\n",
            None,
            "runs no pretrain_*.py command",
        ),
        (
            "megatron",
            "torchrun --nproc_per_node 8 pretrain_gpt.py --bf16\n",
            None,
            "--micro-batch-size is not given",
        ),
        (
            "megatron",
            "python pretrain_gpt.py --micro-batch-size 1 --bf16\n",
            None,
            "give --chips N",
        ),
        (
            "megatron",
            "torchrun --nproc_per_node 8 pretrain_gpt.py --micro-batch-size 1 --fp8-format hybrid --fp8-recipe fancy\n",
            None,
            "fp8-recipe = 'fancy'",
        ),
        (
            "megatron",
            "torchrun --nproc_per_node 8 pretrain_gpt.py --micro-batch-size 1 --num-layers-per-virtual-pipeline-stage 2\n",
            None,
            "without --num-layers",
        ),
        ("nemo", "trainer:\n  devices: 8\n", None, "no `model:` section"),
        ("nemo", "model:\n  micro_batch_size: ${model.nothing}\n", None, "refers to model.nothing"),
        (
            "nemo",
            "model:\n  activations_checkpoint_granularity: most\n",
            None,
            "selective, full or null",
        ),
        ("deepspeed", '{"train_batch_size": 8,}', None, "not valid JSON"),
        ("deepspeed", '{"train_batch_sise": 8}', None, "closest known: train_batch_size"),
        (
            "deepspeed",
            '{"zero_optimization": {"stagee": 2}, "train_batch_size": 8}',
            8,
            "closest known: stage",
        ),
        ("deepspeed", '{"gradient_accumulation_steps": 2}', 8, "both missing"),
        ("deepspeed", '{"train_batch_size": 8}', None, "give --chips N"),
        (
            "deepspeed",
            '{"train_batch_size": 8, "zero_optimization": {"stage": 4}}',
            8,
            "ZeRO stages are 0, 1, 2 and 3",
        ),
    ],
)
def test_bad_files_are_one_paragraph(stack, text, chips, needle):
    with pytest.raises(LaunchError) as e:
        read_launch(text, source="f", stack=stack, chips=chips)
    assert needle in paragraph(e.value)


def test_unknown_stack_names_the_closest():
    with pytest.raises(LaunchError, match="closest known: megatron"):
        stack_module("megatronn")


def test_undetectable_format_asks_for_stack():
    with pytest.raises(LaunchError, match="name it with --stack"):
        detect_stack("hello world", "notes.txt")


def test_an_unresolvable_model_names_the_flag():
    with pytest.raises(LaunchError, match="give --model"):
        resolve_model("my-org/secret-model-42b", "run.sh")
    with pytest.raises(LaunchError, match="names no model"):
        resolve_model(None, "ds.json")


def test_model_references_resolve_through_the_catalog_and_config_json(tmp_path):
    assert resolve_model("./assets/hf/Llama-3.1-405B", "job.toml").name == "llama-3.1-405b"
    assert resolve_model("llama2_70b", "x.yaml").name == "llama-2-70b"
    d = tmp_path / "hf" / "my-model"
    d.mkdir(parents=True)
    (d / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,'
        ' "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000}'
    )
    m = resolve_model("hf/my-model", str(tmp_path / "job.toml"))
    assert m.n_layers == 2
