"""The agent's settings as plain values (no gRPC or Kubernetes imports here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.app.paths import (
    DEFAULT_CDI_DIR,
    DEFAULT_DRA_PLUGIN_DIR,
    DEFAULT_DRA_REGISTRY_DIR,
    DEFAULT_NRI_SOCKET,
    DEFAULT_POD_RESOURCES_SOCKET,
)
from agent.plugin.timing import Timing
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings


@dataclass(frozen=True, slots=True)
class AgentConfig:
    kubelet_dir: Path
    grouping: GroupingSettings = field(default_factory=GroupingSettings)
    allocation: AllocationSettings = field(default_factory=AllocationSettings)
    pod_resources_socket: Path = Path(DEFAULT_POD_RESOURCES_SOCKET)
    timing: Timing = field(default_factory=Timing)
    rescan_interval: float = 5.0  # seconds between topology rescans; 0 disables
    full_rescan_every: int = 12  # every Nth rescan reads everything even when the fingerprint is unchanged
    pod_resources_interval: float = 2.0  # seconds between pod-resources List calls; 0 disables
    node_name: str | None = None  # from the downward API (NODE_NAME)
    node_labels: bool = False  # patch labels and an annotation onto the Node
    label_interval: float = 30.0  # seconds between label checks (no request unless something changed)
    cpu_manager_state: Path | None = None  # kubelet's cpu_manager_state, checked at start and on rescans
    kubelet_config: Path | None = None  # kubelet's config file, for reservedSystemCPUs
    metrics_port: int | None = None  # None: no HTTP endpoint; 0: any free port (tests)
    metrics_address: str = ""  # every address of both families (IPv6 socket accepting IPv4 too)
    allocations_pod_names: bool = False  # /allocations names the holders' namespace/pod/container
    cpuset_enforcement: str = "none"  # "cri": pin topology containers' cpusets through the container runtime;
    # "nri": at creation, as an NRI plugin; "auto": nri when its socket answers, else cri, else none
    nri_socket: Path = Path(DEFAULT_NRI_SOCKET)  # the runtime's NRI socket
    cri_socket: Path | None = None  # the runtime's CRI socket (None: the first usual one that exists at start)
    shared_pool: bool = False  # with enforcement: confine every other container to the CPUs no held group has
    stranded_policy: str = "evict"  # with enforcement: "evict" a stranded holder's pod (its groups' CPUs all offline,
    # every online CPU in other holders' groups) through the API server; "keep": leave it and only report it
    cpuset_interval: float = 2.0  # seconds between looks at the runtime (fast for a while after an Allocate)
    mode: str = "deviceplugin"  # "dra": ResourceSlices and a kubelet DRA plugin instead of the device-plugin API
    dra_registry_dir: Path = Path(DEFAULT_DRA_REGISTRY_DIR)  # kubelet's plugins_registry
    dra_plugin_dir: Path = Path(DEFAULT_DRA_PLUGIN_DIR)  # where dra.sock is served (the kubelet's path too)
    cdi_dir: Path = Path(DEFAULT_CDI_DIR)  # CDI spec files of prepared claims
    dra_interval: float = 60.0  # seconds between looks at the ResourceSlices (a List; writes only on change)
