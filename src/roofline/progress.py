"""Progress bars with an ETA on long work: validate, calibrate, report, verify and the large
train/serve searches (issue 22 item 9). tqdm draws them on stderr.

A bar is shown only when both stdout and stderr are terminals and the command prints no JSON
(the CLI runs a `--json` command inside `allowed(False)`); a pipe, a file, a CI log, the web UI
and the Python API (both capture stdout) never get one, so documents and logs stay clean.
A bar appears after DELAY_S seconds of work (`ROOFLINE_PROGRESS_DELAY=SECONDS` changes it), so
quick commands never flicker, and is erased when the work ends (what the command prints is
unchanged). `ROOFLINE_PROGRESS=0` turns them off.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

DELAY_S = 0.5  # no bar for work shorter than this
_ALLOWED: ContextVar[bool] = ContextVar("roofline_progress_allowed", default=True)


def enabled() -> bool:
    """Whether a bar may be drawn now (see the module doc)."""
    if not _ALLOWED.get() or os.environ.get("ROOFLINE_PROGRESS", "").strip() == "0":
        return False
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


@contextlib.contextmanager
def allowed(on: bool) -> Iterator[None]:
    """Within it, bars are drawn only if `on` (and they were allowed outside)."""
    token = _ALLOWED.set(bool(on) and _ALLOWED.get())
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def _sized() -> bool:
    """Whether the terminal reports its size (a fresh pty, e.g. under `script` or a CI runner,
    has a 0x0 window, where tqdm would draw a bar of no columns on row -1: nothing)."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (AttributeError, ValueError, OSError):
        return False
    return size.columns > 0 and size.lines > 0


def _delay() -> float:
    """DELAY_S, or ROOFLINE_PROGRESS_DELAY when it is a number of seconds >= 0."""
    try:
        d = float(os.environ.get("ROOFLINE_PROGRESS_DELAY", DELAY_S))
    except ValueError:
        return DELAY_S
    return d if d >= 0 else DELAY_S  # NaN and negatives fall back too


def _bar(total: float | None, desc: str, unit: str) -> Any:
    from tqdm import tqdm

    sized = _sized()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=sized,  # follow a resize; a window of 0 columns would draw nothing
        ncols=None if sized else 80,
        nrows=None if sized else 24,
        delay=_delay(),
        mininterval=0.2,
    )


def _finish(b: Any) -> None:
    """Draw a bar's finished state even when it came within tqdm's mininterval of the last draw
    (a loop quicker than one refresh would otherwise end on its first, ETA-less frame); a bar
    still inside its delay stays undrawn, so quick work never flickers."""
    if b._time() - b.start_t >= b.delay:
        b.refresh()


class _Staged:
    """A drawn bar for `bar`: tqdm's own, but a new description waits out the bar's delay like
    any other redraw (tqdm's set_description draws at once, so a step quicker than the delay
    left a half-finished frame behind that close() never cleared: it erases only bars it drew)."""

    def __init__(self, b: Any) -> None:
        self._b = b

    def update(self, n: float = 1) -> None:
        self._b.update(n)

    def set_description(self, desc: str) -> None:
        b = self._b
        b.set_description(desc, refresh=b._time() - b.start_t >= b.delay)


class _Silent:
    """What `bar` yields when no bar is drawn: the same calls, doing nothing."""

    def update(self, n: float = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass


def track(
    items: Iterable[T], desc: str, *, total: int | None = None, unit: str = "it"
) -> Iterator[T]:
    """`items`, with a bar counting them off when one may be drawn."""
    if not enabled():
        yield from items
        return
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with _bar(total, desc, unit) as b:
        for x in items:
            yield x
            b.update(1)
        _finish(b)


@contextlib.contextmanager
def bar(total: float | None, desc: str, *, unit: str = "it") -> Iterator[Any]:
    """A bar to `update(n)` by hand (stages of one long step), or a silent stand-in."""
    if not enabled():
        yield _Silent()
        return
    with _bar(total, desc, unit) as b:
        yield _Staged(b)
        _finish(b)


def counter(desc: str, *, unit: str = "it") -> Callable[[int, int], None] | None:
    """A `(done, total)` callback that draws a bar, for loops that count for themselves (the
    training planner's costing); None when no bar may be drawn. The bar closes at done == total."""
    if not enabled():
        return None
    state: dict[str, Any] = {}

    def show(done: int, total: int) -> None:
        b = state.get("bar")
        if b is None:
            b = state["bar"] = _bar(total, desc, unit)
        b.update(done - b.n)
        if done >= total:
            _finish(b)
            b.close()
            state.pop("bar")

    return show


def write(message: str) -> None:
    """A line on stderr that does not tear a bar being drawn (tqdm.write when one may be)."""
    if enabled():
        from tqdm import tqdm

        tqdm.write(message, file=sys.stderr)
    else:
        print(message, file=sys.stderr)


__all__ = ["DELAY_S", "allowed", "bar", "counter", "enabled", "track", "write"]
