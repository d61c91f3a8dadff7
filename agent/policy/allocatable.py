"""Handing a node's extended resources from one mode to the other without a failed pod (issue 30). Pure.

The scheduler takes the device-plugin path for ``topology/book: 1`` while the Node's allocatable has a non-zero
``topology/book``, and the DRA path (the DeviceClass's ``extendedResourceName``) once it is zero or absent
(kubernetes ``pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go``
``filterExtendedResources``: ``isBackedByDRA && allocatable == 0``). kubelet derives that allocatable from the
device plugin's healthy devices (``pkg/kubelet/cm/devicemanager/manager.go`` ``GetCapacity``) but writes it to the
Node only at its next status sync (``nodeStatusUpdateFrequency``, 10 s by default), while its device manager refuses
an Allocate the moment the plugin is gone (``devicesToAllocate``: "no healthy devices present; cannot allocate
unhealthy devices"): a pod bound in between fails admission (``UnexpectedAdmissionError``) instead of waiting.

So the agent that hands the node over takes its resources' allocatable to zero itself before its device plugin
stops (the value kubelet writes once it is gone), keeps serving while pods bound before the scheduler saw the zero
are admitted, and a DRA agent writes the zero at its start too (an agent of an older release stops without it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

_ZERO = re.compile(r"^[+]?0*(\.0*)?([a-zA-Z]{0,2}|[eE][+-]?\d+)?$")


def is_zero(quantity: object) -> bool:
    """Whether a Kubernetes quantity string is zero (``0``, ``0k``, ``0.0``)."""
    text = str(quantity).strip()
    return bool(text) and bool(_ZERO.match(text)) and any(ch == "0" for ch in text)


def still_allocatable(allocatable: Mapping[str, Any], resources: Iterable[str]) -> dict[str, str]:
    """The ``resources`` the Node's allocatable still offers (a non-zero quantity)."""
    return {r: str(allocatable[r]) for r in resources if r in allocatable and not is_zero(allocatable[r])}


def zero_patch(resources: Iterable[str]) -> dict[str, Any]:
    """The JSON merge patch of a Node's status that takes ``resources`` to zero allocatable (capacity untouched,
    as kubelet keeps it for its grace period after a plugin ends)."""
    return {"status": {"allocatable": {r: "0" for r in sorted(resources)}}}
