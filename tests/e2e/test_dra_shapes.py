"""DRA mode on the real cluster with a fake topology of books of different sizes:

* a CEL claim for a book with at least N cores (the shipped ``deploy/examples/dra/one-book-min-cores.yaml``, N = 10)
  skips the small book of the vLLM PR #40714 machine (books of 12, 12 and 1 cores), and an N no book has keeps the
  pod Pending with the scheduler's reason;
* a CPU taken offline (the snapshot's ``online`` flag, changed in the fake-topology ConfigMap under the running
  agent: no real CPU of this machine goes offline) taints its book in the ResourceSlice, a new claim for that book is
  not allocated, and the taint goes when the CPU is back.

The module's fixture ``helm upgrade``\\ s the release to ``mode: dra`` with the ``pr40714`` snapshot
(``agent/data/pr40714.json``), ``agent.minGroupCores=0`` (so the one-core book is published too) and
``cpusetEnforcement=none`` (its 50 CPUs do not exist here), and puts the lane's own install back at the end.
Run with ``make e2e`` (TOPOLOGY_E2E_DRA=1), or as tests/e2e/test_dra.py says.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agent.topology import snapshot_format as snapshot
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.dra import DRIVER, agent_ready, allocated_device, delete, slices
from tests.support.e2e.kube import apply, kjson, wait_kubectl
from tests.support.env import REPO

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TOPOLOGY_E2E_DRA") != "1", reason="DRA mode e2e: set TOPOLOGY_E2E_DRA=1"),
]

NS = "topology-e2e-pods"
EXAMPLE = REPO / "deploy" / "examples" / "dra" / "one-book-min-cores.yaml"
BOOKS = {"drawer0-book0": 12, "drawer0-book1": 12, "drawer0-book2": 1}  # cores, agent/data/pr40714.json
OFFLINE_CPU = 30  # a thread of book 1 (CPUs 24-47)
TAINT = {"key": f"{DRIVER}/unhealthy", "value": "not-whole", "effect": "NoSchedule"}


def shipped_template() -> dict[str, Any]:
    """The example's ResourceClaimTemplate, as shipped (its CEL selector: cores >= 10)."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    (template,) = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    template["metadata"]["namespace"] = NS
    return template


def shipped_selector() -> str:
    (request,) = shipped_template()["spec"]["spec"]["devices"]["requests"]
    (selector,) = request["exactly"]["selectors"]
    return str(selector["cel"]["expression"])


def pr40714(offline: tuple[int, ...] = ()) -> str:
    topology = snapshot.load(REPO / "agent" / "data" / "pr40714.json")
    cpus = tuple(dataclasses.replace(c, online=False) if c.cpu in offline else c for c in topology.cpus)
    return snapshot.dumps(dataclasses.replace(topology, cpus=cpus))


@pytest.fixture(scope="module")
def shaped(local: E2EEnv, node: str, pod_namespace: str, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[E2EEnv]:
    path = tmp_path_factory.mktemp("pr40714") / "default.json"
    path.write_text(pr40714(), encoding="utf-8")
    local.helm_upgrade("--set", "mode=dra", "--set", "agent.levels=book", "--set", "agent.minGroupCores=0",
                       "--set", "cpusetEnforcement=none", "--set-file", f"fakeTopology.snapshots.default\\.json={path}")
    try:
        wait_kubectl("the agent in DRA mode with the pr40714 books",
                     lambda: agent_ready(local) and published(local, node) == set(BOOKS), timeout=180)
        yield local
    finally:
        local.kubectl("delete", "pods,resourceclaims,resourceclaimtemplates", "--all", "-n", NS, "--wait=true",
                      "--ignore-not-found", timeout=120)
        local.helm_upgrade()
        wait_kubectl("the agent in device-plugin mode to be ready", lambda: agent_ready(local), timeout=180)


def devices(env: E2EEnv, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices(env, node) for d in s["spec"].get("devices") or []}


def published(env: E2EEnv, node: str) -> set[str]:
    return set(devices(env, node))


def template_pod(name: str, image: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeSelector": {"topology-e2e/worker": "true"}, "terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "book", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", "sleep 3600"],
                                     "resources": {"claims": [{"name": "book"}],
                                                   "requests": {"cpu": "100m", "memory": "16Mi"},
                                                   "limits": {"memory": "32Mi"}}}]}}


def claim_pod(name: str, image: str, claim_name: str) -> dict[str, Any]:
    p = template_pod(name, image, "unused")
    p["spec"]["resourceClaims"] = [{"name": "book", "resourceClaimName": claim_name}]
    return p


def selector_claim(name: str, expression: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "book", "exactly": {
                "deviceClassName": f"book.{DRIVER}", "allocationMode": "ExactCount", "count": 1,
                "selectors": [{"cel": {"expression": expression}}]}}]}}}


def pod_claim_device(env: E2EEnv, pod_name: str) -> str:
    """The device the scheduler allocated to the claim the controller manager made for the pod's template."""
    def claim_name() -> Any:
        statuses = kjson(env, "-n", NS, "get", "pod", pod_name)["status"].get("resourceClaimStatuses") or []
        return statuses[0].get("resourceClaimName") if statuses else None
    return allocated_device(env, wait_kubectl(f"the claim of {pod_name}", claim_name, timeout=60))


def unschedulable(env: E2EEnv, pod_name: str) -> dict[str, Any]:
    def check() -> Any:
        p = kjson(env, "-n", NS, "get", "pod", pod_name)
        conds = [c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return conds[0] if conds and conds[0]["status"] == "False" and conds[0].get("message") else None
    cond: dict[str, Any] = wait_kubectl(f"the scheduler's reason for {pod_name}", check, timeout=90)
    print(f"{pod_name} Pending: {cond['reason']}: {cond['message']}")
    assert cond["reason"] == "Unschedulable"
    assert "cannot allocate all claims" in cond["message"], cond["message"]
    return cond


def still_pending(env: E2EEnv, pod_name: str, claim_name: str | None = None) -> None:
    assert kjson(env, "-n", NS, "get", "pod", pod_name)["status"]["phase"] == "Pending"
    if claim_name:
        assert not kjson(env, "-n", NS, "get", "resourceclaim", claim_name).get("status", {}).get("allocation")


def test_published_sizes_of_the_pr40714_books(shaped: E2EEnv, node: str) -> None:
    found = devices(shaped, node)
    assert {name: d["attributes"]["cores"]["int"] for name, d in found.items()} == BOOKS
    assert {name: d["capacity"]["cores"]["value"] for name, d in found.items()} == {
        name: str(cores) for name, cores in BOOKS.items()}
    assert not any(d.get("taints") for d in found.values())


def test_cel_claim_for_n_cores_skips_the_small_book(shaped: E2EEnv, node: str) -> None:
    assert shipped_selector() == f'device.attributes["{DRIVER}"].cores >= 10'
    # N no book has: Pending with the scheduler's reason, while every book is free.
    apply(shaped, selector_claim("thirteen", shipped_selector().replace(">= 10", ">= 13")))
    apply(shaped, claim_pod("thirteen-pod", shaped.workload_image, "thirteen"))
    unschedulable(shaped, "thirteen-pod")
    still_pending(shaped, "thirteen-pod", "thirteen")
    delete(shaped, "pod/thirteen-pod", "resourceclaim/thirteen")
    # The shipped template, three times: the two 12-core books, then Pending although the 1-core book is free.
    apply(shaped, shipped_template())
    name = shipped_template()["metadata"]["name"]
    got = set()
    for pod_name in ("big-a", "big-b"):
        apply(shaped, template_pod(pod_name, shaped.workload_image, name))
        got.add(pod_claim_device(shaped, pod_name))
    assert got == {"drawer0-book0", "drawer0-book1"}
    apply(shaped, template_pod("big-c", shaped.workload_image, name))
    unschedulable(shaped, "big-c")
    still_pending(shaped, "big-c")
    # The small book is allocatable all along: a claim for >= 1 core gets it now.
    apply(shaped, selector_claim("any-size", shipped_selector().replace(">= 10", ">= 1")))
    apply(shaped, claim_pod("any-size-pod", shaped.workload_image, "any-size"))
    assert allocated_device(shaped, "any-size") == "drawer0-book2"
    still_pending(shaped, "big-c")
    delete(shaped, "pod/big-a", "pod/big-b", "pod/big-c", "pod/any-size-pod", "resourceclaim/any-size",
           f"resourceclaimtemplate/{name}")


def fake_topology_configmap(env: E2EEnv) -> str:
    items = kjson(env, "-n", env.namespace, "get", "configmaps", "-l",
                  f"app.kubernetes.io/instance={env.release}")["items"]
    (name,) = [c["metadata"]["name"] for c in items if c["metadata"]["name"].endswith("-fake-topology")]
    return str(name)


def set_snapshot(env: E2EEnv, text: str) -> None:
    env.kubectl("-n", env.namespace, "patch", "configmap", fake_topology_configmap(env), "--type", "merge", "-p",
                json.dumps({"data": {"default.json": text}}))


def tainted(env: E2EEnv, node: str) -> dict[str, list[Any]]:
    """Device -> its taints, without the ``timeAdded`` the API server stamps on each."""
    return {name: [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]
            for name, d in devices(env, node).items() if d.get("taints")}


def test_cpu_offline_taints_its_book_and_nothing_new_lands_on_it(shaped: E2EEnv, node: str) -> None:
    set_snapshot(shaped, pr40714(offline=(OFFLINE_CPU,)))
    try:
        # The kubelet rewrites the ConfigMap volume (syncFrequency 10 s here), the agent's rescan (5 s) sees the
        # snapshot changed, the group is no longer whole, and the publisher replaces the slices.
        got = wait_kubectl("book 1 tainted in the ResourceSlice", lambda: tainted(shaped, node), timeout=150)
        assert got == {"drawer0-book1": [TAINT]}, got
        apply(shaped, selector_claim("on-book1", f'device.attributes["{DRIVER}"].book == 1'))
        apply(shaped, claim_pod("on-book1-pod", shaped.workload_image, "on-book1"))
        unschedulable(shaped, "on-book1-pod")
        still_pending(shaped, "on-book1-pod", "on-book1")
        # A claim any big book satisfies gets the untainted one.
        apply(shaped, selector_claim("big", shipped_selector()))
        apply(shaped, claim_pod("big-pod", shaped.workload_image, "big"))
        assert allocated_device(shaped, "big") == "drawer0-book0"
    finally:
        set_snapshot(shaped, pr40714())
    wait_kubectl("the taint gone with the CPU back", lambda: not tainted(shaped, node), timeout=150)
    # Nothing new landed on it while it was tainted; now the waiting claim gets it.
    assert allocated_device(shaped, "on-book1") == "drawer0-book1"
    delete(shaped, "pod/on-book1-pod", "pod/big-pod", "resourceclaim/on-book1", "resourceclaim/big")

