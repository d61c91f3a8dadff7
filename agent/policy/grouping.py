"""The grouping policy: which CPU groups a node advertises. Pure: model + settings -> groups.

Usable CPUs are online, configured, not reserved and not of an excluded polarization; the automatic level is
``book`` when more than one book has usable CPUs, else ``socket``.

Must hold: a group never splits a core's SMT threads; a group much smaller than its peers, one of another size than
its level's (``uniform_groups``), anything on a machine known not to be IBM Z and anything of a degenerate topology
(one CPU per book and socket) is not advertised, each with its reason; a group's memory node is a real node. The
rules with their reasons: docs/contributing/design/grouping.md."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.errors import PolicyError
from agent.policy.naming import device_id, resource_name
from agent.topology.cpulist import format_cpulist
from agent.topology.model import POLARIZATIONS, Cpu, Topology

LEVELS: tuple[str, ...] = ("drawer", "book", "socket")
DEFAULT_PREFIX = "topology"


@dataclass(frozen=True, slots=True)
class GroupingSettings:
    levels: tuple[str, ...] | None = None  # None: automatic (book if more than one book, else socket)
    resource_prefix: str = DEFAULT_PREFIX
    reserved_cpus: frozenset[int] = frozenset()
    exclude_polarization: frozenset[str] = frozenset()
    min_group_cores: int | None = None  # None: half the cores of the level's median group (at least 1); 0: all
    uniform_groups: bool = False  # advertise only the groups of one size (CPUs) per level: uniform_size()
    allow_non_s390x: bool = False  # group a machine known not to be IBM Z (x86_64, ...) too: tests, snapshots

    def validated(self) -> GroupingSettings:
        if self.min_group_cores is not None and self.min_group_cores < 0:
            raise PolicyError("--min-group-cores must be 0 or more (or 'auto')")
        if self.levels is not None:
            if not self.levels:
                raise PolicyError("--levels needs at least one of: drawer, book, socket (or 'auto')")
            unknown = [lv for lv in self.levels if lv not in LEVELS]
            if unknown:
                shown = ", ".join(map(repr, unknown[:8]))  # quoted: a newline typed in a value stays on the line
                raise PolicyError(f"unknown level(s) {shown}: choose from drawer, book, socket")
        bad = sorted(self.exclude_polarization - set(POLARIZATIONS))
        if bad:
            raise PolicyError(f"unknown polarization(s) {', '.join(bad)}: choose from {', '.join(POLARIZATIONS)}")
        for level in ("book", "socket", "drawer"):
            resource_name(self.resource_prefix, level)  # PolicyError when kubelet would reject it
        return self


@dataclass(frozen=True, slots=True)
class Group:
    """One advertised device: a drawer, book or socket's usable CPUs."""

    level: str
    resource: str
    id: str
    key: tuple[int | None, ...]  # (drawer,), (drawer, book) or (drawer, book, socket)
    cpus: tuple[int, ...]
    cores: tuple[tuple[int, ...], ...]  # each core's threads, sorted by first thread
    threads_per_core: int
    polarization: tuple[tuple[str, int], ...]  # (polarization, CPU count), in POLARIZATIONS order
    memory_nodes: tuple[int, ...]
    recorded_nodes: tuple[int, ...]  # what the CPUs' node data said (may be empty)

    @property
    def memory_node(self) -> int:
        return self.memory_nodes[0]

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)

    @property
    def order(self) -> tuple[int, ...]:
        """Topology order: drawer, book, socket (unknown ids first)."""
        return tuple(-1 if k is None else k for k in self.key)

    @property
    def polarization_summary(self) -> str:
        return ",".join(f"{p}:{n}" for p, n in self.polarization) or "-"


@dataclass(frozen=True, slots=True)
class Skipped:
    cpus: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Uniform:
    """What --uniform-groups chose for one resource: the size advertised and the groups left out."""

    resource: str
    cpus: int  # the CPUs of every advertised group of the resource
    left_out: tuple[str, ...]  # ids of the groups of other sizes


@dataclass(frozen=True, slots=True)
class Grouping:
    groups: tuple[Group, ...]
    skipped: tuple[Skipped, ...]
    levels: tuple[str, ...]
    level_reason: str
    fidelity: str  # lpar | guest-no-topology | unknown (s390, facility not known) | generic (not s390)
    warnings: tuple[str, ...] = ()
    uniform: tuple[Uniform, ...] = ()  # with --uniform-groups, one per advertised level

    def resources(self) -> list[str]:
        seen: dict[str, None] = {}
        for g in self.groups:
            seen.setdefault(g.resource, None)
        return list(seen)

    def by_resource(self, resource: str) -> list[Group]:
        return [g for g in self.groups if g.resource == resource]

    def by_id(self, resource: str) -> dict[str, Group]:
        return {g.id: g for g in self.groups if g.resource == resource}


def group_sizes(grouping: Grouping) -> dict[str, tuple[int, ...]]:
    """Each advertised resource -> the distinct CPU counts of its groups, largest first. One size: a pod
    asking for N of that resource requests exactly N x that many ``cpu``, whichever groups it gets."""
    sizes: dict[str, set[int]] = {}
    for g in grouping.groups:
        sizes.setdefault(g.resource, set()).add(len(g.cpus))
    return {resource: tuple(sorted(s, reverse=True)) for resource, s in sizes.items()}


def _unusable_reason(cpu: Cpu, settings: GroupingSettings) -> str | None:
    if not cpu.configured:
        return "standby (deconfigured)"
    if not cpu.online:
        return "offline"
    if cpu.cpu in settings.reserved_cpus:
        return "reserved (--reserved-cpus)"
    if cpu.polarization in settings.exclude_polarization:
        return f"polarization {cpu.polarization} excluded (--exclude-polarization)"
    return None


def _skipped(by_reason: dict[str, list[int]]) -> list[Skipped]:
    return [Skipped(tuple(sorted(cpus)), reason) for reason, cpus in sorted(by_reason.items()) if cpus]


def _key(cpu: Cpu, level: str) -> tuple[int | None, ...]:
    full = (cpu.drawer, cpu.book, cpu.socket)
    return full[: LEVELS.index(level) + 1]


def _cores(cpus: list[Cpu]) -> tuple[tuple[int, ...], ...]:
    """Each core's threads among ``cpus``, sorted by first thread."""
    members = {c.cpu for c in cpus}
    return tuple(sorted({tuple(t for t in c.siblings if t in members) for c in cpus}))


def _degenerate_reason(topology: Topology, usable: list[Cpu]) -> str | None:
    m = topology.machine
    if not m.is_s390:
        return None
    if m.topology_facility is False:
        who = {"zvm": "z/VM guest", "kvm": "KVM guest"}.get(m.environment, "machine")
        return (f"degenerate topology: no topology facility ({who} without CPU topology): the kernel gives "
                "every CPU its own socket and book, which is no topology at all")
    if m.topology_facility is None and len(usable) > 1:
        # Without word from /proc/sysinfo, judge by shape (with the facility, single-CPU books are real).
        books = Counter(c.book_key for c in usable if c.book is not None)
        sockets = Counter(c.socket_key for c in usable if c.socket is not None)
        if (not books or max(books.values()) == 1) and sockets and max(sockets.values()) == 1:
            return "degenerate topology: every book and socket holds a single CPU (a guest without topology)"
    return None


def _auto_levels(usable: list[Cpu]) -> tuple[tuple[str, ...], str]:
    books = {c.book_key for c in usable if c.book is not None}
    if len(books) > 1:
        return ("book",), f"{len(books)} books have usable CPUs: grouping by book"
    sockets = {c.socket_key for c in usable if c.socket is not None}
    how = "one book" if books else "no books"
    return ("socket",), f"{how}, {len(sockets)} socket(s) with usable CPUs: grouping by socket"


def _memory_nodes(cpus: Iterable[Cpu], real: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """(memory nodes to use, recorded nodes, fell back) for a group's CPUs."""
    recorded = tuple(sorted({c.node for c in cpus if c.node is not None}))
    valid = tuple(n for n in recorded if n in real)
    if valid:
        return valid, recorded, len(valid) != len(recorded)
    return (real[0] if real else 0,), recorded, bool(recorded)


def min_cores_for(sizes: Sequence[int], setting: int | None) -> tuple[int, str]:
    """(the fewest cores a group of a level with these group sizes needs, how that was chosen)."""
    if setting is not None:
        return setting, f"--min-group-cores {setting}"
    if not sizes:
        return 1, "automatic"
    ordered = sorted(sizes)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    threshold = max(1, int(median // 2))
    return threshold, f"half the {median:g} cores of the median group, the automatic --min-group-cores"


def uniform_size(sizes: Sequence[int]) -> int | None:
    """The one group size --uniform-groups advertises: the most common, a tie going to the larger size
    (more CPUs per device; on pr40714-like books of 12, 12 and 1 cores the 12s). None without groups."""
    if not sizes:
        return None
    counts = Counter(sizes)
    return max(counts, key=lambda size: (counts[size], size))


def group_topology(topology: Topology, settings: GroupingSettings | None = None) -> Grouping:
    """The groups ``topology`` advertises under ``settings``."""
    settings = (settings or GroupingSettings()).validated()
    skipped: defaultdict[str, list[int]] = defaultdict(list)  # reason -> CPUs left out for it
    usable = _whole_cores(_usable(topology, settings, skipped), topology, skipped)
    refused = _refusal(topology, usable, settings)
    if refused is not None:
        reason, fidelity = refused
        skipped[reason].extend(c.cpu for c in usable)
        return Grouping((), tuple(_skipped(skipped)), (), reason, fidelity)
    if settings.levels is None:
        levels, level_reason = _auto_levels(usable)
    else:
        levels, level_reason = tuple(lv for lv in LEVELS if lv in settings.levels), "levels set by --levels"
    m = topology.machine
    fidelity = "lpar" if m.is_s390 and m.topology_facility else ("generic" if not m.is_s390 else "unknown")
    warnings: list[str] = []
    groups: list[Group] = []
    uniform: list[Uniform] = []
    for level in levels:
        level_groups, chosen = _level_groups(level, usable, settings, m.memory_nodes, skipped, warnings)
        groups += level_groups
        if chosen is not None:
            uniform.append(chosen)
    # A CPU counted under several level-unknown reasons only needs listing once per reason.
    deduped = {reason: sorted(set(cpus)) for reason, cpus in skipped.items()}
    return Grouping(tuple(groups), tuple(_skipped(deduped)), levels, level_reason, fidelity, tuple(warnings),
                    tuple(uniform))


def _usable(topology: Topology, settings: GroupingSettings, skipped: defaultdict[str, list[int]]) -> list[Cpu]:
    """The CPUs online, configured, not reserved and not of an excluded polarization; the others in ``skipped``."""
    usable: list[Cpu] = []
    for cpu in topology.cpus:
        reason = _unusable_reason(cpu, settings)
        if reason is None:
            usable.append(cpu)
        else:
            skipped[reason].append(cpu.cpu)
    return usable


def _whole_cores(usable: list[Cpu], topology: Topology, skipped: defaultdict[str, list[int]]) -> list[Cpu]:
    """The usable CPUs whose every present SMT sibling is usable too (a group never splits a core)."""
    usable_numbers = {c.cpu for c in usable}
    present = {c.cpu for c in topology.cpus}
    kept: list[Cpu] = []
    for cpu in usable:
        if not cpu.siblings:
            skipped["cores unknown: the kernel reports no SMT siblings (thread_siblings)"].append(cpu.cpu)
            continue
        missing = [t for t in cpu.siblings if t in present and t not in usable_numbers]
        if missing:
            skipped[f"core split: sibling thread(s) {format_cpulist(missing)} not usable (whole cores only)"].append(
                cpu.cpu)
            continue
        kept.append(cpu)
    return kept


def _refusal(topology: Topology, usable: list[Cpu], settings: GroupingSettings) -> tuple[str, str] | None:
    """(why nothing is advertised, the fidelity) for a machine that is not IBM Z or has no real topology."""
    m = topology.machine
    if not m.is_s390 and m.arch != "unknown" and not settings.allow_non_s390x:
        return (f"not an IBM Z machine (architecture {m.arch}): nothing is advertised (--allow-non-s390x groups it "
                "anyway; --topology-file reads an s390x snapshot)", "generic")
    degenerate = _degenerate_reason(topology, usable)
    if degenerate is not None:
        return degenerate, "guest-no-topology"
    return None


def _level_groups(level: str, usable: list[Cpu], settings: GroupingSettings, real_nodes: tuple[int, ...],
                  skipped: defaultdict[str, list[int]], warnings: list[str]) -> tuple[list[Group], Uniform | None]:
    """The groups of one level, in topology order, and what --uniform-groups chose for it (None without it).
    Groups too small (--min-group-cores) or of another size (--uniform-groups) go to ``skipped``."""
    resource = resource_name(settings.resource_prefix, level)
    members: dict[tuple[int | None, ...], list[Cpu]] = defaultdict(list)
    for cpu in usable:
        key = _key(cpu, level)
        if key[-1] is None:
            skipped[f"{level} unknown: the kernel reports no {level} id"].append(cpu.cpu)
        else:
            members[key].append(cpu)
    ordered = sorted(members.items(), key=lambda kv: tuple(-1 if k is None else k for k in kv[0]))
    shapes = [(key, cpus, _cores(cpus)) for key, cpus in ordered]
    threshold, how = min_cores_for([len(cores) for _, _, cores in shapes], settings.min_group_cores)
    size: int | None = None
    if settings.uniform_groups:
        size = uniform_size([len(cpus) for _, cpus, cores in shapes if len(cores) >= threshold])
    groups: list[Group] = []
    left_out: list[str] = []
    for key, cpus, cores in shapes:
        gid = device_id(dict(zip(LEVELS, key, strict=False)))
        if len(cores) < threshold:
            skipped[f"{level} {gid} not advertised: {len(cores)} core{'s' if len(cores) != 1 else ''}, fewer than "
                    f"{threshold} ({how}); a pod asking for one {level} would get far less than its peers "
                    f"(--min-group-cores 0 advertises every {level})"].extend(c.cpu for c in cpus)
        elif size is not None and len(cpus) != size:
            skipped[f"{level} {gid} not advertised: {len(cpus)} CPUs, not the {size} of this node's other "
                    f"{level}s (--uniform-groups advertises one size per resource: the most common, a tie going "
                    "to the larger)"].extend(c.cpu for c in cpus)
            left_out.append(gid)
        else:
            groups.append(_group(level, resource, gid, key, cpus, cores, real_nodes, warnings))
    return groups, (None if size is None else Uniform(resource, size, tuple(left_out)))


def _group(level: str, resource: str, gid: str, key: tuple[int | None, ...], cpus: list[Cpu],
           cores: tuple[tuple[int, ...], ...], real_nodes: tuple[int, ...], warnings: list[str]) -> Group:
    """One advertised group; a recorded memory node that is not a real one falls back, with a warning."""
    pol = Counter(c.polarization for c in cpus)
    nodes, recorded, fell_back = _memory_nodes(cpus, real_nodes)
    if fell_back:
        warnings.append(
            f"{resource} {gid}: recorded memory node(s) {','.join(map(str, recorded))} not a real "
            f"memory node (real: {','.join(map(str, real_nodes))}); falling back to memory node {nodes[0]}")
    return Group(
        level=level,
        resource=resource,
        id=gid,
        key=key,
        cpus=tuple(sorted(c.cpu for c in cpus)),
        cores=cores,
        threads_per_core=max(len(core) for core in cores),
        polarization=tuple((p, pol[p]) for p in POLARIZATIONS if pol.get(p)),
        memory_nodes=nodes,
        recorded_nodes=recorded,
    )
