"""Kubelet's client side of one registered device plugin (`plugin/v1beta1/client.go`, `endpoint.go`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from agent._proto.deviceplugin.v1beta1 import api_pb2 as dp
from agent._proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

from .calls import CallLog
from .constants import LOGGER_NAME, PRE_START_CONTAINER_TIMEOUT
from .errors import PluginCallError, format_rpc_error

log = logging.getLogger(LOGGER_NAME)

# What grpc-go reports for a call on a closed ClientConn (Python raises ValueError instead).
CONNECTION_CLOSING = "rpc error: code = Canceled desc = grpc: the client connection is closing"

SnapshotCallback = Callable[["PluginEndpoint", dp.ListAndWatchResponse], None]
EndCallback = Callable[["PluginEndpoint", str | None], None]


class PluginEndpoint:
    """A connection to `<device-plugins>/<endpoint>` for one resource.

    Lifecycle: `dial` -> `fetch_options` (both inside Register) -> `start_list_and_watch` (after Register
    returned) -> stream ends (plugin side) or `close` (kubelet side). The ListAndWatch consumer runs in its
    own daemon thread and reports through the callbacks; it never reconnects.
    """

    def __init__(
        self,
        resource: str,
        socket_path: Path,
        calls: CallLog,
        on_snapshot: SnapshotCallback,
        on_end: EndCallback,
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self._calls = calls
        self._on_snapshot = on_snapshot
        self._on_end = on_end
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: dp_grpc.DevicePluginStub | None = None
        self._stream: grpc.Future | None = None
        self._thread: threading.Thread | None = None
        self._closed = False  # closed by kubelet (replacement, restart, stop)
        self._stream_ended = False
        self.options: dp.DevicePluginOptions | None = None
        self.snapshots = 0  # messages received on this endpoint's stream (updated by the device manager)

    def __repr__(self) -> str:
        return f"PluginEndpoint({self.resource} @ {self.socket_path})"

    @property
    def closed_by_kubelet(self) -> bool:
        return self._closed

    @property
    def stopped(self) -> bool:
        """`endpoint.isStopped()`: the stream ended or kubelet dropped the connection."""
        return self._closed or self._stream_ended

    # -- connect -------------------------------------------------------------------------------

    def dial(self, timeout: float) -> None:
        """Blocking dial with a deadline, like `grpc.DialContext(..., WithBlock())`."""
        channel = grpc.insecure_channel(f"unix://{self.socket_path}", options=[("grpc.default_authority", "localhost")])
        ready = grpc.channel_ready_future(channel)
        try:
            ready.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            # Closing a channel whose connectivity is still polled for this future can block for good
            # (grpc's Channel._close waits for its polling thread): close it on a daemon thread, so
            # neither this handler nor the interpreter's exit waits for it.
            ready.cancel()
            threading.Thread(target=channel.close, name="close-dial", daemon=True).start()
            raise PluginCallError("context deadline exceeded") from None
        with self._lock:
            self._channel = channel
            self._stub = dp_grpc.DevicePluginStub(channel)

    def _require_stub(self) -> dp_grpc.DevicePluginStub:
        with self._lock:
            if self.stopped or self._stub is None:
                raise PluginCallError(f"endpoint {self!r} has been stopped")
            return self._stub

    def fetch_options(self, timeout: float | None) -> dp.DevicePluginOptions:
        stub = self._require_stub()
        self._calls.record(self.resource, "GetDevicePluginOptions", {})
        try:
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=timeout)
        except grpc.RpcError as err:
            raise PluginCallError(format_rpc_error(err)) from err
        except ValueError:  # the channel was closed under us (stream ended / kubelet dropped it)
            raise PluginCallError(CONNECTION_CLOSING) from None
        self.options = options
        return options

    # -- ListAndWatch ----------------------------------------------------------------------------

    def start_list_and_watch(self) -> None:
        """Start the consumer thread (idempotent)."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._consume, name=f"kubelet-law-{self.resource}", daemon=True)
            thread = self._thread
        thread.start()

    def _consume(self) -> None:
        error: str | None = None
        with self._lock:
            stub = self._stub
            if self._closed or stub is None:
                return
            self._calls.record(self.resource, "ListAndWatch", {})
            try:
                stream = stub.ListAndWatch(dp.Empty())
            except ValueError:
                stream = None
            self._stream = stream
        if stream is None:
            with self._lock:
                self._stream_ended = True
            self._on_end(self, CONNECTION_CLOSING)
            return
        try:
            for response in stream:
                if self._closed:
                    break
                self._on_snapshot(self, response)
            else:
                error = "EOF"
        except grpc.RpcError as err:
            error = format_rpc_error(err)
        except Exception as err:  # a callback bug must not kill the thread silently
            log.exception("ListAndWatch consumer for %s failed", self.resource)
            error = repr(err)
        with self._lock:
            self._stream_ended = True
            channel = self._channel
        if channel is not None and not self._closed:
            channel.close()  # kubelet disconnects the client; it never reconnects
        self._on_end(self, error)

    def join(self, timeout: float | None = None) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- unary calls ------------------------------------------------------------------------------

    def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> dp.PreferredAllocationResponse:
        stub = self._require_stub()
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        self._calls.record(
            self.resource,
            "GetPreferredAllocation",
            {
                "available_deviceIDs": list(available),
                "must_include_deviceIDs": list(must_include),
                "allocation_size": size,
            },
        )
        try:
            return stub.GetPreferredAllocation(request)
        except grpc.RpcError as err:
            raise PluginCallError(format_rpc_error(err)) from err
        except ValueError:  # the channel was closed under us (stream ended / kubelet dropped it)
            raise PluginCallError(CONNECTION_CLOSING) from None

    def allocate(self, device_ids: Sequence[str], timeout: float | None = None) -> dp.AllocateResponse:
        stub = self._require_stub()
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=list(device_ids))])
        self._calls.record(self.resource, "Allocate", {"devices_ids": list(device_ids)})
        try:
            return stub.Allocate(request, timeout=timeout)
        except grpc.RpcError as err:
            raise PluginCallError(format_rpc_error(err)) from err
        except ValueError:  # the channel was closed under us (stream ended / kubelet dropped it)
            raise PluginCallError(CONNECTION_CLOSING) from None

    def pre_start_container(
        self, device_ids: Sequence[str], timeout: float = PRE_START_CONTAINER_TIMEOUT
    ) -> dp.PreStartContainerResponse:
        stub = self._require_stub()
        self._calls.record(self.resource, "PreStartContainer", {"devices_ids": list(device_ids)})
        try:
            return stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=list(device_ids)), timeout=timeout)
        except grpc.RpcError as err:
            raise PluginCallError(format_rpc_error(err)) from err
        except ValueError:  # the channel was closed under us (stream ended / kubelet dropped it)
            raise PluginCallError(CONNECTION_CLOSING) from None

    # -- teardown ---------------------------------------------------------------------------------

    def break_connection(self) -> None:
        """The connection breaks under the stream (not kubelet's choice): the consumer sees an
        error, kubelet marks the devices unhealthy and disconnects; it never reconnects."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def close(self) -> None:
        """Kubelet drops the connection: cancel the stream, close the channel; the end callback is told."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stream, channel = self._stream, self._channel
        if stream is not None:
            stream.cancel()
        if channel is not None:
            channel.close()
