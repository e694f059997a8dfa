"""A disaggregated deployment sized from given (measured) prefill and decode step times.

Book applied-inference.md ("Serving LLaMA 3-70B", disaggregated serving): with a prefill pass of
`T_p` seconds for `b_p` prompts and a decode step of `T_d` seconds for `B` sequences, each
running `G` steps, a prefill replica finishes `b_p/T_p` requests a second and a decode replica
`B/(G·T_d)`; the pools balance at

    prefill : decode replicas = (B/(G·T_d)) / (b_p/T_p)     (P=8192 in 0.91 s, B=32, G=512,
                                                             T_d = 19 ms -> ≈ 3:1)

Each decode step a replica finishes `B/G` sequences, whose KV caches are evicted:
`B·(P+G)/G` tokens per step (P=8192, G=4096, B=32 -> 96 tokens, 32/4096 sequences).

Under an arrival rate λ (requests/s over the deployment) the pools need `⌈λ·T_p/b_p⌉` prefill
and `⌈λ·G·T_d/B⌉` decode replicas (Little's law: λ·T busy servers), and each decode step
finishes `λ·T_d` sequences over the deployment, evicting `λ·T_d·(P+G)` tokens of KV.

The KV bytes per token are the ledger's (`kv_cache_bytes_per_token`); the hand-off of a
prompt's KV cache crosses `kv_link_bytes_per_s` per chip, the same link the modelled
disaggregated view (`steady.disaggregated`) charges. That view counts `G − 1` decode steps per
request (the first token comes from prefill); the book, and this module, count `G`: the two
ratios differ by `G/(G − 1)`.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from typing import Any

from roofline.errors import SpecError
from roofline.units import fmt_bytes, fmt_time

# keys of a step-times file (TOML): measured or given times and the batch they were taken at
STEP_FILE_KEYS = {
    "prefill_step_s": "one prefill pass, seconds",
    "decode_step_s": "one decode step, seconds",
    "batch": "sequences per decode step",
    "prefill_batch": "prompts per prefill pass (optional, default 1)",
    "source": "where the times come from (optional, text)",
}


def load_step_times(path: str) -> dict[str, Any]:
    """A small TOML file of given step times, e.g.

    prefill_step_s = 0.91
    decode_step_s = 0.019
    batch = 32
    source = "applied-inference.md, LLaMA-3 70B on v5e 4x4"
    """
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as e:
        raise SpecError(
            f"cannot read step-times file {path!r} ({e.strerror})", fix="check the path"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(
            f"step-times file {path!r} is not TOML ({e})",
            rule="a step-times file is TOML: key = value lines",
            fix="write e.g. `decode_step_s = 0.019`",
        ) from None
    unknown = sorted(set(data) - set(STEP_FILE_KEYS))
    if unknown:
        raise SpecError(
            f"step-times file {path!r}: unknown keys {unknown}",
            rule="keys: " + ", ".join(f"{k} ({v})" for k, v in STEP_FILE_KEYS.items()),
            fix="rename or remove them",
        )
    for k, v in data.items():
        if k != "source" and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise SpecError(
                f"step-times file {path!r}: {k} = {v!r}",
                rule=f"{k} is a number ({STEP_FILE_KEYS[k]})",
                fix=f"write e.g. {k} = " + ("0.019" if k.endswith("_s") else "32"),
            )
    return data


@dataclass(frozen=True)
class GivenSteps:
    """Step times given from outside the model (measured, or from another tool)."""

    prefill_step_s: float  # T_p: one prefill pass
    decode_step_s: float  # T_d: one decode step
    decode_batch: float  # B: sequences per decode step (one decode replica)
    prompt: float  # P tokens
    gen: float  # G tokens
    kv_bytes_per_token: float  # the ledger's, at the KV dtype
    prefill_batch: float = 1.0  # b_p: prompts per prefill pass
    rate: float | None = None  # λ: requests per second over the deployment
    kv_link_bytes_per_s: float = 0.0  # the prefill replica's total KV hand-off bandwidth

    def __post_init__(self) -> None:
        for name, flag in (
            ("prefill_step_s", "--prefill-step-s"),
            ("decode_step_s", "--decode-step-s"),
            ("decode_batch", "--batch"),
            ("prefill_batch", "--prefill-batch"),
        ):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise SpecError(
                    f"{flag} {v!r}",
                    rule=f"{flag} is a positive finite number (a step time, or sequences per step)",
                    fix=f"give e.g. {flag} " + ("20ms" if name.endswith("_s") else "32"),
                )


@dataclass(frozen=True)
class Sized:
    """A deployment sized from given step times (see the module docstring); rates in requests/s."""

    given: GivenSteps
    prefill_rate: float  # b_p / T_p per prefill replica
    decode_rate: float  # B / (G·T_d) per decode replica
    ratio: float  # prefill replicas per decode replica
    completions_per_step: float  # B / G per decode replica at batch B
    evicted_tokens_per_step: float  # B·(P+G)/G
    handoff_bytes: float  # P · KV bytes/token per request
    handoff_s: float | None  # over the prefill replica's KV link (None: no link given)
    prefill_replicas: int | None = None  # under the rate
    decode_replicas: int | None = None
    batch_in_flight: float | None = None  # λ·G·T_d / decode replicas
    prefill_utilisation: float | None = None
    rate_completions_per_step: float | None = None  # λ·T_d over the deployment
    rate_evicted_tokens_per_step: float | None = None  # λ·T_d·(P+G)

    def to_dict(self) -> dict[str, Any]:
        g = self.given
        out = {k: v for k, v in self.__dict__.items() if k != "given"}
        out["given"] = dict(g.__dict__)
        out["evicted_kv_bytes_per_step"] = self.evicted_tokens_per_step * g.kv_bytes_per_token
        if self.rate_evicted_tokens_per_step is not None:
            out["rate_evicted_kv_bytes_per_step"] = (
                self.rate_evicted_tokens_per_step * g.kv_bytes_per_token
            )
        if self.handoff_s is None:
            out["handoff_s_reason"] = "no KV link given"
        return out


def size_deployment(g: GivenSteps) -> Sized:
    """Size a disaggregated deployment from `g` (the module docstring's arithmetic)."""
    P, G, B = g.prompt, g.gen, g.decode_batch
    pre = g.prefill_batch / g.prefill_step_s
    dec = B / (G * g.decode_step_s)
    handoff = P * g.kv_bytes_per_token
    extra: dict[str, Any] = {}
    if g.rate is not None:
        n_pre = math.ceil(g.rate / pre - 1e-9)
        n_dec = math.ceil(g.rate / dec - 1e-9)
        done = g.rate * g.decode_step_s
        extra = {
            "prefill_replicas": n_pre,
            "decode_replicas": n_dec,
            "batch_in_flight": g.rate * G * g.decode_step_s / n_dec,
            "prefill_utilisation": g.rate / (n_pre * pre),
            "rate_completions_per_step": done,
            "rate_evicted_tokens_per_step": done * (P + G),
        }
    ratio = dec / pre
    if not all(math.isfinite(x) and x > 0 for x in (pre, dec, ratio)):
        raise SpecError(
            f"--prefill-step-s {g.prefill_step_s:g} and --decode-step-s {g.decode_step_s:g} "
            f"(--batch {B:g}, --gen {G:g}) give prefill/decode rates {pre:g} and {dec:g} "
            "requests/s, whose ratio is no finite number",
            rule="given step times and batches are measured values, so the rates and their "
            "ratio are finite and positive",
            fix="give the step times as measured, e.g. --prefill-step-s 0.91s --decode-step-s 19ms",
        )
    return Sized(
        given=g,
        prefill_rate=pre,
        decode_rate=dec,
        ratio=ratio,
        completions_per_step=B / G,
        evicted_tokens_per_step=B * (P + G) / G,
        handoff_bytes=handoff,
        handoff_s=handoff / g.kv_link_bytes_per_s if g.kv_link_bytes_per_s > 0 else None,
        **extra,
    )


def _n(x: float) -> str:
    return f"{x:.4g}"


def explain(s: Sized) -> list[str]:
    """Book-style lines: formula, substitution, result."""
    g = s.given
    P, G, B, bp = _n(g.prompt), _n(g.gen), _n(g.decode_batch), _n(g.prefill_batch)
    tp, td = fmt_time(g.prefill_step_s), fmt_time(g.decode_step_s)
    kv = fmt_bytes(g.kv_bytes_per_token)
    lines = [
        f"prefill replica: b_p / T_p = {bp} / {tp} = {_n(s.prefill_rate)} requests/s",
        f"decode replica: B / (G·T_d) = {B} / ({G}·{td}) = {_n(s.decode_rate)} requests/s",
        f"prefill : decode replicas = (B/(G·T_d)) / (b_p/T_p) = {_n(s.decode_rate)} / "
        f"{_n(s.prefill_rate)} = {s.ratio:.3f} : 1",
        f"per decode step: B / G = {B} / {G} = {_n(s.completions_per_step)} sequences finish; "
        f"their KV is evicted: B·(P + G)/G = {B}·({P} + {G})/{G} = "
        f"{_n(s.evicted_tokens_per_step)} tokens = "
        f"{fmt_bytes(s.evicted_tokens_per_step * g.kv_bytes_per_token)} ({kv}/token)",
        f"KV hand-off per request: P · KV/token = {P} · {kv} = {fmt_bytes(s.handoff_bytes)}"
        + (
            f" in {fmt_time(s.handoff_s)} at {g.kv_link_bytes_per_s:.3g} B/s"
            if s.handoff_s is not None
            else ""
        ),
    ]
    if g.rate is not None:
        lam = _n(g.rate)
        lines += [
            f"at λ = {lam} requests/s:",
            f"  prefill replicas ⌈λ·T_p/b_p⌉ = ⌈{lam}·{tp}/{bp}⌉ = {s.prefill_replicas} "
            f"(busy {s.prefill_utilisation:.0%})",
            f"  decode replicas ⌈λ·G·T_d/B⌉ = ⌈{lam}·{G}·{td}/{B}⌉ = {s.decode_replicas} "
            f"({_n(s.batch_in_flight or 0.0)} sequences in flight each)",
            f"  per decode step: λ·T_d = {lam}·{td} = {_n(s.rate_completions_per_step or 0.0)} "
            f"sequences finish over the deployment, evicting λ·T_d·(P + G) = "
            f"{_n(s.rate_evicted_tokens_per_step or 0.0)} tokens = "
            f"{fmt_bytes((s.rate_evicted_tokens_per_step or 0.0) * g.kv_bytes_per_token)} of KV",
        ]
    return lines
