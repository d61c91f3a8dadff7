"""Who holds which device: kubelet's pod-resources ``List`` plus our own Allocates that ``List`` does not show yet, the
prepared DRA claims, and the admission rule that keeps books and sockets exclusive. Pure: time is passed in; the
caller holds one lock around every call.

Must hold: kubelet never reports deallocation, so nothing the agent handed out is released while pod-resources does
not answer; a pending allocation a later ``List`` does not show is held by the pods that appeared since (a plain init
container's) or, when none did, dropped; after a kubelet restart Lists add holders but release nothing until two
Lists begun ``restart_settle`` seconds after it agree; a claim's devices are held in either mode, and an Allocate is
refused a device held through a claim. Why, with kubelet's code: docs/contributing/design/holds.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.policy.keys import DeviceKey, Holder

PENDING = Holder("", "not yet listed by kubelet", "")
INIT = "(init container)"
PodRef = tuple[str, str]  # (namespace, pod)


@dataclass(frozen=True, slots=True)
class ListedDevice:
    """One row of a pod-resources List answer for one of our resources."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    claim: str = ""  # the DRA claim (namespace/name) the devices are held through; "" for a device-plugin row


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of :meth:`AllocationLedger.admit`."""

    refused: str | None = None  # why the devices cannot be handed out now; None: recorded
    changed: bool = False  # the set of held devices grew (publish the new blocked set)
    recent: tuple[str, ...] = ()  # other resources allocated just before: perhaps one container asked for two


def conflict(key: DeviceKey, held: Mapping[DeviceKey, Iterable[Holder]],
             overlap: Mapping[DeviceKey, Sequence[DeviceKey]]) -> str | None:
    """Why allocating ``key`` now would break exclusivity, or None: it is held through a DRA claim (kubelet's device
    manager, which offers it, does not know that hold), or it overlaps a held device."""
    claimed = sorted(h for h in held.get(key, ()) if h.claim)
    if claimed:
        return f"{key[0]} {key[1]} is held through a DRA claim: {claimed[0]}"
    for other in overlap.get(key, ()):
        holders = held.get(other)
        if holders:
            return f"{key[0]} {key[1]} overlaps {other[0]} {other[1]}, held by {min(holders)}"
    return None


def admissible(resource: str, ids: Sequence[str], held: Mapping[DeviceKey, Iterable[Holder]],
               overlap: Mapping[DeviceKey, Sequence[DeviceKey]]) -> list[str]:
    """The ``ids`` of ``resource`` that Allocate would not refuse now (no overlapping device held)."""
    return [i for i in ids if conflict((resource, i), held, overlap) is None]


@dataclass(frozen=True, slots=True)
class SavedHolds:
    """What a restarted agent needs to hold again: every held device, and the pods of the init-container holds."""

    keys: frozenset[DeviceKey]
    pods: Mapping[DeviceKey, frozenset[PodRef]]


@dataclass
class AllocationLedger:
    resources: frozenset[str]
    visibility_grace: float = 2.0  # a List begun this long after an Allocate must show it
    same_container_window: float = 0.5  # kubelet allocates one container's resources back to back
    listed: dict[DeviceKey, frozenset[Holder]] = field(default_factory=dict)
    listed_at: float = float("-inf")  # when the List that ``listed`` is from was requested
    pending: dict[DeviceKey, float] = field(default_factory=dict)  # -> time of our Allocate
    last_allocate: dict[str, float] = field(default_factory=dict)  # resource -> time of its last Allocate
    restart_settle: float = 10.0  # after a kubelet restart, Lists release nothing for this long (at least)
    claims: dict[DeviceKey, frozenset[Holder]] = field(default_factory=dict)  # DRA mode: prepared claims
    pending_claims: dict[DeviceKey, tuple[float, frozenset[Holder]]] = field(default_factory=dict)  # restored
    synced: bool = False  # at least one List answer seen
    pod_held: dict[DeviceKey, frozenset[PodRef]] = field(default_factory=dict)  # held by plain init containers
    kept: dict[DeviceKey, frozenset[Holder]] = field(default_factory=dict)  # held when kubelet restarted
    restarted_at: float | None = None  # kubelet restarted then and its List has not settled yet
    _pods: frozenset[PodRef] | None = None  # the pods of the last List (None: no List yet)
    _seen_before: dict[DeviceKey, frozenset[PodRef] | None] = field(default_factory=dict)  # pods at the Allocate
    _settling: frozenset[PodRef] | None = None  # pods of the last List begun past the settle time
    _held: dict[DeviceKey, frozenset[Holder]] = field(default_factory=dict, repr=False)

    def held(self) -> Mapping[DeviceKey, frozenset[Holder]]:
        """Every held device and its holders (listed containers, or PENDING); do not modify."""
        return self._held

    def admit(self, resource: str, requests: Sequence[Sequence[str]], now: float,
              overlap: Mapping[DeviceKey, Sequence[DeviceKey]]) -> Admission:
        """Record the devices of every container request of one Allocate, or none of them when any
        overlaps a held device of another resource."""
        last = self.last_allocate
        recent: tuple[str, ...] = ()
        if len(last) > 1 or (last and resource not in last):  # another resource allocated before
            recent = tuple(r for r, at in last.items() if r != resource and now - at < self.same_container_window)
        keys = [(resource, device) for ids in requests for device in ids]
        for key in keys:
            if not overlap.get(key) and key not in self._held:  # overlaps nothing, held by nobody: no conflict
                continue
            why = conflict(key, self._held, overlap)
            if why is not None:
                if recent:
                    why += (f" (allocated right after {', '.join(recent)}: if one container requested both, note "
                            "that a container must request only one topology resource)")
                return Admission(refused=why, recent=recent)
        changed = False
        for key in keys:
            self.pending[key] = now  # a repeated Allocate (a container restart) renews the hold
            self._seen_before[key] = self._pods
            if key not in self._held:
                self._held[key] = frozenset({PENDING})
                changed = True
        self.last_allocate[resource] = now
        return Admission(changed=changed, recent=recent)

    def apply_list(self, rows: Iterable[ListedDevice], started: float, now: float) -> None:
        """A ``List`` answer that was requested at ``started``."""
        listed: dict[DeviceKey, set[Holder]] = {}
        pods: set[PodRef] = set()
        with_ours: set[PodRef] = set()
        for row in rows:
            pods.add((row.namespace, row.pod))
            if row.resource not in self.resources:
                continue
            holder = Holder(row.namespace, row.pod, row.container, row.claim)
            for device in row.device_ids:
                listed.setdefault((row.resource, device), set()).add(holder)
                with_ours.add((row.namespace, row.pod))
        self.listed = {k: frozenset(v) for k, v in listed.items()}
        self.listed_at = started
        self.synced = True
        listed_pods = frozenset(pods)
        settling = self._settled(listed_pods, started)
        self._pods = listed_pods
        # Init-container holds: while any of their pods is listed (or kubelet's view is not settled).
        self.pod_held = {key: owners for key, owners in self.pod_held.items()
                         if key not in listed and (settling or owners & listed_pods)}
        pending: dict[DeviceKey, float] = {}
        for key, at in self.pending.items():
            if key in listed:
                self._seen_before.pop(key, None)
            elif settling or started < at + self.visibility_grace:
                pending[key] = at
            else:
                before = self._seen_before.pop(key, None)
                owners = frozenset(listed_pods - before - with_ours) if before is not None else frozenset()
                if owners:
                    self.pod_held[key] = owners
        self.pending = pending
        self.pending_claims = {key: (at, holders) for key, (at, holders) in self.pending_claims.items()
                               if key not in listed and (settling or started < at + self.visibility_grace)}
        self._rebuild()

    def _settled(self, pods: frozenset[PodRef], started: float) -> bool:
        """Still settling after a kubelet restart (True), or settled with this answer (False)."""
        if self.restarted_at is None:
            return False
        if started < self.restarted_at + self.restart_settle:
            return True
        previous, self._settling = self._settling, pods
        if previous != pods:
            return True
        self.restarted_at = None
        self._settling = None
        self.kept = {}
        return False

    def kubelet_restarted(self, at: float) -> None:
        """kubelet restarted at ``at`` (its socket was re-created): keep every hold known now until its
        List has settled again."""
        for key, holders in self.listed.items():
            self.kept[key] = self.kept.get(key, frozenset()) | holders
        self.restarted_at = at if self.restarted_at is None else max(self.restarted_at, at)
        self._settling = None
        self._rebuild()

    def restore(self, keys: Iterable[DeviceKey], now: float,
                pods: Mapping[DeviceKey, frozenset[PodRef]] | None = None) -> None:
        """Holds saved by an agent that stopped: pending again until the next ``List`` shows or drops
        them (they were allocated before ``now``, so a List begun from now on must show them); those
        of init containers (``pods``) held while their pods are listed."""
        for key, owners in (pods or {}).items():
            if key[0] in self.resources and owners:
                self.pod_held[key] = self.pod_held.get(key, frozenset()) | owners
        for key in keys:
            if key[0] in self.resources and key not in self.pod_held:
                self.pending.setdefault(key, now - self.visibility_grace)
        self._rebuild()

    def set_claims(self, claims: Mapping[DeviceKey, frozenset[Holder]]) -> None:
        """DRA mode: the devices of every claim prepared now, held until it is unprepared (listed or not)."""
        self.claims = {key: frozenset(holders) for key, holders in claims.items() if holders}
        self._rebuild()

    def restore_claims(self, claims: Mapping[DeviceKey, frozenset[Holder]], now: float) -> None:
        """Device-plugin mode: the claims a DRA agent left prepared, held until a ``List`` shows or drops them (as
        :meth:`restore` keeps saved holds): no unprepare comes while no DRA plugin runs."""
        for key, holders in claims.items():
            if key[0] in self.resources and holders:
                self.pending_claims[key] = (now - self.visibility_grace, frozenset(holders))
        self._rebuild()

    def containers(self) -> Mapping[DeviceKey, frozenset[Holder]]:
        """The containers known to hold each device: listed, and those listed before a kubelet restart
        that has not settled yet (the same containers, most likely, still running).

        A device Allocated after the List that named its holder was requested has a new holder that no List
        names yet: kubelet hands out only devices its active pods do not hold (``pkg/kubelet/cm/devicemanager``
        ``UpdateAllocatedDevices`` frees a removed pod's before ``devicesToAllocate`` picks), so the listed one
        is gone (a pod deleted at once, its container still being killed), and is not named as its holder any
        more (the device stays held: pending). Else the new holder's annotations, naming CPUs "another
        container" holds, would not be believed, and its container would start on the shared pool instead of
        its book until the next List."""
        stale = {key for key, at in self.pending.items() if at > self.listed_at}
        current = {key: holders for key, holders in self.listed.items() if key not in stale}
        if self.restarted_at is None or not self.kept:
            return current
        merged = dict(self.kept)
        for key, holders in current.items():
            merged[key] = merged.get(key, frozenset()) | holders
        return merged

    def saved(self) -> SavedHolds:
        """Every device-plugin hold, for saving: an agent restarted while pod-resources is away must know them all
        (a device held through DRA claims alone is in the DRA checkpoint instead)."""
        return SavedHolds(frozenset(k for k, holders in self._held.items() if any(not h.claim for h in holders)),
                          dict(self.pod_held))

    def _rebuild(self) -> None:
        held = dict(self.listed)
        for key in self.pending:
            held[key] = held.get(key, frozenset()) | {PENDING}
        for key, owners in self.pod_held.items():
            held[key] = held.get(key, frozenset()) | {Holder(ns, pod, INIT) for ns, pod in owners}
        if self.restarted_at is not None:
            for key, holders in self.kept.items():
                held[key] = held.get(key, frozenset()) | holders
        for key, holders in self.claims.items():
            held[key] = held.get(key, frozenset()) | holders
        for key, (_, holders) in self.pending_claims.items():
            held[key] = held.get(key, frozenset()) | holders
        self._held = held
