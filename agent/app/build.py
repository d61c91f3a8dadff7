"""The composition root: every bit of start-up I/O, then finished parts handed to :class:`Agent`; nothing is served
or registered here. :func:`build_agent` runs its named steps in order (the groups to advertise, the device table
with the holds known before serving, what serves the devices to kubelet, the node reporter, the holders before
serving, the cpuset enforcement).

Must hold: holds of both modes count in either (pod-resources' claim rows are read in device-plugin mode too, a DRA
agent's checkpoint holds its claims' devices there until pod-resources shows or drops them, and DRA mode restores
the saved device-plugin holds), so a switch of modes, either way, hands out nothing the other mode holds, from the
first ListAndWatch or the first slice publication on (docs/contributing/design/holds.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agent.app.agent import Agent, LatestTopology, exclusivity_confirmed
from agent.app.config import AgentConfig
from agent.app.paths import CRI_SOCKETS
from agent.cri.client import CriClient
from agent.devices.persist import StateFiles
from agent.devices.serving import DeviceServer
from agent.devices.table import NodeDevices
from agent.dra.prepare import (
    PreparedClaim,
    admin_devices,
    checkpoint_path,
    claim_holds,
    forget_claims,
    read_checkpoint,
)
from agent.enforce.auto_switch import AutoEnforcement
from agent.enforce.cri_loop import CpusetEnforcement
from agent.enforce.engine import EnforcementCounters, EnforcementEngine
from agent.enforce.engine_choice import choose_enforcement, cri_socket_of
from agent.enforce.nri_hooks import NriEnforcement
from agent.errors import PodResourcesError
from agent.node.reporter import LabelerFactory, NodeReporter, default_labeler
from agent.observe.http import HttpEndpoint
from agent.observe.metrics import AgentMetrics
from agent.plugin.manager import PluginManager
from agent.plugin.podresources import PodResourcesClient
from agent.plugin.servicer import Wire, render
from agent.policy.device_states import shadow_groups
from agent.policy.grouping import Group, Grouping, group_topology
from agent.policy.keys import DeviceKey
from agent.policy.ledger import SavedHolds
from agent.policy.resource_slices import DRIVER
from agent.topology.model import Topology

if TYPE_CHECKING:  # made only in the steps that need them (DRA mode, claims left by it, --stranded-policy evict)
    from agent.dra.driver import DraManager
    from agent.dra.unprepare_only import UnprepareOnly
    from agent.enforce.evictions import Evictions

log = logging.getLogger("topology-agent")

FIRST_SYNC_PATIENCE = 5.0  # seconds to wait for pod-resources before serving after a (re)start
FIRST_SYNC_RETRY = 0.5


def choose_grouping(fresh: Grouping, files: StateFiles, pod_resources: PodResourcesClient,
                    topology: Topology, claims: Mapping[str, PreparedClaim] | None = None) -> Grouping:
    """The groups advertised before a restart while anything holds any of them (their ids and CPU sets
    must not change under running pods), else the groups found now. Holders, of either mode: pod-resources'
    device rows and claim rows, the saved holds, the prepared DRA claims (``claims``, the checkpoint). Saves the
    choice."""
    saved = files.load_groups(c.cpu for c in topology.cpus)
    chosen = fresh
    if saved is not None and saved.groups != fresh.groups:
        ids = {g.id: g.resource for g in saved.groups}
        keys = {(resource, device) for device, resource in ids.items()}
        pod_resources.dra_devices = ids
        held = set(files.load_holds(keys).keys) | set(claim_holds(claims or {}, {g.id: g for g in saved.groups}))
        try:
            held |= {(row.resource, d) for row in pod_resources.list() for d in row.device_ids
                     if (row.resource, d) in keys}
            why = f"{len(held)} of them held" if held else ""
        except PodResourcesError as exc:
            why = f"holders unknown ({exc})"
        if why:
            log.warning("keeping the %d groups advertised before the restart (%s); the topology found now differs "
                        "and applies once they are free and the agent restarts", len(saved.groups), why,
                        extra={"reason": why})
            chosen = saved
    files.save_groups(chosen)
    return chosen


class ReleasedClaims:
    """Device-plugin mode: the claims a DRA agent left prepared that hold nothing any more (no pending hold, no
    container listed) are forgotten in the checkpoint, with their CDI files, so that the next agent does not hold
    their devices again while kubelet's List settles after a restart (a NodeDevices listener; also run after the
    first List)."""

    def __init__(self, devices: NodeDevices[Wire], path: Path, claims: Mapping[str, PreparedClaim],
                 groups: Sequence[Group], cdi_dir: Path,
                 forget: Callable[[list[str]], list[str]] | None = None) -> None:
        self.devices = devices
        self.path = path
        self.cdi_dir = cdi_dir  # the forgotten claims' CDI files go with them
        # the checkpoint's owner when the DRA plugin serves their unprepare (its preparer), else the file itself
        self.forget = forget or (lambda uids: forget_claims(self.path, uids, self.cdi_dir))
        by_id = {g.id: g for g in groups}
        self.holding = {uid: set(keys) for uid in claims if (keys := claim_holds({uid: claims[uid]}, by_id))}

    def __call__(self) -> None:
        if not self.holding:
            return
        with self.devices.lock:
            ledger = self.devices.ledger
            still = set(ledger.pending_claims) | set(ledger.listed)
        released = [uid for uid, keys in self.holding.items() if not keys & still]
        for uid in self.forget(released) if released else ():
            self.holding.pop(uid, None)


def first_pod_resources_sync(devices: NodeDevices[Wire], pod_resources: PodResourcesClient,
                             config: AgentConfig) -> bool:
    """Read the holders before serving; kubelet may be restarting too, so retry for a few seconds
    when its socket is there but does not answer (without the socket: go on)."""
    deadline = time.monotonic() + FIRST_SYNC_PATIENCE
    while True:
        started = time.monotonic()
        try:
            devices.apply_list(pod_resources.list(), started)
            return True
        except PodResourcesError as exc:
            devices.list_failed(exc)
            if not config.pod_resources_socket.exists() or time.monotonic() >= deadline:
                log.warning("serving without knowing which groups pods hold (%s); the pod-resources loop keeps "
                            "trying", exc, extra={"reason": str(exc)})
                return False
        time.sleep(FIRST_SYNC_RETRY)


def socket_age(path: Path) -> float | None:
    """Seconds since ``path`` was created (a socket's mtime is its bind), or None without it."""
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except OSError:
        return None


def advertised_groups(topology: Topology, config: AgentConfig, files: StateFiles, pod_resources: PodResourcesClient,
                      claims: Mapping[str, PreparedClaim]) -> tuple[Grouping, tuple[Group, ...]]:
    """Step 1: the groups to advertise (:func:`choose_grouping`) and the ``shadow`` groups, those of every level not
    advertised (another level, too small), which the other mode or an earlier choice may hold all the same.
    pod-resources is told every id of either, so that its rows of both are read as holds."""
    grouping = choose_grouping(group_topology(topology, config.grouping), files, pod_resources, topology, claims)
    shadow = shadow_groups(grouping, topology, config.grouping)
    pod_resources.dra_devices = {g.id: g.resource for g in (*grouping.groups, *shadow)}
    return grouping, shadow


def device_table(topology: Topology, config: AgentConfig, grouping: Grouping, shadow: Sequence[Group],
                 files: StateFiles, pod_resources: PodResourcesClient, claims: Mapping[str, PreparedClaim],
                 leftover: UnprepareOnly | None = None) -> tuple[NodeDevices[Wire], list[Callable[[], None]]]:
    """Step 2: the node's device table with every hold known before serving: the saved holds (of an earlier instance)
    and, in device-plugin mode, the claims a DRA agent left prepared; and the steps to run after the first List
    (the prepared claims that hold nothing any more are then forgotten, through ``leftover``'s preparer when the DRA
    plugin serves their unprepare)."""
    machine = topology.machine
    every = (*grouping.groups, *shadow)
    devices = NodeDevices(grouping, config.grouping, config.allocation, render,
                          numa_topology=machine.has_node_dirs and len(machine.memory_nodes) > 1, store=files,
                          mode=config.mode, shadow=shadow)
    holds = files.load_holds((g.resource, g.id) for g in every)
    after_first_sync: list[Callable[[], None]] = []
    if config.pod_resources_interval <= 0:
        if any(devices.overlap.values()):
            log.warning("pod-resources is off (--pod-resources-interval 0): the agent cannot learn when a pod ends, "
                        "so a device handed out keeps its overlapping devices blocked until the agent restarts")
        holds = SavedHolds(frozenset(), {})  # nothing could ever confirm or release them
    if holds.keys:
        log.warning("keeping %d device(s) an earlier instance held until pod-resources shows or drops them: %s",
                    len(holds.keys), ", ".join(f"{r} {d}" for r, d in sorted(holds.keys)))
        devices.restore_holds(holds)
    if config.mode != "dra" and claims and config.pod_resources_interval > 0:
        # A DRA agent ran here: its prepared claims hold their devices until pod-resources shows or drops them
        # (no unprepare comes while no DRA plugin runs). In DRA mode the preparer holds them until unprepared.
        held = claim_holds(claims, {g.id: g for g in every})
        if held:
            log.warning("keeping %d device(s) that DRA claims hold (prepared by the agent in DRA mode) until "
                        "pod-resources shows or drops them: %s", len(held),
                        ", ".join(f"{r} {d}" for r, d in sorted(held)))
            devices.restore_claims(held)
            forget = ReleasedClaims(devices, checkpoint_path(config.kubelet_dir), claims, every, config.cdi_dir,
                                    leftover.preparer.forget if leftover is not None else None)
            devices.add_listener(forget)
            after_first_sync.append(forget)
        pod_resources.dra_admin = (leftover.preparer.admin_devices if leftover is not None
                                   else lambda: admin_devices(claims))
    return devices, after_first_sync


def device_server(config: AgentConfig, topology: Topology, grouping: Grouping, devices: NodeDevices[Wire],
                  pod_resources: PodResourcesClient,
                  metrics: AgentMetrics) -> tuple[DeviceServer, DraManager | None]:
    """Step 3: what serves the devices to kubelet, made but not started: the plugin manager, or in DRA mode the DRA
    driver (returned a second time, for the enforcement's wiring). A kubelet younger than the ledger's settling time
    (the node rebooted, or kubelet restarted with the agent) counts as just restarted: its first List is not news."""
    manager: DeviceServer
    dra = None
    if config.mode == "dra":  # the second adapter: ResourceSlices and a kubelet DRA plugin (agent/dra)
        from agent.app.build_dra import build_dra_manager

        manager = dra = build_dra_manager(config, topology, grouping, devices, pod_resources)
    else:
        manager = PluginManager(config.kubelet_dir, devices.tables, metrics, config.timing,
                                on_kubelet_restart=devices.kubelet_restarted)
    kubelet_age = socket_age(config.kubelet_dir / "kubelet.sock")
    if kubelet_age is not None and kubelet_age < devices.ledger.restart_settle:
        devices.kubelet_restarted(kubelet_age)
    return manager, dra


def node_reporter(topology: Topology, grouping: Grouping, config: AgentConfig, devices: NodeDevices[Wire],
                  labeler_factory: LabelerFactory) -> NodeReporter:
    """Step 4: the node reporter (labels, annotation, Events), with kubelet's CPU manager state read once."""
    reporter = NodeReporter(topology, grouping, node_name=config.node_name, labels_enabled=config.node_labels,
                            cpu_manager_state=config.cpu_manager_state, kubelet_config=config.kubelet_config,
                            labeler_factory=labeler_factory,
                            exclusivity=lambda: exclusivity_confirmed(config, devices))
    reporter.check_cpu_manager()
    return reporter


def holders_before_serving(topology: Topology, config: AgentConfig, devices: NodeDevices[Wire],
                           pod_resources: PodResourcesClient, after_first_sync: Sequence[Callable[[], None]]) -> None:
    """Step 5: know what is in use, and what is whole, before serving: a restarted agent must not hand out held
    groups, nor groups (kept from before the restart) that lost CPUs meanwhile."""
    devices.apply_topology(topology)
    if config.pod_resources_interval > 0:
        first_pod_resources_sync(devices, pod_resources, config)
    for step in after_first_sync:
        step()


def cpuset_enforcement(config: AgentConfig, devices: NodeDevices[Wire], groups: Mapping[DeviceKey, Group],
                       latest: LatestTopology, reporter: NodeReporter, metrics: AgentMetrics,
                       dra: DraManager | None) -> tuple[EnforcementEngine | None, str, Evictions | None]:
    """Step 6: the cpuset enforcement engine (none, cri, nri or auto, chosen once here; auto may switch later), the
    mode in force, and the evictions of stranded holders' pods (``--stranded-policy evict``). Made, not started;
    nothing to enforce on a node that advertises nothing. In DRA mode a prepare wakes the NRI hooks (a hold)."""
    enforcement: EnforcementEngine | None = None
    mode = "none"
    cri_socket = cri_socket_of(config.cri_socket, CRI_SOCKETS)
    if config.cpuset_enforcement != "none" and devices.tables:
        mode, why = choose_enforcement(config.cpuset_enforcement, config.nri_socket, cri_socket)
        if mode == "none":
            log.warning("cpuset enforcement off (%s): containers run wherever kubelet puts them; devices are still "
                        "served", why, extra={"reason": why})
    evictions = None
    if config.cpuset_enforcement != "none" and devices.tables and config.stranded_policy == "evict":
        from agent.enforce.evictions import Evictions
        from agent.node.kubeapi import kube_api_from_environment

        evictions = Evictions(kube_api_from_environment)  # no API client, no thread, before a pod is to be evicted
    evict = evictions.want if evictions is not None else None

    def make_nri(counters: EnforcementCounters | None = None) -> NriEnforcement:
        nri = NriEnforcement(
            devices, groups, config.allocation.annotation_domain, online=latest.online,
            reserved=config.grouping.reserved_cpus, shared_pool=config.shared_pool,
            cpu_manager_policy=lambda: reporter.cpu_manager_policy, socket_path=config.nri_socket,
            observe_pinned=metrics.pin_latency.observe,
            claims=dra.prepared_requests if dra is not None else None,  # DRA: the claim its CDI env names
            notify=reporter.warn, counters=counters, evict=evict,
            verifier=CriClient(cri_socket) if cri_socket.exists() else None)  # reads back what the runtime applied
        log.info("enforcing topology cpusets at creation as an NRI plugin on %s%s", config.nri_socket,
                 " with a shared pool for every other container" if config.shared_pool else "")
        return nri

    def make_cri(counters: EnforcementCounters | None = None) -> CpusetEnforcement:
        cri = CpusetEnforcement(
            CriClient(cri_socket), devices, groups, config.allocation.annotation_domain, online=latest.online,
            reserved=config.grouping.reserved_cpus, shared_pool=config.shared_pool,
            cpu_manager_policy=lambda: reporter.cpu_manager_policy, interval=config.cpuset_interval,
            observe_pinned=metrics.pin_latency.observe, notify=reporter.warn, evict=evict, counters=counters)
        log.info("enforcing topology cpusets through the CRI socket %s%s", cri_socket,
                 " with a shared pool for every other container" if config.shared_pool else "")
        return cri

    if config.cpuset_enforcement == "auto" and devices.tables:
        from agent.nri.probe import socket_answers

        enforcement = AutoEnforcement(mode, make_nri=make_nri, make_cri=make_cri, nri_socket=config.nri_socket,
                                      cri_socket=cri_socket, nri_answers=socket_answers)
    elif mode == "nri":
        enforcement = make_nri()
    elif mode == "cri":
        enforcement = make_cri()
    if enforcement is not None:
        devices.enforced = enforcement.enforced
        if dra is not None and not isinstance(enforcement, CpusetEnforcement):
            dra.on_claims_changed(enforcement.changed)  # NRI (or auto, which may be NRI): a prepare is a hold
    return enforcement, mode, evictions


def build_agent(topology: Topology, config: AgentConfig, *, loader: Callable[[], Topology] | None = None,
                fingerprint: Callable[[], object] | None = None,
                labeler_factory: LabelerFactory = default_labeler) -> Agent:
    """The agent for ``topology`` and ``config``, every part made and its start-up I/O done, nothing served,
    registered or started (:meth:`Agent.start` does that). ``loader`` reads the topology again (rescans; None: no
    rescans), ``fingerprint`` cheaply tells whether it may have changed; ``labeler_factory`` makes the Node's
    labeler (tests hand in their own). The steps run in the order below: each needs what the ones before made."""
    first_fingerprint = fingerprint() if fingerprint is not None else None
    pod_resources = PodResourcesClient(config.pod_resources_socket)
    pod_resources.dra_driver = DRIVER  # claim rows are holds in either mode
    files = StateFiles(config.kubelet_dir, config.grouping)
    files.refuse_newer()  # a file of a newer format stops the agent before anything is written
    claims = read_checkpoint(checkpoint_path(config.kubelet_dir))  # DRA mode's prepared claims (the preparer's own)
    grouping, shadow = advertised_groups(topology, config, files, pod_resources, claims)
    leftover = None
    if config.mode != "dra" and claims:  # a DRA agent ran here: kubelet needs its plugin to unprepare them
        from agent.app.build_dra import build_unprepare_only

        leftover = build_unprepare_only(config, (*grouping.groups, *shadow))
    devices, after_first_sync = device_table(topology, config, grouping, shadow, files, pod_resources, claims,
                                             leftover)
    metrics = AgentMetrics()
    metrics.prepare(grouping.resources())
    manager, dra = device_server(config, topology, grouping, devices, pod_resources, metrics)
    reporter = node_reporter(topology, grouping, config, devices, labeler_factory)
    if devices.tables:
        holders_before_serving(topology, config, devices, pod_resources, after_first_sync)
    http = HttpEndpoint(config.metrics_address, config.metrics_port) if config.metrics_port is not None else None
    latest = LatestTopology(topology)
    groups = {(g.resource, g.id): g for g in (*grouping.groups, *shadow)}
    enforcement, mode, evictions = cpuset_enforcement(config, devices, groups, latest, reporter, metrics, dra)
    return Agent(topology=topology, config=config, grouping=grouping, devices=devices, manager=manager,
                 pod_resources=pod_resources, reporter=reporter, metrics=metrics, http=http, loader=loader,
                 fingerprint=fingerprint, first_fingerprint=first_fingerprint, latest=latest,
                 enforcement=enforcement, enforcement_mode=mode, evictions=evictions, dra_unprepare_only=leftover)
