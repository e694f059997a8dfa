"""Serving: continuous batching in steady state, on the step costs of inference.py.

Metrics are defined as vLLM's benchmark (benchmarks/benchmark_serving.py) defines them:
- TTFT: time from sending a request to its first output token (queueing and prefill included);
- TPOT: (end-to-end latency − TTFT) / (output tokens − 1) per request, averaged over requests:
  the first token is excluded (AIConfigurator's measured TPOT is the same quantity);
- ITL: the gap between consecutive tokens of one request; with one token per step its mean is TPOT;
- E2EL: TTFT + (G − 1)·TPOT; throughput: output tokens (and requests) per second.

Steady state of a replica serving `concurrency` requests in a closed loop (or a Poisson `rate`),
prompts of P tokens (a fraction `prefix_hit` already cached), G output tokens each:
- every engine pass decodes one token for each of the B_d running sequences and prefills
  k̄ = X·τ·P_new prompt tokens on average (X requests/s, τ the mean pass time); engines that mix
  prefill chunks into decode passes (vLLM, TensorRT-LLM) pay both in one pass (the weights are
  read once); prefill-first engines (SGLang, JetStream) run prefill batches between decode
  passes, so decode passes are spaced by the prefills: τ = τ_decode / (1 − X·t_prefill);
- TPOT = τ (each running sequence gets one token per pass); the sequences in decode are
  B_d = X·(G − 1)·τ (Little's law), the rest of the concurrency waits for or is in prefill:
  TTFT = (C − B_d) / X, and never less than half a pass plus its own prefill passes (plus an
  M/D/1 wait for the prefill capacity when it is busy);
- X = C / (TTFT + (G − 1)·TPOT): a fixed point, solved vectorised over candidates.

Benchmarks start all `concurrency` requests at once: the first wave's prefills queue behind each
other (on a mixed engine each beside the decodes of the requests prefilled before it).
`first_wave_share` (1 / waves; a benchmark of 10×concurrency requests, AIConfigurator's
assumption for its measured sample, has 0.1) averages that wave's TTFT into the reported mean.

Disaggregated serving runs the same physics on two pools (prefill replicas with no decode,
decode replicas with no prefill) joined by the KV transfer over the real link; speculative
decoding replaces one decode pass with a verify pass of γ + 1 tokens plus γ draft passes and
emits (1 − α^(γ+1)) / (1 − α) tokens per cycle (Leviathan et al. 2023, eq. 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roofline.errors import SpecError
from roofline.serving.inference import PassShape, StepModel
from roofline.specs.engines import EngineProfile
from roofline.units import HOUR

MAX_TOKENS = 2**30  # bound on one request's prompt or output (no arithmetic runs on more)
ITERATIONS = (
    60  # fixed-point sweeps (damped: Damping); within 1e-5 of 1000 sweeps in every case tested
)
GROW = 1.25  # a damped sweep's step regrows by this after a step that keeps its sign
BISECTIONS = 200  # halvings of a closed loop's throughput interval (stops at 1e-13 relative)


# --------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Requests: prompt and output lengths (fixed, or samples of a distribution), the load
    (`concurrency` in flight, or a Poisson `rate` in requests/s, for the whole deployment) and the
    share of each prompt already in the prefix cache."""

    prompt_tokens: Sequence[float] | float = 1024
    gen_tokens: Sequence[float] | float = 256
    concurrency: float | None = None
    rate: float | None = None
    prefix_hit: float = 0.0
    first_wave_share: float = 0.0  # weight of the all-at-once first wave in the reported TTFT
    # the clients stream: every running request gets its new token each pass (the benchmark
    # clients' --streaming); false for offline throughput runs that collect whole outputs. The
    # engine's per-sequence host time (`host_per_seq_s`) is paid for streamed sequences only
    streaming: bool = True

    def __post_init__(self) -> None:
        P = np.atleast_1d(np.asarray(self.prompt_tokens, float))
        G = np.atleast_1d(np.asarray(self.gen_tokens, float))
        if P.shape != G.shape and P.size != 1 and G.size != 1:
            raise SpecError(
                f"{P.size} prompt lengths and {G.size} output lengths",
                rule="a length distribution pairs each prompt with its output length",
                fix="give the same number of prompt and output lengths (or one of each)",
            )
        if (
            not (np.all(np.isfinite(P)) and np.all(np.isfinite(G)))
            or np.any(P > MAX_TOKENS)
            or np.any(G > MAX_TOKENS)
        ):
            raise SpecError(
                f"prompt/output lengths up to {max(P.max(), G.max()):.3g} tokens",
                rule=f"a request's prompt and output are at most 2^30 = {MAX_TOKENS:,} tokens each",
                fix="give lengths a model can serve, e.g. --prompt 8192 --gen 1024",
            )
        if np.any(P < 1) or np.any(G < 1):
            raise SpecError(
                "prompt and output lengths must be at least 1 token",
                rule="every request has a prompt and at least one output token",
                fix="give --prompt and --gen of 1 or more",
            )
        if not 0.0 <= self.prefix_hit < 1.0:
            raise SpecError(
                f"prefix-cache hit rate {self.prefix_hit}",
                rule="the hit rate is a fraction in [0, 1): at least one prompt token is computed",
                fix="give e.g. --prefix-hit 0.5",
            )
        for name in ("concurrency", "rate"):
            v = getattr(self, name)
            if v is not None and not (np.isfinite(v) and v > 0):
                raise SpecError(
                    f"{name} = {v}",
                    rule=f"{name} is a positive number",
                    fix=f"give a positive --{name}",
                )

    @property
    def prompt(self) -> float:
        return float(np.mean(self.prompt_tokens))

    @property
    def gen(self) -> float:
        return float(np.mean(self.gen_tokens))

    @property
    def new_prompt(self) -> float:
        """Prompt tokens computed per request (the cached prefix skipped)."""
        return self.prompt * (1.0 - self.prefix_hit)

    @property
    def synchronized(self) -> bool:
        """A closed loop (no Poisson rate) of fixed lengths: requests that start together
        finish together and come back together."""
        return (
            self.rate is None and np.size(self.prompt_tokens) == 1 and np.size(self.gen_tokens) == 1
        )

    @property
    def decode_context(self) -> float:
        """Mean KV length of a running sequence, weighted by time in decode: E[G·(P + G/2)]/E[G]."""
        P = np.asarray(self.prompt_tokens, float)
        G = np.asarray(self.gen_tokens, float)
        return float(np.mean(G * (P + G / 2)) / np.mean(G * np.ones_like(P)))

    @property
    def max_context(self) -> float:
        return float(np.max(np.asarray(self.prompt_tokens, float) + np.asarray(self.gen_tokens)))


def load_lengths(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths from a file: two columns (CSV or whitespace), one request a line;
    lines starting with '#' and a header line of words are skipped. The file is read through
    the catalog's bounded reader (a regular UTF-8 file of at most 64 MiB); a bad line is named
    by its number, never quoted (the UI must not echo file content)."""
    from roofline.specs.catalog import MAX_DATA_FILE_BYTES, read_text_file

    text = read_text_file(path, "lengths", max_bytes=MAX_DATA_FILE_BYTES)
    P, G = [], []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.replace(",", " ").split()
        try:
            p, g = float(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            if n == 1:
                continue  # header
            raise SpecError(
                f"lengths file {path!r} line {n} does not start with two numbers",
                rule="each line holds a prompt length and an output length",
                fix="write e.g. `1024,256`",
            ) from None
        P.append(p)
        G.append(g)
    if not P:
        raise SpecError(
            f"lengths file {path!r} has no requests",
            rule="a lengths file holds one request a line: prompt tokens, output tokens",
            fix="add lines `prompt,output`",
        )
    return np.array(P), np.array(G)


# --------------------------------------------------------------------------------------
# Steady state of one aggregated replica
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Steady:
    """A replica's operating point (arrays over candidates). Times in seconds."""

    concurrency: Any  # requests in flight on this replica
    ttft_s: Any
    tpot_s: Any
    e2e_s: Any
    requests_per_s: Any  # this replica
    decode_batch: Any  # sequences decoding in a pass
    pass_s: Any  # mean pass time (= TPOT without speculation)
    prefill_share: Any  # fraction of the replica's time spent on prefill work
    first_wave_ttft_s: Any
    steady_ttft_s: Any
    capped: Any  # the decode batch hit the engine's cap or the KV capacity
    gen_tokens: float = 1.0

    @property
    def output_tokens_per_s(self) -> Any:
        return self.requests_per_s * self.gen_tokens


def steady_state(
    step: StepModel,
    engine: EngineProfile | None,
    work: Workload,
    concurrency: Any,
    *,
    batch_cap: Any = np.inf,
    step_overhead_s: float | None = None,
    request_latency_s: float = 0.0,  # the profile's, for this engine: adds to the engine file's
) -> Steady:
    """Closed-loop steady state of one replica at `concurrency` requests (array) in flight.

    `batch_cap`: most sequences that fit (KV capacity; the engine's max_num_seqs is applied too,
    per scheduler: with attention DP each rank of vLLM and TensorRT-LLM has its own).
    A mixed engine keeping a closed loop in step (`_in_cohorts`) prefills cohorts of
    k = ⌊budget / P_new⌋ (at most C) that came back together; where arrivals drift apart a pass
    prefills the prompts that arrived since the last one (`arrival_batch`). A prompt longer
    than the budget takes ⌈P_new / budget⌉ chunked passes alone.
    """
    C = np.asarray(concurrency, float)
    G, P, Pn = work.gen, work.prompt, work.new_prompt
    ctx = work.decode_context
    # the engine's caps hold per scheduler (per attention-DP rank or replica)
    dp, hbm = step.degree("dp"), step.chip.fit_hbm_bytes
    budget = np.asarray(engine.token_budget(hbm, dp), float) if engine else np.inf
    mixed = engine.mixed_prefill_decode if engine else True
    cap = np.minimum(batch_cap, engine.seq_cap(dp) if engine else np.inf)
    # decode-first budgets (vLLM, TensorRT-LLM): the running decodes take one token each of the
    # step's budget before prefill chunks take the rest, so a prompt as long as the budget is
    # chunked over two passes when anyone else is decoding
    k0 = np.minimum(np.floor(budget / Pn), np.maximum(C, 1.0))
    running = np.maximum(np.minimum(C, cap) - k0, 0.0) if mixed else np.zeros_like(C)
    avail = np.maximum(budget - running, 1.0)
    chunked = engine is None or engine.chunked_prefill
    n_chunks, chunk = split_prompt(Pn, float(np.min(avail)), chunked)
    k = np.clip(np.floor(avail / Pn), 1.0, np.maximum(C, 1.0)) if engine else np.ones_like(C)
    ovh = _pass_overhead(step, engine, work, C, cap) if step_overhead_s is None else step_overhead_s
    lat = (engine.request_latency_s if engine else 0.0) + request_latency_s
    if _runs_in_waves(engine, work):
        return _waves(step, work, C, np.minimum(C, cap), k, chunk, n_chunks, ovh)

    seqs = k if Pn <= chunk else np.ones_like(k)  # the chunks a cohort's prefill pass runs
    cohorts = _in_cohorts(engine, work)

    # a cohort's prefill pass with nothing decoding beside it
    pf_alone = _cohort_alone(step, ctx, seqs, chunk, P, Pn, paired=mixed) + ovh
    X = C / (n_chunks * pf_alone + G * _decode(step, np.minimum(C, cap), ctx, ovh))
    Bd = np.minimum(C, cap) * 0.9
    tau = _decode(step, np.maximum(Bd, 1.0), ctx, ovh)
    damp = Damping(X)
    for _ in range(ITERATIONS):
        Bd1, tau_in = np.maximum(Bd, 1.0), tau  # a sweep reads X, Bd and the last pass time
        if mixed:  # a decode pass and the cohort's (or the arrivals') prefill pass beside it
            m = k if cohorts else arrival_batch(X * tau, k)
            sm = seqs if cohorts else np.where(Pn <= chunk, m, 1.0)
            tau_d, t_pf = (t + ovh for t in _decode_and_cohort(step, Bd1, ctx, sm, chunk, P, Pn))
        else:  # a prefill batch holds whoever arrived since the last one (zero-truncated Poisson)
            m = arrival_batch(X * tau, k)
            tau_d = _decode(step, Bd1, ctx, ovh)
            t_pf = _cohort_pass(step, 0.0, ctx, np.where(Pn <= chunk, m, 1.0), chunk, P, Pn) + ovh
        extra = t_pf - (tau_d if mixed else 0.0)  # what prefill adds over a decode pass
        per_req = np.maximum(extra, 0.0) * n_chunks / np.where(Pn <= chunk, m, 1.0)
        rho = np.minimum(X * per_req, RHO_MAX)  # share of the time spent on prefill work
        tau = tau_d / (1.0 - rho)
        # cohorts queue behind each other (M/D/1); in a closed loop a cohort has only the other
        # C/k − 1 cohorts to queue behind
        wait = md1_wait(t_pf, rho) * np.maximum(1.0 - k / np.maximum(C, 1.0), 0.0)
        ttft_min = tau_d / 2 + n_chunks * t_pf + wait + lat
        Bd_new = np.minimum(C * (G - 1) * tau / ((G - 1) * tau + ttft_min), cap)
        Bd_new = np.maximum(Bd_new, np.minimum(C, 1.0))
        X_new = np.where(
            Bd_new >= cap - 1e-9,
            Bd_new / np.maximum((G - 1) * tau, 1e-12) if G > 1 else C / ttft_min,
            C / (ttft_min + (G - 1) * tau),
        )
        X_next, Bd_next = damp.step((X, Bd), (X_new, Bd_new))
        if damp.kept and _settled((X, Bd, tau_in), (X_next, Bd_next, tau)):  # arrivals read τ
            break  # every later sweep would repeat this one to the last bit
        X, Bd = X_next, Bd_next
    ttft_ss = np.maximum(C / X - (G - 1) * tau, ttft_min)
    first = np.maximum(
        _first_wave(step, C, k, seqs, chunk, n_chunks, (P, Pn), pf_alone, ovh, cap, mixed) + lat,
        ttft_min,
    )
    w = work.first_wave_share
    ttft = (1 - w) * ttft_ss + w * first
    return Steady(
        concurrency=C,
        ttft_s=ttft,
        tpot_s=tau,
        e2e_s=ttft + (G - 1) * tau,
        requests_per_s=C / (ttft_ss + (G - 1) * tau),
        decode_batch=Bd,
        pass_s=tau,
        prefill_share=np.clip(rho, 0.0, 1.0),
        first_wave_ttft_s=first,
        steady_ttft_s=ttft_ss,
        capped=Bd >= cap - 1e-6,
        gen_tokens=G,
    )


def _first_wave(step, C, k, seqs, chunk, n_chunks, lengths, pf_alone, ovh, cap, mixed) -> Any:
    """Mean TTFT of the benchmark's first wave: all C requests arrive together and n = C/k
    cohorts prefill one after another, cohort i's first token after the passes of cohorts
    0 … i − 1 and its own. On a mixed engine (vLLM, TensorRT-LLM: the running decodes are
    scheduled first and ride in every pass: the engine records' [sched] / [ifb]) the pass of cohort
    j also decodes the j·k requests prefilled before it, at about the prompt's context; on a
    prefill-first engine (SGLang) the waiting prompts run before any decode, alone. With the
    pass time affine in its decodes, t(j) = a + b·j·k, the wave's mean
    Σ_j t(j)·(n − j)/n = a·(n + 1)/2 + b·k·(n² − 1)/6 is (n + 1)/2 passes at j·k = k·(n − 1)/3
    decodes: one pass costed at a third of the wave beside it."""
    P, Pn = lengths
    n = C / k
    beside = np.minimum(np.maximum(k * (n - 1.0) / 3.0, 0.0), cap)
    if mixed and np.any(beside > 0):
        t = _cohort_pass(step, beside, P, seqs, chunk, P, Pn) + ovh
        pf = np.where(beside > 0, t, pf_alone)
    else:
        pf = pf_alone
    return (n + 1) / 2 * n_chunks * pf


def arrival_batch(lam: Any, k: Any) -> Any:
    """Mean prompts in a prefill pass in the staggered (drifted) steady state: the scheduler
    admits whoever is waiting when it looks (SGLang PrefillAdder, see the engine record's
    [drift]; vLLM's and TensorRT-LLM's decode-first budgets give the waiting prompts what the
    running decodes leave), and a pass prefills only when at least one waits, so with λ = X·τ
    arrivals per pass interval the batch is a zero-truncated Poisson count, mean
    λ / (1 − e^(−λ)) (1 as λ → 0: one prompt's pass; λ when λ is large), at most the budget's
    cohort k."""
    lam = np.maximum(np.asarray(lam, float), 1e-12)
    return np.clip(lam / -np.expm1(-lam), 1.0, np.maximum(k, 1.0))


def _in_cohorts(engine: EngineProfile | None, work: Workload) -> bool:
    """Whether a mixed engine's closed loop stays in step (its record's `closed_loop_lockstep`):
    the requests prefilled in one pass decode together, finish on the same pass and come back
    together, so they share their next prefill pass (the budget's cohort). Never for a Poisson
    rate or a length distribution (nothing comes back together), nor with no engine record."""
    return engine is not None and work.synchronized and engine.closed_loop_lockstep


def _runs_in_waves(engine: EngineProfile | None, work: Workload) -> bool:
    """A closed loop of fixed lengths on a prefill-first engine whose cohorts stay aligned
    (`closed_loop_lockstep`) runs in waves; where they drift apart (SGLang: its scheduler
    prefills whoever is waiting and decodes in between, so a wave's late arrivals start
    decoding passes after its early ones and never catch up) it serves the staggered steady
    state, with only the benchmark's first wave all at once."""
    if engine is None or engine.mixed_prefill_decode or not work.synchronized:
        return False
    return engine.closed_loop_lockstep


class Damping:
    """Per-candidate step of a damped fixed-point sweep, x <- x + a·(x_new − x): a = 1/2, halved
    for a candidate each time its step changes sign and regrown by GROW (at most to 1/2) each time
    it keeps it. The map X -> X_new is decreasing (more requests/s, more prefill per second,
    longer passes, fewer requests/s); where its slope is below −3 (prefill near the capacity:
    τ = τ_d/(1 − ρ)) a half step overshoots by more than it corrects, |1 − (1 + L)/2| > 1, and the
    sweeps orbit a two-cycle about the fixed point instead of reaching it (Qwen3-32B fp8 on 2 H100,
    TensorRT-LLM, ISL 4096, OSL 128, C 64: X alternating 4.4 and 7.7 requests/s after 60 sweeps,
    where the fixed point is 5.5). Halving on each overshoot makes the sweep contract wherever
    the map is monotone, regrowing keeps it from crawling once past the steep stretch (6 workloads
    × 23 concurrencies × 3 engines × 3 plans: 60 sweeps land within 1e-5 of 1000 sweeps' answer,
    against 0.5% with no regrowth and up to 8× apart with plain half steps); a candidate that never
    overshoots keeps the plain half step. The sweep has settled only when its step size has too
    (`kept`: the last step left every `a` as it was)."""

    def __init__(self, x: Any) -> None:
        self.a = np.full(np.shape(x), 0.5)
        self.last = np.zeros(np.shape(x))
        self.kept = True

    def step(self, state: tuple, new: tuple) -> tuple:
        """The next state; the sign test is on the first variable's step (X's)."""
        dx = np.broadcast_to(np.asarray(new[0] - state[0], float), self.a.shape)
        turn, a = dx * self.last, self.a
        self.a = np.where(
            turn < 0, self.a * 0.5, np.where(turn > 0, np.minimum(self.a * GROW, 0.5), self.a)
        )
        self.last, self.kept = dx, np.array_equal(a, self.a)
        return tuple(x + self.a * (n - x) for x, n in zip(state, new, strict=True))


def _settled(state: tuple, new: tuple) -> bool:
    """Whether a fixed-point sweep left its state unchanged to the last bit: every later sweep
    then computes the same values, so stopping here gives the ITERATIONS-sweep answer exactly."""
    return all(np.array_equal(a, b) for a, b in zip(state, new, strict=True))


def _waves(step, work, C, B, k, chunk, n_chunks, ovh) -> Steady:
    """A prefill-first engine under a closed loop of fixed lengths whose cohorts stay aligned
    (`closed_loop_lockstep`, JetStream): every wave is a first wave.

    Waiting prompts run before any decode (a prefill batch whenever one can be admitted), so all B admitted requests are prefilled in ⌈B/k⌉ back-to-back batches, then
    decode in lockstep, finish on the same pass and come back together. The i-th batch's
    requests see TTFT = i·n_chunks·t_batch; requests beyond B wait a whole wave (Little's law).
    """
    G, P, Pn, ctx = work.gen, work.prompt, work.new_prompt, work.decode_context
    kk = np.minimum(k, np.maximum(B, 1.0))
    seqs = kk if Pn <= chunk else np.ones_like(kk)
    t_b = _cohort_pass(step, 0.0, ctx, seqs, chunk, P, Pn) + ovh
    n_b = np.ceil(B / kk)
    first = (n_b + 1) / 2 * n_chunks * t_b  # mean over the wave
    tau = _decode(step, np.maximum(B, 1.0), ctx, ovh)
    prefill = n_b * n_chunks * t_b
    wave = prefill + (G - 1) * tau
    X = B / wave
    # the first-to-second token gap holds the rest of the wave's prefills (G = 1: no gap)
    tpot = tau + (prefill - first) / (G - 1) if G > 1 else tau
    ttft = np.maximum(C / X - (G - 1) * tpot, first)
    pre = prefill / wave
    return Steady(
        concurrency=C,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=ttft + (G - 1) * tpot,
        requests_per_s=X,
        decode_batch=B,
        pass_s=tau,
        prefill_share=pre,
        first_wave_ttft_s=first,
        steady_ttft_s=ttft,
        capped=C > B,
        gen_tokens=G,
    )


def _cohort_pass(
    step: StepModel, decode: Any, ctx: float, seqs: Any, chunk: float, P: float, Pn: float
) -> Any:
    """Mean time of the passes that decode `decode` sequences and prefill `seqs` chunks of
    `chunk` prompt tokens, a cached prefix before the first: a prompt of n = P_new / chunk chunks
    has its i-th chunk end at P − P_new + i·chunk, so the mean pass attends over the keys up to
    P − P_new + (n + 1)/2·chunk (attention is affine in the keys at a fixed chunk)."""
    return step.pass_time(_cohort_shape(decode, ctx, seqs, chunk, P, Pn)).time_s


def _cohort_shape(decode: Any, ctx: float, seqs: Any, chunk: float, P: float, Pn: float):
    n = max(round(Pn / chunk), 1)
    return PassShape(
        decode=decode,
        context=ctx,
        prefill_seqs=seqs,
        prefill_chunk=chunk,
        prefill_context=P - Pn + chunk * (n + 1) / 2,
    )


def _decode_and_cohort(
    step: StepModel, B: Any, ctx: float, seqs: Any, chunk: float, P: float, Pn: float
) -> tuple[Any, Any]:
    """(a decode pass at B sequences, the cohort's prefill pass beside the same B decodes),
    without the engine's overhead. A one-plan `ShardedStep` (`m` == 1: it costs any 1-d array
    of shapes, a single shape as a 1-element array) at single shapes costs both in one
    `pass_time` call over the two shapes: the decode shape prefills nothing, so its element is
    the decode pass's to the last bit (its prefill rows add zeros after its own), as
    tests/test_steady_settled.py checks; otherwise two calls."""
    if not _pairs(step, B, seqs):
        decode = step.pass_time(PassShape(decode=B, context=ctx)).time_s
        return decode, _cohort_pass(step, B, ctx, seqs, chunk, P, Pn)
    b, k = (float(np.asarray(x, float).reshape(-1)[0]) for x in (B, seqs))
    t = np.asarray(step.pass_time(_cohort_shape([b, b], ctx, [0.0, k], chunk, P, Pn)).time_s)
    return t[0:1], t[1:2]  # shaped as a one-element call's


def _pairs(step: StepModel, B: Any, seqs: Any) -> bool:
    """Whether `_decode_and_cohort` costs its two shapes in one call (see there)."""
    return np.size(B) == 1 and np.size(seqs) == 1 and getattr(step, "m", None) == 1


def _cohort_alone(
    step: StepModel, ctx: float, seqs: Any, chunk: float, P: float, Pn: float, paired: bool
) -> Any:
    """The cohort's prefill pass with nothing decoding beside it. `paired` (the sweeps cost
    their passes with `_decode_and_cohort`): costed the same way, beside an empty shape, so that
    it and the sweeps walk one prefill table (the table is walked per set of chunk counts; the
    element is the single call's to the last bit, as tests/test_steady_settled.py checks)."""
    if paired and _pairs(step, 0.0, seqs):
        return _decode_and_cohort(step, 0.0, ctx, seqs, chunk, P, Pn)[1]
    return _cohort_pass(step, 0.0, ctx, seqs, chunk, P, Pn)


def _decode(step: StepModel, B: Any, ctx: float, ovh: Any) -> Any:
    return step.pass_time(PassShape(decode=B, context=ctx)).time_s + ovh


def _pass_overhead(
    step: StepModel, engine: EngineProfile | None, work: Workload, C: Any, cap: Any
) -> Any:
    """A steady state's exposed host time per pass (`engine_overhead_s` at concurrency C), its
    per-sequence part for the streamed sequences that can run at once (none offline)."""
    streamed = np.minimum(C, cap) if work.streaming else np.zeros_like(C)
    return engine_overhead_s(step, engine, C, running=streamed)


def engine_overhead_s(
    step: StepModel, engine: EngineProfile | None, B: Any, running: Any = None
) -> Any:
    """Host time per pass the engine leaves exposed: its scheduler step (unless overlapped), its
    per-sequence work done serially with the GPU (`host_per_seq_s` of the `running` sequences,
    B where not given), plus kernel launches for decode batches B larger than the largest
    captured CUDA graph. Per attention-DP rank: each rank replays its own graph and runs its own
    loop over its own sequences, in parallel with the others."""
    if engine is None:
        return 0.0
    graph = engine.graph_batch(step.degree("tp"))
    per_rank = np.asarray(B) / np.maximum(step.degree("dp"), 1)
    eager = np.where(per_rank > graph, engine.eager_launch_s_per_layer * step.model.n_layers, 0.0)
    seqs = B if running is None else running
    return engine.step_overhead_s + host_per_seq_s(step, engine, seqs) + eager


def host_per_seq_s(step: StepModel, engine: EngineProfile | None, B: Any) -> Any:
    """The engine's exposed per-sequence host time in a pass of `B` running sequences: its
    `seq_overhead_s` for each sequence of one attention-DP rank (the ranks' loops run side by
    side, each over its own sequences). 0 without an engine or where it records none."""
    if engine is None or not engine.seq_overhead_s:
        return 0.0
    return engine.seq_overhead_s * np.asarray(B, float) / np.maximum(step.degree("dp"), 1)


# --------------------------------------------------------------------------------------
# Speculative decoding
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Speculation:
    """Draft γ tokens per cycle, each accepted with probability α (i.i.d.), then verify them in
    one target pass of γ + 1 tokens. `draft_cost`: one draft step's time as a fraction of a
    target decode pass (a small draft model ~0.05-0.1; MTP heads ~1/L of the target)."""

    draft_tokens: int = 3
    acceptance: float = 0.7
    draft_cost: float = 0.05

    def __post_init__(self) -> None:
        if not (isinstance(self.draft_tokens, int) and self.draft_tokens >= 1):
            raise SpecError(
                f"draft length {self.draft_tokens}", rule="draft length γ ≥ 1", fix="give --draft 3"
            )
        if not 0.0 <= self.acceptance < 1.0 + 1e-12:
            raise SpecError(
                f"acceptance rate {self.acceptance}",
                rule="acceptance α is a probability in [0, 1]",
                fix="give e.g. --acceptance 0.7",
            )
        if self.draft_cost < 0:
            raise SpecError(f"draft cost {self.draft_cost}", rule="≥ 0", fix="give e.g. 0.05")

    @property
    def tokens_per_verify(self) -> float:
        """E[tokens per cycle] = (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023): the accepted
        prefix of the γ drafts plus the one token the target pass itself produces."""
        a, g = self.acceptance, self.draft_tokens
        return float(g + 1) if a >= 1.0 else (1.0 - a ** (g + 1)) / (1.0 - a)


def speculative_tpot(
    step: StepModel, spec: Speculation, batch: Any, context: float
) -> dict[str, Any]:
    """TPOT with speculation at a decode batch: (t_verify(γ+1) + γ·t_draft) / E[tokens]."""
    t1 = step.pass_time(PassShape(decode=batch, context=context)).time_s
    g = spec.draft_tokens
    verify = step.pass_time(
        PassShape(prefill_seqs=batch, prefill_chunk=g + 1, prefill_context=context + g)
    ).time_s
    cycle = verify + g * spec.draft_cost * t1
    E = spec.tokens_per_verify
    return {
        "tokens_per_verify": E,
        "verify_s": verify,
        "cycle_s": cycle,
        "tpot_s": cycle / E,
        "speedup": t1 * E / cycle,
    }


# --------------------------------------------------------------------------------------
# Disaggregated prefill / decode
# --------------------------------------------------------------------------------------


def kv_link_bytes_per_s(chip: Any) -> float:
    """Per-chip bandwidth a prefill worker's KV cache leaves over towards the decode worker:
    NVLink inside an NVL36/72 rack, else the node's scale-out NICs shared by its GPUs (DCN for a
    TPU slice)."""
    if chip.is_tpu:
        return chip.dcn_bw_bytes_per_s or 3e9
    if (chip.nvlink_domain or 8) >= 36 and chip.nvlink_bw_bytes_per_s:
        return chip.nvlink_bw_bytes_per_s
    return (chip.node_egress_bytes_per_s or 4e11) / (chip.nvlink_domain or 8)


RHO_MAX = 0.95  # a queue formula's load bound: a saturated pool is priced by Little's law instead


def md1_wait(service: Any, rho: Any) -> Any:
    """Mean wait of an M/D/1 queue (Pollaczek–Khinchine, deterministic service):
    service·ρ / (2·(1 − ρ)), ρ capped at RHO_MAX (past it the closed loop's Little's law, not the
    open queue, prices the wait). Vectorised."""
    return closed_wait(service, np.minimum(np.asarray(rho, float), RHO_MAX), np.inf)


@dataclass(frozen=True)
class Disagg:
    """Two pools: `prefill_replicas` of the prefill step model, `decode_replicas` of the decode one;
    the KV cache of each prompt crosses `link_bw_bytes_per_s` (+ `link_latency_s`) — one link per
    prefill replica (its chips' own NICs or NVLink ports, the bandwidth given summed over them).
    `handoff_s` is the per-request hand-off between the pools (router -> prefill worker ->
    KV-ready notification -> the decode worker's first step): pure latency on every request's way
    to its first token, holding no prefill or decode capacity (the profile's `disagg_handoff_s`,
    fitted by `roofline calibrate --from-runs serving`; 0 in the datasheet profile)."""

    prefill_replicas: int
    decode_replicas: int
    link_bw_bytes_per_s: float
    link_latency_s: float = 10e-6
    kv_bytes_per_token: float = 0.0
    prefill_batch: int = 1  # prompts a prefill replica runs per pass
    handoff_s: float = 0.0


def prefill_chunks(
    pre: StepModel, engine: EngineProfile | None, per: float, Pn: float
) -> tuple[float, float]:
    """(passes, tokens a prompt runs per pass) on a prefill worker whose passes each hold `per`
    prompts: the engine's token budget per step (`token_budget`, the replica's or every
    attention-DP rank's) is shared by the pass's prompts, and an engine that chunks prefill
    splits a longer prompt over ceil(P / (budget / per)) passes of equal chunks — SGLang divides
    its chunked_prefill_size over the DP ranks, so a DP-attention prefill worker on GB200 runs an
    8192-token prompt as four 2048-token chunks. An engine that does not chunk runs it whole."""
    if engine is None or not engine.chunked_prefill:
        return 1.0, Pn
    budget = float(np.max(engine.token_budget(pre.chip.fit_hbm_bytes, pre.degree("dp"))))
    return split_prompt(Pn, max(budget / max(per, 1.0), 1.0), True)


def split_prompt(Pn: float, room: float, chunked: bool) -> tuple[float, float]:
    """(passes, tokens a pass runs) of a prompt of Pn new tokens with `room` tokens of a pass's
    budget for it: an engine that chunks prefill splits a longer prompt into ceil(Pn / room)
    passes whose chunks sum to the prompt (a prompt as long as the budget with one decode
    beside it is two chunks of P/2, not P − 1 and 1); one that does not runs it whole."""
    n = float(np.ceil(Pn / min(Pn, room))) if chunked else 1.0
    return n, Pn / n


def _bisect(sweep: Any, hi: Any) -> Any:
    """The fixed point X = sweep(X)[0] in [0, hi] by bisection (per element): near a pool's knee
    the closed wait is too steep for damped sweeps to settle in ITERATIONS."""
    lo = np.zeros_like(hi)
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        up = sweep(mid)[0] > mid
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
        if np.all(hi - lo <= 1e-13 * hi):
            break
    return (lo + hi) / 2


def disaggregated(
    pre: StepModel,
    dec: StepModel,
    d: Disagg,
    work: Workload,
    concurrency: Any,
    *,
    decode_cap: Any = np.inf,
    engine: EngineProfile | None = None,
) -> dict[str, Any]:
    """Closed-loop steady state of a disaggregated deployment at `concurrency` (all pools).

    The benchmark client is a closed loop: `concurrency` = N users, each sending its next request
    when the last one finishes (AIPerf `--concurrency` alone: "send requests as fast as possible
    within concurrency", docs.nvidia.com/aiperf load-generator options reference; AIConfigurator's
    generated benchmark runs `aiperf profile --concurrency c --num-requests 50c
    --warmup-request-count 2c`, ai-dynamo/aiconfigurator generator/config/backend_templates/
    benchmark/bench_run.sh.j2; GenAI-Perf's concurrency mode is Perf Analyzer's, which keeps "N
    requests always outstanding", Triton perf_analyzer docs/inference_load_modes.md). So the
    deployment is a closed queueing network of N requests, solved by approximate Mean Value
    Analysis (`closed_wait`): the prefill servers (`prefill_replicas × prefill_batch` single
    servers of a fixed pass time t_pf: the router sends each request to one replica and each
    replica keeps its own queue — Dynamo routes to a worker, an attention-DP worker to a rank),
    the KV links (one per prefill replica, each prompt's cache holds it P·kv/bw seconds), the
    hand-off (pure latency), and the decode phase as the delay ("think") station of
    (G − 1)·TPOT. Throughput and TTFT satisfy X = N / (TTFT + (G − 1)·TPOT) (Little's law on the
    loop). At low load the waits are the open M/D/1 ones (times (N − 1)/N, the arrival theorem);
    as a pool saturates X tends to its capacity and TTFT to N/X − (G − 1)·TPOT, with no load cap.
    When every decode slot is taken the decode pool bounds X instead: X = slots / ((G − 1)·TPOT)
    and the TTFT is the same Little's-law remainder (the wait for a slot; none while N ≤ slots).
    Decode replicas run pure decode passes at B_d = (N − X·TTFT) / decode_replicas sequences each
    (= X·(G − 1)·TPOT per replica), at most `decode_cap` (the sequences a decode replica's KV
    memory holds) and the engine's running-sequence cap: its slots.
    """
    C = np.asarray(concurrency, float)
    G, P, ctx = work.gen, work.prompt, work.decode_context
    ovh = engine.step_overhead_s if engine else 0.0
    per = float(d.prefill_batch)  # prompts one prefill pass runs (one per attention-DP rank)
    t_pf = _prefill_time(pre, engine, per, work, ovh)
    cap_pf = d.prefill_replicas * per / t_pf  # prompts/s the prefill pool can do
    busy = P * d.kv_bytes_per_token / d.link_bw_bytes_per_s  # a prompt's hold on its link
    # the loop's throughput stays under both pools' capacities (the links' too)
    x_max = 0.999 * np.minimum(cap_pf, d.prefill_replicas / busy if busy > 0 else np.inf)
    # every request's way from prefill to its first token: the KV transfer and the hand-off
    # (pure latency: in a closed loop it lengthens each request's cycle, so it enters the fixed
    # point; where a pool saturates it replaces queueing rather than adding to it)
    lat = d.link_latency_s + busy + d.handoff_s
    cap = np.minimum(decode_cap, seq_cap_of(dec, engine))
    streamed = 1.0 if work.streaming else 0.0  # the decode passes' streamed share of sequences

    def sweep(X: Any) -> tuple[Any, ...]:
        """The loop's throughput F(X) given X (the waits and the decode batch it makes)."""
        w_pf, w_link = _waits(X, t_pf, cap_pf, busy, d, C)
        ttft_min = t_pf + w_pf + w_link + lat
        Bd = np.clip((C - X * ttft_min) / d.decode_replicas, 1.0, cap)
        tau = _decode(dec, Bd, ctx, ovh + host_per_seq_s(dec, engine, Bd * streamed))
        F = np.minimum(C / (ttft_min + (G - 1) * tau), Bd * d.decode_replicas / max(G - 1, 1) / tau)
        return np.minimum(F, x_max), w_pf, w_link, ttft_min, Bd, tau

    # F(0) > 0 and F never exceeds `hi` (no TTFT is under t_pf + lat, no pass under one
    # sequence's), so a root of X = F(X) lies in [0, hi]
    tau1 = _decode(dec, np.ones_like(C), ctx, ovh + host_per_seq_s(dec, engine, streamed))
    X = _bisect(sweep, np.minimum(x_max, C / (t_pf + lat + (G - 1) * tau1)) * np.ones_like(C))
    _, w_pf, w_link, ttft_min, Bd, tau = sweep(X)
    ttft_ss = np.maximum(ttft_min, C / X - (G - 1) * tau)  # Little's law when a pool saturates
    # that remainder is the wait for a decode slot where the slots bound X, else the saturated
    # prefill pool's (or link's) queue beyond what the closed-queue wait priced at X
    slots_bound = Bd >= cap - 1e-9
    gap = ttft_ss - ttft_min
    # the first wave: all C arrive together and queue for the prefill pool's passes
    first = np.maximum((C / (d.prefill_replicas * per) + 1) / 2 * t_pf + lat, ttft_min)
    w = work.first_wave_share
    ttft = (1 - w) * ttft_ss + w * first
    # servers each pool needs at this throughput: the prefill:decode ratio that balances them
    # (a prefill server finishes `per` prompts every pass of t_pf)
    n_pre = X * t_pf / per
    n_dec = X * (G - 1) * tau / np.maximum(Bd, 1.0)
    return {
        "ttft_s": ttft,
        "tpot_s": tau,
        "e2e_s": ttft + (G - 1) * tau,
        "requests_per_s": X,
        "decode_batch": Bd,
        "prefill_s": t_pf,
        "prefill_wait_s": w_pf + np.where(slots_bound, 0.0, gap),
        "kv_transfer_s": d.link_latency_s + busy,
        "link_wait_s": w_link,
        "handoff_s": d.handoff_s,
        "decode_wait_s": np.where(slots_bound, gap, 0.0),  # waiting for a decode slot
        "first_wave_s": first,
        "prefill_utilisation": n_pre / d.prefill_replicas,
        "prefill_decode_ratio": n_pre / np.maximum(n_dec, 1e-12),
    }


def _prefill_time(
    pre: StepModel, engine: EngineProfile | None, per: float, work: Workload, ovh: float
) -> Any:
    """A prompt's prefill on a prefill replica: its chunks' passes (`prefill_chunks`) end to end,
    each pass running `per` prompts' chunks, plus the engine's per-step overhead."""
    n_pf, chunk = prefill_chunks(pre, engine, per, work.new_prompt)
    pass_s = _cohort_pass(pre, 0.0, work.decode_context, per, chunk, work.prompt, work.new_prompt)
    return n_pf * (pass_s + ovh)


def seq_cap_of(dec: StepModel, engine: EngineProfile | None) -> Any:
    """The engine's running-sequence cap of one decode replica (per attention-DP rank × ranks)."""
    return engine.seq_cap(dec.degree("dp")) if engine else np.inf


def closed_wait(service: Any, rho: Any, users: Any, residual: float = 0.5) -> Any:
    """Mean wait at one FCFS server of a CLOSED network of `users` requests (approximate Mean
    Value Analysis): by the arrival theorem (Reiser & Lavenberg 1980) a request arriving at the
    server finds the queue the other N − 1 make, which Schweitzer's approximation (Schweitzer
    1979, Bard 1979) takes as (N − 1)/N of the whole population's; a request in service has
    `residual`·service left (½ for a fixed service time, 1 for an exponential one: the residual
    life (1 + c²)/2 of a non-exponential FCFS server, Reiser 1979). With the server's load
    ρ = X·service this solves to

        W = residual · service · ρ' / (1 − ρ'),  ρ' = ρ·(N − 1)/N,

    so N = 1 never waits, N → ∞ is the open queue's Pollaczek–Khinchine wait (`md1_wait` at
    residual ½), and a saturated server (ρ → 1) keeps ρ' ≤ (N − 1)/N: the wait is finite and the
    closed loop's throughput, not a load cap, settles it (X·(TTFT + think) = N). Vectorised."""
    n = np.maximum(np.asarray(users, float), 1.0)
    r = np.clip(np.asarray(rho, float), 0.0, 1.0) * (1.0 - 1.0 / n)  # n = inf: the open queue
    return residual * np.asarray(service, float) * r / (1.0 - r)


def _waits(X: Any, t_pf: Any, cap_pf: Any, busy: float, d: Disagg, C: Any) -> tuple[Any, Any]:
    """The queueing on a request's way to the decode pool at X requests/s with C requests in the
    closed loop: its prefill replica's wait (each of the prefill servers, load X / cap_pf, runs
    one fixed-length pass after another) and its link's (each of `prefill_replicas` links carries
    X / replicas prompts/s, each holding it `busy` seconds), both `closed_wait`s."""
    return (
        closed_wait(t_pf, X / cap_pf, C),
        closed_wait(busy, X * busy / d.prefill_replicas, C),
    )


# --------------------------------------------------------------------------------------
# Deployment metrics, cost and the Pareto
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    """What a deployment delivers (arrays over candidates)."""

    ttft_s: Any
    tpot_s: Any
    e2e_s: Any
    requests_per_s: Any
    output_tokens_per_s: Any
    input_tokens_per_s: Any
    tokens_per_s_per_chip: Any
    tokens_per_s_per_user: Any
    chips: Any
    usd_per_million_output_tokens: Any = None
    usd_per_million_input_tokens: Any = None
    # the whole bill over the output tokens (prefill time included): what the cost objective ranks
    usd_bill_per_million_output_tokens: Any = None
    extra: dict = field(default_factory=dict)


def deployment_metrics(
    s: Steady,
    work: Workload,
    chips_per_replica: Any,
    replicas: Any,
    usd_per_chip_hour: float | None,
) -> Metrics:
    """Scale one replica's steady state to the deployment and price it.

    Cost per second of the deployment splits between prefill and decode by the share of the
    replicas' time each takes: $/M input = cost·share_prefill / input tokens/s, $/M output =
    cost·(1 − share) / output tokens/s (their sum is the whole bill).
    """
    rps = s.requests_per_s * replicas
    out_tps = rps * work.gen
    in_tps = rps * work.prompt
    chips = chips_per_replica * replicas
    m = Metrics(
        ttft_s=s.ttft_s,
        tpot_s=s.tpot_s,
        e2e_s=s.e2e_s,
        requests_per_s=rps,
        output_tokens_per_s=out_tps,
        input_tokens_per_s=in_tps,
        tokens_per_s_per_chip=out_tps / chips,
        tokens_per_s_per_user=1.0 / s.tpot_s,
        chips=chips,
    )
    if usd_per_chip_hour is not None:
        usd_s = usd_per_chip_hour * chips / HOUR
        share = np.clip(s.prefill_share, 0.0, 1.0)
        object.__setattr__(m, "usd_per_million_output_tokens", usd_s * (1 - share) / out_tps * 1e6)
        object.__setattr__(m, "usd_per_million_input_tokens", usd_s * share / in_tps * 1e6)
        object.__setattr__(m, "usd_bill_per_million_output_tokens", usd_s / out_tps * 1e6)
    return m


def pareto_front(per_user: Any, per_chip: Any) -> np.ndarray:
    """Indices of the points no other point beats on both tokens/s/user and tokens/s/chip,
    sorted by tokens/s/user (the latency/throughput frontier of applied-inference.md)."""
    u = np.asarray(per_user, float)
    c = np.asarray(per_chip, float)
    ok = np.isfinite(u) & np.isfinite(c)
    idx = np.nonzero(ok)[0]
    order = idx[np.lexsort((-c[idx], -u[idx]))]  # by user speed desc, then chip throughput desc
    front, best = [], -np.inf
    for i in order:
        if c[i] > best:
            front.append(i)
            best = c[i]
    return np.array(sorted(front, key=lambda i: u[i]), dtype=int)


def qps_per_chip(batch: Any, step_s: Any, decode_steps: Any, chips: Any) -> Any:
    """Book applied-inference.md: queries/s per chip = B / (step · median decode steps · N)."""
    return np.asarray(batch, float) / (np.asarray(step_s) * decode_steps * chips)


Objective = Callable[[Metrics], Any]

__all__ = [
    "Disagg",
    "Metrics",
    "Speculation",
    "Steady",
    "Workload",
    "deployment_metrics",
    "disaggregated",
    "load_lengths",
    "pareto_front",
    "qps_per_chip",
    "speculative_tpot",
    "steady_state",
]
