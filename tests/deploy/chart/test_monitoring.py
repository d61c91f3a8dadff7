"""The chart's monitoring (docs/admin/monitoring.md): the opt-in PrometheusRule and the Grafana dashboard.

* Every metric the rules and the dashboard name is one the agent exports (its real exposition, not a list).
* ``promtool check rules`` on the rendered rules, and ``promtool test rules``: each alert fires on the input that
  means trouble, with the labels and annotations it says, and stays quiet on a healthy agent. promtool is built from
  the Go module proxy by devkit/promtool/build.sh (pinned beside it); without it these skip, and fail under
  CI=true only when .ci/run builds it.
* The dashboard's structure (no official Grafana schema is available offline): panels with unique ids and a grid
  position, every query on the templated Prometheus data source, the panels the docs promise.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.observe.metrics import AgentMetrics
from agent.observe.status import AgentStatus, EnforcementStatus, ResourceStatus
from tests.support.chart import Render, one
from tests.support.env import REPO

CHART = REPO / "deploy" / "helm" / "s390x-topology-agent"
DASHBOARD = CHART / "dashboards" / "s390x-topology-agent.json"
ON = ("--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.grafanaDashboard.enabled=true")
METRIC = re.compile(r"\b(topology_agent_[a-z_]+)")
ALERTS = {"TopologyAgentNotReady", "TopologyAgentExclusivityUnconfirmed", "TopologyAgentRegistrationFailing",
          "TopologyAgentPinsFailing", "TopologyAgentCpusetEnforcementRefused", "TopologyAgentUnbalancedAllocations"}


def exported() -> dict[str, set[str]]:
    """sample name -> its label names, from the agent's own exposition with every optional family present."""
    metrics = AgentMetrics()
    metrics.prepare(["topology/book"])
    metrics.pin_latency.observe(0.2)
    metrics.unbalanced_allocations.labels("topology/book").inc()
    enforcement = EnforcementStatus(refused=False, failing=False, topology_containers=1, pinned=1, updates={},
                                    pool_cpus=0, pool_empty=False, steps=1, container_refusals=0, refusing=0)
    status = AgentStatus(machine="z16", fidelity="lpar", dispatching="horizontal", smt=2,
                         groups=(("topology/book", "drawer0-book0", 12),),
                         resources=(ResourceStatus(resource="topology/book", registrations=1, streams=1,
                                                   seconds_since_registration=1.0, states={"healthy": 1}),),
                         ready=True, enforcement=enforcement, enforcement_mode="cri",
                         uniform=(("topology/book", 12, 0),))
    metrics.read_status(lambda: status)
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def cpuset_families_without_enforcement() -> set[str]:
    """The cpuset_* families the agent exports with --cpuset-enforcement none (no EnforcementStatus)."""
    metrics = AgentMetrics()
    metrics.read_status(lambda: AgentStatus(machine="z16", fidelity="lpar", dispatching="horizontal", smt=2,
                                            groups=(), resources=(), ready=True))
    text = generate_latest(metrics.registry).decode()
    return {f.name for f in text_string_to_metric_families(text)
            if f.name.startswith("topology_agent_cpuset_") and not f.name.endswith("_created")}


def rules(render: Render, *args: str) -> list[dict[str, Any]]:
    rule = one(render(*ON, *args), "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_monitoring_is_off_by_default(render: Render) -> None:
    kinds = {d["kind"] for d in render()}
    assert "PrometheusRule" not in kinds
    assert not [d for d in render() if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]]


def test_the_rule_carries_the_labels_the_ruleselector_needs(render: Render) -> None:
    rule = one(render(*ON, "--set", "metrics.prometheusRule.labels.release=kube-prometheus-stack"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]} == ALERTS


def test_for_and_severity_come_from_the_values(render: Render) -> None:
    found = {r["alert"]: r for r in rules(render, "--set", "metrics.prometheusRule.for=3m",
                                          "--set", "metrics.prometheusRule.severity=critical")}
    assert found["TopologyAgentNotReady"]["for"] == "3m"
    assert found["TopologyAgentNotReady"]["labels"]["severity"] == "critical"
    assert "for" not in found["TopologyAgentUnbalancedAllocations"]  # every one is worth a look at once


def test_every_metric_the_rules_name_is_exported(render: Render) -> None:
    names = exported()
    for rule in rules(render):
        used = set(METRIC.findall(rule["expr"]))
        assert used, rule
        assert used <= names.keys(), f"{rule['alert']}: not exported: {sorted(used - names.keys())}"


def test_every_metric_the_docs_name_is_exported() -> None:
    """Docs match the code: a topology_agent_* name anywhere in the docs is a family or sample the agent exports."""
    names = exported()
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    named = {n for path in docs for n in METRIC.findall(path.read_text())}
    unknown = {n for n in named if n not in names and not any(s.startswith(f"{n}_") for s in names)}
    assert not unknown, f"named in the docs, not exported: {sorted(unknown)}"


def test_every_metric_the_agent_exports_is_documented() -> None:
    """Code matches the docs: every topology_agent_* sample (histograms by their family) is in the metrics table of
    docs/admin/monitoring.md."""
    text = (REPO / "docs" / "admin" / "monitoring.md").read_text()
    table = set(re.findall(r"^\| `(topology_agent_[a-z_]+)` \|", text[text.index("## Every metric"):], re.M))
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in exported() if n.startswith("topology_agent_")
                and not n.endswith("_created")}
    assert families == table


def test_the_dashboard_configmap_holds_the_dashboard_file(render: Render) -> None:
    docs = render(*ON, "--set", "metrics.grafanaDashboard.namespace=monitoring")
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["s390x-topology-agent.json"]) == json.loads(DASHBOARD.read_text())


# ------------------------------------------------------------------------------------------------ the dashboard
def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def test_the_dashboard_has_the_promised_panels() -> None:
    titles = [p["title"] for p in _dashboard()["panels"]]
    for wanted in ("Groups advertised per node", "Held / free / blocked", "Allocate latency", "Pin latency"):
        assert any(t.startswith(wanted) for t in titles), (wanted, titles)


def test_the_dashboard_structure() -> None:
    dash = _dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["type"] in {"timeseries", "stat", "table", "bargauge", "gauge"}, panel["type"]
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            for variable in re.findall(r"\$(\w+)", target["expr"]):
                assert variable in variables or variable == "__rate_interval", (panel["title"], variable)


def test_every_metric_and_label_the_dashboard_queries_is_exported() -> None:
    names = exported()
    queries = [t["expr"] for p in _dashboard()["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in _dashboard()["templating"]["list"] if "definition" in v]
    for expr in queries:
        used = set(METRIC.findall(expr))
        assert used and used <= names.keys(), f"{expr}: not exported: {sorted(used - names.keys())}"
        for metric, selector in re.findall(r"(topology_agent_[a-z_]+)\{([^}]*)\}", expr):
            for label in re.findall(r"(\w+)=~?\"", selector):
                # node is added by the scrape (the ServiceMonitor's relabeling), the rest by the agent
                assert label == "node" or label in names[metric], f"{metric} has no label {label}"


# ------------------------------------------------------------------------------------------------ promtool
def promtool() -> str:
    path = subprocess.run([str(REPO / "devkit" / "promtool" / "build.sh"), "--print"], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()
    if not os.access(path, os.X_OK):
        built_by_ci = "devkit/promtool/build.sh" in (REPO / ".ci" / "run").read_text()
        if os.environ.get("CI") == "true" and built_by_ci:
            pytest.fail(f"promtool is missing under CI=true although .ci/run builds it (expected at {path})")
        pytest.skip(f"promtool is not built (devkit/promtool/build.sh builds it into {Path(path).parent}, "
                    "several minutes cold)")
    return path


@pytest.fixture()
def rules_file(render: Render, tmp_path: Path) -> Path:
    rule = one(render(*ON), "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def test_promtool_check_rules(rules_file: Path) -> None:
    done = subprocess.run([promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def _annotations(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """The rule's annotations as Prometheus expands them for a series with ``labels``."""
    def expand(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)

    return {key: expand(value) for key, value in rule["annotations"].items()}


# alert -> (input series: name{labels} -> values, eval time, whether it fires)
SERIES = 'instance="10.0.0.5:9400", node="z1", resource="topology/book"'
CASES: list[tuple[str, dict[str, str], str, bool]] = [
    ("TopologyAgentNotReady", {"topology_agent_ready": "0x15"}, "11m", True),
    ("TopologyAgentNotReady", {"topology_agent_ready": "1x15"}, "11m", False),
    ("TopologyAgentNotReady", {"topology_agent_ready": "0x5"}, "5m", False),  # not for 10m yet
    ("TopologyAgentExclusivityUnconfirmed", {"topology_agent_exclusivity_confirmed": "0x15"}, "11m", True),
    ("TopologyAgentExclusivityUnconfirmed", {"topology_agent_exclusivity_confirmed": "1x15"}, "11m", False),
    ("TopologyAgentRegistrationFailing", {"topology_agent_registration_failures_total": "0+1x30"}, "25m", True),
    ("TopologyAgentRegistrationFailing", {"topology_agent_registration_failures_total": "5x30"}, "25m", False),
    ("TopologyAgentPinsFailing", {"topology_agent_cpuset_enforcement_failing": "1x15",
                                  "topology_agent_cpuset_containers_refusing": "0x15"}, "11m", True),
    ("TopologyAgentPinsFailing", {"topology_agent_cpuset_enforcement_failing": "0x15",
                                  "topology_agent_cpuset_containers_refusing": "2x15"}, "11m", True),
    ("TopologyAgentPinsFailing", {"topology_agent_cpuset_enforcement_failing": "0x15",
                                  "topology_agent_cpuset_containers_refusing": "0x15"}, "11m", False),
    ("TopologyAgentCpusetEnforcementRefused", {"topology_agent_cpuset_enforcement_refused": "1x15"}, "11m", True),
    ("TopologyAgentUnbalancedAllocations", {"topology_agent_unbalanced_allocations_total": "0 0 1 1 1"}, "4m", True),
    ("TopologyAgentUnbalancedAllocations", {"topology_agent_unbalanced_allocations_total": "3x10"}, "9m", False),
]


def test_promtool_test_rules_each_alert_fires_on_trouble_only(render: Render, rules_file: Path,
                                                               tmp_path: Path) -> None:
    binary = promtool()
    by_name = {r["alert"]: r for r in rules(render)}
    labels = dict(re.findall(r'(\w+)="([^"]*)"', SERIES))
    tests = []
    for alert, inputs, at, fires in CASES:
        expected = []
        if fires:
            rule = by_name[alert]
            expected = [{"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": _annotations(rule, labels)}]
        tests.append({"interval": "1m",
                      "input_series": [{"series": f"{name}{{{SERIES}}}", "values": values}
                                       for name, values in inputs.items()],
                      "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": expected}]})
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False))
    done = subprocess.run([binary, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_docs_name_the_cpuset_series_that_are_always_there() -> None:
    """The sentence before the metrics table says which cpuset_* rows exist without enforcement: exactly those."""
    text = (REPO / "docs" / "admin" / "monitoring.md").read_text()
    section = text[text.index("## Every metric"):]
    intro = section[:section.index("\n|")]
    always = intro[intro.index("but for"):intro.index("always there")]
    assert set(METRIC.findall(always)) == cpuset_families_without_enforcement()
