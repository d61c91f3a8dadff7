"""Registering a served resource with kubelet's Registration service (kubelet.sock)."""

from __future__ import annotations

from pathlib import Path

import grpc

from agent._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from agent.errors import RegistrationAbandoned, RegistrationError
from agent.plugin.servicer import plugin_options

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
# A channel of its own subchannel pool connects afresh: gRPC otherwise shares a subchannel that
# failed while kubelet was down, and keeps failing calls until its reconnect backoff (~1 s) ends.
FRESH_CONNECTION = [("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 50),
                    ("grpc.min_reconnect_backoff_ms", 50)]


class PendingRegistration:
    """A Register call under way; kubelet may restart meanwhile, so it can be abandoned."""

    def __init__(self, kubelet_socket: Path, endpoint: str, resource: str, timeout: float) -> None:
        self.kubelet_socket = kubelet_socket
        self.resource = resource
        request = api_pb2.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource,
                                          options=plugin_options())
        self._channel = grpc.insecure_channel(f"unix://{kubelet_socket}", options=FRESH_CONNECTION)
        self.future = api_pb2_grpc.RegistrationStub(self._channel).Register.future(
            request, timeout=timeout, wait_for_ready=False)

    def done(self) -> bool:
        return bool(self.future.done())

    def result(self) -> None:
        """Raise RegistrationError unless kubelet accepted the registration (call once done)."""
        try:
            self.future.result(timeout=0)
        except grpc.FutureCancelledError:
            raise RegistrationAbandoned(f"registration of {self.resource} abandoned") from None
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise RegistrationError(f"kubelet at {self.kubelet_socket} refused {self.resource}: "
                                    f"{code.name if code else 'error'}: {details}") from None
        finally:
            self.close()

    def abandon(self) -> None:
        self.future.cancel()
        self.close()

    def close(self) -> None:
        self._channel.close()
