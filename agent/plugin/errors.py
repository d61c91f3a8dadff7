"""Errors of the kubelet-facing side, importable without loading gRPC."""

from agent.errors import StartupError


class SocketInUseError(StartupError):
    """Our socket cannot be served: another live process has it, or the path is unusable."""


class RegistrationError(RuntimeError):
    """kubelet refused the registration or could not be reached."""
