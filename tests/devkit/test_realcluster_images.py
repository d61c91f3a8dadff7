"""The real cluster's images (topology_devkit.realcluster.images): built (from the cache when they are), imported
with ctr into a private containerd (the devkit's harness, Debian's containerd 1.6) under their own names, and run:
the pause image as every pod's sandbox, busybox with the e2e workload's command, the agent's --version and
discover. Skipped when buildah, debootstrap, gcc, root or containerd are missing; a failure under CI=true."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._proto.runtime.v1 import api_pb2 as cri
from tests.support.env import missing
from topology_devkit import containerd as harness
from topology_devkit import oci
from topology_devkit.containerd import Containerd, ContainerdUnavailable, PodContainer, alive
from topology_devkit.realcluster import images
from topology_devkit.testing.wait import poll_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def archives() -> dict[str, Path]:
    reason = images.unavailable_reason()
    if reason is not None:
        missing("the image tools", reason)
    return images.build_all(images.default_cache())


class _PauseSandboxContainerd(Containerd):
    """The harness with the pause image as the sandbox image (what kubelet's containerd is configured with)."""

    def _config(self) -> str:
        text = super()._config()
        line = f"sandbox_image = {json.dumps(harness.IMAGE)}"
        assert line in text
        return text.replace(line, f"sandbox_image = {json.dumps(images.PAUSE)}")


@pytest.fixture(scope="module")
def ctd(archives: dict[str, Path]) -> Iterator[Containerd]:
    ctr = shutil.which("ctr")
    if ctr is None or harness.unavailable_reason() is not None:
        missing("containerd", harness.unavailable_reason() or f"apt-get install {harness.PACKAGES}")
    try:
        runtime = _PauseSandboxContainerd("topo-images").__enter__()
    except ContainerdUnavailable as exc:
        missing("containerd", exc.reason)
    try:
        images.import_all(Path(ctr), runtime.socket, archives)
        yield runtime
    finally:
        runtime.close()


def _run(ctd: Containerd, image: str, command: tuple[str, ...] = (), name: str = "images") -> PodContainer:
    ctd.image = image
    try:
        return ctd.run_pod(name, command=command, memory_limit=256 << 20)
    finally:
        ctd.image = harness.IMAGE


def _log(ctd: Containerd, pod: PodContainer) -> str:
    """What the container wrote (the CRI log's message fields)."""
    path = ctd.workdir / "logs" / pod.pod_uid / pod.container_name / f"{pod.attempt}.log"
    lines = path.read_text().splitlines() if path.is_file() else []
    return "\n".join(line.split(" ", 3)[3] if line.count(" ") >= 3 else line for line in lines)


def _wait_log(ctd: Containerd, pod: PodContainer, text: str, timeout: float = 30.0) -> str:
    poll_until(lambda: text in _log(ctd, pod), timeout, every=0.1)
    return _log(ctd, pod)


# ------------------------------------------------------------------------------------------------
# without the tools: the mirror, the naming


def test_the_mirror_is_read_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
                      "Components: main\n\nTypes: deb\nURIs: http://mirror.example/security\n"
                      "Suites: bookworm-security\nComponents: main\n")
    assert images.debian_mirror([deb822]) == ("http://mirror.example/debian", "http://mirror.example/security")
    one_line = tmp_path / "sources.list"
    one_line.write_text("# deb http://old.example/debian bookworm main\n"
                        "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian/ bookworm main\n")
    assert images.debian_mirror([one_line]) == ("http://one.example/debian", images.DEBIAN_SECURITY)
    with pytest.raises(images.ImageError, match="no 'bookworm' entry"):
        images.debian_mirror([tmp_path / "absent.list"])


def test_an_archive_is_renamed_for_ctr_in_its_index_only(tmp_path: Path) -> None:
    layer = oci.files_layer({"hello": (b"hi\n", 0o644)}, directories=["etc"])
    source = oci.write_archive(tmp_path / "a.tar", "example/other:1", [layer], {"Cmd": ["/hello"]})
    target = images.name_archive(source, tmp_path / "b.tar", images.BUSYBOX)
    assert images.archive_names(target) == [images.BUSYBOX]
    with tarfile.open(source) as a, tarfile.open(target) as b:
        assert a.getnames() == b.getnames()
        index = json.loads(b.extractfile("index.json").read())  # type: ignore[union-attr]
        assert index["manifests"][0]["annotations"][oci.REF_NAME] == "latest"
        for name in a.getnames():
            if name.startswith("blobs/sha256/"):
                assert a.extractfile(name).read() == b.extractfile(name).read()  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------------
# the archives


def test_each_archive_names_its_image_and_the_pause_image_is_one_static_file(archives: dict[str, Path]) -> None:
    assert set(archives) == set(images.IMAGES)
    for name, path in archives.items():
        assert images.archive_names(path) == [name]
        assert not path.is_relative_to(images.REPO), "build output must stay out of the work tree"
    with tarfile.open(archives[images.PAUSE]) as tar:
        def blob(digest: str) -> bytes:
            member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            return member.read()

        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        assert config["config"]["Entrypoint"] == ["/pause"]
        (layer,) = manifest["layers"]
        with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"]))) as rootfs:
            assert [(m.name, m.mode) for m in rootfs.getmembers()] == [("pause", 0o755)]


def test_pause_exits_0_on_sigterm_and_reaps_the_orphans_it_inherits(archives: dict[str, Path], tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        missing("root and unshare", "run as root; apt-get install util-linux")
    pause = images.compile_pause(images.default_cache())
    # PID 1 of a new PID namespace: a child of its own (sleep 0.2) and an orphan (sleep 0.4) become pause's
    script = f"sleep 0.2 & (sleep 0.4 &); exec {pause}"
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", script])
    try:
        assert poll_until(lambda: _children(outer.pid) != [], 5.0)
        (init,) = _children(outer.pid)
        assert poll_until(lambda: Path(f"/proc/{init}/exe").resolve() == pause.resolve(), 5.0)
        # both sleeps exit; pause reaps them (a zombie would stay listed as its child)
        assert poll_until(lambda: _children(init) == [], 5.0), _children(init)
        assert alive(init)
        os.kill(init, signal.SIGTERM)
        assert outer.wait(timeout=5) == 0
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


# ------------------------------------------------------------------------------------------------
# in containerd


def test_the_images_keep_their_names_in_containerd(ctd: Containerd) -> None:
    listed = subprocess.run(["ctr", "--address", str(ctd.socket), "-n", "k8s.io", "images", "ls", "-q"],
                            capture_output=True, text=True, check=True, timeout=30).stdout.split()
    assert set(images.IMAGES) <= set(listed)


def test_pause_is_the_sandbox_and_a_pause_container_stops_cleanly_on_sigterm(ctd: Containerd) -> None:
    pod = _run(ctd, images.BUSYBOX, ("sleep", "3600"), name="sandbox")
    try:
        status = ctd.runtime.PodSandboxStatus(cri.PodSandboxStatusRequest(
            pod_sandbox_id=pod.sandbox_id, verbose=True), timeout=10)
        pid = int(json.loads(status.info["info"])["pid"])
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"/pause"
    finally:
        ctd.remove_pod(pod)
    pod = _run(ctd, images.PAUSE, name="pause")
    try:
        # PID 1 of a PID namespace ignores a signal it has no handler for: SIGTERM sent before pause reached its
        # sigaction (a loaded machine) is dropped and the stop ends in SIGKILL after 20 s (exit 137). Stop it once
        # its handler is in, as kubelet, which stops pods seconds after their start, always does.
        pid = ctd.container_pid(pod.container_id)
        assert poll_until(lambda: _catches(pid, signal.SIGTERM), 30.0, every=0.05), "pause never caught SIGTERM"
        started = time.monotonic()
        ctd.stop_container(pod.container_id, timeout=20)  # SIGTERM, SIGKILL only after 20 s
        assert ctd.wait_exited(pod.container_id) == 0
        assert time.monotonic() - started < 10
    finally:
        ctd.remove_pod(pod)


def _catches(pid: int, sig: int) -> bool:
    """``pid`` has a handler for ``sig`` (SigCgt of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def test_busybox_runs_the_e2e_workload(ctd: Containerd) -> None:
    pod = _run(ctd, images.BUSYBOX, ("sh", "-c", "grep Cpus_allowed_list /proc/self/status; env; sleep 3600"))
    try:
        log = _wait_log(ctd, pod, "PATH=")
        assert f"Cpus_allowed_list:\t{ctd.default_cpus()}" in log
        assert "PATH=/bin" in log
    finally:
        ctd.remove_pod(pod)


@pytest.mark.parametrize(("command", "expected"), [
    (("topology-agent", "--version"), "topology-agent "),
    (("topology-agent", "discover", "--topology-file", "embedded:z16-lpar"), "drawer0-book0"),
])
def test_the_agent_image_runs_the_agent(ctd: Containerd, command: tuple[str, ...], expected: str) -> None:
    pod = _run(ctd, images.AGENT, command, name="agent")
    try:
        code = ctd.wait_exited(pod.container_id, timeout=60)
        log = _log(ctd, pod)
        assert code == 0, log
        assert expected in log
    finally:
        ctd.remove_pod(pod)


def test_the_agent_image_is_the_dockerfiles_on_the_stand_in_base(archives: dict[str, Path]) -> None:
    with tarfile.open(archives[images.AGENT]) as tar:
        def blob(digest: str) -> bytes:
            member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            return member.read()

        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
    assert config["architecture"] == oci.goarch()
    assert config["config"]["Entrypoint"] == ["topology-agent"] and config["config"]["User"] == "65532:65532"
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.base.name"].startswith("docker.io/library/" + images.STANDIN_REPO)
    assert labels["org.opencontainers.image.title"] == "s390x-topology-agent"
