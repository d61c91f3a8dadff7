"""Faults that broke book/socket exclusivity, against the real ``serve`` process.

Without pod-resources, what the agent handed out must never be forgotten (not after a minute either),
not even across an agent restart, and the agent must say that exclusivity is unconfirmed
(in /readyz's body, a metric and the node annotation: not with a 503, which would stall rollouts);
a refused Allocate must hold nothing.
"""

from __future__ import annotations

import os

import grpc
import pytest

from tests.support.env import BOOK, SOCKET
from tests.support.harness import short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import Container, KubeletEmulator
from topology_devkit.testing.wait import wait_until


def test_without_pod_resources_a_hold_survives_an_agent_restart_and_readiness_says_so() -> None:
    root = short_tmpdir()
    missing = root / "not-yet" / "kubelet.sock"  # pod-resources is not there (yet)
    with KubeletEmulator(root) as k:
        first = AgentProcess(k, root, "--levels", "book,socket", "--pod-resources-interval", "0.1",
                             pod_resources=missing)
        try:
            k.wait_registered(BOOK, timeout=30)
            k.wait_registered(SOCKET, timeout=30)
            first.allocate(BOOK, ["drawer0-book0"])  # what kubelet would do for a pod
            inside = {"drawer0-book0-socket0", "drawer0-book0-socket1"}
            wait_until("the book's sockets blocked", lambda: k.unhealthy_devices(SOCKET) == inside, 10)
            # Readiness gates DaemonSet rollouts only: devices are served, so ready, and the body says the rest.
            status, body = first.get("/readyz")
            assert status == 200 and "exclusivity unconfirmed" in body
            assert first.metric("topology_agent_exclusivity_confirmed") == 0
            assert first.metric("topology_agent_pending_holds") == 1
            with pytest.raises(grpc.RpcError) as refused:
                first.allocate(SOCKET, ["drawer0-book0-socket1"])
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            first.kill()  # no goodbye: what it handed out must come back from its saved holds
        k.restart()
        second = AgentProcess(k, root, "--levels", "book,socket", "--pod-resources-interval", "0.1",
                              pod_resources=missing)
        try:
            wait_until("re-registered", lambda: k.registrations(SOCKET) >= 2 and bool(k.devices(SOCKET)), 30)
            assert k.unhealthy_devices(SOCKET) == inside  # still blocked by the hold from before the restart
            with pytest.raises(grpc.RpcError) as refused:
                second.allocate(SOCKET, ["drawer0-book0-socket0"])
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            # pod-resources appears and answers: kubelet holds nothing, so the hold is released.
            missing.parent.mkdir()
            os.symlink(k.pod_resources_socket, missing)
            wait_until("confirmed once pod-resources answers", lambda: second.get("/readyz") == (200, "ready\n"), 30)
            wait_until("the sockets released", lambda: not k.unhealthy_devices(SOCKET), 10)
            assert second.metric("topology_agent_exclusivity_confirmed") == 1
            assert second.metric("topology_agent_pending_holds") == 0
        finally:
            second.stop()


def test_a_refused_allocate_holds_nothing() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k, AgentProcess(k, root, "--levels", "book,socket") as agent:
        k.wait_registered(BOOK, timeout=30)
        with pytest.raises(grpc.RpcError) as refused:
            agent.allocate(BOOK, ["drawer0-book0"], ["drawer9-book9"])  # one valid, one invalid container
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        answer = agent.allocate(SOCKET, ["drawer0-book0-socket0"])  # the valid book was not kept held
        assert answer.container_responses[0].envs["TOPOLOGY_GROUPS"] == "drawer0-book0-socket0"


def test_a_confirmed_hold_survives_an_agent_restart_while_pod_resources_is_away() -> None:
    root = short_tmpdir()
    away = root / "away" / "kubelet.sock"  # where the second instance looks: nothing there
    with KubeletEmulator(root) as k:
        first = AgentProcess(k, root, "--levels", "book,socket", "--pod-resources-interval", "0.1")
        inside = {"drawer0-book0-socket0", "drawer0-book0-socket1"}
        try:
            k.wait_registered(BOOK, timeout=30)
            k.wait_registered(SOCKET, timeout=30)
            k.admit_pod("ml", "llm", [Container("c", {BOOK: 1})])
            assert k.allocated(BOOK) == {"drawer0-book0"}
            wait_until("the hold confirmed by List", lambda: first.metric("topology_agent_pending_holds") == 0 and
                       k.unhealthy_devices(SOCKET) == inside, 10)
        finally:
            first.kill()
        seen = k.snapshots(SOCKET)  # cumulative: the second instance's first list is the next one
        second = AgentProcess(k, root, "--levels", "book,socket", "--pod-resources-interval", "0.1",
                              pod_resources=away)
        try:
            wait_until("re-registered and listed",
                       lambda: k.registrations(SOCKET) >= 2 and k.snapshots(SOCKET) > seen, 30)
            wait_until("serving /readyz", lambda: second.get("/readyz")[0] in (200, 503), 10)
            assert k.unhealthy_devices(SOCKET) == inside
            with pytest.raises(grpc.RpcError) as refused:
                second.allocate(SOCKET, ["drawer0-book0-socket1"])
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            second.stop()
