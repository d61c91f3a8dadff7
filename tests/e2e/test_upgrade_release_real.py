"""An upgrade from the last recorded release, and a rollback to it, on the real cluster (docs/admin/releases.md).

The release's image and chart are built from its own commit (``python -m topology_devkit.realcluster release-image
VERSION``: a worktree of the commit, the lane's buildah build, cached by commit) and installed as a user installs it:
``helm uninstall`` of the suite's release, ``helm install`` of the release's chart with the lane's values (the mode's on
top) and its image. A pod holds a book. Then ``helm upgrade`` to the working tree's chart and image:
the pod keeps running in the same container (restart count, container id and cpuset unchanged), every entry of the
agent's holds, of kubelet's device checkpoint and every topology.s390x.ibm.com/ label and annotation is still there,
and the first new book pod gets the free book. Then ``helm rollback`` to the release's revision: the release's agent
starts on the files today's agent kept (format 1 both) and the same holds. The suite's install comes back at the end.

The local lane only (the node's own files). One cycle per mode in TOPOLOGY_E2E_UPGRADE_MODES (cri, the default: CRI
enforcement; nri: NRI with the shared pool; dra: DRA mode with a claim prepared, the holder's own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.topology.cpulist import parse_cpulist
from tests.support.e2e.cluster import E2EEnv, lane_values
from tests.support.e2e.dra import DRA_VALUES, DRIVER, allocated_device, claim, delete, slices
from tests.support.e2e.dra import pod as dra_pod
from tests.support.e2e.kube import apply, wait_for
from tests.support.e2e.node import (
    AGENT_PREFIX,
    DEVICE_PLUGINS,
    STATE_DIR,
    agent_pod,
    device_state,
    ours,
    proc_status,
    running_env,
)
from tests.support.env import REPO

pytestmark = pytest.mark.e2e

RELEASES = json.loads((REPO / "releases.json").read_text())["releases"]
LAST = RELEASES[-1]["version"]
CHECKPOINT = DEVICE_PLUGINS / "kubelet_internal_checkpoint"
CDI = Path("/var/run/cdi")
# The modes a release is installed in, with the values on top of the lane's (CI runs cri alone: one cycle of install,
# upgrade and rollback; TOPOLOGY_E2E_UPGRADE_MODES=cri,nri,dra runs each).
MODES: dict[str, tuple[str, ...]] = {"cri": (), "nri": ("--set", "cpusetEnforcement=nri", "--set", "sharedPool=true"),
                                     "dra": DRA_VALUES}
SELECTED = [m.strip() for m in (os.environ.get("TOPOLOGY_E2E_UPGRADE_MODES") or "cri").split(",") if m.strip()]


@pytest.fixture(scope="module")
def release(local: E2EEnv) -> tuple[str, Path]:
    """The last release's image (built from its commit, cached, imported into the node's runtime) and chart."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "topology_devkit.realcluster", "release-image", LAST],
                          capture_output=True, text=True, timeout=1800, cwd=REPO, check=False,
                          env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devkit'}"})
    assert done.returncode == 0, f"release-image {LAST}: {done.stdout}{done.stderr}"
    image, chart = done.stdout.strip().splitlines()[-1].split("\t")
    print(f"release {LAST}: {image} ready in {time.monotonic() - started:.1f} s ({chart})")
    return image, Path(chart)


def agent_image(core: Any, env: E2EEnv, node: str, image: str) -> Any:
    """The Ready agent pod on ``node`` once it runs ``image``."""
    def running() -> Any:
        pod = agent_pod(core, env, node)
        return pod if pod.spec.containers[0].image == image else None

    return wait_for(f"the agent on {node} to run {image}", running, timeout=180, interval=0.5)


def container(core: Any, namespace: str, name: str) -> tuple[str, str, int]:
    pod = core.read_namespaced_pod(name, namespace)
    status = pod.status.container_statuses[0]
    return pod.status.phase, status.container_id, status.restart_count


def holds(prefix: str, mode: str) -> set[tuple[str, ...]]:
    """The agent's saved holds: (resource, device) of holds.json; in DRA mode (namespace, claim, device) of its
    prepared claims (dra/claims.json)."""
    if mode == "dra":
        saved = json.loads((STATE_DIR / "dra" / "claims.json").read_text())
        return {(c["namespace"], c["name"], d["device"]) for c in saved["claims"] for d in c["devices"]}
    saved = json.loads((STATE_DIR / prefix / "holds.json").read_text())
    return {(resource, device) for resource, device in saved["holds"]}


def checkpoint(prefix: str, mode: str) -> set[tuple[str, ...]]:
    """kubelet's device checkpoint: (pod uid, container, resource, device) of our resources; in DRA mode the
    driver's CDI files (name, content)."""
    if mode == "dra":
        return {(f.name, f.read_text()) for f in CDI.glob(f"{DRIVER}-*.json")}
    data = json.loads(CHECKPOINT.read_text())["Data"]
    return {(e["PodUID"], e["ContainerName"], e["ResourceName"], device)
            for e in data.get("PodDeviceEntries") or [] if e["ResourceName"].startswith(f"{prefix}/")
            for devices in (e.get("DeviceIDs") or {}).values() for device in devices}


def labels(core: Any, node: str) -> dict[str, str]:
    return {k: v for k, v in (core.read_node(node).metadata.labels or {}).items() if k.startswith(f"{AGENT_PREFIX}/")}


def book_holder(env: E2EEnv, core: Any, namespace: str, mode: str, pods: Callable[..., str],
                name: str) -> tuple[str, str, str]:
    """A running pod holding a book (in DRA mode through its own claim ``name``): (pod, book, its CPUs)."""
    if mode != "dra":
        holder = pods({f"{env.prefix}/book": 1})
        got = running_env(core, namespace, holder)
        return holder, got["TOPOLOGY_GROUPS"], got["TOPOLOGY_CPUS"]
    apply(env, claim(name, f"book.{DRIVER}"))
    doc = dra_pod(name, env.workload_image, name, cpu="1")
    doc["spec"]["containers"][0]["command"] = ["sh", "-c", "env; echo ENV-END; exec sleep 3600"]
    apply(env, doc)
    got = running_env(core, namespace, name)
    assert got["TOPOLOGY_GROUPS"] == allocated_device(env, name)
    return name, got["TOPOLOGY_GROUPS"], got["TOPOLOGY_CPUS"]


@pytest.mark.parametrize("mode", SELECTED)
def test_an_upgrade_from_the_last_release_and_a_rollback_keep_every_hold(
        mode: str,
        core: Any, pod_namespace: str, local: E2EEnv, node: str, pods: Callable[..., str],
        release: tuple[str, Path]) -> None:
    assert mode in MODES, f"TOPOLOGY_E2E_UPGRADE_MODES: {mode!r} is not one of {', '.join(MODES)}"
    image, chart = release
    values = MODES[mode]
    started = time.monotonic()
    local.helm("uninstall", local.release, "--wait", "--timeout", "180s")
    try:
        local.helm("install", local.release, str(chart), "-f", str(REPO / "devkit" / "cluster" / "e2e-values.yaml"),
                   *lane_values(local.runtime), "--set", f"image.tag={image.rpartition(':')[2]}",
                   "--set-file", f"fakeTopology.snapshots.default\\.json={local.snapshots / 'default.json'}", *values,
                   "--wait", "--timeout", "180s")
        local.wait_for_rollout()
        old = agent_image(core, local, node, image)
        said = local.kubectl("-n", local.namespace, "exec", old.metadata.name, "--", "topology-agent",
                             "--version").stdout
        assert said.split()[:2] == ["topology-agent", LAST], said  # the release's own code answers

        if mode == "dra":
            wait_for(f"{LAST}'s ResourceSlices", lambda: len(slices(local, node)) == 2, timeout=120, interval=0.5)
        holder, device, cpus = book_holder(local, core, pod_namespace, mode, pods, "held-book")
        wait_for(f"{holder} pinned to {cpus}",
                 lambda: proc_status(local, pod_namespace, holder, "Cpus_allowed_list") == cpus, timeout=60,
                 interval=0.5)
        wait_for(f"{device} saved by {LAST}", lambda: any(device in h for h in holds(local.prefix, mode)), timeout=30,
                 interval=0.5)
        wait_for(f"{node}'s labels from {LAST}", lambda: labels(core, node), timeout=60, interval=0.5)
        before = (container(core, pod_namespace, holder), holds(local.prefix, mode), checkpoint(local.prefix, mode),
                  labels(core, node), set(ours(core, node)))
        assert before[0][0] == "Running" and before[2], before

        def kept(agent: Any, what: str) -> None:
            if mode != "dra":
                wait_for(f"{device} held by {what}", lambda: device_state(agent, device) == "allocated", timeout=30,
                         interval=0.5)
            assert container(core, pod_namespace, holder) == before[0], "the holder restarted or stopped"
            assert proc_status(local, pod_namespace, holder, "Cpus_allowed_list") == cpus
            assert before[1] <= holds(local.prefix, mode), f"a hold lost after {what}"
            assert before[2] <= checkpoint(local.prefix, mode), f"a checkpoint entry or CDI file lost after {what}"
            assert before[3].items() <= labels(core, node).items(), f"a label lost or changed after {what}"
            assert before[4] <= set(ours(core, node)), f"an annotation lost after {what}"

        upgrade_started = time.monotonic()
        local.helm_upgrade(*values)  # the working tree's chart and image, the lane's values
        new = agent_image(core, local, node, local.image)
        kept(new, "the upgrade")
        print(f"upgrade {LAST} -> working tree: {time.monotonic() - upgrade_started:.1f} s")

        second, other, other_cpus = book_holder(local, core, pod_namespace, mode, pods, "new-book")
        assert other != device, "the new pod got the held book"
        assert not set(parse_cpulist(other_cpus)) & set(parse_cpulist(cpus)), (other_cpus, cpus)
        wait_for(f"{second} pinned", lambda: proc_status(local, pod_namespace, second, "Cpus_allowed_list")
                 == other_cpus, timeout=60, interval=0.5)

        revision = min(entry["revision"] for entry in json.loads(local.helm(
            "history", local.release, "-o", "json").stdout) if entry["app_version"] == LAST)
        rollback_started = time.monotonic()
        local.helm("rollback", local.release, str(revision), "--wait", "--timeout", "180s")
        local.wait_for_rollout()
        back = agent_image(core, local, node, image)
        kept(back, f"the rollback to {LAST}")
        assert any(other in h for h in holds(local.prefix, mode)), f"{other} not saved after the rollback"
        if mode != "dra":
            wait_for(f"{other} held by {LAST} again", lambda: device_state(back, other) == "allocated", timeout=30,
                     interval=0.5)
        print(f"rollback to {LAST}: {time.monotonic() - rollback_started:.1f} s; "
              f"the whole cycle {time.monotonic() - started:.1f} s")
    finally:
        if mode == "dra":  # released before the agent leaves DRA mode
            delete(local, "pods,resourceclaims", "--all")
        local.helm_upgrade(install=True)  # the suite's install again, for the tests after this one
