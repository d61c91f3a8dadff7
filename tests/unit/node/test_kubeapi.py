"""DRA mode's calls of agent/node/kubeapi.py against a small HTTP API server, through both transports (the lean
one of a pod, the kubernetes package's of a kubeconfig): the paths, queries and bodies sent for ResourceSlices, Nodes
and ResourceClaims; pagination; errors with their status and message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.errors import KubeApiError
from agent.node.kubeapi import KubeApi, LeanKubeApi, kubeconfig_api
from topology_devkit.testing.apiserver import FakeApiServer, Request

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class Server(FakeApiServer):
    """Pages of ResourceSlices, a create that conflicts, replaces and deletes that succeed, one Node."""

    def __init__(self) -> None:
        self.authorization: set[str | None] = set()
        super().__init__(self.answer)

    @property
    def seen(self) -> list[tuple[str, str, dict[str, list[str]], Any]]:
        """(method, path, query, JSON body) of every request so far."""
        return [(r.method, r.path, r.query, r.json()) for r in self.requests]

    def answer(self, request: Request) -> tuple[int, Any]:
        self.authorization.add(request.headers.get("Authorization"))
        path, method = request.path, request.method
        if path == SLICES and method == "GET":
            page = request.query.get("continue", ["0"])[0]
            items = [{"metadata": {"name": f"s{page}"}}]
            meta = {"continue": "1"} if page == "0" else {}
            return 200, {"kind": "ResourceSliceList", "items": items, "metadata": meta}
        if path == SLICES and method == "POST":
            return 409, {"kind": "Status", "status": "Failure", "code": 409, "reason": "AlreadyExists",
                         "message": 'resourceslices "x" already exists'}
        if path.startswith(SLICES + "/") and method in ("PUT", "DELETE"):
            return 200, request.json() or {"kind": "Status"}
        if path == "/api/v1/nodes/node-a":
            return 200, {"metadata": {"name": "node-a", "uid": "1234"}}
        return 404, {"kind": "Status", "code": 404, "message": f"{path} not found"}


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


@pytest.fixture(params=["lean", "kubeconfig"])
def api(request: pytest.FixtureRequest, server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KubeApi:
    if request.param == "lean":
        return LeanKubeApi(server.url, retries=0)
    kube_config = pytest.importorskip("kubernetes.config.kube_config")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server.url}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    return kubeconfig_api()


def test_list_pages_through_with_the_field_selector(api: KubeApi, server: Server) -> None:
    assert [o["metadata"]["name"] for o in api.list_slices("node-a", "topology.s390x.ibm.com")] == ["s0", "s1"]
    (_, _, first, _), (_, _, second, _) = server.seen
    assert first["fieldSelector"] == ["spec.nodeName=node-a,spec.driver=topology.s390x.ibm.com"]
    assert first["limit"] == ["100"] and "continue" not in first
    assert second["continue"] == ["1"]


def test_writes_and_errors(api: KubeApi, server: Server) -> None:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "x", "resourceVersion": "7", "annotations": {"a/b": "c"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "1234",
                                              "controller": True}]},
            "spec": {"driver": "d.example.com", "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 2, "resourceSliceCount": 1},
                     "devices": [{"name": "book0", "attributes": {"cores": {"int": 6}},
                                  "capacity": {"cores": {"value": "6"}},
                                  "consumesCounters": [{"counterSet": "drawer0",
                                                        "counters": {"book0-socket0": {"value": "6"}}}]}]}}
    with pytest.raises(KubeApiError) as info:
        api.create_slice(body)
    assert info.value.conflict and "already exists" in str(info.value)
    api.replace_slice("x", body)
    method, path, query, sent = server.seen[-1]
    assert (method, path) == ("PUT", SLICES + "/x") and query["fieldManager"] == ["topology-agent"]
    assert sent == body  # exactly what the publisher built
    api.delete_slice("x", "7")
    method, path, _, sent = server.seen[-1]
    assert (method, path) == ("DELETE", SLICES + "/x")
    assert sent["preconditions"] == {"resourceVersion": "7"}
    assert api.node_uid("node-a") == "1234"
    with pytest.raises(KubeApiError) as info:
        api.read_claim("ns", "c")
    assert info.value.not_found
    assert server.seen[-1][1] == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    assert server.authorization == ({None} if isinstance(api, LeanKubeApi) else {"Bearer t"})  # the kubeconfig's
