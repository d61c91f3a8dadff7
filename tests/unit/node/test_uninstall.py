"""The uninstall (docs/admin/upgrade-uninstall.md): a stopping agent keeps everything unless its DaemonSet is
being deleted; then it removes its state files, the seccomp profile and its node's labels. The pre-delete hook
deletes the DaemonSet in the foreground, waits, and removes what nodes without an agent still carry."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.errors import KubeApiError
from agent.node.cleanup import (
    cleanup_if_released,
    remove_seccomp_profile,
    remove_state_files,
    run_uninstall_hook,
)
from agent.node.kubeapi import LeanKubeApi, NodeRow
from agent.node.seccomp import PROFILE_NAME, profile
from agent.policy.teardown import (
    label_selector,
    leftover_nodes,
    parse_label_selector,
    release_deleted,
    removal_patch,
)
from tests.support.env import REPO
from tests.support.kubeapi import ANNOTATIONS, OURS, PREFIX, THEIRS, UninstallApi, uninstall_node, write_state_files
from topology_devkit.testing.apiserver import FakeApiServer, Request


# ------------------------------------------------------------------------------------------------ the pure core
def test_only_a_daemonset_gone_or_marked_for_deletion_means_the_release_is_deleted() -> None:
    assert release_deleted(None)
    assert release_deleted({"metadata": {"name": "a", "deletionTimestamp": "2026-12-01T20:00:00Z"}})
    assert not release_deleted({"metadata": {"name": "a"}})  # a rolling update: the DaemonSet is there
    assert not release_deleted({"metadata": "junk"})
    assert not release_deleted({})


def test_the_removal_patch_names_only_our_keys() -> None:
    patch = removal_patch({**OURS, **THEIRS}, ANNOTATIONS, PREFIX)
    assert patch == {"metadata": {"labels": {f"{PREFIX}advertised": None, f"{PREFIX}books": None},
                                  "annotations": {f"{PREFIX}topology": None}}}
    assert removal_patch(THEIRS, {"other": "x"}, PREFIX) is None


def test_leftover_nodes_are_those_still_carrying_our_keys() -> None:
    nodes = [("b", dict(OURS), {}), ("a", {}, {f"{PREFIX}topology": "{}"}), ("c", dict(THEIRS), {})]
    assert [name for name, _ in leftover_nodes(nodes, PREFIX)] == ["a", "b"]


def test_label_selectors_round_trip_and_bad_items_are_named() -> None:
    assert label_selector({"kubernetes.io/arch": "s390x", "a": "b"}) == "a=b,kubernetes.io/arch=s390x"
    assert parse_label_selector("a=b, kubernetes.io/arch=s390x") == {"a": "b", "kubernetes.io/arch": "s390x"}
    assert parse_label_selector("") == {}
    with pytest.raises(ValueError, match="'foo' is not key=value"):
        parse_label_selector("a=b,foo")


# ------------------------------------------------------------------------------------------------ the files


def test_state_files_of_our_prefix_go_and_the_directory_once_empty(tmp_path: Path) -> None:
    ours = write_state_files(tmp_path)
    (tmp_path / "s390x-topology-agent" / "groups.json").write_text("{}")  # the layout before per-prefix directories
    (tmp_path / "kubelet_internal_checkpoint").write_text("kubelet's")
    removed = remove_state_files(tmp_path, "topology", dra=False)
    assert not ours.exists() and not (tmp_path / "s390x-topology-agent").exists()
    assert str(ours) in removed
    assert (tmp_path / "kubelet_internal_checkpoint").read_text() == "kubelet's"


def test_another_prefix_keeps_its_state(tmp_path: Path) -> None:
    write_state_files(tmp_path)
    other = write_state_files(tmp_path, "other.example")
    remove_state_files(tmp_path, "topology", dra=False)
    assert not (tmp_path / "s390x-topology-agent" / "topology").exists()
    assert (other / "holds.json").exists()


def test_dra_claims_go_in_dra_mode_only(tmp_path: Path) -> None:
    claims = tmp_path / "s390x-topology-agent" / "dra"
    claims.mkdir(parents=True)
    (claims / "claims.json").write_text("{}")
    remove_state_files(tmp_path, "topology", dra=False)
    assert (claims / "claims.json").exists()
    remove_state_files(tmp_path, "topology", dra=True)
    assert not (tmp_path / "s390x-topology-agent").exists()


def test_the_seccomp_profile_goes_only_when_it_is_ours(tmp_path: Path) -> None:
    target = tmp_path / PROFILE_NAME
    assert not remove_seccomp_profile(tmp_path, "amd64")  # none there
    target.write_bytes(profile("amd64"))
    assert remove_seccomp_profile(tmp_path, "amd64") and not target.exists()
    target.write_text('{"defaultAction": "SCMP_ACT_ALLOW"}')  # an administrator's own
    assert not remove_seccomp_profile(tmp_path, "amd64") and target.exists()


# ------------------------------------------------------------------------------------------------ the agent's cleanup


def _clean(api: UninstallApi, kubelet_dir: Path, seccomp: Path | None) -> bool:
    return cleanup_if_released(api, namespace="topology-system", daemonset="agent", node_name="n1",
                               kubelet_dir=kubelet_dir, resource_prefix="topology", dra=False, seccomp_dir=seccomp,
                               node_labels=True)


@pytest.fixture()
def node_files(tmp_path: Path) -> tuple[Path, Path]:
    kubelet_dir, seccomp = tmp_path / "device-plugins", tmp_path / "profiles"
    write_state_files(kubelet_dir)
    seccomp.mkdir()
    (seccomp / PROFILE_NAME).write_bytes(profile(platform.machine()))
    return kubelet_dir, seccomp


def test_a_plain_sigterm_keeps_everything(node_files: tuple[Path, Path]) -> None:
    """A rolling update: the DaemonSet is there, not marked: holds, labels and profile stay."""
    kubelet_dir, seccomp = node_files
    api = UninstallApi({"metadata": {"name": "agent"}}, uninstall_node())
    assert not _clean(api, kubelet_dir, seccomp)
    assert (kubelet_dir / "s390x-topology-agent" / "topology" / "holds.json").exists()
    assert (seccomp / PROFILE_NAME).exists()
    assert api.patches == []


@pytest.mark.parametrize("failure", [KubeApiError(403, "forbidden"), TimeoutError("no answer"),
                                     ConnectionRefusedError("refused")])
def test_any_doubt_keeps_everything(node_files: tuple[Path, Path], failure: Exception,
                                    caplog: pytest.LogCaptureFixture) -> None:
    kubelet_dir, seccomp = node_files
    api = UninstallApi(failure, uninstall_node())
    assert not _clean(api, kubelet_dir, seccomp)
    assert (kubelet_dir / "s390x-topology-agent" / "topology" / "holds.json").exists()
    assert api.patches == []
    assert "cannot tell whether DaemonSet topology-system/agent is being deleted" in caplog.text


@pytest.mark.parametrize("daemonset", [None, {"metadata": {"name": "agent", "deletionTimestamp": "now"}}])
def test_a_deleted_daemonset_cleans_the_node(node_files: tuple[Path, Path], daemonset: dict[str, Any] | None) -> None:
    kubelet_dir, seccomp = node_files
    api = UninstallApi(daemonset, uninstall_node())
    assert _clean(api, kubelet_dir, seccomp)
    assert not (kubelet_dir / "s390x-topology-agent").exists()
    assert not (seccomp / PROFILE_NAME).exists()
    assert api.nodes["n1"] == (THEIRS, {"node.alpha.kubernetes.io/ttl": "0"})


# ------------------------------------------------------------------------------------------------ the hook
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _hook(api: UninstallApi, timeout: float = 30) -> tuple[int, list[str]]:
    lines: list[str] = []
    clock = Clock()
    code = run_uninstall_hook(api, namespace="ns", daemonset="agent", node_selector={"kubernetes.io/arch": "s390x"},
                              timeout=timeout, say=lines.append, clock=clock, sleep=clock.sleep)
    return code, lines


def test_the_hook_waits_for_the_agents_then_cleans_only_the_nodes_they_left() -> None:
    nodes: list[NodeRow] = [("clean", dict(THEIRS), {}), ("down", {**OURS, **THEIRS}, dict(ANNOTATIONS)),
                            ("amd64", {**OURS, "kubernetes.io/arch": "amd64"}, {})]
    api = UninstallApi({"metadata": {"name": "agent"}}, nodes, gone_after=3)
    code, lines = _hook(api)
    assert code == 0
    assert api.deleted and api.gone_after == 0
    assert [name for name, _ in api.patches] == ["down"]  # not the node outside the selector
    assert api.nodes["down"] == (THEIRS, {"node.alpha.kubernetes.io/ttl": "0"})
    assert any("node down: its agent did not clean up" in line for line in lines), lines
    assert lines[-1] == "uninstall: done: 2 node(s) looked at, 1 cleaned by the hook"


def test_a_node_that_never_lets_go_does_not_block_the_uninstall() -> None:
    api = UninstallApi({"metadata": {"name": "agent"}}, uninstall_node(), gone_after=10**6)
    code, lines = _hook(api, timeout=5)
    assert code == 0
    assert any("still has pods after 5 s" in line for line in lines), lines
    assert [name for name, _ in api.patches] == ["n1"]


def test_the_hook_fails_when_it_cannot_delete() -> None:
    api = UninstallApi({"metadata": {"name": "agent"}}, uninstall_node())
    api.delete_error = KubeApiError(403, "forbidden")
    code, lines = _hook(api)
    assert code == 1
    assert lines == ["uninstall: cannot delete DaemonSet ns/agent: the API server answered 403: forbidden"]


def test_an_already_deleted_daemonset_still_cleans_the_labels() -> None:
    api = UninstallApi(None, uninstall_node())
    code, lines = _hook(api)
    assert code == 0 and lines[0] == "uninstall: DaemonSet ns/agent is already gone"
    assert [name for name, _ in api.patches] == ["n1"]


# ------------------------------------------------------------------------------------------------ the HTTP calls
def _answer(request: Request) -> tuple[int, Any]:
    """A DaemonSet "agent" (and none "gone") in namespace ns, and two pages of Nodes."""
    target = request.target
    if request.method == "DELETE":
        if target.endswith("/gone"):
            return 404, {"kind": "Status", "message": "not found"}
        return 200, {"kind": "DaemonSet"}
    if target.endswith("/daemonsets/gone"):
        return 404, {"kind": "Status", "message": 'daemonsets.apps "gone" not found'}
    if target.startswith("/apis/apps/v1/namespaces/ns/daemonsets/"):
        return 200, {"metadata": {"name": "agent"}}
    if "continue=page2" in target:
        return 200, {"items": [{"metadata": {"name": "n2", "labels": {"a": "b"}}}], "metadata": {}}
    return 200, {"items": [{"metadata": {"name": "n1", "annotations": {"x": "y"}}}], "metadata": {"continue": "page2"}}


@pytest.fixture()
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(_answer) as api:
        yield api


def test_the_requests_on_the_wire(server: FakeApiServer) -> None:
    client = LeanKubeApi(server.url, retries=0)
    assert client.get_daemonset("ns", "agent", 5) == {"metadata": {"name": "agent"}}
    assert client.get_daemonset("ns", "gone", 5) is None
    assert client.delete_daemonset_foreground("ns", "agent", 5)
    assert not client.delete_daemonset_foreground("ns", "gone", 5)
    rows = client.list_nodes("kubernetes.io/arch=s390x", 5)
    assert rows == [("n1", {}, {"x": "y"}), ("n2", {"a": "b"}, {})]
    seen = server.requests
    assert (seen[2].method, seen[2].target) == ("DELETE", "/apis/apps/v1/namespaces/ns/daemonsets/agent")
    assert json.loads(seen[2].body)["propagationPolicy"] == "Foreground"
    assert seen[4].target == "/api/v1/nodes?limit=500&labelSelector=kubernetes.io%2Farch%3Ds390x"
    assert "continue=page2" in seen[5].target


# ------------------------------------------------------------------------------------------------ the command line
@pytest.mark.parametrize(("argv", "message"), [
    (["uninstall", "--daemonset", "a", "--namespace", "n", "--node-selector", "foo"],
     "topology-agent: error: --node-selector: 'foo' is not key=value"),
    (["uninstall", "--daemonset", "a", "--namespace", "n", "--timeout", "soon"],
     "topology-agent: error: --timeout: expected seconds, got 'soon'"),
    (["uninstall", "--daemonset", "a", "--namespace", "n"],
     "topology-agent: error: uninstall runs in a pod of the cluster: KUBERNETES_SERVICE_HOST/PORT are not set "
     "(not running in a pod)"),
])
def test_bad_uninstall_input_is_one_line_and_exit_2(argv: list[str], message: str) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "agent", *argv], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip() == message
