"""What every fuzz target shares: the registry (``door`` turns a property into a hypothesis test and lists it), the
per-call bound, and the three outcomes: the right answer, a clear refusal (``refused``: the defined error type, one
line), or a failure of the target (a crash, a hang, lost state).

A target module is ``tests/fuzz/fuzz_<door>.py`` (not ``test_*``: ``make test`` does not collect them); the runner
(tests/fuzz/runner.py) imports every one and runs what they registered.
"""

from __future__ import annotations

import functools
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import given
from hypothesis import strategies as st

CALL_SECONDS = 5.0  # one input's bound: every door answers in milliseconds, a hundred times that is a hang
MAX_MESSAGE = 1000  # a refusal is one line a person reads: no traceback, no dump of the input

T = TypeVar("T")


class Hang(AssertionError):
    """One input ran past CALL_SECONDS."""


@dataclass
class Target:
    name: str
    door: str
    test: Callable[[], None]  # the hypothesis test
    calls: list[int] = field(default_factory=lambda: [0])


TARGETS: dict[str, Target] = {}
SKIPPED: dict[str, str] = {}  # targets that cannot run here, and why
BOUND = {"on": True}  # the atheris engine bounds each input itself (-timeout): no SIGALRM of ours then


@contextmanager
def bounded(seconds: float = CALL_SECONDS) -> Iterator[None]:
    """Raise Hang in the main thread when the block runs longer than ``seconds``."""
    if not BOUND["on"]:
        yield
        return

    def fire(_signum: int, _frame: Any) -> None:
        raise Hang(f"one input ran longer than {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def door(name: str, door_name: str, *strategies: st.SearchStrategy[Any], **kw: st.SearchStrategy[Any]
         ) -> Callable[[Callable[..., None]], Callable[[], None]]:
    """Register ``fn`` as target ``name`` of ``door_name``: a hypothesis test over ``strategies``, each call bounded
    and counted."""

    def wrap(fn: Callable[..., None]) -> Callable[[], None]:
        calls = [0]

        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> None:
            calls[0] += 1
            started = time.monotonic()
            with bounded():
                fn(*args, **kwargs)
            assert time.monotonic() - started < CALL_SECONDS, "one input ran past the bound"

        test = given(*strategies, **kw)(counted)
        TARGETS[name] = Target(name, door_name, test, calls)
        return test

    return wrap


def one_line(exc: BaseException) -> str:
    message = str(exc)
    assert message, f"{type(exc).__name__} without a message"
    assert "\n" not in message, f"{type(exc).__name__} over several lines: {message[:200]!r}"
    assert "Traceback" not in message, message[:200]
    return message


def refused(call: Callable[[], T], *errors: type[BaseException], bound: int = MAX_MESSAGE) -> T | BaseException:
    """``call()``'s answer, or the refusal it raised: one of ``errors``, with one line of at most ``bound``
    characters. Any other exception escapes (the target fails)."""
    try:
        return call()
    except errors as exc:
        assert len(one_line(exc)) <= bound, f"a refusal of {len(str(exc))} characters: {str(exc)[:200]!r}"
        return exc
