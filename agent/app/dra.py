"""DRA mode in the running agent (``--mode dra``): its part of the composition root, and the manager that is what
:class:`agent.plugin.manager.PluginManager` is in device-plugin mode.

The manager serves the kubelet plugin (:mod:`agent.dra.kubelet_plugin`) and keeps the node's ResourceSlices true
(:mod:`agent.dra.publisher`): at start, when the kubelet takes the registration (a kubelet start wipes the node's
slices), when a group stops or starts being whole (its device taint), and every ``interval`` seconds a look (one
List, no write unless something is missing or differs). The same broken groups go to kubelet's health stream
(:mod:`agent.dra.health`) at once. The discovery, grouping, planning, state and enforcement
are the device-plugin mode's own (:func:`build_dra_manager` is handed them by :func:`agent.app.build.build_agent`).

The prepared claims are holds in the node's device table from the prepare on (a prepare is a hold at once, in every
enforcement mode: the listeners, the cpuset enforcement among them, hear of it), and the groups the device-plugin
mode holds (pods admitted before a switch to DRA mode) are tainted in the slices, with those overlapping them, until
they are free (:meth:`agent.devices.table.NodeDevices.in_use_elsewhere`); a claim on them is refused.
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
from agent.dra.kubelet_plugin import KubeletPlugin
from agent.dra.prepare import ClaimPreparer, checkpoint_path
from agent.dra.publisher import DraApi, SlicePublisher
from agent.dra.served import ServedApi, check_served
from agent.errors import AgentError, NodeLabelerError, StartupError
from agent.node.handover import ExtendedResourcesClear
from agent.node.kubeapi import kube_api_from_environment
from agent.plugin.podresources import PodResourcesClient
from agent.plugin.servicer import Wire
from agent.policy.claims import PreparedRequest
from agent.policy.dra import DRIVER, PoolPlan, SliceSettings, build_pool
from agent.policy.grouping import Grouping
from agent.policy.health import DeviceKey
from agent.topology.model import Topology

log = logging.getLogger("topology-agent.dra")

DEFAULT_INTERVAL = 60.0  # seconds between looks at the slices (a List) when nothing changes
HANDOVER_LOOK = 1.0  # seconds between looks at the Node while it still offers our names through a device plugin


Taints = tuple[dict[DeviceKey, str], dict[DeviceKey, str]]  # (not whole, in use by the device-plugin mode)


class DraManager:
    def __init__(self, *, plugin: KubeletPlugin, publisher: SlicePublisher,
                 plan: Callable[[Mapping[DeviceKey, str], Mapping[DeviceKey, str]], PoolPlan],
                 broken: Callable[[], Mapping[DeviceKey, str]], resources: list[str],
                 interval: float = DEFAULT_INTERVAL,
                 in_use: Callable[[], Mapping[DeviceKey, str]] = dict,
                 handover: ExtendedResourcesClear | None = None) -> None:
        self.plugin = plugin
        self.handover = handover  # the Node's allocatable offers our names no more (the scheduler takes DRA's path)
        self.publisher = publisher
        self.plan = plan
        self.broken = broken
        self.in_use = in_use
        self.resources = resources
        self.restarts = 0  # kubelet restarts seen (re-registrations after the first)
        self.published = False
        self.last_error: str | None = None
        self._started = False
        self._last: Taints | None = None
        self._claim_listeners: list[Callable[[], None]] = []
        plugin.on_registered = self._registered
        self.loop = PeriodicLoop("ResourceSlice publication", interval, self.step, (AgentError, OSError),
                                 on_failure=self._failed, pace=self._pace)

    # --- the step -------------------------------------------------------------------------------
    def _taints_now(self) -> Taints:
        """The unhealthy groups (told to kubelet's health streams on the way) and those in use elsewhere, now."""
        broken = dict(self.broken())
        if self.plugin.health is not None:
            self.plugin.health.update(broken)
        return broken, dict(self.in_use())

    def step(self) -> None:
        broken, in_use = taints = self._taints_now()
        if self._last is not None and taints != self._last:
            log.warning("republishing ResourceSlices: unhealthy groups now %s; in use by the device-plugin mode %s",
                        ", ".join(sorted(d for _, d in broken)) or "none",
                        ", ".join(sorted(d for _, d in in_use)) or "none")
        self._last = taints
        if not self.plugin.registration_socket_present():
            log.warning("the DRA registration socket %s is gone: serving it again", self.plugin.registration_path)
            self.plugin.stop()
            self.plugin.start()
        self.publisher.publish(self.plan(broken, in_use))
        self.published = True
        self.last_error = None
        if self.handover is not None:
            self.handover.step()

    def _pace(self) -> float:
        """Every second while the Node still offers our names through the device-plugin API (kubelet's status sync
        takes up to 10 s), else every ``interval``."""
        waiting = self.handover is not None and not self.handover.done and self.handover.unknown is None
        return min(self.loop.interval, HANDOVER_LOOK) if waiting else self.loop.interval

    def _failed(self, exc: BaseException) -> None:
        self.last_error = str(exc)

    def _registered(self) -> None:
        if self.plugin.registrations > 1:
            self.restarts += 1
        self.loop.wake()

    def changed(self) -> None:
        """Device states changed (a NodeDevices listener): tell kubelet's health streams, republish when the
        tainted sets differ."""
        taints = self._taints_now()
        if self._last is not None and taints != self._last:
            self.loop.wake()

    # --- for the NRI enforcement ---------------------------------------------------------------
    def prepared_requests(self) -> Mapping[str, PreparedRequest]:
        """The prepared claims' requests by ``<claim uid>/<request>`` (memory only: the NRI hooks call it)."""
        return self.plugin.preparer.requests()

    def on_claims_changed(self, listener: Callable[[], None]) -> None:
        """``listener()`` after a claim was prepared or unprepared (the pool changed); it must not block."""
        self._claim_listeners.append(listener)

    def claims_changed(self) -> None:
        """The preparer's change callback: tell every listener (the node's device table first)."""
        for listener in self._claim_listeners:
            listener()

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

    def withdraw_slices(self) -> int:
        """The last agent of DRA mode on its node stops (a switch, an uninstall): publish no more and delete the
        node's slices, so that the scheduler allocates nothing more here; the plugin keeps serving meanwhile."""
        self.loop.stop()
        deleted = self.publisher.remove_all()
        log.info("deleted %d ResourceSlice(s) of this node: the scheduler allocates no claim here until the next "
                 "DRA agent publishes", deleted)
        return deleted

    def ready(self) -> bool:
        """Published, registered, and the scheduler takes DRA's path for our extended resource names: a pod created
        once this is true (``helm upgrade --wait`` returned) is not bound through a device plugin that is gone."""
        return (self.published and self.plugin.registered and self.last_error is None
                and (self.handover is None or self.handover.ready()))

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




def dra_api() -> DraApi:
    """The API server DRA mode speaks to: in a pod with its service account, else a kubeconfig."""
    try:
        return kube_api_from_environment()
    except NodeLabelerError as exc:
        raise StartupError(f"--mode dra needs the API server: {exc}") from None


def remove_node_slices(node_name: str) -> int:
    """Delete ``node_name``'s ResourceSlices of the DRA driver (the API server as DRA mode speaks to it: in a pod,
    its service account); the count deleted. ``serve`` hands it to the uninstall clean-up in DRA mode."""
    return SlicePublisher(dra_api(), node_name, DRIVER).remove_all()


def build_dra_manager(config: AgentConfig, topology: Topology, grouping: Grouping, devices: NodeDevices[Wire],
                      pod_resources: PodResourcesClient) -> DraManager:
    if not config.node_name:
        raise StartupError("--mode dra needs NODE_NAME (the chart sets it from spec.nodeName): the node's "
                           "ResourceSlices and pool are named after it")
    try:
        settings = SliceSettings(config.node_name).validated()
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    api = dra_api()
    if isinstance(api, ServedApi):  # the agent's client always is (a test's stand-in for the API server may not be)
        check_served(api)  # refuses an API server older than the slices the agent writes, in one line
    preparer = ClaimPreparer(driver=DRIVER, pool=settings.node_name, groups={g.id: g for g in grouping.groups},
                             allocation=config.allocation, read_claim=api.read_claim, cdi_dir=config.cdi_dir,
                             checkpoint=checkpoint_path(config.kubelet_dir), check=devices.claim_conflict)
    publisher = SlicePublisher(api, settings.node_name, DRIVER)

    def plan(broken: Mapping[DeviceKey, str], in_use: Mapping[DeviceKey, str]) -> PoolPlan:
        return build_pool(grouping, topology, settings, broken, in_use)

    def broken() -> dict[tuple[str, str], str]:
        with devices.lock:
            return dict(devices.broken)

    health = HealthService(pool=settings.node_name, devices=[d["name"] for d in plan({}, {}).devices], broken=broken)
    plugin = KubeletPlugin(driver=DRIVER, registry_dir=config.dra_registry_dir, plugin_dir=config.dra_plugin_dir,
                           preparer=preparer, health=health)

    # pod-resources lists DRA claims per container (build_agent set it up): admin access is observed, not held.
    pod_resources.dra_admin = preparer.admin_devices
    handover = ExtendedResourcesClear(kube_api_from_environment, settings.node_name, grouping.resources())
    manager = DraManager(plugin=plugin, publisher=publisher, plan=plan, broken=broken,
                         resources=grouping.resources(), interval=config.dra_interval,
                         in_use=devices.in_use_elsewhere, handover=handover)
    preparer.on_change = manager.claims_changed
    manager.on_claims_changed(lambda: devices.set_claims(preparer.holds()))  # first: the holds, then the others
    devices.set_claims(preparer.holds())  # the checkpoint's claims hold their devices before anything is served
    devices.add_listener(manager.changed)
    return manager
