"""explain's closing section: why a topology pod would stay Pending or be rejected on this node, per cause that
applies, with the text kubectl describe shows and the fix (docs/admin/troubleshooting.md)."""

from __future__ import annotations

import subprocess
import sys

from agent.node.labels import not_advertised
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.troubleshoot import pending_causes
from agent.topology.embedded import load_embedded
from tests.support.env import REPO


def causes(name: str, levels: tuple[str, ...] | None = None) -> list[str]:
    topology = load_embedded(name)
    grouping = group_topology(topology, GroupingSettings(levels=levels))
    return pending_causes(grouping, "topology", not_advertised(topology, grouping))


def test_a_level_not_advertised_and_a_group_too_small() -> None:
    found = causes("pr40714")
    assert found[0] == ('topology/socket is not advertised here (levels: book): a pod asking for it stays Pending '
                        'with "Insufficient topology/socket"; fix: --levels book,socket (chart: agent.levels)')
    assert any(line.startswith("1 group(s) too small to advertise") for line in found)
    assert any(line.startswith("topology/book: 2 on this node") for line in found)


def test_overlapping_levels_name_the_blocked_sockets_and_the_lag() -> None:
    found = causes("z16-lpar", ("book", "socket"))
    assert not [line for line in found if "is not advertised here" in line]
    (overlap,) = [line for line in found if "overlap" in line]
    assert "its sockets are blocked" in overlap and "about 10 s" in overlap
    assert "Insufficient topology/socket" in overlap


def test_a_guest_without_topology_says_only_that() -> None:
    (line,) = causes("z16-guest-no-topology")
    assert line.startswith("nothing is advertised (no-topology-facility)")
    assert "topology.s390x.ibm.com/advertised=no-topology-facility" in line


def test_explain_ends_with_the_causes() -> None:
    done = subprocess.run([sys.executable, "-m", "agent", "explain", "--topology-file", "embedded:pr40714"],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    tail = done.stdout.split("why a topology pod would stay Pending or be rejected here")[1]
    assert "topology/socket is not advertised here" in tail


def test_explain_says_where_a_holder_of_offline_cpus_runs() -> None:
    """A CPU left out because it is offline comes with what happens to a pod that still holds its group."""
    import dataclasses

    from agent.observe.report import explain
    from agent.policy.allocation import AllocationSettings

    topology = load_embedded("z16-lpar")
    topology = dataclasses.replace(topology, cpus=tuple(dataclasses.replace(c, online=c.cpu not in range(12))
                                                        for c in topology.cpus))
    text = explain(topology, group_topology(topology, GroupingSettings(levels=("book",))), AllocationSettings())
    left_out = text.split("left out:")[1]
    assert "cpus 0-11: offline" in left_out
    assert "run on the CPUs no other pod holds" in left_out and "topology_agent_cpuset_holders_offline" in left_out
    assert "TopologyHolderOffline" in left_out
