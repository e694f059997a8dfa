"""`train --offload-optimizer --json`: `offload.host_adam_reason` is null where T_adam is costed
and the reason where it is not (the `_reason` convention of docs/json.md), never ""."""

from __future__ import annotations

import json

import pytest

from roofline.cli import main

ARGS = "train --model llama-3-8b --batch-tokens 65536 --seq 1024 --tokens 0 --plan fsdp=8"


@pytest.mark.parametrize(
    "system, costed", [("h100:8", True), ("v5p:2x2x2", False)], ids=["h100", "v5p"]
)
def test_host_adam_reason_is_null_or_a_reason(system, costed, capsys):
    argv = [*ARGS.split(), "--system", system, "--offload-optimizer", "--json"]
    assert main(argv) == 0
    off = json.loads(capsys.readouterr().out)["offload"]
    if costed:
        assert off["host_adam_reason"] is None and off["host_adam_s"] > 0
        assert off["adam_breakeven_tokens_per_chip"] is not None
    else:
        assert "no host DRAM bandwidth" in off["host_adam_reason"]
        assert off["host_adam_s"] == 0 and off["adam_breakeven_tokens_per_chip"] is None
