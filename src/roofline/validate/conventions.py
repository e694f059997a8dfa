"""Each source's own FLOP convention, and its measured metric -> tokens/s per chip.

Sources report throughput in different currencies: tokens/s (per chip or in total), step
time, "model TFLOP/s per chip" or MFU. TFLOP/s and MFU are tokens/s times the source's own
FLOPs per token (and over its own peak), so converting them back needs *that source's*
formula, not ours: which N (all parameters, non-embedding, the paper's count), whether
attention is counted, whether causal attention is halved, whether recompute is included.

Letters: L layers, h = d_model, s sequence length, V vocab, N heads, K kv heads, H head dim,
F MLP width, N_p the parameter count the source uses. Every convention is per token of a
training step (forward + backward); docs/validate.md cites each one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from roofline.specs.model import MLPKind, ModelSpec


@dataclass(frozen=True)
class Convention:
    key: str
    formula: str  # human-readable, in the letters above
    source: str  # where the formula is defined
    needs_params: bool = False  # uses the source's own parameter count N_p
    flops: Callable[[ModelSpec, int, float | None], float] | None = None

    def flops_per_token(self, m: ModelSpec, seq: int, params: float | None) -> float:
        assert self.flops is not None
        return self.flops(m, seq, params)


def _megatron_2024(m: ModelSpec, s: int, _p: float | None) -> float:
    """Megatron-LM num_floating_point_operations (mcore <= 0.9): attention not halved."""
    h, L = m.d_model, m.n_layers
    q_ratio = m.n_heads * m.d_head / h
    gated = 1.5 if m.mlp == MLPKind.GATED else 1.0
    ffn, routed = (m.moe.d_ff_expert, m.moe.top_k) if m.moe else (m.d_ff, 1)
    attn = (1 + m.n_kv_heads / m.n_heads + s / h) * q_ratio
    return 12 * L * h * h * (attn + ffn / h * routed * gated + m.vocab / (2 * L * h))


def _megatron_2025(m: ModelSpec, s: int, _p: float | None) -> float:
    """Megatron-Core transformer_flops (2025): causal attention halved, GQA-aware projections."""
    h, L = m.d_model, m.n_layers
    q, kv = m.n_heads * m.d_head, m.n_kv_heads * m.d_head
    ffn_mult = 3 if m.mlp == MLPKind.GATED else 2
    attn = h * (q + 2 * kv) + q * s / 2 * 2 + q * h
    if m.moe:
        moe = m.moe
        mlp = m.d_ff * ffn_mult * moe.dense_layers + (
            moe.d_ff_expert * moe.top_k + moe.d_ff_expert * moe.n_shared_experts
        ) * ffn_mult * (L - moe.dense_layers)
    else:
        mlp = m.d_ff * ffn_mult * L
    return 6 * (h * mlp + attn * L + h * m.vocab)


def _narayanan(m: ModelSpec, s: int, _p: float | None) -> float:
    """Narayanan et al. 2021 eq. (3): 96·B·s·l·h²·(1 + s/6h + V/16lh), recompute included."""
    h, L = m.d_model, m.n_layers
    return 96 * L * h * h * (1 + s / (6 * h) + m.vocab / (16 * L * h))


def _six_n(_m: ModelSpec, _s: int, p: float | None) -> float:
    assert p is not None
    return 6 * p


def _six_n_attn(causal: bool) -> Callable[[ModelSpec, int, float | None], float]:
    def f(m: ModelSpec, s: int, p: float | None) -> float:
        assert p is not None
        attn = 12 * m.n_layers * m.n_heads * m.d_head * s
        return 6 * p + (attn / 2 if causal else attn)

    return f


def _mpt(m: ModelSpec, s: int, p: float | None) -> float:
    assert p is not None
    return 6 * p + 6 * m.n_layers * 2 * m.d_model * s


CONVENTIONS: dict[str, Convention] = {
    c.key: c
    for c in (
        Convention(
            "megatron-2024",
            "12·L·h²·[(1 + K/N + s/h)·(N·H/h) + (F/h)·k·g + V/(2·L·h)], g = 3/2 if gated; "
            "attention over the full s² (not halved), no recompute",
            "Megatron-LM megatron/training/training.py num_floating_point_operations (mcore r0.8-0.9); "
            "DGX Cloud 24.11 READMEs print the same formula (12·L·h²·(1+K/N+s/h) + 18·L·F·h + 6·V·h)",
            flops=_megatron_2024,
        ),
        Convention(
            "megatron-2025",
            "6·[h·(F·f·L_dense + (F_e·k + F_e·shared)·f·L_moe) + L·(h·(N·H + 2·K·H) + N·H·s + N·H·h) + h·V], "
            "f = 3 gated / 2 plain; causal attention halved",
            "Megatron-LM training.py transformer_flops (2025, 'causal mask (only half of the mask is non-zero)')",
            flops=_megatron_2025,
        ),
        Convention(
            "narayanan2021",
            "96·L·h²·(1 + s/(6h) + V/(16·L·h)) (includes the recompute forward: 4 passes)",
            "Narayanan et al. 2021 (arXiv:2104.04473) eq. 3; the measured file's notes",
            flops=_narayanan,
        ),
        Convention(
            "maxtext-6n",
            "6·N_p (all parameters, tied embedding once); no attention term",
            "MaxText train.py at commit 281e04bf (2023-04-27, the v4 table): per_device_tflops = 6·N·T",
            needs_params=True,
            flops=_six_n,
        ),
        Convention(
            "maxtext-6n-attn",
            "6·N_p + 12·L·N·H·s (attention over the full s², not halved)",
            "MaxText train.py calculate_training_tflops at e47fa1b5 (2023-10-31, the v5e table)",
            needs_params=True,
            flops=_six_n_attn(causal=False),
        ),
        Convention(
            "maxtext-6n-causal",
            "6·N_p + 6·L·N·H·s (causal attention halved)",
            "MaxText maxtext_utils.calculate_tflops_training_per_device at 04262f3c (2024-03-22, the "
            "v5p table; halving added 2023-11-08 in 64ee4e93, removed 2024-05-08, restored 2025-07)",
            needs_params=True,
            flops=_six_n_attn(causal=True),
        ),
        Convention(
            "maxtext-components",
            "3·[L·(2·F·h·(a+1) + 2·h·(N+2K)·H + 2·h·N·H) + 2·h·V] + 3·L·4·N·H·s (a = MLP input "
            "matrices; MoE: k experts + router); attention over the full s² — equal to megatron-2024 "
            "for dense models",
            "MaxText maxtext_utils.calculate_tflops_training_per_device, 2024-05-08 (353fb837) to "
            "2025-07-18 ('megatron tflops calculation does not account for causality')",
            flops=_megatron_2024,
        ),
        Convention(
            "mpt",
            "6·N_p + 6·L·2·h·s (attention over the full s²)",
            "llm-foundry scripts/train/benchmarking README (MFU formula), as in the measured file's notes",
            needs_params=True,
            flops=_mpt,
        ),
        Convention(
            "llama3-assumed",
            "6·N_p + 6·L·N·H·s (causal attention halved), N_p = the run's parameter count",
            "ASSUMED: the table (via a secondary source) does not state its FLOP formula",
            needs_params=True,
            flops=_six_n_attn(causal=True),
        ),
    )
}

# Worked numbers of a table that apply its formula to another form of the run's model, by
# (document, model name): the form, and the evidence. Nemotron-4 340B has 8 query groups
# (public_dims.toml), but DGX Cloud's README counts its FLOPs with K/N = 1.
MHA_FORM: dict[tuple[str, str], str] = {
    ("dgx-cloud", "nemotron-4 340b"): (
        "nemotron/README_340b.md (dgxc-benchmarking@35a9aecc): 1.01e16 FLOPs per 4096-token "
        "sequence, the formula in MHA form (K/N = 1; the model's 8 query groups give 8.62e15)"
    ),
}


def convention_model(document: str, model: ModelSpec) -> tuple[ModelSpec, str]:
    """The model a table's FLOP convention counts (`MHA_FORM`), and why ('' when the run's)."""
    why = MHA_FORM.get((document, model.name.strip().lower()))
    if why is None or model.n_kv_heads == model.n_heads:
        return model, ""
    return replace(model, n_kv_heads=model.n_heads), why


# Tables whose MFU divides by the peak of the run's compute dtype (FP8 rows by the FP8 peak);
# every other source divides by the bf16 peak.
MFU_AT_COMPUTE_PEAK = {
    "dgx-cloud": "README: 'FP8 MFU is relative to the FP8 peak' (1979 TFLOP/s)",
    "llm-foundry": "benchmarking README: FP8 rows' MFU is computed against the FP8 peak",
}

# The FLOP convention of each published table (sources.py document keys).
DOCUMENT_CONVENTION: dict[str, str] = {
    "megatron-lm-readme-2024": "megatron-2024",
    "megatron-narayanan2021": "narayanan2021",
    "nemo": "megatron-2024",
    "dgx-cloud": "megatron-2024",
    "megatron-bridge": "megatron-2025",
    "maxtext-readme-v4": "maxtext-6n",
    "maxtext-readme-v5e": "maxtext-6n-attn",
    "maxtext-readme-v5p": "maxtext-6n-causal",
    "maxtext-tiering": "maxtext-components",
    "llm-foundry": "mpt",
    "llama3-paper": "llama3-assumed",
}


@dataclass(frozen=True)
class Measured:
    """A run's measured throughput in tokens/s per chip, and how it was obtained."""

    tokens_per_s_per_chip: float | None
    metric: str  # the measured field used
    conversion: str  # the arithmetic, with numbers
    convention: str = ""  # FLOP convention key when one was needed
    assumed: bool = False  # the convention is an assumption, not the source's stated one
    reason: str = ""  # why no value


def _pos(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if x > 0 and math.isfinite(x) else None


def direct_tokens(meas: dict, chips: int | None, batch_tokens: float | None) -> Measured | None:
    """tokens/s per chip from a field that is already a token rate or a step time."""
    if (v := _pos(meas.get("tokens_per_sec_per_chip"))) is not None:
        return Measured(v, "tokens_per_sec_per_chip", f"{v:g} tokens/s per chip as published")
    if (v := _pos(meas.get("tokens_per_sec"))) is not None:
        return Measured(
            v, "tokens_per_sec", f"{v:g} tokens/s read as per chip (torchtitan logs per-GPU tps)"
        )
    if (v := _pos(meas.get("tokens_per_sec_per_chip_approx"))) is not None:
        return Measured(
            v, "tokens_per_sec_per_chip_approx", f"~{v:g} tokens/s per chip as published"
        )
    if chips and (v := _pos(meas.get("tokens_per_sec_total"))) is not None:
        return Measured(v / chips, "tokens_per_sec_total", f"{v:g} tokens/s / {chips} chips")
    if chips and batch_tokens and (t := _pos(meas.get("step_time_s"))) is not None:
        return Measured(
            batch_tokens / t / chips,
            "step_time_s",
            f"{batch_tokens:g} tokens / {t:g} s / {chips} chips",
        )
    return None


def from_flops(
    meas: dict,
    conv: Convention,
    model: ModelSpec,
    seq: int,
    params: float | None,
    peak_flops_per_s: float,
) -> Measured | None:
    """tokens/s per chip from TFLOP/s per chip (or MFU × the source's peak) and the convention."""
    if conv.needs_params and params is None:
        return None
    fpt = conv.flops_per_token(model, seq, params)
    tf = _pos(meas.get("tflops_per_chip"))
    if tf is not None:
        return Measured(
            tf * 1e12 / fpt,
            "tflops_per_chip",
            f"{tf:g} TFLOP/s / {fpt:.4g} FLOPs per token ({conv.key})",
            conv.key,
            conv.key.endswith("assumed"),
        )
    mfu = _pos(meas.get("mfu_pct"))
    if mfu is not None:
        return Measured(
            mfu / 100 * peak_flops_per_s / fpt,
            "mfu_pct",
            f"{mfu:g}% × {peak_flops_per_s / 1e12:g} TFLOP/s / {fpt:.4g} FLOPs per token ({conv.key})",
            conv.key,
            conv.key.endswith("assumed"),
        )
    return None
