"""DRA mode on a real cluster: the driver, the values that switch the release to it, the agent pod and its
ResourceSlices, and the claims and pods the DRA tests make."""

from __future__ import annotations

from typing import Any

from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import kjson, wait_kubectl

DRIVER = "topology.s390x.ibm.com"


DRA_VALUES = ("--set", "mode=dra", "--set-json", 'agent.levels=["book","socket"]')


def agent_pod(env: E2EEnv) -> dict[str, Any]:
    pods = kjson(env, "-n", env.namespace, "get", "pods", "-l", f"app.kubernetes.io/instance={env.release}")["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    assert running, "no running agent pod"
    return running[0]


def agent_ready(env: E2EEnv) -> bool:
    try:
        pod = agent_pod(env)
    except AssertionError:
        return False
    return all(c.get("ready") for c in pod["status"].get("containerStatuses", []))


def slices(env: E2EEnv, node: str) -> list[dict[str, Any]]:
    items = kjson(env, "get", "resourceslices", "--field-selector", f"spec.nodeName={node},spec.driver={DRIVER}")
    return sorted(items["items"], key=lambda s: s["metadata"]["name"])


def claim(name: str, device_class: str, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "topology-e2e-pods"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}}


def pod(name: str, image: str, claim_name: str | None = None, limits: dict[str, Any] | None = None,
        cpu: str = "100m") -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "sleep 3600"],
        "resources": {"requests": {"cpu": cpu, "memory": "16Mi"}, "limits": {"memory": "32Mi", **(limits or {})}}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 1,
                            "nodeSelector": {"topology-e2e/worker": "true"}}
    if claim_name:
        spec["resourceClaims"] = [{"name": "c", "resourceClaimName": claim_name}]
        container["resources"]["claims"] = [{"name": "c"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "topology-e2e-pods"},
            "spec": spec}


def allocated_device(env: E2EEnv, claim_name: str) -> str:
    c = wait_kubectl(f"claim {claim_name} allocated", lambda: (lambda c: c if c.get("status", {}).get("allocation")
                                                            else None)(kjson(env, "-n", "topology-e2e-pods", "get",
                                                                              "resourceclaim", claim_name)))
    (result,) = c["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER
    return str(result["device"])


def delete(env: E2EEnv, *what: str) -> None:
    env.kubectl("-n", "topology-e2e-pods", "delete", *what, "--wait=true", "--ignore-not-found", timeout=120)
