"""DRA mode's ResourceSlices (agent/policy/resource_slices.py): layout, limits, determinism, the counters'
exclusivity."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import replace

import kubernetes_validate
import pytest

from agent.cli import main
from agent.errors import PolicyError
from agent.policy.device_states import overlaps
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.resource_slices import (
    DRIVER,
    MAX_ATTRIBUTES_PER_DEVICE,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_COUNTERS_PER_SET,
    MAX_DEVICES_PER_SLICE,
    MAX_STRING_VALUE,
    NUMA_NODE_ATTRIBUTE,
    TAINT_KEY,
    PoolPlan,
    SliceSettings,
    build_pool,
    deviceclass,
    level_of_device,
    pool_dict,
)
from agent.topology.embedded import load_embedded
from agent.topology.model import Topology
from topology_devkit.synthetic import LparShape, build_topology

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def pool(topology: Topology, levels: tuple[str, ...] | None = ("book", "socket"), node: str = "node-a",
         **kw: object) -> PoolPlan:
    grouping = group_topology(topology, GroupingSettings(levels=levels, **kw))  # type: ignore[arg-type]
    return build_pool(grouping, topology, SliceSettings(node))


def devices(plan: PoolPlan) -> dict[str, dict[str, object]]:
    return {d["name"]: d for d in plan.devices}


def check_limits(plan: PoolPlan) -> None:
    names = set()
    for s in plan.slices:
        spec = s.spec
        assert spec["nodeName"] == plan.node_name and spec["driver"] == DRIVER
        assert spec["pool"] == {"name": plan.pool, "generation": 0, "resourceSliceCount": len(plan.slices)}
        assert ("devices" in spec) != ("sharedCounters" in spec)  # only one of them per slice
        assert len(spec.get("devices", [])) <= MAX_DEVICES_PER_SLICE
        assert len(spec.get("sharedCounters", [])) <= MAX_COUNTER_SETS_PER_SLICE
        for cs in spec.get("sharedCounters", []):
            assert DNS_LABEL.match(cs["name"])
            assert 0 < len(cs["counters"]) <= MAX_COUNTERS_PER_SET
            assert all(DNS_LABEL.match(c) for c in cs["counters"])
        for d in spec.get("devices", []):
            assert DNS_LABEL.match(d["name"]) and len(d["name"]) <= 63
            assert d["name"] not in names
            names.add(d["name"])
            assert len(d["attributes"]) + len(d["capacity"]) <= MAX_ATTRIBUTES_PER_DEVICE
            for key, value in d["attributes"].items():
                assert C_IDENTIFIER.match(key) or key == NUMA_NODE_ATTRIBUTE  # the one standard attribute
                assert len(value) == 1
                if "string" in value:
                    assert len(value["string"]) <= MAX_STRING_VALUE
            assert 1 <= len(d["consumesCounters"]) <= 2
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": s.name},
               "spec": s.with_generation(1)}
        kubernetes_validate.validate(obj, "1.37", strict=True)


def fits(plan: PoolPlan, chosen: list[str]) -> bool:
    """Whether the scheduler could allocate these devices together: no counter overdrawn."""
    left = {(cs, c): v for cs, counters in plan.counters.items() for c, v in counters.items()}
    by_name = devices(plan)
    for name in chosen:
        for use in by_name[name]["consumesCounters"]:  # type: ignore[attr-defined]
            for c, v in use["counters"].items():
                left[(use["counterSet"], c)] -= int(v["value"])
    return all(v >= 0 for v in left.values())


def test_pr40714_layout() -> None:
    topology = load_embedded("pr40714")
    plan = pool(topology)
    check_limits(plan)
    assert [s.name for s in plan.slices] == ["node-a-topology-counters-0", "node-a-topology-devices-0"]
    assert plan.counters == {"drawer0": {"book0-socket0": 6, "book0-socket1": 6, "book1-socket0": 6,
                                         "book1-socket1": 6}}
    by_name = devices(plan)
    # The one-core book is not advertised (min-group-cores auto), so not published either.
    assert sorted(by_name) == ["drawer0-book0", "drawer0-book0-socket0", "drawer0-book0-socket1",
                               "drawer0-book1", "drawer0-book1-socket0", "drawer0-book1-socket1"]
    book = by_name["drawer0-book1"]
    assert book["attributes"] == {
        "level": {"string": "book"}, "drawer": {"int": 0}, "book": {"int": 1}, "cores": {"int": 12},
        "cpus": {"int": 24}, "smtThreads": {"int": 2}, "memoryNode": {"int": 0},
        "polarization": {"string": "horizontal"}, "machineType": {"string": "3931"},
        NUMA_NODE_ATTRIBUTE: {"int": 0}}  # the standard name (stable in 1.37), for matchAttribute across drivers
    assert book["capacity"] == {"cores": {"value": "12"}}
    assert book["consumesCounters"] == [{"counterSet": "drawer0", "counters": {
        "book1-socket0": {"value": "6"}, "book1-socket1": {"value": "6"}}}]
    socket = by_name["drawer0-book1-socket0"]
    assert socket["attributes"]["socket"] == {"int": 0}  # type: ignore[index]
    assert socket["consumesCounters"] == [{"counterSet": "drawer0", "counters": {"book1-socket0": {"value": "6"}}}]


def test_pr40714_small_book_published_with_min_group_cores_0() -> None:
    plan = pool(load_embedded("pr40714"), min_group_cores=0)
    check_limits(plan)
    small = devices(plan)["drawer0-book2"]
    assert small["attributes"]["cores"] == {"int": 1}  # type: ignore[index]
    # A CEL selector "cores >= 10" would skip it (the e2e test asks the real scheduler).


def test_z16_400_all_levels_within_limits() -> None:
    topology = load_embedded("z16-400")
    plan = pool(topology, levels=("drawer", "book", "socket"))
    check_limits(plan)
    assert len(plan.devices) == 4 + 16 + 32
    assert len(plan.slices) == 2
    assert list(plan.counters) == ["drawer0", "drawer1", "drawer2", "drawer3"]
    assert all(len(c) == 8 for c in plan.counters.values())
    drawer = devices(plan)["drawer1"]
    assert drawer["consumesCounters"][0]["counterSet"] == "drawer1"  # type: ignore[index]
    assert len(drawer["consumesCounters"][0]["counters"]) == 8  # type: ignore[index]


def test_counters_forbid_exactly_the_overlaps() -> None:
    """Any two devices fit together exactly when the device-plugin mode's overlap rule allows them."""
    topology = load_embedded("z16-lpar")
    grouping = group_topology(topology, GroupingSettings(levels=("drawer", "book", "socket")))
    plan = build_pool(grouping, topology, SliceSettings("n"))
    groups = {g.id: g for g in grouping.groups}
    for a, b in itertools.combinations(groups, 2):
        assert fits(plan, [a, b]) == (not overlaps(groups[a], groups[b])), (a, b)
    for name in groups:
        assert fits(plan, [name])
        assert not fits(plan, [name, name])


def test_deterministic_and_generation_free_content() -> None:
    topology = load_embedded("z16-lpar")
    a, b = pool(topology), pool(topology)
    assert a == b
    assert json.dumps(pool_dict(a), sort_keys=True) == json.dumps(pool_dict(b), sort_keys=True)
    s = a.slices[1]
    assert replace(s, spec=s.with_generation(7)).content == s.content
    assert pool(topology, levels=("book",)).content() != a.content()


def test_many_devices_split_into_slices() -> None:
    # 3 drawers x 12 books x 2 sockets: 36 books + 72 sockets = 108 devices -> two device slices.
    shape = LparShape(name="big", machine_type="3931", drawers=tuple(tuple((2, 2) for _ in range(12))
                                                                     for _ in range(3)))
    plan = pool(build_topology(shape))
    check_limits(plan)
    assert len(plan.devices) == 108
    assert [len(s.spec.get("devices", [])) for s in plan.slices] == [0, 64, 44]


def test_many_drawers_split_counter_slices_and_large_drawers_split_sets() -> None:
    # 10 drawers (more than 8 counter sets) and, in drawer 0, 20 books of 2 sockets (40 > 32 counters).
    layout = (tuple((1, 1) for _ in range(20)), *tuple(((1, 1),) for _ in range(9)))
    plan = pool(build_topology(LparShape(name="wide", machine_type="3931", drawers=layout)), min_group_cores=0)
    check_limits(plan)
    assert list(plan.counters)[:2] == ["drawer0", "drawer0-1"]
    assert len(plan.counters["drawer0"]) == 32 and len(plan.counters["drawer0-1"]) == 8
    assert sum(1 for s in plan.slices if "sharedCounters" in s.spec) == 2
    # A book never straddles two sets: every device consumes from one set.
    assert all(len(d["consumesCounters"]) == 1 for d in plan.devices)


def test_drawer_spanning_three_sets_is_left_out() -> None:
    layout = (tuple((1, 1) for _ in range(40)),)
    plan = pool(build_topology(LparShape(name="huge", machine_type="3931", drawers=layout)),
                levels=("drawer", "book"), min_group_cores=0)
    check_limits(plan)
    assert "drawer0" not in devices(plan)
    assert plan.left_out and "3 counter sets" in plan.left_out[0]


def test_broken_groups_are_tainted() -> None:
    topology = load_embedded("pr40714")
    grouping = group_topology(topology, GroupingSettings(levels=("book", "socket")))
    plan = build_pool(grouping, topology, SliceSettings("node-a"),
                      broken={("topology/book", "drawer0-book0"): "cpus 3 offline"})
    check_limits(plan)
    by_name = devices(plan)
    assert by_name["drawer0-book0"]["taints"] == [{"key": TAINT_KEY, "value": "not-whole", "effect": "NoSchedule"}]
    assert "taints" not in by_name["drawer0-book1"]


def test_mixed_polarization_and_no_machine_type() -> None:
    topology = load_embedded("z16-vertical")
    plan = pool(topology)
    check_limits(plan)
    pols = {d["attributes"]["polarization"]["string"] for d in plan.devices}
    assert pols <= {"horizontal", "vertical:high", "vertical:medium", "vertical:low", "unknown", "mixed"}


def test_bad_node_name() -> None:
    with pytest.raises(PolicyError, match="not a DNS subdomain"):
        SliceSettings("Node_A").validated()
    with pytest.raises(PolicyError):
        SliceSettings("n", driver="nodot").validated()


def test_level_of_device() -> None:
    assert level_of_device("drawer0-book1-socket2") == "socket"
    assert level_of_device("drawer0-book1") == "book"
    assert level_of_device("drawer3") == "drawer"
    assert level_of_device("gpu-0") is None


def test_deviceclass_validates() -> None:
    cls = deviceclass("book", extended_resource="topology/book")
    kubernetes_validate.validate(cls, "1.37", strict=True)
    assert cls["metadata"]["name"] == "book.topology.s390x.ibm.com"
    assert cls["spec"]["extendedResourceName"] == "topology/book"


def test_discover_mode_dra(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--topology-file", "embedded:pr40714", "--levels", "book,socket", "--mode", "dra"]) == 0
    out = capsys.readouterr().out
    assert "DRA mode would publish (driver topology.s390x.ibm.com" in out
    assert "counter set drawer0: book0-socket0=6, book0-socket1=6, book1-socket0=6, book1-socket1=6" in out
    assert "device drawer0-book1: book, 12 cores, 24 cpus, consumes drawer0: book1-socket0,book1-socket1" in out
    assert main(["discover", "--topology-file", "embedded:pr40714", "--mode", "dra", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    slices = doc["dra"]["resourceSlices"]
    assert [s["kind"] for s in slices] == ["ResourceSlice", "ResourceSlice"]


def test_explain_mode_dra(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--topology-file", "embedded:pr40714", "--mode", "dra"]) == 0
    assert "DRA mode would publish" in capsys.readouterr().out


def test_discover_default_mode_has_no_dra_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--topology-file", "embedded:pr40714"]) == 0
    assert "DRA mode" not in capsys.readouterr().out
