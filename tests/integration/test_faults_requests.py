"""Hostile requests against the real ``serve`` process: what a refusal echoes is bounded (a status
detail, a log line), so a client sees INVALID_ARGUMENT, never RESOURCE_EXHAUSTED; and durations
do not follow the wall clock."""

from __future__ import annotations

import time

import grpc
import pytest

from agent._proto.deviceplugin.v1beta1 import api_pb2
from tests.support.env import BOOK
from tests.support.harness import running_node, short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.testing.wait import wait_until

MAX_DETAILS = 2048
MAX_LOG_LINE = 4096


@pytest.fixture(scope="module")
def agent() -> object:
    root = short_tmpdir()
    with KubeletEmulator(root) as k, AgentProcess(k, root, "--levels", "book") as process:
        k.wait_registered(BOOK, timeout=30)
        yield process


@pytest.mark.parametrize("ids", [[f"unknown-{i}" for i in range(10_000)], ["x" * 1_000_000],
                                 ["drawer0-book0"] * 5000], ids=["10k-unknown-ids", "1MB-id", "5k-duplicates"])
def test_an_allocate_with_absurd_ids_gets_a_short_invalid_argument(agent: AgentProcess, ids: list[str]) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        agent.allocate(BOOK, ids)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(refused.value.details()) < MAX_DETAILS
    if len(set(ids)) > 10:
        assert "more" in refused.value.details()


@pytest.mark.parametrize("must", [[f"unknown-{i}" for i in range(10_000)], ["y" * 1_000_000]],
                         ids=["10k-unknown", "1MB-id"])
def test_a_preferred_allocation_with_absurd_ids_gets_a_short_invalid_argument(agent: AgentProcess,
                                                                              must: list[str]) -> None:
    with agent.plugin(BOOK) as stub, pytest.raises(grpc.RpcError) as refused:
        stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["drawer0-book0"],
                                                        must_include_deviceIDs=must, allocation_size=1)]),
            timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(refused.value.details()) < MAX_DETAILS


def test_no_log_line_echoes_a_whole_request(agent: AgentProcess) -> None:
    with pytest.raises(grpc.RpcError):
        agent.allocate(BOOK, ["z" * 1_000_000])
    wait_until("the refusal logged", lambda: agent.logged("Allocate refused"), 5)
    longest = max(len(line) for line in agent.log_path.read_text().splitlines())
    assert longest < MAX_LOG_LINE


def test_seconds_since_registration_ignore_a_wall_clock_jump(monkeypatch: pytest.MonkeyPatch) -> None:
    with running_node(levels=("book",)) as node:
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 86_400)  # the wall clock jumps a day ahead
        (since,) = [r.seconds_since_registration for r in node.agent.status().resources]
        assert since is not None and 0 <= since < 60
