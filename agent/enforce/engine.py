"""What every cpuset enforcement engine is to the agent, and what the CRI loop and the NRI hooks share.

:class:`EnforcementEngine` is the face the running agent uses (the CRI loop, the NRI hooks and auto all have it);
:class:`CpusetEngine` holds what the two engines that plan cpusets are handed (the device table, the groups, the
online CPUs, the pool settings, the reporting sinks) and their counters. Must hold: one engine writes cpusets at a
time (auto stops one before it starts the next, and both share one set of counters, so the metrics stay monotonic).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from agent.devices.table import NodeDevices
from agent.enforce.evictions import SETTLE
from agent.plugin.servicer import Wire
from agent.policy.cpuset import CpusetPlan, Eviction
from agent.policy.grouping import Group
from agent.policy.keys import DeviceKey, Identity
from agent.topology.cpulist import format_cpulist

log = logging.getLogger("topology-agent.cpuset")

RUNTIME_DOWN = frozenset({"UNAVAILABLE", "CANCELLED", "NO_SOCKET", "NO_ACCESS"})  # CRI codes that fail the whole step


@dataclass
class EnforcementCounters:
    updates: dict[tuple[str, str], int]  # (kind, result) -> count
    steps: int = 0
    pinned: int = 0  # topology containers on their groups' CPUs at the last step
    topology_containers: int = 0
    pool_cpus: int = 0  # CPUs in the shared pool at the last step
    pool_empty: bool = False
    refused: str | None = None  # why enforcement is refused (kubelet's static CPU manager), or None
    container_refusals: int = 0  # calls the runtime refused for one container (the step went on)
    refusing: int = 0  # containers whose last call the runtime refused
    offline: int = 0  # holders whose groups' CPUs are all offline (on the shared pool), at the last plan
    stranded: int = 0  # of those, the ones no CPU is left for (kept as they are; NRI refuses their creation)
    creations_refused: int = 0  # NRI: creations refused (an ordinary container on an empty pool, a stranded holder)
    overridden: int = 0  # NRI: containers found by the re-check on a cpuset other than the one the agent knew


Notify = Callable[[str, str], None]  # (event reason, message): a Warning Event on the Node, sent off this thread
Evict = Callable[[Iterable[Eviction]], None]  # the pods the plan names for eviction (never blocks)


class OfflineNotices:
    """Says once per holder (log, Event) that its groups' CPUs are all offline, and again when it is back; keeps
    the counts of the last plan; hands the pods to evict (a stranded holder's) to ``evict`` (``--stranded-policy
    evict``; None: ``keep``)."""

    def __init__(self, notify: Notify | None, evict: Evict | None = None) -> None:
        self.notify = notify
        self.evict = evict
        self._said: dict[Identity, bool] = {}  # holder -> stranded when said

    def report(self, plan: CpusetPlan, counters: EnforcementCounters) -> None:
        counters.offline, counters.stranded = len(plan.offline), len(plan.stranded)
        if self.evict is not None:
            self.evict(plan.evict)
        stranded = set(plan.stranded)
        for identity in plan.offline:
            now = identity in stranded
            if self._said.get(identity) == now:
                continue
            self._said[identity] = now
            who = "/".join(identity)
            if now and self.evict is not None:
                message = (f"{who} holds groups whose CPUs are all offline and no CPU is left outside other holders' "
                           f"groups: no cpuset keeps it off other pods' CPUs, so its pod is evicted if it stays so for "
                           f"{SETTLE:g} s (--stranded-policy evict; a new container of it is refused)")
            elif now:
                message = (f"{who} holds groups whose CPUs are all offline and no CPU is left outside other holders' "
                           "groups: it keeps its cpuset, which may be on other pods' CPUs (--stranded-policy keep; a "
                           "new container of it is refused) until a CPU comes back or a group is freed")
            else:
                message = (f"{who} holds groups whose CPUs are all offline: it runs on the shared pool "
                           f"({format_cpulist(plan.free)}), never on CPUs other pods hold, until they are back")
            log.warning("%s", message, extra={"reason": "offline"})
            if self.notify is not None:
                self.notify("TopologyHolderOffline", message)
        for identity in set(self._said) - set(plan.offline):
            del self._said[identity]
            log.info("%s: its groups' CPUs are online again; pinned to them", "/".join(identity),
                     extra={"reason": "offline"})


class EnforcementEngine(Protocol):
    """A cpuset enforcement as the running agent sees it."""

    @property
    def mode(self) -> str:
        """The enforcement in force: cri, nri (auto: the engine's now, or none)."""
        ...

    @property
    def counters(self) -> EnforcementCounters: ...

    @property
    def failing(self) -> bool: ...

    def readiness_note(self) -> str | None: ...

    def enforced(self) -> dict[DeviceKey, list[str]]:
        """Each held device -> the cpusets its holders' containers run on."""
        ...

    def changed(self) -> None:
        """Devices changed hands (or CPUs came or went): look again soon. Never blocks."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class CpusetEngine:
    """What the CRI loop and the NRI hooks are handed, in one place, and their counters."""

    mode = "none"

    def __init__(self, devices: NodeDevices[Wire], groups: Mapping[DeviceKey, Group], annotation_domain: str, *,
                 online: Callable[[], frozenset[int]], reserved: frozenset[int], shared_pool: bool,
                 cpu_manager_policy: Callable[[], str | None], observe_pinned: Callable[[float], None] | None = None,
                 notify: Notify | None = None, evict: Evict | None = None,
                 counters: EnforcementCounters | None = None) -> None:
        self.devices = devices
        self.groups = groups
        self.domain = annotation_domain
        self.online = online  # the online CPUs now
        self.reserved = reserved
        self.shared_pool = shared_pool
        self.cpu_manager_policy = cpu_manager_policy  # kubelet's: static refuses the enforcement
        self.observe_pinned = observe_pinned  # seconds from a container's creation to its pinning
        self.counters = counters if counters is not None else EnforcementCounters(updates={})
        self.offline = OfflineNotices(notify, evict)

    def _count(self, kind: str, result: str) -> None:
        key = (kind, result)
        self.counters.updates[key] = self.counters.updates.get(key, 0) + 1
