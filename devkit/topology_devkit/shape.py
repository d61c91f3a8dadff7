"""An id-free description of a topology, for comparing two sources of the same machine.

sysfs gives kernel ids (or ids derived from masks), lscpu gives logical indexes in order of
first appearance, a snapshot gives whatever was saved: the ids differ, the shape must not.
``canonical_shape`` keeps what every source agrees on: each CPU's state, and which CPUs
share a core, a socket, a book and a drawer. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from agent.topology.model import Cpu, Topology


def _partition(topology: Topology, key: Callable[[Cpu], Hashable | None]) -> list[list[int]]:
    """CPUs grouped by ``key`` (CPUs whose key is None left out), as sorted lists, sorted."""
    groups: dict[Hashable, list[int]] = {}
    for cpu in topology.cpus:
        k = key(cpu)
        if k is not None:
            groups.setdefault(k, []).append(cpu.cpu)
    return sorted(sorted(members) for members in groups.values())


def canonical_shape(topology: Topology) -> dict[str, Any]:
    """The topology without container ids.

    ``cpus``: per CPU (ascending) its number, online, configured, polarization and node.
    ``cores``/``sockets``/``books``/``drawers``: the partition of the CPUs that have that
    level into its containers, as a sorted list of sorted CPU lists. Containers are keyed
    hierarchically (a socket by drawer, book and socket id) because container ids are only
    unique within their parent. Machine facts are left out: sources differ in what they know.
    """
    return {
        "cpus": [
            {
                "cpu": c.cpu,
                "online": c.online,
                "configured": c.configured,
                "polarization": c.polarization,
                "node": c.node,
            }
            for c in topology.cpus
        ],
        "cores": _partition(topology, lambda c: None if c.core is None else (*c.socket_key, c.core)),
        "sockets": _partition(topology, lambda c: None if c.socket is None else c.socket_key),
        "books": _partition(topology, lambda c: None if c.book is None else c.book_key),
        "drawers": _partition(topology, lambda c: c.drawer),
    }
