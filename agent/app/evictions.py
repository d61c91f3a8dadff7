"""Asking the API server to evict the pods the cpuset plan names (:attr:`agent.policy.cpuset.CpusetPlan.evict`: the
pod of a stranded holder, which no cpuset keeps off other pods' CPUs), through the policy/v1 Eviction subresource,
so that the pod's PodDisruptionBudgets and its termination grace are honoured (``--stranded-policy evict``).

Never in the way of anything: :meth:`Evictions.want` only records what the plan names (the NRI handlers and the CRI
loop call it at every plan) and wakes a thread of its own, started for the first pod to evict, which makes the calls.
Each pod is asked once: an accepted eviction is remembered while the plan still names the pod (it terminates
meanwhile), and forgotten once it does not. A refusal (429: a PodDisruptionBudget allows no disruption now; any
other answer or no answer) is logged once per pod and reason and tried again with backoff
(:class:`agent.backoff.Backoff`) for as long as the plan names the pod; a pod the plan no longer names (a CPU came
back, a group was freed) is not asked again. A pod the API server does not know (404) is gone already.
"""

from __future__ import annotations

import http.client
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from agent.backoff import Backoff
from agent.errors import AgentError, KubeApiError
from agent.policy.cpuset import Eviction

if TYPE_CHECKING:  # the API client is made on the thread, at the first eviction
    from agent.node.kubeapi import EvictionApi

log = logging.getLogger("topology-agent.cpuset")

TIMEOUT = 10.0  # seconds for one eviction call
FIRST_RETRY, MAX_RETRY = 5.0, 120.0  # the backoff of refused or failed evictions


class Evictions:
    """The pods to evict, and the thread that asks for them."""

    def __init__(self, api: Callable[[], EvictionApi], *, first: float = FIRST_RETRY, cap: float = MAX_RETRY,
                 timeout: float = TIMEOUT) -> None:
        self._make_api = api  # called on the thread, at the first eviction: no API client before one is needed
        self._api: EvictionApi | None = None
        self.backoff = Backoff(first, cap)
        self.timeout = timeout
        self._counts: dict[tuple[str, str], int] = {}  # (reason, result) -> calls
        self._wanted: dict[tuple[str, str], Eviction] = {}  # what the last plan names
        self._asked: set[tuple[str, str]] = set()  # of those, the ones the API server accepted (or does not know)
        self._said: dict[tuple[str, str], str] = {}  # pod -> the last failure logged for it
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def want(self, evictions: Iterable[Eviction]) -> None:
        """The pods the plan names now (never blocks: any thread may call it)."""
        wanted = {e.key: e for e in evictions}
        with self._lock:
            new = wanted.keys() - self._wanted.keys() - self._asked
            self._asked &= wanted.keys()
            self._said = {k: v for k, v in self._said.items() if k in wanted}
            self._wanted = wanted
            start = bool(new) and self._thread is None and not self._stop.is_set()
            if start:
                self._thread = threading.Thread(target=self._run, name="evictions", daemon=True)
        if start and self._thread is not None:
            self._thread.start()
        if new:
            self._wake.set()  # a new pod is asked for at once; the ones refused keep their backoff

    @property
    def pending(self) -> int:
        """Pods the plan names whose eviction the API server has not accepted yet."""
        with self._lock:
            return len(self._wanted.keys() - self._asked)

    def counts(self) -> dict[tuple[str, str], int]:
        """(reason, result) -> eviction calls so far."""
        with self._lock:
            return dict(self._counts)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=TIMEOUT + 1)

    def run_once(self) -> bool:
        """Ask for every pod the plan names and the API server has not accepted; True when none was left to retry."""
        with self._lock:
            todo = [e for k, e in self._wanted.items() if k not in self._asked]
        done = True
        for eviction in todo:
            if self._stop.is_set():
                return False
            result = self._ask(eviction)
            with self._lock:
                self._counts[(eviction.reason, result)] = self._counts.get((eviction.reason, result), 0) + 1
                if result in ("evicted", "gone"):
                    if eviction.key in self._wanted:
                        self._asked.add(eviction.key)
                    self._said.pop(eviction.key, None)
            done = done and result in ("evicted", "gone")
        return done

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done = self.run_once()
            except Exception:  # the thread must go on whatever one call does
                log.exception("evicting pods failed")
                done = False
            if done:
                self.backoff.reset()
                self._wake.wait()  # until the plan names a new pod, or a stop
            else:
                self._wake.wait(self.backoff.next())
            self._wake.clear()

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
