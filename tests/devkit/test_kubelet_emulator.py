"""The kubelet emulator against a tiny fake device plugin on real unix sockets.

Every wait is a condition wait with a deadline (`kubelet.wait_for`, `FakePlugin.wait_for`); the only
bounded "nothing happens" windows are the explicit no-reconnect checks.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from agent._proto.deviceplugin.v1beta1 import api_pb2 as dp
from agent._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from agent._proto.podresources.v1 import api_pb2 as pr
from agent._proto.podresources.v1 import api_pb2_grpc as pr_grpc
from tests.support.env import BOOK, SOCKET
from topology_devkit.kubelet_emulator import (
    AdmissionError,
    Container,
    ContainerStartError,
    KubeletEmulator,
    KubeletNotRunningError,
    TokenBucket,
    is_extended_resource_name,
)

WAIT = 5.0


# ============================================================================ fake device plugin


class FakePlugin(dp_grpc.DevicePluginServicer):
    """A minimal, scriptable device plugin serving on `<device-plugins>/<sock_name>`."""

    def __init__(
        self,
        plugin_dir: Path,
        resource: str,
        devices: dict[str, str],
        *,
        sock_name: str | None = None,
        gpa: bool = True,
        pre_start: bool = False,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.sock_name = sock_name or f"fake-{resource.replace('/', '-')}.sock"
        self.gpa = gpa
        self.pre_start = pre_start
        self.cond = threading.Condition()
        self._devices = dict(devices)
        self._version = 0
        self._eof = False
        self.register_pending = False
        self.options_saw_register_pending: list[bool] = []
        self.streams_opened = 0
        self.streams_closed = 0
        self.gpa_requests: list[dp.ContainerPreferredAllocationRequest] = []
        self.allocate_requests: list[list[str]] = []
        self.pre_start_requests: list[list[str]] = []
        self.gpa_answer: Callable[[dp.ContainerPreferredAllocationRequest], list[str]] | None = None
        self.allocate_error: str | None = None
        self.allocate_empty = False
        self.server: grpc.Server | None = None

    # -- control --------------------------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.sock_name

    def serve(self) -> FakePlugin:
        self.server = grpc.server(ThreadPoolExecutor(max_workers=8))
        dp_grpc.add_DevicePluginServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.socket_path}")
        self.server.start()
        with self.cond:
            self._eof = False
        return self

    def stop(self) -> None:
        with self.cond:
            self._eof = True
            self.cond.notify_all()
        if self.server is not None:
            self.server.stop(grace=None).wait(WAIT)
            self.server = None

    def register(self, *, version: str = "v1beta1", resource: str | None = None, endpoint: str | None = None) -> None:
        with grpc.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as channel:
            stub = dp_grpc.RegistrationStub(channel)
            with self.cond:
                self.register_pending = True
            try:
                stub.Register(
                    dp.RegisterRequest(
                        version=version,
                        endpoint=endpoint if endpoint is not None else self.sock_name,
                        resource_name=resource if resource is not None else self.resource,
                        options=dp.DevicePluginOptions(),  # deliberately wrong: kubelet >= 1.25 ignores it
                    ),
                    timeout=WAIT,
                )
            finally:
                with self.cond:
                    self.register_pending = False

    def set_devices(self, devices: dict[str, str]) -> None:
        with self.cond:
            self._devices = dict(devices)
            self._version += 1
            self.cond.notify_all()

    def resume(self) -> None:
        """Allow new ListAndWatch streams again after `end_streams` (the server kept running)."""
        with self.cond:
            self._eof = False

    def end_streams(self) -> None:
        """Return from every ListAndWatch (the stream ends with OK/EOF on the kubelet side)."""
        with self.cond:
            self._eof = True
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT
        with self.cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(what)
                self.cond.wait(remaining)

    # -- DevicePlugin service ---------------------------------------------------------------------

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> dp.DevicePluginOptions:
        with self.cond:
            self.options_saw_register_pending.append(self.register_pending)
        return dp.DevicePluginOptions(pre_start_required=self.pre_start, get_preferred_allocation_available=self.gpa)

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        cancelled = threading.Event()

        def on_done() -> None:
            cancelled.set()
            with self.cond:
                self.cond.notify_all()

        context.add_callback(on_done)
        with self.cond:
            self.streams_opened += 1
            self.cond.notify_all()
        sent = [-1]
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self._version != sent[0] or self._eof or cancelled.is_set())
                    if self._eof or cancelled.is_set():
                        return
                    sent[0] = self._version
                    devices = [dp.Device(ID=i, health=h) for i, h in self._devices.items()]
                yield dp.ListAndWatchResponse(devices=devices)
        finally:
            with self.cond:
                self.streams_closed += 1
                self.cond.notify_all()

    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        req = request.container_requests[0]
        with self.cond:
            self.gpa_requests.append(req)
        ids = self.gpa_answer(req) if self.gpa_answer else list(req.available_deviceIDs)[: req.allocation_size]
        return dp.PreferredAllocationResponse(
            container_responses=[dp.ContainerPreferredAllocationResponse(deviceIDs=ids)]
        )

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        ids = list(request.container_requests[0].devices_ids)
        with self.cond:
            self.allocate_requests.append(ids)
        if self.allocate_error:
            context.abort(grpc.StatusCode.UNKNOWN, self.allocate_error)
        if self.allocate_empty:
            return dp.AllocateResponse()
        key = self.resource.split("/")[-1].upper()
        return dp.AllocateResponse(
            container_responses=[
                dp.ContainerAllocateResponse(
                    envs={f"{key}_IDS": ",".join(sorted(ids)), "SHARED": key},
                    annotations={f"{self.resource}.ids": ",".join(sorted(ids))},
                )
            ]
        )

    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> dp.PreStartContainerResponse:
        with self.cond:
            self.pre_start_requests.append(list(request.devices_ids))
        return dp.PreStartContainerResponse()


# ============================================================================ fixtures


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kle-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(root: Path) -> Iterator[KubeletEmulator]:
    with KubeletEmulator(root) as k:
        yield k


@pytest.fixture
def plugins() -> Iterator[list[FakePlugin]]:
    started: list[FakePlugin] = []
    yield started
    for plugin in started:
        plugin.stop()


FOUR_BOOKS = {"b0": "Healthy", "b1": "Healthy", "b2": "Healthy", "b3": "Healthy"}


def start_plugin(
    kubelet: KubeletEmulator,
    plugins: list[FakePlugin],
    resource: str = BOOK,
    devices: dict[str, str] | None = None,
    *,
    gpa: bool = True,
    pre_start: bool = False,
) -> FakePlugin:
    plugin = FakePlugin(
        kubelet.device_plugin_dir, resource, devices or FOUR_BOOKS, gpa=gpa, pre_start=pre_start
    ).serve()
    plugins.append(plugin)
    plugin.register()
    kubelet.wait_registered(resource)
    return plugin


def pod_resources_stub(kubelet: KubeletEmulator) -> tuple[grpc.Channel, pr_grpc.PodResourcesListerStub]:
    channel = grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}")
    return channel, pr_grpc.PodResourcesListerStub(channel)


def is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except FileNotFoundError:
        return False


# ============================================================================ resource names


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("topology/book", True),
        ("topology/socket", True),
        ("topology.ibm.com/book", True),
        ("topology/Book_1", True),
        ("book", False),
        ("topology.kubernetes.io/book", False),
        ("kubernetes.io/book", False),
        ("requests.topology/book", False),
        ("Topology/book", False),
        ("topology/book/0", False),
        ("topology/", False),
        ("/book", False),
        ("topology/-book", False),
        ("topology/" + "b" * 63, True),
        ("topology/" + "b" * 64, False),
    ],
)
def test_is_extended_resource_name(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid


# ============================================================================ registration


def test_register_dials_and_asks_options_before_returning(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    plugin = start_plugin(kubelet, plugins, gpa=True, pre_start=True)
    # GetDevicePluginOptions ran while the plugin's own Register call was still pending.
    assert plugin.options_saw_register_pending == [True]
    assert kubelet.registrations(BOOK) == 1
    assert kubelet.calls.methods(BOOK) == ["GetDevicePluginOptions", "ListAndWatch"]
    # Options come from GetDevicePluginOptions, not from RegisterRequest.options (which were all false).
    options = kubelet.options(BOOK)
    assert options is not None and options.pre_start_required and options.get_preferred_allocation_available
    assert kubelet.endpoint(BOOK) == plugin.socket_path
    assert kubelet.devices(BOOK) == FOUR_BOOKS
    assert (kubelet.capacity(BOOK), kubelet.allocatable(BOOK), kubelet.snapshots(BOOK)) == (4, 4, 1)


def test_bad_version_is_rejected(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    plugin = FakePlugin(kubelet.device_plugin_dir, BOOK, FOUR_BOOKS).serve()
    plugins.append(plugin)
    with pytest.raises(grpc.RpcError) as info:
        plugin.register(version="v1beta2")
    assert info.value.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INVALID_ARGUMENT)
    assert info.value.details() == (
        'requested API version "v1beta2" is not supported by kubelet. Supported version is "[v1beta1]"'
    )
    assert kubelet.registrations(BOOK) == 0
    assert kubelet.registration_requests(BOOK) == 1
    assert plugin.options_saw_register_pending == []  # never dialled


@pytest.mark.parametrize("name", ["book", "kubernetes.io/book", "requests.topology/book", "Topology/book"])
def test_bad_resource_name_is_rejected(kubelet: KubeletEmulator, plugins: list[FakePlugin], name: str) -> None:
    plugin = FakePlugin(kubelet.device_plugin_dir, name, FOUR_BOOKS, sock_name="bad.sock").serve()
    plugins.append(plugin)
    with pytest.raises(grpc.RpcError) as info:
        plugin.register()
    assert info.value.details() == f'the ResourceName "{name}" is invalid'
    assert kubelet.registrations(name) == 0
    assert plugin.options_saw_register_pending == []


def test_register_fails_when_endpoint_cannot_be_dialled(root: Path) -> None:
    with KubeletEmulator(root, dial_timeout=0.3) as kubelet:
        plugin = FakePlugin(kubelet.device_plugin_dir, BOOK, FOUR_BOOKS)  # not serving
        with pytest.raises(grpc.RpcError) as info:
            plugin.register(endpoint="missing.sock")
        assert info.value.details().startswith("failed to dial device plugin: ")
        assert kubelet.registrations(BOOK) == 0
        assert kubelet.capacity(BOOK) == 0


def test_latest_registration_replaces_previous_endpoint(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    first = start_plugin(kubelet, plugins)
    second = FakePlugin(kubelet.device_plugin_dir, BOOK, {"n0": "Healthy"}, sock_name="second.sock").serve()
    plugins.append(second)
    second.register()
    kubelet.wait_for(lambda: kubelet.devices(BOOK) == {"n0": "Healthy"}, WAIT, "second plugin's snapshot")
    first.wait_for(lambda: first.streams_closed == 1, "old stream closed by kubelet")
    assert kubelet.registrations(BOOK) == 2
    assert kubelet.endpoint(BOOK) == second.socket_path
    # The old stream's end did not mark the new endpoint's devices unhealthy.
    assert (kubelet.capacity(BOOK), kubelet.allocatable(BOOK)) == (1, 1)


# ============================================================================ ListAndWatch


def test_each_message_is_a_full_snapshot(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    plugin = start_plugin(kubelet, plugins)
    plugin.set_devices({"b0": "Healthy", "b2": "Unhealthy", "b3": "healthy"})  # b1 gone; "healthy" != "Healthy"
    kubelet.wait_for(lambda: kubelet.snapshots(BOOK) == 2, WAIT, "second snapshot")
    assert kubelet.devices(BOOK) == {"b0": "Healthy", "b2": "Unhealthy", "b3": "healthy"}
    assert kubelet.healthy_devices(BOOK) == {"b0"}
    assert (kubelet.capacity(BOOK), kubelet.allocatable(BOOK)) == (3, 1)
    plugin.set_devices({})
    kubelet.wait_for(lambda: kubelet.snapshots(BOOK) == 3, WAIT, "empty snapshot")
    assert (kubelet.capacity(BOOK), kubelet.allocatable(BOOK), kubelet.devices(BOOK)) == (0, 0, {})


def test_stream_end_zeroes_allocatable_keeps_capacity_and_never_reconnects(
    kubelet: KubeletEmulator, plugins: list[FakePlugin]
) -> None:
    plugin = start_plugin(kubelet, plugins)
    plugin.end_streams()
    kubelet.wait_for(lambda: kubelet.allocatable(BOOK) == 0, WAIT, "allocatable 0 after stream end")
    assert kubelet.capacity(BOOK) == 4  # within the 300 s grace
    assert set(kubelet.devices(BOOK).values()) == {"Unhealthy"}
    # Bounded negative check: no new ListAndWatch within a short window.
    with pytest.raises(TimeoutError):
        kubelet.wait_for(lambda: kubelet.calls.count_of("ListAndWatch", BOOK) > 1, 0.3, "reconnect")
    assert plugin.streams_opened == 1
    with pytest.raises(AdmissionError) as info:
        kubelet.admit_pod("default", "p", [Container("c", {BOOK: 1})])
    assert info.value.message == (
        "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices topology/book, "
        "which is unexpected"
    )
    # Only a new Register revives the resource.
    plugin.resume()
    plugin.register()
    kubelet.wait_registered(BOOK)
    assert (kubelet.registrations(BOOK), kubelet.allocatable(BOOK)) == (2, 4)


def test_capacity_drops_to_zero_after_grace(root: Path, plugins: list[FakePlugin]) -> None:
    with KubeletEmulator(root, stop_grace_period=0.2) as kubelet:
        plugin = start_plugin(kubelet, plugins)
        plugin.end_streams()
        kubelet.wait_for(lambda: kubelet.allocatable(BOOK) == 0, WAIT, "stream end")
        kubelet.wait_for(lambda: kubelet.capacity(BOOK) == 0, WAIT, "capacity 0 after grace")
        assert kubelet.resources() == []
        with pytest.raises(AdmissionError) as info:
            kubelet.admit_pod("default", "p", [Container("c", {BOOK: 1})])
        assert info.value.reason == f"OutOf{BOOK}"


# ============================================================================ allocation


def test_gpa_then_allocate_with_kubelet_rules(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    plugin = start_plugin(kubelet, plugins)
    # Prefer from the back, add an unknown id and one too many: kubelet drops, keeps order, truncates.
    plugin.gpa_answer = lambda req: ["zz", *reversed(req.available_deviceIDs)]
    pod = kubelet.admit_pod("default", "p", [Container("c", {BOOK: 2})])
    assert kubelet.calls.methods(BOOK)[-2:] == ["GetPreferredAllocation", "Allocate"]
    gpa = plugin.gpa_requests[0]
    assert (list(gpa.available_deviceIDs), list(gpa.must_include_deviceIDs), gpa.allocation_size) == (
        ["b0", "b1", "b2", "b3"],
        [],
        2,
    )
    assert plugin.allocate_requests == [["b3", "b2"]]
    assert pod.devices("c", BOOK) == ["b3", "b2"]
    assert kubelet.allocated(BOOK) == {"b2", "b3"}

    # The next pod only sees the free ids; a short GPA answer is filled by kubelet.
    plugin.gpa_answer = lambda req: []
    pod2 = kubelet.admit_pod("default", "q", [Container("c", {BOOK: 2})])
    assert list(plugin.gpa_requests[1].available_deviceIDs) == ["b0", "b1"]
    assert sorted(pod2.devices("c", BOOK)) == ["b0", "b1"]

    with pytest.raises(AdmissionError) as info:
        kubelet.admit_pod("default", "r", [Container("c", {BOOK: 1})])
    assert info.value.reason == "UnexpectedAdmissionError"
    assert info.value.message == (
        "Allocate failed due to requested number of devices unavailable for topology/book. "
        "Requested: 1, Available: 0, which is unexpected"
    )


def test_no_gpa_when_plugin_does_not_offer_it(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    plugin = start_plugin(kubelet, plugins, gpa=False)
    kubelet.admit_pod("default", "p", [Container("c", {BOOK: 2})])
    assert kubelet.calls.count_of("GetPreferredAllocation") == 0
    assert plugin.allocate_requests == [["b0", "b1"]]


def test_requested_more_than_available(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    start_plugin(kubelet, plugins, devices={"b0": "Healthy", "b1": "Unhealthy"})
    with pytest.raises(AdmissionError) as info:
        kubelet.admit_pod("default", "p", [Container("c", {BOOK: 2})])
    assert info.value.message == (
        "Allocate failed due to requested number of devices unavailable for topology/book. "
        "Requested: 2, Available: 1, which is unexpected"
    )
    assert kubelet.calls.count_of("Allocate") == 0


def test_allocate_error_rolls_back_the_whole_pod(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    books = start_plugin(kubelet, plugins)
    sockets = start_plugin(kubelet, plugins, resource=SOCKET, devices={"s0": "Healthy", "s1": "Healthy"})
    sockets.allocate_error = "boom"
    with pytest.raises(AdmissionError) as info:
        kubelet.admit_pod("default", "p", [Container("c", {BOOK: 1, SOCKET: 1})])
    assert info.value.reason == "UnexpectedAdmissionError"
    assert info.value.message == "Allocate failed due to rpc error: code = Unknown desc = boom, which is unexpected"
    # The book Allocate happened, yet its id is free again and the book plugin was never told.
    assert books.allocate_requests == [["b0"]]
    assert kubelet.allocated(BOOK) == set() and kubelet.allocated(SOCKET) == set()
    assert kubelet.pods() == []
    sockets.allocate_error = None
    sockets.allocate_empty = True
    with pytest.raises(AdmissionError) as info:
        kubelet.admit_pod("default", "p", [Container("c", {SOCKET: 1})])
    assert "no containers return in allocation response" in info.value.message


def test_unregistered_resource_is_out_of(kubelet: KubeletEmulator) -> None:
    with pytest.raises(AdmissionError) as info:
        kubelet.admit_pod("default", "p", [Container("c", {BOOK: 1, "cpu": 2})])
    assert info.value.reason == "OutOftopology/book"
    assert info.value.message == "Node didn't have enough resource: topology/book, requested: 1, used: 0, capacity: 0"


def test_init_container_devices_are_reused(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    start_plugin(kubelet, plugins)
    pod = kubelet.admit_pod(
        "default",
        "p",
        [
            Container("app", {BOOK: 2}),
            Container("init", {BOOK: 2}, init=True),
            Container("sidecar", {BOOK: 1}, init=True, restartable=True),
        ],
    )
    # Init containers first: the plain init container's devices become reusable; the sidecar takes one of
    # them (no GPA needed) and keeps it; the app container reuses the other and asks GPA for one more,
    # with the reused id as must_include and the total as allocation_size.
    assert pod.devices("init", BOOK) == ["b0", "b1"]
    assert pod.devices("sidecar", BOOK) == ["b0"]
    assert pod.devices("app", BOOK) == ["b1", "b2"]
    gpa = [c.request for c in kubelet.calls.for_resource(BOOK) if c.method == "GetPreferredAllocation"]
    assert gpa == [
        {"available_deviceIDs": ["b0", "b1", "b2", "b3"], "must_include_deviceIDs": [], "allocation_size": 2},
        {"available_deviceIDs": ["b1", "b2", "b3"], "must_include_deviceIDs": ["b1"], "allocation_size": 2},
    ]
    assert kubelet.allocated(BOOK) == {"b0", "b1", "b2"}


# ============================================================================ container start / delete


def test_start_container_replays_cached_env_and_calls_pre_start(
    kubelet: KubeletEmulator, plugins: list[FakePlugin]
) -> None:
    books = start_plugin(kubelet, plugins, pre_start=True)
    start_plugin(kubelet, plugins, resource=SOCKET, devices={"s0": "Healthy", "s1": "Healthy"})
    pod = kubelet.admit_pod("default", "p", [Container("c", {BOOK: 2, SOCKET: 1})])
    allocations = kubelet.calls.count_of("Allocate")
    first = kubelet.start_container("default", "p", "c")
    second = kubelet.start_container("default", "p", "c")
    assert first == second == {"BOOK_IDS": "b0,b1", "SHARED": "BOOK", "SOCKET_IDS": "s0"}  # first wins
    assert kubelet.calls.count_of("Allocate") == allocations  # never re-allocated
    assert books.pre_start_requests == [["b0", "b1"], ["b0", "b1"]]
    assert kubelet.calls.count_of("PreStartContainer", SOCKET) == 0
    assert pod.starts("c") == 2
    assert pod.envs("c") == first
    assert pod.annotations("c") == {"topology/book.ids": "b0,b1", "topology/socket.ids": "s0"}
    assert set(pod.responses("c")) == {BOOK, SOCKET}
    with pytest.raises(KeyError):
        kubelet.start_container("default", "p", "nope")


def test_pre_start_error_fails_the_start(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    books = start_plugin(kubelet, plugins, pre_start=True)
    kubelet.admit_pod("default", "p", [Container("c", {BOOK: 1})])
    books.stop()
    with pytest.raises(ContainerStartError, match="device plugin PreStartContainer rpc failed with err: "):
        kubelet.start_container("default", "p", "c")


def test_delete_pod_frees_silently(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    start_plugin(kubelet, plugins)
    kubelet.admit_pod("default", "p", [Container("c", {BOOK: 4})])
    calls = len(kubelet.calls)
    kubelet.delete_pod("default", "p")
    assert len(kubelet.calls) == calls  # the plugin is never told
    assert kubelet.allocated(BOOK) == set() and kubelet.pods() == []
    pod = kubelet.admit_pod("default", "q", [Container("c", {BOOK: 4})])
    assert sorted(pod.devices("c", BOOK)) == ["b0", "b1", "b2", "b3"]
    with pytest.raises(KeyError):
        kubelet.delete_pod("default", "p")


# ============================================================================ restart


def test_restart_deletes_sockets_keeps_allocations(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    plugin = start_plugin(kubelet, plugins)
    pod = kubelet.admit_pod("default", "p", [Container("c", {BOOK: 2})])
    plugin_dir = kubelet.device_plugin_dir
    (plugin_dir / "regular-file").write_text("x")
    (plugin_dir / "a-dir").mkdir()
    stray = socket.socket(socket.AF_UNIX)
    stray.bind(str(plugin_dir / "stray.sock"))
    stray.close()
    assert kubelet.checkpoint_path.is_file()
    # Keep the old kubelet.sock inode alive through a hard link outside the dir, so a recreated socket
    # must get a new inode number.
    os.link(kubelet.kubelet_socket, kubelet.root / "old-kubelet.sock")
    old_inode = kubelet.kubelet_socket.stat().st_ino

    kubelet.restart()

    assert kubelet.restarts == 1
    assert not plugin.socket_path.exists() and not (plugin_dir / "stray.sock").exists()
    assert (plugin_dir / "regular-file").is_file() and (plugin_dir / "a-dir").is_dir()
    assert kubelet.checkpoint_path.is_file()
    assert is_socket(kubelet.kubelet_socket) and kubelet.kubelet_socket.stat().st_ino != old_inode
    assert is_socket(kubelet.pod_resources_socket)
    plugin.wait_for(lambda: plugin.streams_closed == 1, "plugin stream cancelled by the restart")
    assert (kubelet.capacity(BOOK), kubelet.allocatable(BOOK)) == (0, 0)
    assert kubelet.pods() == [pod] and pod.devices("c", BOOK) == ["b0", "b1"]
    with pytest.raises(AdmissionError, match="no healthy devices present"):
        kubelet.admit_pod("default", "q", [Container("c", {BOOK: 1})])
    # Cached env still replays while the plugin is away (no options known -> no PreStart).
    assert kubelet.start_container("default", "p", "c")["BOOK_IDS"] == "b0,b1"

    # The plugin notices, serves again and re-registers: allocations are honoured.
    plugin.stop()
    plugin.serve()
    plugin.register()
    kubelet.wait_registered(BOOK)
    assert (kubelet.registrations(BOOK), kubelet.allocatable(BOOK)) == (2, 4)
    q = kubelet.admit_pod("default", "q", [Container("c", {BOOK: 2})])
    assert sorted(q.devices("c", BOOK)) == ["b2", "b3"]


def test_restart_down_phase_without_blocking(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    plugin = start_plugin(kubelet, plugins)
    kubelet.restart(down_for=0.2, block=False)
    assert not kubelet.is_running
    assert not kubelet.kubelet_socket.exists() and not kubelet.pod_resources_socket.exists()
    with pytest.raises(KubeletNotRunningError):
        kubelet.admit_pod("default", "p", [Container("c", {BOOK: 1})])
    kubelet.wait_for(lambda: kubelet.is_running, WAIT, "kubelet back up")
    assert is_socket(kubelet.kubelet_socket)
    plugin.stop()
    plugin.serve()
    plugin.register()
    kubelet.wait_registered(BOOK)


# ============================================================================ pod-resources


def test_pod_resources_list_get_allocatable(kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    plugin = start_plugin(kubelet, plugins)
    kubelet.admit_pod(
        "ns",
        "p",
        [
            Container("init", {BOOK: 1}, init=True),
            Container("sidecar", {}, init=True, restartable=True),
            Container("app", {BOOK: 2}),
        ],
    )
    plugin.set_devices({**FOUR_BOOKS, "b3": "Unhealthy"})
    kubelet.wait_for(lambda: kubelet.snapshots(BOOK) == 2, WAIT, "b3 unhealthy")
    channel, stub = pod_resources_stub(kubelet)
    with channel:
        listed = stub.List(pr.ListPodResourcesRequest(), timeout=WAIT)
        assert [(p.namespace, p.name) for p in listed.pod_resources] == [("ns", "p")]
        containers = listed.pod_resources[0].containers
        assert [c.name for c in containers] == ["sidecar", "app"]  # plain init containers are not listed
        app = containers[1]
        assert [(d.resource_name, list(d.device_ids)) for d in app.devices] == [(BOOK, ["b0", "b1"])]
        assert not app.devices[0].HasField("topology") and list(app.cpu_ids) == []

        got = stub.Get(pr.GetPodResourcesRequest(pod_name="p", pod_namespace="ns"), timeout=WAIT)
        assert got.pod_resources == listed.pod_resources[0]
        with pytest.raises(grpc.RpcError) as info:
            stub.Get(pr.GetPodResourcesRequest(pod_name="x", pod_namespace="ns"), timeout=WAIT)
        assert info.value.details() == "pod x in namespace ns not found"

        allocatable = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=WAIT)
        assert sorted(d.device_ids[0] for d in allocatable.devices) == ["b0", "b1", "b2"]  # healthy only
        assert list(allocatable.cpu_ids) == []
    assert kubelet.pod_resources_calls == 4

    kubelet.delete_pod("ns", "p")
    channel, stub = pod_resources_stub(kubelet)
    with channel:
        assert list(stub.List(pr.ListPodResourcesRequest(), timeout=WAIT).pod_resources) == []


def test_pod_resources_rate_limit(root: Path) -> None:
    with KubeletEmulator(root, pod_resources_qps=0.001, pod_resources_burst=3) as kubelet:
        channel, stub = pod_resources_stub(kubelet)
        with channel:
            for _ in range(3):
                stub.List(pr.ListPodResourcesRequest(), timeout=WAIT)
            with pytest.raises(grpc.RpcError) as info:
                stub.List(pr.ListPodResourcesRequest(), timeout=WAIT)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.details() == "rejected by rate limit"
        assert (kubelet.pod_resources_calls, kubelet.pod_resources_rejected) == (3, 1)


def test_token_bucket_refills() -> None:
    now = [0.0]
    bucket = TokenBucket(100, 10, clock=lambda: now[0])
    assert [bucket.allow() for _ in range(11)] == [True] * 10 + [False]
    now[0] += 0.05  # 5 tokens
    assert sum(bucket.allow() for _ in range(10)) == 5


# ============================================================================ misc


def test_socket_path_length_is_checked() -> None:
    with pytest.raises(ValueError, match="too long"):
        KubeletEmulator("/tmp/" + "x" * 120)


def test_logs_under_kubelet_emulator_logger(
    kubelet: KubeletEmulator, plugins: list[FakePlugin], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kubelet-emulator"):
        start_plugin(kubelet, plugins)
    messages = [r.getMessage() for r in caplog.records if r.name == "kubelet-emulator"]
    assert any("Got registration request from device plugin with resource" in m for m in messages)
    assert any("State pushed for device plugin" in m for m in messages)


def test_directories_and_sockets(kubelet: KubeletEmulator) -> None:
    assert kubelet.device_plugin_dir == kubelet.root / "device-plugins"
    assert kubelet.pod_resources_socket == kubelet.root / "pod-resources" / "kubelet.sock"
    assert is_socket(kubelet.device_plugin_dir / "kubelet.sock")
    assert stat.S_IMODE(os.stat(kubelet.device_plugin_dir).st_mode) & 0o007 == 0


def test_after_a_restart_pod_resources_shows_no_pod_until_the_pods_are_synced(
        kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    # kubelet's List walks its pod manager, empty after a restart until the API server resends the pods
    # (server_v1.go List: podsProvider.GetPods()); the device manager has the allocations at once.
    start_plugin(kubelet, plugins)
    kubelet.admit_pod("default", "p", [Container("c", {BOOK: 2})])
    kubelet.pods_resync = 2.0
    kubelet.restart()
    channel, stub = pod_resources_stub(kubelet)
    with channel:
        assert list(stub.List(pr.ListPodResourcesRequest(), timeout=WAIT).pod_resources) == []
        assert not kubelet.pods_synced()
        assert [p.name for p in kubelet.pods()] == ["p"]  # the allocations are kept meanwhile
        kubelet.wait_for(kubelet.pods_synced, WAIT, "pods synced again")
        listed = stub.List(pr.ListPodResourcesRequest(), timeout=WAIT)
        assert [(p.namespace, p.name) for p in listed.pod_resources] == [("default", "p")]


def test_a_pod_deleted_before_the_pods_are_synced_keeps_its_devices_until_then(
        kubelet: KubeletEmulator, plugins: list[FakePlugin]) -> None:
    # kubelet frees no device while its pod sources are not ready (devicemanager/manager.go UpdateAllocatedDevices:
    # `if !m.sourcesReady.AllReady() { return }`): the real kubelet 1.37.2 refuses a pod admitted right then with
    # UnexpectedAdmissionError "requested number of devices unavailable".
    plugin = start_plugin(kubelet, plugins)
    kubelet.admit_pod("default", "p", [Container("c", {BOOK: 2})])
    kubelet.pods_resync = 30.0
    kubelet.restart()
    plugin.stop()
    plugin.serve()
    plugin.register()
    kubelet.wait_registered(BOOK)
    kubelet.delete_pod("default", "p")
    assert [p.name for p in kubelet.pods()] == ["p"], "its devices stay allocated until the pods are synced"
    with pytest.raises(AdmissionError):
        kubelet.admit_pod("default", "q", [Container("c", {BOOK: 4})])
    kubelet._pods_synced_at = 0.0  # the API server sent the pods back
    assert kubelet.pods_synced()
    assert kubelet.pods() == []
    q = kubelet.admit_pod("default", "q", [Container("c", {BOOK: 4})])  # the freed devices are there again
    assert sorted(q.devices("c", BOOK)) == ["b0", "b1", "b2", "b3"]
