"""``topology-agent serve``: discover, advertise, stay registered until SIGTERM/SIGINT.

Wiring only: the topology comes from :mod:`agent.topology.source`, the groups from
:mod:`agent.policy.grouping`, and the kubelet side from :mod:`agent.plugin.manager`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from agent.devices.persist import load_groups, save_groups
from agent.devices.state import NodeState
from agent.devices.table import ResourceDevices
from agent.errors import TopologyReadError
from agent.node.reporter import LabelerFactory, NodeReporter, default_labeler
from agent.observe.http import HttpEndpoint, make_app
from agent.observe.metrics import AgentMetrics
from agent.plugin.manager import PluginManager
from agent.plugin.podresources import PodResourcesClient, PodResourcesError
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import Grouping, group_topology
from agent.runtime.config import AgentConfig
from agent.runtime.loops import PeriodicLoop
from agent.topology.model import Topology

log = logging.getLogger("topology-agent")

FIRST_SYNC_PATIENCE = 5.0  # seconds to wait for pod-resources before serving after a (re)start

def resource_devices(topology: Topology, grouping: Grouping, settings: AllocationSettings) -> list[ResourceDevices]:
    """One device table per advertised resource. Device.topology is set only on multi-NUMA nodes."""
    multi_numa = topology.machine.has_node_dirs and len(topology.machine.memory_nodes) > 1
    return [ResourceDevices(r, grouping.by_resource(r), settings, numa_topology=multi_numa)
            for r in grouping.resources()]


def log_discovery(topology: Topology, grouping: Grouping) -> None:
    m = topology.machine
    log.info("discovered %d CPUs: %s %s, environment %s, topology facility %s, SMT %d, memory nodes %s",
             len(topology.cpus), m.generation or m.machine_type or m.arch, m.arch, m.environment,
             m.topology_facility, m.smt_threads, ",".join(map(str, m.memory_nodes)))
    log.info("levels %s: %s", ",".join(grouping.levels) or "none", grouping.level_reason)
    for g in grouping.groups:
        log.info("advertising %s %s: cpus %s", g.resource, g.id, g.cpulist,
                 extra={"resource": g.resource, "device": g.id, "cpus": g.cpulist})
    for s in grouping.skipped:
        log.info("not advertised: %s", s.reason, extra={"cpus": ",".join(map(str, s.cpus)), "reason": s.reason})
    for w in grouping.warnings:
        log.warning("%s", w)


class Agent:
    """The running agent: the topology it started with, its groups, live device state, the
    plugin manager, and the loops that keep the state true (pod-resources, rescans)."""

    def __init__(self, topology: Topology, config: AgentConfig,
                 loader: Callable[[], Topology] | None = None,
                 labeler_factory: LabelerFactory = default_labeler,
                 fingerprint: Callable[[], object] | None = None) -> None:
        self.topology = topology
        self.config = config
        self.loader = loader
        self.fingerprint = fingerprint
        self._last_fingerprint: object = fingerprint() if fingerprint is not None else None
        self._quick_rescans = 0
        self.full_rescan_requested = False  # set by SIGHUP
        self.pod_resources = PodResourcesClient(config.pod_resources_socket)
        self.grouping = self._choose_grouping(group_topology(topology, config.grouping))
        self.resources = resource_devices(topology, self.grouping, config.allocation)
        self.state = NodeState(self.grouping, self.resources, config.grouping, config.pending_timeout)
        self.metrics = AgentMetrics()
        self.manager = PluginManager(config.kubelet_dir, self.resources, on_allocate=self.state.record_allocate,
                                     timing=config.timing, check=self.state.check_allocate,
                                     observer=self.metrics.observe)
        self.pod_resources_loop = PeriodicLoop("pod-resources", config.pod_resources_interval,
                                               self.sync_pod_resources, (PodResourcesError,))
        self.rescan_loop = PeriodicLoop("topology rescan", config.rescan_interval, self._periodic_rescan,
                                        (TopologyReadError, OSError))
        self.reporter = NodeReporter(topology, self.grouping, node_name=config.node_name,
                                     labels_enabled=config.node_labels, cpu_manager_state=config.cpu_manager_state,
                                     kubelet_config=config.kubelet_config, labeler_factory=labeler_factory)
        self.label_loop = PeriodicLoop("node labels", config.label_interval if config.node_labels else 0,
                                       self.reporter.sync_labels, ())
        self.metrics.attach(self)
        self.http: HttpEndpoint | None = None

    def sync_pod_resources(self) -> None:
        started = time.monotonic()
        rows = self.pod_resources.list()
        self.state.apply_list(rows, started)

    def _choose_grouping(self, fresh: Grouping) -> Grouping:
        """The groups advertised before a restart while pods hold any of them (their ids and
        CPU sets must not change under running pods), else the groups found now."""
        settings = self.config.grouping
        saved = load_groups(self.config.kubelet_dir, settings)
        chosen = fresh
        if saved is not None and saved.groups != fresh.groups:
            ours = {g.resource for g in saved.groups}
            try:
                held = {(row.resource, d) for row in self.pod_resources.list() if row.resource in ours
                        for d in row.device_ids}
                why = f"pods hold {len(held)} of them" if held else ""
            except PodResourcesError as exc:
                held, why = set(), f"holders unknown ({exc})"
            if why:
                log.warning("keeping the %d groups advertised before the restart (%s); the topology found now "
                            "differs and applies once they are free and the agent restarts", len(saved.groups), why,
                            extra={"reason": why})
                chosen = saved
        save_groups(self.config.kubelet_dir, chosen, settings)
        return chosen

    def _first_pod_resources_sync(self) -> None:
        """Read the holders before serving; kubelet may be restarting too, so retry for a few
        seconds when its socket is there but does not answer (without the socket: go on)."""
        deadline = time.monotonic() + FIRST_SYNC_PATIENCE
        while not self.pod_resources_loop.run_once():
            if not self.config.pod_resources_socket.exists() or time.monotonic() >= deadline:
                log.warning("serving without knowing which groups pods hold; the pod-resources loop keeps trying")
                return
            time.sleep(0.5)

    def _periodic_rescan(self) -> None:
        full, self.full_rescan_requested = self.full_rescan_requested, False
        self.rescan(full)

    def rescan(self, full: bool = False) -> None:
        """Read the topology again and mark groups that are no longer whole (and back).

        A cheap fingerprint (online and present lists, dispatching mode) is checked first; the
        full read runs when it changed, every ``full_rescan_every`` rescans (PR/SM can move CPUs
        between books without any of those changing), and when ``full`` is asked (SIGHUP).
        """
        policy = self.reporter.cpu_manager_policy
        self.reporter.check_cpu_manager()
        if policy != self.reporter.cpu_manager_policy:
            self.label_loop.wake()
        if self.loader is None:
            return
        fingerprint = self.fingerprint() if self.fingerprint is not None else None
        quick = (not full and fingerprint is not None and fingerprint == self._last_fingerprint
                 and self._quick_rescans + 1 < self.config.full_rescan_every)
        if quick:
            self._quick_rescans += 1
            return
        self._quick_rescans = 0
        self.state.apply_topology(self.loader())
        self._last_fingerprint = fingerprint

    def ready(self) -> bool:
        """Every advertised resource is registered and kubelet watches it (trivially true with none)."""
        return not self.resources or self.manager.ready()

    def alive(self) -> bool:
        return self.manager.alive()

    def allocations(self) -> dict[str, object]:
        """The live device state, for /allocations."""
        states = self.state.states()
        holders = self.state.holders()
        devices = []
        for g in self.grouping.groups:
            key = (g.resource, g.id)
            s = states[key]
            devices.append({"resource": g.resource, "id": g.id, "cpus": g.cpulist, "health": s.health,
                            "state": s.state, "reason": s.reason, "holders": holders.get(key, [])})
        return {
            "ready": self.ready(),
            "resources": self.grouping.resources(),
            "devices": devices,
            "blocked": [d for d in devices if d["state"] == "blocked-by-overlap"],
            "unhealthy": [d for d in devices if d["health"] != "Healthy"],
        }

    def start(self) -> None:
        log_discovery(self.topology, self.grouping)
        if self.config.metrics_port is not None:
            app = make_app(self.metrics.registry, self.alive, self.ready, self.allocations)
            self.http = HttpEndpoint(self.config.metrics_address, self.config.metrics_port, app)
        self.reporter.check_cpu_manager()
        if self.config.node_labels:  # labels say what the node is even when it advertises nothing
            self.label_loop.start()
            self.label_loop.wake()
        if not self.resources:
            log.warning("nothing to advertise on this node; staying up without registering")
            if self.http is not None:
                self.http.start()
            return
        # Know what is in use, and what is whole, before serving: a restarted agent must not hand
        # out held groups, nor groups (kept from before the restart) that lost CPUs meanwhile.
        self.state.apply_topology(self.topology)
        self._first_pod_resources_sync()
        self.state.start_publisher()
        self.manager.start()
        self.pod_resources_loop.start()
        self.rescan_loop.start()
        if self.http is not None:
            self.http.start()

    def stop(self) -> None:
        self.label_loop.stop()
        self.rescan_loop.stop()
        self.pod_resources_loop.stop()
        self.manager.stop()
        self.state.stop_publisher()
        self.pod_resources.close()
        if self.http is not None:
            self.http.stop()
        log.info("stopped: sockets removed")


def run_until_signalled(agent: Agent) -> int:
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        stop.set()

    def rescan_now(signum: int, _frame: object) -> None:
        log.info("received SIGHUP: rescanning topology")
        if agent.rescan_loop.running:
            agent.full_rescan_requested = True
            agent.rescan_loop.wake()
        else:  # periodic rescans are off: read once, off the signal handler
            threading.Thread(target=agent.rescan, kwargs={"full": True}, name="sighup-rescan", daemon=True).start()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, rescan_now)
    try:
        agent.start()
        stop.wait()
    finally:
        agent.stop()
        for s, h in previous.items():
            signal.signal(s, h)
    return 0
