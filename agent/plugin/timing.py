"""How patiently the plugin watches kubelet and registers (plain values: no gRPC import here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Timing:
    poll: float = 0.05  # how often kubelet's directory is looked at without inotify
    idle_poll: float = 5.0  # the safety poll when inotify wakes the agent on every change
    stream_grace: float = 5.0  # a registered resource with no open ListAndWatch for this long re-registers
    backoff_min: float = 0.05
    backoff_max: float = 2.0
    register_timeout: float = 10.0
    kubelet_missing_warning: float = 10.0  # seconds without kubelet.sock before a warning (repeated every 30x)
