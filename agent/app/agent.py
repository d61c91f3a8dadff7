"""The running agent: finished parts (made by :func:`agent.app.build.build_agent`) that it starts,
keeps true with its loops (pod-resources, rescans, node labels) and stops. No I/O in the constructor."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import select
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

from agent.app.config import AgentConfig
from agent.devices.serving import DeviceServer
from agent.devices.table import NodeDevices
from agent.dra.unprepare_only import UnprepareOnly
from agent.enforce.engine import EnforcementEngine
from agent.enforce.evictions import Evictions
from agent.errors import PodResourcesError, TopologyReadError
from agent.node.reporter import NodeReporter
from agent.observe.http import HttpEndpoint, make_app
from agent.observe.logs import dropped_records
from agent.observe.metrics import AgentMetrics
from agent.observe.report import machine_line
from agent.observe.status import AgentStatus, EnforcementStatus, ResourceStatus
from agent.periodic import PeriodicLoop, backoff_delay
from agent.plugin.podresources import PodResourcesClient
from agent.plugin.servicer import Wire
from agent.policy.grouping import Grouping
from agent.topology.model import Topology
from agent.worker import stop_together

log = logging.getLogger("topology-agent")

SLOW_POD_RESOURCES = 30.0  # seconds between pod-resources Lists while nothing is held
IDLE_AFTER = 60.0  # seconds after the last change of hands before pod-resources slows down
# Agent.stop's one deadline (plus half a second per stage for a stage that started late): with the log's flush at exit
# well inside the chart's terminationGracePeriodSeconds (30), before kubelet's SIGKILL.
STOP_BOUND = 10.0
# From SIGTERM to the process's end, hand-over (before_stop), stop and exit included, at most (run_until_signalled's
# watchdog): 5 s before kubelet's SIGKILL under the chart's terminationGracePeriodSeconds (30), with the stacks said.
EXIT_BOUND = 25.0


def exclusivity_confirmed(config: AgentConfig, devices: NodeDevices[Wire]) -> bool:
    """The holders are known from pod-resources (or pod-resources is off: nothing to confirm)."""
    return config.pod_resources_interval <= 0 or devices.exclusivity_confirmed()


def log_discovery(topology: Topology, grouping: Grouping) -> None:
    log.info("discovered %d CPUs, %s", len(topology.cpus), machine_line(topology.machine))
    log.info("levels %s: %s", ",".join(grouping.levels) or "none", grouping.level_reason)
    for g in grouping.groups:
        log.info("advertising %s %s: cpus %s", g.resource, g.id, g.cpulist,
                 extra={"resource": g.resource, "device": g.id, "cpus": g.cpulist})
    for s in grouping.skipped:
        log.info("not advertised: %s", s.reason, extra={"cpus": ",".join(map(str, s.cpus)), "reason": s.reason})
    for w in grouping.warnings:
        log.warning("%s", w)


class LatestTopology:
    """The topology as last read (rescans replace it); its online CPUs for the cpuset enforcement."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def online(self) -> frozenset[int]:
        return frozenset(c.cpu for c in self.topology.cpus if c.online and c.configured)


class Agent:
    """The topology it started with, its groups, the node's device table, the plugin manager, the
    node reporter, metrics, the HTTP endpoint and the loops that keep the state true."""

    def __init__(self, *, topology: Topology, config: AgentConfig, grouping: Grouping, devices: NodeDevices[Wire],
                 manager: DeviceServer, pod_resources: PodResourcesClient, reporter: NodeReporter,
                 metrics: AgentMetrics, http: HttpEndpoint | None, latest: LatestTopology,
                 loader: Callable[[], Topology] | None = None, fingerprint: Callable[[], object] | None = None,
                 first_fingerprint: object = None, enforcement: EnforcementEngine | None = None,
                 enforcement_mode: str = "none", evictions: Evictions | None = None,
                 dra_unprepare_only: UnprepareOnly | None = None) -> None:
        self.topology = topology
        self.config = config
        self.grouping = grouping
        self.devices = devices
        self.manager = manager
        self.pod_resources = pod_resources
        self.reporter = reporter
        self.metrics = metrics
        self.http = http
        self.loader = loader
        self.latest = latest
        self.enforcement = enforcement
        self.evictions = evictions  # --stranded-policy evict: the pods the enforcement asks the API server to evict
        self.dra_unprepare_only = dra_unprepare_only  # device-plugin mode: the DRA plugin for claims left prepared
        self._enforcement_mode = enforcement_mode  # none | cri | nri: the one chosen at start
        self.fingerprint = fingerprint
        self._last_fingerprint = first_fingerprint
        self._quick_rescans = 0
        self.full_rescan_requested = False  # set by SIGHUP
        self.before_stop: Callable[[], object] | None = None  # on a signal, while still serving (a hand-over)
        self.stop_bound = STOP_BOUND
        self.pod_resources_loop = PeriodicLoop("pod-resources", config.pod_resources_interval,
                                               self.sync_pod_resources, (PodResourcesError,),
                                               on_failure=self.devices.list_failed, pace=self._pod_resources_pace)
        self._last_change = time.monotonic()
        devices.add_listener(self._devices_changed)
        self.rescan_loop = PeriodicLoop("topology rescan", config.rescan_interval, self._periodic_rescan,
                                        (TopologyReadError, OSError))
        self.label_loop = PeriodicLoop("node labels", config.label_interval if config.node_labels else 0,
                                       self.reporter.sync_labels, (), pace=self._label_pace)
        reporter.on_event = self.label_loop.wake  # a Warning Event to post (agent.node.reporter.NodeReporter.warn)
        metrics.read_status(self.status)

    @property
    def enforcement_mode(self) -> str:
        """The cpuset enforcement in force now (auto may switch while the agent runs)."""
        return self.enforcement.mode if self.enforcement is not None else self._enforcement_mode

    # --- the loops' steps ---------------------------------------------------------------------
    def _pod_resources_pace(self) -> float:
        """pod-resources every --pod-resources-interval while a device is held or one changed hands in
        the last minute (kubelet never says when a pod ends: the List does); slowly otherwise (nothing
        can end, and every new allocation comes through our own Allocate, which speeds it up again)."""
        fast = self.config.pod_resources_interval
        if self.devices.held_keys() or time.monotonic() - self._last_change < IDLE_AFTER:
            return fast
        self.pod_resources.close()  # no connection kept open between slow Lists (the next one dials)
        return max(fast, SLOW_POD_RESOURCES)

    def _label_pace(self) -> float:
        """The next label sync: every --label-interval, backing off while the API server fails (away,
        refusing, denying: the labeler said so once), to 10 intervals at most (5 min by default)."""
        return backoff_delay(self.config.label_interval, self.reporter.failed_syncs)

    def _devices_changed(self) -> None:
        self._last_change = time.monotonic()
        if self.pod_resources_loop.current_delay > self.config.pod_resources_interval:
            self.pod_resources_loop.wake()  # it was idling slowly: back to the fast pace now

    def check_cpu_manager(self) -> None:
        """Read kubelet's CPU manager state again when its file changed (a stat per file otherwise): kubelet
        takes a new policy only when it restarts, so this runs with every List and every rescan, and a
        changed policy is seen with rescans off (``--rescan-interval 0``) too."""
        policy = self.reporter.cpu_manager_policy
        self.reporter.check_cpu_manager()
        if policy != self.reporter.cpu_manager_policy:
            self.label_loop.wake()

    def sync_pod_resources(self) -> None:
        self.check_cpu_manager()
        started = time.monotonic()
        rows = self.pod_resources.list()
        if self.pod_resources.replaced:  # kubelet restarted: seen here too, in case this List beat the plugin manager
            self.devices.kubelet_restarted(time.monotonic() - started)
        self.devices.apply_list(rows, started)

    def _periodic_rescan(self) -> None:
        full, self.full_rescan_requested = self.full_rescan_requested, False
        self.rescan(full)

    def rescan(self, full: bool = False) -> None:
        """Read the topology again and mark groups that are no longer whole (and back).

        A cheap fingerprint (online and present lists, dispatching mode) is checked first; the
        full read runs when it changed, every ``full_rescan_every`` rescans (PR/SM can move CPUs
        between books without any of those changing), and when ``full`` is asked (SIGHUP).
        """
        self.check_cpu_manager()
        if self.loader is None:
            return
        fingerprint = self.fingerprint() if self.fingerprint is not None else None
        quick = (not full and fingerprint is not None and fingerprint == self._last_fingerprint
                 and self._quick_rescans + 1 < self.config.full_rescan_every)
        if quick:
            self._quick_rescans += 1
            return
        self._quick_rescans = 0
        current = self.loader()
        online = self.latest.online()
        self.latest.topology = current
        self.devices.apply_topology(current)
        self._last_fingerprint = fingerprint
        if self.enforcement is not None and self.latest.online() != online:
            self.enforcement.changed()  # a held group's CPUs may have gone: its holder goes to the pool now

    # --- what it reports ---------------------------------------------------------------------
    def ready(self) -> bool:
        return self.readiness()[0]

    def exclusivity_confirmed(self) -> bool:
        return exclusivity_confirmed(self.config, self.devices)

    def readiness(self) -> tuple[bool, str]:
        """Ready: every advertised resource is registered and kubelet watches it (trivially ready with
        nothing to advertise). The text says why not, and what else is amiss.

        Readiness gates DaemonSet rollouts (and ``helm --wait``) and nothing else: no Service routes
        to the agent. Whether pod-resources confirms who holds what is therefore said in the text, in
        ``topology_agent_exclusivity_confirmed`` and in the node annotation, not with a 503: a wrong
        kubelet root would otherwise stall every rollout while devices are served and holds kept."""
        if not self.devices.tables:
            return True, "ready (nothing to advertise)"
        if not self.manager.ready():
            return False, "not registered with kubelet"
        note = self.enforcement.readiness_note() if self.enforcement is not None else None
        if not self.exclusivity_confirmed():
            note = ("exclusivity unconfirmed: pod-resources does not answer, so devices handed out stay held and "
                    "their overlapping devices blocked until it does" + (f"; {note}" if note else ""))
        if note is None and self.enforcement_mode != "none":
            note = f"cpuset enforcement: {self.enforcement_mode}"
        left = self.dra_claims_to_unprepare()
        if left and self.dra_unprepare_only is not None:
            leftover = self.dra_unprepare_only
            how = "registered" if leftover.registered() else "served" if leftover.serving else "failing (see the log)"
            note = (f"DRA plugin {how} for unprepare only: {left} claim(s) prepared in DRA mode left"
                    + (f"; {note}" if note else ""))
        return True, f"ready ({note})" if note else "ready"

    def alive(self) -> bool:
        return self.manager.alive()

    def dra_claims_to_unprepare(self) -> int:
        """Claims prepared in DRA mode that the DRA plugin, kept for their unprepare only, has not unprepared yet (0:
        none, or it is unregistered)."""
        leftover = self.dra_unprepare_only
        return leftover.claims_left() if leftover is not None and leftover.wanted else 0

    def allocations(self) -> dict[str, object]:
        return {"ready": self.ready(), **self.devices.allocations(pod_names=self.config.allocations_pod_names)}

    def status(self) -> AgentStatus:
        m = self.topology.machine
        tally = Counter((resource, s.state) for (resource, _), s in self.devices.states().items())
        resources = []
        for resource in self.grouping.resources():
            resources.append(ResourceStatus(
                resource=resource, registrations=self.manager.registrations.get(resource, 0),
                streams=self.manager.streams_open(resource),
                seconds_since_registration=self.manager.seconds_since_registration(resource),
                states={state: n for (r, state), n in tally.items() if r == resource}))
        return AgentStatus(
            machine=m.generation or m.machine_type or m.arch, fidelity=self.grouping.fidelity,
            dispatching=m.dispatching, smt=m.smt_threads,
            groups=tuple((g.resource, g.id, len(g.cpus)) for g in self.grouping.groups),
            resources=tuple(resources), ready=self.ready(), kubelet_restarts=self.manager.restarts,
            exclusivity_confirmed=self.exclusivity_confirmed(), pending_holds=self.devices.pending_holds(),
            registration_failures=self.manager.registration_failures,
            memory_node_fallbacks=len(self.grouping.warnings), rescans=self.rescan_loop.runs,
            rescan_failures=self.rescan_loop.failures, topology_changes=self.devices.changes,
            pod_resources_polls=self.pod_resources_loop.runs, pod_resources_failures=self.pod_resources_loop.failures,
            label_patches=self.reporter.patches, label_failures=self.reporter.failures,
            cpu_manager_static=self.reporter.cpu_manager_policy == "static",
            cpu_manager_findings=len(self.reporter.findings), log_records_dropped=dropped_records(),
            enforcement=self._enforcement_status(), enforcement_mode=self.enforcement_mode,
            uniform=tuple((u.resource, u.cpus, len(u.left_out)) for u in self.grouping.uniform),
            dra_unprepare_only=self.dra_unprepare_only is not None and self.dra_unprepare_only.serving,
            dra_claims_to_unprepare=self.dra_claims_to_unprepare())

    def _enforcement_status(self) -> EnforcementStatus | None:
        if self.enforcement is None:
            return None
        c = self.enforcement.counters
        return EnforcementStatus(refused=c.refused is not None, failing=self.enforcement.failing and c.refused is None,
                                 topology_containers=c.topology_containers, pinned=c.pinned,
                                 updates=dict(c.updates), pool_cpus=c.pool_cpus, pool_empty=c.pool_empty,
                                 steps=c.steps, container_refusals=c.container_refusals, refusing=c.refusing,
                                 offline=c.offline, stranded=c.stranded, creations_refused=c.creations_refused,
                                 overridden=c.overridden,
                                 evictions=self.evictions.counts() if self.evictions is not None else {},
                                 evictions_pending=self.evictions.pending if self.evictions is not None else 0)

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        log_discovery(self.topology, self.grouping)
        self.label_loop.start()  # labels say what the node is even when it advertises nothing (off: no thread)
        self.label_loop.wake()
        if not self.devices.tables:
            log.warning("nothing to advertise on this node (%s); staying up without registering",
                        self.grouping.level_reason, extra={"reason": self.grouping.level_reason})
        else:
            self.devices.start_publisher()
            self.manager.start()
            self.pod_resources_loop.start()
            self.rescan_loop.start()
            if self.enforcement is not None:
                self.enforcement.start()
        if self.dra_unprepare_only is not None:  # kubelet finishes those claims' pods only once they are unprepared
            self.dra_unprepare_only.start()
        if self.http is not None:
            self.http.start(make_app(self.metrics.registry, self.alive, self.readiness, self.allocations))

    def stop(self) -> None:
        """Stop every part against one deadline, ``stop_bound`` seconds from now; parts still stopping then are
        named in a warning and left behind (daemon threads: they never hold the exit). The cpuset enforcement stops
        before the device tables and their servers go (it answers the runtime from them); the HTTP endpoint last."""
        started = time.monotonic()
        deadline = started + self.stop_bound
        loops = (self.label_loop, self.rescan_loop, self.pod_resources_loop)
        for loop in loops:  # no new step begins while the enforcement stops
            loop.request_stop()
        late: list[str] = []
        late += stop_together([(name, stop) for name, stop in (
            ("cpuset enforcement", self.enforcement.stop if self.enforcement is not None else None),
            ("evictions", self.evictions.stop if self.evictions is not None else None)) if stop is not None], deadline)
        late += stop_together([*((loop.name, loop.stop) for loop in loops), ("plugin manager", self.manager.stop),
                               *([("DRA plugin for unprepare only", self.dra_unprepare_only.stop)]
                                 if self.dra_unprepare_only is not None else [])], deadline)
        late += stop_together([("device state publisher", self.devices.stop_publisher),
                               ("pod-resources client", self.pod_resources.close)], deadline)
        if self.http is not None:
            late += stop_together([("HTTP endpoint", self.http.stop)], deadline)
        took = time.monotonic() - started
        if late:
            log.warning("still stopping after %.1f s, left behind: %s", took, ", ".join(late),
                        extra={"reason": "stop bound reached"})
        log.info("stopped in %.2f s%s", took, "" if "plugin manager" in late else ": sockets removed")


def wait_for_signal(received: list[int], on_hangup: Callable[[], object]) -> int:
    """The first SIGTERM or SIGINT in ``received`` (the handler appends each signal), ``on_hangup`` called for every
    SIGHUP before it. The kernel hands a process's signal to another thread when the main one has one pending already
    (a SIGUSR1 just before a SIGTERM), and Python runs the handler only once the main thread runs Python code again:
    a main thread blocked in ``Event.wait`` would sleep on for good. The wake-up fd gets a byte from the C handler in
    whichever thread took the signal, and wakes this select."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    seen = 0
    try:
        while True:
            while seen < len(received):
                signum = received[seen]
                seen += 1
                if signum != signal.SIGHUP:
                    return signum
                on_hangup()
            select.select([reader], [], [])
            with contextlib.suppress(BlockingIOError):
                reader.recv(256)
    finally:
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()


def run_until_signalled(agent: Agent, exit_bound: float | None = EXIT_BOUND) -> int:
    """Serve until SIGTERM or SIGINT, then hand over (``before_stop``) and stop; SIGHUP reads the topology again. From
    SIGTERM or SIGINT on, a watchdog (``faulthandler``'s, a C thread) writes every thread's stack and ends the process
    with exit code 1 after ``exit_bound`` seconds, whatever still runs then (None: no watchdog)."""
    received: list[int] = []

    def note(signum: int, _frame: object) -> None:
        # Python runs this in the main thread between any two of its bytecodes, maybe while that thread holds a lock
        # (the log queue's, inside a log call; an Event's): it takes none, no log line, no Event.set. It notes the
        # signal for wait_for_signal, which acts on it; the watchdog is C code writing to fd 2 (no flush).
        if signum != signal.SIGHUP and exit_bound is not None and all(s == signal.SIGHUP for s in received):
            faulthandler.dump_traceback_later(exit_bound, exit=True, file=2)
        received.append(signum)

    def rescan_now() -> None:
        log.info("received SIGHUP: rescanning topology")
        agent.full_rescan_requested = True
        if agent.rescan_loop.running:
            agent.rescan_loop.wake()
        else:  # periodic rescans are off: read once, off the main thread, as a periodic step would
            threading.Thread(target=agent.rescan_loop.run_once, name="sighup-rescan", daemon=True).start()

    previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        agent.start()
        signum = wait_for_signal(received, rescan_now)
        log.info("received %s: shutting down", signal.Signals(signum).name)
        if agent.before_stop is not None:
            agent.before_stop()
    finally:
        agent.stop()
        for s, h in previous.items():
            signal.signal(s, h)
    return 0
