"""What serves the node's devices to kubelet, as the running agent sees it: one face for both modes.

Device-plugin mode's :class:`agent.plugin.manager.PluginManager` (a gRPC server per resource, registered with
kubelet) and DRA mode's :class:`agent.dra.driver.DraManager` (the kubelet DRA plugin and the node's ResourceSlices)
both are a :class:`DeviceServer`; the composition root picks one, the agent uses only this face.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class DeviceServer(Protocol):
    @property
    def registrations(self) -> Mapping[str, int]:
        """Resource -> registrations with kubelet so far."""
        ...

    @property
    def registration_failures(self) -> int: ...

    @property
    def restarts(self) -> int:
        """kubelet restarts seen."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def ready(self) -> bool:
        """Registered, and kubelet (or the scheduler) can be handed devices through it now."""
        ...

    def alive(self) -> bool:
        """Its thread runs (or was never needed)."""
        ...

    def wait_registered(self, timeout: float) -> bool: ...

    def streams_open(self, resource: str) -> int: ...

    def seconds_since_registration(self, resource: str) -> float | None: ...
