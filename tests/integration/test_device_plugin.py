"""The device plugin against the kubelet emulator, over real gRPC on real Unix sockets."""

from __future__ import annotations

import functools
import socket
import threading

import grpc
import pytest

from agent._proto.deviceplugin.v1beta1 import api_pb2
from agent.app.build import build_agent
from agent.app.config import AgentConfig
from agent.devices.table import UNHEALTHY
from agent.errors import SocketInUseError
from agent.policy.allocation import plan_allocation
from agent.topology.embedded import load_embedded
from tests.support.env import BOOK, SOCKET
from tests.support.harness import FAST, running_node, short_tmpdir
from topology_devkit.kubelet_emulator import AdmissionError, Container, KubeletEmulator


def test_registers_and_advertises_every_group() -> None:
    with running_node() as node:
        k = node.kubelet
        assert k.devices(BOOK) == {g.id: "Healthy" for g in node.agent.grouping.by_resource(BOOK)}
        assert k.allocatable(BOOK) == 8 and k.allocatable(SOCKET) == 16
        assert k.registrations(BOOK) == 1 and k.registrations(SOCKET) == 1
        options = k.options(BOOK)
        assert options is not None and options.get_preferred_allocation_available and not options.pre_start_required
        methods = [c.method for c in k.calls if c.resource == BOOK]
        assert methods[:2] == ["GetDevicePluginOptions", "ListAndWatch"]


def test_pods_get_their_books_and_restarts_replay_the_same_environment() -> None:
    with running_node() as node:
        k = node.kubelet
        one = k.admit_pod("default", "tp1", [Container("vllm", {BOOK: 1})])
        two = k.admit_pod("default", "tp2", [Container("vllm", {BOOK: 2})])
        table = node.agent.grouping.by_id(BOOK)
        for pod, n in ((one, 1), (two, 2)):
            ids = pod.devices("vllm", BOOK)
            assert len(ids) == n
            env = k.start_container("default", pod.name, "vllm")
            expected = plan_allocation([table[i] for i in ids]).envs
            assert {key: env[key] for key in expected} == dict(expected)
        assert not set(one.devices("vllm", BOOK)) & set(two.devices("vllm", BOOK))
        # The two books of the tensor-parallel pod come from one drawer.
        assert len({i.split("-")[0] for i in two.devices("vllm", BOOK)}) == 1
        allocates = sum(1 for c in k.calls if c.method == "Allocate")
        again = k.start_container("default", "tp2", "vllm")
        assert again == k.start_container("default", "tp2", "vllm")
        assert sum(1 for c in k.calls if c.method == "Allocate") == allocates  # replayed from kubelet's cache
        wanted = ("GetPreferredAllocation", "Allocate")
        methods = [c.method for c in k.calls if c.resource == BOOK and c.method in wanted]
        assert methods == ["GetPreferredAllocation", "Allocate"] * 2


def test_more_books_than_exist_is_refused_by_kubelet() -> None:
    with running_node() as node, pytest.raises(AdmissionError, match="unavailable"):
        node.kubelet.admit_pod("default", "big", [Container("c", {BOOK: 9})])


@pytest.mark.parametrize(
    ("ids", "words"),
    [
        (["drawer9-book9"], ["unknown", "drawer9-book9"]),
        (["drawer0-book0", "drawer0-book0"], ["duplicate", "drawer0-book0"]),
        ([], ["no device ids"]),
    ],
)
def test_bad_ids_get_invalid_argument_and_the_plugin_keeps_serving(ids: list[str], words: list[str]) -> None:
    with running_node(levels=("book",)) as node:
        with pytest.raises(grpc.RpcError) as err:
            node.allocate(BOOK, ids)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert all(w in err.value.details() for w in words)
        ok = node.allocate(BOOK, ["drawer0-book0"])
        assert ok.container_responses[0].envs["TOPOLOGY_CPUS"] == "0-11"


def test_preferred_allocation_over_the_wire() -> None:
    with running_node(levels=("book",)) as node:
        channel, stub = node.plugin_stub(BOOK)
        with channel:
            request = api_pb2.PreferredAllocationRequest(container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["drawer0-book0", "drawer1-book4", "drawer1-book6", "drawer1-book7"],
                    must_include_deviceIDs=["drawer1-book7"], allocation_size=2)])
            answer = stub.GetPreferredAllocation(request, timeout=5)
            assert list(answer.container_responses[0].deviceIDs) == ["drawer1-book7", "drawer1-book4"]
            bad = api_pb2.PreferredAllocationRequest(container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["drawer0-book0"],
                                                            allocation_size=3)])
            with pytest.raises(grpc.RpcError) as err:
                stub.GetPreferredAllocation(bad, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_list_and_watch_streams_are_full_snapshots_and_end_cleanly() -> None:
    with running_node(levels=("book",)) as node:
        devices = node.agent.devices.table(BOOK)
        servicer = node.agent.manager.servers[BOOK].servicer  # type: ignore[attr-defined]
        channel, stub = node.plugin_stub(BOOK)
        with channel:
            first = stub.ListAndWatch(api_pb2.Empty())
            second = stub.ListAndWatch(api_pb2.Empty())
            a, b = next(first), next(second)
            assert [d.ID for d in a.devices] == [d.ID for d in b.devices] == list(devices.groups)
            assert all(d.health == "Healthy" and not d.topology.nodes for d in a.devices)
            node.kubelet.wait_for(lambda: servicer.streams.open == 3, what="three streams (kubelet's and ours)")
            devices.publish({"drawer0-book1": UNHEALTHY})
            for stream in (first, second):
                update = next(stream)
                health = {d.ID: d.health for d in update.devices}
                assert len(health) == 8 and health["drawer0-book1"] == "Unhealthy"
            node.kubelet.wait_for(lambda: node.kubelet.devices(BOOK).get("drawer0-book1") == "Unhealthy")
            assert node.kubelet.allocatable(BOOK) == 7 and node.kubelet.capacity(BOOK) == 8
            first.cancel()
            node.kubelet.wait_for(lambda: servicer.streams.open == 2, what="cancelled stream ended")
            devices.publish({"drawer0-book1": "Healthy"})
            assert {d.ID: d.health for d in next(second).devices}["drawer0-book1"] == "Healthy"
            second.cancel()
            node.kubelet.wait_for(lambda: servicer.streams.open == 1, what="second stream ended")


def test_twenty_kubelet_restarts_in_a_row_lose_nothing() -> None:
    with running_node() as node:
        k = node.kubelet
        pod = k.admit_pod("default", "keep", [Container("c", {BOOK: 1})])
        (book,) = pod.devices("c", BOOK)
        k.wait_for(lambda: k.devices(SOCKET).get(f"{book}-socket0") == "Unhealthy", what="its sockets blocked")
        before = {r: k.devices(r) for r in (BOOK, SOCKET)}
        for i in range(20):
            k.restart(down_for=0.05 if i % 2 else 0.0)
            for resource in (BOOK, SOCKET):
                k.wait_for(functools.partial(registered_times, k, resource, i + 2),
                           timeout=5, what=f"re-registration {i + 1} of {resource}")
            assert {r: k.devices(r) for r in (BOOK, SOCKET)} == before
        assert node.agent.manager.restarts >= 20
        assert k.pod("default", "keep").devices("c", BOOK) == pod.devices("c", BOOK)
        # Allocation still works after the last restart.
        k.admit_pod("default", "after", [Container("c", {BOOK: 1})])


def test_kubelet_socket_appearing_late_is_waited_for() -> None:
    with running_node(start_kubelet=False, levels=("book",)) as node:
        assert not node.agent.manager.registered.is_set()  # type: ignore[attr-defined]
        node.kubelet.start()
        node.kubelet.wait_registered(BOOK, timeout=5)
        assert node.agent.manager.wait_registered(5)


def test_a_second_instance_does_not_steal_the_sockets() -> None:
    with running_node(levels=("book",)) as node:
        second = build_agent(load_embedded("z16-lpar"), AgentConfig(kubelet_dir=node.kubelet.device_plugin_dir,
                                                               timing=FAST))
        with pytest.raises(SocketInUseError, match="another running process"):
            second.manager.start()
        assert node.kubelet.registrations(BOOK) == 1
        assert node.allocate(BOOK, ["drawer0-book0"]).container_responses


def test_a_stale_socket_of_a_dead_instance_is_replaced(tmp_path_factory: pytest.TempPathFactory) -> None:
    with running_node(levels=("book",), start_kubelet=False) as node:
        path = node.agent.manager.servers[BOOK].path  # type: ignore[attr-defined]
        node.agent.manager.stop()  # leaves nothing behind...
        assert not path.exists()
        import socket

        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))  # ...so make a dead socket file like a killed process leaves
        s.close()
        again = build_agent(load_embedded("z16-lpar"), AgentConfig(kubelet_dir=node.kubelet.device_plugin_dir,
                                                              timing=FAST))
        again.manager.start()
        try:
            node.kubelet.start()
            node.kubelet.wait_registered(BOOK)
        finally:
            again.manager.stop()


def test_allocate_answers_while_pod_resources_hangs() -> None:
    # A pod-resources socket that accepts and never answers: the agent's List calls hang or fail.
    # Allocate must not wait for them (kubelet has no timeout on Allocate).
    hole_dir = short_tmpdir()
    hole = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hole.bind(str(hole_dir / "kubelet.sock"))
    hole.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def swallow() -> None:
        hole.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(hole.accept()[0])
            except TimeoutError:
                continue

    t = threading.Thread(target=swallow)
    t.start()
    try:
        with running_node(levels=("book",), pod_resources_socket=hole_dir / "kubelet.sock",
                          pod_resources_interval=0.05) as node:
            node.kubelet.wait_for(lambda: bool(accepted), what="a List call is in flight")
            channel, stub = node.plugin_stub(BOOK)
            with channel:
                for _ in range(20):
                    request = api_pb2.AllocateRequest(container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=["drawer0-book0"])])
                    answer = stub.Allocate(request, timeout=2)  # a hang would be DEADLINE_EXCEEDED
                    assert answer.container_responses[0].envs["TOPOLOGY_GROUPS"] == "drawer0-book0"
            assert not node.agent.devices.ledger.synced  # pod-resources never answered meanwhile
    finally:
        stop.set()
        t.join()
        for conn in accepted:
            conn.close()
        hole.close()


def test_a_broken_stream_without_a_new_one_leads_to_registering_again() -> None:
    with running_node(levels=("book",)) as node:
        k = node.kubelet
        k.break_stream(BOOK)  # kubelet never reconnects: allocatable drops to 0 until a new Register
        k.wait_for(lambda: k.allocatable(BOOK) == 0, what="kubelet marked the devices unhealthy")
        # The agent notices no stream is open (after its grace period) and registers again.
        k.wait_for(lambda: k.registrations(BOOK) == 2 and k.allocatable(BOOK) == 8, timeout=10,
                   what="registered again and advertised")
        assert node.agent.manager.restarts == 1


def registered_times(kubelet: KubeletEmulator, resource: str, times: int) -> bool:
    return kubelet.registrations(resource) == times and kubelet.allocatable(resource) > 0
