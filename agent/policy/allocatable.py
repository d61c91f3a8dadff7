"""Handing a node's extended resources from one mode to the other without a failed pod. Pure.

The scheduler takes the device-plugin path for a resource while the Node's allocatable of it is non-zero and DRA's
once it is zero, but kubelet writes that zero only at its next status sync while it refuses an Allocate the moment
the plugin is gone. So the agent that hands over writes the zero itself before its device plugin stops, and a DRA
agent writes it at its start too. These are the quantities and the patch.

Must hold: only a quantity that reads as zero (``0``, ``0k``, ``0.0``) counts as withdrawn; the patch touches the
allocatable only (capacity stays, as kubelet keeps it). The upstream code this follows:
docs/contributing/design/mode-handover.md."""

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
