"""A thread-safe log of the RPCs kubelet made to device plugins."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

from .model import PluginCall


class CallLog:
    """Append-only, thread-safe list of `PluginCall` (resource, method, request summary).

    Iteration, indexing and ``len`` work on a snapshot, so it can be read while plugins are called.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[PluginCall] = []

    def record(self, resource: str, method: str, request: Mapping[str, object] | None = None) -> None:
        with self._lock:
            self._calls.append(PluginCall(resource, method, dict(request or {})))

    def snapshot(self) -> list[PluginCall]:
        with self._lock:
            return list(self._calls)

    def __iter__(self) -> Iterator[PluginCall]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def __getitem__(self, index: int) -> PluginCall:
        with self._lock:
            return self._calls[index]

    def for_resource(self, resource: str) -> list[PluginCall]:
        return [c for c in self.snapshot() if c.resource == resource]

    def methods(self, resource: str | None = None) -> list[str]:
        """Method names in call order, optionally for one resource."""
        return [c.method for c in self.snapshot() if resource is None or c.resource == resource]

    def count_of(self, method: str, resource: str | None = None) -> int:
        return sum(1 for c in self.snapshot() if c.method == method and (resource is None or c.resource == resource))

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()
