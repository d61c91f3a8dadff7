"""tools/check-host-devices.sh, which .ci/run calls after every stage: it fails naming the stage when a device
node is no longer the kernel's character device, and puts the node back (a later buildah step needs /dev/null to be
the kernel's). Run on a folder of our own (HOST_DEV), never on the host's /dev."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.env import REPO, missing

SCRIPT = REPO / "tools" / "check-host-devices.sh"
KERNEL = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9)}


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        missing("root (mknod of character devices)", "run the tests as root, as .ci/run does")
    folder = tmp_path / "dev"
    folder.mkdir()
    for name, (major, minor) in KERNEL.items():
        os.mknod(folder / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    return folder


def check(dev: Path, stage: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "check", stage], env={**os.environ, "HOST_DEV": str(dev)},
                          capture_output=True, text=True, timeout=30, check=False)


def numbers(path: Path) -> tuple[int, int] | None:
    mode = path.lstat().st_mode
    return (os.major(path.lstat().st_rdev), os.minor(path.lstat().st_rdev)) if stat.S_ISCHR(mode) else None


def test_intact_nodes_pass_silently(dev: Path) -> None:
    done = check(dev, "make test")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_a_dev_null_turned_into_a_plain_file_fails_naming_the_stage_and_is_put_back(dev: Path) -> None:
    (dev / "null").unlink()
    (dev / "null").write_text("")  # what a shell's `>/dev/null` leaves once the node is gone
    done = check(dev, "make s390x-smoke")
    assert done.returncode == 3
    assert 'broken after "make s390x-smoke"' in done.stderr
    assert f"{dev}/null (a regular empty file, 0 bytes" in done.stderr
    assert "zero" not in done.stderr, "only the broken node is named"
    assert numbers(dev / "null") == (1, 3), "put back with the kernel's numbers"
    assert check(dev, "the next stage").returncode == 0


def test_a_missing_node_and_one_with_the_wrong_numbers_are_both_named(dev: Path) -> None:
    (dev / "urandom").unlink()
    (dev / "zero").unlink()
    os.mknod(dev / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    done = check(dev, "make e2e")
    assert done.returncode == 3
    assert f"{dev}/urandom (missing)" in done.stderr
    assert f"{dev}/zero (character device 1:3, not 1:5)" in done.stderr
    assert {name: numbers(dev / name) for name in KERNEL} == KERNEL
