"""The devkit's containerd harness: its image is a valid OCI layout, it says why it cannot run, a zombie
counts as dead, and its teardown leaves nothing behind even after containerd crashed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.support.env import missing
from topology_devkit import containerd as harness
from topology_devkit.containerd import Containerd, ContainerdUnavailable, alive, build_image
from topology_devkit.testing.wait import poll_until


def test_the_image_is_a_reproducible_oci_layout_of_busybox(tmp_path: Path) -> None:
    if not Path("/bin/busybox").is_file():
        missing("/bin/busybox", "apt-get install busybox-static")
    first = build_image(tmp_path / "a.tar")
    assert build_image(tmp_path / "b.tar").read_bytes() == first.read_bytes()
    with tarfile.open(first) as tar:
        def read(name: str) -> bytes:
            member = tar.extractfile(name)
            assert member is not None, name
            return member.read()

        def blob(digest: str) -> bytes:
            data = read(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
            return data

        assert json.loads(read("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        (entry,) = json.loads(read("index.json"))["manifests"]
        assert entry["annotations"]["io.containerd.image.name"] == harness.IMAGE
        manifest = json.loads(blob(entry["digest"]))
        assert len(blob(entry["digest"])) == entry["size"]
        config = json.loads(blob(manifest["config"]["digest"]))
        assert config["config"]["Entrypoint"] == ["/bin/sleep"] and config["os"] == "linux"
        (layer_entry,) = manifest["layers"]
        layer = blob(layer_entry["digest"])
        assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(layer)) as rootfs:
        names = {m.name: m for m in rootfs.getmembers()}
        assert names["bin/busybox"].isfile() and names["bin/busybox"].mode == 0o755
        assert names["bin/sleep"].issym() and names["bin/sleep"].linkname == "busybox"


def test_the_reason_it_cannot_run_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert harness.unavailable_reason() == "containerd needs root (run the tests as root)"
    ctd = Containerd("test-reason")
    with pytest.raises(ContainerdUnavailable, match="needs root"):
        ctd.__enter__()
    assert not ctd.workdir.exists()  # a failed start cleans up too

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "containerd" else f"/usr/bin/{tool}")
    reason = harness.unavailable_reason()
    assert reason is not None and "\n" not in reason
    assert reason.startswith("missing containerd (containerd)") and reason.endswith(
        "apt-get install containerd runc crun busybox-static")


def test_a_zombie_is_dead() -> None:
    child = subprocess.Popen(["true"])
    try:
        assert poll_until(lambda: Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z",
                          10.0), "the child never exited"
        assert not alive(child.pid)  # not reaped yet: /proc still has it, in state Z
        assert alive(os.getpid())
    finally:
        child.wait()
    assert not alive(child.pid)


def test_the_shim_socket_folders_are_made_with_containerds_modes_and_only_those_made_are_returned(
        tmp_path: Path) -> None:
    state, sockets = tmp_path / "containerd", tmp_path / "containerd" / "s"
    made = harness.make_shim_folders(((state, 0o711), (sockets, 0o700)))
    assert made == [state, sockets]
    assert (state.stat().st_mode & 0o7777, sockets.stat().st_mode & 0o7777) == (0o711, 0o700)
    sockets.rmdir()
    assert harness.make_shim_folders(((state, 0o711), (sockets, 0o700))) == [sockets], "an existing folder is kept"


def test_teardown_after_a_crash_leaves_nothing_behind() -> None:
    state_before = harness.SHIM_SOCKETS.parent.exists()
    try:
        ctd = Containerd("test-crash").__enter__()
    except ContainerdUnavailable as exc:
        missing("a real containerd", exc.reason)
    try:
        pods = [ctd.run_pod(f"crash-{handler}", handler=handler) for handler in ctd.handlers()]
        assert pods, f"no runtime handler works here: {ctd.handler_problems()}"
        processes = [ctd.container_pid(pod.container_id) for pod in pods]
        shims = ctd._own_processes()
        assert shims and all(alive(pid) for pid in processes)
        ctd.stop_containerd(kill=True)  # containerd crashes; shims and containers keep running
        assert all(alive(pid) for pid in processes)
    finally:
        ctd.close()

    assert not [pid for pid in [*processes, *shims] if alive(pid)]
    leftovers = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{ctd.prefix}")]
    leftovers += [str(p) for p in Path("/sys/fs/cgroup").glob(ctd.prefix)]
    assert leftovers == []
    for ident in ctd._ids:
        digest = hashlib.sha256(os.path.join(str(ctd.socket), "k8s.io", ident).encode()).hexdigest()
        assert not (harness.SHIM_SOCKETS / digest).exists()
    assert not ctd.workdir.exists()
    if not state_before:  # a 0600 /run/containerd left behind would lock the real-cluster lane's agent out
        assert not harness.SHIM_SOCKETS.parent.exists(), "the harness removes the shim folders it made"
    ctd.close()  # twice is fine
