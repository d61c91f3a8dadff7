"""DRA mode in the running agent: what :class:`agent.plugin.manager.PluginManager` is in device-plugin mode.

It serves the kubelet plugin (:mod:`agent.dra.kubelet_plugin`) and keeps the node's ResourceSlices true
(:mod:`agent.dra.publisher`): at start, when the kubelet takes the registration (a kubelet start wipes the node's
slices), when a group stops or starts being whole (its device taint), and every ``interval`` seconds a look (one
List, no write unless something is missing or differs). The discovery, grouping, planning, state and enforcement
are the device-plugin mode's own (the composition root passes them in).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from agent.app.loops import PeriodicLoop
from agent.dra.kubeclient import ApiError
from agent.dra.kubelet_plugin import KubeletPlugin
from agent.dra.publisher import SlicePublisher
from agent.errors import AgentError
from agent.policy.dra import PoolPlan

log = logging.getLogger("topology-agent.dra")

DEFAULT_INTERVAL = 60.0  # seconds between looks at the slices (a List) when nothing changes


class DraManager:
    def __init__(self, *, plugin: KubeletPlugin, publisher: SlicePublisher,
                 plan: Callable[[Mapping[tuple[str, str], str]], PoolPlan],
                 broken: Callable[[], Mapping[tuple[str, str], str]], resources: list[str],
                 interval: float = DEFAULT_INTERVAL) -> None:
        self.plugin = plugin
        self.publisher = publisher
        self.plan = plan
        self.broken = broken
        self.resources = resources
        self.restarts = 0  # kubelet restarts seen (re-registrations after the first)
        self.published = False
        self.last_error: str | None = None
        self._started = False
        self._last_broken: dict[tuple[str, str], str] | None = None
        plugin.on_registered = self._registered
        self.loop = PeriodicLoop("ResourceSlice publication", interval, self.step, (ApiError, AgentError, OSError),
                                 on_failure=self._failed)

    # --- the step -------------------------------------------------------------------------------
    def step(self) -> None:
        broken = dict(self.broken())
        if self._last_broken is not None and broken != self._last_broken:
            log.warning("republishing ResourceSlices: unhealthy groups now %s",
                        ", ".join(sorted(d for _, d in broken)) or "none")
        self._last_broken = broken
        if not self.plugin.registration_socket_present():
            log.warning("the DRA registration socket %s is gone: serving it again", self.plugin.registration_path)
            self.plugin.stop()
            self.plugin.start()
        self.publisher.publish(self.plan(broken))
        self.published = True
        self.last_error = None

    def _failed(self, exc: BaseException) -> None:
        self.last_error = str(exc)

    def _registered(self) -> None:
        if self.plugin.registrations > 1:
            self.restarts += 1
        self.loop.wake()

    def changed(self) -> None:
        """Device states changed (a NodeDevices listener): republish when the unhealthy set differs."""
        if self._last_broken is not None and dict(self.broken()) != self._last_broken:
            self.loop.wake()

    # --- PluginManager's face -------------------------------------------------------------------
    def start(self) -> None:
        self.plugin.start()
        self._started = True
        if not self.loop.run_once():  # the first publication before anything else; the loop retries
            log.warning("first ResourceSlice publication failed (%s); retrying", self.last_error)
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()
        self.plugin.stop()
        self._started = False

    def ready(self) -> bool:
        return self.published and self.plugin.registered and self.last_error is None

    def alive(self) -> bool:
        return not self._started or self.loop.running or self.loop.interval <= 0

    @property
    def registrations(self) -> dict[str, int]:
        return {r: self.plugin.registrations for r in self.resources}

    @property
    def registration_failures(self) -> int:
        return self.plugin.registration_failures

    def streams_open(self, resource: str) -> int:
        return 0

    def seconds_since_registration(self, resource: str) -> float | None:
        at = self.plugin.registered_at
        return None if at is None else time.monotonic() - at

    def wait_registered(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.plugin.registered:
                return True
            threading.Event().wait(0.05)
        return self.plugin.registered
