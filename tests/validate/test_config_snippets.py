"""Runs whose source gives the stack's own settings carry them as a `config:` snippet, read by
the stack's importer (`roofline import`'s readers); its plan wins over the hand-mapped fields.

The snippets restate NVIDIA/Megatron-LM examples/sc21 (run_table_1.sh + CONFIG.sh @db6892a9696e)
for the five Narayanan et al. 2021 runs: the importer gives exactly the plan the hand mapping
gave (so `validate`'s scores are unchanged), now read from the launch flags themselves."""

from __future__ import annotations

import copy

import pytest
import yaml

from roofline.validate.runfile import BUILTIN
from roofline.validate.training_runs import map_training_run

ENTRIES = yaml.safe_load(BUILTIN["training"].read_text(encoding="utf-8"))
WITH_SNIPPET = [e for e in ENTRIES if "config" in e]


def test_the_sc21_runs_carry_their_launch_settings():
    assert sorted(e["id"] for e in WITH_SNIPPET) == sorted(
        f"megatron-a100-narayanan2021-{s}" for s in ("1.7b", "3.6b", "39b", "76b", "145b")
    )


@pytest.mark.parametrize("entry", WITH_SNIPPET, ids=lambda e: e["id"])
def test_a_snippet_maps_to_the_hand_mapped_plan(entry):
    imported = map_training_run(entry)
    hand = map_training_run({k: v for k, v in entry.items() if k != "config"})
    assert imported.mapped and hand.mapped
    assert imported.inputs.plan == hand.inputs.plan
    assert imported.inputs.workload == hand.inputs.workload
    assert imported.inputs.framework == hand.inputs.framework == "megatron"
    assert any("plan imported from the run's megatron settings" in n for n in imported.defaults)
    # the snippet states what the hand mapping read off the entry's fields
    p = entry["parallelism"]
    assert f"--tensor-model-parallel-size {p['tp']} " in entry["config"]["text"]
    assert f"--global-batch-size {p['global_batch_seqs']} " in entry["config"]["text"]


def test_the_snippet_wins_over_the_hand_mapped_fields():
    entry = copy.deepcopy(WITH_SNIPPET[0])  # 1.7B: tp=1 on 32 GPUs, micro batch 16
    entry["config"]["text"] = entry["config"]["text"].replace(
        "--tensor-model-parallel-size 1", "--tensor-model-parallel-size 2"
    )
    run = map_training_run(entry)
    d = run.inputs.plan.degrees
    assert (d.tp, d.dp) == (2, 16)
    assert any("(hand-mapped: dp=32," in n for n in run.defaults)


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"stack": "megatron"}, "config: is a mapping"),
        ({"stack": "megatorn", "text": "pretrain_gpt.py"}, "closest known: megatron"),
        ({"stack": "vllm", "text": "vllm serve x --tensor-parallel-size 8"}, "serving"),
    ],
)
def test_a_bad_snippet_is_a_skip_reason(config, said):
    entry = copy.deepcopy(WITH_SNIPPET[0]) | {"config": config}
    run = map_training_run(entry)
    assert not run.mapped and said in run.skipped_reason
