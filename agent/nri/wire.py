"""NRI's wire, bottom to top, as pure functions (../shared/docs/nri.md §1-§2): the multiplexer's frames (conn 1 the
Plugin service, conn 2 the Runtime service), ttrpc's messages, and ttrpc's ``Request``/``Response`` envelopes (the
messages generated from ttrpc's ``request.proto`` and googleapis' ``google/rpc/status.proto``, behind two small
records).

Must hold: every frame sent is at most 4096 bytes (Go's reader fails a larger one); messages are unary requests and
responses, client streams odd and increasing, data at most 4 MiB. The formats, field by field:
docs/contributing/design/nri-protocol.md."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from agent._proto.googleapis.google.rpc import status_pb2
from agent._proto.ttrpc import request_pb2 as ttrpc_pb2

PLUGIN_CONN = 1  # the runtime's ttrpc client -> our Plugin service
RUNTIME_CONN = 2  # our ttrpc client -> the runtime's Runtime service
MUX_HEADER = struct.Struct(">II")
TTRPC_HEADER = struct.Struct(">IIBB")
MAX_FRAME = 4096  # payload bytes per mux frame we send
MAX_MESSAGE = 4 << 20  # ttrpc's data limit
MAX_RECEIVED_FRAME = MAX_MESSAGE + TTRPC_HEADER.size  # the Go writer may send a whole message in one frame

REQUEST = 1
RESPONSE = 2

# google.rpc codes we send or read
OK = 0
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13


class WireError(Exception):
    """The peer sent something this side cannot read: the connection is to be closed."""


# --- the multiplexer ------------------------------------------------------------------------------

def mux_frames(conn: int, data: bytes) -> bytes:
    """``data`` of one logical connection as mux frames of at most MAX_FRAME payload bytes."""
    out = bytearray()
    for start in range(0, len(data), MAX_FRAME):
        chunk = data[start:start + MAX_FRAME]
        out += MUX_HEADER.pack(conn, len(chunk)) + chunk
    return bytes(out)


class Demux:
    """Cuts a trunk's bytes into frames and joins each conn's payloads into its byte stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.streams: dict[int, bytearray] = {}

    def feed(self, data: bytes) -> list[int]:
        """Take trunk bytes; the conns whose streams grew."""
        self._buffer += data
        grew: list[int] = []
        while len(self._buffer) >= MUX_HEADER.size:
            conn, size = MUX_HEADER.unpack_from(self._buffer)
            if size > MAX_RECEIVED_FRAME:
                raise WireError(f"mux frame of {size} bytes on conn {conn}")
            if len(self._buffer) < MUX_HEADER.size + size:
                break
            payload = bytes(self._buffer[MUX_HEADER.size:MUX_HEADER.size + size])
            del self._buffer[:MUX_HEADER.size + size]
            if conn in (PLUGIN_CONN, RUNTIME_CONN):  # frames for a conn not open are dropped, as upstream does
                self.streams.setdefault(conn, bytearray()).extend(payload)
                if conn not in grew:
                    grew.append(conn)
        return grew


# --- ttrpc messages -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Message:
    stream: int
    kind: int  # REQUEST | RESPONSE
    flags: int
    data: bytes


def ttrpc_message(stream: int, kind: int, data: bytes) -> bytes:
    if len(data) > MAX_MESSAGE:
        raise WireError(f"a ttrpc message of {len(data)} bytes is over the 4 MiB limit")
    return TTRPC_HEADER.pack(len(data), stream, kind, 0) + data


def messages(stream: bytearray) -> Iterator[Message]:
    """Every whole ttrpc message at the head of ``stream`` (consumed); a partial one stays."""
    while len(stream) >= TTRPC_HEADER.size:
        size, sid, kind, flags = TTRPC_HEADER.unpack_from(stream)
        if size > MAX_MESSAGE:
            raise WireError(f"ttrpc message of {size} bytes on stream {sid}")
        if len(stream) < TTRPC_HEADER.size + size:
            return
        data = bytes(stream[TTRPC_HEADER.size:TTRPC_HEADER.size + size])
        del stream[:TTRPC_HEADER.size + size]
        yield Message(sid, kind, flags, data)


# --- ttrpc's envelope ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Request:
    service: str
    method: str
    payload: bytes = b""
    timeout_nano: int = 0
    metadata: tuple[tuple[str, str], ...] = field(default=())

    def encode(self) -> bytes:
        return ttrpc_pb2.Request(service=self.service, method=self.method, payload=self.payload,
                                 timeout_nano=self.timeout_nano,
                                 metadata=[ttrpc_pb2.KeyValue(key=k, value=v) for k, v in self.metadata],
                                 ).SerializeToString()

    @classmethod
    def decode(cls, data: bytes) -> Request:
        request = _parse(ttrpc_pb2.Request, data)
        return cls(request.service, request.method, request.payload, request.timeout_nano,
                   tuple((kv.key, kv.value) for kv in request.metadata))


@dataclass(frozen=True, slots=True)
class Response:
    code: int = OK
    message: str = ""
    payload: bytes = b""

    def encode(self) -> bytes:
        # The Go server always sets status (empty for OK): a present, possibly empty, message field.
        return ttrpc_pb2.Response(status=status_pb2.Status(code=self.code, message=self.message),
                                  payload=self.payload).SerializeToString()

    @classmethod
    def decode(cls, data: bytes) -> Response:
        response = _parse(ttrpc_pb2.Response, data)
        return cls(response.status.code, response.status.message, response.payload)


def _parse(kind: Any, data: bytes) -> Any:
    try:
        return kind.FromString(data)
    except DecodeError as exc:
        raise WireError(f"cannot decode a ttrpc {kind.__name__}: {exc}") from None
