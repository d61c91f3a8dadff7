"""NRI's wire, bottom to top, as pure functions (../shared/docs/nri.md §1-§2): the multiplexer's
frames, ttrpc's messages, and ttrpc's ``Request``/``Response`` envelopes.

* A mux frame is ``ConnID u32 BE | length u32 BE | payload``; conn 1 carries the Plugin service
  (the runtime calls, we serve), conn 2 the Runtime service (we call). Each conn's payloads form
  one byte stream. Go's reader fails a frame larger than its 4096-byte buffer, so every frame we
  send is at most 4096 bytes.
* A ttrpc message is ``length u32 BE | stream id u32 BE | type u8 | flags u8 | data``; requests
  (type 1) and responses (type 2), unary only, client streams odd and increasing, data at most
  4 MiB.
* ``ttrpc.Request{service=1, method=2, payload=3, timeout_nano=4, metadata=5}`` and
  ``ttrpc.Response{status=1 (google.rpc.Status{code=1, message=2}), payload=2}`` are five fields:
  encoded here by hand rather than vendoring ttrpc's and googleapis' protos for them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

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


# --- protobuf, the little ttrpc needs -------------------------------------------------------------

def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _bytes_field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: ints for varints, bytes for length-delimited."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            yield number, value
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise WireError("truncated length-delimited field")
            yield number, data[pos:pos + size]
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire}")
    if pos != len(data):
        raise WireError("truncated fixed-width field")


@dataclass(frozen=True, slots=True)
class Request:
    service: str
    method: str
    payload: bytes = b""
    timeout_nano: int = 0
    metadata: tuple[tuple[str, str], ...] = field(default=())

    def encode(self) -> bytes:
        out = _bytes_field(1, self.service.encode()) + _bytes_field(2, self.method.encode())
        if self.payload:
            out += _bytes_field(3, self.payload)
        if self.timeout_nano:
            out += _varint(4 << 3) + _varint(self.timeout_nano)
        return out

    @classmethod
    def decode(cls, data: bytes) -> Request:
        service = method = ""
        payload = b""
        timeout = 0
        metadata: list[tuple[str, str]] = []
        for number, value in _fields(data):
            if number == 1 and isinstance(value, bytes):
                service = value.decode(errors="replace")
            elif number == 2 and isinstance(value, bytes):
                method = value.decode(errors="replace")
            elif number == 3 and isinstance(value, bytes):
                payload = value
            elif number == 4 and isinstance(value, int):
                timeout = value - (1 << 64) if value >= 1 << 63 else value
            elif number == 5 and isinstance(value, bytes):
                kv = {n: v for n, v in _fields(value) if isinstance(v, bytes)}
                metadata.append((kv.get(1, b"").decode(errors="replace"), kv.get(2, b"").decode(errors="replace")))
        return cls(service, method, payload, timeout, tuple(metadata))


@dataclass(frozen=True, slots=True)
class Response:
    code: int = OK
    message: str = ""
    payload: bytes = b""

    def encode(self) -> bytes:
        status = b""
        if self.code:
            status += _varint(1 << 3) + _varint(self.code)
        if self.message:
            status += _bytes_field(2, self.message.encode())
        out = _bytes_field(1, status)  # the Go server always sets status (empty for OK)
        if self.payload:
            out += _bytes_field(2, self.payload)
        return out

    @classmethod
    def decode(cls, data: bytes) -> Response:
        code, message, payload = OK, "", b""
        for number, value in _fields(data):
            if number == 1 and isinstance(value, bytes):
                for n, v in _fields(value):
                    if n == 1 and isinstance(v, int):
                        code = v
                    elif n == 2 and isinstance(v, bytes):
                        message = v.decode(errors="replace")
            elif number == 2 and isinstance(value, bytes):
                payload = value
        return cls(code, message, payload)
