"""Switching modes without a failed pod: the last device-plugin agent on a node takes its
resources' allocatable to zero while it still serves, and a DRA agent is Ready only once the Node offers its names
through DRA alone (agent/policy/allocatable.py, agent/node/resource_withdrawal.py, agent/app/handover_on_stop.py).

The API server is a stand-in holding one Node (its status as the agent reads and patches it, and kubelet's own
status sync writing the device plugin's value back when the test says so) and the agent's DaemonSet; kubelet's
device manager is the emulator, so "still serving" means a pod is admitted through the plugin during the drain.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from agent.app.handover_on_stop import hand_over_if_last
from agent.errors import KubeApiError
from agent.policy.allocatable import is_zero, still_allocatable, zero_patch
from agent.policy.teardown import handing_over, template_mode
from tests.support.env import BOOK, SOCKET
from tests.support.harness import Node, running_node
from topology_devkit.kubelet_emulator import Container

NODE = "node-a"


def daemonset(mode: str | None, deleting: bool = False) -> dict[str, Any]:
    env = [{"name": "TOPOLOGY_AGENT_LEVELS", "value": "auto"}]
    if mode is not None:
        env.append({"name": "TOPOLOGY_AGENT_MODE", "value": mode})
    meta: dict[str, Any] = {"name": "topology-agent"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    return {"metadata": meta, "spec": {"template": {"spec": {"containers": [
        {"name": "init-looks-alike", "env": [{"name": "OTHER", "value": "x"}]},
        {"name": "agent", "env": env}]}}}}


def test_the_next_mode_is_read_from_the_daemonsets_template() -> None:
    assert template_mode(daemonset("dra")) == "dra"
    assert template_mode(daemonset(None)) == "deviceplugin"  # the chart before TOPOLOGY_AGENT_MODE: device plugin
    assert template_mode({"kind": "Status"}) is None and template_mode(None) is None
    assert handing_over(daemonset("dra"), "deviceplugin") == "its DaemonSet now runs dra mode"
    assert handing_over(daemonset("deviceplugin"), "dra") == "its DaemonSet now runs deviceplugin mode"
    assert handing_over(daemonset("deviceplugin"), "deviceplugin") is None  # a rolling update in the same mode
    assert handing_over(daemonset("deviceplugin", deleting=True), "deviceplugin") == \
        "the release is being uninstalled"
    assert handing_over({"kind": "Status"}, "deviceplugin") is None  # doubt: as for a restart


def test_quantities_and_the_patch() -> None:
    assert all(is_zero(q) for q in ("0", "0k", "0.0", "00", "0m"))
    assert not any(is_zero(q) for q in ("1", "10", "0.5", "", "2k"))
    assert still_allocatable({"topology/book": "2", "topology/socket": "0", "cpu": "8"},
                             ["topology/book", "topology/socket", "topology/drawer"]) == {"topology/book": "2"}
    assert zero_patch(["topology/socket", "topology/book"]) == {
        "status": {"allocatable": {"topology/book": "0", "topology/socket": "0"}}}


class ApiServer:
    """One Node's allocatable and the agent's DaemonSet; ``kubelet_writes_back`` replays kubelet's status sync (the
    device plugin's healthy count) after the agent's next patch."""

    def __init__(self, allocatable: Mapping[str, str], daemonset: dict[str, Any] | None = None) -> None:
        self.allocatable = dict(allocatable)
        self.daemonset = daemonset
        self.patches: list[dict[str, Any]] = []
        self.kubelet_writes_back: dict[str, str] = {}
        self.refuse_patch: str | None = None

    def get_daemonset(self, namespace: str, name: str, timeout: float) -> dict[str, Any] | None:
        return copy.deepcopy(self.daemonset)

    def node_allocatable(self, name: str, timeout: float) -> dict[str, str]:
        assert name == NODE
        return dict(self.allocatable)

    def patch_node_status(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        if self.refuse_patch:
            raise KubeApiError(403, self.refuse_patch)
        self.patches.append(copy.deepcopy(dict(body)))
        self.allocatable.update(body["status"]["allocatable"])

    def sync_kubelet(self) -> None:
        self.allocatable.update(self.kubelet_writes_back)
        self.kubelet_writes_back = {}


@pytest.fixture
def node() -> Iterator[Node]:
    with running_node(node_name=NODE) as n:
        yield n


def test_the_last_device_plugin_agent_withdraws_its_resources_while_it_still_serves(node: Node) -> None:
    k = node.kubelet
    api = ApiServer({"cpu": "8", BOOK: "8", SOCKET: "16"}, daemonset("dra"))
    api.kubelet_writes_back = {BOOK: "8", SOCKET: "16"}  # kubelet's status sync lands in the first drain
    admitted: list[str] = []

    def drain(seconds: float) -> None:
        """The drain: the scheduler bound a pod just before it saw the zero; kubelet admits it now."""
        assert seconds > 0
        pod = k.admit_pod("default", f"late-{len(admitted)}", [Container("c", {BOOK: 1})])
        admitted.append(pod.devices("c", BOOK)[0])
        api.sync_kubelet()

    why = hand_over_if_last(node.agent, lambda: api, namespace="ns", daemonset="topology-agent", sleep=drain)
    assert why == "its DaemonSet now runs dra mode"
    assert api.patches == [zero_patch([BOOK, SOCKET])] * 2  # written again after kubelet wrote its value back
    assert still_allocatable(api.allocatable, [BOOK, SOCKET]) == {} and api.allocatable["cpu"] == "8"
    assert len(admitted) == 2  # both pods bound before the zero were admitted: the plugin still served


@pytest.mark.parametrize("template", [daemonset("deviceplugin"), None], ids=["rolling-update", "doubt"])
def test_a_restart_in_the_same_mode_hands_nothing_over(node: Node, template: dict[str, Any] | None) -> None:
    api = ApiServer({BOOK: "8"}, template)

    def failing() -> ApiServer:
        raise KubeApiError(403, "daemonsets.apps is forbidden")

    factory = (lambda: api) if template is not None else failing
    assert hand_over_if_last(node.agent, factory, namespace="ns", daemonset="topology-agent",
                             sleep=lambda s: None) is None
    assert api.patches == []


def test_an_uninstall_withdraws_too_and_a_refused_patch_is_said(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    api = ApiServer({BOOK: "8", SOCKET: "16"}, daemonset("deviceplugin", deleting=True))
    api.refuse_patch = "nodes \"node-a\" is forbidden: cannot patch resource \"nodes/status\""
    slept: list[float] = []
    assert hand_over_if_last(node.agent, lambda: api, namespace="ns", daemonset="topology-agent",
                             sleep=slept.append) == "the release is being uninstalled"
    assert slept == [] and "cannot withdraw topology/book, topology/socket" in caplog.text


# --- the DRA side: Ready once the Node offers the names through DRA only ---------------------------------
@contextlib.contextmanager
def dra_manager_with(monkeypatch: pytest.MonkeyPatch, api: ApiServer) -> Iterator[Any]:
    """build_agent in DRA mode against stand-ins (no API server, no kubelet): its DraManager, serving."""
    import agent.app.build_dra as dra
    from agent.app.build import build_agent
    from agent.app.config import AgentConfig
    from agent.policy.grouping import GroupingSettings
    from agent.policy.resource_slices import DRIVER
    from agent.topology.embedded import load_embedded
    from tests.support.harness import short_tmpdir
    from tests.support.kubeapi import SliceApi

    monkeypatch.setattr(dra, "dra_api", SliceApi)
    monkeypatch.setattr(dra, "kube_api_from_environment", lambda: api)
    root = short_tmpdir()
    (root / "kubelet").mkdir()
    config = AgentConfig(kubelet_dir=root / "kubelet", grouping=GroupingSettings(levels=("book", "socket")),
                         mode="dra", node_name=NODE, pod_resources_socket=root / "none.sock",
                         pod_resources_interval=0, dra_registry_dir=root / "registry",
                         dra_plugin_dir=root / "plugins" / DRIVER, cdi_dir=root / "cdi",
                         cpu_manager_state=root / "none")
    manager: Any = build_agent(load_embedded("z16-lpar"), config).manager
    manager.plugin.start()
    manager.plugin._status(True, "")  # kubelet took the registration
    try:
        yield manager
    finally:
        manager.stop()


def test_a_dra_agent_is_ready_once_the_node_offers_its_names_through_dra_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = ApiServer({"cpu": "8", BOOK: "8"})  # the device plugin's value; kubelet has not synced since it went
    with dra_manager_with(monkeypatch, api) as manager:
        manager.step()
        assert api.patches == [zero_patch([BOOK])] and manager.ready()


def test_without_the_right_to_write_the_zero_it_waits_for_kubelets_status_sync(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = ApiServer({BOOK: "8", SOCKET: "0"})
    api.refuse_patch = "forbidden"
    with dra_manager_with(monkeypatch, api) as manager:
        manager.step()
        assert not manager.ready() and manager._pace() == 1.0  # looks again every second
        api.allocatable[BOOK] = "0"  # kubelet's status sync: the plugin is gone
        manager.step()
        assert manager.ready() and manager._pace() == manager.loop.interval
