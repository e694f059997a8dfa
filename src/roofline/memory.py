"""Training memory before sharding: parameters, gradients, optimizer state, activations.

Book transformers.md ("Gradient checkpointing") and training.md: Adam with bf16
parameters and fp32 moments is 10 bytes/param (2 + 4 + 4); saving every intermediate
costs ~20·D values per token per layer, one checkpoint per layer costs D, and
rematerialising the whole layer raises training FLOPs from 6 to 8 × params × tokens.
Here the saved tensors are read off the ledger rows instead of assumed.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from roofline.errors import SpecError
from roofline.ledger import Ledger, Op, OpKind, Tensor
from roofline.units import dtype_bytes


class RematKind(enum.StrEnum):
    NONE = "none"  # save every intermediate the backward pass reads
    MATMULS = (
        "matmuls"  # save only matmul outputs (jax dots_saveable); recompute attention + elementwise
    )
    FULL = "full"  # one checkpoint per layer (the layer input); recompute the whole layer
    CHECKPOINTS = "checkpoints"  # N checkpoints of size D per layer (book applied-training: 4)


@dataclass(frozen=True)
class Remat:
    kind: RematKind = RematKind.FULL
    n: int = 1  # checkpoints per layer for CHECKPOINTS

    def __str__(self) -> str:
        return f"ckpt{self.n}" if self.kind == RematKind.CHECKPOINTS else self.kind.value


def parse_remat(text: str | Remat) -> Remat:
    """'none' | 'matmuls' (alias 'dots', 'selective') | 'full' (alias 'block', 'layer') | 'ckpt4' / 'checkpoints=4'."""
    if isinstance(text, Remat):
        return text
    s = str(text).strip().lower()
    aliases = {
        "none": RematKind.NONE,
        "off": RematKind.NONE,
        "matmuls": RematKind.MATMULS,
        "dots": RematKind.MATMULS,
        "selective": RematKind.MATMULS,
        "full": RematKind.FULL,
        "block": RematKind.FULL,
        "layer": RematKind.FULL,
    }
    if s in aliases:
        return Remat(aliases[s])
    m = re.fullmatch(r"(?:ckpt|checkpoints?)[=:]?(\d+)", s)
    if m and int(m.group(1)) > 0:
        return Remat(RematKind.CHECKPOINTS, int(m.group(1)))
    raise SpecError(
        f"unknown remat policy {text!r}",
        rule="remat is none, matmuls, full, or ckptN (N checkpoints of size D per layer)",
        fix="write e.g. remat=full or remat=ckpt4",
    )


@dataclass(frozen=True)
class OptimizerPolicy:
    """Bytes per parameter of each persistent training buffer."""

    name: str
    param_bytes: float  # the weights the forward pass reads
    grad_bytes: float  # gradient buffer
    state_bytes: float  # optimizer state incl. fp32 master copy if any

    @property
    def bytes_per_param(self) -> float:
        return self.param_bytes + self.grad_bytes + self.state_bytes


OPTIMIZERS = {
    # book training.md: bf16 params + fp32 Adam moments = 10 bytes/param (gradients transient, bf16)
    "adam-bf16": OptimizerPolicy("adam-bf16", 2.0, 2.0, 8.0),
    # Megatron/DeepSpeed mixed precision: bf16 params, fp32 grads, fp32 master + m + v (18 B/param)
    "adam-fp32-master": OptimizerPolicy("adam-fp32-master", 2.0, 4.0, 12.0),
    "adam-fp32": OptimizerPolicy("adam-fp32", 4.0, 4.0, 8.0),
    "sgd-bf16": OptimizerPolicy("sgd-bf16", 2.0, 2.0, 0.0),
}


def parse_optimizer(name: str | OptimizerPolicy) -> OptimizerPolicy:
    if isinstance(name, OptimizerPolicy):
        return name
    key = str(name).strip().lower()
    if key not in OPTIMIZERS:
        raise SpecError(
            f"unknown optimizer policy {name!r}",
            rule="policies: " + ", ".join(OPTIMIZERS),
            fix="write e.g. optimizer=adam-bf16 (the book's 10 bytes/param)",
        )
    return OPTIMIZERS[key]


def saved_tensors(ledger: Ledger, remat: Remat) -> list[tuple[Op, Tensor]]:
    """The activations one layer keeps for its backward pass under NONE or MATMULS remat.

    NONE: every distinct activation input of a per-layer row plus the weight matmuls' outputs
    (deduplicated by block and name); MATMULS: the weight matmuls' outputs only. Tensors that
    never reach HBM (flash attention's scores) are not kept. FULL/CHECKPOINTS keep N copies of
    the layer input instead (see `saved_activation_bytes_per_token`).
    """
    out: list[tuple[Op, Tensor]] = []
    seen: set[tuple[str, str]] = set()
    for op in ledger:
        if op.name in ("embed", "unembed", "norms"):
            continue
        block = op.name.split("/")[0]
        if remat.kind == RematKind.MATMULS:
            tensors = [op.out] if op.kind == OpKind.MATMUL else []
        else:
            tensors = [t for t in op.inputs if not t.is_param] + (
                [op.out] if op.kind == OpKind.MATMUL else []
            )
        for t in tensors:
            if t.on_chip or (block, t.name) in seen:
                continue
            seen.add((block, t.name))
            out.append((op, t))
    return out


def saved_activation_bytes_per_token(
    ledger: Ledger, remat: Remat, *, flash_attention: bool = True
) -> float:
    """Bytes per token kept for the backward pass, all layers (unsharded).

    FULL / CHECKPOINTS: N·D per layer (book: 2·B·T·D·L at bf16); NONE and MATMULS: the
    tensors of `saved_tensors` (NONE adds the normalised copies of x the norms keep).
    The ledger must have been built for batch = seq = 1 token or the result is per B·T.
    (`flash_attention` is a property of the ledger: build it with flash=False to keep scores.)
    """
    led_tokens = ledger.sizes.get("batch", 1) * ledger.sizes.get("seq", 1)
    m = ledger.model
    act_b = dtype_bytes(ledger.ops[0].out.dtype) if ledger.ops else 2.0
    if remat.kind in (RematKind.FULL, RematKind.CHECKPOINTS):
        assert m is not None
        n = 1 if remat.kind == RematKind.FULL else remat.n
        return n * m.d_model * m.n_layers * act_b
    total = sum(t.nbytes(op.sizes) * op.count for op, t in saved_tensors(ledger, remat))
    if remat.kind == RematKind.NONE:
        assert m is not None
        total += m.d_model * act_b * m.norms_per_layer * m.n_layers  # normalised copies of x
    return total / led_tokens


# The last projection of each layer type: its output only feeds the residual stream, so a
# rematerialised layer does not rerun it (the backward pass never reads it). The step cost
# (cost.py) applies this; XLA does the same (docs/verify.md, fsdp=8 with remat).
LAST_PROJECTIONS = ("mlp/down", "moe/down", "moe/shared/down")


def recompute_flops_fraction(ledger: Ledger, remat: Remat) -> float:
    """Extra forward FLOPs in backward, as a fraction of forward FLOPs of the layers.

    The book's rule (transformers.md): FULL/CHECKPOINTS rerun the layer (6 → 8 × params ×
    tokens); MATMULS reruns attention dot products and elementwise ops; NONE reruns nothing.
    This is an upper bound: the step cost skips `LAST_PROJECTIONS`, as compilers do.
    """
    if remat.kind in (RematKind.FULL, RematKind.CHECKPOINTS):
        return 1.0
    if remat.kind == RematKind.NONE:
        return 0.0
    fwd = sum(o.flops for o in ledger if o.name not in ("embed", "unembed"))
    redo = sum(o.flops for o in ledger if o.kind in (OpKind.ATTENTION, OpKind.ELEMENTWISE))
    return redo / fwd if fwd else 0.0
