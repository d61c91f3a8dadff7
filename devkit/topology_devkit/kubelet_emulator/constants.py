"""Kubelet constants the emulator reproduces.

Values from kubelet sources; see ../shared/docs/kubelet-device-plugin.md §1.2, §2.8, §3.1.
"""

from __future__ import annotations

from typing import Final

LOGGER_NAME: Final = "kubelet-emulator"

# pkg/apis/deviceplugin/v1beta1/constants.go
VERSION: Final = "v1beta1"
SUPPORTED_VERSIONS: Final[tuple[str, ...]] = (VERSION,)
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
KUBELET_SOCKET: Final = "kubelet.sock"
PRE_START_CONTAINER_TIMEOUT: Final = 30.0  # KubeletPreStartContainerRPCTimeoutInSecs

# Directory layout below the kubelet root dir.
DEVICE_PLUGINS_DIR: Final = "device-plugins"
POD_RESOURCES_DIR: Final = "pod-resources"
POD_RESOURCES_SOCKET: Final = "kubelet.sock"
CHECKPOINT_FILE: Final = "kubelet_internal_checkpoint"  # devicemanager types.go

# devicemanager / plugin client timing
DIAL_TIMEOUT: Final = 10.0  # blocking dial of the plugin endpoint during Register
ENDPOINT_STOP_GRACE_PERIOD: Final = 300.0  # endpointStopGracePeriod, 5 minutes

# pkg/kubelet/apis/podresources/grpc/ratelimit.go
POD_RESOURCES_QPS: Final = 100.0
POD_RESOURCES_BURST: Final = 10

# sun_path is 108 bytes including the terminating NUL.
MAX_UNIX_SOCKET_PATH: Final = 107

# Admission reasons (pkg/kubelet/lifecycle, pkg/kubelet/cm/admission)
REASON_UNEXPECTED_ADMISSION: Final = "UnexpectedAdmissionError"

# The NUMA key devicemanager uses for devices without topology (nodeWithoutTopology).
NODE_WITHOUT_TOPOLOGY: Final = -1
