"""What a container gets for a set of allocated groups: CPU set, memory node, the vLLM binding,
OpenMP places under names no runtime reads, annotations. Pure, and a function of the groups alone:
kubelet caches the answer and replays it on every container restart.

No variable that makes an OpenMP runtime bind a process is set for the whole container by
default: GNU libgomp pins the main thread of every process that loads it to the first place of
``OMP_PLACES`` at load time, so a container-level ``OMP_PLACES``/``OMP_PROC_BIND`` pins vLLM's API
server, and every process it starts, to one CPU (measured, ``../shared/docs/s390x-topology.md``
C.2). vLLM writes the OpenMP variables of each rank into that rank's process itself, from
``VLLM_CPU_OMP_THREADS_BIND``. ``openmp_env`` (``--openmp-env``) restores them for nodes that run
only single-process OpenMP jobs. The table of docs/inference/what-a-container-gets.md is this contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter

from agent.policy.grouping import Group
from agent.topology.cpulist import cpu_ranges, format_cpulist, format_ranges

DEFAULT_ANNOTATION_DOMAIN = "topology.s390x.ibm.com"

ENV_CPUS = "TOPOLOGY_CPUS"
ENV_GROUPS = "TOPOLOGY_GROUPS"
ENV_MEMORY_NODES = "CPU_VISIBLE_MEMORY_NODES"
ENV_OMP_NUM_THREADS = "OMP_NUM_THREADS"
ENV_VLLM_BIND = "VLLM_CPU_OMP_THREADS_BIND"
ENV_TOPOLOGY_OMP_PLACES = "TOPOLOGY_OMP_PLACES"
ENV_TOPOLOGY_OMP_NUM_THREADS = "TOPOLOGY_OMP_NUM_THREADS"
ENV_TOPOLOGY_OMP_PLACES_BY_GROUP = "TOPOLOGY_OMP_PLACES_BY_GROUP"
ENV_TOPOLOGY_RANKS = "TOPOLOGY_RANKS"
# Set only with --openmp-env: they make libgomp bind every process that loads it.
ENV_OMP_PLACES = "OMP_PLACES"
ENV_OMP_PROC_BIND = "OMP_PROC_BIND"

ENV_KEYS: tuple[str, ...] = (ENV_CPUS, ENV_GROUPS, ENV_MEMORY_NODES, ENV_VLLM_BIND, ENV_TOPOLOGY_RANKS,
                             ENV_OMP_NUM_THREADS, ENV_TOPOLOGY_OMP_NUM_THREADS, ENV_TOPOLOGY_OMP_PLACES,
                             ENV_TOPOLOGY_OMP_PLACES_BY_GROUP)
OPENMP_ENV_KEYS: tuple[str, ...] = (ENV_OMP_PLACES, ENV_OMP_PROC_BIND)
# Variables that make an OpenMP runtime bind the process that reads them (libgomp: OMP_PLACES,
# OMP_PROC_BIND, GOMP_CPU_AFFINITY; Intel/LLVM: KMP_AFFINITY). Never set by default.
BINDING_ENV_KEYS: tuple[str, ...] = ("OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")

# vLLM's `auto` binding keeps one CPU back on s390x for the serving process's own threads; one
# core per group does the same and keeps tensor-parallel ranks of equal size.
DEFAULT_RESERVE_CORES_PER_GROUP = 1


@dataclass(frozen=True, slots=True)
class AllocationSettings:
    omp_threads_per_core: int = 1  # 1: the highest-numbered SMT thread of each core (vLLM's s390x pick); 2: both
    reserve_cores_per_group: int = DEFAULT_RESERVE_CORES_PER_GROUP  # cores per group left out of the OpenMP lists
    openmp_env: bool = False  # also set OMP_PLACES/OMP_PROC_BIND for the whole container (single-process jobs only)
    annotation_domain: str = DEFAULT_ANNOTATION_DOMAIN

    def validated(self) -> AllocationSettings:
        if self.omp_threads_per_core not in (1, 2):
            raise ValueError("--omp-threads-per-core must be 1 or 2")
        if self.reserve_cores_per_group < 0:
            raise ValueError("--reserve-cores-per-group must be 0 or more")
        return self


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """The environment and annotations of one container for one set of groups."""

    groups: tuple[str, ...]
    cpus: tuple[int, ...]
    ranks: tuple[tuple[int, ...], ...]  # OpenMP threads of each group, one tensor-parallel rank per group
    rank_cores: tuple[int, ...] = ()  # cores of each group, in rank order
    envs: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    imbalance: str | None = None  # why the ranks' unequal sizes matter; None when they are equal

    @property
    def balanced(self) -> bool:
        """Every rank's group has as many cores as every other (always true for one group)."""
        return self.imbalance is None


def rank_imbalance(ids: tuple[str, ...], rank_cores: tuple[int, ...]) -> str | None:
    """Why ranks of these sizes are a problem, or None when every rank has as many cores."""
    if len(set(rank_cores)) <= 1:
        return None
    sizes = ", ".join(f"{g} {n} core{'s' if n != 1 else ''}" for g, n in zip(ids, rank_cores, strict=True))
    return f"tensor-parallel ranks of unequal size ({sizes}): every rank waits for the smallest at each layer"


def omp_threads(group: Group, settings: AllocationSettings) -> tuple[int, ...]:
    """The CPUs a group's OpenMP threads run on: per core, the highest thread (or both)."""
    cores = list(group.cores)
    keep = max(1, len(cores) - settings.reserve_cores_per_group)  # a rank always keeps one core
    chosen: list[int] = []
    for core in cores[:keep]:
        chosen.extend(core[-settings.omp_threads_per_core:])
    return tuple(sorted(chosen))


def omp_places(cpus: Iterable[int]) -> str:
    """An explicit OMP_PLACES value, one place per CPU: ``{1},{3},{5}``."""
    return ",".join(f"{{{c}}}" for c in cpus)


@dataclass(frozen=True, slots=True)
class GroupPart:
    """What one group puts into every plan that holds it, worked out once per group: a plan is
    then joins of these (the first Allocate of a new id set plans on kubelet's clock)."""

    group: Group
    sort_key: tuple[tuple[int, ...], str]  # topology order
    ranges: tuple[tuple[int, int], ...]  # its CPUs as ranges
    rank: tuple[int, ...]  # its OpenMP threads
    rank_cpulist: str
    rank_places: str
    id: str
    cpus: tuple[int, ...]  # the group's CPUs, as a plan lists them
    cpulist: str  # format_ranges(ranges)
    first: int  # its lowest and highest CPU number (-1: no CPUs)
    last: int
    cores: int
    threads: int  # len(rank)
    node_list: str  # its memory nodes, sorted, comma-separated


def group_part(group: Group, settings: AllocationSettings) -> GroupPart:
    rank = omp_threads(group, settings)
    ranges = cpu_ranges(group.cpus)
    return GroupPart(group=group, sort_key=(group.order, group.id), ranges=ranges, rank=rank,
                     rank_cpulist=format_cpulist(rank), rank_places=omp_places(rank), id=group.id,
                     cpus=tuple(group.cpus), cpulist=format_ranges(ranges), first=ranges[0][0] if ranges else -1,
                     last=ranges[-1][1] if ranges else -1, cores=len(group.cores), threads=len(rank),
                     node_list=",".join(map(str, sorted(set(group.memory_nodes)))))


PART_ORDER = attrgetter("sort_key")  # sort parts into topology order: ``parts.sort(key=PART_ORDER)``
_ID, _RANK, _CORES = attrgetter("id"), attrgetter("rank"), attrgetter("cores")
_PLACES, _BIND, _THREADS = attrgetter("rank_places"), attrgetter("rank_cpulist"), attrgetter("threads")


def _cpu_set(parts: Sequence[GroupPart]) -> tuple[str, tuple[int, ...]]:
    """TOPOLOGY_CPUS and the CPUs of two or more groups in topology order: the groups' own lists joined,
    a range that continues into the next group's merged. Groups that overlap or come out of CPU
    order (possible, not usual) are merged CPU by CPU."""
    previous = parts[0]
    touching = False
    for part in parts[1:]:
        if part.first <= previous.last + 1:
            if part.first <= previous.last:  # overlapping or out of order
                union = sorted({c for p in parts for c in p.cpus})
                return format_cpulist(union), tuple(union)
            touching = True
        previous = part
    cpus = parts[0].cpus  # the groups' CPUs one after the other (a few tuples concatenated at C speed)
    for part in parts[1:]:
        cpus += part.cpus
    if not touching:
        return ",".join([p.cpulist for p in parts]), cpus
    merged = list(parts[0].ranges)
    for part in parts[1:]:
        ranges = part.ranges
        if ranges[0][0] == merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], ranges[0][1])
            merged.extend(ranges[1:])
        else:
            merged.extend(ranges)
    return format_ranges(merged), cpus


def plan_allocation(groups: Iterable[Group], settings: AllocationSettings | None = None) -> ContainerPlan:
    """The plan for a container holding ``groups`` (any order; the result is in topology order)."""
    settings = (settings or AllocationSettings()).validated()
    return plan_parts([group_part(g, settings) for g in groups], settings)


@lru_cache(maxsize=8)
def _annotation_keys(domain: str) -> tuple[str, str, str, str, str, str]:
    """The annotation keys under ``domain`` (cpus, memory-nodes, groups, resource, rank-cores, warning)."""
    return (f"{domain}/cpus", f"{domain}/memory-nodes", f"{domain}/groups", f"{domain}/resource",
            f"{domain}/rank-cores", f"{domain}/warning")


def plan_parts(parts: Iterable[GroupPart], settings: AllocationSettings) -> ContainerPlan:
    """:func:`plan_allocation` from groups' parts (``settings`` already validated, the parts made with them)."""
    return plan_ordered(sorted(parts, key=PART_ORDER), settings)


def plan_ordered(ordered_parts: Sequence[GroupPart], settings: AllocationSettings) -> ContainerPlan:
    """:func:`plan_parts` of parts in topology order already. Straight-line joins of the parts' pieces: a
    first-time Allocate plans on kubelet's clock, where every step costs several times what it costs in
    a loop (the caches are cold between calls)."""
    if not ordered_parts:
        raise ValueError("an allocation needs at least one group")
    first = ordered_parts[0]
    if len(ordered_parts) == 1:
        ids: tuple[str, ...] = (first.id,)
        cpulist, cpus = first.cpulist, first.cpus
        node_list = first.node_list
        rank_cores: tuple[int, ...] = (first.cores,)
        ranks: tuple[tuple[int, ...], ...] = (first.rank,)
        places = by_group = first.rank_places
        bind = first.rank_cpulist
        threads = str(first.threads)
        warning = None
    else:
        ids = tuple(map(_ID, ordered_parts))
        cpulist, cpus = _cpu_set(ordered_parts)
        node_list = first.node_list
        for part in ordered_parts:
            if part.node_list != node_list:  # groups on different memory nodes: their union
                node_list = ",".join(map(str, sorted({n for p in ordered_parts for n in p.group.memory_nodes})))
                break
        rank_cores = tuple(map(_CORES, ordered_parts))
        ranks = tuple(map(_RANK, ordered_parts))
        place_parts = tuple(map(_PLACES, ordered_parts))
        places, by_group = ",".join(place_parts), "|".join(place_parts)
        bind = "|".join(map(_BIND, ordered_parts))
        threads = str(sum(map(_THREADS, ordered_parts)))
        warning = rank_imbalance(ids, rank_cores)
    id_list = ",".join(ids)
    envs = {
        ENV_CPUS: cpulist,
        ENV_GROUPS: id_list,
        ENV_MEMORY_NODES: node_list,
        ENV_VLLM_BIND: bind,
        ENV_TOPOLOGY_RANKS: str(len(ids)),
        ENV_OMP_NUM_THREADS: threads,  # binds nothing; keeps a runtime from a thread per node CPU
        ENV_TOPOLOGY_OMP_NUM_THREADS: threads,
        ENV_TOPOLOGY_OMP_PLACES: places,
        ENV_TOPOLOGY_OMP_PLACES_BY_GROUP: by_group,
    }
    if settings.openmp_env:
        envs[ENV_OMP_PLACES] = places
        envs[ENV_OMP_PROC_BIND] = "close"
    cpus_key, nodes_key, groups_key, resource_key, rank_cores_key, warning_key = _annotation_keys(
        settings.annotation_domain)
    annotations = {
        cpus_key: cpulist,
        nodes_key: node_list,
        groups_key: id_list,
        resource_key: first.group.resource,
        rank_cores_key: ",".join(map(str, rank_cores)),
    }
    if warning is not None:
        annotations[warning_key] = warning
    return ContainerPlan(ids, cpus, ranks, rank_cores, envs, annotations, warning)
