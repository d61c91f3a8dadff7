"""A thin synchronous client of the CRI RuntimeService: list containers, read one, update its cpuset.

Every call has a deadline, and every failure becomes one :class:`~agent.errors.CriError` naming the
socket, the call and the gRPC code. The channel is recreated after a failure (the runtime may have
restarted on the same socket).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent._proto.runtime.v1 import api_pb2, api_pb2_grpc
from agent.errors import CriError
from agent.topology.cpulist import parse_cpulist

# kubelet's labels on every container it creates
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"

MAX_RECEIVE = 16 * 1024 * 1024  # ListContainers on a node with many containers


def channel_options(timeout: float) -> list[tuple[str, int]]:
    """A channel of its own subchannel pool with a short reconnect backoff, as agent/plugin/registration.py
    uses for kubelet: a shared subchannel that failed while the runtime was down keeps failing calls until
    its backoff (~1 s) ends. gRPC also takes ``min_reconnect_backoff_ms`` as the timeout of a connection
    attempt (100 ms at least): it is longer than the call's deadline here, so that a call to a busy runtime
    slow to accept fails on its deadline, not after a 100 ms handshake."""
    return [("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", int(1000 * timeout) + 1000),
            ("grpc.max_receive_message_length", MAX_RECEIVE)]


@dataclass(frozen=True)
class ContainerInfo:
    """One container as ListContainers reports it. ``state`` is the CRI name (``CONTAINER_RUNNING``...);
    ``created_at`` is in nanoseconds since the epoch."""

    id: str
    pod_sandbox_id: str
    name: str
    attempt: int
    state: str
    created_at: int
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def pod_name(self) -> str:
        return self.labels.get(POD_NAME, "")

    @property
    def pod_namespace(self) -> str:
        return self.labels.get(POD_NAMESPACE, "")

    @property
    def pod_uid(self) -> str:
        return self.labels.get(POD_UID, "")

    @property
    def container_name(self) -> str:
        return self.labels.get(CONTAINER_NAME, "")


@dataclass(frozen=True)
class ContainerStatusInfo(ContainerInfo):
    """One container as ContainerStatus reports it, with its current cpuset and host PID.

    ``cpuset_cpus`` / ``cpuset_mems`` are empty when the container has none of its own (it may then
    run on every CPU its parent cgroup allows). ``pid`` is None when the runtime does not say (CRI-O
    and containerd do, in the verbose info) or the container has no process. ``applied_cpus`` is the
    cpuset of the OCI spec the runtime keeps for the container (verbose info's ``runtimeSpec``): unlike
    the status's resources it includes NRI plugins' adjustments at creation (containerd 2.4's
    ``createContainer`` fills the status from the spec before ``WithContainerAdjustment`` runs:
    https://github.com/containerd/containerd/blob/v2.4.2/internal/cri/server/container_create.go; updates change both).
    """

    started_at: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    pid: int | None = None
    applied_cpus: str | None = None  # the cpus of the OCI spec the runtime keeps (verbose info); None: not said


class CriClient:
    """A client of the container runtime's CRI socket (e.g. /run/containerd/containerd.sock)."""

    def __init__(self, socket: Path, timeout: float = 2.0) -> None:
        self.socket = Path(socket)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None

    # -- the calls ----------------------------------------------------------------------------------

    def version(self) -> str:
        """``<runtime name> <runtime version> (CRI <api version>)``, e.g. ``containerd 1.6.20 (CRI v1)``."""
        answer = self._call("Version", api_pb2.VersionRequest())
        return f"{answer.runtime_name} {answer.runtime_version} (CRI {answer.runtime_api_version})"

    def list_containers(self, labels: Mapping[str, str] | None = None,
                        running_only: bool = True) -> list[ContainerInfo]:
        """The containers whose labels include all of ``labels`` (all containers without), running ones only
        unless ``running_only`` is False."""
        selector = api_pb2.ContainerFilter(label_selector=dict(labels or {}))
        if running_only:
            selector.state.state = api_pb2.CONTAINER_RUNNING
        answer = self._call("ListContainers", api_pb2.ListContainersRequest(filter=selector))
        return [
            ContainerInfo(id=c.id, pod_sandbox_id=c.pod_sandbox_id, name=c.metadata.name, attempt=c.metadata.attempt,
                          state=_state_name(c.state), created_at=c.created_at, labels=dict(c.labels),
                          annotations=dict(c.annotations))
            for c in answer.containers
        ]

    def container_status(self, container_id: str) -> ContainerStatusInfo:
        """A container's state, kubelet's labels, its current cpuset and host PID."""
        answer = self._call("ContainerStatus", api_pb2.ContainerStatusRequest(container_id=container_id, verbose=True))
        status = answer.status
        info = _verbose_info(answer.info.get("info", ""))
        cpu = _dig(info, "runtimeSpec", "linux", "resources", "cpu")
        applied = str(cpu.get("cpus", "")) if isinstance(info.get("runtimeSpec"), dict) else None
        if status.HasField("resources") and status.resources.HasField("linux"):
            cpus, mems = status.resources.linux.cpuset_cpus, status.resources.linux.cpuset_mems
        else:  # a runtime that does not report resources in the status: the OCI spec it applied
            cpus, mems = str(cpu.get("cpus", "")), str(cpu.get("mems", ""))
        sandbox = info.get("sandboxID") or info.get("sandboxId") or ""
        if not isinstance(sandbox, str) or not sandbox:
            sandbox = self._sandbox_of(status.id or container_id)
        pid = info.get("pid")
        return ContainerStatusInfo(
            id=status.id, pod_sandbox_id=sandbox, name=status.metadata.name, attempt=status.metadata.attempt,
            state=_state_name(status.state), created_at=status.created_at, labels=dict(status.labels),
            annotations=dict(status.annotations), started_at=status.started_at, cpuset_cpus=cpus, cpuset_mems=mems,
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None, applied_cpus=applied)

    def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        """Set a container's cpuset (``cpus`` and ``mems`` in the kernel's list format; empty ``mems``
        leaves the memory nodes as they are). Nothing else is sent: the runtime keeps the other limits."""
        if not parse_cpulist(cpus):  # a bad list raises CpuListError; an empty one would be a silent no-op
            raise CriError(f"CRI UpdateContainerResources at {self.socket}: refusing an empty CPU list "
                           f"for container {container_id}", "INVALID_ARGUMENT")
        parse_cpulist(mems)
        linux = api_pb2.LinuxContainerResources(cpuset_cpus=cpus.strip(), cpuset_mems=mems.strip())
        self._call("UpdateContainerResources",
                   api_pb2.UpdateContainerResourcesRequest(container_id=container_id, linux=linux))

    def close(self) -> None:
        self._reset()

    # -- plumbing -----------------------------------------------------------------------------------

    def _sandbox_of(self, container_id: str) -> str:
        answer = self._call("ListContainers", api_pb2.ListContainersRequest(
            filter=api_pb2.ContainerFilter(id=container_id)))
        return next((c.pod_sandbox_id for c in answer.containers), "")

    def _stub(self) -> api_pb2_grpc.RuntimeServiceStub:
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket}", options=channel_options(self.timeout))
            return api_pb2_grpc.RuntimeServiceStub(self._channel)

    def _reset(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            present = self.socket.exists()
        except PermissionError:
            # Seen on the real-cluster lane: a runtime whose socket folder is 0600 (containerd makes the folder
            # of a socket outside its state folder so) cannot be reached by uid 0 without CAP_DAC_OVERRIDE.
            raise CriError(f"CRI {method} at {self.socket}: NO_ACCESS: permission denied on the socket's folder "
                           "(the agent runs as uid 0 without capabilities: the folder needs the x bit for its "
                           "owner, as containerd's default /run/containerd has)", "NO_ACCESS") from None
        if not present:
            raise CriError(f"CRI {method} at {self.socket}: NO_SOCKET: the runtime's socket does not exist "
                           "(is the runtime running and its directory mounted?)", "NO_SOCKET")
        try:
            return getattr(self._stub(), method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
            if code in TRANSPORT_CODES:  # the connection may be bad: dial afresh next time
                self._reset()
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            if code == "DEADLINE_EXCEEDED":
                details = f"no answer within {self.timeout:g} s"
            raise CriError(f"CRI {method} at {self.socket}: {code}: {_one_line(details)}", code) from None


TRANSPORT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"})


def _state_name(state: int) -> str:
    try:
        return api_pb2.ContainerState.Name(state)
    except ValueError:  # a state newer than our proto
        return f"CONTAINER_STATE_{state}"


def _verbose_info(text: str) -> dict[str, Any]:
    """The runtime's verbose info document (a JSON object); empty when absent or not JSON."""
    try:
        info = json.loads(text) if text else {}
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _dig(document: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    for key in keys:
        value = document.get(key)
        if not isinstance(value, dict):
            return {}
        document = value
    return dict(document)


def _one_line(text: str | None, limit: int = 300) -> str:
    flat = " ".join((text or "no details").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
