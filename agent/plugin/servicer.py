"""The kubelet v1beta1 DevicePlugin service for one resource: a thin adapter over a
:class:`~agent.devices.table.DeviceTable`. Allocate and GetPreferredAllocation do no I/O and hold no
lock across anything slow: kubelet has no timeout on them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import grpc

from agent._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from agent.devices.table import DeviceTable
from agent.errors import PreferenceError, Refusal
from agent.policy.allocation import ContainerPlan

log = logging.getLogger("topology-agent.plugin")

# One container's answer, serialized once and kept by the device table: an AllocateResponse with that one
# container (protobuf's repeated field: responses joined are one response with every container), so an
# answer is the concatenation of its containers' wires and nothing is built or serialized again per call.
Wire = bytes
SERVICE = "v1beta1.DevicePlugin"
REFUSAL_CODES = {"invalid": grpc.StatusCode.INVALID_ARGUMENT, "conflict": grpc.StatusCode.FAILED_PRECONDITION,
                 "unhealthy": grpc.StatusCode.FAILED_PRECONDITION}


class Observer(Protocol):
    """Sees every Allocate and GetPreferredAllocation (the metrics implement it; must not block)."""

    def call(self, method: str, resource: str, code: str, seconds: float) -> None: ...

    def unbalanced(self, resource: str) -> None: ...


class NoObserver:
    def call(self, method: str, resource: str, code: str, seconds: float) -> None:
        pass

    def unbalanced(self, resource: str) -> None:
        pass


MAX_DETAILS = 1024  # characters of a refusal's status detail (gRPC metadata; clients cap it at 16 KiB)


def bounded(message: str) -> str:
    """A status detail short enough for every client (the request it answers may echo megabytes)."""
    if len(message) <= MAX_DETAILS:
        return message
    return f"{message[:MAX_DETAILS - 40]}... ({len(message) - MAX_DETAILS + 40} more characters)"


def render(plan: ContainerPlan) -> Wire:
    """The wire form of a plan: an AllocateResponse holding its one ContainerAllocateResponse, serialized
    once per id list and kept by the device table (answers for several containers are these joined)."""
    response = api_pb2.AllocateResponse()
    response.container_responses.add(envs=plan.envs, annotations=plan.annotations)
    return response.SerializeToString()


def allocate_response_bytes(response: api_pb2.AllocateResponse | bytes) -> bytes:
    """Allocate answers with ready bytes; a message (an error path's) is serialized as usual."""
    return response if isinstance(response, bytes) else response.SerializeToString()


def add_to_server(servicer: DevicePluginServicer, server: grpc.Server) -> None:
    """The generated registration, with Allocate answering pre-serialized bytes."""
    messages = api_pb2
    handlers = {
        "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
            servicer.GetDevicePluginOptions, request_deserializer=messages.Empty.FromString,
            response_serializer=messages.DevicePluginOptions.SerializeToString),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            servicer.ListAndWatch, request_deserializer=messages.Empty.FromString,
            response_serializer=messages.ListAndWatchResponse.SerializeToString),
        "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
            servicer.GetPreferredAllocation, request_deserializer=messages.PreferredAllocationRequest.FromString,
            response_serializer=messages.PreferredAllocationResponse.SerializeToString),
        "Allocate": grpc.unary_unary_rpc_method_handler(
            servicer.Allocate, request_deserializer=messages.AllocateRequest.FromString,
            response_serializer=allocate_response_bytes),
        "PreStartContainer": grpc.unary_unary_rpc_method_handler(
            servicer.PreStartContainer, request_deserializer=messages.PreStartContainerRequest.FromString,
            response_serializer=messages.PreStartContainerResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def plugin_options() -> api_pb2.DevicePluginOptions:
    """The options we serve and also put in RegisterRequest (kubelets <= 1.24 read those)."""
    return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


MAX_STREAMS = 4  # open ListAndWatch streams per resource; each holds a server thread (16 in all)


class StreamTracker:
    """Counts open ListAndWatch streams and keeps them few.

    Each stream holds one of the server's threads for as long as it is open, and Allocate needs
    free ones: beyond MAX_STREAMS the oldest stream is ended, except the first one opened after
    our latest registration (kubelet opens it right after Register; kubelet never reconnects).
    """

    def __init__(self, limit: int = MAX_STREAMS) -> None:
        self._lock = threading.Lock()
        self.limit = limit
        self.open = 0
        self.on_none_open: Callable[[], object] | None = None  # called when the last open stream ends
        self._streams: list[tuple[threading.Event, bool]] = []  # (cancel, kubelet's), oldest first
        self._registered = False  # a registration happened and its stream has not opened yet

    def registered(self) -> None:
        with self._lock:
            self._registered = True

    def opened(self, cancel: threading.Event) -> list[threading.Event]:
        """Count a new stream; returns the streams to end to stay within the limit."""
        with self._lock:
            self.open += 1
            kubelets, self._registered = self._registered, False
            self._streams.append((cancel, kubelets))
            excess = len(self._streams) - self.limit
            victims = [c for c, protected in self._streams if not protected][:max(excess, 0)]
            self._streams = [(c, p) for c, p in self._streams if c not in victims]
            return victims

    def closed(self, cancel: threading.Event) -> None:
        with self._lock:
            self.open -= 1
            self._streams = [(c, p) for c, p in self._streams if c is not cancel]
            none_open = self.open == 0
        if none_open and self.on_none_open is not None:
            self.on_none_open()


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, table: DeviceTable[Wire], stopping: threading.Event, observer: Observer | None = None,
                 heartbeat: float = 30.0) -> None:
        self.table = table
        self.stopping = stopping
        self.observer: Observer = observer or NoObserver()
        self.heartbeat = heartbeat
        self.streams = StreamTracker()

    def GetDevicePluginOptions(self, request: api_pb2.Empty, context: grpc.ServicerContext
                               ) -> api_pb2.DevicePluginOptions:
        return plugin_options()

    def _response(self) -> api_pb2.ListAndWatchResponse:
        snap = self.table.snapshot()
        devices = []
        for device_id, health in snap.health:
            device = api_pb2.Device(ID=device_id, health=health)
            if self.table.numa_topology:
                nodes = self.table.groups[device_id].memory_nodes
                device.topology.nodes.extend(api_pb2.NUMANode(ID=n) for n in nodes)
            devices.append(device)
        return api_pb2.ListAndWatchResponse(devices=devices)

    def ListAndWatch(self, request: api_pb2.Empty, context: grpc.ServicerContext
                     ) -> Iterator[api_pb2.ListAndWatchResponse]:
        cancelled = threading.Event()

        def on_done() -> None:
            cancelled.set()
            self.table.wake()

        context.add_callback(on_done)
        resource = self.table.resource
        victims = self.streams.opened(cancelled)
        if victims:
            log.warning("more than %d ListAndWatch streams open: ending the oldest", self.streams.limit,
                        extra={"resource": resource, "reason": "too many streams"})
            for victim in victims:
                victim.set()
            self.table.wake()
        log.info("ListAndWatch stream opened", extra={"resource": resource})
        try:
            version = self.table.snapshot().version
            yield self._response()
            while not cancelled.is_set() and not self.stopping.is_set():
                snap = self.table.wait_for_change(version, self.heartbeat, cancelled)
                if cancelled.is_set() or self.stopping.is_set():
                    break
                if snap.version != version:
                    version = snap.version
                    yield self._response()
        finally:
            self.streams.closed(cancelled)
            log.info("ListAndWatch stream closed", extra={"resource": resource})

    def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
                               ) -> api_pb2.PreferredAllocationResponse:
        started = time.perf_counter()
        code = grpc.StatusCode.INTERNAL
        try:
            responses = [
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=self.table.preferred(
                    list(c.available_deviceIDs), list(c.must_include_deviceIDs), c.allocation_size))
                for c in request.container_requests]
            code = grpc.StatusCode.OK
            return api_pb2.PreferredAllocationResponse(container_responses=responses)
        except PreferenceError as exc:
            code = grpc.StatusCode.INVALID_ARGUMENT
            context.abort(code, bounded(f"{self.table.resource}: {exc}"))
            raise  # not reached: abort raises
        finally:
            self.observer.call("GetPreferredAllocation", self.table.resource, code.name,
                               time.perf_counter() - started)

    def Allocate(self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext) -> bytes:
        started = time.perf_counter()
        resource = self.table.resource
        outcome = "INTERNAL"  # the gRPC code's name, for the observer
        try:
            answers = self.table.admit([c.devices_ids for c in request.container_requests])
            outcome = "OK"
        except Refusal as refusal:
            code = REFUSAL_CODES[refusal.kind]
            outcome = code.name
            message = bounded(refusal.message)
            log.warning("Allocate refused: %s", message, extra={"resource": resource, "reason": refusal.kind})
            context.abort(code, message)
            raise  # not reached: abort raises
        finally:
            self.observer.call("Allocate", resource, outcome, time.perf_counter() - started)
        for answer in answers:
            if answer.imbalance is not None:
                log.warning("Allocate %s: %s", ",".join(answer.groups), answer.imbalance,
                            extra={"resource": resource, "device": ",".join(answer.groups), "reason": "unbalanced"})
                self.observer.unbalanced(resource)
            if log.isEnabledFor(logging.DEBUG):
                cpus = answer.plan.envs["TOPOLOGY_CPUS"]
                log.debug("Allocate %s -> cpus %s", ",".join(answer.groups), cpus,
                          extra={"resource": resource, "device": ",".join(answer.groups), "cpus": cpus})
        return answers[0].wire if len(answers) == 1 else b"".join([a.wire for a in answers])  # an AllocateResponse

    def PreStartContainer(self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
                          ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
