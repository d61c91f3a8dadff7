"""kubelet's root as the chart sees it, on the local lane: kubelet runs with the --root-dir the lane gave it
(KUBELET_ROOT at cluster-up: /var/lib/kubelet, or another as on k0s and microk8s), serves pod-resources under that
root and its device-plugin socket in the constant /var/lib/kubelet/device-plugins, and the release installed as
docs/admin/kubelet-roots.md says mounts exactly those, with the agent registered and reading pod-resources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import wait_for
from tests.support.e2e.node import DEVICE_PLUGINS, KUBELET_ROOT, agent_pod, http_get, metric
from topology_devkit.realcluster.layout import Layout

pytestmark = pytest.mark.e2e


def kubelet_root_dir() -> Path:
    """The --root-dir of the kubelet that runs (its command line), the lane's kubelet by its pid file."""
    pid = int(Layout.from_env().pidfile("kubelet").read_text().split()[0])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    (root,) = [a.split("=", 1)[1] for a in argv if a.startswith("--root-dir=")]
    return Path(root)


def test_the_chart_mounts_the_directories_this_kubelet_uses(core: Any, local: E2EEnv, node: str) -> None:
    root = kubelet_root_dir()
    assert root == KUBELET_ROOT  # what e2e.sh told the suite, and the chart (--set kubelet.root)
    assert (root / "pod-resources" / "kubelet.sock").is_socket()
    assert (DEVICE_PLUGINS / "kubelet.sock").is_socket()  # whatever the root
    if root != Path("/var/lib/kubelet"):
        assert not (root / "device-plugins").exists()  # kubelet never makes one under another root
        assert not Path("/var/lib/kubelet/pod-resources").exists()
    pod = agent_pod(core, local, node)
    volumes = {v.name: v.host_path.path for v in pod.spec.volumes if v.host_path}
    assert volumes["device-plugins"] == str(DEVICE_PLUGINS)
    assert volumes["pod-resources"] == str(root / "pod-resources")
    assert volumes["kubelet-root"] == str(root)
    # Registered with kubelet (Ready means every resource is) and reading pod-resources under the moved root.
    sockets = {p.name for p in DEVICE_PLUGINS.iterdir() if p.is_socket()}
    assert f"{local.prefix}-book.sock" in sockets, sockets
    wait_for("the agent to confirm exclusivity through pod-resources under the root",
             lambda: metric(http_get(f"http://{pod.status.pod_ip}:9400/metrics")[1],
                            "topology_agent_exclusivity_confirmed") == 1.0, timeout=30, interval=0.5)
