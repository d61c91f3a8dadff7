"""CPU sets enforced through a real container runtime: ``serve --cpuset-enforcement cri`` against a
real containerd (runc and crun), kubelet's pod-resources from the emulator, and the processes'
own ``Cpus_allowed_list`` as the judge.

The node is this machine's own CPUs as one book of two one-core sockets, so a socket is one CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.topology import snapshot_format as snapshot
from agent.topology.cpulist import format_cpulist, parse_cpulist
from agent.topology.model import Cpu, Machine, Topology
from tests.support.env import SOCKET
from tests.support.harness import short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.containerd import Containerd
from topology_devkit.kubelet_emulator import Container, KubeletEmulator
from topology_devkit.testing.wait import wait_until


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
            wait_until("the pinned count", lambda: agent.metric("topology_agent_cpuset_containers_pinned") == 1, 10)
            wait_until("both pins timed", lambda: agent.metric("topology_agent_cpuset_pin_seconds_count") >= 2, 5)
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
            wait_until("the agent looked at the runtime",
                       lambda: agent.metric("topology_agent_cpuset_enforcement_steps_total") >= 1, 10)
            assert ctd.cpus_allowed_list(web.container_id) == both  # no group held: the pool is everything
            cpus, annotations = admit(k, "llm")
            llm = ctd.run_pod("llm", container="c", annotations=annotations)
            other = format_cpulist(sorted({a, b} - set(parse_cpulist(cpus))))
            ctd.wait_cpus_allowed(llm.container_id, cpus, timeout=10)
            ctd.wait_cpus_allowed(web.container_id, other, timeout=10)
            # counted right after the runtime answers
            wait_until("the shrink counted",
                       lambda: agent.metric("topology_agent_cpuset_updates_total", kind="shrink", result="ok") >= 1, 5)
            k.delete_pod("default", "llm")  # kubelet no longer lists it: its socket is free again
            ctd.remove_pod(llm)
            ctd.wait_cpus_allowed(web.container_id, both, timeout=15)
            wait_until("the widening counted",
                       lambda: agent.metric("topology_agent_cpuset_updates_total", kind="widen", result="ok") >= 1, 5)
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
            wait_until("the failure reported",
                       lambda: agent.metric("topology_agent_cpuset_enforcement_failing") == 1, 15)
            assert agent.get("/readyz")[0] == 200
            wait_until("the failure logged", lambda: agent.logged("cpuset enforcement failing"), 5)
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
            wait_until("refused", lambda: agent.metric("topology_agent_cpuset_enforcement_refused") == 1, 15)
            status, body = agent.get("/readyz")
            assert status == 200 and "cpuset enforcement refused" in body
            steps = agent.metric("topology_agent_cpuset_enforcement_steps_total")
            # had it not refused, the pin would be there by now
            wait_until("two more looks at the runtime",
                       lambda: agent.metric("topology_agent_cpuset_enforcement_steps_total") >= steps + 2, 15)
            assert ctd.cpus_allowed_list(pod.container_id) == ctd.default_cpus()
            ctd.remove_pod(pod)
        finally:
            agent.stop()
