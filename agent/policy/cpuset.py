"""Which cpuset every running container should have, when the agent enforces CPU sets through the container runtime
(``--cpuset-enforcement cri`` or ``nri``). Pure: containers, holders and groups in, updates out.

Must hold: a holder (known from pod-resources, or from the agent's own Allocate annotations before it is listed)
runs on its groups' CPUs and memory nodes; a pinned container's CPUs count as taken whatever the ledger says; with
the shared pool every other container runs on the online CPUs no held or pinned group has (``reserved`` always in
it), and a pool that would be empty shrinks nobody; a holder whose groups' CPUs are all offline never runs on CPUs
other pods hold: the pool, else its own pod's groups, else it is stranded and its pod is named for eviction; only
what differs is changed. The rules, case by case: docs/contributing/design/cpuset-enforcement.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.policy.grouping import Group
from agent.policy.keys import DeviceKey, Identity
from agent.topology.cpulist import format_cpulist

KINDS = ("topology", "shrink", "widen", "offline")  # what an update does (metrics label every one)
EVICTION_REASONS = ("stranded",)  # why a pod is to be evicted (metrics label every one)
EVICTION_RESULTS = ("evicted", "blocked", "failed", "gone")  # what the API server made of an eviction: accepted,
# 429 (a PodDisruptionBudget), any other failure or no answer, 404 (the pod is gone)


@dataclass(frozen=True, slots=True)
class RunningContainer:
    id: str
    identity: Identity
    cpus: frozenset[int]  # its cpuset now; empty: none of its own (every CPU its parent allows)
    mems: str = ""
    annotated_groups: tuple[str, ...] = ()  # device ids our Allocate wrote into its annotations
    annotated_resource: str = ""
    created_at: float = 0.0  # seconds since the epoch


@dataclass(frozen=True, slots=True)
class Update:
    container: str
    identity: Identity
    cpus: str  # cpulist
    mems: str  # cpulist; "" leaves the memory nodes as they are
    kind: str  # one of KINDS: "topology" (its groups) | "shrink" (into the shared pool) | "widen" (the pool grew
    # back) | "offline" (a holder whose groups' CPUs are all offline, onto the pool)
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Eviction:
    namespace: str
    pod: str
    reason: str  # one of EVICTION_REASONS
    why: str  # one sentence, for the log and the Event

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.pod


@dataclass(frozen=True, slots=True)
class CpusetPlan:
    updates: tuple[Update, ...]
    pool: tuple[int, ...]  # the shared pool now (every online CPU without --shared-pool)
    topology_containers: int  # running containers that hold topology devices
    pinned: int  # of those, already on their groups' CPUs
    pool_empty: bool  # the pool would be empty: nobody was shrunk
    offline: tuple[Identity, ...] = ()  # holders whose groups' CPUs are all offline (run on the pool)
    stranded: tuple[Identity, ...] = ()  # of those, the ones no CPU is left for (the pool is empty)
    free: tuple[int, ...] = ()  # the online CPUs of no held or pinned group, reserved ones included (with or
    # without --shared-pool: where an offline holder goes)
    evict: tuple[Eviction, ...] = ()  # pods to evict, each once: those of stranded holders


def stranded_evictions(stranded: Iterable[Identity]) -> tuple[Eviction, ...]:
    """The pods of stranded holders, each once (in the order of their first stranded container), with why."""
    containers: dict[tuple[str, str], list[str]] = {}
    for namespace, pod, name in stranded:
        containers.setdefault((namespace, pod), []).append(name)
    return tuple(Eviction(namespace, pod, "stranded",
                          f"{'container' if len(names) == 1 else 'containers'} {', '.join(names)} "
                          f"{'holds' if len(names) == 1 else 'hold'} groups whose CPUs are all offline, and every "
                          "online CPU is in a group another container holds: no cpuset keeps the pod off other "
                          "pods' CPUs")
                 for (namespace, pod), names in containers.items())


def desired_topology(container: RunningContainer, holders: Mapping[Identity, Iterable[DeviceKey]],
                     groups: Mapping[DeviceKey, Group]) -> list[Group]:
    """The groups a container holds: from pod-resources, else from its annotations (a new container),
    unless they name CPUs pod-resources lists for another container."""
    listed = [groups[k] for k in holders.get(container.identity, ()) if k in groups]
    if listed:
        return listed
    if not container.annotated_resource:
        return []
    annotated = [groups[(container.annotated_resource, d)] for d in container.annotated_groups
                 if (container.annotated_resource, d) in groups]
    mine = {c for g in annotated for c in g.cpus}
    for identity, keys in holders.items():
        if identity != container.identity and any(mine & set(groups[k].cpus) for k in keys if k in groups):
            return []  # not what kubelet allocated: another container holds some of those CPUs
    return annotated


def plan_cpusets(containers: Iterable[RunningContainer], holders: Mapping[Identity, Iterable[DeviceKey]],
                 held: Iterable[DeviceKey], groups: Mapping[DeviceKey, Group], online: Iterable[int],
                 reserved: Iterable[int] = (), shared_pool: bool = False) -> CpusetPlan:
    """The cpuset updates that bring every running container where it belongs."""
    online_set = frozenset(online)
    # "None of its own" is every CPU its parent allows: the groups' offline CPUs too, once back (or, on a fake
    # topology, never gone), so a container without one is moved whenever its target lacks any of them.
    everything = online_set | {c for g in groups.values() for c in g.cpus}
    running = [(c, desired_topology(c, holders, groups)) for c in containers]
    taken = {c for key in held if key in groups for c in groups[key].cpus}
    taken |= {c for _, mine in running for g in mine for c in g.cpus}
    pool = (online_set - taken) | (frozenset(reserved) & online_set)
    pool_empty = shared_pool and not pool
    pods: dict[tuple[str, str], set[int]] = {}  # each pod's online CPUs of the groups its containers hold
    for c, mine in running:
        pods.setdefault(c.identity[:2], set()).update(x for g in mine for x in g.cpus if x in online_set)
    updates: list[Update] = []
    offline: list[Identity] = []
    stranded: list[Identity] = []
    topology = pinned = 0
    for container, mine in running:
        current = container.cpus or everything
        if mine:
            topology += 1
            cpus = frozenset(c for g in mine for c in g.cpus) & online_set
            mems = ",".join(map(str, sorted({n for g in mine for n in g.memory_nodes})))
            if not cpus:  # every CPU of its groups went offline: the pool, never another pod's CPUs
                offline.append(container.identity)
                home = pool or frozenset(pods.get(container.identity[:2], ()))  # else its own pod's groups
                if not home:
                    stranded.append(container.identity)
                elif current != home:
                    updates.append(Update(container.id, container.identity, format_cpulist(sorted(home)), "",
                                          "offline", container.created_at))
                continue
            if current == cpus and (not mems or container.mems == mems):
                pinned += 1
                continue
            updates.append(Update(container.id, container.identity, format_cpulist(sorted(cpus)), mems, "topology",
                                  container.created_at))
        elif shared_pool and not pool_empty and current != pool:
            kind = "widen" if current < pool else "shrink"
            updates.append(Update(container.id, container.identity, format_cpulist(sorted(pool)), "", kind,
                                  container.created_at))
    return CpusetPlan(tuple(updates), tuple(sorted(pool if shared_pool else online_set)), topology, pinned,
                      pool_empty, tuple(offline), tuple(stranded), tuple(sorted(pool)), stranded_evictions(stranded))
