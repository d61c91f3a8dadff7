"""Errors raised by the emulator, and Go-style formatting of gRPC errors for kubelet-like messages."""

from __future__ import annotations

import grpc

from .constants import REASON_UNEXPECTED_ADMISSION


class AdmissionError(Exception):
    """A pod was rejected at admission, with kubelet's reason and message.

    ``reason`` is ``"UnexpectedAdmissionError"`` for any device-manager failure (the message then reads
    ``"Allocate failed due to <err>, which is unexpected"``) or ``"OutOf<resource>"`` when the node does not
    offer the extended resource at all (predicate admission).
    """

    def __init__(self, reason: str, message: str, *, pod: str = "") -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.pod = pod

    @classmethod
    def unexpected(cls, error: str, *, pod: str = "") -> AdmissionError:
        """`admission.GetPodAdmitResult` wrapping of a device-manager error."""
        return cls(REASON_UNEXPECTED_ADMISSION, f"Allocate failed due to {error}, which is unexpected", pod=pod)

    @classmethod
    def insufficient(cls, resource: str, requested: int, used: int, capacity: int, *, pod: str = "") -> AdmissionError:
        """Predicate admission failure (`InsufficientResourceError`)."""
        return cls(
            f"OutOf{resource}",
            f"Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}",
            pod=pod,
        )


class ContainerStartError(RuntimeError):
    """A container (re)start failed before the runtime was asked (e.g. PreStartContainer error)."""


class KubeletNotRunningError(RuntimeError):
    """The emulated kubelet is stopped or in the down phase of a restart."""


class DeviceManagerError(Exception):
    """Internal: a device-manager error with kubelet's wording (wrapped into AdmissionError)."""


class PluginCallError(Exception):
    """Internal: an RPC to a plugin failed; str() is the Go-style error text kubelet would print."""


class PluginConnectError(Exception):
    """Internal: Register failed after validation (dial or GetDevicePluginOptions)."""


def go_code_name(code: grpc.StatusCode) -> str:
    """Go's `codes.Code.String()` for a Python status code (``DEADLINE_EXCEEDED`` -> ``DeadlineExceeded``)."""
    if code is grpc.StatusCode.CANCELLED:
        return "Canceled"
    if code is grpc.StatusCode.OK:
        return "OK"
    return "".join(part.capitalize() for part in code.name.split("_"))


def format_rpc_error(error: BaseException) -> str:
    """`fmt.Sprintf("%v", err)` of a gRPC status error: ``rpc error: code = X desc = Y``."""
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    if isinstance(error, grpc.RpcError) and callable(code) and callable(details):
        status = code()
        if isinstance(status, grpc.StatusCode):
            return f"rpc error: code = {go_code_name(status)} desc = {details() or ''}"
    return str(error)


def go_quote(value: str) -> str:
    """Rough `strconv.Quote`/`%q`: double quotes with backslash escapes."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'
