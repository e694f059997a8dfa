"""Run `roofline` in-process on one argv and judge the outcome (the fuzz tier's oracle).

A case passes when the command either answers (exit 0) with sane numbers, or refuses with one
paragraph on stderr and exit 2 (argparse usage errors count: also exit 2, no traceback). It
fails on: any exception escaping `main` (a traceback), running past the time limit (a hang),
or an answer with a bad number: NaN/inf in text or JSON, a string in a numeric JSON field, a
negative time/size/count/price, a percentage or fraction above 100%.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import signal
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass

from roofline.cli import main


class CaseTimeout(BaseException):
    """Raised by SIGALRM inside the case (BaseException: `except Exception` cannot swallow it)."""


@dataclass
class Outcome:
    argv: list[str]
    rc: int | None
    out: str
    err: str
    seconds: float
    crash: str = ""  # the traceback of an exception that escaped main
    timed_out: bool = False

    def problems(self) -> list[str]:
        """Everything wrong with this outcome (empty = the case passes)."""
        if self.timed_out:
            return [f"hang: still running after {self.seconds:.1f} s"]
        if self.crash:
            return ["traceback: " + self.crash.strip().splitlines()[-1]]
        if self.rc == 2:
            return _refusal_problems(self.err)
        if self.rc != 0:
            return [f"exit code {self.rc}"]
        return _answer_problems(self.argv, self.out)


def _alarm(signum, frame):  # noqa: ARG001 - signal handler signature
    raise CaseTimeout()


def run_cli(argv: list[str], timeout_s: float = 10.0) -> Outcome:
    """main(argv) with stdout/stderr captured and a wall-clock limit (SIGALRM, main thread)."""
    out, err = io.StringIO(), io.StringIO()
    rc: int | None = None
    crash = ""
    timed_out = False
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv))
            except SystemExit as e:  # argparse: --help (0) and usage errors (2)
                rc = e.code if isinstance(e.code, int) else 1
    except CaseTimeout:
        timed_out = True
    except Exception:  # noqa: BLE001 - the fuzz oracle reports every escape
        crash = traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return Outcome(
        list(argv), rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0, crash, timed_out
    )


# -- refusals ------------------------------------------------------------------------------------


def _refusal_problems(err: str) -> list[str]:
    text = err.strip()
    if "Traceback" in text:
        return ["traceback printed on stderr"]
    if not text:
        return ["exit 2 without a message"]
    lines = text.splitlines()
    if lines[0].startswith("usage:"):  # argparse: usage line(s) then "prog: error: ..."
        return [] if lines[-1].split(": error: ", 1)[-1] else ["argparse error without text"]
    if len(lines) != 1:
        return [f"error is not one paragraph ({len(lines)} lines)"]
    if ": error: " not in text:
        return ["error does not say 'roofline CMD: error:'"]
    return []


# -- answers -------------------------------------------------------------------------------------

_BAD_TEXT = [
    (
        re.compile(r"(?<![\w.])-?(nan|inf|infinity)(?![\w])(?! fabric)", re.I),
        "NaN/inf in the text",
    ),
    (re.compile(r"\$\s*-|\$nan|\$inf", re.I), "a negative or non-finite price"),
    (
        re.compile(
            r"(?<![\w.\-·×=/(])-\d[\d.,]*(e[+-]?\d+)?\s*(ns|µs|ms|s|min|h|days|[kMGTPE]?B|[kMGTPEZY]?FLOP)\b"
        ),
        "a negative time, size or FLOP count",
    ),
]
_PCT = re.compile(r"(?<![\w.])(\d[\d,]*\.?\d*)\s*%")


def _answer_problems(argv: list[str], out: str) -> list[str]:
    if "--json" in argv:
        try:
            doc = json.loads(out, parse_constant=lambda c: float("nan"))
        except json.JSONDecodeError as e:
            return [f"--json output is not JSON ({e.msg})"]
        return list(_json_problems(doc, "$"))
    probs = [msg for rx, msg in _BAD_TEXT if rx.search(out)]
    # validate prints signed errors ("+237.8%"), which may exceed 100%; other percentages are
    # shares, MFU or bubble fractions
    for line in out.splitlines() if argv[:1] != ["validate"] else ():
        limit = 100.0 * _text_ceiling(argv, line)
        big = [m for m in _PCT.finditer(line) if float(m.group(1).replace(",", "")) > limit]
        if big:
            probs.append(f"a percentage above {limit:g}%: {big[0].group(0)!r}")
            break
    return probs


_COMPUTE_PEAK = re.compile(r"% of the bf16 peak, [\d.]+% of the (\w+) peak")
# a row of the top-plans table names its plan's matmul dtype; its MFU column is the bf16 one
_PLAN_DTYPE = re.compile(r"\bmatmul_dtype=(\w+)")


def _text_ceiling(argv: list[str], line: str) -> float:
    """The MFU line (or a top-plans row) of a plan whose matmuls compute in fp8/fp4 may pass
    100% of the bf16 peak (its HFU too), up to the system's chip's peak ratio (mfu_ceiling);
    1 elsewhere."""
    m = _COMPUTE_PEAK.search(line) or _PLAN_DTYPE.search(line)
    if not m or "--system" not in argv[:-1]:
        return 1.0
    return mfu_ceiling(argv[argv.index("--system") + 1], m.group(1))


# keys whose values are quantities: numbers (or null) and never negative
_NUMERIC_SUFFIXES = (
    "_s",
    "_bytes",
    "bytes",
    "_per_s",
    "flops",
    "_flops_per_s",
    "params",
    "_usd",
    "usd_per_hour",
    "usd_per_chip_hour",
    "tokens",
    "intensity",
    "_count",
    "n_chips",
    "mfu",
    "hfu",
)
_FRACTION_KEYS = re.compile(r"(^|_)(mfu|hfu|share|fraction|efficiency|utilization)$")
_BF16_REFERENCED = re.compile(r"(^|_)(mfu|hfu)$")  # not mfu_compute_dtype: its own peak
_NON_NEGATIVE_EXEMPT = re.compile(r"(error|bias|delta|diff|signed)", re.I)


_GENERIC_REASONS = ("not a number (", "+infinite (", "-infinite (", "entries [")


def mfu_ceiling(chip_text, compute_dtype) -> float:
    """The most a bf16-referenced MFU can be (training/step.py: `mfu` is model FLOPs over the
    bf16 peak, `mfu_compute_dtype` over the dense matmuls' dtype peak): the chip's
    compute-dtype peak over its bf16 peak, so an fp8/fp4 run may pass 100%; 1 otherwise."""
    if not isinstance(chip_text, str) or not isinstance(compute_dtype, str):
        return 1.0
    from roofline.errors import RooflineError
    from roofline.specs.chip import load_chip
    from roofline.training.step import mfu_peak

    name = chip_text.strip().split(" ")[0].split(":")[0]
    try:
        chip = load_chip(name)
        return max(1.0, chip.peak(compute_dtype, fallback=chip.default_dtype) / mfu_peak(chip))
    except (RooflineError, KeyError, ValueError):
        return 1.0


def _context(x: dict, ceiling: float) -> float:
    """A record naming its chip (`system`/`chip`) and `compute_dtype` sets the MFU ceiling
    for everything inside it."""
    chip = x.get("chip", x.get("system"))
    if isinstance(chip, dict):
        chip = chip.get("name")
    return mfu_ceiling(chip, x.get("compute_dtype")) if "compute_dtype" in x else ceiling


def _json_problems(x, path: str, ceiling: float = 1.0) -> Iterable[str]:
    if isinstance(x, dict):
        ceiling = _context(x, ceiling)
        for k, v in x.items():
            p = f"{path}.{k}"
            if k in ("formulas", "arithmetic", "notes"):  # text about numbers, not numbers
                continue
            if isinstance(v, float) and not math.isfinite(v):
                yield f"{p} is {v} (JSON must hold null with a reason)"
            elif isinstance(v, str) and v.strip().lower() in ("inf", "-inf", "nan", "infinity"):
                yield f"{p} is the string {v!r} in a numeric field"
            elif k.endswith("_reason") and isinstance(v, str) and v.startswith(_GENERIC_REASONS):
                # the writer's fallback: a non-finite float reached the output (docs/json.md)
                yield f"{p}: a non-finite number reached the JSON writer ({v[:40]}...)"
            elif _is_quantity_key(k):
                yield from _quantity_problems(k, v, p, ceiling)
            yield from _json_problems(v, p, ceiling)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            if isinstance(v, float) and not math.isfinite(v):
                yield f"{path}[{i}] is {v}"
            elif isinstance(v, str) and v.strip().lower() in ("inf", "-inf", "nan"):
                yield f"{path}[{i}] is the string {v!r}"
            else:
                yield from _json_problems(v, f"{path}[{i}]", ceiling)


def _is_quantity_key(k: str) -> bool:
    return k.endswith(_NUMERIC_SUFFIXES) and not k.endswith(("_reason", "_source", "_formula"))


def _quantity_problems(k: str, v, path: str, ceiling: float = 1.0) -> Iterable[str]:
    if v is None or isinstance(v, (dict, list)):
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        yield f"{path} = {v!r}: a quantity field holds a {type(v).__name__}"
        return
    if v < 0 and not _NON_NEGATIVE_EXEMPT.search(k):
        yield f"{path} = {v!r} is negative"
    # MFU/HFU against the bf16 peak may pass 1 when the matmuls run in fp8/fp4 (mfu_ceiling)
    limit = ceiling if _BF16_REFERENCED.search(k) else 1.0
    if _FRACTION_KEYS.search(k) and v > limit + 1e-9:
        yield f"{path} = {v!r}: a fraction above {limit:g} ({100 * limit:g}%)"


# -- `roofline ui` requests -------------------------------------------------------------------------

SECRETS = ("root:x:0:0", "CANARY-5b1e")  # /etc/passwd, and the canary file outside the data dir
UI_STATUSES = frozenset({200, 400, 403, 404, 413, 503})


@dataclass
class Response:
    request: dict
    status: int | None
    body: bytes
    seconds: float
    crash: str = ""
    timed_out: bool = False

    def problems(self) -> list[str]:
        if self.timed_out:
            return [f"hang: no answer after {self.seconds:.1f} s"]
        if self.crash:
            return ["traceback: " + self.crash.strip().splitlines()[-1]]
        text = self.body.decode("utf-8", "replace")
        probs = [f"echoed the content of {s!r}" for s in SECRETS if s in text]
        if self.status not in UI_STATUSES:
            probs.append(f"status {self.status}")
        if _must_refuse(self.request) and self.status not in (403, 400):
            probs.append(f"a request without the token or from another site got {self.status}")
        if self.request["path"].startswith("/api/"):
            probs += _api_problems(self.status, text)
        return probs


def _must_refuse(req: dict) -> bool:
    h = req["headers"]
    foreign = h.get("Origin") not in (None, "http://127.0.0.1:8000")
    return (
        h.get("Authorization") != "token fuzz-token"
        or foreign
        or h.get("Sec-Fetch-Site", "none") not in ("none", "same-origin")
    )


def _api_problems(status: int | None, text: str) -> list[str]:
    try:
        doc = json.loads(text, parse_constant=lambda c: float("nan"))
    except json.JSONDecodeError as e:
        return [f"the API answered no JSON ({e.msg})"]
    if status == 200:
        return list(_json_problems(doc, "$"))
    if not isinstance(doc, dict):
        return ["an API error that is not a JSON object"]
    error = str(doc.get("error", ""))
    if not doc.get("what") or not ("Rule:" in error or "Fix:" in error) or "\n" in error:
        return ["an API error without its one paragraph (what, Rule:/Fix:)"]
    return []


def _multipart(fields: dict[str, str], files: dict[str, tuple[str, str | bytes]]):
    boundary = "fuzzboundary7e1"
    out = b""
    for k, v in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n'.encode()
        out += v.encode("utf-8", "surrogatepass") + b"\r\n"
    for k, (name, data) in files.items():
        raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
        out += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"; filename="{name}"\r\n\r\n'
            ).encode()
            + raw
            + b"\r\n"
        )
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


async def _asgi_call(app, req: dict) -> tuple[int, bytes]:
    from urllib.parse import urlencode

    headers = {"Host": "127.0.0.1:8000", **req["headers"]}
    body = b""
    method = "GET"
    query = urlencode(req["params"])
    if req["files"]:
        method = "POST"
        body, headers["Content-Type"] = _multipart(req["params"], req["files"])
        headers["Content-Length"] = str(len(body))
        query = ""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": req["path"], "raw_path": req["path"].encode(), "root_path": "",
        "query_string": query.encode("utf-8", "surrogatepass"),
        "headers": [(k.lower().encode(), v.encode("latin-1", "replace")) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def run_request(app, req: dict, timeout_s: float = 30.0) -> Response:
    """One request to the UI's ASGI app, in-process (no socket), with a wall-clock limit."""
    import asyncio

    status, body, crash, timed_out = None, b"", "", False
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    t0 = time.perf_counter()
    try:
        status, body = asyncio.run(_asgi_call(app, req))
    except CaseTimeout:
        timed_out = True
    except Exception:  # noqa: BLE001 - the fuzz oracle reports every escape
        crash = traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return Response(req, status, body, time.perf_counter() - t0, crash, timed_out)
