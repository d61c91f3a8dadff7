"""A thread of its own: the one way the agent's long-lived workers start, wake and stop.

A :class:`Worker` runs :meth:`Worker._run` on a daemon thread from :meth:`Worker.start` until :meth:`Worker.stop`;
:meth:`Worker.wake` cuts its current wait short. Must hold: ``stop`` sets the stop flag before it wakes the thread (a
wait that ends sees it), and joins with a bound (``join_timeout``), so a stuck step never holds the agent's exit.
:func:`stop_together` stops several parts at once against one deadline: slow ones never add up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("topology-agent")


class Worker:
    join_timeout = 5.0  # seconds stop() waits for the thread

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        """The thread's body: loops until ``self._stop`` is set."""
        raise NotImplementedError

    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def start(self) -> None:
        self._thread = self._new_thread()
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def request_stop(self) -> None:
        """Ask the thread to end after its current step; no wait (:meth:`stop` waits)."""
        self._stop.set()
        self._wake.set()

    def stop(self) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _pause(self, seconds: float | None) -> None:
        """Wait until woken or ``seconds`` pass (None: until woken), and take the wake-up."""
        self._wake.wait(seconds)
        self._wake.clear()


def stop_together(parts: Sequence[tuple[str, Callable[[], object]]], deadline: float, floor: float = 0.5) -> list[str]:
    """Call every part's stop at once, each on a daemon thread of its own, and wait for them until ``deadline``
    (``time.monotonic()``), or ``floor`` seconds when it has passed: a stop that started late still gets its quick
    steps done (a socket removed). The names of those still stopping, left behind (they never hold the exit)."""
    def run(name: str, stop: Callable[[], object]) -> None:
        try:
            stop()
        except Exception:  # the others stop regardless
            log.exception("stopping the %s failed", name)

    threads = []
    for name, stop in parts:
        thread = threading.Thread(target=run, args=(name, stop), name=f"stop {name}", daemon=True)
        thread.start()
        threads.append((name, thread))
    wait_until = max(deadline, time.monotonic() + floor)
    for _, thread in threads:
        thread.join(timeout=max(0.0, wait_until - time.monotonic()))
    return [name for name, thread in threads if thread.is_alive()]
