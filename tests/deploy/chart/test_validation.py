"""The chart passes helm lint --strict and the Kubernetes schemas of every version it supports (kubernetes-validate,
strict), refuses what its values.schema.json refuses, and renders its default objects in their namespaces."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.support.chart import (
    CHART,
    FAKE_ARGS,
    FLOOR,
    NEWEST,
    SCRAPER_NS,
    SCRAPER_POD,
    Render,
    helm_template,
    kinds,
)
from tests.support.env import missing

# ------------------------------------------------------------------------------------------- lint / validate


@pytest.mark.parametrize("args", [(), FAKE_ARGS], ids=["default", "fake-topology"])
def test_helm_lint_strict(helm: str, args: tuple[str, ...]) -> None:
    result = subprocess.run([helm, "lint", "--strict", str(CHART), *args], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


# Every option on at once (what tools/check-chart.sh and the checkov run in deploy/helm/README.md render too).
ALL_OPTIONS = (
    *FAKE_ARGS,
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "metrics.allocationsPodNames=true",
    "--set", "seccompProfile.install=true",
    "--set", "kubelet.readState=true",
    "--set", "networkPolicy.enabled=true",
    "--set-json", f"networkPolicy.scraper.namespaceSelector={SCRAPER_NS}",
    "--set-json", f"networkPolicy.scraper.podSelector={SCRAPER_POD}",
)


@pytest.mark.parametrize("kube_version", [FLOOR, NEWEST])
@pytest.mark.parametrize("args", [(), FAKE_ARGS, ("--set", "metrics.serviceMonitor.enabled=true"), ALL_OPTIONS,
                                  ("--set", "openshift.scc.create=true")],
                         ids=["default", "fake-topology", "service-monitor", "all-options", "openshift"])
def test_rendered_objects_pass_strict_schema_validation(render: Render, kube_version: str,
                                                        args: tuple[str, ...]) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        missing("kubernetes-validate", "pip install kubernetes-validate")
    docs = render(*args, kube_version=kube_version)
    for doc in docs:
        if doc["apiVersion"].startswith(("monitoring.coreos.com/", "security.openshift.io/")):
            continue  # a CRD: no schema bundled (test_openshift_apiserver.py has the SCC's API server take it)
        kubernetes_validate.validate(doc, kube_version, strict=True)


def test_chart_names_its_window_and_refuses_what_is_outside() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.34.0-0 <1.38.0-0"


# What API servers say in /version's gitVersion: upstream, OpenShift (a build suffix), managed services (a
# pre-release suffix), k3s and kind.
@pytest.mark.parametrize("version, accepted", [
    ("v1.34.0", True), ("v1.34.2+5f2d7a1", True), ("v1.34.3-eks-1234", True), ("v1.35.1-gke.1234000", True),
    ("v1.35.0", True), ("v1.36.4+k3s1", True), ("v1.37.2", True), ("v1.37.9-rc.1", True),
    ("v1.33.9", False), ("v1.33.9+rke2r1", False), ("v1.38.0-alpha.1", False), ("v1.38.0", False),
])
def test_kube_version_window_with_vendor_suffixes(helm: str, version: str, accepted: bool) -> None:
    result = helm_template(helm, ("--kube-version", version))
    assert (result.returncode == 0) is accepted, result.stderr
    if not accepted:
        assert "chart requires kubeVersion" in result.stderr


def test_helm_template_without_a_kube_version_is_refused_by_helm_3_17(helm: str) -> None:
    """Helm 3.17 assumes 1.32 offline: below the window, so GitOps users pass --kube-version (docs/admin/install.md)."""
    result = helm_template(helm, ())
    assert result.returncode != 0 and "v1.32.0" in result.stderr


def test_default_objects_and_namespaces(render: Render) -> None:
    docs = render()
    assert sorted(kinds(docs)) == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Role", "RoleBinding",
                                   "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for doc in docs:
        if doc["kind"] in ("DaemonSet", "ServiceAccount", "ConfigMap", "Service"):
            assert doc["metadata"]["namespace"] == "kube-system"


# ---------------------------------------------------------------------------------------------- schema


@pytest.mark.parametrize("args, field", [
    (("--set", "metrics.port=0"), "port"),
    (("--set", "metrics.port=65536"), "port"),
    (("--set", "metrics.port=http"), "port"),
    (("--set", "agent.logLevel=verbose"), "logLevel"),
    (("--set", "agent.logFormat=xml"), "logFormat"),
    (("--set", "agent.levels=books"), "levels"),
    (("--set", "agent.levels=book\\,\\,socket"), "levels"),
    (("--set", "agent.levels=auto\\,book"), "levels"),
    (("--set", "agent.levels=drawer\\,book\\,socket\\,book"), "levels"),  # the agent refuses a level twice
    (("--set", "agent.levels=book\\,book"), "levels"),
    (("--set", "agent.reserveCoresPerGroup=-1"), "reserveCoresPerGroup"),
    (("--set", "agent.reserveCoresPerGroup=1.5"), "reserveCoresPerGroup"),
    (("--set", "agent.ompThreadsPerCore=3"), "ompThreadsPerCore"),
    (("--set-string", "agent.ompThreadsPerCore=2"), "ompThreadsPerCore"),
    (("--set", "agent.nodeLabels=yes"), "nodeLabels"),
    (("--set", "agent.reservedCpus=0-a"), "reservedCpus"),
    (("--set", "agent.resourcePrefix=Topology_"), "resourcePrefix"),
    (("--set", "agent.resourcePrefix=kubernetes.io"), "resourcePrefix"),
    (("--set-json", 'agent.excludePolarization=["vertical:sideways"]'), "excludePolarization"),
    (("--set", "agent.excludePolarization=unknown"), "excludePolarization"),
    (("--set", "agent.source=procfs"), "source"),
    (("--set", "agent.rescanInterval=-1"), "rescanInterval"),
    (("--set", "agent.podResourcesInterval=soon"), "podResourcesInterval"),
    (("--set", "kubelet.readState=yes"), "readState"),
    (("--set", "agent.bogus=1"), "bogus"),
    (("--set", "kubelet.root=var/lib/kubelet"), "root"),
    (("--set", "kubelet.devicePluginDir=device-plugins"), "devicePluginDir"),
    (("--set", "fakeTopology.enabled=1"), "enabled"),
    (("--set", "fakeTopology.snapshots.node1=x"), "snapshots"),
    (("--set-json", 'admissionPolicy.validationActions=["Deny","Warn"]'), "validationActions"),
    (("--set", "admissionPolicy.failurePolicy=Maybe"), "failurePolicy"),
    (("--set", "updateStrategy.maxUnavailable=0"), "maxUnavailable"),
    (("--set", "image.digest=latest"), "digest"),
    (("--set", "metrics.allocationsPodNames=yes"), "allocationsPodNames"),
    (("--set", "nodeRestrictionPolicy.enabled=1"), "enabled"),
    (("--set", "nodeRestrictionPolicy.mode=audit"), "mode"),
    (("--set", "networkPolicy.enabled=on"), "enabled"),
    (("--set-json", 'networkPolicy.scraper.podSelector={"app":"prometheus"}'), "app"),
    (("--set-json", 'networkPolicy.scraper.podSelector={"matchLabels":{"app":1}}'), "app"),
    (("--set-json", 'networkPolicy.scraper.namespaceSelector={"matchExpressions":[{"key":"a","operator":"Is"}]}'),
     "operator"),
    (("--set", "networkPolicy.ingress=all"), "ingress"),
])
def test_schema_rejects(template_error: Callable[..., str], args: tuple[str, ...], field: str) -> None:
    stderr = template_error(*args)
    assert "values don't meet the specifications of the schema" in stderr, stderr
    assert field in stderr, stderr


def iter_values(values: Any, path: str = "") -> Iterator[str]:
    if isinstance(values, dict):
        for key, value in values.items():
            yield from iter_values(value, f"{path}.{key}" if path else key)
    else:
        yield path


def test_every_value_is_in_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def known(path: str) -> bool:
        node = schema
        for part in path.split("."):
            props = node.get("properties", {})
            if part in props:
                node = props[part]
                if "$ref" in node:
                    node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
                if "oneOf" in node:  # e.g. a string map or null: free-form below this point
                    return True
                continue
            return node.get("additionalProperties") not in (False, None) or node.get("type") == "object"
        return True

    unknown = [p for p in iter_values(values) if not known(p)]
    assert not unknown, f"values.yaml keys missing from values.schema.json: {unknown}"


@pytest.mark.parametrize("value", ["agent.levels", "agent.reservedCpus", "agent.nodeLabels", "agent.openmpEnv",
                                   "agent.minGroupCores", "kubelet.root", "metrics.port", "livenessProbe",
                                   "cpusetEnforcement", "sharedPool", "criSocket", "nriSocket"])
def test_a_value_set_to_null_is_refused_by_the_schema(template_error: Callable[..., str], value: str) -> None:
    """Helm drops a value set to null: the schema then names it, rather than a broken render or an agent that
    refuses 'None' at start."""
    stderr = template_error("--set-json", f"{value}=null")
    assert "values don't meet the specifications of the schema" in stderr
    assert value.rsplit(".", 1)[-1] in stderr
