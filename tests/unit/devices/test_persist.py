"""The agent's own state files (agent/devices/persist.py): what tend() puts back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.devices.persist import StateFiles
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.ledger import SavedHolds
from agent.topology.embedded import load_embedded


@pytest.mark.parametrize("damage", ["wiped", "cut short", "changed"])
def test_tend_puts_back_holds_someone_wiped_cut_short_or_changed(tmp_path: Path, damage: str) -> None:
    settings = GroupingSettings(levels=("book",))
    grouping = group_topology(load_embedded("z16-lpar"), settings)
    files = StateFiles(tmp_path, settings)
    key = ("topology/book", grouping.groups[0].id)
    holds = SavedHolds(frozenset({key}), {})
    files.save_holds(holds)
    written = files.holds_path.read_bytes()
    if damage == "wiped":
        files.holds_path.unlink()
    elif damage == "cut short":
        files.holds_path.write_bytes(written[:7])
    else:
        files.holds_path.write_text(json.dumps({**json.loads(written), "holds": []}))
    files.tend()
    assert files.holds_path.read_bytes() == written and files.load_holds([key]) == holds
    files.tend()  # nothing to do now: the file is as written
    assert files.holds_path.read_bytes() == written
