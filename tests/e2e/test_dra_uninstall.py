"""DRA mode on the real cluster: ``helm uninstall`` removes the node's ResourceSlices of our driver and the
DeviceClasses; the release is installed again after,
as ``make e2e`` installed it, so the modules after this one find it.

Run with ``make e2e`` (TOPOLOGY_E2E_DRA=1), or as tests/e2e/test_dra.py says.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.dra import DRA_VALUES, DRIVER, agent_ready, slices
from tests.support.e2e.kube import kjson, wait_kubectl

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TOPOLOGY_E2E_DRA") != "1", reason="DRA mode e2e: set TOPOLOGY_E2E_DRA=1"),
]

# Seconds after helm uninstall returns. The agent deletes its node's slices as it stops (its DaemonSet being deleted,
# agent/node/cleanup.py) and the pre-delete hook waits for that; the kubelet alone would take its 30 s grace for a
# deregistered plugin (32 s measured), while the scheduler could still allocate the devices.
SLICES_GONE_WITHIN = 5.0


def release_pods(env: E2EEnv) -> list[str]:
    pods = kjson(env, "-n", env.namespace, "get", "pods", "-l", f"app.kubernetes.io/instance={env.release}")
    return [p["metadata"]["name"] for p in pods["items"]]


def test_helm_uninstall_removes_the_nodes_slices_and_the_device_classes(local: E2EEnv, node: str) -> None:
    local.helm_upgrade(*DRA_VALUES)
    try:
        wait_kubectl("the agent in DRA mode with its slices",
                     lambda: agent_ready(local) and len(slices(local, node)) == 2, timeout=180)
        started = time.monotonic()
        out = local.helm("uninstall", local.release, "--wait", "--timeout", "180s")
        took = time.monotonic() - started
        print(f"helm uninstall: {took:.1f} s: {out.stdout.strip()}")

        def gone() -> bool:
            return not slices(local, node)

        returned = time.monotonic()
        wait_kubectl(f"the node's {DRIVER} slices gone", gone, timeout=SLICES_GONE_WITHIN, every=0.25)
        print(f"slices gone {time.monotonic() - returned:.1f} s after helm uninstall returned")
        assert not release_pods(local)
        classes = [c["metadata"]["name"] for c in kjson(local, "get", "deviceclasses")["items"]]
        assert not [c for c in classes if c.endswith(f".{DRIVER}")], classes
    finally:
        local.helm_upgrade(install=True)
        wait_kubectl("the agent reinstalled in device-plugin mode and ready", lambda: agent_ready(local), timeout=180)
    assert not slices(local, node)
