"""The DRA kubelet plugin (agent/dra/kubelet_plugin.py, agent/dra/prepare.py), driven the way kubelet drives it:
GetInfo and NotifyRegistrationStatus on the registration socket, then NodePrepareResources and
NodeUnprepareResources on the DRA socket (v1 and v1beta1); CDI files, checkpoint, idempotence, restarts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent._proto.dra.v1 import api_pb2 as dra_v1
from agent._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from agent._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from agent._proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from agent._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from agent._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from agent.dra.kubelet_plugin import KubeletPlugin
from agent.dra.prepare import (
    ClaimPreparer,
    PreparedClaim,
    PrepareError,
    cdi_file_uid,
    forget_claims,
    load_checkpoint,
    plan_claim,
    request_index,
    with_claim_env,
)
from agent.policy.allocation import AllocationSettings, plan_allocation
from agent.policy.container_claims import PreparedRequest
from agent.policy.grouping import group_topology
from agent.policy.resource_slices import DRIVER
from agent.topology.embedded import load_embedded
from tests.support.dra_claims import Claims, claim, groups
from tests.support.harness import short_tmpdir


def env_of(spec: dict[str, Any], device: str) -> dict[str, str]:
    (d,) = [d for d in spec["devices"] if d["name"] == device]
    return dict(e.split("=", 1) for e in d["containerEdits"]["env"])


def test_plan_claim_matches_allocate_contract() -> None:
    g = groups()
    devices, files = plan_claim(claim("u1", ("tp", "drawer0-book1"), ("tp", "drawer0-book0")), driver=DRIVER,
                                pool="node-a", groups=g, allocation=AllocationSettings())
    assert [d.device for d in devices] == ["drawer0-book1", "drawer0-book0"]
    assert {d.cdi_ids for d in devices} == {(f"{DRIVER}/book=u1-tp",)}
    (name, spec), = files.items()
    assert name == f"{DRIVER}-book_u1.json"
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == f"{DRIVER}/book"
    expected = plan_allocation([g["drawer0-book0"], g["drawer0-book1"]]).envs
    env = env_of(spec, "u1-tp")
    assert env == {**expected, "TOPOLOGY_DRA_CLAIM": "u1/tp"}  # the contract, and the request it is (for NRI)
    assert env["TOPOLOGY_GROUPS"] == "drawer0-book0,drawer0-book1"  # topology order, one rank list per device
    assert env["TOPOLOGY_RANKS"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1


def test_plan_claim_per_request_and_foreign_devices() -> None:
    g = groups()
    mixed = claim("u2", ("a", "drawer0-book0-socket0"), ("b", "drawer0-book1"))
    mixed["status"]["allocation"]["devices"]["results"].append(
        {"request": "gpu", "driver": "gpu.example.com", "pool": "x", "device": "gpu-0"})
    devices, files = plan_claim(mixed, driver=DRIVER, pool="node-a", groups=g, allocation=AllocationSettings())
    assert [(d.request, d.cdi_ids) for d in devices] == [("a", (f"{DRIVER}/socket=u2-a",)),
                                                          ("b", (f"{DRIVER}/book=u2-b",))]
    assert sorted(files) == [f"{DRIVER}-book_u2.json", f"{DRIVER}-socket_u2.json"]


@pytest.fixture
def dirs() -> Iterator[dict[str, Path]]:
    root = short_tmpdir()
    yield {"registry": root / "plugins_registry", "plugin": root / "plugins" / DRIVER, "cdi": root / "cdi",
           "state": root / "state" / "dra-claims.json"}


def make_plugin(dirs: dict[str, Path], claims: Claims) -> KubeletPlugin:
    preparer = ClaimPreparer(driver=DRIVER, pool="node-a", groups=groups(), allocation=AllocationSettings(),
                             read_claim=claims.read, cdi_dir=dirs["cdi"], checkpoint=dirs["state"])
    return KubeletPlugin(driver=DRIVER, registry_dir=dirs["registry"], plugin_dir=dirs["plugin"], preparer=preparer)


def test_registration_and_prepare_unprepare_v1(dirs: dict[str, Path]) -> None:
    claims = Claims()
    claims.items[("ns", "one-book")] = claim("uid-1", ("book", "drawer0-book1"), name="one-book")
    plugin = make_plugin(dirs, claims)
    plugin.start()
    try:
        reg_sock = dirs["registry"] / f"{DRIVER}-reg.sock"
        with grpc.insecure_channel(f"unix://{reg_sock}") as ch:
            stub = reg_grpc.RegistrationStub(ch)
            info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
            assert (info.type, info.name) == ("DRAPlugin", DRIVER)
            assert info.endpoint == str(dirs["plugin"] / "dra.sock")
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
        assert plugin.registered and plugin.registrations == 1
        with grpc.insecure_channel(f"unix://{info.endpoint}") as ch:
            dra = dra_v1_grpc.DRAPluginStub(ch)
            req = dra_v1.NodePrepareResourcesRequest(claims=[
                dra_v1.Claim(namespace="ns", name="one-book", uid="uid-1"),
                dra_v1.Claim(namespace="ns", name="gone", uid="uid-9")])
            answer = dra.NodePrepareResources(req, timeout=5)
            ok = answer.claims["uid-1"]
            assert ok.error == ""
            assert [(d.pool_name, d.device_name, list(d.request_names), list(d.cdi_device_ids)) for d in ok.devices] \
                == [("node-a", "drawer0-book1", ["book"], [f"{DRIVER}/book=uid-1-book"])]
            assert "not found" in answer.claims["uid-9"].error
            spec_file = dirs["cdi"] / f"{DRIVER}-book_uid-1.json"
            spec = json.loads(spec_file.read_text())
            assert env_of(spec, "uid-1-book")["TOPOLOGY_CPUS"] == "24-47"
            # Again (kubelet retries after its own restart): the same answer, no API read.
            reads = claims.reads
            again = dra.NodePrepareResources(dra_v1.NodePrepareResourcesRequest(claims=[req.claims[0]]), timeout=5)
            assert again.claims["uid-1"] == ok and claims.reads == reads
            un = dra.NodeUnprepareResources(dra_v1.NodeUnprepareResourcesRequest(claims=[req.claims[0]]), timeout=5)
            assert un.claims["uid-1"].error == ""
            assert not spec_file.exists()
            un = dra.NodeUnprepareResources(dra_v1.NodeUnprepareResourcesRequest(claims=[req.claims[0]]), timeout=5)
            assert un.claims["uid-1"].error == ""  # unknown now: still fine
    finally:
        plugin.stop()
    assert not (dirs["registry"] / f"{DRIVER}-reg.sock").exists()
    assert not (dirs["plugin"] / "dra.sock").exists()


def test_v1beta1_and_restart_keeps_prepared_claims(dirs: dict[str, Path]) -> None:
    claims = Claims()
    claims.items[("ns", "s")] = claim("uid-2", ("s", "drawer0-book0-socket1"), name="s")
    plugin = make_plugin(dirs, claims)
    plugin.start()
    try:
        with grpc.insecure_channel(f"unix://{plugin.dra_path}") as ch:
            dra = dra_v1beta1_grpc.DRAPluginStub(ch)
            req = dra_v1beta1.NodePrepareResourcesRequest(claims=[dra_v1beta1.Claim(namespace="ns", name="s",
                                                                                    uid="uid-2")])
            first = dra.NodePrepareResources(req, timeout=5)
            assert list(first.claims["uid-2"].devices[0].cdi_device_ids) == [f"{DRIVER}/socket=uid-2-s"]
    finally:
        plugin.stop()
    spec_file = dirs["cdi"] / f"{DRIVER}-socket_uid-2.json"
    spec_file.unlink()  # /var/run is a tmpfs: a node reboot empties it
    # A restarted agent: the checkpoint answers, the file comes back, the claim is not read again.
    del claims.items[("ns", "s")]
    plugin = make_plugin(dirs, claims)
    plugin.start()
    try:
        assert plugin.preparer.prepares == 0 and "uid-2" in plugin.preparer.claims
        with grpc.insecure_channel(f"unix://{plugin.dra_path}") as ch:
            again = dra_v1beta1_grpc.DRAPluginStub(ch).NodePrepareResources(req, timeout=5)
        assert again.claims["uid-2"] == first.claims["uid-2"]
        assert spec_file.exists() and plugin.preparer.prepares == 0
    finally:
        plugin.stop()


def test_wrong_uid_and_other_pool(dirs: dict[str, Path]) -> None:
    claims = Claims()
    claims.items[("ns", "c")] = claim("new-uid", ("r", "drawer0-book0"))
    claims.items[("ns", "p")] = claim("p-uid", ("r", "drawer0-book0"), name="p", pool="other-node")
    preparer = make_plugin(dirs, claims).preparer
    with pytest.raises(Exception, match="replaced"):
        preparer.prepare("ns", "c", "old-uid")
    with pytest.raises(Exception, match="not this node's pool"):
        preparer.prepare("ns", "p", "p-uid")
    assert not dirs["state"].exists()


def test_untrusted_checkpoint_is_ignored(dirs: dict[str, Path]) -> None:
    dirs["state"].parent.mkdir(parents=True)
    dirs["state"].write_text("{not json")
    assert make_plugin(dirs, Claims()).preparer.claims == {}


@pytest.mark.parametrize("doc", [
    {"metadata": 7},
    {"metadata": {"uid": "u"}, "status": {"allocation": {"devices": {"results": [None, 3]}}}},
    {"metadata": {"uid": "u"}, "status": {"allocation": {"devices": {"results": [{"driver": DRIVER}]}}}},
    {"metadata": {"uid": "u"}, "status": {"allocation": {"devices": {"results": {"request": "r"}}}}},
    {"metadata": {"uid": "u"}, "status": []},
    {"metadata": {"uid": "u"}, "status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": DRIVER, "pool": "\n", "device": "drawer0-book0"}]}}}},
])
def test_a_claim_not_in_the_api_servers_shape_is_refused_with_a_prepare_error(doc: dict[str, Any]) -> None:
    groups = {g.id: g for g in group_topology(load_embedded("z16-lpar")).groups}
    with pytest.raises(PrepareError) as refused:
        plan_claim(doc, driver=DRIVER, pool="node-a", groups=groups, allocation=AllocationSettings())
    assert "\n" not in str(refused.value)  # it goes back to kubelet as one line, whatever the claim holds


@pytest.mark.parametrize("text", [
    "[" * 100_000,  # nested past the JSON parser's recursion limit
    '{"version": 1, "claims": [{"uid": null, "namespace": "ns", "name": "c", "devices": [], "files": {}}]}',
    '{"version": 1, "claims": [{"uid": "u", "namespace": "ns", "name": "c", "devices": [{"request": "r", '
    '"pool": "p", "device": "d", "cdiIds": [7]}], "files": {}}]}',
    '{"version": 1, "claims": {"uid": "u"}}',
])
def test_a_checkpoint_that_is_not_the_agents_is_not_trusted(tmp_path: Path, text: str) -> None:
    """Whatever the file holds, reading it never raises: None (not trusted), and nothing is coerced into a claim."""
    path = tmp_path / "claims.json"
    path.write_text(text)
    assert load_checkpoint(path) is None


def test_prepared_requests_are_indexed_in_memory_and_follow_prepare_unprepare(dirs: dict[str, Path]) -> None:
    claims = Claims()
    claims.items[("ns", "two")] = claim("uid-3", ("tp", "drawer0-book0"), ("tp", "drawer0-book1"),
                                        ("s", "drawer0-book1-socket0"), name="two")
    preparer = make_plugin(dirs, claims).preparer
    changes: list[int] = []
    preparer.on_change = lambda: changes.append(len(preparer.requests()))
    assert preparer.requests() == {}
    preparer.prepare("ns", "two", "uid-3")
    assert preparer.requests() == {
        "uid-3/tp": PreparedRequest("ns", "two", (("topology/book", "drawer0-book0"),
                                                  ("topology/book", "drawer0-book1"))),
        "uid-3/s": PreparedRequest("ns", "two", (("topology/socket", "drawer0-book1-socket0"),))}
    spec = json.loads((dirs["cdi"] / f"{DRIVER}-socket_uid-3.json").read_text())
    assert env_of(spec, "uid-3-s")["TOPOLOGY_DRA_CLAIM"] == "uid-3/s"  # what names it in the container's env
    preparer.prepare("ns", "two", "uid-3")  # again: nothing new, no change reported
    assert changes == [2]
    restarted = make_plugin(dirs, claims).preparer  # the checkpoint restores the index too
    assert restarted.requests() == preparer.requests()
    preparer.unprepare("uid-3")
    assert preparer.requests() == {} and changes == [2, 0]


def test_a_device_no_longer_published_is_left_out_of_the_index() -> None:
    g = groups()
    devices, files = plan_claim(claim("u4", ("r", "drawer0-book0"), ("r", "drawer0-book1")), driver=DRIVER,
                                pool="node-a", groups=g, allocation=AllocationSettings())
    prepared = {"u4": PreparedClaim("u4", "ns", "c", devices, files)}
    del g["drawer0-book1"]
    assert request_index(prepared, g) == {"u4/r": PreparedRequest("ns", "c", (("topology/book", "drawer0-book0"),))}


def test_a_checkpoint_from_before_the_claim_variable_gets_it_in_its_cdi_files(dirs: dict[str, Path]) -> None:
    claims = Claims()
    claims.items[("ns", "old")] = claim("uid-5", ("r", "drawer0-book0"), name="old")
    preparer = make_plugin(dirs, claims).preparer
    preparer.prepare("ns", "old", "uid-5")
    doc = json.loads(dirs["state"].read_text())
    for spec in doc["claims"][0]["files"].values():  # what an agent before TOPOLOGY_DRA_CLAIM wrote
        for device in spec["devices"]:
            device["containerEdits"]["env"] = [e for e in device["containerEdits"]["env"]
                                               if not e.startswith("TOPOLOGY_DRA_CLAIM=")]
    dirs["state"].write_text(json.dumps(doc))
    spec_file = dirs["cdi"] / f"{DRIVER}-book_uid-5.json"
    spec_file.unlink()
    restarted = make_plugin(dirs, claims).preparer
    assert env_of(json.loads(spec_file.read_text()), "uid-5-r")["TOPOLOGY_DRA_CLAIM"] == "uid-5/r"
    assert restarted.claims["uid-5"].files == preparer.claims["uid-5"].files
    assert restarted.prepares == 0 and claims.reads == 1  # restored, not prepared again
    current = preparer.claims["uid-5"]
    assert with_claim_env(current) is current  # a claim that has the variable is left as it is


def test_a_failed_checkpoint_write_changes_nothing_the_nri_hook_believes(dirs: dict[str, Path]) -> None:
    claims = Claims()
    claims.items[("ns", "one")] = claim("uid-9", ("tp", "drawer0-book0"), name="one")
    preparer = make_plugin(dirs, claims).preparer
    dirs["state"].mkdir(parents=True)  # the checkpoint's path taken by a directory: every save fails
    with pytest.raises(OSError):
        preparer.prepare("ns", "one", "uid-9")
    assert preparer.requests() == {} and preparer.claims == {}
    dirs["state"].rmdir()
    preparer.prepare("ns", "one", "uid-9")  # kubelet's retry: prepared, and saved this time
    assert set(preparer.requests()) == {"uid-9/tp"}
    assert make_plugin(dirs, claims).preparer.requests() == preparer.requests()  # in the checkpoint too

    dirs["state"].unlink()
    dirs["state"].mkdir()
    with pytest.raises(OSError):
        preparer.unprepare("uid-9")
    assert set(preparer.requests()) == {"uid-9/tp"}  # still held while the unprepare is not saved
    dirs["state"].rmdir()
    preparer.unprepare("uid-9")
    assert preparer.requests() == {} and make_plugin(dirs, claims).preparer.requests() == {}


def test_cdi_file_uid_names_only_this_drivers_claim_files() -> None:
    assert cdi_file_uid(f"{DRIVER}-book_2355-71be.json", DRIVER) == "2355-71be"
    assert cdi_file_uid(f"{DRIVER}-group_u_1.json", DRIVER) == "1"  # the uid is what follows the last "_"
    for other in (f"{DRIVER}-book_u1.yaml", "other.example.com-book_u1.json", f"{DRIVER}-book.json",
                  f"{DRIVER}-_u1.json", f"{DRIVER}-book_.json", f"{DRIVER}.json"):
        assert cdi_file_uid(other, DRIVER) is None, other


def test_after_a_device_plugin_agent_forgot_a_claim_the_next_dra_agent_removes_its_cdi_files(
        dirs: dict[str, Path]) -> None:
    """A claim prepared in DRA mode; after a switch to device-plugin mode its pod went, and the agent forgot it in the
    checkpoint (kubelet could not unprepare it: no DRA plugin ran) but left its CDI file; back in DRA mode kubelet's
    DRA manager unprepares a claim the checkpoint no longer knows. The file must go; other claims' and other
    drivers' files stay."""
    claims = Claims()
    claims.items[("ns", "gone")] = claim("u-gone", ("book", "drawer0-book1"), name="gone")
    claims.items[("ns", "kept")] = claim("u-kept", ("book", "drawer0-book0"), name="kept")
    preparer = make_plugin(dirs, claims).preparer
    preparer.prepare("ns", "gone", "u-gone")
    preparer.prepare("ns", "kept", "u-kept")
    foreign = dirs["cdi"] / "gpu.example.com-gpu_u-gone.json"
    foreign.write_text("{}")
    assert forget_claims(dirs["state"], ["u-gone"]) == ["u-gone"]  # as an agent before this fix: files left
    back = make_plugin(dirs, claims).preparer  # DRA mode again: its checkpoint holds u-kept only
    assert set(back.claims) == {"u-kept"}
    expected = sorted([f"{DRIVER}-book_u-kept.json", foreign.name])
    assert sorted(p.name for p in dirs["cdi"].iterdir()) == expected
    back.unprepare("u-gone")  # kubelet's unprepare of the forgotten claim succeeds
    assert sorted(p.name for p in dirs["cdi"].iterdir()) == expected


def test_unpreparing_a_claim_the_checkpoint_does_not_hold_removes_its_cdi_files(dirs: dict[str, Path]) -> None:
    """A file of a claim this agent never saved (an earlier instance's prepare that finished after this one read the
    checkpoint, in a rolling upgrade) goes when kubelet unprepares that claim."""
    claims = Claims()
    claims.items[("ns", "kept")] = claim("u-kept", ("book", "drawer0-book0"), name="kept")
    preparer = make_plugin(dirs, claims).preparer
    preparer.prepare("ns", "kept", "u-kept")
    late = dirs["cdi"] / f"{DRIVER}-book_u-late.json"
    late.write_text("{}")
    preparer.unprepare("u-late")
    assert sorted(p.name for p in dirs["cdi"].iterdir()) == [f"{DRIVER}-book_u-kept.json"]
    assert set(preparer.claims) == {"u-kept"}


def test_forgetting_a_claim_in_device_plugin_mode_removes_its_cdi_files(dirs: dict[str, Path]) -> None:
    claims = Claims()
    claims.items[("ns", "two")] = claim("u-2", ("b", "drawer0-book1"), ("s", "drawer0-book0-socket0"), name="two")
    make_plugin(dirs, claims).preparer.prepare("ns", "two", "u-2")
    assert len(list(dirs["cdi"].iterdir())) == 2
    assert forget_claims(dirs["state"], ["u-2"], dirs["cdi"]) == ["u-2"]
    assert list(dirs["cdi"].iterdir()) == []


def test_a_dra_agent_starting_removes_cdi_files_its_trusted_checkpoint_does_not_hold(dirs: dict[str, Path]) -> None:
    """A prepare that wrote its files and then could not save the checkpoint (or a claim forgotten while no agent
    ran) leaves files of no claim: the next DRA agent removes them, but only on a checkpoint it could read."""
    claims = Claims()
    claims.items[("ns", "kept")] = claim("u-kept", ("book", "drawer0-book0"), name="kept")
    make_plugin(dirs, claims).preparer.prepare("ns", "kept", "u-kept")
    orphan = dirs["cdi"] / f"{DRIVER}-book_u-orphan.json"
    orphan.write_text("{}")
    make_plugin(dirs, claims)
    assert sorted(p.name for p in dirs["cdi"].iterdir()) == [f"{DRIVER}-book_u-kept.json"]
    orphan.write_text("{}")
    dirs["state"].write_text("{not json")  # not trusted: nothing is cleaned up on its strength
    make_plugin(dirs, claims)
    assert sorted(p.name for p in dirs["cdi"].iterdir()) == sorted([f"{DRIVER}-book_u-kept.json", orphan.name])
