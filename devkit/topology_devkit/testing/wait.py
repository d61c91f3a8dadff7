"""One wait with a deadline: call a check until it gives something truthy, or fail saying what was awaited.

The failure names what was awaited, for how long, and the last answer seen (an exception the caller tolerates
counts as an answer), so a test or bench that times out says why. :class:`WaitTimeout` is both an AssertionError
(a failed test, not an error in it) and a TimeoutError (what callers of a bounded wait catch). Never a fixed sleep:
a wait returns as soon as its condition holds, so a loaded machine only makes it slower, not wrong.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError, TimeoutError):
    """A wait ran out of time; the message says what it waited for."""


def _last(value: object) -> str:
    if isinstance(value, BaseException):
        detail = getattr(value, "stderr", None) or str(value)  # a failed command says why on its stderr
        return f"; last: {type(value).__name__}: {str(detail).strip()[-500:]}"
    if value is None or isinstance(value, bool):
        return ""
    return f"; last: {value!r}"[:600]


def wait_until(what: str, check: Callable[[], T | None], timeout: float, *, every: float = 0.02,
               tolerate: tuple[type[BaseException], ...] = (),
               error: Callable[[str], BaseException] = WaitTimeout) -> T:
    """Call ``check`` every ``every`` seconds until it returns something truthy, and return that.

    After ``timeout`` seconds raise ``error`` (default :class:`WaitTimeout`) with ``what`` and the last answer.
    Exceptions of the ``tolerate`` types count as a falsy answer (a command that fails until a thing is there)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
        except tolerate as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise error(f"timed out after {timeout:g} s waiting for {what}{_last(last)}")
        time.sleep(every)


def poll_until(check: Callable[[], object], timeout: float, *, every: float = 0.01) -> bool:
    """Call ``check`` until it holds or ``timeout`` seconds pass; whether it held. For a caller that decides what
    a timeout means itself (a best-effort clean-up, a negative check); :func:`wait_until` is the one that fails."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            return bool(check())
        time.sleep(every)
    return True


async def await_until(what: str, check: Callable[[], object], timeout: float, *, every: float = 0.01) -> None:
    """:func:`wait_until` for a test whose servers run on its own event loop: it sleeps with ``asyncio.sleep``, so
    those servers answer while it waits."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}{_last(value)}")
        await asyncio.sleep(every)
