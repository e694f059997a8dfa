"""Verify a decode (or prefill) step: build it as a real sharded JAX program, compile it on
simulated devices, and diff the collectives XLA emits against the walk's prediction.

The decode step of `n_layers` layers takes x [B, 1, D] and a KV cache k, v [B, S, K, H] sharded
as the plan says (the batch over the data / expert axes, the KV heads over the tensor axis, or
replicated over it when tp exceeds the KV heads), writes the new token's K/V into the cache at
position S − 1, attends over the whole cache and runs the MLP. The prefill step is the same
layers over [B, T, D] with causal attention and no cache. The prediction is the walk's decode /
prefill records for the same rows (serving_step.py's mapping of plans to strategies), summed
per (collective kind, mesh axes) as bytes per device per step — the compiler check of issue 11.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roofline.core.rules import Degrees, Strategy, Structure, rules_of
from roofline.errors import VerifyError
from roofline.specs.model import MLPKind, ModelSpec
from roofline.verify.program import (
    Program,
    _dtype,
    _jax,
    _pspec,
    make_mesh,
    param_dims,
    param_shapes,
)

PHASES = ("decode", "prefill")


def _structure(model: ModelSpec, deg: Degrees) -> Structure:
    K = model.n_kv_heads
    rep = model.mla is None and deg.tp > 1 and (deg.tp > K or K % deg.tp != 0)
    return Structure(active=frozenset(s for s in Strategy if deg.of(s) > 1), kv_replicated=rep)


@dataclass(frozen=True)
class _Shape:
    """The step's sizes: batch, new tokens T, cache length S, heads N, KV heads K, head dim H."""

    batch: int
    T: int
    S: int
    N: int
    K: int
    H: int


def _layer_fn(model: ModelSpec, shape: _Shape, phase: str, dt: Any, x_sharding: Any, kv1: Any):
    """One Transformer layer of the step as a JAX function (x, cache) -> (x, cache): RMSNorm,
    GQA attention (decode: the new token's K/V written into the cache at S − 1, which stays as
    the plan shards it; prefill: causal over the chunk), the MLP, residuals pinned to the
    activation sharding."""
    jax, jnp = _jax()
    batch, T, S, N, K, H = shape.batch, shape.T, shape.S, shape.N, shape.K, shape.H
    G = N // K

    def rms(a, scale):
        a32 = a.astype(jnp.float32)
        a32 = a32 * jax.lax.rsqrt(jnp.mean(a32 * a32, axis=-1, keepdims=True) + 1e-6)
        return (a32 * scale.astype(jnp.float32)).astype(dt)

    def attend(q, k, v, causal):
        s = jnp.einsum("btkgh,bskh->bkgts", q, k).astype(jnp.float32) / math.sqrt(H)
        if causal:
            s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e30)
        w = jax.nn.softmax(s, axis=-1).astype(dt)
        return jnp.einsum("bkgts,bskh->btkgh", w, v).reshape(batch, T, N, H)

    def mlp(p, h):
        up = jnp.einsum("btd,df->btf", h, p["w_up"])
        a = (
            jax.nn.silu(jnp.einsum("btd,df->btf", h, p["w_gate"])) * up
            if model.mlp == MLPKind.GATED
            else jax.nn.gelu(up)
        )
        return jnp.einsum("btf,fd->btd", a, p["w_down"])

    def layer(p, x, kc, vc):
        h = rms(x, p["ln1"])
        q = jnp.einsum("btd,dnh->btnh", h, p["wq"]).reshape(batch, T, K, G, H)
        k = jnp.einsum("btd,dkh->btkh", h, p["wk"])
        v = jnp.einsum("btd,dkh->btkh", h, p["wv"])
        if phase == "decode":  # the cache stays as the plan shards it (pinned inside the loop)
            kc = jax.lax.dynamic_update_slice_in_dim(kc, k.astype(kc.dtype), S - 1, axis=1)
            vc = jax.lax.dynamic_update_slice_in_dim(vc, v.astype(vc.dtype), S - 1, axis=1)
            kc = jax.lax.with_sharding_constraint(kc, kv1)
            vc = jax.lax.with_sharding_constraint(vc, kv1)
            o = attend(q, kc, vc, causal=False)
        else:
            o = attend(q, k, v, causal=True)
        x = x + jnp.einsum("btnh,nhd->btd", o, p["wo"])
        x = jax.lax.with_sharding_constraint(x, x_sharding)
        x = x + mlp(p, rms(x, p["ln2"]))
        return jax.lax.with_sharding_constraint(x, x_sharding), kc, vc

    return layer


def build_decode_step(
    model: ModelSpec,
    deg: Degrees,
    *,
    batch: int = 8,
    context: int = 256,
    n_layers: int = 1,
    dtype: str = "bf16",
    phase: str = "decode",
) -> Program:
    """The sharded decode (or prefill) step of a dense model; see the module doc."""
    if model.moe is not None or model.mla is not None:
        raise VerifyError(
            f"model {model.name!r} is {'MoE' if model.moe else 'MLA'}",
            rule="the decode program covers dense GQA/MHA/MQA models",
            fix="verify a dense model, e.g. --model tiny-llama",
        )
    jax, jnp = _jax()
    P, NS = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
    rules = rules_of(_structure(model, deg), model)
    mesh = make_mesh(deg)
    dt = _dtype(dtype)
    notes: list[str] = []
    D, N, K, H = model.d_model, model.n_heads, model.n_kv_heads, model.d_head
    T = 1 if phase == "decode" else context
    S = context
    pdims = {k: ("layers", *v) for k, v in param_dims(model).items()}
    pshapes = {k: (n_layers, *v) for k, v in param_shapes(model).items()}
    pspecs = {k: _pspec(mesh, pdims[k], pshapes[k], rules, True, notes, k) for k in pdims}

    def spec(dims, shape, what):
        return _pspec(mesh, dims, shape, rules, False, notes, what)

    x_spec = spec(("batch", "seq", "embed"), (batch, T, D), "x")
    kv_dims = ("layers", "batch", "kv_seq", "kv_heads", "head_dim")
    kv_spec = spec(kv_dims, (n_layers, batch, S, K, H), "kv cache")
    kv1 = NS(mesh, spec(kv_dims[1:], (batch, S, K, H), "kv cache of a layer"))

    shape = _Shape(batch, T, S, N, K, H)
    layer = _layer_fn(model, shape, phase, dt, NS(mesh, x_spec), kv1)

    def step(params, x_in, kcache, vcache):
        def body(carry, slab):
            p, kc, vc = slab
            y, kc, vc = layer(p, carry, kc, vc)
            return y, (kc, vc)

        y, (kc, vc) = jax.lax.scan(body, x_in, (params, kcache, vcache))
        return y, kc, vc

    sds = jax.ShapeDtypeStruct
    params = {k: sds(pshapes[k], dt, sharding=NS(mesh, pspecs[k])) for k in pdims}
    x_arg = sds((batch, T, D), dt, sharding=NS(mesh, x_spec))
    cache = sds((n_layers, batch, S, K, H), dt, sharding=NS(mesh, kv_spec))
    out_sh = (NS(mesh, x_spec), NS(mesh, kv_spec), NS(mesh, kv_spec))
    fn = jax.jit(step, out_shardings=out_sh, donate_argnums=(2, 3))
    return Program(
        name=f"{phase}_step",
        fn=fn,
        args=(params, x_arg, cache, cache),
        mesh=mesh,
        degrees=deg,
        rules=rules,
        kind=phase,
        info={"batch": batch, "context": S, "layers": n_layers, "dtype": dtype, "P": P},
        notes=tuple(notes),
        raw_fn=step,
    )


def predict_collectives(
    model: ModelSpec, deg: Degrees, *, batch: int, context: int, n_layers: int, phase: str
) -> dict[tuple[str, tuple[str, ...]], float]:
    """Bytes per device per step by (HLO collective kind, mesh axes), from the walk."""
    import numpy as np

    from roofline.core.ledger import build_ledger, decode_ledger
    from roofline.core.walk import MeshRows, walk_rows
    from roofline.specs.efficiency import PEAK
    from roofline.specs.plan import Phase
    from roofline.specs.system import parse_system

    m = model.with_(n_layers=n_layers)
    if phase == "decode":
        led = decode_ledger(m, batch=1, context=context)
    else:
        led = build_ledger(m, batch=1, seq=context)
    keep = tuple(o for o in led.ops if o.name not in ("embed", "unembed"))
    led = type(led)(keep, led.model, led.sizes)
    system = parse_system(f"h100:{deg.n_chips}")
    rows = MeshRows(
        system_idx=np.zeros(1, int),
        degrees={s: np.array([deg.of(s)]) for s in Strategy},
        microbatches=np.ones(1),
    )
    w = walk_rows(
        m,
        [system],
        _structure(model, deg),
        rows,
        float(batch),
        led,
        PEAK,
        phase=Phase.DECODE if phase == "decode" else Phase.PREFILL,
    )
    out: dict[tuple[str, tuple[str, ...]], float] = {}
    for c in w.collectives:
        counted = bool(np.asarray(c.counted).reshape(-1)[0]) and bool(
            np.asarray(c.chosen).reshape(-1)[0]
        )
        if not counted:
            continue
        key = (_HLO_KIND[c.kind.value], tuple(sorted(c.axes)))
        b = float(np.asarray(c.bytes_per_chip).reshape(-1)[0]) * float(
            np.asarray(c.copies).reshape(-1)[0]
        )
        out[key] = out.get(key, 0.0) + b
    return out


_HLO_KIND = {
    "all-gather": "all-gather",
    "reduce-scatter": "reduce-scatter",
    "all-reduce": "all-reduce",
    "all-to-all": "all-to-all",
    "permute": "collective-permute",
}


@dataclass(frozen=True)
class DecodeCheck:
    """Predicted against observed collectives of one compiled decode/prefill step."""

    rows: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()
    tolerance: float = 0.05
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r["status"] == "agree" for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rows": list(self.rows),
            "notes": list(self.notes),
            **dict(self.info),
        }


def verify_decode(
    model: ModelSpec,
    deg: Degrees,
    *,
    batch: int = 8,
    context: int = 256,
    n_layers: int = 1,
    dtype: str = "bf16",
    phase: str = "decode",
    bytes_tol: float = 0.05,
) -> DecodeCheck:
    """Compile the step and compare bytes per device per (kind, mesh axes) with the walk."""
    from roofline.verify.hlo import observe

    if phase not in PHASES:
        raise VerifyError(f"phase {phase!r}", rule="phases: " + ", ".join(PHASES), fix="use decode")
    prog = build_decode_step(
        model, deg, batch=batch, context=context, n_layers=n_layers, dtype=dtype, phase=phase
    )
    obs = observe(prog)
    seen: dict[tuple[str, tuple[str, ...]], float] = {}
    for c in obs.collectives:
        key = (c.normalized_from or c.kind, tuple(sorted(c.mesh_axes)))
        seen[key] = seen.get(key, 0.0) + c.total_bytes_per_device
    pred = predict_collectives(
        model, deg, batch=batch, context=context, n_layers=n_layers, phase=phase
    )
    rows = []
    for key in sorted(set(seen) | set(pred)):
        p, o = pred.get(key, 0.0), seen.get(key, 0.0)
        ok = abs(p - o) <= bytes_tol * max(p, o, 1.0)
        rows.append(
            {
                "kind": key[0],
                "mesh_axes": list(key[1]),
                "predicted_bytes": p,
                "observed_bytes": o,
                "ratio": (o / p) if p else None,
                "status": "agree" if ok else "DISAGREE",
            }
        )
    info = {"phase": phase, "batch": batch, "context": context, "layers": n_layers, "dtype": dtype}
    return DecodeCheck(tuple(rows), prog.notes, bytes_tol, info)


def run_cli(args: Any) -> tuple[dict[str, Any], dict[str, Any], str, bool]:
    """`roofline verify --phase decode|prefill`: (inputs, result, text, ok) for the CLI."""
    from roofline.core.rules import parse_degrees
    from roofline.report.table import table
    from roofline.specs.model_catalog import load_model

    model = load_model(args.model)
    deg, rest = parse_degrees(args.plan or "")
    if rest or deg.pp > 1 or deg.n_chips != args.devices:
        raise VerifyError(
            f"plan {args.plan!r} for {args.devices} devices",
            rule="a serving plan to verify is strategy degrees (dp, tp, ep) multiplying to --devices",
            fix=f"e.g. --plan tp=2,dp={max(args.devices // 2, 1)}",
        )
    r = verify_decode(
        model,
        deg,
        batch=args.batch,
        context=args.context,
        n_layers=args.layers,
        dtype=args.dtype,
        phase=args.phase,
        bytes_tol=args.bytes_tol,
    )
    rows = [
        (
            x["kind"],
            ",".join(x["mesh_axes"]),
            f"{x['predicted_bytes']:,.0f}",
            f"{x['observed_bytes']:,.0f}",
            "-" if x["ratio"] is None else f"{x['ratio']:.3f}",
            x["status"],
        )
        for x in r.rows
    ]
    text = (
        f"roofline verify: {model.name} {args.phase} step, plan {args.plan}, batch {args.batch}, "
        f"context {args.context}, {args.layers} layer(s), {args.dtype}, {args.devices} simulated devices\n"
        "bytes per device per step: predicted by the walk, observed in the post-SPMD HLO\n\n"
        + (
            table(rows, ["kind", "axes", "predicted", "observed", "ratio", "status"])
            if rows
            else "no collectives (predicted and observed)"
        )
        + ("\n\nprogram notes: " + "; ".join(r.notes) if r.notes else "")
    )
    inputs = {
        "model": model.name,
        "plan": args.plan,
        "phase": args.phase,
        "batch": args.batch,
        "context": args.context,
        "layers": args.layers,
        "dtype": args.dtype,
        "devices": args.devices,
    }
    return inputs, r.to_dict(), text, r.ok
