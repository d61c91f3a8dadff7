"""DRA mode on the real cluster: the release switched to ``mode: dra`` and back.

Off by default, so the e2e run (``make e2e``) is untouched; on the local lane (a real single-node cluster on this
machine, docs/contributing/lanes/real-cluster.md) with the chart installed and the image built from this tree::

    TOPOLOGY_E2E_DRA=1 TOPOLOGY_E2E_KUBECONFIG=.cluster/kubeconfig TOPOLOGY_E2E_LANE=local \\
    TOPOLOGY_E2E_SNAPSHOTS=.cluster/snapshots TOPOLOGY_E2E_HELM=.tools/bin/helm \\
    TOPOLOGY_E2E_KUBECTL="$(devkit/cluster/build.sh --print)/kubectl" \\
    TOPOLOGY_E2E_WORKLOAD_IMAGE=localhost/topology-e2e-busybox:latest \\
    .venv/bin/pytest -m e2e tests/e2e/test_dra.py -v -p no:cacheprovider

(or ``PYTEST_ARGS=tests/e2e/test_dra.py TOPOLOGY_E2E_DRA=1 make e2e``). The module's fixture runs ``helm upgrade`` with
``--set mode=dra --set-json agent.levels=["book","socket"]`` and puts the release back in device-plugin mode at the end.
The node's fake topology is one single-threaded book (with one socket) per real CPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology import snapshot_format as snapshot
from agent.topology.model import Topology
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.dra import (
    DRA_VALUES,
    DRIVER,
    agent_pod,
    agent_ready,
    allocated_device,
    claim,
    delete,
    pod,
    slices,
)
from tests.support.e2e.kube import apply, kjson, wait_kubectl

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TOPOLOGY_E2E_DRA") != "1", reason="DRA mode e2e: set TOPOLOGY_E2E_DRA=1"),
]



@pytest.fixture(scope="module")
def dra(local: E2EEnv, node: str, pod_namespace: str) -> Iterator[E2EEnv]:
    """The release in DRA mode for this module; device-plugin mode again afterwards."""
    local.helm_upgrade(*DRA_VALUES)
    try:
        wait_kubectl("the agent in DRA mode to be ready", lambda: agent_ready(local) and len(slices(local, node)) == 2,
                     timeout=180)
        yield local
    finally:
        local.kubectl("delete", "pods,resourceclaims", "--all", "-n", "topology-e2e-pods", "--wait=true",
                      "--ignore-not-found", timeout=120)
        local.helm_upgrade()
        wait_kubectl("the agent in device-plugin mode to be ready", lambda: agent_ready(local), timeout=180)


def running(env: E2EEnv, name: str) -> dict[str, Any]:
    def check() -> Any:
        p = kjson(env, "-n", "topology-e2e-pods", "get", "pod", name)
        return p if p["status"].get("phase") == "Running" else None
    return wait_kubectl(f"pod {name} Running", check, timeout=120)


def container_view(env: E2EEnv, name: str) -> tuple[dict[str, str], str]:
    out = env.kubectl("-n", "topology-e2e-pods", "exec", name, "--", "sh", "-c",
                      "env; grep Cpus_allowed_list /proc/self/status").stdout
    envs = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    allowed = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Cpus_allowed_list"))
    return envs, allowed


def test_slices_validate_with_attributes_and_counters(dra: E2EEnv, node: str) -> None:
    items = slices(dra, node)
    assert [s["metadata"]["name"] for s in items] == [f"{node}-topology-counters-0", f"{node}-topology-devices-0"]
    counters, devices = items
    assert {s["spec"]["pool"]["name"] for s in items} == {node}
    assert len({s["spec"]["pool"]["generation"] for s in items}) == 1
    assert counters["spec"]["sharedCounters"] == [{"name": "drawer0", "counters": {
        "book0-socket0": {"value": "1"}, "book1-socket0": {"value": "1"}}}]
    by_name = {d["name"]: d for d in devices["spec"]["devices"]}
    assert sorted(by_name) == ["drawer0-book0", "drawer0-book0-socket0", "drawer0-book1", "drawer0-book1-socket0"]
    book = by_name["drawer0-book1"]
    assert book["attributes"]["level"] == {"string": "book"} and book["attributes"]["cores"] == {"int": 1}
    assert book["capacity"]["cores"]["value"] == "1"
    assert book["consumesCounters"] == [{"counterSet": "drawer0", "counters": {"book1-socket0": {"value": "1"}}}]
    owner = devices["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", node)
    classes = {c["metadata"]["name"]: c for c in kjson(dra, "get", "deviceclasses")["items"]}
    assert classes[f"book.{DRIVER}"]["spec"]["extendedResourceName"] == "topology/book"
    assert classes[f"socket.{DRIVER}"]["spec"]["extendedResourceName"] == "topology/socket"
    assert "extendedResourceName" not in classes[f"drawer.{DRIVER}"]["spec"]


def test_node_restriction_policy_holds_slices_to_the_agents_node(dra: E2EEnv, node: str, tmp_path: Path) -> None:
    ds = kjson(dra, "-n", dra.namespace, "get", "daemonset", "-l", f"app.kubernetes.io/instance={dra.release}")
    account = ds["items"][0]["spec"]["template"]["spec"]["serviceAccountName"]
    token = dra.kubectl("-n", dra.namespace, "create", "token", account, "--bound-object-kind", "Pod",
                        "--bound-object-name", agent_pod(dra)["metadata"]["name"]).stdout.strip()
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "e2e-foreign-slice"},
            "spec": {"driver": DRIVER, "nodeName": "some-other-node",
                     "pool": {"name": "some-other-node", "generation": 1, "resourceSliceCount": 1}, "devices": []}}
    # A kubeconfig with that token alone (the lane's own carries an admin client certificate, which would win).
    cluster = kjson(dra, "config", "view", "--raw", "--minify")["clusters"][0]["cluster"]
    as_agent = tmp_path / "agent-kubeconfig"
    as_agent.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "agent",
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [{"name": "agent", "context": {"cluster": "c", "user": "agent"}}],
        "users": [{"name": "agent", "user": {"token": token}}]}))
    kubectl = os.environ.get("TOPOLOGY_E2E_KUBECTL") or "kubectl"
    who = subprocess.run([kubectl, "--kubeconfig", str(as_agent), "auth", "whoami", "-o", "json"], text=True,
                         capture_output=True, timeout=60, check=True).stdout
    extra = json.loads(who)["status"]["userInfo"].get("extra", {})
    assert extra.get("authentication.kubernetes.io/node-name") == [node], who
    result = subprocess.run([kubectl, "--kubeconfig", str(as_agent), "create", "-f", "-"], input=json.dumps(body),
                            text=True, capture_output=True, timeout=60, check=False)
    print(f"a ResourceSlice of another node, as the agent: {result.stderr.strip()}")
    assert result.returncode != 0
    assert ("the topology agent running on node " + node + " may not create a ResourceSlice of node some-other-node"
            in result.stderr), result.stderr


def test_book_claim_prepared_with_environment_and_cpuset(dra: E2EEnv, node: str) -> None:
    apply(dra, claim("one-book", f"book.{DRIVER}"))
    apply(dra, pod("book-pod", dra.workload_image, "one-book"))
    running(dra, "book-pod")
    device = allocated_device(dra, "one-book")
    uid = kjson(dra, "-n", "topology-e2e-pods", "get", "resourceclaim", "one-book")["metadata"]["uid"]
    book_cpu = device.removeprefix("drawer0-book")  # one CPU per book: book N is CPU N
    envs, _ = container_view(dra, "book-pod")
    assert envs["TOPOLOGY_GROUPS"] == device and envs["TOPOLOGY_CPUS"] == book_cpu
    assert envs["TOPOLOGY_RANKS"] == "1" and envs["CPU_VISIBLE_MEMORY_NODES"] == "0"
    wait_kubectl("the container's cpuset to be the book's CPUs",
                 lambda: container_view(dra, "book-pod")[1] == book_cpu, timeout=60)
    cdi = f"/var/run/cdi/{DRIVER}-book_{uid}.json"
    spec = json.loads(dra.node_shell(node, f"cat {cdi}"))
    assert spec["kind"] == f"{DRIVER}/book"


def test_socket_inside_the_held_book_stays_pending_another_is_allocated(dra: E2EEnv, node: str) -> None:
    held = allocated_device(dra, "one-book")  # from the test above
    book = int(held.removeprefix("drawer0-book"))
    apply(dra, claim("inside", f"socket.{DRIVER}", f'device.attributes["{DRIVER}"].book == {book}'))
    apply(dra, pod("inside-pod", dra.workload_image, "inside"))
    other = 1 - book
    apply(dra, claim("outside", f"socket.{DRIVER}", f'device.attributes["{DRIVER}"].book == {other}'))
    apply(dra, pod("outside-pod", dra.workload_image, "outside"))
    running(dra, "outside-pod")
    assert allocated_device(dra, "outside") == f"drawer0-book{other}-socket0"

    def unschedulable() -> Any:
        p = kjson(dra, "-n", "topology-e2e-pods", "get", "pod", "inside-pod")
        conds = [c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return conds[0] if conds and conds[0]["status"] == "False" and conds[0].get("message") else None

    cond = wait_kubectl("the scheduler's reason for inside-pod", unschedulable, timeout=60)
    print(f"inside-pod Pending: {cond['reason']}: {cond['message']}")
    time.sleep(5)
    assert kjson(dra, "-n", "topology-e2e-pods", "get", "pod", "inside-pod")["status"]["phase"] == "Pending"
    assert not kjson(dra, "-n", "topology-e2e-pods", "get", "resourceclaim", "inside").get("status", {}).get(
        "allocation")
    delete(dra, "pod/inside-pod", "pod/outside-pod", "resourceclaim/inside", "resourceclaim/outside")


def test_agent_restart_same_slices_no_reprepare(dra: E2EEnv, node: str) -> None:
    before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices(dra, node)}
    old = agent_pod(dra)["metadata"]["name"]
    dra.kubectl("-n", dra.namespace, "delete", "pod", old, "--wait=true", timeout=120)
    wait_kubectl("a new agent ready", lambda: agent_ready(dra) and agent_pod(dra)["metadata"]["name"] != old,
                 timeout=180)
    time.sleep(3)
    after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices(dra, node)}
    print(f"slices before the agent restart {before}, after {after}")
    assert after == before  # the same slices: not one write
    logs = dra.kubectl("-n", dra.namespace, "logs", agent_pod(dra)["metadata"]["name"]).stdout
    assert "restored 1 prepared claim(s)" in logs, logs[-2000:]
    assert "prepared claim topology-e2e-pods/one-book" not in logs
    envs, _ = container_view(dra, "book-pod")
    assert envs["TOPOLOGY_GROUPS"] == allocated_device(dra, "one-book")


def test_kubelet_restart_keeps_the_claim_and_restores_the_slices(dra: E2EEnv, node: str) -> None:
    """kubelet wipes every driver's slices of its node at its start: the registration that follows republishes."""
    registered_before = agent_pod(dra)["metadata"]["name"]
    dra.restart_kubelet(node)
    wait_kubectl("the node's slices back", lambda: len(slices(dra, node)) == 2, timeout=120)
    wait_kubectl("the agent ready again", lambda: agent_ready(dra), timeout=120)
    assert agent_pod(dra)["metadata"]["name"] == registered_before  # the same agent, not restarted
    assert kjson(dra, "-n", "topology-e2e-pods", "get", "pod", "book-pod")["status"]["phase"] == "Running"
    # Right after its start kubelet answers exec with "unable to upgrade connection: pod does not exist" until it
    # has synced its pods: wait for that, then the claim's environment and cpuset are still there.
    envs, allowed = wait_kubectl("exec into book-pod after the kubelet restart",
                                 lambda: container_view(dra, "book-pod"))
    device = allocated_device(dra, "one-book")
    assert envs["TOPOLOGY_GROUPS"] == device and allowed == device.removeprefix("drawer0-book")


def test_claim_deleted_unprepared_and_cdi_file_gone(dra: E2EEnv, node: str) -> None:
    uid = kjson(dra, "-n", "topology-e2e-pods", "get", "resourceclaim", "one-book")["metadata"]["uid"]
    cdi = f"/var/run/cdi/{DRIVER}-book_{uid}.json"
    delete(dra, "pod/book-pod", "resourceclaim/one-book")
    wait_kubectl("the CDI file removed", lambda: dra.node_shell(node, f"test -e {cdi} && echo present || echo gone")
                 .strip() == "gone", timeout=60)


def test_extended_resource_pod_served_through_dra(dra: E2EEnv, node: str) -> None:
    apply(dra, pod("ext-pod", dra.workload_image, limits={"topology/book": 1}, cpu="1"))
    p = running(dra, "ext-pod")
    status = p["status"].get("extendedResourceClaimStatus")
    assert status and status["resourceClaimName"], p["status"]
    envs, _ = container_view(dra, "ext-pod")
    assert envs["TOPOLOGY_GROUPS"] in ("drawer0-book0", "drawer0-book1")
    book_cpu = envs["TOPOLOGY_GROUPS"].removeprefix("drawer0-book")
    wait_kubectl("the extended-resource pod's cpuset", lambda: container_view(dra, "ext-pod")[1] == book_cpu,
                 timeout=60)
    delete(dra, "pod/ext-pod")


# --- device health in the pod's status (DRAResourceHealth) -------------------------------------------
# In this module so that it shares its DRA-mode release (one helm upgrade each way, not two).
# DRA device health in the pod's status on the real cluster, reported through DRAResourceHealth where the kubelet
# supports it (KEP-4680, ``ResourceHealthStatus`` beta and on by default since 1.36 in the kubelet
# and the API server, so the lane sets no gate).
#
# A pod holds a book through a ResourceClaim; the book is made unhealthy by taking its CPU offline in the fake
# topology (the snapshot's ``online`` flag in the chart's fake-topology ConfigMap, changed under the running agent:
# no real CPU of this machine goes offline); the agent's rescan finds the group no longer whole and its health
# stream tells the kubelet, which writes ``status.containerStatuses[].allocatedResourcesStatus``:
# ``claim:<name>`` with the claim's CDI device id and ``Unhealthy`` (and the agent's reason as the message,
# ``ResourceHealthStatusMessage``). With the CPU back, ``Healthy`` again.
#
# How long it takes: the kubelet rewrites the ConfigMap volume at the pod's next sync (``syncFrequency``; 1 min by
# default, 10 s on the lane), the agent rescans every 5 s, the stream sends at once, the kubelet syncs the pod's
# status.

NS = "topology-e2e-pods"
LEVELS = ("book", "socket")  # DRA_VALUES' agent.levels


def lane_topology(env: E2EEnv) -> Topology:
    return snapshot.load(env.snapshots / "default.json")


def cpus_of(topology: Topology, device: str) -> tuple[int, ...]:
    grouping = group_topology(topology, GroupingSettings(levels=LEVELS, min_group_cores=0, allow_non_s390x=True))
    (group,) = [g for g in grouping.groups if g.id == device]
    return group.cpus


def offline(topology: Topology, cpus: tuple[int, ...]) -> str:
    return snapshot.dumps(dataclasses.replace(topology, cpus=tuple(
        dataclasses.replace(c, online=False) if c.cpu in cpus else c for c in topology.cpus)))


def set_snapshot(env: E2EEnv, text: str) -> None:
    items = kjson(env, "-n", env.namespace, "get", "configmaps", "-l",
                  f"app.kubernetes.io/instance={env.release}")["items"]
    (name,) = [c["metadata"]["name"] for c in items if c["metadata"]["name"].endswith("-fake-topology")]
    env.kubectl("-n", env.namespace, "patch", "configmap", name, "--type", "merge", "-p",
                json.dumps({"data": {"default.json": text}}))


def claim_health(env: E2EEnv, pod_name: str) -> list[dict[str, Any]]:
    """The pod's main container's allocatedResourcesStatus entries for its claim ``c`` (tests.e2e.test_dra.pod)."""
    p = kjson(env, "-n", NS, "get", "pod", pod_name)
    (status,) = [c for c in p["status"].get("containerStatuses", []) if c["name"] == "main"]
    entries = [e for e in status.get("allocatedResourcesStatus") or [] if e["name"] == "claim:c"]
    return [r for e in entries for r in e.get("resources") or []]


def health_is(env: E2EEnv, pod_name: str, health: str) -> list[dict[str, Any]] | None:
    resources = claim_health(env, pod_name)
    return resources if resources and all(r["health"] == health for r in resources) else None


def test_a_book_gone_unhealthy_shows_in_its_pods_status(dra: E2EEnv, node: str) -> None:
    apply(dra, claim("health-book", f"book.{DRIVER}"))
    apply(dra, pod("health-pod", dra.workload_image, "health-book"))
    running(dra, "health-pod")
    device = allocated_device(dra, "health-book")
    topology = lane_topology(dra)
    cpus = cpus_of(topology, device)

    # The stream's first report: Healthy, under the claim's CDI device id (kubelet's ResourceID).
    healthy = wait_kubectl("the claim Healthy in the pod's status", lambda: health_is(dra, "health-pod", "Healthy"),
                           timeout=120)
    print(f"before: {healthy}")
    (resource,) = healthy
    assert resource["resourceID"].startswith(f"{DRIVER}/book="), resource

    set_snapshot(dra, offline(topology, cpus))
    try:
        got = wait_kubectl(f"{device} Unhealthy in the pod's status", lambda: health_is(dra, "health-pod", "Unhealthy"),
                           timeout=180)
        print(f"CPUs {cpus} offline: {got}")
        (resource,) = got
        assert "offline" in resource.get("message", ""), resource  # ResourceHealthStatusMessage (beta, on)
        assert kjson(dra, "-n", NS, "get", "pod", "health-pod")["status"]["phase"] == "Running"  # nothing stops it
    finally:
        set_snapshot(dra, snapshot.dumps(topology))
    wait_kubectl(f"{device} Healthy again", lambda: health_is(dra, "health-pod", "Healthy"), timeout=180)
    delete(dra, "pod/health-pod", "resourceclaim/health-book")


# --- holds across an agent restart, admin access -------------------------------------------------------
def published(env: E2EEnv, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices(env, node) for d in s["spec"].get("devices", [])}


def test_a_restart_on_a_changed_topology_keeps_the_groups_a_claim_holds(dra: E2EEnv, node: str) -> None:
    """A DRA agent restarted after the topology changed keeps the groups it published while a claim holds one (its
    checkpoint and pod-resources' claim rows are read before the grouping is chosen): the other book, offline now,
    stays published (tainted not-whole) instead of a fresh grouping being published as a new pool generation."""
    apply(dra, claim("kept-book", f"book.{DRIVER}"))
    apply(dra, pod("kept-pod", dra.workload_image, "kept-book"))
    running(dra, "kept-pod")
    held = allocated_device(dra, "kept-book")
    other = "drawer0-book1" if held == "drawer0-book0" else "drawer0-book0"
    topology = lane_topology(dra)
    set_snapshot(dra, offline(topology, cpus_of(topology, other)))
    try:
        wait_kubectl(f"{other} tainted in the slices", lambda: published(dra, node).get(other, {}).get("taints"),
                     timeout=180)
        old = agent_pod(dra)["metadata"]["name"]
        dra.kubectl("-n", dra.namespace, "delete", "pod", old, "--wait=true", timeout=120)
        wait_kubectl("a new agent ready", lambda: agent_ready(dra) and agent_pod(dra)["metadata"]["name"] != old,
                     timeout=180)
        devices = published(dra, node)
        print(f"after the restart: {sorted(devices)}; {other} taints {devices.get(other, {}).get('taints')}")
        assert sorted(devices) == sorted([held, f"{held}-socket0", other, f"{other}-socket0"])
        assert devices[other].get("taints") and not devices[held].get("taints")
        logs = dra.kubectl("-n", dra.namespace, "logs", agent_pod(dra)["metadata"]["name"]).stdout
        assert "keeping the 4 groups advertised before the restart" in logs, logs[-2000:]
    finally:
        set_snapshot(dra, snapshot.dumps(topology))
    wait_kubectl(f"{other} whole again", lambda: not published(dra, node).get(other, {}).get("taints"), timeout=180)
    delete(dra, "pod/kept-pod", "resourceclaim/kept-book")


def enforcement_steps(env: E2EEnv) -> float:
    """The agent's ``topology_agent_cpuset_enforcement_steps_total`` (its metrics port, from this node)."""
    import urllib.request

    address = agent_pod(env)["status"]["podIP"]
    with urllib.request.urlopen(f"http://{address}:9400/metrics", timeout=5) as response:
        text = response.read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("topology_agent_cpuset_enforcement_steps_total "))


def test_an_admin_access_claim_is_observed_not_pinned(dra: E2EEnv, node: str) -> None:
    """An admin-access claim for a book, then a claim for the socket inside it: the scheduler allocates both (an
    admin-access allocation consumes no counters: ``foreachAllocatedDevice`` skips it; the other order is refused by
    the counters). Both are prepared; the socket's holder is pinned to its CPUs, the admin container is not, and its
    environment names the book to observe, with nothing to bind to and no claim to pin by."""
    dra.kubectl("label", "namespace", NS, "resource.kubernetes.io/admin-access=true", "--overwrite")
    try:
        admin = claim("observes-book", f"book.{DRIVER}")
        admin["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
        apply(dra, admin)
        apply(dra, pod("observer", dra.workload_image, "observes-book", cpu="0"))
        running(dra, "observer")
        book = allocated_device(dra, "observes-book")
        index = int(book.removeprefix("drawer0-book"))
        apply(dra, claim("holds-socket", f"socket.{DRIVER}", f'device.attributes["{DRIVER}"].book == {index}'))
        apply(dra, pod("socket-holder", dra.workload_image, "holds-socket", cpu="0"))
        running(dra, "socket-holder")
        assert allocated_device(dra, "holds-socket") == f"{book}-socket0"
        cpu = str(index)
        wait_kubectl("the socket's holder pinned", lambda: container_view(dra, "socket-holder")[1] == cpu, timeout=60)
        envs, allowed = container_view(dra, "observer")
        print(f"observer: TOPOLOGY_GROUPS={envs.get('TOPOLOGY_GROUPS')} Cpus_allowed_list={allowed}")
        assert envs.get("TOPOLOGY_ADMIN_ACCESS") == "true" and envs.get("TOPOLOGY_GROUPS") == book
        assert "TOPOLOGY_DRA_CLAIM" not in envs and "VLLM_CPU_OMP_THREADS_BIND" not in envs
        # Two more looks at the runtime by the enforcement loop (every 2 s), and it is still not pinned.
        steps = enforcement_steps(dra)
        wait_kubectl("two enforcement steps", lambda: enforcement_steps(dra) >= steps + 2, timeout=60)
        assert container_view(dra, "observer")[1] != cpu
    finally:
        delete(dra, "pod/observer", "pod/socket-holder", "resourceclaim/observes-book", "resourceclaim/holds-socket")
        dra.kubectl("label", "namespace", NS, "resource.kubernetes.io/admin-access-")
