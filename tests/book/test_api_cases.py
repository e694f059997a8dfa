"""Every kind of book question in the Python API (issue 20: "asked on the CLI and in the Python
API"): limits for every strategy, `op` against each memory level, transfers (point to point,
gathers, DCN, host loads, capacities), collectives bounded by switches, serving from given step
times and with a sequence-sharded KV cache, training with offload and its pipeline
communication. Each `roofline.api` function runs the command itself; its document is the CLI's
`--json` for the same inputs."""

from __future__ import annotations

import json
import shlex

import pytest

import roofline as rl
from roofline.cli import main
from roofline.errors import SpecError

VOLATILE = {"search_time_s"}

CASES = [
    (
        "limits --system tpu-v5p:16x16x16 --batch 4M --strategy fsdp+tp",
        lambda: rl.limits_query("tpu-v5p:16x16x16", batch="4M", strategy="fsdp+tp"),
    ),
    (
        "limits --model deepseek-v3 --system h800:2048 --strategy ep --batch 62914560 "
        "--plan fsdp=32,ep=64",
        lambda: rl.limits_query(
            "h800:2048", "deepseek-v3", strategy="ep", batch=62914560, plan="fsdp=32,ep=64"
        ),
    ),
    (
        "limits --system tpu-v5e:4x8 --batch 64 --strategy decode",
        lambda: rl.limits_query("tpu-v5e:4x8", batch=64, strategy="decode"),
    ),
    (
        "op 'fp32[N] + fp32[N]' --dims N=65536 --chip h100",
        lambda: rl.op_query("fp32[N] + fp32[N]", dims="N=65536", chip="h100"),
    ),
    (
        "op 'int8[B,D] @ int8[D,F]' --dims B=64,D=4096,F=16384 --chip tpu-v5e",
        lambda: rl.op_query("int8[B,D] @ int8[D,F]", dims="B=64,D=4096,F=16384", chip="tpu-v5e"),
    ),
    (
        "transfer --system tpu-v5e:4x4 --bytes 16777216 --from 0,0 --to 3,3",
        lambda: rl.transfer_query("tpu-v5e:4x4", bytes=16777216, src="0,0", dst="3,3"),
    ),
    (
        "transfer --system 2xtpu-v5p:4x4x4 --bytes 1G --from 0 --to 1",
        lambda: rl.transfer_query("2xtpu-v5p:4x4x4", bytes="1G", from_="0", to="1"),
    ),
    (
        "transfer --system tpu-v5e:4x4 --bytes 16e9 --gather-to 0,0",
        lambda: rl.transfer_query("tpu-v5e:4x4", bytes="16e9", gather_to="0,0"),
    ),
    (
        "transfer --system h100:8 --bytes 1G --from host --to 0",
        lambda: rl.transfer_query("h100:8", bytes="1G", src="host", dst="0"),
    ),
    (
        "transfer --system dgx-h100-superpod-spine-switches --capacities",
        lambda: rl.transfer_query("dgx-h100-superpod-spine-switches", capacities=True),
    ),
    (
        "collective all-reduce --bytes 2097152 --over X --mesh X=4,Y=256 "
        "--system dgx-h100-superpod-spine-switches --sharp",
        lambda: rl.collective_query(
            "all-reduce",
            bytes=2097152,
            over="X",
            mesh="X=4,Y=256",
            system="dgx-h100-superpod-spine-switches",
            sharp=True,
        ),
    ),
    (
        "serve --model llama-3-70b --system tpu-v5e:4x4 --prompt 8192 --gen 512 --kv-dtype int8 "
        "--prefill-step-s 0.91s --decode-step-s 19ms --batch 32 --rate 10",
        lambda: rl.serve_query(
            "llama-3-70b",
            "tpu-v5e:4x4",
            prompt=8192,
            gen=512,
            kv_dtype="int8",
            prefill_step_s="0.91s",
            decode_step_s="19ms",
            batch=32,
            rate=10,
        ),
    ),
    (
        "serve --system h100:32 --plan tp=8 --kv-seq 4 --batch 1 --context 1Mi",
        lambda: rl.serve_query(system="h100:32", plan="tp=8", kv_seq=4, batch=1, context="1Mi"),
    ),
    (
        "train --model llama-3-8b --system h100:8 --framework ideal --profile peak "
        "--plan fsdp=8,remat=none,offload_activations=1 --batch-tokens 131072 --seq 8192 "
        "--tokens 0",
        lambda: rl.train_query(
            "llama-3-8b",
            "h100:8",
            framework="ideal",
            profile="peak",
            plan="fsdp=8,remat=none,offload_activations=1",
            batch_tokens=131072,
            seq=8192,
            tokens=0,
        ),
    ),
    (
        "train --model llama-3-70b --system h100:8 --framework ideal --profile peak "
        "--plan fsdp=8 --batch-tokens 4096 --seq 512 --tokens 0 --offload-optimizer",
        lambda: rl.train_query(
            "llama-3-70b",
            "h100:8",
            framework="ideal",
            profile="peak",
            plan="fsdp=8",
            batch_tokens=4096,
            seq=512,
            tokens=0,
            offload_optimizer=True,
        ),
    ),
    (
        "train --model llama-3-8b --system h100:16 --profile peak --plan pp=4,fsdp=4,microbatch=8 "
        "--batch-tokens 262144 --seq 4096 --tokens 0",
        lambda: rl.train_query(
            "llama-3-8b",
            "h100:16",
            profile="peak",
            plan="pp=4,fsdp=4,microbatch=8",
            batch_tokens=262144,
            seq=4096,
            tokens=0,
        ),
    ),
]


def _cli(capsys, command: str) -> dict:
    capsys.readouterr()
    assert main([*shlex.split(command), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _stable(doc) -> dict:
    return {k: v for k, v in dict(doc).items() if k not in VOLATILE}


@pytest.mark.parametrize("command,call", CASES, ids=[c.split(" --")[0] for c, _ in CASES])
def test_the_api_answers_as_the_cli_does(command, call, capsys):
    want = _stable(_cli(capsys, command))
    got = call()
    assert isinstance(got, rl.Answer) and got.command == command.split()[0]
    assert _stable(got.document) == want


def test_answers_read_by_key_and_print_short():
    a = rl.train_query(
        "llama-3-8b",
        "h100:16",
        profile="peak",
        plan="pp=4,fsdp=4,microbatch=8",
        batch_tokens=262144,
        seq=4096,
        tokens=0,
    )
    assert "pipeline_comm" in a and a["pipeline_comm"] == a.document["pipeline_comm"]
    assert repr(a).startswith("Answer(roofline train: ") and "\n" not in repr(a)


def test_an_unknown_option_names_the_options():
    with pytest.raises(SpecError, match="has no input 'strategyy'"):
        rl.limits_query("tpu-v5e:4x8", strategyy="fsdp")
