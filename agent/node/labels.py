"""Node labels and the topology annotation the agent puts on its Node. Pure: model + grouping -> dicts.

Labels carry only what node selectors and affinities need (machine generation, how many books and
sockets are advertised, SMT, polarization, how much the topology can be trusted, the CPU manager
policy); everything else goes into one compact JSON annotation. Every key lives under
``topology.s390x.ibm.com/`` so the agent can recognise, update and remove its own keys
(:data:`LABEL_KEYS`, :data:`ANNOTATION_KEYS`) without touching anybody else's.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agent.policy.grouping import Grouping
from agent.topology.cpulist import format_cpulist
from agent.topology.model import DISPATCHING_MODES, Topology

DOMAIN = "topology.s390x.ibm.com"
KEY_PREFIX = f"{DOMAIN}/"

LABEL_MACHINE = f"{KEY_PREFIX}machine"
LABEL_MACHINE_TYPE = f"{KEY_PREFIX}machine-type"
LABEL_BOOKS = f"{KEY_PREFIX}books"
LABEL_SOCKETS = f"{KEY_PREFIX}sockets"
LABEL_SMT = f"{KEY_PREFIX}smt"
LABEL_POLARIZATION = f"{KEY_PREFIX}polarization"
LABEL_FIDELITY = f"{KEY_PREFIX}fidelity"
LABEL_ENVIRONMENT = f"{KEY_PREFIX}environment"
LABEL_CPU_MANAGER_POLICY = f"{KEY_PREFIX}cpu-manager-policy"
# "true" while the node advertises groups, else why not: not-ibm-z | no-topology-facility |
# degenerate-topology | no-usable-groups (the full sentence is the annotation's notAdvertised.reason).
LABEL_ADVERTISED = f"{KEY_PREFIX}advertised"
NOT_ADVERTISED_CODES: tuple[str, ...] = ("not-ibm-z", "no-topology-facility", "degenerate-topology",
                                         "no-usable-groups")

# Every label key the agent may set, so keys of ours that are no longer wanted can be removed.
LABEL_KEYS: tuple[str, ...] = (
    LABEL_MACHINE,
    LABEL_MACHINE_TYPE,
    LABEL_BOOKS,
    LABEL_SOCKETS,
    LABEL_SMT,
    LABEL_POLARIZATION,
    LABEL_FIDELITY,
    LABEL_ENVIRONMENT,
    LABEL_CPU_MANAGER_POLICY,
    LABEL_ADVERTISED,
)

TOPOLOGY_ANNOTATION = f"{KEY_PREFIX}topology"
ANNOTATION_KEYS: tuple[str, ...] = (TOPOLOGY_ANNOTATION,)

ANNOTATION_SCHEMA_VERSION = 1
# The API server caps *all* annotations of an object at 256 KiB together; ours stays far below.
MAX_ANNOTATION_BYTES = 64 * 1024

MAX_LABEL_VALUE = 63
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_INVALID_CHARS = re.compile(r"[^-A-Za-z0-9_.]+")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def is_valid_label_value(value: str) -> bool:
    """Kubernetes' rule for label values: <= 63 characters of [A-Za-z0-9._-], alphanumeric at both ends."""
    return len(value) <= MAX_LABEL_VALUE and _LABEL_VALUE.fullmatch(value) is not None


def _label_value(text: str | None) -> str | None:
    """``text`` made into a valid, non-empty label value, or None when nothing is left."""
    if text is None:
        return None
    value = _EDGE.sub("", _INVALID_CHARS.sub("-", text.strip()))
    value = _EDGE.sub("", value[:MAX_LABEL_VALUE])
    return value or None


def _groups_per_level(grouping: Grouping, level: str) -> str:
    return str(sum(1 for g in grouping.groups if g.level == level))


def not_advertised(topology: Topology, grouping: Grouping) -> tuple[str, str] | None:
    """(code, reason) when the node advertises nothing, else None: what an admin reads on the Node."""
    if grouping.groups:
        return None
    m = topology.machine
    if not m.is_s390 and m.arch != "unknown":
        code = "not-ibm-z"
    elif grouping.fidelity == "guest-no-topology":
        code = "no-topology-facility" if m.topology_facility is False else "degenerate-topology"
    else:
        code = "no-usable-groups"
    if not grouping.levels:  # the whole machine was turned down: one reason says it
        return code, grouping.level_reason
    return code, "; ".join(dict.fromkeys(s.reason for s in grouping.skipped)) or "no usable CPUs"


def node_event(node_name: str, code: str, message: str, now: str, reporter: str = "s390x-topology-agent",
               ) -> dict[str, Any]:
    """The Warning Event of a node that advertises nothing (``code`` from :func:`not_advertised`)."""
    return warning_event(node_name, "TopologyNotAdvertised", f"nothing advertised ({code}): {message}", now, reporter)


def warning_event(node_name: str, reason: str, message: str, now: str, reporter: str = "s390x-topology-agent",
                  ) -> dict[str, Any]:
    """A core/v1 Warning Event on the Node (namespace default, uid the node name, as kubelet's own node
    events, so ``kubectl describe node`` lists it). ``now`` is an RFC 3339 time."""
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{node_name}.topology-", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name},
        "type": "Warning", "reason": reason,
        "message": message[:1024],
        "source": {"component": reporter, "host": node_name},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


def node_labels(topology: Topology, grouping: Grouping, cpu_manager_policy: str | None) -> dict[str, str]:
    """The labels for this node; ``cpu_manager_policy`` None means kubelet's state file is absent.

    All values are valid label values. ``machine-type`` is left out when the type is unknown.
    """
    m = topology.machine
    machine = (m.generation if m.is_s390 else None) or m.arch
    policy = _label_value(cpu_manager_policy.lower()) if cpu_manager_policy is not None else None
    labels: dict[str, str | None] = {
        LABEL_MACHINE: _label_value(machine) or "unknown",
        LABEL_MACHINE_TYPE: _label_value(m.machine_type),
        LABEL_BOOKS: _groups_per_level(grouping, "book"),
        LABEL_SOCKETS: _groups_per_level(grouping, "socket"),
        LABEL_SMT: str(max(1, m.smt_threads)),
        LABEL_POLARIZATION: m.dispatching if m.dispatching in DISPATCHING_MODES else "unknown",
        LABEL_FIDELITY: _label_value(grouping.fidelity) or "unknown",
        LABEL_ENVIRONMENT: _label_value(m.environment) or "unknown",
        LABEL_CPU_MANAGER_POLICY: policy or "unknown",
        LABEL_ADVERTISED: (nothing[0] if (nothing := not_advertised(topology, grouping)) else "true"),
    }
    return {key: value for key, value in labels.items() if value is not None}


def _summary(topology: Topology, grouping: Grouping, exclusivity: str | None = None) -> dict[str, Any]:
    m = topology.machine
    summary: dict[str, Any] = {
        "version": ANNOTATION_SCHEMA_VERSION,
        "machine": {
            "arch": m.arch,
            "type": m.machine_type,
            "generation": m.generation,
            "environment": m.environment,
            "topologyFacility": m.topology_facility,
            "dispatching": m.dispatching,
            "smtThreads": m.smt_threads,
            "memoryNodes": list(m.memory_nodes),
        },
        "fidelity": grouping.fidelity,
        "levels": list(grouping.levels),
        "levelReason": grouping.level_reason,
        "groups": [
            {"resource": g.resource, "id": g.id, "cpus": g.cpulist, "memoryNode": g.memory_node}
            for g in grouping.groups
        ],
        "skipped": [{"cpus": format_cpulist(s.cpus), "reason": s.reason} for s in grouping.skipped],
        "warnings": list(grouping.warnings),
    }
    if exclusivity is not None:  # "confirmed" | "unconfirmed": whether pod-resources vouches for the holders
        summary["exclusivity"] = exclusivity
    nothing = not_advertised(topology, grouping)
    if nothing is not None:
        summary["notAdvertised"] = {"code": nothing[0], "reason": nothing[1][:1000]}
    return summary


def _dumps(summary: dict[str, Any]) -> str:
    # Deterministic (sorted keys, no timestamps): the same topology gives the same bytes, so a
    # steady-state sync writes nothing.
    return json.dumps(summary, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _shrink(summary: dict[str, Any]) -> str:
    """The summary cut down until it fits :data:`MAX_ANNOTATION_BYTES` (never needed on real machines)."""
    text = _dumps(summary)
    if len(text.encode()) <= MAX_ANNOTATION_BYTES:
        return text
    counts: dict[str, int] = {}
    for group in summary["groups"]:
        counts[group["resource"]] = counts.get(group["resource"], 0) + 1
    summary = {
        **summary,
        "groups": [],
        "groupCounts": counts,
        "skipped": [{"cpus": s["cpus"][:200], "reason": s["reason"][:200]} for s in summary["skipped"][:20]],
        "warnings": [w[:200] for w in summary["warnings"][:20]],
        "truncated": True,
    }
    text = _dumps(summary)
    if len(text.encode()) <= MAX_ANNOTATION_BYTES:
        return text
    return _dumps({key: summary[key] for key in ("version", "machine", "fidelity", "levels", "groupCounts",
                                                 "exclusivity", "notAdvertised") if key in summary}
                  | {"truncated": True})


def node_annotations(topology: Topology, grouping: Grouping, exclusivity: str | None = None) -> dict[str, str]:
    """One annotation, :data:`TOPOLOGY_ANNOTATION`: a compact JSON summary of machine and groups.

    Keys: ``version``, ``machine`` (arch, type, generation, environment, topologyFacility,
    dispatching, smtThreads, memoryNodes), ``fidelity``, ``levels``, ``levelReason``, ``groups``
    (resource, id, cpus as a kernel cpulist, memoryNode), ``skipped`` (cpus, reason) and
    ``warnings``, and ``exclusivity`` (``confirmed`` / ``unconfirmed``: whether pod-resources vouches for
    the holders) when given. Always below :data:`MAX_ANNOTATION_BYTES` (``truncated: true`` when it was
    cut; the exclusivity is never cut).
    """
    return {TOPOLOGY_ANNOTATION: _shrink(_summary(topology, grouping, exclusivity))}
