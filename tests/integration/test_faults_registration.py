"""Faults that stopped registration, against the real ``serve`` process: an obstacle while serving
again after a kubelet restart must be waited out, never end registration for good, and a burst of
kubelet restarts must not stall a re-registration on a stale Register."""

from __future__ import annotations

import time

from tests.support.env import BOOK, SOCKET
from tests.support.harness import short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.testing.wait import wait_until


def test_a_directory_at_the_socket_path_during_a_kubelet_restart_is_waited_out() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k, AgentProcess(k, root, "--levels", "book") as agent:
        k.wait_registered(BOOK, timeout=30)
        k.restart(down_for=1.5, block=False)  # deletes our socket; kubelet.sock is back after 1.5 s
        obstacle = k.device_plugin_dir / "topology-book.sock"
        wait_until("kubelet deleting our socket", lambda: not obstacle.exists(), 5)
        obstacle.mkdir()  # left behind by something else
        wait_until("kubelet back", lambda: k.is_running, 10)
        wait_until("the agent naming the obstacle", lambda: agent.logged("is a directory, not a socket"), 10)
        assert agent.proc.poll() is None and agent.get("/healthz")[0] == 200
        obstacle.rmdir()
        wait_until("registered again once the obstacle is gone",
                   lambda: k.registrations(BOOK) >= 2 and k.allocatable(BOOK) == 8, 15)


def test_a_second_instance_during_a_kubelet_restart_is_waited_out() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k, AgentProcess(k, root, "--levels", "book") as first:
        k.wait_registered(BOOK, timeout=30)
        socket = k.device_plugin_dir / "topology-book.sock"
        # kubelet stays down until the second instance serves the freed path: a first instance that saw kubelet
        # back sooner would serve again itself (under load a process starts slower than any fixed downtime).
        k.restart(down_for=1.0, block=False, up_when=socket.exists)
        wait_until("our socket deleted", lambda: not socket.exists(), 5)
        second = AgentProcess(k, root, "--levels", "book")  # takes the freed socket path
        try:
            wait_until("the second instance registered", lambda: k.is_running and k.registrations(BOOK) >= 2, 30)
            wait_until("the first one waiting", lambda: first.logged("served by another running process"), 15)
            assert first.proc.poll() is None
        finally:
            assert second.stop() == 0
        wait_until("the first instance registered again once the second is gone",
                   lambda: k.registrations(BOOK) >= 3 and k.allocatable(BOOK) == 8, 15)


def test_every_re_registration_after_a_burst_of_kubelet_restarts_is_prompt() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k, AgentProcess(k, root, "--levels", "book,socket") as agent:
        k.wait_registered(BOOK, timeout=30)
        k.wait_registered(SOCKET, timeout=30)
        slowest = 0.0
        for _ in range(8):
            before = {r: k.registrations(r) for r in (BOOK, SOCKET)}
            for _ in range(3):  # three restarts within a few milliseconds
                k.restart()
            back = time.monotonic()
            wait_until("re-registration after a burst",
                       lambda b=before: all(k.registrations(r) > b[r] and k.allocatable(r) > 0  # type: ignore[misc]
                                            for r in (BOOK, SOCKET)), 15)
            slowest = max(slowest, time.monotonic() - back)
        # A Register left to a kubelet that restarted meanwhile must not wait out its 10 s timeout.
        assert slowest < 3.0, f"slowest re-registration took {slowest:.2f}s"
        assert agent.proc.poll() is None
