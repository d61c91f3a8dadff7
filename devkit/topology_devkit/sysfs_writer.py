"""Write a topology model out as a host-root tree (``sys/`` + ``proc/``) the way an s390 kernel shows it.

The tree is what :func:`agent.topology.sysfs.read_sysfs` and ``lscpu --sysroot`` read, so the
synthetic z14-z17 shapes can be discovered like a real node. What is written follows the
kernel sources cited in ../shared/docs/s390x-topology.md §B:

* ``cpu/{online,offline,present,possible,kernel_max,dispatching}``; ``possible`` is larger
  than ``present`` (like real LPARs), ``offline`` is ``possible`` minus ``online``.
* per CPU ``online`` (cpu0 too: it can go offline on s390), ``configure``, ``polarization``,
  ``address``, ``dedicated`` (only when the model knows it, i.e. with the topology facility)
  and a ``node0`` link.
* ``cpuN/topology/`` for ONLINE CPUs only. On a modern kernel (>= 5.7, ``kernel="modern"``)
  the sibling masks hold online CPUs only; ``kernel="pre-5.7"`` keeps configured but offline
  CPUs in the masks (standby CPUs are never in them). Masks are printed in the kernel's
  format: 32-bit hex words, comma-separated, as wide as ``possible``.
* ``node/node<N>/{cpulist,cpumap}`` (node 0 also covers the possible-but-absent CPUs, as on
  a real s390) and ``node/{online,possible,has_memory,has_cpu,has_normal_memory}`` when the
  model has node directories.
* ``proc/sysinfo`` (``CPU Topology HW/SW`` only with the topology facility; a ``VM00``
  section for z/VM and KVM guests) and ``proc/cpuinfo`` (online CPUs only, with the 5.7+
  per-CPU topology lines).

:func:`kernel_view` is the model as a reader of such a tree can recover it: offline CPUs have
no ``topology/`` directory, so their place in the topology is lost.

CLI: ``python -m topology_devkit.sysfs_writer SHAPE_OR_SNAPSHOT OUTDIR``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from agent.topology.cpulist import format_cpulist
from agent.topology.model import Cpu, Machine, Topology

KERNELS: tuple[str, ...] = ("modern", "pre-5.7")

# Whole-CEC magnitudes for "CPU Topology HW:" (drawers, books, sockets, cores per socket).
_CEC_MAGNITUDES: dict[str, tuple[int, int, int, int]] = {
    "z196": (0, 4, 6, 4),
    "zEC12": (0, 4, 6, 6),
    "z13": (4, 2, 3, 8),
    "z13s": (2, 2, 3, 8),
    "z14": (4, 2, 3, 10),
    "z15": (5, 2, 2, 12),
    "z16": (4, 4, 2, 8),
    "z17": (4, 4, 2, 8),
}
_MODELS: dict[str, str] = {
    "2817": "M49", "2827": "H89", "2964": "N96", "2965": "N20", "3906": "M05", "3907": "LR1",
    "8561": "T01", "8562": "T02", "3931": "A01", "3932": "A02", "9175": "ME1", "9176": "ML1",
}
_FEATURES_BASE = "esan3 zarch stfle msa ldisp eimm dfp edat etf3eh highgprs te vx vxd vxe gs"
_FEATURES: dict[str, str] = {
    "z14": _FEATURES_BASE,
    "z15": _FEATURES_BASE + " vxe2 vxp sort dflt",
    "z16": _FEATURES_BASE + " vxe2 vxp sort dflt vxp2 nnpa",
    "z17": _FEATURES_BASE + " vxe2 vxp sort dflt vxp2 nnpa",
}


def default_possible(topology: Topology) -> int:
    """Possible CPUs: the next multiple of 64 strictly above the highest present CPU number."""
    highest = max((c.cpu for c in topology.cpus), default=0)
    return (highest + 1) // 64 * 64 + 64


def format_cpumask(cpus: Iterable[int], nbits: int) -> str:
    """A kernel ``%*pb`` CPU mask over ``nbits`` bits: ``0000,00000000,000000fc`` (MSB word first)."""
    value = 0
    for cpu in cpus:
        if not 0 <= cpu < nbits:
            raise ValueError(f"CPU {cpu} outside a {nbits}-bit mask")
        value |= 1 << cpu
    nbits = max(nbits, 1)
    words = (nbits + 31) // 32
    first_digits = (((nbits - 1) % 32) + 1 + 3) // 4
    parts = [f"{(value >> (32 * (words - 1))) & 0xFFFFFFFF:0{first_digits}x}"]
    parts += [f"{(value >> (32 * w)) & 0xFFFFFFFF:08x}" for w in range(words - 2, -1, -1)]
    return ",".join(parts)


def _mask_members(topology: Topology, kernel: str) -> set[int]:
    """CPUs that appear in sibling masks: online ones (modern), online or configured (pre-5.7)."""
    if kernel == "modern":
        return {c.cpu for c in topology.cpus if c.online}
    return {c.cpu for c in topology.cpus if c.online or c.configured}


def _core_key(c: Cpu) -> Hashable:
    return ("siblings", c.threads) if c.siblings else ("core", c.drawer, c.book, c.socket, c.core, c.cpu)


def _groups(cpus: Sequence[Cpu], key: Callable[[Cpu], Hashable], members: set[int]) -> dict[Hashable, list[int]]:
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for c in cpus:
        if c.cpu in members:
            groups[key(c)].append(c.cpu)
    return groups


def kernel_view(topology: Topology, kernel: str = "modern") -> Topology:
    """``topology`` as a reader of the tree :func:`write_sysfs_tree` writes can see it.

    Offline CPUs have no ``topology/`` directory, so they lose core/socket/book/drawer and
    siblings (pre-5.7: a configured offline CPU keeps each level some online CPU shares with
    it, because that CPU's mask lists it); sibling lists hold only the CPUs in the masks;
    ``smt_threads`` is the largest sibling count among online CPUs. Everything else
    (online, configure, polarization, dedicated, address, node) stays readable.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, not {kernel!r}")
    members = _mask_members(topology, kernel)
    online_keys: dict[str, set[Hashable]] = {level: set() for level in ("core", "socket", "book", "drawer")}
    for c in topology.cpus:
        if c.online:
            online_keys["core"].add(_core_key(c))
            online_keys["socket"].add(c.socket_key)
            online_keys["book"].add(c.book_key)
            online_keys["drawer"].add(c.drawer)
    cpus: list[Cpu] = []
    for c in topology.cpus:
        if c.online:
            siblings = tuple(s for s in c.siblings if s in members)
            cpus.append(replace(c, siblings=siblings))
            continue
        if c.cpu not in members:
            cpus.append(replace(c, core=None, socket=None, book=None, drawer=None, siblings=()))
            continue
        core_seen = _core_key(c) in online_keys["core"]
        cpus.append(
            replace(
                c,
                core=c.core if core_seen else None,
                socket=c.socket if c.socket_key in online_keys["socket"] else None,
                book=c.book if c.book_key in online_keys["book"] else None,
                drawer=c.drawer if c.drawer in online_keys["drawer"] else None,
                siblings=tuple(s for s in c.siblings if s in members) if core_seen else (),
            )
        )
    smt = max((len(c.siblings) for c in cpus if c.online), default=1) or 1
    return Topology(machine=replace(topology.machine, smt_threads=smt), cpus=tuple(cpus))


class _Tree:
    """Files under one root; each directory is created once (a 400-CPU tree has ~20k files)."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.made: set[str] = set()

    def _parent(self, rel: str) -> str:
        path = f"{self.root}/{rel}"
        parent = os.path.dirname(path)
        if parent not in self.made:
            os.makedirs(parent, exist_ok=True)
            self.made.add(parent)
        return path

    def write(self, rel: str, text: str) -> None:
        data = (text if text.endswith("\n") else text + "\n").encode("ascii")
        fd = os.open(self._parent(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def link(self, rel: str, target: str) -> None:
        os.symlink(target, self._parent(rel))


def _id_text(value: int | None) -> str:
    return str(-1 if value is None else value)


def _write_cpus(tree: _Tree, topology: Topology, kernel: str, nbits: int) -> None:
    cpus = topology.cpus
    machine = topology.machine
    base = "sys/devices/system/cpu"
    present = [c.cpu for c in cpus]
    online = [c.cpu for c in cpus if c.online]
    tree.write(f"{base}/present", format_cpulist(present))
    tree.write(f"{base}/possible", format_cpulist(range(nbits)))
    tree.write(f"{base}/online", format_cpulist(online))
    tree.write(f"{base}/offline", format_cpulist(set(range(nbits)) - set(online)))
    tree.write(f"{base}/kernel_max", str(max(511, nbits - 1)))
    tree.write(f"{base}/dispatching", "1" if machine.dispatching == "vertical" else "0")
    tree.write(f"{base}/isolated", "")
    tree.write(f"{base}/smt/active", "1" if machine.smt_threads > 1 else "0")
    tree.write(f"{base}/smt/control", "on" if machine.smt_threads > 1 else
               ("off" if machine.environment == "lpar" else "notsupported"))

    members = _mask_members(topology, kernel)
    levels: dict[str, tuple[Callable[[Cpu], Hashable], dict[Hashable, list[int]]]] = {}
    for level, key in (("thread", _core_key), ("core", lambda c: c.socket_key),
                       ("book", lambda c: c.book_key), ("drawer", lambda c: c.drawer)):
        levels[level] = (key, _groups(cpus, key, members))

    for c in cpus:
        d = f"{base}/cpu{c.cpu}"
        tree.write(f"{d}/online", "1" if c.online else "0")
        tree.write(f"{d}/configure", "1" if c.configured else "0")
        tree.write(f"{d}/polarization", c.polarization)
        if c.address is not None:
            tree.write(f"{d}/address", str(c.address))
        if c.dedicated is not None:
            tree.write(f"{d}/dedicated", "1" if c.dedicated else "0")
        if machine.has_node_dirs and c.node is not None:
            tree.link(f"{d}/node{c.node}", f"../../node/node{c.node}")
        if not c.online:
            continue
        t = f"{d}/topology"
        tree.write(f"{t}/core_id", _id_text(c.core))
        tree.write(f"{t}/physical_package_id", _id_text(c.socket))
        if c.book is not None:
            tree.write(f"{t}/book_id", str(c.book))
        if c.drawer is not None:
            tree.write(f"{t}/drawer_id", str(c.drawer))
        for level, names in (
            ("thread", ("thread_siblings", "core_cpus")),
            ("core", ("core_siblings", "package_cpus")),
            ("book", ("book_siblings",)),
            ("drawer", ("drawer_siblings",)),
        ):
            if (level == "book" and c.book is None) or (level == "drawer" and c.drawer is None):
                continue
            key, groups = levels[level]
            group = sorted(set(groups.get(key(c), [])) | {c.cpu})
            for name in names:
                tree.write(f"{t}/{name}_list", format_cpulist(group))
                tree.write(f"{t}/{name}", format_cpumask(group, nbits))


def _write_nodes(tree: _Tree, topology: Topology, nbits: int) -> None:
    machine = topology.machine
    if not machine.has_node_dirs:
        return
    base = "sys/devices/system/node"
    nodes = sorted(set(machine.memory_nodes) | {c.node for c in topology.cpus if c.node is not None})
    first = min(machine.memory_nodes)
    present = {c.cpu for c in topology.cpus}
    by_node: dict[int, set[int]] = {n: set() for n in nodes}
    for c in topology.cpus:
        if c.node is not None:
            by_node[c.node].add(c.cpu)
    # s390 maps every possible CPU to a node; the ones not present go to the first node.
    by_node[first] |= set(range(nbits)) - present
    for n in nodes:
        tree.write(f"{base}/node{n}/cpulist", format_cpulist(by_node[n]))
        tree.write(f"{base}/node{n}/cpumap", format_cpumask(by_node[n], nbits))
    tree.write(f"{base}/online", format_cpulist(nodes))
    tree.write(f"{base}/possible", format_cpulist(nodes))
    tree.write(f"{base}/has_memory", format_cpulist(machine.memory_nodes))
    tree.write(f"{base}/has_normal_memory", format_cpulist(machine.memory_nodes))
    tree.write(f"{base}/has_cpu", format_cpulist(n for n in nodes if by_node[n] & present))


def _magnitudes(topology: Topology) -> tuple[int, int, int, int]:
    cpus = topology.cpus
    drawers = len({c.drawer for c in cpus})
    books = max(len({c.book for c in cpus if c.drawer == d}) for d in {c.drawer for c in cpus})
    sockets = max(len({c.socket for c in cpus if c.book_key == b}) for b in {c.book_key for c in cpus})
    cores = max(len({c.core for c in cpus if c.socket_key == s}) for s in {c.socket_key for c in cpus})
    observed = (drawers, books, sockets, cores)
    cec = _CEC_MAGNITUDES.get(topology.machine.generation or "", (0, 0, 0, 0))
    return tuple(max(a, b) for a, b in zip(cec, observed, strict=True))  # type: ignore[return-value]


def _field(name: str, value: str) -> str:
    return f"{name + ':':<22}{value}"


def sysinfo_text(topology: Topology, lpar_name: str = "SYNLP01") -> str:
    """``/proc/sysinfo`` for the model (STSI 1.1.1, 1.2.2, 15.1.x, 2.2.2 and 3.2.2 blocks)."""
    m = topology.machine
    mtid = m.smt_threads - 1
    cores: dict[Hashable, bool] = {}
    for c in topology.cpus:
        key = _core_key(c)
        cores[key] = cores.get(key, False) or c.configured
    configured = sum(1 for v in cores.values() if v)
    standby = len(cores) - configured
    mtype = m.machine_type or "0000"
    lines = [
        _field("Manufacturer", "IBM             "),
        _field("Type", mtype),
        _field("Model", f"{700 + configured:<3}              {_MODELS.get(mtype, 'A01'):<16}"),
        _field("Sequence Code", "00000000000A1B2C"),
        _field("Plant", "02  "),
        _field("Model Capacity", f"{700 + configured:<3}              00000571"),
        _field("Capacity Adj. Ind.", "100"),
        _field("Capacity Ch. Reason", "0"),
        _field("Capacity Transient", "0"),
        "",
    ]
    if m.topology_facility:
        mag = " ".join(str(x) for x in (0, 0, *_magnitudes(topology)))
        lines += [_field("CPU Topology HW", mag), _field("CPU Topology SW", mag)]
    d, b, s, k = _magnitudes(topology) if m.topology_facility else (1, 1, 1, len(cores))
    total = max(d, 1) * max(b, 1) * max(s, 1) * max(k, 1)
    lines += [
        _field("CPUs Total", str(total)),
        _field("CPUs Configured", str(configured)),
        _field("CPUs Standby", str(standby)),
        _field("CPUs Reserved", str(max(total - configured - standby, 0))),
        _field("CPUs G-MTID", str(mtid)),
        _field("CPUs S-MTID", str(mtid)),
        _field("Capability", "3296"),
        _field("Nominal Capability", "3296"),
        _field("Secondary Capability", "492"),
        "",
    ]
    guest = m.environment in ("zvm", "kvm")
    if m.environment in ("lpar", "zvm", "kvm"):
        lpar_cores = 2 * len(cores) if guest else len(cores)
        lines += [
            _field("LPAR Number", "21"),
            _field("LPAR Characteristics", "Shared "),
            _field("LPAR Name", f"{lpar_name:<8}"),
            _field("LPAR Adjustment", "250"),
            _field("LPAR CPUs Total", str(lpar_cores if guest else len(cores))),
            _field("LPAR CPUs Configured", str(lpar_cores if guest else configured)),
            _field("LPAR CPUs Standby", str(0 if guest else standby)),
            _field("LPAR CPUs Reserved", "0"),
            _field("LPAR CPUs Dedicated", "0"),
            _field("LPAR CPUs Shared", str(lpar_cores if guest else configured)),
            _field("LPAR CPUs G-MTID", str(mtid)),
            _field("LPAR CPUs S-MTID", str(mtid)),
            _field("LPAR CPUs PS-MTID", str(mtid)),
        ]
    if guest:
        program = "z/VM    7.3.0   " if m.environment == "zvm" else "KVM/Linux       "
        lines += [
            "",
            _field("VM00 Name", "SYNGUEST"),
            _field("VM00 Control Program", program),
            _field("VM00 CPUs Total", str(len(cores))),
            _field("VM00 CPUs Configured", str(configured)),
            _field("VM00 CPUs Standby", str(standby)),
            _field("VM00 CPUs Reserved", "0"),
        ]
    return "\n".join(lines) + "\n"


def cpuinfo_text(topology: Topology) -> str:
    """``/proc/cpuinfo`` as a 5.7+ kernel prints it: a summary, then one block per online CPU."""
    m = topology.machine
    mtype = m.machine_type or "0000"
    online = [c for c in topology.cpus if c.online]
    features = _FEATURES.get(m.generation or "", _FEATURES_BASE)
    lines = [
        "vendor_id       : IBM/S390",
        f"# processors    : {len(online)}",
        "bogomips per cpu: 3241.00",
        f"max thread id   : {m.smt_threads - 1}",
        f"features\t: {features} sie ",
    ]
    lines += [f"processor {c.cpu}: version = 00,  identification = 0A1B2C,  machine = {mtype}" for c in online]
    socket_cpus: dict[Hashable, list[Cpu]] = defaultdict(list)
    for c in online:
        socket_cpus[c.socket_key].append(c)
    for c in online:
        mates = socket_cpus[c.socket_key]
        lines += [
            "",
            f"cpu number      : {c.cpu}",
            f"physical id     : {_id_text(c.socket)}",
            f"core id         : {_id_text(c.core)}",
            f"book id         : {_id_text(c.book)}",
            f"drawer id       : {_id_text(c.drawer)}",
            f"dedicated       : {1 if c.dedicated else 0}",
            f"address         : {_id_text(c.address)}",
            f"siblings        : {len(mates)}",
            f"cpu cores       : {len({_core_key(x) for x in mates})}",
            "version         : 00",
            "identification  : 0A1B2C",
            f"machine         : {mtype}",
            "cpu MHz dynamic : 5200",
            "cpu MHz static  : 5200",
        ]
    return "\n".join(lines) + "\n"


def _check_model(topology: Topology) -> Machine:
    m = topology.machine
    if m.arch not in ("s390x", "unknown"):
        raise ValueError(f"write_sysfs_tree writes s390 trees; this model is {m.arch}")
    if not topology.cpus:
        raise ValueError("the model has no CPUs")
    return m


def write_sysfs_tree(
    topology: Topology,
    root: Path,
    *,
    kernel: str = "modern",
    possible: int | None = None,
    lpar_name: str = "SYNLP01",
) -> None:
    """Write ``topology`` under ``root`` as ``sys/devices/system/{cpu,node}`` + ``proc/{sysinfo,cpuinfo}``.

    ``root`` may exist but must not already hold those trees (stale CPU dirs would survive).
    ``possible`` is the number of possible CPUs (default: :func:`default_possible`).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, not {kernel!r}")
    _check_model(topology)
    nbits = default_possible(topology) if possible is None else possible
    if nbits <= max(c.cpu for c in topology.cpus):
        raise ValueError(f"possible={nbits} does not cover CPU {max(c.cpu for c in topology.cpus)}")
    root = Path(root)
    for rel in ("sys/devices/system/cpu", "sys/devices/system/node", "proc/sysinfo", "proc/cpuinfo"):
        if (root / rel).exists():
            raise FileExistsError(f"{root / rel} already exists; write into an empty directory")
    tree = _Tree(root)
    _write_cpus(tree, topology, kernel, nbits)
    _write_nodes(tree, topology, nbits)
    tree.write("proc/sysinfo", sysinfo_text(topology, lpar_name))
    tree.write("proc/cpuinfo", cpuinfo_text(topology))


def _resolve(source: str) -> Topology:
    from agent.topology import snapshot_format as snapshot
    from agent.topology.embedded import embedded_snapshot_names, load_embedded
    from topology_devkit.synthetic import SHAPES, build_topology

    if source in SHAPES:
        return build_topology(SHAPES[source])
    if Path(source).is_file():
        return snapshot.load(source)
    if source in embedded_snapshot_names():
        return load_embedded(source)
    raise SystemExit(f"{source!r} is neither a shape ({', '.join(SHAPES)}) nor a snapshot file")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topology_devkit.sysfs_writer",
                                     description="Write a synthetic s390 sysfs/procfs host-root tree.")
    parser.add_argument("source", help="a shape name (see python -m topology_devkit.synthetic) or a snapshot file")
    parser.add_argument("outdir", type=Path, help="host root to write sys/ and proc/ into")
    parser.add_argument("--kernel", choices=KERNELS, default="modern")
    parser.add_argument("--possible", type=int, default=None, help="number of possible CPUs")
    args = parser.parse_args(argv)
    topology = _resolve(args.source)
    try:
        write_sysfs_tree(topology, args.outdir, kernel=args.kernel, possible=args.possible)
    except (FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(topology.cpus)} CPUs under {args.outdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
