"""Who holds which device: kubelet's pod-resources ``List`` plus our own Allocates that ``List``
does not show yet. Pure (time is passed in); the pod-resources client feeds it.

kubelet never reports deallocation, and an Allocate becomes visible in ``List`` only after it
returns. A pending allocation that a ``List`` begun well after it still does not show was
rolled back by kubelet (the pod was rejected later in admission) and is dropped; any pending
one expires after ``pending_timeout`` regardless.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.policy.health import DeviceKey, Holder


@dataclass(frozen=True, slots=True)
class ListedDevice:
    """One row of a pod-resources List answer for one of our resources."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass
class AllocationLedger:
    resources: frozenset[str]
    pending_timeout: float = 60.0
    visibility_grace: float = 2.0  # a List begun this long after an Allocate must show it
    listed: dict[DeviceKey, set[Holder]] = field(default_factory=dict)
    pending: dict[DeviceKey, float] = field(default_factory=dict)  # -> time of our Allocate
    synced: bool = False  # at least one List answer seen

    def record_allocate(self, resource: str, ids: Iterable[str], now: float) -> None:
        for device in ids:
            self.pending[(resource, device)] = now

    def apply_list(self, rows: Iterable[ListedDevice], started: float, now: float) -> None:
        """A ``List`` answer that was requested at ``started``."""
        listed: dict[DeviceKey, set[Holder]] = {}
        for row in rows:
            if row.resource not in self.resources:
                continue
            holder = Holder(row.namespace, row.pod, row.container)
            for device in row.device_ids:
                listed.setdefault((row.resource, device), set()).add(holder)
        self.listed = listed
        self.synced = True
        self.pending = {
            key: at for key, at in self.pending.items()
            if key not in listed and started < at + self.visibility_grace and now < at + self.pending_timeout
        }

    def expire(self, now: float) -> bool:
        """Drop pending allocations past their timeout; True when something was dropped."""
        kept = {k: at for k, at in self.pending.items() if now < at + self.pending_timeout}
        changed = len(kept) != len(self.pending)
        self.pending = kept
        return changed

    def held(self) -> Mapping[DeviceKey, set[Holder]]:
        result = {k: set(v) for k, v in self.listed.items()}
        for key in self.pending:
            result.setdefault(key, set()).add(Holder("", "not yet listed by kubelet", ""))
        return result
