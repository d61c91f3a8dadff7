"""The node's device table: every advertised device, who holds it, what it publishes to kubelet,
and the Allocate answers. No I/O and no gRPC; one lock for the node's state.

:class:`DeviceTable` is what the gRPC servicer needs of one resource, in one place:
:meth:`~DeviceTable.snapshot` and :meth:`~DeviceTable.wait_for_change` for ListAndWatch,
:meth:`~DeviceTable.admit` for Allocate (validate the ids and take the ready answer, then check
overlap and record the holders under the node's one lock, or raise :class:`~agent.errors.Refusal`) and
:meth:`~DeviceTable.preferred` for GetPreferredAllocation. :class:`NodeDevices` owns the tables
and everything they share: the holders (pod-resources plus our own Allocates), the machine's
health from rescans, and the published states, recomputed off the Allocate path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Generic, Protocol, TypeVar

from agent.errors import Refusal
from agent.policy.allocation import (
    PART_ORDER,
    AllocationSettings,
    ContainerPlan,
    GroupPart,
    group_part,
    plan_ordered,
)
from agent.policy.device_states import (
    DeviceState,
    device_states,
    elsewhere_conflict,
    held_elsewhere,
    machine_health,
    overlap_map,
)
from agent.policy.grouping import Group, Grouping, GroupingSettings
from agent.policy.keys import DeviceKey, Holder
from agent.policy.ledger import AllocationLedger, ListedDevice, SavedHolds, admissible
from agent.policy.preference import PreferenceIndex, preferred_allocation, spoiled_containers
from agent.topology.model import Topology
from agent.worker import Worker

log = logging.getLogger("topology-agent.devices")

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
MAX_ANSWERS = 512  # cached Allocate answers per resource (distinct id lists kubelet sent); the oldest go first
MAX_ECHOED_IDS = 8  # ids named in a refusal; the rest are counted (a refusal is a gRPC status, and a log line)
MAX_ECHOED_ID_LENGTH = 64

W = TypeVar("W")
_PART_ID = attrgetter("id")
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One published ListAndWatch snapshot: id -> Healthy/Unhealthy, in advertised order."""

    version: int
    health: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Answer(Generic[W]):
    """What Allocate returns for one container request: its groups, its ready wire form, and its plan.

    An answer keeps only what Allocate needs (the plan's dicts and strings are the wire's again, and
    about three times its size): the plan is made again from the groups' parts when asked (pure, so
    equal), and a first-time Allocate leaves little new memory behind, to be touched for the first time
    on kubelet's clock."""

    groups: tuple[str, ...]
    imbalance: str | None  # the plan's: why its ranks' unequal sizes matter
    wire: W
    parts: tuple[GroupPart, ...]
    settings: AllocationSettings

    @property
    def plan(self) -> ContainerPlan:
        return plan_ordered(self.parts, self.settings)


class HoldStore(Protocol):
    """Where every hold is kept across agent restarts (pod-resources may not answer after one)."""

    def save_holds(self, holds: SavedHolds) -> None: ...

    def tend(self) -> None:
        """Called now and then from the publisher: put back what was wiped (the saved groups)."""


def _shown(ids: Iterable[str]) -> str:
    ids = list(ids)
    shown = [repr(i if len(i) <= MAX_ECHOED_ID_LENGTH else i[:MAX_ECHOED_ID_LENGTH] + "...")
             for i in ids[:MAX_ECHOED_IDS]]
    more = f" and {len(ids) - MAX_ECHOED_IDS} more" if len(ids) > MAX_ECHOED_IDS else ""
    return ", ".join(shown) + more


def check_ids(ids: Sequence[str], known: Mapping[str, object], resource: str) -> None:
    """Raise Refusal("invalid") naming the bad ids (at most a few of them)."""
    if not ids:
        raise Refusal("invalid", f"{resource}: container request has no device ids")
    unique = set(ids)
    if len(unique) == len(ids) and known.keys() >= unique:  # the usual request: nothing to name
        return
    unknown = sorted({i for i in ids if i not in known})
    seen: set[str] = set()
    duplicates = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
    problems = []
    if unknown:
        problems.append(f"unknown device id(s) {_shown(unknown)}")
    if duplicates:
        problems.append(f"duplicate device id(s) {_shown(duplicates)}")
    if problems:
        raise Refusal("invalid", f"{resource}: {'; '.join(problems)} (known: {_shown(sorted(known))})")


class DeviceTable(Generic[W]):
    """One extended resource: its devices, their published health and its Allocate answers."""

    def __init__(self, node: NodeDevices[W], resource: str, groups: Iterable[Group], numa_topology: bool) -> None:
        self._node = node
        self.resource = resource
        self.groups: dict[str, Group] = {g.id: g for g in groups}
        self._parts = {i: group_part(g, node.allocation) for i, g in self.groups.items()}  # per group, once
        self._preference = PreferenceIndex(self.groups)  # the groups' features, once
        self.numa_topology = numa_topology  # set Device.topology (only when the node has several NUMA nodes)
        self._answers: dict[tuple[str, ...], Answer[W]] = {}  # insertion order: the oldest is evicted first
        self._cond = threading.Condition()
        self._snapshot = DeviceHealth(1, tuple((i, HEALTHY) for i in self.groups))

    # --- Allocate ---------------------------------------------------------------------------
    def admit(self, requests: Sequence[Sequence[str]]) -> list[Answer[W]]:
        """The answers for one Allocate's container requests, after recording their devices as held.

        All or nothing: Refusal("invalid") for bad ids, Refusal("unhealthy") for a group that lost CPUs
        (offline, standby, moved: its answer would name CPUs that are gone), Refusal("conflict") when a
        device overlaps a device of another resource that is held; then nothing is recorded.
        """
        node = self._node
        if not requests:
            raise Refusal("invalid", f"{self.resource}: Allocate request has no container requests")
        cached = self._answers.get
        # each id list made a tuple once: a protobuf repeated field decodes its strings on every pass
        answers = [cached(key) or self._answer(key) for key in map(tuple, requests)]
        with node.lock:
            broken = None
            if node.broken:  # some group lost CPUs (rare): is it one of these?
                broken = next(((self.resource, d) for a in answers for d in a.groups
                               if (self.resource, d) in node.broken), None)
            why = node.broken.get(broken) if broken is not None else None
            if why is None:
                admission = node.ledger.admit(self.resource, [a.groups for a in answers], node.clock(),
                                              node.overlap)
        if broken is not None:  # kubelet acted on a snapshot from before the rescan that found it
            raise Refusal("unhealthy", f"{self.resource}: {broken[1]} is not whole: {why}")
        if admission.refused is not None:
            raise Refusal("conflict", f"{self.resource}: {admission.refused}")
        if admission.changed:  # publish the new blocked set right after, off this path
            node.request_refresh()
        for other in admission.recent:
            log.warning("%s allocated right after %s: if one container requested both, their environments "
                        "collide (a container must request only one topology resource)", self.resource, other,
                        extra={"resource": self.resource, "reason": "possibly two topology resources in one container"})
        return answers

    def _answer(self, ids: Sequence[str]) -> Answer[W]:
        """Validate, plan and render a container request seen for the first time (the work outside the
        node's lock; only storing the answer takes it).

        The answer depends on the set of ids alone (a plan is in topology order), and kubelet sends a
        set in any order (``UnsortedList``): an order not seen before reuses the set's answer."""
        ids = tuple(ids)  # the same tuple when it is one
        check_ids(ids, self.groups, self.resource)
        parts = sorted(map(self._parts.__getitem__, ids), key=PART_ORDER)
        canonical = tuple(map(_PART_ID, parts))
        answers = self._answers
        answer = answers.get(canonical)
        if answer is None:
            settings = self._node.allocation
            plan = plan_ordered(parts, settings)
            answer = Answer(canonical, plan.imbalance, self._node.render(plan), tuple(parts), settings)
        with self._node.lock:
            for key in (canonical,) if ids == canonical else (canonical, ids):
                if key not in answers:
                    if len(answers) >= MAX_ANSWERS:
                        del answers[next(iter(answers))]
                    answers[key] = answer
        return answer

    # --- GetPreferredAllocation -------------------------------------------------------------------
    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """GetPreferredAllocation's choice, its Allocate answer made ready: kubelet allocates what it
        was offered, so the planning happens here rather than in the Allocate right after.

        Never a device Allocate would refuse while the request can be met without it (kubelet's
        ``available`` lags behind pods admitted back to back: it learns of a block from our next
        ListAndWatch message); among equal answers, the one that leaves the most whole books and
        drawers (criterion (4) of :mod:`agent.policy.preference`)."""
        node = self._node
        with node.lock:
            held = node.ledger.held()
            allowed = admissible(self.resource, available, held, node.overlap)
            keys = node._container_keys
            spoiled = spoiled_containers(keys[k] for k in (*held, *node.broken) if k in keys)
        if len(set(allowed) - set(must_include)) >= size - len(set(must_include)):
            available = allowed  # kubelet's health view lags behind our holds: offer nothing Allocate refuses
        chosen = preferred_allocation(self.groups, available, must_include, size, self._preference, spoiled)
        if chosen:
            self.prepare(chosen)
        return chosen

    def prepare(self, ids: Sequence[str]) -> None:
        """Plan and render the answer for ``ids`` unless it is cached (any order of the set)."""
        key = tuple(ids)
        if key not in self._answers:
            self._answer(key)

    # --- ListAndWatch -----------------------------------------------------------------------
    def snapshot(self) -> DeviceHealth:
        with self._cond:
            return self._snapshot

    def wait_for_change(self, version: int, timeout: float, cancelled: threading.Event) -> DeviceHealth:
        """The snapshot once its version differs from ``version``, or when cancelled or timed out."""
        with self._cond:
            self._cond.wait_for(lambda: self._snapshot.version != version or cancelled.is_set(), timeout)
            return self._snapshot

    def wake(self) -> None:
        """Wake every waiting stream (a stream was cancelled or the server stops)."""
        with self._cond:
            self._cond.notify_all()

    def publish(self, health: Mapping[str, str]) -> bool:
        """Set devices' health (ids not named stay as they are); True when it changed."""
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


class NodeDevices(Generic[W]):
    """Every resource's table and what they share: holders, machine health, published states."""

    TEND_EVERY = 5.0  # seconds between the publisher's store checks when nothing changes (a stat)

    def __init__(self, grouping: Grouping, settings: GroupingSettings, allocation: AllocationSettings,
                 render: Callable[[ContainerPlan], W], *, numa_topology: bool = False,
                 store: HoldStore | None = None, clock: Clock = time.monotonic, mode: str = "deviceplugin",
                 shadow: Sequence[Group] = ()) -> None:
        self.grouping = grouping
        self.shadow = tuple(shadow)  # groups not advertised whose holds still block what they overlap
        self.mode = mode  # what hands the devices out: "deviceplugin" (kubelet's device manager) or "dra" (claims)
        self.settings = settings
        self.allocation = allocation.validated()
        self.render = render
        self.clock = clock
        self.lock = threading.Lock()  # the node state's one lock: ledger, broken groups, states
        self.overlap = overlap_map(grouping, self.shadow)
        self.keys = {(g.resource, g.id): g.key for g in grouping.groups}  # each device's container key
        self._container_keys = {**{(g.resource, g.id): g.key for g in self.shadow}, **self.keys}
        self.ledger = AllocationLedger(frozenset(grouping.resources()) | {g.resource for g in self.shadow})
        self.store = store
        self._saved_holds = SavedHolds(frozenset(), {})
        self._listing_ok = False  # pod-resources answered, and its last answer is current
        self.tables: tuple[DeviceTable[W], ...] = tuple(
            DeviceTable(self, r, grouping.by_resource(r), numa_topology) for r in grouping.resources())
        self.broken: dict[DeviceKey, str] = {}
        self.changes = 0  # device state transitions published
        self._states: dict[DeviceKey, DeviceState] = device_states(grouping, {}, {}, self.overlap)
        self._publish_lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []  # told after every publish (off the Allocate path)
        self.enforced: Callable[[], Mapping[DeviceKey, list[str]]] | None = None  # cpusets applied, per device
        self._publisher: StatePublisher | None = None

    def table(self, resource: str) -> DeviceTable[W]:
        return next(t for t in self.tables if t.resource == resource)

    # --- inputs ---------------------------------------------------------------------------
    def apply_list(self, rows: Iterable[ListedDevice], started: float) -> None:
        with self.lock:
            self.ledger.apply_list(rows, started, self.clock())
            self._listing_ok = True
        self.refresh()

    def list_failed(self, _reason: object = None) -> None:
        """pod-resources did not answer: who holds what is unconfirmed until it does again."""
        with self.lock:
            self._listing_ok = False

    def restore_holds(self, holds: SavedHolds) -> None:
        """Every hold an earlier instance knew of: pending again until pod-resources shows or drops them."""
        with self.lock:
            self.ledger.restore(holds.keys, self.clock(), holds.pods)
            self._saved_holds = self.ledger.saved()
        self.refresh()

    def set_claims(self, claims: Mapping[DeviceKey, frozenset[Holder]]) -> None:
        """DRA mode: the devices of the claims prepared now (a prepare is a hold at once, until its unprepare); the
        listeners hear of it right after, off the caller's path."""
        with self.lock:
            self.ledger.set_claims(claims)
        self.request_refresh()

    def restore_claims(self, claims: Mapping[DeviceKey, frozenset[Holder]]) -> None:
        """Device-plugin mode: the claims a DRA agent left prepared, held until pod-resources shows or drops them."""
        with self.lock:
            self.ledger.restore_claims(claims, self.clock())
        self.refresh()

    def elsewhere(self) -> dict[DeviceKey, str]:
        """The devices held by the other mode (:func:`~agent.policy.device_states.held_elsewhere`), with who holds
        them."""
        with self.lock:
            return held_elsewhere(self.ledger.held(), self.mode)

    def in_use_elsewhere(self) -> dict[DeviceKey, str]:
        """DRA mode's devices that no claim may get now: those the other mode holds and those overlapping them (the
        scheduler's counters know only claims), with the reason."""
        with self.lock:
            elsewhere = held_elsewhere(self.ledger.held(), self.mode)
        out = dict(elsewhere)
        for key in self.keys:
            if key not in out:
                why = elsewhere_conflict(key, elsewhere, self.overlap)
                if why is not None:
                    out[key] = why
        return out

    def claim_conflict(self, keys: Iterable[DeviceKey]) -> str | None:
        """Why a claim on ``keys`` must not be prepared (a device the other mode holds, or one overlapping it)."""
        with self.lock:
            elsewhere = held_elsewhere(self.ledger.held(), self.mode)
        return next((why for why in (elsewhere_conflict(k, elsewhere, self.overlap) for k in keys) if why), None)

    def kubelet_restarted(self, seconds_ago: float = 0.0) -> None:
        """kubelet restarted (its socket re-created): its List releases nothing until it has settled."""
        with self.lock:
            self.ledger.kubelet_restarted(self.clock() - seconds_ago)
        self.refresh()

    def exclusivity_confirmed(self) -> bool:
        """pod-resources' last answer is current: the holders are known, not only our own Allocates."""
        with self.lock:
            return self._listing_ok

    def pending_holds(self) -> int:
        """Devices handed out that pod-resources has not shown yet."""
        with self.lock:
            return len(self.ledger.pending)

    def apply_topology(self, topology: Topology) -> None:
        broken = machine_health(self.grouping, topology, self.settings)
        with self.lock:
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
        with self.lock:
            return dict(self._states)

    def holders(self) -> dict[DeviceKey, list[str]]:
        with self.lock:
            return {k: sorted(map(str, v)) for k, v in self.ledger.held().items()}

    def held_keys(self) -> frozenset[DeviceKey]:
        """Every device held now: listed by pod-resources or handed out and not listed yet."""
        with self.lock:
            return frozenset(self.ledger.held())

    def holder_identities(self) -> dict[tuple[str, str, str], set[DeviceKey]]:
        """kubelet's namespace/pod/container -> the devices pod-resources lists it holding (or listed before a
        kubelet restart whose List has not settled yet)."""
        result: dict[tuple[str, str, str], set[DeviceKey]] = {}
        with self.lock:
            for key, holders in self.ledger.containers().items():
                for h in holders:
                    result.setdefault((h.namespace, h.pod, h.container), set()).add(key)
        return result

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs after a publish that changed some device's state, in the publishing thread:
        it must not block."""
        self._listeners.append(listener)

    def allocations(self, pod_names: bool = False) -> dict[str, Any]:
        """Devices, their states and holders, for /allocations. Without ``pod_names`` the holders are
        counted and the reasons name devices only: who runs what is not for whoever reaches the port."""
        states = self.states()
        holders = self.holders()
        enforced = self.enforced() if self.enforced is not None else None
        devices = []
        for g in self.grouping.groups:
            key = (g.resource, g.id)
            s = states[key]
            held = holders.get(key, [])
            reason = s.reason
            if not pod_names and s.state == "allocated":
                reason = f"held by {len(held)} container{'s' if len(held) != 1 else ''}"
            elif not pod_names and s.state == "held-elsewhere":
                other = "a DRA claim" if self.mode == "deviceplugin" else "a device-plugin allocation"
                reason = f"held through {other}"
            elif not pod_names and s.state == "blocked-by-overlap":
                blocker = next((o for o in self.overlap.get(key, ()) if holders.get(o)), None)
                reason = f"{blocker[0]} {blocker[1]} is held" if blocker else "an overlapping device is held"
            entry: dict[str, Any] = {"resource": g.resource, "id": g.id, "cpus": g.cpulist, "health": s.health,
                                     "state": s.state, "reason": reason, "holders": held if pod_names else len(held)}
            if enforced is not None:
                entry["enforced_cpusets"] = enforced.get(key, [])
            devices.append(entry)
        return {
            "resources": self.grouping.resources(),
            "devices": devices,
            "blocked": [d for d in devices if d["state"] == "blocked-by-overlap"],
            "unhealthy": [d for d in devices if d["health"] != HEALTHY],
        }

    # --- publishing off the Allocate path -------------------------------------------------
    def start_publisher(self) -> None:
        """Publish allocation-driven changes from a thread of their own (until stop_publisher)."""
        self._publisher = StatePublisher(self)
        self._publisher.start()

    def stop_publisher(self) -> None:
        if self._publisher is not None:
            self._publisher.stop()
            self._publisher = None

    def request_refresh(self) -> None:
        publisher = self._publisher
        if publisher is None:
            self.refresh()
        else:
            publisher.wake()

    def _save_holds(self) -> None:
        """Keep every hold on disk (off the Allocate path: refresh runs in the publisher)."""
        if self.store is None:
            return
        with self.lock:
            holds = self.ledger.saved()
            if holds == self._saved_holds:
                return
            self._saved_holds = holds
        self.store.save_holds(holds)

    def refresh(self) -> None:
        """Recompute every device's state and publish the resources whose health changed.

        One refresh at a time from compute to publish, so an older computation never overwrites
        a newer one (the publisher, the pod-resources loop and rescans all refresh)."""
        with self._publish_lock:
            with self.lock:
                held = self.ledger.held()
                new = device_states(self.grouping, held, self.broken, self.overlap, held_elsewhere(held, self.mode))
                old, self._states = self._states, new
            changed = False
            for key, state in new.items():
                if old.get(key) != state:
                    changed = True
                    self.changes += 1
                    before = old[key].state if key in old else "-"
                    log.info("device %s %s: %s -> %s%s", key[0], key[1], before, state.state,
                             f" ({state.reason})" if state.reason else "",
                             extra={"resource": key[0], "device": key[1], "before": before, "after": state.state,
                                    "reason": state.reason})
            self._save_holds()  # first: whatever kubelet is shown blocked is on disk, should the agent die now
            for table in self.tables:
                table.publish({dev: s.health for (res, dev), s in new.items() if res == table.resource})
            if not changed:
                return
        for listener in self._listeners:  # devices changed hands, or health
            listener()


class StatePublisher(Worker):
    """Publishes a node's device states from a thread of its own: first every one-group answer (most pods hold one),
    then a refresh whenever woken (an Allocate, a List) and the store's upkeep every ``TEND_EVERY`` seconds."""

    def __init__(self, devices: NodeDevices[Any]) -> None:
        super().__init__(thread_name="state-publisher")
        self.devices = devices

    def _run(self) -> None:
        devices = self.devices
        try:  # every one-group answer ready before kubelet asks
            for table in devices.tables:
                for device in table.groups:
                    if self._stop.is_set():
                        return
                    table.prepare([device])
        except Exception:  # an Allocate plans it then; publishing must go on
            log.exception("preparing the one-group answers failed")
        while True:
            dirty = self._wake.wait(devices.TEND_EVERY)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if dirty:
                    devices.refresh()
                if devices.store is not None:
                    devices.store.tend()
            except Exception:  # keep publishing whatever happens to one refresh
                log.exception("publishing device states failed")
