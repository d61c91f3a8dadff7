"""``DRAResourceHealth`` on the DRA socket (v1 and v1alpha1, the same content): kubelet's health stream for the
driver's devices (KEP-4680), the report computed by :func:`agent.policy.health_report.health_report`.

Must hold: every response is the complete state of the driver's devices, sent at a stream's start, at once on every
change and again every :data:`~agent.policy.health_report.RESEND` seconds (kubelet reads an entry older than its
timeout as Unknown); at most ``max_streams`` streams, others refused with RESOURCE_EXHAUSTED (kubelet retries); the
report is computed from the device table's listener after the table's lock is released, and streams read it under
this module's own lock and send outside any lock. Design: docs/contributing/design/dra-slices.md."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import grpc

from agent._proto.dra_health.v1 import api_pb2 as health_v1
from agent._proto.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from agent._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from agent._proto.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from agent.policy.health_report import HEALTH_TIMEOUT, RESEND, DeviceReport, health_report, unhealthy

log = logging.getLogger("topology-agent.dra")

SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")  # newest first (kubelet picks the first it has)
MAX_STREAMS = 3

Broken = Mapping[tuple[str, str], str]


class _Stream:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False  # set once, as the stream leaves (and gives its place back)


class HealthService:
    """The report and the streams that send it. ``devices``: the pool's published device names."""

    def __init__(self, *, pool: str, devices: Sequence[str], broken: Callable[[], Broken],
                 max_streams: int = MAX_STREAMS, resend: float = RESEND, timeout: int = HEALTH_TIMEOUT,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.devices = tuple(devices)
        self.broken = broken
        self.max_streams = max_streams
        self.resend = resend
        self.timeout = timeout
        self.wall_clock = wall_clock
        self._cond = threading.Condition()
        self._report: tuple[DeviceReport, ...] = health_report(self.devices, {})
        self._version = 0
        self._at = wall_clock()
        self._open = False
        self._streams = 0
        self.streams_refused = 0

    # --- the state ---------------------------------------------------------------------------------
    def update(self, broken: Broken) -> bool:
        """The device table's broken groups now: streams send at once when the report changed. Never blocks
        on a stream (they send outside the lock)."""
        report = health_report(self.devices, broken)
        with self._cond:
            self._at = self.wall_clock()
            if report == self._report:
                return False
            self._report = report
            self._version += 1
            self._cond.notify_all()
        log.info("DRA device health now: %s unhealthy", ", ".join(unhealthy(report)) or "none")
        return True

    @property
    def streams(self) -> int:
        with self._cond:
            return self._streams

    def open(self) -> None:
        """Serve streams (the plugin started): the report from the device table as it is now."""
        self.update(self.broken())
        with self._cond:
            self._open = True

    def close(self, wait: float = 1.0) -> None:
        """End every stream cleanly (status OK: kubelet sees the end of the stream) and refuse new ones; waits
        up to ``wait`` seconds for the streams to leave."""
        deadline = time.monotonic() + wait
        with self._cond:
            self._open = False
            self._cond.notify_all()
            while self._streams and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)

    # --- the streams -------------------------------------------------------------------------------
    def _leave(self, stream: _Stream) -> None:
        with self._cond:
            if not stream.done:
                stream.done = True
                self._streams -= 1
            self._cond.notify_all()

    def _response(self, pb: ModuleType, report: tuple[DeviceReport, ...], at: float) -> Any:
        return pb.NodeWatchResourcesResponse(devices=[
            pb.DeviceHealth(device=pb.DeviceIdentifier(pool_name=self.pool, device_name=r.device),
                            health=pb.HEALTHY if r.healthy else pb.UNHEALTHY, last_updated_time=int(at),
                            health_check_timeout_seconds=self.timeout, message=r.message)
            for r in report])

    def watch(self, pb: ModuleType, context: Any) -> Iterator[Any]:
        streams = 0
        with self._cond:
            if not self._open:
                refused: tuple[grpc.StatusCode, str] | None = (grpc.StatusCode.UNAVAILABLE, "the agent is stopping")
            elif self._streams >= self.max_streams:
                self.streams_refused += 1
                refused = (grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"at most {self.max_streams} health streams at a time")
            else:
                refused = None
                self._streams += 1
                streams = self._streams
        if refused is not None:
            log.warning("refused a DRA health stream: %s", refused[1])
            context.abort(*refused)
        stream = _Stream()
        try:
            if not context.add_callback(lambda: self._leave(stream)):
                return  # the call ended already
            log.info("kubelet watches DRA device health (%s, %d stream(s))", pb.DESCRIPTOR.package, streams)
            sent = -1
            due = 0.0
            while True:
                with self._cond:
                    while self._open and not stream.done and self._version == sent:
                        left = due - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    if not self._open or stream.done:
                        return
                    report, at, sent = self._report, self._at, self._version
                due = time.monotonic() + self.resend
                yield self._response(pb, report, at)
        finally:
            self._leave(stream)
            log.info("a DRA health stream ended")

    def add_to_server(self, server: grpc.Server) -> None:
        service = self

        class V1(health_v1_grpc.DRAResourceHealthServicer):
            def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
                return service.watch(health_v1, context)

        class V1Alpha1(health_v1alpha1_grpc.DRAResourceHealthServicer):
            def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
                return service.watch(health_v1alpha1, context)

        health_v1_grpc.add_DRAResourceHealthServicer_to_server(V1(), server)
        health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(V1Alpha1(), server)
