"""Where kubelet and container runtimes keep their files, as the agent's defaults (plain values;
imported by the command line, which must start fast)."""

from __future__ import annotations

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_CPU_MANAGER_STATE = "/var/lib/kubelet/cpu_manager_state"
DEFAULT_KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
CRI_SOCKETS: tuple[str, ...] = ("/run/containerd/containerd.sock", "/run/crio/crio.sock")
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"  # containerd's and CRI-O's default
# DRA mode: kubelet's plugin watcher directory, the driver's own plugin directory, CDI's dynamic spec directory.
DEFAULT_DRA_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_DRA_PLUGIN_DIR = "/var/lib/kubelet/plugins/topology.s390x.ibm.com"
DEFAULT_CDI_DIR = "/var/run/cdi"
