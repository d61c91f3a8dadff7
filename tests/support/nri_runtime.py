"""A fake container runtime's side of the NRI trunk, for the plugin's protocol tests and the live attack: it
listens where the plugin dials, serves RegisterPlugin and calls the Plugin service as containerd does, and can send
whatever bytes a test wants."""

from __future__ import annotations

import socket
from pathlib import Path

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.nri import wire
from agent.nri.stub import EVENTS, PLUGIN_SERVICE, RUNTIME_SERVICE
from agent.nri.wire import Demux, Request, Response, messages, mux_frames, ttrpc_message


class FakeRuntime:
    """The runtime's side of the trunk: listens, accepts one plugin at a time, serves RegisterPlugin
    on conn 2 and calls the Plugin service on conn 1 (odd, increasing stream ids)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.conn: socket.socket | None = None
        self.demux = Demux()
        self.registered: list[nri.RegisterPluginRequest] = []
        self.stream = 1

    def accept(self, timeout: float = 5.0) -> None:
        self.listener.settimeout(timeout)
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(timeout)
        self.demux = Demux()
        self.stream = 1

    def _next(self, conn_id: int) -> wire.Message:
        assert self.conn is not None
        while True:
            stream = self.demux.streams.get(conn_id)
            if stream is not None:
                for message in messages(stream):
                    return message
            data = self.conn.recv(65536)
            assert data, "the plugin closed the trunk"
            self.demux.feed(data)

    def serve_register(self) -> None:
        assert self.conn is not None
        message = self._next(wire.RUNTIME_CONN)
        request = Request.decode(message.data)
        assert (request.service, request.method) == (RUNTIME_SERVICE, "RegisterPlugin")
        assert message.stream % 2 == 1 and request.timeout_nano > 0
        self.registered.append(nri.RegisterPluginRequest.FromString(request.payload))
        self.conn.sendall(mux_frames(wire.RUNTIME_CONN, ttrpc_message(message.stream, wire.RESPONSE,
                                                                       Response().encode())))

    def call(self, method: str, payload: bytes, service: str = PLUGIN_SERVICE) -> Response:
        assert self.conn is not None
        stream, self.stream = self.stream, self.stream + 2
        request = Request(service, method, payload, timeout_nano=2_000_000_000)
        self.conn.sendall(mux_frames(wire.PLUGIN_CONN, ttrpc_message(stream, wire.REQUEST, request.encode())))
        message = self._next(wire.PLUGIN_CONN)
        assert message.stream == stream and message.kind == wire.RESPONSE
        return Response.decode(message.data)

    def handshake(self, *containers: nri.Container, split: bool = False) -> nri.SynchronizeResponse:
        self.accept()
        self.serve_register()
        configured = self.call("Configure", nri.ConfigureRequest(
            runtime_name="fake", runtime_version="0.0", request_timeout=2000).SerializeToString())
        assert configured.code == wire.OK
        assert nri.ConfigureResponse.FromString(configured.payload).events == EVENTS
        pod = nri.PodSandbox(id="pod-1", name="llm", namespace="default", uid="u1")
        if split:
            part = self.call("Synchronize", nri.SynchronizeRequest(pods=[pod], more=True).SerializeToString())
            assert nri.SynchronizeResponse.FromString(part.payload) == nri.SynchronizeResponse(more=True)
            final = nri.SynchronizeRequest(containers=list(containers))
        else:
            final = nri.SynchronizeRequest(pods=[pod], containers=list(containers))
        answer = self.call("Synchronize", final.SerializeToString())
        assert answer.code == wire.OK
        return nri.SynchronizeResponse.FromString(answer.payload)

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def close(self) -> None:
        self.drop()
        self.listener.close()
