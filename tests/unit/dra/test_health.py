"""DRA device health (agent/policy/health_report.py, agent/dra/health_service.py): the report, and NodeWatchResources
on the DRA socket driven the way kubelet 1.37 drives it (the registration names the service, a long-lived stream of
full reports), over real gRPC channels on Unix sockets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent._proto.dra_health.v1 import api_pb2 as h1
from agent._proto.dra_health.v1 import api_pb2_grpc as h1_grpc
from agent._proto.dra_health.v1alpha1 import api_pb2 as h1a
from agent._proto.dra_health.v1alpha1 import api_pb2_grpc as h1a_grpc
from agent._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from agent._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from agent.dra.driver import DraManager
from agent.dra.health_service import HealthService
from agent.dra.kubelet_plugin import KubeletPlugin
from agent.dra.prepare import ClaimPreparer
from agent.dra.publisher import SlicePublisher
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.health_report import HEALTH_TIMEOUT, MAX_MESSAGE, DeviceReport, health_report
from agent.policy.resource_slices import DRIVER, SliceSettings, build_pool
from agent.topology.embedded import load_embedded
from tests.support.harness import short_tmpdir
from tests.support.kubeapi import SliceApi
from topology_devkit.testing.wait import wait_until

BOOK = ("topology/book", "drawer0-book0")
WAIT = 5.0  # seconds: every wait below is for a condition, this is only its deadline


def test_report_is_complete_and_names_the_reason() -> None:
    report = health_report(["drawer0-book0", "drawer0-book1", "drawer0-book0-socket0"],
                           {BOOK: "cpus 3 offline or in standby", ("topology/book", "not-published"): "x"})
    assert report == (DeviceReport("drawer0-book0", False, "not whole: cpus 3 offline or in standby"),
                      DeviceReport("drawer0-book1", True), DeviceReport("drawer0-book0-socket0", True))
    long = health_report(["drawer0-book0"], {BOOK: "y" * 5000})[0].message
    assert len(long) == MAX_MESSAGE and long.endswith("...")


# --- the stream --------------------------------------------------------------------------------------------


def pool_devices() -> tuple[Any, Any, list[str]]:
    topology = load_embedded("pr40714")
    grouping = group_topology(topology, GroupingSettings(levels=("book", "socket")))
    names = [d["name"] for d in build_pool(grouping, topology, SliceSettings("node-a")).devices]
    return topology, grouping, names


class Node:
    """A KubeletPlugin with a HealthService on short socket paths, and the broken groups the table would have."""

    def __init__(self, *, max_streams: int = 2, resend: float = 30.0) -> None:
        self.topology, self.grouping, self.names = pool_devices()
        self.root = short_tmpdir()
        self.broken: dict[tuple[str, str], str] = {}
        self.health = HealthService(pool="node-a", devices=self.names, broken=lambda: dict(self.broken),
                                    max_streams=max_streams, resend=resend)
        self.api = SliceApi()
        preparer = ClaimPreparer(driver=DRIVER, pool="node-a", groups={g.id: g for g in self.grouping.groups},
                                 allocation=AllocationSettings(), read_claim=self.api.read_claim,
                                 cdi_dir=self.root / "cdi", checkpoint=self.root / "claims.json")
        self.plugin = KubeletPlugin(driver=DRIVER, registry_dir=self.root / "reg", plugin_dir=self.root / "plugin",
                                    preparer=preparer, health=self.health)


class Watch:
    """One kubelet-side NodeWatchResources stream, read by a thread into a list (kubelet's Recv loop)."""

    def __init__(self, endpoint: Path, version: str = "v1") -> None:
        self.channel = grpc.insecure_channel(f"unix://{endpoint}")
        stub: Any = (h1_grpc.DRAResourceHealthStub if version == "v1" else h1a_grpc.DRAResourceHealthStub)(
            self.channel)
        pb = h1 if version == "v1" else h1a
        self.call = stub.NodeWatchResources(pb.NodeWatchResourcesRequest())
        self.messages: list[Any] = []
        self.ended: grpc.RpcError | bool | None = False  # False: running; None: ended with OK; else the error
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        end: grpc.RpcError | None = None
        try:
            for message in self.call:
                with self._cond:
                    self.messages.append(message)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            end = exc
        with self._cond:
            self.ended = end
            self._cond.notify_all()

    def wait(self, predicate: Callable[[], bool], what: str) -> None:
        with self._cond:
            assert self._cond.wait_for(predicate, timeout=WAIT), f"not within {WAIT} s: {what}"

    def message(self, n: int) -> Any:
        self.wait(lambda: len(self.messages) >= n or self.ended is not False, f"message {n}")
        assert len(self.messages) >= n, f"the stream ended after {len(self.messages)} message(s): {self.ended}"
        return self.messages[n - 1]

    def end(self) -> grpc.RpcError | None:
        self.wait(lambda: self.ended is not False, "the end of the stream")
        assert self.ended is not True
        return self.ended

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


def states(message: Any) -> dict[str, tuple[int, str]]:
    return {d.device.device_name: (d.health, d.message) for d in message.devices}


@pytest.fixture
def node() -> Iterator[Node]:
    n = Node()
    n.plugin.start()
    try:
        yield n
    finally:
        n.plugin.stop()


def test_registration_names_the_health_services(node: Node) -> None:
    with grpc.insecure_channel(f"unix://{node.plugin.registration_path}") as ch:
        info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=5)
    # kubelet 1.37: validateSupportedServices picks the first DRAPlugin it knows, pickHealthService v1 before
    # v1alpha1 (dra_plugin_manager.go); without the name there it never opens the stream.
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                             "v1alpha1.DRAResourceHealth"]


def test_first_message_change_second_stream_cap_and_stop(node: Node) -> None:
    node.broken[BOOK] = "cpus 3 offline or in standby"  # broken before the plugin started: opened with it
    node.plugin.stop()
    node.plugin.start()
    first = Watch(node.plugin.dra_path)
    try:
        m = first.message(1)
        assert [d.device.device_name for d in m.devices] == node.names  # the complete pool, in slice order
        assert {d.device.pool_name for d in m.devices} == {"node-a"}
        assert {d.health_check_timeout_seconds for d in m.devices} == {HEALTH_TIMEOUT}
        assert abs(m.devices[0].last_updated_time - time.time()) < 60
        s = states(m)
        assert s["drawer0-book0"] == (h1.UNHEALTHY, "not whole: cpus 3 offline or in standby")
        assert s["drawer0-book1"] == (h1.HEALTHY, "")
        assert [d for d, (h, _) in s.items() if h == h1.UNHEALTHY] == ["drawer0-book0"]

        # A change reaches the open stream at once; an update that changes nothing sends nothing.
        node.health.update({})
        assert states(first.message(2))["drawer0-book0"] == (h1.HEALTHY, "")
        assert not node.health.update({})
        assert node.health.update({("topology/socket", "drawer0-book1-socket1"): "cpus 9 moved"})
        assert states(first.message(3))["drawer0-book1-socket1"] == (h1.UNHEALTHY, "not whole: cpus 9 moved")
        assert len(first.messages) == 3

        # A second stream (a restarted kubelet, v1alpha1 of an older one) starts with the state as it is now.
        second = Watch(node.plugin.dra_path, "v1alpha1")
        try:
            assert states(second.message(1))["drawer0-book1-socket1"] == (h1a.UNHEALTHY, "not whole: cpus 9 moved")
            wait_until("two streams counted", lambda: node.health.streams == 2, WAIT, every=0.01)

            # The cap: a third is refused with RESOURCE_EXHAUSTED (kubelet retries every 5 s) ...
            third = Watch(node.plugin.dra_path)
            err = third.end()
            assert err is not None and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert node.health.streams_refused == 1
            third.close()
        finally:
            second.close()  # ... and a stream whose client went away frees its place
        wait_until("the cancelled stream left", lambda: node.health.streams == 1, WAIT, every=0.01)
        fourth = Watch(node.plugin.dra_path)
        try:
            assert len(fourth.message(1).devices) == len(node.names)

            # Stop: every stream ends with OK (kubelet: EOF), at once, and the counts are back to zero.
            started = time.monotonic()
            node.plugin.stop()
            assert first.end() is None and fourth.end() is None
            assert time.monotonic() - started < 2.0
            assert node.health.streams == 0
        finally:
            fourth.close()
    finally:
        first.close()


def test_the_report_is_sent_again_inside_the_timeout() -> None:
    """kubelet reads an entry older than health_check_timeout_seconds as Unknown: with nothing changing, the
    stream sends the full report again every ``resend`` seconds."""
    n = Node(resend=0.2)
    n.plugin.start()
    watch = Watch(n.plugin.dra_path)
    try:
        t0 = time.monotonic()
        first, second = watch.message(1), watch.message(2)
        assert 0.15 < time.monotonic() - t0 < WAIT
        assert states(first) == states(second)
    finally:
        watch.close()
        n.plugin.stop()


def test_a_stream_refused_while_stopped() -> None:
    n = Node()
    with pytest.raises(grpc.RpcError), grpc.insecure_channel(f"unix://{n.plugin.dra_path}") as ch:
        # nothing serves the socket before start
        next(iter(h1_grpc.DRAResourceHealthStub(ch).NodeWatchResources(h1.NodeWatchResourcesRequest(), timeout=1)))

    class Context:
        def abort(self, code: grpc.StatusCode, details: str) -> None:
            raise RuntimeError(code, details)

    with pytest.raises(RuntimeError) as refused:
        next(n.health.watch(h1, Context()))
    assert refused.value.args[0] == grpc.StatusCode.UNAVAILABLE


def test_manager_changed_reaches_the_stream() -> None:
    """The device table's listener (DraManager.changed): the health stream hears of a group no longer whole
    before the slices are republished."""
    n = Node()
    manager = DraManager(plugin=n.plugin, publisher=SlicePublisher(n.api, "node-a", DRIVER),
                         plan=lambda b, u: build_pool(n.grouping, n.topology, SliceSettings("node-a"), b, u),
                         broken=lambda: dict(n.broken), resources=n.grouping.resources(), interval=0)
    manager.start()
    watch = Watch(n.plugin.dra_path)
    try:
        assert all(d.health == h1.HEALTHY for d in watch.message(1).devices)
        n.broken[BOOK] = "cpus 3 offline or in standby"
        manager.changed()
        assert states(watch.message(2))["drawer0-book0"][0] == h1.UNHEALTHY
    finally:
        watch.close()
        manager.stop()
