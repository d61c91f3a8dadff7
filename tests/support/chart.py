"""The chart as the tests see it: rendered by the real helm (``helm template``; helm from $HELM, else
.tools/bin/helm from tools/get-helm.sh, else PATH), its objects picked by kind, and a cluster for ``helm install
--dry-run=server`` (discovery, /version and the namespaces: what ``lookup`` in NOTES.txt and Helm's live discovery
read). The fixtures that run helm are in tests/deploy/chart/conftest.py."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.env import REPO

CHART = REPO / "deploy" / "helm" / "s390x-topology-agent"
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
# The chart's kubeVersion window (Chart.yaml): its floor and its newest minor.
FLOOR, NEWEST = "1.34.0", "1.37.0"
Doc = dict[str, Any]


def find_helm() -> str | None:
    if os.environ.get("HELM"):
        return shutil.which(os.environ["HELM"])  # None when $HELM is not an executable
    local = REPO / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("helm")


@functools.cache
def helm_template(helm: str, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    cmd = [helm, "template", "t", str(CHART), "-n", "kube-system", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


Render = Callable[..., list[Doc]]


def kinds(docs: list[Doc]) -> dict[str, list[Doc]]:
    out: dict[str, list[Doc]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def one(docs: list[Doc], kind: str) -> Doc:
    found = kinds(docs).get(kind, [])
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def agent_container(docs: list[Doc]) -> Doc:
    containers = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    return containers[0]


def env_of(container: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def mounts_of(docs: list[Doc]) -> dict[str, tuple[Doc, Doc]]:
    """volume name -> (volumeMount, volume)."""
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["name"]: (m, volumes[m["name"]]) for m in agent_container(docs)["volumeMounts"]}


FAKE_ARGS = (
    "--set", "fakeTopology.enabled=true",
    "--set-file", f"fakeTopology.snapshots.default\\.json={REPO / 'agent/data/z16-lpar.json'}",
    "--set-file", f"fakeTopology.snapshots.worker2\\.json={REPO / 'agent/data/z14-lpar.json'}",
)


# The kinds the chart renders, as an API server lists them in discovery: (group/version, resource, kind,
# namespaced). One with the API switched off lists no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy.
_API = [
    ("v1", "namespaces", "Namespace", False), ("v1", "nodes", "Node", False), ("v1", "secrets", "Secret", True),
    ("v1", "serviceaccounts", "ServiceAccount", True), ("v1", "configmaps", "ConfigMap", True),
    ("v1", "services", "Service", True), ("apps/v1", "daemonsets", "DaemonSet", True),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ("rbac.authorization.k8s.io/v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True),
    ("batch/v1", "jobs", "Job", True),
    ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True),
    ("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False),
    ("admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
     False),
]

_MORE = [
    ("resource.k8s.io/v1", "deviceclasses", "DeviceClass", False),
    ("monitoring.coreos.com/v1", "servicemonitors", "ServiceMonitor", True),
    ("monitoring.coreos.com/v1", "prometheusrules", "PrometheusRule", True),
]


@dataclass
class FakeCluster:
    """What the fake API server answers: a Kubernetes version, whether it serves ValidatingAdmissionPolicy and
    OpenShift's SCCs, and namespaces (name -> labels)."""

    minor: int = 34
    vap: bool = True
    openshift: bool = False  # serves security.openshift.io/v1 SecurityContextConstraints
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets: list[Doc] = field(default_factory=list)  # Helm's release storage (helm.sh/release.v1 Secrets)
    dra_and_monitoring: bool = False  # also serves resource.k8s.io/v1 DeviceClasses and the Prometheus operator's kinds

    def resources(self) -> list[tuple[str, str, str, bool]]:
        scc = [("security.openshift.io/v1", "securitycontextconstraints", "SecurityContextConstraints", False)]
        return [r for r in _API if self.vap or not r[2].startswith("ValidatingAdmissionPolicy")] + \
            (scc if self.openshift else []) + (_MORE if self.dra_and_monitoring else [])

    def answer(self, path: str) -> tuple[int, Doc]:
        if path == "/version":
            return 200, {"major": "1", "minor": str(self.minor), "gitVersion": f"v1.{self.minor}.0",
                         "platform": "linux/s390x"}
        groups: dict[str, list[tuple[str, str, str, bool]]] = {}
        for r in self.resources():
            groups.setdefault(r[0], []).append(r)
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                 "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}}
                for gv in groups if "/" in gv]}
        for gv, resources in groups.items():
            if path == ("/api/v1" if gv == "v1" else f"/apis/{gv}"):
                return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": [
                    {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
                     "verbs": ["get", "list", "create", "update", "patch", "delete"]}
                    for _, name, kind, namespaced in resources]}
        match = re.fullmatch(r"/api/v1/namespaces/([^/]+)", path)
        if match and match.group(1) in self.namespaces:
            return 200, {"kind": "Namespace", "apiVersion": "v1",
                         "metadata": {"name": match.group(1), "labels": self.namespaces[match.group(1)]}}
        if path.endswith("/secrets"):  # Helm's release storage: the releases the test put there
            return 200, {"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": self.secrets}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                     "message": f"{path} not found"}


@dataclass
class Installed:
    manifest: list[Doc]
    notes: str


def chart_install(*args: str) -> tuple[str, ...]:
    return ("install", "t", str(CHART), *args)


PRIVILEGED = {"pod-security.kubernetes.io/enforce": "privileged"}


SCRAPER_NS = '{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}'  # kube-prometheus-stack's Prometheus


SCRAPER_POD = '{"matchLabels":{"app.kubernetes.io/name":"prometheus"}}'


NETPOL_ARGS = ("--set", "networkPolicy.enabled=true",
               "--set-json", f"networkPolicy.scraper.namespaceSelector={SCRAPER_NS}",
               "--set-json", f"networkPolicy.scraper.podSelector={SCRAPER_POD}")


REQUESTS, NODES = "topology-requests", "node-restriction"  # the two policies, by the suffix of their names


def policy_of(docs: list[Doc], which: str = REQUESTS) -> tuple[Doc, Doc]:
    """(ValidatingAdmissionPolicy, its binding) named <fullname>-<which>."""
    found = kinds(docs)
    (policy,) = [p for p in found.get("ValidatingAdmissionPolicy", []) if p["metadata"]["name"].endswith(which)]
    (binding,) = [b for b in found.get("ValidatingAdmissionPolicyBinding", [])
                  if b["spec"]["policyName"] == policy["metadata"]["name"]]
    return policy, binding


def policies(docs: list[Doc]) -> set[str]:
    """Which policies were rendered, each with its binding: {"topology-requests", "node-restriction"}."""
    found = kinds(docs)
    names = {p["metadata"]["name"] for p in found.get("ValidatingAdmissionPolicy", [])}
    bound = {b["spec"]["policyName"] for b in found.get("ValidatingAdmissionPolicyBinding", [])}
    assert names == bound, f"policies {names} and bindings {bound} differ"
    return {which for which in (REQUESTS, NODES) for name in names if name.endswith(which)}


BOTH = {REQUESTS, NODES}


def schema_leaves(node: dict[str, Any], prefix: str = "") -> list[str]:
    """The values the schema names: every property without properties of its own (maps and lists are one value)."""
    leaves = []
    for key, child in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        leaves.extend(schema_leaves(child, f"{path}.") if "properties" in child else [path])
    return leaves
