"""docs/admin/kubelet-roots.md's install commands, rendered as written: on each distribution the device-plugin
directory stays kubelet's constant /var/lib/kubelet/device-plugins, pod-resources and the kubelet root are where that
distribution's kubelet keeps them, and the runtime's socket is its own."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.support.chart import Render, mounts_of
from tests.support.env import REPO

DOC = REPO / "docs" / "admin" / "kubelet-roots.md"

# distribution -> (kubelet's --root-dir, the runtime's CRI socket), from the sources the page cites.
EXPECTED = {
    "k3s": ("/var/lib/kubelet", "/run/k3s/containerd/containerd.sock"),
    "microk8s": ("/var/snap/microk8s/common/var/lib/kubelet", "/var/snap/microk8s/common/run/containerd.sock"),
    "k0s": ("/var/lib/k0s/kubelet", "/run/k0s/containerd.sock"),
}


def documented_sets() -> dict[str, list[str]]:
    """Each distribution's `helm install` block: the --set arguments, by the bold name before it."""
    text = DOC.read_text(encoding="utf-8")
    out: dict[str, list[str]] = {}
    for name, block in re.findall(r"\*\*(\w+)\*\*:.*?```sh\n(.*?)```", text, flags=re.S):
        words = shlex.split(block.replace("\\\n", " "))
        assert "install" in words, block
        out[name] = [w for i, w in enumerate(words) if i and words[i - 1] == "--set"]
    return out


def test_the_page_covers_each_distribution() -> None:
    assert set(documented_sets()) == set(EXPECTED)


@pytest.mark.parametrize("distribution", EXPECTED)
def test_the_documented_values_mount_what_that_kubelet_uses(render: Render, distribution: str) -> None:
    root, socket = EXPECTED[distribution]
    sets = documented_sets()[distribution]
    args = [a for s in sets for a in ("--set", s)]
    mounts = mounts_of(render(*args))
    assert mounts["device-plugins"][1]["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    assert mounts["pod-resources"][1]["hostPath"] == {"path": f"{root}/pod-resources", "type": "Directory"}
    assert mounts["kubelet-root"][1]["hostPath"]["path"] == root  # cpuset enforcement (auto) reads its state
    assert mounts["cri-socket"][1]["hostPath"]["path"] == socket.rsplit("/", 1)[0]
