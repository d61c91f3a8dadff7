"""Updates outside any NRI event on a runtime whose NRI cannot take unsolicited ``UpdateContainers`` (before NRI
v0.12.1: CRI-O 1.34, which vendors NRI v0.9.1-pre and says no NRI version in ``Configure``; containerd before 2.4):
they go over the runtime's CRI socket, ``UpdateContainerResources``, as the CRI enforcement sends them. Judged on the
real cluster by tests/e2e/test_nri_faults_real.py with ``make e2e RUNTIME=crio`` (a held book's CPU going offline
moves its holder to the pool at once; a freed book returns to the pool)."""

from __future__ import annotations

from typing import Any

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.errors import CriError
from tests.support.enforcement import annotated, container, pod, setup3
from topology_devkit.testing.wait import wait_until


class CriRuntime:
    """The runtime's CRI side: records UpdateContainerResources, fails as told; reads back what it applied."""

    def __init__(self, fail: dict[str, str] | None = None) -> None:
        self.updates: list[tuple[str, str, str]] = []
        self.fail = fail or {}  # container id -> gRPC code
        self.applied: dict[str, str] = {}
        self.closed = 0

    def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        self.updates.append((container_id, cpus, mems))
        if container_id in self.fail:
            raise CriError(f"CRI UpdateContainerResources: {self.fail[container_id]}", self.fail[container_id])
        self.applied[container_id] = cpus

    def container_status(self, container_id: str) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(cpuset_cpus=self.applied.get(container_id, ""),
                               applied_cpus=self.applied.get(container_id, ""))

    def close(self) -> None:
        self.closed += 1


def old_nri(enforcement: Any) -> list[Any]:
    """Registered with a runtime whose Configure says no NRI version (CRI-O 1.34): unsolicited updates refused."""
    enforcement.plugin.state.registered = True
    enforcement.plugin.state.nri_version = ""
    sent: list[Any] = []

    def refuse(updates: list[nri.ContainerUpdate], timeout: float = 2.0) -> list[str]:
        sent.append(updates)
        raise AssertionError("no unsolicited UpdateContainers to an NRI before v0.12.1")

    enforcement.plugin.update_containers = refuse
    return sent


def test_an_allocate_shrinks_the_others_over_cri_at_once_and_they_are_remembered() -> None:
    runtime = CriRuntime()
    enforcement, grouping, _ = setup3(verifier=runtime)
    unsolicited = old_nri(enforcement)
    assert not enforcement.plugin.unsolicited_safe
    enforcement.start()
    try:
        enforcement.create_container(pod("web"), container("c-web", "web"))
        enforcement.devices.table(grouping.groups[0].resource).admit([[grouping.groups[0].id]])  # Allocate
        wait_until("the shrink over CRI", lambda: enforcement.counters.updates.get(("shrink", "ok"), 0) == 1, 10)
        assert runtime.updates == [("c-web", "1-2", "")]
        assert unsolicited == []
        assert runtime.closed >= 1  # no connection kept open between pushes
        assert enforcement.upkeep.push_over_cri()  # nothing more to send: confirmed, remembered
        assert runtime.updates == [("c-web", "1-2", "")]
        llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
        assert llm.adjust.linux.resources.cpu.cpus == "0" and list(llm.update) == []
    finally:
        enforcement.stop()


def test_a_container_the_runtime_refuses_fails_alone_and_a_runtime_down_leaves_the_rest_in_doubt() -> None:
    runtime = CriRuntime(fail={"c-a": "NOT_FOUND"})
    enforcement, grouping, _ = setup3(verifier=runtime)
    old_nri(enforcement)
    for name in ("a", "b"):
        enforcement.create_container(pod(name), container(f"c-{name}", name))
    enforcement.devices.table(grouping.groups[0].resource).admit([[grouping.groups[0].id]])
    assert not enforcement.upkeep.push_over_cri()
    assert sorted(c for c, _, _ in runtime.updates) == ["c-a", "c-b"]
    assert ("shrink", "error") in enforcement.counters.updates and ("shrink", "ok") in enforcement.counters.updates
    runtime.updates.clear()
    runtime.fail = {"c-a": "UNAVAILABLE"}  # the runtime went away: c-a is in doubt, so every reply sends it again
    assert not enforcement.upkeep.push_over_cri()
    assert [c for c, _, _ in runtime.updates] == ["c-a"]
    web = enforcement.create_container(pod("web"), container("c-web", "web"))
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in web.update] == [("c-a", "1-2")]


def test_without_the_cri_socket_the_next_events_reply_carries_them() -> None:
    enforcement, grouping, _ = setup3()
    unsolicited = old_nri(enforcement)
    enforcement.start()
    try:
        enforcement.create_container(pod("web"), container("c-web", "web"))
        enforcement.devices.table(grouping.groups[0].resource).admit([[grouping.groups[0].id]])
        llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
        assert [(u.container_id, u.linux.resources.cpu.cpus) for u in llm.update] == [("c-web", "1-2")]
        assert unsolicited == []
    finally:
        enforcement.stop()
