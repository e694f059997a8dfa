"""verify: compile the same plan with JAX/XLA and read what the compiler did.

`program` builds a plan as a real sharded JAX program (a Transformer layer's training
step, or one of the book's sharded matmuls) from the same rules the algebra uses;
`hlo` compiles it and reads collectives, FLOPs and bytes from the HLO and
cost_analysis(); `distributed` runs it as a real multi-process JAX job (gloo on CPU).
JAX is imported lazily: importing this package does not need it.
"""

from __future__ import annotations

from roofline.verify.hlo import Observed, ObservedCollective, observe, observe_text, summarize
from roofline.verify.program import (
    MatmulSpec,
    Optimizer,
    Program,
    build_matmul,
    build_train_step,
    make_mesh,
)

__all__ = [
    "Observed",
    "ObservedCollective",
    "observe",
    "observe_text",
    "summarize",
    "Program",
    "MatmulSpec",
    "Optimizer",
    "build_matmul",
    "build_train_step",
    "make_mesh",
]
