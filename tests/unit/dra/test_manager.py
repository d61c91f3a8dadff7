"""DRA mode in the running agent: the manager's publication steps and the pod-resources holds of DRA claims."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from agent._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from agent._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from agent._proto.podresources.v1 import api_pb2 as pr
from agent._proto.podresources.v1 import api_pb2_grpc as pr_grpc
from agent.dra.driver import DraManager
from agent.dra.kubelet_plugin import KubeletPlugin
from agent.dra.prepare import ClaimPreparer
from agent.dra.publisher import SlicePublisher
from agent.plugin.podresources import PodResourcesClient
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.ledger import ListedDevice
from agent.policy.resource_slices import DRIVER, TAINT_KEY, SliceSettings, build_pool
from agent.topology.embedded import load_embedded
from tests.support.harness import short_tmpdir
from tests.support.kubeapi import SliceApi


def test_manager_publishes_taints_and_restores() -> None:
    topology = load_embedded("pr40714")
    grouping = group_topology(topology, GroupingSettings(levels=("book", "socket")))
    root = short_tmpdir()
    api = SliceApi()
    preparer = ClaimPreparer(driver=DRIVER, pool="node-a", groups={g.id: g for g in grouping.groups},
                             allocation=AllocationSettings(), read_claim=api.read_claim, cdi_dir=root / "cdi",
                             checkpoint=root / "claims.json")
    plugin = KubeletPlugin(driver=DRIVER, registry_dir=root / "reg", plugin_dir=root / "plugin", preparer=preparer)
    broken: dict[tuple[str, str], str] = {}
    manager = DraManager(plugin=plugin, publisher=SlicePublisher(api, "node-a", DRIVER),
                         plan=lambda b, u: build_pool(grouping, topology, SliceSettings("node-a"), b, u),
                         broken=lambda: dict(broken), resources=grouping.resources(), interval=0)
    manager.start()
    try:
        assert len(api.slices) == 2 and not manager.ready()  # published, not yet registered
        with grpc.insecure_channel(f"unix://{plugin.registration_path}") as ch:
            reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
        assert manager.ready() and manager.registrations == {"topology/book": 1, "topology/socket": 1}
        writes = api.writes()
        manager.step()
        assert api.writes() == writes  # nothing changed: a List, no write
        broken[("topology/book", "drawer0-book0")] = "cpus 3 offline"
        manager.step()
        devices = {d["name"]: d for d in api.slices["node-a-topology-devices-0"]["spec"]["devices"]}
        assert devices["drawer0-book0"]["taints"][0]["key"] == TAINT_KEY
        assert {o["spec"]["pool"]["generation"] for o in api.slices.values()} == {2}
        api.slices.clear()  # kubelet wiped them
        manager.step()
        assert len(api.slices) == 2
        plugin.registration_path.unlink()  # somebody removed our registration socket
        manager.step()
        assert plugin.registration_socket_present()
    finally:
        manager.stop()


class ListerWithClaims(pr_grpc.PodResourcesListerServicer):
    def List(self, request: object, context: object) -> pr.ListPodResourcesResponse:
        claim = pr.DynamicResource(claim_name="c", claim_namespace="ns", claim_resources=[
            pr.ClaimResource(driver_name=DRIVER, pool_name="node-a", device_name="drawer0-book1"),
            pr.ClaimResource(driver_name="gpu.example.com", pool_name="x", device_name="gpu-0")])
        return pr.ListPodResourcesResponse(pod_resources=[
            pr.PodResources(name="p", namespace="ns", containers=[
                pr.ContainerResources(name="main", dynamic_resources=[claim])]),
            pr.PodResources(name="idle", namespace="ns", containers=[pr.ContainerResources(name="x")])])


def test_pod_resources_reports_dra_claims_as_holds() -> None:
    sock = short_tmpdir() / "pr.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(ListerWithClaims(), server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        client = PodResourcesClient(Path(sock))
        assert client.list() == [ListedDevice("ns", "p", "", "", ()), ListedDevice("ns", "idle", "", "", ())]
        client.dra_driver = DRIVER
        client.dra_devices = {"drawer0-book1": "topology/book"}
        assert client.list() == [ListedDevice("ns", "p", "main", "topology/book", ("drawer0-book1",), "ns/c"),
                                 ListedDevice("ns", "idle", "", "", ())]
        # A device held with admin access is observed, not held: its row is no hold (the pod holds nothing).
        client.dra_admin = lambda: frozenset({("ns", "c", "drawer0-book1")})
        assert client.list() == [ListedDevice("ns", "p", "", "", ()), ListedDevice("ns", "idle", "", "", ())]
        client.close()
    finally:
        server.stop(None)
