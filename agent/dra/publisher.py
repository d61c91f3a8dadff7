"""Publishing the node's ResourceSlices (:mod:`agent.policy.resource_slices` computes them): idempotent and converging.
One step (:meth:`SlicePublisher.publish`) lists the driver's slices of this node and compares them with the plan by
name and by a content hash kept in an annotation; when they differ the pool generation goes up by one, every slice of
the plan is created or replaced (a concurrent writer is a 409: retried from a fresh List), then the rest deleted.

Must hold: an unchanged plan costs one List and no write; the slices are not deleted on SIGTERM (a restart must not
empty the pool: kubelet deletes a deregistered driver's slices after its grace), only by :meth:`remove_all` when the
DaemonSet is being deleted or the node handed to the other mode. Why: docs/contributing/design/dra-slices.md."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from agent.backoff import Backoff
from agent.errors import KubeApiError
from agent.policy.resource_slices import API_VERSION, CONTENT_ANNOTATION, PoolPlan, SlicePlan

log = logging.getLogger("topology-agent.dra")

CONFLICT_RETRIES = 5
JSON = dict[str, Any]


class DraApi(Protocol):
    """The API server's part (:class:`agent.node.kubeapi.KubeApi` has these calls)."""

    def list_slices(self, node: str, driver: str) -> list[JSON]: ...
    def create_slice(self, body: JSON) -> JSON: ...
    def replace_slice(self, name: str, body: JSON) -> JSON: ...
    def delete_slice(self, name: str, resource_version: str | None = None) -> None: ...
    def node_uid(self, node: str) -> str: ...
    def read_claim(self, namespace: str, name: str) -> JSON: ...


@dataclass
class PublishResult:
    generation: int
    created: int = 0
    replaced: int = 0
    deleted: int = 0
    attempts: int = 1

    @property
    def writes(self) -> int:
        return self.created + self.replaced + self.deleted


class SlicePublisher:
    def __init__(self, api: DraApi, node_name: str, driver: str, *, sleep: Any = time.sleep) -> None:
        self.api = api
        self.node_name = node_name
        self.driver = driver
        self.sleep = sleep
        self._node_uid: str | None = None
        self.writes = 0  # every create, replace and delete so far
        self.lists = 0
        self.last: PublishResult | None = None

    def node_uid(self) -> str:
        if self._node_uid is None:
            self._node_uid = self.api.node_uid(self.node_name)
        return self._node_uid

    def object(self, plan: SlicePlan, generation: int) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION, "kind": "ResourceSlice",
            "metadata": {
                "name": plan.name,
                "annotations": {CONTENT_ANNOTATION: plan.content},
                "labels": {"app.kubernetes.io/managed-by": "topology-agent"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node_name,
                                     "uid": self.node_uid(), "controller": True}],
            },
            "spec": plan.with_generation(generation),
        }

    def _list(self) -> dict[str, dict[str, Any]]:
        self.lists += 1
        return {o["metadata"]["name"]: o for o in self.api.list_slices(self.node_name, self.driver)}

    @staticmethod
    def in_sync(plan: PoolPlan, existing: dict[str, dict[str, Any]]) -> bool:
        if set(existing) != {s.name for s in plan.slices}:
            return False
        if not existing:  # nothing to publish, and nothing there: a node without groups is in sync
            return True
        generations = {int(o["spec"]["pool"].get("generation", 0)) for o in existing.values()}
        if len(generations) != 1:
            return False
        for s in plan.slices:
            have = existing[s.name]
            annotations = have["metadata"].get("annotations") or {}
            if annotations.get(CONTENT_ANNOTATION) != s.content or have["spec"]["pool"].get("name") != plan.pool:
                return False
        return True

    def publish(self, plan: PoolPlan) -> PublishResult:
        """Make the API server hold exactly ``plan``'s slices; zero writes when it already does."""
        last: KubeApiError | None = None
        backoff = Backoff(0.2, 2.0)
        for attempt in range(1, CONFLICT_RETRIES + 1):
            try:
                result = self._publish_once(plan)
                result.attempts = attempt
                self.last = result
                return result
            except KubeApiError as exc:
                if not (exc.conflict or exc.not_found):
                    raise
                last = exc
                log.info("ResourceSlice write conflicted (%s); reading them again (attempt %d)", exc, attempt)
                self.sleep(backoff.next())
        assert last is not None
        raise last

    def _publish_once(self, plan: PoolPlan) -> PublishResult:
        existing = self._list()
        current = max((int(o["spec"]["pool"].get("generation", 0)) for o in existing.values()), default=0)
        if self.in_sync(plan, existing):
            return PublishResult(generation=current)
        generation = current + 1
        result = PublishResult(generation=generation)
        for s in plan.slices:
            body = self.object(s, generation)
            have = existing.get(s.name)
            if have is None:
                self.api.create_slice(body)
                result.created += 1
            else:
                body["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
                self.api.replace_slice(s.name, body)
                result.replaced += 1
            self.writes += 1
        wanted = {s.name for s in plan.slices}
        for name, have in existing.items():
            if name not in wanted:
                try:
                    self.api.delete_slice(name, have["metadata"].get("resourceVersion"))
                except KubeApiError as exc:
                    if not exc.not_found:
                        raise
                result.deleted += 1
                self.writes += 1
        log.info("published %d ResourceSlice(s) of pool %s at generation %d (%d created, %d replaced, %d stale "
                 "deleted)", len(plan.slices), plan.pool, generation, result.created, result.replaced, result.deleted)
        return result

    def remove_all(self) -> int:
        """Delete every slice of this driver on this node; the count deleted."""
        deleted = 0
        for name in self._list():
            try:
                self.api.delete_slice(name)
                deleted += 1
            except KubeApiError as exc:
                if not exc.not_found:
                    raise
        self.writes += deleted
        return deleted

