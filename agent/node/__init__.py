"""The node side of the agent: node labels and annotations, and who else owns CPUs on the node.

* :mod:`agent.node.labels` -- pure: topology + grouping -> labels and one JSON annotation;
* :mod:`agent.node.kube` -- a thin adapter that patches the Node object, only when something changed;
* :mod:`agent.node.cpu_manager` -- kubelet's CPU manager checkpoint and ``reservedSystemCPUs``, and
  warnings when they clash with the advertised groups.

Import :mod:`agent.node.kube` explicitly: it pulls in the ``kubernetes`` client (about 0.3 s).
"""

from __future__ import annotations

from agent.errors import CpuManagerStateError, KubeletConfigError
from agent.node.cpu_manager import (
    CpuManagerState,
    cpu_manager_findings,
    parse_cpu_manager_state,
    read_cpu_manager_state,
    read_reserved_system_cpus,
)
from agent.node.labels import (
    ANNOTATION_KEYS,
    DOMAIN,
    LABEL_KEYS,
    TOPOLOGY_ANNOTATION,
    is_valid_label_value,
    node_annotations,
    node_labels,
)

__all__ = [
    "ANNOTATION_KEYS",
    "DOMAIN",
    "LABEL_KEYS",
    "TOPOLOGY_ANNOTATION",
    "CpuManagerState",
    "CpuManagerStateError",
    "KubeletConfigError",
    "cpu_manager_findings",
    "is_valid_label_value",
    "node_annotations",
    "node_labels",
    "parse_cpu_manager_state",
    "read_cpu_manager_state",
    "read_reserved_system_cpus",
]
