"""CPU sets enforced through a real container runtime: ``serve --cpuset-enforcement cri`` against a
real containerd (runc and crun), kubelet's pod-resources from the emulator, and the processes'
own ``Cpus_allowed_list`` as the judge.

The node is this machine's own CPUs as one book of two one-core sockets, so a socket is one CPU.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest
from prometheus_client import generate_latest

from agent.cri.client import ContainerInfo, ContainerStatusInfo, CriClient
from agent.devices.table import NodeDevices
from agent.enforce.cri_loop import IDLE_INTERVAL, CpusetEnforcement
from agent.errors import CriError
from agent.observe.metrics import AgentMetrics
from agent.observe.status import AgentStatus, EnforcementStatus
from agent.plugin.servicer import render
from agent.policy.allocation import AllocationSettings
from agent.policy.cpuset import CpusetPlan, Update
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology import snapshot_format as snapshot
from agent.topology.cpulist import format_cpulist, parse_cpulist
from agent.topology.embedded import load_embedded
from agent.topology.model import Cpu, Machine, Topology
from tests.conftest import BOOK, SOCKET
from tests.plugin_harness import short_tmpdir
from topology_devkit.agent_process import AgentProcess, wait_until
from topology_devkit.containerd import Containerd
from topology_devkit.kubelet_emulator import Container, KubeletEmulator


def two_sockets(ctd: Containerd, directory: Path) -> tuple[Path, list[int]]:
    """A snapshot of one s390x book of two one-core sockets on the CPUs containers get here."""
    cpus = parse_cpulist(ctd.default_cpus())
    if len(cpus) < 2:
        pytest.skip(f"needs 2 CPUs for containers, this machine gives them {cpus}")
    a, b = cpus[:2]
    machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                      dispatching="horizontal", smt_threads=1)
    topology = Topology(machine=machine, cpus=tuple(
        Cpu(cpu=n, core=i, socket=i, book=0, drawer=0, siblings=(n,), polarization="horizontal")
        for i, n in enumerate((a, b))))
    path = directory / "two-sockets.json"
    path.write_text(snapshot.dumps(topology))
    return path, [a, b]


def start_agent(k: KubeletEmulator, root: Path, ctd: Containerd, topology: Path, *extra: str) -> AgentProcess:
    agent = AgentProcess(k, root, "--cpuset-enforcement", "cri", "--cri-socket", str(ctd.socket),
                         "--cpuset-interval", "0.5", "--pod-resources-interval", "0.2",
                         "--cpu-manager-state", str(root / "no-cpu-manager-state"), *extra,
                         topology=str(topology))
    k.wait_registered(SOCKET, timeout=30)
    return agent


def admit(k: KubeletEmulator, name: str) -> tuple[str, dict[str, str]]:
    """kubelet admits a pod asking for one socket: its CPUs and the annotations its container gets."""
    pod = k.admit_pod("default", name, [Container("c", {SOCKET: 1})])
    env = k.start_container("default", name, "c")
    return env["TOPOLOGY_CPUS"], pod.annotations("c")


def test_a_topology_container_is_pinned_and_pinned_again_after_a_restart(ctd: Containerd, handler: str) -> None:
    root = short_tmpdir()
    topology, _ = two_sockets(ctd, root)
    with KubeletEmulator(root) as k:
        agent = start_agent(k, root, ctd, topology)
        try:
            cpus, annotations = admit(k, "llm")
            pod = ctd.run_pod("llm", container="c", handler=handler, annotations=annotations)
            ctd.wait_cpus_allowed(pod.container_id, cpus, timeout=10)
            again = ctd.restart_container(pod)  # a new container id, with the pod's original (no) cpuset
            assert again.container_id != pod.container_id
            ctd.wait_cpus_allowed(again.container_id, cpus, timeout=10)
            wait_until(lambda: agent.metric("topology_agent_cpuset_containers_pinned") == 1, 10, "the pinned count")
            wait_until(lambda: agent.metric("topology_agent_cpuset_pin_seconds_count") >= 2, 5, "both pins timed")
            assert agent.metric("topology_agent_cpuset_updates_total", kind="topology", result="ok") >= 2
            devices = json.loads(agent.get("/allocations")[1])["devices"]
            assert [d["enforced_cpusets"] for d in devices if d["holders"]] == [[cpus]]
            ctd.remove_pod(again)
        finally:
            agent.stop()


def test_the_shared_pool_confines_the_rest_and_widens_when_the_group_is_freed(ctd: Containerd) -> None:
    root = short_tmpdir()
    topology, (a, b) = two_sockets(ctd, root)
    both = format_cpulist([a, b])
    with KubeletEmulator(root) as k:
        web = ctd.run_pod("web", container="c")  # holds nothing
        agent = start_agent(k, root, ctd, topology, "--shared-pool")
        try:
            wait_until(lambda: agent.metric("topology_agent_cpuset_enforcement_steps_total") >= 1, 10,
                       "the agent looked at the runtime")
            assert ctd.cpus_allowed_list(web.container_id) == both  # no group held: the pool is everything
            cpus, annotations = admit(k, "llm")
            llm = ctd.run_pod("llm", container="c", annotations=annotations)
            other = format_cpulist(sorted({a, b} - set(parse_cpulist(cpus))))
            ctd.wait_cpus_allowed(llm.container_id, cpus, timeout=10)
            ctd.wait_cpus_allowed(web.container_id, other, timeout=10)
            wait_until(lambda: agent.metric("topology_agent_cpuset_updates_total", kind="shrink", result="ok") >= 1,
                       5, "the shrink counted")  # counted right after the runtime answers
            k.delete_pod("default", "llm")  # kubelet no longer lists it: its socket is free again
            ctd.remove_pod(llm)
            ctd.wait_cpus_allowed(web.container_id, both, timeout=15)
            wait_until(lambda: agent.metric("topology_agent_cpuset_updates_total", kind="widen", result="ok") >= 1,
                       5, "the widening counted")
        finally:
            agent.stop()
            ctd.remove_pod(web)


def test_a_runtime_that_is_down_never_stops_device_serving(ctd: Containerd) -> None:
    root = short_tmpdir()
    topology, _ = two_sockets(ctd, root)
    with KubeletEmulator(root) as k:
        agent = start_agent(k, root, ctd, topology)
        try:
            ctd.stop_containerd()
            cpus, annotations = admit(k, "llm")  # Allocate still answers
            wait_until(lambda: agent.metric("topology_agent_cpuset_enforcement_failing") == 1, 15,
                       "the failure reported")
            assert agent.get("/readyz")[0] == 200
            wait_until(lambda: agent.logged("cpuset enforcement failing"), 5, "the failure logged")
            ctd.start_containerd()
            pod = ctd.run_pod("llm", container="c", annotations=annotations)
            ctd.wait_cpus_allowed(pod.container_id, cpus, timeout=40)  # after the backoff, the pin arrives
            ctd.remove_pod(pod)
        finally:
            agent.stop()


def test_enforcement_is_refused_while_kubelet_runs_the_static_cpu_manager(ctd: Containerd) -> None:
    root = short_tmpdir()
    topology, _ = two_sockets(ctd, root)
    state = root / "cpu_manager_state"
    state.write_text(json.dumps({"policyName": "static", "defaultCpuSet": "0-1", "checksum": 1}))
    with KubeletEmulator(root) as k:
        agent = AgentProcess(k, root, "--cpuset-enforcement", "cri", "--cri-socket", str(ctd.socket),
                             "--cpuset-interval", "0.5", "--cpu-manager-state", str(state), topology=str(topology))
        try:
            k.wait_registered(SOCKET, timeout=30)
            _, annotations = admit(k, "llm")
            pod = ctd.run_pod("llm", container="c", annotations=annotations)
            wait_until(lambda: agent.metric("topology_agent_cpuset_enforcement_refused") == 1, 15, "refused")
            status, body = agent.get("/readyz")
            assert status == 200 and "cpuset enforcement refused" in body
            steps = agent.metric("topology_agent_cpuset_enforcement_steps_total")
            wait_until(lambda: agent.metric("topology_agent_cpuset_enforcement_steps_total") >= steps + 2, 15,
                       "two more looks at the runtime")  # had it not refused, the pin would be there by now
            assert ctd.cpus_allowed_list(pod.container_id) == ctd.default_cpus()
            ctd.remove_pod(pod)
        finally:
            agent.stop()


def test_the_loop_looks_slowly_only_while_nothing_is_held_and_nothing_needed_an_update() -> None:
    settings = GroupingSettings(levels=("book",))
    devices = NodeDevices(group_topology(load_embedded("z16-lpar"), settings), settings, AllocationSettings(), render)
    loop = CpusetEnforcement(cast(CriClient, None), devices, {}, "topology.s390x.ibm.com", online=frozenset,
                             reserved=frozenset(), shared_pool=True, cpu_manager_policy=lambda: None, interval=2.0)
    quiet = CpusetPlan(updates=(), pool=(), topology_containers=0, pinned=0, pool_empty=False)
    widen = Update(container="c1", identity=("ns", "pod", "c"), cpus="0-3", mems="", kind="widen")
    assert loop.next_delay(quiet) == IDLE_INTERVAL  # an idle node: nothing to pin, no pool to keep
    assert loop.next_delay(replace(quiet, updates=(widen,))) == 2.0  # the last group was just freed
    assert loop.next_delay(None) == 2.0  # refused: the CPU manager policy is looked at again soon
    devices.table(BOOK).admit([["drawer0-book0"]])
    assert loop.next_delay(quiet) == 2.0  # a held device: its container may be recreated any time
    loop.changed()
    assert loop.next_delay(quiet) == loop.fast_interval


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


def test_a_container_that_ends_between_the_list_and_its_status_is_skipped_not_a_failed_step() -> None:
    settings = GroupingSettings(levels=("book",))
    devices = NodeDevices(group_topology(load_embedded("z16-lpar"), settings), settings, AllocationSettings(), render)
    runtime = EndingRuntime()
    loop = CpusetEnforcement(cast(CriClient, runtime), devices, {}, "topology.s390x.ibm.com",
                             online=lambda: frozenset(range(8)), reserved=frozenset(), shared_pool=True,
                             cpu_manager_policy=lambda: None, interval=2.0)
    plan = loop.step()
    assert plan is not None and plan.topology_containers == 0
    assert runtime.updates == [("alive", "0-7")]  # widened to the pool; the ended one left alone


class RefusingRuntime(EndingRuntime):
    """A runtime that refuses every update of one container (a sandboxed runtime, say) and takes the rest."""

    def list_containers(self, running_only: bool = True) -> list[ContainerInfo]:
        return [ContainerInfo(id=c, pod_sandbox_id=f"s-{c}", name=c, attempt=0, state="CONTAINER_RUNNING",
                              created_at=0, labels={"io.kubernetes.pod.name": c,
                                                    "io.kubernetes.pod.namespace": "ns",
                                                    "io.kubernetes.container.name": c})
                for c in ("sandboxed", "a", "b")]

    def update_cpuset(self, container: str, cpus: str, mems: str = "") -> None:
        if container == "sandboxed":
            raise CriError(f"CRI UpdateContainerResources {container}: UNKNOWN: not supported by this runtime",
                           "UNKNOWN")
        super().update_cpuset(container, cpus, mems)


def test_a_container_the_runtime_refuses_costs_that_container_only(caplog: pytest.LogCaptureFixture) -> None:
    settings = GroupingSettings(levels=("book",))
    devices = NodeDevices(group_topology(load_embedded("z16-lpar"), settings), settings, AllocationSettings(), render)
    runtime = RefusingRuntime()
    loop = CpusetEnforcement(cast(CriClient, runtime), devices, {}, "topology.s390x.ibm.com",
                             online=lambda: frozenset(range(8)), reserved=frozenset(), shared_pool=True,
                             cpu_manager_policy=lambda: None, interval=2.0)
    with caplog.at_level("WARNING", logger="topology-agent.cpuset"):
        for _ in range(3):
            assert loop.step() is not None  # no step fails: no backoff grows
    assert runtime.updates == [("a", "0-7"), ("b", "0-7")]  # pinned in the first step, the refused one aside
    assert not loop.failing and loop.readiness_note() is None
    assert loop.counters.container_refusals == 3 and loop.counters.refusing == 1
    said = [r for r in caplog.records if "sandboxed" in r.getMessage()]
    assert len(said) == 1  # once per container, not once per step
    metrics = AgentMetrics()
    metrics.read_status(lambda: AgentStatus(machine="z16", fidelity="full", dispatching="horizontal", smt=2, groups=(),
                                            resources=(), ready=True, enforcement=EnforcementStatus(
                                                refused=False, failing=False, topology_containers=0, pinned=0,
                                                updates={}, pool_cpus=8, pool_empty=False,
                                                container_refusals=loop.counters.container_refusals,
                                                refusing=loop.counters.refusing)))
    text = generate_latest(metrics.registry).decode()
    assert "topology_agent_cpuset_container_refusals_total 3.0" in text
    assert "topology_agent_cpuset_containers_refusing 1.0" in text


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


def test_the_cri_loop_confines_a_holder_whose_book_is_offline_and_says_so_once() -> None:
    """Item 6 in CRI mode: its groups' CPUs all offline, the holder goes to the CPUs no other holder has (without
    --shared-pool too), counted, and said once as a Node event."""
    settings = GroupingSettings(levels=("book",))
    grouping = group_topology(load_embedded("z16-lpar"), settings)
    devices = NodeDevices(grouping, settings, AllocationSettings(), render)
    runtime = OfflineHolderRuntime()
    notices: list[tuple[str, str]] = []
    loop = CpusetEnforcement(cast(CriClient, runtime), devices, {(g.resource, g.id): g for g in grouping.groups},
                             "topology.s390x.ibm.com", online=lambda: frozenset(range(12, 82)), reserved=frozenset(),
                             shared_pool=False, cpu_manager_policy=lambda: None, interval=2.0,
                             notify=lambda reason, message: notices.append((reason, message)))
    for _ in range(2):
        loop.step()
    assert runtime.updates[:2] == [("llm", "22-81"), ("other", "12-21")]  # never book 1, which other holds
    assert loop.counters.offline == 1 and loop.counters.updates[("offline", "ok")] >= 1
    assert [r for r, _ in notices] == ["TopologyHolderOffline"] and "ns/llm/llm" in notices[0][1]
