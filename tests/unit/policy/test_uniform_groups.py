"""--uniform-groups: one group size per resource, so that one pod spec is right whichever group kubelet picks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.observe.metrics import AgentMetrics
from agent.observe.report import explain, grouping_dict, table
from agent.observe.status import AgentStatus
from agent.policy.allocation import AllocationSettings
from agent.policy.device_states import machine_health
from agent.policy.grouping import GroupingSettings, group_sizes, group_topology, uniform_size
from agent.policy.state_codec import grouping_from_dict, grouping_to_dict
from agent.topology.embedded import load_embedded
from tests.support.env import BOOK

UNIFORM = GroupingSettings(uniform_groups=True)


def sizes(name: str, settings: GroupingSettings = UNIFORM) -> list[int]:
    return [len(g.cpus) for g in group_topology(load_embedded(name), settings).by_resource(BOOK)]


def test_the_most_common_size_wins_and_a_tie_goes_to_the_larger() -> None:
    assert uniform_size([12, 10, 10, 12, 10, 8, 12, 8]) == 12  # 12 and 10 three times each: the larger
    assert uniform_size([8, 8, 12]) == 8  # the most common, even when smaller
    assert uniform_size([22, 8, 16, 6]) == 22
    assert uniform_size([]) is None


@pytest.mark.parametrize("name, before, after", [
    ("z16-lpar", [12, 10, 10, 12, 10, 8, 12, 8], [12, 12, 12]),
    ("z15-lpar", [22, 8, 16, 6], [22]),
    ("z16-vertical", [12, 8], [12]),
    ("pr40714", [24, 24], [24, 24]),  # the one-core book is already out (--min-group-cores auto)
])
def test_uneven_books_advertise_one_size(name: str, before: list[int], after: list[int]) -> None:
    assert sizes(name, GroupingSettings()) == before
    assert sizes(name) == after
    grouping = group_topology(load_embedded(name), UNIFORM)
    assert group_sizes(grouping) == {BOOK: (after[0],)}
    (uniform,) = grouping.uniform
    assert (uniform.resource, uniform.cpus, len(uniform.left_out)) == (BOOK, after[0], len(before) - len(after))


def test_the_groups_left_out_are_named_with_the_reason() -> None:
    grouping = group_topology(load_embedded("z16-lpar"), UNIFORM)
    reasons = [s.reason for s in grouping.skipped]
    assert len(reasons) == 5
    assert any(r.startswith("book drawer1-book5 not advertised: 8 CPUs, not the 12 of this node's other books "
                            "(--uniform-groups") for r in reasons)
    advertised = {c for g in grouping.groups for c in g.cpus}
    left_out = {c for s in grouping.skipped for c in s.cpus}
    assert not advertised & left_out
    assert advertised | left_out == {c.cpu for c in load_embedded("z16-lpar").cpus}


def test_each_level_gets_its_own_size() -> None:
    grouping = group_topology(load_embedded("z16-lpar"), replace(UNIFORM, levels=("book", "socket")))
    assert {u.resource: u.cpus for u in grouping.uniform} == {BOOK: 12, "topology/socket": 6}
    assert {r: len(s) for r, s in group_sizes(grouping).items()} == {BOOK: 1, "topology/socket": 1}


def test_off_by_default_and_the_health_check_ignores_it() -> None:
    topology = load_embedded("z16-lpar")
    assert group_topology(topology).uniform == ()
    advertised = group_topology(topology, UNIFORM)
    assert machine_health(advertised, topology, UNIFORM) == {}  # the left-out books are not "broken"


def test_the_saved_grouping_keeps_the_choice() -> None:
    topology = load_embedded("z16-lpar")
    grouping = group_topology(topology, UNIFORM)
    data = json.loads(json.dumps(grouping_to_dict(grouping, UNIFORM)))
    back = grouping_from_dict(data, UNIFORM, (c.cpu for c in topology.cpus))
    assert back is not None and back.uniform == grouping.uniform and back.groups == grouping.groups
    assert grouping_from_dict(data, GroupingSettings(), (c.cpu for c in topology.cpus)) is None  # other settings
    plain = grouping_to_dict(group_topology(topology), GroupingSettings())
    assert "uniform" not in plain and "uniform_groups" not in plain["settings"]  # files as before the flag


def test_discover_and_explain_print_the_exact_request() -> None:
    topology = load_embedded("z16-lpar")
    uneven = group_topology(topology)
    even = group_topology(topology, UNIFORM)
    assert ("pod spec: topology/book groups differ in size (12, 10, 8 CPUs): no one cpu request is right for every "
            "group kubelet may pick; --uniform-groups advertises only the 12-CPU ones") in table(topology, uneven)
    line = ('pod spec: topology/book: N needs cpu: N x 12 (every topology/book has 12 CPUs; for N = 1: cpu: "12", '
            'no cpu limit) (--uniform-groups left out 5 of another size)')
    assert line in table(topology, even)
    assert line in explain(topology, even, AllocationSettings())
    assert grouping_dict(topology, even)["cpu_request"] == {BOOK: 12}
    assert grouping_dict(topology, uneven)["cpu_request"] == {BOOK: None}
    assert grouping_dict(topology, even)["uniform"][0]["left_out"] == [
        "drawer0-book1", "drawer0-book2", "drawer1-book4", "drawer1-book5", "drawer1-book7"]


def test_the_flag_and_its_environment_twin() -> None:
    exe = shutil.which("topology-agent", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert exe is not None
    base = [exe, "discover", "--topology-file", "embedded:z16-lpar", "--format", "json"]
    for extra, env, advertised in (([], {}, 8), (["--uniform-groups"], {}, 3),
                                   ([], {"TOPOLOGY_AGENT_UNIFORM_GROUPS": "true"}, 3),
                                   (["--no-uniform-groups"], {"TOPOLOGY_AGENT_UNIFORM_GROUPS": "true"}, 8)):
        result = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60, check=True,
                                env={"PATH": "/usr/bin:/bin", **env})
        assert len(json.loads(result.stdout)["groups"]) == advertised, (extra, env)


def test_the_metrics() -> None:
    metrics = AgentMetrics()
    metrics.read_status(lambda: AgentStatus(machine="z16", fidelity="lpar", dispatching="horizontal", smt=2,
                                            groups=(), resources=(), ready=True, uniform=((BOOK, 12, 5),)))
    samples = {(s.name, tuple(s.labels.items())): s.value
               for f in text_string_to_metric_families(generate_latest(metrics.registry).decode()) for s in f.samples}
    assert samples[("topology_agent_groups_not_uniform", (("resource", BOOK),))] == 5
    assert samples[("topology_agent_uniform_group_cpus", (("resource", BOOK),))] == 12


def test_a_snapshot_run_reads_the_groups_saved_before_these_flags() -> None:
    """--topology-file turns allow_non_s390x on: the saved settings must not change for it (fake-topology mode
    upgrades keep their groups), and uniform_groups appears in them only when on."""
    from agent.policy.state_codec import settings_key

    before = settings_key(GroupingSettings())
    assert settings_key(GroupingSettings(allow_non_s390x=True)) == before
    assert "uniform_groups" not in before
