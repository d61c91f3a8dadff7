"""The agent's HTTP endpoint: /metrics (prometheus-client's exposition), /healthz, /readyz and /allocations, on one
asyncio event loop in a thread of its own; the default (empty) address listens on every address of both families
(one IPv6 socket that also accepts IPv4, or IPv4 alone where the node has no IPv6).

Must hold: nothing here can take a thread from gRPC, and the network cannot exhaust it: an idle connection costs a
file descriptor, never a thread; a request must arrive within :data:`IDLE_TIMEOUT` seconds; at most
:func:`max_connections` are open (a new one closes the longest-idle one, so a probe always gets through); only GET
and HEAD; no Server header; with descriptors exhausted, accepting pauses for a second instead of spinning."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agent.errors import EndpointError

log = logging.getLogger("topology-agent.http")

IDLE_TIMEOUT = 10.0  # seconds a connection may wait before (or between) requests
MAX_REQUEST_HEAD = 8 * 1024  # request line and headers
MAX_REQUESTS_PER_CONNECTION = 1000
BACKLOG = 128


def max_connections() -> int:
    """Open connections at most: a quarter of the descriptor limit, at most 512, at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = soft if soft != resource.RLIM_INFINITY else 4096
    return max(16, min(512, limit // 4))


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())


Respond = Callable[[str], Reply]  # path -> reply (GET; HEAD sends the same headers without the body)
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           500: "Internal Server Error", 503: "Service Unavailable"}


def make_app(registry: CollectorRegistry, live: Callable[[], bool], ready: Callable[[], tuple[bool, str]],
             allocations: Callable[[], dict[str, object]]) -> Respond:
    def respond(path: str) -> Reply:
        if path == "/metrics":
            return Reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
        if path == "/healthz":
            ok = live()
            return Reply(200 if ok else 500, b"ok\n" if ok else b"plugin manager stopped\n")
        if path == "/readyz":
            ok, why = ready()
            return Reply(200 if ok else 503, f"{why}\n".encode())
        if path == "/allocations":
            return Reply(200, json.dumps(allocations(), indent=1).encode(), "application/json")
        return Reply(404, b"not found: try /metrics, /healthz, /readyz, /allocations\n")

    return respond


def _bind(address: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``address`` ("" or "::": both families where the node has IPv6)."""
    host = address.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in ("", "::"):
        try:
            six = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        except OSError:
            if host == "::":
                raise
            six = None
        if six is not None:
            try:
                six.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                six.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too, as ::ffff:a.b.c.d
                six.bind(("::", port))
                return [six]
            except OSError:
                six.close()
                if host == "::":
                    raise
        host = "0.0.0.0"
    infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
    except OSError:
        sock.close()
        raise
    return [sock]


class HttpEndpoint:
    """The bound port (bound when made, so a taken port stops the start-up); serves once started."""

    def __init__(self, address: str, port: int) -> None:
        try:
            self._sockets = _bind(address, port)
        except (OSError, UnicodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise EndpointError(f"cannot serve metrics on {address or '*'}:{port}: {reason} "
                                "(choose another --metrics-address or --metrics-port, or port 0 to disable)") from None
        self.port = self._sockets[0].getsockname()[1]
        self.families = [s.family for s in self._sockets]
        self.max_connections = max_connections()
        self.connections = 0
        self.evicted = 0
        self._idle: dict[asyncio.StreamWriter, float] = {}  # connections waiting for a request -> since
        self._respond: Respond | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self, respond: Respond) -> None:
        self._respond = respond
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()
        self._ready.wait(5)
        log.info("serving /metrics, /healthz, /readyz, /allocations on port %d", self.port)

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended (it failed to start, or stopped)
                loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=5)
            self._thread = None
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    # --- the event loop's side ----------------------------------------------------------------
    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        servers = []
        try:
            for sock in self._sockets:
                servers.append(loop.run_until_complete(asyncio.start_server(
                    self._serve_connection, sock=sock, backlog=BACKLOG, limit=MAX_REQUEST_HEAD)))
            self._ready.set()
            loop.run_forever()
        finally:
            for server in servers:
                server.close()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.sleep(0))
            loop.close()
            self._ready.set()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= self.max_connections and self._idle:
            oldest = min(self._idle, key=self._idle.__getitem__)  # make room: the longest-idle one goes
            self._idle.pop(oldest)
            self.evicted += 1
            oldest.close()
        self.connections += 1
        loop = asyncio.get_running_loop()
        try:
            for _ in range(MAX_REQUESTS_PER_CONNECTION):
                self._idle[writer] = loop.time()
                if not await self._one_request(reader, writer):
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            self._idle.pop(writer, None)
            self.connections -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read and answer one request; False when the connection should close."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT)
        except (TimeoutError, asyncio.IncompleteReadError):
            return False
        except asyncio.LimitOverrunError:
            self._idle.pop(writer, None)
            await self._send(writer, "GET", Reply(400, b"request head too large\n"), close=True)
            return False
        self._idle.pop(writer, None)  # busy now: never the one closed to make room
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._send(writer, "GET", Reply(400, b"bad request line\n"), close=True)
            return False
        method, target, version = parts
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        keep_alive = (headers.get("connection", "").lower() != "close" if version == "HTTP/1.1"
                      else headers.get("connection", "").lower() == "keep-alive")
        if headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers:
            await self._send(writer, method, Reply(400, b"no request body expected\n"), close=True)
            return False
        if method not in ("GET", "HEAD"):
            reply = Reply(405, b"only GET and HEAD\n", headers=(("Allow", "GET, HEAD"),))
        else:
            assert self._respond is not None
            try:
                reply = self._respond(target.split("?", 1)[0])
            except Exception:
                log.exception("answering %s failed", target[:100])
                reply = Reply(500, b"internal error\n")
        await self._send(writer, method, reply, close=not keep_alive)
        return keep_alive

    async def _send(self, writer: asyncio.StreamWriter, method: str, reply: Reply, close: bool) -> None:
        head = [f"HTTP/1.1 {reply.status} {REASONS.get(reply.status, 'Unknown')}",
                f"Content-Type: {reply.content_type}", f"Content-Length: {len(reply.body)}",
                f"Connection: {'close' if close else 'keep-alive'}", *(f"{k}: {v}" for k, v in reply.headers)]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
            writer.write(reply.body)
        await asyncio.wait_for(writer.drain(), IDLE_TIMEOUT)
