"""Metrics, health and readiness of a running agent, scraped over HTTP through the kubelet emulator."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import __version__
from agent.version import commit
from tests.support.env import BOOK, SOCKET
from tests.support.harness import Node, running_node
from topology_devkit.kubelet_emulator import AdmissionError, Container


def get(node: Node, path: str) -> tuple[int, str]:
    assert node.agent.http is not None
    url = f"http://127.0.0.1:{node.agent.http.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def scrape(node: Node) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(node, "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_after_registration_allocations_restart_and_a_bad_allocate() -> None:
    with running_node(metrics_port=0, metrics_address="127.0.0.1") as node:
        k = node.kubelet
        m = scrape(node)
        assert value(m, "topology_agent_build_info", version=__version__, commit=commit()) == 1
        assert value(m, "topology_agent_node_info", machine="z16", fidelity="lpar", dispatching="horizontal",
                     smt="2") == 1
        assert value(m, "topology_agent_devices", resource=BOOK, state="healthy") == 8
        assert value(m, "topology_agent_registrations_total", resource=BOOK) == 1
        assert value(m, "topology_agent_list_and_watch_streams", resource=SOCKET) == 1
        assert value(m, "topology_agent_group_cpus", resource=BOOK, device="drawer0-book0") == 12
        assert value(m, "topology_agent_ready") == 1

        pod = k.admit_pod("default", "p", [Container("c", {BOOK: 1})])
        (book,) = pod.devices("c", BOOK)
        k.wait_for(lambda: k.devices(SOCKET).get(f"{book}-socket0") == "Unhealthy")
        m = scrape(node)
        assert value(m, "topology_agent_rpc_calls_total", method="Allocate", resource=BOOK, code="OK") == 1
        assert value(m, "topology_agent_rpc_calls_total", method="GetPreferredAllocation", resource=BOOK,
                     code="OK") == 1
        assert value(m, "topology_agent_rpc_duration_seconds_count", method="Allocate", resource=BOOK) == 1
        assert value(m, "topology_agent_devices", resource=BOOK, state="allocated") == 1
        assert value(m, "topology_agent_devices", resource=SOCKET, state="blocked-by-overlap") == 2

        with pytest.raises(grpc.RpcError):
            node.allocate(BOOK, ["nope"])
        m = scrape(node)
        assert value(m, "topology_agent_rpc_calls_total", method="Allocate", resource=BOOK,
                     code="INVALID_ARGUMENT") == 1

        k.restart()
        k.wait_for(lambda: k.registrations(BOOK) == 2 and k.registrations(SOCKET) == 2)
        k.wait_for(lambda: node.agent.ready())
        m = scrape(node)
        assert value(m, "topology_agent_kubelet_restarts_total") >= 1
        assert value(m, "topology_agent_registrations_total", resource=BOOK) == 2
        assert value(m, "topology_agent_seconds_since_registration", resource=BOOK) < 60


def test_readyz_follows_registration() -> None:
    with running_node(metrics_port=0, metrics_address="127.0.0.1", start_kubelet=False, levels=("book",)) as node:
        assert get(node, "/healthz")[0] == 200
        assert get(node, "/readyz")[0] == 503  # not registered yet: no kubelet
        node.kubelet.start()
        node.kubelet.wait_registered(BOOK)
        node.kubelet.wait_for(lambda: get(node, "/readyz")[0] == 200, what="ready after registration")
        node.kubelet.restart(down_for=0.3, block=False)
        node.kubelet.wait_for(lambda: get(node, "/readyz")[0] == 503, what="not ready while kubelet is gone")
        node.kubelet.wait_for(lambda: get(node, "/readyz")[0] == 200, timeout=10, what="ready after re-registration")
        assert get(node, "/healthz") == (200, "ok\n")
        assert get(node, "/nope")[0] == 404


def test_allocations_endpoint_shows_holders_and_blocked_devices() -> None:
    with running_node(metrics_port=0, metrics_address="127.0.0.1", allocations_pod_names=True) as node:
        k = node.kubelet
        pod = k.admit_pod("ml", "llm", [Container("vllm", {BOOK: 1})])
        (book,) = pod.devices("vllm", BOOK)
        k.wait_for(lambda: node.agent.devices.holders().get((BOOK, book)) == ["ml/llm/vllm"])
        status, body = get(node, "/allocations")
        data = json.loads(body)
        assert status == 200 and data["ready"] is True
        held = [d for d in data["devices"] if d["state"] == "allocated"]
        assert held == [{"resource": BOOK, "id": book, "cpus": node.agent.grouping.by_id(BOOK)[book].cpulist,
                         "health": "Healthy", "state": "allocated", "reason": "ml/llm/vllm",
                         "holders": ["ml/llm/vllm"]}]
        assert {d["id"] for d in data["blocked"]} == {f"{book}-socket0", f"{book}-socket1"}
        assert all("ml/llm/vllm" in d["reason"] for d in data["blocked"])


def test_allocations_endpoint_names_no_pod_by_default() -> None:
    with running_node(metrics_port=0, metrics_address="127.0.0.1") as node:
        k = node.kubelet
        pod = k.admit_pod("ml", "llm", [Container("vllm", {BOOK: 1})])
        (book,) = pod.devices("vllm", BOOK)
        k.wait_for(lambda: node.agent.devices.holders().get((BOOK, book)) == ["ml/llm/vllm"])
        status, body = get(node, "/allocations")
        assert status == 200 and "ml" not in json.loads(body).get("resources", []) and "llm" not in body
        data = json.loads(body)
        held = [d for d in data["devices"] if d["state"] == "allocated"]
        assert [(d["id"], d["holders"], d["reason"]) for d in held] == [(book, 1, "held by 1 container")]
        assert {d["reason"] for d in data["blocked"]} == {f"{BOOK} {book} is held"}


def test_metric_series_stay_bounded_while_a_thousand_pods_come_and_go() -> None:
    with running_node(metrics_port=0, metrics_address="127.0.0.1", pod_resources_interval=0.02) as node:
        k = node.kubelet
        baseline = None
        admitted = 0
        for i in range(1000):
            resource = BOOK if i % 2 else SOCKET
            try:
                k.admit_pod("default", f"p{i}", [Container("c", {resource: 1})])
                admitted += 1
            except AdmissionError:  # every group blocked by a very recent one: rare, fine here
                continue
            k.delete_pod("default", f"p{i}")
            if i == 10:
                baseline = scrape(node)
        k.wait_for(lambda: not node.agent.devices.holders(), timeout=10, what="all pods gone")
        final = scrape(node)
        assert admitted >= 900
        assert baseline is not None and set(final) == set(baseline)  # the same series, not just as many
        label_names = {name for _, labels in final for name, _ in labels}
        assert not label_names & {"pod", "namespace", "container", "uid"}
