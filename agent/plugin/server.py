"""One gRPC DevicePlugin server on its own Unix socket in kubelet's device-plugin directory."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from concurrent import futures
from pathlib import Path

import grpc

from agent.devices.table import DeviceTable
from agent.errors import SocketPathError, StartupError
from agent.plugin.servicer import DevicePluginServicer, Observer, Wire, add_to_server
from agent.unix_socket import MAX_SOCKET_PATH, clear_stale_socket, too_long

log = logging.getLogger("topology-agent.plugin")

# Each open ListAndWatch stream pins a worker thread; kubelet's Register call-back and
# Allocate need free ones at the same time.
WORKERS = 16


def socket_name(resource: str) -> str:
    """``topology/book`` -> ``topology-book.sock`` (unique per resource, stable across restarts)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in resource)
    return f"{safe}.sock"


def _bind_problem(path: Path) -> str | None:
    """The operating system's reason why a Unix socket cannot be bound at ``path`` (gRPC only says that
    binding failed), or None when a bind works now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.bind(str(path))
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        probe.close()
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def _identity(path: Path) -> tuple[int, int, int]:
    """Which file is at ``path``: inode numbers are reused, so the creation time counts too."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class PluginServer:
    """Serves one resource until stopped; a stopped server is not restarted (make a new one)."""

    def __init__(self, table: DeviceTable[Wire], directory: Path, observer: Observer | None = None) -> None:
        self.table = table
        self.path = Path(directory) / socket_name(table.resource)
        self.stopping = threading.Event()
        self.servicer = DevicePluginServicer(table, self.stopping, observer)
        self._server: grpc.Server | None = None
        self.inode: tuple[int, int, int] | None = None

    @property
    def endpoint(self) -> str:
        return self.path.name

    def start(self) -> None:
        if too_long(self.path):
            raise StartupError(f"socket path {self.path} is longer than {MAX_SOCKET_PATH} bytes, the limit of "
                               "Unix sockets: use a shorter --kubelet-dir or --resource-prefix")
        clear_stale_socket(self.path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS,
                                                        thread_name_prefix=f"plugin-{self.table.resource}"),
                             options=[("grpc.so_reuseport", 0)])
        add_to_server(self.servicer, server)
        try:
            server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError as exc:
            server.stop(None)
            raise SocketPathError(f"cannot serve on {self.path}: {_bind_problem(self.path) or exc}") from None
        server.start()
        self._server = server
        self.inode = _identity(self.path)

    def socket_present(self) -> bool:
        """Our socket file is still the one we created (kubelet deletes it when it restarts)."""
        try:
            return _identity(self.path) == self.inode
        except OSError:
            return False

    def begin_stop(self, grace: float | None = 0.2) -> threading.Event | None:
        """End our streams and stop accepting calls; returns the event set once fully stopped."""
        self.stopping.set()
        self.table.wake()
        server, self._server = self._server, None
        return server.stop(grace) if server is not None else None

    def stop(self, grace: float | None = 0.2) -> None:
        done = self.begin_stop(grace)
        if done is not None:
            done.wait(timeout=(grace or 0) + 2)
        self.remove_socket()

    def remove_socket(self) -> None:
        if self.inode is not None:
            with contextlib.suppress(OSError):
                if _identity(self.path) == self.inode:
                    self.path.unlink()
