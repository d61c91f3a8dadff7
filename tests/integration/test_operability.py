"""What an operator meets: the metrics port on IPv4 and IPv6, process metrics, a kubelet directory
that is wrong, read-only or a file, and one-line errors for bad command lines."""

from __future__ import annotations

import http.client
import logging
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import main
from agent.plugin.timing import Timing
from tests.support.harness import FAST, Node, running_node, short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.testing.wait import wait_until


def ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def healthz(host: str, port: int) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


def port_of(node: Node) -> int:
    assert node.agent.http is not None
    return node.agent.http.port


def test_the_default_address_answers_ipv4_probes_and_ipv6_ones_where_the_node_has_ipv6() -> None:
    with running_node(levels=("book",), metrics_port=0, metrics_address="") as node:
        assert healthz("127.0.0.1", port_of(node)) == 200
        if ipv6_loopback():
            assert healthz("::1", port_of(node)) == 200


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_address_listens_on_ipv6() -> None:
    with running_node(levels=("book",), metrics_port=0, metrics_address="::1") as node:
        assert healthz("::1", port_of(node)) == 200
        with pytest.raises(OSError):
            healthz("127.0.0.1", port_of(node))


def test_an_ipv4_address_listens_on_ipv4_only() -> None:
    with running_node(levels=("book",), metrics_port=0, metrics_address="127.0.0.1") as node:
        assert healthz("127.0.0.1", port_of(node)) == 200
        if ipv6_loopback():
            with pytest.raises(OSError):
                healthz("::1", port_of(node))


def test_process_metrics_are_exported() -> None:
    with running_node(levels=("book",), metrics_port=0, metrics_address="127.0.0.1") as node:
        conn = http.client.HTTPConnection("127.0.0.1", port_of(node), timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total",
                 "process_threads"):
        assert f"\n{name} " in text, name


def test_a_kubelet_directory_without_kubelet_sock_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    timing = Timing(poll=0.02, stream_grace=FAST.stream_grace, backoff_min=0.02, backoff_max=0.2,
                    kubelet_missing_warning=0.3)
    with running_node(levels=("book",), start_kubelet=False, timing=timing):
        wait_until("the warning", lambda: any("no kubelet.sock in" in r.getMessage() for r in caplog.records), 10)
    (warning,) = [r for r in caplog.records if "no kubelet.sock in" in r.getMessage()][:1]
    assert warning.levelno == logging.WARNING
    assert "k3s" in warning.getMessage() and "microk8s" in warning.getMessage()


def test_a_file_given_as_kubelet_directory_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    root = short_tmpdir()
    try:
        (root / "not-a-dir").write_text("")
        code = main(["serve", "--topology-file", "embedded:z16-lpar", "--kubelet-dir", str(root / "not-a-dir"),
                     "--metrics-port", "0", "--no-node-labels", "--pod-resources-interval", "0"])
        err = capsys.readouterr().err
        assert code == 2 and "it is a file, not a directory" in err and "Traceback" not in err
    finally:
        shutil.rmtree(root)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for a private mount")
def test_a_read_only_kubelet_directory_says_so() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k:
        probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"cannot make a private mount namespace here: {probe.stderr.decode().strip()}")
        # The agent in a mount namespace of its own where kubelet's directory is read-only.
        wrapper = root / "python-ro"
        wrapper.write_text(f"#!/bin/sh\nmount --bind -o ro {k.device_plugin_dir} {k.device_plugin_dir} "
                           f"&& exec {sys.executable} \"$@\"\n")
        wrapper.chmod(0o755)
        agent = AgentProcess(k, root, "--levels", "book", python=["unshare", "-m", "--propagation", "private",
                                                                     str(wrapper)])
        try:
            wait_until("the OS reason in the log", lambda: agent.logged("Read-only file system"), 20)
            assert agent.proc.poll() is None  # waits it out, keeps trying
        finally:
            agent.stop()


def test_bad_command_lines_are_one_line_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("")
    cases = [
        (["snapshot", "--topology-file", "embedded:z16-lpar", "-o", str(tmp_path / "missing" / "x.json")],
         "No such file or directory"),
        (["snapshot", "--topology-file", "embedded:z16-lpar", "-o", str(tmp_path)], "Is a directory"),
        (["discover", "--topology-file", str(empty)], "empty"),
        (["discover", "--topology-file", "embedded:z16-lpar", "--levels", ""], "--levels"),
        (["discover", "--topology-file", "embedded:z16-lpar", "--levels", "book,book"], "at most once"),
    ]
    for argv, words in cases:
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, argv
        assert words in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 2)", "(default: 9400)", "(default: /var/lib/kubelet/device-plugins)",
                    "(default: on)", "(default: off)", "(default: auto)"):
        assert default in out, default


def test_the_discovery_log_names_the_machine_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with running_node(levels=("book",)):
        pass
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("discovered")]
    assert "machine: z16 (3931)" in line and "topology facility yes" in line
    assert "True" not in line and "None" not in line
