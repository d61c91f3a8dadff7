"""Errors of the kubelet-facing side, importable without loading gRPC."""


class SocketInUseError(RuntimeError):
    """Another live process serves on our socket path."""


class RegistrationError(RuntimeError):
    """kubelet refused the registration or could not be reached."""
