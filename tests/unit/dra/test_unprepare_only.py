"""The DRA plugin kept for unprepare only (agent/dra/unprepare_only.py) and the preparer's part of it
(agent/dra/prepare.py: refusing new claims, forgetting released ones), driven as kubelet drives them: the
registration socket, then NodePrepareResources and NodeUnprepareResources on the DRA socket."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent._proto.dra.v1 import api_pb2 as dra_v1
from agent._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from agent._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from agent._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from agent.dra.kubelet_plugin import KubeletPlugin
from agent.dra.prepare import ClaimPreparer, PrepareError
from agent.dra.unprepare_only import UnprepareOnly
from agent.errors import KubeApiError
from agent.policy.allocation import AllocationSettings
from agent.policy.resource_slices import DRIVER
from tests.support.dra_claims import Claims, claim, groups
from tests.support.harness import short_tmpdir
from topology_devkit.testing.wait import wait_until

REFUSAL = "the agent on this node runs in device-plugin mode"


@pytest.fixture
def dirs() -> Iterator[dict[str, Path]]:
    root = short_tmpdir()
    yield {"registry": root / "plugins_registry", "plugin": root / "plugins" / DRIVER, "cdi": root / "cdi",
           "state": root / "state" / "dra-claims.json"}


def preparer(dirs: dict[str, Path], claims: Claims) -> ClaimPreparer:
    return ClaimPreparer(driver=DRIVER, pool="node-a", groups=groups(), allocation=AllocationSettings(),
                         read_claim=claims.read, cdi_dir=dirs["cdi"], checkpoint=dirs["state"])


def left_by_dra_mode(dirs: dict[str, Path], *uids: str) -> None:
    """What a DRA agent left on the node: each claim prepared on its own book, in the checkpoint, with its CDI file."""
    claims = Claims()
    p = preparer(dirs, claims)
    for uid, book in zip(uids, ("drawer0-book0", "drawer0-book1"), strict=False):
        claims.items[("ns", uid)] = claim(uid, ("r", book), name=uid)
        p.prepare("ns", uid, uid)


class Slices:
    def __init__(self, fail: int = 0, status: int = 503) -> None:
        self.removed = 0
        self.calls = 0
        self.fail = fail
        self.status = status

    def remove_all(self) -> int:
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise KubeApiError(self.status, "refused")
        self.removed += 1
        return 2 if self.removed == 1 else 0


def make(dirs: dict[str, Path], claims: Claims | None = None,
         slices: Slices | None = None) -> tuple[UnprepareOnly, ClaimPreparer]:
    p = preparer(dirs, claims or Claims())
    p.refuse_new = REFUSAL
    plugin = KubeletPlugin(driver=DRIVER, registry_dir=dirs["registry"], plugin_dir=dirs["plugin"], preparer=p)
    leftover = UnprepareOnly(plugin=plugin, slices=slices, interval=0.05, linger=0.1)
    p.on_change = leftover.changed
    return leftover, p


def register(dirs: dict[str, Path]) -> str:
    """kubelet's plugin watcher: GetInfo, then the registration taken; the DRA socket's path."""
    with grpc.insecure_channel(f"unix://{dirs['registry'] / f'{DRIVER}-reg.sock'}") as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
        assert (info.type, info.name) == ("DRAPlugin", DRIVER)
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
    return str(info.endpoint)


def sockets(dirs: dict[str, Path]) -> list[Path]:
    return [p for p in (dirs["registry"] / f"{DRIVER}-reg.sock", dirs["plugin"] / "dra.sock") if p.exists()]


# --- the preparer -------------------------------------------------------------------------------------------
def test_a_preparer_refusing_new_claims_answers_those_it_holds_and_reads_no_claim(dirs: dict[str, Path]) -> None:
    left_by_dra_mode(dirs, "u-1")
    claims = Claims()
    claims.items[("ns", "new")] = claim("u-2", ("r", "drawer0-book1"), name="new")
    p = preparer(dirs, claims)
    p.refuse_new = REFUSAL
    with pytest.raises(PrepareError, match=f"claim ns/new cannot be prepared: {REFUSAL}"):
        p.prepare("ns", "new", "u-2")
    assert claims.reads == 0 and set(p.claims) == {"u-1"}
    assert [d.device for d in p.prepare("ns", "u-1", "u-1").devices] == ["drawer0-book0"]  # kubelet asks again
    assert not list(dirs["cdi"].glob("*_u-2.json"))


def test_forget_drops_claims_and_their_files_and_says_which_it_holds_no_more(dirs: dict[str, Path]) -> None:
    left_by_dra_mode(dirs, "u-1", "u-2")
    p = preparer(dirs, Claims())
    told: list[int] = []
    p.on_change = lambda: told.append(len(p.claims))
    assert p.forget(["u-1", "u-gone"]) == ["u-1", "u-gone"]  # forgotten now, or never held
    assert told == [1] and set(p.claims) == {"u-2"}
    assert [c["uid"] for c in json.loads(dirs["state"].read_text())["claims"]] == ["u-2"]
    assert sorted(f.name for f in dirs["cdi"].iterdir()) == [f"{DRIVER}-book_u-2.json"]
    assert p.forget(["u-1"]) == ["u-1"] and told == [1]  # nothing changed: nobody told
    p.unprepare("u-2")  # a later unprepare writes the checkpoint without the forgotten claim
    assert json.loads(dirs["state"].read_text())["claims"] == []


def test_forget_changes_nothing_when_the_checkpoint_cannot_be_written(dirs: dict[str, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.dra.prepare as prepare

    left_by_dra_mode(dirs, "u-1")
    p = preparer(dirs, Claims())

    def full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepare, "write_atomically", full)
    assert p.forget(["u-1"]) == []
    assert set(p.claims) == {"u-1"} and list(dirs["cdi"].glob("*_u-1.json"))


# --- the plugin ---------------------------------------------------------------------------------------------
def test_without_claims_left_nothing_is_served(dirs: dict[str, Path]) -> None:
    slices = Slices()
    leftover, _ = make(dirs, slices=slices)
    leftover.start()
    try:
        assert not leftover.serving and not leftover.served and sockets(dirs) == []
        assert slices.removed == 0 and not leftover.loop.running
    finally:
        leftover.stop()


def test_it_serves_unprepare_only_then_unregisters(dirs: dict[str, Path]) -> None:
    left_by_dra_mode(dirs, "u-1", "u-2")
    claims = Claims()
    claims.items[("ns", "new")] = claim("u-3", ("r", "drawer0-book1"), name="new")
    slices = Slices()
    leftover, p = make(dirs, claims, slices)
    leftover.start()
    try:
        assert leftover.serving and slices.removed == 1  # the node's slices deleted at once
        endpoint = register(dirs)
        assert leftover.registered() and leftover.claims_left() == 2
        with grpc.insecure_channel(f"unix://{endpoint}") as ch:
            dra = dra_v1_grpc.DRAPluginStub(ch)
            answer = dra.NodePrepareResources(dra_v1.NodePrepareResourcesRequest(claims=[
                dra_v1.Claim(namespace="ns", name="new", uid="u-3"),
                dra_v1.Claim(namespace="ns", name="u-1", uid="u-1")]), timeout=5)
            assert REFUSAL in answer.claims["u-3"].error and not answer.claims["u-3"].devices
            assert answer.claims["u-1"].error == ""  # a claim it holds: answered from the checkpoint
            assert [d.device_name for d in answer.claims["u-1"].devices] == ["drawer0-book0"]
            assert claims.reads == 0
            gone = dra.NodeUnprepareResources(dra_v1.NodeUnprepareResourcesRequest(claims=[
                dra_v1.Claim(namespace="ns", name="u-1", uid="u-1")]), timeout=5)
            assert gone.claims["u-1"].error == ""
            assert set(p.claims) == {"u-2"} and not list(dirs["cdi"].glob("*_u-1.json"))
            assert leftover.claims_left() == 1 and len(sockets(dirs)) == 2  # one left: still registered
            last = dra.NodeUnprepareResources(dra_v1.NodeUnprepareResourcesRequest(claims=[
                dra_v1.Claim(namespace="ns", name="u-2", uid="u-2")]), timeout=5)
            assert last.claims["u-2"].error == ""  # answered before the plugin goes
        wait_until("the plugin unregistered", lambda: not leftover.serving and sockets(dirs) == [], 5, every=0.02)
        assert json.loads(dirs["state"].read_text())["claims"] == [] and list(dirs["cdi"].iterdir()) == []
        assert not leftover.registered() and leftover.served
    finally:
        leftover.stop()
    assert sockets(dirs) == []


def test_forgotten_claims_unregister_it_too(dirs: dict[str, Path]) -> None:
    """pod-resources dropped the claim's containers and kubelet never unprepares it: forgotten, the plugin goes."""
    left_by_dra_mode(dirs, "u-1")
    leftover, p = make(dirs)
    leftover.start()
    try:
        register(dirs)
        assert p.forget(["u-1"]) == ["u-1"]
        wait_until("the plugin unregistered", lambda: sockets(dirs) == [], 5, every=0.02)
    finally:
        leftover.stop()


def test_a_removed_registration_socket_is_served_again_and_the_slices_retried(dirs: dict[str, Path]) -> None:
    left_by_dra_mode(dirs, "u-1")
    slices = Slices(fail=1)
    leftover, _ = make(dirs, slices=slices)
    leftover.start()
    try:
        wait_until("the slices deleted after a failure", lambda: slices.removed == 1, 5, every=0.02)
        assert leftover.loop.failures >= 1
        (dirs["registry"] / f"{DRIVER}-reg.sock").unlink()  # an operator, or a kubelet, removed it
        wait_until("served again", lambda: (dirs["registry"] / f"{DRIVER}-reg.sock").exists(), 5, every=0.02)
        register(dirs)
        assert leftover.registered() and slices.removed == 1  # deleted once: nothing publishes them again
    finally:
        leftover.stop()
    assert sockets(dirs) == [] and not leftover.serving


def test_stop_removes_the_sockets_and_keeps_the_claims(dirs: dict[str, Path]) -> None:
    """The agent stops (a restart, an upgrade): the next one serves the claims left, from the same checkpoint."""
    left_by_dra_mode(dirs, "u-1")
    leftover, _ = make(dirs)
    leftover.start()
    assert len(sockets(dirs)) == 2
    leftover.stop()
    assert sockets(dirs) == []
    assert [c["uid"] for c in json.loads(dirs["state"].read_text())["claims"]] == ["u-1"]
    again, _ = make(dirs)
    again.start()
    try:
        assert again.serving and again.claims_left() == 1
    finally:
        again.stop()


def test_without_api_access_it_serves_all_the_same(dirs: dict[str, Path]) -> None:
    left_by_dra_mode(dirs, "u-1")
    leftover, _ = make(dirs, slices=None)
    leftover.start()
    try:
        assert leftover.slices_cleared and leftover.serving
        register(dirs)
        assert leftover.registered()
    finally:
        leftover.stop()


def test_a_plugin_that_cannot_be_served_is_retried_and_the_agent_goes_on(dirs: dict[str, Path]) -> None:
    """Its directory unusable (a file in its place; on a host, a denial): said, retried with backoff, served once it
    can be; nothing raises into the agent's start."""
    left_by_dra_mode(dirs, "u-1")
    dirs["registry"].parent.mkdir(parents=True, exist_ok=True)
    dirs["registry"].write_text("not a directory")
    leftover, _ = make(dirs)
    leftover.start()
    try:
        assert leftover.wanted and not leftover.serving and leftover.loop.failures == 1 and sockets(dirs) == []
        assert leftover.claims_left() == 1
        dirs["registry"].unlink()
        wait_until("served once it can be", lambda: leftover.serving and len(sockets(dirs)) == 2, 5, every=0.02)
        register(dirs)
        assert leftover.registered()
    finally:
        leftover.stop()


def test_a_forbidden_slice_deletion_is_said_once_and_not_retried(dirs: dict[str, Path]) -> None:
    """Without the chart's RBAC for it (no node-restriction policy), the plugin serves all the same."""
    left_by_dra_mode(dirs, "u-1")
    slices = Slices(fail=5, status=403)
    leftover, _ = make(dirs, slices=slices)
    leftover.start()
    try:
        assert leftover.serving and leftover.slices_cleared and slices.calls == 1 and leftover.loop.failures == 0
        leftover.step()
        assert slices.calls == 1
    finally:
        leftover.stop()
