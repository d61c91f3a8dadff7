"""A fake Kubernetes API server on 127.0.0.1, over HTTP or HTTPS, for tests and benches: every request recorded,
each answered with JSON by a function the caller gives (the request in, a status and a body out).

    with FakeApiServer(lambda request: (200, {"kind": "Status"})) as api:
        ... api.url ..., api.requests

The answer function holds what the fake knows (a Node, ResourceSlices, discovery); this class holds the HTTP: one
handler for every verb, a Content-Length on every answer, an answer function that raises answered 500 with its
message (the test then fails on what the client saw, not on a hung connection).
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Request:
    method: str
    target: str  # the request target: path and query
    headers: Message = field(repr=False)  # case-insensitive: headers.get("Authorization")
    body: bytes = field(repr=False)
    at: float  # time.monotonic() when it arrived

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


Answer = Callable[[Request], tuple[int, Any]]


class FakeApiServer:
    """Serves ``answer`` on a free port of 127.0.0.1 from a thread of its own until :meth:`close`.

    ``tls``: (certificate, key) to serve HTTPS; ``keep_alive``: HTTP/1.1 with persistent connections, as a real
    API server speaks to a long-running client."""

    def __init__(self, answer: Answer, *, tls: tuple[Path, Path] | None = None, keep_alive: bool = False) -> None:
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(self.command, self.path, self.headers,
                                  self.rfile.read(length) if length else b"", time.monotonic())
                with server.lock:
                    server.requests.append(request)
                try:
                    status, body = answer(request)
                except Exception as exc:  # the fake's own bug: an answer the client can report
                    status, body = 500, {"kind": "Status", "code": 500, "message": f"fake API server: {exc!r}"}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = int(self.httpd.server_address[1])
        self.url = f"{'https' if tls is not None else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="fake-apiserver", daemon=True)
        self._thread.start()

    def count(self, method: str | None = None, since: float = 0.0) -> int:
        """Requests of ``method`` (any: None) that arrived at or after ``since`` (time.monotonic())."""
        with self.lock:
            return sum(1 for r in self.requests if (method is None or r.method == method) and r.at >= since)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
