"""The soak's invariants, checked over plain snapshots of the truth: no I/O here (``truth.py`` reads them).

A :class:`Snapshot` is what the node and the API server said at one moment: every container's ``Cpus_allowed_list``
(each thread), the groups each pod holds by kubelet's own accounts (its device checkpoint, pod-resources, the claims'
allocations), the agent's hold file and DRA checkpoint, the CDI files, the ResourceSlices, the pods and claims that
exist, admission failures, and the agent's RSS and open files. :class:`Checker` takes them one after the other and
returns the violations each one shows (each once), by kind:

* ``shared-held-cpu``: a CPU of a held group allowed to two holders;
* ``non-holder-on-held-cpu``: with the shared pool on, a container holding nothing allowed a CPU of a held group
  (unless the pool would be empty: the agent then shrinks nobody);
* ``holder-outside-group``: a holder allowed a CPU outside its groups, once the pin bound after its start has passed;
* ``admission-failure-while-free``: a pod failed admission while a group of the resource it asked for was free;
* ``leaked-hold``: kubelet's checkpoint or pod-resources names a pod that no longer exists, or the agent's hold
  file keeps a group nobody holds, past the grace;
* ``leaked-claim-checkpoint``: the agent's DRA checkpoint keeps a claim that no longer exists, past the grace;
* ``leaked-cdi-file``: a CDI spec file of a claim that no longer exists, past the grace;
* ``leaked-slice``: the driver's ResourceSlices outlive DRA mode, past the grace;
* ``terminating-too-long``: a pod still there longer than its termination grace period past its deletion, plus the
  bound (its containers stopped, kubelet finishes it: unprepares its claims, removes it);
* ``advertised-fewer-than-free``: in device-plugin mode the Node's allocatable offers fewer groups of a level than are
  free, past the bound: free is every CPU online and none in a group held by a pod still running (one with a running
  container, or one not being deleted);
* ``agent-rss-growth``, ``agent-fd-growth``: one agent process's RSS or open files grew past the allowance since
  its first sample after warm-up.

The allowances (:class:`Allowances`) are documented with their reasons in bench/README.md, section "Soak".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

KINDS = ("shared-held-cpu", "non-holder-on-held-cpu", "holder-outside-group", "admission-failure-while-free",
         "leaked-hold", "leaked-claim-checkpoint", "leaked-cdi-file", "leaked-slice", "terminating-too-long",
         "advertised-fewer-than-free", "agent-rss-growth", "agent-fd-growth")


@dataclass(frozen=True)
class Allowances:
    pin_bound_nri: float = 0.0  # the container is created inside its groups (NRI CreateContainer)
    pin_bound_cri: float = 2.0  # CRI UpdateContainerResources after the start: the agent's pin loop
    recovery: float = 15.0  # after a fault ends (a component back up), the agent catches up
    cpu_online_recovery: float = 150.0  # a fake-topology CPU back online: ConfigMap sync, rescan, re-pin
    leak_grace: float = 60.0  # kubelet's and the agent's own reconcile loops, pod deletion with grace
    terminating_bound: float = 60.0  # past a deleted pod's grace: kubelet stops it, unprepares, removes it
    advertise_bound: float = 60.0  # a group freed: pod-resources drops its pod, kubelet's status sync (10 s)
    warmup: float = 60.0  # an agent's RSS and fds are first sampled this long after it is first seen
    rss_growth_kib: int = 64 * 1024
    fd_growth: int = 64


@dataclass(frozen=True)
class Container:
    pod_uid: str
    pod: str
    name: str
    started: float  # epoch seconds
    allowed: tuple[frozenset[int], ...]  # each thread's Cpus_allowed_list

    @property
    def key(self) -> str:
        return f"{self.pod}/{self.name}"

    @property
    def cpus(self) -> frozenset[int]:
        return frozenset().union(*self.allowed) if self.allowed else frozenset()


@dataclass(frozen=True)
class Hold:
    """A group a pod holds by kubelet's accounts (``container`` is "" for a claim reserved by the pod as a whole)."""

    group: str
    pod_uid: str
    container: str = ""
    source: str = ""  # checkpoint | pod-resources | claim


@dataclass(frozen=True)
class Failure:
    """A pod that failed admission: its status reason and message, and the resource it asked for."""

    pod: str
    uid: str
    reason: str
    message: str
    resource: str


@dataclass(frozen=True)
class Terminating:
    """A pod being deleted: ``deadline`` is its deletionTimestamp (the deletion plus ``grace`` seconds)."""

    uid: str
    pod: str
    deadline: float  # epoch seconds
    grace: float


@dataclass(frozen=True)
class AgentProc:
    pid: int
    rss_kib: int
    fds: int


@dataclass(frozen=True)
class Fault:
    kind: str
    start: float
    end: float
    cpu: int | None = None  # cpu-offline: the CPU taken offline (``end``: back online)


@dataclass(frozen=True)
class Snapshot:
    t: float
    groups: Mapping[str, frozenset[int]]  # every group id of the fake topology -> its CPUs
    online: frozenset[int]  # the fake topology's online CPUs
    enforcement: str = "cri"  # cri | nri | none
    shared_pool: bool = False
    mode: str = "deviceplugin"
    containers: tuple[Container, ...] = ()
    holds: tuple[Hold, ...] = ()
    pods: frozenset[str] = frozenset()  # uids of the pods that exist (API server)
    claims: frozenset[str] = frozenset()  # uids of the ResourceClaims that exist
    agent_holds: frozenset[str] = frozenset()  # groups in the agent's hold file
    agent_claims: frozenset[str] = frozenset()  # claim uids in the agent's DRA checkpoint
    cdi_files: Mapping[str, str] = field(default_factory=dict)  # file name -> claim uid
    slices: int = 0  # the driver's ResourceSlices of this node
    failures: tuple[Failure, ...] = ()
    agent: AgentProc | None = None
    terminating: tuple[Terminating, ...] = ()  # pods with a deletionTimestamp
    advertised: Mapping[str, int] | None = None  # the Node's allocatable of each topology resource (None: not read)


@dataclass(frozen=True)
class Violation:
    kind: str
    t: float
    what: str
    faults: tuple[str, ...] = ()  # the faults before it (kind@seconds ago), newest first

    def line(self) -> str:
        before = f" (faults before: {', '.join(self.faults)})" if self.faults else ""
        return f"{self.kind} at {self.t:.1f}: {self.what}{before}"


def held_cpus(snap: Snapshot) -> dict[int, set[str]]:
    """CPU -> the pod uids holding a group containing it (online CPUs of held groups only)."""
    out: dict[int, set[str]] = {}
    for h in snap.holds:
        for cpu in snap.groups.get(h.group, frozenset()) & snap.online:
            out.setdefault(cpu, set()).add(h.pod_uid)
    return out


def container_groups(snap: Snapshot, c: Container) -> set[str]:
    """The groups this container holds: its own holds, and claims reserved by its pod as a whole."""
    return {h.group for h in snap.holds if h.pod_uid == c.pod_uid and h.container in (c.name, "")}


def free_groups(snap: Snapshot, resource_level: str) -> list[str]:
    """Groups of a level (book, socket) none of whose online CPUs is in a held group, with an online CPU."""
    taken = set(held_cpus(snap))
    return sorted(g for g, cpus in snap.groups.items()
                  if _level(g) == resource_level and cpus & snap.online and not (cpus & snap.online) & taken)


def free_now(snap: Snapshot, resource_level: str) -> list[str]:
    """Groups of a level whose CPUs are all online and none of them in a group held by a pod still running: one with
    a running container, or one that exists and is not being deleted (admitted, an init container's hold)."""
    being_deleted = {t.uid for t in snap.terminating}
    running = {c.pod_uid for c in snap.containers} | (snap.pods - being_deleted)
    taken: set[int] = set()
    for h in snap.holds:
        if h.pod_uid in running:
            taken |= snap.groups.get(h.group, frozenset()) & snap.online
    return sorted(g for g, cpus in snap.groups.items()
                  if _level(g) == resource_level and cpus and cpus <= snap.online and not cpus & taken)


def _level(group: str) -> str:
    last = group.rsplit("-", 1)[-1]
    return last.rstrip("0123456789")


class Checker:
    """Feeds on snapshots in time order; :meth:`check` returns the violations new in each."""

    def __init__(self, allowances: Allowances | None = None) -> None:
        self.allow = allowances or Allowances()
        self.faults: list[Fault] = []
        self.reported: set[tuple[str, str]] = set()
        self.first_seen: dict[tuple[str, str], float] = {}  # (leak kind, key) -> when it was first seen
        self.hold_seen: dict[tuple[str, str], float] = {}  # (group, pod uid) -> first seen
        self.pool_since: float | None = None  # shared pool on since
        self.pool_seen: tuple[frozenset[int], float] = (frozenset(), 0.0)  # the pool (online, not held) and since
        self.agent_base: dict[int, tuple[float, AgentProc | None]] = {}  # pid -> (first seen, baseline sample)
        self.short_since: dict[str, float] = {}  # resource -> since when the Node offers fewer than are free
        self.previous: Snapshot | None = None

    def fault(self, fault: Fault) -> None:
        self.faults.append(fault)

    def fault_started(self, kind: str, start: float, cpu: int | None = None) -> int:
        """A fault under way (its end unknown: nothing it touches is judged until it ended); its index."""
        self.faults.append(Fault(kind, start, float("inf"), cpu))
        return len(self.faults) - 1

    def fault_ended(self, index: int, end: float) -> None:
        f = self.faults[index]
        self.faults[index] = Fault(f.kind, f.start, end, f.cpu)

    # --- allowances --------------------------------------------------------------------------------------------
    def _bound(self, snap: Snapshot) -> float:
        return self.allow.pin_bound_nri if snap.enforcement == "nri" else self.allow.pin_bound_cri

    def _judged_from(self, snap: Snapshot, c: Container, groups: Iterable[int] = ()) -> float:
        """When a container's cpuset is judged: the pin bound after its start; a container started during a fault
        or its recovery, once the recovery has passed; one of a group with a CPU that went offline, 150 s after
        the CPU came back."""
        when = c.started + self._bound(snap)
        cpus = set(groups)
        for f in self.faults:
            recovery = self.allow.cpu_online_recovery if f.kind == "cpu-offline" else self.allow.recovery
            if f.start - 1.0 <= c.started <= f.end + recovery:
                when = max(when, f.end + recovery)
            if f.kind == "cpu-offline" and (f.cpu in cpus or not cpus) and f.start <= snap.t:
                when = max(when, f.end + recovery)
        return when

    def _recovery(self, f: Fault) -> float:
        return self.allow.cpu_online_recovery if f.kind == "cpu-offline" else self.allow.recovery

    def _in_fault(self, t: float) -> bool:
        """A fault under way at ``t``, or its recovery."""
        return any(f.start - 1.0 <= t <= f.end + self._recovery(f) for f in self.faults)

    def _fault_history(self, t: float) -> tuple[str, ...]:
        return tuple(f"{f.kind}@{t - f.start:.0f}s" for f in reversed(self.faults) if f.start <= t)[:5]

    def _report(self, out: list[Violation], kind: str, key: str, t: float, what: str) -> None:
        if (kind, key) in self.reported:
            return
        self.reported.add((kind, key))
        out.append(Violation(kind, t, what, self._fault_history(t)))

    # --- the check ---------------------------------------------------------------------------------------------
    def check(self, snap: Snapshot) -> list[Violation]:
        out: list[Violation] = []
        for h in snap.holds:
            self.hold_seen.setdefault((h.group, h.pod_uid), snap.t)
        if snap.shared_pool:
            self.pool_since = snap.t if self.pool_since is None else self.pool_since
        else:
            self.pool_since = None
        pool = snap.online - set(held_cpus(snap))
        if pool != self.pool_seen[0]:
            self.pool_seen = (pool, snap.t)
        self._exclusivity(snap, out)
        self._admission(snap, out)
        self._leaks(snap, out)
        self._terminating(snap, out)
        self._advertised(snap, out)
        self._agent(snap, out)
        self.previous = snap
        return out

    def _exclusivity(self, snap: Snapshot, out: list[Violation]) -> None:
        held = held_cpus(snap)
        holders: dict[int, list[Container]] = {}
        for c in snap.containers:
            groups = container_groups(snap, c)
            own = frozenset().union(*(snap.groups.get(g, frozenset()) for g in groups)) if groups else frozenset()
            judged = snap.t >= self._judged_from(snap, c, own)
            if groups:
                outside = c.cpus - own
                if judged and outside:
                    self._report(out, "holder-outside-group", c.key, snap.t,
                                 f"{c.key} holds {sorted(groups)} (CPUs {sorted(own)}) "
                                 f"but is allowed {sorted(outside)}")
                if judged:
                    for cpu in c.cpus & set(held):
                        holders.setdefault(cpu, []).append(c)
                continue
            if not snap.shared_pool or not judged:
                continue
            pool = snap.online - set(held)
            if not pool:
                continue  # a pool that would be empty shrinks nobody (agent/policy/cpuset.py)
            settled = {cpu for cpu, since in self._held_since(snap).items()
                       if snap.t - since >= self.allow.pin_bound_cri}
            if self.pool_since is not None and snap.t - self.pool_since < self.allow.recovery:
                continue
            if snap.t - self.pool_seen[1] < self.allow.pin_bound_cri:
                continue  # the pool just changed: the agent moves the others (CRI, or NRI's UpdateContainers)
            on_held = {cpu for cpu in c.cpus & settled if held[cpu] != {c.pod_uid}}  # its own pod's: not another's
            if on_held:
                self._report(out, "non-holder-on-held-cpu", c.key, snap.t,
                             f"{c.key} holds nothing but is allowed held CPUs {sorted(on_held)}")
        for cpu, cs in sorted(holders.items()):
            if len({c.key for c in cs}) > 1:
                names = sorted({c.key for c in cs})
                self._report(out, "shared-held-cpu", f"{cpu}:{','.join(names)}", snap.t,
                             f"CPU {cpu} of a held group is allowed to {len(names)} holders: {', '.join(names)}")

    def _held_since(self, snap: Snapshot) -> dict[int, float]:
        """CPU -> when the newest hold covering it was first seen (the agent then shrinks the others)."""
        since: dict[int, float] = {}
        for h in snap.holds:
            first = self.hold_seen.get((h.group, h.pod_uid), snap.t)
            for cpu in snap.groups.get(h.group, frozenset()) & snap.online:
                since[cpu] = max(since.get(cpu, first), first)
        return since

    def _admission(self, snap: Snapshot, out: list[Violation]) -> None:
        before = self.previous or snap
        for f in snap.failures:
            level = f.resource.rsplit("/", 1)[-1]
            free = free_groups(before, level)
            in_recovery = any(x.start - 1.0 <= snap.t <= x.end + self.allow.recovery for x in self.faults)
            if free and not in_recovery:
                self._report(out, "admission-failure-while-free", f.uid, snap.t,
                             f"pod {f.pod} failed admission ({f.reason}: {f.message}) while {', '.join(free)} "
                             f"was free")

    def _leaks(self, snap: Snapshot, out: list[Violation]) -> None:
        held_groups = {h.group for h in snap.holds}
        leaks: dict[tuple[str, str], str] = {}
        for h in snap.holds:
            if h.pod_uid not in snap.pods:
                leaks[("leaked-hold", f"{h.source}:{h.pod_uid}:{h.group}")] = (
                    f"{h.source or 'kubelet'} still holds {h.group} for pod {h.pod_uid}, which is gone")
        for g in snap.agent_holds - held_groups:
            leaks[("leaked-hold", f"agent:{g}")] = f"the agent's hold file keeps {g}, which no pod holds"
        for uid in snap.agent_claims - snap.claims:
            leaks[("leaked-claim-checkpoint", uid)] = f"the agent's DRA checkpoint keeps claim {uid}, which is gone"
        for name, uid in snap.cdi_files.items():
            if uid not in snap.claims:
                leaks[("leaked-cdi-file", name)] = f"CDI file {name} of claim {uid}, which is gone"
        if snap.slices and snap.mode != "dra":
            leaks[("leaked-slice", snap.mode)] = f"{snap.slices} ResourceSlice(s) of the driver in {snap.mode} mode"
        for key in list(self.first_seen):
            if key not in leaks:
                del self.first_seen[key]
        for key, what in leaks.items():
            since = self.first_seen.setdefault(key, snap.t)
            if snap.t - since > self.allow.leak_grace:
                self._report(out, key[0], key[1], snap.t, f"{what} ({snap.t - since:.0f} s)")

    def _terminating(self, snap: Snapshot, out: list[Violation]) -> None:
        """A pod still there ``terminating_bound`` seconds past its deletionTimestamp; a fault during its termination
        moves that to the fault's recovery, plus the bound."""
        for p in snap.terminating:
            due = p.deadline
            for f in self.faults:
                if f.start - 1.0 <= snap.t and f.end + self._recovery(f) >= p.deadline - p.grace:
                    due = max(due, f.end + self._recovery(f))
            late = snap.t - due
            if late > self.allow.terminating_bound:
                self._report(out, "terminating-too-long", p.uid, snap.t,
                             f"pod {p.pod} is still Terminating {snap.t - (p.deadline - p.grace):.0f} s after its "
                             f"deletion (grace {p.grace:g} s)")

    def _advertised(self, snap: Snapshot, out: list[Violation]) -> None:
        if snap.mode != "deviceplugin" or snap.advertised is None or self._in_fault(snap.t):
            self.short_since.clear()  # DRA mode offers nothing through allocatable; a fault's recovery is judged after
            return
        for level in sorted({_level(g) for g in snap.groups}):
            resource = f"topology/{level}"
            free = free_now(snap, level)
            offered = snap.advertised.get(resource, 0)
            if offered >= len(free):
                self.short_since.pop(resource, None)
                continue
            since = self.short_since.setdefault(resource, snap.t)
            if snap.t - since > self.allow.advertise_bound:
                self._report(out, "advertised-fewer-than-free", f"{resource}@{since:.0f}", snap.t,
                             f"the Node offers {resource}: {offered} while {len(free)} are free "
                             f"({', '.join(free)}) for {snap.t - since:.0f} s")

    def _agent(self, snap: Snapshot, out: list[Violation]) -> None:
        a = snap.agent
        if a is None:
            return
        seen, base = self.agent_base.setdefault(a.pid, (snap.t, None))
        if base is None:
            if snap.t - seen >= self.allow.warmup:
                self.agent_base[a.pid] = (seen, a)
            return
        if a.rss_kib - base.rss_kib > self.allow.rss_growth_kib:
            self._report(out, "agent-rss-growth", str(a.pid), snap.t,
                         f"agent pid {a.pid} RSS {base.rss_kib} -> {a.rss_kib} KiB")
        if a.fds - base.fds > self.allow.fd_growth:
            self._report(out, "agent-fd-growth", str(a.pid), snap.t, f"agent pid {a.pid} fds {base.fds} -> {a.fds}")
