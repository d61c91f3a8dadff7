"""DRA device health in the pod's status on the real cluster (issue 22: health "reported through DRAResourceHealth
where the kubelet supports it"; KEP-4680, ``ResourceHealthStatus`` beta and on by default since 1.36 in the kubelet
and the API server, so the lane sets no gate).

A pod holds a book through a ResourceClaim; the book is made unhealthy by taking its CPU offline in the fake
topology (the snapshot's ``online`` flag in the chart's fake-topology ConfigMap, changed under the running agent:
no real CPU of this machine goes offline); the agent's rescan finds the group no longer whole and its health
stream tells the kubelet, which writes ``status.containerStatuses[].allocatedResourcesStatus``:
``claim:<name>`` with the claim's CDI device id and ``Unhealthy`` (and the agent's reason as the message,
``ResourceHealthStatusMessage``). With the CPU back, ``Healthy`` again.

How long it takes: the kubelet rewrites the ConfigMap volume at the pod's next sync (``syncFrequency``; 1 min by
default, 10 s on the lane), the agent rescans every 5 s, the stream sends at once, the kubelet syncs the pod's
status. Off by default (``TOPOLOGY_E2E_DRA=1``); run it as tests/e2e/test_dra.py says, with this file's path.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology import snapshot
from agent.topology.model import Topology
from tests.e2e.conftest import E2EEnv
from tests.e2e.test_dra import (
    DRA_VALUES,
    DRIVER,
    agent_ready,
    allocated_device,
    apply,
    claim,
    delete,
    kjson,
    pod,
    running,
    slices,
    wait_for,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TOPOLOGY_E2E_DRA") != "1", reason="DRA mode e2e: set TOPOLOGY_E2E_DRA=1"),
]

NS = "topology-e2e-pods"
LEVELS = ("book", "socket")  # DRA_VALUES' agent.levels


@pytest.fixture(scope="module")
def dra(local: E2EEnv, node: str, pod_namespace: str) -> Iterator[E2EEnv]:
    """The release in DRA mode for this module (the lane's snapshot); device-plugin mode again afterwards."""
    local.helm_upgrade(*DRA_VALUES)
    try:
        wait_for("the agent in DRA mode to be ready", lambda: agent_ready(local) and len(slices(local, node)) == 2,
                 timeout=180)
        yield local
    finally:
        local.kubectl("delete", "pods,resourceclaims", "--all", "-n", NS, "--wait=true", "--ignore-not-found",
                      timeout=120)
        local.helm_upgrade()
        wait_for("the agent in device-plugin mode to be ready", lambda: agent_ready(local), timeout=180)


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
    healthy = wait_for("the claim Healthy in the pod's status", lambda: health_is(dra, "health-pod", "Healthy"),
                       timeout=120)
    print(f"before: {healthy}")
    (resource,) = healthy
    assert resource["resourceID"].startswith(f"{DRIVER}/book="), resource

    set_snapshot(dra, offline(topology, cpus))
    try:
        got = wait_for(f"{device} Unhealthy in the pod's status", lambda: health_is(dra, "health-pod", "Unhealthy"),
                       timeout=180)
        print(f"CPUs {cpus} offline: {got}")
        (resource,) = got
        assert "offline" in resource.get("message", ""), resource  # ResourceHealthStatusMessage (beta, on)
        assert kjson(dra, "-n", NS, "get", "pod", "health-pod")["status"]["phase"] == "Running"  # nothing stops it
    finally:
        set_snapshot(dra, snapshot.dumps(topology))
    wait_for(f"{device} Healthy again", lambda: health_is(dra, "health-pod", "Healthy"), timeout=180)
    delete(dra, "pod/health-pod", "resourceclaim/health-book")
