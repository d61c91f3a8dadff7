"""Discovery on every real s390x dump, checked against lscpu's own output for that dump.

lscpu's BOOK/SOCKET columns are logical indexes of sibling masks; the groups they imply (online,
configured CPUs only) must equal ours as sets of CPUs. Where the agent deliberately differs
(guests without the topology facility), the test says so and checks the reason.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.sysfs import read_sysfs
from tests.support.env import REAL_DUMPS, real_dump

# Dumps the agent refuses to advertise, with the words the reason must contain.
DELIBERATELY_DIFFERENT = {
    "s390-kvm": "no topology facility",
    "s390-zvm": "no topology facility",
    "s390-nested-virt": "no topology facility",
    "hwloc-2s390-2c": "cores unknown",
}


def lscpu_table(dump_dir: Path) -> list[dict[str, str]]:
    lines = (dump_dir / "lscpu-e.txt").read_text().splitlines()
    header = lines[0].split()
    return [dict(zip(header, line.split(), strict=True)) for line in lines[1:] if line.strip()]


def lscpu_groups(rows: list[dict[str, str]], column: str) -> set[frozenset[int]]:
    groups: dict[str, set[int]] = defaultdict(set)
    for row in rows:
        if row["CONFIGURED"] == "yes" and row["ONLINE"] == "yes" and row[column] != "-":
            groups[row[column]].add(int(row["CPU"]))
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_groups_match_lscpu(name: str) -> None:
    dump_dir, root = real_dump(name)
    rows = lscpu_table(dump_dir)
    grouping = group_topology(read_sysfs(root), GroupingSettings(levels=("book", "socket")))
    ours = {level: {frozenset(g.cpus) for g in grouping.groups if g.level == level} for level in ("book", "socket")}
    if name in DELIBERATELY_DIFFERENT:
        assert grouping.groups == ()
        reasons = " ".join(s.reason for s in grouping.skipped)
        assert DELIBERATELY_DIFFERENT[name] in reasons
        # Every online CPU is accounted for with that reason.
        assert {c for s in grouping.skipped for c in s.cpus} >= {int(r["CPU"]) for r in rows if r["ONLINE"] == "yes"}
        # What lscpu implies there is no topology: one CPU per book and socket, or no ids at all.
        for column in ("BOOK", "SOCKET"):
            assert all(len(g) == 1 for g in lscpu_groups(rows, column))
        return
    assert ours["book"] == lscpu_groups(rows, "BOOK")
    assert ours["socket"] == lscpu_groups(rows, "SOCKET")


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_offline_and_standby_cpus_never_advertised(name: str) -> None:
    dump_dir, root = real_dump(name)
    topology = read_sysfs(root)
    grouping = group_topology(topology, GroupingSettings(levels=("book", "socket")))
    advertised = {c for g in grouping.groups for c in g.cpus}
    unusable = {c.cpu for c in topology.cpus if not (c.online and c.configured)}
    assert not advertised & unusable
    for row in lscpu_table(dump_dir):
        cpu = topology.by_number()[int(row["CPU"])]
        assert cpu.online == (row["ONLINE"] == "yes")
        assert cpu.configured == (row["CONFIGURED"] == "yes")


def test_z13_drawer_dump_keeps_hierarchical_kernel_ids() -> None:
    _, root = real_dump("s390-lpar-drawer")
    topology = read_sysfs(root)
    assert topology.machine.generation == "z13"
    assert topology.machine.environment == "lpar"
    assert topology.machine.topology_facility is True
    assert topology.machine.memory_nodes == (0,)
    assert {c.socket_key for c in topology.cpus} == {(4, 1, 2), (4, 1, 3)}
    grouping = group_topology(topology)
    assert grouping.levels == ("socket",)  # one book: PR #40714 falls back to sockets
    assert [(g.id, g.cpulist) for g in grouping.groups] == [
        ("drawer4-book1-socket2", "0-1"),
        ("drawer4-book1-socket3", "2-7"),
    ]


def test_old_kernel_ids_are_derived_from_masks() -> None:
    _, root = real_dump("s390-lpar")
    topology = read_sysfs(root)
    # physical_package_id is -1 and core_id is not unique: sockets come from the masks.
    assert len({c.socket_key for c in topology.cpus if c.online}) == 7
    assert all(c.siblings == (c.cpu,) for c in topology.cpus if c.online)
    assert topology.machine.dispatching == "vertical"
    cpu0 = topology.by_number()[0]
    assert (cpu0.online, cpu0.configured, cpu0.book) == (False, True, 3)  # offline, still in its book's mask
    standby = topology.by_number()[6]
    assert (standby.online, standby.configured, standby.polarization) == (False, False, "unknown")
    grouping = group_topology(topology)
    assert [(g.id, g.cpulist) for g in grouping.groups] == [("book3", "1-5"), ("book4", "8-19")]


def test_gapped_book_and_hand_made_drawers() -> None:
    _, root = real_dump("hwloc-20s390-2g6s4c")
    grouping = group_topology(read_sysfs(root))
    assert grouping.levels == ("book",)
    assert "drawer4-book0" in {g.id for g in grouping.groups}
    assert grouping.by_id("topology/book")["drawer4-book0"].cpulist == "0-2,10-12"


def test_every_group_gets_a_real_memory_node() -> None:
    for name in REAL_DUMPS:
        _, root = real_dump(name)
        topology = read_sysfs(root)
        for g in group_topology(topology, GroupingSettings(levels=("book", "socket"))).groups:
            assert g.memory_nodes and set(g.memory_nodes) <= set(topology.machine.memory_nodes)


def test_missing_real_dumps_fail_under_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.support import env

    monkeypatch.setattr(env, "REAL_FIXTURES", tmp_path / "no-shared")
    monkeypatch.setattr(env, "IN_CI", True)
    outcomes = []
    for ci in (True, False):
        monkeypatch.setattr(env, "IN_CI", ci)
        try:
            env.real_dump("s390-lpar")
        except BaseException as outcome:  # a skip is a BaseException: caught here to be asserted
            outcomes.append((type(outcome).__name__, "CI=true" in str(outcome)))
    assert outcomes == [("Failed", True), ("Skipped", False)]  # failed under CI=true, skipped elsewhere
