"""Exclusivity across levels and machine health, as pure functions."""

from __future__ import annotations

import dataclasses

from agent.policy.device_states import device_states, machine_health, overlap_map, overlaps
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.keys import Holder
from agent.policy.ledger import conflict
from agent.topology.embedded import load_embedded
from agent.topology.model import Topology
from tests.support.env import BOOK, SOCKET

SETTINGS = GroupingSettings(levels=("book", "socket"))
Z16 = load_embedded("z16-lpar")
GROUPING = group_topology(Z16, SETTINGS)
POD = Holder("default", "p", "c")


def test_overlap_is_containment_across_levels() -> None:
    books = GROUPING.by_id(BOOK)
    sockets = GROUPING.by_id(SOCKET)
    assert overlaps(books["drawer0-book0"], sockets["drawer0-book0-socket1"])
    assert not overlaps(books["drawer0-book0"], sockets["drawer0-book1-socket0"])
    assert not overlaps(books["drawer0-book0"], books["drawer0-book1"])
    assert sorted(overlap_map(GROUPING)[(BOOK, "drawer1-book5")]) == [
        (SOCKET, "drawer1-book5-socket0"), (SOCKET, "drawer1-book5-socket1")]


def test_a_held_book_blocks_its_sockets_only() -> None:
    states = device_states(GROUPING, {(BOOK, "drawer0-book0"): {POD}}, {})
    assert states[(BOOK, "drawer0-book0")].state == "allocated"
    assert states[(SOCKET, "drawer0-book0-socket0")].health == "Unhealthy"
    assert states[(SOCKET, "drawer0-book0-socket0")].state == "blocked-by-overlap"
    assert "default/p/c" in states[(SOCKET, "drawer0-book0-socket1")].reason
    assert states[(SOCKET, "drawer0-book1-socket0")].health == "Healthy"
    unhealthy = [k for k, s in states.items() if s.health == "Unhealthy"]
    assert len(unhealthy) == 2


def test_a_held_socket_blocks_its_book_and_an_allocated_device_is_never_marked() -> None:
    held = {(SOCKET, "drawer0-book0-socket0"): {POD}, (BOOK, "drawer0-book0"): {Holder("x", "y", "z")}}
    broken = {(BOOK, "drawer0-book0"): "cpus 3 offline", (SOCKET, "drawer0-book0-socket0"): "cpus 3 offline"}
    states = device_states(GROUPING, held, broken)
    assert states[(BOOK, "drawer0-book0")].health == "Healthy"  # allocated (even though it overlaps)
    assert states[(SOCKET, "drawer0-book0-socket0")].health == "Healthy"
    assert conflict((BOOK, "drawer0-book0"), {(SOCKET, "drawer0-book0-socket0"): {POD}}, overlap_map(GROUPING))


def test_conflict_names_the_holder() -> None:
    why = conflict((SOCKET, "drawer1-book4-socket1"), {(BOOK, "drawer1-book4"): {POD}}, overlap_map(GROUPING))
    assert why == "topology/socket drawer1-book4-socket1 overlaps topology/book drawer1-book4, held by default/p/c"
    assert conflict((SOCKET, "drawer0-book0-socket0"), {(BOOK, "drawer1-book4"): {POD}}, overlap_map(GROUPING)) is None


def offline(topology: Topology, *cpus: int) -> Topology:
    return Topology(machine=topology.machine, cpus=tuple(
        dataclasses.replace(c, online=c.cpu not in cpus) for c in topology.cpus))


def test_machine_health_marks_groups_that_lost_cpus() -> None:
    broken = machine_health(GROUPING, offline(Z16, 3), SETTINGS)
    assert set(broken) == {(BOOK, "drawer0-book0"), (SOCKET, "drawer0-book0-socket0")}
    assert "offline" in broken[(BOOK, "drawer0-book0")]
    assert machine_health(GROUPING, Z16, SETTINGS) == {}


def test_moved_cpus_break_the_group_and_new_cpus_do_not_reshape_it() -> None:
    moved = Topology(machine=Z16.machine, cpus=tuple(
        dataclasses.replace(c, book=1, drawer=0) if c.cpu in (10, 11) else c for c in Z16.cpus))
    broken = machine_health(GROUPING, moved, SETTINGS)
    assert (BOOK, "drawer0-book0") in broken and "moved" in broken[(BOOK, "drawer0-book0")]
    assert (BOOK, "drawer0-book1") not in broken  # gained CPUs: still whole, not reshaped
