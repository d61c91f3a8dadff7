"""Errors of the kubelet-facing side, importable without loading gRPC."""

from agent.errors import StartupError


class SocketInUseError(StartupError):
    """Another live process serves on our socket path."""


class RegistrationError(RuntimeError):
    """kubelet refused the registration or could not be reached."""
