"""Faults that exhausted the agent, against the real ``serve`` process: an undrained stderr, many
ListAndWatch streams, many HTTP connections, many distinct device-id sets."""

from __future__ import annotations

import http.client
import itertools
import resource
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from agent._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from tests.support.env import BOOK, SOCKET
from tests.support.harness import short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.testing.wait import wait_until


def test_an_undrained_stderr_bounds_memory_and_never_blocks_allocate() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k:
        agent = AgentProcess(k, root, "--levels", "book", "--log-level", "debug", stderr_pipe=True)
        try:
            k.wait_registered(BOOK, timeout=30)
            books = [f"drawer{0 if b < 4 else 1}-book{b}" for b in range(8)]
            with agent.plugin(BOOK) as stub:
                for i in range(300):  # fill the pipe (64 KiB) and settle
                    stub.Allocate(request([books[i % 8]]), timeout=5)
                before = agent.rss_kib()

                def burst(n: int) -> None:
                    for i in range(n):
                        stub.Allocate(request([books[i % 8], books[(i + 1) % 8]]), timeout=5)

                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(burst, [3000] * 4))  # every call answers within its deadline
                grown = agent.rss_kib() - before
        finally:
            agent.kill()
        # Unbounded, 12,000 debug lines held in memory grew it by ~100 MB; the queue holds 4096 records.
        assert grown < 24 * 1024, f"RSS grew by {grown} KiB"


def request(ids: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])


def test_many_list_and_watch_streams_never_starve_allocate() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k, AgentProcess(k, root, "--levels", "book,socket") as agent:
        k.wait_registered(BOOK, timeout=30)
        path = k.device_plugin_dir / "topology-book.sock"
        channel = grpc.insecure_channel(f"unix://{path}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        streams = [stub.ListAndWatch(api_pb2.Empty()) for _ in range(20)]
        try:
            for stream in streams[-4:]:
                next(stream)  # the newest streams are served
            # The older ones were ended: four stay open while all twenty are still held by the client.
            wait_until("four streams open, kubelet's among them",
                       lambda: agent.metric("topology_agent_list_and_watch_streams", resource=BOOK) == 4, 10)
            assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=3).get_preferred_allocation_available
            answer = stub.Allocate(request(["drawer0-book0"]), timeout=3)
            assert answer.container_responses[0].envs["TOPOLOGY_GROUPS"] == "drawer0-book0"
            # kubelet's own stream was never ended: it still sees the new blocked sockets.
            wait_until("kubelet's stream", lambda: k.devices(SOCKET).get("drawer0-book0-socket0") == "Unhealthy", 10)
            assert k.registrations(BOOK) == 1
        finally:
            for stream in streams:
                stream.cancel()
            channel.close()


def raise_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_idle_http_connections_cost_no_threads_and_never_hold_healthz() -> None:
    if raise_fd_limit(2200) < 2100:
        pytest.skip("needs room for 2,000 open descriptors in the test process")
    root = short_tmpdir()
    with KubeletEmulator(root) as k, AgentProcess(k, root, "--levels", "book") as agent:
        k.wait_registered(BOOK, timeout=30)
        threads = agent.threads()
        idle = []
        try:
            for _ in range(2000):
                s = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
                idle.append(s)
            started = time.monotonic()
            assert agent.get("/healthz", timeout=5) == (200, "ok\n")
            assert time.monotonic() - started < 2.0
            assert agent.threads() <= threads + 2  # no thread per connection
            assert k.registrations(BOOK) == 1 and agent.proc.poll() is None
        finally:
            for s in idle:
                s.close()
        conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=5)
        conn.request("POST", "/metrics", body=b"")
        response = conn.getresponse()
        assert response.status in (400, 405) and response.getheader("Server") is None
        conn.close()


def test_idle_http_connections_are_closed_by_the_agent() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k, AgentProcess(k, root, "--levels", "book") as agent:
        k.wait_registered(BOOK, timeout=30)
        s = socket.create_connection(("127.0.0.1", agent.port), timeout=30)
        try:
            started = time.monotonic()
            assert s.recv(1) == b""  # closed by the agent, not by us
            assert time.monotonic() - started < 20
        finally:
            s.close()


def test_many_distinct_device_id_sets_keep_memory_bounded() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k, AgentProcess(k, root, "--levels", "socket",
                                                  "--pod-resources-interval", "0.2") as agent:
        k.wait_registered(SOCKET, timeout=30)
        sockets = sorted(k.devices(SOCKET))
        orders = itertools.permutations(sockets, 3)
        with agent.plugin(SOCKET) as stub:
            for ids in itertools.islice(orders, 600):  # warm up, and fill the cache
                stub.Allocate(request(list(ids)), timeout=5)
            before = agent.rss_kib()
            for ids in itertools.islice(orders, 6000):
                stub.Allocate(request(list(ids)), timeout=5)
            grown = agent.rss_kib() - before
        # Kept for ever, each distinct id list's answer cost ~6.7 KB: 6,000 more would be ~40 MB.
        assert grown < 12 * 1024, f"RSS grew by {grown} KiB"
