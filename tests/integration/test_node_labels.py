"""The running agent labels its Node through kmock (a Kubernetes API emulator over real HTTP):
one GET and one PATCH, then no request at all while nothing changes."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
import pytest

from agent.app.build import build_agent
from agent.app.config import AgentConfig
from agent.node.kubeapi import LeanKubeApi
from agent.node.labeler import MERGE_PATCH, NodeLabeler
from agent.topology.embedded import load_embedded
from tests.support.harness import short_tmpdir
from topology_devkit.testing.wait import await_until

NODE = "s390x-worker-7"


@pytest.mark.asyncio
async def test_agent_patches_its_node_once_and_then_stays_quiet(kmock: kmock.KubernetesEmulator) -> None:
    kmock.objects["v1/nodes", None, NODE] = {"apiVersion": "v1", "kind": "Node",
                                             "metadata": {"name": NODE, "labels": {"kubernetes.io/arch": "s390x"}}}
    def factory(name: str) -> NodeLabeler:
        return NodeLabeler(name, LeanKubeApi(str(kmock.url).rstrip("/")))

    root = short_tmpdir()
    config = AgentConfig(kubelet_dir=root / "device-plugins", pod_resources_socket=root / "none.sock",
                         node_name=NODE, node_labels=True, label_interval=0.02, rescan_interval=0,
                         pod_resources_interval=0)
    agent = build_agent(load_embedded("z16-lpar"), config, labeler_factory=factory)
    await asyncio.to_thread(agent.start)
    try:
        await await_until("one PATCH of the Node", lambda: agent.reporter.patches == 1, 30)
        await await_until("ten runs of the label loop", lambda: agent.label_loop.runs >= 10, 30)
        requests: list[Any] = list(kmock)
        assert [(r.method, r.url.path) for r in requests] == [("GET", f"/api/v1/nodes/{NODE}"),
                                                              ("PATCH", f"/api/v1/nodes/{NODE}")]
        assert requests[1].headers["Content-Type"] == MERGE_PATCH
        labels = kmock.objects["v1/nodes", None, NODE].raw["metadata"]["labels"]
        assert labels["topology.s390x.ibm.com/books"] == "8"
        assert labels["topology.s390x.ibm.com/fidelity"] == "lpar"
        assert labels["kubernetes.io/arch"] == "s390x"
    finally:
        await asyncio.to_thread(agent.stop)
