"""Each stack's documented semantics, case by case (defaults cite launch/defaults/*.toml)."""

from __future__ import annotations

import pytest

from roofline.errors import RooflineError
from roofline.launch import read_launch
from roofline.specs.plan import RematKind, Schedule, parse_remat


def tt(body: str, chips: int | None = None):
    return read_launch(body, source="job.toml", stack="torchtitan", chips=chips)


PP = """
[training]
local_batch_size = 8
seq_len = 4096
[parallelism]
data_parallel_shard_degree = -1
pipeline_parallel_degree = 4
"""


def test_torchtitan_pipeline_microbatches_default_to_the_local_batch():
    # pipeline_parallel_microbatch_size defaults to 1: 8 local sequences -> 8 microbatches
    c = tt(PP, chips=32)
    assert c.plan.degrees.pp == 4 and c.plan.degrees.fsdp == 8
    assert c.plan.microbatches == 8
    assert any(
        d.key == "parallelism.pipeline_parallel_microbatch_size" and d.value == 1
        for d in c.defaults
    )


def test_torchtitan_microbatch_size_and_gradient_accumulation_multiply():
    body = (
        PP.replace("seq_len = 4096", "seq_len = 4096\nglobal_batch_size = 256")
        + "pipeline_parallel_microbatch_size = 2\n"
    )
    c = tt(body, chips=32)
    # accumulation 256 / (8 × 8 ranks) = 4; each local batch as 8 / 2 = 4 microbatches
    assert c.plan.microbatches == 16
    assert c.workload.micro_batch_sequences == 2


def test_torchtitan_old_generation_defaults_to_one_microbatch_per_stage():
    body = """
[training]
batch_size = 8
seq_len = 2048
data_parallel_shard_degree = -1
[experimental]
pipeline_parallel_degree = 4
"""
    c = tt(body, chips=16)
    assert c.plan.degrees.pp == 4 and c.plan.microbatches == 4  # the number of stages
    assert c.workload.global_batch_sequences == 8 * 4


def test_torchtitan_looped_schedule_is_interleaved_with_two_stages_per_rank():
    c = tt(PP + 'pipeline_parallel_schedule = "Interleaved1F1B"\n', chips=32)
    assert c.plan.schedule == Schedule.INTERLEAVED and c.plan.virtual_stages == 2


def test_torchtitan_default_activation_checkpointing_is_every_second_layer():
    c = tt("[training]\nseq_len = 2048\n", chips=8)
    assert c.plan.remat.kind == RematKind.FULL
    # selective_ac_option "2" (every 2nd layer) is not a per-layer plan remat: named, costed as full
    notes = [u for u in c.unsupported if u.key == "activation_checkpoint.selective_ac_option"]
    assert len(notes) == 1 and "0.5 of the layers" in notes[0].reason


def test_torchtitan_expert_parallel_borrows_from_fsdp():
    body = "[parallelism]\ndata_parallel_shard_degree = -1\nexpert_parallel_degree = 8\n"
    c = tt(body, chips=64)
    assert (c.plan.degrees.fsdp, c.plan.degrees.ep) == (8, 8)
    assert c.plan.degrees.n_chips == 64


def test_torchtitan_async_tp_without_compile_is_a_problem():
    body = "[parallelism]\ntensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n"
    c = tt(body, chips=8)
    assert c.plan.collective_matmul
    assert any("compile.enable" in p.message for p in c.problems)


def test_torchtitan_batch_not_divisible_is_a_problem():
    body = "[training]\nlocal_batch_size = 3\nglobal_batch_size = 100\n"
    c = tt(body, chips=8)
    assert any("not a multiple of 3 per replica × 8" in p.message for p in c.problems)


def mx(body: str, chips: int | None = None):
    return read_launch(body, source="m.yml", stack="maxtext", chips=chips)


def test_maxtext_dcn_data_takes_the_slices():
    c = mx(
        "num_slices: 4\nici_fsdp_parallelism: -1\nici_tensor_parallelism: 4\nper_device_batch_size: 2\n",
        chips=1024,
    )
    d = c.plan.degrees
    assert (d.dp, d.fsdp, d.tp) == (4, 64, 4)  # dcn_data -1 = 4 slices; ici_fsdp -1 = 256 / 4
    assert c.workload.global_batch_sequences == 2048


def test_maxtext_fractional_per_device_batch_and_accumulation():
    c = mx(
        "ici_fsdp_parallelism: -1\nper_device_batch_size: 0.5\ngradient_accumulation_steps: 4\n",
        chips=64,
    )
    assert c.workload.global_batch_sequences == 32 * 4
    assert c.plan.microbatches == 4


def test_maxtext_pipeline_defaults_to_stages_microbatches_and_layer_repeats():
    body = "ici_pipeline_parallelism: 4\nici_fsdp_parallelism: -1\nper_device_batch_size: 1\nbase_num_decoder_layers: 32\n"
    c = mx(body, chips=16)
    assert c.plan.microbatches == 4  # num_pipeline_microbatches -1 = the stage count
    assert c.plan.virtual_stages == 8  # repeats -1 = 32 layers / (4 stages × 1 layer per stage)
    delayed = mx(body + "pipeline_delay_activation_forwarding: true\n", chips=16)
    assert delayed.plan.microbatches == 8


def test_maxtext_quantization_maps_onto_the_profile_recipe():
    c = mx("ici_fsdp_parallelism: -1\nquantization: fp8\n", chips=8)
    assert c.options["precision"] == "fp8" and c.plan.dtypes.matmul.value == "fp8"


def test_maxtext_command_line_overrides_and_yaml_agree():
    cmd = mx(
        "python3 -m MaxText.train MaxText/configs/base.yml ici_fsdp_parallelism=4 ici_tensor_parallelism=2 per_device_batch_size=4\n"
    )
    yml = mx("ici_fsdp_parallelism: 4\nici_tensor_parallelism: 2\nper_device_batch_size: 4\n")
    assert cmd.plan == yml.plan and cmd.workload == yml.workload and cmd.chips == 8


def meg(script: str, chips: int | None = None):
    return read_launch(script, source="run.sh", stack="megatron", chips=chips)


def test_megatron_shell_defaults_arrays_and_conditions():
    script = """
TP=${TP:-4}
NODES=2
MODE=fp8
ARGS=(--tensor-model-parallel-size $TP --micro-batch-size 2)
if [[ "$MODE" == "bf16" ]]; then
  ARGS+=(--bf16)
elif [[ "$MODE" == "fp8" ]]; then
  ARGS+=(--bf16 --fp8-format e4m3 --fp8-recipe tensorwise)
fi
torchrun --nproc_per_node 8 --nnodes $NODES pretrain_gpt.py ${ARGS[@]} --global-batch-size 64 --seq-length 4096
"""
    c = meg(script)
    assert c.chips == 16 and c.plan.degrees.tp == 4 and c.plan.degrees.dp == 4
    assert c.plan.microbatches == 64 // (2 * 4)
    assert c.options["precision"] == "fp8-current"


def test_megatron_virtual_stages_from_layers_per_virtual_stage():
    script = "torchrun --nproc_per_node 8 pretrain_gpt.py --pipeline-model-parallel-size 4 --num-layers 32 --num-layers-per-virtual-pipeline-stage 2 --micro-batch-size 1 --global-batch-size 16 --bf16"
    c = meg(script)
    assert c.plan.virtual_stages == 4 and c.plan.schedule == Schedule.INTERLEAVED


def test_megatron_global_batch_defaults_to_micro_times_data_parallel():
    c = meg("torchrun --nproc_per_node 8 pretrain_gpt.py --micro-batch-size 2 --bf16")
    assert c.workload.global_batch_sequences == 16 and c.plan.microbatches == 1
    assert any(d.key == "global-batch-size" for d in c.defaults)


def test_megatron_expert_parallel_is_carved_from_data_parallel():
    c = meg(
        "torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py --tensor-model-parallel-size 2 --expert-model-parallel-size 8 --micro-batch-size 1 --bf16"
    )
    d = c.plan.degrees
    assert (d.dp, d.ep, d.tp) == (2, 8, 2) and d.n_chips == 32


def test_megatron_fsdp_shards_the_data_parallel_ranks():
    c = meg(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --use-megatron-fsdp --micro-batch-size 1 --bf16"
    )
    assert c.plan.degrees.fsdp == 8 and c.plan.degrees.dp == 1


def test_megatron_selective_and_partial_recompute():
    sel = meg(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --recompute-activations --micro-batch-size 1 --bf16"
    )
    assert sel.plan.remat.kind == RematKind.MATMULS
    part = meg(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --recompute-granularity full --recompute-method block --recompute-num-layers 4 --micro-batch-size 1 --bf16"
    )
    assert part.plan.remat.kind == RematKind.FULL
    assert [u.key for u in part.unsupported] == ["recompute-method"]


def test_megatron_recompute_modules_are_the_plans_partial_recompute():
    """--recompute-modules (nargs='*') other than the default core_attn: remat=a+b in
    Megatron-Core's module order; --grad-reduce-in-bf16: bf16 gradients (16 B/param)."""
    c = meg(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --recompute-granularity selective "
        "--recompute-modules mlp mla_up_proj --grad-reduce-in-bf16 --micro-batch-size 1 --bf16"
    )
    assert c.plan.remat == parse_remat("mla_up_proj+mlp")
    assert str(c.plan.remat) == "mla_up_proj+mlp"
    assert c.plan.optimizer.bytes_per_param == 16.0
    core = meg(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --recompute-granularity selective "
        "--recompute-modules core_attn --micro-batch-size 1 --bf16"
    )
    assert core.plan.remat.kind == RematKind.MATMULS  # the stack's own selective policy
    with pytest.raises(RooflineError, match="recompute-modules"):
        meg(
            "torchrun --nproc_per_node 8 pretrain_gpt.py --recompute-granularity selective "
            "--recompute-modules attention --micro-batch-size 1 --bf16"
        )


def test_nemo_recompute_modules_and_bf16_gradient_sync():
    text = """
trainer: {devices: 8, num_nodes: 1, precision: bf16-mixed}
model:
  micro_batch_size: 1
  global_batch_size: 8
  encoder_seq_length: 4096
  tensor_model_parallel_size: 1
  activations_checkpoint_granularity: selective
  recompute_modules: [moe_act, layernorm]
  optim: {name: distributed_fused_adam, grad_sync_dtype: bf16}
"""
    c = read_launch(text, source="nemo.yaml", stack="nemo")
    assert c.plan.remat == parse_remat("layernorm+moe_act")
    assert c.plan.optimizer.name == "adam-fp32-master-bf16-grads"


def ds(text: str, chips: int | None = None):
    return read_launch(text, source="ds.json", stack="deepspeed", chips=chips)


def test_deepspeed_completes_the_batch_triple_as_deepspeed_does():
    c = ds('{"train_batch_size": 512, "train_micro_batch_size_per_gpu": 4}', chips=32)
    assert c.plan.microbatches == 512 // 4 // 32
    c2 = ds('{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}', chips=16)
    assert c2.workload.global_batch_sequences == 4 * 2 * 16


def test_deepspeed_triple_gives_the_gpu_count_and_flags_a_mismatch():
    text = '{"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}'
    assert ds(text).chips == 32
    assert any("implies 32" in p.message for p in ds(text, chips=64).problems)


def test_deepspeed_zero3_is_fsdp_and_offload_is_named():
    c = ds(
        '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}',
        chips=64,
    )
    assert c.plan.degrees.fsdp == 64 and c.plan.degrees.dp == 1
    assert [u.key for u in c.unsupported] == ["zero_optimization.offload_param"]


@pytest.mark.parametrize("stack", ["torchtitan", "maxtext", "megatron", "nemo", "deepspeed"])
def test_reader_defaults_are_documented_in_its_table(stack):
    from roofline.launch.common import stack_defaults

    t = stack_defaults(stack)
    assert len(t.commit) == 40 and t.values
    for key in t.values:
        assert ":" in t.sources[key] or t.sources[key].endswith(".py"), key


def test_maxtext_command_variables_are_expanded():
    script = "PDBS=2\nTP=4\npython3 -m MaxText.train MaxText/configs/base.yml per_device_batch_size=$PDBS ici_tensor_parallelism=${TP} ici_fsdp_parallelism=-1\n"
    c = mx(script, chips=64)
    assert (c.plan.degrees.fsdp, c.plan.degrees.tp) == (16, 4)
    assert c.workload.global_batch_sequences == 128


def test_nested_shell_defaults_expand_innermost_first():
    import re

    from roofline.launch.shell import script

    s = script("ICI=${3:-${ICI_DATA:-2}}\nrun train.py x=$ICI\n", re.compile(r"train\.py"))
    assert s.commands == [["run", "train.py", "x=2"]]
