"""Who may read the agent's metrics: the ServiceMonitor (opt-in), the allocations' pod names (opt-in), and the
NetworkPolicy that admits only the scraper to the metrics port."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.support.chart import (
    NETPOL_ARGS,
    SCRAPER_NS,
    SCRAPER_POD,
    Doc,
    Render,
    agent_container,
    env_of,
    kinds,
    one,
)

# ---------------------------------------------------------------------------------------------------- metrics


def test_service_monitor_off_by_default(render: Render) -> None:
    assert not {"ServiceMonitor", "Service"} & set(kinds(render()))


def test_service_monitor_when_enabled(render: Render) -> None:
    docs = render("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.interval=15s",
                  "--set-json", 'metrics.serviceMonitor.labels={"release":"prometheus"}')
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kube-system"]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_allocations_name_no_pod_unless_asked(render: Render) -> None:
    assert env_of(agent_container(render()))["TOPOLOGY_AGENT_ALLOCATIONS_POD_NAMES"] == "false"
    env = env_of(agent_container(render("--set", "metrics.allocationsPodNames=true")))
    assert env["TOPOLOGY_AGENT_ALLOCATIONS_POD_NAMES"] == "true"


def agent_policy(docs: list[Doc]) -> Doc:
    """The agent's NetworkPolicy (the uninstall hook's pod has one of its own, tests/deploy/chart/test_uninstall.py)."""
    (policy,) = [d for d in kinds(docs).get("NetworkPolicy", []) if d["metadata"]["name"] == "t-s390x-topology-agent"]
    return policy


def test_network_policy_off_by_default(render: Render) -> None:
    assert "NetworkPolicy" not in kinds(render())


def test_network_policy_admits_only_the_scraper_to_the_metrics_port(render: Render) -> None:
    docs = render(*NETPOL_ARGS, "--set", "metrics.port=9555")
    policy = agent_policy(docs)
    assert policy["metadata"]["namespace"] == "kube-system"
    spec = policy["spec"]
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]  # egress stays open: the agent calls the API server
    (rule,) = spec["ingress"]
    # One peer with both selectors (AND), not two peers (OR: any pod of monitoring, or any prometheus anywhere).
    assert rule["from"] == [{"namespaceSelector": json.loads(SCRAPER_NS), "podSelector": json.loads(SCRAPER_POD)}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9555}]
    # That is the port the probes and the scraper use; the probes come from the pod's own node, which
    # NetworkPolicy always admits, so no rule names the kubelet.
    container = agent_container(docs)
    assert container["ports"][0]["containerPort"] == 9555
    assert container["readinessProbe"]["httpGet"]["port"] == container["ports"][0]["name"]


def test_network_policy_with_one_selector(render: Render) -> None:
    (rule,) = agent_policy(render("--set", "networkPolicy.enabled=true", "--set-json",
                         f"networkPolicy.scraper.podSelector={SCRAPER_POD}"))["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": json.loads(SCRAPER_POD)}]  # the release namespace only
    (rule,) = agent_policy(render("--set", "networkPolicy.enabled=true", "--set-json",
                         f"networkPolicy.scraper.namespaceSelector={SCRAPER_NS}"))["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": json.loads(SCRAPER_NS)}]


def test_network_policy_needs_a_scraper(template_error: Callable[..., str]) -> None:
    stderr = template_error("--set", "networkPolicy.enabled=true")
    assert "networkPolicy.scraper.namespaceSelector" in stderr and "to name the metrics scraper" in stderr
