"""The lane's host processes on reserved CPUs, as a real node keeps its daemons off the CPUs it hands to pods
(kubelet's ``reservedSystemCPUs``, systemd's ``AllowedCPUs`` of system.slice).

:func:`confine` makes one cpuset cgroup of the lane's own (:data:`GROUP`, cgroup v1, beside ``kubepods``) with the
given CPUs and moves into it the lane's processes that are in the root cpuset: the control plane, the runtime, the
kubelet, the runtime's shims or monitors, and any extra pids (a bench's client). What they start later inherits the
group; a container's processes leave it when the runtime places them in their pod's cgroup. :func:`host_pids` widens
that to every user-space process of the host, as OpenShift's performance profile does (its tuned profile, built on
tuned's cpu-partitioning, sets systemd's CPUAffinity to the CPUs outside ``spec.cpu.isolated``). :func:`release`
moves every process of the group back to the root cpuset (all CPUs again) and removes the group; ``cluster-down``
calls it, so a run that died confined leaves nothing.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path

from . import crio
from .layout import CONTAINERD_SOCKET, Layout, components
from .procs import pids_of, running

CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")
GROUP = "topology-lane-host"


def cpuset_path(proc_cgroup: str) -> str | None:
    """The cpuset cgroup path in a ``/proc/<pid>/cgroup`` text (cgroup v1: ``N:cpuset:/path``), None without one."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and "cpuset" in parts[1].split(","):
            return parts[2]
    return None


def _cpuset_of(pid: int) -> str | None:
    try:
        return cpuset_path(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None


def lane_pids(layout: Layout) -> list[int]:
    """The lane's host processes: its components (by pid file), containerd's shims and CRI-O's monitors."""
    pids = [pid for c in components(layout.runtime()) if (pid := running(layout, c)) is not None]
    pids += pids_of("containerd-shim-runc-v2", str(CONTAINERD_SOCKET)) + crio.own_monitors()
    return sorted(set(pids))


def host_pids(proc: Path = Path("/proc")) -> list[int]:
    """Every user-space process of the host: kernel threads (an empty ``cmdline``) stay where the kernel put them."""
    pids = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile
                continue
    return sorted(pids)


def _move(procs: Path, pid: int) -> bool:
    try:
        with procs.open("w") as f:
            f.write(f"{pid}\n")
        return True
    except OSError as err:  # gone meanwhile, or a process the kernel keeps where it is
        if err.errno in (errno.ESRCH, errno.EINVAL):
            return False
        raise


def confine(cpus: str, pids: Iterable[int], root: Path = CPUSET_ROOT) -> list[int]:
    """Move ``pids`` that are in the root cpuset (or already in the group) into the group on ``cpus``; the pids
    moved. OSError when the host has no cgroup v1 cpuset or refuses the CPUs."""
    group = root / GROUP
    group.mkdir(exist_ok=True)
    (group / "cpuset.mems").write_text((root / "cpuset.mems").read_text().strip() + "\n")  # before any task
    (group / "cpuset.cpus").write_text(f"{cpus}\n")
    moved = []
    for pid in pids:
        if _cpuset_of(pid) in ("/", f"/{GROUP}") and _move(group / "cgroup.procs", pid):
            moved.append(pid)
    return moved


def release(root: Path = CPUSET_ROOT) -> int:
    """Every process of the group back into the root cpuset, then the group removed; how many moved (0 when there
    is no group)."""
    group = root / GROUP
    if not group.is_dir():
        return 0
    moved = 0
    for _ in range(20):  # a process may start in the group while it is emptied
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        if not pids:
            break
        moved += sum(_move(root / "cgroup.procs", pid) for pid in pids)
    group.rmdir()
    return moved


def allowed_cpus(pid: int) -> str:
    """``Cpus_allowed_list`` of ``pid`` ("" when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
