"""A thread of its own: the one way the agent's long-lived workers start, wake and stop.

A :class:`Worker` runs :meth:`Worker._run` on a daemon thread from :meth:`Worker.start` until :meth:`Worker.stop`;
:meth:`Worker.wake` cuts its current wait short. Must hold: ``stop`` sets the stop flag before it wakes the thread (a
wait that ends sees it), and joins with a bound (``join_timeout``), so a stuck step never holds the agent's exit.
"""

from __future__ import annotations

import threading


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

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _pause(self, seconds: float | None) -> None:
        """Wait until woken or ``seconds`` pass (None: until woken), and take the wake-up."""
        self._wake.wait(seconds)
        self._wake.clear()
