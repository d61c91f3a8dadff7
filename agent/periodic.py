"""The periodic loop: one step every interval on a thread of its own (a :class:`agent.worker.Worker`), with backoff
on failure and one log line when a source goes away and one when it comes back (never one per poll)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent.backoff import Backoff
from agent.worker import Worker

log = logging.getLogger("topology-agent")

BACKOFF_FACTOR_CAP = 10  # a failing source is looked at again after at most 10 intervals (5 min at 30 s)


def backoff_delay(interval: float, failures: int, cap_factor: float = BACKOFF_FACTOR_CAP) -> float:
    """The wait after ``failures`` failures in a row: the interval when none, then doubling from twice
    the interval, capped at ``cap_factor`` intervals (so a source that comes back is noticed within it)."""
    if failures <= 0:
        return interval
    return Backoff(2 * interval, interval * cap_factor).nominal(failures - 1)


class PeriodicLoop(Worker):
    """Calls ``step`` every ``interval`` seconds (and when woken) until stopped.

    A step that raises one of ``expected`` errors is retried with backoff (:class:`~agent.backoff.Backoff`, from
    twice the interval up to ``max_backoff``); the first failure of a streak is logged as a warning, the recovery once.
    """

    def __init__(self, name: str, interval: float, step: Callable[[], object],
                 expected: tuple[type[BaseException], ...], max_backoff: float = 30.0,
                 on_failure: Callable[[BaseException], None] | None = None,
                 pace: Callable[[], float] | None = None) -> None:
        super().__init__(thread_name=name)
        self.name = name
        self.interval = interval
        self.pace = pace  # the wait after a successful step, when it varies (default: interval)
        self.current_delay = interval
        self.step = step
        self.expected = expected
        self.max_backoff = max_backoff
        self.on_failure = on_failure
        self.failing = False
        self.runs = 0
        self.failures = 0

    def run_once(self) -> bool:
        """One step now, in the caller's thread; True when it succeeded."""
        self.runs += 1
        try:
            self.step()
        except self.expected as exc:
            self.failures += 1
            if not self.failing:
                log.warning("%s failing, keeping the last known state and retrying with backoff: %s", self.name, exc,
                            extra={"reason": str(exc)})
            self.failing = True
            if self.on_failure is not None:
                self.on_failure(exc)
            return False
        if self.failing:
            log.info("%s works again", self.name)
        self.failing = False
        return True

    def _run(self) -> None:
        backoff = Backoff(min(2 * self.interval, self.max_backoff), self.max_backoff)
        delay = self.interval
        while not self._stop.is_set():
            self._pause(delay)
            if self._stop.is_set():
                return
            try:  # the pace too: nothing may end the loop
                if self.run_once():
                    backoff.reset()
                    delay = self.pace() if self.pace is not None else self.interval
                else:
                    delay = backoff.next()
            except Exception:  # never let the loop die: log and keep going
                log.exception("%s failed unexpectedly", self.name)
                delay = backoff.next()
            self.current_delay = delay

    def start(self) -> None:
        if self.interval > 0:  # 0: off, no thread (run_once still works)
            super().start()
