"""Mounts below a folder, and removing a folder only when nothing is mounted below it.

A folder the lanes remove may still have something mounted inside it: a debootstrap killed by its timeout leaves
the root's /proc and /sys mounted (its exit trap never ran), a crashed kubelet leaves its pods' volumes. A recursive
remove then walks into the mounted file system, the host's /sys or /dev included. Unmount first, and remove nothing
that is still mounted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def mounts_under(prefixes: list[Path]) -> list[str]:
    """Mount points at or below any of ``prefixes`` (this process's mount namespace), deepest first.

    mountinfo names real paths: a prefix through a symbolic link (``/var/run`` is ``/run`` on Debian) is matched
    by its real path as well as by its own.
    """
    wanted = {str(p) for p in prefixes} | {os.path.realpath(p) for p in prefixes}
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(f"{p}/") for p in wanted):
            found.append(point)
    return sorted(set(found), key=len, reverse=True)


def unmount(prefixes: list[Path], rounds: int = 5) -> None:
    """Lazily unmount everything at or below ``prefixes`` (stacked mounts take a round each)."""
    for _ in range(rounds):
        points = mounts_under(prefixes)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def remove_tree(path: Path) -> list[str]:
    """Unmount what is below ``path``, then remove it; a folder still mounted is left whole. What stayed mounted."""
    unmount([path])
    left = mounts_under([path])
    if not left:
        shutil.rmtree(path, ignore_errors=True)
    return left
