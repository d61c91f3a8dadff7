"""Door: the NRI socket, from a runtime that is buggy or hostile. Mux frames and ttrpc messages cut anywhere,
oversized, on conns that are not open; requests for services and methods that do not exist, payloads that are not
the message, carry unknown fields or are cut short; events out of order (a creation before Configure, an update for
a container never created). The agent's side is the real trunk (agent/nri/ttrpc.py) serving the real plugin and
NRI enforcement over a socketpair. Right answer: every whole request is answered on its stream, in order; refusal:
an error code (INVALID_ARGUMENT, UNIMPLEMENTED, RESOURCE_EXHAUSTED) or, for bytes that break the framing, the trunk
closed with a one-line reason. Never: a dead reader with the trunk still open, an INTERNAL (a handler that raised).
"""

from __future__ import annotations

import socket
import struct
from functools import partial
from typing import Any

from hypothesis import strategies as st

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.devices.table import NodeDevices
from agent.enforce.nri_hooks import NriEnforcement
from agent.nri.stub import PLUGIN_SERVICE
from agent.nri.ttrpc import Trunk
from agent.nri.wire import (
    INTERNAL,
    MAX_MESSAGE,
    PLUGIN_CONN,
    REQUEST,
    RESPONSE,
    RUNTIME_CONN,
    TTRPC_HEADER,
    Demux,
    Request,
    Response,
    WireError,
    messages,
    mux_frames,
    ttrpc_message,
)
from agent.plugin.servicer import render as render_wire
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from tests.fuzz.common import door, refused
from tests.support.enforcement import DOMAIN, annotated, container, pod, three_books

SETTINGS = GroupingSettings(levels=("book",))
GROUPING = group_topology(three_books(), SETTINGS)
METHODS = ["Configure", "Synchronize", "CreateContainer", "UpdateContainer", "StopContainer", "RemoveContainer",
           "StateChange", "Shutdown", "RegisterPlugin", "", "configure", "Nope"]


def enforcement() -> NriEnforcement:
    devices = NodeDevices(GROUPING, SETTINGS, AllocationSettings(), render_wire)
    groups = {(g.resource, g.id): g for g in GROUPING.groups}
    return NriEnforcement(devices, groups, DOMAIN, online=lambda: frozenset({0, 1, 2}), reserved=frozenset(),
                          shared_pool=True, cpu_manager_policy=lambda: None)


@st.composite
def containers(draw: st.DrawFn) -> tuple[nri.PodSandbox, nri.Container]:
    name = draw(st.sampled_from(["a", "b", "c"]))
    notes = annotated(GROUPING, draw(st.integers(0, 2))) if draw(st.booleans()) else {}
    c = container(f"c-{name}-{draw(st.integers(0, 3))}", name, notes,
                  cpus=draw(st.sampled_from(["", "0", "0-2", "1,2", "x", "5-1", "0-99999999"])))
    c.state = draw(st.sampled_from([nri.CONTAINER_RUNNING, nri.CONTAINER_CREATED, nri.CONTAINER_STOPPED, 0, 99]))
    return pod(name), c


@st.composite
def payloads(draw: st.DrawFn, method: str) -> bytes:
    p, c = draw(containers())
    message: Any = {
        "Configure": nri.ConfigureRequest(runtime_name="fuzz", runtime_version="1", NRI_version="v0.12.1",
                                          request_timeout=draw(st.integers(-5, 10_000))),
        "Synchronize": nri.SynchronizeRequest(pods=[p], containers=[c], more=draw(st.booleans())),
        "CreateContainer": nri.CreateContainerRequest(pod=p, container=c),
        "UpdateContainer": nri.UpdateContainerRequest(pod=p, container=c, linux_resources=nri.LinuxResources(
            cpu=nri.LinuxCPU(cpus=draw(st.sampled_from(["", "1", "0-2", "x,y"]))))),
        "StopContainer": nri.StopContainerRequest(pod=p, container=c),
        "RemoveContainer": nri.RemoveContainerRequest(pod=p, container=c),
        "StateChange": nri.StateChangeEvent(event=draw(st.integers(0, 20)), pod=p, container=c),
    }.get(method, nri.Empty())
    data = message.SerializeToString()
    how = draw(st.sampled_from(["whole", "whole", "unknown-field", "cut", "garbage"]))
    if how == "unknown-field":  # field 4000, wire type 2 (length-delimited): an unknown field protobuf keeps
        data += b"\x82\xfa\x01" + bytes([len(tail := draw(st.binary(max_size=20)))]) + tail
    elif how == "cut":
        data = data[:draw(st.integers(0, len(data)))]
    elif how == "garbage":
        data = draw(st.binary(max_size=64))
    return data


@st.composite
def frames(draw: st.DrawFn) -> tuple[bytes, int]:
    """Bytes the runtime sends, and how many whole requests on conn 1 they carry (-1: the framing breaks)."""
    kind = draw(st.sampled_from(["request"] * 6 + ["garbage-request", "response", "other-conn", "oversized"]))
    stream = draw(st.integers(0, 2**32 - 1))
    if kind == "request":
        method = draw(st.sampled_from(METHODS))
        service = PLUGIN_SERVICE if draw(st.integers(0, 5)) else draw(st.sampled_from(["", "x.Runtime", "\u00e9"]))
        body = Request(service, method, draw(payloads(method))).encode()
        return mux_frames(PLUGIN_CONN, ttrpc_message(stream, REQUEST, body)), 1
    if kind == "garbage-request":  # a whole ttrpc message whose envelope is not a Request
        return mux_frames(PLUGIN_CONN, ttrpc_message(stream, REQUEST, draw(st.binary(max_size=40)))), 1
    if kind == "response":  # an answer to a call never made
        return mux_frames(RUNTIME_CONN, ttrpc_message(stream, RESPONSE, draw(st.binary(max_size=40)))), 0
    if kind == "other-conn":
        return mux_frames(draw(st.integers(3, 2**32 - 1)), draw(st.binary(max_size=40))), 0
    return struct.pack(">II", PLUGIN_CONN, MAX_MESSAGE + 1000), -1


@door("nri-wire", "nri", st.lists(st.binary(max_size=64), max_size=20))
def nri_wire(chunks: list[bytes]) -> None:
    """Any bytes: the demultiplexer and the message reader take them or raise WireError; nothing piles up."""
    demux = Demux()
    for chunk in chunks:
        try:
            for conn in demux.feed(chunk):
                for message in messages(demux.streams[conn]):
                    refused(partial(Request.decode, message.data), WireError)
                    refused(partial(Response.decode, message.data), WireError)
        except WireError as exc:
            assert "\n" not in str(exc)
            return
        assert all(len(s) < TTRPC_HEADER.size + MAX_MESSAGE for s in demux.streams.values())


def read_answers(sock: socket.socket, wanted: int) -> tuple[list[Response], bool]:
    """The responses on conn 1 until ``wanted`` arrived or the trunk closed (True)."""
    demux, answers = Demux(), list[Response]()
    sock.settimeout(3.0)
    while len(answers) < wanted:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"no answer and no close within 3 s ({len(answers)} of {wanted})") from None
        except ConnectionResetError:
            return answers, True
        if not data:
            return answers, True
        for conn in demux.feed(data):
            for message in messages(demux.streams[conn]):
                assert conn == PLUGIN_CONN and message.kind == RESPONSE, (conn, message)
                answers.append(Response.decode(message.data))
    return answers, False


@door("nri-trunk", "nri", st.lists(frames(), max_size=12), st.integers(1, 64))
def nri_trunk(sent: list[tuple[bytes, int]], chunk: int) -> None:
    """The runtime's bytes in pieces of ``chunk``, then one valid probe: every whole request answered in order
    and the probe too, or (only when the framing broke) the trunk closed with a reason."""
    ours, theirs = socket.socketpair()
    plugin = enforcement().plugin
    trunk = Trunk(ours, plugin.serve, send_timeout=2.0)
    trunk.start()
    try:
        probe = mux_frames(PLUGIN_CONN, ttrpc_message(1, REQUEST, Request(PLUGIN_SERVICE, "Shutdown").encode()))
        data = b"".join(b for b, _ in sent) + probe
        broken = any(n < 0 for _, n in sent)
        expected = sum(n for _, n in sent if n > 0) + 1
        theirs.settimeout(3.0)
        for start in range(0, len(data), chunk * 97):
            try:
                theirs.sendall(data[start:start + chunk * 97])
            except (BrokenPipeError, ConnectionResetError):
                break
        answers, closed = read_answers(theirs, expected)
        if closed:
            assert broken, f"the trunk closed on input that keeps the framing: {trunk.close_reason}"
            assert trunk.wait_closed(3.0) and trunk.close_reason and "\n" not in trunk.close_reason
        else:
            assert len(answers) == expected and answers[-1].code == 0  # the probe
            assert not trunk.closed
        assert all(a.code != INTERNAL for a in answers), [a.message for a in answers if a.code == INTERNAL]
    finally:
        trunk.close()
        theirs.close()
        trunk.join(3.0)
