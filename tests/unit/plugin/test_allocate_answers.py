"""Allocate's answers are the planner's contract byte for byte, however fast the path that makes them.

The reference below is the planner as it was written before the answers were made from per-group parts
(commit 633f14f: every value worked out from the groups themselves), rendered as a ``ContainerAllocateResponse``
from the two maps, serialized by protobuf as field 1 of an AllocateResponse. The
device table's answer for every set tried (every group, every pair, a seeded sample of three and four
groups, each sent in a shuffled order and again in another order) on every bundled shape and level,
with four settings variants, must be the same plan and the same bytes.

upb writes map entries in an order seeded per process (the bytes of one answer differ between two agent
processes, as they always have), so the bytes are compared within this process, and also in protobuf's
deterministic serialization, which is the same in every process.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterable

import pytest

from agent._proto.deviceplugin.v1beta1 import api_pb2
from agent.devices.table import NodeDevices
from agent.plugin.servicer import render
from agent.policy.allocation import (
    ENV_CPUS,
    ENV_GROUPS,
    ENV_MEMORY_NODES,
    ENV_OMP_NUM_THREADS,
    ENV_OMP_PLACES,
    ENV_OMP_PROC_BIND,
    ENV_TOPOLOGY_OMP_NUM_THREADS,
    ENV_TOPOLOGY_OMP_PLACES,
    ENV_TOPOLOGY_OMP_PLACES_BY_GROUP,
    ENV_TOPOLOGY_RANKS,
    ENV_VLLM_BIND,
    AllocationSettings,
    ContainerPlan,
    omp_places,
    omp_threads,
    plan_allocation,
    rank_imbalance,
)
from agent.policy.grouping import Group, GroupingSettings, group_topology
from agent.topology.cpulist import format_cpulist
from agent.topology.embedded import embedded_snapshot_names, load_embedded
from agent.topology.model import Topology
from agent.topology.sysfs import read_sysfs
from tests.support.env import REAL_DUMPS, real_dump

SETTINGS = {
    "default": AllocationSettings(),
    "smt2": AllocationSettings(omp_threads_per_core=2),
    "reserve0": AllocationSettings(reserve_cores_per_group=0),
    "openmp-env, other domain": AllocationSettings(openmp_env=True, annotation_domain="example.com"),
}


def reference_plan(groups: Iterable[Group], settings: AllocationSettings) -> ContainerPlan:
    """The planner of commit 633f14f, unchanged but for its name."""
    ordered = sorted(groups, key=lambda g: (g.order, g.id))
    cpus = sorted({c for g in ordered for c in g.cpus})
    nodes = sorted({n for g in ordered for n in g.memory_nodes})
    ranks = tuple(omp_threads(g, settings) for g in ordered)
    rank_cores = tuple(len(g.cores) for g in ordered)
    places = [c for rank in ranks for c in rank]
    cpulist = format_cpulist(cpus)
    node_list = ",".join(map(str, nodes))
    ids = tuple(g.id for g in ordered)
    envs = {
        ENV_CPUS: cpulist,
        ENV_GROUPS: ",".join(ids),
        ENV_MEMORY_NODES: node_list,
        ENV_VLLM_BIND: "|".join(format_cpulist(rank) for rank in ranks),
        ENV_TOPOLOGY_RANKS: str(len(ranks)),
        ENV_OMP_NUM_THREADS: str(len(places)),
        ENV_TOPOLOGY_OMP_NUM_THREADS: str(len(places)),
        ENV_TOPOLOGY_OMP_PLACES: omp_places(places),
        ENV_TOPOLOGY_OMP_PLACES_BY_GROUP: "|".join(omp_places(rank) for rank in ranks),
    }
    if settings.openmp_env:
        envs[ENV_OMP_PLACES] = omp_places(places)
        envs[ENV_OMP_PROC_BIND] = "close"
    domain = settings.annotation_domain
    annotations = {
        f"{domain}/cpus": cpulist,
        f"{domain}/memory-nodes": node_list,
        f"{domain}/groups": ",".join(ids),
        f"{domain}/resource": ordered[0].resource,
        f"{domain}/rank-cores": ",".join(map(str, rank_cores)),
    }
    warning = rank_imbalance(ids, rank_cores)
    if warning is not None:
        annotations[f"{domain}/warning"] = warning
    return ContainerPlan(groups=ids, cpus=tuple(cpus), ranks=ranks, rank_cores=rank_cores, envs=envs,
                         annotations=annotations, imbalance=warning)


def _field(number: int, payload: bytes) -> bytes:
    assert len(payload) < 1 << 14
    length = bytes((len(payload),)) if len(payload) < 0x80 else bytes((len(payload) & 0x7F | 0x80, len(payload) >> 7))
    return bytes((number << 3 | 2,)) + length + payload


def reference_wire(plan: ContainerPlan, deterministic: bool = False) -> bytes:
    """The servicer's rendering as it always was: field 1 of an AllocateResponse holding the message."""
    message = api_pb2.ContainerAllocateResponse(envs=dict(plan.envs), annotations=dict(plan.annotations))
    return _field(1, message.SerializeToString(deterministic=deterministic))


def deterministic(wire: bytes) -> bytes:
    (container,) = api_pb2.AllocateResponse.FromString(wire).container_responses
    return _field(1, container.SerializeToString(deterministic=True))


def shapes() -> list[tuple[str, Topology]]:
    """Every bundled snapshot, and the real sysfs dumps the tests carry."""
    result = [(name, load_embedded(name)) for name in embedded_snapshot_names()]
    for name in sorted(REAL_DUMPS):
        try:
            _, root = real_dump(name)
        except pytest.skip.Exception:
            continue
        result.append((name, read_sysfs(root)))
    return result


def sets_to_try(ids: list[str], rng: random.Random) -> list[tuple[str, ...]]:
    chosen: list[tuple[str, ...]] = [(i,) for i in ids]
    chosen += itertools.combinations(ids, 2)
    for size in (3, 4):
        combos = list(itertools.combinations(ids, size))
        chosen += rng.sample(combos, min(len(combos), 60))
    return [tuple(rng.sample(s, len(s))) for s in chosen]


@pytest.mark.parametrize("settings_name", sorted(SETTINGS))
def test_every_answer_is_the_reference_plan_and_bytes(settings_name: str) -> None:
    settings = SETTINGS[settings_name]
    rng = random.Random(23)
    checked = 0
    for shape, topology in shapes():
        for level in ("drawer", "book", "socket"):
            grouping = group_topology(topology, GroupingSettings(levels=(level,), allow_non_s390x=True))
            for resource in grouping.resources():  # one resource: no overlap refuses a set
                node = NodeDevices(grouping, GroupingSettings(levels=(level,)), settings, render)
                table = node.table(resource)
                groups = grouping.by_id(resource)
                for ids in sets_to_try(sorted(groups), rng):
                    want = reference_plan([groups[i] for i in ids], settings)
                    wire = reference_wire(want)
                    (first,) = table.admit([list(ids)])  # planned and rendered now
                    assert first.plan == want, (shape, ids)
                    assert first.plan.envs == want.envs and list(first.plan.envs) == list(want.envs)
                    assert list(first.plan.annotations) == list(want.annotations)
                    assert first.wire == wire, (shape, ids)
                    assert deterministic(first.wire) == reference_wire(want, deterministic=True)
                    again = tuple(reversed(ids))  # another order of the set: the set's answer
                    (second,) = table.admit([list(again)])
                    assert second.wire == wire and second.plan == want
                    assert plan_allocation([groups[i] for i in ids], settings) == want
                    checked += 1
    assert checked > 1500


def test_groups_numbered_out_of_topology_order_overlapping_or_touching() -> None:
    """The slow paths of the CPU list: a later group numbered first, two groups sharing CPUs, and
    ranges that continue from one group into the next."""
    book = group_topology(load_embedded("z16-lpar")).by_resource("topology/book")[0]

    def group(i: int, cpus: tuple[int, ...]) -> Group:
        return dataclasses.replace(book, id=f"drawer0-book{i}", key=(0, i), cpus=cpus,
                                   cores=tuple(cpus[j:j + 2] for j in range(0, len(cpus), 2)))

    cases = [((8, 9, 10, 11), (0, 1, 2, 3)), ((0, 1, 4, 5), (2, 3, 6, 7)), ((0, 1, 2, 3), (4, 5, 6, 7)),
             ((0, 1, 2, 3), (2, 3, 4, 5)), ((0, 1, 6, 7), (8, 9), (10, 11, 20, 21)), ((4, 5), (0, 1), (2, 3))]
    for cpus in cases:
        groups = [group(i, c) for i, c in enumerate(cpus)]
        for settings in SETTINGS.values():
            assert plan_allocation(groups, settings) == reference_plan(groups, settings), cpus
