"""In-memory stand-ins for the agent's Kubernetes API client (agent/node/kubeapi.py): ResourceSlices with
resourceVersions (SliceApi), and the DaemonSet and Nodes an uninstall reads and patches (UninstallApi)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.errors import KubeApiError
from agent.node.kubeapi import NodeRow
from agent.policy.teardown import parse_label_selector


class SliceApi:
    """ResourceSlices of an API server, in memory: list, create (409 when it exists), replace (409 on a stale
    resourceVersion; ``conflicts`` replaces answer 409 first, as if someone else wrote meanwhile), delete."""
    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.calls: list[str] = []
        self.conflicts = 0  # replace calls that answer 409 before succeeding

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        self.calls.append("list")
        return [copy.deepcopy(o) for o in self.slices.values()
                if o["spec"]["nodeName"] == node and o["spec"]["driver"] == driver]

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        name = body["metadata"]["name"]
        if name in self.slices:
            raise KubeApiError(409, f'resourceslices "{name}" already exists')
        self.slices[name] = self._bump(body)
        return self.slices[name]

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("replace")
        if self.conflicts:
            self.conflicts -= 1
            self.slices[name] = self._bump(self.slices[name])  # someone else wrote it meanwhile
        if body["metadata"].get("resourceVersion") != self.slices[name]["metadata"]["resourceVersion"]:
            raise KubeApiError(409, "the object has been modified; please apply your changes to the latest version")
        self.slices[name] = self._bump(body)
        return self.slices[name]

    def delete_slice(self, name: str, resource_version: str | None = None) -> None:
        self.calls.append("delete")
        if name not in self.slices:
            raise KubeApiError(404, "not found")
        del self.slices[name]

    def node_uid(self, node: str) -> str:
        return "uid-" + node

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        raise KubeApiError(404, "no claims here")

    def writes(self) -> int:
        return sum(1 for c in self.calls if c != "list")


# the Node of an uninstall: our labels and annotation beside others
PREFIX = "topology.s390x.ibm.com/"
OURS = {f"{PREFIX}books": "4", f"{PREFIX}advertised": "true"}
THEIRS = {"kubernetes.io/arch": "s390x", "team": "ml"}
ANNOTATIONS = {f"{PREFIX}topology": "{}", "node.alpha.kubernetes.io/ttl": "0"}


def write_state_files(kubelet_dir: Path, prefix: str = "topology") -> Path:
    directory = kubelet_dir / "s390x-topology-agent" / prefix
    directory.mkdir(parents=True)
    (directory / "groups.json").write_text("{}")
    (directory / "holds.json").write_text("{}")
    return directory


class UninstallApi:
    """The DaemonSet and the Nodes an uninstall reads, deletes and patches; ``gone_after`` GETs still see the
    DaemonSet after its foreground delete."""
    def __init__(self, daemonset: dict[str, Any] | Exception | None, nodes: list[NodeRow] | None = None,
                 gone_after: int = 0) -> None:
        self.daemonset = daemonset
        self.nodes = {name: (labels, annotations) for name, labels, annotations in nodes or []}
        self.gone_after = gone_after  # GETs of the DaemonSet before it is gone (after a delete)
        self.deleted = False
        self.patches: list[tuple[str, Mapping[str, Any]]] = []
        self.delete_error: Exception | None = None

    def get_daemonset(self, namespace: str, name: str, timeout: float) -> dict[str, Any] | None:
        if isinstance(self.daemonset, Exception):
            raise self.daemonset
        if self.deleted:
            if self.gone_after <= 0:
                return None
            self.gone_after -= 1
        return self.daemonset

    def delete_daemonset_foreground(self, namespace: str, name: str, timeout: float) -> bool:
        if self.delete_error is not None:
            raise self.delete_error
        existed = self.daemonset is not None and not self.deleted
        self.deleted = True
        if isinstance(self.daemonset, dict):
            self.daemonset = {"metadata": {**self.daemonset["metadata"], "deletionTimestamp": "now"}}
        return existed

    def node_metadata(self, name: str, timeout: float) -> tuple[dict[str, str], dict[str, str]]:
        labels, annotations = self.nodes[name]
        return dict(labels), dict(annotations)

    def patch_node(self, name: str, body: Mapping[str, Any], timeout: float) -> None:
        self.patches.append((name, body))
        labels, annotations = self.nodes[name]
        for key, value in body["metadata"].get("labels", {}).items():
            assert value is None
            labels.pop(key)
        for key in body["metadata"].get("annotations", {}):
            annotations.pop(key)

    def list_nodes(self, selector: str, timeout: float) -> list[NodeRow]:
        wanted = parse_label_selector(selector)
        return [(name, dict(labels), dict(annotations)) for name, (labels, annotations) in sorted(self.nodes.items())
                if wanted.items() <= labels.items()]


def uninstall_node() -> list[NodeRow]:
    return [("n1", {**OURS, **THEIRS}, dict(ANNOTATIONS))]
