"""DRA mode's calls of agent/node/kubeapi.py against a small HTTP API server, through both transports (the lean
one of a pod, the kubernetes package's of a kubeconfig): the paths, queries and bodies sent for ResourceSlices, Nodes
and ResourceClaims; pagination; errors with their status and message."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from agent.errors import KubeApiError
from agent.node.kubeapi import KubeApi, LeanKubeApi, kubeconfig_api

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class Server:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self.authorization: set[str | None] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                outer.requests.append((self.command, url.path, query, body))
                outer.authorization.add(self.headers.get("Authorization"))
                if url.path == SLICES and self.command == "GET":
                    page = query.get("continue", ["0"])[0]
                    items = [{"metadata": {"name": f"s{page}"}}]
                    meta = {"continue": "1"} if page == "0" else {}
                    return self._answer(200, {"kind": "ResourceSliceList", "items": items, "metadata": meta})
                if url.path == SLICES and self.command == "POST":
                    return self._answer(409, {"kind": "Status", "status": "Failure", "code": 409, "reason":
                                              "AlreadyExists", "message": 'resourceslices "x" already exists'})
                if url.path.startswith(SLICES + "/") and self.command in ("PUT", "DELETE"):
                    return self._answer(200, body or {"kind": "Status"})
                if url.path == "/api/v1/nodes/node-a":
                    return self._answer(200, {"metadata": {"name": "node-a", "uid": "1234"}})
                return self._answer(404, {"kind": "Status", "code": 404, "message": f"{url.path} not found"})

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()


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
    (_, _, first, _), (_, _, second, _) = server.requests
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
    method, path, query, sent = server.requests[-1]
    assert (method, path) == ("PUT", SLICES + "/x") and query["fieldManager"] == ["topology-agent"]
    assert sent == body  # exactly what the publisher built
    api.delete_slice("x", "7")
    method, path, _, sent = server.requests[-1]
    assert (method, path) == ("DELETE", SLICES + "/x")
    assert sent["preconditions"] == {"resourceVersion": "7"}
    assert api.node_uid("node-a") == "1234"
    with pytest.raises(KubeApiError) as info:
        api.read_claim("ns", "c")
    assert info.value.not_found
    assert server.requests[-1][1] == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    assert server.authorization == ({None} if isinstance(api, LeanKubeApi) else {"Bearer t"})  # the kubeconfig's
