"""Pods, containers and their device allocations as the emulated kubelet keeps them."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from agent._proto.deviceplugin.v1beta1 import api_pb2 as dp

from .runopts import RunContainerOptions, merge_responses


@dataclass(frozen=True)
class Container:
    """A container of a pod spec: ``requests`` are integer extended-resource requests (= limits).

    ``init`` marks an init container; ``restartable`` an init container with ``restartPolicy: Always``
    (a sidecar), which keeps its devices and is reported by pod-resources ``List``.
    """

    name: str
    requests: Mapping[str, int] = field(default_factory=dict)
    init: bool = False
    restartable: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("container name must not be empty")
        if self.restartable and not self.init:
            raise ValueError(f"container {self.name!r}: only init containers can be restartable")
        for resource, quantity in self.requests.items():
            if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 0:
                raise ValueError(f"container {self.name!r}: request for {resource!r} must be an int >= 0")

    @property
    def is_sidecar(self) -> bool:
        return self.init and self.restartable

    @property
    def keeps_devices(self) -> bool:
        """App containers and sidecars hold their devices for the pod's lifetime."""
        return not self.init or self.restartable


@dataclass(frozen=True)
class ContainerAllocation:
    """Devices of one resource given to one container, with the cached Allocate response."""

    resource: str
    device_ids: tuple[str, ...]
    numa: Mapping[int, tuple[str, ...]]  # NUMA node -> ids (-1 = no topology), as podDevices keeps them
    response: dp.ContainerAllocateResponse


class PluginCall(NamedTuple):
    """One RPC kubelet made to a plugin: (resource, method, request summary)."""

    resource: str
    method: str
    request: Mapping[str, object]


class Pod:
    """An admitted pod. Allocation data is fixed at admission; read it through the accessors."""

    def __init__(self, namespace: str, name: str, containers: list[Container]) -> None:
        if not namespace or not name:
            raise ValueError("pod namespace and name must not be empty")
        names = [c.name for c in containers]
        if len(set(names)) != len(names):
            raise ValueError(f"pod {namespace}/{name}: duplicate container names {names}")
        self.namespace = namespace
        self.name = name
        self.uid = str(uuid.uuid4())
        self.containers: tuple[Container, ...] = tuple(containers)
        self._allocations: dict[str, dict[str, ContainerAllocation]] = {c.name: {} for c in containers}
        self._starts: dict[str, int] = {c.name: 0 for c in containers}

    def __repr__(self) -> str:
        return f"Pod({self.namespace}/{self.name}, containers={[c.name for c in self.containers]})"

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def container(self, name: str) -> Container:
        for container in self.containers:
            if container.name == name:
                return container
        raise KeyError(f"pod {self.namespace}/{self.name} has no container {name!r}")

    def admission_order(self) -> list[Container]:
        """Init containers in order, then app containers in order (kubelet's allocation order)."""
        return [c for c in self.containers if c.init] + [c for c in self.containers if not c.init]

    def allocations(self, container: str) -> dict[str, ContainerAllocation]:
        """resource -> allocation for `container`, in allocation order."""
        self.container(container)
        return dict(self._allocations[container])

    def devices(self, container: str, resource: str) -> list[str]:
        alloc = self.allocations(container).get(resource)
        return list(alloc.device_ids) if alloc else []

    def all_device_ids(self, resource: str) -> set[str]:
        ids: set[str] = set()
        for per_resource in self._allocations.values():
            alloc = per_resource.get(resource)
            if alloc:
                ids.update(alloc.device_ids)
        return ids

    def resources(self) -> set[str]:
        return {res for per_resource in self._allocations.values() for res in per_resource}

    def responses(self, container: str) -> dict[str, dp.ContainerAllocateResponse]:
        """resource -> copy of the cached ContainerAllocateResponse."""
        out: dict[str, dp.ContainerAllocateResponse] = {}
        for resource, alloc in self.allocations(container).items():
            copy = dp.ContainerAllocateResponse()
            copy.CopyFrom(alloc.response)
            out[resource] = copy
        return out

    def run_options(self, container: str) -> RunContainerOptions:
        allocs = self.allocations(container)
        return merge_responses((res, alloc.response) for res, alloc in allocs.items())

    def envs(self, container: str) -> dict[str, str]:
        """Merged env vars of all of `container`'s resources (first wins on duplicate keys)."""
        return self.run_options(container).envs

    def annotations(self, container: str) -> dict[str, str]:
        return self.run_options(container).annotations

    def mounts(self, container: str) -> list[dp.Mount]:
        return self.run_options(container).mounts

    def device_specs(self, container: str) -> list[dp.DeviceSpec]:
        return self.run_options(container).devices

    def cdi_devices(self, container: str) -> list[str]:
        return self.run_options(container).cdi_devices

    def starts(self, container: str) -> int:
        """How many times `container` was started through `KubeletEmulator.start_container`."""
        self.container(container)
        return self._starts[container]

    # -- mutation, used by the device manager only -------------------------------------------

    def _set_allocation(self, container: str, alloc: ContainerAllocation) -> None:
        self._allocations[container][alloc.resource] = alloc

    def _record_start(self, container: str) -> None:
        self._starts[container] += 1
