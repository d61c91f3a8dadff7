"""The real-cluster lane's CRI-O runtime without a cluster: its pins agree with each other, each runtime's binaries
have a key of their own, CRI-O's configuration says what the lane's docs say, the runc wrapper holds a spec's
oom_score_adj to this VM's limit and touches nothing else, and the runtime in use is the one the cluster was started
with."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.support.env import REPO
from topology_devkit.realcluster import crio, restrict_oom
from topology_devkit.realcluster.layout import Layout, components

CLUSTER = REPO / "devkit" / "cluster"


def versions() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (CLUSTER / "versions.env").read_text().splitlines()
             if line and not line.startswith("#"))
    return {k: v.strip('"') for k, v in pairs}


@pytest.mark.parametrize(("module", "path", "key"), [
    ("crio", "github.com/cri-o/cri-o", "CRIO_VERSION"),
    ("kubernetes-1.34", "k8s.io/kubernetes", "CRIO_KUBERNETES_VERSION"),
])
def test_the_crio_sets_modules_pin_the_versions_the_build_stamps(module: str, path: str, key: str) -> None:
    gomod = (CLUSTER / "go" / module / "go.mod").read_text()
    assert f"require {path} v{versions()[key]}\n" in gomod
    assert f"{path} v{versions()[key]} h1:" in (CLUSTER / "go" / module / "go.sum").read_text()


def test_kubernetes_1_34_replaces_every_staging_module_with_its_tag_and_keeps_its_godebug() -> None:
    gomod = (CLUSTER / "go" / "kubernetes-1.34" / "go.mod").read_text()
    replaced = re.findall(r"^\t(k8s\.io/[a-z-]+) => (k8s\.io/[a-z-]+) (v\S+)$", gomod, re.MULTILINE)
    assert len(replaced) == 31  # 1.34 has no streaming or cri-streaming staging module (1.36 added them)
    assert all(a == b and v == "v0.34.2" for a, b, v in replaced), replaced
    assert "\ngodebug default=go1.24\n" in gomod  # k8s.io/kubernetes v1.34.2's own go.mod says so


def test_the_build_tags_are_crio_makefiles_less_what_needs_other_c_libraries() -> None:
    tags = versions()["CRIO_BUILD_TAGS"].split()
    assert {"containers_image_openpgp", "exclude_graphdriver_btrfs", "exclude_graphdriver_devicemapper",
            "seccomp"} <= set(tags)


def _key(cache: Path, *args: str) -> str:
    done = subprocess.run([str(CLUSTER / "build.sh"), "--print", *args], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", "CLUSTER_CACHE": str(cache)})
    return done.stdout.strip()


def test_each_runtime_has_its_own_bin_folder_and_the_default_is_containerd(tmp_path: Path) -> None:
    containerd, crio_set = _key(tmp_path, "containerd"), _key(tmp_path, "crio")
    assert _key(tmp_path) == containerd
    assert Path(containerd).name.startswith("bin-") and Path(crio_set).name.startswith("bin-crio-")
    assert containerd != crio_set
    done = subprocess.run([str(CLUSTER / "build.sh"), "--print", "docker"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2 and "containerd or crio" in done.stderr


def test_crio_config_matches_kubelets_cgroup_driver_and_keeps_to_the_lanes_paths(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    bins = tmp_path / "bin"
    config = tomllib.loads(crio.crio_config(layout, bins))
    runtime = config["crio"]["runtime"]
    assert runtime["cgroup_manager"] == "cgroupfs"  # configs.kubelet_config: cgroupDriver cgroupfs
    assert runtime["runtimes"]["runc"]["monitor_cgroup"] == "pod"
    assert runtime["runtimes"]["runc"]["monitor_path"] == "/usr/bin/conmon"
    assert runtime["runtimes"]["runc"]["runtime_path"] == str(crio.runc_wrapper(layout))
    assert runtime["irqbalance_config_restore_file"] == "disable"  # else it writes into /etc/sysconfig
    assert "/var/run/cdi" in runtime["cdi_spec_dirs"]
    assert config["crio"]["api"]["listen"] == "/run/crio/crio.sock"
    assert config["crio"]["nri"] == {"enable_nri": True, "nri_listen": "/var/run/nri/nri.sock",
                                     "nri_plugin_dir": str(tmp_path / "crio" / "nri" / "plugins"),
                                     "nri_plugin_config_dir": str(tmp_path / "crio" / "nri" / "conf.d")}
    assert config["crio"]["image"]["pause_image"] == "localhost/topology-e2e-pause:3.10"
    assert config["crio"]["network"]["plugin_dirs"] == [str(bins / "cni")]
    assert crio.argv(layout, bins)[-2:] == ["--config-dir", str(tmp_path / "etc" / "crio.conf.d")]


@pytest.mark.parametrize(("args", "command", "bundle"), [
    (["--root", "/run/runc", "--log", "/x/log.json", "--log-format", "json", "create", "--bundle", "/b", "--pid-file",
      "/p", "id"], "create", "/b"),
    (["--systemd-cgroup", "run", "-b", "/c", "id"], "run", "/c"),
    (["--root", "/run/runc", "update", "--resources", "-", "id"], "update", None),
    (["--root", "/run/runc", "exec", "--process", "/p.json", "id", "sh", "-c", "echo run create"], "exec", None),
])
def test_the_runc_wrapper_finds_the_command_past_runcs_global_options(args: list[str], command: str,
                                                                      bundle: str | None) -> None:
    assert restrict_oom.command_of(args) == command
    assert restrict_oom.bundle_of(args) == (Path(bundle) if bundle else None)


def test_a_score_below_runcs_own_is_raised_to_it_and_nothing_else_changes() -> None:
    spec: dict[str, object] = {"ociVersion": "1.2.1", "process": {"args": ["/pause"], "oomScoreAdj": -997},
                               "linux": {"x": 1}}
    assert restrict_oom.restrict(spec, 0) is True
    assert spec == {"ociVersion": "1.2.1", "process": {"args": ["/pause"], "oomScoreAdj": 0}, "linux": {"x": 1}}
    burstable: dict[str, object] = {"process": {"oomScoreAdj": 936}}
    assert restrict_oom.restrict(burstable, 0) is False and burstable == {"process": {"oomScoreAdj": 936}}
    assert restrict_oom.restrict({"process": {}}, 0) is False


def test_the_wrapper_rewrites_the_bundles_spec_and_runs_the_real_runc(tmp_path: Path) -> None:
    fake_runc = tmp_path / "runc"
    fake_runc.write_text("#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/called\"\n")
    fake_runc.chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"oomScoreAdj": -997, "args": ["sh"]}}))
    (bundle / "config.json").chmod(0o600)
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(crio.runc_wrapper_script(tmp_path).replace(str(tmp_path / "runc"), str(fake_runc)))
    wrapper.chmod(0o755)
    subprocess.run([str(wrapper), "--root", "/run/runc", "create", "--bundle", str(bundle), "id"], check=True,
                   timeout=30)
    own = int(Path("/proc/self/oom_score_adj").read_text())
    assert json.loads((bundle / "config.json").read_text())["process"]["oomScoreAdj"] == max(own, -997)
    assert (bundle / "config.json").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "called").read_text().split() == ["--root", "/run/runc", "create", "--bundle", str(bundle),
                                                          "id"]


def test_the_runtime_in_use_is_the_recorded_one_else_runtime_else_containerd(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(tmp_path)
    monkeypatch.delenv("RUNTIME", raising=False)
    assert layout.runtime() == "containerd"
    monkeypatch.setenv("RUNTIME", "crio")
    assert layout.runtime() == "crio" and not layout.skewed()
    layout.runtime_file.write_text("containerd\n")
    assert layout.runtime() == "containerd"
    layout.runtime_file.write_text("crio skew\n")
    assert layout.runtime() == "crio" and layout.skewed()
    assert components("crio") == ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "crio",
                                  "kubelet")
    monkeypatch.setenv("RUNTIME", "docker")
    layout.runtime_file.unlink()
    with pytest.raises(ValueError, match="RUNTIME is one of containerd, crio"):
        layout.runtime()
