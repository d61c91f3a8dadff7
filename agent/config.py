"""The agent's settings as plain values (no gRPC or Kubernetes imports here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True, slots=True)
class Timing:
    poll: float = 0.05  # how often kubelet's directory is looked at
    stream_grace: float = 5.0  # a registered resource with no open ListAndWatch for this long re-registers
    backoff_min: float = 0.05
    backoff_max: float = 2.0
    register_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class AgentConfig:
    kubelet_dir: Path
    grouping: GroupingSettings = field(default_factory=GroupingSettings)
    allocation: AllocationSettings = field(default_factory=AllocationSettings)
    pod_resources_socket: Path = Path(DEFAULT_POD_RESOURCES_SOCKET)
    timing: Timing = field(default_factory=Timing)
    rescan_interval: float = 5.0  # seconds between topology rescans; 0 disables
    pod_resources_interval: float = 2.0  # seconds between pod-resources List calls; 0 disables
    pending_timeout: float = 60.0  # an Allocate that List never shows is forgotten after this long
