"""Build a plan as a real sharded JAX program: one Transformer layer (or a scanned stack)
forward + backward + optimizer update, or one of the book's sharded matmuls.

Every parameter, activation and output carries the PartitionSpec produced by
`roofline.core.rules.partition_spec` from the *same* rules the algebra uses (one source of
truth; book `sharding.md`, `training.md`). Inputs are `jax.ShapeDtypeStruct`s, so any size
lowers and compiles without allocating; `Program.example_args()` makes small real arrays.

Parameter layout of a dense layer (logical dims in brackets):

    ln1, ln2        [embed]
    wq              [embed, heads, head_dim]           (separate Q/K/V, default)
    wk, wv          [embed, kv_heads, head_dim]
    wqkv            [embed, kv_heads, qkv, head_dim]   (fused: qkv = N/K + 2, unsharded)
    wo              [heads, head_dim, embed]
    w_gate, w_up    [embed, mlp]                        (gated MLP; plain MLP has w_up only)
    w_down          [mlp, embed]

An MoE layer replaces the MLP by a router [embed, experts] and expert weights
[experts, embed, mlp] / [experts, mlp, embed], with GShard-style top-k dispatch over
groups = batch rows: dispatched activations are [experts, batch, capacity, embed], so the
switch from batch-sharded to expert-sharded is an all-to-all (book `training.md`, MoE).
A stack of L layers has a leading `layers` dim on every parameter and runs under
`jax.lax.scan` (one while loop in HLO).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roofline.core.rules import Degrees, Rules, parse_degrees, partition_spec, rules_for
from roofline.errors import VerifyError
from roofline.specs.model import MLPKind, ModelSpec


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise VerifyError(
            "JAX is not installed",
            rule="`roofline verify` compiles the plan with JAX",
            fix="pip install 'roofline[jax]'",
        ) from e
    return jax, jnp


class Optimizer(enum.StrEnum):
    SGD = "sgd"  # p <- p - lr * g
    ADAM = "adam"  # Adam without bias correction; m, v sharded like p


# ----------------------------------------------------------------------------- mesh


def make_mesh(degrees: Degrees, devices: Sequence[Any] | None = None):
    """A `jax.sharding.Mesh` with the plan's axes (rules.AXIS_ORDER, outermost first).

    Devices are taken in order (`jax.devices()` unless given), so logical device id
    (partition id in HLO) p sits at mesh coordinate `np.unravel_index(p, mesh.shape)`.
    """
    import numpy as np

    jax, _ = _jax()
    axes = degrees.mesh_axes()
    n = math.prod(s for _, s in axes)
    devs = list(jax.devices() if devices is None else devices)
    if len(devs) < n:
        raise VerifyError(
            f"the plan needs {n} devices, JAX sees {len(devs)}",
            rule="the compiled program runs one SPMD partition per mesh device",
            fix=f"set XLA_FLAGS=--xla_force_host_platform_device_count={n} before importing jax "
            f"(or jax.config.update('jax_num_cpu_devices', {n}))",
        )
    arr = np.array(devs[:n], dtype=object).reshape([s for _, s in axes])
    return jax.sharding.Mesh(arr, tuple(a for a, _ in axes))


def _pspec(
    mesh,
    dims: Sequence[str | None],
    shape: Sequence[int],
    rules: Rules,
    is_param: bool,
    notes: list[str],
    what: str,
):
    """PartitionSpec from the rules; an axis that does not divide its dim is dropped (noted)."""
    jax, _ = _jax()
    entries = partition_spec(tuple(d or "_none" for d in dims), rules, is_param)
    out = []
    for d, n, e in zip(dims, shape, entries, strict=True):
        if e is None:
            out.append(None)
            continue
        axes = (e,) if isinstance(e, str) else tuple(e)
        size = math.prod(mesh.shape[a] for a in axes)
        if n % size:
            notes.append(
                f"{what}: {d}={n} is not divisible by mesh axes {axes} (size {size}); replicated"
            )
            out.append(None)
        else:
            out.append(e)
    return jax.sharding.PartitionSpec(*out)


# ----------------------------------------------------------------------------- program


@dataclass(frozen=True)
class Program:
    """A jitted function plus abstract, sharded inputs. `lower()` gives the jax Lowered."""

    name: str
    fn: Callable[..., Any]  # jax.jit-wrapped, with in/out shardings
    args: tuple[Any, ...]  # pytrees of jax.ShapeDtypeStruct with .sharding
    mesh: Any
    degrees: Degrees
    rules: Rules
    kind: str  # "train_step" | "matmul"
    info: Mapping[str, Any] = field(default_factory=dict)  # dims, options, shapes
    notes: tuple[str, ...] = ()  # where the program departs from the rules (indivisible dims)
    raw_fn: Callable[..., Any] | None = None  # the un-jitted function (single-device reference)

    @property
    def n_devices(self) -> int:
        return int(self.mesh.devices.size)

    def lower(self):
        return self.fn.lower(*self.args)

    def example_args(self, seed: int = 0) -> tuple[Any, ...]:
        """Small real host arrays (numpy) with the shapes/dtypes of `args` (deterministic)."""
        import numpy as np

        jax, _ = _jax()
        rng = np.random.default_rng(seed)
        leaves, tree = jax.tree_util.tree_flatten(self.args)
        out = []
        for s in leaves:
            x = rng.standard_normal(s.shape).astype(np.float32) * 0.1
            if s.shape and len(s.shape) == 1:  # norm scales
                x = x + 1.0
            out.append(np.asarray(x, dtype=s.dtype))
        return jax.tree_util.tree_unflatten(tree, out)


def _as_plan(plan: str | Degrees | Mapping[str, int]) -> Degrees:
    if isinstance(plan, Degrees):
        return plan
    return parse_degrees(plan)[0]


def _dtype(name: str | Any):
    _, jnp = _jax()
    if not isinstance(name, str):
        return jnp.dtype(name)
    table = {
        "bf16": jnp.bfloat16,
        "bfloat16": jnp.bfloat16,
        "f32": jnp.float32,
        "float32": jnp.float32,
        "fp32": jnp.float32,
        "f16": jnp.float16,
        "fp16": jnp.float16,
        "float16": jnp.float16,
    }
    if name.lower() not in table:
        raise VerifyError(
            f"dtype {name!r}", rule="verify programs use bf16, f16 or f32", fix="use --dtype bf16"
        )
    return jnp.dtype(table[name.lower()])


def param_dims(model: ModelSpec, *, fused_qkv: bool = False) -> dict[str, tuple[str | None, ...]]:
    """Logical dims of one layer's parameters (see module docstring)."""
    dims: dict[str, tuple[str | None, ...]] = {"ln1": ("embed",), "ln2": ("embed",)}
    if fused_qkv:
        dims["wqkv"] = ("embed", "kv_heads", None, "head_dim")
    else:
        dims["wq"] = ("embed", "heads", "head_dim")
        dims["wk"] = ("embed", "kv_heads", "head_dim")
        dims["wv"] = ("embed", "kv_heads", "head_dim")
    dims["wo"] = ("heads", "head_dim", "embed")
    if model.moe is not None:
        dims["router"] = ("embed", "routes")  # replicated over the expert axis (core.ledger)
        if model.mlp == MLPKind.GATED:
            dims["we_gate"] = ("experts", "embed", "mlp")
        dims["we_up"] = ("experts", "embed", "mlp")
        dims["we_down"] = ("experts", "mlp", "embed")
    else:
        if model.mlp == MLPKind.GATED:
            dims["w_gate"] = ("embed", "mlp")
        dims["w_up"] = ("embed", "mlp")
        dims["w_down"] = ("mlp", "embed")
    return dims


def param_shapes(model: ModelSpec, *, fused_qkv: bool = False) -> dict[str, tuple[int, ...]]:
    D, F, N, K, H = model.d_model, model.d_ff, model.n_heads, model.n_kv_heads, model.d_head
    shapes: dict[str, tuple[int, ...]] = {"ln1": (D,), "ln2": (D,)}
    if fused_qkv:
        shapes["wqkv"] = (D, K, N // K + 2, H)
    else:
        shapes.update(wq=(D, N, H), wk=(D, K, H), wv=(D, K, H))
    shapes["wo"] = (N, H, D)
    if model.moe is not None:
        E, Fe = model.moe.n_experts, model.moe.d_ff_expert
        shapes["router"] = (D, E)
        if model.mlp == MLPKind.GATED:
            shapes["we_gate"] = (E, D, Fe)
        shapes.update(we_up=(E, D, Fe), we_down=(E, Fe, D))
    else:
        if model.mlp == MLPKind.GATED:
            shapes["w_gate"] = (D, F)
        shapes.update(w_up=(D, F), w_down=(F, D))
    return shapes


def moe_capacity(model: ModelSpec, seq: int, capacity_factor: float) -> int:
    """Tokens per expert per group (group = one batch row of `seq` tokens), GShard style."""
    assert model.moe is not None
    return max(1, math.ceil(capacity_factor * model.moe.top_k * seq / model.moe.n_experts))


@dataclass(frozen=True)
class _ActivationSpecs:
    """The PartitionSpecs the layer pins its activations to (with_sharding_constraint)."""

    x: Any
    q: Any
    kv: Any
    attn: Any
    h: Any
    disp: Any = None  # MoE: tokens dispatched to experts
    eh: Any = None  # MoE: the experts' hidden activations
    capacity: int = 0  # MoE: tokens per expert per group


def _activation_specs(model, batch, seq, capacity_factor, act_spec) -> _ActivationSpecs:
    D, N, K, H = model.d_model, model.n_heads, model.n_kv_heads, model.d_head
    G = N // K
    specs = dict(
        x=act_spec(("batch", "seq", "embed"), (batch, seq, D), "activation x"),
        q=act_spec(
            ("batch", "seq", "kv_heads", None, "head_dim"), (batch, seq, K, G, H), "activation q"
        ),
        kv=act_spec(
            ("batch", "kv_seq", "kv_heads", "head_dim"), (batch, seq, K, H), "activation k/v"
        ),
        attn=act_spec(("batch", "seq", "heads", "head_dim"), (batch, seq, N, H), "activation attn"),
        h=act_spec(("batch", "seq", "mlp"), (batch, seq, model.d_ff), "activation mlp hidden"),
    )
    if model.moe is not None:
        E, Fe = model.moe.n_experts, model.moe.d_ff_expert
        C = moe_capacity(model, seq, capacity_factor)
        specs["disp"] = act_spec(
            ("experts", "batch", None, "embed"), (E, batch, C, D), "activation dispatched"
        )
        specs["eh"] = act_spec(
            ("experts", "batch", None, "mlp"), (E, batch, C, Fe), "activation expert hidden"
        )
        specs["capacity"] = C
    return _ActivationSpecs(**specs)


class _Layer:
    """One Transformer layer as JAX code: RMSNorm, attention (GQA), dense or MoE MLP."""

    def __init__(
        self, jax, jnp, model, specs: _ActivationSpecs, mesh, dt, batch, seq, fused_qkv, constrain
    ):
        self.jax, self.jnp, self.model, self.s = jax, jnp, model, specs
        self.mesh, self.dt, self.batch, self.seq = mesh, dt, batch, seq
        self.fused_qkv, self.constrain = fused_qkv, constrain

    def wsc(self, a, spec):
        if not self.constrain:
            return a
        return self.jax.lax.with_sharding_constraint(
            a, self.jax.sharding.NamedSharding(self.mesh, spec)
        )

    def rms(self, a, scale):
        jax, jnp = self.jax, self.jnp
        a32 = a.astype(jnp.float32)
        a32 = a32 * jax.lax.rsqrt(jnp.mean(a32 * a32, axis=-1, keepdims=True) + 1e-6)
        return (a32 * scale.astype(jnp.float32)).astype(self.dt)

    def attention(self, p, h):
        jax, jnp, m = self.jax, self.jnp, self.model
        batch, seq = self.batch, self.seq
        N, K, H = m.n_heads, m.n_kv_heads, m.d_head
        G = N // K
        if self.fused_qkv:
            qkv = jnp.einsum("btd,dkjh->btkjh", h, p["wqkv"])
            q, k, v = qkv[:, :, :, :G], qkv[:, :, :, G], qkv[:, :, :, G + 1]
        else:
            q = jnp.einsum("btd,dnh->btnh", h, p["wq"]).reshape(batch, seq, K, G, H)
            k = jnp.einsum("btd,dkh->btkh", h, p["wk"])
            v = jnp.einsum("btd,dkh->btkh", h, p["wv"])
        q, k, v = self.wsc(q, self.s.q), self.wsc(k, self.s.kv), self.wsc(v, self.s.kv)
        s = jnp.einsum("btkgh,bskh->bkgts", q, k).astype(jnp.float32) / math.sqrt(H)
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        s = jnp.where(mask, s, -1e30)
        w = jax.nn.softmax(s, axis=-1).astype(self.dt)
        o = jnp.einsum("bkgts,bskh->btkgh", w, v).reshape(batch, seq, N, H)
        o = self.wsc(o, self.s.attn)
        return jnp.einsum("btnh,nhd->btd", o, p["wo"])

    def dense_mlp(self, p, h):
        jax, jnp = self.jax, self.jnp
        up = jnp.einsum("btd,df->btf", h, p["w_up"])
        if self.model.mlp == MLPKind.GATED:
            a = jax.nn.silu(jnp.einsum("btd,df->btf", h, p["w_gate"])) * up
        else:
            a = jax.nn.gelu(up)
        a = self.wsc(a, self.s.h)
        return jnp.einsum("btf,fd->btd", a, p["w_down"])

    def _routing(self, h, p):
        """GShard top-k routing: dispatch and combine tensors [g, s, E, C]."""
        jax, jnp = self.jax, self.jnp
        assert self.model.moe is not None
        kk, E, C = self.model.moe.top_k, self.model.moe.n_experts, self.s.capacity
        batch, seq = self.batch, self.seq
        logits = jnp.einsum("gsd,de->gse", h, p["router"]).astype(jnp.float32)
        probs = jax.nn.softmax(logits, axis=-1)
        gate, idx = jax.lax.top_k(probs, kk)  # [g, s, k]
        onehot = jax.nn.one_hot(idx, E, dtype=jnp.int32)  # [g, s, k, E]
        # position of each (token, choice) in its expert's buffer, choices in priority order
        flat = onehot.transpose(0, 2, 1, 3).reshape(batch, kk * seq, E)
        pos = (jnp.cumsum(flat, axis=1) - 1).reshape(batch, kk, seq, E).transpose(0, 2, 1, 3)
        keep = onehot * (pos < C)
        slot = jax.nn.one_hot(jnp.sum(pos * keep, axis=-1), C, dtype=jnp.float32)  # [g,s,k,C]
        dispatch = jnp.einsum("gske,gskc->gsec", keep.astype(jnp.float32), slot)
        combine = jnp.einsum("gske,gskc,gsk->gsec", keep.astype(jnp.float32), slot, gate)
        return dispatch, combine

    def moe_mlp(self, p, h):
        jax, jnp, dt = self.jax, self.jnp, self.dt
        dispatch, combine = self._routing(h, p)
        xe = jnp.einsum("gsec,gsd->egcd", dispatch.astype(dt), h)
        xe = self.wsc(xe, self.s.disp)  # batch-sharded -> expert-sharded: all-to-all
        up = jnp.einsum("egcd,edf->egcf", xe, p["we_up"])
        if self.model.mlp == MLPKind.GATED:
            a = jax.nn.silu(jnp.einsum("egcd,edf->egcf", xe, p["we_gate"])) * up
        else:
            a = jax.nn.gelu(up)
        a = self.wsc(a, self.s.eh)
        ye = jnp.einsum("egcf,efd->egcd", a, p["we_down"])
        ye = self.wsc(ye, self.s.disp)
        return jnp.einsum("gsec,egcd->gsd", combine.astype(dt), ye)

    def apply(self, p, x):
        x = self.wsc(x, self.s.x)
        x = x + self.attention(p, self.rms(x, p["ln1"]))
        x = self.wsc(x, self.s.x)
        h = self.rms(x, p["ln2"])
        x = x + (self.moe_mlp(p, h) if self.model.moe is not None else self.dense_mlp(p, h))
        return self.wsc(x, self.s.x)


def _train_step_fn(jax, jnp, layer_fn, stacked: bool, opt: Optimizer, learning_rate: float):
    """(params, opt_state, x) -> (params', opt_state', loss): loss = mean(out²) in f32, then
    an SGD or Adam update."""

    def forward(params, x):
        if stacked:

            def body(carry, p):
                return layer_fn(p, carry), None

            out, _ = jax.lax.scan(body, x, params)
        else:
            out = layer_fn(params, x)
        return jnp.mean(jnp.square(out.astype(jnp.float32)))

    def step(params, opt_state, x):
        loss, grads = jax.value_and_grad(forward)(params, x)
        lr = jnp.float32(learning_rate)
        if opt == Optimizer.SGD:
            new = jax.tree.map(
                lambda p, g: (p.astype(jnp.float32) - lr * g.astype(jnp.float32)).astype(p.dtype),
                params,
                grads,
            )
            return new, opt_state, loss
        m, v = opt_state
        g32 = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        m = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g, m, g32)
        v = jax.tree.map(lambda a, g: 0.999 * a + 0.001 * g * g, v, g32)
        new = jax.tree.map(
            lambda p, a, b: (p.astype(jnp.float32) - lr * a / (jnp.sqrt(b) + 1e-8)).astype(p.dtype),
            params,
            m,
            v,
        )
        return new, (m, v), loss

    return step


def _check_layer_args(model: ModelSpec, n_layers: int, fused_qkv: bool) -> None:
    if n_layers < 1:
        raise VerifyError(
            f"n_layers={n_layers}", rule="a program has at least one layer", fix="use n_layers=1"
        )
    N, K = model.n_heads, model.n_kv_heads
    if fused_qkv and N % K:
        raise VerifyError(
            f"fused QKV with N={N}, K={K}", rule="K divides N", fix="use separate Q/K/V"
        )


def build_train_step(
    model: ModelSpec,
    plan: str | Degrees | Mapping[str, int],
    *,
    batch: int = 8,
    seq: int = 64,
    dtype: str | Any = "bf16",
    n_layers: int = 1,
    remat: bool = False,
    fused_qkv: bool = False,
    optimizer: Optimizer | str = Optimizer.SGD,
    learning_rate: float = 1e-2,
    capacity_factor: float = 1.0,
    rules: Rules | None = None,
    devices: Sequence[Any] | None = None,
    constrain_activations: bool = True,
) -> Program:
    """One training step of `n_layers` layers of `model` (scan when n_layers > 1).

    The step is `(params, opt_state, x) -> (params', opt_state', loss)` with
    x [batch, seq, embed] the layer input (no embedding / unembedding: the layer is the
    unit). Loss = mean(out**2) in f32. Params, x and outputs carry the rules' specs;
    activations inside the layer are pinned with `with_sharding_constraint` at x, q/k/v,
    the attention output, the MLP hidden and the MoE dispatch (set
    `constrain_activations=False` to let the partitioner propagate freely).
    `remat=True` wraps each layer in `jax.checkpoint` (full recomputation).
    """
    jax, jnp = _jax()
    deg = _as_plan(plan)
    rules = rules if rules is not None else rules_for(deg)
    mesh = make_mesh(deg, devices)
    dt = _dtype(dtype)
    opt = Optimizer(optimizer)
    notes: list[str] = []
    _check_layer_args(model, n_layers, fused_qkv)
    stacked = n_layers > 1
    pdims = param_dims(model, fused_qkv=fused_qkv)
    pshapes = param_shapes(model, fused_qkv=fused_qkv)
    if stacked:
        pdims = {k: ("layers", *v) for k, v in pdims.items()}
        pshapes = {k: (n_layers, *v) for k, v in pshapes.items()}
    pspecs = {
        k: _pspec(mesh, pdims[k], pshapes[k], rules, True, notes, f"param {k}") for k in pdims
    }

    def act_spec(dims: tuple[str | None, ...], shape: tuple[int, ...], what: str):
        return _pspec(mesh, dims, shape, rules, False, notes, what)

    specs = _activation_specs(model, batch, seq, capacity_factor, act_spec)
    L = _Layer(jax, jnp, model, specs, mesh, dt, batch, seq, fused_qkv, constrain_activations)

    def layer(p, x):
        return L.apply(p, x)

    step = _train_step_fn(
        jax, jnp, jax.checkpoint(layer) if remat else layer, stacked, opt, learning_rate
    )
    fn, args = _jit_step(
        jax, jnp, step, mesh, pspecs, pshapes, specs.x, (batch, seq, model.d_model), dt, opt
    )
    name = (
        f"{model.name}:{_plan_str(deg)}"
        + (f":L{n_layers}" if stacked else "")
        + (":remat" if remat else "")
        + (":fusedqkv" if fused_qkv else "")
        + f":{dt.name}"
    )
    info = {
        "model": model.name,
        "plan": _plan_str(deg),
        "batch": batch,
        "seq": seq,
        "dtype": dt.name,
        "n_layers": n_layers,
        "remat": remat,
        "fused_qkv": fused_qkv,
        "optimizer": opt.value,
        "param_shapes": pshapes,
        "param_specs": {k: tuple(s) for k, s in pspecs.items()},
        "x_spec": tuple(specs.x),
        "mesh": dict(mesh.shape),
    }
    if model.moe is not None:
        info["moe_capacity"] = specs.capacity
    return Program(
        name=name,
        fn=fn,
        args=args,
        mesh=mesh,
        degrees=deg,
        rules=rules,
        kind="train_step",
        info=info,
        notes=tuple(dict.fromkeys(notes)),
        raw_fn=step,
    )


def _jit_step(jax, jnp, step, mesh, pspecs, pshapes, x_spec, x_shape, dt, opt):
    """The jitted step with the params', optimizer state's and input's shardings, and abstract
    arguments to lower it with."""
    NS = jax.sharding.NamedSharding
    p_sh = {k: NS(mesh, s) for k, s in pspecs.items()}
    params = {k: jax.ShapeDtypeStruct(pshapes[k], dt, sharding=p_sh[k]) for k in pshapes}
    if opt == Optimizer.SGD:
        opt_state: Any = ()
        opt_sh: Any = ()
    else:
        st = {k: jax.ShapeDtypeStruct(pshapes[k], jnp.float32, sharding=p_sh[k]) for k in pshapes}
        opt_state, opt_sh = (st, dict(st)), (p_sh, dict(p_sh))
    x_sh = NS(mesh, x_spec)
    x = jax.ShapeDtypeStruct(x_shape, dt, sharding=x_sh)
    replicated = NS(mesh, jax.sharding.PartitionSpec())
    fn = jax.jit(
        step,
        in_shardings=(p_sh, opt_sh, x_sh),
        out_shardings=(p_sh, opt_sh, replicated),
        donate_argnums=(0, 1),
    )
    return fn, (params, opt_state, x)


def _plan_str(deg: Degrees) -> str:
    return deg.describe(empty="single")


# ----------------------------------------------------------------------------- matmuls

_OPERAND = re.compile(r"\s*([A-Za-z]\w*)\s*\[([^\]]*)\]\s*")


@dataclass(frozen=True)
class MatmulSpec:
    """The book's notation, e.g. 'A[I_X,J] * B[J,K_Y] -> C[I_X,K_Y]' (sharding.md)."""

    lhs: tuple[tuple[str, tuple[str, ...]], ...]  # (dim letter, mesh axes) per dim
    rhs: tuple[tuple[str, tuple[str, ...]], ...]
    out: tuple[tuple[str, tuple[str, ...]], ...]

    @staticmethod
    def parse(text: str) -> MatmulSpec:
        s = text.replace("·", "*").replace("@", "*")
        if "->" in s:
            ins, out = s.split("->", 1)
        else:
            ins, out = s, ""
        parts = [p for p in ins.split("*")]
        if len(parts) != 2:
            raise VerifyError(
                f"matmul {text!r}",
                rule="two operands: 'A[I_X,J] * B[J,K_Y] -> C[I_X,K_Y]'",
                fix="write the book's notation with '*' between operands",
            )
        lhs, rhs = (_parse_operand(p, text) for p in parts)
        lhs_d, rhs_d = [d for d, _ in lhs], [d for d, _ in rhs]
        contracted = [d for d in lhs_d if d in rhs_d]
        free = [d for d in lhs_d if d not in contracted] + [d for d in rhs_d if d not in contracted]
        if out.strip():
            o = _parse_operand(out, text)
            if sorted(d for d, _ in o) != sorted(free):
                raise VerifyError(
                    f"matmul {text!r}: output dims {[d for d, _ in o]} but free dims are {free}",
                    rule="the output has the non-contracted dims",
                    fix="fix the output",
                )
        else:  # default output: free dims keep their input sharding, axes used twice dropped
            used: set[str] = set()
            o_list = []
            for d in free:
                axes = dict(lhs).get(d) if d in lhs_d else dict(rhs)[d]
                axes = tuple(a for a in (axes or ()) if a not in used)
                used.update(axes)
                o_list.append((d, axes))
            o = tuple(o_list)
        return MatmulSpec(lhs, rhs, o)

    def einsum(self) -> str:
        letters: dict[str, str] = {}
        for d, _ in (*self.lhs, *self.rhs):
            letters.setdefault(d, "abcdefghijklmnopqrstuvwxyz"[len(letters)])
        f = lambda op: "".join(letters[d] for d, _ in op)  # noqa: E731
        return f"{f(self.lhs)},{f(self.rhs)}->{f(self.out)}"

    def mesh_axes(self) -> tuple[str, ...]:
        return tuple(
            dict.fromkeys(a for op in (self.lhs, self.rhs, self.out) for _, ax in op for a in ax)
        )

    def default_mesh(self) -> dict[str, int]:
        """8 devices: one axis of 8, or the last axis 4 and the others 2."""
        axes = self.mesh_axes()
        if len(axes) == 1:
            return {axes[0]: 8}
        return {a: (4 if i == len(axes) - 1 else 2) for i, a in enumerate(axes)}

    def invalid_reason(self) -> str | None:
        """The book's case 4: a mesh axis shards two dims of one operand, or both the
        contracting dim of one operand and a free dim of the other's output."""
        for name, op in (("lhs", self.lhs), ("rhs", self.rhs), ("out", self.out)):
            ax = [a for _, axes in op for a in axes]
            if len(ax) != len(set(ax)):
                return f"{name} uses a mesh axis twice"
        return None


def _parse_operand(text: str, whole: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    m = _OPERAND.fullmatch(text)
    if not m:
        raise VerifyError(
            f"cannot read operand {text.strip()!r} of {whole!r}",
            rule="operands look like A[I_X,J_YZ]",
            fix="write e.g. 'A[I_X,J] * B[J,K_Y]'",
        )
    out = []
    for item in m.group(2).split(","):
        item = item.strip()
        dim, _, axes = item.partition("_")
        out.append((dim, tuple(axes) if axes else ()))
    return tuple(out)


def build_matmul(
    spec: str | MatmulSpec,
    *,
    sizes: Mapping[str, int] | None = None,
    mesh_shape: Mapping[str, int] | None = None,
    dtype: str | Any = "bf16",
    devices: Sequence[Any] | None = None,
) -> Program:
    """Forward matmul in the book's notation, e.g. 'A[I,J_X] * B[J_X,K] -> C[I,K]'.

    Mesh axes are single letters (X, Y, Z...); `mesh_shape` gives their sizes (default 2 for
    each axis but the last, the rest of 8 devices... i.e. X=2,Y=4 for two axes, X=8 for one).
    Sizes of the dims default to 256 each (I=J=K=256).
    """
    import numpy as np

    jax, jnp = _jax()
    P = jax.sharding.PartitionSpec
    NS = jax.sharding.NamedSharding
    ms = spec if isinstance(spec, MatmulSpec) else MatmulSpec.parse(spec)
    axes = ms.mesh_axes()
    if mesh_shape is None:
        mesh_shape = ms.default_mesh()
        if len(axes) > 2:
            raise VerifyError(
                f"matmul {spec!r} uses {len(axes)} mesh axes",
                rule="give mesh_shape for 3+ axes",
                fix="pass mesh_shape={'X': 2, 'Y': 2, 'Z': 2}",
            )
    missing = [a for a in axes if a not in mesh_shape]
    if missing:
        raise VerifyError(
            f"mesh axes {missing} have no size",
            rule="every axis in the notation needs a size",
            fix="add them to mesh_shape",
        )
    names = tuple(mesh_shape) or ("X",)
    n = math.prod(mesh_shape.values()) if mesh_shape else 1
    devs = list(jax.devices() if devices is None else devices)
    if len(devs) < n:
        raise VerifyError(
            f"the matmul needs {n} devices, JAX sees {len(devs)}",
            rule="one partition per device",
            fix=f"set XLA_FLAGS=--xla_force_host_platform_device_count={n}",
        )
    mesh = jax.sharding.Mesh(
        np.array(devs[:n], dtype=object).reshape([mesh_shape[a] for a in names] or [1]), names
    )
    sizes = dict(sizes or {})
    dims = {d for op in (ms.lhs, ms.rhs) for d, _ in op}
    for d in dims:
        sizes.setdefault(d, 256)

    def ps(op):
        return P(*[(None if not ax else (ax[0] if len(ax) == 1 else ax)) for _, ax in op])

    dt = _dtype(dtype)
    notes = []
    reason = ms.invalid_reason()
    if reason:
        raise VerifyError(
            f"matmul {spec!r}: {reason}",
            rule="JAX forbids a mesh axis twice in one PartitionSpec "
            "(book sharding.md case 4: gather one operand first)",
            fix="give an output sharding that uses each axis once, e.g. '-> C[I_X,K]'",
        )
    eq = ms.einsum()
    a = jax.ShapeDtypeStruct(tuple(sizes[d] for d, _ in ms.lhs), dt, sharding=NS(mesh, ps(ms.lhs)))
    b = jax.ShapeDtypeStruct(tuple(sizes[d] for d, _ in ms.rhs), dt, sharding=NS(mesh, ps(ms.rhs)))

    def mm(x, y):
        return jnp.einsum(eq, x, y, preferred_element_type=dt)

    fn = jax.jit(mm, in_shardings=(a.sharding, b.sharding), out_shardings=NS(mesh, ps(ms.out)))
    text = spec if isinstance(spec, str) else eq
    info = {
        "spec": text,
        "einsum": eq,
        "sizes": sizes,
        "mesh": dict(mesh_shape),
        "dtype": dt.name,
        "out": tuple((d, ax) for d, ax in ms.out),
    }
    deg = Degrees()
    return Program(
        name=f"matmul:{text}",
        fn=fn,
        args=(a, b),
        mesh=mesh,
        degrees=deg,
        rules=rules_for(deg),
        kind="matmul",
        info=info,
        notes=tuple(notes),
        raw_fn=mm,
    )


__all__ = [
    "Program",
    "Optimizer",
    "MatmulSpec",
    "make_mesh",
    "build_train_step",
    "build_matmul",
    "param_dims",
    "param_shapes",
    "moe_capacity",
]
