"""The command line: discover, snapshot and explain, their output and their error handling."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.topology.embedded import load_embedded
from tests.support.env import REPO, real_dump
from topology_devkit.sysfs_writer import write_sysfs_tree


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_discover_table_names_groups_and_left_out_cpus(capsys: pytest.CaptureFixture[str]) -> None:
    _, root = real_dump("s390-lpar")
    code, out, _ = run(capsys, "discover", "--host-root", str(root), "--levels", "book,socket")
    assert code == 0
    assert "topology/book    book3" in out and "1-5" in out
    assert "cpus 0: offline" in out and "cpus 6-7: standby (deconfigured)" in out
    assert "z196 (2817)" in out


def test_discover_json_for_machines(capsys: pytest.CaptureFixture[str]) -> None:
    _, root = real_dump("s390-lpar-drawer")
    code, out, _ = run(capsys, "discover", "--host-root", str(root), "--format", "json")
    data = json.loads(out)
    assert code == 0
    assert [(g["resource"], g["id"], g["cpus"], g["memory_node"]) for g in data["groups"]] == [
        ("topology/socket", "drawer4-book1-socket2", [0, 1], 0),
        ("topology/socket", "drawer4-book1-socket3", [2, 3, 4, 5, 6, 7], 0)]
    assert data["memory_nodes"] == [0] and data["skipped"] == [] and data["machine"]["generation"] == "z13"


def test_discover_says_why_a_guest_advertises_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    _, root = real_dump("s390-zvm")
    code, out, _ = run(capsys, "discover", "--host-root", str(root), "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["groups"] == [] and data["fidelity"] == "guest-no-topology"
    assert "no topology facility" in data["skipped"][0]["reason"]


def test_snapshot_round_trip_through_the_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _, root = real_dump("hwloc-20s390-2g6s4c")
    snap = tmp_path / "node.json"
    assert run(capsys, "snapshot", "--host-root", str(root), "-o", str(snap))[0] == 0
    assert json.loads(snap.read_text())["version"] == 1
    _, from_root, _ = run(capsys, "discover", "--host-root", str(root), "--format", "json")
    _, from_snapshot, _ = run(capsys, "discover", "--topology-file", str(snap), "--format", "json")
    assert from_root == from_snapshot


def test_topology_directory_picks_the_node_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    run(capsys, "snapshot", "--topology-file", "embedded:pr40714", "-o", str(tmp_path / "worker-1.json"))
    run(capsys, "snapshot", "--topology-file", "embedded:z16-lpar", "-o", str(tmp_path / "default.json"))
    monkeypatch.setenv("NODE_NAME", "worker-1")
    _, out, _ = run(capsys, "discover", "--topology-file", str(tmp_path), "--format", "json")
    assert len(json.loads(out)["groups"]) == 2  # pr40714: the one-core book is not advertised
    monkeypatch.setenv("NODE_NAME", "worker-2")
    _, out, _ = run(capsys, "discover", "--topology-file", str(tmp_path), "--format", "json")
    assert len(json.loads(out)["groups"]) == 8


def test_environment_twins_set_flags(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOPOLOGY_AGENT_LEVELS", "book,socket")
    monkeypatch.setenv("TOPOLOGY_AGENT_TOPOLOGY_FILE", "embedded:pr40714")
    _, out, _ = run(capsys, "discover", "--format", "json")
    assert {g["resource"] for g in json.loads(out)["groups"]} == {"topology/book", "topology/socket"}
    _, out, _ = run(capsys, "discover", "--format", "json", "--levels", "socket")  # the flag wins
    assert {g["resource"] for g in json.loads(out)["groups"]} == {"topology/socket"}


def test_explain_shows_roles_and_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "--topology-file", "embedded:pr40714", "--reserve-cores-per-group", "1")
    assert code == 0
    assert "topology/book drawer0-book0: cpus 0-23" in out
    assert "cpu    1  drawer 0 book 0 socket 0 core 0, horizontal: OpenMP place" in out
    assert "reserved core" in out and "VLLM_CPU_OMP_THREADS_BIND=1,3,5,7,9,11,13,15,17,19,21" in out


def fake_lscpu(tmp_path: Path, output: str) -> Path:
    script = tmp_path / "bin" / "lscpu"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script.parent


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["discover", "--host-root", "/nonexistent"], "/nonexistent: host root does not exist"),
        (["discover", "--topology-file", "/etc/hostname"], "/etc/hostname: not valid JSON"),
        (["discover", "--topology-file", "embedded:z99"], "z99"),
        (["discover", "--reserved-cpus", "3-1"], "--reserved-cpus"),
        (["discover", "--levels", "chip"], "unknown level"),
        (["discover", "--exclude-polarization", "vertical:tiny"], "unknown polarization"),
        (["discover", "--resource-prefix", "kubernetes.io"], "kubernetes.io"),
        (["serve", "--metrics-port", "70000"], "--metrics-port"),
        (["serve", "--rescan-interval", "soon"], "--rescan-interval"),
        (["discover", "--levels", "0\r0"], "unknown level(s) '0\\r0'"),  # a typed line break stays on the line
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                words: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert words in err and "Traceback" not in err and err.count("\n") == 1


def test_argparse_rejects_bad_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", "--omp-threads-per-core", "3"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_invalid_lscpu_output_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = fake_lscpu(tmp_path, '{"cpus": [ {"cpu": 0, "core": x} ]}')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code, _, err = run(capsys, "discover", "--source", "lscpu", "--host-root", str(tmp_path))
    assert code == 2 and "lscpu" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("cpus", "words"),
    [
        ([{"cpu": 0, "siblings": [0, 1]}], "sibling CPU 1 is not in the snapshot"),
        ([{"cpu": 0, "siblings": [1]}, {"cpu": 1, "siblings": [1]}], "must include CPU 0 itself"),
        ([{"cpu": 0, "siblings": [0, 1], "book": 0}, {"cpu": 1, "siblings": [0, 1], "book": 1}], "different"),
        ([{"cpu": 0, "siblings": [0, 1]}, {"cpu": 1, "siblings": [1]}], "disagree"),
        ([{"cpu": 0, "siblings": [True]}], "list of CPU numbers"),
    ],
)
def test_snapshots_with_broken_cores_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 cpus: list[dict[str, Any]], words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"version": 1, "machine": {"arch": "s390x"}, "cpus": cpus}))
    for command in ("discover", "explain"):
        code, _, err = run(capsys, command, "--topology-file", str(path))
        assert code == 2 and words in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("env", "value", "words"),
    [
        ("TOPOLOGY_AGENT_LOG_LEVEL", "verbose", "TOPOLOGY_AGENT_LOG_LEVEL"),
        ("TOPOLOGY_AGENT_LOG_FORMAT", "JSON", "TOPOLOGY_AGENT_LOG_FORMAT"),
        ("TOPOLOGY_AGENT_OMP_THREADS_PER_CORE", "abc", "--omp-threads-per-core"),
        ("TOPOLOGY_AGENT_POD_RESOURCES_INTERVAL", "nan", "--pod-resources-interval"),
        ("TOPOLOGY_AGENT_RESCAN_INTERVAL", "inf", "--rescan-interval"),
        ("TOPOLOGY_AGENT_NODE_LABELS", "maybe", "TOPOLOGY_AGENT_NODE_LABELS"),
    ],
)
def test_bad_environment_twins_are_checked_like_flags(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      env: str, value: str, words: str) -> None:
    monkeypatch.setenv(env, value)
    code, _, err = run(capsys, "serve", "--topology-file", "embedded:z16-lpar", "--kubelet-dir", "/dev/null/x")
    assert code == 2 and words in err and "Traceback" not in err


def test_the_command_as_a_process_prints_what_main_returns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """python -m agent (the console script's main) prints what main() prints in-process, and exits 0; an error
    is one line, exit 2."""
    write_sysfs_tree(load_embedded("z16-400"), tmp_path)
    argv = ["discover", "--format", "json", "--host-root", str(tmp_path), "--levels", "book,socket"]
    assert main(argv) == 0
    want = capsys.readouterr().out
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TOPOLOGY_AGENT_"))}
    done = subprocess.run([sys.executable, "-m", "agent", *argv], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, want, "")
    bad = subprocess.run([sys.executable, "-m", "agent", "discover", "--host-root", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=env, check=False)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1


def test_an_argument_argparse_refuses_is_quoted_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["snapshot", "--omp-threads-per-core", "\x1e"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "unrecognized arguments: --omp-threads-per-core \\x1e" in err


def test_what_argparse_echoes_is_cut_short(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["snapshot", *["--levels", "x" * 300] * 5])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 600 and "more characters" in err
