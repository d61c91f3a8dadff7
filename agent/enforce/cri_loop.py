"""Enforcing CPU sets through the container runtime (``--cpuset-enforcement cri``): a loop of its own that lists the
running containers over CRI, plans their cpusets (:mod:`agent.policy.cpuset`) and applies what differs with
``UpdateContainerResources``, as kubelet's CPU manager does.

Must hold: never on the Allocate path and never in the way of device serving (a failing or absent runtime is retried
with backoff and reported); a runtime that refuses one container's update costs that container only (said once,
counted, tried again at the next step); a stranded holder's pod goes to :mod:`agent.enforce.evictions`; nothing is
done while kubelet runs the static CPU manager policy (the two would fight); nothing is persisted (container ids and
pins are rebuilt from pod-resources and the runtime). Design: docs/contributing/design/cpuset-enforcement.md."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from agent.backoff import Backoff
from agent.cri.client import ContainerInfo, CriClient
from agent.devices.table import NodeDevices
from agent.enforce.engine import RUNTIME_DOWN, CpusetEngine, EnforcementCounters, Evict, Notify
from agent.errors import AgentError, CriError
from agent.plugin.servicer import Wire
from agent.policy.cpuset import CpusetPlan, RunningContainer, plan_cpusets
from agent.policy.grouping import Group
from agent.policy.keys import DeviceKey
from agent.topology.cpulist import format_cpulist, parse_cpulist
from agent.worker import Worker

log = logging.getLogger("topology-agent.cpuset")

RECHECK = 60.0  # seconds after which a container's cpuset is read from the runtime again
IDLE_INTERVAL = 30.0  # seconds between looks while no device is held and nothing needed updating
FAILING_MAX = 30.0  # the longest wait between looks while the runtime fails
VERBS = {"topology": "pinned", "shrink": "confined", "widen": "widened",
         "offline": "confined (its groups' CPUs are offline)"}  # an update's kind, said in the log


class CpusetEnforcement(CpusetEngine, Worker):
    mode = "cri"

    def __init__(self, client: CriClient, devices: NodeDevices[Wire], groups: Mapping[DeviceKey, Group],
                 annotation_domain: str, *, online: Callable[[], frozenset[int]], reserved: frozenset[int],
                 shared_pool: bool, cpu_manager_policy: Callable[[], str | None], interval: float = 2.0,
                 fast_interval: float = 0.1, fast_window: float = 15.0,
                 observe_pinned: Callable[[float], None] | None = None, notify: Notify | None = None,
                 evict: Evict | None = None, counters: EnforcementCounters | None = None) -> None:
        CpusetEngine.__init__(self, devices, groups, annotation_domain, online=online, reserved=reserved,
                              shared_pool=shared_pool, cpu_manager_policy=cpu_manager_policy,
                              observe_pinned=observe_pinned, notify=notify, evict=evict, counters=counters)
        Worker.__init__(self, thread_name="cpuset-enforcement")
        self.client = client
        self.interval = interval
        self.fast_interval = fast_interval
        self.fast_window = fast_window
        self._cache: dict[str, tuple[frozenset[int], str, float]] = {}  # id -> (cpus, mems, read at)
        self._first_pinned: set[str] = set()
        self._enforced: dict[DeviceKey, list[str]] = {}
        self._fast_until = 0.0
        self._failing: str | None = None
        self._refusing: dict[str, str] = {}  # container id -> why the runtime refused its last call (said once)
        self._lock = threading.Lock()

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.devices.add_listener(self.changed)
        Worker.start(self)

    def stop(self) -> None:
        Worker.stop(self)
        self.client.close()

    def changed(self) -> None:
        """Devices changed hands (an Allocate, a pod gone): look at the runtime often for a while, to
        pin a new container soon after kubelet creates it (Allocate comes first, the container after)."""
        self._fast_until = time.monotonic() + self.fast_window
        self.wake()

    # --- what it reports -----------------------------------------------------------------------
    def enforced(self) -> dict[DeviceKey, list[str]]:
        with self._lock:
            return {k: list(v) for k, v in self._enforced.items()}

    @property
    def failing(self) -> bool:
        """The last step failed (the runtime did not answer, or refused a call)."""
        return self._failing is not None

    def readiness_note(self) -> str | None:
        if self.counters.refused:
            return f"cpuset enforcement refused: {self.counters.refused}"
        if self._failing:
            return f"cpuset enforcement failing: {self._failing}"
        return None

    # --- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = Backoff(min(2 * self.interval, FAILING_MAX), FAILING_MAX)
        delay = self.interval
        while not self._stop.is_set():
            try:
                plan = self.step()
                if self._failing is not None:
                    log.info("cpuset enforcement works again")
                self._failing = None
                backoff.reset()
                delay = self.next_delay(plan)
                if delay >= IDLE_INTERVAL:
                    self.client.close()  # no connection kept open between idle looks (the next one dials)
            except AgentError as exc:  # CriError among them
                if str(exc) != self._failing:
                    log.warning("cpuset enforcement failing, retrying with backoff (devices are still served): %s",
                                exc, extra={"reason": str(exc)})
                self._failing = str(exc)
                delay = backoff.next()
            except Exception:  # the loop must go on whatever one step does
                log.exception("cpuset enforcement step failed")
                delay = self.interval
            self._pause(delay)

    def next_delay(self, plan: CpusetPlan | None) -> float:
        """Often for a while after devices changed hands; at the interval while any device is held (a
        restarted container must be pinned again); slowly on a node where nothing is held and nothing
        needed an update (nothing to pin, no pool to keep: devices changing hands wake the loop)."""
        if time.monotonic() < self._fast_until:
            return self.fast_interval
        if plan is not None and not plan.updates and not self.devices.held_keys():
            return max(self.interval, IDLE_INTERVAL)
        return self.interval

    def step(self) -> CpusetPlan | None:
        """One look at the runtime and the updates it needs (None when refused)."""
        self.counters.steps += 1
        policy = self.cpu_manager_policy()
        if policy == "static":
            if self.counters.refused is None:
                log.warning("cpuset enforcement refused: kubelet runs the static CPU manager policy and sets "
                            "container cpusets itself; the two would fight. Devices are still served; run kubelet "
                            "with cpuManagerPolicy: none to enforce topology cpusets")
            self.counters.refused = "kubelet runs the static CPU manager policy"
            return None
        if self.counters.refused is not None:
            log.info("cpuset enforcement resumes: kubelet's CPU manager policy is %s", policy or "unknown")
        self.counters.refused = None
        listed = self.client.list_containers(running_only=True)
        containers = [c for c in map(self._running, listed) if c is not None]
        alive = {c.id for c in containers}
        for gone in set(self._cache) - alive:
            del self._cache[gone]
        for gone in set(self._refusing) - alive - {i.id for i in listed}:
            del self._refusing[gone]
        self._first_pinned &= alive
        plan = plan_cpusets(containers, self.devices.holder_identities(), self.devices.held_keys(), self.groups,
                            self.online(), self.reserved, self.shared_pool)
        if plan.pool_empty and not self.counters.pool_empty:
            log.warning("the shared pool would be empty (every online CPU is in a held group): other containers "
                        "keep their CPUs until a group is freed")
        self.counters.pool_empty = plan.pool_empty
        self.counters.pool_cpus = len(plan.pool)
        self.offline.report(plan, self.counters)
        pinned = plan.pinned
        for update in plan.updates:
            try:
                self.client.update_cpuset(update.container, update.cpus, update.mems)
            except CriError as exc:
                self._count(update.kind, "error")
                if exc.code == "NOT_FOUND":  # the container ended meanwhile
                    self._cache.pop(update.container, None)
                    continue
                if exc.code in RUNTIME_DOWN:
                    raise
                self._refused(update.container, "/".join(update.identity), exc)
                continue
            self._count(update.kind, "ok")
            self._refusing.pop(update.container, None)
            if update.kind == "topology":
                pinned += 1
            cpus = frozenset(parse_cpulist(update.cpus))
            old = self._cache.get(update.container)
            self._cache[update.container] = (cpus, update.mems or (old[1] if old else ""), time.monotonic())
            log.info("%s %s/%s/%s: cpuset %s%s", VERBS[update.kind], *update.identity, update.cpus,
                     f", memory nodes {update.mems}" if update.mems else "",
                     extra={"cpus": update.cpus, "reason": update.kind})
            if update.kind == "topology" and update.container not in self._first_pinned:
                self._first_pinned.add(update.container)
                if self.observe_pinned is not None and update.created_at:
                    self.observe_pinned(max(0.0, time.time() - update.created_at))
        self.counters.topology_containers = plan.topology_containers
        self.counters.pinned = pinned
        self.counters.refusing = len(self._refusing)
        self._record_enforced(containers)
        return plan

    def _running(self, info: ContainerInfo) -> RunningContainer | None:
        """The container as the planner sees it; None when it ended since it was listed."""
        cached = self._cache.get(info.id)
        if cached is None or time.monotonic() - cached[2] > RECHECK:
            try:
                status = self.client.container_status(info.id)
            except CriError as exc:
                if exc.code == "NOT_FOUND":
                    return None
                if exc.code in RUNTIME_DOWN:
                    raise
                self._refused(info.id, f"{info.pod_namespace}/{info.pod_name}/{info.container_name}", exc)
                return None
            cached = (frozenset(parse_cpulist(status.cpuset_cpus)), status.cpuset_mems, time.monotonic())
            self._cache[info.id] = cached
        groups = info.annotations.get(f"{self.domain}/groups", "")
        return RunningContainer(
            id=info.id, identity=(info.pod_namespace, info.pod_name, info.container_name), cpus=cached[0],
            mems=cached[1], annotated_groups=tuple(g for g in groups.split(",") if g),
            annotated_resource=info.annotations.get(f"{self.domain}/resource", ""),
            created_at=info.created_at / 1e9)

    def _refused(self, container: str, who: str, exc: CriError) -> None:
        """The runtime refused a call for this container alone: said once per container, counted every time."""
        self.counters.container_refusals += 1
        if container not in self._refusing:
            log.warning("the runtime refuses cpuset calls for %s (container %s), which stays as it is; the others "
                        "are still updated, and this one is tried again at every step: %s", who, container[:13], exc,
                        extra={"reason": str(exc)})
        self._refusing[container] = str(exc)

    def _record_enforced(self, containers: list[RunningContainer]) -> None:
        """Each held device -> the cpusets its holders' containers run on now."""
        holders = self.devices.holder_identities()
        by_identity: dict[tuple[str, str, str], list[str]] = {}
        for c in containers:
            cpus = self._cache.get(c.id, (c.cpus, "", 0.0))[0]
            by_identity.setdefault(c.identity, []).append(format_cpulist(sorted(cpus)) if cpus else "all")
        enforced: dict[DeviceKey, list[str]] = {}
        for identity, keys in holders.items():
            for key in keys:
                enforced.setdefault(key, []).extend(by_identity.get(identity, []))
        with self._lock:
            self._enforced = {k: sorted(set(v)) for k, v in enforced.items()}
