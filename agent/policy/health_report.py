"""What DRA mode tells the kubelet about its devices' health (``DRAResourceHealth``, KEP-4680). Pure.

Every published device of the pool is in every report (the proto: "a complete list for the driver"; a device left
out reads as Unknown to kubelet once its timeout passes): ``UNHEALTHY`` with the reason when its group is no longer
whole (CPUs offline, moved: the device table's broken groups, the same that taint the device in its ResourceSlice),
``HEALTHY`` otherwise. kubelet shows it in the status of the pods whose claims hold the device
(``containerStatuses[].allocatedResourcesStatus``, the message with ``ResourceHealthStatusMessage``); it stops
nothing, the device taint is what keeps new pods off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_MESSAGE = 1024  # k8s.io/api core/v1 ResourceHealthMessageMaxLength: kubelet truncates longer ones
HEALTH_TIMEOUT = 30  # seconds: health_check_timeout_seconds, kubelet's own default (healthinfo.go)
RESEND = 10.0  # seconds between full reports when nothing changes: kubelet reads a report older than the timeout
#                as Unknown (healthInfoCache.getHealthInfo), so a report must come well inside it


@dataclass(frozen=True, slots=True)
class DeviceReport:
    device: str  # the device's name in the ResourceSlice (the group id)
    healthy: bool
    message: str = ""


def _message(reason: str) -> str:
    text = f"not whole: {reason}"
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def health_report(devices: Iterable[str], broken: Mapping[tuple[str, str], str]) -> tuple[DeviceReport, ...]:
    """One report for ``devices`` (published device names, in publication order); ``broken`` maps
    ``(resource, device id)`` to why the group is no longer whole (a device's name is its group's id)."""
    why = {device: reason for (_, device), reason in broken.items()}
    return tuple(DeviceReport(d, False, _message(why[d])) if d in why else DeviceReport(d, True)
                 for d in devices)


def unhealthy(report: Iterable[DeviceReport]) -> list[str]:
    return [r.device for r in report if not r.healthy]
