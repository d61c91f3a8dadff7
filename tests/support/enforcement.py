"""Stand-ins for the enforcement engines' tests: CRI runtimes that answer from a script, and the NRI messages and the
two-book machine the NRI handlers are driven with."""

from __future__ import annotations

from typing import Any

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.cri.client import ContainerInfo, ContainerStatusInfo
from agent.devices.table import NodeDevices
from agent.enforce.nri_hooks import NriEnforcement
from agent.errors import CriError
from agent.plugin.servicer import render as render_wire
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.model import Cpu, Machine, Topology
from tests.support.env import BOOK


class EndingRuntime:
    """A runtime where one listed container has ended by the time its status is asked for."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, str]] = []

    def list_containers(self, running_only: bool = True) -> list[ContainerInfo]:
        return [ContainerInfo(id=c, pod_sandbox_id=f"s-{c}", name=c, attempt=0, state="CONTAINER_RUNNING",
                              created_at=0, labels={"io.kubernetes.pod.name": c,
                                                    "io.kubernetes.pod.namespace": "ns",
                                                    "io.kubernetes.container.name": c})
                for c in ("alive", "ended")]

    def container_status(self, container: str) -> ContainerStatusInfo:
        if container == "ended":
            raise CriError(f"ContainerStatus {container}: NOT_FOUND", "NOT_FOUND")
        return ContainerStatusInfo(id=container, pod_sandbox_id=f"s-{container}", name=container, attempt=0,
                                   state="CONTAINER_RUNNING", created_at=0, cpuset_cpus="0-3")

    def update_cpuset(self, container: str, cpus: str, mems: str = "") -> None:
        self.updates.append((container, cpus))

    def close(self) -> None:
        pass


class OfflineHolderRuntime(EndingRuntime):
    """A holder of book 0 (annotated by Allocate) and a holder of book 1; book 0's CPUs went offline."""

    def list_containers(self, running_only: bool = True) -> list[ContainerInfo]:
        return [ContainerInfo(id=c, pod_sandbox_id=f"s-{c}", name=c, attempt=0, state="CONTAINER_RUNNING",
                              created_at=0, labels={"io.kubernetes.pod.name": c, "io.kubernetes.pod.namespace": "ns",
                                                    "io.kubernetes.container.name": c},
                              annotations={"topology.s390x.ibm.com/groups": book,
                                           "topology.s390x.ibm.com/resource": BOOK})
                for c, book in (("llm", "drawer0-book0"), ("other", "drawer0-book1"))]

    def container_status(self, container: str) -> ContainerStatusInfo:  # as the kernel left them: every CPU
        return ContainerStatusInfo(id=container, pod_sandbox_id=f"s-{container}", name=container, attempt=0,
                                   state="CONTAINER_RUNNING", created_at=0, cpuset_cpus="")


DOMAIN = "topology.s390x.ibm.com"


def two_books() -> Topology:
    machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                      dispatching="horizontal", smt_threads=1)
    return Topology(machine=machine, cpus=tuple(
        Cpu(cpu=n, core=n, socket=n, book=n, drawer=0, siblings=(n,), polarization="horizontal") for n in (0, 1)))


def annotated(grouping: Any, index: int) -> dict[str, str]:
    g = grouping.groups[index]
    return {f"{DOMAIN}/groups": g.id, f"{DOMAIN}/resource": g.resource, f"{DOMAIN}/cpus": g.cpulist}


def pod(name: str) -> nri.PodSandbox:
    return nri.PodSandbox(id=f"pod-{name}", name=name, namespace="default", uid=f"u-{name}")


def container(cid: str, name: str, annotations: dict[str, str] | None = None, cpus: str = "",
              mems: str = "") -> nri.Container:
    c = nri.Container(id=cid, pod_sandbox_id=f"pod-{name}", name="c", state=nri.CONTAINER_RUNNING,
                      annotations=annotations or {})
    if cpus:
        c.linux.resources.cpu.cpus = cpus
    if mems:
        c.linux.resources.cpu.mems = mems
    return c


def three_books() -> Topology:
    machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                      dispatching="horizontal", smt_threads=1)
    return Topology(machine=machine, cpus=tuple(
        Cpu(cpu=n, core=n, socket=n, book=n, drawer=0, siblings=(n,), polarization="horizontal") for n in (0, 1, 2)))


def setup3(shared_pool: bool = True, online: frozenset[int] = frozenset({0, 1, 2}),
           **kw: Any) -> tuple[NriEnforcement, Any, list[tuple[str, str]]]:
    """NRI enforcement on three one-CPU books (the grouping, and the notices it gave); ``set_online`` changes the
    online CPUs it sees."""
    settings = GroupingSettings(levels=("book",))
    grouping = group_topology(three_books(), settings)
    devices = NodeDevices(grouping, settings, AllocationSettings(), render_wire)
    groups = {(g.resource, g.id): g for g in grouping.groups}
    notices: list[tuple[str, str]] = []
    current = [online]
    enforcement = NriEnforcement(devices, groups, DOMAIN, online=lambda: current[0], reserved=frozenset(),
                                 shared_pool=shared_pool, cpu_manager_policy=lambda: None,
                                 socket_path=short_tmpdir_path() / "absent.sock",
                                 notify=lambda reason, message: notices.append((reason, message)), **kw)
    enforcement.set_online = lambda cpus: current.__setitem__(0, cpus)  # type: ignore[attr-defined]
    return enforcement, grouping, notices


def short_tmpdir_path() -> Any:
    """A short temporary folder for sockets (imported late: the harness needs grpc, these tests do not)."""
    from tests.support.harness import short_tmpdir

    return short_tmpdir()
