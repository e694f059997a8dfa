"""Training memory before sharding: parameters, gradients, optimizer state, activations.

Book transformers.md ("Gradient checkpointing") and training.md: Adam with bf16
parameters and fp32 moments is 10 bytes/param (2 + 4 + 4); saving every intermediate
costs ~20·D values per token per layer, one checkpoint per layer costs D, and
rematerialising the whole layer raises training FLOPs from 6 to 8 × params × tokens.
Here the saved tensors are read off the ledger rows instead of assumed.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from roofline.core.ledger import MOE_BIAS_ROWS, Ledger, Op, OpKind, Tensor
from roofline.specs.framework import MODULE_RERUNS, RERUN_GROUPS

# the remat and optimizer vocabulary lives with the rest of the plan vocabulary (re-exported)
from roofline.specs.plan import OPTIMIZERS as OPTIMIZERS
from roofline.specs.plan import OptimizerPolicy as OptimizerPolicy
from roofline.specs.plan import Remat as Remat
from roofline.specs.plan import RematKind as RematKind
from roofline.specs.plan import parse_optimizer as parse_optimizer
from roofline.specs.plan import parse_remat as parse_remat


def saved_tensors(ledger: Ledger, remat: Remat) -> list[tuple[Op, Tensor]]:
    """The activations one layer keeps for its backward pass under NONE, MATMULS or MODULES.

    NONE: every distinct activation input of a per-layer row plus the weight matmuls' outputs
    (deduplicated by block and name); MATMULS: the weight matmuls' outputs only; MODULES: NONE's
    less what the recomputed modules produce (`module_products`). Tensors that never reach HBM
    (flash attention's scores) are not kept. FULL/CHECKPOINTS keep N copies of the layer input
    instead (see `saved_activation_bytes_per_token`).
    """
    out: list[tuple[Op, Tensor]] = []
    seen: set[tuple[str, str]] = module_products(ledger, remat)
    for op in ledger:
        if op.name in ("embed", "unembed", "norms", *TRAINING_ROWS):
            continue
        block = op.name.split("/")[0]
        # the routed experts' down projection output is never read backward: Megatron-Core
        # scales by the router probabilities before it (NVIDIA/Megatron-LM@329baaca
        # megatron/core/transformer/moe/experts.py activation_func_with_probs), so the unpermute's
        # backward needs no expert output; torchtitan's MoE default score_before_experts=True
        # scales the inputs instead, to the same effect
        keeps_out = op.kind == OpKind.MATMUL and op.name not in _OUTPUT_NOT_SAVED
        if remat.kind == RematKind.MATMULS:
            tensors = [op.out] if keeps_out else []
        else:
            tensors = [t for t in op.inputs if not t.is_param] + ([op.out] if keeps_out else [])
        for t in tensors:
            if t.on_chip or (block, t.name) in seen:
                continue
            seen.add((block, t.name))
            out.append((op, t))
    return out


# Bytes of a tensor as some caller counts them (unsharded, or per chip under a sharding);
# `op` is the ledger row the tensor belongs to (None for the layer input x).
TensorBytes = Callable[[Op | None, Tensor], Any]


def layer_input(ledger: Ledger) -> Tensor:
    """x[batch, seq, embed]: the layer input a checkpoint keeps (in the activations' dtype)."""
    return Tensor("x", ("batch", "seq", "embed"), ledger.ops[0].out.dtype if ledger.ops else "bf16")


def saved_bytes(
    ledger: Ledger, remat: Remat, tensor_bytes: TensorBytes, *, keeps_layer_input: bool = False
) -> Any:
    """Activation bytes all layers keep for the backward pass (the one home of the rule).

    FULL / CHECKPOINTS: N copies of the layer input per layer (book: 2·B·T·D·L at bf16);
    NONE, MATMULS and MODULES: the tensors of `saved_tensors`, and NONE (MODULES unless it
    recomputes the layernorms) adds the normalised copies of x the norms keep. `tensor_bytes` says how a tensor is counted (whole, or per chip).

    `keeps_layer_input` (a real stack; the book's "checkpoint the big matmuls" counts the
    matmuls' outputs only): a MATMULS policy keeps each layer's input x, the point its recompute
    of the norms and attention starts from, and not the outputs of the layer's last projections
    (`LAST_PROJECTIONS`), which only enter the residual sum, whose backward reads nothing. MaxText
    saves x under every remat policy (AI-Hypercomputer/maxtext@e591f30c
    src/maxtext/configs/base.yml:361, decoder_layer_input 'device': "cannot be rematerialized -
    it serves as periodic checkpoints that act as the remat start points"; jax.checkpoint keeps
    the inputs of the function it wraps and the scan over layers stacks each iteration's carry),
    while its 'minimal' list naming mlpwo (src/maxtext/layers/decoders.py:326-345) saves nothing
    for it: a checkpoint policy only chooses among the residuals the backward reads, and
    mlpwo's output is not one. Autograd likewise keeps what a backward reads (torch.utils.checkpoint
    the wrapped block's inputs; Megatron's input layernorm its input). For a dense layer the two
    are the same size (x for the down projection's output); a MoE layer, whose routed down
    projection is not kept either way (`saved_tensors`), keeps x on top.
    """
    m = ledger.model
    assert m is not None
    x = layer_input(ledger)
    if remat.kind in (RematKind.FULL, RematKind.CHECKPOINTS):
        n = 1 if remat.kind == RematKind.FULL else remat.n
        return n * tensor_bytes(None, x) * m.n_layers
    total: Any = 0.0
    real_matmuls = remat.kind == RematKind.MATMULS and keeps_layer_input
    for op, t in saved_tensors(ledger, remat):
        if real_matmuls and op.name in LAST_PROJECTIONS and t is op.out:
            continue
        total = total + tensor_bytes(op, t) * op.count
    if real_matmuls:
        total = total + tensor_bytes(None, x) * m.n_layers
    if remat.kind == RematKind.NONE or (
        remat.kind == RematKind.MODULES and "layernorm" not in remat.modules
    ):
        total = total + m.norms_per_layer * m.n_layers * tensor_bytes(None, x)
    return total


def saved_activation_bytes_per_token(
    ledger: Ledger, remat: Remat, *, flash_attention: bool = True
) -> float:
    """Bytes per token kept for the backward pass, all layers (unsharded; see `saved_bytes`).

    The ledger must have been built for batch = seq = 1 token or the result is per B·T.
    (`flash_attention` is a property of the ledger: build it with flash=False to keep scores.)
    """
    led_tokens = ledger.sizes.get("batch", 1) * ledger.sizes.get("seq", 1)
    total = saved_bytes(
        ledger, remat, lambda op, t: t.nbytes(op.sizes if op is not None else ledger.sizes)
    )
    return total / led_tokens


# The last projection of each layer type: its output only feeds the residual stream, so a
# rematerialised layer does not rerun it (the backward pass never reads it). XLA does the same
# (docs/verify.md, fsdp=8 with remat).
LAST_PROJECTIONS = ("mlp/down", "moe/down", "moe/shared/down")
# Matmuls whose output no backward pass reads (see saved_tensors)
_OUTPUT_NOT_SAVED = ("moe/down",)
# Rows outside the layer stack: remat never reruns them.
NON_LAYER_ROWS = ("embed", "unembed", "loss")
# Memory-bound kernels of a training step the inference ledger does not hold (walk.ledger_for):
# their backward needs none of their inputs (an add), or the LM head's saved output (the loss).
TRAINING_ROWS = ("residual", "loss", "moe/permute", "moe/unpermute", *MOE_BIAS_ROWS)
_RERUN_BY_ANY_REMAT = frozenset({RematKind.FULL, RematKind.CHECKPOINTS, RematKind.MATMULS})
_RERUN_BY_LAYER_REMAT = frozenset({RematKind.FULL, RematKind.CHECKPOINTS})


def rerun_by(op: Op) -> frozenset[RematKind]:
    """The remat policies whose backward pass reruns `op`'s forward (the one home of the rule).

    FULL / CHECKPOINTS rerun the layer but its last projection; MATMULS keeps matmul outputs and
    reruns attention and elementwise ops; NONE reruns nothing; rows outside the layers never rerun.
    """
    if op.name in NON_LAYER_ROWS or op.name in LAST_PROJECTIONS:
        return frozenset()
    if op.kind == OpKind.MATMUL:
        return _RERUN_BY_LAYER_REMAT
    return _RERUN_BY_ANY_REMAT


# Tensors a row hands on under other names: the MLA up-projection's output is split into the
# keys (with the RoPE part applied) and the values the attention rows read; the router's choice
# makes the dispatched tokens xe (the permute row is outside the inference ledger).
_PRODUCED_AS = {"attn/kv_b": ("k", "v"), "moe/router": ("xe",)}


def module_patterns(remat: Remat) -> tuple[str, ...]:
    """The ledger-name globs a MODULES remat reruns (`specs.framework.MODULE_RERUNS`)."""
    out: list[str] = []
    for m in remat.modules:
        for g in MODULE_RERUNS[m][0]:
            out.extend(RERUN_GROUPS[g])
    return tuple(out)


def reruns_module(op: Op, remat: Remat) -> bool:
    """Whether a MODULES remat reruns `op`'s forward (rows outside the layers never rerun)."""
    if remat.kind != RematKind.MODULES or op.name in NON_LAYER_ROWS:
        return False
    return any(fnmatch.fnmatchcase(op.name, p) for p in module_patterns(remat))


def module_products(ledger: Ledger, remat: Remat) -> set[tuple[str, str]]:
    """(block, tensor name) of what the recomputed modules of a MODULES remat produce: their
    outputs are discarded after the forward pass and made again in the backward pass (Megatron's
    checkpointing keeps a module's inputs only). Empty for the other kinds."""
    out: set[tuple[str, str]] = set()
    x = layer_input(ledger).name  # the residual stream a module returns into is its input
    for op in ledger:
        if reruns_module(op, remat):
            block = op.name.split("/")[0]
            names = (op.out.name, *_PRODUCED_AS.get(op.name, ()))
            out.update((block, n) for n in names if n != x)
    return out


def recompute_flops_fraction(ledger: Ledger, remat: Remat) -> float:
    """Extra forward FLOPs in backward, as a fraction of forward FLOPs of the layers.

    The book's rule (transformers.md): FULL/CHECKPOINTS rerun the layer (6 → 8 × params ×
    tokens); MATMULS reruns attention dot products and elementwise ops; MODULES the rows of its
    modules; NONE reruns nothing.
    This is an upper bound: the step cost skips `LAST_PROJECTIONS`, as compilers do.
    """
    if remat.kind in (RematKind.FULL, RematKind.CHECKPOINTS):
        return 1.0
    fwd = sum(o.flops for o in ledger if o.name not in NON_LAYER_ROWS)
    redo = sum(o.flops for o in ledger if remat.kind in rerun_by(o) or reruns_module(o, remat))
    return redo / fwd if fwd else 0.0


# --------------------------------------------------------------------------------------
# Memory per chip of a training step (vectorised over candidate plans)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per chip of one training step by buffer (floats or arrays, one per candidate)."""

    params: Any
    grads: Any
    optimizer: Any
    activations: Any
    temporaries: Any

    @property
    def total(self) -> Any:
        return self.params + self.grads + self.optimizer + self.activations + self.temporaries

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def persistent_bytes(
    params_local: Any, opt: OptimizerPolicy, dp: Any, zero: Any
) -> tuple[Any, Any, Any]:
    """Parameters, gradients and optimizer state per chip: ZeRO-2 shards the gradients and
    ZeRO-1 the optimizer state over the data axis (the fsdp axis already shards all three)."""
    p = params_local * opt.param_bytes
    g = params_local * opt.grad_bytes / np.where(zero >= 2, dp, 1)
    o = params_local * opt.state_bytes / np.where(zero >= 1, dp, 1)
    return p, g, o


def fsdp_gathered_bytes(
    weights_gathered: Any, fsdp: Any, n_layers: int, layers_per_stage: Any, keep_all: Any
) -> Any:
    """FSDP weights gathered and alive at once: two layers' (prefetch double buffer), or — when
    the backward pass reuses the forward's gathers (no remat) — every layer of the stage.
    `weights_gathered` is all layers' gathered weight bytes per chip; none without FSDP."""
    two = 2 * weights_gathered / n_layers
    stage = weights_gathered * layers_per_stage / n_layers
    return np.where(fsdp > 1, np.where(keep_all, stage, two), 0.0)


def minimum_memory_bytes(
    params: float,
    opt: OptimizerPolicy,
    d_model: int,
    n_layers: int,
    batch_tokens: float,
    checkpoints: int = 4,
) -> float:
    """The book's minimum-chips check (applied-training.md): parameters + optimizer state, plus
    `checkpoints` bf16 checkpoints of D per token per layer for the whole batch."""
    return (
        params * (opt.param_bytes + opt.state_bytes)
        + 2.0 * checkpoints * d_model * n_layers * batch_tokens
    )
