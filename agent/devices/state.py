"""The node's live device state: holders (pod-resources + our Allocates), machine health from
rescans, and what every device publishes. Thin: the rules live in agent.policy.health and
agent.policy.ledger; this object holds the current values under one short lock and pushes
each change to the resources' ListAndWatch streams (in memory, no I/O)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from agent.devices.table import ResourceDevices
from agent.policy.grouping import Grouping, GroupingSettings
from agent.policy.health import DeviceKey, DeviceState, conflict, device_states, machine_health, overlap_map
from agent.policy.ledger import AllocationLedger, ListedDevice
from agent.topology.model import Topology

log = logging.getLogger("topology-agent.state")

Clock = Callable[[], float]
SAME_CONTAINER_WINDOW = 0.5  # seconds: two resources allocated this close may belong to one container


class NodeState:
    def __init__(self, grouping: Grouping, resources: Sequence[ResourceDevices], settings: GroupingSettings,
                 pending_timeout: float = 60.0, clock: Clock = time.monotonic) -> None:
        self.grouping = grouping
        self.settings = settings
        self.resources = {r.resource: r for r in resources}
        self.overlap = overlap_map(grouping)
        self.ledger = AllocationLedger(frozenset(self.resources), pending_timeout=pending_timeout)
        self.broken: dict[DeviceKey, str] = {}
        self.clock = clock
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._states: dict[DeviceKey, DeviceState] = device_states(grouping, {}, {}, self.overlap)
        self.changes = 0  # device state transitions published
        self._last_allocate: dict[str, float] = {}
        self._held = self.ledger.held()  # refreshed under the lock whenever the ledger changes
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._publisher: threading.Thread | None = None

    # --- inputs ---------------------------------------------------------------------------
    def check_allocate(self, resource: str, ids: Sequence[str]) -> str | None:
        """Why Allocate must refuse ``ids`` (an overlapping device is held), or None."""
        with self._lock:
            held = self._held
            now = self.clock()
            recent = [r for r, at in self._last_allocate.items() if r != resource and now - at < SAME_CONTAINER_WINDOW]
        for device in ids:
            why = conflict((resource, device), held, self.overlap)
            if why is not None:
                if recent:
                    why += (f" (allocated right after {', '.join(recent)}: if one container requested both, "
                            f"note that a container must request only one topology resource)")
                return why
        return None

    def record_allocate(self, resource: str, ids: Iterable[str]) -> None:
        now = self.clock()
        keys = [(resource, i) for i in ids]
        with self._lock:
            self.ledger.record_allocate(resource, ids, now)
            changed = not all(k in self._held for k in keys)  # a repeated Allocate changes nothing
            if changed:
                self._held = self.ledger.held()
            recent = [r for r, at in self._last_allocate.items() if r != resource and now - at < SAME_CONTAINER_WINDOW]
            self._last_allocate[resource] = now
        for other in recent:
            # kubelet allocates a container's resources one after the other: this may be one container.
            log.warning("%s allocated right after %s: if one container requested both, their environments "
                        "collide (a container must request only one topology resource)", resource, other,
                        extra={"resource": resource, "reason": "possibly two topology resources in one container"})
        if changed:  # Allocate must stay fast: the new blocked set is published right after, off this path
            self._request_refresh()

    def apply_list(self, rows: Iterable[ListedDevice], started: float) -> None:
        with self._lock:
            self.ledger.apply_list(rows, started, self.clock())
            self._held = self.ledger.held()
        self.refresh()

    def expire_pending(self) -> None:
        with self._lock:
            changed = self.ledger.expire(self.clock())
            self._held = self.ledger.held()
        if changed:
            self.refresh()

    def apply_topology(self, topology: Topology) -> None:
        broken = machine_health(self.grouping, topology, self.settings)
        with self._lock:
            before, self.broken = self.broken, broken
        for key in sorted(set(before) | set(broken)):
            if before.get(key) != broken.get(key):
                log.warning("topology change for %s %s: %s -> %s", key[0], key[1], before.get(key, "whole"),
                            broken.get(key, "whole again"),
                            extra={"resource": key[0], "device": key[1], "before": before.get(key, "whole"),
                                   "after": broken.get(key, "whole")})
        self.refresh()

    # --- outputs --------------------------------------------------------------------------
    def states(self) -> dict[DeviceKey, DeviceState]:
        with self._lock:
            return dict(self._states)

    def holders(self) -> dict[DeviceKey, list[str]]:
        with self._lock:
            return {k: sorted(map(str, v)) for k, v in self._held.items()}

    # --- publishing off the Allocate path -------------------------------------------------
    def start_publisher(self) -> None:
        """Publish allocation-driven changes from a thread of their own (until stop_publisher)."""
        self._publisher = threading.Thread(target=self._publish_loop, name="state-publisher", daemon=True)
        self._publisher.start()

    def stop_publisher(self) -> None:
        self._stopping.set()
        self._dirty.set()
        if self._publisher is not None:
            self._publisher.join(timeout=5)
            self._publisher = None

    def _request_refresh(self) -> None:
        if self._publisher is None:
            self.refresh()
        else:
            self._dirty.set()

    def _publish_loop(self) -> None:
        # Also wakes now and then to expire pending allocations that kubelet never listed, so a
        # node without a working pod-resources socket does not keep groups blocked for ever.
        check = max(self.ledger.pending_timeout / 4, 1.0)
        while True:
            dirty = self._dirty.wait(check)
            self._dirty.clear()
            if self._stopping.is_set():
                return
            try:
                if not dirty:
                    self.expire_pending()
                    continue
                self.refresh()
            except Exception:  # keep publishing whatever happens to one refresh
                log.exception("publishing device states failed")

    def refresh(self) -> None:
        """Recompute every device's state and publish the resources whose health changed.

        One refresh at a time from compute to publish, so an older computation never overwrites
        a newer one (the publisher, the pod-resources loop and rescans all refresh)."""
        with self._publish_lock:
            self._refresh_locked()

    def _refresh_locked(self) -> None:
        with self._lock:
            new = device_states(self.grouping, self._held, self.broken, self.overlap)
            old, self._states = self._states, new
        for key, state in new.items():
            if old.get(key) != state:
                self.changes += 1
                before = old[key].state if key in old else "-"
                log.info("device %s %s: %s -> %s%s", key[0], key[1], before, state.state,
                         f" ({state.reason})" if state.reason else "",
                         extra={"resource": key[0], "device": key[1], "before": before, "after": state.state,
                                "reason": state.reason})
        for resource, devices in self.resources.items():
            devices.publish({dev: s.health for (res, dev), s in new.items() if res == resource})
