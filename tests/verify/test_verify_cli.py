"""`roofline verify`: bad input exits 2 before jax starts; --json keys (compiles, marked hlo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from roofline.cli import main


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--plan", "fsdp=3"], "3 devices"),
        (["--plan", "fsdp=4,tp=2", "--devices", "4"], "8 devices"),
        (["--plan", "bogus=8"], "bogus"),
        (["--plan", "fsdp=x"], "whole number"),
        (["--plan", "pp=8"], "pp=8"),
        (["--plan", "fsdp=8", "--model", "no-such-model"], "no-such-model"),
        ([], "either --plan"),
        (["--plan", "fsdp=8", "--matmul", "A[I,J_X] * B[J_X,K] -> C[I,K]"], "either --plan"),
        (["--matmul", "A[I,J_X] * B[J_X,K] -> C[I,K]", "--mesh", "X=4"], "4 devices"),
        (["--matmul", "A[I,J_X] + B[J_X,K]"], "matmul"),
        (["--plan", "fsdp=8", "--bytes-tol", "2"], "bytes-tol"),
    ],
)
def test_bad_input_exits_2_with_one_paragraph(argv, words, capsys):
    assert main(["verify", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("roofline verify: error:") and words in err
    assert "Traceback" not in err


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return subprocess.run(
        [sys.executable, "-m", "roofline", "verify", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.hlo
def test_verify_matmul_json_keys():
    p = _run(
        [
            "--matmul",
            "A[I,J_X] * B[J_X,K] -> C[I,K]",
            "--dims",
            "I=256,J=512,K=256",
            "--mesh",
            "X=8",
            "--json",
        ]
    )
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    for key in (
        "schema_version",
        "command",
        "inputs",
        "verdict",
        "verdict_line",
        "rows",
        "flops",
        "deviations",
        "alternatives",
        "tolerance",
        "prediction",
        "observed",
        "program_notes",
        "mesh",
        "source",
    ):
        assert key in d, key
    assert d["command"] == "verify" and d["verdict"] == "agree" and d["source"] == "post-spmd"
    (row,) = d["rows"]
    assert row["kind"] == "all-reduce" and row["axes"] == ["X"] and row["status"] == "agree"
    assert row["predicted_bytes"] == row["observed_bytes"] == 256 * 256 * 2
    for key in ("predicted", "observed", "observed_cost_analysis", "ratio", "status", "deviations"):
        assert key in d["flops"]
    assert d["flops"]["predicted"] == d["flops"]["observed"] == 2 * 256 * 512 * 256 / 8


@pytest.mark.hlo
def test_verify_model_prints_the_table():
    p = _run(["--model", "tiny-llama", "--plan", "fsdp=8", "--seq", "32"])
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "mesh fsdp=8 on 8 simulated CPU devices" in out
    assert "all-gather      fsdp" in out and "reduce-scatter  fsdp" in out and "FLOPs (dot)" in out
    assert "verdict: AGREE" in out


def test_the_default_stack_is_the_one_xla_runs():
    """Issue 22 item 13: with no --framework, verify prices the algebra with the JAX/XLA stack's
    option policy (the compiled program runs on XLA), and `ideal` still asks for the algebra's
    cheapest options."""
    from roofline.cli import build_parser
    from roofline.core.stack import stack_of

    args = build_parser("verify").parse_args(["verify", "--plan", "fsdp=8"])
    assert args.framework == "maxtext"
    assert stack_of(args.framework).name == "maxtext"
    ideal = build_parser("verify").parse_args(
        ["verify", "--plan", "fsdp=8", "--framework", "ideal"]
    )
    assert stack_of(ideal.framework).name == stack_of(None).name


@pytest.mark.hlo
def test_llama_3_8b_fsdp_tp_agrees_by_default():
    """The issue's reproducer: it said DISAGREE by default and agreed only with --framework
    maxtext. One compile at Llama-3-8B dims (~25 s on 2 cores)."""
    p = _run(["--model", "llama-3-8b", "--plan", "fsdp=4,tp=2", "--devices", "8", "--json"])
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["inputs"]["framework"] == "maxtext"
    assert d["verdict"] in ("agree", "agree-with-named-deviations"), d["verdict_line"]
    assert not any(row["status"] == "disagree" for row in d["rows"])
