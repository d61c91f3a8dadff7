"""A node that advertises nothing says why on the Node: a label, the annotation, one Warning Event."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from agent.errors import KubeApiError
from agent.node.kubeapi import LeanKubeApi
from agent.node.labeler import NodeLabeler
from agent.node.labels import LABEL_ADVERTISED, TOPOLOGY_ANNOTATION, node_event
from agent.node.reporter import NodeReporter
from agent.policy.grouping import group_topology
from agent.topology.embedded import load_embedded
from agent.topology.model import Cpu, Machine, Topology
from topology_devkit.testing.apiserver import FakeApiServer, Request


class FakeApi:
    def __init__(self, refuse_events: bool = False) -> None:
        self.labels: dict[str, str] = {}
        self.annotations: dict[str, str] = {}
        self.events: list[tuple[str, Mapping[str, Any]]] = []
        self.refuse_events = refuse_events

    def node_metadata(self, name: str, timeout: float) -> tuple[dict[str, str], dict[str, str]]:
        return dict(self.labels), dict(self.annotations)

    def patch_node(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        for key, value in body["metadata"].get("labels", {}).items():
            self.labels[key] = value
        for key, value in body["metadata"].get("annotations", {}).items():
            self.annotations[key] = value

    def create_event(self, namespace: str, body: Mapping[str, Any], timeout: float) -> None:
        if self.refuse_events:
            raise KubeApiError(403, 'events is forbidden: cannot create resource "events"')
        self.events.append((namespace, body))


def reporter(topology: Topology, api: FakeApi) -> NodeReporter:
    return NodeReporter(topology, group_topology(topology), node_name="z1", labels_enabled=True,
                        cpu_manager_state=None, kubelet_config=None,
                        labeler_factory=lambda name: NodeLabeler(name, api))


def test_a_guest_without_topology_says_why_on_the_node_once() -> None:
    api = FakeApi()
    r = reporter(load_embedded("z16-guest-no-topology"), api)
    assert r.sync_labels() and r.sync_labels()
    assert api.labels[LABEL_ADVERTISED] == "no-topology-facility"
    assert json.loads(api.annotations[TOPOLOGY_ANNOTATION])["notAdvertised"]["code"] == "no-topology-facility"
    ((namespace, event),) = api.events  # once per start, not per sync
    assert namespace == "default" and event["type"] == "Warning" and event["reason"] == "TopologyNotAdvertised"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "z1", "uid": "z1"}
    assert event["message"].startswith("nothing advertised (no-topology-facility): degenerate topology: no topology "
                                       "facility (z/VM guest")


def test_a_machine_that_is_not_ibm_z() -> None:
    api = FakeApi()
    x86 = Topology(Machine(arch="x86_64", environment="none"), (Cpu(0, core=0, socket=0, siblings=(0,)),))
    assert reporter(x86, api).sync_labels()
    assert api.labels[LABEL_ADVERTISED] == "not-ibm-z"
    assert "not an IBM Z machine (architecture x86_64)" in api.events[0][1]["message"]


def test_a_node_that_advertises_posts_no_event() -> None:
    api = FakeApi()
    assert reporter(load_embedded("z16-lpar"), api).sync_labels()
    assert api.labels[LABEL_ADVERTISED] == "true" and api.events == []


def test_a_warning_the_enforcement_gives_is_posted_by_the_label_loop() -> None:
    """An offline holder's notice (agent.enforce.cri_loop.OfflineNotices) becomes a Warning Event on the
    Node at the next label sync, posted off the thread that gave it, which it wakes."""
    api = FakeApi()
    r = reporter(load_embedded("z16-lpar"), api)
    woken: list[bool] = []
    r.on_event = lambda: woken.append(True)
    r.warn("TopologyHolderOffline", "ns/llm/c holds groups whose CPUs are all offline")
    assert woken == [True] and api.events == []  # nothing posted from the caller's thread
    assert r.sync_labels()
    ((namespace, event),) = api.events
    assert (namespace, event["reason"], event["type"]) == ("default", "TopologyHolderOffline", "Warning")
    assert event["message"] == "ns/llm/c holds groups whose CPUs are all offline"
    assert r.sync_labels() and len(api.events) == 1  # posted once


def test_an_event_refused_by_rbac_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi(refuse_events=True)
    r = reporter(load_embedded("z16-guest-no-topology"), api)
    assert r.sync_labels() and r.sync_labels()  # the labels still sync
    warnings = [rec.getMessage() for rec in caplog.records if "POST event" in rec.getMessage()]
    assert len(warnings) == 1 and "forbidden (403)" in warnings[0] and "create on events" in warnings[0]


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[tuple[str, str, str, Any]]]]:
    seen: list[tuple[str, str, str, Any]] = []

    def answer(request: Request) -> tuple[int, Any]:
        body = request.json()
        seen.append((request.method, request.target, request.headers["Content-Type"], body))
        return 201, {"kind": "Event", **body}

    with FakeApiServer(answer) as server:
        yield server.url, seen


def test_the_lean_client_posts_the_event(api_server: tuple[str, list[tuple[str, str, str, Any]]]) -> None:
    url, seen = api_server
    body = node_event("z1", "not-ibm-z", "not an IBM Z machine", "2026-12-01T20:00:00Z")
    LeanKubeApi(url).create_event("default", body, 5)
    assert seen == [("POST", "/api/v1/namespaces/default/events", "application/json", body)]
