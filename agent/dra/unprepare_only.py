"""DRA mode's kubelet plugin, kept for unprepare only by an agent in device-plugin mode whose DRA checkpoint still holds
prepared claims (the agent ran in DRA mode before a switch): kubelet finishes a pod only once the driver of its
claims has unprepared them, and retries while no plugin of that name is registered (the pod stays Terminating), so
the plugin registers, answers NodeUnprepareResources (CDI files and checkpoint entries removed), refuses every claim it
does not hold, publishes no ResourceSlice (and deletes the node's), and unregisters, its sockets removed, once no
prepared claim is left.

Must hold: no new claim is prepared in device-plugin mode (its devices are the device plugin's to hand out); the
plugin stays registered while any claim is prepared, and a little longer than the last unprepare's answer takes; the
claims' devices stay held in the node's device table until pod-resources drops them (:mod:`agent.app.build`). Why:
docs/contributing/design/mode-handover.md.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from agent.dra.kubelet_plugin import KubeletPlugin
from agent.errors import AgentError, KubeApiError
from agent.periodic import PeriodicLoop

log = logging.getLogger("topology-agent.dra")

LOOK = 10.0  # seconds between looks (the registration socket, the slices) while nothing changes
LINGER = 2.0  # seconds the plugin stays registered after the last claim went: that unprepare's answer goes out first


class SliceRemover(Protocol):
    """Deletes the node's ResourceSlices of the driver (:class:`agent.dra.publisher.SlicePublisher`)."""

    def remove_all(self) -> int: ...


class UnprepareOnly:
    """The DRA plugin of a device-plugin agent, while prepared claims are left (started only when some are)."""

    def __init__(self, *, plugin: KubeletPlugin, slices: SliceRemover | None, interval: float = LOOK,
                 linger: float = LINGER) -> None:
        self.plugin = plugin
        self.preparer = plugin.preparer
        self.slices = slices  # None: no API access (the DRA agent that handed over deleted them already)
        self.slices_cleared = slices is None
        self.linger = linger
        self.wanted = False  # claims were left at the start, and some may still be
        self.serving = False  # its sockets are served
        self.served = False  # they were served once
        self._empty_since: float | None = None
        self._lock = threading.Lock()
        self.loop = PeriodicLoop("DRA plugin for unprepare only", interval, self.step, (AgentError, OSError),
                                 pace=self._pace)

    def claims_left(self) -> int:
        """Prepared claims not unprepared yet."""
        return len(self.preparer.claims)

    def registered(self) -> bool:
        """Serving, and kubelet took the registration."""
        return self.serving and self.plugin.registered

    def start(self) -> None:
        left = self.claims_left()
        if not left:
            return
        log.warning("the DRA checkpoint holds %d claim(s) prepared in DRA mode: serving the DRA plugin for their "
                    "unprepare only (no ResourceSlices, no new claims) until none is left", left,
                    extra={"claims": left})
        self.wanted = True
        self.loop.run_once()  # serves, or says why not; the loop retries with backoff
        self.loop.start()

    def changed(self) -> None:
        """A claim was unprepared or forgotten (the preparer's change callback): look now; it does not block."""
        self.loop.wake()

    def step(self) -> None:
        with self._lock:
            if not self.wanted:
                return
            if self.claims_left():
                self._empty_since = None
            else:
                now = time.monotonic()
                self._empty_since = self._empty_since if self._empty_since is not None else now
                if not self.serving or now - self._empty_since >= self.linger:
                    self._unserve()
                    self.wanted = False
                    log.info("every claim prepared in DRA mode is unprepared: the DRA plugin is unregistered")
                    return
            if not self.serving:
                self._serve()
            elif not self.plugin.registration_socket_present():
                log.warning("the DRA registration socket %s is gone: serving it again", self.plugin.registration_path)
                self._unserve()
                self._serve()
        if not self.slices_cleared and self.slices is not None:
            try:
                deleted = self.slices.remove_all()
            except KubeApiError as exc:
                if exc.status not in (401, 403):
                    raise  # the API server away: retried with backoff
                log.warning("not allowed to delete this node's ResourceSlices (%s): the chart grants it beside its "
                            "node-restriction policy only", exc, extra={"reason": str(exc)})
                deleted = 0
            self.slices_cleared = True
            if deleted:
                log.info("deleted %d ResourceSlice(s) of this node: device-plugin mode publishes none", deleted)

    def _serve(self) -> None:
        """Both sockets, or neither (an error says why: kubelet cannot end those claims' pods meanwhile)."""
        try:
            self.plugin.start()
        except (AgentError, OSError):
            self.plugin.stop()
            raise
        self.serving = self.served = True

    def _unserve(self) -> None:
        if self.serving:
            self.plugin.stop()
            self.serving = False

    def _pace(self) -> float:
        """The linger's end while no claim is left, else every ``interval``."""
        since = self._empty_since
        if self.serving and since is not None:
            return max(0.05, min(self.loop.interval, since + self.linger - time.monotonic()))
        return self.loop.interval

    def stop(self) -> None:
        self.loop.stop()
        with self._lock:
            self._unserve()
