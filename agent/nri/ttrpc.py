"""One NRI trunk: a Unix stream socket carrying two ttrpc connections through NRI's multiplexer.

On conn 1 this side is the ttrpc *server* (the runtime calls the Plugin service); on conn 2 it is
the *client* (we call the Runtime service). One reader thread reads the trunk; each request on
conn 1 is answered by ``serve`` on that thread (handlers are pure and quick: no I/O, so none can
hold up the replies the runtime waits for), and each response on conn 2 wakes its caller.
Writes hold one lock, a frame at a time never interleaves, and a write that cannot finish within
``send_timeout`` closes the trunk rather than hang.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable

from agent.nri.wire import (
    INTERNAL,
    INVALID_ARGUMENT,
    PLUGIN_CONN,
    REQUEST,
    RESPONSE,
    RUNTIME_CONN,
    Demux,
    Message,
    Request,
    Response,
    WireError,
    messages,
    mux_frames,
    ttrpc_message,
)

log = logging.getLogger("topology-agent.nri")

Serve = Callable[[Request], Response]


class TrunkClosed(Exception):
    """The trunk is closed (the runtime went away, or this side closed it)."""


class CallTimeout(Exception):
    """The runtime did not answer a call in time."""


class Trunk:
    def __init__(self, sock: socket.socket, serve: Serve, *, send_timeout: float = 2.0,
                 on_close: Callable[[str], None] | None = None) -> None:
        self._sock = sock
        self._serve = serve
        self._send_timeout = send_timeout
        self._on_close = on_close
        self._send_lock = threading.Lock()
        self._calls_lock = threading.Lock()
        self._next_stream = 1
        self._waiting: dict[int, tuple[threading.Event, list[Response]]] = {}
        self._closed = threading.Event()
        self.close_reason = ""
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._sock.settimeout(None)
        self._thread = threading.Thread(target=self._read, name="nri-trunk", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def wait_closed(self, timeout: float | None = None) -> bool:
        return self._closed.wait(timeout)

    def close(self, reason: str = "closed by the plugin") -> None:
        with self._calls_lock:
            if self._closed.is_set():
                return
            self.close_reason = reason
            self._closed.set()
            waiting = list(self._waiting.values())
            self._waiting.clear()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        for event, _ in waiting:
            event.set()
        if self._on_close is not None:
            self._on_close(reason)

    def join(self, timeout: float = 5.0) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # --- calls to the runtime (conn 2) -------------------------------------------------------------
    def call(self, service: str, method: str, payload: bytes, timeout: float) -> Response:
        event = threading.Event()
        box: list[Response] = []
        with self._calls_lock:
            if self._closed.is_set():
                raise TrunkClosed(self.close_reason)
            stream = self._next_stream
            self._next_stream += 2  # client streams are odd and increasing
            self._waiting[stream] = (event, box)
        request = Request(service, method, payload, timeout_nano=int(timeout * 1e9))
        self._send(RUNTIME_CONN, ttrpc_message(stream, REQUEST, request.encode()))
        if not event.wait(timeout):
            with self._calls_lock:
                self._waiting.pop(stream, None)
            raise CallTimeout(f"{method}: no answer within {timeout:.1f} s")
        if not box:
            raise TrunkClosed(self.close_reason)
        return box[0]

    # --- the wire ----------------------------------------------------------------------------------
    def _send(self, conn: int, message: bytes) -> None:
        data = mux_frames(conn, message)
        with self._send_lock:
            if self._closed.is_set():
                raise TrunkClosed(self.close_reason)
            try:
                self._sock.settimeout(self._send_timeout)
                self._sock.sendall(data)
            except OSError as exc:
                self.close(f"write failed: {exc}")
                raise TrunkClosed(self.close_reason) from None

    def _read(self) -> None:
        demux = Demux()
        reason = "the runtime closed the connection"
        try:
            while not self._closed.is_set():
                try:
                    data = self._sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                for conn in demux.feed(data):
                    for message in messages(demux.streams[conn]):
                        self._dispatch(conn, message)
        except WireError as exc:
            reason = f"protocol error: {exc}"
        except OSError as exc:
            reason = f"read failed: {exc}"
        except TrunkClosed:
            pass
        self.close(reason)

    def _dispatch(self, conn: int, message: Message) -> None:
        if conn == RUNTIME_CONN and message.kind == RESPONSE:
            with self._calls_lock:
                waiter = self._waiting.pop(message.stream, None)
            if waiter is None:
                log.debug("NRI: a late answer on stream %d dropped", message.stream)
                return
            waiter[1].append(Response.decode(message.data))
            waiter[0].set()
        elif conn == PLUGIN_CONN and message.kind == REQUEST:
            try:
                request = Request.decode(message.data)
            except WireError as exc:  # one envelope that is not a Request: refused on its stream, as Go's ttrpc does
                self._send(PLUGIN_CONN, ttrpc_message(message.stream, RESPONSE,
                                                      Response(INVALID_ARGUMENT, str(exc)).encode()))
                return
            try:
                response = self._serve(request)
            except Exception as exc:  # a handler's bug answers an error, never ends the trunk
                log.exception("NRI request failed")
                response = Response(INTERNAL, f"topology-agent: {exc}")
            self._send(PLUGIN_CONN, ttrpc_message(message.stream, RESPONSE, response.encode()))
        else:
            log.debug("NRI: message of type %d on conn %d ignored", message.kind, conn)
