"""Read a measured-runs file and tell which schema it is in, from its content.

Three schemas (the public files ship with the package; `--runs training|inference|serving`
names them):

- `training` (measured_training.yaml): entries with `model`, `hardware`, `parallelism` and a
  `measured` block of training metrics, no `engine`;
- `serving` (measured_serving_aic.yaml): entries with an `engine`, a `workload` with
  `concurrency`, and `measured.ttft_ms` + `measured.tpot_ms` (AIConfigurator's sample);
- `inference` (measured_inference.yaml): other entries with an `engine` (offline throughput,
  online request-rate, fixed-batch latency and fixed-concurrency benchmarks).

A file that is not YAML, not a list of mappings, or mixes schemas is a one-paragraph error.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roofline.errors import SpecError
from roofline.specs.catalog import check_nesting, exists, is_file, read_text_file

DATA_DIR = Path(__file__).parent
BUILTIN = {
    "training": DATA_DIR / "measured_training.yaml",
    "inference": DATA_DIR / "measured_inference.yaml",
    "serving": DATA_DIR / "measured_serving_aic.yaml",
}


class Schema(enum.StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    SERVING = "serving"


@dataclass(frozen=True)
class RunFile:
    path: str
    schema: Schema
    entries: tuple[Any, ...]


MAX_RUNS_FILE_BYTES = 64 * 2**20  # the public serving file is ~0.7 MB; far above any real one


def resolve_path(runs: str | Path) -> Path:
    s = str(runs)
    if s in BUILTIN and not Path(s).exists():
        return BUILTIN[s]
    return Path(s)


def _load_yaml(path: Path) -> Any:
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a pinned dependency
        raise SpecError(
            "reading measured-run files needs PyYAML",
            rule="roofline validate reads YAML",
            fix="pip install pyyaml",
        ) from None
    if not is_file(path) and not exists(path):
        raise SpecError(
            f"runs file {str(path)!r} does not exist",
            rule="--runs is a YAML file of measured runs, or one of " + ", ".join(BUILTIN),
            fix="check the path, or write --runs training",
        )
    # one checked reader: no directories, devices (/dev/zero never ends) or giant files
    text = read_text_file(path, "measured-runs", max_bytes=MAX_RUNS_FILE_BYTES)
    check_nesting(text, "measured-runs", path)  # libyaml's C loader would segfault
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise SpecError(
            f"runs file {str(path)!r} is not valid YAML{at}",
            rule="a runs file is a YAML list of entries (see shared/reference/measured_training.yaml)",
            fix="fix the syntax at the line named",
        ) from None


def entry_schema(e: Any) -> Schema | None:
    """The schema one entry belongs to (None if it is not a mapping)."""
    if not isinstance(e, dict):
        return None
    if "engine" not in e:
        return Schema.TRAINING
    meas = e.get("measured") if isinstance(e.get("measured"), dict) else {}
    work = e.get("workload") if isinstance(e.get("workload"), dict) else {}
    if "concurrency" in work and "ttft_ms" in meas and "tpot_ms" in meas:
        return Schema.SERVING
    return Schema.INFERENCE


def detect_schema(entries: list[Any], origin: str) -> Schema:
    kinds = {k for k in (entry_schema(e) for e in entries) if k is not None}
    if not kinds:
        raise SpecError(
            f"runs file {origin!r} has no entries that are mappings",
            rule="each entry is a mapping with id, model, hardware, ... and measured",
            fix="see shared/reference/measured_training.yaml for the schema",
        )
    if Schema.TRAINING in kinds and len(kinds) > 1:
        raise SpecError(
            f"runs file {origin!r} mixes training entries (no `engine`) with inference/serving entries",
            rule="one file holds one kind of measurement",
            fix="split the file into training and serving runs",
        )
    if kinds == {Schema.SERVING}:
        return Schema.SERVING
    return Schema.TRAINING if kinds == {Schema.TRAINING} else Schema.INFERENCE


def load_runs(runs: str | Path) -> RunFile:
    """Read a runs file (or a built-in name) and detect its schema."""
    path = resolve_path(runs)
    data = _load_yaml(path)
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        data = data["runs"]
    if not isinstance(data, list):
        raise SpecError(
            f"runs file {str(path)!r} holds a {type(data).__name__}, not a list of runs",
            rule="a runs file is a YAML list of entries (or a mapping with a `runs:` list)",
            fix="make the top level a list: `- id: ...`",
        )
    return RunFile(str(path), detect_schema(data, str(path)), tuple(data))
