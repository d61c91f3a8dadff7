"""DRA mode's part of the composition root (``--mode dra``): the API client, the claim preparer, the slice publisher,
the health service and the kubelet plugin, made into a :class:`agent.dra.driver.DraManager` over the device-plugin
mode's own discovery, grouping, planning, state and enforcement; and, in device-plugin mode with claims left prepared,
the DRA plugin kept for their unprepare only (:class:`agent.dra.unprepare_only.UnprepareOnly`).

Must hold: the checkpoint's claims hold their devices before anything is served, and a prepare or unprepare tells the
node's device table first, then every other listener (the cpuset enforcement among them).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from agent.app.config import AgentConfig
from agent.devices.table import NodeDevices
from agent.dra.driver import DraManager
from agent.dra.health_service import HealthService
from agent.dra.kubelet_plugin import KubeletPlugin
from agent.dra.prepare import ClaimPreparer, checkpoint_path
from agent.dra.publisher import DraApi, SlicePublisher
from agent.dra.served import ServedApi, check_served
from agent.dra.unprepare_only import UnprepareOnly
from agent.errors import NodeLabelerError, StartupError
from agent.node.kubeapi import kube_api_from_environment
from agent.node.resource_withdrawal import ExtendedResourcesClear
from agent.plugin.podresources import PodResourcesClient
from agent.plugin.servicer import Wire
from agent.policy.grouping import Group, Grouping
from agent.policy.keys import DeviceKey
from agent.policy.resource_slices import DRIVER, PoolPlan, SliceSettings, build_pool
from agent.topology.model import Topology

log = logging.getLogger("topology-agent.dra")

REFUSE_NEW = ("the agent on this node runs in device-plugin mode: its DRA plugin serves only the unprepare of the "
              "claims prepared before the switch")


def dra_api() -> DraApi:
    """The API server DRA mode speaks to: in a pod with its service account, else a kubeconfig."""
    try:
        return kube_api_from_environment()
    except NodeLabelerError as exc:
        raise StartupError(f"--mode dra needs the API server: {exc}") from None


def remove_node_slices(node_name: str) -> int:
    """Delete ``node_name``'s ResourceSlices of the DRA driver (the API server as DRA mode speaks to it: in a pod,
    its service account); the count deleted. ``serve`` hands it to the uninstall clean-up in DRA mode."""
    return SlicePublisher(dra_api(), node_name, DRIVER).remove_all()


def build_dra_manager(config: AgentConfig, topology: Topology, grouping: Grouping, devices: NodeDevices[Wire],
                      pod_resources: PodResourcesClient) -> DraManager:
    if not config.node_name:
        raise StartupError("--mode dra needs NODE_NAME (the chart sets it from spec.nodeName): the node's "
                           "ResourceSlices and pool are named after it")
    try:
        settings = SliceSettings(config.node_name).validated()
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    api = dra_api()
    if isinstance(api, ServedApi):  # the agent's client always is (a test's stand-in for the API server may not be)
        check_served(api)  # refuses an API server older than the slices the agent writes, in one line
    preparer = ClaimPreparer(driver=DRIVER, pool=settings.node_name, groups={g.id: g for g in grouping.groups},
                             allocation=config.allocation, read_claim=api.read_claim, cdi_dir=config.cdi_dir,
                             checkpoint=checkpoint_path(config.kubelet_dir), check=devices.claim_conflict)
    publisher = SlicePublisher(api, settings.node_name, DRIVER)

    def plan(broken: Mapping[DeviceKey, str], in_use: Mapping[DeviceKey, str]) -> PoolPlan:
        return build_pool(grouping, topology, settings, broken, in_use)

    def broken() -> dict[tuple[str, str], str]:
        with devices.lock:
            return dict(devices.broken)

    health = HealthService(pool=settings.node_name, devices=[d["name"] for d in plan({}, {}).devices], broken=broken)
    plugin = KubeletPlugin(driver=DRIVER, registry_dir=config.dra_registry_dir, plugin_dir=config.dra_plugin_dir,
                           preparer=preparer, health=health)

    # pod-resources lists DRA claims per container (build_agent set it up): admin access is observed, not held.
    pod_resources.dra_admin = preparer.admin_devices
    handover = ExtendedResourcesClear(kube_api_from_environment, settings.node_name, grouping.resources())
    manager = DraManager(plugin=plugin, publisher=publisher, plan=plan, broken=broken,
                         resources=grouping.resources(), interval=config.dra_interval,
                         in_use=devices.in_use_elsewhere, handover=handover)
    preparer.on_change = manager.claims_changed
    manager.on_claims_changed(lambda: devices.set_claims(preparer.holds()))  # first: the holds, then the others
    devices.set_claims(preparer.holds())  # the checkpoint's claims hold their devices before anything is served
    devices.add_listener(manager.changed)
    return manager


def build_unprepare_only(config: AgentConfig, groups: Sequence[Group]) -> UnprepareOnly:
    """Device-plugin mode with claims left in the DRA checkpoint: the DRA plugin for their unprepare only, over a
    preparer that refuses every claim it does not hold (``groups``: every group its claims may name); without API
    access it deletes no ResourceSlice (the DRA agent that handed over did)."""
    preparer = ClaimPreparer(driver=DRIVER, pool=config.node_name or "", groups={g.id: g for g in groups},
                             allocation=config.allocation, read_claim=_no_claim_read, cdi_dir=config.cdi_dir,
                             checkpoint=checkpoint_path(config.kubelet_dir))
    preparer.refuse_new = REFUSE_NEW
    slices = None
    if config.node_name:
        try:
            slices = SlicePublisher(dra_api(), config.node_name, DRIVER)
        except StartupError as exc:
            log.warning("not deleting this node's ResourceSlices: %s", exc, extra={"reason": str(exc)})
    plugin = KubeletPlugin(driver=DRIVER, registry_dir=config.dra_registry_dir, plugin_dir=config.dra_plugin_dir,
                           preparer=preparer)
    leftover = UnprepareOnly(plugin=plugin, slices=slices)
    preparer.on_change = leftover.changed
    return leftover


def _no_claim_read(namespace: str, name: str) -> dict[str, object]:
    raise StartupError(f"claim {namespace}/{name}: device-plugin mode reads no claim")  # refused before reading
