"""DRA mode in the running agent (``--mode dra``): its part of the composition root, and the manager that is what
:class:`agent.plugin.manager.PluginManager` is in device-plugin mode.

The manager serves the kubelet plugin (:mod:`agent.dra.kubelet_plugin`) and keeps the node's ResourceSlices true
(:mod:`agent.dra.publisher`): at start, when the kubelet takes the registration (a kubelet start wipes the node's
slices), when a group stops or starts being whole (its device taint), and every ``interval`` seconds a look (one
List, no write unless something is missing or differs). The same broken groups go to kubelet's health stream
(:mod:`agent.dra.health`) at once. The discovery, grouping, planning, state and enforcement
are the device-plugin mode's own (:func:`build_dra_manager` is handed them by :func:`agent.app.build.build_agent`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from agent.app.config import AgentConfig
from agent.app.loops import PeriodicLoop
from agent.devices.table import NodeDevices
from agent.dra.health import HealthService
from agent.dra.kubeclient import ApiError
from agent.dra.kubelet_plugin import KubeletPlugin
from agent.dra.prepare import ClaimPreparer
from agent.dra.publisher import SlicePublisher
from agent.errors import AgentError, StartupError
from agent.plugin.podresources import PodResourcesClient
from agent.plugin.servicer import Wire
from agent.policy.claims import PreparedRequest
from agent.policy.dra import DRIVER, PoolPlan, SliceSettings, build_pool
from agent.policy.grouping import Grouping
from agent.topology.model import Topology

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
    def _broken_now(self) -> dict[tuple[str, str], str]:
        """The unhealthy groups now, told to kubelet's health streams on the way."""
        broken = dict(self.broken())
        if self.plugin.health is not None:
            self.plugin.health.update(broken)
        return broken

    def step(self) -> None:
        broken = self._broken_now()
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
        """Device states changed (a NodeDevices listener): tell kubelet's health streams, republish when the
        unhealthy set differs."""
        broken = self._broken_now()
        if self._last_broken is not None and broken != self._last_broken:
            self.loop.wake()

    # --- for the NRI enforcement ---------------------------------------------------------------
    def prepared_requests(self) -> Mapping[str, PreparedRequest]:
        """The prepared claims' requests by ``<claim uid>/<request>`` (memory only: the NRI hooks call it)."""
        return self.plugin.preparer.requests()

    def on_claims_changed(self, listener: Callable[[], None]) -> None:
        """``listener()`` after a claim was prepared or unprepared (the pool changed); it must not block."""
        self.plugin.preparer.on_change = listener

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


STATE_SUBDIR = "s390x-topology-agent/dra"
CHECKPOINT = "claims.json"


def build_dra_manager(config: AgentConfig, topology: Topology, grouping: Grouping, devices: NodeDevices[Wire],
                      pod_resources: PodResourcesClient) -> DraManager:
    if not config.node_name:
        raise StartupError("--mode dra needs NODE_NAME (the chart sets it from spec.nodeName): the node's "
                           "ResourceSlices and pool are named after it")
    try:
        settings = SliceSettings(config.node_name).validated()
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    from agent.dra.kubeclient import KubernetesDraApi

    api = KubernetesDraApi()
    preparer = ClaimPreparer(driver=DRIVER, pool=settings.node_name, groups={g.id: g for g in grouping.groups},
                             allocation=config.allocation, read_claim=api.read_claim, cdi_dir=config.cdi_dir,
                             checkpoint=config.kubelet_dir / STATE_SUBDIR / CHECKPOINT)
    publisher = SlicePublisher(api, settings.node_name, DRIVER)

    def plan(broken: Mapping[tuple[str, str], str]) -> PoolPlan:
        return build_pool(grouping, topology, settings, broken)

    def broken() -> dict[tuple[str, str], str]:
        with devices.lock:
            return dict(devices.broken)

    health = HealthService(pool=settings.node_name, devices=[d["name"] for d in plan({}).devices], broken=broken)
    plugin = KubeletPlugin(driver=DRIVER, registry_dir=config.dra_registry_dir, plugin_dir=config.dra_plugin_dir,
                           preparer=preparer, health=health)

    # pod-resources lists DRA claims per container: the holds (and the cpuset enforcement) come from there.
    pod_resources.dra_driver = DRIVER
    pod_resources.dra_devices = {g.id: g.resource for g in grouping.groups}
    manager = DraManager(plugin=plugin, publisher=publisher, plan=plan, broken=broken,
                         resources=grouping.resources(), interval=config.dra_interval)
    devices.add_listener(manager.changed)
    return manager
