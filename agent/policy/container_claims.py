"""Which of the agent's prepared DRA claims a container holds, from the variable its CDI device put into its
environment (``TOPOLOGY_DRA_CLAIM=<claim uid>/<request>``, written by :mod:`agent.dra.prepare`). Pure.

The runtime applies a CDI device's edits to the OCI spec before NRI's CreateContainer sees the container, and a CDI
env entry replaces the last one of the same name, so the last entry of that name is the one that counts.

Must hold: the variable is believed only for a claim this agent prepared and a pod in the claim's namespace (the trust
boundary the API itself draws); anything else is ignored and the container treated as any other. The containerd and
CDI code this follows: docs/contributing/design/dra-claims.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.policy.keys import DeviceKey, Identity

CLAIM_ENV = "TOPOLOGY_DRA_CLAIM"
ADMIN_ENV = "TOPOLOGY_ADMIN_ACCESS"  # set (``true``) instead of CLAIM_ENV for a request allocated with admin access


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One request of a claim the agent prepared: whose it is, and the devices allocated to it."""

    namespace: str
    claim: str  # the claim's name (for messages)
    devices: tuple[DeviceKey, ...]


@dataclass(frozen=True, slots=True)
class ClaimMatch:
    value: str  # what the variable said ("": no such variable)
    devices: tuple[DeviceKey, ...] = ()  # the request's devices when believed, else ()
    refused: str = ""  # why it is not believed ("" when believed or absent)


def claim_value(uid: str, request: str) -> str:
    """The variable's value for one request of a claim."""
    return f"{uid}/{request}"


def named_claim(env: Iterable[str]) -> str:
    """The value of the last ``TOPOLOGY_DRA_CLAIM`` entry of an OCI environment ("" without one)."""
    prefix = f"{CLAIM_ENV}="
    value = ""
    for entry in env:
        if entry.startswith(prefix):
            value = entry[len(prefix):]
    return value


def match_claim(env: Iterable[str], namespace: str, prepared: Mapping[str, PreparedRequest]) -> ClaimMatch:
    """The devices a container's environment names, if the claim is one the agent prepared, in its namespace."""
    return believe(named_claim(env), namespace, prepared)


def believe(value: str, namespace: str, prepared: Mapping[str, PreparedRequest]) -> ClaimMatch:
    """The devices a variable's ``value`` names for a pod of ``namespace``, if the claim is one the agent prepared
    (``prepared`` as it is now) in that namespace."""
    if not value:
        return ClaimMatch("")
    request = prepared.get(value)
    if request is None:
        return ClaimMatch(value, refused="not a claim request this agent prepared")
    if request.namespace != namespace:
        return ClaimMatch(value, refused=f"claim {request.namespace}/{request.claim} is not of the pod's namespace "
                                         f"{namespace or '(none)'}")
    if not request.devices:
        return ClaimMatch(value, refused=f"claim {request.namespace}/{request.claim} has none of this node's groups")
    return ClaimMatch(value, request.devices)


def with_claims(holders: Mapping[Identity, Iterable[DeviceKey]],
                claimed: Mapping[Identity, Iterable[DeviceKey]]) -> dict[Identity, tuple[DeviceKey, ...]]:
    """The holders as pod-resources lists them, plus the containers whose believed claim names their devices
    (pod-resources may not list a new container yet); where pod-resources lists a container, its listing wins."""
    merged = {identity: tuple(keys) for identity, keys in holders.items()}
    for identity, keys in claimed.items():
        if not merged.get(identity):
            merged[identity] = tuple(keys)
    return merged


def claimed_devices(named: Iterable[tuple[Identity, str]],
                    prepared: Mapping[str, PreparedRequest]) -> dict[Identity, tuple[DeviceKey, ...]]:
    """The believed devices of containers by identity, from the variable each one's environment names (``named``:
    (namespace, pod, container) and value), against the claims prepared now: a claim unprepared since is no hold."""
    out: dict[Identity, tuple[DeviceKey, ...]] = {}
    for identity, value in named:
        devices = believe(value, identity[0], prepared).devices
        if devices:
            out[identity] = devices
    return out


def prepared_keys(prepared: Mapping[str, PreparedRequest]) -> frozenset[DeviceKey]:
    """Every device of every prepared claim: allocated by the scheduler, so held whether or not pod-resources
    lists a container holding it yet (as a device Allocate handed out is)."""
    return frozenset(key for request in prepared.values() for key in request.devices)
