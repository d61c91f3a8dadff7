"""A running agent against the kubelet emulator, in a few lines, for integration tests."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from agent._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from agent.app.agent import Agent
from agent.app.build import build_agent
from agent.app.config import AgentConfig
from agent.plugin.timing import Timing
from agent.policy.grouping import GroupingSettings
from agent.topology.embedded import load_embedded
from agent.topology.model import Topology
from topology_devkit.kubelet_emulator import KubeletEmulator

FAST = Timing(poll=0.02, stream_grace=1.0, backoff_min=0.02, backoff_max=0.2, register_timeout=5.0)


MADE: list[Path] = []  # every short_tmpdir of this session: removed when it ends (tests/conftest.py)


def short_tmpdir() -> Path:
    """Unix socket paths must stay under 107 bytes: pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="tpa-", dir="/tmp"))
    MADE.append(path)
    return path


@dataclass
class Node:
    kubelet: KubeletEmulator
    agent: Agent
    root: Path
    topology: Topology = field(repr=False)

    def plugin_stub(self, resource: str) -> tuple[grpc.Channel, api_pb2_grpc.DevicePluginStub]:
        """A client of our plugin's own socket, the way kubelet dials it."""
        path = self.agent.manager.servers[resource].path  # type: ignore[attr-defined]
        channel = grpc.insecure_channel(f"unix://{path}")
        return channel, api_pb2_grpc.DevicePluginStub(channel)

    def allocate(self, resource: str, ids: list[str]) -> api_pb2.AllocateResponse:
        channel, stub = self.plugin_stub(resource)
        with channel:
            request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
            return stub.Allocate(request, timeout=5)


@contextlib.contextmanager
def running_node(topology: Topology | str = "z16-lpar", levels: tuple[str, ...] | None = ("book", "socket"),
                 start_kubelet: bool = True, loader: Callable[[], Topology] | None = None,
                 fingerprint: Callable[[], object] | None = None, **config: object) -> Iterator[Node]:
    topo = load_embedded(topology) if isinstance(topology, str) else topology
    root = short_tmpdir()
    kubelet = KubeletEmulator(root)
    config = {"rescan_interval": 0.0, "pod_resources_interval": 0.05, "timing": FAST,
              "pod_resources_socket": kubelet.pod_resources_socket, **config}
    settings = AgentConfig(kubelet_dir=kubelet.device_plugin_dir, grouping=GroupingSettings(levels=levels),
                           **config)  # type: ignore[arg-type]
    if start_kubelet:
        kubelet.start()
    try:
        agent = build_agent(topo, settings, loader=loader, fingerprint=fingerprint)
    except BaseException:
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        agent.start()
        node = Node(kubelet, agent, root, topo)
        if start_kubelet:
            for resource in agent.grouping.resources():
                kubelet.wait_registered(resource)
            # kubelet can push the first device list before the agent's Register call has returned: the agent is
            # ready (its /readyz, topology_agent_ready) only once it has seen both.
            kubelet.wait_for(agent.ready, timeout=30.0, what="the agent to be ready")
        yield node
    finally:
        agent.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
