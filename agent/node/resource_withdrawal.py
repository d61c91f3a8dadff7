"""Taking the node's extended resources out of the scheduler's device-plugin path when the node goes to the other mode
(the decisions, and the upstream behaviour they follow: :mod:`agent.policy.allocatable`).

* :func:`withdraw_device_plugin`: the last device-plugin agent on its node writes its resources' allocatable to zero
  while it still serves, drains, and writes it again if kubelet's status sync wrote the old value back;
* :class:`ExtendedResourcesClear`: a DRA agent is Ready only once the Node offers none of its extended resources
  (writing the zero itself when an older agent stopped without it).

Must hold: never raises (needs ``patch`` on ``nodes/status``; without it, or the API server, one warning, and
kubelet's status sync closes the gap). Design: docs/contributing/design/mode-handover.md."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from agent.node.kubeapi import NodeStatusApi
from agent.policy.allocatable import still_allocatable, zero_patch

log = logging.getLogger("topology-agent.handover")

REQUEST_TIMEOUT = 5.0
DRAIN = 2.0  # seconds the plugin keeps serving after the zero: scheduler watch, binding, kubelet admission
TRIES = 3


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def withdraw_device_plugin(api: NodeStatusApi, node: str, resources: Sequence[str], *, why: str,
                           drain: float = DRAIN, tries: int = TRIES,
                           sleep: Callable[[float], None] = time.sleep) -> bool:
    """Take ``resources`` out of ``node``'s allocatable before the device plugin stops (it keeps serving meanwhile);
    True when the Node shows them at zero. Never raises: a failure is one warning."""
    names = ", ".join(resources)
    for _ in range(tries):
        try:
            api.patch_node_status(node, zero_patch(resources), REQUEST_TIMEOUT)
        except Exception as exc:
            log.warning("cannot withdraw %s from node %s's allocatable (%s): until kubelet's next status sync the "
                        "scheduler may bind pods that kubelet then refuses (UnexpectedAdmissionError)", names, node,
                        _why(exc), extra={"reason": _why(exc)})
            return False
        sleep(drain)  # still serving: what the scheduler bound before it saw the zero is admitted now
        try:
            left = still_allocatable(api.node_allocatable(node, REQUEST_TIMEOUT), resources)
        except Exception as exc:
            log.warning("cannot read node %s back after withdrawing %s (%s)", node, names, _why(exc))
            return False
        if not left:
            log.info("withdrew %s from node %s's allocatable before stopping (%s): the scheduler binds no new pod "
                     "for them here until their next server registers", names, node, why)
            return True
        log.info("kubelet wrote %s back meanwhile (its status sync, from devices still served): withdrawing again",
                 ", ".join(f"{r}={v}" for r, v in left.items()))
    log.warning("node %s still offers %s after %d tries: stopping anyway", node, names, tries)
    return False


class ExtendedResourcesClear:
    """DRA mode: whether the Node's allocatable still offers the agent's extended resource names (a device plugin's
    value kubelet has not replaced yet), made zero when it does. :meth:`step` until :attr:`done`."""

    def __init__(self, api: Callable[[], NodeStatusApi], node: str, resources: Sequence[str]) -> None:
        self._factory = api
        self._api: NodeStatusApi | None = None
        self.node = node
        self.resources = tuple(resources)
        self.done = False
        self.unknown: str | None = None  # why the Node cannot be asked (then readiness does not wait for it)

    def ready(self) -> bool:
        return self.done or self.unknown is not None

    def step(self) -> None:
        if self.done:
            return
        try:
            if self._api is None:
                self._api = self._factory()
            left = still_allocatable(self._api.node_allocatable(self.node, REQUEST_TIMEOUT), self.resources)
        except Exception as exc:  # the Node cannot be read: readiness does not wait for what cannot be seen
            if self.unknown != _why(exc):
                log.warning("cannot make sure node %s offers %s through DRA only (%s): until kubelet's next status "
                            "sync a pod asking for them may be bound through the device-plugin API and refused",
                            self.node, ", ".join(self.resources), _why(exc), extra={"reason": _why(exc)})
            self.unknown = _why(exc)
            return
        self.unknown = None
        if left:
            log.info("node %s still offers %s through the device-plugin API (kubelet's status sync lags): writing the "
                     "zero kubelet writes once it syncs, so that the scheduler serves them through DRA", self.node,
                     ", ".join(f"{r}={v}" for r, v in left.items()))
            try:
                self._api.patch_node_status(self.node, zero_patch(left), REQUEST_TIMEOUT)
                left = still_allocatable(self._api.node_allocatable(self.node, REQUEST_TIMEOUT), self.resources)
            except Exception as exc:  # not Ready until kubelet's status sync writes the zero (10 s by default)
                log.warning("cannot write the zero to node %s (%s): waiting for kubelet's status sync", self.node,
                            _why(exc), extra={"reason": _why(exc)})
                return
        self.done = not left
        if self.done:
            log.info("node %s offers %s through DRA only", self.node, ", ".join(self.resources))
