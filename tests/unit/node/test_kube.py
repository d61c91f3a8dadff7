"""NodeLabeler against kmock's Kubernetes emulator over real HTTP: the exact requests it sends.

The Node API client is synchronous and kmock serves on the test's event loop, so every sync runs in
a worker thread (``asyncio.to_thread``), as the agent does it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from kmock import action as Action
from kubernetes.config import incluster_config, kube_config

from agent.errors import NodeLabelerError
from agent.node.kubeapi import LeanKubeApi
from agent.node.labeler import MERGE_PATCH, NodeLabeler
from agent.node.labels import KEY_PREFIX, TOPOLOGY_ANNOTATION, node_annotations, node_labels
from agent.policy.grouping import group_topology
from agent.topology.embedded import load_embedded

NODE = "s390x-worker-1"
NODES = "v1/nodes"
NODE_PATH = f"/api/v1/nodes/{NODE}"
LOGGER = "topology-agent.node"
P = KEY_PREFIX

LABELS = {f"{P}machine": "z16", f"{P}books": "8", f"{P}fidelity": "lpar"}
ANNOTATIONS = {TOPOLOGY_ANNOTATION: '{"version":1}'}

FORBIDDEN: dict[str, Any] = {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": f'nodes "{NODE}" is forbidden: User "system:serviceaccount:kube-system:topology-agent" '
               'cannot patch resource "nodes" in API group "" at the cluster scope',
}


def _node(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "labels": {"kubernetes.io/hostname": NODE, "kubernetes.io/arch": "s390x", **(labels or {})},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
        },
    }


@pytest.fixture()
def api_factory() -> Iterator[Any]:
    def make(url: str) -> LeanKubeApi:
        return LeanKubeApi(url.rstrip("/"))  # what the agent uses in a pod, over plain HTTP here

    yield make


@pytest.fixture()
def labeler(kmock: kmock.KubernetesEmulator, api_factory: Any) -> NodeLabeler:
    kmock.objects[NODES, None, NODE] = _node(labels={f"{P}stale": "gone-soon", f"{P}books": "4"},
                                             annotations={"example.com/other": "keep"})
    return NodeLabeler(NODE, api_factory(str(kmock.url)))


async def _sync(labeler: NodeLabeler, labels: dict[str, str], annotations: dict[str, str]) -> bool:
    return await asyncio.to_thread(labeler.sync, labels, annotations)


def _requests(mock: kmock.KubernetesEmulator) -> list[kmock.Request]:
    return list(mock)


def _stored(mock: kmock.KubernetesEmulator) -> dict[str, Any]:
    return dict(mock.objects[NODES, None, NODE].raw["metadata"])


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def _next(view: Any) -> Any:
    """A kmock view that matches only the next request of ``view``."""
    seen = len(view)
    return view[seen:seen + 1]


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.asyncio
async def test_first_sync_gets_then_patches_only_our_keys(kmock: kmock.KubernetesEmulator,
                                                         labeler: NodeLabeler) -> None:
    assert await _sync(labeler, LABELS, ANNOTATIONS) is True

    get, patch = _requests(kmock)
    assert (get.method, get.url.path, get.action) == ("GET", NODE_PATH, Action.FETCH)
    assert (patch.method, patch.url.path, patch.action) == ("PATCH", NODE_PATH, Action.UPDATE)
    assert patch.headers["Content-Type"] == MERGE_PATCH
    assert patch.params == {}
    assert patch.data == {"metadata": {
        "labels": {f"{P}books": "8", f"{P}fidelity": "lpar", f"{P}machine": "z16", f"{P}stale": None},
        "annotations": ANNOTATIONS,
    }}
    # kmock applied it like a merge patch: our keys as desired, everybody else's untouched.
    meta = _stored(kmock)
    assert meta["labels"] == {"kubernetes.io/hostname": NODE, "kubernetes.io/arch": "s390x", **LABELS}
    assert meta["annotations"] == {"node.alpha.kubernetes.io/ttl": "0", "example.com/other": "keep", **ANNOTATIONS}
    assert (labeler.patches, labeler.failures) == (1, 0)


@pytest.mark.asyncio
async def test_steady_state_sends_nothing(kmock: kmock.KubernetesEmulator, labeler: NodeLabeler) -> None:
    assert await _sync(labeler, LABELS, ANNOTATIONS)
    before = len(kmock)
    for _ in range(3):
        assert await _sync(labeler, dict(LABELS), dict(ANNOTATIONS)) is True
    assert len(kmock) == before == 2
    assert labeler.patches == 1


@pytest.mark.asyncio
async def test_a_changed_label_is_one_patch_with_that_key(kmock: kmock.KubernetesEmulator,
                                                         labeler: NodeLabeler) -> None:
    assert await _sync(labeler, LABELS, ANNOTATIONS)
    before = len(kmock)
    assert await _sync(labeler, {**LABELS, f"{P}books": "7"}, ANNOTATIONS)

    new = _requests(kmock)[before:]
    assert [(r.method, r.url.path) for r in new] == [("PATCH", NODE_PATH)]
    assert new[0].headers["Content-Type"] == MERGE_PATCH
    assert new[0].data == {"metadata": {"labels": {f"{P}books": "7"}}}
    assert _stored(kmock)["labels"][f"{P}books"] == "7"
    assert labeler.patches == 2


@pytest.mark.asyncio
async def test_a_removed_key_is_sent_as_null(kmock: kmock.KubernetesEmulator, labeler: NodeLabeler) -> None:
    assert await _sync(labeler, LABELS, ANNOTATIONS)
    before = len(kmock)
    smaller = {k: v for k, v in LABELS.items() if k != f"{P}fidelity"}
    assert await _sync(labeler, smaller, {})

    new = _requests(kmock)[before:]
    assert [(r.method, r.url.path) for r in new] == [("PATCH", NODE_PATH)]
    assert new[0].data == {"metadata": {"labels": {f"{P}fidelity": None},
                                        "annotations": {TOPOLOGY_ANNOTATION: None}}}
    meta = _stored(kmock)
    assert f"{P}fidelity" not in meta["labels"]
    assert meta["annotations"] == {"node.alpha.kubernetes.io/ttl": "0", "example.com/other": "keep"}


@pytest.mark.asyncio
async def test_node_already_labelled_needs_only_the_get(kmock: kmock.KubernetesEmulator, api_factory: Any) -> None:
    # An agent restart on a node it labelled before: one GET, no write.
    kmock.objects[NODES, None, NODE] = _node(labels=LABELS, annotations=ANNOTATIONS)
    labeler = NodeLabeler(NODE, api_factory(str(kmock.url)))
    assert await _sync(labeler, LABELS, ANNOTATIONS) is True
    assert [(r.method, r.url.path) for r in _requests(kmock)] == [("GET", NODE_PATH)]
    assert labeler.patches == 0


@pytest.mark.asyncio
async def test_real_labels_and_annotation_round_trip(kmock: kmock.KubernetesEmulator, labeler: NodeLabeler) -> None:
    topology = load_embedded("z16-lpar")
    grouping = group_topology(topology)
    labels = node_labels(topology, grouping, "none")
    annotations = node_annotations(topology, grouping)
    assert await _sync(labeler, labels, annotations)
    meta = _stored(kmock)
    assert {k: v for k, v in meta["labels"].items() if k.startswith(P)} == labels
    assert meta["annotations"][TOPOLOGY_ANNOTATION] == annotations[TOPOLOGY_ANNOTATION]


@pytest.mark.asyncio
async def test_patch_forbidden_warns_once_and_retries(kmock: kmock.KubernetesEmulator, labeler: NodeLabeler,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    _next(kmock["patch", NODE_PATH]) << 403 << FORBIDDEN

    assert await _sync(labeler, LABELS, ANNOTATIONS) is False  # no exception
    assert [(r.method, r.url.path) for r in _requests(kmock)] == [("GET", NODE_PATH), ("PATCH", NODE_PATH)]
    (warning,) = _warnings(caplog)
    assert "403" in warning.getMessage() and "RBAC" in warning.getMessage()
    assert "cannot patch resource" in warning.getMessage()  # the API server's own words
    assert warning.exc_info is None
    assert (labeler.patches, labeler.failures) == (0, 1)
    assert labeler.last_error is not None and "PATCH" in labeler.last_error

    # kmock quirk: its emulator applies a PATCH to the stored object even when a reaction answers
    # 403 (a real API server would not). Put the node back the way a denied patch leaves it.
    assert _stored(kmock)["labels"][f"{P}machine"] == "z16"
    kmock.objects[NODES, None, NODE] = _node(labels={f"{P}stale": "gone-soon", f"{P}books": "4"})

    # The next sync does not trust its memory: GET again, then PATCH, which now succeeds.
    before = len(kmock)
    assert await _sync(labeler, LABELS, ANNOTATIONS) is True
    assert [(r.method, r.url.path) for r in _requests(kmock)[before:]] == [("GET", NODE_PATH), ("PATCH", NODE_PATH)]
    assert (labeler.patches, labeler.failures) == (1, 1)
    assert labeler.last_error is None
    assert any(r.levelno == logging.INFO and "synced again" in r.getMessage() for r in caplog.records)
    assert _stored(kmock)["labels"][f"{P}machine"] == "z16"


@pytest.mark.asyncio
async def test_get_forbidden(kmock: kmock.KubernetesEmulator, labeler: NodeLabeler,
                             caplog: pytest.LogCaptureFixture) -> None:
    _next(kmock["get", NODE_PATH]) << 403 << {**FORBIDDEN, "message": "cannot get resource nodes"}
    assert await _sync(labeler, LABELS, ANNOTATIONS) is False
    assert [(r.method, r.url.path) for r in _requests(kmock)] == [("GET", NODE_PATH)]  # no blind PATCH
    (warning,) = _warnings(caplog)
    assert "GET node" in warning.getMessage() and "403" in warning.getMessage()
    assert labeler.failures == 1


@pytest.mark.asyncio
async def test_node_missing(kmock: kmock.KubernetesEmulator, api_factory: Any,
                            caplog: pytest.LogCaptureFixture) -> None:
    labeler = NodeLabeler("no-such-node", api_factory(str(kmock.url)))
    assert await _sync(labeler, LABELS, ANNOTATIONS) is False
    assert [(r.method, r.url.path) for r in _requests(kmock)] == [("GET", "/api/v1/nodes/no-such-node")]
    (warning,) = _warnings(caplog)
    assert "404" in warning.getMessage() and "no-such-node" in warning.getMessage()
    assert (labeler.patches, labeler.failures) == (0, 1)


@pytest.mark.asyncio
async def test_same_failure_again_is_not_repeated(kmock: kmock.KubernetesEmulator, api_factory: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    labeler = NodeLabeler("no-such-node", api_factory(str(kmock.url)))
    for _ in range(3):
        assert await _sync(labeler, LABELS, ANNOTATIONS) is False
    assert len(_warnings(caplog)) == 1  # one warning for a streak of identical failures
    assert labeler.failures == 3
    assert [r.method for r in _requests(kmock)] == ["GET"] * 3  # but every sync retried


@pytest.mark.asyncio
async def test_unreachable_api_server(api_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    labeler = NodeLabeler(NODE, api_factory(f"http://127.0.0.1:{_closed_port()}"))
    assert await _sync(labeler, LABELS, ANNOTATIONS) is False
    (warning,) = _warnings(caplog)
    assert "unreachable" in warning.getMessage()
    assert (labeler.patches, labeler.failures) == (0, 1)


@pytest.mark.asyncio
async def test_api_server_timeout(kmock: kmock.KubernetesEmulator, api_factory: Any,
                                  caplog: pytest.LogCaptureFixture) -> None:
    kmock.objects[NODES, None, NODE] = _node()
    release = asyncio.Event()

    async def hang() -> dict[str, Any]:
        await release.wait()
        return {}

    kmock["get", NODE_PATH] << hang
    labeler = NodeLabeler(NODE, api_factory(str(kmock.url)), request_timeout=0.2)
    try:
        assert await _sync(labeler, LABELS, ANNOTATIONS) is False
    finally:
        release.set()
    (warning,) = _warnings(caplog)
    assert "timed out after 0.2s" in warning.getMessage()
    assert [r.method for r in _requests(kmock)] == ["GET", "GET"]  # the one retry of from_environment's config
    assert labeler.failures == 1


def test_foreign_keys_are_refused() -> None:
    labeler = NodeLabeler(NODE, LeanKubeApi("http://127.0.0.1:9"))
    with pytest.raises(ValueError, match=re.escape("kubernetes.io/arch")):
        labeler.sync({"kubernetes.io/arch": "s390x"}, {})
    with pytest.raises(ValueError, match="node name"):
        NodeLabeler("", labeler.api)


@pytest.mark.asyncio
async def test_in_a_pod_the_service_account_token_is_read_for_every_request(
        kmock: kmock.KubernetesEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kmock.objects[NODES, None, NODE] = _node()
    (tmp_path / "token").write_text("first\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(kmock.url.port))
    api = LeanKubeApi.in_cluster(tmp_path)
    assert (api.scheme, api.host, api.port) == ("https", "127.0.0.1", kmock.url.port)
    plain = LeanKubeApi(str(kmock.url).rstrip("/"), token_file=tmp_path / "token")  # kmock speaks HTTP
    labeler = NodeLabeler(NODE, plain)
    assert await _sync(labeler, LABELS, {}) is True
    (tmp_path / "token").write_text("rotated\n")  # kubelet rotates bound tokens
    labeler.invalidate()
    assert await _sync(labeler, {**LABELS, f"{P}books": "7"}, {}) is True
    tokens = [r.headers["Authorization"] for r in _requests(kmock)]
    assert tokens[:2] == ["Bearer first"] * 2 and tokens[2:] == ["Bearer rotated"] * 2
    (tmp_path / "token").unlink()  # the token gone: said as such, not as an unreachable API server
    labeler.invalidate()
    assert await _sync(labeler, {**LABELS, f"{P}books": "8"}, {}) is False
    assert labeler.last_error is not None and "cannot read the service account token" in labeler.last_error
    assert "unreachable" not in labeler.last_error


def test_in_cluster_needs_the_service_environment_and_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(NodeLabelerError, match="not running in a pod"):
        LeanKubeApi.in_cluster(tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(NodeLabelerError, match="no service account token"):
        LeanKubeApi.in_cluster(tmp_path)
    (tmp_path / "token").write_text("t")
    assert LeanKubeApi.in_cluster(tmp_path).host == "fd00::1"  # an IPv6 service address


@pytest.mark.asyncio
async def test_from_environment_uses_the_kubeconfig_outside_a_cluster(
        kmock: kmock.KubernetesEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kmock.objects[NODES, None, NODE] = _node()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{str(kmock.url).rstrip('/')}'}}}}]\n"
        "users: [{name: agent, user: {token: abc}}]\n"
        "contexts: [{name: test, context: {cluster: kmock, user: agent}}]\n")
    monkeypatch.delenv(incluster_config.SERVICE_HOST_ENV_NAME, raising=False)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))

    labeler = NodeLabeler.from_environment(NODE)
    assert await _sync(labeler, LABELS, ANNOTATIONS) is True
    get, patch = _requests(kmock)
    assert get.headers["Authorization"] == "Bearer abc"
    assert (patch.method, patch.headers["Content-Type"]) == ("PATCH", MERGE_PATCH)


def test_from_environment_without_any_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(incluster_config.SERVICE_HOST_ENV_NAME, raising=False)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "absent"))
    with pytest.raises(NodeLabelerError, match="not running in a cluster"):
        NodeLabeler.from_environment(NODE)
