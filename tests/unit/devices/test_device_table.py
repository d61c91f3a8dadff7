"""The device table driven directly: no sockets, no threads, an injected clock."""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import grpc
import pytest

from agent._proto.deviceplugin.v1beta1 import api_pb2
from agent.devices.table import MAX_ANSWERS, NodeDevices
from agent.errors import Refusal
from agent.observe.metrics import AgentMetrics
from agent.plugin.servicer import DevicePluginServicer, Wire, render
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.ledger import ListedDevice
from agent.topology.embedded import load_embedded
from tests.support.env import BOOK, REPO, SOCKET
from topology_devkit.testing.wait import poll_until

SETTINGS = GroupingSettings(levels=("book", "socket"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingLock:
    """The node's lock, counting how often it is taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.taken += 1

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._lock.release()


def node(clock: Clock | None = None, topology: str = "z16-lpar") -> NodeDevices[Wire]:
    grouping = group_topology(load_embedded(topology), SETTINGS)
    return NodeDevices(grouping, SETTINGS, AllocationSettings(), render, clock=clock or Clock())


def states(devices: NodeDevices[Wire]) -> dict[str, str]:
    return {f"{r}|{d}": s.state for (r, d), s in devices.states().items() if s.state != "healthy"}


def test_admit_records_the_holder_at_the_clocks_time_and_blocks_the_overlapping_devices() -> None:
    clock = Clock()
    devices = node(clock)
    (answer,) = devices.table(BOOK).admit([["drawer0-book0"]])
    assert answer.plan.groups == ("drawer0-book0",)
    wire = api_pb2.AllocateResponse.FromString(answer.wire)  # the serialized container_responses entry
    assert wire.container_responses[0].envs["TOPOLOGY_CPUS"] == "0-11"
    assert devices.ledger.pending == {(BOOK, "drawer0-book0"): 1000.0}
    assert states(devices) == {f"{BOOK}|drawer0-book0": "allocated", f"{SOCKET}|drawer0-book0-socket0":
                               "blocked-by-overlap", f"{SOCKET}|drawer0-book0-socket1": "blocked-by-overlap"}
    with pytest.raises(Refusal) as refused:
        devices.table(SOCKET).admit([["drawer0-book0-socket1"]])
    assert refused.value.kind == "conflict" and "held by" in refused.value.message
    clock.now += 3600  # an hour without a word from pod-resources: still held, still refused
    with pytest.raises(Refusal):
        devices.table(SOCKET).admit([["drawer0-book0-socket1"]])
    assert not devices.exclusivity_confirmed()
    devices.apply_list([], started=clock.now)  # pod-resources answers: kubelet never admitted it
    assert states(devices) == {} and devices.exclusivity_confirmed()
    assert devices.table(SOCKET).admit([["drawer0-book0-socket1"]])


def test_a_refused_allocate_holds_nothing_even_with_a_valid_container_request() -> None:
    devices = node()
    with pytest.raises(Refusal) as refused:
        devices.table(BOOK).admit([["drawer0-book0"], ["drawer9-book9"]])
    assert refused.value.kind == "invalid" and "drawer9-book9" in refused.value.message
    assert devices.ledger.held() == {} and states(devices) == {}


def test_listed_holders_replace_pending_ones() -> None:
    clock = Clock()
    devices = node(clock)
    devices.table(BOOK).admit([["drawer0-book0"]])
    clock.now += 3
    devices.apply_list([ListedDevice("ml", "llm", "vllm", BOOK, ("drawer0-book0",))], started=clock.now - 0.1)
    assert devices.holders() == {(BOOK, "drawer0-book0"): ["ml/llm/vllm"]} and not devices.ledger.pending


def test_refusals_echo_a_bounded_number_of_ids() -> None:
    devices = node()
    with pytest.raises(Refusal) as refused:
        devices.table(BOOK).admit([[f"bogus-{i}" * 20 for i in range(10_000)]])
    assert len(refused.value.message) < 2000 and "more" in refused.value.message


def test_the_answer_cache_is_bounded() -> None:
    devices = node(topology="z16-400")
    table = devices.table(BOOK)
    ids = list(table.groups)
    requests = list(itertools.islice(itertools.permutations(ids, 3), MAX_ANSWERS + 100))
    for request in requests:
        table._answer(list(request))
    assert len(requests) > MAX_ANSWERS and len(table._answers) == MAX_ANSWERS
    assert tuple(requests[-1]) in table._answers and tuple(requests[0]) not in table._answers  # oldest evicted


def counting_node(topology: str = "z16-400") -> tuple[NodeDevices[Wire], list[tuple[str, ...]]]:
    rendered: list[tuple[str, ...]] = []

    def counting_render(plan: Any) -> Wire:
        rendered.append(plan.groups)
        return render(plan)

    grouping = group_topology(load_embedded(topology), SETTINGS)
    return NodeDevices(grouping, SETTINGS, AllocationSettings(), counting_render, clock=Clock()), rendered


def test_a_set_in_another_order_reuses_its_answer() -> None:
    devices, rendered = counting_node()
    table = devices.table(BOOK)
    ids = sorted(table.groups)[:3]
    answers = [table.admit([list(order)])[0] for order in itertools.permutations(ids)]
    assert len(rendered) == 1  # planned and rendered once, for six orders kubelet may send
    assert all(a is answers[0] for a in answers)
    assert answers[0].plan.groups == tuple(ids)  # topology order, whatever the request's


def test_the_set_get_preferred_allocation_chose_is_allocated_without_planning() -> None:
    devices, rendered = counting_node()
    table = devices.table(BOOK)
    chosen = table.preferred(sorted(table.groups), [], 4)
    assert rendered == [tuple(chosen)]  # planned and rendered while kubelet waited for the preference
    answer = table.admit([list(reversed(chosen))])[0]  # kubelet sends the set in its own order
    assert rendered == [tuple(chosen)] and answer.plan.groups == tuple(chosen)


def test_one_group_answers_are_ready_once_the_publisher_runs() -> None:
    devices, rendered = counting_node()
    devices.start_publisher()
    try:
        poll_until(lambda: len(rendered) >= sum(len(t.groups) for t in devices.tables), 10)
    finally:
        devices.stop_publisher()
    assert sorted(rendered) == sorted((g,) for t in devices.tables for g in t.groups)
    table = devices.table(BOOK)
    table.admit([[next(iter(table.groups))]])
    assert len(rendered) == sum(len(t.groups) for t in devices.tables)  # the Allocate rendered nothing


# --- a warm Allocate, as kubelet sends it, traced -------------------------------------------------

class Context:
    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def project_files_called(call: Any) -> set[str]:
    """Which of the project's files run code while ``call()`` runs."""
    agent_dir = str(REPO / "agent")
    files: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(agent_dir):
            files.add(str(Path(frame.f_code.co_filename).relative_to(REPO)))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return files


@pytest.fixture
def traced() -> Iterator[tuple[NodeDevices[Wire], DevicePluginServicer, CountingLock]]:
    devices = node()
    lock = CountingLock()
    devices.lock = lock  # type: ignore[assignment]
    servicer = DevicePluginServicer(devices.table(BOOK), threading.Event(), AgentMetrics())
    yield devices, servicer, lock


def test_a_warm_allocate_touches_four_files_and_takes_the_node_lock_once(
        traced: tuple[NodeDevices[Wire], DevicePluginServicer, CountingLock]) -> None:
    _, servicer, lock = traced
    request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(
        devices_ids=["drawer0-book1", "drawer0-book2"])])
    servicer.Allocate(request, Context())  # cold: validates, plans and renders once
    lock.taken = 0
    answers: list[bytes] = []
    files = project_files_called(lambda: answers.append(servicer.Allocate(request, Context())))
    answer = api_pb2.AllocateResponse.FromString(answers[0])  # Allocate answers ready bytes
    assert answer.container_responses[0].envs["TOPOLOGY_GROUPS"] == "drawer0-book1,drawer0-book2"
    assert files <= {"agent/plugin/servicer.py", "agent/devices/table.py", "agent/policy/ledger.py",
                     "agent/observe/metrics.py"}, files  # at most these four
    assert lock.taken == 1


def test_the_preference_never_offers_a_device_the_agent_would_refuse() -> None:
    # kubelet's health view lags behind a book just allocated: its available list still has the book's sockets.
    devices = node()
    devices.table(BOOK).admit([["drawer0-book0"]])
    sockets = devices.table(SOCKET)
    inside = {"drawer0-book0-socket0", "drawer0-book0-socket1"}
    for size in range(1, len(sockets.groups) - len(inside) + 1):
        chosen = sockets.preferred(sorted(sockets.groups), [], size)
        assert len(chosen) == size and not inside & set(chosen), size
        sockets.admit([chosen])  # the Allocate that follows is not refused
        devices.ledger.pending.clear()
        devices.ledger.apply_list([ListedDevice("ml", "book", "c", BOOK, ("drawer0-book0",))], 0.0, 0.0)
    # Only when the request cannot be met without them does kubelet get them (and the refusal).
    assert inside <= set(sockets.preferred(sorted(sockets.groups), [], len(sockets.groups)))


def test_a_socket_request_leaves_the_most_whole_books_free() -> None:
    devices = node()
    devices.table(SOCKET).admit([["drawer0-book1-socket0"]])
    sockets = devices.table(SOCKET)
    available = sorted(set(sockets.groups) - {"drawer0-book1-socket0"})
    assert sockets.preferred(available, [], 1) == ["drawer0-book1-socket1"]
    # A book request likewise takes a book of a drawer already in use before one of a whole drawer.
    devices = node()
    books = devices.table(BOOK)
    books.admit([["drawer1-book4"]])
    assert books.preferred(sorted(set(books.groups) - {"drawer1-book4"}), [], 1) == ["drawer1-book5"]


def test_allocate_of_a_group_whose_cpus_went_offline_is_refused() -> None:
    import dataclasses

    from agent.topology.model import Topology
    base = load_embedded("z16-lpar")
    devices = node()
    devices.apply_topology(Topology(machine=base.machine, cpus=tuple(
        dataclasses.replace(c, online=c.cpu != 13) for c in base.cpus)))  # cpu 13: drawer0-book1(-socket0)
    with pytest.raises(Refusal) as refused:
        devices.table(BOOK).admit([["drawer0-book1"]])  # kubelet acting on a snapshot from before the rescan
    assert refused.value.kind == "unhealthy" and "offline" in refused.value.message
    assert devices.held_keys() == frozenset()  # nothing recorded
    devices.table(BOOK).admit([["drawer0-book0"]])  # whole groups are still handed out
    devices.apply_topology(base)
    devices.table(BOOK).admit([["drawer0-book2"]])
