"""The ledger: a model as itemised einsum ops over named dimensions, unsharded.

Every op is one row (`attn/q`, `attn/scores`, `mlp/up`, `moe/experts`, `unembed`, ...)
standing for `count` identical layers. Each row knows its operands' logical dims and
dtypes, so FLOPs, HBM bytes and parameters follow from the shapes; the sharding algebra
reads the same rows. Book: transformers.md ("Counting parameters and FLOPs").

Letters: B batch (sequences), T query length, S key length, D d_model, F d_ff, N heads,
K kv heads, G = N/K, H head dim, V vocab, E experts, k experts per token, L layers.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from roofline.errors import SpecError
from roofline.specs.model import MLPKind, ModelSpec
from roofline.specs.plan import Causal as Causal  # the counting convention is plan vocabulary
from roofline.units import dtype_bytes, parse_dtype


def expected_distinct_experts(n_experts: float, top_k: float, tokens: Any) -> Any:
    """Expected number of distinct routed experts a pass over `tokens` tokens touches.

    Each token picks k of E experts; under uniform, independent routing an expert is missed by
    one token with probability 1 − k/E, so it is touched with probability 1 − (1 − k/E)^tokens
    and the expected count is E·(1 − (1 − k/E)^tokens). One token reads k experts; a large
    batch reads all E (the book's "MoE: B > 240·E/k" assumes every expert is loaded). A decode
    step at batch B (T = 1) of a layer reads this many experts' weights; real routers are
    skewed (hot experts), which touches fewer — this is the uniform-routing expectation.
    """
    import numpy as np  # lazily: `roofline models` and `chips` answer without numpy

    t = np.asarray(tokens, dtype=float)
    out = n_experts * (1.0 - np.power(1.0 - top_k / n_experts, t))
    return float(out) if out.ndim == 0 else out


def expected_max_std_normal(n: int) -> float:
    """E[max of n independent standard normals]: the integral of x·n·φ(x)·Φ(x)^(n−1) on a fine
    grid (n = 1: 0; n = 2: 1/√π; n = 3: 3/(2√π), the closed forms the tests check)."""
    return _expected_max_std_normal(int(n))


@functools.lru_cache(maxsize=256)
def _expected_max_std_normal(n: int) -> float:
    if n <= 1:
        return 0.0
    import numpy as np

    x = np.linspace(-12.0, 12.0, 24001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    f = x * n * phi * cdf ** (n - 1)
    return float(np.sum(f) * (x[1] - x[0]))


def expert_parallel_imbalance(n_experts: float, top_k: float, tokens: Any, ep: int) -> Any:
    """The slowest expert-parallel rank's routed tokens over the mean rank's, for `tokens` tokens
    each routed to top_k distinct of E experts held E/ep per rank (numpy-friendly).

    A grouped expert GEMM finishes when its slowest rank does (the dispatch/combine wait for all
    of them; the reason the engines ship an expert-parallel load balancer that duplicates hot
    experts: NVIDIA/TensorRT-LLM@1cf5f035 examples/ep_load_balancer/README.md), so a pass pays
    the expected maximum over ranks of the T·k assignments. Under
    uniform, independent routing one token's count on a rank is hypergeometric (k draws from E
    experts, E/ep of them the rank's): mean k/ep, the ranks' counts summing to k. Over T tokens
    the loads are normal with covariance s²·(I − J/ep), s² = T·k·(E − k) / (ep·(E − 1)), i.e.
    s·(Z_i − Z̄) for independent standard normals Z, so E[max] = T·k/ep + s·E[max of ep Z]
    (`expected_max_std_normal`): the ratio 1 + e_ep·sqrt(ep·(E − k) / (T·k·(E − 1))), capped
    where the busiest rank takes min(k, E/ep) of every token's experts. ep = 1: 1. Real routers
    are skewed (hot experts) and group-limited ones concentrate a token's experts (DeepSeek-V3's
    8 groups / top 4 at ep = 8: a per-token rank-count variance of 1.34 simulated against the
    uniform 0.85, tests/test_moe_ep_imbalance.py), which only adds to this — the
    uniform-routing lower bound; no fitted factor.
    """
    import numpy as np

    t = np.maximum(np.asarray(tokens, dtype=float), 1e-12)
    if ep <= 1 or n_experts <= top_k:
        out = np.ones_like(t)
    else:
        e = expected_max_std_normal(ep)
        ratio = 1.0 + e * np.sqrt(ep * (n_experts - top_k) / (t * top_k * (n_experts - 1.0)))
        cap = ep * min(top_k, n_experts / ep) / top_k
        out = np.minimum(ratio, cap)
    return float(out) if out.ndim == 0 else out


class OpKind(enum.StrEnum):
    MATMUL = "matmul"  # contraction with a weight: 2·prod(dims) FLOPs forward
    ATTENTION = "attention"  # activation×activation contraction (scores, context)
    ELEMENTWISE = "elementwise"  # norms, activations, softmax: memory-bound, ~few FLOPs/element
    GATHER = "gather"  # embedding lookup: reads B·T rows of the table


@dataclass(frozen=True)
class Tensor:
    """An operand: a name, its logical dims (in order) and dtype."""

    name: str
    dims: tuple[str, ...]
    dtype: str = "bf16"
    is_param: bool = False
    on_chip: bool = False  # never written to HBM (flash attention's score/probability tiles)

    def elements(self, sizes: Mapping[str, float]) -> float:
        return math.prod(sizes[d] for d in self.dims)

    def nbytes(self, sizes: Mapping[str, float]) -> float:
        return self.elements(sizes) * dtype_bytes(self.dtype)

    def hbm_bytes(self, sizes: Mapping[str, float]) -> float:
        return 0.0 if self.on_chip else self.nbytes(sizes)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(self.dims)}]"


@dataclass(frozen=True)
class Op:
    """One ledger row: `out = lhs · rhs` contracted over shared dims absent from `out`.

    `count` is how many identical copies (layers) the row stands for; every total is
    already multiplied by it. `flop_factor` scales FLOPs for causal masks and windows.
    """

    name: str
    kind: OpKind
    inputs: tuple[Tensor, ...]
    out: Tensor
    sizes: Mapping[str, float]
    count: float = 1
    flop_factor: float = 1.0
    flops_per_element: float = 0.0  # elementwise ops only
    routed: bool = False  # routed-expert row: a pass reads only the experts its tokens chose
    window: float | None = None  # attention rows of sliding-window layers: keys per query ≤ window
    # the second operand takes no gradient (a one-hot mask built from integer routing indices):
    # the backward pass computes d_lhs only
    frozen_rhs: bool = False
    # a routed-expert row computed as a plain batched einsum over a fixed, padded capacity
    # (the dropping path) rather than a grouped kernel over each expert's own token count
    batched: bool = False

    @property
    def contracting(self) -> tuple[str, ...]:
        if len(self.inputs) < 2:
            return ()
        a, b = self.inputs[0].dims, self.inputs[1].dims
        return tuple(d for d in a if d in b and d not in self.out.dims)

    @property
    def all_dims(self) -> tuple[str, ...]:
        seen: list[str] = []
        for t in (*self.inputs, self.out):
            seen += [d for d in t.dims if d not in seen]
        return tuple(seen)

    @property
    def einsum(self) -> str:
        return (
            ", ".join(f"{t.name}[{','.join(t.dims)}]" for t in self.inputs)
            + f" -> {self.out.name}[{','.join(self.out.dims)}]"
        )

    # -- per-row totals (forward, all `count` copies) ---------------------------------
    @property
    def flops(self) -> float:
        """Forward FLOPs: 2 × (output dims) × (contracting dims) (book transformers.md).

        Dims of one input that are neither contracted nor in the output are broadcast
        (GQA: a KV head serves N/K query heads), so they add no FLOPs.
        """
        if self.kind in (OpKind.MATMUL, OpKind.ATTENTION):
            dims = (*self.out.dims, *self.contracting)
            return 2.0 * math.prod(self.sizes[d] for d in dims) * self.flop_factor * self.count
        if self.kind == OpKind.ELEMENTWISE:
            return self.flops_per_element * self.out.elements(self.sizes) * self.count
        return 0.0

    @property
    def backward_flops(self) -> float:
        """dL/dlhs and dL/drhs: two contractions of the same size (book: 4NPM); none for gathers."""
        if self.kind in (OpKind.MATMUL, OpKind.ATTENTION):
            return (1.0 if self.frozen_rhs else 2.0) * self.flops
        return self.flops

    @property
    def bytes(self) -> float:
        """HBM bytes read and written once: every operand read plus the output written.

        Tensors kept on chip (flash attention's scores) move no HBM bytes. A routed-expert
        weight is read only for the experts the pass's tokens chose (`weight_read_fraction`).
        """
        if self.kind == OpKind.GATHER:
            return self.out.nbytes(self.sizes) * 2 * self.count
        frac = self.weight_read_fraction
        reads = sum(t.hbm_bytes(self.sizes) * (frac if t.is_param else 1.0) for t in self.inputs)
        return (reads + self.out.hbm_bytes(self.sizes)) * self.count

    @property
    def weight_read_fraction(self) -> Any:
        """Share of the weight one pass reads from HBM at this row's token count (see below)."""
        if not self.routed:
            return 1.0
        return self.weight_read_fraction_at(self.sizes["batch"] * self.sizes["seq"])

    def weight_read_fraction_at(self, tokens: Any) -> Any:
        """Share of the weight a pass over `tokens` tokens reads: 1, or for a routed-expert row
        the expected distinct experts over E (`expected_distinct_experts`); numpy-friendly."""
        if not self.routed:
            return 1.0
        E, k = self.sizes["experts"], self.sizes["top_k"]
        return expected_distinct_experts(E, k, tokens) / E

    @property
    def weight(self) -> Tensor | None:
        return next((t for t in self.inputs if t.is_param), None)

    @property
    def params(self) -> float:
        w = self.weight
        return 0.0 if w is None else w.elements(self.sizes) * self.count

    @property
    def weight_bytes(self) -> float:
        w = self.weight
        return 0.0 if w is None else w.nbytes(self.sizes) * self.count

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf

    def with_sizes(self, **sizes: Any) -> Op:
        """This row at other sizes (numpy arrays allowed): inference prices passes this way."""
        s = dict(self.sizes)
        s.update(sizes)
        return replace(self, sizes=MappingProxyType(s))


@dataclass(frozen=True)
class Ledger:
    """An ordered tuple of Op rows with totals and prefix grouping."""

    ops: tuple[Op, ...]
    model: ModelSpec | None = None
    sizes: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __getitem__(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(name)

    def select(self, prefix: str) -> Ledger:
        return replace(
            self,
            ops=tuple(o for o in self.ops if o.name == prefix or o.name.startswith(prefix + "/")),
        )

    @property
    def flops(self) -> float:
        return sum(o.flops for o in self.ops)

    @property
    def backward_flops(self) -> float:
        return sum(o.backward_flops for o in self.ops)

    @property
    def bytes(self) -> float:
        return sum(o.bytes for o in self.ops)

    @property
    def params(self) -> float:
        return sum(o.params for o in self.ops)

    def rows(self) -> list[dict]:
        return [
            {
                "name": o.name,
                "kind": o.kind.value,
                "einsum": o.einsum,
                "count": o.count,
                "flops": o.flops,
                "bytes": o.bytes,
                "params": o.params,
                "intensity": o.intensity,
            }
            for o in self.ops
        ]


# --------------------------------------------------------------------------------------
# Building the ledger of a Transformer
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DtypePolicy:
    """Storage dtypes: weights, activations, KV cache; compute follows the wider input.

    `experts` (routed and shared expert weights) and `embeddings` (the embedding table and
    the unembedding) default to `weights`. Quantised serving checkpoints (ModelOpt FP8/NVFP4,
    DeepSeek's FP8) keep the embeddings and the output head in bf16 and may quantise experts
    differently from the dense layers (AIConfigurator's gemm_quant_mode vs moe_quant_mode).
    A matmul runs in the wider of its inputs' dtypes (book inference.md: int8 weights with bf16
    activations run on the bf16 units), so `activations` is the compute dtype of W8A8/W4A4.
    """

    weights: str = "bf16"
    activations: str = "bf16"
    kv: str = "bf16"
    experts: str | None = None
    embeddings: str | None = None

    def __post_init__(self) -> None:
        for f in ("weights", "activations", "kv"):
            object.__setattr__(self, f, parse_dtype(getattr(self, f)))
        for f in ("experts", "embeddings"):
            v = getattr(self, f)
            object.__setattr__(self, f, self.weights if v is None else parse_dtype(v))


def _t(name: str, dims: str, dtype: str, param: bool = False) -> Tensor:
    return Tensor(name, tuple(dims.split()), dtype, param)


def _mm(
    name: str,
    x: Tensor,
    w: Tensor,
    out: Tensor,
    sizes: Mapping[str, float],
    count: float,
    factor: float = 1.0,
) -> Op:
    return Op(name, OpKind.MATMUL, (x, w), out, sizes, count, factor)


def build_ledger(
    model: ModelSpec,
    *,
    batch: float = 1,
    seq: float = 1,
    kv_seq: float | None = None,
    dtypes: DtypePolicy | None = None,
    causal: Causal | str = Causal.HALF,
    include_elementwise: bool = True,
    flash: bool = True,
    mla_absorb: bool | None = None,
) -> Ledger:
    """The forward pass of `model` over `batch` sequences of `seq` query tokens.

    `kv_seq` (S) defaults to `seq` (training/prefill); decode uses seq=1, kv_seq=context, and a
    prefill chunk after a cached prefix seq=new tokens, kv_seq=prefix+new (the queries are the
    last T of S positions). `causal` = HALF counts only the unmasked part of the score/context
    FLOPs (maxtext/Megatron convention); FULL counts the dense 12BT²NH of the book.
    `flash` (default): the B·N·T·S score and probability matrices stay on chip, so attention
    reads Q, K, V and writes O (book inference.md: intensity ST/(S+T)); False materialises them.
    `mla_absorb` (MLA models): run attention in the latent space with W_UK folded into the
    query and W_UV applied after the context (DeepSeek-V2 §2.1.2, as DeepSeek and vLLM/SGLang
    serve decode), so a step reads the latent cache once instead of decompressing it;
    None picks the form with fewer FLOPs (absorbed for decode, decompressed for long prefill).
    """
    if batch <= 0 or seq <= 0 or (kv_seq is not None and kv_seq <= 0):
        raise SpecError(
            f"batch={batch}, seq={seq}, kv_seq={kv_seq}",
            rule="batch and sequence lengths are positive",
            fix="give positive sizes",
        )
    dt = dtypes or DtypePolicy()
    causal = Causal(causal)
    m = model
    S = float(kv_seq if kv_seq is not None else seq)
    T = float(seq)
    wd, ad, ed = dt.weights, dt.activations, dt.embeddings
    sizes: dict[str, float] = {
        "batch": float(batch),
        "seq": T,
        "kv_seq": S,
        "embed": m.d_model,
        "mlp": m.d_ff,
        "heads": m.n_heads,
        "kv_heads": m.n_kv_heads,
        "head_dim": m.d_head,
        "vocab": m.vocab,
    }
    ops: list[Op] = []
    L = m.n_layers
    x = _t("x", "batch seq embed", ad)
    S_ = MappingProxyType(sizes)

    # embedding lookup: reads B·T rows of [V, D]
    ops.append(Op("embed", OpKind.GATHER, (_t("W_emb", "vocab embed", ed, True),), x, S_, 1))

    # ---- attention ------------------------------------------------------------------
    ops += _attention_ops(
        m, sizes, T, S, wd, ad, dt.kv, causal, flash, mla_absorb, include_elementwise
    )
    if not flash and include_elementwise:
        ops += _unfused_softmax_rows(ops)

    # ---- MLP / MoE --------------------------------------------------------------------
    ops += _mlp_ops(m, sizes, wd, ad, dt.experts)

    if include_elementwise:
        # RMSNorm/LayerNorm: a weight vector of size D; ~4 FLOPs per element (book: O(BTD))
        norm_w = _t("w_norm", "embed", wd, True)
        ops.append(
            Op("norms", OpKind.ELEMENTWISE, (x, norm_w), x, S_, L * m.norms_per_layer + 1, 1.0, 4.0)
        )
    # ---- unembedding ----------------------------------------------------------------
    ops.append(
        _mm(
            "unembed",
            x,
            _t("W_unemb", "embed vocab", ed, True),
            _t("logits", "batch seq vocab", ad),
            S_,
            1,
        )
    )
    if m.tied_embeddings:
        # tied: the embedding table is the unembedding weight; count its parameters once
        emb = ops[0]
        ops[0] = replace(emb, inputs=(replace(emb.inputs[0], is_param=False),))
    return Ledger(tuple(ops), model, MappingProxyType(dict(sizes)))


# What an unfused attention kernel does between its two batched GEMMs: Megatron-LM's attention
# before FlashAttention (NVIDIA/Megatron-LM@00129014dc4b megatron/model/transformer.py
# ParallelAttention: baddbmm scores, FusedScaleMaskSoftmax, attention_dropout, bmm), trained with
# its default attention dropout (megatron/arguments.py _add_regularization_args:
# --attention-dropout default 0.1). Per score element the softmax reads the scores and writes the
# probabilities (2 + 2 bytes at 16 bits); the dropout reads them and writes the dropped
# probabilities and a one-byte mask (Korthikanti et al. 2022 §4.1 count the same tensors: softmax
# output 2as²b, mask as²b, dropout output 2as²b). Each row's backward moves as many bytes again.
UNFUSED_MASK_DTYPE = "int8"


def _unfused_softmax_rows(ops: list[Op]) -> list[Op]:
    """The softmax and dropout rows of an unfused kernel, one pair per score row (a
    sliding-window model's local and global rows each): memory-bound, the whole score matrix."""
    out: list[Op] = []
    for op in ops:
        if op.kind != OpKind.ATTENTION or not op.name.startswith("attn/scores"):
            continue
        suffix = op.name.removeprefix("attn/scores")
        s = op.out
        p0 = replace(s, name="p0")
        mask = replace(s, name="mask", dtype=UNFUSED_MASK_DTYPE)
        for name, ins, o, fpe in (
            ("attn/softmax", (s,), p0, 5.0),  # scale, mask, max, exp, normalise
            ("attn/dropout", (p0, mask), replace(s, name="p"), 1.0),
        ):
            out.append(Op(name + suffix, OpKind.ELEMENTWISE, ins, o, op.sizes, op.count, 1.0, fpe))
    return out


def _attention_ops(
    m: ModelSpec,
    sizes: dict,
    T: float,
    S: float,
    wd: str,
    ad: str,
    kvd: str,
    causal: Causal,
    flash: bool = True,
    mla_absorb: bool | None = None,
    elementwise: bool = True,
) -> list[Op]:
    def sc(name: str) -> Tensor:  # the score / probability matrix
        return Tensor(name, ("batch", "heads", "seq", "kv_seq"), ad, False, flash)

    L = m.n_attention_layers  # a hybrid's linear layers are priced by _linear_ops
    x = _t("x", "batch seq embed", ad)
    ops: list[Op] = _linear_ops(m, sizes, T, wd, ad) if m.linear is not None else []
    if m.mla is not None:
        mla = _mla_ops(m, sizes, T, S, wd, ad, kvd, causal, flash, mla_absorb)
        if m.dsa is not None:
            idx = _dsa_indexer_ops(m, sizes, T, S, ad, wd, causal, elementwise)
            mla = _with_dsa(m, mla, idx, T, S, causal)
        return ops + mla
    S_ = MappingProxyType(sizes)
    qkv_bias = 1  # bias vectors are counted under attn/bias below
    ops.append(
        _mm(
            "attn/q",
            x,
            _t("W_q", "embed heads head_dim", wd, True),
            _t("q", "batch seq heads head_dim", ad),
            S_,
            L,
        )
    )
    if m.attn_output_gate:  # Qwen3-Next/3.5: q_proj's second half, sigmoid(g)·ctx
        ops.append(
            _mm(
                "attn/gate",
                x,
                _t("W_g", "embed heads head_dim", wd, True),
                _t("g", "batch seq heads head_dim", ad),
                S_,
                L,
            )
        )
    ops.append(
        _mm(
            "attn/k",
            x,
            _t("W_k", "embed kv_heads head_dim", wd, True),
            _t("k", "batch seq kv_heads head_dim", kvd),
            S_,
            L,
        )
    )
    ops.append(
        _mm(
            "attn/v",
            x,
            _t("W_v", "embed kv_heads head_dim", wd, True),
            _t("v", "batch seq kv_heads head_dim", kvd),
            S_,
            L,
        )
    )
    # score and context rows: one per distinct key length (sliding-window layers see min(S, W))
    groups: dict[float, float] = {}
    for i in range(m.n_layers):
        if not m.is_full_attention_layer(i):
            continue
        s_eff = min(S, float(m.sliding_window)) if m.is_local_layer(i) else S
        groups[s_eff] = groups.get(s_eff, 0) + 1
    for s_eff, n in groups.items():
        suffix = "" if len(groups) == 1 else ("_local" if s_eff < S else "_global")
        sz = dict(sizes)
        sz["kv_seq"] = s_eff
        f = _causal_factor(T, S, s_eff if s_eff < S else None, causal)
        sz_ = MappingProxyType(sz)
        q = _t("q", "batch seq heads head_dim", ad)
        k = _t("k", "batch kv_seq kv_heads head_dim", kvd)
        win = float(m.sliding_window) if s_eff < S else None
        ops.append(
            Op(f"attn/scores{suffix}", OpKind.ATTENTION, (q, k), sc("s"), sz_, n, f, window=win)
        )
        ops.append(
            Op(
                f"attn/context{suffix}",
                OpKind.ATTENTION,
                (sc("p"), _t("v", "batch kv_seq kv_heads head_dim", kvd)),
                _t("ctx", "batch seq heads head_dim", ad),
                sz_,
                n,
                f,
                window=win,
            )
        )
    ops.append(
        _mm(
            "attn/out",
            _t("ctx", "batch seq heads head_dim", ad),
            _t("W_o", "heads head_dim embed", wd, True),
            x,
            S_,
            L,
        )
    )
    if m.qkv_bias:
        b = Op(
            "attn/bias",
            OpKind.ELEMENTWISE,
            (_t("q", "batch seq heads head_dim", ad), _t("b_qkv", "qkv_bias", wd, True)),
            _t("q", "batch seq heads head_dim", ad),
            MappingProxyType({**sizes, "qkv_bias": (m.n_heads + 2 * m.n_kv_heads) * m.d_head}),
            L * qkv_bias,
            1.0,
            1.0,
        )
        ops.append(b)
    return ops


# The recurrent state of a Gated DeltaNet layer is kept in fp32 by the serving engines (SGLang
# ServerArgs.mamba_ssm_dtype, python/sglang/srt/server_args.py, default "float32"), whatever the
# KV-cache dtype.
LINEAR_STATE_DTYPE = "fp32"
# DSA's indexer keys are cached in FP8 whatever the KV dtype (deepseek-ai/DeepSeek-V3.2-Exp
# inference/model.py @ 6d8cb70dfdd6f37c83c5208105a3e2c8da117485: Indexer.k_cache is
# float8_e4m3fn [.., index_head_dim], k_scale_cache one fp32 per 128 values, ~3% more, not counted).
DSA_INDEX_DTYPE = "fp8"


def _linear_sizes(m: ModelSpec, sizes: dict, T: float) -> MappingProxyType:
    """A Gated DeltaNet layer's dims: `heads`/`kv_heads` are its value/key heads (so tensor
    parallelism splits them as it splits attention heads), `head_dim` dk, `v_dim` dv."""
    a = m.linear
    assert a is not None
    sz = dict(sizes)
    sz.update(
        heads=a.n_value_heads,
        kv_heads=a.n_key_heads,
        head_dim=a.key_head_dim,
        v_dim=a.value_head_dim,
        conv_ch=a.conv_channels,
        conv_k=a.conv_kernel,
        gates=2,  # β (write strength) and α (decay) per value head
        chunk=min(float(a.chunk_size), T),
        intra=3 * a.key_head_dim + 2 * a.value_head_dim,
    )
    return MappingProxyType(sz)


def _linear_ops(m: ModelSpec, sizes: dict, T: float, wd: str, ad: str) -> list[Op]:
    """Gated DeltaNet layers (Yang et al., arXiv 2412.06464; Qwen3-Next/Qwen3.5 linear layers).

    Projections q, k [key heads × dk], v, z [value heads × dv], β and α per value head, a
    depthwise conv of `conv_kernel` taps (2·taps FLOPs per channel), then the delta rule over a
    fixed state S[value heads, dk, dv] per sequence: u = β(v − Sᵀk) and o = Sᵀq read the state,
    S += k·uᵀ writes it (three products of 2·dk·dv FLOPs per token and value head; q and k are
    shared by the value heads of a group). Prefill runs the chunked form (Yang et al., arXiv
    2406.06484 §3.2): within a chunk of C tokens QKᵀ, KKᵀ, the WY factor T·K, T·V and the
    intra-chunk attention over U cost 2·C·(3·dk + 2·dv) per token and head (`attn/lin_chunk`,
    absent in decode: the recurrent step has no chunk). No KV cache: the state does not grow.
    """
    n = m.n_linear_layers
    S_ = _linear_sizes(m, sizes, T)
    x = _t("x", "batch seq embed", ad)
    q, k = _t("lq", "batch seq kv_heads head_dim", ad), _t("lk", "batch seq kv_heads head_dim", ad)
    u = _t("lu", "batch seq heads v_dim", ad)
    o = _t("lo", "batch seq heads v_dim", ad)
    state = _t("S", "batch heads head_dim v_dim", LINEAR_STATE_DTYPE)
    ops = [
        _mm("attn/lin_q", x, _t("W_lq", "embed kv_heads head_dim", wd, True), q, S_, n),
        _mm("attn/lin_k", x, _t("W_lk", "embed kv_heads head_dim", wd, True), k, S_, n),
        _mm("attn/lin_v", x, _t("W_lv", "embed heads v_dim", wd, True), u, S_, n),
        _mm("attn/lin_z", x, _t("W_lz", "embed heads v_dim", wd, True), o, S_, n),
        _mm(
            "attn/lin_ab",
            x,
            _t("W_lab", "embed heads gates", wd, True),
            _t("lab", "batch seq heads gates", ad),
            S_,
            n,
        ),
        Op(
            "attn/lin_conv",
            OpKind.ELEMENTWISE,
            (_t("lqkv", "batch seq conv_ch", ad), _t("W_conv", "conv_ch conv_k", wd, True)),
            _t("lqkv", "batch seq conv_ch", ad),
            S_,
            n,
            1.0,
            2.0 * m.linear.conv_kernel,  # type: ignore[union-attr]
        ),
        # u = β(v − Sᵀk): reads the state from HBM (once per pass)
        Op("attn/lin_state_in", OpKind.ATTENTION, (k, state), u, S_, n),
        # o = Sᵀq: the state is already on chip
        Op("attn/lin_state_out", OpKind.ATTENTION, (q, replace(state, on_chip=True)), o, S_, n),
        # S ← αS + k·uᵀ: the updated state is written back
        Op(
            "attn/lin_state_update",
            OpKind.ATTENTION,
            (replace(k, on_chip=True), replace(u, on_chip=True)),
            state,
            S_,
            n,
        ),
    ]
    if T > 1:
        a_ = Tensor("lqk", ("batch", "seq", "heads", "intra"), ad, False, True)
        b_ = Tensor("lkk", ("batch", "chunk", "heads", "intra"), ad, False, True)
        c_ = Tensor("lA", ("batch", "seq", "heads", "chunk"), ad, False, True)
        ops.append(Op("attn/lin_chunk", OpKind.ATTENTION, (a_, b_), c_, S_, n))
    ops.append(_mm("attn/lin_out", o, _t("W_lo", "heads v_dim embed", wd, True), x, S_, n))
    return ops


def _dsa_indexer_ops(
    m: ModelSpec,
    sizes: dict,
    T: float,
    S: float,
    ad: str,
    wd: str,
    causal: Causal,
    elementwise: bool = True,
) -> list[Op]:
    """DSA's lightning indexer (DeepSeek-V3.2-Exp report §2.1; the reference Indexer in
    deepseek-ai/DeepSeek-V3.2-Exp inference/model.py @ 6d8cb70d): per layer, index queries
    q_I[index heads, d_I] from the query latent (wq_b), one index key k_I[d_I] per token (cached, FP8)
    and a weight per index head; every query scores every cached key, 2·H_I·d_I FLOPs per
    (query, key) pair under the causal mask (O(L) per query), and the top-k select reads the
    head-summed logits (fp32, written and read once). Attention then runs on `index_topk` keys.

    `elementwise`: also the indexer's own elementwise kernels between its projections and its
    scores (`_dsa_indexer_elementwise`), each a launch per layer that MLA does not pay."""
    a, d = m.mla, m.dsa
    assert a is not None and d is not None
    L = m.n_attention_layers
    sz = dict(sizes)
    sz.update(
        idx_heads=d.index_n_heads,
        idx_dim=d.index_head_dim,
        head_dim=d.index_head_dim,
        # the indexer's RoPE dims: MLA's qk_rope_head_dim (reference Indexer.rope_head_dim)
        idx_rope=a.qk_rope_head_dim,
    )
    S_ = MappingProxyType(sz)
    x = _t("x", "batch seq embed", ad)
    src, w_dims = (_t("cq", "batch seq q_lora", ad), "q_lora") if a.q_lora_rank else (x, "embed")
    qi = _t("qi", "batch seq idx_heads idx_dim", ad)
    ki = _t("ki", "batch seq idx_dim", DSA_INDEX_DTYPE)
    f = _causal_factor(T, S, None, causal)
    logits = _t("ilog", "batch seq kv_seq", "fp32")
    wi = _t("wi", "batch seq idx_heads", ad)
    own = _dsa_indexer_elementwise(m, S_, qi, ki, wi, ad) if elementwise else []
    return [
        _mm("attn/index_q", src, _t("W_iq", f"{w_dims} idx_heads idx_dim", wd, True), qi, S_, L),
        _mm("attn/index_k", x, _t("W_ik", "embed idx_dim", wd, True), ki, S_, L),
        _mm(
            "attn/index_w",
            x,
            _t("W_iw", "embed idx_heads", wd, True),
            wi,
            S_,
            L,
        ),
        *own,
        Op(
            "attn/index_scores",
            OpKind.ATTENTION,
            (replace(qi, dtype=DSA_INDEX_DTYPE), _t("ki", "batch kv_seq idx_dim", DSA_INDEX_DTYPE)),
            Tensor("il", ("batch", "seq", "idx_heads", "kv_seq"), ad, False, True),
            S_,
            L,
            f,
        ),
        Op("attn/index_topk", OpKind.ELEMENTWISE, (logits,), logits, S_, L, 1.0, 1.0),
    ]


def _dsa_indexer_elementwise(
    m: ModelSpec, S_: Mapping[str, float], qi: Tensor, ki: Tensor, wi: Tensor, ad: str
) -> list[Op]:
    """The indexer's elementwise kernels, one launch each per layer, as the reference Indexer
    (deepseek-ai/DeepSeek-V3.2-Exp inference/model.py @ 6d8cb70d, Indexer.forward) and SGLang's
    (sgl-project/sglang python/sglang/srt/layers/attention/nsa/nsa_indexer.py, Indexer
    _get_q_k_bf16 and forward_cuda) run them between the projections and the scores: the index
    key's LayerNorm (k_norm), RoPE on the index query's and key's first qk_rope_head_dim
    dims (SGLang: one rotary call for both), the Hadamard transform of the query and of the key
    (rotate_activation: two calls), their FP8 block quantisation (act_quant: two calls) and the
    key's store into the FP8 index cache (with its scale), and the scaling of the index heads'
    weights after their projection (weights · H_I^-1/2 · q_scale · d_I^-1/2: two multiplies in
    the reference, one fused kernel in SGLang's torch.compile'd _get_logits_head_gate). The
    engines' fused count is taken where the two differ (RoPE, the weights' scaling); the
    reference's concatenations after RoPE (SGLang: slice assignments) are left out. MLA's own
    rows carry no such kernels (its norms are `norms`): these are a DSA layer's extra launches,
    whatever they move (a few hundred bytes a token). Hadamard: log2(d_I) adds per element."""
    L = m.n_attention_layers
    d_i = S_["idx_dim"]
    qr = _t("qr", "batch seq idx_heads idx_rope", ad)
    kr = _t("kr", "batch seq idx_rope", ad)
    k16 = replace(ki, dtype=ad)
    q8 = replace(qi, dtype=DSA_INDEX_DTYPE)
    had = math.log2(d_i) if d_i > 1 else 1.0
    ew = OpKind.ELEMENTWISE
    return [
        Op("attn/index_k_norm", ew, (k16,), k16, S_, L, 1.0, 4.0),
        Op("attn/index_rope", ew, (qr, kr), qr, S_, L, 1.0, 3.0),
        Op("attn/index_rotate_q", ew, (qi,), qi, S_, L, 1.0, had),
        Op("attn/index_rotate_k", ew, (k16,), k16, S_, L, 1.0, had),
        Op("attn/index_quant_q", ew, (qi,), q8, S_, L, 1.0, 2.0),
        Op("attn/index_quant_k", ew, (k16,), ki, S_, L, 1.0, 2.0),
        Op("attn/index_store", ew, (ki,), ki, S_, L, 1.0, 0.0),
        Op("attn/index_w_scale", ew, (wi,), wi, S_, L, 1.0, 2.0),
    ]


def _with_dsa(
    m: ModelSpec, mla: list[Op], indexer: list[Op], T: float, S: float, causal: Causal
) -> list[Op]:
    """MLA rows under DSA: the indexer's rows (`_dsa_indexer_ops`) after the KV projection,
    attention over the top-k."""
    assert m.dsa is not None
    at = next(i for i, o in enumerate(mla) if o.name == "attn/kv_a") + 1
    rows = [_sparse(o, m.dsa.index_topk, T, S, causal) for o in mla]
    return rows[:at] + indexer + rows[at:]


def _sparse(op: Op, topk: int, T: float, S: float, causal: Causal) -> Op:
    """An MLA score/context row under DSA: each query attends min(position, top-k) keys, the
    sliding-window count with W = top-k (`causal_fraction`), reading top-k cache entries."""
    if op.kind != OpKind.ATTENTION:
        return op
    W = float(topk)
    f = _causal_factor(T, S, W if W < S else None, causal)
    return replace(op.with_sizes(kv_seq=min(S, W)), flop_factor=f, window=W)


def mla_absorbed_by_default(model: ModelSpec, T: float, S: float) -> bool:
    """Whether MLA runs absorbed (latent-space attention) for T queries over S keys.

    Absorbed attention costs 2·B·T·S·N·(2r + rope) FLOPs per layer (scores over the r + rope
    latent, context over the r latent); decompressing costs 2·B·S·r·N·(nope + v) for the
    up-projection of every cached key plus the ordinary attention. With T ≪ S (decode, short
    chunks after a long prefix) absorption wins; DeepSeek serves decode this way and
    decompresses for prefill (DeepSeek-V2 report §2.1.2; vLLM's MLA backend splits the same way).
    """
    a = model.mla
    if a is not None and model.dsa is not None:
        return True  # DSA runs on MLA's MQA (absorbed) mode (DeepSeek-V3.2-Exp report §2.1)
    if a is None or T >= S:
        return False
    return T * (2 * a.kv_lora_rank + a.qk_rope_head_dim) < a.kv_lora_rank * (
        a.qk_nope_head_dim + a.v_head_dim
    )


def _mla_ops(
    m: ModelSpec,
    sizes: dict,
    T: float,
    S: float,
    wd: str,
    ad: str,
    kvd: str,
    causal: Causal,
    flash: bool,
    absorb: bool | None,
) -> list[Op]:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a low-rank q_a/q_b, keys
    and values cached as one latent c[kv_lora] plus a shared rope key, up-projected by W_kvb."""
    a = m.mla
    assert a is not None
    L = m.n_attention_layers
    x = _t("x", "batch seq embed", ad)
    sizes.update(
        q_lora=a.q_lora_rank or 0,
        kv_lora=a.kv_lora_rank,
        qk_dim=a.qk_nope_head_dim + a.qk_rope_head_dim,
        nope_dim=a.qk_nope_head_dim,
        rope_dim=a.qk_rope_head_dim,
        v_dim=a.v_head_dim,
        kv_b_dim=a.qk_nope_head_dim + a.v_head_dim,
        kv_a_dim=a.kv_lora_rank + a.qk_rope_head_dim,
    )
    S_ = MappingProxyType(sizes)
    q = _t("q", "batch seq heads qk_dim", ad)
    ops: list[Op] = []
    if a.q_lora_rank:
        cq = _t("cq", "batch seq q_lora", ad)
        ops.append(_mm("attn/q_a", x, _t("W_qa", "embed q_lora", wd, True), cq, S_, L))
        ops.append(_mm("attn/q_b", cq, _t("W_qb", "q_lora heads qk_dim", wd, True), q, S_, L))
    else:
        ops.append(_mm("attn/q", x, _t("W_q", "embed heads qk_dim", wd, True), q, S_, L))
    ckv_new = _t("ckv", "batch seq kv_a_dim", kvd)
    ops.append(_mm("attn/kv_a", x, _t("W_kva", "embed kv_a_dim", wd, True), ckv_new, S_, L))
    absorb = mla_absorbed_by_default(m, T, S) if absorb is None else absorb
    f = _causal_factor(T, S, None, causal)
    scores = Tensor("s", ("batch", "heads", "seq", "kv_seq"), ad, False, flash)
    probs = replace(scores, name="p")
    if absorb:
        # W_kvb = [W_UK | W_UV]; q_nope·W_UK lands the query in the latent space, the context
        # is taken over the latent cache and W_UV lifts it to v_dim; the cache is read once:
        # the fused kernel (FlashMLA) reuses each latent tile for scores and context.
        q_lat = _t("q_lat", "batch seq heads kv_a_dim", ad)
        ops.append(
            _mm(
                "attn/q_absorb",
                _t("q_nope", "batch seq heads nope_dim", ad),
                _t("W_uk", "kv_lora heads nope_dim", wd, True),
                replace(q_lat, dims=("batch", "seq", "heads", "kv_lora")),
                S_,
                L,
            )
        )
        cache = _t("ckv", "batch kv_seq kv_a_dim", kvd)
        ctx_lat = _t("ctx_lat", "batch seq heads kv_lora", ad)
        lat_v = Tensor("ckv_v", ("batch", "kv_seq", "kv_lora"), kvd, False, True)
        ops.append(Op("attn/scores", OpKind.ATTENTION, (q_lat, cache), scores, S_, L, f))
        ops.append(Op("attn/context", OpKind.ATTENTION, (probs, lat_v), ctx_lat, S_, L, f))
        ops.append(
            _mm(
                "attn/v_absorb",
                ctx_lat,
                _t("W_uv", "kv_lora heads v_dim", wd, True),
                _t("ctx", "batch seq heads v_dim", ad),
                S_,
                L,
            )
        )
    else:
        ops.append(
            _mm(
                "attn/kv_b",
                _t("ckv", "batch kv_seq kv_lora", kvd),
                _t("W_kvb", "kv_lora heads kv_b_dim", wd, True),
                _t("kv", "batch kv_seq heads kv_b_dim", ad),
                S_,
                L,
            )
        )
        k = _t("k", "batch kv_seq heads qk_dim", ad)
        v = _t("v", "batch kv_seq heads v_dim", ad)
        ctx = _t("ctx", "batch seq heads v_dim", ad)
        ops.append(Op("attn/scores", OpKind.ATTENTION, (q, k), scores, S_, L, f))
        ops.append(Op("attn/context", OpKind.ATTENTION, (probs, v), ctx, S_, L, f))
    ops.append(
        _mm(
            "attn/out",
            _t("ctx", "batch seq heads v_dim", ad),
            _t("W_o", "heads v_dim embed", wd, True),
            x,
            S_,
            L,
        )
    )
    return ops


def _causal_factor(T: float, S: float, window: float | None, causal: Causal) -> float:
    """Scalar form of `causal_fraction` (FULL counts the dense matrix: the book's 12BT²NH)."""
    if causal == Causal.FULL or T <= 1:  # one query row (decode, a 1-token ledger) sees every key
        return 1.0
    return float(causal_fraction(T, S, window))


def causal_fraction(T: Any, S: Any, window: float | None = None) -> Any:
    """Fraction of the T×S' score matrix a causal kernel computes (S' = min(S, window) keys per row).

    The T queries are the last T of S positions (T == S: self-attention over the prompt;
    T < S: a chunk after a cached prefix; T == 1: decode). The query at position p attends to
    min(p, W) keys, so the work is Σ_{p=S−T+1..S} min(p, W) over T·min(S, W): causal
    self-attention keeps (T+1)/(2T), a window W ≤ T keeps 1 − (W−1)/(2T), decode keeps all.
    More queries than keys (T > S) is cross attention: no causal mask, the whole matrix.
    Vectorised over numpy arrays of T and S.
    """
    import numpy as np  # lazily: `roofline models` and `chips` answer without numpy

    T = np.asarray(T, dtype=float)
    S = np.asarray(S, dtype=float)
    W = S if window is None else np.minimum(S, float(window))
    lo = S - T + 1  # first query position (1-based)
    top = np.minimum(S, W)  # positions lo..top see p keys, the rest see W
    work = (lo + top) * (top - lo + 1) / 2 + np.maximum(0.0, S - W) * W
    out = np.where((T <= 1) | (lo >= W) | (T > S), 1.0, work / (T * W))
    return float(out) if out.ndim == 0 else out


def _mlp_ops(m: ModelSpec, sizes: dict, wd: str, ad: str, xd: str | None = None) -> list[Op]:
    xd = xd or wd  # expert weights (routed and shared)
    x = _t("x", "batch seq embed", ad)
    h = _t("h", "batch seq mlp", ad)
    ops: list[Op] = []
    S_ = MappingProxyType(sizes)
    n_dense = m.n_dense_layers
    gated = m.mlp == MLPKind.GATED
    if n_dense:
        ops += _ffn("mlp", x, h, S_, n_dense, gated, wd, ad, expert_dim=None)
    if m.moe is not None and m.n_moe_layers:
        mo = m.moe
        nl = m.n_moe_layers
        sz = dict(sizes)
        sz.update(experts=mo.n_experts, expert_mlp=mo.d_ff_expert, top_k=mo.top_k)
        sz["capacity"] = expert_capacity(mo, sizes["batch"], sizes["seq"])
        sz_ = MappingProxyType(sz)
        # the router's expert dim is `routes`, not `experts`: its weight is replicated over the
        # expert-parallel ranks like a dense weight (Megatron-Core TopKRouter's weight is not
        # expert-parallel: NVIDIA/Megatron-LM megatron/core/transformer/moe/router.py; the
        # engines replicate it too), so no rule shards it over the expert axis
        rz = MappingProxyType({**sz, "routes": mo.n_experts})
        ops.append(
            _mm(
                "moe/router",
                x,
                _t("W_router", "embed routes", wd, True),
                _t("logits", "batch seq routes", "fp32"),
                rz,
                nl,
            )
        )
        # routed experts: each token visits top_k experts; weights [E, D, F]. FLOPs use the
        # routed token count B·T·k (tokens × top_k), parameters all E experts.
        if mo.capacity_factor > 0:
            ops += _dense_dispatch(sz_, nl, ad)
        ops += _experts(sz_, nl, gated, xd, ad, batched=mo.capacity_factor > 0)
        if mo.n_shared_experts:
            F_sh = (mo.d_ff_shared or mo.d_ff_expert) * mo.n_shared_experts
            sz2 = dict(sizes)
            sz2["mlp"] = F_sh
            ops += _ffn(
                "moe/shared", x, h, MappingProxyType(sz2), nl, gated, xd, ad, expert_dim=None
            )
    return ops


def _ffn(
    prefix: str,
    x: Tensor,
    h: Tensor,
    sizes: Mapping,
    n: float,
    gated: bool,
    wd: str,
    ad: str,
    expert_dim: str | None,
) -> list[Op]:
    # gated: g = x·W_gate, u = x·W_up, h = silu(g)·u, y = h·W_down; plain: u = x·W_up, h = gelu(u)
    u = replace(h, name="u")
    ops = []
    acts: tuple[Tensor, ...] = (u,)
    if gated:
        g = replace(h, name="g")
        ops.append(_mm(f"{prefix}/gate", x, _t("W_gate", "embed mlp", wd, True), g, sizes, n))
        acts = (g, u)
    ops.append(_mm(f"{prefix}/up", x, _t("W_up", "embed mlp", wd, True), u, sizes, n))
    ops.append(
        Op(f"{prefix}/act", OpKind.ELEMENTWISE, acts, h, sizes, n, 1.0, 4.0 if gated else 3.0)
    )
    ops.append(_mm(f"{prefix}/down", h, _t("W_down", "mlp embed", wd, True), x, sizes, n))
    return ops


def expert_capacity(moe: Any, batch: float, seq: float) -> float:
    """Token slots per expert over `batch` sequences of `seq` tokens: B·T·k/E (balanced,
    dropless), or with a capacity factor c each sequence's int(T·k/E·c) slots, computed whether
    filled or not (MaxText dense_matmul: maxtext@261a8be0 MaxText/layers/linears.py:461
    expert_capacity_per_batch = int((seq_len·k / E)·capacity_factor), the dispatch einsum
    'BSM,BSEC -> EBCM' pads every expert of every sequence to C)."""
    E, k, c = moe.n_experts, moe.top_k, moe.capacity_factor
    if c > 0:
        return batch * max(1, int(seq * k / E * c))
    return batch * seq * k / E


def _dense_dispatch(sizes: Mapping, n: float, ad: str) -> list[Op]:
    """The dropping path's dispatch and combine as the one-hot einsums MaxText runs
    (maxtext@261a8be0 MaxText/layers/linears.py:558 'BSM,BSEC -> EBCM' and :602
    'EBCM,BSEC -> BSM'): each sequence's [T, E, C] mask contracts over its T tokens
    (dispatch) or its E·C slots (combine), 2·B·T·E·C·D FLOPs each, C = `slots` the slots of
    one sequence (`expert_capacity` at batch 1). Open: under expert parallelism the `experts`
    dim of the mask and of xe is split over the expert axis, so the algebra adds its own
    all-to-all/all-gathers beside the expert rows' dispatch (MaxText runs both einsums
    batch-sharded, mask_axes ("activation_batch", "activation_length", None, None)); naming the
    dim `routes` (never sharded) fixes that but prices them as dense GEMMs, and held out by
    source went 4.98% -> 5.11%, so it is not done here."""
    sz = MappingProxyType({**sizes, "slots": sizes["capacity"] / sizes["batch"]})
    x = _t("x", "batch seq embed", ad)
    # the combine mask carries the router's weights (softmax_probs x one-hot); the dispatch
    # mask is its bool cast (`dispatch_mask = combine_mask.astype(bool)`, linears.py
    # generate_masks): one byte an element, int8's width here
    combine_mask = _t("mask", "batch seq experts slots", ad)
    dispatch_mask = replace(combine_mask, name="dispatch_mask", dtype="int8")
    xe = _t("xe", "experts batch slots embed", ad)
    return [
        # the dispatch mask is a bool cast of integer one-hots: no gradient flows into it
        replace(_mm("moe/dispatch", x, dispatch_mask, xe, sz, n), frozen_rhs=True),
        _mm("moe/combine", replace(xe, name="ye"), combine_mask, x, sz, n),
    ]


def _experts(
    sizes: Mapping, n: float, gated: bool, wd: str, ad: str, *, batched: bool = False
) -> list[Op]:
    """Routed experts as einsums over [experts, tokens-per-expert, ...].

    The dispatched activation is xe[experts, batch, seq, top_k?]: we model it as
    xe[experts, capacity, embed] with capacity = B·T·k/E tokens per expert (balanced
    routing; `expert_capacity`: a capacity factor's padded slots where the model drops tokens),
    so FLOPs = 2·capacity·E·D·F per matrix and weights are [E, D, F].
    """
    sz_ = sizes
    # the expert FFN width is its own logical dim: tensor parallelism splits it only where the
    # stack splits experts over the tensor ranks (rules.moe_rules)
    xe = _t("xe", "experts capacity embed", ad)
    he = _t("he", "experts capacity expert_mlp", ad)
    ue = replace(he, name="ue")
    ops = []
    acts: tuple[Tensor, ...] = (ue,)
    if gated:
        ge = replace(he, name="ge")
        ops.append(
            _mm("moe/gate", xe, _t("W_gate", "experts embed expert_mlp", wd, True), ge, sz_, n)
        )
        acts = (ge, ue)
    ops.append(_mm("moe/up", xe, _t("W_up", "experts embed expert_mlp", wd, True), ue, sz_, n))
    ops = [replace(o, routed=True) for o in ops]
    ops.append(Op("moe/act", OpKind.ELEMENTWISE, acts, he, sz_, n, 1.0, 4.0 if gated else 3.0))
    ops.append(
        _mm(
            "moe/down",
            he,
            _t("W_down", "experts expert_mlp embed", wd, True),
            replace(xe, name="ye"),
            sz_,
            n,
        )
    )
    ops[-1] = replace(ops[-1], routed=True)
    # dropping: MaxText's 'EBCM,EMH -> EBCH' einsums, one batched dot over E at capacity C
    # (maxtext@261a8be0 MaxText/layers/linears.py:567-597), no grouped kernel
    return [replace(o, batched=batched) if o.kind == OpKind.MATMUL else o for o in ops]


def moe_token_rows(up: Op, dtype: str) -> tuple[Op, Op]:
    """The MoE layer's memory passes around the expert GEMMs, as rows beside `up` (the
    `moe/up` row, whose sizes carry the capacity B·T·k/E): `moe/permute` copies each token top_k
    times into expert order, x[B, T, D] -> xe[E, capacity, D] (no FLOPs), and `moe/unpermute`
    sums each token's top_k expert outputs with its router weights back into [B, T, D] (one FLOP
    an element). Training stacks run both (Megatron-Core moe_utils permute/unpermute); inference
    engines all run the combine (vLLM's fused_moe: ops.moe_sum over the top_k outputs;
    TensorRT-LLM's finalizeMoeRouting), see serving.inference.serving_ledger."""
    sz = MappingProxyType(dict(up.sizes))
    xe = Tensor("xe", ("experts", "capacity", "embed"), dtype)
    x = Tensor("x", ("batch", "seq", "embed"), dtype)
    return (
        Op("moe/permute", OpKind.ELEMENTWISE, (x,), xe, sz, up.count, 1.0, 0.0),
        Op("moe/unpermute", OpKind.ELEMENTWISE, (xe,), x, sz, up.count, 1.0, 1.0),
    )


MOE_BIAS_ROWS = ("moe/bias/scale", "moe/bias/add", "moe/bias/cat", "moe/bias/cast")


def moe_bias_rows(up: Op, dtype: str) -> tuple[Op, ...]:
    """The routed experts' output bias as a stack adds it with eager torch ops after the grouped
    down projection (rows beside `up`, the `moe/up` row with the capacity B·T·k/E). Megatron-Core
    0.17 (NeMo 26.04) TEGroupedMLP keeps the fc2 GroupedLinear's bias out of the GEMM
    (skip_bias_add=True) and `_apply_bias` runs, per expert, `t + b·p` on the rows of `t`, the
    bf16 expert output, with `p` its router weight (fp32), then `torch.cat` and `.to(bf16)`
    (NVIDIA/Megatron-LM@core_v0.17.0 megatron/core/transformer/moe/experts.py:250-267, :398):
    four passes over [E, capacity, D] — `b·p` written in fp32, the sum read from bf16 and fp32
    and written in fp32, the fp32 rows copied by the concatenation, and cast back to bf16:
    28 bytes per element forward, where a bias in the GEMM epilogue moves none. The backward
    pass (autograd's casts back and the bias and router-weight gradients, each a product and a
    reduction over the same rows: ~36 bytes) is priced like the forward, the walk's rule for
    elementwise rows."""
    sz = MappingProxyType(dict(up.sizes))
    n = up.count
    b = _t("b_down", "experts embed", dtype, True)
    p = _t("p", "experts capacity", "fp32")
    ye = _t("ye", "experts capacity embed", dtype)
    bp = _t("ye_bias", "experts capacity embed", "fp32")
    s = _t("ye_sum", "experts capacity embed", "fp32")
    c = _t("ye_cat", "experts capacity embed", "fp32")
    return (
        Op("moe/bias/scale", OpKind.ELEMENTWISE, (b, p), bp, sz, n, 1.0, 1.0),
        Op("moe/bias/add", OpKind.ELEMENTWISE, (ye, bp), s, sz, n, 1.0, 1.0),
        Op("moe/bias/cat", OpKind.ELEMENTWISE, (s,), c, sz, n, 1.0, 0.0),
        Op("moe/bias/cast", OpKind.ELEMENTWISE, (c,), ye, sz, n, 1.0, 0.0),
    )


# --------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamCount:
    total: float
    active: float
    breakdown: Mapping[str, float]

    def to_dict(self) -> dict:
        return {"total": self.total, "active": self.active, "breakdown": dict(self.breakdown)}


def _group(name: str) -> str:
    if name in ("embed", "unembed", "norms"):
        return name
    head, _, tail = name.partition("/")
    if head == "attn":
        return "attn/" + tail.replace("_local", "").replace("_global", "")
    return head if head in ("mlp",) else name


@functools.lru_cache(maxsize=256)  # immutable; a ModelSpec is hashable
def count_params(model: ModelSpec) -> ParamCount:
    """Total and active (per-token) parameters, itemised by ledger row.

    Active counts top_k of the E routed experts (plus shared experts and everything else).
    DeepSeek-V3's multi-token-prediction module is not counted (as in the published 671B).
    """
    led = build_ledger(model)
    breakdown: dict[str, float] = {}
    active = 0.0
    for op in led:
        p = op.params
        if not p:
            continue
        key = op.name if op.name.startswith("moe/") else _group(op.name)
        breakdown[key] = breakdown.get(key, 0.0) + p
        if op.name in ("moe/gate", "moe/up", "moe/down"):
            active += p * model.moe.top_k / model.moe.n_experts  # type: ignore[union-attr]
        else:
            active += p
    return ParamCount(sum(breakdown.values()), active, MappingProxyType(breakdown))


def forward_flops(
    model: ModelSpec,
    seq: float,
    *,
    batch: float = 1,
    causal: Causal | str = Causal.HALF,
    include_attention: bool = True,
) -> float:
    """FLOPs of one forward pass over batch × seq tokens (matmuls + attention; elementwise excluded)."""
    led = build_ledger(model, batch=batch, seq=seq, causal=causal, include_elementwise=False)
    return sum(
        o.flops
        for o in led
        if o.kind != OpKind.ELEMENTWISE and (include_attention or o.kind != OpKind.ATTENTION)
    )


def flops_per_token(
    model: ModelSpec,
    seq: float,
    *,
    training: bool = True,
    causal: Causal | str = Causal.HALF,
    include_attention: bool = True,
) -> float:
    """Per-token FLOPs at sequence length `seq`: forward, or forward + backward (×3) for training."""
    f = forward_flops(model, seq, causal=causal, include_attention=include_attention) / seq
    return 3 * f if training else f


def kv_cache_bytes_per_token(
    model: ModelSpec, kv_dtype: str = "bf16", context: float | None = None, kv_copies: Any = 1.0
) -> float:
    """KV-cache bytes per token of context, all layers: 2·K·H·L·bytes for GQA/MHA/MQA.

    MLA caches the latent (kv_lora_rank + rope dim) once per layer; DSA adds its FP8 index key
    (index_head_dim bytes per layer), the rest of its cache stays full MLA. Sliding-window layers
    keep at most W tokens, so with a `context` longer than W their per-token share is W/context.
    A hybrid's linear-attention layers cache nothing per token: only its full-attention layers
    count, and with a `context` the fixed recurrent state of a sequence
    (`linear_state_bytes_per_sequence`) is spread over it as state/context per token — so
    bytes/token × context is the memory of one sequence, as the serving KV pool sizes it.
    `kv_copies`: copies of the attention cache a tensor axis keeps when it exceeds the KV heads
    (serving's kv_replication; numpy-friendly); the linear state is split by value heads, never
    copied. Book: transformers.md "KV caching", inference.md.
    """
    b = dtype_bytes(kv_dtype)
    if model.mla is not None:
        per_layer = (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * b
    else:
        per_layer = 2 * model.n_kv_heads * model.d_head * b
    if model.dsa is not None:
        per_layer += model.dsa.index_head_dim * dtype_bytes(DSA_INDEX_DTYPE)
    total = 0.0
    for i in range(model.n_layers):
        if not model.is_full_attention_layer(i):
            continue
        share = 1.0
        if context is not None and model.is_local_layer(i):
            share = min(1.0, model.sliding_window / context)  # type: ignore[operator]
        total += per_layer * share
    total = total * kv_copies
    if context is not None and model.linear is not None:
        import numpy as np  # lazily, as causal_fraction: contexts may be arrays (serving)

        c = np.maximum(np.asarray(context, dtype=float), 1.0)
        share = linear_state_bytes_per_sequence(model) / c
        total = total + (float(share) if share.ndim == 0 else share)
    return total


def linear_state_bytes_per_sequence(model: ModelSpec) -> float:
    """Fixed memory of one sequence in a hybrid's linear-attention layers (0 without them):
    per layer the delta-rule state n_value_heads·dk·dv plus the conv's last (taps − 1) inputs
    of its q/k/v channels, in LINEAR_STATE_DTYPE (Gated DeltaNet, arXiv 2412.06464)."""
    a = model.linear
    if a is None:
        return 0.0
    per_layer = (a.state_elements + (a.conv_kernel - 1) * a.conv_channels) * dtype_bytes(
        LINEAR_STATE_DTYPE
    )
    return per_layer * model.n_linear_layers


# --------------------------------------------------------------------------------------
# Inference steps: the same ledger at serving shapes
# --------------------------------------------------------------------------------------


def decode_ledger(
    model: ModelSpec,
    *,
    batch: float,
    context: float,
    dtypes: DtypePolicy | None = None,
    tokens_per_step: float = 1,
    mla_absorb: bool | None = None,
) -> Ledger:
    """One decode step: `batch` sequences each add `tokens_per_step` tokens (1; k + 1 when a
    target model verifies k speculative tokens) attending to `context` cached keys.

    Every weight is read once per step (routed experts: the expected distinct ones), the KV
    cache of all B·S positions once, and FLOPs are 2·(active params)·B plus attention's
    4·B·S·N·H per layer (book inference.md: decode is memory-bound below B_crit).
    """
    S = float(context) + float(tokens_per_step) - 1.0
    return build_ledger(
        model,
        batch=batch,
        seq=tokens_per_step,
        kv_seq=max(S, float(tokens_per_step)),
        dtypes=dtypes,
        mla_absorb=mla_absorb,
    )


def prefill_ledger(
    model: ModelSpec,
    *,
    batch: float = 1,
    prompt: float,
    cached: float = 0,
    dtypes: DtypePolicy | None = None,
    causal: Causal | str = Causal.HALF,
    mla_absorb: bool | None = None,
) -> Ledger:
    """Prefill of `batch` prompts of `prompt` tokens, the first `cached` already in the KV cache
    (a prefix-cache hit): T = prompt − cached new queries over S = prompt keys, causal, flash.

    Only the last position's logits are computed (engines sample one token per prompt, vLLM's
    `logits_indices`), so the unembedding row is 2·B·D·V, not 2·B·T·D·V.
    """
    if not (0 <= cached < prompt):
        raise SpecError(
            f"prefill of {prompt} tokens with {cached} cached",
            rule="0 <= cached tokens < prompt tokens (at least one token is computed)",
            fix="lower the prefix-cache hit rate below 1",
        )
    led = build_ledger(
        model,
        batch=batch,
        seq=float(prompt) - float(cached),
        kv_seq=float(prompt),
        dtypes=dtypes,
        causal=causal,
        mla_absorb=mla_absorb,
    )
    ops = tuple(o.with_sizes(seq=1.0) if o.name == "unembed" else o for o in led.ops)
    return replace(led, ops=ops)
