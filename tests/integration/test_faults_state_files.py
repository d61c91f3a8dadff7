"""The agent's saved state files as hostile input, against the real ``serve`` process: whatever is
in them, the agent starts, says what it distrusts, never hands out a CPU the machine lacks, and
keeps its files per resource prefix, rewritten when wiped."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from agent.devices.persist import StateFiles
from agent.errors import SavedStateError
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.state_codec import grouping_from_dict, grouping_to_dict
from agent.topology.embedded import load_embedded
from tests.support.env import BOOK
from tests.support.harness import short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import Container, KubeletEmulator
from topology_devkit.testing.wait import wait_until

STATE = "s390x-topology-agent"


def groups_file(k: KubeletEmulator, prefix: str = "topology") -> Path:
    return k.device_plugin_dir / STATE / prefix / "groups.json"


def run_once(k: KubeletEmulator, root: Path, *args: str) -> AgentProcess:
    """A new agent process, once it registered (with this kubelet: its count grows)."""
    before, snapshots = k.registrations(BOOK), k.snapshots(BOOK)
    agent = AgentProcess(k, root, "--levels", "book", *args)
    k.wait_for(lambda: k.registrations(BOOK) > before and k.snapshots(BOOK) > snapshots, timeout=30,
               what="registered, its devices delivered")
    return agent


@pytest.mark.parametrize(("content", "said"), [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"version": 1, "settings": {}, "groups": "nope"', "not JSON"),
    (json.dumps({"version": 1, "settings": {"levels": ["book"], "resource_prefix": "topology", "reserved_cpus": [],
                                             "exclude_polarization": [], "min_group_cores": None},
                 "groups": [{"level": "book", "resource": "topology/book", "id": 7}]}), "must be"),
])
def test_a_broken_groups_file_is_said_and_replaced(content: str, said: str) -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k:
        path = groups_file(k)
        path.parent.mkdir(parents=True)
        path.write_text(content)
        agent = run_once(k, root)
        try:
            # (log lines are written in batches)
            wait_until("the distrust said",
                       lambda: agent.logged(said) and agent.logged("not trusting the saved groups"), 10)
            assert not [line for line in agent.log() if line.get("level") == "error" or "Traceback" in str(line)]
            assert json.loads(path.read_text())["groups"]  # written afresh
        finally:
            assert agent.stop() == 0


def test_a_cpu_the_machine_lacks_never_reaches_a_container() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k:
        first = run_once(k, root)
        k.admit_pod("default", "held", [Container("c", {BOOK: 1})])  # the saved groups would be kept
        assert first.stop() == 0
        path = groups_file(k)
        data = json.loads(path.read_text())
        data["groups"][0]["cpus"].append(9999)
        data["groups"][0]["cores"].append([9999])
        path.write_text(json.dumps(data))
        second = run_once(k, root)
        try:
            wait_until("the foreign CPU said",
                       lambda: second.logged("9999") and second.logged("that this machine does not have"), 10)
            k.admit_pod("default", "next", [Container("c", {BOOK: 1})])
            env = k.start_container("default", "next", "c")
            assert "9999" not in env["TOPOLOGY_CPUS"]
        finally:
            assert second.stop() == 0


def test_the_kept_reason_does_not_grow_and_a_wiped_directory_is_written_again() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k:
        for _ in range(3):
            agent = run_once(k, root)
            if not k.pods():
                k.admit_pod("default", "held", [Container("c", {BOOK: 1})])
            assert agent.stop() == 0
        reason = json.loads(groups_file(k).read_text())["level_reason"]
        assert "kept from before the restart" not in reason
        agent = run_once(k, root)
        try:
            for f in groups_file(k).parent.iterdir():
                f.unlink()
            groups_file(k).parent.rmdir()
            wait_until("the groups written again", lambda: groups_file(k).exists(), 20)
        finally:
            assert agent.stop() == 0


def test_two_resource_prefixes_keep_separate_files() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k:
        a = AgentProcess(k, root, "--levels", "book")
        b = AgentProcess(k, root, "--levels", "book", "--resource-prefix", "other.example.com")
        try:
            k.wait_for(lambda: k.registrations(BOOK) >= 1 and k.registrations("other.example.com/book") >= 1,
                       timeout=30, what="both registered")
            wait_until("both files",
                       lambda: groups_file(k).exists() and groups_file(k, "other.example.com").exists(), 10)
            assert json.loads(groups_file(k).read_text())["settings"]["resource_prefix"] == "topology"
            other = json.loads(groups_file(k, "other.example.com").read_text())
            assert other["settings"]["resource_prefix"] == "other.example.com"
        finally:
            a.stop()
            b.stop()


def test_a_save_that_fails_leaves_no_temporary_file_and_is_not_retried_every_few_seconds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    settings = GroupingSettings()
    grouping = group_topology(load_embedded("z16-lpar"), settings)
    files = StateFiles(tmp_path, settings)

    def disk_full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    files.save_groups(grouping)
    directory = files.groups_path.parent
    assert list(directory.iterdir()) == []  # neither the file nor a temporary one
    assert "cannot save the advertised groups" in caplog.text
    caplog.clear()
    files.tend()
    assert caplog.text == ""  # nothing to rewrite: the groups never were saved
    monkeypatch.undo()
    files.save_groups(grouping)
    files.groups_path.unlink()  # wiped by someone else: written again
    files.tend()
    assert files.groups_path.is_file() and "are gone: writing them again" in caplog.text


@pytest.mark.parametrize(("levels", "said"), [(["bogus"], "'bogus' is not one of"),
                                              (["socket"], "groups at level book that levels does not list")])
def test_saved_levels_are_checked_like_every_other_value(levels: list[str], said: str) -> None:
    settings = GroupingSettings(levels=("book",))
    topology = load_embedded("z16-lpar")
    data = grouping_to_dict(group_topology(topology, settings), settings)
    assert grouping_from_dict(data, settings, [c.cpu for c in topology.cpus]) is not None  # as written: trusted
    data["levels"] = levels
    with pytest.raises(SavedStateError, match=said):
        grouping_from_dict(data, settings, [c.cpu for c in topology.cpus])
