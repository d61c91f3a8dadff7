"""Door: DRA objects from the API server. ResourceClaims (written by users, allocated by the scheduler) mutated
field by field; the node's ResourceSlices and the chart's DeviceClasses as a round trip: every topology and level
the agent publishes, for any node name, and each DeviceClass's CEL selector over every published device; the
slices the API server hands back (another writer's, an old agent's) against the publisher's plan. Right answer:
an unchanged claim prepares its devices, a selector matches exactly its level's devices, slices as written are in
sync. Refusal: PrepareError / PolicyError, one line. Never another exception.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from hypothesis import strategies as st

from agent.dra.prepare import PreparedClaim, PrepareError, plan_claim
from agent.dra.publisher import SlicePublisher
from agent.errors import PolicyError
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.resource_slices import DRIVER, SliceSettings, build_pool, deviceclass, level_of_device
from agent.topology.embedded import load_embedded
from tests.fuzz.common import door, refused
from tests.fuzz.mutate import mangled_text, mutated_json

TOPOLOGIES = ("z16-lpar", "z16-guest-no-topology", "z14-lpar", "z16-vertical", "pr40714", "z17-lpar")
LEVELS = (("book",), ("socket",), ("drawer",), ("book", "socket"), ("drawer", "book", "socket"))
SETTINGS = GroupingSettings(levels=("book", "socket"))
GROUPING = group_topology(load_embedded("z16-lpar"), SETTINGS)
GROUPS = {g.id: g for g in GROUPING.groups}


def claim(ids: list[str]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": "c", "uid": "0f1e2d3c-uid"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": f"book.{DRIVER}"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r" if n % 2 == 0 else "s", "driver": DRIVER, "pool": "node-a", "device": i}
                for n, i in enumerate(ids)]}}}}


@door("resource-claim", "dra", st.lists(st.sampled_from(sorted(GROUPS)), min_size=1, max_size=4, unique=True),
      st.data())
def resource_claim(ids: list[str], data: st.DataObject) -> None:
    original = claim(ids)
    doc = data.draw(mutated_json(original, 4))
    if not isinstance(doc, dict):
        doc = {"spec": doc}
    answer = refused(partial(plan_claim, doc, driver=DRIVER, pool="node-a", groups=GROUPS,
                             allocation=AllocationSettings()), PrepareError, AttributeError, TypeError)
    if doc == original:
        assert isinstance(answer, tuple), answer
        assert [d.device for d in answer[0]] == ids
    if isinstance(answer, (AttributeError, TypeError)):
        raise answer  # a claim the API server would store must be prepared or refused, not crash the call
    if isinstance(answer, tuple):
        devices, files = answer
        assert {d.device for d in devices} <= set(GROUPS)
        prepared = PreparedClaim("u", "ns", "c", devices, files)
        assert PreparedClaim.from_json(json.loads(json.dumps(prepared.to_json()))) == prepared


def cel_matches(expression: str, device: dict[str, Any]) -> bool:
    attrs = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
    env = celpy.Environment()
    return bool(env.program(env.compile(expression)).evaluate(
        {"device": json_to_cel({"driver": DRIVER, "attributes": {DRIVER: attrs}})}))


node_names = st.sampled_from(["node-a", "n", "a" * 63, "a" * 253, "node.example.com"]) | st.text(max_size=70)


@door("slices-round-trip", "dra", st.sampled_from(TOPOLOGIES), st.sampled_from(LEVELS), node_names, st.data())
def slices_round_trip(name: str, levels: tuple[str, ...], node: str, data: st.DataObject) -> None:
    topology = load_embedded(name)
    grouping = refused(partial(group_topology, topology, GroupingSettings(levels=levels)), PolicyError)
    if isinstance(grouping, BaseException):
        return
    settings = refused(SliceSettings(node).validated, PolicyError)
    if isinstance(settings, BaseException):
        return
    plan = build_pool(grouping, topology, settings)
    assert all(len(s.name) <= 253 for s in plan.slices)
    devices = plan.devices
    assert len({d["name"] for d in devices}) == len(devices)
    for device in devices:
        assert level_of_device(device["name"]) in levels
    if devices and data.draw(st.integers(0, 3)) == 0:  # CEL is slow: a quarter of the inputs
        for level in levels:
            expression = deviceclass(level)["spec"]["selectors"][0]["cel"]["expression"]
            device = data.draw(st.sampled_from(devices))
            assert cel_matches(expression, device) == (level_of_device(device["name"]) == level)
    publisher = SlicePublisher(None, node, DRIVER)  # type: ignore[arg-type]
    publisher._node_uid = "uid"
    written = {s.name: {**publisher.object(s, 3), "metadata": {**publisher.object(s, 3)["metadata"],
                                                                 "resourceVersion": "1"}} for s in plan.slices}
    assert SlicePublisher.in_sync(plan, written)
    back = data.draw(mutated_json(written, 3))
    if isinstance(back, dict) and all(isinstance(o, dict) for o in back.values()):
        refused(partial(SlicePublisher.in_sync, plan, back), KeyError, TypeError, ValueError, AttributeError)


@door("claim-text", "dra", st.data())
def claim_text(data: st.DataObject) -> None:
    """A claim as the bytes the API client decodes: JSON or a clear error, never a crash past the decoder."""
    text = data.draw(mangled_text(json.dumps(claim(sorted(GROUPS)[:2]))))
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return
    if isinstance(doc, dict):
        refused(partial(plan_claim, doc, driver=DRIVER, pool="node-a", groups=GROUPS,
                        allocation=AllocationSettings()), PrepareError)
