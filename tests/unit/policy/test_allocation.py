"""The allocation contract: what a container gets for its groups (pure planner)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from agent.policy.allocation import BINDING_ENV_KEYS, ENV_KEYS, AllocationSettings, plan_allocation
from agent.policy.grouping import Group, GroupingSettings, group_topology
from agent.topology.cpulist import format_cpulist, parse_cpulist
from agent.topology.embedded import load_embedded
from agent.topology.model import Topology
from agent.topology.sysfs import read_sysfs
from tests.support.env import REAL_DUMPS, real_dump


def vllm_parse_id_list(text: str) -> list[int]:
    """vLLM's cpu_resource_utils.parse_id_list: ints and inclusive a-b ranges, deduplicated and sorted."""
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-")
            ids.update(range(int(lo), int(hi) + 1))
        else:
            ids.add(int(part))
    return sorted(ids)


def vllm_visible_memory_nodes(value: str, mems_allowed: list[int]) -> list[int]:
    """vLLM's get_visible_memory_node: the comma list intersected with Mems_allowed."""
    return [n for n in (int(x) for x in value.split(",") if x.strip()) if n in mems_allowed]


def check_contract(topology: Topology, groups: list[Group], settings: AllocationSettings) -> None:
    plan = plan_allocation(groups, settings)
    env = plan.envs
    union = sorted({c for g in groups for c in g.cpus})
    assert parse_cpulist(env["TOPOLOGY_CPUS"]) == union
    ordered = sorted(groups, key=lambda g: g.order)
    assert env["TOPOLOGY_GROUPS"] == ",".join(g.id for g in ordered)
    places = [p.strip("{}") for p in env["TOPOLOGY_OMP_PLACES"].split("},{")]
    place_cpus = [int(p) for p in places]
    assert int(env["OMP_NUM_THREADS"]) == int(env["TOPOLOGY_OMP_NUM_THREADS"]) == len(places)
    assert set(place_cpus) <= set(union)
    assert not set(BINDING_ENV_KEYS) & set(env)  # nothing that makes an OpenMP runtime bind the container
    by_group = [[int(p.strip("{}")) for p in rank.split(",")]
                for rank in env["TOPOLOGY_OMP_PLACES_BY_GROUP"].split("|")]
    assert [c for rank in by_group for c in rank] == place_cpus
    assert int(env["TOPOLOGY_RANKS"]) == len(groups)
    ranks = [vllm_parse_id_list(r) for r in env["VLLM_CPU_OMP_THREADS_BIND"].split("|")]
    assert len(ranks) == len(groups)
    seen: set[int] = set()
    for rank, group in zip(ranks, ordered, strict=True):
        assert set(rank) <= set(group.cpus)  # each rank inside one group
        assert not seen & set(rank)  # no two ranks share a CPU
        seen |= set(rank)
        cores_used = {core for core in group.cores if set(core) & set(rank)}
        # One thread per core by default (both with --omp-threads-per-core 2, where the core has two).
        assert sum(min(settings.omp_threads_per_core, len(core)) for core in cores_used) == len(rank)
    assert sorted(place_cpus) == sorted(seen)
    assert [vllm_parse_id_list(",".join(map(str, r))) for r in by_group] == ranks
    # No core is split between this container and anything else: every core of a group is whole in TOPOLOGY_CPUS.
    for g in groups:
        for core in g.cores:
            assert set(core) <= set(union)
    nodes = vllm_visible_memory_nodes(env["CPU_VISIBLE_MEMORY_NODES"], list(topology.machine.memory_nodes))
    assert nodes and set(nodes) <= set(topology.machine.memory_nodes)


def topologies() -> list[tuple[str, Topology]]:
    result = [(name, load_embedded(name)) for name in ("z16-lpar", "pr40714", "z16-vertical")]
    for name in sorted(REAL_DUMPS):
        try:
            _, root = real_dump(name)
        except pytest.skip.Exception:
            continue
        result.append((name, read_sysfs(root)))
    return result


@pytest.mark.parametrize(
    "settings",
    [AllocationSettings(), AllocationSettings(omp_threads_per_core=2), AllocationSettings(reserve_cores_per_group=0)],
    ids=["default", "smt2", "reserve0"],
)
def test_contract_for_every_single_and_pair_allocation(settings: AllocationSettings) -> None:
    checked = 0
    for _name, topology in topologies():
        grouping = group_topology(topology, GroupingSettings(levels=("book", "socket")))
        for resource in grouping.resources():
            groups = grouping.by_resource(resource)
            for n in (1, 2):
                for combo in itertools.combinations(groups, n):
                    check_contract(topology, list(combo), settings)
                    checked += 1
    assert checked > 100


def test_z16_one_book_picks_the_highest_thread_of_each_core() -> None:
    grouping = group_topology(load_embedded("z16-lpar"))
    book = grouping.by_id("topology/book")["drawer0-book0"]
    env = plan_allocation([book], AllocationSettings(reserve_cores_per_group=0)).envs
    assert env["TOPOLOGY_CPUS"] == "0-11"
    assert env["TOPOLOGY_OMP_PLACES"] == "{1},{3},{5},{7},{9},{11}"
    assert env["OMP_NUM_THREADS"] == "6"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1,3,5,7,9,11"
    assert env["CPU_VISIBLE_MEMORY_NODES"] == "0"


def test_by_default_one_core_per_group_is_left_to_the_serving_process() -> None:
    book = group_topology(load_embedded("z16-lpar")).by_id("topology/book")["drawer0-book0"]
    env = plan_allocation([book]).envs
    assert env["TOPOLOGY_CPUS"] == "0-11"  # the whole book is the container's
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1,3,5,7,9"  # core 5 (CPUs 10-11) is not an OpenMP place
    assert env["OMP_NUM_THREADS"] == env["TOPOLOGY_OMP_NUM_THREADS"] == "5"


def test_openmp_env_is_an_opt_in_that_adds_exactly_places_and_binding() -> None:
    book = group_topology(load_embedded("z16-lpar")).by_id("topology/book")["drawer0-book0"]
    plain = plan_allocation([book]).envs
    opted = plan_allocation([book], AllocationSettings(openmp_env=True)).envs
    assert set(plain) == set(ENV_KEYS)
    assert {k: v for k, v in opted.items() if k not in plain} == {
        "OMP_PLACES": plain["TOPOLOGY_OMP_PLACES"], "OMP_PROC_BIND": "close"}


def test_unequal_ranks_are_said_in_an_annotation() -> None:
    books = group_topology(load_embedded("pr40714"), GroupingSettings(min_group_cores=0)).by_id("topology/book")
    plan = plan_allocation([books["drawer0-book0"], books["drawer0-book2"]])
    assert plan.rank_cores == (12, 1) and not plan.balanced
    assert "unequal" in plan.annotations["topology.s390x.ibm.com/warning"]
    assert plan.annotations["topology.s390x.ibm.com/rank-cores"] == "12,1"
    even = plan_allocation([books["drawer0-book0"], books["drawer0-book1"]])
    assert even.balanced and even.imbalance is None and "topology.s390x.ibm.com/warning" not in even.annotations


def test_pr40714_two_books_give_two_ranks_like_vllm_logged() -> None:
    books = group_topology(load_embedded("pr40714")).by_id("topology/book")
    env = plan_allocation([books["drawer0-book1"], books["drawer0-book0"]],
                          AllocationSettings(reserve_cores_per_group=0)).envs
    assert env["TOPOLOGY_GROUPS"] == "drawer0-book0,drawer0-book1"
    ranks = env["VLLM_CPU_OMP_THREADS_BIND"].split("|")
    assert vllm_parse_id_list(ranks[0]) == list(range(1, 24, 2))  # the PR log's local_rank=0
    assert vllm_parse_id_list(ranks[1]) == list(range(25, 48, 2))  # local_rank=1


def test_reserved_cores_stay_in_the_cpuset_but_not_in_openmp() -> None:
    book = group_topology(load_embedded("pr40714")).by_id("topology/book")["drawer0-book0"]
    env = plan_allocation([book], AllocationSettings(reserve_cores_per_group=2)).envs
    assert env["TOPOLOGY_CPUS"] == "0-23"
    assert env["OMP_NUM_THREADS"] == "10"
    assert 23 not in vllm_parse_id_list(env["VLLM_CPU_OMP_THREADS_BIND"])
    tiny = group_topology(load_embedded("pr40714"), GroupingSettings(min_group_cores=0)).by_id(
        "topology/book")["drawer0-book2"]
    assert plan_allocation([tiny], AllocationSettings(reserve_cores_per_group=5)).envs["OMP_NUM_THREADS"] == "1"


def test_plan_depends_on_the_groups_alone() -> None:
    books = group_topology(load_embedded("z16-lpar")).by_resource("topology/book")
    assert plan_allocation(books[:2]) == plan_allocation(list(reversed(books[:2])))


def test_annotations_carry_cpus_and_memory_nodes_under_our_domain() -> None:
    book = group_topology(load_embedded("z16-lpar")).by_resource("topology/book")[0]
    ann = plan_allocation([book]).annotations
    assert ann["topology.s390x.ibm.com/cpus"] == "0-11"
    assert ann["topology.s390x.ibm.com/memory-nodes"] == "0"


@pytest.mark.parametrize("kwargs", [{"omp_threads_per_core": 3}, {"reserve_cores_per_group": -1}])
def test_bad_allocation_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="--"):
        AllocationSettings(**kwargs).validated()


@pytest.mark.parametrize("cpus", [((8, 9, 10, 11), (0, 1, 2, 3)),  # the first book in topology order numbered last
                                  ((0, 1, 4, 5), (2, 3, 6, 7)),  # interleaved numbers
                                  ((0, 1, 2, 3), (4, 5, 6, 7))])  # adjacent: one range
def test_the_cpu_set_is_right_whatever_the_numbering_across_groups(cpus: tuple[tuple[int, ...], ...]) -> None:
    book = group_topology(load_embedded("z16-lpar")).groups[0]
    groups = [dataclasses.replace(book, id=f"drawer0-book{i}", key=(0, i), cpus=c, cores=(c[:2], c[2:]))
              for i, c in enumerate(cpus)]
    plan = plan_allocation(groups)
    union = sorted(c for g in cpus for c in g)
    assert plan.cpus == tuple(union)
    assert parse_cpulist(plan.envs["TOPOLOGY_CPUS"]) == union
    assert plan.envs["TOPOLOGY_CPUS"] == format_cpulist(union)
    assert plan.envs["VLLM_CPU_OMP_THREADS_BIND"] == "|".join(str(c[1]) for c in cpus)  # rank order = topology order
