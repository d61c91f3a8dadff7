"""The kubelet side of DRA mode: pluginregistration v1 and the DRAPlugin service (v1 and v1beta1) on Unix sockets.

* ``<registry dir>/<driver>-reg.sock`` (kubelet's plugin watcher scans ``<kubelet root>/plugins_registry``):
  ``GetInfo`` answers type ``DRAPlugin``, the driver name, the endpoint (the DRA socket's path as the kubelet sees
  it) and the gRPC services served, ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin`` (kubelet picks the newest it knows);
  and, with a :class:`~agent.dra.health_service.HealthService`, ``v1.DRAResourceHealth`` and
  ``v1alpha1.DRAResourceHealth`` (kubelet 1.37 starts the health stream only for a driver that names it there);
  ``NotifyRegistrationStatus`` tells whether the kubelet took it.
* ``<plugin dir>/dra.sock`` (``<kubelet root>/plugins/<driver>/``): ``NodePrepareResources`` and
  ``NodeUnprepareResources`` (:mod:`agent.dra.prepare`), per claim: an error in one claim's answer, never a failed
  call; with a health service, ``NodeWatchResources`` (:mod:`agent.dra.health_service`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from agent._proto.dra.v1 import api_pb2 as dra_v1
from agent._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from agent._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from agent._proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from agent._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from agent._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from agent.dra import health_service as dra_health
from agent.dra.prepare import ClaimPreparer, PrepareError
from agent.errors import KubeApiError, SocketPathError, StartupError
from agent.unix_socket import MAX_SOCKET_PATH, clear_stale_socket, too_long

log = logging.getLogger("topology-agent.dra")

PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet pkg/apis/pluginregistration/v1 constants.go
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # gRPC service names, newest first (draplugin.go)
WORKERS = 8


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, on_status: Callable[[bool, str], None],
                 services: tuple[str, ...] = SERVICES) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.on_status = on_status
        self.services = services

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                                  supported_versions=list(self.services))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.on_status(request.plugin_registered, request.error)
        return reg_pb2.RegistrationStatusResponse()


def _prepare_servicer(pb: ModuleType, base: type, preparer: ClaimPreparer) -> Any:
    class Servicer(base):
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            answer = pb.NodePrepareResourcesResponse()
            for claim in request.claims:
                out = answer.claims[claim.uid]
                try:
                    prepared = preparer.prepare(claim.namespace, claim.name, claim.uid)
                except (PrepareError, KubeApiError, OSError, ValueError) as exc:
                    log.warning("cannot prepare claim %s/%s (%s): %s", claim.namespace, claim.name, claim.uid, exc)
                    out.error = str(exc)[:1000]
                    continue
                for d in prepared.devices:
                    out.devices.append(pb.Device(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                                                 cdi_device_ids=list(d.cdi_ids)))
            return answer

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            answer = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                out = answer.claims[claim.uid]
                try:
                    preparer.unprepare(claim.uid)
                except OSError as exc:
                    out.error = str(exc)[:1000]
            return answer

    return Servicer()


def _check_path(path: Path) -> None:
    if too_long(path):
        raise StartupError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes, the limit of Unix sockets")


class KubeletPlugin:
    """Both servers. ``endpoint`` is the DRA socket's path as the kubelet sees it (the same path when the
    directory is mounted at the host's path, as the chart does)."""

    def __init__(self, *, driver: str, registry_dir: Path, plugin_dir: Path, preparer: ClaimPreparer,
                 endpoint: str | None = None, on_registered: Callable[[], None] | None = None,
                 health: dra_health.HealthService | None = None) -> None:
        self.driver = driver
        self.registration_path = Path(registry_dir) / f"{driver}-reg.sock"
        self.dra_path = Path(plugin_dir) / "dra.sock"
        self.endpoint = endpoint or str(self.dra_path)
        self.preparer = preparer
        self.on_registered = on_registered
        self.health = health
        self.services = SERVICES + (dra_health.SERVICES if health is not None else ())
        self.registered = False
        self.registrations = 0
        self.registration_failures = 0
        self.last_error = ""
        self.registered_at: float | None = None
        self._servers: list[grpc.Server] = []
        self._inodes: dict[Path, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def _status(self, registered: bool, error: str) -> None:
        with self._lock:
            self.registered = registered
            if registered:
                self.registrations += 1
                self.registered_at = time.monotonic()
                self.last_error = ""
            else:
                self.registration_failures += 1
                self.last_error = error
        if registered:
            log.info("registered with kubelet as DRA driver %s (endpoint %s)", self.driver, self.endpoint)
            if self.on_registered is not None:
                self.on_registered()
        else:
            log.warning("kubelet refused the DRA plugin registration: %s", error, extra={"reason": error})

    def _serve(self, path: Path, add: Callable[[grpc.Server], None], name: str, workers: int = WORKERS) -> None:
        _check_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        clear_stale_socket(path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name),
                             options=[("grpc.so_reuseport", 0)])
        add(server)
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            server.stop(None)
            raise SocketPathError(f"cannot serve on {path}: {exc}") from None
        server.start()
        st = path.stat()
        self._inodes[path] = (st.st_dev, st.st_ino)
        self._servers.append(server)

    def start(self) -> None:
        """The DRA service first, then the registration socket (kubelet dials the endpoint at once)."""
        preparer = self.preparer
        health = self.health

        def add_dra(server: grpc.Server) -> None:
            dra_v1_grpc.add_DRAPluginServicer_to_server(
                _prepare_servicer(dra_v1, dra_v1_grpc.DRAPluginServicer, preparer), server)
            dra_v1beta1_grpc.add_DRAPluginServicer_to_server(
                _prepare_servicer(dra_v1beta1, dra_v1beta1_grpc.DRAPluginServicer, preparer), server)
            if health is not None:
                health.add_to_server(server)

        if health is not None:
            health.open()
        # Each health stream keeps a worker for its lifetime: the prepare calls keep their WORKERS.
        self._serve(self.dra_path, add_dra, "dra", WORKERS + (health.max_streams if health is not None else 0))
        self._serve(self.registration_path, lambda s: reg_grpc.add_RegistrationServicer_to_server(
            RegistrationServicer(self.driver, self.endpoint, self._status, self.services), s), "dra-registration")
        log.info("serving DRA plugin %s on %s (registration %s)", self.driver, self.dra_path, self.registration_path)

    def registration_socket_present(self) -> bool:
        """Our registration socket is still there (a kubelet or an operator may remove plugin sockets)."""
        try:
            st = self.registration_path.stat()
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._inodes.get(self.registration_path)

    def stop(self) -> None:
        if self.health is not None:
            self.health.close()  # the health streams end with OK before the servers go
        for server in self._servers:
            server.stop(0.2).wait(timeout=3)
        self._servers.clear()
        for path, inode in self._inodes.items():
            with contextlib.suppress(OSError):
                st = path.stat()
                if (st.st_dev, st.st_ino) == inode:
                    path.unlink()
        self._inodes.clear()
        self.registered = False
