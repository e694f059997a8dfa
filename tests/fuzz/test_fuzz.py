"""The fuzz tier (marker `fuzz`): every command family driven in-process by Hypothesis.

Each case calls `roofline.cli.main(argv)` with output captured and a time limit; it fails on a
traceback, a hang, or a bad number (see fuzz_harness.Outcome.problems). The runs are
derandomized (the same cases every run, so CI never flakes); set ROOFLINE_FUZZ_RANDOM=1 for
fresh cases and ROOFLINE_FUZZ_SCALE=10 for ten times as many, e.g.

    ROOFLINE_FUZZ_RANDOM=1 ROOFLINE_FUZZ_SCALE=10 python -m pytest -m fuzz tests/fuzz
    python tests/fuzz/survey.py 500          # every failure, grouped by cause

Budget: EXAMPLES below sum to the number of cases CI runs (test_case_budget states it).
"""

from __future__ import annotations

import os
import subprocess
import sys

import fuzz_cases
import pytest
from fuzz_harness import run_cli, run_request
from hypothesis import HealthCheck, Phase, given, settings

pytestmark = pytest.mark.fuzz

SCALE = float(os.environ.get("ROOFLINE_FUZZ_SCALE", "1"))
RANDOM = os.environ.get("ROOFLINE_FUZZ_RANDOM", "") not in ("", "0")
TIMEOUT_S = 20.0  # per case; the slowest valid case (train) takes under 1 s on a loaded core

# cases per family in CI (measured ~10-30 ms each, train ~80 ms)
EXAMPLES = {
    "chip": 250,
    "listing": 10,  # only 9 distinct argv exist: Hypothesis stops there
    "model": 360,
    "system": 400,
    "op": 360,
    "collective": 350,
    "matmul": 300,
    "model_file": 450,
    "chip_file": 300,
    "system_file": 300,
    "train": 300,
    "train_known": 100,
    "validate": 200,
    "serve": 240,
    # issue 22: files of every kind as every file input, calibrate, report, the UI's requests
    "file_kinds": 160,
    "calibrate": 30,  # a fit on one or two runs, most refused first: ~0.1 s CPU each
    "report": 20,  # an HTML page: ~0.3 s CPU each (Markdown renders PNGs: a few s)
    "ui": 70,  # requests to the UI's app in-process; each one computing forks a worker
    # the commands of issues 19-21 (trimmed above: chip, model, system, op, serve)
    "import": 60,  # every stack's launch files, mutated or malformed: ~0.1 s each
    "export": 40,  # most search train's plans on a small system: ~0.15 s each
    "limits": 150,  # closed forms: ~10 ms each
    "transfer": 150,
    "serve_steps": 120,
}


def fuzz_settings(family: str, shrink: bool = True):
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.generate)
    return settings(
        phases=phases,
        max_examples=max(1, int(EXAMPLES[family] * SCALE)),
        deadline=None,  # the harness has its own time limit
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


def check(argv: list[str]) -> None:
    out = run_cli(argv, timeout_s=TIMEOUT_S)
    problems = out.problems()
    assert not problems, (
        f"roofline {' '.join(repr(a) for a in argv)}\n"
        + "\n".join(problems)
        + (f"\n{out.crash}" if out.crash else "")
        + (f"\nstderr: {out.err[-800:]}" if out.err else "")
    )


def _family_test(family: str, shrink: bool = True):
    @fuzz_settings(family, shrink)
    @given(fuzz_cases.FAMILIES[family])
    def test(argv: list[str]) -> None:
        check(argv)

    test.__name__ = f"test_fuzz_{family}"
    return test


test_fuzz_chip = _family_test("chip")
test_fuzz_listing = _family_test("listing")
test_fuzz_model = _family_test("model")
test_fuzz_system = _family_test("system")
test_fuzz_op = _family_test("op")
test_fuzz_collective = _family_test("collective")
test_fuzz_matmul = _family_test("matmul")
test_fuzz_model_file = _family_test("model_file")
test_fuzz_chip_file = _family_test("chip_file")
test_fuzz_system_file = _family_test("system_file")
test_fuzz_train = _family_test("train")
test_fuzz_validate = _family_test("validate")
test_fuzz_serve = _family_test("serve")
test_fuzz_file_kinds = _family_test("file_kinds")
test_fuzz_calibrate = _family_test("calibrate")
test_fuzz_report = _family_test("report")
test_fuzz_import = _family_test("import")
test_fuzz_export = _family_test("export")
test_fuzz_limits = _family_test("limits")
test_fuzz_transfer = _family_test("transfer")
test_fuzz_serve_steps = _family_test("serve_steps")


@fuzz_settings("ui")
@given(fuzz_cases.ui_request())
def test_fuzz_ui(request_case: dict) -> None:
    """`roofline ui` requests: never a 500, a hang or a file's content outside the data dir;
    requests without the token or from another site are refused (fuzz_harness.Response)."""
    out = run_request(fuzz_cases.ui_app(), request_case, timeout_s=2 * TIMEOUT_S)
    problems = out.problems()
    assert not problems, (
        f"{request_case}\n"
        + "\n".join(problems)
        + (f"\n{out.crash}" if out.crash else f"\nbody: {out.body[:600]!r}")
    )


# Findings F1-F3, F5 (docs/fuzz-findings.md), now fixed: --assume-mfu outside (0, 1],
# schedule=interleaved with virtual <= 0, unpriced chips. This family keeps their inputs in.
test_fuzz_train_known = _family_test("train_known", shrink=False)


def test_case_budget():
    """The number of fuzz cases CI runs (README: 'The fuzz tier runs N cases')."""
    assert set(EXAMPLES) == set(fuzz_cases.FAMILIES) | {"ui"}
    assert (
        3000 <= sum(EXAMPLES.values()) <= 6000
    )  # 4,719 run: 4,720 budgeted, listing stops at 9 distinct


def test_the_oracle_can_fail():
    """The harness itself: a traceback, a NaN, an inf string and a bad percentage are caught."""
    from fuzz_harness import Outcome

    assert Outcome(["x"], None, "", "", 0.1, crash="Traceback...\nValueError: x").problems()
    assert Outcome(["x"], None, "", "", 30.0, timed_out=True).problems()
    assert Outcome(["model"], 0, "KV cache  nan B", "", 0.1).problems()
    assert Outcome(["train"], 0, "MFU  300.0%", "", 0.1).problems()
    assert Outcome(["chips"], 0, "$nan", "", 0.1).problems()
    assert Outcome(["x", "--json"], 0, '{"step_time_s": "inf"}', "", 0.1).problems()
    assert Outcome(["x", "--json"], 0, '{"step_time_s": -1.0}', "", 0.1).problems()
    assert Outcome(["x", "--json"], 0, '{"mfu": 3.0}', "", 0.1).problems()
    assert Outcome(["x", "--json"], 0, '{"a": NaN}', "", 0.1).problems()
    assert Outcome(
        ["x", "--json"], 0, '{"a": null, "a_reason": "not a number (x)"}', "", 0.1
    ).problems()
    assert not Outcome(
        ["x", "--json"], 0, '{"a": null, "a_reason": "no price"}', "", 0.1
    ).problems()
    assert Outcome(["x"], 2, "", "roofline x: error: a\nb\nc", 0.1).problems()
    assert not Outcome(["x"], 2, "", "roofline x: error: bad. Rule: r. Fix: f.", 0.1).problems()
    assert not Outcome(["chip", "mi300x"], 0, "Infinity Fabric 448 GB/s", "", 0.1).problems()
    # MFU against the bf16 peak passes 1 only as far as the matmuls' dtype peak allows it
    run = '{"system": "gb300:64", "compute_dtype": "%s", "prediction": {"mfu": 1.07}}'
    assert not Outcome(["x", "--json"], 0, run % "fp4", "", 0.1).problems()
    assert Outcome(["x", "--json"], 0, run % "bf16", "", 0.1).problems()
    assert Outcome(["x", "--json"], 0, run.replace("1.07", "7.0") % "fp4", "", 0.1).problems()
    mfu = "MFU 77.6% of the bf16 peak, 38.8% of the fp8 peak (the matmuls' dtype); HFU 107.1%"
    assert not Outcome(["import", "f", "--system", "tpu-v5e:4x4"], 0, mfu, "", 0.1).problems()
    assert Outcome(["import", "f", "--system", "tpu-v5e:4x4"], 0, mfu + " 207%", "", 0.1).problems()
    assert Outcome(["import", "f"], 0, mfu, "", 0.1).problems()  # no chip: 100%
    # a top-plans row: its MFU column is against the bf16 peak, its plan names the dtype
    row = "1  dp=32,fsdp=2,microbatch=4,matmul_dtype=%s  64  2.71 s  101.2%%  171 GB  compute"
    assert not Outcome(["train", "--system", "gb200:72"], 0, row % "fp4", "", 0.1).problems()
    assert Outcome(["train", "--system", "gb200:72"], 0, row % "bf16", "", 0.1).problems()


def test_the_ui_oracle_can_fail():
    """The UI oracle: a 500, a hang, a canary's content, a foreign request answered, an API
    error without its paragraph are each caught; a refusal and a clean 400 pass."""
    from fuzz_harness import Response

    ok = {"path": "/api/train", "headers": {"Authorization": "token fuzz-token"}}
    err = b'{"error": "x. Fix: y.", "what": "x", "rule": "", "fix": "y"}'
    assert Response(ok, 500, b"{}", 0.1).problems()
    assert Response(ok, None, b"", 30.0, timed_out=True).problems()
    assert Response(ok, 400, err.replace(b"x.", b"CANARY-5b1e."), 0.1).problems()
    assert Response({**ok, "headers": {}}, 200, b"{}", 0.1).problems()
    assert Response(
        {**ok, "headers": {**ok["headers"], "Origin": "null"}}, 200, b"{}", 0.1
    ).problems()
    assert Response(ok, 400, b'{"error": "x"}', 0.1).problems()
    assert not Response({**ok, "headers": {}}, 403, err, 0.1).problems()
    assert not Response(ok, 400, err, 0.1).problems()


def test_trivial_commands_import_little():
    """`roofline chips` must not import the planner, numpy or matplotlib (the 0.3 s CPU target)."""
    code = (
        "import sys, io, contextlib\n"
        "from roofline.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['chips']); main(['chip', 'h100']); main(['models'])\n"
        "heavy = [m for m in ('numpy', 'matplotlib', 'roofline.training.planner', 'jax', 'roofline.training.step')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    heavy = [m for m in r.stdout.strip().split(",") if m]
    assert heavy == [], f"trivial commands imported {heavy}"


# -- open findings in other owners' modules, one reproducer each (docs/fuzz-findings.md) ---------
OPEN_FINDINGS = [
    ("F1", ["train", "--model", "tiny-llama", "--system", "h100:8", "--assume-mfu", "0"]),
    ("F1", ["train", "--model", "tiny-llama", "--system", "h100:8", "--assume-mfu", "2", "--json"]),
    ("F2", ["train", "--model", "book-tf-q1", "--system", "tpu-v5p:4x4x4", "--plan",
            "dp=32,pp=2,schedule=interleaved,virtual=0"]),
    ("F3", ["train", "--model", "llama-3-8b", "--system", "h100:16", "--plan",
            "dp=8,pp=2,schedule=interleaved,virtual=-2"]),
    ("F4", ["train", "--model", "llama-3.1-405b", "--system", "h100:16384", "--batch-tokens",
            "16M", "--seq", "8192"]),
    ("F5", ["train", "--model", "tiny-llama", "--system", "tpu-7x:4x4x4"]),
    ("F6", ["train", "--model", "tiny-llama", "--system", "h100:8", "--profile", "x" * 300]),
    ("F7", ["validate", "--runs", "/dev/zero"]),
    ("F8", ["validate", "--runs", "training", "--framework", "no-such-stack"]),
]  # fmt: skip


# fixed findings stay as regression tests; the ones still open are expected to fail
STILL_OPEN: set[str] = set()


@pytest.mark.parametrize(
    ("finding", "argv"),
    [
        pytest.param(
            f,
            a,
            marks=[pytest.mark.xfail(strict=True, reason="open finding (docs/fuzz-findings.md)")]
            if f in STILL_OPEN
            else [],
        )
        for f, a in OPEN_FINDINGS
    ],
    ids=[f for f, _ in OPEN_FINDINGS],
)
def test_open_findings(finding, argv):
    if finding == "F7":  # reads a device forever: in a child process with memory and time caps
        return _in_child(argv)
    out = run_cli(argv, timeout_s=5.0)
    problems = out.problems()
    if finding == "F8" and out.rc == 0 and "not applied" in out.out:
        problems.append("an unknown --framework is accepted and silently not applied")
    assert not problems, f"{finding}: {problems}"


def _in_child(argv: list[str]) -> None:
    # 2 GiB of address space: a runaway read fails fast, safely. The child sets its own limit
    # (no preexec_fn: that forks the pytest process, which JAX's at-fork hook warns about once
    # an hlo or calibrate test has started JAX, and warnings are errors here).
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30)); "
        "from roofline.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        r = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang: roofline {' '.join(argv)}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-300:]
