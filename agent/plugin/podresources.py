"""A client of kubelet's pod-resources v1 API: which of our device ids each container holds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from agent._proto.podresources.v1 import api_pb2, api_pb2_grpc
from agent.errors import PodResourcesError
from agent.plugin.registration import FRESH_CONNECTION
from agent.policy.ledger import ListedDevice

MAX_RECEIVE = 16 * 1024 * 1024  # a node with many pods answers large List responses


class PodResourcesClient:
    def __init__(self, socket_path: Path, timeout: float = 5.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._socket: tuple[int, int] | None = None  # the socket the last List answered on
        self.replaced = False  # the last List answered on a socket other than the one before: kubelet restarted
        # The DRA driver whose claimed devices count as holds (in both modes: a claim holds its devices whatever the
        # agent serves now), its device names -> resource names, and the (claim namespace, claim name, device) that
        # are held with admin access (observed, not held: the scheduler does not count them either).
        self.dra_driver: str | None = None
        self.dra_devices: dict[str, str] = {}
        self.dra_admin: Callable[[], frozenset[tuple[str, str, str]]] = frozenset

    def _stub(self) -> api_pb2_grpc.PodResourcesListerStub:
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(
                    f"unix://{self.socket_path}",
                    options=[("grpc.max_receive_message_length", MAX_RECEIVE), *FRESH_CONNECTION])
            return api_pb2_grpc.PodResourcesListerStub(self._channel)

    def reset(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = None

    def list(self) -> list[ListedDevice]:
        """Every container's devices, as kubelet's List reports them (active pods only); a pod whose listed
        containers hold no device is one row without devices (an init container may hold some)."""
        try:
            st = self.socket_path.stat()
        except OSError:
            raise PodResourcesError(
                f"{self.socket_path}: no pod-resources socket (is the directory mounted?)") from None
        try:
            answer = self._stub().List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            self.reset()  # kubelet recreates the socket when it restarts
            code = exc.code().name if isinstance(exc, grpc.Call) else "error"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise PodResourcesError(f"pod-resources List failed: {code}: {details}") from None
        socket = (st.st_dev, st.st_ino)
        self.replaced = self._socket is not None and socket != self._socket
        self._socket = socket
        rows: list[ListedDevice] = []
        for pod in answer.pod_resources:
            before = len(rows)
            rows.extend(ListedDevice(pod.namespace, pod.name, container.name, devices.resource_name,
                                     tuple(devices.device_ids))
                        for container in pod.containers for devices in container.devices)
            if self.dra_driver:  # DRA claims per container: our devices, held through the claim
                admin = self.dra_admin()
                rows.extend(ListedDevice(pod.namespace, pod.name, container.name, self.dra_devices[r.device_name],
                                         (r.device_name,), f"{claim.claim_namespace}/{claim.claim_name}")
                            for container in pod.containers for claim in container.dynamic_resources
                            for r in claim.claim_resources
                            if r.driver_name == self.dra_driver and r.device_name in self.dra_devices
                            and (claim.claim_namespace, claim.claim_name, r.device_name) not in admin)
            if len(rows) == before:  # the pod is there, holding nothing
                rows.append(ListedDevice(pod.namespace, pod.name, "", "", ()))
        return rows

    def close(self) -> None:
        self.reset()
