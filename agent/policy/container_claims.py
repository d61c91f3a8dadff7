"""Which of the agent's prepared DRA claims a container holds, from the variable its CDI device put into its
environment (``TOPOLOGY_DRA_CLAIM=<claim uid>/<request>``, written by :mod:`agent.dra.prepare`). Pure.

In DRA mode there is no Allocate answer to put group ids into a container's annotations; what reaches the
runtime is the CDI device, and the runtime applies its edits to the OCI spec before NRI's CreateContainer sees the
container. In containerd 2.4.2: ``internal/cri/server/container_create_linux.go`` ``containerSpecOpts`` ends
with ``customopts.WithCDI(config.Annotations, config.CDIDevices)``, which ``platformSpecOpts``
(``internal/cri/server/container_create.go``) returns among its options; ``createContainer`` there passes them to
``containerd.WithSpec`` and appends ``c.nri.WithContainerAdjustment()`` after it;
``internal/cri/nri/nri_api_linux.go`` ``WithContainerAdjustment`` unmarshals the generated spec and calls NRI's
CreateContainer with it, and ``criContainer.GetEnv`` is that spec's ``Process.Env``. A CDI env entry replaces the
last entry of the same name the container set itself (container-device-interface v1.1.1
``internal/ociedit/spec_editor.go`` ``addEnv``), so the last entry of that name is the one that counts.

Anyone can write the variable into their own pod spec, so it is believed only for a claim this agent prepared
(the preparer's checkpointed claims, in memory) and for a pod in the claim's namespace. Any pod of that namespace
could name the claim in its ``spec.resourceClaims`` anyway (ResourceClaims are namespaced, and kubelet prepares a
claim for every pod that references it), so the namespace is the trust boundary the API itself draws. A variable
that is not believed is ignored: the container is treated as any other.
"""

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
