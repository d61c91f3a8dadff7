"""The grouping policy, driven directly over plain model values."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import PolicyError
from agent.policy.grouping import GroupingSettings, group_topology, min_cores_for
from agent.policy.naming import resource_name_error
from agent.topology.embedded import load_embedded
from agent.topology.model import Cpu, Machine, Topology
from topology_devkit.kubelet_emulator.names import is_extended_resource_name

LPAR = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
               dispatching="horizontal", smt_threads=2)


def lpar(layout: list[list[list[int]]], smt: int = 2, machine: Machine = LPAR,
         changes: dict[int, dict[str, Any]] | None = None) -> Topology:
    """CPUs for drawers > books > sockets > core counts, SMT threads adjacent; socket ids reused per book."""
    cpus: list[Cpu] = []
    n = core = 0
    for d, books in enumerate(layout):
        for b, sockets in enumerate(books):
            for s, ncores in enumerate(sockets):
                for _ in range(ncores):
                    threads = tuple(range(n, n + smt))
                    for t in threads:
                        cpus.append(Cpu(cpu=t, core=core, socket=s, book=10 * d + b, drawer=d, siblings=threads,
                                        node=0, polarization="horizontal", address=t))
                    n += smt
                    core += 1
    changes = changes or {}
    cpus = [Cpu(**{**{f: getattr(c, f) for f in Cpu.__slots__}, **changes.get(c.cpu, {})}) for c in cpus]
    return Topology(machine=machine, cpus=tuple(cpus))


def test_auto_picks_books_when_several_books_have_usable_cpus() -> None:
    g = group_topology(lpar([[[2, 2], [3]]]))
    assert g.levels == ("book",)
    assert [(x.id, x.cpulist) for x in g.groups] == [("drawer0-book0", "0-7"), ("drawer0-book1", "8-13")]
    assert all(x.resource == "topology/book" for x in g.groups)


def test_auto_falls_back_to_sockets_with_one_book() -> None:
    g = group_topology(lpar([[[2, 1]]]))
    assert g.levels == ("socket",)
    assert [x.id for x in g.groups] == ["drawer0-book0-socket0", "drawer0-book0-socket1"]


def test_a_book_without_usable_cpus_does_not_count() -> None:
    t = lpar([[[2], [1]]], changes={4: {"online": False}, 5: {"online": False}})
    assert group_topology(t).levels == ("socket",)


def test_whole_cores_only() -> None:
    g = group_topology(lpar([[[2]]]), GroupingSettings(reserved_cpus=frozenset({1})))
    assert [x.cpulist for x in g.groups] == ["2-3"]
    reasons = {s.reason: s.cpus for s in g.skipped}
    assert reasons["reserved (--reserved-cpus)"] == (1,)
    assert any("core split" in r and cpus == (0,) for r, cpus in reasons.items())


def test_excluded_polarization_and_summary() -> None:
    t = lpar([[[3]]], smt=1, changes={0: {"polarization": "vertical:high"}, 2: {"polarization": "vertical:low"}})
    g = group_topology(t, GroupingSettings(exclude_polarization=frozenset({"vertical:low"})))
    assert g.groups[0].cpus == (0, 1)
    assert g.groups[0].polarization == (("horizontal", 1), ("vertical:high", 1))


def test_memory_node_falls_back_with_a_warning() -> None:
    t = lpar([[[1], [1]]], changes={0: {"node": 3}, 1: {"node": 3}})
    g = group_topology(t)
    first = g.groups[0]
    assert first.memory_nodes == (0,) and first.recorded_nodes == (3,)
    assert len(g.warnings) == 1
    assert "memory node(s) 3" in g.warnings[0] and "falling back to memory node 0" in g.warnings[0]


def test_no_node_data_means_first_real_node_without_warning() -> None:
    t = lpar([[[1], [1]]], changes={c: {"node": None} for c in range(4)})
    g = group_topology(t)
    assert [x.memory_node for x in g.groups] == [0, 0] and g.warnings == ()


def test_degenerate_guest_is_not_advertised() -> None:
    guest = Machine(arch="s390x", environment="zvm", topology_facility=False)
    cpus = tuple(Cpu(cpu=i, core=i, socket=i, book=i, drawer=i, siblings=(i,)) for i in range(4))
    g = group_topology(Topology(machine=guest, cpus=cpus), GroupingSettings(levels=("book", "socket")))
    assert g.groups == () and g.fidelity == "guest-no-topology"
    assert "no topology facility (z/VM guest" in g.skipped[0].reason


def test_degenerate_shape_without_facility_information() -> None:
    unknown = Machine(arch="s390x", environment="unknown", topology_facility=None)
    cpus = tuple(Cpu(cpu=i, core=0, socket=i, book=i, siblings=(i,)) for i in range(3))
    g = group_topology(Topology(machine=unknown, cpus=cpus))
    assert g.groups == () and "single CPU" in g.skipped[0].reason


def test_x86_machine_groups_by_socket() -> None:
    x86 = Machine(arch="x86_64", environment="none", memory_nodes=(0, 1), has_node_dirs=True)
    cpus = tuple(Cpu(cpu=i, core=i % 4, socket=i // 4, siblings=(i,), node=i // 4) for i in range(8))
    g = group_topology(Topology(machine=x86, cpus=cpus), GroupingSettings(allow_non_s390x=True))
    assert [(x.id, x.memory_node) for x in g.groups] == [("socket0", 0), ("socket1", 1)]
    assert g.fidelity == "generic"


def test_a_machine_that_is_not_ibm_z_advertises_nothing_unless_asked() -> None:
    x86 = Machine(arch="x86_64", environment="none")
    cpus = tuple(Cpu(cpu=i, core=i, socket=0, siblings=(i,)) for i in range(4))
    g = group_topology(Topology(machine=x86, cpus=cpus))
    assert g.groups == () and g.levels == ()
    assert g.level_reason.startswith("not an IBM Z machine (architecture x86_64): nothing is advertised")
    assert [(s.cpus, s.reason) for s in g.skipped] == [((0, 1, 2, 3), g.level_reason)]
    unknown = Machine(arch="unknown", environment="none")  # a sysfs tree without /proc: grouped as it is
    assert [x.id for x in group_topology(Topology(machine=unknown, cpus=cpus)).groups] == ["socket0"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"levels": ("chip",)}, "unknown level"),
        ({"levels": ()}, "at least one"),
        ({"resource_prefix": "Topology"}, "lowercase"),
        ({"resource_prefix": "kubernetes.io"}, "kubernetes.io"),
        ({"exclude_polarization": frozenset({"vertical:tiny"})}, "unknown polarization"),
    ],
)
def test_bad_settings_are_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        group_topology(lpar([[[1]]]), GroupingSettings(**kwargs))


def test_custom_prefix() -> None:
    g = group_topology(lpar([[[1], [1]]]), GroupingSettings(resource_prefix="topology.ibm.com"))
    assert {x.resource for x in g.groups} == {"topology.ibm.com/book"}


# --- properties -----------------------------------------------------------------------------

layouts = st.lists(  # drawers
    st.lists(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=3), min_size=1, max_size=3),
    min_size=1, max_size=2,
)


@st.composite
def topologies(draw: st.DrawFn) -> tuple[Topology, GroupingSettings]:
    smt = draw(st.sampled_from([1, 2]))
    base = lpar(draw(layouts), smt=smt)
    numbers = [c.cpu for c in base.cpus]
    changes: dict[int, dict[str, Any]] = {}
    for cpu in draw(st.sets(st.sampled_from(numbers), max_size=4)):
        changes[cpu] = {"online": False}
    for cpu in draw(st.sets(st.sampled_from(numbers), max_size=3)):
        changes.setdefault(cpu, {})["polarization"] = draw(st.sampled_from(["vertical:low", "vertical:high"]))
    t = Topology(machine=base.machine, cpus=tuple(
        Cpu(**{**{f: getattr(c, f) for f in Cpu.__slots__}, **changes.get(c.cpu, {})}) for c in base.cpus))
    reserved = frozenset(draw(st.sets(st.sampled_from(numbers), max_size=3)))
    levels = draw(st.sampled_from([None, ("book", "socket"), ("drawer", "book", "socket")]))
    excluded = draw(st.sampled_from([frozenset(), frozenset({"vertical:low"})]))
    min_cores = draw(st.sampled_from([None, 0, 2]))
    return t, GroupingSettings(levels=levels, reserved_cpus=reserved, exclude_polarization=excluded,
                               min_group_cores=min_cores)


@settings(max_examples=150, deadline=None)
@given(topologies())
def test_every_usable_cpu_is_in_exactly_one_group_per_level(case: tuple[Topology, GroupingSettings]) -> None:
    topology, s = case
    g = group_topology(topology, s)
    by_number = topology.by_number()

    def usable(n: int) -> bool:
        c = by_number[n]
        return (c.online and c.configured and n not in s.reserved_cpus
                and c.polarization not in s.exclude_polarization)

    whole = {c.cpu for c in topology.cpus if all(usable(t) for t in c.siblings)}
    for level in g.levels:
        members = [c for grp in g.groups if grp.level == level for c in grp.cpus]
        # A group too small to advertise is said per group, with its CPUs.
        small = [c for sk in g.skipped if sk.reason.startswith(f"{level} ") and " not advertised: " in sk.reason
                 for c in sk.cpus]
        assert sorted(members + small) == sorted(whole), level
        sizes = [len(grp.cores) for grp in g.groups if grp.level == level]
        if s.min_group_cores is not None and sizes:
            assert min(sizes) >= s.min_group_cores
        if s.min_group_cores == 0:
            assert not small
    for grp in g.groups:
        for core in grp.cores:
            assert set(core) <= set(grp.cpus)
            assert set(by_number[core[0]].siblings) == set(core)  # no core split
    skipped = [c for sk in g.skipped for c in sk.cpus]
    too_small = {c for sk in g.skipped if " not advertised: " in sk.reason for c in sk.cpus}
    assert set(skipped) | whole >= {c.cpu for c in topology.cpus}
    assert not (set(skipped) - too_small) & whole  # whole cores are left out only for a group's size


@settings(max_examples=100, deadline=None)
@given(topologies(), st.randoms(use_true_random=False))
def test_ids_unique_and_stable_under_reordering(case: tuple[Topology, GroupingSettings], rnd: random.Random) -> None:
    topology, s = case
    shuffled = list(topology.cpus)
    rnd.shuffle(shuffled)
    a = group_topology(topology, s)
    b = group_topology(Topology(machine=topology.machine, cpus=tuple(shuffled)), s)
    assert a == b
    for resource in a.resources():
        ids = [x.id for x in a.by_resource(resource)]
        assert len(ids) == len(set(ids))
        assert all(len(i) <= 63 for i in ids)


def test_groups_far_smaller_than_their_peers_are_not_advertised_and_the_reason_names_them() -> None:
    topology = load_embedded("pr40714")  # books of 12, 12 and 1 cores
    auto = group_topology(topology)
    assert [g.id for g in auto.groups] == ["drawer0-book0", "drawer0-book1"]
    (small,) = [s for s in auto.skipped if "drawer0-book2" in s.reason]
    assert small.cpus == (48, 49)
    assert "1 core, fewer than 6" in small.reason and "--min-group-cores 0" in small.reason
    every = group_topology(topology, GroupingSettings(min_group_cores=0))
    assert [g.id for g in every.groups] == ["drawer0-book0", "drawer0-book1", "drawer0-book2"]
    strict = group_topology(topology, GroupingSettings(min_group_cores=13))
    assert not strict.groups and len([s for s in strict.skipped if "not advertised" in s.reason]) == 3


@pytest.mark.parametrize(("sizes", "expected"), [([12, 12, 1], 6), ([6, 5, 5, 6, 5, 4, 6, 4], 2), ([1, 1], 1),
                                                 ([3], 1), ([], 1), ([2, 3], 1), ([8, 9], 4)])
def test_the_automatic_minimum_is_half_the_median_group(sizes: list[int], expected: int) -> None:
    assert min_cores_for(sizes, None)[0] == expected
    assert min_cores_for(sizes, 0)[0] == 0


@settings(max_examples=600, deadline=None)
@given(st.one_of(
    st.text(alphabet="aZ09-._/", max_size=12),
    st.builds(lambda p, n: f"{p}/{n}", st.text(alphabet="az09-.", max_size=10),
              st.text(alphabet="aZ09-._", max_size=10)),
    st.sampled_from(["topology/book", "requests.x/book", "kubernetes.io/book", "a.kubernetes.io/b", "x" * 250 + "/b",
                     "a/" + "b" * 63, "a/" + "b" * 64, "-a/b", "a-/b", "a..b/c", "A/b", "a/b-", "a/_b"])))
def test_resource_names_are_judged_as_kubelet_judges_them(name: str) -> None:
    """The agent's check against the emulator's copy of kubelet's patterns."""
    assert (resource_name_error(name) is None) == is_extended_resource_name(name), name
