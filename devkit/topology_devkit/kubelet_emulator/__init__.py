"""An in-process kubelet emulator for device-plugin tests and demos.

It reproduces what a real kubelet (>= 1.25) does with device plugins, on real unix sockets: the
``v1beta1.Registration`` service (validation, synchronous dial + GetDevicePluginOptions inside Register),
ListAndWatch consumption with full-snapshot semantics and no reconnect, the admission-time allocation
algorithm (GetPreferredAllocation, Allocate, rollback), cached-response replay on container start,
silent deallocation, kubelet restarts, and the pod-resources v1 service with its rate limit.
Reference: ../shared/docs/kubelet-device-plugin.md §2, §3 and §7. Logs go to the ``kubelet-emulator`` logger.

Example::

    with KubeletEmulator(tempfile.mkdtemp(dir="/tmp")) as kubelet:
        ...start a plugin that registers with kubelet.device_plugin_dir / "kubelet.sock"...
        kubelet.wait_registered("topology/book")
        pod = kubelet.admit_pod("default", "p", [Container("c", {"topology/book": 1})])
        env = kubelet.start_container("default", "p", "c")
"""

from typing import TYPE_CHECKING, Any

# Lazy (PEP 562): importing a grpc-free helper module of this package (``names``, ``constants``) must
# not import grpc, so the s390x smoke lane (no grpcio) can run the pure tests that use them.
_WHERE = {
    "CallLog": "calls", "HEALTHY": "constants", "UNHEALTHY": "constants", "VERSION": "constants",
    "KubeletEmulator": "emulator", "AdmissionError": "errors", "ContainerStartError": "errors",
    "KubeletNotRunningError": "errors", "Container": "model", "ContainerAllocation": "model",
    "PluginCall": "model", "Pod": "model", "is_extended_resource_name": "names", "TokenBucket": "ratelimit",
    "RunContainerOptions": "runopts",
}

if TYPE_CHECKING:
    from .calls import CallLog
    from .constants import HEALTHY, UNHEALTHY, VERSION
    from .emulator import KubeletEmulator
    from .errors import AdmissionError, ContainerStartError, KubeletNotRunningError
    from .model import Container, ContainerAllocation, PluginCall, Pod
    from .names import is_extended_resource_name
    from .ratelimit import TokenBucket
    from .runopts import RunContainerOptions


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "HEALTHY",
    "UNHEALTHY",
    "VERSION",
    "AdmissionError",
    "CallLog",
    "Container",
    "ContainerAllocation",
    "ContainerStartError",
    "KubeletEmulator",
    "KubeletNotRunningError",
    "PluginCall",
    "Pod",
    "RunContainerOptions",
    "TokenBucket",
    "is_extended_resource_name",
]
