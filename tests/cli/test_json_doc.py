"""docs/json.md's key tables are the keys the commands write, both ways (issue 21): each command
runs with `--json` (on its defaults where it has them) and every documented table's keys must
equal the keys of the object it documents. A key added to a command without its row, or a row
left for a key gone, fails here."""

from __future__ import annotations

import contextlib
import io
import json
import re
from functools import cache
from pathlib import Path

import pytest

from roofline.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "json.md"
ENVELOPE = ("schema_version", "command", "inputs")

RUNS = {
    "chips": "chips",
    "models": "models",
    "system": "system",
    "limits": "limits",
    "limits_ep": "limits --model mixtral-8x7b --system h100:64 --strategy ep",
    "train": "train",
    "train_plan": "train --model llama-3-8b --system h100:8 --batch-tokens 65536 --seq 1024 "
    "--plan fsdp=8",
    "train_offload": "train --model llama-3-8b --system h100:8 --batch-tokens 65536 --seq 1024 "
    "--plan fsdp=8,offload_activations=1 --offload-optimizer",
    "serve": "serve",
    "capacities": "transfer --capacities --system h100:64",
    "p2p": "transfer --bytes 17M --from 0 --to 9 --system h100:64",
}


@cache
def doc_of(name: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*RUNS[name].split(), "--json"]) == 0
    return json.loads(out.getvalue())


def result_keys(name: str) -> set[str]:
    return set(doc_of(name)) - set(ENVELOPE)


def tables(anchor: str) -> list[set[str]]:
    """The keys (backticked names in the first column) of each table from the line `anchor`
    to the next `## ` heading."""
    text = DOC.read_text()
    start = text.index("\n" + anchor + "\n")
    end = text.find("\n## ", start + 1)
    out: list[set[str]] = []
    fresh = True
    for line in text[start : end if end > 0 else None].splitlines():
        cells = line.strip().split("|")
        if not line.strip().startswith("|") or len(cells) < 3:
            fresh = True
            continue
        if fresh:
            out.append(set())
            fresh = False
        if not re.fullmatch(r"[-\s]*", cells[1]) and cells[1].strip() != "key":
            out[-1] |= set(re.findall(r"`([^`]+)`", cells[1]))
    return [t for t in out if t]


def test_the_table_reader_reads_a_table():
    """Not vacuous: the reader finds the plan table's keys (with several keys to a cell)."""
    plan = tables("## `train`: the plan and what it puts off-chip")[0]
    assert {"spec", "dp", "pp", "mesh_axes"} <= plan and len(plan) > 15


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_document_opens_with_the_envelope(name):
    (env,) = tables("## Envelope")
    assert env == set(ENVELOPE)
    doc = doc_of(name)
    assert tuple(doc)[:3] == ENVELOPE and doc["command"] == RUNS[name].split()[0]
    assert f'`"{doc["schema_version"]}"`' in DOC.read_text()


def test_list_commands():
    (t,) = tables("## `chips`, `models`, `system`")
    assert t == result_keys("chips") | result_keys("models") | result_keys("system")


def test_train_top_level_keys():
    every, search = tables("## `train`: top-level keys")
    assert result_keys("train_plan") == every
    assert result_keys("train") - result_keys("train_plan") == search
    assert result_keys("train_plan") <= result_keys("train")


def test_train_plan_and_offload_tables():
    plan, acts, opt = tables("## `train`: the plan and what it puts off-chip")
    assert set(doc_of("train")["plan"]) == plan == set(doc_of("train_plan")["plan"])
    off = doc_of("train_offload")
    assert set(off["activation_offload"]) == acts
    assert set(off["offload"]) == opt
    added = result_keys("train_offload") - result_keys("train_plan")
    assert added == {"offload_activations", "offload_optimizer", "activation_offload", "offload"}
    assert all(f"`{k}`" in DOC.read_text() for k in added)


def test_serve_top_level_and_plan_keys():
    top, plan = tables("## `serve`: top-level keys")
    d = doc_of("serve")
    assert result_keys("serve") == top
    rows = [d["best"], *d["top"], *d["pareto"]]
    assert {frozenset(r["plan"]) for r in rows} | {frozenset(d["plan"])} == {frozenset(plan)}


def test_limits_tables():
    top, bandwidth, limit, ep = tables("## `limits`")
    d = doc_of("limits")
    assert result_keys("limits") == top
    assert {frozenset(b) for b in d["bandwidths"].values()} == {frozenset(bandwidth)}
    assert {frozenset(v) for v in d["limits"].values()} == {frozenset(limit)}
    e = doc_of("limits_ep")
    assert set(e["limits"]) | set(e["skipped"]) == ep


def test_transfer_tables():
    top, tier, transfer = tables("## `transfer`")
    assert result_keys("capacities") | result_keys("p2p") == top
    assert {frozenset(t) for t in doc_of("capacities")["capacities"]} == {frozenset(tier)}
    assert set(doc_of("p2p")["transfer"]) == transfer
