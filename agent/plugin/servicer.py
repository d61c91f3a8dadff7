"""The kubelet v1beta1 DevicePlugin service for one resource: a thin adapter over
:class:`ResourceDevices`. Allocate and GetPreferredAllocation do no I/O and hold no lock
across anything slow: kubelet has no timeout on them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import grpc

from agent._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from agent.devices.table import DeviceRequestError, ResourceDevices
from agent.policy.preference import PreferenceError, preferred_allocation

log = logging.getLogger("topology-agent.plugin")

# Called after a successful Allocate with (resource, device ids); must not block.
AllocateHook = Callable[[str, Sequence[str]], None]
# Called before answering Allocate: why these ids must be refused (an overlapping device is held), or None.
AdmissionCheck = Callable[[str, Sequence[str]], str | None]
# Sees every Allocate / GetPreferredAllocation: (method, resource, gRPC code name, seconds).
CallObserver = Callable[[str, str, str, float], None]

T = TypeVar("T")


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def plugin_options() -> api_pb2.DevicePluginOptions:
    """The options we serve and also put in RegisterRequest (kubelets <= 1.24 read those)."""
    return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class StreamTracker:
    """Counts open ListAndWatch streams and remembers when the last one ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open = 0
        self.started = 0
        self.ended = threading.Event()

    def opened(self) -> None:
        with self._lock:
            self.open += 1
            self.started += 1
            self.ended.clear()

    def closed(self) -> None:
        with self._lock:
            self.open -= 1
            if self.open == 0:
                self.ended.set()


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, devices: ResourceDevices, stopping: threading.Event,
                 on_allocate: AllocateHook | None = None, check: AdmissionCheck | None = None,
                 observer: CallObserver | None = None, heartbeat: float = 30.0) -> None:
        self.devices = devices
        self.stopping = stopping
        self.on_allocate = on_allocate
        self.check = check
        self.observer = observer
        self._responses: dict[tuple[str, ...], api_pb2.ContainerAllocateResponse] = {}
        self.heartbeat = heartbeat
        self.streams = StreamTracker()

    def GetDevicePluginOptions(self, request: api_pb2.Empty, context: grpc.ServicerContext
                               ) -> api_pb2.DevicePluginOptions:
        return plugin_options()

    def _response(self) -> api_pb2.ListAndWatchResponse:
        snap = self.devices.snapshot()
        devices = []
        for device_id, health in snap.health:
            device = api_pb2.Device(ID=device_id, health=health)
            if self.devices.numa_topology:
                nodes = self.devices.groups[device_id].memory_nodes
                device.topology.nodes.extend(api_pb2.NUMANode(ID=n) for n in nodes)
            devices.append(device)
        return api_pb2.ListAndWatchResponse(devices=devices)

    def ListAndWatch(self, request: api_pb2.Empty, context: grpc.ServicerContext
                     ) -> Iterator[api_pb2.ListAndWatchResponse]:
        cancelled = threading.Event()

        def on_done() -> None:
            cancelled.set()
            self.devices.wake()

        context.add_callback(on_done)
        self.streams.opened()
        resource = self.devices.resource
        log.info("ListAndWatch stream opened", extra={"resource": resource})
        try:
            version = self.devices.snapshot().version
            yield self._response()
            while not cancelled.is_set() and not self.stopping.is_set():
                snap = self.devices.wait_for_change(version, self.heartbeat, cancelled)
                if cancelled.is_set() or self.stopping.is_set():
                    break
                if snap.version != version:
                    version = snap.version
                    yield self._response()
        finally:
            self.streams.closed()
            log.info("ListAndWatch stream closed", extra={"resource": resource})

    def _observed(self, method: str, context: grpc.ServicerContext, call: Callable[[], T]) -> T:
        """Run ``call``; a _Refused becomes a gRPC error; the observer sees code and duration."""
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return call()
        except _Refused as refused:
            code = refused.code
            context.abort(refused.code, refused.message)
            raise  # not reached: abort raises
        except Exception:
            code = grpc.StatusCode.INTERNAL
            raise
        finally:
            if self.observer is not None:
                self.observer(method, self.devices.resource, code.name, time.perf_counter() - started)

    def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
                               ) -> api_pb2.PreferredAllocationResponse:
        return self._observed("GetPreferredAllocation", context, lambda: self._preferred(request))

    def _preferred(self, request: api_pb2.PreferredAllocationRequest) -> api_pb2.PreferredAllocationResponse:
        responses = []
        for creq in request.container_requests:
            try:
                ids = preferred_allocation(self.devices.groups, list(creq.available_deviceIDs),
                                           list(creq.must_include_deviceIDs), creq.allocation_size)
            except PreferenceError as exc:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{self.devices.resource}: {exc}") from None
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext) -> api_pb2.AllocateResponse:
        return self._observed("Allocate", context, lambda: self._allocate(request))

    def _allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        responses = []
        resource = self.devices.resource
        if not request.container_requests:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{resource}: Allocate request has no container requests")
        for creq in request.container_requests:
            try:
                plan = self.devices.plan(list(creq.devices_ids))
            except DeviceRequestError as exc:
                log.warning("Allocate refused: %s", exc, extra={"resource": resource, "reason": "invalid ids"})
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
            why = self.check(resource, plan.groups) if self.check is not None else None
            if why is not None:
                log.warning("Allocate refused: %s", why, extra={"resource": resource, "device": ",".join(plan.groups),
                                                                 "reason": why})
                raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{resource}: {why}")
            response = self._responses.get(plan.groups)
            if response is None:  # the wire form of a plan is built once per id set, like the plan
                response = api_pb2.ContainerAllocateResponse(envs=dict(plan.envs), annotations=dict(plan.annotations))
                self._responses[plan.groups] = response
            responses.append(response)
            log.info("Allocate %s -> cpus %s", ",".join(plan.groups), plan.envs["TOPOLOGY_CPUS"],
                     extra={"resource": resource, "device": ",".join(plan.groups),
                            "cpus": plan.envs["TOPOLOGY_CPUS"]})
            if self.on_allocate is not None:
                self.on_allocate(resource, plan.groups)
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
                          ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
