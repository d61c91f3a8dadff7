"""The agent's HTTP endpoint: /metrics (prometheus-client's own exposition), /healthz, /readyz
and /allocations, served by prometheus-client's threading WSGI server."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from agent.errors import EndpointError

log = logging.getLogger("topology-agent.http")

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No log line per scrape or probe."""


def make_app(registry: CollectorRegistry, live: Callable[[], bool], ready: Callable[[], tuple[bool, str]],
             allocations: Callable[[], dict[str, object]]) -> WsgiApp:
    metrics_app = make_wsgi_app(registry)

    def reply(start_response: StartResponse, status: str, body: bytes, content_type: str) -> list[bytes]:
        start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
        return [body]

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/healthz":
            ok = live()
            return reply(start_response, "200 OK" if ok else "500 Internal Server Error",
                         b"ok\n" if ok else b"plugin manager stopped\n", "text/plain")
        if path == "/readyz":
            ok, why = ready()
            return reply(start_response, "200 OK" if ok else "503 Service Unavailable", f"{why}\n".encode(),
                         "text/plain")
        if path == "/allocations":
            body = json.dumps(allocations(), indent=1).encode()
            return reply(start_response, "200 OK", body, "application/json")
        return reply(start_response, "404 Not Found", b"not found: try /metrics, /healthz, /readyz, /allocations\n",
                     "text/plain")

    return app


def _not_yet(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
    return [b"starting\n"]


class HttpEndpoint:
    """The bound port (bound when made, so a taken port stops the start-up); serves once started."""

    def __init__(self, address: str, port: int) -> None:
        try:
            self.server = make_server(address, port, _not_yet, ThreadingWSGIServer, handler_class=_QuietHandler)
        except OSError as exc:
            raise EndpointError(f"cannot serve metrics on {address}:{port}: {exc.strerror or exc} "
                                "(choose another --metrics-port, or 0 to disable)") from None
        self.port = self.server.server_port
        self._started = False
        self._thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    def start(self, app: WsgiApp) -> None:
        self.server.set_app(app)
        self._started = True
        self._thread.start()
        log.info("serving /metrics, /healthz, /readyz, /allocations on port %d", self.port)

    def stop(self) -> None:
        if self._started:  # shutdown() waits for serve_forever: never call it when that never ran
            self.server.shutdown()
            self._thread.join(timeout=5)
        self.server.server_close()
