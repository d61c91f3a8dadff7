"""--cpuset-enforcement nri and auto below the wire: the creation plan (agent/policy/creation.py),
the choice of mode, the answers of agent/app/nri_enforcement.py to NRI messages, and the chart's
mounts for each mode. The real containerd judges in tests/test_nri_containerd.py."""

from __future__ import annotations

from typing import Any

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.app.nri_enforcement import NriEnforcement
from agent.devices.table import NodeDevices
from agent.plugin.servicer import render as render_wire
from agent.policy.allocation import AllocationSettings
from agent.policy.cpuset import RunningContainer
from agent.policy.creation import enforcement_mode, plan_creation
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.model import Cpu, Machine, Topology
from tests.test_chart import Render, agent_container, env_of, helm, mounts_of, render  # noqa: F401

DOMAIN = "topology.s390x.ibm.com"


def two_books() -> Topology:
    machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                      dispatching="horizontal", smt_threads=1)
    return Topology(machine=machine, cpus=tuple(
        Cpu(cpu=n, core=n, socket=n, book=n, drawer=0, siblings=(n,), polarization="horizontal") for n in (0, 1)))


def setup(shared_pool: bool = False, policy: str | None = None) -> tuple[NriEnforcement, Any]:
    settings = GroupingSettings(levels=("book",))
    grouping = group_topology(two_books(), settings)
    devices = NodeDevices(grouping, settings, AllocationSettings(), render_wire)
    groups = {(g.resource, g.id): g for g in grouping.groups}
    enforcement = NriEnforcement(devices, groups, DOMAIN, online=lambda: frozenset({0, 1}), reserved=frozenset(),
                                 shared_pool=shared_pool, cpu_manager_policy=lambda: policy)
    return enforcement, grouping


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


def test_the_chart_mounts_the_nri_socket_for_nri_and_auto_only(render: Render) -> None:  # noqa: F811
    assert "nri-socket" not in mounts_of(render("--set", "cpusetEnforcement=cri"))
    docs = render("--set", "cpusetEnforcement=nri", "--set", "nriSocket=/run/nri/nri.sock")
    mounts = mounts_of(docs)
    mount, volume = mounts["nri-socket"]
    assert volume["hostPath"] == {"path": "/run/nri", "type": "DirectoryOrCreate"}
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_NRI_SOCKET"] == f"{mount['mountPath']}/nri.sock"
    assert env["TOPOLOGY_AGENT_CPUSET_ENFORCEMENT"] == "nri" and "cri-socket" not in mounts
    assert "TOPOLOGY_AGENT_CRI_SOCKET" not in env and mounts["kubelet-root"][0]["readOnly"] is True
    auto = mounts_of(render("--set", "cpusetEnforcement=auto"))
    assert {"nri-socket", "cri-socket", "kubelet-root"} <= auto.keys()
    assert auto["nri-socket"][1]["hostPath"]["path"] == "/var/run/nri"


def test_auto_without_any_runtime_socket_is_off_with_one_warning_and_says_so() -> None:
    from tests.plugin_harness import short_tmpdir
    from topology_devkit.agent_process import AgentProcess, wait_until
    from topology_devkit.kubelet_emulator import KubeletEmulator

    root = short_tmpdir()
    with KubeletEmulator(root) as k:
        agent = AgentProcess(k, root, "--cpuset-enforcement", "auto", "--nri-socket", str(root / "no-nri.sock"),
                             "--cri-socket", str(root / "no-cri.sock"),
                             "--cpu-manager-state", str(root / "no-cpu-manager-state"))
        try:
            k.wait_registered("topology/book", timeout=30)
            wait_until(lambda: agent.metric("topology_agent_cpuset_enforcement_mode", mode="none") == 1, 10,
                       "the mode reported")
            assert agent.metric("topology_agent_cpuset_enforcement_mode", mode="nri") == 0
            warnings = [line for line in agent.log() if "cpuset enforcement off" in str(line.get("msg", ""))]
            assert len(warnings) == 1 and warnings[0]["level"] == "warning", warnings
            assert "neither an NRI socket answers nor a CRI socket exists" in warnings[0]["msg"]
            status, body = agent.get("/readyz")
            assert status == 200 and "cpuset enforcement" not in body
        finally:
            agent.stop()
