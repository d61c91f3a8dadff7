"""Asking the API server to evict the pods the cpuset plan names (:attr:`agent.policy.cpuset.CpusetPlan.evict`: the pod
of a stranded holder, which no cpuset keeps off other pods' CPUs), through the policy/v1 Eviction subresource, so that
its PodDisruptionBudgets and termination grace are honoured (``--stranded-policy evict``).

Must hold: never in the way of anything (:meth:`Evictions.want` only records and wakes; the calls are made on a thread
of its own, started for the first pod to evict); a pod is asked for only once the plans have named it for ``settle``
seconds in a row, once if accepted, again with backoff while refused and named, never once the plan no longer names
it; a pod the API server does not know is gone already. Design: docs/contributing/design/cpuset-enforcement.md."""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from agent.backoff import Backoff
from agent.errors import AgentError, KubeApiError
from agent.policy.cpuset import Eviction
from agent.worker import Worker

if TYPE_CHECKING:  # the API client is made on the thread, at the first eviction
    from agent.node.kubeapi import EvictionApi

log = logging.getLogger("topology-agent.cpuset")

TIMEOUT = 10.0  # seconds for one eviction call
FIRST_RETRY, MAX_RETRY = 5.0, 120.0  # the backoff of refused or failed evictions
SETTLE = 10.0  # seconds a pod must stay named before it is asked for


class Evictions(Worker):
    """The pods to evict, and the thread that asks for them."""

    join_timeout = TIMEOUT + 1  # a call under way may take its timeout

    def __init__(self, api: Callable[[], EvictionApi], *, first: float = FIRST_RETRY, cap: float = MAX_RETRY,
                 timeout: float = TIMEOUT, settle: float = SETTLE, clock: Callable[[], float] = time.monotonic,
                 thread: bool = True) -> None:
        super().__init__(thread_name="evictions")
        self._make_api = api  # called on the thread, at the first eviction: no API client before one is needed
        self._api: EvictionApi | None = None
        self.backoff = Backoff(first, cap)
        self.timeout = timeout
        self.settle = settle
        self.clock = clock
        self.threaded = thread  # False: no thread, the caller runs run_once (tests)
        self._counts: dict[tuple[str, str], int] = {}  # (reason, result) -> calls
        self._wanted: dict[tuple[str, str], Eviction] = {}  # what the last plan names
        self._since: dict[tuple[str, str], float] = {}  # of those, when the plans began to name each (clock)
        self._asked: set[tuple[str, str]] = set()  # of those, the ones the API server accepted (or does not know)
        self._said: dict[tuple[str, str], str] = {}  # pod -> the last failure logged for it
        self._lock = threading.Lock()

    def want(self, evictions: Iterable[Eviction]) -> None:
        """The pods the plan names now (never blocks: any thread may call it)."""
        wanted = {e.key: e for e in evictions}
        now = self.clock()
        with self._lock:
            new = wanted.keys() - self._wanted.keys() - self._asked
            self._asked &= wanted.keys()
            self._since = {k: self._since.get(k, now) for k in wanted}
            self._said = {k: v for k, v in self._said.items() if k in wanted}
            self._wanted = wanted
            start = bool(new) and self.threaded and self._thread is None and not self._stop.is_set()
            if start:
                self._thread = self._new_thread()
        if start and self._thread is not None:
            self._thread.start()
        if new:
            self._wake.set()  # the thread looks when a new pod is due; the ones refused keep their backoff

    @property
    def pending(self) -> int:
        """Pods the plan names whose eviction the API server has not accepted yet."""
        with self._lock:
            return len(self._wanted.keys() - self._asked)

    def counts(self) -> dict[tuple[str, str], int]:
        """(reason, result) -> eviction calls so far."""
        with self._lock:
            return dict(self._counts)

    def run_once(self) -> tuple[bool, float | None]:
        """Ask for every pod the plans have named for ``settle`` seconds and the API server has not accepted: (none
        was left to retry, the seconds until the next pod is due; None: none is waiting)."""
        now = self.clock()
        with self._lock:
            waiting = {k: self._since[k] + self.settle - now for k in self._wanted if k not in self._asked}
            todo = [self._wanted[k] for k, left in waiting.items() if left <= 0]
            later = [left for left in waiting.values() if left > 0]
        due = min(later) if later else None
        done = True
        for eviction in todo:
            if self._stop.is_set():
                return False, due
            result = self._ask(eviction)
            with self._lock:
                self._counts[(eviction.reason, result)] = self._counts.get((eviction.reason, result), 0) + 1
                if result in ("evicted", "gone"):
                    if eviction.key in self._wanted:
                        self._asked.add(eviction.key)
                    self._said.pop(eviction.key, None)
            done = done and result in ("evicted", "gone")
        return done, due

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done, due = self.run_once()
            except Exception:  # the thread must go on whatever one call does
                log.exception("evicting pods failed")
                done, due = False, None
            if done:
                self.backoff.reset()
                delay = due  # None: until the plan names a new pod, or a stop
            else:
                retry = self.backoff.next()
                delay = retry if due is None else min(retry, due)
            self._pause(delay)

    def _ask(self, eviction: Eviction) -> str:
        who = f"{eviction.namespace}/{eviction.pod}"
        try:
            if self._api is None:
                self._api = self._make_api()
            self._api.evict_pod(eviction.namespace, eviction.pod, self.timeout)
        except KubeApiError as exc:
            if exc.not_found:
                log.info("pod %s is gone: no eviction needed (%s)", who, eviction.reason,
                         extra={"reason": eviction.reason})
                return "gone"
            result = "blocked" if exc.status == 429 else "failed"
            self._failed(eviction, result, str(exc))
            return result
        except (AgentError, OSError, http.client.HTTPException) as exc:  # no API configuration, no answer
            self._failed(eviction, "failed", str(exc) or type(exc).__name__)
            return "failed"
        log.warning("evicted pod %s (%s): %s", who, eviction.reason, eviction.why, extra={"reason": eviction.reason})
        return "evicted"

    def _failed(self, eviction: Eviction, result: str, message: str) -> None:
        """Said once per pod and message; the pod is asked again after the backoff while the plan names it."""
        with self._lock:
            if self._said.get(eviction.key) == message:
                return
            self._said[eviction.key] = message
        what = ("a PodDisruptionBudget allows no disruption now" if result == "blocked"
                else "the API server did not accept it")
        log.warning("cannot evict pod %s/%s (%s) yet: %s (%s); asked again with backoff while it is %s",
                    eviction.namespace, eviction.pod, eviction.reason, what, message, eviction.reason,
                    extra={"reason": message})
