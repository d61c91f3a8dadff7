"""Synthetic IBM Z (z14-z17) LPAR topologies: a small declarative shape and a builder. Pure.

No public sysfs dump of a z14-z17 LPAR with SMT exists (see ../shared/docs/s390x-topology.md §A.5), so the agent's
tests, demos and benchmark run on shapes built here. A shape lists, per drawer and per book,
the core count of each socket (PU chip). The builder numbers logical CPUs the way the s390
kernel does on an LPAR: in order drawer > book > socket > core > thread, with the SMT threads
of a core on adjacent CPU numbers (2n, 2n+1), ``core_id`` the machine-wide physical core
number and ``address = core << 1 | thread`` under SMT-2.

Container ids are hierarchical: by default socket ids restart in every book (sockets 0, 1 in
each z16 DCM), and drawer/book ids follow an :class:`IdRule` so they need not start at 0.

Offline and standby (deconfigured) CPUs stay in the model with their place in the topology:
the model is the ground truth. A modern kernel shows less (offline CPUs have no
``topology/`` directory and are left out of every sibling mask); see
:func:`topology_devkit.sysfs_writer.kernel_view` for what a sysfs reader can recover.

``python -m topology_devkit.synthetic --write-data`` regenerates ``agent/data/*.json``;
``--table`` prints the shapes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.topology.model import DISPATCHING_MODES, ENVIRONMENTS, Cpu, Machine, Topology, generation_of

Layout = tuple[tuple[tuple[int, ...], ...], ...]


@dataclass(frozen=True)
class IdRule:
    """How the containers of one level are numbered, in walk order.

    ``per_parent``: the numbering restarts at ``start`` in every parent container (socket ids
    0, 1 in every book); otherwise it runs across the machine (books 0-7 over two drawers).
    """

    start: int = 0
    step: int = 1
    per_parent: bool = True

    def __post_init__(self) -> None:
        if self.start < 0 or self.step < 1:
            raise ValueError(f"IdRule needs start >= 0 and step >= 1, got {self}")

    def ids(self, count: int, offset: int) -> list[int]:
        """Ids for ``count`` containers of one parent, ``offset`` of them numbered before it."""
        first = 0 if self.per_parent else offset
        return [self.start + (first + i) * self.step for i in range(count)]


@dataclass(frozen=True)
class LparShape:
    """The CPU topology of one (synthetic) LPAR or guest, small enough to read in a table.

    ``drawers`` holds per drawer, per book, the core count of each socket:
    ``(((3, 3), (3, 2)),)`` is one drawer with two books of two sockets each.
    ``standby_cores`` are core indexes in walk order (0 = the LPAR's first core);
    ``offline_cpus`` are logical CPU numbers. With ``topology_facility=False`` (a z/VM or
    KVM guest) the nesting is ignored: the total is the CPU count, and every CPU becomes its
    own socket, book and drawer, as in the kernel's TOPOLOGY_MODE_SINGLE.
    """

    name: str
    machine_type: str
    drawers: Layout
    environment: str = "lpar"
    description: str = ""
    drawer_ids: IdRule = field(default_factory=IdRule)
    book_ids: IdRule = field(default_factory=lambda: IdRule(per_parent=False))
    socket_ids: IdRule = field(default_factory=IdRule)
    cores_per_chip: int | None = None  # physical core number = chip slot * this + position (gaps)
    core_id_start: int = 0
    smt: int = 2
    dispatching: str = "horizontal"
    vertical_high: int | None = None  # cores; None: about one in six
    vertical_medium: int | None = None  # cores; None: about one in four
    offline_cpus: tuple[int, ...] = ()
    standby_cores: tuple[int, ...] = ()
    memory_nodes: tuple[int, ...] = (0,)
    has_node_dirs: bool = True
    topology_facility: bool = True

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.smt not in (1, 2):
            problems.append(f"smt must be 1 or 2, not {self.smt}")
        if self.environment not in ENVIRONMENTS or self.environment == "none":
            problems.append(f"environment must be one of lpar, zvm, kvm, unknown, not {self.environment!r}")
        if self.dispatching not in DISPATCHING_MODES[:2]:
            problems.append(f"dispatching must be horizontal or vertical, not {self.dispatching!r}")
        if not self.drawers or any(not d for d in self.drawers) or any(not b for d in self.drawers for b in d):
            problems.append("every drawer needs at least one book and every book at least one socket")
        if any(n < 1 for n in self.socket_core_counts):
            problems.append("every socket needs at least one core")
        if self.cores_per_chip is not None and any(n > self.cores_per_chip for n in self.socket_core_counts):
            problems.append(f"a socket has more cores than cores_per_chip={self.cores_per_chip}")
        if not self.memory_nodes or any(n < 0 for n in self.memory_nodes):
            problems.append("memory_nodes must be a non-empty list of node numbers")
        n_cores = self.core_count
        if any(not 0 <= c < n_cores for c in self.standby_cores):
            problems.append(f"standby_cores must be core indexes 0..{n_cores - 1}")
        if 0 in self.standby_cores:
            problems.append("core 0 holds CPU 0, which cannot be deconfigured")
        if any(not 0 <= c < n_cores * self.smt for c in self.offline_cpus):
            problems.append(f"offline_cpus must be CPU numbers 0..{n_cores * self.smt - 1}")
        if not self.topology_facility and (self.smt != 1 or self.standby_cores):
            problems.append("a guest without the topology facility has smt=1 and no standby cores")
        if problems:
            raise ValueError(f"shape {self.name!r}: " + "; ".join(problems))

    @property
    def socket_core_counts(self) -> list[int]:
        return [n for drawer in self.drawers for book in drawer for n in book]

    @property
    def core_count(self) -> int:
        return sum(self.socket_core_counts)

    @property
    def cpu_count(self) -> int:
        return self.core_count * self.smt


@dataclass(frozen=True)
class _CoreSlot:
    index: int  # walk order
    core: int
    socket: int
    book: int
    drawer: int


def _core_slots(shape: LparShape) -> list[_CoreSlot]:
    slots: list[_CoreSlot] = []
    books_before = 0
    sockets_before = 0
    chip_slot = 0
    dense_core = shape.core_id_start
    for drawer_id, drawer in zip(shape.drawer_ids.ids(len(shape.drawers), 0), shape.drawers, strict=True):
        book_ids = shape.book_ids.ids(len(drawer), books_before)
        books_before += len(drawer)
        for book_id, book in zip(book_ids, drawer, strict=True):
            socket_ids = shape.socket_ids.ids(len(book), sockets_before)
            sockets_before += len(book)
            for socket_id, n_cores in zip(socket_ids, book, strict=True):
                for k in range(n_cores):
                    if shape.cores_per_chip is None:
                        core = dense_core
                        dense_core += 1
                    else:
                        core = shape.core_id_start + chip_slot * shape.cores_per_chip + k
                    slots.append(_CoreSlot(len(slots), core, socket_id, book_id, drawer_id))
                chip_slot += 1
    return slots


def _vertical_counts(shape: LparShape, configured_cores: int) -> tuple[int, int]:
    high = shape.vertical_high if shape.vertical_high is not None else max(1, configured_cores // 6)
    medium = shape.vertical_medium if shape.vertical_medium is not None else max(1, configured_cores // 4)
    return high, medium


def _machine(shape: LparShape) -> Machine:
    return Machine(
        arch="s390x",
        machine_type=shape.machine_type,
        environment=shape.environment,
        topology_facility=shape.topology_facility,
        dispatching=shape.dispatching,
        smt_threads=shape.smt,
        memory_nodes=tuple(sorted(set(shape.memory_nodes))),
        has_node_dirs=shape.has_node_dirs,
    )


def _build_single_mode(shape: LparShape) -> Topology:
    """A guest without the topology facility: each CPU its own socket, book and drawer."""
    node = min(shape.memory_nodes) if shape.has_node_dirs else None
    offline = set(shape.offline_cpus)
    cpus = tuple(
        Cpu(
            cpu=n,
            core=n,
            socket=n,
            book=n,
            drawer=n,
            siblings=(n,),
            node=node,
            online=n not in offline,
            configured=True,  # z/VM and KVM CPUs are always configured
            polarization="horizontal",
            dedicated=None,  # no `dedicated` file without the topology facility
            address=n,
        )
        for n in range(shape.core_count)
    )
    return Topology(machine=_machine(shape), cpus=cpus)


def build_topology(shape: LparShape) -> Topology:
    """The model of ``shape``: every present CPU, offline and standby ones included."""
    if not shape.topology_facility:
        return _build_single_mode(shape)
    slots = _core_slots(shape)
    standby = set(shape.standby_cores)
    offline = set(shape.offline_cpus)
    configured_slots = [s for s in slots if s.index not in standby]
    high, medium = _vertical_counts(shape, len(configured_slots))
    polarization: dict[int, str] = {}
    for rank, slot in enumerate(configured_slots):
        if shape.dispatching == "horizontal":
            polarization[slot.index] = "horizontal"
        elif rank < high:
            polarization[slot.index] = "vertical:high"
        elif rank < high + medium:
            polarization[slot.index] = "vertical:medium"
        else:
            polarization[slot.index] = "vertical:low"
    node = min(shape.memory_nodes) if shape.has_node_dirs else None
    cpus: list[Cpu] = []
    for slot in slots:
        first = slot.index * shape.smt
        siblings = tuple(range(first, first + shape.smt))
        configured = slot.index not in standby
        for thread, number in enumerate(siblings):
            cpus.append(
                Cpu(
                    cpu=number,
                    core=slot.core,
                    socket=slot.socket,
                    book=slot.book,
                    drawer=slot.drawer,
                    siblings=siblings,
                    node=node,
                    online=configured and number not in offline,
                    configured=configured,
                    polarization=polarization.get(slot.index, "unknown"),
                    dedicated=False,
                    address=(slot.core << 1 | thread) if shape.smt == 2 else slot.core,
                )
            )
    return Topology(machine=_machine(shape), cpus=tuple(cpus))


def _shapes() -> dict[str, LparShape]:
    z16_layout: Layout = (
        ((3, 3), (3, 2), (2, 3), (3, 3)),
        ((3, 2), (2, 2), (3, 3), (2, 2)),
    )
    # 4 drawers x 4 DCMs x 2 chips = 32 sockets; 8 of them with 7 cores, 24 with 6: 200 cores.
    z16_400: Layout = tuple(
        tuple((7, 6) if b in (d, (d + 2) % 4) else (6, 6) for b in range(4))
        for d in range(4)
    )
    shapes = [
        LparShape(
            name="z14-lpar",
            machine_type="3906",
            description="z14: 2 drawers x 2 clusters x 3 PU chips (10-core chips, 4-6 cores each)",
            drawers=(((5, 4, 6), (4, 5, 4)), ((6, 4, 5), (4, 4, 5))),
            book_ids=IdRule(per_parent=True),  # cluster ids 0, 1 in both drawers
            cores_per_chip=10,
        ),
        LparShape(
            name="z15-lpar",
            machine_type="8561",
            description="z15 T01: 2 drawers, uneven clusters of 1-2 PU chips, vertical polarization",
            drawers=(((6, 5), (4,)), ((5, 3), (2, 1))),
            drawer_ids=IdRule(start=1),
            cores_per_chip=12,
            dispatching="vertical",
            vertical_high=3,
            vertical_medium=4,
        ),
        LparShape(
            name="z16-lpar",
            machine_type="3931",
            description="z16 A01: 2 drawers x 4 DCMs x 2 Telum chips, 2-3 cores each (the demo node)",
            drawers=z16_layout,
            cores_per_chip=8,
        ),
        LparShape(
            name="z16-vertical",
            machine_type="3931",
            description="z16: 1 drawer x 2 DCMs, vertical polarization, CPU 5 offline, core 7 standby",
            drawers=(((4, 3), (3, 2)),),
            cores_per_chip=8,
            dispatching="vertical",
            vertical_high=2,
            vertical_medium=3,
            offline_cpus=(5,),
            standby_cores=(7,),
        ),
        LparShape(
            name="z17-lpar",
            machine_type="9175",
            description="z17 ME1: the LPAR in drawer 2, DCMs 8-11 (ids not starting at 0)",
            drawers=(((4, 4), (4, 3), (2, 4), (3, 1)),),
            drawer_ids=IdRule(start=2),
            book_ids=IdRule(start=8, per_parent=False),
            cores_per_chip=8,
        ),
        LparShape(
            name="pr40714",
            machine_type="3931",
            description="vLLM PR #40714 LPAR: 3 books of 12, 12 and 1 cores, SMT-2, CPUs 0-49 "
            "(machine type not in the log; z16 assumed)",
            drawers=(((6, 6), (6, 6), (1,)),),
        ),
        LparShape(
            name="z16-400",
            machine_type="3931",
            description="z16: 4 drawers x 4 DCMs x 2 chips, 200 cores, 400 CPUs (discovery benchmark)",
            drawers=z16_400,
            cores_per_chip=8,
        ),
        LparShape(
            name="z16-guest-no-topology",
            machine_type="3931",
            environment="zvm",
            description="z/VM 7.3 guest on a z16 without the topology facility: 8 CPUs, single mode",
            drawers=(((8,),),),
            smt=1,
            topology_facility=False,
        ),
    ]
    return {s.name: s for s in shapes}


SHAPES: dict[str, LparShape] = _shapes()
DEFAULT_SHAPE = "z16-lpar"


def shape_summary(shape: LparShape) -> dict[str, object]:
    """One table row: counts of the built model (distinct drawers/books/sockets/cores/CPUs)."""
    topology = build_topology(shape)
    cpus = topology.cpus
    core_pol: dict[tuple[int | None, ...], str] = {(*c.socket_key, c.core): c.polarization for c in cpus}
    counts = {p: sum(1 for v in core_pol.values() if v == p) for p in ("vertical:high", "vertical:medium",
                                                                      "vertical:low", "unknown")}
    if shape.dispatching == "vertical":
        polarization = "vertical (cores {}H/{}M/{}L)".format(
            counts["vertical:high"], counts["vertical:medium"], counts["vertical:low"])
    else:
        polarization = "horizontal"
    if counts["unknown"]:
        polarization += f", {counts['unknown']} standby"
    return {
        "name": shape.name,
        "type": shape.machine_type,
        "generation": generation_of(shape.machine_type) or "?",
        "environment": shape.environment,
        "drawers": len({c.drawer for c in cpus}),
        "books": len({c.book_key for c in cpus}),
        "sockets": len({c.socket_key for c in cpus}),
        "cores": len({c.core for c in cpus}),
        "cpus": len(cpus),
        "online": sum(1 for c in cpus if c.online),
        "smt": shape.smt,
        "polarization": polarization,
    }


def format_table(shapes: Sequence[LparShape]) -> str:
    rows = [shape_summary(s) for s in shapes]
    cols = ["name", "type", "generation", "environment", "drawers", "books", "sockets", "cores", "cpus",
            "online", "smt", "polarization"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def data_dir() -> Path:
    """The source tree's ``agent/data`` directory (where the shipped snapshots live)."""
    import agent  # the product package, next to which the shipped snapshots live

    return Path(agent.__file__).resolve().parent / "data"


def write_data(target: Path | None = None) -> list[Path]:
    """Write one snapshot per shape into ``target`` (default: agent/data). Returns the paths."""
    from agent.topology import snapshot_format as snapshot  # I/O lives in snapshot.dump

    out = target or data_dir()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, shape in SHAPES.items():
        path = out / f"{name}.json"
        snapshot.dump(build_topology(shape), path)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topology_devkit.synthetic",
                                     description="Synthetic IBM Z topologies.")
    parser.add_argument("--write-data", action="store_true", help="rewrite agent/data/<shape>.json")
    parser.add_argument("--out", type=Path, default=None, help="directory for --write-data (default agent/data)")
    parser.add_argument("--table", action="store_true", help="print the shapes as a table")
    args = parser.parse_args(argv)
    if not (args.write_data or args.table):
        args.table = True
    if args.table:
        print(format_table(list(SHAPES.values())))
    if args.write_data:
        for path in write_data(args.out):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
