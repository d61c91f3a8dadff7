"""agent/atomic.py: the one atomic write. The new content or the old, never a part; synced (the file, then the
directory after the rename); nothing left behind when it fails, at any step."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agent.atomic import write_atomically


def test_writes_replaces_and_sets_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomically(target, b"one")
    assert target.read_bytes() == b"one" and stat.S_IMODE(target.stat().st_mode) == 0o644
    write_atomically(str(target), b"two", mode=0o600)
    assert target.read_bytes() == b"two" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["state.json"]


def test_syncs_the_file_before_the_rename_and_the_directory_after(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_atomically(tmp_path / "f", b"x")
    assert events == ["fsync file", "rename", "fsync dir"]


@pytest.mark.parametrize("step", ["fsync", "chmod", "replace"])
def test_a_failure_leaves_the_old_content_and_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 step: str) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, step, fail)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.json"]


def test_an_interrupt_also_removes_the_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "f", b"x")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_a_missing_directory_is_an_error_with_nothing_created(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "no" / "f", b"x")
    assert os.listdir(tmp_path) == []
