"""Who holds which device: kubelet's pod-resources ``List`` plus our own Allocates that ``List``
does not show yet, and the admission rule that keeps books and sockets exclusive. Pure: time is
passed in; the caller holds one lock around every call.

kubelet never reports deallocation, and an Allocate becomes visible in ``List`` only after it
returns. A pending allocation that a ``List`` begun well after it still does not show was rolled
back by kubelet (the pod was rejected later in admission) and is dropped. Nothing else ever drops
it: while pod-resources does not answer, what the agent handed out stays held, however long.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.policy.health import DeviceKey, Holder

PENDING = Holder("", "not yet listed by kubelet", "")


@dataclass(frozen=True, slots=True)
class ListedDevice:
    """One row of a pod-resources List answer for one of our resources."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of :meth:`AllocationLedger.admit`."""

    refused: str | None = None  # why the devices cannot be handed out now; None: recorded
    changed: bool = False  # the set of held devices grew (publish the new blocked set)
    recent: tuple[str, ...] = ()  # other resources allocated just before: perhaps one container asked for two


def conflict(key: DeviceKey, held: Mapping[DeviceKey, Iterable[Holder]],
             overlap: Mapping[DeviceKey, Sequence[DeviceKey]]) -> str | None:
    """Why allocating ``key`` now would break exclusivity, or None."""
    for other in overlap.get(key, ()):
        holders = held.get(other)
        if holders:
            return f"{key[0]} {key[1]} overlaps {other[0]} {other[1]}, held by {min(holders)}"
    return None


@dataclass
class AllocationLedger:
    resources: frozenset[str]
    visibility_grace: float = 2.0  # a List begun this long after an Allocate must show it
    same_container_window: float = 0.5  # kubelet allocates one container's resources back to back
    listed: dict[DeviceKey, frozenset[Holder]] = field(default_factory=dict)
    pending: dict[DeviceKey, float] = field(default_factory=dict)  # -> time of our Allocate
    last_allocate: dict[str, float] = field(default_factory=dict)  # resource -> time of its last Allocate
    synced: bool = False  # at least one List answer seen
    _held: dict[DeviceKey, frozenset[Holder]] = field(default_factory=dict, repr=False)

    def held(self) -> Mapping[DeviceKey, frozenset[Holder]]:
        """Every held device and its holders (listed containers, or PENDING); do not modify."""
        return self._held

    def admit(self, resource: str, requests: Sequence[Sequence[str]], now: float,
              overlap: Mapping[DeviceKey, Sequence[DeviceKey]]) -> Admission:
        """Record the devices of every container request of one Allocate, or none of them when any
        overlaps a held device of another resource."""
        recent = tuple(r for r, at in self.last_allocate.items()
                       if r != resource and now - at < self.same_container_window)
        keys = [(resource, device) for ids in requests for device in ids]
        for key in keys:
            why = conflict(key, self._held, overlap)
            if why is not None:
                if recent:
                    why += (f" (allocated right after {', '.join(recent)}: if one container requested both, note "
                            "that a container must request only one topology resource)")
                return Admission(refused=why, recent=recent)
        changed = False
        for key in keys:
            self.pending[key] = now  # a repeated Allocate (a container restart) renews the hold
            if key not in self._held:
                self._held[key] = frozenset({PENDING})
                changed = True
        self.last_allocate[resource] = now
        return Admission(changed=changed, recent=recent)

    def apply_list(self, rows: Iterable[ListedDevice], started: float, now: float) -> None:
        """A ``List`` answer that was requested at ``started``."""
        listed: dict[DeviceKey, set[Holder]] = {}
        for row in rows:
            if row.resource not in self.resources:
                continue
            holder = Holder(row.namespace, row.pod, row.container)
            for device in row.device_ids:
                listed.setdefault((row.resource, device), set()).add(holder)
        self.listed = {k: frozenset(v) for k, v in listed.items()}
        self.synced = True
        self.pending = {key: at for key, at in self.pending.items()
                        if key not in listed and started < at + self.visibility_grace}
        self._rebuild()

    def restore(self, keys: Iterable[DeviceKey], now: float) -> None:
        """Holds saved by an agent that stopped: pending again until the next ``List`` shows or drops
        them (they were allocated before ``now``, so a List begun from now on must show them)."""
        for key in keys:
            if key[0] in self.resources:
                self.pending.setdefault(key, now - self.visibility_grace)
        self._rebuild()

    def _rebuild(self) -> None:
        held = dict(self.listed)
        for key in self.pending:
            held[key] = held.get(key, frozenset()) | {PENDING}
        self._held = held
