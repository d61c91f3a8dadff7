"""``topology-agent serve`` as a real process: registers, and on SIGTERM/SIGINT stops serving,
removes its sockets and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.harness import short_tmpdir
from topology_devkit.kubelet_emulator import KubeletEmulator


def serve(kubelet: KubeletEmulator, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "serve", "--topology-file", "embedded:z16-lpar",
         "--kubelet-dir", str(kubelet.device_plugin_dir), "--pod-resources-socket", str(kubelet.pod_resources_socket),
         "--log-format", "json", "--metrics-port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_and_removes_sockets(sig: signal.Signals) -> None:
    with KubeletEmulator(short_tmpdir()) as kubelet:
        proc = serve(kubelet, "--levels", "book,socket")
        try:
            kubelet.wait_registered("topology/book", timeout=20)
            kubelet.wait_registered("topology/socket", timeout=20)
            kubelets_own = {"kubelet.sock", "kubelet_internal_checkpoint", "s390x-topology-agent"}
            ours = {p.name for p in kubelet.device_plugin_dir.iterdir()} - kubelets_own
            assert ours == {"topology-book.sock", "topology-socket.sock"}
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        assert {p.name for p in kubelet.device_plugin_dir.iterdir()} == {"kubelet.sock", "kubelet_internal_checkpoint",
                                                                         "s390x-topology-agent"}  # its saved groups
        assert '"msg": "registered topology/book with kubelet' in err


def test_second_process_is_refused_with_a_clear_error() -> None:
    with KubeletEmulator(short_tmpdir()) as kubelet:
        first = serve(kubelet)
        try:
            kubelet.wait_registered("topology/book", timeout=20)
            second = serve(kubelet)
            _, err = second.communicate(timeout=30)
            assert second.returncode == 2
            assert "served by another running process" in err and "Traceback" not in err
            assert kubelet.registrations("topology/book") == 1
        finally:
            first.send_signal(signal.SIGTERM)
            first.communicate(timeout=20)
