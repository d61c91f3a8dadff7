"""The lscpu JSON reader (agent/topology/lscpu.py) and canonical_shape (agent/topology/shape.py).

Real dumps: each dump's ``lscpu-e.json`` (util-linux 2.38.1, invalid JSON on purpose) and
``lscpu-vllm-cmd.json`` are checked against the plain-text table ``lscpu-e.txt`` of the same
run, parsed here independently. The other two JSON dialects (<= 2.37 all strings, >= 2.41
whole columns turned into strings) are rendered here from the same table, following the
column types of util-linux's ``sys-utils/lscpu.c``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import TopologyReadError
from agent.topology.lscpu import (
    LSCPU_COLUMNS,
    lscpu_command,
    parse_lscpu_json,
    read_lscpu,
    repair_lscpu_json,
)
from agent.topology.model import POLARIZATIONS, Cpu, Machine, Topology
from tests.support.env import REAL_DUMPS, real_dump, real_fixtures
from topology_devkit.shape import canonical_shape

Row = dict[str, Any]

# Column JSON types in util-linux 2.38+: NUMBER columns become bare numbers; DRAWER has
# SCOLS_JSON_NUMBER in the wrong slot so it stays a string; POLARIZATION and ADDRESS are
# untyped (strings); CONFIGURED and ONLINE are booleans.
NUMBER_COLUMNS = frozenset({"CPU", "CORE", "SOCKET", "NODE", "BOOK"})
BOOL_COLUMNS = frozenset({"CONFIGURED", "ONLINE"})
INT_COLUMNS = frozenset({"CPU", "CORE", "SOCKET", "BOOK", "DRAWER", "NODE", "ADDRESS"})
DIALECTS = ("2.37", "2.38", "2.41")
VLLM_COLUMNS = ("CPU", "CORE", "NODE", "SOCKET", "BOOK")
LEVELS = ("CORE", "SOCKET", "BOOK", "DRAWER")

MODEL_TO_LSCPU_POLARIZATION = {
    "horizontal": "horizontal",
    "vertical:high": "vert-high",
    "vertical:medium": "vert-medium",
    "vertical:low": "vert-low",
    "unknown": None,
}
LSCPU_TO_MODEL_POLARIZATION = {v: k for k, v in MODEL_TO_LSCPU_POLARIZATION.items()}


# --- the plain-text table and the three dialects -------------------------------------------


def parse_table(text: str) -> tuple[tuple[str, ...], list[Row]]:
    """``lscpu -e`` plain text: header of column names, rows of cells (``-`` = None)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = tuple(lines[0].split())
    rows: list[Row] = []
    for line in lines[1:]:
        cells = line.split()
        assert len(cells) == len(header), line
        row: Row = {}
        for column, cell in zip(header, cells, strict=True):
            if cell == "-":
                row[column] = None
            elif column in INT_COLUMNS:
                row[column] = int(cell)
            elif column in BOOL_COLUMNS:
                assert cell in ("yes", "no"), cell
                row[column] = cell == "yes"
            else:
                row[column] = cell
        rows.append(row)
    return header, rows


def _cell(column: str, value: Any, dialect: str, stringly: bool) -> str:
    if column in BOOL_COLUMNS:
        if dialect == "2.37":
            return '"yes"' if value else '"no"'
        return "true" if value else "false"
    text = "-" if value is None else str(value)
    if column in NUMBER_COLUMNS and dialect != "2.37" and not stringly:
        return text  # 2.38-2.40: a bare "-" when missing
    return json.dumps(text)


def render(rows: list[Row], columns: tuple[str, ...], dialect: str) -> str:
    """``lscpu -J -e=<columns>`` output as util-linux ``dialect`` prints it."""
    stringly = {column: dialect == "2.41" and any(row[column] is None for row in rows) for column in columns}
    entries = []
    for row in rows:
        cells = [
            f'         "{column.lower()}": {_cell(column, row[column], dialect, stringly[column])}'
            for column in columns
        ]
        entries.append("\n" + ",\n".join(cells) + "\n      ")
    return '{\n   "cpus": [\n      {' + "},{".join(entries) + "}\n   ]\n}\n"


def expected_cpus(rows: list[Row]) -> tuple[Cpu, ...]:
    """The Cpus a table describes (missing columns take the model's defaults)."""
    cores: dict[int, list[int]] = {}
    for row in rows:
        if row.get("CORE") is not None:
            cores.setdefault(row["CORE"], []).append(row["CPU"])
    cpus = []
    for row in rows:
        core = row.get("CORE")
        cpus.append(
            Cpu(
                cpu=row["CPU"],
                core=core,
                socket=row.get("SOCKET"),
                book=row.get("BOOK"),
                drawer=row.get("DRAWER"),
                siblings=tuple(sorted(cores[core])) if core is not None else (),
                node=row.get("NODE"),
                online=row.get("ONLINE", True),
                configured=row.get("CONFIGURED", True),
                polarization=LSCPU_TO_MODEL_POLARIZATION[row.get("POLARIZATION")],
                dedicated=None,
                address=row.get("ADDRESS"),
            )
        )
    return tuple(cpus)


def table_groups(rows: list[Row], level: str) -> list[list[int]]:
    """CPUs grouped by a level's logical index, as the table shows it (flat, not hierarchical)."""
    groups: dict[int, list[int]] = {}
    for row in rows:
        if row.get(level) is not None:
            groups.setdefault(row[level], []).append(row["CPU"])
    return sorted(sorted(g) for g in groups.values())


def load_table(name: str) -> tuple[Path, list[Row]]:
    dump_dir, _ = real_dump(name)
    header, rows = parse_table((dump_dir / "lscpu-e.txt").read_text())
    assert header == LSCPU_COLUMNS
    return dump_dir, rows


# --- real dumps -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_real_lscpu_e_json_matches_text_table(name: str) -> None:
    dump_dir, rows = load_table(name)
    path = dump_dir / "lscpu-e.json"
    topo = parse_lscpu_json(path.read_text(), source=str(path))

    assert topo.cpus == expected_cpus(rows)
    shape = canonical_shape(topo)
    for level, key in zip(LEVELS, ("cores", "sockets", "books", "drawers"), strict=True):
        assert shape[key] == table_groups(rows, level), level
    nodes = sorted({r["NODE"] for r in rows if r["NODE"] is not None})
    assert topo.machine.memory_nodes == (tuple(nodes) or (0,))
    assert topo.machine.has_node_dirs == bool(nodes)
    assert topo.machine.arch == "s390x"
    assert topo.machine.environment == "unknown"
    assert topo.machine.topology_facility is None


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_real_vllm_cmd_json_matches_text_table(name: str) -> None:
    dump_dir, rows = load_table(name)
    path = dump_dir / "lscpu-vllm-cmd.json"
    topo = parse_lscpu_json(path.read_text(), source=str(path))
    subset = [{c: r[c] for c in VLLM_COLUMNS} for r in rows]
    assert topo.cpus == expected_cpus(subset)
    for cpu, row in zip(topo.cpus, rows, strict=True):
        assert (cpu.cpu, cpu.core, cpu.socket, cpu.book, cpu.node) == (
            row["CPU"],
            row["CORE"],
            row["SOCKET"],
            row["BOOK"],
            row["NODE"],
        )
        assert (cpu.drawer, cpu.polarization, cpu.address, cpu.online, cpu.configured) == (
            None,
            "unknown",
            None,
            True,
            True,
        )


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_rendered_238_dialect_is_byte_identical_to_real_output(name: str) -> None:
    """The renderer used for the other dialects models real lscpu 2.38.1 output exactly."""
    dump_dir, rows = load_table(name)
    assert render(rows, LSCPU_COLUMNS, "2.38") == (dump_dir / "lscpu-e.json").read_text()
    assert render(rows, VLLM_COLUMNS, "2.38") == (dump_dir / "lscpu-vllm-cmd.json").read_text()


@pytest.mark.parametrize("name", sorted(REAL_DUMPS))
def test_all_three_dialects_give_the_same_topology(name: str) -> None:
    dump_dir, rows = load_table(name)
    reference = parse_lscpu_json((dump_dir / "lscpu-e.json").read_text())
    texts = {dialect: render(rows, LSCPU_COLUMNS, dialect) for dialect in DIALECTS}
    for dialect in ("2.37", "2.41"):
        json.loads(texts[dialect])  # these two dialects are valid JSON as they stand
        assert parse_lscpu_json(texts[dialect], source=dialect) == reference, dialect
    for columns in (VLLM_COLUMNS, tuple(reversed(LSCPU_COLUMNS))):
        topos = [parse_lscpu_json(render(rows, columns, d)) for d in DIALECTS]
        assert topos[0] == topos[1] == topos[2]


def test_241_dialect_really_stringifies_columns_with_a_dash() -> None:
    rows = [
        {"CPU": 0, "CORE": 0, "NODE": None, "DRAWER": 0, "ONLINE": True},
        {"CPU": 1, "CORE": None, "NODE": None, "DRAWER": 0, "ONLINE": False},
    ]
    columns = ("CPU", "CORE", "NODE", "DRAWER", "ONLINE")
    decoded = json.loads(render(rows, columns, "2.41"))["cpus"]
    assert decoded[0] == {"cpu": 0, "core": "0", "node": "-", "drawer": "0", "online": True}
    assert decoded[1] == {"cpu": 1, "core": "-", "node": "-", "drawer": "0", "online": False}
    bare = render(rows, columns, "2.38")
    assert '"core": -,' in bare
    with pytest.raises(json.JSONDecodeError):
        json.loads(bare)


def test_known_groups_of_real_dumps() -> None:
    """Hand-written from ../shared/docs/s390x-topology.md §A.3/§A.4 (not derived from the table)."""

    def shape(name: str) -> dict[str, Any]:
        dump_dir, _ = real_dump(name)
        return canonical_shape(parse_lscpu_json((dump_dir / "lscpu-e.json").read_text()))

    drawer = shape("s390-lpar-drawer")
    assert drawer["sockets"] == [[0, 1], [2, 3, 4, 5, 6, 7]]
    assert drawer["books"] == drawer["drawers"] == [list(range(8))]

    lpar = shape("s390-lpar")
    assert lpar["books"] == [[0, 1, 2, 3, 4, 5], list(range(8, 20))]  # cpu6/7 standby: no book
    assert lpar["drawers"] == []
    assert [c["cpu"] for c in lpar["cpus"] if not c["configured"]] == [6, 7]
    assert [c["cpu"] for c in lpar["cpus"] if not c["online"]] == [0, 6, 7]
    assert all(0 not in core for core in lpar["cores"])  # offline cpu0 has CORE "-"
    assert {c["polarization"] for c in lpar["cpus"]} == {"vertical:medium", "vertical:low", "unknown"}

    hwloc = shape("hwloc-20s390-2g6s4c")
    assert hwloc["books"] == [[0, 1, 2, 10, 11, 12], [3, 4, 5, 6, 7, 8, 9], [13, 14, 15], [16, 17, 18, 19]]

    assert shape("s390-kvm")["books"] == [[0], [1], [2]]
    bare = shape("hwloc-2s390-2c")
    assert bare["cores"] == bare["sockets"] == bare["books"] == bare["drawers"] == []


def test_real_machine_facts() -> None:
    dump_dir, _ = real_dump("s390-lpar")
    lpar = parse_lscpu_json((dump_dir / "lscpu-e.json").read_text()).machine
    assert (lpar.dispatching, lpar.smt_threads, lpar.memory_nodes, lpar.has_node_dirs) == ("vertical", 1, (0,), False)
    dump_dir, _ = real_dump("s390-lpar-drawer")
    drawer = parse_lscpu_json((dump_dir / "lscpu-e.json").read_text()).machine
    assert (drawer.dispatching, drawer.memory_nodes, drawer.has_node_dirs) == ("horizontal", (0,), True)


def test_vllm_pr_snippet_string_dialect() -> None:
    path = real_fixtures() / "vllm-pr-snippets" / "pr39781-wjhrdy-lscpu-J-e-CPU,CORE,NODE,BOOK.json"
    topo = parse_lscpu_json(path.read_text(), source=path.name)
    assert [c.cpu for c in topo.cpus] == [0, 2, 4, 6]
    assert [c.core for c in topo.cpus] == [0, 2, 4, 6]
    assert [c.book for c in topo.cpus] == [0, 0, 1, 1]
    assert canonical_shape(topo)["books"] == [[0, 2], [4, 6]]
    assert topo.machine.memory_nodes == (0,) and topo.machine.has_node_dirs
    assert topo.machine.arch == "s390x"


def test_truncated_real_snippet_is_a_clean_error() -> None:
    path = real_fixtures() / "vllm-pr-snippets" / "pr39781-R3hankhan123-lscpu-J.partial.txt"
    with pytest.raises(TopologyReadError, match=r"R3hankhan123.*not valid lscpu JSON"):
        parse_lscpu_json(path.read_text(), source=path.name)


# --- lenient cells --------------------------------------------------------------------------


def test_lenient_cell_spellings() -> None:
    text = json.dumps(
        {
            "cpus": [
                {
                    "cpu": "0",
                    "core": " 3 ",
                    "polarization": "vertical:high",
                    "address": 17,
                    "configured": "YES",
                    "online": None,
                    "node": "",
                },
                {"cpu": 1, "core": 3, "polarization": "VL", "address": "-", "configured": False, "online": "no"},
                {"cpu": 2, "polarization": "-", "online": "-", "maxmhz": 5200.0, "l1d:l1i:l2": "0:0:0"},
            ]
        }
    )
    a, b, c = parse_lscpu_json(text).cpus
    assert (a.core, a.polarization, a.address, a.configured, a.online, a.node) == (
        3,
        "vertical:high",
        17,
        True,
        True,
        None,
    )
    assert a.siblings == b.siblings == (0, 1)
    assert (b.polarization, b.address, b.configured, b.online) == ("vertical:low", None, False, False)
    assert (c.core, c.siblings, c.polarization, c.online, c.dedicated) == (None, (), "unknown", True, None)


def test_machine_facts_from_the_table_alone() -> None:
    x86ish = parse_lscpu_json('{"cpus": [{"cpu": 1, "core": 0, "node": 1}, {"cpu": 0, "core": 0, "node": 0}]}')
    assert [c.cpu for c in x86ish.cpus] == [0, 1]
    assert x86ish.machine == Machine(
        arch="unknown",
        environment="unknown",
        topology_facility=None,
        dispatching="unknown",
        smt_threads=2,
        memory_nodes=(0, 1),
        has_node_dirs=True,
    )
    horizontal = parse_lscpu_json('{"cpus": [{"cpu": 0, "polarization": "horizontal"}]}').machine
    assert (horizontal.arch, horizontal.dispatching, horizontal.smt_threads) == ("s390x", "horizontal", 1)


# --- the bare-dash repair ---------------------------------------------------------------------


def test_repair_touches_only_bare_dash_values() -> None:
    text = '{"a": -, "b-c": "x - y", "d": "\\"-", "e": "-", "f": -1, "g": -0.5e-3, "h": [-, 1, - ], "i": -\n}'
    assert repair_lscpu_json(text) == (
        '{"a": null, "b-c": "x - y", "d": "\\"-", "e": "-", "f": -1, "g": -0.5e-3, "h": [null, 1, null ], "i": null\n}'
    )
    # inside strings nothing is a value position, whatever precedes or follows the dash
    inside = '{"j": "x: - ,y", "k": "[-]", "l": "\\\\", "m": -, "n": "{\\"o\\": -}"}'
    assert repair_lscpu_json(inside) == inside.replace('"m": -,', '"m": null,')
    assert json.loads(repair_lscpu_json(inside))["n"] == '{"o": -}'
    # in key position (after "," or "{" inside an object) a dash is left for json to reject
    for bad in ('{"a": 1, -}', "{-}", '{"a": [1, {-: 2}]}', '{"a" -}'):
        assert repair_lscpu_json(bad) == bad


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('-":,[]{} \\ab\n0'), max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(alphabet=st.sampled_from('-":,ab '), max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(json_values, st.booleans())
def test_repair_leaves_valid_json_alone(value: Any, indent: bool) -> None:
    text = json.dumps(value, indent=3 if indent else None)
    assert repair_lscpu_json(text) == text


# --- malformed input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", r"^src: empty lscpu output$"),
        ("  \n", r"^src: empty lscpu output$"),
        ("CPU CORE\n0 0\n", r"^src: not valid lscpu JSON: .* line 1 column 1"),
        ("[1, 2]", r"^src: lscpu JSON must be an object .* got list$"),
        ('{"lscpu": []}', r'^src: no "cpus" list in lscpu JSON \(this is `lscpu -J` summary output'),
        ('{"cpu": []}', r'^src: no "cpus" list in lscpu JSON$'),
        ('{"cpus": {}}', r'^src: "cpus" must be a list, got dict$'),
        ('{"cpus": []}', r'^src: "cpus" is empty'),
        ('{"cpus": [{"cpu": 0}, 7]}', r"^src: cpus\[1\] must be an object, got int$"),
        ('{"cpus": [{"cpu": 0}, {"core": 1}]}', r'^src: cpus\[1\] has no "cpu" number$'),
        ('{"cpus": [{"cpu": -}]}', r"^src: cpus\[0\]: bad 'cpu' value None \(expected a CPU number\)$"),
        ('{"cpus": [{"cpu": "x1"}]}', r"^src: cpus\[0\]: bad 'cpu' value 'x1'"),
        ('{"cpus": [{"cpu": 0, "core": "zero"}]}', r"^src: cpus\[0\] \(cpu 0\): bad 'core' value 'zero'"),
        ('{"cpus": [{"cpu": 0}, {"cpu": 1, "socket": 1.5}]}', r"^src: cpus\[1\] \(cpu 1\): bad 'socket' value 1.5"),
        ('{"cpus": [{"cpu": 0, "book": true}]}', r"^src: cpus\[0\] \(cpu 0\): bad 'book' value True"),
        ('{"cpus": [{"cpu": 0, "core": -1}]}', r"^src: cpus\[0\] \(cpu 0\): bad 'core' value -1 "),
        ('{"cpus": [{"cpu": 0, "node": "-1"}]}', r"^src: cpus\[0\] \(cpu 0\): bad 'node' value '-1'"),
        ('{"cpus": [{"cpu": 0, "online": "maybe"}]}', r"^src: cpus\[0\] \(cpu 0\): bad 'online' value 'maybe'"),
        (
            '{"cpus": [{"cpu": 0, "polarization": "diagonal"}]}',
            r"^src: cpus\[0\] \(cpu 0\): bad 'polarization' value 'diagonal' \(expected horizontal, vert-high",
        ),
        ('{"cpus": [{"cpu": 0, "polarization": 1}]}', r"^src: cpus\[0\] \(cpu 0\): bad 'polarization' value 1"),
        ('{"cpus": [{"cpu": 3}, {"cpu": "3"}]}', r"^src: cpus\[1\]: cpu 3 already listed at cpus\[0\]$"),
        # a bare "-" where no value is expected is not repaired: the JSON stays invalid
        ('{"cpus" - [{"cpu": 0}]}', r"^src: not valid lscpu JSON: Expecting ':' delimiter .*near '.*-"),
        ('{"cpus": [{"cpu": 0, -: 1}]}', r"^src: not valid lscpu JSON: Expecting property name .*near '.*-"),
        ('{"cpus": [{"cpu": 0, -}]}', r"^src: not valid lscpu JSON: Expecting property name .*near '.*0, -}"),
        ('{"cpus": [{"cpu": 0, "core": -x}]}', r"^src: not valid lscpu JSON: .*near '.*-x"),
        ('{"cpus": [{"cpu": 0, "core": 1 -}]}', r"^src: not valid lscpu JSON: .*near '.*1 -"),
        ('{"cpus": [{"cpu": 0, "core": --}]}', r"^src: not valid lscpu JSON: .*near '.*--"),
        ('{"cpus": [{"cpu": 0, "core": "1}]}', r"^src: not valid lscpu JSON: Unterminated string"),
    ],
)
def test_malformed_input_is_one_clear_line(text: str, expected: str) -> None:
    with pytest.raises(TopologyReadError, match=expected) as info:
        parse_lscpu_json(text, source="src")
    assert "\n" not in str(info.value)
    # no chained traceback (a json or KeyError behind it) when printed
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_default_source_name() -> None:
    with pytest.raises(TopologyReadError, match=r"^<lscpu>: empty"):
        parse_lscpu_json("")


# --- property: random topologies in every dialect -------------------------------------------


@st.composite
def machines(draw: st.DrawFn) -> tuple[Topology, list[Row]]:
    """A model with arbitrary (hierarchical, non-logical) ids, and the lscpu table for it."""
    small = st.none() | st.integers(0, 2)
    n_cores = draw(st.integers(1, 10))
    threads = draw(st.integers(1, 2))
    paths = [(draw(small), draw(small), draw(small), draw(st.integers(0, 30))) for _ in range(n_cores)]
    count = n_cores * threads
    numbers = draw(st.permutations(sorted(draw(st.sets(st.integers(0, 300), min_size=count, max_size=count)))))
    cpus = []
    for i, number in enumerate(numbers):
        drawer: int | None
        book: int | None
        socket: int | None
        core: int | None
        drawer, book, socket, core = paths[i // threads]
        kind = draw(st.sampled_from(["full", "full", "full", "no-core", "bare"]))
        if kind != "full":
            core = None
        if kind == "bare":
            drawer = book = socket = None
        cpus.append(
            Cpu(
                cpu=number,
                core=core,
                socket=socket,
                book=book,
                drawer=drawer,
                node=draw(st.none() | st.integers(0, 3)),
                online=draw(st.booleans()),
                configured=draw(st.booleans()),
                polarization=draw(st.sampled_from(POLARIZATIONS)),
                address=draw(st.none() | st.integers(0, 400)),
            )
        )
    topo = Topology(machine=Machine(), cpus=tuple(cpus))

    # lscpu numbers each level's distinct containers in order of first appearance.
    index: dict[str, dict[tuple[int | None, ...], int]] = {level: {} for level in LEVELS}
    rows: list[Row] = []
    for c in topo.cpus:
        keys = {"DRAWER": (c.drawer,), "BOOK": c.book_key, "SOCKET": c.socket_key, "CORE": (*c.socket_key, c.core)}
        own = {"DRAWER": c.drawer, "BOOK": c.book, "SOCKET": c.socket, "CORE": c.core}
        row: Row = {
            "CPU": c.cpu,
            "NODE": c.node,
            "ADDRESS": c.address,
            "CONFIGURED": c.configured,
            "ONLINE": c.online,
            "POLARIZATION": MODEL_TO_LSCPU_POLARIZATION[c.polarization],
        }
        for level in LEVELS:
            row[level] = None if own[level] is None else index[level].setdefault(keys[level], len(index[level]))
        rows.append(row)
    return topo, rows


@settings(max_examples=150, deadline=None)
@given(machines(), st.permutations(LSCPU_COLUMNS), st.randoms(use_true_random=False))
def test_random_topology_round_trips_through_every_dialect(
    machine: tuple[Topology, list[Row]], columns: list[str], rnd: Any
) -> None:
    model, rows = machine
    shuffled = list(rows)
    rnd.shuffle(shuffled)  # entry order does not matter
    expected = canonical_shape(model)
    parsed = [parse_lscpu_json(render(shuffled, tuple(columns), d), source=d) for d in DIALECTS]
    assert parsed[0] == parsed[1] == parsed[2]
    topo = parsed[0]
    assert canonical_shape(topo) == expected
    assert [c.address for c in topo.cpus] == [c.address for c in model.cpus]
    cores = {cpu: group for group in expected["cores"] for cpu in group}
    assert all(list(c.siblings) == cores.get(c.cpu, []) for c in topo.cpus)
    assert topo.machine.smt_threads == max((len(g) for g in expected["cores"]), default=1)
    nodes = sorted({c.node for c in model.cpus if c.node is not None})
    assert topo.machine.memory_nodes == (tuple(nodes) or (0,))


def test_canonical_shape_ignores_ids_but_not_grouping() -> None:
    a = Topology(Machine(), (Cpu(0, core=5, socket=2, book=1), Cpu(1, core=6, socket=3, book=1)))
    b = Topology(Machine(), (Cpu(0, core=0, socket=0, book=0), Cpu(1, core=1, socket=1, book=0)))
    c = Topology(Machine(), (Cpu(0, core=0, socket=0, book=0), Cpu(1, core=1, socket=0, book=0)))
    assert canonical_shape(a) == canonical_shape(b)
    assert canonical_shape(a) != canonical_shape(c)
    # socket ids are only unique within their book
    d = Topology(Machine(), (Cpu(0, socket=0, book=0), Cpu(1, socket=0, book=1)))
    assert canonical_shape(d)["sockets"] == [[0], [1]]
    assert canonical_shape(d)["cores"] == [] and canonical_shape(d)["drawers"] == []


# --- read_lscpu -------------------------------------------------------------------------------


def test_read_lscpu_missing_binary() -> None:
    with pytest.raises(TopologyReadError, match=r"^/nonexistent/lscpu-xyz -J -e=CPU,CORE.*lscpu not found"):
        read_lscpu(lscpu="/nonexistent/lscpu-xyz")
    with pytest.raises(TopologyReadError, match=r"no-such-lscpu-binary-here.*--sysroot /x.*not found"):
        read_lscpu(sysroot="/x", lscpu="no-such-lscpu-binary-here")


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-lscpu"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_read_lscpu_nonzero_exit(tmp_path: Path) -> None:
    fake = _script(tmp_path, "echo 'lscpu: cannot open sysroot' >&2\nexit 3\n")
    with pytest.raises(
        TopologyReadError,
        match=r"fake-lscpu -J .*--sysroot /r: failed with exit status 3: "
        r"lscpu: cannot open sysroot$",
    ):
        read_lscpu(sysroot="/r", lscpu=fake)


def test_read_lscpu_passes_arguments_and_parses_output(tmp_path: Path) -> None:
    args = tmp_path / "args"
    output = tmp_path / "out.json"
    output.write_text('{"cpus": [{"cpu": 0, "core": -, "online": "yes"}]}')
    fake = _script(tmp_path, f'printf "%s\\n" "$@" > {args}\necho "LC_ALL=$LC_ALL" >> {args}\ncat {output}\n')
    topo = read_lscpu(sysroot="/some root", lscpu=fake)
    assert [c.cpu for c in topo.cpus] == [0] and topo.cpus[0].core is None
    assert args.read_text().splitlines() == [*lscpu_command("/some root", "x")[1:], "LC_ALL=C"]
    with pytest.raises(TopologyReadError, match=r"fake-lscpu -J .*: not valid lscpu JSON"):
        output.write_text("garbage")
        read_lscpu(lscpu=fake)


def test_read_lscpu_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def timeout(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert kwargs["timeout"] == 2.5
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(subprocess, "run", timeout)
    with pytest.raises(TopologyReadError, match=r"^lscpu -J -e=.*: timed out after 2.5s$"):
        read_lscpu(timeout=2.5)


def test_read_lscpu_on_real_dump() -> None:
    if shutil.which("lscpu") is None:
        pytest.skip("lscpu is not installed")
    dump_dir, root = real_dump("s390-lpar-drawer")
    topo = read_lscpu(sysroot=str(root))
    assert len(topo.cpus) == 8
    assert canonical_shape(topo)["sockets"] == [[0, 1], [2, 3, 4, 5, 6, 7]]
    stored = parse_lscpu_json((dump_dir / "lscpu-e.json").read_text())
    assert canonical_shape(topo) == canonical_shape(stored)
