"""--cpuset-enforcement nri and auto below the wire: the creation plan (agent/policy/creation_cpuset.py),
the choice of mode, the answers of agent/enforce/nri_hooks.py to NRI messages. The chart's mounts for each mode are
held in tests/deploy/chart/test_daemonset.py; the real containerd judges in tests/runtime/test_nri_containerd.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.devices.table import NodeDevices
from agent.enforce.nri_hooks import NriEnforcement
from agent.plugin.servicer import render as render_wire
from agent.policy.allocation import AllocationSettings
from agent.policy.container_claims import (
    CLAIM_ENV,
    ClaimMatch,
    PreparedRequest,
    match_claim,
    prepared_keys,
    with_claims,
)
from agent.policy.cpuset import RunningContainer
from agent.policy.creation_cpuset import plan_creation
from agent.policy.enforcement_choice import enforcement_mode
from agent.policy.grouping import GroupingSettings, group_topology
from tests.support.enforcement import DOMAIN, annotated, container, pod, setup3, short_tmpdir_path, two_books


def setup(shared_pool: bool = False, policy: str | None = None) -> tuple[NriEnforcement, Any]:
    settings = GroupingSettings(levels=("book",))
    grouping = group_topology(two_books(), settings)
    devices = NodeDevices(grouping, settings, AllocationSettings(), render_wire)
    groups = {(g.resource, g.id): g for g in grouping.groups}
    enforcement = NriEnforcement(devices, groups, DOMAIN, online=lambda: frozenset({0, 1}), reserved=frozenset(),
                                 shared_pool=shared_pool, cpu_manager_policy=lambda: policy)
    return enforcement, grouping


def test_the_mode_in_force() -> None:
    assert enforcement_mode("auto", True, True) == ("nri", "auto: the NRI socket answers")
    assert enforcement_mode("auto", False, True)[0] == "cri"
    assert enforcement_mode("auto", False, False)[0] == "none"
    assert enforcement_mode("cri", True, True)[0] == "cri"  # asked for: no probing decides
    assert enforcement_mode("nri", False, False)[0] == "nri"  # asked for: it dials until the runtime answers


def test_a_topology_container_is_created_on_its_groups_cpus_and_memory_nodes() -> None:
    enforcement, grouping = setup()
    g = grouping.groups[1]
    answer = enforcement.create_container(pod("llm"), container("c1", "llm", annotated(grouping, 1)))
    cpu = answer.adjust.linux.resources.cpu
    assert cpu.cpus == g.cpulist == "1"
    assert cpu.mems == ",".join(map(str, g.memory_nodes)) or not g.memory_nodes
    assert list(answer.update) == []  # no shared pool: nobody else moves
    plain = enforcement.create_container(pod("web"), container("c2", "web"))
    assert plain == nri.CreateContainerResponse()  # nothing to say: created as asked for
    assert enforcement.counters.topology_containers == 1 and enforcement.counters.pinned == 1


def test_with_the_shared_pool_others_are_created_in_it_and_running_ones_confined_in_the_reply() -> None:
    enforcement, grouping = setup(shared_pool=True)
    web = enforcement.create_container(pod("web"), container("c-web", "web"))
    assert web == nri.CreateContainerResponse()  # nothing held: the pool is every CPU, no cpuset needed
    enforcement.devices.table(grouping.groups[0].resource).admit([[grouping.groups[0].id]])  # Allocate
    llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
    assert llm.adjust.linux.resources.cpu.cpus == "0"
    assert [(u.container_id, u.linux.resources.cpu.cpus, u.ignore_failure) for u in llm.update] == [
        ("c-web", "1", True)]  # the running one leaves the held book, in the same reply
    late = enforcement.create_container(pod("late"), container("c-late", "late"))
    assert late.adjust.linux.resources.cpu.cpus == "1" and list(late.update) == []
    assert enforcement.counters.updates == {("shrink", "ok"): 2, ("topology", "ok"): 1}


def test_synchronize_reconciles_what_was_created_while_the_plugin_was_away() -> None:
    enforcement, grouping = setup(shared_pool=True)
    enforcement.devices.table(grouping.groups[1].resource).admit([[grouping.groups[1].id]])
    stopped = container("gone", "old")
    stopped.state = nri.CONTAINER_STOPPED
    updates = enforcement.synchronize(
        [pod("llm"), pod("web")],
        [container("c-llm", "llm", annotated(grouping, 1)), container("c-web", "web", cpus="0-1"), stopped])
    assert sorted((u.container_id, u.linux.resources.cpu.cpus) for u in updates) == [("c-llm", "1"), ("c-web", "0")]
    assert {c.id for c in enforcement.known()} == {"c-llm", "c-web"}
    pinned = container("c-llm", "llm", annotated(grouping, 1), cpus="1", mems="0")
    assert enforcement.synchronize([pod("llm")], [pinned]) == []  # already right: nothing to send


def test_an_update_keeps_a_topology_container_on_its_groups() -> None:
    enforcement, grouping = setup()
    c = container("c1", "llm", annotated(grouping, 0), cpus="0")
    asked = nri.LinuxResources(cpu=nri.LinuxCPU(cpus="0-1"))  # kubelet's update would widen it
    (update,) = enforcement.update_container(pod("llm"), c, asked)
    assert (update.container_id, update.linux.resources.cpu.cpus) == ("c1", "0")


def test_refused_under_the_static_cpu_manager_policy() -> None:
    enforcement, grouping = setup(policy="static")
    answer = enforcement.create_container(pod("llm"), container("c1", "llm", annotated(grouping, 0)))
    assert answer == nri.CreateContainerResponse()
    assert enforcement.readiness_note() == "cpuset enforcement refused: kubelet runs the static CPU manager policy"


def test_plan_creation_counts_the_new_holder_as_held_before_pod_resources_lists_it() -> None:
    _, grouping = setup()
    groups = {(g.resource, g.id): g for g in grouping.groups}
    g = grouping.groups[0]
    new = RunningContainer("n", ("ns", "p", "c"), frozenset(), annotated_groups=(g.id,), annotated_resource=g.resource)
    other = RunningContainer("o", ("ns", "q", "c"), frozenset({0, 1}))
    plan = plan_creation(new, [other, new], {}, (), groups, {0, 1}, shared_pool=True)
    assert plan.adjust is not None and (plan.adjust.cpus, plan.adjust.kind) == ("0", "topology")
    assert [(u.container, u.cpus, u.kind) for u in plan.others] == [("o", "1", "shrink")]
    assert plan.pool == (1,)


def test_auto_without_any_runtime_socket_is_off_with_one_warning_and_says_so() -> None:
    from tests.support.harness import short_tmpdir
    from topology_devkit.agent_process import AgentProcess
    from topology_devkit.kubelet_emulator import KubeletEmulator
    from topology_devkit.testing.wait import wait_until

    root = short_tmpdir()
    with KubeletEmulator(root) as k:
        agent = AgentProcess(k, root, "--cpuset-enforcement", "auto", "--nri-socket", str(root / "no-nri.sock"),
                             "--cri-socket", str(root / "no-cri.sock"),
                             "--cpu-manager-state", str(root / "no-cpu-manager-state"))
        try:
            k.wait_registered("topology/book", timeout=30)
            wait_until("the mode reported",
                       lambda: agent.metric("topology_agent_cpuset_enforcement_mode", mode="none") == 1, 10)
            assert agent.metric("topology_agent_cpuset_enforcement_mode", mode="nri") == 0
            warnings = [line for line in agent.log() if "cpuset enforcement off" in str(line.get("msg", ""))]
            assert len(warnings) == 1 and warnings[0]["level"] == "warning", warnings
            assert "neither an NRI socket answers nor a CRI socket exists" in warnings[0]["msg"]
            status, body = agent.get("/readyz")
            assert status == 200 and "cpuset enforcement" not in body
        finally:
            agent.stop()


# --- DRA mode: the claim a container's CDI environment names (agent/policy/container_claims.py) ---------------------


def prepared_book(grouping: Any, index: int, namespace: str = "default") -> dict[str, PreparedRequest]:
    g = grouping.groups[index]
    return {"uid-1/book": PreparedRequest(namespace, "one-book", ((g.resource, g.id),))}


def with_env(c: nri.Container, *env: str) -> nri.Container:
    c.env.extend(["PATH=/bin", *env])
    return c


def test_match_claim_believes_only_a_prepared_request_of_the_pods_namespace() -> None:
    prepared = {"uid-1/book": PreparedRequest("ns", "one-book", (("topology/book", "b0"),))}
    assert match_claim(["PATH=/bin"], "ns", prepared) == ClaimMatch("")
    assert match_claim([f"{CLAIM_ENV}=uid-1/book"], "ns", prepared).devices == (("topology/book", "b0"),)
    unknown = match_claim([f"{CLAIM_ENV}=uid-2/book"], "ns", prepared)
    assert unknown.devices == () and unknown.refused == "not a claim request this agent prepared"
    other = match_claim([f"{CLAIM_ENV}=uid-1/book"], "attacker", prepared)
    assert other.devices == () and "not of the pod's namespace attacker" in other.refused
    # The pod's own entry comes first, the CDI device's replaces or follows it: the last one counts.
    assert match_claim([f"{CLAIM_ENV}=forged", f"{CLAIM_ENV}=uid-1/book"], "ns", prepared).devices
    assert not match_claim([f"{CLAIM_ENV}=uid-1/book", f"{CLAIM_ENV}=forged"], "ns", prepared).devices
    empty = {"uid-1/book": PreparedRequest("ns", "one-book", ())}
    assert "none of this node's groups" in match_claim([f"{CLAIM_ENV}=uid-1/book"], "ns", empty).refused


def test_with_claims_adds_claimed_containers_and_pod_resources_wins() -> None:
    a, b = ("ns", "p", "c"), ("ns", "q", "c")
    merged = with_claims({a: {("topology/book", "b1")}}, {a: (("topology/book", "b0"),), b: (("topology/book", "b0"),)})
    assert merged == {a: (("topology/book", "b1"),), b: (("topology/book", "b0"),)}
    assert prepared_keys({"u/r": PreparedRequest("ns", "c", (("r", "x"), ("r", "y"))),
                          "v/r": PreparedRequest("ns", "d", (("r", "y"),))}) == {("r", "x"), ("r", "y")}


def setup_dra(shared_pool: bool, prepared: dict[str, PreparedRequest]) -> NriEnforcement:
    settings = GroupingSettings(levels=("book",))
    grouping = group_topology(two_books(), settings)
    devices = NodeDevices(grouping, settings, AllocationSettings(), render_wire)
    groups = {(g.resource, g.id): g for g in grouping.groups}
    return NriEnforcement(devices, groups, DOMAIN, online=lambda: frozenset({0, 1}), reserved=frozenset(),
                          shared_pool=shared_pool, cpu_manager_policy=lambda: None, claims=lambda: prepared)


def test_a_dra_container_is_created_on_its_claims_book_and_others_kept_off_it() -> None:
    _, grouping = setup()
    prepared = prepared_book(grouping, 1)
    enforcement = setup_dra(True, prepared)
    web = enforcement.create_container(pod("web"), container("c-web", "web"))
    assert web.adjust.linux.resources.cpu.cpus == "0"  # the claim is prepared: its book is held already
    llm = enforcement.create_container(pod("llm"), with_env(container("c-llm", "llm"), f"{CLAIM_ENV}=uid-1/book"))
    cpu = llm.adjust.linux.resources.cpu
    assert (cpu.cpus, cpu.mems) == ("1", ",".join(map(str, grouping.groups[1].memory_nodes)))
    assert list(llm.update) == []  # web was created in the pool already
    assert enforcement.counters.topology_containers == 1 and enforcement.counters.pinned == 1
    # An update (kubelet's, before pod-resources lists the container) keeps it on its book.
    asked = nri.LinuxResources(cpu=nri.LinuxCPU(cpus="0-1"))
    (update,) = enforcement.update_container(pod("llm"), with_env(container("c-llm", "llm", cpus="1"),
                                                                   f"{CLAIM_ENV}=uid-1/book"), asked)
    assert update.linux.resources.cpu.cpus == "1"
    # Still prepared when llm stops: its book stays out of the pool. Unprepared: the pool grows back.
    assert enforcement.stop_container(pod("llm"), container("c-llm", "llm")) == []
    prepared.clear()
    widened = enforcement.stop_container(pod("other"), container("c-other", "other"))
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in widened] == [("c-web", "0-1")]


def test_a_forged_or_foreign_claim_variable_is_treated_as_any_other_container(
        caplog: pytest.LogCaptureFixture) -> None:
    _, grouping = setup()
    enforcement = setup_dra(True, prepared_book(grouping, 1, namespace="team-a"))
    caplog.set_level(logging.DEBUG, logger="topology-agent.cpuset")
    forged = enforcement.create_container(pod("x"), with_env(container("c-x", "x"), f"{CLAIM_ENV}=made-up/book"))
    assert forged.adjust.linux.resources.cpu.cpus == "0"  # the pool: never the held book
    foreign = enforcement.create_container(pod("y"), with_env(container("c-y", "y"), f"{CLAIM_ENV}=uid-1/book"))
    assert foreign.adjust.linux.resources.cpu.cpus == "0"  # a prepared claim, but of namespace team-a
    enforcement.create_container(pod("x"), with_env(container("c-x2", "x"), f"{CLAIM_ENV}=made-up/book"))
    ignored = [r for r in caplog.records if "ignoring TOPOLOGY_DRA_CLAIM" in r.getMessage()]
    assert [r.levelno for r in ignored] == [logging.DEBUG] * 3  # each container, at debug (off by default)
    assert "not of the pod's namespace default" in ignored[1].getMessage()
    assert enforcement.counters.topology_containers == 0
    no_pool = setup_dra(False, prepared_book(grouping, 1, namespace="team-a"))
    assert no_pool.create_container(pod("y"), with_env(container("c-y", "y"), f"{CLAIM_ENV}=uid-1/book")) \
        == nri.CreateContainerResponse()  # as asked for, like any container without the shared pool


def test_a_claim_unprepared_since_holds_nothing_for_its_container() -> None:
    _, grouping = setup()
    prepared = prepared_book(grouping, 1)
    enforcement = setup_dra(True, prepared)
    enforcement.create_container(pod("llm"), with_env(container("c-llm", "llm"), f"{CLAIM_ENV}=uid-1/book"))
    book = (grouping.groups[1].resource, grouping.groups[1].id)
    assert enforcement._holders()[("default", "llm", "c")] == (book,)
    prepared.clear()  # unprepared: the container's variable names nothing the agent prepared now
    assert ("default", "llm", "c") not in enforcement._holders()


def test_synchronize_pins_a_dra_container_created_while_the_plugin_was_away() -> None:
    _, grouping = setup()
    enforcement = setup_dra(True, prepared_book(grouping, 0))
    updates = enforcement.synchronize(
        [pod("llm"), pod("web")],
        [with_env(container("c-llm", "llm", cpus="0-1"), f"{CLAIM_ENV}=uid-1/book"),
         container("c-web", "web", cpus="0-1")])
    assert sorted((u.container_id, u.linux.resources.cpu.cpus) for u in updates) == [("c-llm", "0"), ("c-web", "1")]


def test_without_dra_the_claim_variable_means_nothing() -> None:
    enforcement, _ = setup(shared_pool=True)
    answer = enforcement.create_container(pod("x"), with_env(container("c-x", "x"), f"{CLAIM_ENV}=uid-1/book"))
    assert answer == nri.CreateContainerResponse()  # nothing held, no claims known: every CPU is the pool


def test_build_agent_in_dra_mode_hands_the_nri_plugin_the_prepared_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """The composition root's wiring: the kubelet plugin's ClaimPreparer is what the NRI enforcement reads, and a
    prepare or unprepare wakes it (no API server: the claim reader is a dict)."""
    import agent.app.build_dra as dra
    from agent.app.build import build_agent
    from agent.app.config import AgentConfig
    from agent.policy.resource_slices import DRIVER
    from tests.support.harness import short_tmpdir

    claims: dict[tuple[str, str], dict[str, Any]] = {}

    class NoApiServer:
        def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
            return claims[(namespace, name)]

    monkeypatch.setattr(dra, "dra_api", NoApiServer)
    root = short_tmpdir()
    config = AgentConfig(kubelet_dir=root / "kubelet", grouping=GroupingSettings(levels=("book",)), mode="dra",
                         node_name="node-a", cpuset_enforcement="nri", shared_pool=True,
                         pod_resources_socket=root / "no-pod-resources.sock", nri_socket=root / "nri.sock",
                         dra_registry_dir=root / "plugins_registry", dra_plugin_dir=root / "plugins" / DRIVER,
                         cdi_dir=root / "cdi", cpu_manager_state=root / "no-cpu-manager-state")
    agent = build_agent(two_books(), config)
    enforcement = agent.enforcement
    assert isinstance(enforcement, NriEnforcement)
    preparer = agent.manager.plugin.preparer  # type: ignore[attr-defined]
    woken = enforcement.upkeep._wake  # what the upkeep thread waits on (not started here)
    assert not woken.is_set()
    book = agent.grouping.groups[1]
    claims[("inference", "one-book")] = {
        "metadata": {"namespace": "inference", "name": "one-book", "uid": "u-1"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": DRIVER, "pool": "node-a", "device": book.id}]}}}}
    preparer.prepare("inference", "one-book", "u-1")
    assert woken.is_set()  # the pool changed: the enforcement's thread looks again
    woken.clear()
    new = nri.Container(id="c-llm", pod_sandbox_id="pod-llm", name="c", state=nri.CONTAINER_CREATED,
                        env=["PATH=/bin", f"{CLAIM_ENV}=u-1/r"])
    answer = enforcement.create_container(nri.PodSandbox(id="pod-llm", name="llm", namespace="inference"), new)
    assert answer.adjust.linux.resources.cpu.cpus == book.cpulist
    preparer.unprepare("u-1")
    assert woken.is_set()


# --- lost updates, an empty pool, offline holders, annotations passed through ------------------------------


class FakeUnsolicited:
    """The runtime's side of unsolicited UpdateContainers: records each call, fails as told."""

    def __init__(self, enforcement: NriEnforcement, fail: Exception | None = None) -> None:
        self.calls: list[list[nri.ContainerUpdate]] = []
        self.fail = fail
        enforcement.plugin.state.registered = True
        enforcement.plugin.state.nri_version = "v0.12.1"
        enforcement.plugin.update_containers = self  # type: ignore[method-assign]

    def __call__(self, updates: list[nri.ContainerUpdate], timeout: float = 2.0) -> list[str]:
        self.calls.append(list(updates))
        if self.fail is not None:
            raise self.fail
        return []


def test_a_lost_unsolicited_update_is_planned_again_in_the_next_reply() -> None:
    """An Allocate makes the pool thread move web off the book; the runtime never answers (containerd's
    updateFromPlugin waits on the lock every event holds). The holder's CreateContainer reply must move web."""
    from agent.nri.ttrpc import CallTimeout
    from topology_devkit.testing.wait import wait_until

    enforcement, grouping, _ = setup3()
    runtime = FakeUnsolicited(enforcement, fail=CallTimeout("no answer"))
    enforcement.start()
    try:
        assert enforcement.create_container(pod("web"), container("c-web", "web")) == nri.CreateContainerResponse()
        enforcement.devices.table(grouping.groups[0].resource).admit([[grouping.groups[0].id]])  # Allocate
        wait_until("the pool thread's unsolicited update", lambda: len(runtime.calls) >= 1, 10)
        ((sent,),) = runtime.calls[:1]
        assert (sent.container_id, sent.linux.resources.cpu.cpus) == ("c-web", "1-2")
        assert sent.ignore_failure is False  # so that a failure comes back (containerd logs it otherwise)
        llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
        assert llm.adjust.linux.resources.cpu.cpus == "0"
        assert [(u.container_id, u.linux.resources.cpu.cpus) for u in llm.update] == [("c-web", "1-2")]
        assert enforcement.counters.updates.get(("shrink", "error"), 0) >= 1
    finally:
        enforcement.stop()


def test_a_confirmed_unsolicited_update_is_remembered_and_not_sent_again() -> None:
    from topology_devkit.testing.wait import wait_until

    enforcement, grouping, _ = setup3()
    runtime = FakeUnsolicited(enforcement)
    enforcement.start()
    try:
        enforcement.create_container(pod("web"), container("c-web", "web"))
        enforcement.devices.table(grouping.groups[0].resource).admit([[grouping.groups[0].id]])
        wait_until("the shrink confirmed", lambda: enforcement.counters.updates.get(("shrink", "ok"), 0) == 1, 10)
        llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
        assert list(llm.update) == []  # the runtime confirmed web's move: nothing to repeat
        assert len(runtime.calls) == 1
    finally:
        enforcement.stop()


def test_a_failed_batch_is_tried_one_by_one_and_only_the_failed_one_is_planned_again() -> None:
    from agent.nri.stub import UpdatesFailed
    from topology_devkit.testing.wait import wait_until

    enforcement, grouping, _ = setup3()
    calls: list[list[str]] = []

    def runtime(updates: list[nri.ContainerUpdate], timeout: float = 2.0) -> list[str]:
        ids = [u.container_id for u in updates]
        calls.append(ids)
        if "c-bad" in ids:  # containerd: the failed updates go to its log, the plugin gets an error only
            raise UpdatesFailed("UpdateContainers failed: NRI update of some containers failed (code 2)")
        return []

    FakeUnsolicited(enforcement)
    enforcement.plugin.update_containers = runtime  # type: ignore[method-assign]
    enforcement.start()
    try:
        for name in ("web", "bad"):
            enforcement.create_container(pod(name), container(f"c-{name}", name))
        enforcement.devices.table(grouping.groups[0].resource).admit([[grouping.groups[0].id]])
        wait_until("web confirmed alone", lambda: enforcement.counters.updates.get(("shrink", "ok"), 0) == 1, 10)
        assert sorted(calls[0]) == ["c-bad", "c-web"]
        llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
        assert [u.container_id for u in llm.update] == ["c-bad"]
    finally:
        enforcement.stop()


def test_a_new_plain_container_is_refused_while_the_shared_pool_is_empty() -> None:
    """Also: an empty shared pool. Created on every CPU it would run on the held books: refused instead (the
    runtime fails the creation, kubelet retries it), and counted."""
    from agent.nri.stub import Refused

    enforcement, grouping, _ = setup3()
    table = enforcement.devices.table(grouping.groups[0].resource)
    table.admit([[g.id] for g in grouping.groups])
    with pytest.raises(Refused, match="shared pool is empty"):
        enforcement.create_container(pod("web"), container("c-web", "web"))
    assert "c-web" not in {c.id for c in enforcement.known()}
    assert enforcement.counters.creations_refused == 1
    llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
    assert llm.adjust.linux.resources.cpu.cpus == "0"  # a holder is created on its book as ever


def test_a_holder_whose_book_is_offline_is_created_in_the_pool_and_said() -> None:
    """A restarted container of a pod whose book went offline runs on the pool, never on all CPUs."""
    enforcement, grouping, notices = setup3(online=frozenset({1, 2}))
    table = enforcement.devices.table(grouping.groups[0].resource)
    table.admit([[grouping.groups[0].id]])
    table.admit([[grouping.groups[2].id]])
    llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
    assert llm.adjust.linux.resources.cpu.cpus == "1"  # the pool: not book 2, which another pod holds
    assert enforcement.counters.offline == 1 and enforcement.counters.updates[("offline", "ok")] == 1
    assert [reason for reason, _ in notices] == ["TopologyHolderOffline"]
    assert "default/llm/c" in notices[0][1] and "offline" in notices[0][1]
    enforcement.create_container(pod("llm"), container("c-llm2", "llm", annotated(grouping, 0)))
    assert len(notices) == 1  # said once per holder


def test_annotations_the_pod_itself_carries_are_not_believed() -> None:
    """Also: containerd's pod_annotations pass-through puts a pod's own annotations into its containers' (NRI's
    criContainer.GetAnnotations merges the spec's and kubelet's, kubelet's winning): a pod naming a book in its
    annotations is not pinned to it; kubelet's Allocate annotations, which differ from the pod's, still are."""
    enforcement, grouping, _ = setup3(shared_pool=False)
    forged = annotated(grouping, 1)
    sandbox = pod("x")
    sandbox.annotations.update(forged)
    answer = enforcement.create_container(sandbox, container("c-x", "x", forged))
    assert answer == nri.CreateContainerResponse()  # as asked for: no pin to book 1
    holder = pod("llm")
    holder.annotations.update(annotated(grouping, 1))  # the pod says book 1, kubelet's Allocate said book 2
    real = enforcement.create_container(holder, container("c-llm", "llm", annotated(grouping, 2)))
    assert real.adjust.linux.resources.cpu.cpus == "2"


def test_auto_switches_to_cri_when_nri_stops_answering_and_back_when_it_answers_again() -> None:
    """Also: auto is decided while the agent runs. A runtime restarted with NRI off leaves the plugin dialing
    nobody: after the patience the CRI loop takes over; a new NRI socket that answers brings NRI back."""
    from agent.cri.client import CriClient
    from agent.enforce.auto_switch import AutoEnforcement
    from agent.enforce.cri_loop import CpusetEnforcement
    from agent.enforce.engine import EnforcementCounters

    root = short_tmpdir_path()
    nri_socket, cri_socket = root / "nri.sock", root / "cri.sock"
    settings = GroupingSettings(levels=("book",))
    grouping = group_topology(two_books(), settings)
    devices = NodeDevices(grouping, settings, AllocationSettings(), render_wire)
    groups = {(g.resource, g.id): g for g in grouping.groups}

    def make_nri(counters: EnforcementCounters) -> NriEnforcement:
        return NriEnforcement(devices, groups, DOMAIN, online=lambda: frozenset({0, 1}), reserved=frozenset(),
                              shared_pool=False, cpu_manager_policy=lambda: None, socket_path=nri_socket,
                              counters=counters)

    def make_cri(counters: EnforcementCounters) -> CpusetEnforcement:
        return CpusetEnforcement(CriClient(cri_socket), devices, groups, DOMAIN, online=lambda: frozenset({0, 1}),
                                 reserved=frozenset(), shared_pool=False, cpu_manager_policy=lambda: None,
                                 counters=counters)

    answers = {"nri": False}
    auto = AutoEnforcement("nri", make_nri=make_nri, make_cri=make_cri, nri_socket=nri_socket, cri_socket=cri_socket,
                           nri_answers=lambda _: answers["nri"], patience=30, look=3600)
    auto.start()
    try:
        assert auto.mode == "nri" and auto.step(100.0) is None  # not registered: the patience starts
        assert auto.step(125.0) is None
        assert auto.step(131.0) is None  # no CRI socket: nothing better, the plugin keeps dialing
        cri_socket.touch()
        assert auto.step(132.0) == "cri" and auto.mode == "cri"
        assert "auto: the NRI socket" in (auto.readiness_note() or "")
        assert auto.step(133.0) is None  # no NRI socket file: nothing to dial
        nri_socket.touch()  # the runtime made its socket anew (it does at every start with NRI on)
        assert auto.step(134.0) is None  # made, but nothing answers on it
        answers["nri"] = True
        assert auto.step(135.0) is None  # an unchanged file is dialed again only every reprobe seconds
        assert auto.step(134.0 + 300) == "nri" and auto.mode == "nri" and auto.switches == 2
        assert auto.counters is auto._engine.counters  # type: ignore[union-attr]  # one set of counters
    finally:
        auto.stop()


class FakeVerifier:
    """The runtime's CRI side as the re-check reads it: each container's cpuset."""

    def __init__(self, cpusets: dict[str, str]) -> None:
        self.cpusets = cpusets

    def container_status(self, container_id: str) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(cpuset_cpus="", applied_cpus=self.cpusets[container_id])  # status misses NRI's

    def close(self) -> None:
        pass


def test_the_recheck_finds_a_holder_moved_by_someone_else_counts_it_and_sets_it_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """Also: another NRI plugin on the same runtime moves the agent's holder (an unsolicited update of its own:
    not owned, the last one wins). The periodic read-back sees it, counts it, says so once and pins it again."""
    verifier = FakeVerifier({})
    enforcement, grouping, _ = setup3(shared_pool=False, verifier=verifier)
    runtime = FakeUnsolicited(enforcement)
    llm = enforcement.create_container(pod("llm"), container("c-llm", "llm", annotated(grouping, 0)))
    assert llm.adjust.linux.resources.cpu.cpus == "0"
    enforcement.create_container(pod("web"), container("c-web", "web"))
    verifier.cpusets.update({"c-llm": "0", "c-web": "0-2"})
    assert enforcement.upkeep.recheck() == 0 and enforcement.upkeep.push() and runtime.calls == []
    verifier.cpusets["c-llm"] = "0-2"  # the other plugin's doing
    verifier.cpusets["c-web"] = "2"  # not the agent's to decide without the shared pool: not counted
    with caplog.at_level(logging.WARNING, logger="topology-agent.cpuset"):
        assert enforcement.upkeep.recheck() == 1
        assert enforcement.upkeep.recheck() == 0  # remembered as the runtime has it: counted once
    assert enforcement.counters.overridden == 1
    said = [r.getMessage() for r in caplog.records if "not the 0 the agent set" in r.getMessage()]
    assert len(said) == 1 and "default/llm/c" in said[0] and "another NRI plugin" in said[0]
    assert enforcement.upkeep.push()
    ((update,),) = runtime.calls
    assert (update.container_id, update.linux.resources.cpu.cpus) == ("c-llm", "0")


def test_a_rescan_that_finds_a_held_book_offline_moves_its_running_holder_to_the_pool_at_once() -> None:
    """A running holder under NRI whose book's CPUs went offline (the device stays allocated, so no device
    state changes); the rescan wakes the enforcement, whose unsolicited update moves it to the CPUs no one holds."""
    import dataclasses
    import shutil

    from agent.topology.cpulist import parse_cpulist
    from agent.topology.embedded import load_embedded
    from agent.topology.sysfs import read_sysfs
    from tests.support.harness import running_node
    from topology_devkit.kubelet_emulator import Container
    from topology_devkit.sysfs_writer import write_sysfs_tree
    from topology_devkit.testing.wait import wait_until

    base = load_embedded("z16-lpar")
    root = short_tmpdir_path() / "host"
    write_sysfs_tree(base, root)
    with running_node(topology=read_sysfs(root), loader=lambda: read_sysfs(root), levels=("book",),
                      cpuset_enforcement="nri", nri_socket=root / "no-nri.sock") as node:
        enforcement = node.agent.enforcement
        assert isinstance(enforcement, NriEnforcement)
        runtime = FakeUnsolicited(enforcement)
        k = node.kubelet
        admitted = k.admit_pod("default", "llm", [Container("c", {"topology/book": 1})])
        wait_until("llm listed", lambda: ("default", "llm", "c") in node.agent.devices.holder_identities(), 10)
        llm = container("c-llm", "llm", admitted.annotations("c"))
        cpus = llm.annotations[f"{DOMAIN}/cpus"]
        assert enforcement.create_container(pod("llm"), llm).adjust.linux.resources.cpu.cpus == cpus
        shutil.rmtree(root)
        gone = set(parse_cpulist(cpus))
        write_sysfs_tree(dataclasses.replace(base, cpus=tuple(
            dataclasses.replace(c, online=c.cpu not in gone) for c in base.cpus)), root)
        node.agent.rescan()
        wait_until("the holder moved outside any event", lambda: bool(runtime.calls), 10)
        ((update,),) = runtime.calls
        assert update.container_id == "c-llm"
        assert set(parse_cpulist(update.linux.resources.cpu.cpus)) == set(range(82)) - gone
        assert enforcement.counters.offline == 1


def test_a_cpuset_the_runtime_reports_that_is_no_cpu_list_is_taken_as_every_cpu_not_a_failed_event() -> None:
    enforcement, grouping = setup()
    answer = enforcement.create_container(pod("llm"), container("c1", "llm", annotated(grouping, 1), cpus="x"))
    assert answer.adjust.linux.resources.cpu.cpus == grouping.groups[1].cpulist  # pinned all the same
    updates = enforcement.update_container(pod("llm"), container("c1", "llm", annotated(grouping, 1)),
                                           nri.LinuxResources(cpu=nri.LinuxCPU(cpus="0-1,y")))
    assert [u.linux.resources.cpu.cpus for u in updates] in ([], [grouping.groups[1].cpulist])
