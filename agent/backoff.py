"""The one retry delay of every loop that retries (the plugin manager's registration, the NRI connection, the
enforcement and upkeep loops, the periodic loops, the ResourceSlice conflicts): doubling from ``first`` up to
``cap``, jittered, back to ``first`` after a success.

The jitter takes up to ``jitter`` (a fraction) off each delay, never adds: ``cap`` stays the longest wait, and agents
of many nodes that lost the same API server or runtime at the same moment do not all come back in step.
:meth:`Backoff.wait` sleeps the next delay on an event, so a stop or a wake (kubelet back, a change to act on) ends
the wait at once.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable


class Backoff:
    def __init__(self, first: float, cap: float, *, factor: float = 2.0, jitter: float = 0.2,
                 rand: Callable[[], float] = random.random) -> None:
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter is a fraction in [0, 1): {jitter}")
        self.first = first
        self.cap = max(cap, first)
        self.factor = factor
        self.jitter = jitter
        self.rand = rand
        self.failures = 0  # in a row, since the last reset

    def nominal(self, failures: int) -> float:
        """The delay after ``failures + 1`` failures in a row, before the jitter."""
        return min(self.first * self.factor ** min(failures, 64), self.cap)

    def next(self) -> float:
        """One more failure: the delay to wait before the next try."""
        delay = self.nominal(self.failures)
        self.failures += 1
        return delay * (1.0 - self.jitter * self.rand())

    def reset(self) -> None:
        """A success: the next failure waits ``first`` again."""
        self.failures = 0

    def wait(self, event: threading.Event) -> bool:
        """Wait the next delay, or until ``event`` is set; True when it was set."""
        return event.wait(self.next())
