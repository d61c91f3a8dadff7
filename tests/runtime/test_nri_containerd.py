"""CPU sets at creation through NRI, judged by a real containerd 2.4.2 (built by the real-cluster
lane: ``make cluster-build``) with NRI on: a container whose entrypoint prints its own
``Cpus_allowed_list`` first thing prints its book's CPUs under ``--cpuset-enforcement nri``, and
every CPU under the CRI path (pinned only after it started). In DRA mode the same holds for a container
created with the CDI device of a claim the agent prepared (CRI ``CDI_devices``; the harness's containerd reads
CDI specs from a private directory), and not for one whose own spec forges the claim variable.

The node is this machine's own CPUs as two one-CPU books (a synthetic tree: each CPU is a book).
runc is the build's; Debian 12's crun 1.8 refuses containerd 2.4's OCI spec version ("unknown
version specified"), so the crun case skips with that reason.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.nri.stub import NriPlugin
from agent.topology import snapshot_format as snapshot
from agent.topology.cpulist import format_cpulist, parse_cpulist
from agent.topology.model import Cpu, Machine, Topology
from tests.support.env import IN_CI, missing
from tests.support.harness import short_tmpdir
from tests.support.runtime import FIRST_LINE, built_binaries, first_line, real_containerd
from topology_devkit.agent_process import AgentProcess
from topology_devkit.containerd import Containerd, PodContainer
from topology_devkit.kubelet_emulator import Container, KubeletEmulator
from topology_devkit.testing.wait import wait_until

BOOK = "topology/book"


@pytest.fixture(scope="module")
def ctd2() -> Iterator[Containerd]:
    yield from real_containerd("test-nri")


@pytest.fixture(params=("runc", "crun"))
def handler2(request: pytest.FixtureRequest, ctd2: Containerd) -> str:
    name: str = request.param
    problem = ctd2.handler_problems()[name]
    if problem is not None:
        if name == "crun" and "unknown version specified" in problem:
            pytest.skip(f"crun here cannot run containerd 2.4's OCI spec: {problem[-60:]}")
        missing(f"the {name} runtime handler", problem)
    return name


def two_books(ctd: Containerd, directory: Path) -> tuple[Path, list[int]]:
    cpus = parse_cpulist(ctd.default_cpus())
    if len(cpus) < 2:
        pytest.skip(f"needs 2 CPUs for containers, this machine gives them {cpus}")
    a, b = cpus[:2]
    machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                      dispatching="horizontal", smt_threads=1)
    topology = Topology(machine=machine, cpus=tuple(
        Cpu(cpu=n, core=i, socket=i, book=i, drawer=0, siblings=(n,), polarization="horizontal")
        for i, n in enumerate((a, b))))
    path = directory / "two-books.json"
    path.write_text(snapshot.dumps(topology))
    return path, [a, b]


def start_agent(k: KubeletEmulator, root: Path, ctd: Containerd, topology: Path, mode: str,
                *extra: str) -> AgentProcess:
    agent = AgentProcess(k, root, "--cpuset-enforcement", mode, "--nri-socket", str(ctd.nri_socket),
                         "--cri-socket", str(ctd.socket), "--cpuset-interval", "0.5",
                         "--pod-resources-interval", "0.2", "--levels", "book",
                         "--cpu-manager-state", str(root / "no-cpu-manager-state"), *extra, topology=str(topology))
    k.wait_registered(BOOK, timeout=30)
    return agent


def wait_nri_registered(agent: AgentProcess) -> None:
    wait_until("the NRI plugin registered", lambda: "registered with containerd" in agent.get("/readyz")[1], 20)


def admit(k: KubeletEmulator, name: str) -> tuple[str, dict[str, str]]:
    pod = k.admit_pod("default", name, [Container("c", {BOOK: 1})])
    env = k.start_container("default", name, "c")
    return env["TOPOLOGY_CPUS"], pod.annotations("c")


def test_a_topology_container_prints_its_books_cpus_first_thing(ctd2: Containerd, handler2: str) -> None:
    root = short_tmpdir()
    topology, cpus_of_books = two_books(ctd2, root)
    with KubeletEmulator(root) as k:
        agent = start_agent(k, root, ctd2, topology, "nri")
        try:
            wait_nri_registered(agent)
            assert agent.metric("topology_agent_cpuset_enforcement_mode", mode="nri") == 1
            cpus, annotations = admit(k, "llm")
            assert cpus in map(str, cpus_of_books)
            started = time.perf_counter()
            pod = ctd2.run_pod("llm", container="c", handler=handler2, annotations=annotations, command=FIRST_LINE)
            created = time.perf_counter() - started
            assert first_line(ctd2, pod) == cpus  # its first instruction ran on its book
            assert ctd2.cpus_allowed_list(pod.container_id) == cpus
            wait_until("counted pinned", lambda: agent.metric("topology_agent_cpuset_containers_pinned") == 1, 10)
            assert agent.metric("topology_agent_cpuset_updates_total", kind="topology", result="ok") >= 1
            print(f"created and started with NRI in {created:.3f} s")
            again = ctd2.restart_container(pod)  # kubelet's restart: a new container, pinned at creation too
            assert ctd2.cpus_allowed_list(again.container_id) == cpus  # no loop in this mode: NRI did it
            ctd2.remove_pod(again)
        finally:
            agent.stop()


def test_with_the_cri_path_the_first_line_is_every_cpu(ctd2: Containerd) -> None:
    root = short_tmpdir()
    topology, (a, b) = two_books(ctd2, root)
    with KubeletEmulator(root) as k:
        agent = start_agent(k, root, ctd2, topology, "cri")
        try:
            assert agent.metric("topology_agent_cpuset_enforcement_mode", mode="cri") == 1
            cpus, annotations = admit(k, "llm")
            pod = ctd2.run_pod("llm", container="c", annotations=annotations, command=FIRST_LINE)
            assert first_line(ctd2, pod) == format_cpulist([a, b])  # it ran on every CPU first
            assert ctd2.wait_cpus_allowed(pod.container_id, cpus, timeout=10) == cpus  # pinned afterwards
            ctd2.remove_pod(pod)
        finally:
            agent.stop()


def test_auto_is_nri_when_the_socket_answers_and_the_shared_pool_holds_from_the_first_line_and_widens(
        ctd2: Containerd) -> None:
    root = short_tmpdir()
    topology, (a, b) = two_books(ctd2, root)
    with KubeletEmulator(root) as k:
        agent = start_agent(k, root, ctd2, topology, "auto", "--shared-pool")
        try:
            wait_nri_registered(agent)
            assert agent.metric("topology_agent_cpuset_enforcement_mode", mode="nri") == 1
            web = ctd2.run_pod("web", container="c", command=FIRST_LINE)  # nothing held: the pool is every CPU
            assert first_line(ctd2, web) == format_cpulist([a, b])
            cpus, annotations = admit(k, "llm")
            llm = ctd2.run_pod("llm", container="c", annotations=annotations, command=FIRST_LINE)
            other = format_cpulist(sorted({a, b} - set(parse_cpulist(cpus))))
            assert first_line(ctd2, llm) == cpus
            assert ctd2.wait_cpus_allowed(web.container_id, other, timeout=5) == other  # moved in llm's reply
            plain = ctd2.run_pod("plain", container="c", command=FIRST_LINE)  # started after: never on llm's book
            assert first_line(ctd2, plain) == other
            # llm's container ends while kubelet still lists the pod (a finished Job, say: its book stays held),
            # then the pod is deleted: kubelet no longer lists it, its book is free, and no runtime event comes.
            # (While its container ran, the book stayed taken whatever kubelet listed.)
            ctd2.stop_container(llm.container_id)
            k.delete_pod("default", "llm")
            both = format_cpulist([a, b])
            assert ctd2.wait_cpus_allowed(web.container_id, both, timeout=10) == both  # unsolicited, containerd 2.4
            assert ctd2.wait_cpus_allowed(plain.container_id, both, timeout=5) == both
            # counted once the runtime confirms, a moment after it applies
            wait_until("the widening counted",
                       lambda: agent.metric("topology_agent_cpuset_updates_total", kind="widen", result="ok") >= 2, 5)
            for pod in (plain, llm, web):
                ctd2.remove_pod(pod)
        finally:
            agent.stop()


def test_the_plugin_reconnects_after_a_runtime_restart_and_synchronize_repairs(ctd2: Containerd) -> None:
    root = short_tmpdir()
    topology, _ = two_books(ctd2, root)
    with KubeletEmulator(root) as k:
        agent = start_agent(k, root, ctd2, topology, "nri")
        try:
            wait_nri_registered(agent)
            cpus, annotations = admit(k, "llm")
            pod = ctd2.run_pod("llm", container="c", annotations=annotations, command=FIRST_LINE)
            assert first_line(ctd2, pod) == cpus
            ctd2.stop_containerd()  # the pod keeps running in its shim
            wait_until("the plugin saw it go", lambda: "not registered" in agent.get("/readyz")[1], 10)
            started = time.perf_counter()
            ctd2.start_containerd()
            wait_nri_registered(agent)
            print(f"registered again {time.perf_counter() - started:.3f} s after containerd started")
            assert ctd2.cpus_allowed_list(pod.container_id) == cpus
            again = ctd2.restart_container(pod)
            assert ctd2.cpus_allowed_list(again.container_id) == cpus
            ctd2.remove_pod(again)
        finally:
            agent.stop()


def test_a_container_created_while_the_agent_was_away_is_pinned_at_its_synchronize(ctd2: Containerd) -> None:
    root = short_tmpdir()
    topology, _ = two_books(ctd2, root)
    with KubeletEmulator(root) as k:
        agent = start_agent(k, root, ctd2, topology, "nri")
        try:
            wait_nri_registered(agent)
            cpus, annotations = admit(k, "llm")
        finally:
            agent.stop()
        pod = ctd2.run_pod("llm", container="c", annotations=annotations, command=FIRST_LINE)
        assert first_line(ctd2, pod) == ctd2.default_cpus()  # nobody adjusted it
        agent = start_agent(k, root, ctd2, topology, "nri")
        try:
            wait_nri_registered(agent)
            assert ctd2.wait_cpus_allowed(pod.container_id, cpus, timeout=5) == cpus  # in the Synchronize reply
            ctd2.remove_pod(pod)
        finally:
            agent.stop()

class SlowOnce:
    """Handlers that answer the first CreateContainer past containerd's request timeout, then pin
    every container named 'c' to one CPU (in CreateContainer and in Synchronize)."""

    def __init__(self, cpus: str, delay: float) -> None:
        self.cpus = cpus
        self.delay = delay
        self.slow_done = threading.Event()
        self.synced = 0

    def _pin(self) -> nri.LinuxResources:
        return nri.LinuxResources(cpu=nri.LinuxCPU(cpus=self.cpus))

    def synchronize(self, pods: list[nri.PodSandbox], containers: list[nri.Container]) -> list[nri.ContainerUpdate]:
        self.synced += 1
        return [nri.ContainerUpdate(container_id=c.id, linux=nri.LinuxContainerUpdate(resources=self._pin()))
                for c in containers if c.name == "c" and c.linux.resources.cpu.cpus != self.cpus]

    def create_container(self, pod: nri.PodSandbox, container: nri.Container) -> nri.CreateContainerResponse:
        if not self.slow_done.is_set():
            time.sleep(self.delay)
            self.slow_done.set()
        answer = nri.CreateContainerResponse()
        answer.adjust.linux.resources.cpu.cpus = self.cpus
        return answer

    def update_container(self, pod: nri.PodSandbox, container: nri.Container,
                         resources: nri.LinuxResources) -> list[nri.ContainerUpdate]:
        return []

    def stop_container(self, pod: nri.PodSandbox, container: nri.Container) -> list[nri.ContainerUpdate]:
        return []

    def remove_container(self, pod: nri.PodSandbox, container: nri.Container) -> None:
        pass


def test_a_plugin_slower_than_the_runtimes_timeout_is_dropped_and_repairs_at_its_next_synchronize(
        ctd2: Containerd) -> None:
    """containerd gives up on the plugin after plugin_request_timeout (2 s) and creates the container
    unadjusted: creation is delayed by at most the timeout, never failed; the plugin dials again and
    the next Synchronize pins the container."""
    a = parse_cpulist(ctd2.default_cpus())[0]
    handlers = SlowOnce(str(a), delay=3.0)
    plugin = NriPlugin(handlers, ctd2.nri_socket, name="slow-test", index="20", backoff=(0.05, 0.5))
    plugin.start()
    try:
        assert plugin.wait_registered(10)
        started = time.perf_counter()
        pod = ctd2.run_pod("slow", container="c", command=FIRST_LINE)
        took = time.perf_counter() - started
        assert 1.5 < took < 6.0, took  # the request timeout, then containerd went on without the plugin
        assert first_line(ctd2, pod) == ctd2.default_cpus()  # created unadjusted
        wait_until("the plugin registered and synchronized again", lambda: handlers.synced >= 2, 15)
        assert ctd2.wait_cpus_allowed(pod.container_id, str(a), timeout=5) == str(a)  # repaired by Synchronize
        print(f"a slow plugin delayed creation by {took:.3f} s")
        ctd2.remove_pod(pod)
    finally:
        plugin.stop()


def test_the_build_is_the_one_the_lane_pins() -> None:
    folder = built_binaries()
    info = json.loads((folder / "build-info.json").read_text())
    assert info["containerd"] == "v2.4.2", info
    if IN_CI:
        assert (folder / "containerd").is_file()


def test_a_build_folder_without_the_binaries_is_said_with_how_to_build_them(tmp_path: Path) -> None:
    from topology_devkit.containerd import unavailable_reason

    (tmp_path / "containerd").write_text("")
    reason = unavailable_reason(tmp_path)
    if reason is not None and "needs" in reason and "lacks" not in reason:
        pytest.skip(reason)  # not Linux, or not root: checked before the folder
    assert reason == f"{tmp_path} lacks containerd-shim-runc-v2, ctr, runc (build them: make cluster-build)"


# --- DRA mode: a container created with the CDI device of a prepared claim ------------------------------------

PRINT_ENV = ("sh", "-c", "grep Cpus_allowed_list /proc/self/status; "
             "echo \"claim=$TOPOLOGY_DRA_CLAIM cpus=$TOPOLOGY_CPUS\"; exec sleep 3600")


def log_lines(ctd: Containerd, pod: PodContainer, count: int, timeout: float = 10.0) -> list[str]:
    """The container's first ``count`` lines of output (without the CRI log prefix)."""
    log = ctd.workdir / "logs" / pod.pod_uid / pod.container_name / f"{pod.attempt}.log"
    seen: list[str] = []

    def written() -> bool:
        try:
            seen[:] = [line.split(" ", 3)[3] for line in log.read_text().splitlines()]
        except (OSError, IndexError):
            return False
        return len(seen) >= count

    wait_until(f"{count} lines in {log}", written, timeout)
    return seen[:count]


class DraNode:
    """The DRA side of an agent as agent/app/build.py wires it: the kubelet plugin's ClaimPreparer writing CDI specs
    where this containerd reads them, and the NRI enforcement reading its prepared requests (no kubelet and no
    API server: the claim is handed to prepare() as kubelet's NodePrepareResources would name it)."""

    def __init__(self, ctd: Containerd, root: Path, cpus: list[int], shared_pool: bool) -> None:
        from agent.devices.table import NodeDevices
        from agent.dra.prepare import ClaimPreparer
        from agent.enforce.nri_hooks import NriEnforcement
        from agent.plugin.servicer import render
        from agent.policy.allocation import AllocationSettings
        from agent.policy.grouping import GroupingSettings, group_topology
        from agent.policy.resource_slices import DRIVER

        a, b = cpus
        machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                          dispatching="horizontal", smt_threads=1)
        topology = Topology(machine=machine, cpus=tuple(
            Cpu(cpu=n, core=i, socket=i, book=i, drawer=0, siblings=(n,), polarization="horizontal")
            for i, n in enumerate((a, b))))
        settings = GroupingSettings(levels=("book",))
        self.grouping = group_topology(topology, settings)
        self.claims: dict[tuple[str, str], dict[str, object]] = {}
        self.driver = DRIVER
        self.preparer = ClaimPreparer(driver=DRIVER, pool="node-a", groups={g.id: g for g in self.grouping.groups},
                                      allocation=AllocationSettings(), read_claim=self._read, cdi_dir=ctd.cdi_dir,
                                      checkpoint=root / "dra" / "claims.json")
        devices = NodeDevices(self.grouping, settings, AllocationSettings(), render)
        self.enforcement = NriEnforcement(
            devices, {(g.resource, g.id): g for g in self.grouping.groups}, "topology.s390x.ibm.com",
            online=lambda: frozenset(cpus), reserved=frozenset(), shared_pool=shared_pool,
            cpu_manager_policy=lambda: None, socket_path=ctd.nri_socket, claims=self.preparer.requests)
        self.preparer.on_change = self.enforcement.changed
        self.enforcement.start()
        assert self.enforcement.plugin.wait_registered(20), self.enforcement.plugin.state.last_error

    def _read(self, namespace: str, name: str) -> dict[str, object]:
        return self.claims[(namespace, name)]

    def prepare_book(self, index: int, namespace: str, name: str, uid: str) -> str:
        """A claim allocated one book, prepared: its CDI device id."""
        device = self.grouping.groups[index].id
        self.claims[(namespace, name)] = {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": "book", "driver": self.driver, "pool": "node-a", "device": device}]}}}}
        prepared = self.preparer.prepare(namespace, name, uid)
        (cdi_id,) = prepared.devices[0].cdi_ids
        return cdi_id

    def close(self) -> None:
        self.enforcement.stop()


def test_dra_a_claims_container_starts_on_its_book_and_a_forged_variable_does_not(ctd2: Containerd) -> None:
    root = short_tmpdir()
    cpus = parse_cpulist(ctd2.default_cpus())[:2]
    if len(cpus) < 2:
        pytest.skip(f"needs 2 CPUs for containers, this machine gives them {cpus}")
    node = DraNode(ctd2, root, cpus, shared_pool=False)
    try:
        cdi_id = node.prepare_book(0, "inference", "one-book", "0b5e1a6e-claim")
        book = str(cpus[0])
        started = time.perf_counter()
        llm = ctd2.run_pod("llm", namespace="inference", container="c", cdi_devices=(cdi_id,), command=PRINT_ENV)
        created = time.perf_counter() - started
        first, env = log_lines(ctd2, llm, 2)
        assert first == f"Cpus_allowed_list:\t{book}"  # its first instruction ran on its book (NRI, at creation)
        assert env == f"claim=0b5e1a6e-claim/book cpus={book}"  # CDI put the contract's environment there
        every = ctd2.default_cpus()
        # The same variable written into a pod spec of another namespace, and an unknown claim in the claim's
        # own namespace: not believed, created as any other container (no shared pool: as asked for).
        forged = ctd2.run_pod("thief", namespace="other", container="c", command=PRINT_ENV,
                              envs=(("TOPOLOGY_DRA_CLAIM", "0b5e1a6e-claim/book"),))
        assert first_line(ctd2, forged) == every
        unknown = ctd2.run_pod("guess", namespace="inference", container="c", command=PRINT_ENV,
                               envs=(("TOPOLOGY_DRA_CLAIM", "made-up-uid/book"),))
        assert first_line(ctd2, unknown) == every
        # A forged entry in the holder's own spec changes nothing: the CDI device's entry replaces it.
        both = ctd2.run_pod("llm2", namespace="inference", container="c", cdi_devices=(cdi_id,), command=PRINT_ENV,
                            envs=(("TOPOLOGY_DRA_CLAIM", "made-up-uid/book"),))
        assert log_lines(ctd2, both, 2) == [f"Cpus_allowed_list:\t{book}", f"claim=0b5e1a6e-claim/book cpus={book}"]
        assert node.enforcement.counters.pinned == 2
        print(f"a DRA container created and started with NRI in {created:.3f} s")
        for pod in (both, unknown, forged, llm):
            ctd2.remove_pod(pod)
        node.preparer.unprepare("0b5e1a6e-claim")
    finally:
        node.close()


def test_dra_with_the_shared_pool_the_prepared_book_is_kept_from_everyone_else_and_returned_at_unprepare(
        ctd2: Containerd) -> None:
    root = short_tmpdir()
    cpus = parse_cpulist(ctd2.default_cpus())[:2]
    if len(cpus) < 2:
        pytest.skip(f"needs 2 CPUs for containers, this machine gives them {cpus}")
    node = DraNode(ctd2, root, cpus, shared_pool=True)
    try:
        a, b = (str(c) for c in cpus)
        every = format_cpulist(cpus)
        web = ctd2.run_pod("web", container="c", command=FIRST_LINE)  # nothing prepared: the pool is every CPU
        assert first_line(ctd2, web) == every
        cdi_id = node.prepare_book(1, "inference", "one-book", "7c1d-claim")
        # Prepared, before its container exists and before pod-resources could list it: already held.
        early = ctd2.run_pod("early", container="c", command=FIRST_LINE)
        assert first_line(ctd2, early) == a
        llm = ctd2.run_pod("llm", namespace="inference", container="c", cdi_devices=(cdi_id,), command=FIRST_LINE)
        assert first_line(ctd2, llm) == b
        assert ctd2.wait_cpus_allowed(web.container_id, a, timeout=5) == a  # moved off the book in llm's reply
        forged = ctd2.run_pod("thief", namespace="other", container="c", command=FIRST_LINE,
                              envs=(("TOPOLOGY_DRA_CLAIM", "7c1d-claim/book"),))
        assert first_line(ctd2, forged) == a  # the pool, never the book
        ctd2.remove_pod(llm)
        spec = ctd2.cdi_dir / f"{node.driver}-book_7c1d-claim.json"
        assert spec.is_file()
        node.preparer.unprepare("7c1d-claim")  # kubelet's NodeUnprepareResources: the book is free again
        assert not spec.exists()
        for pod in (web, early, forged):  # widened outside any event (unsolicited UpdateContainers, containerd 2.4)
            assert ctd2.wait_cpus_allowed(pod.container_id, every, timeout=10) == every
            ctd2.remove_pod(pod)
    finally:
        node.close()
