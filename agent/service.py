"""``topology-agent serve``: discover, advertise, stay registered until SIGTERM/SIGINT.

Wiring only: the topology comes from :mod:`agent.topology.source`, the groups from
:mod:`agent.policy.grouping`, and the kubelet side from :mod:`agent.plugin.manager`.
"""

from __future__ import annotations

import logging
import signal
import threading

from agent.config import AgentConfig
from agent.plugin.devices import ResourceDevices
from agent.plugin.manager import PluginManager
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import Grouping, group_topology
from agent.topology.model import Topology

log = logging.getLogger("topology-agent")

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
    """The running agent: one topology, its groups, and the plugin manager."""

    def __init__(self, topology: Topology, config: AgentConfig) -> None:
        self.topology = topology
        self.config = config
        self.grouping = group_topology(topology, config.grouping)
        self.resources = resource_devices(topology, self.grouping, config.allocation)
        self.manager = PluginManager(config.kubelet_dir, self.resources, timing=config.timing)

    def start(self) -> None:
        log_discovery(self.topology, self.grouping)
        if not self.resources:
            log.warning("nothing to advertise on this node; staying up without registering")
            return
        self.manager.start()

    def stop(self) -> None:
        self.manager.stop()
        log.info("stopped: sockets removed")


def run_until_signalled(agent: Agent) -> int:
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        agent.start()
        stop.wait()
    finally:
        agent.stop()
        for s, h in previous.items():
            signal.signal(s, h)
    return 0
