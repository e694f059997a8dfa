"""argv generators, one per command family, shared by the fuzz tests and `survey.py`."""

from __future__ import annotations

import atexit
import functools
import itertools
import shutil
import tempfile
from pathlib import Path

import fuzz_strategies as S
from hypothesis import strategies as st

_TMP = Path(tempfile.mkdtemp(prefix="roofline-fuzz-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)  # generated files go with the process
_counter = itertools.count()


def write_file(content: str | bytes, suffix: str) -> str:
    """Write one generated spec file under a per-process temp dir and return its path."""
    p = _TMP / f"case{next(_counter)}{suffix}"
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return str(p)


_json = st.sampled_from([[], [], ["--json"]])


@st.composite
def chip_argv(draw) -> list[str]:
    return ["chip", draw(S.name_of(S.CHIPS + S.CHIP_ALIASES)), *draw(_json)]


@st.composite
def listing_argv(draw) -> list[str]:
    return [draw(st.sampled_from(["chips", "models", "system"])), *draw(_json)]


@st.composite
def model_argv(draw) -> list[str]:
    argv = ["model", draw(S.name_of(S.SMALL_MODELS))]
    for flag in ("--seq", "--batch", "--kv-seq"):
        if draw(st.booleans()):
            argv += [flag, draw(S.number_text(0, 1 << 16))]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--kv-dtype", draw(st.sampled_from(S.DTYPES + ["bf17"]))]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--weight-dtype", draw(st.sampled_from(S.DTYPES + ["x"]))]
    if draw(st.integers(0, 2)) == 0:
        argv += ["--chip", draw(S.name_of(S.CHIPS))]
    if draw(st.integers(0, 4)) == 0:
        argv += ["--causal", draw(st.sampled_from(["half", "full", "none"]))]
    return argv + draw(_json)


@st.composite
def system_argv(draw) -> list[str]:
    argv = ["system", draw(S.system_spec())]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--price", draw(S.number_text(0, 100))]
    if draw(st.integers(0, 4)) == 0:
        argv += [draw(st.sampled_from(["--sharp", "--wraparound", "--no-wraparound"]))]
    return argv + draw(_json)


@st.composite
def op_argv(draw) -> list[str]:
    expr, dims = draw(S.op_expr())
    argv = ["op", expr, "--dims", dims]
    if draw(st.booleans()):
        argv += ["--chip", draw(S.name_of(S.CHIPS))]
    return argv + draw(_json)


_KINDS = ["all-gather", "AG", "reduce-scatter", "RS", "AR", "all-to-all", "A2A", "permute", "x"]


@st.composite
def collective_argv(draw) -> list[str]:
    argv = ["collective", draw(S.mostly(st.sampled_from(_KINDS[:-1]), st.just("x"), 8))]
    if draw(st.booleans()):
        shape = ",".join(draw(S.number_text(0, 1 << 20)) for _ in range(draw(st.integers(1, 3))))
        argv += ["--array", f"{draw(st.sampled_from(S.DTYPES[:6] + ['q']))}[{shape}]"]
        if draw(st.booleans()):
            argv += [
                "--sharding",
                draw(st.sampled_from(["[B_X, F]", "[B_XY, D]", "[B, F_X]", "[X", "[B_Q]"])),
            ]
    else:
        argv += ["--bytes", draw(S.number_text(0, 1 << 30))]
    if draw(st.booleans()):
        argv += ["--over", draw(st.sampled_from(["X", "XY", "X,Y", "Y", "Z", ""]))]
        argv += [
            "--mesh",
            draw(st.sampled_from(["X=8", "X=4,Y=2", "X=2,Y=2", "X=0", "X=16,Y=16", "Q"])),
        ]
    else:
        argv += ["--over", draw(S.mostly(st.just("X"), st.sampled_from(["XY", "", "x"]), 8))]
    argv += ["--system", draw(S.mostly(S.good_system(), S.system_spec(), 4))]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--ragged", draw(S.number_text(0, 2))]
    if draw(st.integers(0, 4)) == 0:
        argv += ["--sharp", "--sharp-speedup", draw(S.number_text(0, 3))]
    return argv + draw(_json)


@st.composite
def matmul_argv(draw) -> list[str]:
    argv = ["matmul", *draw(S.einsum_case())]
    if draw(st.booleans()):
        argv += ["--backward"]
    return argv + draw(_json)


# -- generated files ---------------------------------------------------------------------------


@st.composite
def model_file_argv(draw) -> list[str]:
    kind = draw(st.integers(0, 5))
    if kind <= 2:
        path = write_file(draw(S.model_toml()), ".toml")
    elif kind <= 4:
        path = write_file(draw(S.hf_json()), ".json")
    else:
        path = write_file(draw(S.raw_bytes()), draw(st.sampled_from([".toml", ".json"])))
    return ["model", path, "--seq", draw(st.sampled_from(["128", "4096", "1"])), *draw(_json)]


@st.composite
def chip_file_argv(draw) -> list[str]:
    content = draw(st.one_of(S.chip_toml(), S.raw_bytes()))
    path = write_file(content, ".toml")
    if draw(st.booleans()):
        return ["chip", path, *draw(_json)]
    return ["system", f"{path}:{draw(st.sampled_from(['8', '16', '4x4']))}", *draw(_json)]


@st.composite
def system_file_argv(draw) -> list[str]:
    path = write_file(draw(st.one_of(S.system_toml(), S.raw_bytes())), ".toml")
    return ["system", path, *draw(_json)]


# -- the other owners' commands (train, serve) ----------------------------------------------------

_PLAN_KEYS = [
    "dp",
    "fsdp",
    "tp",
    "pp",
    "sp",
    "ep",
    "microbatch",
    "remat",
    "zero",
    "schedule",
    "virtual",
]
_PLAN_VALUES = [
    "1",
    "2",
    "4",
    "8",
    "0",
    "-2",
    "3",
    "full",
    "none",
    "ckpt99999999999999999999",
    "interleaved",
    "1f1b",
    "x",
]


_SYSTEMS = {
    "h100:8": 8, "h100:16": 16, "tpu-v5e:4x4": 16, "tpu-v5p:4x4x4": 64, "gb200:72": 72,
    "mi300x:8": 8, "v100:8": 8, "a100:64": 64, "gb300:100": 100, "tpu-7x:4x4x4": 64,
}  # fmt: skip


@st.composite
def plan_text(draw, n_chips: int = 8) -> str:
    if draw(st.integers(0, 3)) == 0:  # pipeline schedules: the virtual-stage edge cases
        pp = draw(st.sampled_from([2, 4]))
        v = draw(st.sampled_from(["0", "-2", "1", "2", "3", "99"]))
        sched = draw(st.sampled_from(["interleaved", "1f1b", "gpipe"]))
        return f"dp={max(n_chips // pp, 1)},pp={pp},schedule={sched},virtual={v}"
    items = [
        f"{draw(st.sampled_from(_PLAN_KEYS))}={draw(st.sampled_from(_PLAN_VALUES))}"
        for _ in range(draw(st.integers(0, 4)))
    ]
    return (
        ",".join(items) if draw(st.integers(0, 9)) else draw(st.sampled_from(["", ",", "dp", "=2"]))
    )


@st.composite
def train_argv(draw, known_issues: bool = True) -> list[str]:
    """`roofline train` cases; known_issues=False leaves out the inputs of open findings
    (docs/fuzz-findings.md), so the tier guards everything else until those are fixed."""
    system = draw(st.sampled_from(sorted(_SYSTEMS)))
    argv = [
        "train",
        "--model",
        draw(st.sampled_from(["tiny-llama", "book-tf-q1", "llama-3-8b"])),
        "--system",
        system,
    ]
    batches = ["1Mi", "4Mi", "4096", "0", "-1", "1e30", "nan"] + (
        ["1M", "4M"] if known_issues else []
    )
    if draw(st.booleans()):
        argv += ["--batch-tokens", draw(st.sampled_from(batches))]
    if draw(st.booleans()):
        argv += ["--seq", draw(st.sampled_from(["2048", "4096", "0", "1e308", "4096.5"]))]
    if draw(st.integers(0, 2)) == 0:
        plan = draw(plan_text(_SYSTEMS[system]))
        if known_issues or not (
            "interleaved" in plan and "virtual=0" in plan or "virtual=-" in plan
        ):
            argv += ["--plan", plan]
    if draw(st.integers(0, 4)) == 0:
        mfu = draw(S.number_text(0, 2))
        if known_issues or _in_unit_interval(mfu):
            argv += ["--assume-mfu", mfu]
    if draw(st.integers(0, 5)) == 0:
        argv += [
            "--efficiency",
            draw(
                st.sampled_from([".", "/dev/null", write_file(draw(S.efficiency_toml()), ".toml")])
            ),
        ]
    if draw(st.integers(0, 5)) == 0:
        argv += ["--offload-optimizer"]
    if not known_issues and system.startswith(("gb200", "gb300", "tpu-7x")):
        argv += ["--price", "3.0"]  # F5: unpriced chips print $nan / NaN per-token costs
    if draw(st.integers(0, 3)) == 0:  # default: auto (the chip's reference stack)
        stacks = ["auto", "AUTO", "ideal", "megatron", "maxtext", "torchtitan", "deepspeed"]
        argv += ["--framework", draw(st.sampled_from([*stacks, "llm-foundry", "bogus", ""]))]
    return argv + draw(_json)


def _in_unit_interval(text: str) -> bool:
    try:
        return 1e-3 <= float(text) <= 1.0
    except ValueError:
        return True  # unreadable: refused before any arithmetic


@st.composite
def validate_argv(draw) -> list[str]:
    path = write_file(draw(S.runs_yaml()), ".yaml")
    argv = ["validate", "--runs", path]
    if draw(st.integers(0, 3)) == 0:
        argv += [
            "--framework",
            draw(st.sampled_from(["auto", "none", "megatron", "maxtext", "bogus"])),
        ]
    return argv + draw(_json)


@st.composite
def serve_argv(draw) -> list[str]:
    """`roofline serve` (issue 11): the one-step mode and the planner, small models."""
    argv = [
        "serve",
        "--model",
        draw(
            S.mostly(
                st.sampled_from(["tiny-llama", "llama-3-8b", "mixtral-8x7b"]),
                S.name_of(S.SMALL_MODELS),
                6,
            )
        ),
    ]
    if draw(st.booleans()):
        argv += [
            "--system",
            draw(
                S.mostly(
                    st.sampled_from(["h100:8", "tpu-v5e:4x2", "b200:8", "mi300x:8", "h100:1"]),
                    S.system_spec(),
                    5,
                )
            ),
        ]
    else:
        argv += ["--chip", draw(S.name_of(["h100", "tpu-v5e", "b200"]))]
    if draw(st.integers(0, 2)) == 0:  # the book's one-step mode
        argv += [
            "--plan",
            draw(st.sampled_from(["tp=8", "tp=4", "tp=2,dp=4", "tp=1", "ep=8", "tp=0", "x"])),
        ]
        argv += [
            "--batch",
            draw(S.number_text(0, 512)),
            "--context",
            draw(S.number_text(0, 1 << 17)),
        ]
    else:
        argv += ["--prompt", draw(S.number_text(0, 8192)), "--gen", draw(S.number_text(0, 2048))]
        if draw(st.booleans()):
            argv += [
                draw(st.sampled_from(["--concurrency", "--rate"])),
                draw(S.number_text(0, 256)),
            ]
        for flag, val in (
            ("--slo-ttft", ["2s", "500ms", "0", "-1", "nan", "1e308"]),
            ("--slo-tpot", ["50ms", "10ms", "0", "x"]),
        ):
            if draw(st.integers(0, 3)) == 0:
                argv += [flag, draw(st.sampled_from(val))]
        if draw(st.integers(0, 3)) == 0:
            argv += [
                "--objective",
                draw(st.sampled_from(["cost", "throughput", "latency", "speed"])),
            ]
    for flag in ("--weight-dtype", "--kv-dtype", "--compute-dtype"):
        if draw(st.integers(0, 4)) == 0:
            argv += [
                flag,
                draw(
                    st.sampled_from(
                        ["bf16", "fp8", "int8", "int4", "nvfp4", "mxfp4", "fp8_block", "bf17"]
                    )
                ),
            ]
    return argv + _serve_options(draw) + draw(_json)


def _serve_options(draw) -> list[str]:
    argv = []
    if draw(st.integers(0, 5)) == 0:
        argv += ["--prefix-hit", draw(st.sampled_from(["0", "0.5", "1", "1.5", "-0.1", "nan"]))]
    if draw(st.integers(0, 6)) == 0:
        argv += ["--acceptance", draw(st.sampled_from(["0.7", "0", "1", "2", "nan"]))]
    if draw(st.integers(0, 6)) == 0:
        argv += ["--price", draw(S.number_text(0, 100))]
    if draw(st.integers(0, 11)) == 11:  # a chart (matplotlib: slow), every kind of path
        suffix = draw(st.sampled_from([".png", ".svg", ".bogus"]))
        argv += ["--plot", out_path(draw(st.sampled_from(_OUTS)), suffix)]
    return argv


# -- the commands of issues 19-21: import, export, limits, transfer, serve's given steps ---------

STACKS = ["torchtitan", "maxtext", "megatron", "nemo", "deepspeed", "vllm", "sglang", "trtllm"]


@st.composite
def import_argv(draw) -> list[str]:
    """`roofline import`: every stack's launch files, mutated or malformed, with or without a
    system to cost them on."""
    content, suffix = draw(S.launch_file())
    argv = ["import", write_file(content, suffix)]
    # `== last`, not `== 0`: Hypothesis starts from (and shrinks to) 0, which would add the
    # flags that refuse most files to most early cases
    if draw(st.integers(0, 3)) == 3:
        argv += ["--stack", draw(S.mostly(st.sampled_from(STACKS), st.just("bogus"), 8))]
    where = draw(st.integers(0, 3))
    if where == 0:
        argv += ["--system", draw(S.mostly(S.good_system(), S.system_spec(), 4))]
    elif where == 1:
        argv += ["--chips", draw(S.number_text(0, 4096))]
    if draw(st.integers(0, 4)) == 4:
        argv += ["--model", draw(S.name_of(S.SMALL_MODELS))]
    for flag in ("--seq", "--tokens", "--price"):
        if draw(st.integers(0, 6)) == 6:
            argv += [flag, draw(S.number_text(0, 1 << 20))]
    return argv + draw(_json)


@st.composite
def export_argv(draw) -> list[str]:
    """`roofline export --to STACK`: a given plan, or train's search on a small system."""
    argv = ["export", "--to", draw(S.mostly(st.sampled_from(STACKS), st.just("bogus"), 10))]
    argv += [
        "--model",
        draw(S.mostly(st.sampled_from(["tiny-llama", "book-tf-q1"]), S.name_of(S.SMALL_MODELS), 4)),
    ]
    system = draw(st.sampled_from(["h100:8", "h100:16", "tpu-v5e:4x4", "mi300x:8", "gb200:72"]))
    if draw(st.booleans()):
        argv += ["--plan", draw(plan_text(_SYSTEMS.get(system, 8)))]
        if draw(st.booleans()):
            argv += ["--system", system]
    else:
        argv += ["--system", draw(S.mostly(st.just(system), S.system_spec(), 6)), "--top", "3"]
    for flag, values in (
        ("--batch-tokens", ["1Mi", "4096", "0", "-1", "nan", "1e30"]),
        ("--seq", ["2048", "4096", "0", "4096.5"]),
        ("--steps", ["100", "0", "-1", "1e308", "x"]),
        ("--precision", ["bf16", "fp8", "fp8-delayed", "nvfp4", "fp4", "bogus"]),
        ("--optimizer", ["adam-fp32-master", "adam", "sgd", "bogus"]),
        ("--objective", ["cost", "time"]),
    ):
        if draw(st.integers(0, 4)) == 0:
            argv += [flag, draw(st.sampled_from(values))]
    if draw(st.integers(0, 4)) == 0:
        argv += ["--out", out_path(draw(st.sampled_from(_OUTS)), ".txt")]
    return argv + draw(_json)


@st.composite
def limits_argv(draw) -> list[str]:
    """`roofline limits`: the book's closed-form limits, every strategy, batches and plans."""
    argv = ["limits", "--model", draw(S.name_of(S.SMALL_MODELS + ["llama-3-70b", "deepseek-v3"]))]
    argv += ["--system", draw(S.mostly(S.good_system(), S.system_spec(), 4))]
    if draw(st.booleans()):
        argv += ["--batch", draw(S.number_text(0, 1 << 24))]
    if draw(st.integers(0, 2)) == 0:
        strategies = ["fsdp", "tp", "fsdp+tp", "zero3+pp", "decode"]
        argv += ["--strategy", draw(S.mostly(st.sampled_from(strategies), st.just("pp"), 10))]
    if draw(st.integers(0, 2)) == 0:
        argv += ["--plan", draw(plan_text(8))]
    for flag in ("--weight-dtype", "--activation-dtype"):
        if draw(st.integers(0, 4)) == 0:
            argv += [flag, draw(st.sampled_from(S.DTYPES + ["bf17"]))]
    return argv + draw(_json)


def _endpoint(draw) -> str:
    good = st.one_of(
        st.integers(0, 300).map(str),
        st.tuples(st.integers(0, 17), st.integers(0, 17)).map(lambda t: f"{t[0]},{t[1]}"),
        st.sampled_from(["0,0,0", "3,3,3", "host"]),
    )
    bad = st.sampled_from(["-1", "0,", "a,b", "", "99999", "1,2,3,4", "9" * 50, "host,1"])
    return draw(S.mostly(good, bad, 5))


@st.composite
def transfer_argv(draw) -> list[str]:
    """`roofline transfer`: point to point, many-to-one gathers, host loads, tier capacities."""
    argv = ["transfer", "--system", draw(S.mostly(S.good_system(), S.system_spec(), 4))]
    mode = draw(st.integers(0, 3))
    if mode == 3:
        return argv + ["--capacities", *draw(_json)]
    argv += ["--bytes", draw(S.number_text(0, 1 << 34))]
    if mode == 2:
        argv += ["--gather-to", _endpoint(draw)]
    else:
        argv += ["--from", _endpoint(draw), "--to", _endpoint(draw)]
    if draw(st.integers(0, 5)) == 0:
        argv += ["--capacities"]
    return argv + draw(_json)


_STEP_TIMES = ["0.91s", "19ms", "1ms", "0", "-1s", "nan", "inf", "1e308", "5 min", "x", "2"]


@st.composite
def serve_steps_argv(draw) -> list[str]:
    """`serve`'s one-step mode with given step times, --kv-seq and --engine (issue 21)."""
    model = draw(
        S.mostly(st.sampled_from(["tiny-llama", "llama-3-8b"]), S.name_of(S.SMALL_MODELS), 8)
    )
    system = draw(st.sampled_from(["h100:8", "tpu-v5e:4x2", "b200:8", "h100:1"]))
    argv = ["serve", "--model", model, "--system", system]
    plans = ["tp=8", "tp=4", "tp=2", "tp=1", "tp=2,dp=4"]
    argv += ["--plan", draw(S.mostly(st.sampled_from(plans), st.just("x"), 10))]
    argv += ["--batch", draw(S.number_text(0, 512)), "--context", draw(S.number_text(0, 1 << 17))]
    given = draw(st.integers(0, 3))
    if given <= 1:
        argv += [f"--prefill-step-s={draw(st.sampled_from(_STEP_TIMES))}"]
        argv += [f"--decode-step-s={draw(st.sampled_from(_STEP_TIMES))}"]
        if draw(st.booleans()):
            argv += ["--prefill-batch", draw(S.number_text(0, 64))]
    elif given == 2:
        argv += [draw(st.sampled_from(["--prefill-step-s", "--decode-step-s"])), "1s"]
    if draw(st.booleans()):
        argv += ["--kv-seq", draw(S.number_text(0, 16))]
    if draw(st.booleans()):
        engines = ["vllm", "sglang", "trtllm", "jetstream", "none", "VLLM", "bogus", ""]
        argv += ["--engine", draw(st.sampled_from(engines))]
    return argv + draw(_json)


# -- files of every kind, as every input that takes a file ---------------------------------------

CANARY = "CANARY-5b1e-never-echoed"  # the content of a file outside the UI's data dir


@functools.cache
def special_files() -> dict[str, str]:
    """Made once per process: a FIFO, a 2 GB sparse file, a folder, devices, odd names."""
    import os

    d = _TMP / "special"
    d.mkdir(exist_ok=True)
    fifo = d / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    huge = d / "huge.csv"
    with open(huge, "wb") as f:
        f.truncate(2 * 2**30)
    (_TMP / "canary.txt").write_text(CANARY)
    return {
        "fifo": str(fifo),
        "huge": str(huge),
        "dir": str(d),
        "zero": "/dev/zero",
        "null": "/dev/null",
        "missing": str(d / "missing.toml"),
        "long": "x" * 5000,
        "nul": "a\0b",
        "passwd": "/etc/passwd",
        "canary": str(_TMP / "canary.txt"),
    }


@st.composite
def nasty_file(draw, suffix: str) -> str:
    """A path to a special file (FIFO, device, 2 GB, folder) or to a generated nasty one."""
    if draw(st.integers(0, 2)) == 0:
        return special_files()[draw(st.sampled_from(sorted(special_files())))]
    return write_file(draw(S.nasty_content()), suffix)


_OUTS = ["ok", "ok", "missing-dir", "dir", "empty"]


def out_path(kind: str, suffix: str) -> str:
    """An output path: a fresh file in the temp dir, or one that must be refused up front."""
    if kind == "ok":
        return str(_TMP / f"out{next(_counter)}{suffix}")
    return {"missing-dir": str(_TMP / "no" / "such" / f"x{suffix}"), "dir": str(_TMP), "empty": ""}[
        kind
    ]


@st.composite
def file_kind_argv(draw) -> list[str]:
    """Every command that reads a file, given a file of every kind."""
    small = ["--model", "tiny-llama", "--system", "h100:8"]
    use = draw(st.integers(0, 8))
    if use == 0:
        return ["model", draw(nasty_file(draw(st.sampled_from([".json", ".toml"]))))]
    if use == 1:
        return [draw(st.sampled_from(["chip", "system"])), draw(nasty_file(".toml"))]
    if use == 2:
        return ["validate", "--runs", draw(nasty_file(".yaml")), *draw(_json)]
    if use == 3:
        return ["serve", *small, "--lengths", draw(nasty_file(".csv")), *draw(_json)]
    if use == 4:
        flag = draw(st.sampled_from(["--profile", "--framework", "--efficiency"]))
        return ["train", *small, flag, draw(nasty_file(".toml"))]
    if use == 5:
        out = out_path("ok", ".html")
        return ["report", *small, "--serving", draw(nasty_file(".json")), "--out", out]
    if use == 6:
        out = out_path(draw(st.sampled_from(_OUTS)), ".toml")
        return ["calibrate", "--from-runs", draw(nasty_file(".yaml")), "--out", out]
    if use == 7:
        suffix = draw(st.sampled_from([".toml", ".yaml", ".json", ".sh"]))
        return ["import", draw(nasty_file(suffix)), "--system", "h100:8", *draw(_json)]
    return ["train", "--model", draw(nasty_file(".json")), "--system", "h100:8"]


@st.composite
def calibrate_argv(draw) -> list[str]:
    """`calibrate --from-runs` on one or two (mutated) public runs, every kind of --out/--docs."""
    argv = ["calibrate", "--from-runs", write_file(draw(S.runs_yaml()), ".yaml"), "--no-cv"]
    argv += ["--out", out_path(draw(st.sampled_from(_OUTS)), ".toml")]
    if draw(st.integers(0, 4)) == 0:
        argv += ["--docs", out_path(draw(st.sampled_from(_OUTS)), ".md")]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--base", draw(st.sampled_from(["datasheet", "fitted", "peak", "nope", ""]))]
    if draw(st.integers(0, 4)) == 0:
        argv += ["--jobs", draw(S.number_text(0, 8))]
    return argv + draw(_json)


@st.composite
def report_argv(draw) -> list[str]:
    """`roofline report`: train inputs, every kind of --out, --serving files, --serve ARGS."""
    argv = ["report", "--model", draw(S.name_of(["tiny-llama", "book-tf-q1"]))]
    argv += [
        "--system",
        draw(S.mostly(st.sampled_from(["h100:8", "tpu-v5e:4x4"]), S.system_spec())),
    ]
    suffix = draw(st.sampled_from([".html", ".html", ".html", ".md", ".txt"]))
    argv += ["--out", out_path(draw(st.sampled_from(_OUTS)), suffix)]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--format", draw(st.sampled_from(["html", "md", "pdf"]))]
    serving = draw(st.integers(0, 5))
    if serving == 0:
        argv += ["--serving", draw(nasty_file(".json"))]
    elif serving == 1:
        args = [
            "--system h100:8 --prompt 512 --gen 64",
            "--concurrency x",
            "'unclosed",
            "--bogus 1",
        ]
        argv += ["--serve", draw(st.sampled_from(args))]
    return argv + draw(st.sampled_from([[], ["--json"]]))


# -- `roofline ui` requests (in-process ASGI calls; fuzz_harness.run_request) --------------------

UI_TOKEN = "fuzz-token"
_UI_PATHS = ["/", "/report.html", "/api/train", "/api/serve", "/api/model", "/api/chip",
             "/api/system", "/api/models", "/api/report", "/api/ui", "/api/bogus"]  # fmt: skip


@st.composite
def _ui_path_value(draw) -> str:
    """A value that names a file: the server's own files, traversal, specials, data-dir names."""
    named = ["/etc/passwd", "../../../../etc/passwd", "/proc/self/environ", "lengths.csv",
             "config.json", "../canary.txt", "escape.csv", "fifo", "/dev/zero"]  # fmt: skip
    return draw(
        st.one_of(st.sampled_from(named), st.sampled_from(sorted(special_files().values())))
    )


def _ui_params(draw, path: str) -> dict[str, str]:
    params: dict[str, str] = {}
    if path in ("/api/chip", "/api/system"):
        good = st.sampled_from(["h100", "tpu-v5e", "h100:8"])
        params["name"] = draw(S.mostly(good, S.name_of(S.CHIPS)))
        return params
    if path == "/api/model":
        params["model"] = draw(st.one_of(S.name_of(S.SMALL_MODELS), _ui_path_value()))
        return params
    if path == "/api/models":
        return params
    good_model = st.sampled_from(["tiny-llama", "book-tf-q1"])
    params["model"] = draw(S.mostly(good_model, _ui_path_value(), 3))
    params["system"] = draw(S.mostly(st.just("h100:8"), S.system_spec(), 4))
    for key in ("seq", "batch_tokens", "top"):
        if draw(st.integers(0, 3)) == 0:
            params[key] = draw(st.one_of(S.number_text(), st.just(S.HUGE_DIGITS)))
    if draw(st.integers(0, 3)) == 0:
        key = draw(st.sampled_from(["profile", "framework", "plan", "bogus"]))
        huge_plan = st.just(f"fsdp={S.HUGE_DIGITS}")
        params[key] = draw(
            st.one_of(_ui_path_value(), huge_plan, S.name_of(["fitted", "megatron"]))
        )
    if draw(st.integers(0, 5)) == 0:
        odd = st.sampled_from(["[" * 5000, "{", HUGE_CONFIG])
        params["config"] = draw(st.one_of(S.hf_json(), odd))
    if path == "/api/serve" or (path in ("/", "/api/report") and draw(st.integers(0, 3)) == 0):
        prefix = "" if path == "/api/serve" else "serve."
        if prefix:
            params["serve"] = "on"
        params[prefix + "lengths"] = draw(_ui_path_value())
    return params


def _ui_headers(draw) -> dict[str, str]:
    headers = {"Authorization": f"token {UI_TOKEN}"}
    trouble = draw(st.integers(0, 15))  # one request in four is refused for who sent it
    if trouble == 0:
        return {}
    if trouble == 1:
        headers["Authorization"] = "token guess"
    elif trouble == 2:
        origins = ["http://evil.example", "null", "http://127.0.0.1:1"]
        headers["Origin"] = draw(st.sampled_from(origins))
    elif trouble == 3:
        headers["Sec-Fetch-Site"] = draw(st.sampled_from(["cross-site", "same-site", "none"]))
    return headers


@st.composite
def ui_request(draw) -> dict:
    """One request: path, query, headers (token or not, other origins), maybe a multipart upload."""
    path = draw(st.sampled_from(_UI_PATHS))
    files = {}
    if draw(st.integers(0, 3)) == 0:
        keys = ["lengths"] if path == "/api/serve" else ["model", "serve.lengths"]
        content = draw(st.one_of(S.nasty_content(), S.lengths_csv(), S.hf_json()))
        name = "upload" + draw(st.sampled_from([".csv", ".json", ".toml", ""]))
        files[draw(st.sampled_from(keys))] = (name, content)
    params = _ui_params(draw, path)
    return {"path": path, "params": params, "headers": _ui_headers(draw), "files": files}


@functools.cache
def ui_app():
    """The UI's app for the fuzz tier: a data dir with a lengths file, a config, a FIFO and a
    symlink out to the canary; a fuzz-sized time limit."""
    import os

    from roofline.web.app import create_app
    from roofline.web.worker import Limits

    data = _TMP / "data"
    data.mkdir(exist_ok=True)
    (data / "lengths.csv").write_text("prompt,output\n1024,256\n2048,128\n")
    (data / "config.json").write_text((S.HF_DIR / "qwen3-0.6b.json").read_text())
    special_files()  # the canary beside the data dir
    if not (data / "fifo").exists():
        os.mkfifo(data / "fifo")
        (data / "escape.csv").symlink_to(_TMP / "canary.txt")
    app = create_app(token=UI_TOKEN, data_dir=data, limits=Limits(timeout_s=15, workers=2))
    # called in-process, the app never runs its shutdown: its uploads go with the process
    atexit.register(shutil.rmtree, app.state.ui.uploads, ignore_errors=True)
    return app


HUGE_CONFIG = '{"model_type": "llama", "hidden_size": ' + S.HUGE_DIGITS + "}"


FAMILIES = {
    "chip": chip_argv(),
    "listing": listing_argv(),
    "model": model_argv(),
    "system": system_argv(),
    "op": op_argv(),
    "collective": collective_argv(),
    "matmul": matmul_argv(),
    "model_file": model_file_argv(),
    "chip_file": chip_file_argv(),
    "system_file": system_file_argv(),
    "train": train_argv(known_issues=False),
    "train_known": train_argv(known_issues=True),
    "validate": validate_argv(),
    "serve": serve_argv(),
    "file_kinds": file_kind_argv(),
    "calibrate": calibrate_argv(),
    "report": report_argv(),
    "import": import_argv(),
    "export": export_argv(),
    "limits": limits_argv(),
    "transfer": transfer_argv(),
    "serve_steps": serve_steps_argv(),
}
