"""Compile real plans on 8 simulated CPU devices and check what XLA did (marked hlo)."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest

jax = pytest.importorskip("jax")

from roofline.core.rules import parse_degrees, partition_spec, rules_for  # noqa: E402
from roofline.errors import VerifyError  # noqa: E402
from roofline.specs.model import ModelSpec, MoESpec  # noqa: E402
from roofline.verify import build_matmul, build_train_step, observe, summarize  # noqa: E402
from roofline.verify.program import MatmulSpec, param_dims  # noqa: E402

TINY = ModelSpec(
    name="tiny", n_layers=1, d_model=64, d_ff=128, n_heads=4, n_kv_heads=2, d_head=16, vocab=256
)
MOE = TINY.with_(name="tiny-moe", moe=MoESpec(n_experts=4, top_k=2, d_ff_expert=64))


def _need8():
    try:
        jax.config.update("jax_num_cpu_devices", 8)
    except Exception:  # backend already initialised by another test
        pass
    if jax.device_count() < 8:
        pytest.skip(
            f"needs 8 (simulated) devices, JAX has {jax.device_count()}; set XLA_FLAGS before jax starts"
        )


def _kinds(obs):
    return {(r["kind"], r["mesh_axes"]) for r in summarize(obs.collectives)}


def test_matmul_notation():
    m = MatmulSpec.parse("A[I_X,J] * B[J,K_Y] -> C[I_X,K_Y]")
    assert m.einsum() == "ab,bc->ac" and m.mesh_axes() == ("X", "Y")
    m = MatmulSpec.parse("A[I_X,J] * B[J,K_X]")  # book case 4: output drops the second X
    assert m.out == (("I", ("X",)), ("K", ()))
    with pytest.raises(VerifyError):
        MatmulSpec.parse("A[I,J] * B[J,K] -> C[I,J]")


@pytest.mark.hlo
def test_param_specs_come_from_rules():
    _need8()
    deg, _ = parse_degrees("fsdp=4,tp=2")
    p = build_train_step(TINY, deg, batch=8, seq=16, dtype="f32")
    rules = rules_for(deg)
    for k, dims in param_dims(TINY).items():
        assert tuple(p.args[0][k].sharding.spec) == partition_spec(
            tuple(d or "_" for d in dims), rules, True
        ), k
    assert tuple(p.args[2].sharding.spec)[0] == "fsdp"  # x [batch, seq, embed]: batch over fsdp
    assert p.n_devices == 8 and dict(p.mesh.shape) == {"fsdp": 4, "tensor": 2}


@pytest.mark.hlo
def test_indivisible_dim_is_replicated_with_a_note():
    _need8()
    p = build_train_step(TINY, "tp=8", batch=8, seq=16, dtype="f32")  # K=2, N=4 heads over 8
    assert any("kv_heads=2" in n for n in p.notes)


@pytest.mark.hlo
def test_matmul_cases():
    _need8()
    o = observe(
        build_matmul("A[I_X,J] * B[J,K_Y] -> C[I_X,K_Y]", sizes={"I": 64, "J": 64, "K": 64})
    )
    assert o.collectives == ()  # case 1: no communication
    assert o.dot_flops_per_device == 2 * 64 * 64 * 64 / 8  # per device: (I/2)(K/4) outputs x J
    assert o.flops_per_device_raw == pytest.approx(2 * 64 * 64 * 64 / 8, rel=0.1)  # + converts
    o = observe(build_matmul("A[I,J_X] * B[J_X,K] -> C[I,K]", sizes={"I": 64, "J": 64, "K": 64}))
    assert _kinds(o) == {("all-reduce", ("X",))}
    o = observe(build_matmul("A[I,J_X] * B[J_X,K] -> C[I_X,K]", sizes={"I": 64, "J": 64, "K": 64}))
    assert _kinds(o) == {("reduce-scatter", ("X",))}
    o = observe(build_matmul("A[I_X,J] * B[J,K_X]", sizes={"I": 64, "J": 64, "K": 64}))
    assert _kinds(o) == {("all-gather", ("X",))}


@pytest.mark.hlo
def test_fsdp_layer_observed():
    _need8()
    o = observe(build_train_step(TINY, "fsdp=8", batch=8, seq=16, dtype="bf16"))
    k = _kinds(o)
    assert ("all-gather", ("fsdp",)) in k and ("reduce-scatter", ("fsdp",)) in k
    ag = [c for c in o.collectives if c.kind == "all-gather" and c.dtype == "bf16"]
    # every weight matrix is gathered once (no remat): Q, K, V, O, gate, up, down
    assert len(ag) == 7
    assert o.flops_per_device > 0 and o.dot_flops_per_device > 0


@pytest.mark.hlo
def test_scan_loop_correction():
    _need8()
    o1 = observe(build_train_step(TINY, "fsdp=8", batch=8, seq=16, dtype="f32"))
    o2 = observe(build_train_step(TINY, "fsdp=8", batch=8, seq=16, dtype="f32", n_layers=2))
    assert o2.loops and all(t == 2 for _, t in o2.loops)
    # cost_analysis counts the scanned body once; the corrected figure is ~2x one layer
    assert o2.flops_per_device_raw < 1.5 * o1.flops_per_device_raw
    assert o2.flops_per_device == pytest.approx(2 * o1.flops_per_device_raw, rel=0.1)
    assert o2.dot_flops_per_device == pytest.approx(2 * o1.dot_flops_per_device, rel=0.02)
    assert any(c.count == 2 for c in o2.collectives)


@pytest.mark.hlo
def test_moe_all_to_all_over_expert_axis():
    _need8()
    o = observe(build_train_step(MOE, "ep=4,fsdp=2", batch=8, seq=16, dtype="f32"))
    assert ("all-to-all", ("expert",)) in _kinds(o)
