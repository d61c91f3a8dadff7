"""DRA mode's part of the composition root (:func:`agent.app.build.build_agent` calls it for ``--mode dra``)."""

from __future__ import annotations

from collections.abc import Mapping

from agent.app.config import AgentConfig
from agent.devices.table import NodeDevices
from agent.dra.kubelet_plugin import KubeletPlugin
from agent.dra.manager import DraManager
from agent.dra.prepare import ClaimPreparer
from agent.dra.publisher import SlicePublisher
from agent.errors import StartupError
from agent.plugin.podresources import PodResourcesClient
from agent.plugin.servicer import Wire
from agent.policy.dra import DRIVER, PoolPlan, SliceSettings, build_pool
from agent.policy.grouping import Grouping
from agent.topology.model import Topology

STATE_SUBDIR = "s390x-topology-agent/dra"
CHECKPOINT = "claims.json"


def build_dra_manager(config: AgentConfig, topology: Topology, grouping: Grouping, devices: NodeDevices[Wire],
                      pod_resources: PodResourcesClient) -> DraManager:
    if not config.node_name:
        raise StartupError("--mode dra needs NODE_NAME (the chart sets it from spec.nodeName): the node's "
                           "ResourceSlices and pool are named after it")
    try:
        settings = SliceSettings(config.node_name).validated()
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    from agent.dra.kubeclient import KubernetesDraApi

    api = KubernetesDraApi()
    preparer = ClaimPreparer(driver=DRIVER, pool=settings.node_name, groups={g.id: g for g in grouping.groups},
                             allocation=config.allocation, read_claim=api.read_claim, cdi_dir=config.cdi_dir,
                             checkpoint=config.kubelet_dir / STATE_SUBDIR / CHECKPOINT)
    plugin = KubeletPlugin(driver=DRIVER, registry_dir=config.dra_registry_dir, plugin_dir=config.dra_plugin_dir,
                           preparer=preparer)
    publisher = SlicePublisher(api, settings.node_name, DRIVER)

    def plan(broken: Mapping[tuple[str, str], str]) -> PoolPlan:
        return build_pool(grouping, topology, settings, broken)

    def broken() -> dict[tuple[str, str], str]:
        with devices.lock:
            return dict(devices.broken)

    # pod-resources lists DRA claims per container: the holds (and the cpuset enforcement) come from there.
    pod_resources.dra_driver = DRIVER
    pod_resources.dra_devices = {g.id: g.resource for g in grouping.groups}
    manager = DraManager(plugin=plugin, publisher=publisher, plan=plan, broken=broken,
                         resources=grouping.resources(), interval=config.dra_interval)
    devices.add_listener(manager.changed)
    return manager
