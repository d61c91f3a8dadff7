"""ResourceSlice publication (agent/dra/publisher.py) against an in-memory API server with resourceVersions."""

from __future__ import annotations

import pytest

from agent.dra.publisher import SlicePublisher
from agent.errors import KubeApiError
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.resource_slices import CONTENT_ANNOTATION, PoolPlan, SliceSettings, build_pool
from agent.topology.embedded import load_embedded
from tests.support.kubeapi import SliceApi


def plan(name: str = "z16-lpar", levels: tuple[str, ...] = ("book", "socket"), node: str = "node-a") -> PoolPlan:
    topology = load_embedded(name)
    return build_pool(group_topology(topology, GroupingSettings(levels=levels)), topology, SliceSettings(node))


def test_first_publish_then_no_writes() -> None:
    api = SliceApi()
    pub = SlicePublisher(api, "node-a", "topology.s390x.ibm.com")
    first = pub.publish(plan())
    assert (first.generation, first.created, first.replaced, first.deleted) == (1, 2, 0, 0)
    obj = api.slices["node-a-topology-devices-0"]
    assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "node-a",
                                                   "uid": "uid-node-a", "controller": True}]
    assert obj["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 2}
    assert obj["metadata"]["annotations"][CONTENT_ANNOTATION] == plan().slices[1].content
    before = api.writes()
    # A restarted agent (a new publisher) and a periodic look: one List each, no write.
    for publisher in (pub, SlicePublisher(api, "node-a", "topology.s390x.ibm.com")):
        result = publisher.publish(plan())
        assert result.writes == 0 and result.generation == 1
    assert api.writes() == before


def test_change_bumps_generation_and_deletes_stale() -> None:
    api = SliceApi()
    pub = SlicePublisher(api, "node-a", "topology.s390x.ibm.com")
    pub.publish(plan(levels=("book", "socket")))
    api.slices["node-a-topology-devices-7"] = api._bump({  # a stale slice from some older layout
        "metadata": {"name": "node-a-topology-devices-7"},
        "spec": {"nodeName": "node-a", "driver": "topology.s390x.ibm.com",
                 "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 3}, "devices": []}})
    result = pub.publish(plan(levels=("book",)))
    assert (result.generation, result.replaced, result.deleted) == (2, 2, 1)
    assert sorted(api.slices) == ["node-a-topology-counters-0", "node-a-topology-devices-0"]
    assert {o["spec"]["pool"]["generation"] for o in api.slices.values()} == {2}
    names = {d["name"] for d in api.slices["node-a-topology-devices-0"]["spec"]["devices"]}
    assert all("socket" not in n for n in names)


def test_other_nodes_slices_untouched() -> None:
    api = SliceApi()
    SlicePublisher(api, "node-b", "topology.s390x.ibm.com").publish(plan(node="node-b"))
    SlicePublisher(api, "node-a", "topology.s390x.ibm.com").publish(plan(node="node-a"))
    assert len(api.slices) == 4
    assert SlicePublisher(api, "node-a", "topology.s390x.ibm.com").remove_all() == 2
    assert sorted(api.slices) == ["node-b-topology-counters-0", "node-b-topology-devices-0"]


def test_conflict_is_retried_from_a_fresh_list() -> None:
    api = SliceApi()
    pub = SlicePublisher(api, "node-a", "topology.s390x.ibm.com", sleep=lambda s: None)
    pub.publish(plan(levels=("book", "socket")))
    api.conflicts = 1
    result = pub.publish(plan(levels=("book",)))
    assert result.attempts == 2
    assert {o["spec"]["pool"]["generation"] for o in api.slices.values()} == {2}
    assert pub.publish(plan(levels=("book",))).writes == 0


def test_persistent_conflict_gives_up() -> None:
    api = SliceApi()
    pub = SlicePublisher(api, "node-a", "topology.s390x.ibm.com", sleep=lambda s: None)
    pub.publish(plan(levels=("book", "socket")))
    api.conflicts = 100
    with pytest.raises(KubeApiError) as info:
        pub.publish(plan(levels=("book",)))
    assert info.value.conflict


def test_wiped_slices_are_restored() -> None:
    """kubelet deletes a driver's slices at its start and after a deregistration: the next step restores them."""
    api = SliceApi()
    pub = SlicePublisher(api, "node-a", "topology.s390x.ibm.com")
    pub.publish(plan())
    api.slices.clear()
    result = pub.publish(plan())
    assert result.created == 2 and result.generation == 1


def test_a_node_without_groups_is_in_sync_with_no_slices_and_writes_nothing_again() -> None:
    api = SliceApi()
    pub = SlicePublisher(api, "node-a", "topology.s390x.ibm.com")
    empty = plan("z16-guest-no-topology", levels=("book",))
    assert empty.slices == () and SlicePublisher.in_sync(empty, {})
    assert (pub.publish(empty).generation, pub.publish(empty).writes) == (0, 0)
