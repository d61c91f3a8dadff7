"""What a container gets for a set of allocated groups: CPU set, memory node, OpenMP and vLLM
environment, annotations. Pure, and a function of the groups alone: kubelet caches the answer
and replays it on every container restart.

| variable | value |
|---|---|
| TOPOLOGY_CPUS | every usable CPU of the groups (all SMT threads), cpulist format |
| TOPOLOGY_GROUPS | the device ids, comma-separated, topology order |
| CPU_VISIBLE_MEMORY_NODES | the groups' real memory nodes, comma-separated |
| OMP_NUM_THREADS | the number of OpenMP places |
| OMP_PLACES | one explicit place per OpenMP thread (``{1},{3},{5}``) |
| OMP_PROC_BIND | ``close`` |
| VLLM_CPU_OMP_THREADS_BIND | one CPU list per group, joined with ``|`` (one tensor-parallel rank per group) |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.policy.grouping import Group
from agent.topology.cpulist import format_cpulist

DEFAULT_ANNOTATION_DOMAIN = "topology.s390x.ibm.com"

ENV_CPUS = "TOPOLOGY_CPUS"
ENV_GROUPS = "TOPOLOGY_GROUPS"
ENV_MEMORY_NODES = "CPU_VISIBLE_MEMORY_NODES"
ENV_OMP_NUM_THREADS = "OMP_NUM_THREADS"
ENV_OMP_PLACES = "OMP_PLACES"
ENV_OMP_PROC_BIND = "OMP_PROC_BIND"
ENV_VLLM_BIND = "VLLM_CPU_OMP_THREADS_BIND"
ENV_KEYS: tuple[str, ...] = (ENV_CPUS, ENV_GROUPS, ENV_MEMORY_NODES, ENV_OMP_NUM_THREADS, ENV_OMP_PLACES,
                             ENV_OMP_PROC_BIND, ENV_VLLM_BIND)


@dataclass(frozen=True, slots=True)
class AllocationSettings:
    omp_threads_per_core: int = 1  # 1: the highest-numbered SMT thread of each core (vLLM's s390x pick); 2: both
    reserve_cores_per_group: int = 0  # cores of each group left out of the OpenMP lists (kept in TOPOLOGY_CPUS)
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
    envs: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def omp_threads(group: Group, settings: AllocationSettings) -> tuple[int, ...]:
    """The CPUs a group's OpenMP threads run on: per core, the highest thread (or both)."""
    cores = list(group.cores)
    keep = max(1, len(cores) - settings.reserve_cores_per_group)  # a rank always keeps one core
    chosen: list[int] = []
    for core in cores[:keep]:
        chosen.extend(core[-settings.omp_threads_per_core:])
    return tuple(sorted(chosen))


def topology_order(groups: Iterable[Group]) -> list[Group]:
    return sorted(groups, key=lambda g: (g.order, g.id))


def plan_allocation(groups: Iterable[Group], settings: AllocationSettings | None = None) -> ContainerPlan:
    """The plan for a container holding ``groups`` (any order; the result is in topology order)."""
    settings = (settings or AllocationSettings()).validated()
    ordered = topology_order(groups)
    if not ordered:
        raise ValueError("an allocation needs at least one group")
    cpus = sorted({c for g in ordered for c in g.cpus})
    nodes = sorted({n for g in ordered for n in g.memory_nodes})
    ranks = tuple(omp_threads(g, settings) for g in ordered)
    places = [c for rank in ranks for c in rank]
    cpulist = format_cpulist(cpus)
    node_list = ",".join(map(str, nodes))
    ids = tuple(g.id for g in ordered)
    envs = {
        ENV_CPUS: cpulist,
        ENV_GROUPS: ",".join(ids),
        ENV_MEMORY_NODES: node_list,
        ENV_OMP_NUM_THREADS: str(len(places)),
        ENV_OMP_PLACES: ",".join(f"{{{c}}}" for c in places),
        ENV_OMP_PROC_BIND: "close",
        ENV_VLLM_BIND: "|".join(format_cpulist(rank) for rank in ranks),
    }
    domain = settings.annotation_domain
    annotations = {
        f"{domain}/cpus": cpulist,
        f"{domain}/memory-nodes": node_list,
        f"{domain}/groups": ",".join(ids),
    }
    return ContainerPlan(groups=ids, cpus=tuple(cpus), ranks=ranks, envs=envs, annotations=annotations)
