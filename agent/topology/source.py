"""Where a command's topology comes from: a host root (sysfs or lscpu), a snapshot file, a
directory of per-node snapshots (the chart's fake-topology mode), or an embedded snapshot."""

from __future__ import annotations

import os
from pathlib import Path

from agent.errors import TopologyReadError
from agent.topology.model import Topology

EMBEDDED_PREFIX = "embedded:"


def snapshot_path(path: str | Path, node_name: str | None = None) -> Path:
    """A snapshot file; for a directory, ``<node name>.json`` in it, else ``default.json``."""
    p = Path(path)
    if not p.is_dir():
        return p
    node = node_name if node_name is not None else os.environ.get("NODE_NAME", "")
    for candidate in ([p / f"{node}.json"] if node else []) + [p / "default.json"]:
        if candidate.is_file():
            return candidate
    wanted = f"neither {node}.json nor default.json" if node else "no default.json"
    raise TopologyReadError(f"{p}: topology directory holds {wanted}")


class TopologySource:
    """One configured place to read the topology from, again and again (the agent rescans)."""

    def __init__(self, host_root: str | Path = "/", topology_file: str | None = None, source: str = "sysfs",
                 node_name: str | None = None, proc_root: str | Path | None = None, details: bool = True) -> None:
        self.host_root = host_root
        self.topology_file = topology_file
        self.source = source
        self.node_name = node_name
        self.proc_root = proc_root
        self.details = details

    def load(self) -> Topology:
        return load_topology(self.host_root, self.topology_file, self.source, self.node_name, self.proc_root,
                             self.details)

    def fingerprint(self) -> object:
        """Changes whenever a full read could give something new (cheap); None: always read."""
        if self.topology_file:
            if self.topology_file.startswith(EMBEDDED_PREFIX):
                return self.topology_file
            try:
                st = snapshot_path(self.topology_file, self.node_name).stat()
            except (OSError, TopologyReadError):
                return None
            return (st.st_ino, st.st_mtime_ns, st.st_size)
        if self.source != "sysfs":
            return None
        from agent.topology.sysfs import sysfs_fingerprint

        return sysfs_fingerprint(self.host_root)


def load_topology(host_root: str | Path = "/", topology_file: str | None = None, source: str = "sysfs",
                  node_name: str | None = None, proc_root: str | Path | None = None, details: bool = True) -> Topology:
    """Read the topology the way the command line asked for."""
    if topology_file:
        if topology_file.startswith(EMBEDDED_PREFIX):
            from agent.topology.embedded import load_embedded

            return load_embedded(topology_file[len(EMBEDDED_PREFIX):])
        from agent.topology import snapshot_format as snapshot

        return snapshot.load(snapshot_path(topology_file, node_name))
    if source == "lscpu":
        from agent.topology.lscpu import read_lscpu

        root = os.path.normpath(os.fspath(host_root))
        if not os.path.isdir(root):
            raise TopologyReadError(f"{root}: host root does not exist or is not a directory")
        return read_lscpu(sysroot=None if os.path.realpath(root) == "/" else root)
    if source != "sysfs":
        raise TopologyReadError(f"unknown topology source {source!r} (choose sysfs or lscpu)")
    from agent.topology.sysfs import read_sysfs

    return read_sysfs(host_root, proc_root, details=details)
