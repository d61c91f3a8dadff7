"""Upgrade and uninstall on the real cluster (docs/admin/upgrade-uninstall.md), local lane only: it changes the
release and reads the node's own files.

* ``helm upgrade`` with a changed value rolls the agent pod over (a plain SIGTERM: its DaemonSet stays), and the book
  a running pod holds is still held by the new agent: the state files are kept.
* ``helm uninstall`` (its pre-delete hook deletes the DaemonSet in the foreground, each agent cleans its node up as it
  stops) leaves no topology.s390x.ibm.com/ label or annotation, no state file and no seccomp profile behind; the
  release is then installed again exactly as devkit/cluster/e2e.sh installs it, so later tests still have it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.snapshots import Expected
from tests.support.e2e.cluster import E2EEnv, lane_values
from tests.support.e2e.kube import wait_for
from tests.support.e2e.node import (
    AGENT_PREFIX,
    KUBELET_ROOT,
    STATE_DIR,
    agent_pod,
    book_pods_running,
    device_state,
    ours,
)
from tests.support.env import REPO

pytestmark = pytest.mark.e2e

PROFILE = KUBELET_ROOT / "seccomp" / "profiles" / "vllm-numa.json"
CHART = REPO / "deploy" / "helm" / "s390x-topology-agent"


def install_as_the_lane_does(env: E2EEnv) -> None:
    """devkit/cluster/e2e.sh's install command, word for word (with the runtime's values: CRI-O's socket)."""
    values = REPO / "devkit" / "cluster" / "e2e-values.yaml"
    env.helm("upgrade", "--install", env.release, str(CHART), "-f", str(values), *lane_values(env.runtime),
             "--set-file", f"fakeTopology.snapshots.default\\.json={env.snapshots / 'default.json'}",
             "--wait", "--timeout", "180s")


def env_value(pod: Any, name: str) -> str | None:
    return next((e.value for e in pod.spec.containers[0].env or [] if e.name == name), None)


def test_an_upgrade_keeps_a_held_book_held(core: Any, pod_namespace: str, local: E2EEnv, node: str,
                                          pods: Callable[..., str]) -> None:
    before = agent_pod(core, local, node)
    ((holder, holder_env),) = book_pods_running(core, pod_namespace, pods, local, 1)
    device = holder_env["TOPOLOGY_GROUPS"]
    wait_for(f"{device} held by the agent", lambda: device_state(before, device) == "allocated", timeout=30,
             interval=0.5)
    holds = STATE_DIR / local.prefix / "holds.json"
    wait_for(f"{device} saved in {holds}", lambda: holds.is_file() and device in holds.read_text(), timeout=30,
             interval=0.5)
    try:
        local.helm_upgrade("--set", "agent.rescanInterval=7")  # a changed value: a new pod template, a rolling update

        def replaced() -> Any:
            pod = agent_pod(core, local, node)
            return pod if pod.metadata.uid != before.metadata.uid else None

        after = wait_for("the upgraded agent pod", replaced, timeout=120, interval=0.5)
        assert env_value(after, "TOPOLOGY_AGENT_RESCAN_INTERVAL") == "7"
        # The new agent starts from the kept state files: the book is held from its first answer on.
        assert holds.is_file() and device in holds.read_text()
        wait_for(f"{device} still held after the upgrade", lambda: device_state(after, device) == "allocated",
                 timeout=30, interval=0.5)
        assert core.read_namespaced_pod(holder, pod_namespace).status.phase == "Running"
        assert ours(core, node).get(f"{AGENT_PREFIX}/advertised") == "true"  # labels kept (patched only on change)
    finally:
        local.helm_upgrade()


def test_an_uninstall_leaves_nothing_behind_and_a_reinstall_comes_back(core: Any, local: E2EEnv, node: str,
                                                                       exp: Expected) -> None:
    from kubernetes import client

    local.helm_upgrade("--set", "seccompProfile.install=true")  # so there is a profile to remove
    try:
        agent_pod(core, local, node)
        wait_for(f"{PROFILE} installed", PROFILE.is_file, timeout=60, interval=0.5)
        wait_for(f"the state files under {STATE_DIR}", lambda: (STATE_DIR / local.prefix / "groups.json").is_file(),
                 timeout=60, interval=0.5)
        wait_for(f"{node}'s {AGENT_PREFIX}/ labels", lambda: f"{AGENT_PREFIX}/advertised" in ours(core, node),
                 timeout=60, interval=0.5)

        done = local.helm("uninstall", local.release, "--wait", "--timeout", "300s", timeout=330)
        assert "uninstalled" in done.stdout

        apps = client.AppsV1Api(core.api_client)
        assert not apps.list_namespaced_daemon_set(local.namespace).items
        assert not core.list_namespaced_pod(local.namespace,
                                            label_selector=f"app.kubernetes.io/instance={local.release}").items
        assert ours(core, node) == {}, "labels or annotations left on the node"
        assert not (STATE_DIR / local.prefix).exists(), f"state files left: {sorted(STATE_DIR.rglob('*'))}"
        assert not STATE_DIR.exists() or any(STATE_DIR.iterdir()), "an empty state directory left"
        assert not PROFILE.exists(), f"{PROFILE} left"
        # The hook's Job, account and roles went with it (hook-delete-policy hook-succeeded).
        jobs = client.BatchV1Api(core.api_client).list_namespaced_job(local.namespace).items
        names = [str(j.metadata.name) for j in jobs if j.metadata is not None]
        assert not [name for name in names if name.endswith("-uninstall")], names
    finally:
        install_as_the_lane_does(local)

    book = f"{local.prefix}/book"
    agent_pod(core, local, node)
    wait_for(f"{node} to advertise {exp.allocatable[book]} {book} again",
             lambda: (core.read_node(node).status.allocatable or {}).get(book) == str(exp.allocatable[book]),
             timeout=90, interval=0.5)
    wait_for(f"{node}'s labels back", lambda: ours(core, node).get(f"{AGENT_PREFIX}/advertised") == "true",
             timeout=60, interval=0.5)
    assert Path(STATE_DIR / local.prefix / "groups.json").is_file()
