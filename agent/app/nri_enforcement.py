"""Enforcing CPU sets at creation (``--cpuset-enforcement nri``): the agent is an NRI plugin of the
container runtime (:mod:`agent.nri.plugin`), and this is what it answers, decided by
:mod:`agent.policy.creation` and :mod:`agent.policy.cpuset` from memory (the device table and the
containers the runtime told about), never from I/O inside a handler.

* CreateContainer: the new container's cpuset and memory nodes (its groups'; with
  ``--shared-pool`` the pool for every other container), and the running containers the new
  holder pushes out of its CPUs, all in the reply.
* Synchronize (at registration, and after every reconnect): every existing container reconciled
  as the CRI loop does, which repairs containers created while the plugin was away.
* UpdateContainer: a topology container keeps its groups' CPUs whatever kubelet updates; Stop and
  Remove forget the container, and their replies widen the others when the pool grew back.

In DRA mode (``claims``: the kubelet plugin's prepared claim requests, in memory) a container's groups come
from the ``TOPOLOGY_DRA_CLAIM`` variable its CDI device put into its environment, believed only for a claim the
agent prepared and a pod of the claim's namespace (:mod:`agent.policy.claims`; anything else is logged at
debug and the container is treated as any other), and every prepared claim's devices count as held.

Refused, like the CRI loop, while kubelet runs the static CPU manager policy (it answers nothing).
When devices change hands outside any event (pod-resources notices a pod has gone, its group is
free), the others are widened back with an unsolicited ``UpdateContainers`` from a thread of its
own, only on runtimes whose NRI is v0.12.1 or later (containerd 2.4+: before, it can deadlock
containerd); on older runtimes the pool widens at the next event's reply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.app.enforcement import EnforcementCounters
from agent.devices.table import NodeDevices
from agent.nri.plugin import DEFAULT_SOCKET, NriPlugin
from agent.plugin.servicer import Wire
from agent.policy.claims import PreparedRequest, claimed_devices, match_claim, prepared_keys, with_claims
from agent.policy.cpuset import Identity, RunningContainer, Update, plan_cpusets
from agent.policy.creation import plan_creation
from agent.policy.grouping import Group
from agent.policy.health import DeviceKey
from agent.topology.cpulist import format_cpulist, parse_cpulist

log = logging.getLogger("topology-agent.cpuset")

LIVE_STATES = frozenset({nri.CONTAINER_CREATED, nri.CONTAINER_RUNNING, nri.CONTAINER_PAUSED,
                         nri.CONTAINER_UNKNOWN})


def running_container(pod: nri.PodSandbox, container: nri.Container, domain: str) -> RunningContainer:
    """An NRI container as the planner sees it."""
    cpu = container.linux.resources.cpu
    annotations = dict(container.annotations)
    groups = annotations.get(f"{domain}/groups", "")
    return RunningContainer(
        id=container.id, identity=(pod.namespace, pod.name, container.name),
        cpus=frozenset(parse_cpulist(cpu.cpus)) if cpu.cpus else frozenset(), mems=cpu.mems,
        annotated_groups=tuple(g for g in groups.split(",") if g),
        annotated_resource=annotations.get(f"{domain}/resource", ""),
        created_at=container.created_at / 1e9 if container.created_at else 0.0)


def container_update(update: Update) -> nri.ContainerUpdate:
    return nri.ContainerUpdate(
        container_id=update.container, ignore_failure=True,
        linux=nri.LinuxContainerUpdate(resources=nri.LinuxResources(cpu=nri.LinuxCPU(cpus=update.cpus,
                                                                                     mems=update.mems))))


class NriEnforcement:
    """The NRI plugin's decisions, and what it reports (the CRI loop's counters and notes)."""

    mode = "nri"

    def __init__(self, devices: NodeDevices[Wire], groups: Mapping[DeviceKey, Group], annotation_domain: str, *,
                 online: Callable[[], frozenset[int]], reserved: frozenset[int], shared_pool: bool,
                 cpu_manager_policy: Callable[[], str | None], socket_path: Path = Path(DEFAULT_SOCKET),
                 plugin_index: str = "10", observe_pinned: Callable[[float], None] | None = None,
                 claims: Callable[[], Mapping[str, PreparedRequest]] | None = None) -> None:
        self.devices = devices
        self.groups = groups
        self.domain = annotation_domain
        self.online = online
        self.reserved = reserved
        self.shared_pool = shared_pool
        self.cpu_manager_policy = cpu_manager_policy
        self.observe_pinned = observe_pinned
        self.claims = claims
        self.counters = EnforcementCounters(updates={})
        self.plugin = NriPlugin(self, socket_path, index=plugin_index)
        self._containers: dict[str, RunningContainer] = {}
        self._claimed: dict[str, tuple[Identity, str]] = {}  # container id -> (identity, its TOPOLOGY_DRA_CLAIM)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle (as the CRI loop's) ----------------------------------------------------------
    def start(self) -> None:
        self.plugin.start()
        if self.shared_pool:
            self.devices.add_listener(self.changed)
            self._thread = threading.Thread(target=self._run, name="nri-pool", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.plugin.stop()

    def changed(self) -> None:
        """Devices changed hands (never blocks: the publishing thread calls it)."""
        self._wake.set()

    def _run(self) -> None:
        """Widen (or confine) the known containers when the pool changed outside any event."""
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set() or not self.plugin.state.registered or not self.plugin.unsolicited_safe:
                continue
            try:
                updates = self._others_now()
                if updates:
                    failed = self.plugin.update_containers(updates)
                    log.info("updated %d containers to the shared pool outside an event%s", len(updates),
                             f" ({len(failed)} failed)" if failed else "", extra={"reason": "pool"})
            except Exception as exc:  # the next event's reply carries them anyway
                log.warning("could not update containers to the shared pool now (%s); the next event will", exc)

    # --- what it reports ----------------------------------------------------------------------------
    @property
    def failing(self) -> bool:
        return not self.plugin.state.registered and bool(self.plugin.state.last_error)

    def readiness_note(self) -> str | None:
        if self.counters.refused:
            return f"cpuset enforcement refused: {self.counters.refused}"
        state = self.plugin.state
        if state.registered:
            return f"cpuset enforcement: nri, registered with {state.runtime or 'the runtime'}"
        return f"cpuset enforcement: nri, not registered ({state.last_error or 'connecting'})"

    def enforced(self) -> dict[DeviceKey, list[str]]:
        """Each held device -> the cpusets its holders' containers were created or updated to."""
        with self._lock:
            containers = list(self._containers.values())
        by_identity: dict[tuple[str, str, str], set[str]] = {}
        for c in containers:
            by_identity.setdefault(c.identity, set()).add(format_cpulist(sorted(c.cpus)) if c.cpus else "all")
        out: dict[DeviceKey, list[str]] = {}
        for identity, keys in self._holders().items():
            for key in keys:
                out.setdefault(key, [])
                out[key] = sorted(set(out[key]) | by_identity.get(identity, set()))
        return out

    # --- the plugin's handlers ------------------------------------------------------------------------
    def _refused(self) -> bool:
        policy = self.cpu_manager_policy()
        if policy == "static":
            if self.counters.refused is None:
                log.warning("cpuset enforcement refused: kubelet runs the static CPU manager policy and sets "
                            "container cpusets itself; the two would fight. Devices are still served")
            self.counters.refused = "kubelet runs the static CPU manager policy"
            return True
        self.counters.refused = None
        return False

    def synchronize(self, pods: list[nri.PodSandbox], containers: list[nri.Container]) -> list[nri.ContainerUpdate]:
        by_id = {p.id: p for p in pods}
        live = [(by_id.get(c.pod_sandbox_id, nri.PodSandbox()), c) for c in containers if c.state in LIVE_STATES]
        known = [running_container(p, c, self.domain) for p, c in live]
        claimed = {c.id: claim for c, claim in ((c, self._claim_of(p, c)) for p, c in live) if claim is not None}
        with self._lock:
            self._containers = {c.id: c for c in known}
            self._claimed = claimed
        if self._refused():
            return []
        plan = plan_cpusets(known, self._holders(), self._held(), self.groups, self.online(), self.reserved,
                            self.shared_pool)
        now = time.time()
        for update in plan.updates:
            self._applied(update)
            if update.kind == "topology" and self.observe_pinned is not None and update.created_at:
                self.observe_pinned(max(0.0, now - update.created_at))  # created while the plugin was away
        self._account()
        return [container_update(u) for u in plan.updates]

    def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.CreateContainerResponse:
        new = running_container(pod, container, self.domain)
        claim = self._claim_of(pod, container)
        with self._lock:
            self._containers[new.id] = new
            self._remember_claim(new.id, claim)
            running = list(self._containers.values())
        if self._refused():
            return nri.CreateContainerResponse()
        plan = plan_creation(new, running, self._holders(), self._held(), self.groups, self.online(), self.reserved,
                             self.shared_pool)
        answer = nri.CreateContainerResponse(update=[container_update(u) for u in plan.others])
        for update in plan.others:
            self._applied(update)
        if plan.adjust is not None:
            cpu = answer.adjust.linux.resources.cpu
            cpu.cpus = plan.adjust.cpus
            if plan.adjust.mems:
                cpu.mems = plan.adjust.mems
            self._applied(plan.adjust)
            if plan.adjust.kind == "topology" and self.observe_pinned is not None:
                self.observe_pinned(0.0)  # pinned before its first instruction
            log.info("%s %s/%s/%s at creation: cpuset %s%s",
                     "pinned" if plan.adjust.kind == "topology" else "confined", *new.identity, plan.adjust.cpus,
                     f", memory nodes {plan.adjust.mems}" if plan.adjust.mems else "",
                     extra={"cpus": plan.adjust.cpus, "reason": plan.adjust.kind})
        self._account()
        return answer

    def update_container(self, pod: nri.PodSandbox, container: nri.Container,
                         resources: nri.LinuxResources) -> list[nri.ContainerUpdate]:
        asked = running_container(pod, container, self.domain)
        if resources.cpu.cpus:
            asked = RunningContainer(asked.id, asked.identity, frozenset(parse_cpulist(resources.cpu.cpus)),
                                     resources.cpu.mems or asked.mems, asked.annotated_groups,
                                     asked.annotated_resource, asked.created_at)
        claim = self._claim_of(pod, container)
        with self._lock:
            self._containers[asked.id] = asked
            self._remember_claim(asked.id, claim)
        if self._refused():
            return []
        plan = plan_cpusets([asked], self._holders(), self._held(), self.groups, self.online(), self.reserved,
                            self.shared_pool)
        for update in plan.updates:
            self._applied(update)
        self._account()
        return [container_update(u) for u in plan.updates]  # for itself: replaces what kubelet asked

    def stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> list[nri.ContainerUpdate]:
        with self._lock:
            self._containers.pop(container.id, None)
            self._claimed.pop(container.id, None)
        return self._others_now()

    def remove_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        with self._lock:
            self._containers.pop(container.id, None)
            self._claimed.pop(container.id, None)
        self._account()

    # --- helpers --------------------------------------------------------------------------------------
    def _claim_of(self, pod: nri.PodSandbox, container: nri.Container) -> tuple[Identity, str] | None:
        """The DRA claim request a container's environment names (believed or not: :meth:`_holders` asks the
        prepared claims each time); a refusal is logged at debug."""
        if self.claims is None:
            return None
        match = match_claim(container.env, pod.namespace, self.claims())
        if not match.value:
            return None
        if match.refused:
            log.debug("ignoring TOPOLOGY_DRA_CLAIM=%s of %s/%s/%s: %s; treated as any other container",
                      match.value[:80], pod.namespace, pod.name, container.name, match.refused)
        return (pod.namespace, pod.name, container.name), match.value

    def _remember_claim(self, container_id: str, claim: tuple[Identity, str] | None) -> None:
        if claim is None:
            self._claimed.pop(container_id, None)
        else:
            self._claimed[container_id] = claim

    def _holders(self) -> dict[Identity, tuple[DeviceKey, ...]]:
        """pod-resources' holders, and the containers whose believed claim names their devices."""
        with self._lock:
            named = list(self._claimed.values())
        claimed = claimed_devices(named, self.claims()) if self.claims is not None else {}
        return with_claims(self.devices.holder_identities(), claimed)

    def _held(self) -> frozenset[DeviceKey]:
        """Every device held now, every prepared claim's devices included (pod-resources may not list them yet)."""
        held = self.devices.held_keys()
        return held | prepared_keys(self.claims()) if self.claims is not None else held

    def _others_now(self) -> list[nri.ContainerUpdate]:
        """What the known containers need now (the pool may have grown back)."""
        with self._lock:
            running = list(self._containers.values())
        if self._refused():
            return []
        plan = plan_cpusets(running, self._holders(), self._held(), self.groups, self.online(), self.reserved,
                            self.shared_pool)
        for update in plan.updates:
            self._applied(update)
        self._account()
        return [container_update(u) for u in plan.updates]

    def _applied(self, update: Update) -> None:
        """An update handed to the runtime in a reply: it applies it (containerd logs a failure)."""
        key = (update.kind, "ok")
        self.counters.updates[key] = self.counters.updates.get(key, 0) + 1
        with self._lock:
            old = self._containers.get(update.container)
            if old is not None:
                self._containers[update.container] = RunningContainer(
                    old.id, old.identity, frozenset(parse_cpulist(update.cpus)), update.mems or old.mems,
                    old.annotated_groups, old.annotated_resource, old.created_at)

    def _account(self) -> None:
        with self._lock:
            running = list(self._containers.values())
        plan = plan_cpusets(running, self._holders(), self._held(), self.groups, self.online(), self.reserved,
                            self.shared_pool)
        self.counters.steps += 1
        self.counters.topology_containers = plan.topology_containers
        self.counters.pinned = plan.pinned
        self.counters.pool_cpus = len(plan.pool)
        self.counters.pool_empty = plan.pool_empty

    def known(self) -> Iterable[RunningContainer]:
        with self._lock:
            return list(self._containers.values())
