"""What only several nodes show, on a real API server and scheduler: the kind lane's two workers
(``make kind-test``), a z16-shaped one (8 books of 4-6 cores) and a z13-shaped one (1 book of 8 cores).

* the scheduler places a book pod on the node that has a free book, overflows to the other one when a node's books
  are held, and leaves it Pending with its own reason when none is free;
* the per-node admission policy, judged by the API server with two real nodes: agent A's token cannot change node B,
  and its own node's labels still apply;
* ``helm upgrade`` rolling the DaemonSet across both nodes while each holds a book: no hold lost, no book shared;
* DRA: slices per node in one pool per node, a claim whose CEL selector only the z13 node's book meets allocated
  there, and ``helm uninstall`` removing every node's slices.

Skipped on a cluster with fewer than two workers (the local lane has one), unless REQUIRE_MULTINODE=1 (the kind lane
sets it: there a skip is a failure). The tests switch the release (``agent.levels``, ``mode: dra``) with the lane's
own values and put it back afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.policy.grouping import Grouping, GroupingSettings, group_topology
from tests.e2e.snapshots import expected
from tests.support.e2e.cluster import WORKER_LABEL, E2EEnv
from tests.support.e2e.kube import wait_kubectl

pytestmark = pytest.mark.e2e

DRIVER = "topology.s390x.ibm.com"
NODE_PREFIX = "topology.s390x.ibm.com/"
PODS = "topology-e2e-pods"
BOTH_LEVELS = ("--set-json", 'agent.levels=["book","socket"]')
DRA_VALUES = ("--set", "mode=dra", *BOTH_LEVELS)



def kjson(env: E2EEnv, *args: str) -> Any:
    return json.loads(env.kubectl(*args, "-o", "json").stdout)


def kubectl_input(env: E2EEnv, doc: dict[str, Any], *args: str, kubeconfig: Path | None = None,
                  check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([os.environ.get("TOPOLOGY_E2E_KUBECTL") or "kubectl", "--kubeconfig",
                           str(kubeconfig or env.kubeconfig), *args, "-f", "-"], input=json.dumps(doc), text=True,
                          check=check, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def nodes(e2e_env: E2EEnv) -> dict[str, str]:
    """{"z16": node, "z13": node}: the two workers by the shape of their snapshot."""
    names = sorted(n["metadata"]["name"] for n in kjson(e2e_env, "get", "nodes", "-l", f"{WORKER_LABEL}=true")["items"])
    if len(names) < 2:
        if os.environ.get("REQUIRE_MULTINODE") == "1":
            pytest.fail(f"REQUIRE_MULTINODE=1 but the cluster has {len(names)} worker(s): {names}")
        pytest.skip(f"needs two workers, the cluster has {len(names)} ({names}): run make kind-test")
    if not e2e_env.owns_install():
        pytest.skip(f"switches the release's levels and mode: not on the {e2e_env.lane} lane")
    shapes: dict[str, str] = {}
    for name in names:
        machine = expected(e2e_env.snapshots, name, e2e_env.prefix).topology.machine.machine_type or "?"
        shapes[{"3931": "z16", "2964": "z13"}.get(machine, machine)] = name
    assert set(shapes) >= {"z16", "z13"}, f"expected a z16- and a z13-shaped worker, got {shapes}"
    return shapes


def grouping(env: E2EEnv, node: str, levels: tuple[str, ...] = ("book", "socket")) -> Grouping:
    """What ``node`` advertises with ``agent.levels`` = ``levels`` (the agent's own policy code)."""
    settings = GroupingSettings(levels=levels, resource_prefix=env.prefix).validated()
    return group_topology(expected(env.snapshots, node, env.prefix).topology, settings)


def count(env: E2EEnv, node: str, resource: str) -> int:
    return sum(1 for g in grouping(env, node).groups if g.resource == resource)


def agents(env: E2EEnv) -> dict[str, dict[str, Any]]:
    """node -> the release's running, ready agent pod there."""
    pods = kjson(env, "-n", env.namespace, "get", "pods", "-l", f"app.kubernetes.io/instance={env.release}")["items"]
    ready = {}
    for p in pods:
        conditions = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}
        if p["status"].get("phase") == "Running" and conditions.get("Ready") == "True" \
                and not p["metadata"].get("deletionTimestamp"):
            ready[p["spec"]["nodeName"]] = p
    return ready


def rolled_out(env: E2EEnv, nodes: dict[str, str]) -> bool:
    ds = kjson(env, "-n", env.namespace, "get", "daemonset", "-l", f"app.kubernetes.io/instance={env.release}")
    s = ds["items"][0]["status"] if ds["items"] else {}
    done = s.get("desiredNumberScheduled", 0) == len(nodes) == s.get("updatedNumberScheduled", -1) \
        == s.get("numberReady", -1) and s.get("observedGeneration") == ds["items"][0]["metadata"]["generation"]
    return done and set(agents(env)) == set(nodes.values())


def allocatable(env: E2EEnv, node: str) -> dict[str, str]:
    status = kjson(env, "get", "node", node)["status"].get("allocatable", {})
    return {k: v for k, v in status.items() if k.startswith(f"{env.prefix}/") and v != "0"}


def book_pod(env: E2EEnv, name: str, books: int = 1, node: str | None = None) -> dict[str, Any]:
    """A pod asking for ``books`` books and 1 cpu (the admission policy wants an integer cpu), on any worker or on
    ``node``; it prints its CPU set and sleeps."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "nodeSelector": {WORKER_LABEL: "true", **({"kubernetes.io/hostname": node} if node else {})},
        "containers": [{
            "name": "main", "image": env.workload_image, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "echo CPUS=$TOPOLOGY_CPUS; grep Cpus_allowed_list /proc/self/status; "
                                    "exec sleep 3600"],
            "resources": {"requests": {"cpu": "1", "memory": "16Mi"},
                          "limits": {"cpu": "1", "memory": "32Mi", f"{env.prefix}/book": str(books)}}}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": PODS}, "spec": spec}


def running(env: E2EEnv, name: str, timeout: float = 120) -> dict[str, Any]:
    def check() -> Any:
        p = kjson(env, "-n", PODS, "get", "pod", name)
        return p if p["status"].get("phase") == "Running" else None
    return wait_kubectl(f"pod {name} Running", check, timeout=timeout)


def held_cpus(env: E2EEnv, name: str) -> str:
    log = wait_kubectl(f"pod {name} to print its CPUs", lambda: (
        text := env.kubectl("-n", PODS, "logs", name).stdout) and "CPUS=" in text and text, timeout=60)
    return next(line.split("=", 1)[1] for line in log.splitlines() if line.startswith("CPUS="))


def delete_all(env: E2EEnv) -> None:
    env.kubectl("delete", "pods,resourceclaims", "--all", "-n", PODS, "--wait=true", "--ignore-not-found",
                timeout=180)


def pending_reason(env: E2EEnv, name: str) -> str:
    pod = kjson(env, "-n", PODS, "get", "pod", name)
    for cond in pod["status"].get("conditions", []):
        if cond["type"] == "PodScheduled" and cond["status"] == "False":
            return str(cond.get("message", ""))
    return ""


# ------------------------------------------------------------------------------------------------------------
# device-plugin mode, books and sockets on both nodes


@pytest.fixture(scope="class")
def books(e2e_env: E2EEnv, nodes: dict[str, str], pod_namespace: str) -> Iterator[E2EEnv]:
    """The release advertising books (and sockets) on both nodes; its lane values again afterwards."""
    e2e_env.helm_upgrade(*BOTH_LEVELS)
    try:
        book = f"{e2e_env.prefix}/book"
        wait_kubectl("both nodes to advertise their books", lambda: rolled_out(e2e_env, nodes) and all(
            allocatable(e2e_env, n).get(book) == str(count(e2e_env, n, book))
            for n in nodes.values()), timeout=240)
        yield e2e_env
    finally:
        try:
            delete_all(e2e_env)
        finally:
            e2e_env.helm_upgrade()
            wait_kubectl("the release back on its lane values", lambda: rolled_out(e2e_env, nodes), timeout=240)


@pytest.mark.usefixtures("books")
class TestBooksAcrossNodes:
    def test_scheduler_places_books_where_free_overflows_then_pending(self, e2e_env: E2EEnv,
                                                                      nodes: dict[str, str]) -> None:
        env, book = e2e_env, f"{e2e_env.prefix}/book"
        z16_books = int(allocatable(env, nodes["z16"])[book])
        assert allocatable(env, nodes["z13"])[book] == "1"
        tag = uuid.uuid4().hex[:6]
        # the z13 node's one book held: a pod that may go to either worker lands on the z16 node, though the z13 node
        # has a CPU free
        kubectl_input(env, book_pod(env, f"hold-z13-{tag}", node=nodes["z13"]), "create")
        assert running(env, f"hold-z13-{tag}")["spec"]["nodeName"] == nodes["z13"]
        kubectl_input(env, book_pod(env, f"any-{tag}"), "create")
        placed = running(env, f"any-{tag}")["spec"]["nodeName"]
        assert placed == nodes["z16"], f"a book pod went to {placed} whose only book is held"
        assert held_cpus(env, f"any-{tag}") in {g.cpulist for g in grouping(env, nodes["z16"]).groups
                                                if g.resource == book}
        # every other z16 book held by one pod: no book free anywhere, the next one stays Pending
        kubectl_input(env, book_pod(env, f"rest-z16-{tag}", books=z16_books - 1, node=nodes["z16"]), "create")
        running(env, f"rest-z16-{tag}")
        kubectl_input(env, book_pod(env, f"none-{tag}"), "create")
        reason = wait_kubectl("the scheduler's reason", lambda: f"2 Insufficient {book}" in (
            r := pending_reason(env, f"none-{tag}")) and r, timeout=60)
        print(f"scheduler: {reason}")
        assert kjson(env, "-n", PODS, "get", "pod", f"none-{tag}")["status"]["phase"] == "Pending"
        # a book freed on the z13 node: the Pending pod goes there
        env.kubectl("-n", PODS, "delete", "pod", f"hold-z13-{tag}", "--wait=true")
        assert running(env, f"none-{tag}")["spec"]["nodeName"] == nodes["z13"]
        delete_all(env)

    def test_helm_upgrade_rolls_both_nodes_while_each_holds_a_book(self, e2e_env: E2EEnv,
                                                                   nodes: dict[str, str]) -> None:
        env, book = e2e_env, f"{e2e_env.prefix}/book"
        tag = uuid.uuid4().hex[:6]
        holders = {shape: f"hold-{shape}-{tag}" for shape in nodes}
        for shape, name in holders.items():
            kubectl_input(env, book_pod(env, name, node=nodes[shape]), "create")
        cpus = {shape: held_cpus(env, name) for shape, name in holders.items()}
        uids = {shape: running(env, name)["metadata"]["uid"] for shape, name in holders.items()}
        before = {n: p["metadata"]["uid"] for n, p in agents(env).items()}
        env.helm_upgrade(*BOTH_LEVELS, "--set-string", f"podAnnotations.e2e-rollout={tag}")
        wait_kubectl("the DaemonSet rolled on both nodes", lambda: rolled_out(env, nodes) and all(
            p["metadata"]["uid"] != before[n] for n, p in agents(env).items()), timeout=240)
        for shape, name in holders.items():  # no hold lost: the same pods, running, never restarted
            pod = kjson(env, "-n", PODS, "get", "pod", name)
            assert pod["metadata"]["uid"] == uids[shape] and pod["status"]["phase"] == "Running", pod["status"]
            assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
        # the new agents registered and kubelet's node status says so again (it lags the rollout by up to its
        # nodeStatusUpdateFrequency; until then allocatable reads 0 and a Pending pod would prove nothing)
        wait_kubectl("both nodes to advertise their books again", lambda: all(
            allocatable(env, n).get(book) == str(count(env, n, book)) for n in nodes.values()), timeout=120)
        # no book shared: the z13 node's one book stays held (a new pod there is Pending), the z16 node hands out
        # another book than the held one
        kubectl_input(env, book_pod(env, f"new-z13-{tag}", node=nodes["z13"]), "create")
        wait_kubectl("a second book pod on the z13 node Pending", lambda: f"Insufficient {book}" in pending_reason(
            env, f"new-z13-{tag}"), timeout=60)
        kubectl_input(env, book_pod(env, f"new-z16-{tag}", node=nodes["z16"]), "create")
        running(env, f"new-z16-{tag}")
        assert held_cpus(env, f"new-z16-{tag}") != cpus["z16"]
        assert allocatable(env, nodes["z13"]).get(book) == "1"
        delete_all(env)


# ------------------------------------------------------------------------------------------------------------
# the per-node admission policy


def agent_kubeconfig(env: E2EEnv, node: str, path: Path) -> Path:
    """A kubeconfig with the token kubelet would give the agent pod on ``node`` (bound to that pod)."""
    pod = agents(env)[node]
    token = env.kubectl("-n", env.namespace, "create", "token", pod["spec"]["serviceAccountName"],
                        "--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"]).stdout.strip()
    cluster = kjson(env, "config", "view", "--raw", "--minify")["clusters"][0]["cluster"]
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "agent",
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [{"name": "agent", "context": {"cluster": "c", "user": "agent"}}],
        "users": [{"name": "agent", "user": {"token": token}}]}))
    return path


def test_agent_token_of_one_node_cannot_patch_the_other(e2e_env: E2EEnv, nodes: dict[str, str],
                                                        tmp_path: Path) -> None:
    env = e2e_env
    wait_kubectl("an agent on each node", lambda: set(agents(env)) >= set(nodes.values()), timeout=180)
    a, b = nodes["z16"], nodes["z13"]
    as_a = agent_kubeconfig(env, a, tmp_path / "agent-a")
    kubectl = os.environ.get("TOPOLOGY_E2E_KUBECTL") or "kubectl"
    key = f"{NODE_PREFIX}e2e-probe"

    def label(node: str, value: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl, "--kubeconfig", str(as_a), "label", "node", node, f"{key}={value}",
                               "--overwrite"], text=True, capture_output=True, timeout=60, check=False)

    try:
        foreign = label(b, "from-a")
        print(f"agent A labelling node B: {foreign.stderr.strip()}")
        assert foreign.returncode != 0
        assert f"the topology agent running on node {a} may not update Node {b}: only its own" in foreign.stderr
        assert key not in (kjson(env, "get", "node", b)["metadata"].get("labels") or {})
        own = label(a, "own")
        assert own.returncode == 0, own.stderr
        assert kjson(env, "get", "node", a)["metadata"]["labels"].get(key) == "own"
    finally:
        env.kubectl("label", "node", a, b, f"{key}-")


# ------------------------------------------------------------------------------------------------------------
# DRA mode on both nodes


def slices(env: E2EEnv, node: str | None = None) -> list[dict[str, Any]]:
    where = f"spec.driver={DRIVER}" + (f",spec.nodeName={node}" if node else "")
    return sorted(kjson(env, "get", "resourceslices", "--field-selector", where)["items"],
                  key=lambda s: s["metadata"]["name"])


def complete_pool(items: list[dict[str, Any]]) -> bool:
    """Every slice of the pool's newest generation is published (resourceSliceCount of them)."""
    if not items:
        return False
    generation = max(s["spec"]["pool"]["generation"] for s in items)
    newest = [s for s in items if s["spec"]["pool"]["generation"] == generation]
    return len(newest) == newest[0]["spec"]["pool"]["resourceSliceCount"]


@pytest.fixture(scope="class")
def dra(e2e_env: E2EEnv, nodes: dict[str, str], pod_namespace: str) -> Iterator[E2EEnv]:
    e2e_env.helm_upgrade(*DRA_VALUES)
    try:
        wait_kubectl("both agents in DRA mode with their slices", lambda: rolled_out(e2e_env, nodes) and all(
            complete_pool(slices(e2e_env, n)) for n in nodes.values()), timeout=240)
        yield e2e_env
    finally:
        try:
            delete_all(e2e_env)
        finally:
            e2e_env.helm_upgrade(install=True)
            wait_kubectl("the release back in device-plugin mode", lambda: rolled_out(e2e_env, nodes), timeout=240)


def claim(name: str, selector: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": PODS},
            "spec": {"devices": {"requests": [{"name": "book", "exactly": {
                "deviceClassName": f"book.{DRIVER}", "allocationMode": "ExactCount", "count": 1,
                "selectors": [{"cel": {"expression": selector}}]}}]}}}


def claim_pod(env: E2EEnv, name: str, claim_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": PODS}, "spec": {
        "terminationGracePeriodSeconds": 1, "nodeSelector": {WORKER_LABEL: "true"},
        "resourceClaims": [{"name": "c", "resourceClaimName": claim_name}],
        "containers": [{"name": "main", "image": env.workload_image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "echo CPUS=$TOPOLOGY_CPUS; exec sleep 3600"],
                        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"memory": "32Mi"},
                                      "claims": [{"name": "c"}]}}]}}


@pytest.mark.usefixtures("dra")
class TestDraAcrossNodes:
    def test_one_pool_per_node_with_that_nodes_devices(self, e2e_env: E2EEnv, nodes: dict[str, str]) -> None:
        for shape, node in nodes.items():
            items = slices(e2e_env, node)
            pools = {s["spec"]["pool"]["name"] for s in items}
            assert pools == {node}, f"{shape} node {node}: pools {pools}"
            devices = {d["name"] for s in items for d in s["spec"].get("devices", [])}
            want = {g.id for g in grouping(e2e_env, node).groups}
            assert devices == want, f"{shape}: {sorted(devices ^ want)}"
        assert {s["spec"]["nodeName"] for s in slices(e2e_env)} == set(nodes.values())

    def test_a_claim_only_the_z13_book_meets_is_allocated_there(self, e2e_env: E2EEnv,
                                                                  nodes: dict[str, str]) -> None:
        env, tag = e2e_env, uuid.uuid4().hex[:6]
        # z13's book has 8 cores, every z16 book 4 to 6
        selector = f'device.attributes["{DRIVER}"].cores >= 7'
        for i in (1, 2):
            kubectl_input(env, claim(f"big-{i}-{tag}", selector), "create")
            kubectl_input(env, claim_pod(env, f"big-{i}-{tag}", f"big-{i}-{tag}"), "create")
        first = running(env, f"big-1-{tag}")
        assert first["spec"]["nodeName"] == nodes["z13"]
        allocation = kjson(env, "-n", PODS, "get", "resourceclaim", f"big-1-{tag}")["status"]["allocation"]
        result = allocation["devices"]["results"][0]
        assert result["pool"] == nodes["z13"] and result["device"].startswith("drawer4-book1"), result
        terms = allocation["nodeSelector"]["nodeSelectorTerms"]
        assert nodes["z13"] in json.dumps(terms)
        assert held_cpus(env, f"big-1-{tag}") == "0-7"
        # the only such book is taken: the second stays Pending although the z16 node has 8 free books
        reason = wait_kubectl("the second big claim unschedulable", lambda: pending_reason(env, f"big-2-{tag}"),
                              timeout=60)
        print(f"scheduler: {reason}")
        time.sleep(3)
        assert kjson(env, "-n", PODS, "get", "pod", f"big-2-{tag}")["status"]["phase"] == "Pending"
        delete_all(env)

    def test_uninstall_removes_every_nodes_slices(self, e2e_env: E2EEnv, nodes: dict[str, str]) -> None:
        delete_all(e2e_env)  # no claim left prepared: its pod could not be torn down without the agent
        assert {s["spec"]["nodeName"] for s in slices(e2e_env)} == set(nodes.values())
        e2e_env.helm("uninstall", e2e_env.release, "--wait", "--timeout", "180s")
        wait_kubectl("every node's slices gone", lambda: not slices(e2e_env), timeout=30, every=0.25)
