"""Prometheus metrics of the running agent, on its own registry.

Live state comes from an :class:`~agent.observe.status.AgentStatus` the agent builds at scrape time,
so nothing on a hot path updates a metric object except the Allocate / GetPreferredAllocation
observer (a counter and a histogram, with cached label children). Labels are bounded: resource,
device (one per advertised group), state, gRPC code; never pods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent import __version__
from agent.observe.status import AgentStatus
from agent.policy.cpuset import EVICTION_REASONS, EVICTION_RESULTS, KINDS
from agent.version import commit

PREFIX = "topology_agent"
DEVICE_STATES: tuple[str, ...] = ("healthy", "allocated", "held-elsewhere", "blocked-by-overlap", "unhealthy-offline")
# Allocate answers from precomputed data: most calls take tens of microseconds.
LATENCY_BUCKETS: tuple[float, ...] = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class AgentMetrics:
    """The registry, and the observer of the gRPC calls (see :class:`agent.plugin.servicer.Observer`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        Info(f"{PREFIX}_build", "Agent version and commit", registry=self.registry).info(
            {"version": __version__, "commit": commit()})
        ProcessCollector(registry=self.registry)  # process_*: CPU seconds, resident memory, open fds, start time
        self.calls = Counter(f"{PREFIX}_rpc_calls", "Allocate and GetPreferredAllocation calls by result",
                             ["method", "resource", "code"], registry=self.registry)
        self.latency = Histogram(f"{PREFIX}_rpc_duration_seconds", "Allocate and GetPreferredAllocation latency",
                                 ["method", "resource"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.unbalanced_allocations = Counter(
            f"{PREFIX}_unbalanced_allocations",
            "Container allocations whose groups (tensor-parallel ranks) differ in size", ["resource"],
            registry=self.registry)
        self.pin_latency = Histogram(
            f"{PREFIX}_cpuset_pin_seconds", "Seconds from a topology container's creation to its cpuset pinned",
            buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0), registry=self.registry)
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def prepare(self, resources: list[str]) -> None:
        """Create every series the gRPC calls can produce up front (at zero): the set of series is then
        fixed from the start, and a first refusal adds none (rates over them need no special case)."""
        for resource in resources:
            for method, codes in (("Allocate", ("OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "INTERNAL")),
                                  ("GetPreferredAllocation", ("OK", "INVALID_ARGUMENT", "INTERNAL"))):
                for code in codes:
                    self._children[(method, resource, code)] = (self.calls.labels(method, resource, code),
                                                                self.latency.labels(method, resource))
            self.unbalanced_allocations.labels(resource)

    def call(self, method: str, resource: str, code: str, seconds: float) -> None:
        key = (method, resource, code)
        children = self._children.get(key)
        if children is None:  # label lookups cost more than the observation: do them once
            children = (self.calls.labels(method, resource, code), self.latency.labels(method, resource))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def unbalanced(self, resource: str) -> None:
        self.unbalanced_allocations.labels(resource).inc()

    def read_status(self, status: Callable[[], AgentStatus]) -> None:
        """Report ``status()`` at every scrape."""
        self.registry.register(StatusCollector(status))


def _threads() -> int | None:
    """Threads of this process, from /proc/self/status (None where there is no procfs)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


Metric = GaugeMetricFamily | CounterMetricFamily


class StatusCollector(Collector):
    def __init__(self, status: Callable[[], AgentStatus]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        s = self.status()
        for part in (_node, _devices, _registrations, _health, _enforcement, _process):
            yield from part(s)


def _node(s: AgentStatus) -> Iterator[Metric]:
    """What the node is."""
    node = GaugeMetricFamily(f"{PREFIX}_node_info", "What the node is",
                             labels=["machine", "fidelity", "dispatching", "smt"])
    node.add_metric([s.machine, s.fidelity, s.dispatching, str(s.smt)], 1)
    yield node


def _devices(s: AgentStatus) -> Iterator[Metric]:
    """The advertised devices: by state, each group's CPUs, --uniform-groups' choice."""
    devices = GaugeMetricFamily(f"{PREFIX}_devices", "Advertised devices by state", labels=["resource", "state"])
    for r in s.resources:
        for state in DEVICE_STATES:
            devices.add_metric([r.resource, state], r.states.get(state, 0))
    yield devices

    cpus = GaugeMetricFamily(f"{PREFIX}_group_cpus", "CPUs of each advertised group", labels=["resource", "device"])
    for resource, device, count in s.groups:
        cpus.add_metric([resource, device], count)
    yield cpus

    if s.uniform:  # --uniform-groups
        size = GaugeMetricFamily(f"{PREFIX}_uniform_group_cpus",
                                 "CPUs of every advertised group of the resource (--uniform-groups)",
                                 labels=["resource"])
        left_out = GaugeMetricFamily(f"{PREFIX}_groups_not_uniform",
                                     "Groups not advertised because their size differs (--uniform-groups)",
                                     labels=["resource"])
        for resource, count, others in s.uniform:
            size.add_metric([resource], count)
            left_out.add_metric([resource], others)
        yield size
        yield left_out


def _registrations(s: AgentStatus) -> Iterator[Metric]:
    """Registrations with kubelet and ListAndWatch streams, per resource."""
    registrations = CounterMetricFamily(f"{PREFIX}_registrations", "Successful registrations with kubelet",
                                        labels=["resource"])
    streams = GaugeMetricFamily(f"{PREFIX}_list_and_watch_streams", "Open ListAndWatch streams",
                                labels=["resource"])
    since = GaugeMetricFamily(f"{PREFIX}_seconds_since_registration",
                              "Seconds since the last successful registration", labels=["resource"])
    for r in s.resources:
        registrations.add_metric([r.resource], r.registrations)
        streams.add_metric([r.resource], r.streams)
        if r.seconds_since_registration is not None:
            since.add_metric([r.resource], r.seconds_since_registration)
    yield registrations
    yield streams
    yield since


def _health(s: AgentStatus) -> Iterator[Metric]:
    """The agent's own health: readiness, exclusivity, the loops' counters, kubelet's CPU manager."""
    yield CounterMetricFamily(f"{PREFIX}_kubelet_restarts", "kubelet restarts detected", value=s.kubelet_restarts)
    yield CounterMetricFamily(f"{PREFIX}_registration_failures", "Failed registration attempts",
                              value=s.registration_failures)
    yield GaugeMetricFamily(f"{PREFIX}_ready", "1 when every resource is registered and watched",
                            value=1 if s.ready else 0)
    yield GaugeMetricFamily(f"{PREFIX}_exclusivity_confirmed",
                            "1 when pod-resources confirms who holds which device; 0 while it does not answer",
                            value=1 if s.exclusivity_confirmed else 0)
    yield GaugeMetricFamily(f"{PREFIX}_pending_holds",
                            "Devices handed out that pod-resources has not shown yet (kept held until it does)",
                            value=s.pending_holds)
    yield GaugeMetricFamily(f"{PREFIX}_dra_unprepare_only_claims",
                            "Claims prepared in DRA mode not unprepared yet, while device-plugin mode keeps the DRA "
                            "plugin registered for their unprepare only (it unregisters at 0)",
                            value=s.dra_claims_to_unprepare)
    yield GaugeMetricFamily(f"{PREFIX}_memory_node_fallbacks",
                            "Groups whose recorded memory node is not a real one (fell back)",
                            value=s.memory_node_fallbacks)
    yield CounterMetricFamily(f"{PREFIX}_topology_rescans", "Topology rescans", value=s.rescans)
    yield CounterMetricFamily(f"{PREFIX}_topology_rescan_failures", "Topology rescans that failed",
                              value=s.rescan_failures)
    yield CounterMetricFamily(f"{PREFIX}_topology_changes", "Device state changes published",
                              value=s.topology_changes)
    yield CounterMetricFamily(f"{PREFIX}_pod_resources_polls", "pod-resources List calls",
                              value=s.pod_resources_polls)
    yield CounterMetricFamily(f"{PREFIX}_pod_resources_failures", "pod-resources List calls that failed",
                              value=s.pod_resources_failures)
    yield CounterMetricFamily(f"{PREFIX}_node_label_patches", "Node label patches sent", value=s.label_patches)
    yield CounterMetricFamily(f"{PREFIX}_node_label_failures", "Node label syncs that failed",
                              value=s.label_failures)
    yield GaugeMetricFamily(f"{PREFIX}_cpu_manager_static",
                            "1 when kubelet's CPU manager runs the static policy (it fights our pinning)",
                            value=1 if s.cpu_manager_static else 0)
    yield GaugeMetricFamily(f"{PREFIX}_cpu_manager_findings", "Warnings about kubelet's CPU manager",
                            value=s.cpu_manager_findings)


def _enforcement(s: AgentStatus) -> Iterator[Metric]:
    """The cpuset enforcement in force and, when one runs, what it did."""
    mode = GaugeMetricFamily(f"{PREFIX}_cpuset_enforcement_mode",
                             "1 for the cpuset enforcement in force (none, cri: after the start, nri: at creation)",
                             labels=["mode"])
    for name in ("none", "cri", "nri"):
        mode.add_metric([name], 1 if s.enforcement_mode == name else 0)
    yield mode
    if s.enforcement is not None:
        e = s.enforcement
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_enforcement_refused",
                                "1 while cpuset enforcement is refused (kubelet's static CPU manager)",
                                value=1 if e.refused else 0)
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_enforcement_failing", "1 while the runtime fails cpuset updates",
                                value=1 if e.failing else 0)
        yield CounterMetricFamily(f"{PREFIX}_cpuset_enforcement_steps", "Looks at the runtime", value=e.steps)
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_topology_containers",
                                "Running containers that hold topology devices", value=e.topology_containers)
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_containers_pinned",
                                "Topology containers running on their groups' CPUs", value=e.pinned)
        updates = CounterMetricFamily(f"{PREFIX}_cpuset_updates", "cpuset updates sent to the runtime",
                                      labels=["kind", "result"])
        for kind in KINDS:
            for result in ("ok", "error"):
                updates.add_metric([kind, result], e.updates.get((kind, result), 0))
        yield updates
        yield CounterMetricFamily(f"{PREFIX}_cpuset_container_refusals",
                                  "cpuset calls the runtime refused for one container (the others went on)",
                                  value=e.container_refusals)
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_containers_refusing",
                                "Containers whose last cpuset call the runtime refused", value=e.refusing)
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_shared_pool_cpus", "CPUs of the shared pool", value=e.pool_cpus)
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_shared_pool_empty",
                                "1 when the shared pool would be empty (nobody is shrunk; NRI refuses new containers "
                                "of it)", value=1 if e.pool_empty else 0)
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_holders_offline",
                                "Topology containers whose groups' CPUs are all offline (run on the shared pool)",
                                value=e.offline)
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_holders_stranded",
                                "Of those, the ones no CPU outside other holders' groups is left for",
                                value=e.stranded)
        yield CounterMetricFamily(f"{PREFIX}_cpuset_creations_refused",
                                  "Container creations NRI refused rather than create them on every CPU",
                                  value=e.creations_refused)
        evictions = CounterMetricFamily(f"{PREFIX}_cpuset_evictions",
                                        "Pod evictions asked of the API server (a stranded holder's pod), by result: "
                                        "evicted, blocked (429, a PodDisruptionBudget), failed, gone (404)",
                                        labels=["reason", "result"])
        for reason in EVICTION_REASONS:
            for result in EVICTION_RESULTS:
                evictions.add_metric([reason, result], e.evictions.get((reason, result), 0))
        yield evictions
        yield GaugeMetricFamily(f"{PREFIX}_cpuset_evictions_pending",
                                "Pods to evict whose eviction the API server has not accepted yet (retried with "
                                "backoff)", value=e.evictions_pending)
        yield CounterMetricFamily(f"{PREFIX}_cpuset_overridden",
                                  "Containers found on another cpuset than the agent set (another NRI plugin, a "
                                  "manual update, a lost update)", value=e.overridden)


def _process(s: AgentStatus) -> Iterator[Metric]:
    """The process's threads and the log records it had to drop."""
    threads = _threads()
    if threads is not None:
        yield GaugeMetricFamily("process_threads", "Threads of the agent's process (Python's and gRPC's)",
                                value=threads)
    yield CounterMetricFamily(f"{PREFIX}_log_records_dropped",
                              "Log records dropped because stderr was not drained fast enough",
                              value=s.log_records_dropped)
