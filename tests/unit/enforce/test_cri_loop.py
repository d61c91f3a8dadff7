"""The CRI loop (``--cpuset-enforcement cri``) against stand-in runtimes: how soon it looks again, a container that
ends or is refused costs that container only, and a holder whose book went offline is confined to the CPUs no other
holder has. The real containerd judges the loop in tests/runtime/test_cpuset_enforcement.py."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest
from prometheus_client import generate_latest

from agent.cri.client import ContainerInfo, CriClient
from agent.devices.table import NodeDevices
from agent.enforce.cri_loop import IDLE_INTERVAL, CpusetEnforcement
from agent.errors import CriError
from agent.observe.metrics import AgentMetrics
from agent.observe.status import AgentStatus, EnforcementStatus
from agent.plugin.servicer import render
from agent.policy.allocation import AllocationSettings
from agent.policy.cpuset import CpusetPlan, Update
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.embedded import load_embedded
from tests.support.enforcement import EndingRuntime, OfflineHolderRuntime
from tests.support.env import BOOK


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


def test_the_cri_loop_confines_a_holder_whose_book_is_offline_and_says_so_once() -> None:
    """In CRI mode a holder whose groups' CPUs are all offline goes to the CPUs no other holder has (without
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
