"""A book to itself in every mode: holds of either mode count in both, from the first ListAndWatch or the
first slice publication on; a restarted DRA agent keeps the groups its claims hold; admin-access claims hold and pin
nothing; a prepare is a hold at once, whatever enforces the cpusets.

Driven the way the real ones drive the agent: the kubelet emulator (device-plugin API and pod-resources, with the
claim rows a DRA kubelet lists), the in-memory API server of the publisher tests, the preparer's own calls, NRI
requests as containerd sends them, and a CRI runtime that records what it is told.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest

from agent._proto.deviceplugin.v1beta1 import api_pb2 as dp
from agent._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from agent._proto.dra.v1 import api_pb2 as dra_v1
from agent._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from agent._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from agent.app.agent import Agent
from agent.app.build import build_agent
from agent.app.config import AgentConfig
from agent.cri.client import CONTAINER_NAME, POD_NAME, POD_NAMESPACE, ContainerInfo, ContainerStatusInfo
from agent.dra.prepare import ClaimPreparer, PrepareError, checkpoint_path
from agent.enforce.cri_loop import CpusetEnforcement
from agent.enforce.nri_hooks import NriEnforcement
from agent.errors import KubeApiError
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.resource_slices import DRIVER, IN_USE_TAINT_KEY
from agent.topology.embedded import load_embedded
from agent.topology.model import Topology
from tests.support.env import BOOK, SOCKET
from tests.support.harness import FAST, short_tmpdir
from tests.support.kubeapi import SliceApi
from topology_devkit.kubelet_emulator import Container, KubeletEmulator
from topology_devkit.testing.wait import wait_until

NODE = "node-a"
LEVELS = ("book", "socket")


def claim(uid: str, device: str, *, name: str = "c", namespace: str = "ns", admin: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "r", "driver": DRIVER, "pool": NODE, "device": device}
    if admin:
        result["adminAccess"] = True  # copied from the request into its allocation result (resource/v1)
    return {"metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": [result]}}}}


class ClaimsApi(SliceApi):
    """The publisher tests' API server, with ResourceClaims to read."""

    def __init__(self) -> None:
        super().__init__()
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise KubeApiError(404, f'resourceclaims.resource.k8s.io "{name}" not found') from None

    def add(self, doc: dict[str, Any]) -> tuple[str, str, str]:
        meta = doc["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = doc
        return meta["namespace"], meta["name"], meta["uid"]

    def published(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self.slices.values() for d in s["spec"].get("devices", [])}


def config(k: KubeletEmulator, *, mode: str = "deviceplugin", levels: tuple[str, ...] | None = LEVELS,
           **extra: Any) -> AgentConfig:
    root = k.root
    settings: dict[str, Any] = {
        "kubelet_dir": k.device_plugin_dir, "grouping": GroupingSettings(levels=levels), "mode": mode,
        "node_name": NODE, "pod_resources_socket": k.pod_resources_socket, "pod_resources_interval": 0.05,
        "rescan_interval": 0.0, "timing": FAST, "dra_registry_dir": root / "plugins_registry",
        "dra_plugin_dir": root / "plugins" / DRIVER, "cdi_dir": root / "cdi",
        "cpu_manager_state": root / "no-cpu-manager-state", "nri_socket": root / "nri.sock", **extra}
    return AgentConfig(**settings)


@pytest.fixture
def kubelet() -> Iterator[KubeletEmulator]:
    with KubeletEmulator(short_tmpdir()) as k:
        yield k


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> ClaimsApi:
    """The API server DRA mode talks to (its client replaced, as no cluster is here)."""
    import agent.app.build_dra as dra

    fake = ClaimsApi()
    monkeypatch.setattr(dra, "dra_api", lambda: fake)
    return fake


@contextlib.contextmanager
def started(agent: Agent) -> Iterator[Agent]:
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def preparer_of(agent: Agent) -> ClaimPreparer:
    preparer = agent.manager.plugin.preparer  # type: ignore[attr-defined]
    assert isinstance(preparer, ClaimPreparer)
    return preparer


def inside(grouping_ids: Any, book: str) -> set[str]:
    return {d for d in grouping_ids if d.startswith(book + "-")}


# --- 1. a restarted DRA agent keeps the groups its prepared claims hold -----------------------------------
@pytest.mark.parametrize("known_from", ["checkpoint", "pod-resources"])
def test_a_restarted_dra_agent_keeps_the_groups_claims_hold_whatever_changed(
        kubelet: KubeletEmulator, api: ClaimsApi, known_from: str) -> None:
    topology = load_embedded("pr40714")  # books of 12, 12 and 1 cores: auto groups by book
    first = build_agent(topology, config(kubelet, mode="dra", levels=None))
    assert [g.id for g in first.grouping.groups] == ["drawer0-book0", "drawer0-book1"]
    preparer_of(first).prepare(*api.add(claim("u-1", "drawer0-book0")))
    if known_from == "pod-resources":  # the checkpoint lost; kubelet lists the claim's container
        kubelet.add_claim_pod("ns", "llm", "main", ("ns", "c"), DRIVER, NODE, ["drawer0-book0"])
        checkpoint_path(kubelet.device_plugin_dir).unlink()
    # While the agent is away book 1 goes offline: found afresh, one book is left and the automatic choice groups
    # by socket, inside the held book; the scheduler counts consumed counters only from devices it still sees.
    shrunk = Topology(machine=topology.machine, cpus=tuple(
        dataclasses.replace(c, online=c.cpu < 24) for c in topology.cpus))
    assert group_topology(shrunk).levels == ("socket",)
    second = build_agent(shrunk, config(kubelet, mode="dra", levels=None))
    assert second.grouping.groups == first.grouping.groups
    second.manager.step()  # type: ignore[attr-defined]
    assert sorted(api.published()) == ["drawer0-book0", "drawer0-book1"]  # no socket inside the held book
    assert (BOOK, "drawer0-book0") in second.devices.held_keys()


# --- 2. deviceplugin -> dra while device-plugin pods run --------------------------------------------------
def test_after_a_switch_to_dra_what_device_plugin_pods_hold_is_tainted_and_refused(
        kubelet: KubeletEmulator, api: ClaimsApi) -> None:
    topology = load_embedded("z16-lpar")
    with started(build_agent(topology, config(kubelet))) as before:
        kubelet.wait_registered(BOOK)
        pod = kubelet.admit_pod("default", "dp", [Container("c", {BOOK: 1})])
        (book,) = pod.devices("c", BOOK)
        wait_until("the hold listed", lambda: before.devices.holders().get((BOOK, book)) == ["default/dp/c"], 10,
                   every=0.02)
    sockets = inside(kubelet.devices(SOCKET), book)
    # helm upgrade --set mode=dra: the new agent holds what the device-plugin pod holds from its first publication.
    with started(build_agent(topology, config(kubelet, mode="dra"))) as agent:
        devices = api.published()
        tainted = {name for name, d in devices.items()
                   if any(t["key"] == IN_USE_TAINT_KEY and t["effect"] == "NoSchedule" for t in d.get("taints", []))}
        assert tainted == {book, *sockets}  # the book and every socket inside it; nothing else
        preparer = preparer_of(agent)
        socket = sorted(sockets)[0]
        with pytest.raises(PrepareError, match=f"{socket} overlaps topology/book {book}, held through a "
                                               "device-plugin allocation: default/dp/c"):
            preparer.prepare(*api.add(claim("u-1", socket, name="inside")))
        other = next(d for d in devices if d not in tainted and d.count("-") == 1)
        preparer.prepare(*api.add(claim("u-2", other, name="elsewhere")))  # a free book is prepared as ever
        kubelet.delete_pod("default", "dp")
        wait_until("the taints gone", lambda: not any(d.get("taints") for d in api.published().values()), 10,
                   every=0.02)
        preparer.prepare(*api.add(claim("u-3", socket, name="later")))


# --- 3. dra -> deviceplugin while DRA pods run ------------------------------------------------------------
def prepare_in_checkpoint(k: KubeletEmulator, topology: Topology, doc: dict[str, Any]) -> None:
    """What a DRA agent left on the node: the claim prepared, in its checkpoint."""
    groups = {g.id: g for g in group_topology(topology, GroupingSettings(levels=LEVELS)).groups}
    preparer = ClaimPreparer(driver=DRIVER, pool=NODE, groups=groups, allocation=AllocationSettings(),
                             read_claim=lambda ns, name: doc, cdi_dir=k.root / "cdi",
                             checkpoint=checkpoint_path(k.device_plugin_dir))
    meta = doc["metadata"]
    preparer.prepare(meta["namespace"], meta["name"], meta["uid"])


def allocate(agent: Agent, resource: str, ids: list[str]) -> dp.AllocateResponse:
    path = agent.manager.servers[resource].path  # type: ignore[attr-defined]
    with grpc.insecure_channel(f"unix://{path}") as channel:
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
        answer: dp.AllocateResponse = dp_grpc.DevicePluginStub(channel).Allocate(request, timeout=5)
        return answer


@pytest.mark.parametrize("known_from", ["pod-resources", "checkpoint"])
def test_after_a_switch_to_device_plugin_dra_claims_are_held_from_the_first_listandwatch(
        kubelet: KubeletEmulator, api: ClaimsApi, known_from: str) -> None:
    topology = load_embedded("z16-lpar")
    book = "drawer0-book1"
    prepare_in_checkpoint(kubelet, topology, claim("u-1", book))
    extra: dict[str, Any] = {}
    if known_from == "pod-resources":
        kubelet.add_claim_pod("ns", "llm", "main", ("ns", "c"), DRIVER, NODE, [book])
    else:  # pod-resources away: the claims a DRA agent left prepared hold their devices meanwhile
        extra["pod_resources_socket"] = kubelet.root / "no-pod-resources.sock"
    with started(build_agent(topology, config(kubelet, **extra))) as agent:
        kubelet.wait_registered(BOOK)
        kubelet.wait_registered(SOCKET)
        kubelet.wait_for(lambda: kubelet.snapshots(BOOK) >= 1 and kubelet.snapshots(SOCKET) >= 1, what="first")
        sockets = inside(kubelet.devices(SOCKET), book)
        assert kubelet.snapshots(BOOK) == 1 and kubelet.unhealthy_devices(BOOK) == {book}  # the first answer
        assert kubelet.unhealthy_devices(SOCKET) == sockets
        listed: list[dict[str, Any]] = agent.allocations()["devices"]  # type: ignore[assignment]
        states = {d["id"]: (d["state"], d["reason"]) for d in listed}
        assert states[book][0] == "held-elsewhere" and "DRA claim" in states[book][1]
        with pytest.raises(grpc.RpcError) as refused:
            allocate(agent, BOOK, [book])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "held through a DRA claim" in (refused.value.details() or "")
        pod = kubelet.admit_pod("default", "sock", [Container("c", {SOCKET: 1})])
        assert not set(pod.devices("c", SOCKET)) & sockets
        if known_from == "pod-resources":  # the DRA pod gone: the book is free again
            kubelet.remove_claim_pod("ns", "llm")
            kubelet.wait_for(lambda: book not in kubelet.unhealthy_devices(BOOK), what="the book healthy again")


def kubelet_registers_dra(cfg: AgentConfig) -> str:
    """kubelet's plugin watcher finds the DRA registration socket: GetInfo, then the registration taken."""
    with grpc.insecure_channel(f"unix://{cfg.dra_registry_dir / f'{DRIVER}-reg.sock'}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
    return str(info.endpoint)


def dra_sockets(cfg: AgentConfig) -> list[Path]:
    return [p for p in (cfg.dra_registry_dir / f"{DRIVER}-reg.sock", cfg.dra_plugin_dir / "dra.sock") if p.exists()]


def test_after_a_switch_to_device_plugin_the_dra_plugin_unprepares_the_claims_left_then_unregisters(
        kubelet: KubeletEmulator, api: ClaimsApi) -> None:
    """kubelet finishes a pod only once its claims are unprepared: the DRA plugin stays registered for that (no
    slices, no new claims), the claimed book held until then and advertised again after, then it unregisters."""
    topology = load_embedded("z16-lpar")
    book = "drawer0-book1"
    prepare_in_checkpoint(kubelet, topology, claim("u-1", book))
    api.create_slice({"metadata": {"name": f"{NODE}-{DRIVER}-0"}, "spec": {"nodeName": NODE, "driver": DRIVER}})
    kubelet.add_claim_pod("ns", "llm", "main", ("ns", "c"), DRIVER, NODE, [book])  # kubelet lists it until unprepared
    cfg = config(kubelet)
    with started(build_agent(topology, cfg)) as agent:
        kubelet.wait_registered(BOOK)
        kubelet.wait_registered(SOCKET)
        kubelet.wait_for(lambda: kubelet.unhealthy_devices(BOOK) == {book}, what="the claimed book held")
        wait_until("the agent ready", agent.ready, 10, every=0.02)
        assert api.slices == {}  # device-plugin mode publishes none, and deletes the node's
        endpoint = kubelet_registers_dra(cfg)
        ready, text = agent.readiness()
        assert ready and "DRA plugin registered for unprepare only: 1 claim(s) prepared in DRA mode left" in text
        gauge = "topology_agent_dra_unprepare_only_claims"
        assert agent.metrics.registry.get_sample_value(gauge) == 1
        with grpc.insecure_channel(f"unix://{endpoint}") as channel:
            dra = dra_v1_grpc.DRAPluginStub(channel)
            api.add(claim("u-2", "drawer0-book0", name="new"))
            refused = dra.NodePrepareResources(dra_v1.NodePrepareResourcesRequest(claims=[
                dra_v1.Claim(namespace="ns", name="new", uid="u-2")]), timeout=5)
            assert "runs in device-plugin mode" in refused.claims["u-2"].error
            assert not list((kubelet.root / "cdi").glob("*_u-2.json"))
            # The pod deleted: kubelet unprepares its claim, then the pod goes (and its claim rows with it).
            answer = dra.NodeUnprepareResources(dra_v1.NodeUnprepareResourcesRequest(claims=[
                dra_v1.Claim(namespace="ns", name="c", uid="u-1")]), timeout=5)
            assert answer.claims["u-1"].error == ""
        kubelet.remove_claim_pod("ns", "llm")
        kubelet.wait_for(lambda: kubelet.unhealthy_devices(BOOK) == set(), what="the book advertised again")
        pod = kubelet.admit_pod("default", "after", [Container("c", {BOOK: 1})])
        assert len(pod.devices("c", BOOK)) == 1
        wait_until("the DRA plugin unregistered", lambda: dra_sockets(cfg) == [], 10, every=0.02)
        assert list((kubelet.root / "cdi").iterdir()) == []
        assert json.loads(checkpoint_path(kubelet.device_plugin_dir).read_text())["claims"] == []
        assert agent.metrics.registry.get_sample_value(gauge) == 0
        assert "unprepare only" not in agent.readiness()[1]
        assert api.slices == {}


def test_a_device_plugin_agent_with_no_claims_left_serves_no_dra_plugin(kubelet: KubeletEmulator,
                                                                        api: ClaimsApi) -> None:
    cfg = config(kubelet)
    with started(build_agent(load_embedded("z16-lpar"), cfg)) as agent:
        kubelet.wait_registered(BOOK)
        assert agent.dra_unprepare_only is None and dra_sockets(cfg) == [] and api.calls == []


@pytest.mark.parametrize("plugin", ["kept-for-unprepare", "reverted"])
def test_the_soak_checker_finds_claims_left_unprepared_after_a_switch_only_without_the_plugin(
        kubelet: KubeletEmulator, api: ClaimsApi, monkeypatch: pytest.MonkeyPatch, plugin: str) -> None:
    """The soak's checker fed what the node shows after a switch to device-plugin mode with two claim pods deleted (a
    socket's and a book's), kubelet played as it ends such a pod: unprepare through the registered DRA driver, then
    remove the pod; with no driver registered it retries and the pod stays Terminating. With the plugin kept for
    unprepare the checker finds nothing; with it reverted (the agent before it), both violations."""
    import time

    import agent.app.build_dra as build_dra
    from bench.cluster.soak.invariants import Allowances, Checker, Hold, Snapshot, Terminating

    if plugin == "reverted":
        monkeypatch.setattr(build_dra, "build_unprepare_only", lambda config, groups: None)
    topology = load_embedded("z16-lpar")
    pods = {"u-sock": ("sock", "drawer0-book0-socket0"), "u-book": ("book", "drawer0-book1")}
    for uid, (name, device) in pods.items():
        prepare_in_checkpoint(kubelet, topology, claim(uid, device, name=name))
        kubelet.add_claim_pod("soak", name, "main", ("ns", name), DRIVER, NODE, [device])
    cfg = config(kubelet)
    with started(build_agent(topology, cfg)) as agent:
        for resource in (BOOK, SOCKET):
            kubelet.wait_registered(resource)
        kubelet.wait_for(lambda: "drawer0-book1" in kubelet.unhealthy_devices(BOOK), what="the claimed book held")
        groups = {g.id: frozenset(g.cpus) for g in agent.grouping.groups}
        online = frozenset().union(*groups.values())
        checker = Checker(Allowances(terminating_bound=1.0, advertise_bound=1.0))
        deleted = time.time()
        there = dict(pods)

        def kubelet_ends(uid: str) -> bool:
            if not (cfg.dra_registry_dir / f"{DRIVER}-reg.sock").exists():
                return False  # "DRA driver topology.s390x.ibm.com is not registered": retried later
            with grpc.insecure_channel(f"unix://{kubelet_registers_dra(cfg)}") as channel:
                answer = dra_v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                    dra_v1.NodeUnprepareResourcesRequest(claims=[dra_v1.Claim(namespace="ns", name=there[uid][0],
                                                                               uid=uid)]), timeout=5)
            if answer.claims[uid].error:
                return False
            kubelet.remove_claim_pod("soak", there.pop(uid)[0])
            return True

        found: list[str] = []
        while time.time() < deleted + 3.5:
            for uid in list(there):
                kubelet_ends(uid)
            snap = Snapshot(
                t=time.time(), groups=groups, online=online, mode="deviceplugin",
                holds=tuple(Hold(device, uid, "main", "pod-resources") for uid, (_, device) in there.items()),
                pods=frozenset(there), terminating=tuple(Terminating(uid, f"soak/{name}", deleted + 1, 1.0)
                                                         for uid, (name, _) in there.items()),
                advertised={r: len(kubelet.devices(r)) - len(kubelet.unhealthy_devices(r)) for r in (BOOK, SOCKET)})
            found += [v.kind for v in checker.check(snap)]
            time.sleep(0.1)
    if plugin == "reverted":
        assert sorted(set(found)) == ["advertised-fewer-than-free", "terminating-too-long"]
        assert found.count("terminating-too-long") == 2
    else:
        assert found == [] and not there


# --- 4. admin-access claims hold nothing and pin nothing ----------------------------------------------------
def cdi_env(k: KubeletEmulator, uid: str, request: str = "r") -> list[str]:
    for spec_file in (k.root / "cdi").glob(f"*_{uid}.json"):
        spec = json.loads(spec_file.read_text())
        for device in spec["devices"]:
            if device["name"] == f"{uid}-{request}":
                return list(device["containerEdits"]["env"])
    raise AssertionError(f"no CDI device for {uid}/{request}")


def nri_create(enforcement: NriEnforcement, name: str, env: list[str]) -> nri.CreateContainerResponse:
    """containerd's CreateContainer with the container's environment after the CDI edits."""
    pod = nri.PodSandbox(id=f"pod-{name}", name=name, namespace="ns", uid=f"u-{name}")
    container = nri.Container(id=f"c-{name}", pod_sandbox_id=pod.id, name="main", state=nri.CONTAINER_CREATED,
                              env=["PATH=/bin", *env])
    return enforcement.create_container(pod, container)


@pytest.mark.parametrize("admin_first", [True, False], ids=["admin-claim-first", "ordinary-claim-first"])
def test_an_admin_access_claim_never_pins_a_container_onto_cpus_another_claim_holds(
        kubelet: KubeletEmulator, api: ClaimsApi, admin_first: bool) -> None:
    topology = load_embedded("z16-lpar")
    agent = build_agent(topology, config(kubelet, mode="dra", cpuset_enforcement="nri", shared_pool=True))
    enforcement = agent.enforcement
    assert isinstance(enforcement, NriEnforcement)
    groups = {g.id: g for g in agent.grouping.groups}
    book = "drawer0-book1"
    socket = sorted(inside(groups, book))[0]
    preparer = preparer_of(agent)
    # The scheduler does not count an admin-access allocation, so it hands out the book and a socket inside it.
    order = [("admin", claim("u-admin", book, name="debug", admin=True)), ("llm", claim("u-llm", socket))]
    if not admin_first:
        order.reverse()
    answers = {}
    for name, doc in order:
        preparer.prepare(*api.add(doc))
        uid = doc["metadata"]["uid"]
        answers[name] = nri_create(enforcement, name, cdi_env(kubelet, uid))
    assert answers["llm"].adjust.linux.resources.cpu.cpus == groups[socket].cpulist
    known = {c.identity[1]: c.cpus for c in enforcement.known()}
    assert known["admin"] and not known["admin"] & set(groups[socket].cpus)  # in the shared pool, off the socket
    assert known["admin"] != frozenset(groups[book].cpus)
    held = agent.devices.held_keys()
    assert (SOCKET, socket) in held and (BOOK, book) not in held  # admin access holds nothing
    admin_env = dict(e.split("=", 1) for e in cdi_env(kubelet, "u-admin"))
    assert admin_env == {"TOPOLOGY_GROUPS": book, "TOPOLOGY_CPUS": groups[book].cpulist,
                         "TOPOLOGY_ADMIN_ACCESS": "true"}  # to observe: nothing to bind to, no claim to pin by


# --- 5. with CRI enforcement a prepare is a hold at once, and wakes the loop -------------------------------
class RecordingRuntime:
    """A CRI runtime with running containers, recording each cpuset it is told (stands for CriClient)."""

    containers: ClassVar[dict[str, tuple[ContainerInfo, str]]] = {}
    updates: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, socket: Path, timeout: float = 2.0) -> None:
        self.socket = socket

    def list_containers(self, labels: Any = None, running_only: bool = True) -> list[ContainerInfo]:
        return [info for info, _ in self.containers.values()]

    def container_status(self, container_id: str) -> ContainerStatusInfo:
        info, cpus = self.containers[container_id]
        return ContainerStatusInfo(**dataclasses.asdict(info), cpuset_cpus=cpus)

    def update_cpuset(self, container_id: str, cpus: str, mems: str) -> None:
        info, _ = self.containers[container_id]
        self.containers[container_id] = (info, cpus)
        self.updates.append((container_id, cpus))

    def close(self) -> None:
        pass


def test_with_cri_enforcement_a_prepare_holds_at_once_and_wakes_the_loop(
        kubelet: KubeletEmulator, api: ClaimsApi, monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.app.build as build

    RecordingRuntime.updates = []
    RecordingRuntime.containers = {"c-web": (ContainerInfo(
        id="c-web", pod_sandbox_id="s-web", name="web", attempt=0, state="CONTAINER_RUNNING", created_at=1,
        labels={POD_NAMESPACE: "default", POD_NAME: "web", CONTAINER_NAME: "web"}), "")}
    monkeypatch.setattr(build, "CriClient", RecordingRuntime)
    topology = load_embedded("z16-lpar")
    cri_socket = kubelet.root / "containerd.sock"
    with started(build_agent(topology, config(kubelet, mode="dra", cpuset_enforcement="cri", shared_pool=True,
                                              cri_socket=cri_socket, cpuset_interval=30.0))) as agent:
        enforcement = agent.enforcement
        assert isinstance(enforcement, CpusetEnforcement)
        wait_until("the first look at the runtime", lambda: enforcement.counters.steps >= 1, 10, every=0.02)
        book = next(g for g in agent.grouping.groups if g.level == "book")
        preparer_of(agent).prepare(*api.add(claim("u-1", book.id)))
        assert (BOOK, book.id) in agent.devices.held_keys()  # at once: no pod-resources List lists it yet
        # The loop (idle: it looks every 30 s) is woken, and keeps every other container off the claimed book.
        wait_until("web confined", lambda: any(cid == "c-web" for cid, _ in RecordingRuntime.updates), 5, every=0.02)
        cpus = {int(c) for part in RecordingRuntime.updates[-1][1].split(",") for c in
                (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))}
        assert not cpus & set(book.cpus)


# --- the other mode's holds on a level this one does not advertise --------------------------------------------
def test_a_dra_claim_on_a_socket_blocks_its_book_when_device_plugin_mode_advertises_books_only(
        kubelet: KubeletEmulator, api: ClaimsApi) -> None:
    topology = load_embedded("z16-lpar")
    socket = "drawer0-book1-socket0"
    prepare_in_checkpoint(kubelet, topology, claim("u-1", socket))  # DRA mode published books and sockets
    kubelet.add_claim_pod("ns", "llm", "main", ("ns", "c"), DRIVER, NODE, [socket])
    with started(build_agent(topology, config(kubelet, levels=("book",)))) as agent:
        kubelet.wait_registered(BOOK)
        kubelet.wait_for(lambda: kubelet.snapshots(BOOK) >= 1, what="the first ListAndWatch")
        assert kubelet.resources() == [BOOK]
        assert kubelet.unhealthy_devices(BOOK) == {"drawer0-book1"}  # the book around the claimed socket
        with pytest.raises(grpc.RpcError) as refused:
            allocate(agent, BOOK, ["drawer0-book1"])
        assert "overlaps topology/socket drawer0-book1-socket0, held by ns/llm/main (claim ns/c)" in (
            refused.value.details() or "")
        pod = kubelet.admit_pod("default", "book", [Container("c", {BOOK: 1})])
        assert pod.devices("c", BOOK) != ["drawer0-book1"]


def test_a_device_plugin_pod_on_a_socket_taints_its_book_when_dra_mode_publishes_books_only(
        kubelet: KubeletEmulator, api: ClaimsApi) -> None:
    topology = load_embedded("z16-lpar")
    with started(build_agent(topology, config(kubelet, levels=("socket",)))):  # device-plugin mode: sockets
        kubelet.wait_registered(SOCKET)
        pod = kubelet.admit_pod("default", "dp", [Container("c", {SOCKET: 1})])
        (socket,) = pod.devices("c", SOCKET)
    book = socket.rsplit("-", 1)[0]
    with started(build_agent(topology, config(kubelet, mode="dra", levels=("book",)))) as agent:
        devices = api.published()
        assert sorted(devices) == sorted(g.id for g in agent.grouping.groups)  # books only
        tainted = {name for name, d in devices.items() if d.get("taints")}
        assert tainted == {book}
        with pytest.raises(PrepareError, match=f"overlaps topology/socket {socket}"):
            preparer_of(agent).prepare(*api.add(claim("u-1", book)))


def test_a_claim_whose_pod_went_in_device_plugin_mode_is_forgotten_and_held_no_more_after_a_kubelet_restart(
        kubelet: KubeletEmulator, api: ClaimsApi) -> None:
    """Its pod deleted while no DRA plugin runs, kubelet cannot unprepare the claim: the checkpoint keeps it. Once
    pod-resources no longer lists it the agent forgets it there, so that an agent started right after a kubelet
    restart (whose List releases nothing for a while) does not hold the book again."""
    from agent.dra.prepare import read_checkpoint

    topology = load_embedded("z16-lpar")
    book = "drawer0-book1"
    prepare_in_checkpoint(kubelet, topology, claim("u-1", book))
    kubelet.add_claim_pod("ns", "llm", "main", ("ns", "c"), DRIVER, NODE, [book])
    checkpoint = checkpoint_path(kubelet.device_plugin_dir)
    cfg = config(kubelet)
    with started(build_agent(topology, cfg)):
        kubelet.wait_registered(BOOK)
        kubelet.wait_for(lambda: kubelet.unhealthy_devices(BOOK) == {book}, what="the claimed book held")
        assert len(dra_sockets(cfg)) == 2  # kubelet could unprepare it
        assert set(read_checkpoint(checkpoint)) == {"u-1"}  # in use: kept
        assert len(list((kubelet.root / "cdi").glob("*_u-1.json"))) == 1
        kubelet.remove_claim_pod("ns", "llm")
        kubelet.wait_for(lambda: not kubelet.unhealthy_devices(BOOK), what="the book free again")
        wait_until("the claim forgotten in the checkpoint", lambda: read_checkpoint(checkpoint) == {}, 10, every=0.02)
        # its CDI file goes with it, right after the checkpoint is written
        wait_until("the claim's CDI file removed", lambda: list((kubelet.root / "cdi").glob("*_u-1.json")) == [], 10,
                   every=0.02)
        wait_until("the DRA plugin unregistered: no claim left", lambda: dra_sockets(cfg) == [], 10, every=0.02)
    kubelet.pods_resync = 30.0  # the restarted kubelet's List stays empty: an agent now releases nothing
    kubelet.restart()
    with started(build_agent(topology, config(kubelet))):
        kubelet.wait_registered(BOOK)
        kubelet.wait_for(lambda: kubelet.snapshots(BOOK) >= 1, what="the first ListAndWatch")
        assert kubelet.unhealthy_devices(BOOK) == set()
