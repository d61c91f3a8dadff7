"""Prometheus metrics of the running agent, on its own registry.

State (devices by state, streams, registrations, rescans, polls, label patches) is read from
the agent at scrape time by a collector, so nothing on a hot path updates a metric object
except the Allocate / GetPreferredAllocation observer (a counter and a histogram). Labels are
bounded: resource, device (one per advertised group), state, gRPC code; never pods.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent import __version__

if TYPE_CHECKING:
    from agent.runtime.agent import Agent

PREFIX = "topology_agent"
DEVICE_STATES: tuple[str, ...] = ("healthy", "allocated", "blocked-by-overlap", "unhealthy-offline")
# Allocate answers from precomputed data: most calls take tens of microseconds.
LATENCY_BUCKETS: tuple[float, ...] = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        Info(f"{PREFIX}_build", "Agent version", registry=self.registry).info({"version": __version__})
        self.calls = Counter(f"{PREFIX}_rpc_calls", "Allocate and GetPreferredAllocation calls by result",
                             ["method", "resource", "code"], registry=self.registry)
        self.latency = Histogram(f"{PREFIX}_rpc_duration_seconds", "Allocate and GetPreferredAllocation latency",
                                 ["method", "resource"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def observe(self, method: str, resource: str, code: str, seconds: float) -> None:
        key = (method, resource, code)
        children = self._children.get(key)
        if children is None:  # label lookups cost more than the observation: do them once
            children = (self.calls.labels(method, resource, code), self.latency.labels(method, resource))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def attach(self, agent: Agent) -> None:
        self.registry.register(AgentCollector(agent))


class AgentCollector(Collector):
    """Reads the agent's current state at scrape time."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        a = self.agent
        m = a.topology.machine
        node = GaugeMetricFamily(f"{PREFIX}_node_info", "What the node is",
                                 labels=["machine", "fidelity", "dispatching", "smt"])
        node.add_metric([m.generation or m.machine_type or m.arch, a.grouping.fidelity, m.dispatching,
                         str(m.smt_threads)], 1)
        yield node

        states = a.state.states()
        devices = GaugeMetricFamily(f"{PREFIX}_devices", "Advertised devices by state",
                                    labels=["resource", "state"])
        tally = Tally((res, s.state) for (res, _), s in states.items())
        for resource in a.grouping.resources():
            for state in DEVICE_STATES:
                devices.add_metric([resource, state], tally[(resource, state)])
        yield devices

        cpus = GaugeMetricFamily(f"{PREFIX}_group_cpus", "CPUs of each advertised group",
                                 labels=["resource", "device"])
        for g in a.grouping.groups:
            cpus.add_metric([g.resource, g.id], len(g.cpus))
        yield cpus

        manager = a.manager
        registrations = CounterMetricFamily(f"{PREFIX}_registrations", "Successful registrations with kubelet",
                                            labels=["resource"])
        streams = GaugeMetricFamily(f"{PREFIX}_list_and_watch_streams", "Open ListAndWatch streams",
                                    labels=["resource"])
        since = GaugeMetricFamily(f"{PREFIX}_seconds_since_registration",
                                  "Seconds since the last successful registration", labels=["resource"])
        now = time.time()
        for resource in a.grouping.resources():
            registrations.add_metric([resource], manager.registrations.get(resource, 0))
            server = manager.servers.get(resource)
            streams.add_metric([resource], server.servicer.streams.open if server is not None else 0)
            if resource in manager.last_registered:
                since.add_metric([resource], now - manager.last_registered[resource])
        yield registrations
        yield streams
        yield since
        yield CounterMetricFamily(f"{PREFIX}_kubelet_restarts", "kubelet restarts detected", value=manager.restarts)
        yield CounterMetricFamily(f"{PREFIX}_registration_failures", "Failed registration attempts",
                                  value=manager.registration_failures)
        yield GaugeMetricFamily(f"{PREFIX}_ready", "1 when every resource is registered and watched",
                                value=1 if a.ready() else 0)

        yield GaugeMetricFamily(f"{PREFIX}_memory_node_fallbacks",
                                "Groups whose recorded memory node is not a real one (fell back)",
                                value=len(a.grouping.warnings))
        yield CounterMetricFamily(f"{PREFIX}_topology_rescans", "Topology rescans", value=a.rescan_loop.runs)
        yield CounterMetricFamily(f"{PREFIX}_topology_rescan_failures", "Topology rescans that failed",
                                  value=a.rescan_loop.failures)
        yield CounterMetricFamily(f"{PREFIX}_topology_changes", "Device state changes published",
                                  value=a.state.changes)
        yield CounterMetricFamily(f"{PREFIX}_pod_resources_polls", "pod-resources List calls",
                                  value=a.pod_resources_loop.runs)
        yield CounterMetricFamily(f"{PREFIX}_pod_resources_failures", "pod-resources List calls that failed",
                                  value=a.pod_resources_loop.failures)
        yield CounterMetricFamily(f"{PREFIX}_node_label_patches", "Node label patches sent",
                                  value=a.reporter.patches)
        yield CounterMetricFamily(f"{PREFIX}_node_label_failures", "Node label syncs that failed",
                                  value=a.reporter.failures)
        policy = GaugeMetricFamily(f"{PREFIX}_cpu_manager_static",
                                   "1 when kubelet's CPU manager runs the static policy (it fights our pinning)")
        policy.add_metric([], 1 if a.reporter.cpu_manager_policy == "static" else 0)
        yield policy
        yield GaugeMetricFamily(f"{PREFIX}_cpu_manager_findings", "Warnings about kubelet's CPU manager",
                                value=len(a.reporter.findings))
