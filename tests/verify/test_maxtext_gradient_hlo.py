"""What XLA's SPMD partitioner emits for MaxText's gradient path (the source of the maxtext
profile's gradient dtypes and per-microbatch timing, specs/frameworks/maxtext.toml): float32
weights (weight_dtype, base.yml:174) cast to bf16 inside a rematerialised layer scanned over
the layers (dtype, base.yml:114; scan_layers, :387), under gradient accumulation a
jax.lax.scan over microbatches whose gradient carry is sharded like the parameters
(src/maxtext/utils/gradient_accumulation.py:110-163). Compiled on 8 simulated CPU devices
(data=2 x fsdp=4); read right after the partitioner, in the program's dtypes (the CPU backend
later does bf16 collectives in f32, docs/verify.md `f32-collective-for-bf16`)."""

from __future__ import annotations

import glob
import os
import re
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest  # noqa: E402

L, D, B, S, M = 2, 128, 16, 16, 4  # layers, width, sequences, length, accumulation steps


def _post_spmd_collectives() -> list[tuple[str, str, str, str]]:
    """(computation, kind, dtype, mesh axes) of every collective after the partitioner."""
    jax = pytest.importorskip("jax")
    if jax.device_count() < 8:
        pytest.skip("needs 8 simulated devices (XLA_FLAGS set before jax starts)")
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "fsdp"))
    ws = NamedSharding(mesh, P(None, "fsdp", None))  # stacked layers, embed over fsdp
    xs = NamedSharding(mesh, P(("data", "fsdp"), None, None))  # batch over data and fsdp

    def model(w, x):
        def layer(h, wl):
            return jnp.tanh(jnp.einsum("bsd,de->bse", h, wl.astype(jnp.bfloat16))), None

        h, _ = jax.lax.scan(jax.checkpoint(layer), x, w)
        return jnp.sum(jnp.square(h.astype(jnp.float32)))

    def step(w, x):
        def accumulate(acc, xb):
            g = jax.grad(model)(w, jax.lax.with_sharding_constraint(xb, xs))
            return acc + jax.lax.with_sharding_constraint(g, ws), None

        acc0 = jax.lax.with_sharding_constraint(jnp.zeros_like(w), ws)
        acc, _ = jax.lax.scan(accumulate, acc0, x.reshape(M, B // M, S, D))
        return acc

    w = jax.device_put(jnp.ones((L, D, D), jnp.float32), ws)
    x = jax.device_put(jnp.ones((B, S, D), jnp.bfloat16), xs)
    dump = tempfile.mkdtemp()
    jax.jit(step, in_shardings=(ws, xs), out_shardings=ws).lower(w, x).compile(
        {"xla_dump_to": dump, "xla_dump_hlo_pass_re": "spmd-partitioning"}
    )
    files = sorted(glob.glob(os.path.join(dump, "*after_spmd-partitioning*.txt")))
    assert files, "no post-SPMD dump"
    with open(files[-1]) as f:
        text = f.read()
    out, comp = [], ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and "{" in line:
            comp = line.split("(")[0].strip()
        m = re.search(r"= (\w+)\[[^\]]*\][^ ]* (all-gather|all-reduce|reduce-scatter)\(", line)
        if m:
            axes = re.search(r"replica_groups=.*?(\{'[^}]*\})", line)  # the mesh axes it spans
            out.append((comp, m.group(2), m.group(1), axes.group(1) if axes else ""))
    return out


@pytest.mark.hlo
def test_maxtext_reduces_its_weight_gradients_in_bf16_inside_the_accumulation_loop():
    colls = _post_spmd_collectives()
    reductions = [c for c in colls if c[1] in ("all-reduce", "reduce-scatter")]
    gathers = [c for c in colls if c[1] == "all-gather" and c[2] == "bf16"]
    # every weight gradient is reduced at its bf16 dot (the f32 convert comes after), over
    # fsdp (the all-reduce a slice makes a reduce-scatter) and over data
    assert reductions and all(c[2] == "bf16" for c in reductions), colls
    assert len({c[3] for c in reductions}) >= 2, colls  # two axes: fsdp and data
    # inside the layer loops of the accumulation body: not hoisted to the entry computation
    assert not any(c[0].startswith("ENTRY") for c in reductions), colls
    # the weights are gathered in bf16 in the forward and again in the backward loop
    assert len({c[0] for c in gathers if not c[0].startswith("ENTRY")}) >= 2, colls
