"""Progress bars on long work (issue 22 item 9): drawn (tqdm, with an ETA) on stderr when stdout
and stderr are terminals, never under --json or when either is a pipe. The commands run under
real pseudo-terminals (pty), as a user's shell would run them."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from roofline import progress

ROOT = Path(__file__).resolve().parents[1]
# tqdm's meter: "desc:  40%|####      | 12/29 [00:01<00:02,  8.1run/s]" — count, elapsed<ETA
METER = re.compile(r"(\d+)/(\d+) \[\d\d:\d\d<\d\d:\d\d")


def run_in_pty(
    argv: list[str],
    *,
    stdout_tty: bool = True,
    stderr_tty: bool = True,
    size: tuple[int, int] | None = None,
    delay: float | None = None,
):
    """`python -m roofline ARGV` with stdout / stderr on a pty or a pipe: (rc, stdout, stderr).
    `size` (rows, columns) sets the ptys' window; a fresh pty has none (0x0)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "120", "TERM": "xterm"}
    env.pop("ROOFLINE_PROGRESS", None)
    env.pop("ROOFLINE_PROGRESS_DELAY", None)
    if delay is not None:
        env["ROOFLINE_PROGRESS_DELAY"] = str(delay)
    ends: dict[str, tuple[int, int | None]] = {}
    for name, tty in (("out", stdout_tty), ("err", stderr_tty)):
        ends[name] = pty.openpty() if tty else os.pipe()
        if tty and size:
            fcntl.ioctl(ends[name][1], termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    p = subprocess.Popen(
        [sys.executable, "-m", "roofline", *argv],
        stdout=ends["out"][1],
        stderr=ends["err"][1],
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    for _, w in ends.values():
        os.close(w)
    fds = {ends["out"][0]: "out", ends["err"][0]: "err"}
    got = {"out": b"", "err": b""}
    while fds:
        ready, _, _ = select.select(list(fds), [], [], 600)
        if not ready:
            p.kill()
            raise AssertionError(f"no output for 600 s from roofline {' '.join(argv)}")
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # a pty's reader gets EIO once the writer is gone
                chunk = b""
            if not chunk:
                os.close(fd)
                del fds[fd]
            else:
                got[fds[fd]] += chunk
    return (
        p.wait(timeout=60),
        got["out"].decode(errors="replace"),
        got["err"].decode(errors="replace"),
    )


def meters(text: str, desc: str) -> list[tuple[int, int]]:
    """The (done, total) of every redraw of the bar named `desc`."""
    return [
        (int(m.group(1)), int(m.group(2)))
        for line in re.split(r"[\r\n]", text)
        if desc in line
        for m in [METER.search(line)]
        if m
    ]


VALIDATE = ["validate", "--runs", "inference"]


def test_validate_draws_a_bar_with_an_eta_on_a_terminal():
    # no delay: validating the inference file now takes less than the default 0.5 s, below
    # which (rightly) no bar is drawn at all
    rc, out, err = run_in_pty(VALIDATE, delay=0)
    assert rc == 0, err
    seen = meters(err, "validate: inference runs")
    assert seen, err[-2000:]
    total = seen[0][1]
    assert all(t == total for _, t in seen) and total > 1
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)  # counts only go up
    assert "Per metric" in out and "validate:" not in out  # the bar is on stderr only


def test_no_bar_under_json():
    rc, out, err = run_in_pty([*VALIDATE, "--json"])
    assert rc == 0, err
    assert "validate:" not in err and not METER.search(err)
    assert out.lstrip().startswith("{")


@pytest.mark.parametrize("stdout_tty, stderr_tty", [(False, True), (True, False)])
def test_no_bar_unless_both_streams_are_terminals(stdout_tty, stderr_tty):
    rc, out, err = run_in_pty(VALIDATE, stdout_tty=stdout_tty, stderr_tty=stderr_tty)
    assert rc == 0, err
    assert "validate:" not in err and not METER.search(err)


def test_the_training_search_draws_its_costing_bar():
    # its costing takes under a second here: the delay is set to 0 so the bar is always drawn
    argv = ["train", "--chips", "2048-8192"]
    rc, out, err = run_in_pty(argv, size=(30, 100), delay=0)  # a terminal that reports its size
    assert rc == 0, err
    seen = meters(err, "train: costing plans")
    assert seen and seen[-1][0] == seen[-1][1]
    drawn = [x for x in re.split(r"[\r\n]", err) if "train: costing plans" in x]
    assert max(len(x.rstrip()) for x in drawn) <= 100  # fits the window
    assert "Best plan by cost" in out


def test_the_delay_setting(monkeypatch):
    monkeypatch.delenv("ROOFLINE_PROGRESS_DELAY", raising=False)
    assert progress._delay() == progress.DELAY_S


@pytest.mark.parametrize("value, delay", [("0", 0.0), ("2.5", 2.5), ("-1", None), ("x", None)])
def test_the_delay_can_be_set(monkeypatch, value, delay):
    monkeypatch.setenv("ROOFLINE_PROGRESS_DELAY", value)
    assert progress._delay() == (progress.DELAY_S if delay is None else delay)


@pytest.mark.slow
def test_calibrate_on_the_device_draws_a_bar_and_its_lines_survive():
    pytest.importorskip("jax")
    rc, out, err = run_in_pty(["calibrate", "--device", "--quick"])
    assert rc == 0, err
    assert meters(err, "calibrate: kernels")
    assert "timing microbenchmarks (quick)" in err  # the progress lines, written past the bar


@pytest.mark.hlo
def test_verify_draws_its_stages():
    pytest.importorskip("jax")
    argv = ["verify", "--matmul", "A[I,J_X] * B[J_X,K] -> C[I,K]", "--mesh", "X=8"]
    rc, out, err = run_in_pty(argv)
    assert rc == 0, err
    assert meters(err, "verify: "), err[-2000:]
    assert "verdict" in out


# --- the module, in-process (pytest captures both streams: no terminal) -----------------


def test_in_process_nothing_is_drawn_and_items_pass_through(capsys):
    assert not progress.enabled()
    assert list(progress.track(iter(range(5)), "x")) == [0, 1, 2, 3, 4]
    assert progress.counter("x") is None
    with progress.bar(3, "x") as b:
        b.update(1)
        b.set_description("y")
    progress.write("a line")
    assert capsys.readouterr().err == "a line\n"


def test_a_new_description_waits_out_the_delay(monkeypatch, capsys):
    """Stages quicker than the delay draw nothing, a new description included: tqdm's
    set_description draws at once, and close() erases only a bar drawn after the delay, so a
    report quicker than the delay used to leave its half-finished frame on the terminal."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(progress, "DELAY_S", 60.0)
    monkeypatch.delenv("ROOFLINE_PROGRESS_DELAY", raising=False)
    with progress.bar(2, "a", unit="stage") as b:
        b.update(1)
        b.set_description("b")
        b.update(1)
    assert capsys.readouterr().err == ""


def test_allowed_nests_and_never_reenables(monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert progress.enabled()
    with progress.allowed(False):
        assert not progress.enabled()
        with progress.allowed(True):
            assert not progress.enabled()
    assert progress.enabled()
    monkeypatch.setenv("ROOFLINE_PROGRESS", "0")
    assert not progress.enabled()


def test_counter_draws_and_closes(monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    show = progress.counter("count", unit="plan")
    assert show is not None
    for done in (3, 7, 10):
        show(done, 10)  # a closed bar at 10; nothing left open


def test_the_serving_search_draws_its_bar_and_erases_it():
    rc, out, err = run_in_pty(["serve"], size=(30, 100), delay=0)  # its loop takes ~1 s
    assert rc == 0, err
    seen = meters(err, "serve: costing dtypes")
    assert seen and seen[-1][0] == seen[-1][1]
    assert err.endswith("\r")  # the last write blanks the line: the bar leaves nothing behind
    assert "best plan" in out


@pytest.mark.slow
def test_report_draws_its_stages(tmp_path):
    pytest.importorskip("vl_convert")
    out_file = tmp_path / "r.html"
    # no delay: the bar draws whatever the machine's speed (the report takes ~0.3-1 s)
    rc, out, err = run_in_pty(["report", "--out", str(out_file)], size=(30, 100), delay=0)
    assert rc == 0, err
    seen = meters(err, "report: ")
    assert seen and seen[-1] == (2, 2) and out_file.is_file()
    assert err.endswith("\r")  # erased when done
    assert out.startswith("wrote ")
