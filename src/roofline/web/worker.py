"""A request's work in its own process: bounded in time and memory, reading only allowed files.

`roofline ui` never computes in the server process. Each job (a command's `--json`
document; a report is several) runs in a child forked from a warm fork server
(`multiprocessing` "forkserver", roofline already imported), which first restricts file reads
to the upload folder and the `--data-dir` (specs.catalog.restrict_reads) and makes that folder
its working directory, so a relative path resolves inside it. The server thread that waits
for the child kills it past `timeout_s` or when its resident memory passes `memory_bytes`, and
a limited number of children run at once: a request beyond that is refused at once (busy)
instead of queueing behind slow work. Nothing is shared between requests but the results
cache (job and inputs -> document or error), which lives in the server process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roofline.cli import COMMANDS
from roofline.errors import RooflineError, SpecError

# the modules the fork server imports once, so that a request's child starts warm (every
# command's module: documents build the whole `roofline` parser)
PRELOAD = (
    "roofline.web.worker",
    "roofline.web.documents",
    *(f"roofline.cli.{c}_cmd" for c in COMMANDS),
)
POLL_S = 0.02  # how often the waiting thread looks at the child's memory
CACHE_ENTRIES = 256


class LimitError(SpecError):
    """A request went past a bound of the server (time, memory, concurrent work).
    `status` is the HTTP status it answers with."""

    status = 503


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 120.0  # wall time of one request's work
    memory_bytes: int = 4 << 30  # resident memory of one request's process
    workers: int = 4  # requests computing at once; one more is answered 503 (busy)


@dataclass(frozen=True)
class Sandbox:
    """What a job may read: files under `roots` (and roofline's own data); `cwd` is where a
    relative path starts (the data dir, else the upload folder)."""

    roots: tuple[str, ...]
    cwd: str


# -- the jobs (run in the child) --------------------------------------------------------------


def _document(command: str, argv: tuple[str, ...]) -> dict[str, Any]:
    from roofline.web import documents

    return documents.document(command, list(argv))


JOBS: dict[str, Callable[..., Any]] = {"document": _document}


def _child(conn, sandbox: Sandbox, job: str, args: tuple) -> None:
    """Entry point of the child process: restrict reads, run the job, send back the result."""
    from roofline.specs.catalog import huge_number_error, restrict_reads, too_many_digits

    try:
        restrict_reads(sandbox.roots)
        os.chdir(sandbox.cwd)
        reply: tuple = ("ok", JOBS[job](*args))
    except RooflineError as e:
        reply = ("error", e.what, e.rule, e.fix)
    except MemoryError:
        reply = ("limit", "the request ran out of memory", "", "")
    except ValueError as e:
        if not too_many_digits(e):
            reply = _crash(e)
        else:
            h = huge_number_error("an input")
            reply = ("error", h.what, h.rule, h.fix)
    except Exception as e:  # noqa: BLE001 - a 500 naming the class; the traceback goes to the log
        reply = _crash(e)
    with contextlib.suppress(BrokenPipeError, OSError):
        conn.send(reply)
    conn.close()


def _crash(e: BaseException) -> tuple:
    """A bug: the traceback goes to the server's terminal (stderr), the class to the client."""
    import traceback

    traceback.print_exc()
    return ("crash", type(e).__name__)


# -- the server side ----------------------------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Worker:
    """Runs jobs in bounded child processes and caches their answers (see the module doc)."""

    def __init__(self, limits: Limits, sandbox: Sandbox) -> None:
        self.limits, self.sandbox = limits, sandbox
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(PRELOAD))
        self._slots = threading.BoundedSemaphore(limits.workers)
        self._cache: OrderedDict[tuple, tuple] = OrderedDict()
        self._cache_lock = threading.Lock()

    def run(self, job: str, *args: Any, stamp: Any = None) -> Any:
        """The job's result, or the RooflineError it raised (LimitError past a bound).
        `stamp` joins the cache key (e.g. the data dir's listing, so edited files recompute)."""
        key = (job, args, stamp)
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        reply = hit if hit is not None else self._compute(job, args)
        if hit is None and reply[0] in ("ok", "error"):
            with self._cache_lock:
                self._cache[key] = reply
                while len(self._cache) > CACHE_ENTRIES:
                    self._cache.popitem(last=False)
        return _unpack(reply, self.limits)

    def _compute(self, job: str, args: tuple) -> tuple:
        if not self._slots.acquire(blocking=False):
            return ("busy",)
        try:
            return self._in_child(job, args)
        finally:
            self._slots.release()

    def _in_child(self, job: str, args: tuple) -> tuple:
        recv, send = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=_child, args=(send, self.sandbox, job, args), daemon=True)
        proc.start()
        send.close()
        try:
            return self._wait(proc, recv)
        finally:
            recv.close()
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)

    def _wait(self, proc, recv) -> tuple:
        deadline = time.monotonic() + self.limits.timeout_s
        while True:
            if recv.poll(POLL_S):
                try:
                    return recv.recv()
                except (EOFError, OSError):  # died before answering
                    proc.join(timeout=5)
                    return ("died", proc.exitcode)
            if time.monotonic() > deadline:
                return ("timeout",)
            if _rss_bytes(proc.pid) > self.limits.memory_bytes:
                return ("memory",)


def _unpack(reply: tuple, limits: Limits) -> Any:
    kind = reply[0]
    if kind == "ok":
        return reply[1]
    if kind == "error":
        raise SpecError(reply[1], rule=reply[2], fix=reply[3])
    raise _limit_error(reply, limits)


def _limit_error(reply: tuple, limits: Limits) -> RooflineError:
    kind = reply[0]
    mib = limits.memory_bytes / 2**20
    if kind == "busy":
        e = LimitError(
            f"the server is already computing {limits.workers} requests",
            rule="roofline ui runs a bounded number of requests at once and refuses the rest "
            "rather than queue them behind slow work",
            fix="retry in a moment, or start `roofline ui --workers N` with more",
        )
    elif kind == "timeout":
        e = LimitError(
            f"the request ran longer than {limits.timeout_s:g} s and was stopped",
            rule="each request's work is bounded in time (roofline ui --timeout)",
            fix="ask for a smaller search (fewer chips, --chips, --top), or raise --timeout",
        )
    elif kind in ("memory", "limit"):
        e = LimitError(
            f"the request needed more than {mib:,.0f} MiB of memory and was stopped",
            rule="each request's work is bounded in memory (roofline ui --memory-mib)",
            fix="ask for a smaller problem, or raise --memory-mib",
        )
    else:  # "died" (a signal) or "crash" (an unexpected exception: a bug)
        e = LimitError(
            f"the request's work failed ({reply[1] if len(reply) > 1 else kind})",
            rule="this is a bug in roofline, not in the input",
            fix="report it with the URL that caused it",
        )
        e.status = 500
    return e
