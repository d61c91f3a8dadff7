"""Put the agent's labels and annotations on its Node, through :mod:`agent.node.kubeapi`.

Zero writes in steady state: the first :meth:`NodeLabeler.sync` GETs the node and patches only the
keys of ours that differ; later syncs compare with what was applied last and send nothing when
nothing changed. After any failure the next sync GETs the node again.

The device plugin never depends on the API server: unreachable, timing out, RBAC denied (403) or
node missing (404) is one warning on logger ``topology-agent.node`` and ``False``, never an
exception. The calls block; from asyncio code run ``sync`` with ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.errors import KubeApiError, NodeLabelerError
from agent.node.kubeapi import MERGE_PATCH, NodeApi, kube_api_from_environment
from agent.node.labels import KEY_PREFIX

log = logging.getLogger("topology-agent.node")

DEFAULT_REQUEST_TIMEOUT = 5.0
__all__ = ["DEFAULT_REQUEST_TIMEOUT", "MERGE_PATCH", "NodeLabeler"]


@dataclass(frozen=True, slots=True)
class _Metadata:
    labels: dict[str, str]
    annotations: dict[str, str]


class _SyncFailed(Exception):
    """Internal: a request failed; the argument is the one-line reason."""


def _ours(values: Mapping[str, str] | None, prefix: str) -> dict[str, str]:
    return {k: v for k, v in (values or {}).items() if k.startswith(prefix)}


def _changes(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str | None]:
    """Keys to set (new or different value) and keys to remove (None), in a stable order."""
    changed: dict[str, str | None] = {k: v for k, v in sorted(desired.items()) if current.get(k) != v}
    changed.update({k: None for k in sorted(current) if k not in desired})
    return changed


class NodeLabeler:
    """Keeps this node's ``topology.s390x.ibm.com/`` labels and annotations as desired.

    ``patches`` and ``failures`` count successful PATCH requests and failed syncs; ``last_error``
    holds the reason of the latest failure (None after a successful sync).
    """

    def __init__(
        self,
        node_name: str,
        api: NodeApi,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        key_prefix: str = KEY_PREFIX,
    ) -> None:
        if not node_name:
            raise ValueError("node name is empty (set NODE_NAME from the downward API: spec.nodeName)")
        self.node_name = node_name
        self.api = api
        self.request_timeout = request_timeout
        self.key_prefix = key_prefix
        self.patches = 0
        self.failures = 0
        self.last_error: str | None = None
        self._applied: _Metadata | None = None  # what the node holds of ours, as far as we know
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls, node_name: str, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> NodeLabeler:
        """In a pod the service account, else the kubeconfig (local runs). NodeLabelerError when
        neither is available; nothing is contacted here."""
        return cls(node_name, kube_api_from_environment(), request_timeout=request_timeout)

    def invalidate(self) -> None:
        """Forget what was applied: the next sync reads the node again (e.g. once an hour)."""
        with self._lock:
            self._applied = None

    def sync(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
        """Make the node's labels and annotations of our domain exactly ``labels`` and ``annotations``.

        True when the node is as desired (patched, or nothing to do); False after a failure, which
        is logged as one warning. ValueError for keys outside our domain (a programming error).
        """
        foreign = sorted(k for k in [*labels, *annotations] if not k.startswith(self.key_prefix))
        if foreign:
            raise ValueError(f"keys outside {self.key_prefix}: {', '.join(foreign)}")
        desired = _Metadata(dict(labels), dict(annotations))
        with self._lock:
            try:
                current = self._applied if self._applied is not None else self._read()
                body: dict[str, Any] = {}
                label_changes = _changes(current.labels, desired.labels)
                annotation_changes = _changes(current.annotations, desired.annotations)
                if label_changes:
                    body["labels"] = label_changes
                if annotation_changes:
                    body["annotations"] = annotation_changes
                if body:
                    self._patch({"metadata": body})
                    self.patches += 1
            except _SyncFailed as failure:
                self._applied = None
                self.failures += 1
                reason = str(failure)
                if reason != self.last_error:
                    log.warning("node %s: labels not synced, will retry: %s", self.node_name, reason)
                else:  # the same failure again: said already
                    log.debug("node %s: labels still not synced: %s", self.node_name, reason)
                self.last_error = reason
                return False
            self._applied = desired
            if self.last_error is not None:
                log.info("node %s: labels synced again", self.node_name)
                self.last_error = None
            return True

    def post_event(self, body: Mapping[str, Any]) -> bool:
        """Create an Event about this node; False (one warning) when the API server refuses or is away."""
        try:
            self.api.create_event(str(body.get("metadata", {}).get("namespace", "default")), body,
                                  self.request_timeout)
        except Exception as exc:  # never let the API server take the agent down
            reason = self._reason("POST event for", exc)
            if isinstance(exc, KubeApiError) and exc.status == 403:
                reason = (f"POST event for node {self.node_name}: forbidden (403): the chart's ClusterRole grants "
                          f"create on events; an older role does not: {exc.message}")
            log.warning("%s", reason, extra={"reason": reason})
            return False
        return True

    def _read(self) -> _Metadata:
        try:
            labels, annotations = self.api.node_metadata(self.node_name, self.request_timeout)
        except Exception as exc:  # never let the API server take the agent down
            raise _SyncFailed(self._reason("GET", exc)) from None
        return _Metadata(_ours(labels, self.key_prefix), _ours(annotations, self.key_prefix))

    def _patch(self, body: dict[str, Any]) -> None:
        try:
            self.api.patch_node(self.node_name, body, self.request_timeout)
        except Exception as exc:  # never let the API server take the agent down
            raise _SyncFailed(self._reason("PATCH", exc)) from None

    def _reason(self, verb: str, exc: Exception) -> str:
        what = f"{verb} node {self.node_name}"
        if isinstance(exc, KubeApiError):
            status = exc.status
            message = exc.message
            if status == 403:
                return (f"{what}: forbidden (403): RBAC must grant the agent's service account get and patch on "
                        f"nodes, and the chart's node-restriction policy lets it change only its own node's "
                        f"topology.s390x.ibm.com/ keys: {message}")
            if status == 401:
                return f"{what}: unauthorized (401): the service account token was not accepted: {message}"
            if status == 404:
                return f"{what}: node not found (404): is NODE_NAME spec.nodeName? {message}"
            return f"{what}: API server answered {status}: {message}"
        if isinstance(exc, TimeoutError):
            return f"{what}: API server timed out after {self.request_timeout:g}s: {exc}"
        if isinstance(exc, OSError):
            return f"{what}: API server unreachable: {exc.strerror or exc}"
        if isinstance(exc, NodeLabelerError):
            return f"{what}: {exc}"
        return f"{what}: {type(exc).__name__}: {exc}"
