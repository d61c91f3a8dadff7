"""The CRI client on CRI-O's answers: ContainerStatus as CRI-O 1.34.0 gives it (captured from the real CRI-O the
real-cluster lane builds, ``make cluster-up RUNTIME=crio``, with runc and cgroupfs), served here by an in-process gRPC
server so that the client's reading of it runs in the unit suite.

What differs from containerd 2.4 (``internal/cri/server/container_status.go``): CRI-O's verbose ``info`` holds the keys
``sandboxID``, ``pid``, ``privileged`` and ``runtimeSpec`` only (``server/container_status.go``, ``createContainerInfo``
at v1.34.0: https://github.com/cri-o/cri-o/blob/v1.34.0/server/container_status.go), its ``runtimeSpec`` is the spec
it keeps for the container and updates on UpdateContainerResources, and the status's ``resources.linux`` shows only
what the container's config or an update set (no cpuset before the first update). The container's cgroup under the
cgroupfs manager is ``<parent>/crio-<id>`` (containerd: ``<parent>/<id>``); the agent reads no cgroup path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent._proto.runtime.v1 import api_pb2 as cri
from agent._proto.runtime.v1 import api_pb2_grpc as cri_grpc
from agent.cri.client import CriClient

CONTAINER = "01b0e2bf118667499e69e8d550a279383057b32aaf228147b6a032507907d59a"
SANDBOX = "539961b7eaf33eb229fc539fd059d0533a7b3794c87079da866be3db6676174b"
LABELS = {"io.kubernetes.pod.uid": "1234-uid", "io.kubernetes.pod.namespace": "smoke-ns",
          "io.kubernetes.pod.name": "smoke", "io.kubernetes.container.name": "main"}
ANNOTATIONS = {"topology.s390x.ibm.com/groups": "drawer0-book1", "io.kubernetes.container.restartCount": "0"}


def crio_info(resources: dict[str, Any]) -> str:
    """CRI-O 1.34.0's verbose info of that container (its ``runtimeSpec`` cut to ``linux``, the part read here; the
    rest is the OCI spec's process, root, mounts, hostname and annotations)."""
    return json.dumps({"sandboxID": SANDBOX, "pid": 23499, "privileged": False, "runtimeSpec": {
        "ociVersion": "1.2.1", "linux": {
            "resources": resources,
            "cgroupsPath": f"/crio-smoke/pod1234/crio-{CONTAINER}"}}})


# Before any update: the status's resources carry cpu_shares alone; after UpdateContainerResources(cpus "1", mems
# "0"), both the status and the kept spec show the cpuset.
BEFORE = (cri.LinuxContainerResources(cpu_shares=2),
          crio_info({"devices": [{"allow": False, "access": "rwm"}], "cpu": {"shares": 2, "quota": 0, "period": 0},
                     "pids": {"limit": -1}}))
AFTER = (cri.LinuxContainerResources(cpu_shares=2, cpuset_cpus="1", cpuset_mems="0"),
         crio_info({"devices": [{"allow": False, "access": "rwm"}], "memory": {},
                    "cpu": {"shares": 2, "quota": 0, "period": 0, "cpus": "1", "mems": "0"}, "pids": {"limit": -1}}))


class CrioStatus(cri_grpc.RuntimeServiceServicer):
    def __init__(self) -> None:
        self.answer = BEFORE
        self.updates: list[cri.UpdateContainerResourcesRequest] = []

    def ContainerStatus(self, request: Any, context: Any) -> Any:
        resources, info = self.answer
        status = cri.ContainerStatus(
            id=CONTAINER, metadata=cri.ContainerMetadata(name="main"), state=cri.CONTAINER_RUNNING,
            created_at=1796420454199431406, started_at=1796420454291077681, labels=LABELS, annotations=ANNOTATIONS,
            resources=cri.ContainerResources(linux=resources))
        return cri.ContainerStatusResponse(status=status, info={"info": info} if request.verbose else {})

    def UpdateContainerResources(self, request: Any, context: Any) -> Any:
        self.updates.append(request)
        self.answer = AFTER
        return cri.UpdateContainerResourcesResponse()


@pytest.fixture()
def crio(tmp_path: Path) -> Iterator[tuple[CrioStatus, CriClient]]:
    servicer = CrioStatus()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    cri_grpc.add_RuntimeServiceServicer_to_server(servicer, server)
    socket = tmp_path / "crio.sock"
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    client = CriClient(socket, timeout=5.0)
    try:
        yield servicer, client
    finally:
        client.close()
        server.stop(0)


def test_crio_status_gives_the_host_pid_and_the_sandbox_from_its_verbose_info(
        crio: tuple[CrioStatus, CriClient]) -> None:
    _, client = crio
    status = client.container_status(CONTAINER)
    assert (status.pid, status.pod_sandbox_id, status.state) == (23499, SANDBOX, "CONTAINER_RUNNING")
    assert (status.pod_namespace, status.pod_name, status.container_name) == ("smoke-ns", "smoke", "main")
    assert status.annotations["topology.s390x.ibm.com/groups"] == "drawer0-book1"
    # No cpuset of its own yet: the status says none, and the kept spec has none either.
    assert (status.cpuset_cpus, status.cpuset_mems, status.applied_cpus) == ("", "", "")


def test_an_update_shows_in_crio_status_and_in_the_spec_it_keeps(crio: tuple[CrioStatus, CriClient]) -> None:
    servicer, client = crio
    client.update_cpuset(CONTAINER, "1", "0")
    sent = servicer.updates[0].linux
    assert (sent.cpuset_cpus, sent.cpuset_mems, sent.cpu_shares) == ("1", "0", 0)  # nothing else is sent
    status = client.container_status(CONTAINER)
    assert (status.cpuset_cpus, status.cpuset_mems, status.applied_cpus) == ("1", "0", "1")
