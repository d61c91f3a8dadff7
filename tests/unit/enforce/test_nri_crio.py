"""What CRI-O 1.34.0's NRI hands the agent, captured on the real-cluster lane (``make cluster-up RUNTIME=crio``, the
chart in ``cpusetEnforcement: nri`` with the shared pool, a second plugin at index 99 recording every request), and
how the agent reads it. The requests below are the captured ones cut to the fields the agent reads (the container's
cpuset as the agent, first in index order, got it: before its own adjustment).

* ``Configure`` says ``cri-o`` ``1.34.0`` and no NRI version (CRI-O vendors NRI v0.9.1-pre, whose ConfigureRequest has
  no such field): the agent never sends it unsolicited ``UpdateContainers`` (agent/enforce/nri_upkeep.py sends those
  updates over CRI instead).
* Every pod annotation is in each container's annotations (CRI-O's ``SpecAddAnnotations`` copies the sandbox's into
  the spec, https://github.com/cri-o/cri-o/blob/v1.34.0/internal/factory/container/container.go), kubelet's
  container annotations over them: a pod that names a book in its own annotations is not believed, an Allocate's
  annotations are.
* The container carries no ``created_at`` (NRI v0.10 added the container's status fields).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.enforce.nri_hooks import running_container
from agent.nri.stub import NriPlugin
from agent.topology.cpulist import parse_cpulist
from tests.support.enforcement import setup3

DOMAIN = "topology.s390x.ibm.com"

CONFIGURE = {"runtimeName": "cri-o", "runtimeVersion": "1.34.0", "registrationTimeout": "5000",
             "requestTimeout": "2000"}

# A pod asking topology/book: 1 (kubelet's Allocate annotations on its container), and a pod that carries the groups
# and resource annotations itself and asks no book: CRI-O 1.34.0's CreateContainer requests for them.
BOOK_POD = {
    "pod": {"id": "9e03b465efd3c9638eb4a30883204ad770f3a3884e7a38ac78a67ca7f67fd7a8", "name": "cap-book",
            "namespace": "default", "uid": "f651b236-9f43-4d1d-98fd-3fc7dbf06619",
            "annotations": {"kubernetes.io/config.source": "api"}},
    "container": {
        "id": "8e04b47a97e4802e60e60e266e50afbf3f8201021f4e4b92badd76dd13249e5e",
        "podSandboxId": "9e03b465efd3c9638eb4a30883204ad770f3a3884e7a38ac78a67ca7f67fd7a8", "name": "main",
        "labels": {"io.kubernetes.pod.name": "cap-book", "io.kubernetes.pod.namespace": "default",
                   "io.kubernetes.pod.uid": "f651b236-9f43-4d1d-98fd-3fc7dbf06619",
                   "io.kubernetes.container.name": "main"},
        "annotations": {"topology.s390x.ibm.com/rank-cores": "1", "io.kubernetes.pod.namespace": "default",
                        "topology.s390x.ibm.com/groups": "drawer0-book0", "kubernetes.io/config.source": "api",
                        "io.kubernetes.cri-o.ContainerType": "container", "io.kubernetes.pod.name": "cap-book",
                        "topology.s390x.ibm.com/resource": "topology/book",
                        "topology.s390x.ibm.com/memory-nodes": "0", "io.kubernetes.container.name": "main",
                        "topology.s390x.ibm.com/cpus": "0"},
        "linux": {"resources": {"cpu": {"shares": {"value": "1024"}, "period": {"value": "100000"}}}}}}
FORGED_POD = {
    "pod": {"id": "c06a4cf9a0a50a283d9a1236874e72631fe112663c5b6359824825679cc03b63", "name": "cap-forged",
            "namespace": "default", "uid": "0604c61f-fd01-44ed-884e-f4f31afa8ff3",
            "annotations": {"topology.s390x.ibm.com/groups": "drawer0-book0",
                            "topology.s390x.ibm.com/resource": "topology/book", "kubernetes.io/config.source": "api"}},
    "container": {
        "id": "9869e3bec3c8053415ea75f3524c7e1da2259553a9eb2819f2631be9a695f007",
        "podSandboxId": "c06a4cf9a0a50a283d9a1236874e72631fe112663c5b6359824825679cc03b63", "name": "main",
        "labels": {"io.kubernetes.pod.name": "cap-forged", "io.kubernetes.pod.namespace": "default",
                   "io.kubernetes.pod.uid": "0604c61f-fd01-44ed-884e-f4f31afa8ff3",
                   "io.kubernetes.container.name": "main"},
        "annotations": {"io.kubernetes.pod.namespace": "default", "topology.s390x.ibm.com/groups": "drawer0-book0",
                        "kubernetes.io/config.source": "api", "io.kubernetes.cri-o.ContainerType": "container",
                        "io.kubernetes.pod.name": "cap-forged", "topology.s390x.ibm.com/resource": "topology/book",
                        "io.kubernetes.container.name": "main"},
        "linux": {"resources": {"cpu": {"shares": {"value": "102"}, "period": {"value": "100000"}}}}}}


def request(captured: dict[str, Any]) -> nri.CreateContainerRequest:
    return json_format.ParseDict(captured, nri.CreateContainerRequest())


def test_crio_configures_with_no_nri_version_so_nothing_goes_unsolicited() -> None:
    plugin = NriPlugin(handlers=None)  # type: ignore[arg-type]  # Configure needs no handler
    answer = plugin._configure(json_format.ParseDict(CONFIGURE, nri.ConfigureRequest()))
    assert answer.events == 0x0688  # within the 0x07FF an NRI before v0.10 takes
    assert (plugin.state.runtime, plugin.state.nri_version, plugin.state.request_timeout) == ("cri-o 1.34.0", "", 2.0)
    assert not plugin.unsolicited_safe


def test_a_pods_own_annotations_copied_into_its_container_are_not_believed() -> None:
    forged = request(FORGED_POD)
    assert forged.container.annotations[f"{DOMAIN}/groups"] == forged.pod.annotations[f"{DOMAIN}/groups"]
    seen = running_container(forged.pod, forged.container, DOMAIN)
    assert (seen.annotated_groups, seen.annotated_resource) == ((), "")
    assert seen.identity == ("default", "cap-forged", "main") and seen.created_at == 0.0  # no created_at from CRI-O


def test_an_allocates_annotations_are_believed_and_the_pod_is_created_on_its_book() -> None:
    book = request(BOOK_POD)
    seen = running_container(book.pod, book.container, DOMAIN)
    assert (seen.annotated_groups, seen.annotated_resource) == (("drawer0-book0",), "topology/book")
    enforcement, grouping, _ = setup3()
    assert grouping.groups[0].id == "drawer0-book0"
    answer = enforcement.create_container(book.pod, book.container)
    assert answer.adjust.linux.resources.cpu.cpus == grouping.groups[0].cpulist
    forged = request(FORGED_POD)
    plain = enforcement.create_container(forged.pod, forged.container)
    assert not set(parse_cpulist(plain.adjust.linux.resources.cpu.cpus)) & set(grouping.groups[0].cpus)
