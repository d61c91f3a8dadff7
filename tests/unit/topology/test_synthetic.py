"""Synthetic z14-z17 shapes: the builder, the shipped snapshots, and the sysfs/procfs trees."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

import pytest

from agent.errors import TopologyReadError
from agent.topology import snapshot_format as snapshot
from agent.topology.cpulist import parse_cpulist, parse_cpumask
from agent.topology.embedded import embedded_snapshot_names, load_embedded
from agent.topology.model import Cpu, Topology
from topology_devkit.synthetic import (
    SHAPES,
    IdRule,
    LparShape,
    build_topology,
    data_dir,
    format_table,
    write_data,
)
from topology_devkit.sysfs_writer import default_possible, format_cpumask, kernel_view, write_sysfs_tree
from topology_devkit.sysfs_writer import main as writer_main

SHIPPED = (
    "z16-lpar", "z16-vertical", "pr40714", "z14-lpar", "z15-lpar", "z17-lpar", "z16-400",
    "z16-guest-no-topology",
)

# name -> (drawers, books, sockets, cores, cpus, smt)
EXPECTED_COUNTS: dict[str, tuple[int, int, int, int, int, int]] = {
    "z14-lpar": (2, 4, 12, 56, 112, 2),
    "z15-lpar": (2, 4, 7, 26, 52, 2),
    "z16-lpar": (2, 8, 16, 41, 82, 2),
    "z16-vertical": (1, 2, 4, 12, 24, 2),
    "z17-lpar": (1, 4, 8, 25, 50, 2),
    "pr40714": (1, 3, 5, 25, 50, 2),
    "z16-400": (4, 16, 32, 200, 400, 2),
    "z16-guest-no-topology": (8, 8, 8, 8, 8, 1),
}

LPAR_SHAPES = [n for n, s in SHAPES.items() if s.topology_facility]

_TOPOLOGIES: dict[str, Topology] = {}


def topo(name: str) -> Topology:
    if name not in _TOPOLOGIES:
        _TOPOLOGIES[name] = build_topology(SHAPES[name])
    return _TOPOLOGIES[name]


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Every shape written once per kernel flavour (the flavours differ only with offline CPUs)."""
    out: dict[tuple[str, str], Path] = {}
    for name in SHAPES:
        for kernel in ("modern", "pre-5.7"):
            if kernel != "modern" and all(c.online for c in topo(name).cpus):
                out[(name, kernel)] = out[(name, "modern")]
                continue
            root = tmp_path_factory.mktemp(f"{name}-{kernel}")
            write_sysfs_tree(topo(name), root, kernel=kernel)
            out[(name, kernel)] = root
    return out


def _read(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="ascii")


CPU = "sys/devices/system/cpu"


# ---------------------------------------------------------------------------------- the shapes


def test_every_named_shape_is_shipped_and_counted() -> None:
    assert set(SHAPES) == set(SHIPPED) == set(EXPECTED_COUNTS)


@pytest.mark.parametrize("name", list(SHAPES))
def test_counts(name: str) -> None:
    t = topo(name)
    drawers, books, sockets, cores, n_cpus, smt = EXPECTED_COUNTS[name]
    assert len({c.drawer for c in t.cpus}) == drawers
    assert len({c.book_key for c in t.cpus}) == books
    assert len({c.socket_key for c in t.cpus}) == sockets
    assert len({(c.drawer, c.book, c.socket, c.core) for c in t.cpus}) == cores
    assert len({c.core for c in t.cpus}) == cores, "core ids are machine-unique"
    assert [c.cpu for c in t.cpus] == list(range(n_cpus))
    assert t.machine.smt_threads == smt == SHAPES[name].smt
    assert t.machine.arch == "s390x"
    assert t.machine.memory_nodes == (0,)
    assert all(c.node == 0 for c in t.cpus)


@pytest.mark.parametrize("name", [n for n in LPAR_SHAPES])
def test_smt_siblings_adjacent_and_whole(name: str) -> None:
    t = topo(name)
    by_number = t.by_number()
    for c in t.cpus:
        first = c.cpu - c.cpu % 2
        assert c.siblings == (first, first + 1)
        for s in c.siblings:
            other = by_number[s]
            assert (other.drawer, other.book, other.socket, other.core) == (c.drawer, c.book, c.socket, c.core)
        assert c.core is not None and c.address == (c.core << 1 | (c.cpu - first))
        assert c.dedicated is False
    # numbering order: drawer > book > socket > core > thread
    walk = [(c.drawer, c.book, c.socket, c.core) for c in t.cpus]
    order = {key: i for i, key in enumerate(dict.fromkeys(walk))}
    assert [order[k] for k in walk] == sorted(order[k] for k in walk)


@pytest.mark.parametrize("name", LPAR_SHAPES)
def test_containers_are_contiguous_cpu_ranges(name: str) -> None:
    t = topo(name)
    for key in (lambda c: c.drawer, lambda c: c.book_key, lambda c: c.socket_key):
        groups: dict[object, list[int]] = defaultdict(list)
        for c in t.cpus:
            groups[key(c)].append(c.cpu)
        for cpus in groups.values():
            assert cpus == list(range(cpus[0], cpus[-1] + 1))


def test_socket_ids_reused_across_books() -> None:
    t = topo("z16-lpar")
    sockets_by_book: dict[tuple[int | None, int | None], set[int | None]] = defaultdict(set)
    for c in t.cpus:
        sockets_by_book[c.book_key].add(c.socket)
    assert len(sockets_by_book) == 8
    assert all(s == {0, 1} for s in sockets_by_book.values())
    assert ids(c.book for c in t.cpus) == list(range(8))  # books numbered across drawers


def test_hierarchical_and_offset_ids() -> None:
    z14 = topo("z14-lpar")
    assert sorted({c.book_key for c in z14.cpus}) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ids(c.socket for c in z14.cpus) == [0, 1, 2]
    z15 = topo("z15-lpar")
    assert ids(c.drawer for c in z15.cpus) == [1, 2]
    z17 = topo("z17-lpar")
    assert {c.drawer for c in z17.cpus} == {2}
    assert ids(c.book for c in z17.cpus) == [8, 9, 10, 11]
    # cores_per_chip leaves gaps in the physical core numbers, so address != CPU number
    z16 = topo("z16-lpar")
    assert z16.by_number()[6].core == 8  # the 4th core of the LPAR is the first of chip 1
    assert any(c.address != c.cpu for c in z16.cpus)


def test_pr40714_machine() -> None:
    t = topo("pr40714")
    assert [c.cpu for c in t.cpus] == list(range(50))
    books: dict[int | None, list[int]] = defaultdict(list)
    for c in t.cpus:
        books[c.book].append(c.cpu)
    assert [len(v) for _, v in sorted(books.items())] == [24, 24, 2]
    assert books[0] == list(range(24)) and books[1] == list(range(24, 48)) and books[2] == [48, 49]
    # vLLM's auto-bind keeps the last thread of each core: the odd CPUs of the PR log
    last_threads = sorted({c.siblings[-1] for c in t.cpus if c.book == 0})
    assert last_threads == list(range(1, 24, 2))
    assert all(c.address == c.cpu for c in t.cpus)


def test_z16_vertical_offline_and_standby() -> None:
    t = topo("z16-vertical")
    by_number = t.by_number()
    offline = by_number[5]
    assert (offline.online, offline.configured) == (False, True)
    assert offline.polarization == "vertical:medium"
    assert offline.core is not None and offline.socket is not None  # the model keeps its place
    for n in (14, 15):
        standby = by_number[n]
        assert (standby.online, standby.configured, standby.polarization) == (False, False, "unknown")
        assert standby.book is not None and standby.siblings == (14, 15)
    assert t.online_cpus == parse_cpulist("0-4,6-13,16-23")
    per_core = {c.core: c.polarization for c in t.cpus if c.configured}
    pols = sorted(per_core.values())
    assert pols.count("vertical:high") == 2
    assert pols.count("vertical:medium") == 3
    assert pols.count("vertical:low") == 6
    assert t.machine.dispatching == "vertical"


def test_z15_vertical_pattern_is_deterministic() -> None:
    t = topo("z15-lpar")
    first_cores = [c.polarization for c in t.cpus[::2]]
    assert first_cores[:3] == ["vertical:high"] * 3
    assert first_cores[3:7] == ["vertical:medium"] * 4
    assert set(first_cores[7:]) == {"vertical:low"}
    assert build_topology(SHAPES["z15-lpar"]) == t


def test_guest_without_topology_facility() -> None:
    t = topo("z16-guest-no-topology")
    m = t.machine
    assert (m.environment, m.topology_facility, m.smt_threads) == ("zvm", False, 1)
    for c in t.cpus:
        assert c.core == c.socket == c.book == c.drawer == c.cpu == c.address
        assert c.siblings == (c.cpu,)
        assert c.dedicated is None and c.polarization == "horizontal"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"smt": 3},
        {"dispatching": "diagonal"},
        {"drawers": ()},
        {"drawers": (((0,),),)},
        {"standby_cores": (0,)},
        {"standby_cores": (99,)},
        {"offline_cpus": (8,)},
        {"cores_per_chip": 1},
        {"topology_facility": False},  # smt=2 without the facility
    ],
)
def test_invalid_shapes_are_rejected(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {"name": "bad", "machine_type": "3931", "drawers": (((2, 2),),)}
    base.update(kwargs)
    with pytest.raises(ValueError, match="bad"):
        LparShape(**base)  # type: ignore[arg-type]


def test_id_rule() -> None:
    assert IdRule().ids(3, 5) == [0, 1, 2]
    assert IdRule(start=8, per_parent=False).ids(2, 2) == [10, 11]
    with pytest.raises(ValueError):
        IdRule(step=0)


def test_table_lists_every_shape() -> None:
    table = format_table(list(SHAPES.values()))
    for name in SHAPES:
        assert name in table


# ------------------------------------------------------------------- snapshots, shipped data


@pytest.mark.parametrize("name", list(SHAPES))
def test_snapshot_round_trip(name: str) -> None:
    t = topo(name)
    assert snapshot.loads(snapshot.dumps(t)) == t


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_json_matches_generator(name: str) -> None:
    shipped = (data_dir() / f"{name}.json").read_text(encoding="utf-8")
    assert shipped == snapshot.dumps(topo(name)), (
        f"agent/data/{name}.json is stale: run python -m topology_devkit.synthetic --write-data"
    )


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    written = write_data(tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{n}.json" for n in SHIPPED)
    for path in written:
        assert path.read_bytes() == (data_dir() / path.name).read_bytes()


def test_embedded_snapshots() -> None:
    assert embedded_snapshot_names() == sorted(SHIPPED)
    for name in SHIPPED:
        assert load_embedded(name) == topo(name)
    with pytest.raises(TopologyReadError, match="z16-lpar") as info:
        load_embedded("z99-lpar")
    assert "z99-lpar" in str(info.value)


# -------------------------------------------------------------------------- the written tree


@pytest.mark.parametrize(
    ("cpus", "nbits", "text"),
    [
        ([2, 3, 4, 5, 6, 7], 141, "0000,00000000,00000000,00000000,000000fc"),  # real z13 dump
        (range(141), 141, "1fff,ffffffff,ffffffff,ffffffff,ffffffff"),  # real z13 node0/cpumap
        ([1], 64, "00000000,00000002"),  # real z196 dump
        ([1], 2, "2"),  # real nested-virt dump
        ([], 32, "00000000"),
        ([32], 33, "1,00000000"),
    ],
)
def test_format_cpumask_matches_kernel(cpus: list[int], nbits: int, text: str) -> None:
    assert format_cpumask(cpus, nbits) == text
    assert parse_cpumask(text) == sorted(cpus)


def test_tree_files_and_formats(trees: dict[tuple[str, str], Path]) -> None:
    root = trees[("z16-vertical", "modern")]
    assert _read(root, f"{CPU}/online") == "0-4,6-13,16-23\n"
    assert _read(root, f"{CPU}/present") == "0-23\n"
    assert _read(root, f"{CPU}/possible") == "0-63\n"
    assert _read(root, f"{CPU}/offline") == "5,14-15,24-63\n"
    assert _read(root, f"{CPU}/kernel_max") == "511\n"
    assert _read(root, f"{CPU}/dispatching") == "1\n"
    for n in range(24):
        for f in ("online", "configure", "polarization", "address", "dedicated"):
            assert (root / CPU / f"cpu{n}" / f).is_file(), f"cpu{n}/{f}"
    assert _read(root, f"{CPU}/cpu0/online") == "1\n"
    # offline CPUs have no topology dir, and are left out of every mask (modern kernel)
    assert not (root / CPU / "cpu5/topology").exists()
    assert not (root / CPU / "cpu14/topology").exists()
    assert _read(root, f"{CPU}/cpu14/configure") == "0\n"
    assert _read(root, f"{CPU}/cpu14/polarization") == "unknown\n"
    assert _read(root, f"{CPU}/cpu5/polarization") == "vertical:medium\n"
    topo4 = root / CPU / "cpu4/topology"
    expected = {
        "core_id": "2", "physical_package_id": "0", "book_id": "0", "drawer_id": "0",
        "thread_siblings_list": "4", "thread_siblings": "00000000,00000010", "core_cpus_list": "4",
        "core_siblings_list": "0-4,6-7", "core_siblings": "00000000,000000df", "package_cpus_list": "0-4,6-7",
        "book_siblings_list": "0-4,6-13", "book_siblings": "00000000,00003fdf",
        "drawer_siblings_list": "0-4,6-13,16-23", "drawer_siblings": "00000000,00ff3fdf",
    }
    for f, value in expected.items():
        assert (topo4 / f).read_text() == value + "\n", f
    assert _read(root, f"{CPU}/cpu16/topology/book_siblings_list") == "16-23\n"
    assert _read(root, f"{CPU}/cpu16/topology/physical_package_id") == "0\n"  # socket ids restart
    assert _read(root, f"{CPU}/cpu8/address") == "16\n"  # core 8 = first core of chip 1
    node = root / "sys/devices/system/node"
    assert (node / "node0/cpulist").read_text() == "0-63\n"
    assert (node / "node0/cpumap").read_text() == "ffffffff,ffffffff\n"
    assert (node / "online").read_text() == "0\n" and (node / "has_memory").read_text() == "0\n"
    assert (root / CPU / "cpu3/node0").resolve() == (node / "node0").resolve()


def test_pre57_masks_keep_configured_offline_cpus(trees: dict[tuple[str, str], Path]) -> None:
    root = trees[("z16-vertical", "pre-5.7")]
    assert _read(root, f"{CPU}/cpu4/topology/thread_siblings_list") == "4-5\n"
    assert _read(root, f"{CPU}/cpu4/topology/drawer_siblings_list") == "0-13,16-23\n"
    assert not (root / CPU / "cpu5/topology").exists()


def test_z16_lpar_sibling_lists(trees: dict[tuple[str, str], Path]) -> None:
    root = trees[("z16-lpar", "modern")]
    lists = sorted(
        (root / CPU / f"cpu{c.cpu}/topology/book_siblings_list").read_text().strip() for c in topo("z16-lpar").cpus
    )
    assert sorted(set(lists), key=lambda x: int(x.split("-")[0])) == [
        "0-11", "12-21", "22-31", "32-43", "44-53", "54-61", "62-73", "74-81"
    ]
    assert _read(root, f"{CPU}/cpu0/topology/drawer_siblings_list") == "0-43\n"
    assert _read(root, f"{CPU}/cpu81/topology/drawer_siblings_list") == "44-81\n"
    assert _read(root, f"{CPU}/possible") == "0-127\n"
    assert _read(root, f"{CPU}/cpu0/topology/thread_siblings") == "00000000,00000000,00000000,00000003\n"


def test_procfs(trees: dict[tuple[str, str], Path]) -> None:
    root = trees[("z16-lpar", "modern")]
    sysinfo = _read(root, "proc/sysinfo")
    assert "Manufacturer:         IBM" in sysinfo
    assert "\nType:                 3931\n" in sysinfo
    assert "CPU Topology HW:      0 0 4 4 2 8\n" in sysinfo
    assert "CPU Topology SW:      0 0 4 4 2 8\n" in sysinfo
    assert "CPUs G-MTID:          1\n" in sysinfo and "CPUs S-MTID:          1\n" in sysinfo
    assert "LPAR Name:" in sysinfo and "LPAR CPUs Configured: 41\n" in sysinfo
    assert "VM00" not in sysinfo
    cpuinfo = _read(root, "proc/cpuinfo")
    assert cpuinfo.startswith("vendor_id       : IBM/S390\n")
    assert "max thread id   : 1\n" in cpuinfo
    assert cpuinfo.count("machine = 3931") == 82
    assert "# processors    : 82\n" in cpuinfo

    guest = trees[("z16-guest-no-topology", "modern")]
    sysinfo = _read(guest, "proc/sysinfo")
    assert "CPU Topology" not in sysinfo
    assert "VM00 Control Program: z/VM    7.3.0" in sysinfo
    assert "max thread id   : 0\n" in _read(guest, "proc/cpuinfo")
    assert not (guest / CPU / "cpu0/dedicated").exists()
    for n in range(8):
        t = guest / CPU / f"cpu{n}/topology"
        for f in ("core_id", "physical_package_id", "book_id", "drawer_id"):
            assert (t / f).read_text() == f"{n}\n"
        assert (t / "book_siblings_list").read_text() == f"{n}\n"


def test_writer_refuses_existing_tree(tmp_path: Path) -> None:
    write_sysfs_tree(topo("z16-vertical"), tmp_path)
    with pytest.raises(FileExistsError):
        write_sysfs_tree(topo("z16-vertical"), tmp_path)
    with pytest.raises(ValueError, match="possible"):
        write_sysfs_tree(topo("z16-vertical"), tmp_path / "x", possible=10)
    with pytest.raises(ValueError, match="kernel"):
        write_sysfs_tree(topo("z16-vertical"), tmp_path / "y", kernel="2.6")
    assert default_possible(topo("z16-400")) == 448


def test_writer_cli(tmp_path: Path) -> None:
    assert writer_main(["pr40714", str(tmp_path / "a")]) == 0
    assert _read(tmp_path / "a", f"{CPU}/present") == "0-49\n"
    snap = tmp_path / "snap.json"
    snapshot.dump(topo("z16-vertical"), snap)
    assert writer_main([str(snap), str(tmp_path / "b"), "--kernel", "pre-5.7"]) == 0
    assert _read(tmp_path / "b", f"{CPU}/online") == "0-4,6-13,16-23\n"
    assert writer_main(["pr40714", str(tmp_path / "a")]) == 1  # refuses to overwrite


# -------------------------------------------------------------- reading the tree back (sysfs.py)


def _diff(got: Topology, want: Topology) -> list[str]:
    problems = [f"machine.{f.name}: got {getattr(got.machine, f.name)!r}, want {getattr(want.machine, f.name)!r}"
                for f in fields(got.machine) if getattr(got.machine, f.name) != getattr(want.machine, f.name)]
    if [c.cpu for c in got.cpus] != [c.cpu for c in want.cpus]:
        problems.append(f"CPU numbers differ: {[c.cpu for c in got.cpus]} vs {[c.cpu for c in want.cpus]}")
        return problems
    for a, b in zip(got.cpus, want.cpus, strict=True):
        problems += [f"cpu{a.cpu}.{f.name}: got {getattr(a, f.name)!r}, want {getattr(b, f.name)!r}"
                     for f in fields(Cpu) if getattr(a, f.name) != getattr(b, f.name)]
    return problems[:20]


@pytest.mark.parametrize("kernel", ["modern", "pre-5.7"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_read_sysfs_round_trip(name: str, kernel: str, trees: dict[tuple[str, str], Path]) -> None:
    sysfs = pytest.importorskip("agent.topology.sysfs")
    got = sysfs.read_sysfs(trees[(name, kernel)])
    want = kernel_view(topo(name), kernel)
    assert _diff(got, want) == []
    assert got == want
    if all(c.online for c in topo(name).cpus):
        assert got == topo(name)  # nothing is lost when every CPU is online


def test_kernel_view_of_offline_cpus() -> None:
    view = kernel_view(topo("z16-vertical"))
    by_number = view.by_number()
    assert (by_number[5].core, by_number[5].book, by_number[5].siblings) == (None, None, ())
    assert by_number[4].siblings == (4,)
    assert by_number[14].node == 0 and by_number[14].address == 32
    pre = kernel_view(topo("z16-vertical"), "pre-5.7").by_number()
    assert (pre[5].core, pre[5].siblings) == (2, (4, 5))
    assert pre[14].book is None  # standby: in no mask
    assert kernel_view(topo("z16-lpar")) == topo("z16-lpar")


# ---------------------------------------------------------------------------- lscpu cross-check


def test_lscpu_sees_the_same_books_and_sockets(trees: dict[tuple[str, str], Path]) -> None:
    lscpu = shutil.which("lscpu") or ("/usr/bin/lscpu" if Path("/usr/bin/lscpu").exists() else None)
    if lscpu is None:
        pytest.skip("lscpu not installed")
    root = trees[("z16-lpar", "modern")]
    proc = subprocess.run([lscpu, "--sysroot", str(root), "-J", "-e=CPU,CORE,SOCKET,BOOK,DRAWER,ONLINE"],
                          capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        pytest.skip(f"lscpu --sysroot failed: {proc.stderr.strip()}")
    rows = json.loads(proc.stdout)["cpus"]
    t = topo("z16-lpar")
    assert len(rows) == len(t.cpus)
    assert len({str(r["book"]) for r in rows}) == len({c.book_key for c in t.cpus})
    assert len({str(r["socket"]) for r in rows}) == len({c.socket_key for c in t.cpus})
    assert len({str(r["drawer"]) for r in rows}) == len({c.drawer for c in t.cpus})
    assert len({str(r["core"]) for r in rows}) == len({c.core for c in t.cpus})


def ids(values: Iterable[int | None]) -> list[int]:
    """Distinct ids, sorted; synthetic shapes always have them."""
    found = set(values)
    assert None not in found
    return sorted(v for v in found if v is not None)
