"""The kind lane's pieces that need no cluster (the lane itself runs in CI: make kind-test, devkit/kind/run.sh):
the control-plane images the node image carries, kind's base runtime spec, the kind config's kubeadm patches
against the pins, and the engine script's refusal to run outside the machine lock."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.support.env import REPO
from tests.support.scripts import load_script
from topology_devkit import oci


def pins(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


CLUSTER = pins(REPO / "devkit" / "cluster" / "versions.env")
node_images = load_script(REPO / "devkit" / "kind" / "node_images.py")


def test_control_plane_images_are_named_as_kubeadm_asks_and_hold_their_binary(tmp_path: Path) -> None:
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
        (bins / name).write_bytes(f"#!{name}\n".encode())
    pause = tmp_path / "pause"
    pause.write_bytes(b"pause")
    written = node_images.write_images(bins, pause, tmp_path / "out", CLUSTER["KUBERNETES_VERSION"],
                                       CLUSTER["ETCD_VERSION"])
    names = {}
    for archive in written:
        with tarfile.open(archive) as tar:
            index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        names[index["manifests"][0]["annotations"][oci.INDEX_NAME]] = archive
    repo = node_images.REPOSITORY
    assert set(names) == {f"{repo}/kube-apiserver:v{CLUSTER['KUBERNETES_VERSION']}",
                          f"{repo}/kube-controller-manager:v{CLUSTER['KUBERNETES_VERSION']}",
                          f"{repo}/kube-scheduler:v{CLUSTER['KUBERNETES_VERSION']}",
                          f"{repo}/etcd:{CLUSTER['ETCD_VERSION']}-0", node_images.pause_image()}


def test_the_kind_config_points_kubeadm_at_those_images_and_keeps_cgroup_v1() -> None:
    config = yaml.safe_load((REPO / "devkit" / "kind" / "kind.yaml").read_text())
    assert [n["role"] for n in config["nodes"]] == ["control-plane", "worker", "worker"]
    assert config["networking"] == {"disableDefaultCNI": True, "kubeProxyMode": "none"}
    patches = {p["kind"]: p for p in (yaml.safe_load(text) for text in config["kubeadmConfigPatches"])}
    assert patches["ClusterConfiguration"]["imageRepository"] == node_images.REPOSITORY
    assert patches["ClusterConfiguration"]["etcd"]["local"]["imageTag"] == f"{CLUSTER['ETCD_VERSION']}-0"
    assert patches["KubeletConfiguration"]["failCgroupV1"] is False
    assert set(patches["InitConfiguration"]["skipPhases"]) == {"preflight", "addon/coredns", "addon/kube-proxy"}


def test_node_containerd_config_edits_match_the_image_name() -> None:
    script = (REPO / "devkit" / "kind" / "node-image.sh").read_text()
    assert f'sandbox_image = \\"{node_images.pause_image()}\\"' in script


@pytest.mark.skipif(os.geteuid() != 0, reason="the engine script refuses non-root first")
def test_the_engine_refuses_to_start_outside_the_machine_lock() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TOPOLOGY_REALCLUSTER_LOCKED"}
    done = subprocess.run(["bash", str(REPO / "devkit" / "kind" / "engine.sh"), "up"], capture_output=True,
                          text=True, timeout=30, env=env, check=False)
    assert done.returncode == 1
    assert "run it under the machine lock" in done.stderr
