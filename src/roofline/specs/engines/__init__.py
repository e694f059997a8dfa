"""Serving-engine profiles as data: what a stack (vLLM, SGLang, TensorRT-LLM, JetStream) does
around the model's forward pass.

A profile says how the engine batches (prefill chunks mixed into decode steps, or prefill-first
batches of their own; the token budget per step; the cap on running sequences), what host work
stays on the critical path (per-step scheduler time unless it is overlapped with the GPU, kernel
launches beyond the largest captured CUDA graph), and how much memory it gives the KV cache. Every
number in `specs/engines/<name>.toml` carries its source; "estimate" marks a documented guess.
The physics of the kernels themselves lives in the efficiency profile, not here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from roofline.errors import SpecError
from roofline.specs.catalog import read_toml, resolve
from roofline.specs.filecache import cached
from roofline.specs.filecache import read_toml as stamped_toml
from roofline.specs.schema import check as check_schema

ENGINE_DIR = Path(__file__).parent
_FRACTION_OF = ("total", "static", "free_after_weights")


@dataclass(frozen=True)
class EngineProfile:
    """One serving engine's scheduling, overheads and memory policy (see the module doc)."""

    name: str
    display: str
    version: str
    source: str
    vendors: tuple[str, ...]
    mixed_prefill_decode: bool  # prefill chunks ride in the decode step's forward pass
    chunked_prefill: bool  # long prompts are split across steps by the token budget
    max_num_batched_tokens: int  # token budget of one step (prefill chunk + decodes)
    max_num_seqs: int  # cap on running sequences (one scheduler's)
    # attention data parallelism: each DP rank runs its own scheduler with the full max_num_seqs
    # and token budget (vLLM's DP engine cores, TensorRT-LLM's attention-DP ranks); false: the
    # settings are the replica's, divided over its ranks (SGLang --enable-dp-attention)
    scheduler_per_dp_rank: bool
    overlap_scheduling: bool  # host scheduling of step n+1 hidden behind step n
    # a closed loop of fixed lengths stays in step: on a prefill-first engine in lockstep waves
    # (every wave prefilled before anyone decodes), on a mixed engine in cohorts (the prompts
    # that finish together share their next prefill pass); false: its cohorts drift apart and
    # each prefill pass holds the prompts that arrived since the last (serving/steady.py)
    closed_loop_lockstep: bool
    step_overhead_s: float  # exposed host time per step
    cuda_graphs: bool
    max_graph_batch: int  # largest decode batch replayed from a captured graph
    eager_launch_s_per_layer: float  # host launch time per layer beyond max_graph_batch
    # of the HBM for weights + workspace + KV ("total"), of the HBM for weights + KV only, the
    # workspace living in the rest ("static"), or of what weights and workspace leave
    # ("free_after_weights")
    memory_fraction: float
    memory_fraction_of: str
    kv_block_tokens: int  # KV cache page size: a sequence's cache rounds up to whole blocks
    prefix_caching: bool
    disaggregated: bool
    speculative: bool
    tensor_parallel_allreduce: str
    aliases: tuple[str, ...] = ()
    max_num_batched_tokens_large_hbm: int | None = None  # budget on GPUs with >= 160 GB
    max_graph_batch_small_tp: int | None = None  # graph cap when tp < 4
    # the KV-cache dtype the engine runs when none is stated, for checkpoints whose weights are
    # in `quantized_kv_weights` (ModelOpt FP8/NVFP4 checkpoints declare an FP8 KV cache)
    quantized_kv_dtype: str = ""
    quantized_kv_weights: tuple[str, ...] = ()
    # the running-sequence cap where it is held apart from the other scheduler settings: true,
    # each attention-DP rank admits max_num_seqs (SGLang's default cap is sized per rank from
    # its own request pool, though its token budget is the replica's); None: as
    # scheduler_per_dp_rank
    max_num_seqs_per_dp_rank: bool | None = None
    # latency every request pays between the client and the scheduler outside any pass (front
    # end, hand-over to the scheduler, first token back to the client); 0 where none is recorded
    request_latency_s: float = 0.0
    # exposed host time per running sequence per step, on top of step_overhead_s: per-request
    # work the engine's loop does serially with the GPU (TensorRT-LLM's TorchSampler request
    # updates after the sampler's event, trtllm.toml [sampler]); per attention-DP rank, each
    # rank's loop handling its own sequences; 0 where none is recorded
    seq_overhead_s: float = 0.0
    # memory the engine's KV sizing finds taken that is neither weights, KV nor the activation
    # workspace (CUDA context and the driver's reservation, library workspaces, runtime buffers),
    # per chip; and what the collectives' buffers (NCCL, custom all-reduce) add on a replica of
    # more than one chip.
    # Both come off the chip's HBM before the memory fraction applies (`kv_memory_bytes`)
    runtime_memory_bytes: float = 0.0
    collective_memory_bytes: float = 0.0
    # the defaults of older releases where they differ from the file's (the current release's):
    # ((major, minor), ((field, value), ...)) for releases before that version, newest first
    # (the file's `[before."X.Y"]` tables; `at_version` applies them)
    before: tuple = field(default=(), repr=False)

    def at_version(self, version: str) -> EngineProfile:
        """The profile as release `version` ships it: every `[before."X.Y"]` table whose X.Y is
        above `version` overrides the file's values, the oldest table last. A version that does
        not read as X.Y ('not stated', a nightly build) gets the file's (current) defaults."""
        v = version_key(version)
        if v is None or not self.before:
            return self
        changes: dict[str, Any] = {}
        for key, items in self.before:  # newest first: an older table overrides a newer one
            if v < key:
                changes.update(dict(items))
        return replace(self, **changes) if changes else self

    def kv_dtype_for(self, weights: str) -> str:
        """The KV dtype for a checkpoint with `weights` when the run does not say (bf16 unless
        the engine loads such checkpoints with a quantised KV cache)."""
        if self.quantized_kv_dtype and weights in self.quantized_kv_weights:
            return self.quantized_kv_dtype
        return "bf16"

    def token_budget(self, hbm_bytes: float, dp: Any = 1) -> Any:
        """The per-step token budget of one replica of `dp` attention-DP ranks on chips with
        `hbm_bytes` of HBM (each rank's budget × dp where every rank schedules alone)."""
        big = self.max_num_batched_tokens_large_hbm
        one = big if big and hbm_bytes >= 160e9 else self.max_num_batched_tokens
        return one * self.ranks_scheduling(dp)

    def seq_cap(self, dp: Any = 1) -> Any:
        """Running sequences one replica of `dp` attention-DP ranks admits (issue 18 item 2:
        the cap is per scheduler, and with attention DP each rank has one)."""
        if self.max_num_seqs_per_dp_rank is None:
            return self.max_num_seqs * self.ranks_scheduling(dp)
        return self.max_num_seqs * (np.maximum(dp, 1) if self.max_num_seqs_per_dp_rank else 1)

    def ranks_scheduling(self, dp: Any) -> Any:
        """Schedulers in a replica of `dp` attention-DP ranks that each hold the full settings
        (vectorised over `dp`)."""
        return np.maximum(dp, 1) if self.scheduler_per_dp_rank else 1

    def graph_batch(self, tp: Any) -> Any:
        """The largest captured decode batch of one rank at tensor parallelism `tp` (vectorised)."""
        small = self.max_graph_batch_small_tp
        if not small:
            return self.max_graph_batch
        return np.where(np.asarray(tp) < 4, small, self.max_graph_batch)

    def kv_memory_bytes(
        self, hbm_bytes: Any, weight_bytes: Any, reserve_bytes: Any, ranks: Any = 1
    ) -> Any:
        """Bytes the engine gives the KV cache on one chip of a replica of `ranks` chips
        (vectorised): its
        memory fraction of the HBM (or of what the weights leave), less the weights and the
        activation workspace. The one home of the KV pool's size.

        `hbm_bytes` is the chip's total as nvidia-smi/rocm-smi report it (`Chip.fit_hbm_bytes`);
        what the engine measures as free or total is less by the runtime's own memory
        (`runtime_memory_bytes`, plus `collective_memory_bytes` when the replica spans more than
        one chip), taken before the
        fraction applies, as the engines measure it (the engine files give each term's source)."""
        runtime = self.runtime_memory_bytes + np.where(
            np.asarray(ranks) > 1, self.collective_memory_bytes, 0.0
        )
        hbm = hbm_bytes - runtime
        if self.memory_fraction_of == "total":  # weights, workspace and KV inside the fraction
            return hbm * self.memory_fraction - weight_bytes - reserve_bytes
        if self.memory_fraction_of == "static":  # weights and KV only: the rest holds the workspace
            return hbm * self.memory_fraction - weight_bytes
        return (hbm - weight_bytes - reserve_bytes) * self.memory_fraction

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_SECTIONS = ("scheduler", "graphs", "memory", "features", "kv")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def version_key(version: str) -> tuple[int, int] | None:
    """(major, minor) of a release string ('0.18.0', 'v0.11.2'); None where it has none ('not
    stated', 'nightly-5b8c30d6')."""
    m = _VERSION.match(str(version).strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _before(raw: dict, flat: dict, origin: str) -> tuple:
    """The file's `[before."X.Y"]` tables as EngineProfile.before, each checked: its key a
    release, its entries fields of the profile whose values pass the same rules."""
    out = []
    names = {f.name for f in fields(EngineProfile)} - {"before", "name", "aliases"}
    for ver, table in raw.get("before", {}).items():
        key = version_key(ver)
        if key is None or not isinstance(table, dict):
            raise SpecError(
                f"engine file {origin}: [before.{ver!r}] is not a release's table",
                rule='a [before."X.Y"] table names a release X.Y and holds profile fields',
                fix='write the release as "0.14"',
            )
        unknown = sorted(set(table) - names)
        if unknown:
            raise SpecError(
                f"engine file {origin}: [before.{ver!r}] sets {unknown[0]!r}",
                rule="a [before] table overrides fields of the engine profile only",
                fix=f"remove {unknown[0]!r} or name a field of the profile",
            )
        _check({**flat, **table}, f"{origin} [before.{ver!r}]")
        out.append((key, tuple(sorted(table.items()))))
    return tuple(sorted(out, reverse=True))


def engine_from_dict(raw: dict, origin: str) -> EngineProfile:
    """Flatten the TOML sections and validate every field (the file, the rule and a fix)."""
    # keys (each section holds exactly its EngineProfile fields), types and tables are the
    # schema's; the rules below are presence, ranges and the fraction's basis
    check_schema("engine", raw, origin)
    flat: dict[str, Any] = {k: v for k, v in raw.items() if k not in (*_SECTIONS, "before")}
    for sec in _SECTIONS:
        flat.update(raw.get(sec, {}))
    missing = [
        f.name for f in fields(EngineProfile) if f.default is not None and f.name not in flat
    ]
    optional = (
        "aliases",
        "quantized_kv_dtype",
        "quantized_kv_weights",
        "request_latency_s",
        "seq_overhead_s",
        "runtime_memory_bytes",
        "collective_memory_bytes",
    )
    missing = [m for m in missing if m not in (*optional, "before")]
    if missing:
        raise SpecError(
            f"engine file {origin} lacks {missing[0]!r}",
            rule="every EngineProfile field without a default is required",
            fix=f"add `{missing[0]} = ...` to its section",
        )
    for k in ("vendors", "aliases", "quantized_kv_weights"):
        flat[k] = tuple(flat.get(k, ()))
    _check(flat, origin)
    flat["before"] = _before(raw, flat, origin)
    return EngineProfile(**flat)


def _check(d: dict, origin: str) -> None:
    def bad(key: str, rule: str) -> SpecError:
        return SpecError(
            f"engine file {origin}: {key} = {d[key]!r}", rule=rule, fix=f"correct {key}"
        )

    for k in ("max_num_batched_tokens", "max_num_seqs", "max_graph_batch", "kv_block_tokens"):
        if not isinstance(d[k], int) or isinstance(d[k], bool) or d[k] < 1:
            raise bad(k, f"{k} is a positive whole number")
    for k, what in (
        ("step_overhead_s", "time in seconds"),
        ("eager_launch_s_per_layer", "time in seconds"),
        ("request_latency_s", "time in seconds"),
        ("seq_overhead_s", "time in seconds"),
        ("runtime_memory_bytes", "byte count"),
        ("collective_memory_bytes", "byte count"),
    ):
        v = d.get(k, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise bad(k, f"{k} is a finite {what}, >= 0")
    v = d["memory_fraction"]
    if not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise bad("memory_fraction", "memory_fraction is in (0, 1]")
    if d["memory_fraction_of"] not in _FRACTION_OF:
        raise bad("memory_fraction_of", "memory_fraction_of is one of " + ", ".join(_FRACTION_OF))


@cache
def _catalog() -> dict[str, tuple[Path, tuple[str, ...]]]:
    out = {}
    for p in sorted(ENGINE_DIR.glob("*.toml")):
        raw = read_toml(p, "engine")
        out[raw["name"]] = (p, tuple(raw.get("aliases", ())))
    return out


def engine_names() -> list[str]:
    return list(_catalog())


@cache
def _load_named(key: str) -> EngineProfile:
    path, _ = _catalog()[key]
    return engine_from_dict(read_toml(path, "engine"), str(path))


def load_engine(name_or_path: str | Path | EngineProfile) -> EngineProfile:
    """An engine profile from a catalog name ('vllm', 'SGLang', 'TensorRT-LLM') or a TOML path."""
    if isinstance(name_or_path, EngineProfile):
        return name_or_path
    s = str(name_or_path)
    if s.endswith(".toml"):
        return cached(("engine", s), lambda: engine_from_dict(stamped_toml(s, "engine"), s))
    return _load_named(resolve(s, {k: v[1] for k, v in _catalog().items()}, "engine"))


__all__ = ["EngineProfile", "engine_from_dict", "engine_names", "load_engine", "version_key"]
