"""Issue 22 items 3-7: each one-line reproducer of a crash or a hang, as a regression test.

Each must end as one paragraph (exit 2) or a reasoned skip, at once: output paths checked
before work, numbers of thousands of digits, files that are huge, special or endless,
absurd or NaN values in runs files, a matmul with nothing sharded, and `report` when the
chart renderer cannot start (`ulimit -v`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from roofline.cli import main
from roofline.errors import SpecError
from roofline.specs import catalog

ROOT = Path(__file__).parents[1]
HF = ROOT / "tests" / "data" / "hf" / "qwen3-0.6b.json"
DIGITS = "7" * 5000
SMALL = ["--model", "tiny-llama", "--system", "tpu-v5e:4x4"]
SERVE = ["serve", "--model", "tiny-llama", "--system", "h100:8"]


def one_paragraph(capsys, argv: list[str], *words: str) -> str:
    capsys.readouterr()
    t = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - t < 30  # at once, not after the work
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Rule:" in err and "Fix:" in err
    for w in words:
        assert w in err, err
    return err


@pytest.fixture
def special_files(tmp_path) -> dict[str, str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:  # 2 GB, sparse
        f.truncate(2 * 2**30)
    return {"fifo": str(fifo), "huge": str(huge), "zero": "/dev/zero", "dir": str(tmp_path)}


# -- item 3 and 6: output paths are checked before any work ----------------------------------


def test_calibrate_checks_out_before_fitting(capsys, tmp_path):
    missing = str(tmp_path / "missing" / "dir" / "p.toml")
    one_paragraph(
        capsys, ["calibrate", "--from-runs", "training", "--out", missing], "does not exist"
    )
    one_paragraph(
        capsys, ["calibrate", "--from-runs", "training", "--docs", str(tmp_path)], "folder"
    )


def test_report_out_is_a_file_in_an_existing_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_paragraph(capsys, ["report", *SMALL, "--out", str(tmp_path)], "it is a folder")
    one_paragraph(capsys, ["report", *SMALL, "--out", ""], "--out ''")
    assert list(tmp_path.iterdir()) == []  # nothing written into the working directory


# -- item 4: a 5,000-digit integer anywhere ------------------------------------------------------


def test_huge_integers_are_one_paragraph(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(HF.read_text().replace('"hidden_size": 1024', f'"hidden_size": {DIGITS}'))
    assert DIGITS in config.read_text()
    chip = tmp_path / "chip.toml"
    chip.write_text(f"name = 'x'\nhbm_bytes = {DIGITS}\n")
    runs = tmp_path / "runs.yaml"
    runs.write_text(f"- id: a\n  hardware:\n    chips: {DIGITS}\n")
    one_paragraph(capsys, ["train", *SMALL, "--plan", f"fsdp={DIGITS}"], "5,000 digits")
    one_paragraph(capsys, ["train", "--model", str(config), "--system", "h100:8"], "4,300 digits")
    one_paragraph(capsys, ["chip", str(chip)], "4,300 digits")
    one_paragraph(capsys, ["validate", "--runs", str(runs)], "4,300 digits")
    with pytest.raises(SystemExit) as e:  # argparse's int: its usage line, exit 2
        main(["train", *SMALL, "--seq", DIGITS])
    assert e.value.code == 2 and "invalid int value" in capsys.readouterr().err


# -- item 5: every file read is bounded by size and kind ------------------------------------------


@pytest.mark.parametrize(
    "kind,words",
    [
        ("fifo", "not a regular file"),
        ("zero", "not a regular file"),
        ("huge", "2,147,483,648 bytes"),
        ("dir", "is a directory"),
    ],
)
def test_lengths_and_serving_files_are_bounded(capsys, special_files, kind, words):
    path = special_files[kind]
    one_paragraph(capsys, [*SERVE, "--lengths", path], "lengths file", words)
    out = str(Path(special_files["dir"]) / "r.html")
    one_paragraph(capsys, ["report", *SMALL, "--serving", path, "--out", out], words)


def test_a_bad_lengths_line_is_named_not_quoted(capsys, tmp_path):
    f = tmp_path / "l.csv"
    f.write_text("1024,256\nhunter2 secret\n")
    err = one_paragraph(capsys, [*SERVE, "--lengths", str(f)], "line 2")
    assert "hunter2" not in err


def test_non_utf8_names_the_byte_offset_only(tmp_path):
    f = tmp_path / "x.csv"
    f.write_bytes(b"1024,256\n\xff\xfe secret")
    with pytest.raises(SpecError, match="byte 9") as e:
        catalog.read_text_file(f, "lengths")
    assert "secret" not in str(e.value)


def test_restricted_reads_refuse_paths_outside_the_roots(tmp_path):
    inside = tmp_path / "in.txt"
    inside.write_text("ok")
    (tmp_path / "out").symlink_to("/etc/hostname")
    try:
        catalog.restrict_reads([tmp_path])
        assert catalog.read_text_file(inside, "lengths") == "ok"
        for p in ("/etc/passwd", tmp_path / "out", tmp_path / ".." / "x"):
            with pytest.raises(SpecError, match="not among the files this server may read"):
                catalog.read_text_file(p, "lengths")
            assert not catalog.is_file(p) and not catalog.exists(p)
        assert catalog.is_file(catalog.DATA_DIR / "chips" / "h100.toml")  # the package's own data
    finally:
        catalog.restrict_reads(None)
    assert catalog.is_file("/etc/passwd")


# -- item 7: absurd values in runs files, a matmul with nothing sharded, report without a renderer -


def _one_run(schema: str, edit) -> list[dict]:
    runs = yaml.safe_load((ROOT / "src/roofline/validate" / schema).read_text())
    e = edit(runs)
    return [e]


def test_runs_file_microbatch_1e308_is_a_skip_with_its_reason(capsys, tmp_path):
    def edit(runs):
        e = next(r for r in runs if "microbatch" in (r.get("parallelism") or {}))
        e["parallelism"]["microbatch"] = 1e308
        e["parallelism"].pop("global_batch_seqs", None)
        e["parallelism"].pop("global_batch_tokens", None)
        return e

    f = tmp_path / "runs.yaml"
    f.write_text(yaml.safe_dump(_one_run("measured_training.yaml", edit)))
    capsys.readouterr()
    assert main(["validate", "--runs", str(f), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "beyond any physical run" in json.dumps(doc)


def test_a_nan_serving_mode_is_not_accepted(capsys, tmp_path):
    def edit(runs):
        runs[0]["workload"]["mode"] = float("nan")
        return runs[0]

    f = tmp_path / "runs.yaml"
    f.write_text(yaml.safe_dump(_one_run("measured_inference.yaml", edit)))
    capsys.readouterr()
    assert main(["validate", "--runs", str(f)]) == 0
    out = capsys.readouterr().out
    assert "workload mode nan is a float" in out and "(0 mapped" in out


def test_verify_matmul_with_nothing_sharded(capsys):
    one_paragraph(capsys, ["verify", "--matmul", "A[I,J] * B[J,K]"], "shards no dimension")


def test_report_under_an_address_space_limit_falls_back(tmp_path):
    """vl-convert's V8 dies natively (SIGTRAP) under `ulimit -v`: the page says so instead."""
    pytest.importorskip("vl_convert")
    limit = 4 * 2**30

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for fmt in ("html", "md"):
        out = tmp_path / f"r.{fmt}"
        r = subprocess.run(
            [sys.executable, "-m", "roofline", "report", *SMALL, "--out", str(out)],
            preexec_fn=cap,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        assert "charts not drawn" in r.stderr and "Charts not drawn" in out.read_text()
        assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize(
    "argv_of,text",
    [
        (lambda p: ["validate", "--runs", p], "[" * 100_000),  # libyaml: a segfault before
        (lambda p: ["validate", "--runs", p], "- " * 50_000 + "1"),
        (lambda p: ["chip", p], "a = " + "[" * 100_000),  # tomllib: a RecursionError before
        (lambda p: ["model", p], "[" * 100_000),
        (lambda p: ["report", *SMALL, "--serving", p, "--out", p + ".html"], "[" * 100_000),
    ],
)
def test_deep_nesting_is_one_paragraph(capsys, tmp_path, argv_of, text):
    f = tmp_path / ("f.json" if text.startswith("[[") else "f.toml")
    f.write_text(text)
    one_paragraph(capsys, argv_of(str(f)))


# -- the fresh-seed fuzz of the new commands (docs/fuzz-findings.md, F12-F14) ---------------


@pytest.mark.parametrize("stack", [None, "maxtext", "nemo", "trtllm", "deepspeed", "torchtitan"])
@pytest.mark.parametrize(
    "text", ['{"a":' * 5000 + "1", "{" * 5000, "a = " + "[" * 5000], ids=["json", "flow", "toml"]
)
def test_import_of_a_deeply_nested_file_is_one_paragraph(capsys, tmp_path, stack, text):
    f = tmp_path / "launch.yaml"  # each stack's parser recursed past Python's limit (F12)
    f.write_text(text)
    argv = ["import", str(f), *(["--stack", stack] if stack else [])]
    err = one_paragraph(capsys, argv)
    assert len(err) < 2000  # names the file, never echoes it


@pytest.mark.parametrize(
    ("stack", "command"),
    [("vllm", "vllm serve"), ("sglang", "sglang.launch_server"), ("trtllm", "trtllm-serve")],
)
def test_export_to_a_serving_engine_writes_its_launch_line(capsys, stack, command):
    # an AttributeError (the serving modules keep no training OPTIMIZER) before (F13); the
    # serving engines now export through serve's inputs
    argv = ["export", "--to", stack, "--model", "tiny-llama", "--plan", "tp=1"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert command in out and "Traceback" not in err


@pytest.mark.parametrize(("prefill", "decode"), [("1e308", "19ms"), ("1e-308", "1e308")])
def test_given_step_times_whose_ratio_overflows_are_refused(capsys, prefill, decode):
    # the prefill : decode ratio was inf, printed as "inf : 1" and written as null (F14)
    argv = [*SERVE, "--plan", "tp=1", "--batch", "280", "--context", "365"]
    argv += [f"--prefill-step-s={prefill}", f"--decode-step-s={decode}", "--json"]
    one_paragraph(capsys, argv, "no finite number")


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--to", "megatron", "--model", "tiny-llama", "--system", "h100:8"],
        [*SERVE, "--prompt", "512", "--gen", "64"],
    ],
    ids=["export", "serve"],
)
@pytest.mark.parametrize("kind", ["missing", "dir", "empty"])
def test_export_and_serve_check_their_output_before_work(capsys, tmp_path, argv, kind):
    # export searched first and failed at the write; --out '' / --plot '' wrote nothing (F15)
    flag = "--out" if argv[0] == "export" else "--plot"
    path = {"missing": str(tmp_path / "no" / "x.png"), "dir": str(tmp_path), "empty": ""}[kind]
    one_paragraph(capsys, [*argv, flag, path], flag)


def test_a_control_character_in_a_maxtext_override_is_one_paragraph(capsys, tmp_path):
    # yaml.reader.ReaderError escaped from the override's value (F16, seed 20261203)
    text = (ROOT / "tests" / "data" / "launch" / "maxtext_llama2_70b_v5p.sh").read_text()
    f = tmp_path / "launch.sh"
    f.write_text(text.replace("per_device_batch_size=4", "per_device_batch_size=\x014"))
    assert "per_device_batch_size=\x014" in f.read_text()
    one_paragraph(capsys, ["import", str(f), "--chips", "256"], "per_device_batch_size")
