"""The chart in DRA mode (mode: dra): DeviceClasses, the kubelet plugin's mounts, RBAC, the ResourceSlice policy;
device-plugin mode keeps the mounts and the slices' deletion (the unprepare of claims left by DRA mode), nothing
else of it. (The real API server judges them in tests/e2e/test_dra.py.)"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from agent.policy.resource_slices import DRIVER, deviceclass
from tests.support.chart import FAKE_ARGS, Render, agent_container, env_of, kinds, mounts_of, one

DRA = ("--set", "mode=dra")


def installed(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The release's objects without Helm hooks (the uninstall Job has an account and a role of its own)."""
    return [d for d in docs if "helm.sh/hook" not in (d.get("metadata", {}).get("annotations") or {})]


def dra_plugin_paths(docs: list[dict[str, Any]]) -> None:
    """The DRA kubelet plugin's directories and CDI's, at the host's paths (kubelet dials the endpoint named)."""
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_DRA_REGISTRY_DIR"] == "/var/lib/kubelet/plugins_registry"
    assert env["TOPOLOGY_AGENT_DRA_PLUGIN_DIR"] == f"/var/lib/kubelet/plugins/{DRIVER}"
    assert env["TOPOLOGY_AGENT_CDI_DIR"] == "/var/run/cdi"
    mounts = mounts_of(docs)
    for name, path in (("dra-registry", "/var/lib/kubelet/plugins_registry"),
                       ("dra-plugin", f"/var/lib/kubelet/plugins/{DRIVER}"), ("cdi", "/var/run/cdi")):
        mount, volume = mounts[name]
        assert mount["mountPath"] == path == volume["hostPath"]["path"]


@pytest.mark.parametrize("extra", [(), ("--set", "agent.nodeLabels=false")], ids=["default", "no-node-labels"])
def test_deviceplugin_mode_keeps_what_unpreparing_claims_left_by_dra_mode_needs(render: Render,
                                                                               extra: tuple[str, ...]) -> None:
    """After helm upgrade from mode dra, the device-plugin agent serves the DRA plugin for the unprepare of the
    claims prepared before (kubelet cannot end their pods otherwise): the same directories, and with API access the
    deletion of its node's slices, held to its own node; no DeviceClass, no claim read, no slice written."""
    docs = installed(render(*extra))
    assert "DeviceClass" not in kinds(docs)
    assert env_of(agent_container(docs))["TOPOLOGY_AGENT_MODE"] == "deviceplugin"
    dra_plugin_paths(docs)
    if extra:  # no API access: no token, no RBAC (the DRA agent that handed over deleted the slices)
        assert "ClusterRole" not in kinds(docs)
        return
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in one(docs, "ClusterRole")["rules"]}
    assert {k: v for k, v in rules.items() if "resource.k8s.io" in k[0]} == {
        (("resource.k8s.io",), ("resourceslices",)): {"list", "delete"}}
    policies = {p["metadata"]["name"]: p for p in kinds(docs)["ValidatingAdmissionPolicy"]}
    rule = policies["t-s390x-topology-agent-resourceslices"]["spec"]["matchConstraints"]["resourceRules"][0]
    assert "DELETE" in rule["operations"]


def test_an_upgrade_from_dra_to_deviceplugin_keeps_the_dra_plugin_mounts(render: Render) -> None:
    def volumes(docs: list[dict[str, Any]]) -> dict[str, Any]:
        return {n: (m, v) for n, (m, v) in mounts_of(docs).items() if n in ("dra-registry", "dra-plugin", "cdi")}

    assert volumes(installed(render())) == volumes(installed(render(*DRA)))


@pytest.mark.parametrize("extra", [(), ("--set", "agent.nodeLabels=false"), FAKE_ARGS],
                         ids=["default", "no-node-labels", "fake-topology"])
def test_dra_mode(render: Render, extra: tuple[str, ...]) -> None:
    docs = installed(render(*DRA, *extra))
    classes = {d["metadata"]["name"]: d for d in kinds(docs)["DeviceClass"]}
    assert sorted(classes) == [f"book.{DRIVER}", f"drawer.{DRIVER}", f"socket.{DRIVER}"]
    for level in ("book", "socket", "drawer"):
        ours = deviceclass(level, extended_resource=None if level == "drawer" else f"topology/{level}")
        assert classes[f"{level}.{DRIVER}"]["spec"] == ours["spec"]  # the chart and discover --mode dra agree
        kubernetes_validate.validate(classes[f"{level}.{DRIVER}"], "1.37", strict=True)
    env = env_of(agent_container(docs))
    assert env["TOPOLOGY_AGENT_MODE"] == "dra"
    dra_plugin_paths(docs)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is True
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in one(docs, "ClusterRole")["rules"]}
    assert rules[(("resource.k8s.io",), ("resourceslices",))] == {"get", "list", "watch", "create", "update",
                                                                   "delete"}
    assert rules[(("resource.k8s.io",), ("resourceclaims",))] == {"get", "list", "watch"}
    assert rules[(("resource.k8s.io",), ("deviceclasses",))] == {"get"}
    assert "get" in rules[(("",), ("nodes",))]
    assert rules[(("",), ("pods/eviction",))] == {"create"}  # DRA's API access: a stranded holder's pod is evicted
    assert env["TOPOLOGY_AGENT_STRANDED_POLICY"] == "evict"
    policies = {p["metadata"]["name"]: p for p in kinds(docs)["ValidatingAdmissionPolicy"]}
    slices = policies["t-s390x-topology-agent-resourceslices"]
    rule = slices["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["resources"] == ["resourceslices"] and set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert slices["spec"]["failurePolicy"] == "Fail"
    bindings = {b["spec"]["policyName"]: b for b in kinds(docs)["ValidatingAdmissionPolicyBinding"]}
    assert bindings["t-s390x-topology-agent-resourceslices"]["spec"]["validationActions"] == ["Deny"]
    node_policy = "t-s390x-topology-agent-node-restriction"
    assert (node_policy in policies) == ("agent.nodeLabels=false" not in extra)


def test_mode_is_checked_by_the_schema(helm: str) -> None:
    import subprocess

    from tests.support.chart import CHART, FLOOR

    result = subprocess.run([helm, "template", "t", str(CHART), "--kube-version", FLOOR, "--set", "mode=both"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0 and "mode" in result.stderr
