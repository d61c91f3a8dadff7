"""Topology snapshots for the kind cluster: a z16-shaped node and a z13-shaped node.

``python tests/e2e/snapshots.py --cluster NAME --out DIR`` writes ``NAME-worker.json`` (z16, the packaged
agent/data/z16-lpar.json), ``NAME-worker2.json`` (z13) and ``default.json`` (z16) for the chart's
fakeTopology.snapshots. The z13 snapshot comes from the real z13 LPAR dump in ../shared/fixtures when it is
there, else from a synthetic z13 shape of the same layout (drawer 4 > book 1 > sockets 2 and 3 with 2 and 6
cores, no SMT). The tests use :func:`expected` to know what each node must advertise.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script from run.sh
    sys.path.insert(0, str(REPO))

from agent.node.labels import LABEL_CPU_MANAGER_POLICY, node_labels  # noqa: E402
from agent.policy.grouping import Grouping, GroupingSettings, group_topology  # noqa: E402
from agent.topology import snapshot_format as snapshot  # noqa: E402
from agent.topology.model import Topology  # noqa: E402
from topology_devkit.synthetic import IdRule, LparShape, build_topology  # noqa: E402

REAL_FIXTURES = Path(os.environ.get("S390X_FIXTURES", REPO.parent / "shared" / "fixtures" / "s390x-real"))
Z13_DUMP = REAL_FIXTURES / "util-linux" / "s390-lpar-drawer"

Z13_SHAPE = LparShape(
    name="z13-kind",
    machine_type="2964",
    description="z13 LPAR like the util-linux s390-lpar-drawer dump: drawer 4 > book 1 > sockets 2 (2 cores), 3 (6)",
    drawers=(((2, 6),),),
    drawer_ids=IdRule(start=4),
    book_ids=IdRule(start=1, per_parent=False),
    socket_ids=IdRule(start=2),
    cores_per_chip=8,
    smt=1,
)


def local_shape(cpus: int) -> LparShape:
    """The real-cluster lane's node: one book of one core (one thread) per CPU of this machine, so the CPU ids the
    agent hands out are real CPUs whose cpusets the tests can read (devkit/topology_devkit/realcluster)."""
    return LparShape(
        name="e2e-local",
        machine_type="3931",
        description=f"{cpus} books of one single-threaded core each, CPUs 0-{cpus - 1} of the machine itself",
        drawers=(tuple((1,) for _ in range(cpus)),),
        smt=1,
    )


def write_local_snapshots(out: Path, cpus: int) -> Path:
    """default.json for the real-cluster lane (every node of it gets the same shape)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "default.json"
    path.write_text(snapshot.dumps(build_topology(local_shape(cpus))), encoding="utf-8")
    return path


def z13_topology() -> tuple[Topology, str]:
    """The z13 topology and where it came from."""
    if (Z13_DUMP / "sys" / "devices" / "system" / "cpu").is_dir():
        from agent.topology.sysfs import read_sysfs

        return read_sysfs(Z13_DUMP), f"real dump {Z13_DUMP}"
    return build_topology(Z13_SHAPE), "synthetic z13 shape (../shared/fixtures not found)"


def z16_topology() -> Topology:
    return snapshot.load(REPO / "agent" / "data" / "z16-lpar.json")


def write_snapshots(out: Path, cluster: str) -> dict[str, str]:
    """Write the three snapshot files; returns file name -> what it holds."""
    out.mkdir(parents=True, exist_ok=True)
    z13, origin = z13_topology()
    files = {
        f"{cluster}-worker.json": (z16_topology(), "z16 (agent/data/z16-lpar.json)"),
        f"{cluster}-worker2.json": (z13, f"z13 ({origin})"),
        "default.json": (z16_topology(), "z16 (agent/data/z16-lpar.json)"),
    }
    for name, (topology, _) in files.items():
        (out / name).write_text(snapshot.dumps(topology), encoding="utf-8")
    return {name: what for name, (_, what) in files.items()}


@dataclass(frozen=True)
class Expected:
    """What a node given this snapshot must show, computed by the agent's own policy code."""

    topology: Topology
    grouping: Grouping

    @property
    def allocatable(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for group in self.grouping.groups:
            counts[group.resource] = counts.get(group.resource, 0) + 1
        return counts

    @property
    def labels(self) -> dict[str, str]:
        labels = node_labels(self.topology, self.grouping, None)
        labels.pop(LABEL_CPU_MANAGER_POLICY, None)  # depends on the kind node's kubelet
        return labels

    def cpulists(self, resource: str) -> set[str]:
        return {g.cpulist for g in self.grouping.groups if g.resource == resource}


def expected(snapshot_dir: Path, node_name: str, prefix: str = "topology") -> Expected:
    """What ``node_name`` advertises: <node>.json, else default.json (the agent's own rule)."""
    path = snapshot_dir / f"{node_name}.json"
    if not path.is_file():
        path = snapshot_dir / "default.json"
    topology = snapshot.load(path)
    return Expected(topology, group_topology(topology, GroupingSettings(resource_prefix=prefix).validated()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write the kind cluster's topology snapshots")
    parser.add_argument("--cluster", help="kind cluster name (nodes are <name>-worker, -worker2)")
    parser.add_argument("--local-cpus", type=int, help="the real-cluster lane: one book per CPU of this machine")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.local_cpus:
        path = write_local_snapshots(args.out, args.local_cpus)
        print(f"{path}: {expected(args.out, 'default').allocatable}")
        return 0
    if not args.cluster:
        parser.error("--cluster or --local-cpus is needed")
    for name, what in write_snapshots(args.out, args.cluster).items():
        exp = expected(args.out, name.removesuffix(".json"))
        print(f"{args.out / name}: {what}; advertises {exp.allocatable}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
