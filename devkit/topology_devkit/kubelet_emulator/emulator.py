"""`KubeletEmulator`: the device-plugin-facing parts of a kubelet, on real unix sockets.

Serves ``v1beta1.Registration`` on ``<root>/device-plugins/kubelet.sock`` and ``v1.PodResourcesLister`` on
``<root>/pod-resources/kubelet.sock``, consumes plugins' ListAndWatch streams, admits pods through the
device manager's allocation algorithm and simulates kubelet restarts. See ../shared/docs/kubelet-device-plugin.md §7.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import grpc

from agent._proto.deviceplugin.v1beta1 import api_pb2 as dp
from agent._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from agent._proto.podresources.v1 import api_pb2 as pr
from agent._proto.podresources.v1 import api_pb2_grpc as pr_grpc

from .calls import CallLog
from .constants import (
    CHECKPOINT_FILE,
    DEVICE_PLUGINS_DIR,
    DIAL_TIMEOUT,
    ENDPOINT_STOP_GRACE_PERIOD,
    KUBELET_SOCKET,
    LOGGER_NAME,
    MAX_UNIX_SOCKET_PATH,
    POD_RESOURCES_BURST,
    POD_RESOURCES_DIR,
    POD_RESOURCES_QPS,
    POD_RESOURCES_SOCKET,
)
from .devicemanager import DeviceManager
from .errors import KubeletNotRunningError
from .model import Container, Pod
from .podresources import PodResourcesServicer
from .ratelimit import RateLimitInterceptor, TokenBucket
from .registration import RegistrationServicer

log = logging.getLogger(LOGGER_NAME)

_POLL_INTERVAL = 0.05
_JOIN_TIMEOUT = 5.0


class _Server:
    """A sync grpc server bound to one unix socket, with its own thread pool."""

    def __init__(
        self,
        name: str,
        path: Path,
        register: Callable[[grpc.Server], None],
        max_workers: int,
        interceptors: tuple[grpc.ServerInterceptor, ...] = (),
    ) -> None:
        self.path = path
        _unlink_socket(path)
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"kubelet-{name}")
        self._server = grpc.server(self._executor, interceptors=interceptors)
        register(self._server)
        self._server.add_insecure_port(f"unix://{path}")
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None).wait(_JOIN_TIMEOUT)
        self._executor.shutdown(wait=False, cancel_futures=True)
        _unlink_socket(self.path)


def _unlink_socket(path: Path) -> None:
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    except FileNotFoundError:
        pass


class KubeletEmulator:
    """A faithful-enough kubelet for device-plugin tests and demos.

    ``root`` plays kubelet's default root, /var/lib/kubelet; keep it short, unix socket paths must stay under 107
    bytes. A real kubelet keeps ``device-plugins/`` there even when ``--root-dir`` moves ``pod-resources/`` and its
    state (``DevicePluginPath`` in k8s.io/kubelet pkg/apis/deviceplugin/v1beta1/constants.go; kubelet-roots.md).
    All waits are condition waits with deadlines (`wait_for`). Thread safe.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        stop_grace_period: float = ENDPOINT_STOP_GRACE_PERIOD,
        dial_timeout: float = DIAL_TIMEOUT,
        allocate_timeout: float | None = None,
        pod_resources_qps: float = POD_RESOURCES_QPS,
        pod_resources_burst: int = POD_RESOURCES_BURST,
        pod_resources_get_enabled: bool = True,
        cleanup_on_start: bool = True,
        shuffle_seed: int | None = None,
        max_workers: int = 8,
        pods_resync: float = 3.0,
    ) -> None:
        """
        Args:
            root: kubelet's default root dir; ``device-plugins/`` and ``pod-resources/`` are created below it.
            stop_grace_period: seconds a resource keeps its capacity after its stream ended (kubelet: 300).
            dial_timeout: blocking-dial deadline for a registering plugin's endpoint (kubelet: 10).
            allocate_timeout: deadline for Allocate; kubelet has none (None).
            pod_resources_qps / pod_resources_burst: pod-resources token bucket (kubelet: 100 / 10).
            pod_resources_get_enabled: the ``KubeletPodResourcesGet`` gate (on since 1.34).
            cleanup_on_start: delete every socket in ``device-plugins/`` at start, as kubelet does.
            shuffle_seed: if set, candidate device ids are offered in a seeded random order instead of
                natural sort order (kubelet's set iteration order is arbitrary).
            max_workers: thread-pool size of each server.
            pods_resync: seconds after a restart during which pod-resources ``List`` is empty and ``Get``
                finds no pod, as kubelet's pod manager is until the API server has sent the pods again
                (the device manager has every allocation back from its checkpoint meanwhile).
        """
        self.root = Path(root).absolute()
        self.device_plugin_dir = self.root / DEVICE_PLUGINS_DIR
        self.kubelet_socket = self.device_plugin_dir / KUBELET_SOCKET
        self.pod_resources_dir = self.root / POD_RESOURCES_DIR
        self.pod_resources_socket = self.pod_resources_dir / POD_RESOURCES_SOCKET
        self.checkpoint_path = self.device_plugin_dir / CHECKPOINT_FILE
        for sock in (self.kubelet_socket, self.pod_resources_socket):
            if len(os.fsencode(sock)) > MAX_UNIX_SOCKET_PATH:
                raise ValueError(f"socket path too long for a unix socket ({len(os.fsencode(sock))} bytes): {sock}")
        self._cleanup_on_start = cleanup_on_start
        self._max_workers = max_workers
        self._pod_resources_qps = pod_resources_qps
        self._pod_resources_burst = pod_resources_burst
        self._pod_resources_get_enabled = pod_resources_get_enabled

        self._changed = threading.Condition()
        self._generation = 0
        self.calls = CallLog()
        self._manager = DeviceManager(
            self.device_plugin_dir,
            self.calls,
            self._notify,
            dial_timeout=dial_timeout,
            stop_grace_period=stop_grace_period,
            allocate_timeout=allocate_timeout,
            shuffle_seed=shuffle_seed,
        )
        self._lifecycle = threading.RLock()
        self._registration_server: _Server | None = None
        self._pod_resources_server: _Server | None = None
        self._up_thread: threading.Thread | None = None
        self._started = False
        self._serving = False
        self._counters_lock = threading.Lock()
        self._pod_resources_calls = 0
        self._pod_resources_rejected = 0
        self._restarts = 0
        self.pods_resync = pods_resync
        self._pods_synced_at = 0.0  # time.monotonic() from which List shows the pods again
        self._deferred_deletions: list[tuple[str, str]] = []  # pods deleted before the pods were synced
        self._deferred_lock = threading.Lock()
        self._claim_pods: dict[tuple[str, str], pr.PodResources] = {}  # pods holding DRA claims (pod-resources)

    # ------------------------------------------------------------------ context manager / lifecycle

    def __enter__(self) -> KubeletEmulator:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Create the directories, clean stale sockets, serve Registration and pod-resources."""
        with self._lifecycle:
            if self._started:
                return
            self.device_plugin_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
            self.pod_resources_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
            if self._cleanup_on_start:
                self._delete_plugin_sockets()
            self._started = True
            self._bring_up()
            log.info("kubelet emulator started at %s", self.root)

    def stop(self) -> None:
        """Stop serving, drop plugin connections and join the stream consumers."""
        with self._lifecycle:
            if not self._started:
                return
            self._started = False
            up_thread = self._up_thread
        self._notify()
        if up_thread is not None:
            up_thread.join(_JOIN_TIMEOUT)
        with self._lifecycle:
            self._take_down()
            log.info("kubelet emulator stopped")

    @property
    def is_running(self) -> bool:
        """True while the kubelet sockets are served (False when stopped or during a restart's down phase)."""
        return self._serving

    @property
    def restarts(self) -> int:
        with self._counters_lock:
            return self._restarts

    def restart(self, down_for: float = 0.0, *, block: bool = True,
                up_when: Callable[[], bool] | None = None) -> None:
        """Simulate a kubelet restart.

        Stops both servers, cancels every ListAndWatch stream and drops the plugin connections, deletes
        every socket file in ``device-plugins/`` (not the checkpoint, not directories or regular files),
        keeps all pods and their allocations (pod-resources shows no pod for ``pods_resync`` seconds once up
        again, as kubelet's pod manager), then after ``down_for`` seconds recreates ``kubelet.sock``
        and the pod-resources socket. Every resource reads 0 until its plugin registers again.
        With ``block=False`` the down phase runs in the background (``wait_for(lambda: k.is_running)``), and
        ``up_when``, if given, keeps kubelet down past ``down_for`` until it returns true (checked every 50 ms): a
        test orders its own step before kubelet's return instead of racing a fixed downtime.
        """
        with self._lifecycle:
            if not self._started:
                raise KubeletNotRunningError("kubelet emulator is not started")
            if self._up_thread is not None and self._up_thread.is_alive():
                raise KubeletNotRunningError("a restart is already in progress")
            log.info("kubelet restarting (down for %.2fs)", down_for)
            self._take_down()
            self._delete_plugin_sockets()
            with self._counters_lock:
                self._restarts += 1
            self._pods_synced_at = float("inf")  # set when it comes up again
            self._notify()
            if block:
                if down_for > 0:
                    time.sleep(down_for)  # the emulated downtime itself, not a test wait
                self._bring_up()
                return
            self._up_thread = threading.Thread(
                target=self._delayed_bring_up, args=(down_for, up_when), name="kubelet-restart", daemon=True
            )
            self._up_thread.start()

    def break_stream(self, resource: str) -> None:
        """The ListAndWatch connection of ``resource`` breaks (kubelet stays up): kubelet logs
        "ListAndWatch ended unexpectedly", marks the resource's devices unhealthy and never
        reconnects; only a new Register from the plugin revives it."""
        state = self._manager.state_view(resource)
        if state is None or state.endpoint is None:
            raise KeyError(f"no connected device plugin for {resource}")
        state.endpoint.break_connection()

    def _delayed_bring_up(self, down_for: float, up_when: Callable[[], bool] | None) -> None:
        deadline = time.monotonic() + down_for
        while (remaining := deadline - time.monotonic()) > 0 or (up_when is not None and not up_when()):
            with self._changed:
                self._changed.wait(remaining if remaining > 0 else _POLL_INTERVAL)
            if not self._started:
                return
        with self._lifecycle:
            if self._started and not self._serving:
                self._bring_up()

    def _bring_up(self) -> None:
        manager = self._manager
        self._registration_server = _Server(
            "registration",
            self.kubelet_socket,
            lambda server: dp_grpc.add_RegistrationServicer_to_server(
                RegistrationServicer(manager, self.device_plugin_dir), server
            ),
            self._max_workers,
        )
        bucket = TokenBucket(self._pod_resources_qps, self._pod_resources_burst)
        self._pod_resources_server = _Server(
            "podresources",
            self.pod_resources_socket,
            lambda server: pr_grpc.add_PodResourcesListerServicer_to_server(
                PodResourcesServicer(manager, self._count_served, get_enabled=self._pod_resources_get_enabled,
                                     pods_synced=self.pods_synced, claim_pods=self._claim_pod_list),
                server,
            ),
            self._max_workers,
            (RateLimitInterceptor(bucket, self._count_rejected),),
        )
        manager.set_accepting(True)
        if self._pods_synced_at == float("inf"):  # up again after a restart: the pod manager starts empty
            self._pods_synced_at = time.monotonic() + self.pods_resync
        self._serving = True
        log.info("Serving Registration on %s and pod-resources on %s", self.kubelet_socket, self.pod_resources_socket)
        self._notify()

    def pods_synced(self) -> bool:
        """pod-resources shows the pods (False for ``pods_resync`` seconds after a restart). Once they are, the
        devices of pods deleted meanwhile are freed (see :meth:`delete_pod`)."""
        synced = time.monotonic() >= self._pods_synced_at
        if synced and self._deferred_deletions:
            with self._deferred_lock:
                deferred, self._deferred_deletions = self._deferred_deletions, []
            for namespace, name in dict.fromkeys(deferred):
                with contextlib.suppress(KeyError):
                    self._manager.delete_pod(namespace, name)
        return synced

    def _take_down(self) -> None:
        self._serving = False
        self._manager.set_accepting(False)
        for server in (self._registration_server, self._pod_resources_server):
            if server is not None:
                server.stop()
        self._registration_server = None
        self._pod_resources_server = None
        for endpoint in self._manager.drop_connections():
            endpoint.join(_JOIN_TIMEOUT)
        self._notify()

    def _delete_plugin_sockets(self) -> list[Path]:
        """kubelet's CleanupPluginDirectory: remove socket files only (checkpoint and dirs stay)."""
        removed: list[Path] = []
        try:
            entries = list(self.device_plugin_dir.iterdir())
        except FileNotFoundError:
            return removed
        for entry in entries:
            if entry.name == CHECKPOINT_FILE:
                continue
            try:
                if stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()
                    removed.append(entry)
            except FileNotFoundError:
                continue
        if removed:
            log.info("Deleted %d socket(s) in %s: %s", len(removed), self.device_plugin_dir, [p.name for p in removed])
        return removed

    def _require_serving(self) -> None:
        if not self._serving:
            raise KubeletNotRunningError("kubelet emulator is not running")

    # ------------------------------------------------------------------ waiting

    def _notify(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
        """Wait until ``predicate()`` is true; re-checked on every state change and every 50 ms.

        Raises TimeoutError(what) after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                generation = self._generation
            if predicate():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(what or f"condition not met within {timeout}s")
            with self._changed:
                if self._generation == generation:
                    self._changed.wait(min(remaining, _POLL_INTERVAL))

    def wait_registered(self, resource: str, timeout: float = 5.0) -> None:
        """Wait until a plugin for ``resource`` is registered and its ListAndWatch delivered a snapshot."""
        self.wait_for(
            lambda: self._manager.is_ready(resource),
            timeout,
            f"no registered device plugin with a first ListAndWatch snapshot for {resource} within {timeout}s",
        )

    # ------------------------------------------------------------------ device-plugin state

    def resources(self) -> list[str]:
        """Resource names kubelet currently knows (registered, or restored after a restart)."""
        return self._manager.resources()

    def registrations(self, resource: str) -> int:
        """Accepted Register calls for ``resource`` (cumulative over restarts)."""
        return self._manager.registrations(resource)

    def registration_requests(self, resource: str) -> int:
        """All Register calls for ``resource``, rejected ones included (counted before validation)."""
        return self._manager.registration_requests(resource)

    def devices(self, resource: str) -> dict[str, str]:
        """id -> health string from the latest snapshot (all ``Unhealthy`` once the stream ended)."""
        return self._manager.devices(resource)

    def healthy_devices(self, resource: str) -> set[str]:
        return self._manager.healthy_devices(resource)

    def unhealthy_devices(self, resource: str) -> set[str]:
        return {device for device, health in self.devices(resource).items() if health != "Healthy"}

    def capacity(self, resource: str) -> int:
        """Node capacity: healthy + unhealthy; kept for the grace period after the stream ended, then 0."""
        return self._manager.capacity(resource)

    def allocatable(self, resource: str) -> int:
        """Node allocatable: healthy devices; 0 once the stream ended."""
        return self._manager.allocatable(resource)

    def snapshots(self, resource: str) -> int:
        """ListAndWatch messages received for ``resource`` in total (all endpoints, all restarts)."""
        return self._manager.snapshots(resource)

    def options(self, resource: str) -> dp.DevicePluginOptions | None:
        """The options kubelet got from GetDevicePluginOptions for the current endpoint."""
        return self._manager.options(resource)

    def endpoint(self, resource: str) -> Path | None:
        """Socket path of the current endpoint of ``resource``."""
        return self._manager.endpoint_path(resource)

    def allocated(self, resource: str) -> set[str]:
        """Device ids of ``resource`` held by admitted pods."""
        return self._manager.allocated(resource)

    # ------------------------------------------------------------------ pods

    def admit_pod(self, namespace: str, name: str, containers: list[Container]) -> Pod:
        """Admit a pod: device allocation per §2.6 for every container and resource.

        Raises AdmissionError (reason ``UnexpectedAdmissionError`` or ``OutOf<resource>``); the pod's ids
        are rolled back. Raises ValueError for a duplicate pod, KubeletNotRunningError while down.
        """
        self._require_serving()
        self.pods_synced()  # frees what pods deleted before the sync held, once synced
        return self._manager.admit(namespace, name, containers)

    def start_container(self, namespace: str, name: str, container: str) -> dict[str, str]:
        """A container (re)start: PreStartContainer if the plugin asked for it, env from the cached
        Allocate responses (never a new Allocate). Raises ContainerStartError on PreStart failure."""
        self._require_serving()
        return self._manager.start_container(namespace, name, container)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Remove a pod; its ids are free again. The plugin is never told. KeyError if unknown.

        After a restart, until the pods are synced, a deleted pod keeps its devices: kubelet's device manager frees
        nothing while its pod sources are not ready (kubernetes pkg/kubelet/cm/devicemanager/manager.go,
        ``UpdateAllocatedDevices``: ``if !m.sourcesReady.AllReady() { return }``), so a pod admitted meanwhile is
        refused. Seen on the real-cluster lane (kubelet 1.37.2), for a pod admitted the moment a restarted kubelet
        had its pods from the API server: ``"Pod admission denied" ... reason="UnexpectedAdmissionError"
        message="Allocate failed due to requested number of devices unavailable for topology/book. Requested: 1,
        Available: 0, which is unexpected"``. The ids are freed when the pods are synced.
        """
        if not self.pods_synced():
            self._manager.pod(namespace, name)  # KeyError if unknown
            with self._deferred_lock:
                self._deferred_deletions.append((namespace, name))
            log.info("Pod %s/%s deleted before the pods were synced: its devices stay allocated until then",
                     namespace, name)
            return
        self._manager.delete_pod(namespace, name)

    def pods(self) -> list[Pod]:
        return self._manager.pods()

    # ------------------------------------------------------------------ DRA claims (pod-resources only)

    def add_claim_pod(self, namespace: str, name: str, container: str, claim: tuple[str, str], driver: str,
                      pool: str, devices: list[str]) -> None:
        """A running pod whose container uses a ResourceClaim (``claim``: namespace, name) allocated ``devices`` of
        ``driver``'s ``pool``, as pod-resources ``List`` reports it (``ContainerResources.dynamic_resources``,
        ``pkg/kubelet/apis/podresources/server_v1.go`` from the DRA manager's claim cache). Nothing else of DRA is
        emulated: no prepare, no scheduling; the pod is listed once the pods are synced, like every other."""
        resources = pr.ContainerResources(name=container, dynamic_resources=[pr.DynamicResource(
            claim_namespace=claim[0], claim_name=claim[1], claim_resources=[
                pr.ClaimResource(driver_name=driver, pool_name=pool, device_name=d) for d in devices])])
        with self._deferred_lock:
            self._claim_pods[(namespace, name)] = pr.PodResources(namespace=namespace, name=name,
                                                                   containers=[resources])
        self._notify()

    def remove_claim_pod(self, namespace: str, name: str) -> None:
        with self._deferred_lock:
            del self._claim_pods[(namespace, name)]
        self._notify()

    def _claim_pod_list(self) -> list[pr.PodResources]:
        with self._deferred_lock:
            return list(self._claim_pods.values())

    def pod(self, namespace: str, name: str) -> Pod:
        return self._manager.pod(namespace, name)

    # ------------------------------------------------------------------ pod-resources counters

    def _count_served(self, _method: str) -> None:
        with self._counters_lock:
            self._pod_resources_calls += 1
        self._notify()

    def _count_rejected(self, _method: str) -> None:
        with self._counters_lock:
            self._pod_resources_rejected += 1
        self._notify()

    @property
    def pod_resources_calls(self) -> int:
        """pod-resources RPCs served (not counting rate-limited rejections)."""
        with self._counters_lock:
            return self._pod_resources_calls

    @property
    def pod_resources_rejected(self) -> int:
        """pod-resources RPCs rejected by the rate limiter."""
        with self._counters_lock:
            return self._pod_resources_rejected
