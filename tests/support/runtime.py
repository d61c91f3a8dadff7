"""For the tests a real runtime judges: the real-cluster lane's containerd 2.4.2 (NRI on), and a container's first
line of output, the moment its entrypoint ran."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.support.env import REPO, missing
from topology_devkit.containerd import Containerd, ContainerdUnavailable, PodContainer
from topology_devkit.testing.wait import wait_until

FIRST_LINE = ("sh", "-c", "grep Cpus_allowed_list /proc/self/status; exec sleep 3600")


def built_binaries() -> Path:
    """The real-cluster lane's build folder (devkit/cluster/build.sh --print) once its build finished."""
    done = subprocess.run([str(REPO / "devkit/cluster/build.sh"), "--print"], capture_output=True, text=True,
                          timeout=30, check=False)
    folder = Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
    if folder is None or not (folder / "build-info.json").is_file():
        missing("containerd 2.4.2 built by the real-cluster lane",
                f"build it: make cluster-build (expected in {folder or 'devkit/cluster/build.sh --print'})")
    return folder


def first_line(ctd: Containerd, pod: PodContainer, timeout: float = 10.0) -> str:
    """The container's first line of output (CRI log: ``<time> stdout F <line>``)."""
    log = ctd.workdir / "logs" / pod.pod_uid / pod.container_name / f"{pod.attempt}.log"
    seen: list[str] = []

    def written() -> bool:
        try:
            lines = log.read_text().splitlines()
        except OSError:
            return False
        seen[:] = lines
        return bool(lines)

    wait_until(f"the first line of {log}", written, timeout)
    return seen[0].split(" ", 3)[3].split(":", 1)[1].strip()


def real_containerd(name: str) -> Iterator[Containerd]:
    """A private containerd 2.4.2 from the lane's build, for one test module's fixture (``yield from``); the test is
    missing (skipped, or failed under CI) where it cannot start, with containerd's reason."""
    try:
        harness = Containerd(name, bin_dir=built_binaries()).__enter__()
    except ContainerdUnavailable as exc:
        missing("a real containerd 2.4.2", exc.reason)
    try:
        yield harness
    finally:
        harness.close()
