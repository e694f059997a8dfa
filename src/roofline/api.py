"""The Python API for what the CLI does beyond the re-exported building blocks: serving (one
decode step, the deployment search), validate and calibrate, as functions with typed results;
the book's other questions — limits, op, transfer, collective, train — as `Answer`s that hold
the command's document.

Each function runs the command itself in-process (`roofline <command> ... --json`, its options
turned into argv by `web.documents.argv_for`, as the report page and the UI do), so a result holds exactly the document the
terminal would print (`.document`, versioned as docs/json.md says) and cannot disagree with
the CLI; the typed fields are read from it. Options are the command's own, by their long names
with underscores (`slo_ttft="2s"`, `weight_dtype="int8"`); an unknown one is a SpecError naming
the options there are, and bad values get the command's own one-paragraph error.

    >>> import roofline as rl
    >>> step = rl.serve_step("llama-3-70b", "tpu-v5e:4x2", "tp=8", batch=32, context=8192,
    ...                      weight_dtype="int8", kv_dtype="int8", profile="peak")
    >>> step.bound, round(step.step_time_s * 1e3, 1)
    ('memory', 19.2)

docs/api.md walks through every function. Import/export of plans and profiles is not here yet
(another change adds it; it will get its function here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roofline.units import fmt_time


def _document(command: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """`roofline <command>` with these options, run in-process and never cached (a file or a
    device may change between calls): its --json document."""
    import contextlib
    import io
    import json

    from roofline.cli import build_parser
    from roofline.errors import SpecError
    from roofline.web.documents import argv_for

    argv = argv_for(command, {k: v for k, v in values.items() if v is not None})
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = build_parser(command).parse_args([command, *argv, "--json"])
        except SystemExit:
            msg = (err.getvalue().strip().splitlines() or ["the options could not be read"])[-1]
            raise SpecError(
                f"roofline {command} {' '.join(argv)}: {msg.split(': error: ', 1)[-1]}",
                rule=f"the options are those of `roofline {command} --help`",
                fix="correct or remove that option",
            ) from None
        args._run(args)
    return json.loads(out.getvalue())


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def _time(x: float | None) -> str:
    return "-" if x is None else fmt_time(x)


# --- serving ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeChoice:
    """One serving deployment the search costed: a replica's plan, its batch and dtypes, and
    what it delivers (per replica; the search's document row)."""

    plan: str
    batch: float
    quant: str
    ttft_s: float | None
    tpot_s: float | None
    tokens_per_s_per_chip: float | None
    tokens_per_s_per_user: float | None
    system: str | None = None
    usd_per_million_output_tokens: float | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ServeChoice:
        q = row.get("quant") or {}
        return cls(
            plan=str((row.get("plan") or {}).get("spec", "")),
            batch=float(row.get("batch") or 0),
            quant="/".join(str(q.get(k, "?")) for k in ("weights", "kv", "compute")),
            ttft_s=_f(row.get("ttft_s")),
            tpot_s=_f(row.get("tpot_s")),
            tokens_per_s_per_chip=_f(row.get("tokens_per_s_per_chip")),
            tokens_per_s_per_user=_f(row.get("tokens_per_s_per_user")),
            system=row.get("system"),
            usd_per_million_output_tokens=_f(row.get("usd_per_million_output_tokens")),
        )

    def __repr__(self) -> str:
        where = f" on {self.system}" if self.system else ""
        chip = self.tokens_per_s_per_chip
        return (
            f"ServeChoice({self.plan}{where}, batch {self.batch:g}, {self.quant}: "
            f"TTFT {_time(self.ttft_s)}, TPOT {_time(self.tpot_s)}, "
            f"{'-' if chip is None else f'{chip:,.1f}'} tok/s/chip)"
        )


@dataclass(frozen=True)
class ServeSearch:
    """`roofline serve` (the search): the best deployment under the targets, the top ones, the
    Pareto front of tokens/s/user against tokens/s/chip, and why candidates were rejected."""

    model: str
    system: str
    best: ServeChoice | None
    top: tuple[ServeChoice, ...]
    pareto: tuple[ServeChoice, ...]
    rejections: Mapping[str, int]
    candidates: int
    disaggregated: Mapping[str, Any] | None
    document: Mapping[str, Any] = field(repr=False, compare=False)

    def __repr__(self) -> str:
        best = repr(self.best) if self.best else "no plan meets the targets"
        return (
            f"ServeSearch({self.model} on {self.system}: {self.candidates} candidates; best {best})"
        )


def serve_search(
    model: str = "llama-3-70b", system: str = "tpu-v5e:16x16", **options: Any
) -> ServeSearch:
    """Search serving deployments as `roofline serve` does (prompt, gen, concurrency or rate,
    slo_ttft, slo_tpot, objective, engine, profile, dtypes: the command's options)."""
    doc = _document("serve", {"model": model, "system": system, **options})
    if "top" not in doc:
        from roofline.errors import SpecError

        raise SpecError(
            "serve_search was given batch/context: that is one decode step",
            rule="the search sizes the batch itself; batch and context cost one step",
            fix="call serve_step(model, system, plan, batch=..., context=...)",
        )
    inputs = doc.get("inputs") or {}
    return ServeSearch(
        model=str(inputs.get("model", model)),
        system=str(inputs.get("system", system)),
        best=ServeChoice.from_row(doc["best"]) if doc.get("best") else None,
        top=tuple(ServeChoice.from_row(r) for r in doc.get("top") or ()),
        pareto=tuple(ServeChoice.from_row(r) for r in doc.get("pareto") or ()),
        rejections=dict(doc.get("rejections") or {}),
        candidates=int(doc.get("candidates_evaluated") or 0),
        disaggregated=doc.get("disaggregated"),
        document=doc,
    )


@dataclass(frozen=True)
class ServeStep:
    """`roofline serve --plan P --batch B --context C`: one decode step with its arithmetic."""

    model: str
    system: str
    plan: str
    batch: int
    context: float
    step_time_s: float
    ttft_s: float
    tokens_per_s: float
    tokens_per_s_per_chip: float
    tokens_per_s_per_user: float
    bound: str
    memory_per_chip_bytes: float
    max_batch: float
    usd_per_million_output_tokens: float | None
    document: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def tpot_s(self) -> float:
        """Time per output token: one decode step (TPOT excludes the first token)."""
        return self.step_time_s

    def __repr__(self) -> str:
        return (
            f"ServeStep({self.model} {self.plan} on {self.system}, batch {self.batch}, context "
            f"{self.context:g}: step {fmt_time(self.step_time_s)} ({self.bound}-bound), "
            f"{self.tokens_per_s:,.0f} tok/s, TTFT {fmt_time(self.ttft_s)})"
        )


def serve_step(
    model: str, system: str, plan: str, *, batch: int, context: int | str, **options: Any
) -> ServeStep:
    """Cost one decode step of `batch` sequences at KV length `context` on one replica of
    `plan` (weight_dtype, kv_dtype, compute_dtype, profile, engine, draft...: serve's options)."""
    values = {"model": model, "system": system, "plan": plan, "batch": batch, "context": context}
    doc = _document("serve", {**values, **options})
    inputs = doc.get("inputs") or {}
    return ServeStep(
        model=str(inputs.get("model", model)),
        system=str(inputs.get("system", system)),
        plan=str(doc["plan"]["spec"]),
        batch=int(doc["batch"]),
        context=float(doc["context"]),
        step_time_s=float(doc["step_time_s"]),
        ttft_s=float(doc["ttft_s"]),
        tokens_per_s=float(doc["tokens_per_s"]),
        tokens_per_s_per_chip=float(doc["tokens_per_s_per_chip"]),
        tokens_per_s_per_user=float(doc["tokens_per_s_per_user"]),
        bound=str(doc["bound"]),
        memory_per_chip_bytes=float(doc["memory_per_chip_bytes"]),
        max_batch=float(doc["max_batch"]),
        usd_per_million_output_tokens=_f(doc.get("usd_per_million_output_tokens")),
        document=doc,
    )


# --- the book's other questions: limits, op, transfer, collective, train ----------------


@dataclass(frozen=True)
class Answer:
    """`roofline <command> ... --json` run in-process: its document (`.document`, as
    docs/json.md says), read by key (`answer["limits"]`); the command's own words are its
    `explanation` lines wherever the document has them."""

    command: str
    document: Mapping[str, Any] = field(repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.document[key]

    def __contains__(self, key: object) -> bool:
        return key in self.document

    def keys(self) -> Any:
        return self.document.keys()

    def __repr__(self) -> str:
        keys = [k for k in self.document if k not in ("schema_version", "command", "inputs")]
        more = f", ... ({len(keys)} keys)" if len(keys) > 6 else ""
        return f"Answer(roofline {self.command}: {', '.join(keys[:6])}{more})"


def _answer(command: str, values: Mapping[str, Any]) -> Answer:
    return Answer(command=command, document=_document(command, values))


def limits_query(system: str, model: str | None = None, **options: Any) -> Answer:
    """`roofline limits`: the book's closed-form limits on `system` (of `model` where given;
    strategy — fsdp, tp, fsdp+tp, ep, decode, ... —, batch, plan, dtypes: its options)."""
    return _answer("limits", {"model": model, "system": system, **options})


def op_query(expr: str, **options: Any) -> Answer:
    """`roofline op`: one operation's roofline against each memory level of the chip
    (dims, chip: the command's options)."""
    return _answer("op", {"expr": expr, **options})


def transfer_query(system: str, **options: Any) -> Answer:
    """`roofline transfer`: a point-to-point transfer (`bytes`, `src` — `--from`, "host" for
    a load from host memory — and `dst`), a many-to-one gather (`gather_to`), or the network's
    capacities (`capacities=True`)."""
    names = {"from_": "src", "from": "src", "to": "dst"}
    values = {names.get(k, k): v for k, v in options.items()}
    return _answer("transfer", {"system": system, **values})


def collective_query(kind: str, **options: Any) -> Answer:
    """`roofline collective`: one collective's time (array or bytes, sharding, over, mesh or
    system, sharp, ragged: the command's options), DCN and switch capacities included."""
    return _answer("collective", {"kind": kind, **options})


def serve_query(model: str | None = None, system: str | None = None, **options: Any) -> Answer:
    """`roofline serve` with any of its options, as a document: what `serve_search` and
    `serve_step` do not type — a deployment sized from given step times (prefill_step_s,
    decode_step_s, rate), a sequence-sharded KV cache (kv_seq)."""
    return _answer("serve", {"model": model, "system": system, **options})


def train_query(model: str, system: str, **options: Any) -> Answer:
    """`roofline train`: the planner's search, or one `plan` costed (batch_tokens, seq, tokens,
    framework, offload_optimizer, offload_activations, ...: the command's options); the
    document holds the pipeline's communication (`pipeline_comm`) and any offload."""
    return _answer("train", {"model": model, "system": system, **options})


# --- validate --------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """Prediction error over a set of measured runs (error = predicted / measured - 1)."""

    n: int
    n_total: int
    median_abs_error: float | None
    bias: float | None
    within_10: float | None
    within_20: float | None

    @classmethod
    def from_summary(cls, s: Mapping[str, Any]) -> Score:
        return cls(
            n=int(s.get("n") or 0),
            n_total=int(s.get("n_total") or 0),
            median_abs_error=_f(s.get("median_abs_error")),
            bias=_f(s.get("bias")),
            within_10=_f(s.get("within_10")),
            within_20=_f(s.get("within_20")),
        )

    def __repr__(self) -> str:
        if not self.n or self.median_abs_error is None:
            return f"Score({self.n}/{self.n_total} covered)"
        bias = "" if self.bias is None else f", bias {self.bias:+.1%}"
        return f"Score({self.n}/{self.n_total} covered: median |error| {self.median_abs_error:.1%}{bias})"


@dataclass(frozen=True)
class Validation:
    """`roofline validate`: the error per metric over the covered runs (never pooled across
    metrics), the profile's held-out error where it records one, and every run's row."""

    schema: str
    profile: str
    scores: Mapping[str, Score]
    held_out: Mapping[str, Any] | None
    runs: tuple[Mapping[str, Any], ...]
    document: Mapping[str, Any] = field(repr=False, compare=False)

    def __repr__(self) -> str:
        scores = "; ".join(f"{k} {v!r}" for k, v in self.scores.items())
        held = ""
        if self.held_out:
            held = "; held out " + ", ".join(
                f"{f['median_abs']:.1%} {what}" for what, f in self.held_out["folds"].items()
            )
        return f"Validation({self.schema}, profile {self.profile}: {scores}{held})"


def validate_runs(runs: str = "training", **options: Any) -> Validation:
    """Predict measured runs (`training`, `inference`, `serving` or a YAML file) and score them
    (profile, framework, planner: validate's options)."""
    doc = _document("validate", {"runs": runs, **options})
    summary = doc.get("summary") or {}
    if "n" in summary:  # training: one metric, tokens/s per chip
        scores = {"tokens_per_s_per_chip": Score.from_summary(summary)}
    else:
        scores = {k: Score.from_summary(v) for k, v in summary.items()}
    used = (doc.get("inputs") or {}).get("profile_used") or {}
    return Validation(
        schema=str((doc.get("inputs") or {}).get("schema", "")),
        profile=str(used.get("name", "?")),
        scores=scores,
        held_out=doc.get("held_out"),
        runs=tuple(doc.get("runs") or ()),
        document=doc,
    )


# --- calibrate -------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """`roofline calibrate`: the fitted profile (as the document holds it) and the files written."""

    mode: str  # "device" or "runs"
    profile: Mapping[str, Any]
    written: tuple[str, ...]
    document: Mapping[str, Any] = field(repr=False, compare=False)

    def __repr__(self) -> str:
        where = f", written to {', '.join(self.written)}" if self.written else ""
        return f"Calibration({self.mode}: profile {self.profile.get('name', '?')!r}{where})"


def calibrate_profile(
    *, device: bool = False, from_runs: str | None = None, **options: Any
) -> Calibration:
    """Fit the efficiency profile on the local accelerator (`device=True`, `quick=True` for
    seconds) or on measured runs (`from_runs="training"` or `"serving"`); `out=` writes it."""
    doc = _document("calibrate", {"device": device or None, "from_runs": from_runs, **options})
    prof = doc.get("profile") or {}
    written = doc.get("written") or ([options["out"]] if options.get("out") else [])
    return Calibration(
        mode="device" if device else "runs",
        profile=prof if isinstance(prof, Mapping) else {"name": str(prof)},
        written=tuple(str(w) for w in written),
        document=doc,
    )


__all__ = [
    "Calibration",
    "Score",
    "ServeChoice",
    "ServeSearch",
    "ServeStep",
    "Validation",
    "calibrate_profile",
    "serve_search",
    "serve_step",
    "validate_runs",
]
