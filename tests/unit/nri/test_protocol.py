"""The NRI plugin's wire and handshake against a fake runtime peer: mux frames, ttrpc messages,
RegisterPlugin -> Configure -> Synchronize (split too), CreateContainer answered with the
adjustment, unknown methods Unimplemented, a handler's bug answered empty, reconnects after the
runtime goes away. The real judge is tests/runtime/test_nri_containerd.py (containerd 2.4.2)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.nri import wire
from agent.nri.stub import PLUGIN_SERVICE, RUNTIME_SERVICE, NriPlugin, nri_version_at_least
from agent.nri.wire import Demux, Request, Response, messages, mux_frames, ttrpc_message
from tests.support.harness import short_tmpdir
from tests.support.nri_runtime import FakeRuntime
from topology_devkit.testing.wait import wait_until


def test_register_plugin_is_the_bytes_of_the_worked_example() -> None:
    """docs/nri.md §2.3, encoded by hand there."""
    payload = nri.RegisterPluginRequest(plugin_name="topology-agent", plugin_idx="90").SerializeToString()
    assert payload == b"\x0a\x0etopology-agent\x12\x0290"
    request = Request(RUNTIME_SERVICE, "RegisterPlugin", payload, timeout_nano=5_000_000_000).encode()
    assert request == (b"\x0a\x1cnri.pkg.api.v1alpha1.Runtime\x12\x0eRegisterPlugin\x1a\x14" + payload
                       + b"\x20\x80\xe4\x97\xd0\x12")
    framed = mux_frames(wire.RUNTIME_CONN, ttrpc_message(1, wire.REQUEST, request))
    assert framed[:18] == bytes.fromhex("00000002 00000054 0000004a 00000001 01 00".replace(" ", ""))
    assert Response().encode() == b"\x0a\x00"  # the runtime's OK reply to it


def test_frames_are_at_most_4096_bytes_and_reassemble_across_frames_and_reads() -> None:
    big = bytes(range(256)) * 40  # 10240 bytes: three frames
    data = mux_frames(wire.PLUGIN_CONN, ttrpc_message(7, wire.RESPONSE, big))
    sizes = []
    pos = 0
    while pos < len(data):
        conn, size = wire.MUX_HEADER.unpack_from(data, pos)
        assert conn == wire.PLUGIN_CONN
        sizes.append(size)
        pos += 8 + size
    assert max(sizes) == 4096 and sum(sizes) == len(big) + 10
    demux = Demux()
    got = []
    for i in range(0, len(data), 1000):  # the trunk delivers arbitrary pieces
        for conn in demux.feed(data[i:i + 1000]):
            got += list(messages(demux.streams[conn]))
    assert [(m.stream, m.kind, m.data) for m in got] == [(7, wire.RESPONSE, big)]


def test_frames_of_an_unknown_conn_are_dropped_and_oversized_ones_refused() -> None:
    demux = Demux()
    assert demux.feed(wire.MUX_HEADER.pack(9, 3) + b"abc") == []
    with pytest.raises(wire.WireError):
        Demux().feed(wire.MUX_HEADER.pack(1, wire.MAX_RECEIVED_FRAME + 1))
    with pytest.raises(wire.WireError):
        list(messages(bytearray(wire.TTRPC_HEADER.pack(wire.MAX_MESSAGE + 1, 1, 1, 0))))


def test_request_and_response_round_trip_with_metadata_and_errors() -> None:
    raw = Request("s", "m", b"\x01\x02", 2_000_000_000).encode() + b"\x2a\x08\x0a\x01k\x12\x03val"
    assert Request.decode(raw) == Request("s", "m", b"\x01\x02", 2_000_000_000, (("k", "val"),))
    again = Response.decode(Response(wire.UNIMPLEMENTED, "nope", b"x").encode())
    assert again == Response(wire.UNIMPLEMENTED, "nope", b"x")


def test_the_envelopes_bytes_are_the_go_sides() -> None:
    """What ttrpc's Go code writes: an OK answer carries an empty status (field 1, length 0), not none."""
    assert Response().encode() == b"\x0a\x00"
    assert Response(wire.UNIMPLEMENTED, "nope", b"x").encode() == b"\x0a\x08\x08\x0c\x12\x04nope\x12\x01x"
    assert Request("s", "m", b"\x01", 7).encode() == b"\x0a\x01s\x12\x01m\x1a\x01\x01\x20\x07"
    with pytest.raises(wire.WireError):
        Request.decode(b"\x0a\x05ab")  # truncated: the trunk refuses it on its stream (below)


class Recorder:
    """Handlers that pin every container named 'pinned' to CPU 1 and remember what they saw."""

    def __init__(self) -> None:
        self.synced: list[list[str]] = []
        self.created: list[str] = []
        self.removed: list[str] = []
        self.fail = False

    def synchronize(self, pods: list[nri.PodSandbox], containers: list[nri.Container]) -> list[nri.ContainerUpdate]:
        self.synced.append([f"{c.pod_sandbox_id}/{c.name}" for c in containers] + [p.name for p in pods])
        return [nri.ContainerUpdate(container_id=c.id, linux=nri.LinuxContainerUpdate(
            resources=nri.LinuxResources(cpu=nri.LinuxCPU(cpus="1")))) for c in containers if c.name == "pinned"]

    def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.CreateContainerResponse:
        if self.fail:
            raise RuntimeError("a bug")
        self.created.append(container.id)
        answer = nri.CreateContainerResponse()
        answer.adjust.linux.resources.cpu.cpus = "1"
        answer.adjust.linux.resources.cpu.mems = "0"
        return answer

    def update_container(self, pod: nri.PodSandbox, container: nri.Container,
                         resources: nri.LinuxResources) -> list[nri.ContainerUpdate]:
        return []

    def stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> list[nri.ContainerUpdate]:
        return []

    def remove_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        self.removed.append(container.id)


@pytest.fixture
def runtime() -> Iterator[FakeRuntime]:
    path = short_tmpdir() / "nri.sock"
    fake = FakeRuntime(path)
    yield fake
    fake.close()


def test_the_handshake_then_create_container_answers_the_adjustment(runtime: FakeRuntime) -> None:
    handlers = Recorder()
    plugin = NriPlugin(handlers, runtime.path, index="10")
    plugin.start()
    try:
        synced = runtime.handshake(nri.Container(id="c0", pod_sandbox_id="pod-1", name="pinned"),
                                   nri.Container(id="c1", pod_sandbox_id="pod-1", name="free"), split=True)
        assert runtime.registered == [nri.RegisterPluginRequest(plugin_name="topology-agent", plugin_idx="10")]
        assert [u.container_id for u in synced.update] == ["c0"] and synced.update[0].linux.resources.cpu.cpus == "1"
        assert handlers.synced == [["pod-1/pinned", "pod-1/free", "llm"]]  # both parts, one decision
        assert plugin.wait_registered(5) and plugin.state.runtime == "fake 0.0"
        started = time.monotonic()
        answer = runtime.call("CreateContainer", nri.CreateContainerRequest(
            pod=nri.PodSandbox(id="pod-1"), container=nri.Container(id="c2", name="new")).SerializeToString())
        elapsed = time.monotonic() - started
        adjust = nri.CreateContainerResponse.FromString(answer.payload).adjust
        cpu = adjust.linux.resources.cpu
        assert answer.code == wire.OK and (cpu.cpus, cpu.mems) == ("1", "0")
        assert elapsed < 0.5, elapsed
        removed = runtime.call("StateChange", nri.StateChangeEvent(
            event=nri.REMOVE_CONTAINER, container=nri.Container(id="c2")).SerializeToString())
        assert removed.code == wire.OK and handlers.removed == ["c2"]  # what runtimes before NRI v0.12 send
        assert runtime.call("ValidateContainerAdjustment", b"").code == wire.UNIMPLEMENTED
        assert runtime.call("Anything", b"", service="other.Service").code == wire.UNIMPLEMENTED
        handlers.fail = True
        failed = runtime.call("CreateContainer", nri.CreateContainerRequest(
            container=nri.Container(id="c3")).SerializeToString())
        assert failed.code == wire.OK  # our bug never fails the runtime's CreateContainer
        assert nri.CreateContainerResponse.FromString(failed.payload) == nri.CreateContainerResponse()
    finally:
        plugin.stop()


def test_the_plugin_dials_again_when_the_runtime_goes_away(runtime: FakeRuntime) -> None:
    handlers = Recorder()
    plugin = NriPlugin(handlers, runtime.path, backoff=(0.05, 0.2))
    plugin.start()
    try:
        runtime.handshake()
        assert plugin.wait_registered(5)
        runtime.drop()  # the runtime restarts
        wait_until("the plugin saw the trunk close", lambda: not plugin.state.registered, 5)
        runtime.handshake(nri.Container(id="c9", pod_sandbox_id="pod-1", name="pinned"))
        assert plugin.wait_registered(5) and plugin.state.connections == 2
        assert handlers.synced[-1] == ["pod-1/pinned", "llm"]  # created while away: repaired here
    finally:
        plugin.stop()


def test_without_a_runtime_the_plugin_backs_off_and_stops_at_once() -> None:
    path = short_tmpdir() / "absent.sock"
    plugin = NriPlugin(Recorder(), path, backoff=(0.05, 0.2))
    plugin.start()
    wait_until("the failure recorded", lambda: "cannot connect" in plugin.state.last_error, 5)
    started = time.monotonic()
    plugin.stop()
    assert time.monotonic() - started < 1.0
    assert not plugin.state.registered


def test_a_registration_the_runtime_never_answers_times_out_and_is_retried(runtime: FakeRuntime) -> None:
    plugin = NriPlugin(Recorder(), runtime.path, backoff=(0.05, 0.2), register_timeout=0.5)
    accepted = threading.Event()

    def silent() -> None:
        runtime.accept()
        accepted.set()

    thread = threading.Thread(target=silent)
    thread.start()
    plugin.start()
    try:
        thread.join(5)
        assert accepted.is_set()
        wait_until("the registration timed out", lambda: "cannot register" in plugin.state.last_error, 10)
        runtime.drop()
        runtime.handshake()  # the next attempt registers
        assert plugin.wait_registered(5)
    finally:
        plugin.stop()


def test_a_runtime_that_registers_but_never_synchronizes_is_dialed_again(runtime: FakeRuntime) -> None:
    plugin = NriPlugin(Recorder(), runtime.path, backoff=(0.05, 0.2), register_timeout=0.3)
    plugin.start()
    try:
        runtime.accept()
        runtime.serve_register()  # then silence: no Configure, no Synchronize
        wait_until("the plugin gave up on it", lambda: "no Synchronize" in plugin.state.last_error, 5)
        runtime.drop()
        runtime.handshake()
        assert plugin.wait_registered(5)
    finally:
        plugin.stop()


def test_a_runtime_that_goes_away_before_synchronizing_is_dialed_again_at_once(runtime: FakeRuntime) -> None:
    plugin = NriPlugin(Recorder(), runtime.path, backoff=(0.05, 0.2), register_timeout=30)
    plugin.start()
    try:
        runtime.accept()
        runtime.serve_register()
        runtime.drop()  # gone after the registration: not the 60 s wait for a Synchronize that cannot come
        runtime.handshake()  # accept() gives it 5 s
        assert plugin.wait_registered(5)
    finally:
        plugin.stop()


def test_unsolicited_updates_only_from_nri_v0_12_1_on() -> None:
    """Before NRI v0.12.1 (containerd before 2.4) an unsolicited UpdateContainers can deadlock the runtime."""
    assert nri_version_at_least("v0.12.3", (0, 12, 1)) and nri_version_at_least("v0.13.0-rc.1", (0, 12, 1))
    assert not nri_version_at_least("v0.12.0", (0, 12, 1))
    assert not nri_version_at_least("", (0, 12, 1)) and not nri_version_at_least("unknown", (0, 12, 1))


def test_a_refused_creation_fails_with_its_reason_and_the_plugin_stays(runtime: FakeRuntime) -> None:
    """A handler's Refused is a non-OK status with its text (the runtime fails that one creation, non-fatal for
    the plugin: NRI isFatalError), not an empty answer that would create the container on every CPU."""
    from agent.nri.stub import Refused

    class Refusing(Recorder):
        def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.CreateContainerResponse:
            raise Refused("the shared pool is empty")

    plugin = NriPlugin(Refusing(), runtime.path)
    plugin.start()
    try:
        runtime.handshake()
        assert plugin.wait_registered(5)
        answer = runtime.call("CreateContainer", nri.CreateContainerRequest(
            pod=nri.PodSandbox(id="pod-1"), container=nri.Container(id="c2", name="new")).SerializeToString())
        assert answer.code == wire.RESOURCE_EXHAUSTED and answer.message == "topology-agent: the shared pool is empty"
        assert plugin.state.registered and plugin.state.refusals == 1
        stopped = runtime.call("StopContainer", nri.StopContainerRequest(container=nri.Container(id="c2"))
                               .SerializeToString())
        assert stopped.code == wire.OK
    finally:
        plugin.stop()


def test_a_request_envelope_that_does_not_decode_is_refused_on_its_stream_and_the_trunk_serves_on() -> None:
    """As Go's ttrpc server: InvalidArgument on that stream id, the connection kept (../shared/docs/nri.md §1.3)."""
    from agent.nri.ttrpc import Trunk

    ours, theirs = socket.socketpair()
    trunk = Trunk(ours, lambda request: Response(0, "", b"served"))
    trunk.start()
    try:
        theirs.sendall(mux_frames(wire.PLUGIN_CONN, ttrpc_message(1, wire.REQUEST, b"\x0a\xff")))  # cut inside a field
        theirs.sendall(mux_frames(wire.PLUGIN_CONN, ttrpc_message(3, wire.REQUEST,
                                                                  Request(PLUGIN_SERVICE, "Shutdown").encode())))
        theirs.settimeout(5.0)
        demux, answers = Demux(), list[tuple[int, Response]]()
        while len(answers) < 2:
            data = theirs.recv(65536)
            assert data, trunk.close_reason
            for conn in demux.feed(data):
                answers += [(m.stream, Response.decode(m.data)) for m in messages(demux.streams[conn])]
        (first, refused), (second, served) = answers
        assert (first, refused.code) == (1, wire.INVALID_ARGUMENT) and "cannot decode" in refused.message
        assert (second, served.code, served.payload) == (3, wire.OK, b"served") and not trunk.closed
    finally:
        trunk.close()
        theirs.close()
