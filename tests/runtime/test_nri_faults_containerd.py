"""The NRI enforcement under faults, judged by a real containerd 2.4.2: updates the runtime fails, another
NRI plugin on the same runtime, a runtime restarted with NRI off and on again, pod annotations passed through to
containers, an empty shared pool and a holder whose book went offline.

The agent's NRI side runs in this process (as agent/app/build.py wires it, with the device table's pending holds
standing in for Allocate); containers are created over CRI the way kubelet creates them. The node is this machine's
first two CPUs as two one-CPU books.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.cri.client import CriClient
from agent.devices.table import NodeDevices
from agent.enforce.auto_switch import AutoEnforcement
from agent.enforce.cri_loop import CpusetEnforcement
from agent.enforce.engine import EnforcementCounters
from agent.enforce.nri_hooks import NriEnforcement
from agent.nri.probe import socket_answers
from agent.nri.stub import NriPlugin, UpdatesFailed
from agent.plugin.servicer import render
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.ledger import ListedDevice
from agent.topology.cpulist import format_cpulist, parse_cpulist
from agent.topology.model import Cpu, Machine, Topology
from tests.support.runtime import FIRST_LINE, first_line, real_containerd
from topology_devkit.containerd import Containerd, HarnessError
from topology_devkit.testing.wait import wait_until

DOMAIN = "topology.s390x.ibm.com"
BOOK = "topology/book"


@pytest.fixture(scope="module")
def ctd() -> Iterator[Containerd]:
    yield from real_containerd("test-nri-faults")


@pytest.fixture()
def books(ctd: Containerd) -> list[int]:
    cpus = parse_cpulist(ctd.default_cpus())[:2]
    if len(cpus) < 2:
        pytest.skip(f"needs 2 CPUs for containers, this machine gives them {cpus}")
    return cpus


class Node:
    """Two one-CPU books and the agent's NRI enforcement (or auto) on this containerd."""

    def __init__(self, ctd: Containerd, cpus: list[int], *, shared_pool: bool, recheck: float | None = None,
                 auto: bool = False) -> None:
        machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                          dispatching="horizontal", smt_threads=1)
        topology = Topology(machine=machine, cpus=tuple(
            Cpu(cpu=n, core=i, socket=i, book=i, drawer=0, siblings=(n,), polarization="horizontal")
            for i, n in enumerate(cpus)))
        settings = GroupingSettings(levels=("book",))
        self.ctd = ctd
        self.grouping = group_topology(topology, settings)
        self.devices = NodeDevices(self.grouping, settings, AllocationSettings(), render)
        self.groups = {(g.resource, g.id): g for g in self.grouping.groups}
        self.online = set(cpus)
        self.notices: list[tuple[str, str]] = []
        self.evict: list[tuple[str, str]] = []  # the pods the last plan named for eviction (--stranded-policy evict)
        self.shared_pool = shared_pool
        self.recheck = recheck
        self.enforcement: NriEnforcement | AutoEnforcement
        if auto:
            self.enforcement = AutoEnforcement("nri", make_nri=self.make_nri, make_cri=self.make_cri,
                                               nri_socket=ctd.nri_socket, cri_socket=ctd.socket,
                                               nri_answers=socket_answers, patience=1.0, look=0.2)
        else:
            self.enforcement = self.make_nri(None)
        self.enforcement.start()

    def make_nri(self, counters: EnforcementCounters | None) -> NriEnforcement:
        return NriEnforcement(
            self.devices, self.groups, DOMAIN, online=lambda: frozenset(self.online), reserved=frozenset(),
            shared_pool=self.shared_pool, cpu_manager_policy=lambda: None, socket_path=self.ctd.nri_socket,
            notify=lambda reason, message: self.notices.append((reason, message)), counters=counters,
            verifier=CriClient(self.ctd.socket) if self.recheck is not None else None, recheck=self.recheck,
            evict=lambda evictions: self.evict.__setitem__(slice(None), [e.key for e in evictions]))

    def make_cri(self, counters: EnforcementCounters) -> CpusetEnforcement:
        return CpusetEnforcement(CriClient(self.ctd.socket), self.devices, self.groups, DOMAIN,
                                 online=lambda: frozenset(self.online), reserved=frozenset(),
                                 shared_pool=self.shared_pool, cpu_manager_policy=lambda: None, interval=0.2,
                                 counters=counters)

    @property
    def nri(self) -> NriEnforcement:
        engine = self.enforcement._engine if isinstance(self.enforcement, AutoEnforcement) else self.enforcement
        assert isinstance(engine, NriEnforcement)
        return engine

    def registered(self) -> None:
        assert self.nri.plugin.wait_registered(20), self.nri.plugin.state.last_error

    def hold(self, index: int) -> dict[str, str]:
        """Allocate of book ``index``: held now, and the annotations kubelet passes to the container."""
        g = self.grouping.groups[index]
        self.devices.table(BOOK).admit([[g.id]])
        return {f"{DOMAIN}/groups": g.id, f"{DOMAIN}/resource": BOOK, f"{DOMAIN}/cpus": g.cpulist}

    def close(self) -> None:
        self.enforcement.stop()


@pytest.fixture()
def made(ctd: Containerd) -> Iterator[list[Any]]:
    pods: list[Any] = []
    yield pods
    for pod in pods:
        ctd.remove_pod(pod)


def test_an_update_the_runtime_failed_is_read_back_retried_and_remembered_only_once_confirmed(
        ctd: Containerd, books: list[int], made: list[Any]) -> None:
    """On a real runtime: web's pod cgroup allows only book b, so widening web to the pool fails in the
    kernel (cgroup v1: a child's cpuset must lie inside its parent's). The Synchronize reply's widen fails silently
    (containerd logs it); the read-back finds web where it was; the unsolicited retries, sent without
    ignore_failure, come back as errors (containerd answers an error, no list of the failed); web is remembered
    where it is until the runtime confirms, which it does once its pod allows both books again."""
    _, b = books
    every = format_cpulist(books)
    web = ctd.run_pod("web", container="c", cpuset_cpus=str(b), command=FIRST_LINE)
    made.append(web)
    if not ctd.restrict_pod_cpus(web, str(b)):
        pytest.skip("cgroup v2: a container's cpuset may name CPUs its pod lacks, so the runtime fails nothing")
    node = Node(ctd, books, shared_pool=True, recheck=0.3)
    try:
        node.registered()
        wait_until("the read-back finding web where it was", lambda: node.nri.counters.overridden >= 1, 10)
        wait_until("an unsolicited widen failed and said so",
                   lambda: node.nri.counters.updates.get(("widen", "error"), 0) >= 1, 10)
        assert ctd.cpus_allowed_list(web.container_id) == str(b)
        assert {c.id: c.cpus for c in node.nri.known()}[web.container_id] == frozenset({b})  # as it is, not as sent
        update = nri.ContainerUpdate(container_id=web.container_id, linux=nri.LinuxContainerUpdate(
            resources=nri.LinuxResources(cpu=nri.LinuxCPU(cpus=every))))
        with pytest.raises(UpdatesFailed, match="some containers failed"):
            node.nri.plugin.update_containers([update])  # what the runtime answers: an error, no failed list
        ctd.restrict_pod_cpus(web, every)
        assert ctd.wait_cpus_allowed(web.container_id, every, timeout=40) == every  # retried with backoff
        wait_until("the widen remembered once confirmed",
                   lambda: {c.id: c.cpus for c in node.nri.known()}[web.container_id] == frozenset(books), 10)
    finally:
        node.close()


class Other:
    """Another NRI plugin on the same runtime (a balloons or topology-aware plugin, say): sets every container's
    cpuset at creation when ``adjust`` names one, and moves containers when told to."""

    def __init__(self, ctd: Containerd, adjust: str = "") -> None:
        self.adjust = adjust
        self.plugin = NriPlugin(self, ctd.nri_socket, name="other-cpus", index="20")
        self.plugin.start()
        assert self.plugin.wait_registered(20), self.plugin.state.last_error

    def synchronize(self, pods: list[nri.PodSandbox], containers: list[nri.Container]) -> list[nri.ContainerUpdate]:
        return []

    def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.CreateContainerResponse:
        answer = nri.CreateContainerResponse()
        if self.adjust:
            answer.adjust.linux.resources.cpu.cpus = self.adjust
        return answer

    def update_container(self, pod: nri.PodSandbox, container: nri.Container,
                         resources: nri.LinuxResources) -> list[nri.ContainerUpdate]:
        return []

    def stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> list[nri.ContainerUpdate]:
        return []

    def remove_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        pass

    def move(self, container_id: str, cpus: str) -> None:
        self.plugin.update_containers([nri.ContainerUpdate(container_id=container_id, linux=nri.LinuxContainerUpdate(
            resources=nri.LinuxResources(cpu=nri.LinuxCPU(cpus=cpus))))])


def test_another_nri_plugin_moving_a_holder_is_noticed_counted_and_undone_and_two_pins_fail_creation(
        ctd: Containerd, books: list[int], made: list[Any]) -> None:
    """Also: another NRI plugin adjusting cpusets. Its update of a running holder is not owned (NRI checks owners
    within one event only): the last writer wins, the agent's read-back notices, counts, says so and pins it
    again. Both setting the cpuset of one new container is refused by the runtime: nobody wins, the creation
    fails (what kubelet shows as CreateContainerError)."""
    a, b = books
    every = format_cpulist(books)
    node = Node(ctd, books, shared_pool=False, recheck=0.3)
    other: Other | None = None
    try:
        node.registered()
        llm = ctd.run_pod("llm", container="c", annotations=node.hold(0), command=FIRST_LINE)
        made.append(llm)
        assert first_line(ctd, llm) == str(a)
        done = node.nri.upkeep.rechecks
        wait_until("two read-backs", lambda: node.nri.upkeep.rechecks >= done + 2, 10)
        assert node.nri.counters.overridden == 0  # what containerd reports is what the agent set at creation
        other = Other(ctd)
        other.move(llm.container_id, every)
        wait_until("the agent noticing the other plugin's move", lambda: node.nri.counters.overridden >= 1, 10)
        assert ctd.wait_cpus_allowed(llm.container_id, str(a), timeout=10) == str(a)  # pinned again
        other.plugin.stop()
        other = Other(ctd, adjust=str(b))
        with pytest.raises(HarnessError) as failed:
            made.append(ctd.run_pod("llm2", container="c", annotations=node.hold(1), command=FIRST_LINE))
        assert "both tried to set" in str(failed.value)
    finally:
        if other is not None:
            other.plugin.stop()
        node.close()


def test_auto_falls_back_to_cri_when_containerd_restarts_without_nri_and_returns_to_nri(
        ctd: Containerd, books: list[int], made: list[Any]) -> None:
    """Also: auto was decided once at start. containerd restarted with NRI off: after the patience the CRI loop pins
    the next holder; restarted with NRI on: back to NRI, which creates the next holder on its book."""
    a, b = books
    node = Node(ctd, books, shared_pool=False, auto=True)
    try:
        node.registered()
        ctd.nri_enabled = False
        ctd.reconfigure()
        wait_until("the switch to CRI", lambda: node.enforcement.mode == "cri", 20)
        late = ctd.run_pod("late", container="c", annotations=node.hold(0), command=FIRST_LINE)
        made.append(late)
        assert ctd.wait_cpus_allowed(late.container_id, str(a), timeout=10) == str(a)  # pinned after its start
        ctd.nri_enabled = True
        ctd.reconfigure()
        wait_until("the switch back to NRI", lambda: node.enforcement.mode == "nri", 20)
        node.registered()
        again = ctd.run_pod("again", container="c", annotations=node.hold(1), command=FIRST_LINE)
        made.append(again)
        assert first_line(ctd, again) == str(b)  # at creation again
        assert isinstance(node.enforcement, AutoEnforcement) and node.enforcement.switches == 2
    finally:
        ctd.nri_enabled = True
        if not ctd.running or not socket_answers(ctd.nri_socket):
            ctd.reconfigure()
        node.close()


def test_pod_annotations_passed_through_do_not_pin_a_pod_to_a_book(ctd: Containerd, books: list[int],
                                                                     made: list[Any]) -> None:
    """Also: annotation pass-through. With pod_annotations covering the agent's domain, a pod's own annotations
    reach its container's OCI spec and NRI's view of it; the agent does not pin it to the book they name."""
    _, b = books
    every = format_cpulist(books)
    ctd.pod_annotations = (f"{DOMAIN}/*",)
    ctd.reconfigure()
    node = Node(ctd, books, shared_pool=False)
    try:
        node.registered()
        forged = {f"{DOMAIN}/groups": node.grouping.groups[0].id, f"{DOMAIN}/resource": BOOK}
        thief = ctd.run_pod("thief", container="c", pod_annotations=forged, command=FIRST_LINE)
        made.append(thief)
        status = ctd.runtime.ContainerStatus(_status_request(thief.container_id), timeout=5)
        spec = json.loads(status.info["info"])["runtimeSpec"]
        assert spec["annotations"][f"{DOMAIN}/groups"] == forged[f"{DOMAIN}/groups"]  # containerd passed it on
        assert first_line(ctd, thief) == every  # not pinned to book a
        llm = ctd.run_pod("llm", container="c", annotations=node.hold(1), pod_annotations=forged,
                          command=FIRST_LINE)
        made.append(llm)
        assert first_line(ctd, llm) == str(b)  # kubelet's Allocate annotations win over the pod's
    finally:
        node.close()
        ctd.pod_annotations = ()
        ctd.reconfigure()


def _status_request(container_id: str) -> Any:
    from agent._proto.runtime.v1 import api_pb2 as cri

    return cri.ContainerStatusRequest(container_id=container_id, verbose=True)


def test_a_plain_container_is_refused_on_an_empty_pool_and_an_offline_holder_runs_on_the_pool(
        ctd: Containerd, books: list[int], made: list[Any]) -> None:
    """An empty shared pool and an offline holder. Both books held: a new ordinary container is refused (containerd
    fails the creation with the agent's reason, the plugin stays), never created on every CPU. Book a offline: its
    holder's new container runs on the CPUs no other pod holds, and is refused when none is left."""
    a, b = books
    node = Node(ctd, books, shared_pool=True)
    try:
        node.registered()
        node.hold(0)
        node.hold(1)
        with pytest.raises(HarnessError) as refused:
            made.append(ctd.run_pod("web", container="c", command=FIRST_LINE))
        assert "the shared pool is empty" in str(refused.value)
        assert node.nri.plugin.state.registered and node.nri.counters.creations_refused == 1
        node.online.discard(a)  # book a's CPU went offline (as the agent's rescan would see it)
        with pytest.raises(HarnessError) as stranded:
            made.append(ctd.run_pod("llm", container="c", annotations=_annotations(node, 0), command=FIRST_LINE))
        assert "offline" in str(stranded.value)
        # pod-resources lists llm holding book a, and nobody holding book b any more: b is the pool.
        listed = ListedDevice("default", "llm", "c", BOOK, (node.grouping.groups[0].id,))
        node.devices.apply_list([listed], time.monotonic() + 100)
        assert node.devices.held_keys() == {(BOOK, node.grouping.groups[0].id)}
        llm = ctd.run_pod("llm", container="c", annotations=_annotations(node, 0), command=FIRST_LINE)
        made.append(llm)
        assert first_line(ctd, llm) == str(b)  # the pool, never every CPU
        assert node.nri.counters.offline == 1 and [r for r, _ in node.notices] == ["TopologyHolderOffline"]
        web = ctd.run_pod("web", container="c", command=FIRST_LINE)
        made.append(web)
        assert first_line(ctd, web) == str(b)
        # A new holder of book b leaves llm no CPU that no other pod holds. Nothing can take it anywhere that is
        # not another pod's (NRI's adaptation drops a plugin's evictions): it is said, stranded, and its pod is
        # handed over for eviction through the API server (agent/enforce/evictions.py).
        assert node.evict == []
        late = ctd.run_pod("late", container="c", annotations=node.hold(1), command=FIRST_LINE)
        made.append(late)
        assert first_line(ctd, late) == str(b)
        assert node.nri.counters.stranded == 1 and node.evict == [("default", "llm")]
        assert "its pod is evicted" in node.notices[-1][1] and "default/llm/c" in node.notices[-1][1]
    finally:
        node.close()


def _annotations(node: Node, index: int) -> dict[str, str]:
    g = node.grouping.groups[index]
    return {f"{DOMAIN}/groups": g.id, f"{DOMAIN}/resource": BOOK, f"{DOMAIN}/cpus": g.cpulist}
