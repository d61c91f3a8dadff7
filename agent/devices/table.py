"""One resource's devices as the plugin serves them: groups by id, their health as published
to kubelet, and the Allocate answers, computed once per id set. No I/O, no gRPC."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.policy.allocation import AllocationSettings, ContainerPlan, plan_allocation
from agent.policy.grouping import Group

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


class DeviceRequestError(ValueError):
    """Device ids kubelet sent that this resource cannot honour (unknown, duplicate, none)."""


def check_ids(ids: Sequence[str], known: Mapping[str, object], resource: str) -> None:
    """Raise DeviceRequestError naming every bad id."""
    if not ids:
        raise DeviceRequestError(f"{resource}: container request has no device ids")
    unknown = sorted({i for i in ids if i not in known})
    seen: set[str] = set()
    duplicates = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
    problems = []
    if unknown:
        problems.append(f"unknown device id(s) {', '.join(map(repr, unknown))}")
    if duplicates:
        problems.append(f"duplicate device id(s) {', '.join(map(repr, duplicates))}")
    if problems:
        raise DeviceRequestError(f"{resource}: {'; '.join(problems)} (known: {', '.join(sorted(known))})")


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One published ListAndWatch snapshot: id -> Healthy/Unhealthy, in advertised order."""

    version: int
    health: tuple[tuple[str, str], ...]


class ResourceDevices:
    """The devices of one extended resource and their published health."""

    def __init__(self, resource: str, groups: Iterable[Group], settings: AllocationSettings | None = None,
                 numa_topology: bool = False) -> None:
        self.resource = resource
        self.groups: dict[str, Group] = {g.id: g for g in groups}
        self.settings = (settings or AllocationSettings()).validated()
        self.numa_topology = numa_topology  # set Device.topology (only when the node has several NUMA nodes)
        self._plans: dict[frozenset[str], ContainerPlan] = {}
        self._cond = threading.Condition()
        self._snapshot = DeviceHealth(1, tuple((i, HEALTHY) for i in self.groups))

    # --- Allocate -----------------------------------------------------------------------
    def plan(self, ids: Sequence[str]) -> ContainerPlan:
        """The container plan for ``ids`` (validated); cached per id set."""
        check_ids(ids, self.groups, self.resource)
        key = frozenset(ids)
        plan = self._plans.get(key)
        if plan is None:
            plan = plan_allocation((self.groups[i] for i in key), self.settings)
            self._plans[key] = plan
        return plan

    # --- health ------------------------------------------------------------------------
    def snapshot(self) -> DeviceHealth:
        with self._cond:
            return self._snapshot

    def publish(self, health: Mapping[str, str]) -> bool:
        """Set every device's health (ids not named stay as they are); True when it changed."""
        with self._cond:
            current = dict(self._snapshot.health)
            for device, state in health.items():
                if device not in current:
                    raise KeyError(f"{self.resource}: no device {device!r}")
                current[device] = HEALTHY if state == HEALTHY else UNHEALTHY
            new = tuple(current.items())
            if new == self._snapshot.health:
                return False
            self._snapshot = DeviceHealth(self._snapshot.version + 1, new)
            self._cond.notify_all()
            return True

    def wait_for_change(self, version: int, timeout: float, cancelled: threading.Event) -> DeviceHealth:
        """The snapshot once its version differs from ``version``, or when cancelled or timed out."""
        with self._cond:
            self._cond.wait_for(lambda: self._snapshot.version != version or cancelled.is_set(), timeout)
            return self._snapshot

    def wake(self) -> None:
        """Wake every waiting stream (used when a stream is cancelled or the server stops)."""
        with self._cond:
            self._cond.notify_all()
