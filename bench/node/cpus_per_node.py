"""Scaling: discovery, rescans and planning from 50 to 4,000 CPUs, per CPU.

Synthetic z16-like nodes (drawers of 4 books of 2 sockets of 7 or 6 cores, SMT-2; ``z16-400`` itself at
400 CPUs) are written as host-root trees, then timed in this process, interleaved (the sizes' order
rotates each repetition) after a warm-up pass:

* **discovery**: ``read_sysfs(tree, proc, details=False)``, the read ``serve`` and ``discover`` do;
* **rescan, fingerprint**: ``sysfs_fingerprint``, what most rescans read (3 files whatever the size);
* **rescan, full read**: ``read_sysfs`` plus ``machine_health`` against the advertised groups, what every
  12th rescan (and one whose fingerprint changed) does;
* **planning**: ``group_topology`` (production settings), an Allocate plan and its wire form
  (``plan_allocation`` + ``render``) for every group, and ``preferred_allocation`` of half the groups on a
  table it has not seen (the first GetPreferredAllocation).

Each row shows the median time per size and per CPU. Target (growth near linear): the per-CPU cost at
4,000 CPUs within 2x of that at 400 (``met``); the fingerprint does the same work at every size, so its
row is information.

    .venv/bin/python bench/node/cpus_per_node.py [--quick]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.plugin.servicer import render
from agent.policy.allocation import AllocationSettings, plan_allocation
from agent.policy.device_states import machine_health
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.preference import preferred_allocation
from agent.topology.model import Topology
from agent.topology.sysfs import read_sysfs, sysfs_fingerprint
from bench.lib.common import INFO, BenchError, Row, at_most, bench_main, fmt_time, median
from topology_devkit.synthetic import SHAPES, LparShape, build_topology
from topology_devkit.sysfs_writer import write_sysfs_tree

BENCH = "cpus_per_node"
SIZES = (50, 200, 400, 1000, 4000)
TARGET_GROWTH = 2.0


def z16_like(cpus: int) -> LparShape:
    """``cpus`` CPUs (SMT-2) as z16 drawers: 4 books of 2 sockets, 7 cores in every fourth socket, else 6."""
    if cpus == 400:
        return SHAPES["z16-400"]
    cores = cpus // 2
    sockets: list[int] = []
    while sum(sockets) < cores:
        sockets.append(min(7 if len(sockets) % 4 == 0 else 6, cores - sum(sockets)))
    books = [tuple(sockets[i:i + 2]) for i in range(0, len(sockets), 2)]
    drawers = tuple(tuple(books[i:i + 4]) for i in range(0, len(books), 4))
    return LparShape(name=f"z16-like-{cpus}", machine_type="3931", drawers=drawers, cores_per_chip=8)


def time_once(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


class Node:
    def __init__(self, cpus: int, root: Path) -> None:
        self.cpus = cpus
        self.model = build_topology(z16_like(cpus))
        if len(self.model.cpus) != cpus:
            raise BenchError(f"the {cpus}-CPU shape has {len(self.model.cpus)} CPUs")
        self.tree = root / f"n{cpus}"
        write_sysfs_tree(self.model, self.tree)
        self.proc = self.tree / "proc"
        self.settings = GroupingSettings()
        self.topology = self.read()
        self.grouping = group_topology(self.topology, self.settings)
        if not self.grouping.groups:
            raise BenchError(f"no groups on the {cpus}-CPU node")

    def read(self) -> Topology:
        return read_sysfs(self.tree, self.proc, details=False)

    def full_rescan(self) -> None:
        machine_health(self.grouping, self.read(), self.settings)

    def plan(self) -> None:
        grouping = group_topology(self.topology, self.settings)
        allocation = AllocationSettings()
        for g in grouping.groups:
            render(plan_allocation([g], allocation))
        resource = grouping.groups[0].resource
        table = dict(grouping.by_id(resource))  # the preference index is made in the call, as at start
        ids = list(table)
        preferred_allocation(table, ids, [], max(1, len(ids) // 2))


MEASURES: dict[str, Callable[[Node], Callable[[], object]]] = {
    "discovery (sysfs read)": lambda n: n.read,
    "rescan, fingerprint": lambda n: lambda: sysfs_fingerprint(n.tree),
    "rescan, full read + health": lambda n: n.full_rescan,
    "planning (groups, plans, preference)": lambda n: n.plan,
}


def run(quick: bool) -> list[Row]:
    reps = 3 if quick else 9
    sizes = (50, 400, 4000) if quick else SIZES
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        nodes = [Node(n, Path(tmp)) for n in sizes]
        times: dict[tuple[str, int], list[float]] = {(m, n.cpus): [] for m in MEASURES for n in nodes}
        for node in nodes:  # warm-up: the page and dentry caches, the preference code
            for make in MEASURES.values():
                make(node)()
        for r in range(reps):
            order = nodes[r % len(nodes):] + nodes[:r % len(nodes)]
            for node in order:
                for name, make in MEASURES.items():
                    times[(name, node.cpus)].append(time_once(make(node)))
        groups = {n.cpus: len(n.grouping.groups) for n in nodes}
    rows: list[Row] = []
    for name in MEASURES:
        med = {n: median(times[(name, n)]) for n in sizes}
        per_cpu = {n: med[n] / n for n in sizes}
        growth = per_cpu[4000] / per_cpu[400]
        text = ", ".join(f"{n}: {fmt_time(med[n])} ({per_cpu[n] * 1e6:.1f} us/CPU)" for n in sizes)
        fixed = name.startswith("rescan, fingerprint")
        rows.append(Row(BENCH, name, f"{text}; per CPU at 4000 / at 400 = {growth:.2f}", growth,
                        "" if fixed else f"per-CPU 4000/400 <= {TARGET_GROWTH}",
                        INFO if fixed else at_most(growth, TARGET_GROWTH),
                        "the same 3 files at every size" if fixed else "",
                        raw={"median_s": {str(n): med[n] for n in sizes}, "reps": reps}))
    rows.append(Row(BENCH, "set-up", ", ".join(f"{n} CPUs: {g} books" for n, g in groups.items()), None, "", INFO,
                    f"median of {reps} interleaved repetitions after a warm-up pass"))
    return rows


def main(argv: list[str] | None = None) -> int:
    return bench_main(BENCH, run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
