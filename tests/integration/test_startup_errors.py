"""Bad input at start is one line and exit 2, never a traceback; stopping is always prompt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.cli import main
from agent.topology.snapshot_format import MAX_SNAPSHOT_BYTES
from tests.support.harness import short_tmpdir
from topology_devkit.testing.wait import wait_until


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_missing_kubelet_dir_is_a_startup_error_and_is_not_created(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "dp"
    line = one_line_error(capsys, "serve", "--topology-file", "embedded:z16-lpar", "--kubelet-dir", str(missing))
    assert line == (f"topology-agent: error: cannot use kubelet's directory {missing} (--kubelet-dir): it does not "
                    "exist; give kubelet's device-plugin directory (usually /var/lib/kubelet/device-plugins, whatever "
                    "kubelet's --root-dir: k3s and microk8s too)")
    assert not (tmp_path / "nonexistent").exists()
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert "it is a file, not a directory" in one_line_error(capsys, "serve", "--topology-file", "embedded:z16-lpar",
                                                  "--kubelet-dir", str(a_file))


def test_sigterm_while_waiting_for_kubelet_stops_promptly() -> None:
    directory = short_tmpdir()  # kubelet's directory, without kubelet.sock
    log = directory.parent / f"{directory.name}.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "serve", "--topology-file", "embedded:z16-lpar", "--kubelet-dir",
             str(directory), "--pod-resources-socket", str(directory / "none.sock"), "--no-node-labels",
             "--metrics-port", "0", "--log-format", "text"],
            stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until("the agent waiting for kubelet.sock", lambda: "waiting for" in log.read_text(), 30)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 1.5, "stopping waited out a poll interval"
    finally:
        if proc.poll() is None:
            proc.kill()
        log.unlink(missing_ok=True)


@pytest.mark.parametrize("text", ["[" * 5000, '{"a":' * 3000 + "1" + "}" * 3000])
def test_a_deeply_nested_snapshot(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.json"
    path.write_text(text)
    for command in ("discover", "explain", "serve"):
        extra = ("--kubelet-dir", str(tmp_path)) if command == "serve" else ()
        line = one_line_error(capsys, command, "--topology-file", str(path), *extra)
        assert line == f"topology-agent: error: {path}: not a topology snapshot: JSON nested too deeply"


def test_an_endless_topology_file_is_refused_after_a_bounded_read(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    line = one_line_error(capsys, "discover", "--topology-file", "/dev/zero")
    assert line.startswith("topology-agent: error: /dev/zero: not a topology snapshot: larger than 16 MiB")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_SNAPSHOT_BYTES + 1))
    assert "larger than 16 MiB" in one_line_error(capsys, "discover", "--topology-file", str(big))


def test_a_topology_directory_without_the_files(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "n1")
    line = one_line_error(capsys, "discover", "--topology-file", str(tmp_path))
    assert line == f"topology-agent: error: {tmp_path}: topology directory holds neither n1.json nor default.json"
    monkeypatch.delenv("NODE_NAME")
    line = one_line_error(capsys, "discover", "--topology-file", str(tmp_path))
    assert line == f"topology-agent: error: {tmp_path}: topology directory holds no default.json"


@pytest.mark.parametrize("argv, expected", [
    (["serve", "--source", "bogus"], "topology-agent serve: error: argument --source: invalid choice: 'bogus' "
                                     "(choose from 'sysfs', 'lscpu') (see topology-agent serve --help)"),
    (["serve", "--cpuset-enforcement", "sometimes"], "topology-agent serve: error: argument --cpuset-enforcement: "
                                                     "invalid choice: 'sometimes'"),
    (["discover", "--format", "xml"], "topology-agent discover: error: argument --format: invalid choice: 'xml'"),
    (["bogus"], "topology-agent: error: argument COMMAND: invalid choice: 'bogus'"),
])
def test_a_bad_choice_is_one_line_and_a_hint(capsys: pytest.CaptureFixture[str], argv: list[str],
                                             expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), captured.err
    assert lines[0].endswith("--help)") and "usage:" not in captured.err


def test_not_an_ibm_z_machine(capsys: pytest.CaptureFixture[str]) -> None:
    if os.uname().machine == "s390x":
        pytest.skip("this host is IBM Z")
    assert main(["discover"]) == 0
    out = capsys.readouterr().out
    assert f"not an IBM Z machine (architecture {os.uname().machine}): nothing is advertised" in out
    assert "no groups advertised" in out
    assert main(["discover", "--allow-non-s390x"]) == 0
    assert "not an IBM Z machine" not in capsys.readouterr().out
    assert main(["explain"]) == 0
    assert "None" not in capsys.readouterr().out  # not "drawer None book None"
