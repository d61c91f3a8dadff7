"""Enforcing CPU sets at creation (``--cpuset-enforcement nri``): the NRI protocol's hooks. The agent is an NRI plugin
of the container runtime (:mod:`agent.nri.stub`), and this is what it answers to CreateContainer, Synchronize,
UpdateContainer, StopContainer and RemoveContainer, decided by :mod:`agent.policy.creation_cpuset` and
:mod:`agent.policy.cpuset`; what happens outside any event is :mod:`agent.enforce.nri_upkeep`. In DRA mode a
container's groups come from the claim its CDI environment names (:mod:`agent.policy.container_claims`).

Must hold: decided from memory (the device table, the containers the runtime told about), never from I/O inside a
handler; a container the pool cannot take is refused, never created on every CPU; a stranded holder's pod goes to
the evictions, never evicted from a handler; the agent's annotations a pod carries itself are not believed; an update
sent outside an event is remembered only once the runtime confirms it; nothing is answered while kubelet runs the
static CPU manager policy. Why: docs/contributing/design/cpuset-enforcement.md."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.cri.client import CriClient
from agent.devices.table import NodeDevices
from agent.enforce.engine import CpusetEngine, EnforcementCounters, Evict, Notify
from agent.enforce.nri_upkeep import RECHECK, Upkeep, container_update
from agent.errors import CpuListError
from agent.nri.stub import DEFAULT_SOCKET, NriPlugin, Refused
from agent.plugin.servicer import Wire
from agent.policy.container_claims import PreparedRequest, claimed_devices, match_claim, prepared_keys, with_claims
from agent.policy.cpuset import CpusetPlan, RunningContainer, Update, desired_topology, plan_cpusets
from agent.policy.creation_cpuset import plan_creation
from agent.policy.grouping import Group
from agent.policy.keys import DeviceKey, Identity
from agent.topology.cpulist import format_cpulist, parse_cpulist

log = logging.getLogger("topology-agent.cpuset")

LIVE_STATES = frozenset({nri.CONTAINER_CREATED, nri.CONTAINER_RUNNING, nri.CONTAINER_PAUSED,
                         nri.CONTAINER_UNKNOWN})


def runtime_cpuset(text: str, who: str) -> frozenset[int]:
    """The CPUs of a cpuset the runtime reports; one it cannot have set (not a CPU list) counts as none known, which
    the planner treats as every CPU, and is said in one line rather than failing the whole event."""
    try:
        return frozenset(parse_cpulist(text)) if text else frozenset()
    except CpuListError as exc:
        log.warning("NRI: %s reports a cpuset that is not a CPU list (%s): taken as every CPU", who, exc,
                    extra={"reason": "bad cpuset"})
        return frozenset()


def running_container(pod: nri.PodSandbox, container: nri.Container, domain: str) -> RunningContainer:
    """An NRI container as the planner sees it. Its groups and resource annotations do not count when the pod
    carries each with the same value itself (pass-through: they may be the pod's own; Allocate sets both, and a
    value kubelet set wins over the pod's, so one that differs says kubelet set them)."""
    cpu = container.linux.resources.cpu
    annotations = dict(container.annotations)
    keys = [key for key in (f"{domain}/groups", f"{domain}/resource") if key in annotations]
    if keys and all(pod.annotations.get(key) == annotations[key] for key in keys):
        log.debug("ignoring the %s annotations of %s/%s/%s: the pod carries them itself", domain, pod.namespace,
                  pod.name, container.name)
        annotations = {k: v for k, v in annotations.items() if not k.startswith(f"{domain}/")}
    groups = annotations.get(f"{domain}/groups", "")
    return RunningContainer(
        id=container.id, identity=(pod.namespace, pod.name, container.name),
        cpus=runtime_cpuset(cpu.cpus, f"{pod.namespace}/{pod.name}/{container.name}"), mems=cpu.mems,
        annotated_groups=tuple(g for g in groups.split(",") if g),
        annotated_resource=annotations.get(f"{domain}/resource", ""),
        created_at=container.created_at / 1e9 if container.created_at else 0.0)


class NriEnforcement(CpusetEngine):
    """The NRI plugin's decisions, and what it reports (the CRI loop's counters and notes)."""

    mode = "nri"

    def __init__(self, devices: NodeDevices[Wire], groups: Mapping[DeviceKey, Group], annotation_domain: str, *,
                 online: Callable[[], frozenset[int]], reserved: frozenset[int], shared_pool: bool,
                 cpu_manager_policy: Callable[[], str | None], socket_path: Path = Path(DEFAULT_SOCKET),
                 plugin_index: str = "10", observe_pinned: Callable[[float], None] | None = None,
                 claims: Callable[[], Mapping[str, PreparedRequest]] | None = None, notify: Notify | None = None,
                 verifier: CriClient | None = None, recheck: float | None = None, evict: Evict | None = None,
                 counters: EnforcementCounters | None = None) -> None:
        super().__init__(devices, groups, annotation_domain, online=online, reserved=reserved, shared_pool=shared_pool,
                         cpu_manager_policy=cpu_manager_policy, observe_pinned=observe_pinned, notify=notify,
                         evict=evict, counters=counters)
        self.claims = claims  # DRA mode: the prepared claims' requests
        self.plugin = NriPlugin(self, socket_path, index=plugin_index)
        self.upkeep = Upkeep(self, verifier, RECHECK if recheck is None else recheck)
        self._containers: dict[str, RunningContainer] = {}  # what the runtime has, as far as it said
        self._doubt: dict[str, RunningContainer] = {}  # id -> what an unconfirmed update may have made it
        self._claimed: dict[str, tuple[Identity, str]] = {}  # container id -> (identity, its TOPOLOGY_DRA_CLAIM)
        self._refusing: set[Identity] = set()  # creations refused (said once each)
        self._lock = threading.Lock()

    # --- lifecycle (as the CRI loop's) ----------------------------------------------------------
    def start(self) -> None:
        self.plugin.start()
        self.devices.add_listener(self.changed)
        self.upkeep.start()

    def stop(self) -> None:
        self.upkeep.stop()
        self.plugin.stop()

    def changed(self) -> None:
        """Devices changed hands (never blocks: the publishing thread calls it)."""
        self.upkeep.wake()

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
            self._doubt.clear()  # the runtime's own word on every container
            self._claimed = claimed
        if self._refused():
            return []
        updates = self._reply(known)
        now = time.time()
        for update in updates:
            if update.kind == "topology" and self.observe_pinned is not None and update.created_at:
                self.observe_pinned(max(0.0, now - update.created_at))  # created while the plugin was away
        self._account()
        return [container_update(u) for u in updates]

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
        plan = dataclasses.replace(plan, others=plan.others + self._doubted(running, {u.container for u in plan.others}
                                                                            | {new.id}))
        if plan.refused:
            self._forget(new.id)
            self.counters.creations_refused += 1
            if new.identity not in self._refusing:
                self._refusing.add(new.identity)
                log.warning("refusing to create %s/%s/%s: %s", *new.identity, plan.refused,
                            extra={"reason": plan.refused})
            self._account()
            raise Refused(plan.refused)
        self._refusing.discard(new.identity)
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
        wanted = runtime_cpuset(resources.cpu.cpus, f"the update of {'/'.join(asked.identity)}")
        if wanted:
            asked = dataclasses.replace(asked, cpus=wanted, mems=resources.cpu.mems or asked.mems)
        claim = self._claim_of(pod, container)
        with self._lock:
            self._containers[asked.id] = asked
            self._doubt.pop(asked.id, None)  # the runtime's word on it
            self._remember_claim(asked.id, claim)
            running = list(self._containers.values())
        if self._refused():
            return []
        plan = self._plan(running)
        updates = [u for u in plan.updates if u.container == asked.id]
        for update in updates:
            self._applied(update)
        self._account()
        return [container_update(u) for u in updates]  # for itself: replaces what kubelet asked

    def stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> list[nri.ContainerUpdate]:
        self._forget(container.id)
        with self._lock:
            running = list(self._containers.values())
        if self._refused():
            return []
        updates = self._reply(running)
        self._account()
        return [container_update(u) for u in updates]

    def remove_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        self._forget(container.id)
        self._account()

    # --- what the upkeep thread uses (agent/enforce/nri_upkeep.py) ----------------------------------------
    def wanted(self) -> list[Update]:
        """What the known containers need now, doubtful ones included; nothing is remembered."""
        if self._refused():
            return []
        with self._lock:
            running = list(self._containers.values())
        return list(self._plan(running).updates)

    def confirmed(self, update: Update) -> None:
        """The runtime applied ``update`` (it said so)."""
        self._applied(update)
        self._account()

    def unconfirmed(self, update: Update, failed: bool) -> None:
        """``update`` may be lost (``failed``: the runtime said it failed) or still be applied later (a timeout):
        the container is in doubt until the runtime says what it has, and every reply sends it again."""
        self._count(update.kind, "error")
        with self._lock:
            old = self._containers.get(update.container)
            if old is not None and not failed:
                self._doubt[update.container] = self._moved(old, update)

    def known(self) -> list[RunningContainer]:
        with self._lock:
            return list(self._containers.values())

    def seen(self, expected: RunningContainer, cpus: frozenset[int]) -> bool:
        """The runtime says the container runs on ``cpus`` (empty: none of its own). Remembered unless an event
        changed the container since ``expected`` was read. True when that differs from what the agent knew, for a
        container whose cpuset the agent decides (a holder; with --shared-pool, every one), and no update of the
        agent's own was in doubt."""
        online = self.online()
        with self._lock:
            now = self._containers.get(expected.id)
            if now is None or now != expected:
                return False  # gone, or an event told more since
            doubted = self._doubt.pop(expected.id, None) is not None
            self._containers[expected.id] = dataclasses.replace(now, cpus=cpus)
        if doubted or (now.cpus or online) == (cpus or online):
            return False
        return self.shared_pool or bool(desired_topology(now, self._holders(), self.groups))

    # --- helpers --------------------------------------------------------------------------------------
    def _plan(self, running: list[RunningContainer]) -> CpusetPlan:
        """The plan for ``running``, with every container in doubt sent again whichever cpuset it has."""
        plan = plan_cpusets(running, self._holders(), self._held(), self.groups, self.online(), self.reserved,
                            self.shared_pool)
        return dataclasses.replace(plan, updates=plan.updates + self._doubted(running,
                                                                              {u.container for u in plan.updates}))

    def _doubted(self, running: list[RunningContainer], have: set[str]) -> tuple[Update, ...]:
        """The updates the containers in doubt need if the unconfirmed update did reach them (those not in
        ``have``): planned from what they may have now, so each gets the right kind."""
        with self._lock:
            doubt = {i: c for i, c in self._doubt.items() if i in self._containers and i not in have}
        if not doubt:
            return ()
        other = plan_cpusets([doubt.get(c.id, c) for c in running], self._holders(), self._held(), self.groups,
                             self.online(), self.reserved, self.shared_pool)
        return tuple(u for u in other.updates if u.container in doubt)

    def _reply(self, running: list[RunningContainer]) -> list[Update]:
        """The updates for a reply (the runtime applies them, a failure goes to its log): remembered as applied."""
        updates = list(self._plan(running).updates)
        for update in updates:
            self._applied(update)
        return updates

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

    def _forget(self, container_id: str) -> None:
        with self._lock:
            self._containers.pop(container_id, None)
            self._doubt.pop(container_id, None)
            self._claimed.pop(container_id, None)

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

    @staticmethod
    def _moved(old: RunningContainer, update: Update) -> RunningContainer:
        return dataclasses.replace(old, cpus=frozenset(parse_cpulist(update.cpus)), mems=update.mems or old.mems)

    def _applied(self, update: Update) -> None:
        """An update the runtime applies (in a reply) or applied (confirmed): remembered."""
        self._count(update.kind, "ok")
        with self._lock:
            old = self._containers.get(update.container)
            self._doubt.pop(update.container, None)
            if old is not None:
                self._containers[update.container] = self._moved(old, update)

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
        self.offline.report(plan, self.counters)
