"""The real-cluster lane's own code, without a cluster: the pins agree with each other, the configs say what the
docs say they say, the PKI names the identities the authorizers expect, and a component that dies while
starting ends the wait with its last log lines instead of a hang."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.support.env import REPO
from topology_devkit.realcluster import configs, pki
from topology_devkit.realcluster.cluster import _argv, _remove_empty_parents, reachable_state_folder, remove_cdi_specs
from topology_devkit.realcluster.layout import Layout, requested_kubelet_root
from topology_devkit.realcluster.procs import ClusterError, crash, running, start, stop, wait_until

CLUSTER = REPO / "devkit" / "cluster"


def versions() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (CLUSTER / "versions.env").read_text().splitlines()
             if line and not line.startswith("#"))
    return dict(pairs)


@pytest.mark.parametrize(("module", "path", "key"), [
    ("kubernetes", "k8s.io/kubernetes", "KUBERNETES_VERSION"),
    ("etcd", "go.etcd.io/etcd/server/v3", "ETCD_VERSION"),
    ("containerd", "github.com/containerd/containerd/v2", "CONTAINERD_VERSION"),
    ("runc", "github.com/opencontainers/runc", "RUNC_VERSION"),
    ("cni", "github.com/containernetworking/plugins", "CNI_PLUGINS_VERSION"),
])
def test_each_go_module_pins_the_version_the_build_stamps(module: str, path: str, key: str) -> None:
    gomod = (CLUSTER / "go" / module / "go.mod").read_text()
    assert f"require {path} v{versions()[key]}\n" in gomod
    gosum = (CLUSTER / "go" / module / "go.sum").read_text()
    assert f"{path} v{versions()[key]} h1:" in gosum, "go.sum must hold the module's own hash"


def test_every_staging_module_is_replaced_by_its_published_tag() -> None:
    gomod = (CLUSTER / "go" / "kubernetes" / "go.mod").read_text()
    replaced = re.findall(r"^\t(k8s\.io/[a-z-]+) => (k8s\.io/[a-z-]+) (v\S+)$", gomod, re.MULTILINE)
    minor = versions()["KUBERNETES_VERSION"].split(".", 1)[1]
    assert len(replaced) >= 33
    assert all(a == b and v == f"v0.{minor}" for a, b, v in replaced), replaced


def test_kubelet_config_has_what_cgroup_v1_and_this_machine_need(tmp_path: Path) -> None:
    text = configs.kubelet_config(Layout(tmp_path))
    for line in ("failCgroupV1: false", "cgroupDriver: cgroupfs", "failSwapOn: false", "mode: Webhook",
                 "readOnlyPort: 0", "imageGCHighThresholdPercent: 100"):
        assert line in text.splitlines() or f"  {line}" in text.splitlines(), line


def test_containerd_config_pins_the_sandbox_image_and_enables_nri(tmp_path: Path) -> None:
    config = tomllib.loads(configs.containerd_config(Layout(tmp_path), tmp_path / "bin"))
    plugins = config["plugins"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "localhost/topology-e2e-pause:3.10"
    assert plugins["io.containerd.nri.v1.nri"]["disable"] is False
    runc = plugins["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]["options"]
    assert runc["BinaryName"] == str(tmp_path / "bin" / "runc") and runc["SystemdCgroup"] is False
    assert config["state"] == "/run/containerd", "the default state folder (0711) keeps the socket reachable"


def test_the_state_folder_a_shim_left_0600_is_made_reachable_before_containerd_starts(tmp_path: Path) -> None:
    left = tmp_path / "run-containerd"
    (left / "s").mkdir(parents=True)
    left.chmod(0o600)  # what Debian's containerd 1.6 shims leave when they create /run/containerd for their sockets
    note = reachable_state_folder(left)
    assert left.stat().st_mode & 0o7777 == 0o711
    assert note is not None and "was 0600" in note and "0711" in note
    assert reachable_state_folder(left) is None, "a folder with containerd's own mode is left alone"
    fresh = tmp_path / "absent" / "containerd"
    assert reachable_state_folder(fresh) is None and fresh.stat().st_mode & 0o7777 == 0o711


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_kubelet_root_moves_with_kubelet_root_and_the_cluster_up_keeps_its_own(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(tmp_path)
    monkeypatch.delenv("KUBELET_ROOT", raising=False)
    assert layout.kubelet_root() == Path("/var/lib/kubelet")
    monkeypatch.setenv("KUBELET_ROOT", "/var/lib/k0s/kubelet")
    assert "--root-dir=/var/lib/k0s/kubelet" in _argv(layout, tmp_path, "kubelet")
    # A cluster that is up keeps the root it was started with, whatever KUBELET_ROOT says now.
    layout.kubelet_root_file.write_text("/var/snap/microk8s/common/var/lib/kubelet\n")
    assert layout.kubelet_root() == Path("/var/snap/microk8s/common/var/lib/kubelet")


def test_down_removes_the_empty_folders_above_a_moved_root_and_nothing_more(tmp_path: Path) -> None:
    root = tmp_path / "var" / "lib" / "k0s" / "kubelet"
    root.parent.mkdir(parents=True)
    (tmp_path / "var" / "lib" / "other").mkdir()
    _remove_empty_parents(root)
    assert not (tmp_path / "var" / "lib" / "k0s").exists()
    assert (tmp_path / "var" / "lib" / "other").is_dir()  # /var/lib is not empty: it and what is above it stay


@pytest.mark.parametrize("value", ["var/lib/kubelet", "/", "/var/lib", "/var/lib/kubelet/..", "/data/kubelets"])
def test_a_kubelet_root_cluster_down_could_not_remove_safely_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                                        value: str) -> None:
    monkeypatch.setenv("KUBELET_ROOT", value)
    with pytest.raises(ValueError, match="absolute path ending in /kubelet"):
        requested_kubelet_root()


def test_pki_names_the_identities_the_authorizers_expect(tmp_path: Path) -> None:
    pki.make_pki(tmp_path, "node-a", ["127.0.0.1"], ["localhost"])

    def subject(name: str) -> str:
        return subprocess.run(["openssl", "x509", "-in", str(tmp_path / f"{name}.crt"), "-noout", "-subject"],
                              capture_output=True, text=True, check=True).stdout

    assert "CN = system:node:node-a" in subject("kubelet") and "O = system:nodes" in subject("kubelet")
    assert "O = system:masters" in subject("admin")
    assert "CN = system:kube-scheduler" in subject("scheduler")
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "apiserver.crt")],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stderr
    assert (tmp_path / "sa.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")


def test_a_component_that_dies_while_starting_ends_the_wait_with_its_log(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    start(layout, "etcd", [sys.executable, "-c", "print('listen tcp 127.0.0.1:2379: address already in use'); "
                                                 "raise SystemExit(1)"])
    started = time.monotonic()
    with pytest.raises(ClusterError) as failed:
        wait_until("etcd to be healthy", lambda: False, 60, layout, "etcd", step=0.05)
    assert time.monotonic() - started < 30, "a dead component must not be waited out to the deadline"
    assert "etcd exited" in str(failed.value) and "address already in use" in str(failed.value)
    assert running(layout, "etcd") is None


def test_stop_ends_a_component_by_its_pid_file(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    pid = start(layout, "kubelet", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert running(layout, "kubelet") == pid
    assert stop(layout, "kubelet", timeout=5)
    assert running(layout, "kubelet") is None and not layout.pidfile("kubelet").exists()


def test_crash_sigkills_a_component_that_ignores_sigterm_and_keeps_its_pid_file(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    pid = start(layout, "containerd", [sys.executable, "-c", "import signal, time; "
                                       "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    started = time.monotonic()
    assert crash(layout, "containerd")
    assert time.monotonic() - started < 5 and running(layout, "containerd") is None
    assert layout.pidfile("containerd").read_text().strip() == str(pid)
    assert not crash(layout, "containerd")  # nothing left to kill


def test_cluster_down_removes_the_drivers_cdi_specs_and_keeps_others(tmp_path: Path) -> None:
    """cluster-down removes the driver's CDI specs: a pod still running at cluster-down is never unprepared, so its
    claim's spec would outlive the cluster; other drivers' specs stay."""
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    ours = ["topology.s390x.ibm.com-book_0d1c.json", "topology.s390x.ibm.com-socket_77aa.json"]
    for name in [*ours, "vendor.example.com-gpu_1.json"]:
        (cdi / name).write_text("{}")
    assert remove_cdi_specs(cdi) == ours
    assert sorted(p.name for p in cdi.iterdir()) == ["vendor.example.com-gpu_1.json"]
    assert remove_cdi_specs(tmp_path / "absent") == []


def test_a_tree_with_a_bind_mount_inside_is_removed_without_touching_what_is_mounted(tmp_path: Path) -> None:
    from tests.support.env import missing
    from topology_devkit.realcluster.mounts import mounts_under, remove_tree

    if os.geteuid() != 0:
        missing("root (mount --bind)", "run the tests as root, as .ci/run does")
    host_dev = tmp_path / "host-dev"  # stands for the host's /dev that a chroot bound into a root
    host_dev.mkdir()
    (host_dev / "null").write_text("the host's")
    root = tmp_path / "rootfs"
    (root / "dev").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host_dev), str(root / "dev")], check=True)
    try:
        assert remove_tree(root) == []
    finally:
        subprocess.run(["umount", "-l", str(root / "dev")], capture_output=True, check=False)
    assert not root.exists() and mounts_under([root]) == []
    assert (host_dev / "null").read_text() == "the host's", "unmounted first, so nothing below the mount went"


def test_a_mount_reached_through_a_symbolic_link_is_found_and_unmounted(tmp_path: Path) -> None:
    """/var/run is a link to /run on Debian: mountinfo names /run/netns/cni-…, cluster-down asks for /var/run/netns.

    Before, the netns file stayed mounted and its unlink failed with EBUSY (a traceback ended `make e2e` in CI).
    """
    from tests.support.env import missing
    from topology_devkit.realcluster.mounts import mounts_under, unmount

    if os.geteuid() != 0:
        missing("root (mount --bind)", "run the tests as root, as .ci/run does")
    real = tmp_path / "run" / "netns"
    real.mkdir(parents=True)
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to(tmp_path / "run")
    handle = real / "cni-test"
    handle.touch()
    subprocess.run(["mount", "--bind", str(handle), str(handle)], check=True)
    try:
        through_link = tmp_path / "var" / "run" / "netns"
        assert mounts_under([through_link]) == [str(handle)]
        unmount([through_link])
        assert mounts_under([through_link]) == []
        handle.unlink()
    finally:
        subprocess.run(["umount", "-l", str(handle)], capture_output=True, check=False)
