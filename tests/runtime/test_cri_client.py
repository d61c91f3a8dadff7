"""The CRI client against its real consumer: a real containerd 1.6 running runc and crun containers.

One containerd serves the whole module (devkit topology_devkit.containerd, as in
../shared/docs/real-containerd.md). The tests skip with the harness's reason where containerd cannot
run, and fail under CI=true, which installs it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent._proto.runtime.v1 import api_pb2 as cri
from agent._proto.runtime.v1 import api_pb2_grpc as cri_grpc
from agent.cri.client import CriClient
from agent.errors import CpuListError, CriError
from agent.topology.cpulist import format_cpulist, parse_cpulist
from tests.support.env import REPO
from topology_devkit.containerd import Containerd, PodContainer


@pytest.fixture
def client(ctd: Containerd) -> Iterator[CriClient]:
    ctd.start_containerd()  # a test that stopped it may have failed before starting it again
    crc = CriClient(ctd.socket, timeout=5.0)
    try:
        yield crc
    finally:
        crc.close()


@pytest.fixture
def pods(ctd: Containerd) -> Iterator[Callable[..., PodContainer]]:
    """Run pods for one test; they are removed after it."""
    made: list[PodContainer] = []

    def run(name: str, **kwargs: Any) -> PodContainer:
        pod = ctd.run_pod(name, **kwargs)
        made.append(pod)
        return pod

    yield run
    ctd.start_containerd()
    for pod in made:
        ctd.remove_pod(pod)


def two_cpus(ctd: Containerd) -> tuple[str, str]:
    """(the CPUs a container runs on by default, the last of them): a pin that differs from the default."""
    everything = ctd.default_cpus()
    cpus = parse_cpulist(everything)
    if len(cpus) < 2:
        pytest.skip(f"containers here run on {len(cpus)} CPU ({everything}): a visible pin needs 2")
    return format_cpulist(cpus), str(cpus[-1])


def one_line(error: CriError, *words: str) -> str:
    text = str(error)
    assert "\n" not in text and text.strip() == text, repr(text)
    assert "Traceback" not in text
    for word in words:
        assert word in text, (word, text)
    return text


# ------------------------------------------------------------------------------------------------
# against the real runtime


def test_version_names_the_runtime_and_the_api(client: CriClient) -> None:
    assert client.version().startswith("containerd ")
    assert client.version().endswith("(CRI v1)")


def test_list_containers_finds_a_container_by_kubelet_labels(
        ctd: Containerd, client: CriClient, handler: str, pods: Callable[..., PodContainer]) -> None:
    web = pods("web-0", namespace="llm", handler=handler)
    other = pods("web-1", namespace="llm", handler=handler)  # same namespace, same container name

    found = client.list_containers({"io.kubernetes.pod.name": "web-0", "io.kubernetes.pod.namespace": "llm"})
    assert [c.id for c in found] == [web.container_id]
    (one,) = found
    assert (one.pod_name, one.pod_namespace, one.pod_uid, one.container_name) == ("web-0", "llm", web.pod_uid, "main")
    assert one.pod_sandbox_id == web.sandbox_id and one.state == "CONTAINER_RUNNING" and one.attempt == 0
    assert abs(one.created_at - time.time_ns()) < 120 * 10**9  # nanoseconds since the epoch

    assert [c.id for c in client.list_containers(web.labels)] == [web.container_id]  # all four labels
    assert [c.id for c in client.list_containers(other.labels)] == [other.container_id]
    everyone = {c.id for c in client.list_containers()}
    assert {web.container_id, other.container_id} <= everyone
    assert client.list_containers({"io.kubernetes.pod.name": "web-0", "io.kubernetes.pod.namespace": "other"}) == []


def test_container_status_reports_labels_state_and_cpuset(
        ctd: Containerd, client: CriClient, handler: str, pods: Callable[..., PodContainer]) -> None:
    cpu = str(parse_cpulist(ctd.default_cpus())[-1])
    pinned = pods("pinned", namespace="llm", handler=handler, cpuset_cpus=cpu, cpuset_mems="0")
    free = pods("free", namespace="llm", handler=handler)

    status = client.container_status(pinned.container_id)
    assert status.id == pinned.container_id and status.pod_sandbox_id == pinned.sandbox_id
    assert status.state == "CONTAINER_RUNNING" and status.name == "main"
    assert status.labels == pinned.labels
    assert (status.pod_name, status.pod_namespace, status.pod_uid, status.container_name) == (
        "pinned", "llm", pinned.pod_uid, "main")
    assert (status.cpuset_cpus, status.cpuset_mems, status.applied_cpus) == (cpu, "0", cpu)
    assert status.pid == ctd.container_pid(pinned.container_id)
    assert status.created_at <= status.started_at and abs(status.started_at - time.time_ns()) < 120 * 10**9
    assert ctd.cpus_allowed_list(pinned.container_id) == cpu  # what the status says is what runs

    unpinned = client.container_status(free.container_id)
    assert (unpinned.cpuset_cpus, unpinned.cpuset_mems, unpinned.applied_cpus) == ("", "", "")  # none of its own


def test_update_cpuset_changes_the_live_process(
        ctd: Containerd, client: CriClient, handler: str, pods: Callable[..., PodContainer]) -> None:
    everything, second = two_cpus(ctd)
    pod = pods("vllm-0", namespace="llm", handler=handler)
    assert ctd.cpus_allowed_list(pod.container_id) == everything

    client.update_cpuset(pod.container_id, second, "0")
    assert ctd.wait_cpus_allowed(pod.container_id, second) == second
    status = client.container_status(pod.container_id)
    assert (status.cpuset_cpus, status.cpuset_mems) == (second, "0")
    # Only the cpuset was sent: the runtime kept the pod's other limits.
    raw = ctd.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=pod.container_id), timeout=10)
    kept = raw.status.resources.linux
    assert (kept.memory_limit_in_bytes, kept.cpu_shares, kept.cpu_period) == (64 << 20, 256, 100_000)

    client.update_cpuset(pod.container_id, everything, "")
    assert ctd.wait_cpus_allowed(pod.container_id, everything) == everything
    assert client.container_status(pod.container_id).cpuset_cpus == everything


def test_a_restarted_container_has_a_new_id_and_the_original_cpuset(
        ctd: Containerd, client: CriClient, handler: str, pods: Callable[..., PodContainer]) -> None:
    everything, second = two_cpus(ctd)
    pod = pods("vllm-1", namespace="llm", handler=handler)
    client.update_cpuset(pod.container_id, second, "")
    assert ctd.wait_cpus_allowed(pod.container_id, second) == second

    again = ctd.restart_container(pod)
    assert again.container_id != pod.container_id and again.sandbox_id == pod.sandbox_id
    assert ctd.cpus_allowed_list(again.container_id) == everything  # the pin is gone: apply it again
    status = client.container_status(again.container_id)
    assert status.attempt == 1 and status.cpuset_cpus == "" and status.labels == pod.labels

    assert [c.id for c in client.list_containers(pod.labels)] == [again.container_id]
    every = {c.id: c.state for c in client.list_containers(pod.labels, running_only=False)}
    assert every == {pod.container_id: "CONTAINER_EXITED", again.container_id: "CONTAINER_RUNNING"}


def test_unknown_container_ids_are_one_line_errors(client: CriClient) -> None:
    unknown = "0" * 64
    with pytest.raises(CriError) as status:
        client.container_status(unknown)
    assert status.value.code == "NOT_FOUND"
    one_line(status.value, "ContainerStatus", str(client.socket), "NOT_FOUND")
    with pytest.raises(CriError) as update:
        client.update_cpuset(unknown, "0", "")
    assert update.value.code == "NOT_FOUND"
    one_line(update.value, "UpdateContainerResources", str(client.socket), "NOT_FOUND")


def test_a_stopped_containerd_is_a_one_line_error_and_the_client_recovers(
        ctd: Containerd, client: CriClient, pods: Callable[..., PodContainer]) -> None:
    pod = pods("survivor", namespace="llm", handler="runc")
    assert client.container_status(pod.container_id).state == "CONTAINER_RUNNING"
    try:
        ctd.stop_containerd()  # a clean stop removes the socket
        with pytest.raises(CriError) as gone:
            client.list_containers(pod.labels)
        one_line(gone.value, "ListContainers", str(ctd.socket))
        ctd.start_containerd()
        assert client.container_status(pod.container_id).state == "CONTAINER_RUNNING"  # same client, same pod

        ctd.stop_containerd(kill=True)  # a crash leaves the socket behind: nobody listens
        assert ctd.socket.exists()
        for call in (client.version, lambda: client.container_status(pod.container_id),
                     lambda: client.list_containers(pod.labels),
                     lambda: client.update_cpuset(pod.container_id, "0", "")):
            with pytest.raises(CriError) as refused:
                call()
            assert refused.value.code == "UNAVAILABLE"
            one_line(refused.value, str(ctd.socket), "UNAVAILABLE")
    finally:
        ctd.start_containerd()
    assert [c.id for c in client.list_containers(pod.labels)] == [pod.container_id]


# ------------------------------------------------------------------------------------------------
# without a runtime


def test_a_missing_socket_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "containerd.sock"
    crc = CriClient(path, timeout=1.0)
    calls: dict[str, Callable[[], object]] = {
        "Version": crc.version, "ListContainers": crc.list_containers,
        "ContainerStatus": lambda: crc.container_status("abc"),
        "UpdateContainerResources": lambda: crc.update_cpuset("abc", "0", "0"),
    }
    for name, call in calls.items():
        with pytest.raises(CriError) as error:
            call()
        assert error.value.code == "NO_SOCKET"
        one_line(error.value, name, str(path), "NO_SOCKET")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_an_unreachable_socket_folder_is_a_one_line_error(tmp_path: Path) -> None:
    """A socket folder the agent cannot enter (containerd makes its socket's folder 0600; the agent runs as uid 0
    with every capability dropped, the chart's securityContext) is a one-line error with its code, never a
    PermissionError traceback at every enforcement step."""
    folder = tmp_path / "run-containerd"
    folder.mkdir(mode=0o600)
    script = ("import sys; from pathlib import Path; from agent.cri.client import CriClient; "
              "from agent.errors import CriError\n"
              "try:\n    CriClient(Path(sys.argv[1]), timeout=1.0).version()\n"
              "except CriError as e:\n    print(e.code); print(e)\n")
    done = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", sys.executable, "-c", script,
                           str(folder / "containerd.sock")], capture_output=True, text=True, timeout=60,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    code, message = done.stdout.splitlines()[:2]
    assert code == "NO_ACCESS" and "permission denied" in message and "Traceback" not in done.stderr


def test_bad_cpu_lists_never_reach_the_runtime(tmp_path: Path) -> None:
    crc = CriClient(tmp_path / "absent.sock")
    with pytest.raises(CpuListError, match="not a CPU list"):
        crc.update_cpuset("abc", "0-x", "0")
    with pytest.raises(CpuListError, match="not a CPU list"):
        crc.update_cpuset("abc", "1", "zero")
    with pytest.raises(CriError, match="empty CPU list") as empty:
        crc.update_cpuset("abc", " ", "0")
    assert empty.value.code == "INVALID_ARGUMENT"


class SilentServer:
    """A listening Unix socket that never answers: it never accepts, or accepts and never replies, or
    speaks HTTP/2 (a gRPC server) but never answers a call (a hung runtime)."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path = path
        self.stop = threading.Event()
        self.held: list[socket.socket] = []
        self.sock: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.server: grpc.Server | None = None
        if kind == "hangs":
            def hang(request: bytes, context: grpc.ServicerContext) -> bytes:
                self.stop.wait(30)
                return b""

            handler = grpc.unary_unary_rpc_method_handler(hang)
            methods = ("Version", "ListContainers", "ContainerStatus", "UpdateContainerResources")
            self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                "runtime.v1.RuntimeService", dict.fromkeys(methods, handler)),))
            self.server.add_insecure_port(f"unix://{path}")
            self.server.start()
            return
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(64)
        if kind == "accepts":
            self.thread = threading.Thread(target=self._accept, args=(self.sock,), daemon=True)
            self.thread.start()

    def _accept(self, sock: socket.socket) -> None:
        sock.settimeout(0.05)
        while not self.stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            self.held.append(conn)  # read nothing, write nothing

    def close(self) -> None:
        self.stop.set()
        if self.server is not None:
            self.server.stop(0).wait(5)
        if self.thread is not None:
            self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        if self.sock is not None:
            self.sock.close()


@pytest.mark.parametrize("kind", ["never-accepts", "accepts", "hangs"])
def test_every_call_returns_within_its_deadline_when_the_server_never_answers(kind: str) -> None:
    path = Path(f"/tmp/silent-cri-{os.getpid()}-{kind}.sock")
    path.unlink(missing_ok=True)
    server = SilentServer(path, kind)
    timeout = 0.5
    crc = CriClient(path, timeout=timeout)
    try:
        calls: dict[str, Callable[[], object]] = {
            "Version": crc.version, "ListContainers": lambda: crc.list_containers({"a": "b"}),
            "ContainerStatus": lambda: crc.container_status("abc"),
            "UpdateContainerResources": lambda: crc.update_cpuset("abc", "0", "0"),
        }
        for name, call in calls.items():
            started = time.monotonic()
            with pytest.raises(CriError) as error:
                call()
            elapsed = time.monotonic() - started
            assert elapsed < timeout + 1.5, f"{name} took {elapsed:.2f} s with a {timeout} s deadline"
            assert error.value.code == "DEADLINE_EXCEEDED", str(error.value)
            one_line(error.value, name, str(path), f"DEADLINE_EXCEEDED: no answer within {timeout:g} s")
    finally:
        crc.close()
        server.close()
        path.unlink(missing_ok=True)


class OlderRuntime(cri_grpc.RuntimeServiceServicer):
    """A runtime whose ContainerStatus reports no resources and no sandbox id (only the verbose spec)."""

    def ContainerStatus(self, request: cri.ContainerStatusRequest,
                        context: grpc.ServicerContext) -> cri.ContainerStatusResponse:
        spec = {"pid": 4242, "runtimeSpec": {"linux": {"resources": {"cpu": {"cpus": "2-3", "mems": "1"}}}}}
        status = cri.ContainerStatus(id=request.container_id, state=cri.CONTAINER_RUNNING,
                                     metadata=cri.ContainerMetadata(name="main", attempt=2),
                                     labels={"io.kubernetes.pod.name": "p"})
        return cri.ContainerStatusResponse(status=status, info={"info": json.dumps(spec)} if request.verbose else {})

    def ListContainers(self, request: cri.ListContainersRequest,
                       context: grpc.ServicerContext) -> cri.ListContainersResponse:
        found = [cri.Container(id=request.filter.id, pod_sandbox_id="sandbox-7")] if request.filter.id else []
        return cri.ListContainersResponse(containers=found)


def test_a_runtime_without_resources_in_the_status_is_read_from_the_verbose_spec() -> None:
    path = Path(f"/tmp/older-cri-{os.getpid()}.sock")
    path.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    cri_grpc.add_RuntimeServiceServicer_to_server(OlderRuntime(), server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    crc = CriClient(path, timeout=5.0)
    try:
        status = crc.container_status("c-1")
        assert (status.cpuset_cpus, status.cpuset_mems, status.pid, status.applied_cpus) == ("2-3", "1", 4242, "2-3")
        assert (status.pod_sandbox_id, status.attempt, status.pod_name) == ("sandbox-7", 2, "p")
        with pytest.raises(CriError) as unimplemented:  # what this runtime does not serve
            crc.version()
        assert unimplemented.value.code == "UNIMPLEMENTED"
        one_line(unimplemented.value, "Version", str(path))
    finally:
        crc.close()
        server.stop(0).wait(5)
        path.unlink(missing_ok=True)
