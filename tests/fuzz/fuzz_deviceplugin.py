"""Door: kubelet's gRPC calls to the device plugin, as a buggy or hostile kubelet may send them. Allocate and
GetPreferredAllocation with ids never offered, duplicates, empty ids and lists, huge lists, sizes out of range,
several container requests, in any order against the real servicer and device table (z16, book and socket).
Right answer: an Allocate names only offered ids, once each, and records them held; a preference is ``size`` ids of
``available`` with every must-include id. Refusal: INVALID_ARGUMENT or FAILED_PRECONDITION with one bounded line,
and nothing recorded (the held set unchanged). Never another exception.
"""

from __future__ import annotations

import threading
from typing import Any, NoReturn

import grpc
from hypothesis import strategies as st

from agent._proto.deviceplugin.v1beta1 import api_pb2
from agent.devices.table import NodeDevices
from agent.plugin.servicer import MAX_DETAILS, DevicePluginServicer
from agent.plugin.servicer import render as render_wire
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.embedded import load_embedded
from tests.fuzz.common import door

SETTINGS = GroupingSettings(levels=("book", "socket"))
GROUPING = group_topology(load_embedded("z16-lpar"), SETTINGS)
RESOURCES = GROUPING.resources()
IDS = {r: [g.id for g in GROUPING.by_resource(r)] for r in RESOURCES}


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Context:
    """The part of grpc.ServicerContext the servicer uses."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Aborted(code, details)

    def add_callback(self, callback: Any) -> bool:
        return True


def id_lists(resource: str) -> st.SearchStrategy[list[str]]:
    offered = st.sampled_from(IDS[resource])
    other = st.sampled_from([i for r in RESOURCES if r != resource for i in IDS[r]])
    odd = st.text(max_size=30) | st.sampled_from(["", " ", "drawer0-book0\n", "drawer9-book9", "\x00"])
    one = offered | offered | other | odd
    return st.lists(one, max_size=6) | st.lists(offered, min_size=1, max_size=3).map(lambda ids: ids * 3000)


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, str, Any]:
    resource = draw(st.sampled_from(RESOURCES))
    if draw(st.booleans()):
        request = api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=draw(id_lists(resource)))
            for _ in range(draw(st.integers(0, 3)))])
        return "Allocate", resource, request
    containers = []
    for _ in range(draw(st.integers(0, 2))):
        containers.append(api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=draw(id_lists(resource)), must_include_deviceIDs=draw(id_lists(resource)),
            allocation_size=draw(st.integers(-3, 40) | st.sampled_from([2**31 - 1, -(2**31)]))))
    return "GetPreferredAllocation", resource, api_pb2.PreferredAllocationRequest(container_requests=containers)


@door("allocate", "deviceplugin", st.lists(calls(), min_size=1, max_size=8))
def allocate(sequence: list[tuple[str, str, Any]]) -> None:
    devices = NodeDevices(GROUPING, SETTINGS, AllocationSettings(), render_wire)
    servicers = {t.resource: DevicePluginServicer(t, threading.Event()) for t in devices.tables}
    for method, resource, request in sequence:
        before = devices.held_keys()
        try:
            answer = getattr(servicers[resource], method)(request, Context())
        except Aborted as exc:
            assert exc.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), exc.code
            assert exc.details and "\n" not in exc.details and len(exc.details) <= MAX_DETAILS, exc.details[:300]
            assert devices.held_keys() == before, "a refused call changed what is held"
            continue
        if method == "Allocate":
            response = api_pb2.AllocateResponse.FromString(answer)
            assert len(response.container_responses) == len(request.container_requests)
            for c in request.container_requests:
                assert len(set(c.devices_ids)) == len(c.devices_ids) and set(c.devices_ids) <= set(IDS[resource])
                assert {(resource, i) for i in c.devices_ids} <= devices.held_keys()
        else:
            for c, r in zip(request.container_requests, answer.container_responses, strict=True):
                chosen = list(r.deviceIDs)
                assert len(chosen) == c.allocation_size and len(set(chosen)) == len(chosen)
                assert set(c.must_include_deviceIDs) <= set(chosen)
                assert set(chosen) <= set(c.available_deviceIDs) | set(c.must_include_deviceIDs)
                assert set(chosen) <= set(IDS[resource])
