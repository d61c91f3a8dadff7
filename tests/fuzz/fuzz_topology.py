"""Door: the node's topology as the agent reads it. sysfs trees (a real tree written from a snapshot, then files
rewritten with garbage, emptied, deleted or made directories), lscpu JSON in each util-linux dialect (mutated and cut
short), snapshot files. Right answer: the unchanged input reads back as the model it was written from. Refusal:
TopologyReadError or CpuListError (a UserError), one line. Whatever reads: grouping it gives groups or a PolicyError.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from agent.errors import PolicyError, UserError
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology import snapshot_format
from agent.topology.embedded import load_embedded
from agent.topology.lscpu import parse_lscpu_json
from agent.topology.model import Topology
from agent.topology.sysfs import read_sysfs
from tests.fuzz.common import door, refused
from tests.fuzz.mutate import json_values, mangled_text, mutated_json
from topology_devkit.shape import canonical_shape
from topology_devkit.sysfs_writer import kernel_view, write_sysfs_tree

SMALL = ("z16-guest-no-topology", "z14-lpar", "z16-vertical")  # the sysfs door writes trees: small machines
SNAPSHOTS = ("z16-lpar", "z16-guest-no-topology", "z14-lpar", "z16-vertical", "pr40714")


def groups_or_refusal(topology: Topology) -> None:
    """What reads must also group: groups, or a PolicyError; for each level the agent knows."""
    for levels in (None, ("socket",), ("book", "socket")):
        settings = GroupingSettings(levels=levels)
        refused(partial(group_topology, topology, settings), PolicyError)


# --- snapshot files -------------------------------------------------------------------------------------------

@door("snapshot-file", "topology", st.sampled_from(SNAPSHOTS), st.data())
def snapshot_file(name: str, data: st.DataObject) -> None:
    topology = load_embedded(name)
    doc = json.loads(snapshot_format.dumps(topology))
    mutated = data.draw(mutated_json(doc))
    text = data.draw(mangled_text(json.dumps(mutated)))
    answer = refused(lambda: snapshot_format.loads(text, "fuzz.json"), UserError)
    if text == json.dumps(doc):
        assert answer == topology
    if isinstance(answer, Topology):
        assert snapshot_format.loads(snapshot_format.dumps(answer)) == answer  # what reads, writes back the same
        groups_or_refusal(answer)


# --- lscpu JSON -----------------------------------------------------------------------------------------------

COLUMNS = ("cpu", "core", "socket", "book", "drawer", "node", "polarization", "address", "configured", "online")
POLARIZATION = {"horizontal": "horizontal", "vertical:high": "vert-high", "vertical:medium": "vert-medium",
                "vertical:low": "vert-low", "unknown": None}


def lscpu_rows(topology: Topology) -> list[dict[str, Any]]:
    rows = []
    for c in topology.cpus:
        rows.append({"cpu": c.cpu, "core": c.core, "socket": c.socket, "book": c.book, "drawer": c.drawer,
                     "node": c.node, "polarization": POLARIZATION[c.polarization], "address": c.address,
                     "configured": c.configured, "online": c.online})
    return rows


def lscpu_text(rows: list[dict[str, Any]], dialect: str) -> str:
    """util-linux's three dialects: 2.38 (numbers, a bare ``-`` for none: not JSON), <= 2.37 (every cell a string),
    >= 2.41 (a column with any ``-`` all strings)."""
    def cell(value: Any, column: str) -> str:
        if value is None:
            return '"-"' if dialect != "2.38" else "-"
        if isinstance(value, bool):
            return json.dumps("yes" if value else "no") if dialect == "2.37" else json.dumps(value)
        if dialect == "2.37" or (dialect == "2.41" and column in stringly):
            return json.dumps(str(value))
        return json.dumps(value)

    def row(r: Any) -> str:  # a row mutated into something else is written as it is
        if not isinstance(r, dict):
            return json.dumps(r)
        return "{" + ",".join(f"{json.dumps(k)}: {cell(v, k)}" for k, v in r.items()) + "}"

    stringly = {col for col in COLUMNS if any(isinstance(r, dict) and r.get(col) is None for r in rows)}
    body = ",".join(row(r) for r in rows)
    return '{"cpus": [' + body + "]}"


@door("lscpu-json", "topology", st.sampled_from(SNAPSHOTS), st.sampled_from(["2.37", "2.38", "2.41"]), st.data())
def lscpu_json(name: str, dialect: str, data: st.DataObject) -> None:
    topology = load_embedded(name)
    rows = lscpu_rows(topology)
    if data.draw(st.booleans()):  # a row mutated as JSON: a cell of another type, a column gone, a row twice
        index = data.draw(st.integers(0, len(rows) - 1))
        rows = [*rows[:index], data.draw(mutated_json(rows[index], 2)), *rows[index + 1:]]
        if data.draw(st.booleans()):
            rows.append({data.draw(st.sampled_from(COLUMNS)): data.draw(json_values)})
    whole = lscpu_text(rows, dialect)
    text = data.draw(mangled_text(whole))
    answer = refused(lambda: parse_lscpu_json(text, "lscpu-fuzz.json"), UserError)
    if text == lscpu_text(lscpu_rows(topology), dialect):
        assert isinstance(answer, Topology), answer
        assert canonical_shape(answer) == canonical_shape(topology)
    if isinstance(answer, Topology):
        groups_or_refusal(answer)


# --- sysfs trees ----------------------------------------------------------------------------------------------

_TREES: dict[str, Path] = {}
_FILES: dict[str, list[str]] = {}


def tree(name: str) -> tuple[Path, list[str]]:
    """A sysfs + procfs tree written from the snapshot once per process; its files, relative."""
    if name not in _TREES:
        root = Path(tempfile.mkdtemp(prefix=f"fuzz-sysfs-{name}-"))
        write_sysfs_tree(load_embedded(name), root)
        _TREES[name] = root
        _FILES[name] = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return _TREES[name], _FILES[name]


garbage = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"\n", b"-1", b"0-", b"99999999999", b"0-3,x",
                                                              b"ffffffff,ffffffff", b"\xff\xfe", b"4294967296",
                                                              b"0-100000000", b"  7  ", b"1\n2\n"]))


@door("sysfs-tree", "topology", st.sampled_from(SMALL), st.data())
def sysfs_tree(name: str, data: st.DataObject) -> None:
    root, files = tree(name)
    edits = data.draw(st.lists(st.tuples(st.sampled_from(files), st.sampled_from(["write", "delete", "dir"]),
                                         garbage), max_size=4, unique_by=lambda e: e[0]))
    saved = {rel: (root / rel).read_bytes() for rel, _, _ in edits}
    try:
        for rel, how, content in edits:
            path = root / rel
            if how == "write":
                path.write_bytes(content)
            else:
                path.unlink()
                if how == "dir":
                    path.mkdir()
        answer = refused(lambda: read_sysfs(root), UserError)
        if not edits:
            assert isinstance(answer, Topology), answer
            assert canonical_shape(answer) == canonical_shape(kernel_view(load_embedded(name)))
        if isinstance(answer, Topology):
            groups_or_refusal(answer)
    finally:
        for rel, content in saved.items():
            path = root / rel
            if path.is_dir():
                shutil.rmtree(path)
            path.write_bytes(content)
            os.utime(path)
