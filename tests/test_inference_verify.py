"""`roofline verify --phase decode|prefill`: the serving step compiled on 8 simulated devices,
its collectives diffed against the walk (marked hlo)."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest

jax = pytest.importorskip("jax")

from roofline.core.rules import parse_degrees  # noqa: E402
from roofline.errors import VerifyError  # noqa: E402
from roofline.specs.model import ModelSpec  # noqa: E402
from roofline.specs.model_catalog import load_model  # noqa: E402
from roofline.verify.decode import predict_collectives, verify_decode  # noqa: E402

TINY = ModelSpec(
    "tiny", n_layers=2, d_model=128, d_ff=256, n_heads=8, n_kv_heads=4, d_head=16, vocab=256
)
pytestmark = pytest.mark.hlo


def _need8():
    try:
        jax.config.update("jax_num_cpu_devices", 8)
    except Exception:  # backend already initialised by another test
        pass
    if jax.device_count() < 8:
        pytest.skip(f"needs 8 simulated devices, JAX has {jax.device_count()}")


@pytest.mark.parametrize("plan", ["tp=2,dp=4", "tp=4,dp=2", "tp=8", "dp=8"])
@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_compiled_serving_step_matches_the_walk(plan, phase):
    """Tensor parallelism: one AllReduce of [B, T, D] after attention and one after the MLP per
    layer; data parallelism: none. tp=8 > K=4 replicates the KV cache (no gather of it)."""
    _need8()
    r = verify_decode(TINY, parse_degrees(plan)[0], batch=8, context=64, n_layers=2, phase=phase)
    assert r.ok, r.rows
    deg = parse_degrees(plan)[0]
    if deg.tp > 1:
        (row,) = r.rows
        T = 1 if phase == "decode" else 64
        per_layer = 2 * (8 // deg.dp) * T * TINY.d_model * 2  # two AllReduces of bf16 [B/dp, T, D]
        assert row["kind"] == "all-reduce" and row["observed_bytes"] == 2 * per_layer
    else:
        assert r.rows == ()


def test_the_prediction_alone_needs_no_compiler():
    p = predict_collectives(
        TINY, parse_degrees("tp=4,dp=2")[0], batch=8, context=64, n_layers=2, phase="decode"
    )
    assert p == {("all-reduce", ("tensor",)): 2 * 2 * 4 * 1 * 128 * 2}


def test_moe_and_mla_are_refused_with_a_reason():
    with pytest.raises(VerifyError, match="dense"):
        verify_decode(load_model("mixtral-8x7b"), parse_degrees("tp=8")[0], batch=8, context=64)


def test_verify_cli_phase_decode(capsys):
    _need8()
    from roofline.cli import main

    argv = ["verify", "--phase", "decode", "--model", "tiny-llama", "--plan", "tp=2,dp=4"]
    assert main([*argv, "--batch", "8", "--context", "64", "--json"]) == 0
    assert '"ok": true' in capsys.readouterr().out
