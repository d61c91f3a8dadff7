"""What the running agent reports about itself: one frozen value, built by the agent on demand and
read by the metrics collector (which never reaches into the agent's parts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ResourceStatus:
    resource: str
    registrations: int = 0  # successful registrations with kubelet
    streams: int = 0  # open ListAndWatch streams
    seconds_since_registration: float | None = None  # monotonic; None before the first registration
    states: Mapping[str, int] = field(default_factory=dict)  # device state -> number of devices


@dataclass(frozen=True, slots=True)
class EnforcementStatus:
    refused: bool  # kubelet runs the static CPU manager policy
    failing: bool  # the runtime does not answer or refuses updates
    topology_containers: int  # running containers holding topology devices
    pinned: int  # of those, on their groups' CPUs
    updates: Mapping[tuple[str, str], int]  # (topology|shrink|widen|offline, ok|error) -> count
    pool_cpus: int  # CPUs of the shared pool (every online CPU without --shared-pool)
    pool_empty: bool  # the pool would be empty: nobody is shrunk
    steps: int = 0  # looks at the runtime so far
    container_refusals: int = 0  # calls the runtime refused for one container (the others went on)
    refusing: int = 0  # containers whose last call the runtime refused
    offline: int = 0  # holders whose groups' CPUs are all offline (on the shared pool)
    stranded: int = 0  # of those, the ones no CPU is left for
    creations_refused: int = 0  # NRI: creations refused (empty pool, stranded holder)
    overridden: int = 0  # NRI: containers the re-check found on another cpuset than the agent knew
    evictions: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (reason, result) -> eviction calls
    evictions_pending: int = 0  # pods the plan names for eviction that the API server has not accepted yet


@dataclass(frozen=True, slots=True)
class AgentStatus:
    machine: str  # generation, machine type or architecture
    fidelity: str
    dispatching: str
    smt: int
    groups: tuple[tuple[str, str, int], ...]  # (resource, device id, CPUs)
    resources: tuple[ResourceStatus, ...]
    ready: bool
    exclusivity_confirmed: bool = True  # pod-resources' last answer is current (or it is off)
    pending_holds: int = 0  # devices handed out that pod-resources has not shown yet
    kubelet_restarts: int = 0
    registration_failures: int = 0
    memory_node_fallbacks: int = 0
    rescans: int = 0
    rescan_failures: int = 0
    topology_changes: int = 0
    pod_resources_polls: int = 0
    pod_resources_failures: int = 0
    label_patches: int = 0
    label_failures: int = 0
    cpu_manager_static: bool = False
    cpu_manager_findings: int = 0
    log_records_dropped: int = 0
    enforcement: EnforcementStatus | None = None  # None: --cpuset-enforcement none
    enforcement_mode: str = "none"  # the cpuset enforcement in force: none | cri | nri
    uniform: tuple[tuple[str, int, int], ...] = ()  # --uniform-groups: (resource, CPUs advertised, groups left out)
    dra_unprepare_only: bool = False  # device-plugin mode serves the DRA plugin for claims prepared in DRA mode
    dra_claims_to_unprepare: int = 0  # of those claims, the ones not unprepared yet
