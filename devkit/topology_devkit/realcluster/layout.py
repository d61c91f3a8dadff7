"""Where the real-cluster lane keeps everything, and the fixed ports and host paths it uses.

The cluster folder (``CLUSTER_DIR``, default ``<repo>/.cluster``) holds the PKI, the component configs and
kubeconfigs, the logs, the pid files, etcd's data and containerd's root. kubelet, containerd's state and
socket and the CNI state use their standard host paths, because that is what the chart mounts by default
(``kubelet.root: /var/lib/kubelet``, ``criSocket: /run/containerd/containerd.sock``): the lane installs
the chart with the flags a user would. ``make cluster-down`` removes all of them again.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# Start order of hack/local-up-cluster.sh: etcd, apiserver, controller manager, scheduler; then the node.
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
COMPONENTS = (*CONTROL_PLANE, "containerd", "kubelet")
# The node's container runtime (make cluster-up RUNTIME=...): containerd 2.4 with Kubernetes 1.37, or CRI-O 1.34 with
# Kubernetes 1.34 (devkit/cluster/build.sh's sets of the same names).
RUNTIMES = ("containerd", "crio")


def components(runtime: str) -> tuple[str, ...]:
    """The lane's components in start order, with ``runtime`` as the node's container runtime."""
    if runtime not in RUNTIMES:
        raise ValueError(runtime)
    return (*CONTROL_PLANE, runtime, "kubelet")

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
APISERVER_PORT = 6443
KCM_PORT = 10257
SCHEDULER_PORT = 10259
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248

SERVICE_CIDR = "10.0.0.0/24"
FIRST_SERVICE_IP = "10.0.0.1"
POD_CIDR = "10.88.0.0/16"
# The bridge's own address (host-local gives the range's first address to the gateway): pods reach the API
# server there, on this machine (there is no kube-proxy to serve the kubernetes Service's address).
BRIDGE_IP = "10.88.0.1"
BRIDGE = "e2e0"
CNI_NETWORK = "topology-e2e"

# kubelet's default --root-dir; KUBELET_ROOT=... at cluster-up moves it (Layout.kubelet_root), as k0s and microk8s do.
KUBELET_ROOT = Path("/var/lib/kubelet")
# Where kubelet's device manager listens whatever --root-dir says (k8s.io/kubelet@v0.37.2
# pkg/apis/deviceplugin/v1beta1/constants.go: DevicePluginPath), so it is also made, and removed, with another root.
DEVICE_PLUGIN_DIR = KUBELET_ROOT / "device-plugins"
POD_LOGS = Path("/var/log/pods")
CONTAINER_LOGS = Path("/var/log/containers")
CONTAINERD_SOCKET = Path("/run/containerd/containerd.sock")
# containerd's default state folder: it makes it 0711, so the agent (uid 0, every capability dropped) can reach the
# socket in it. A socket folder made for the socket alone is 0600 and unreachable without CAP_DAC_OVERRIDE.
CONTAINERD_STATE = Path("/run/containerd")
STATE_MODE = 0o711  # containerd 2.4 cmd/containerd/server/server.go: sys.MkdirAllWithACL(config.State, 0o711)
NRI_SOCKET = Path("/var/run/nri/nri.sock")
# CDI's dynamic spec folder, where the agent's DRA driver writes one spec per prepared claim (the chart's default).
CDI_DIR = Path("/var/run/cdi")
DRA_DRIVER = "topology.s390x.ibm.com"
CNI_STATE = Path("/var/lib/cni/networks") / CNI_NETWORK

PAUSE_IMAGE = "localhost/topology-e2e-pause:3.10"


def node_name() -> str:
    """kubelet's default node name: the host name, lowercased (it must resolve to this machine)."""
    return socket.gethostname().lower()


@dataclass(frozen=True)
class Layout:
    root: Path

    @classmethod
    def from_env(cls) -> Layout:
        return cls(Path(os.environ.get("CLUSTER_DIR") or REPO / ".cluster").resolve())

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni" / "net.d"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def pidfile(self, component: str) -> Path:
        return self.run / f"{component}.pid"

    def component_kubeconfig(self, component: str) -> Path:
        return self.etc / f"{component}.kubeconfig"

    @property
    def runtime_file(self) -> Path:
        """The runtime the cluster was brought up with (``up`` writes it, ``down`` removes it)."""
        return self.root / "runtime"

    def runtime(self) -> str:
        """The runtime of the cluster that is up (or was, until ``down``), else the one asked for in ``RUNTIME``
        (containerd by default)."""
        try:
            recorded = self.runtime_file.read_text().split()
        except OSError:
            recorded = []
        if recorded and recorded[0] in RUNTIMES:
            return recorded[0]
        return requested_runtime()

    @property
    def kubelet_root_file(self) -> Path:
        """kubelet's --root-dir of the cluster that is up (``up`` writes it, ``down`` removes it)."""
        return self.root / "kubelet-root"

    def kubelet_root(self) -> Path:
        """kubelet's --root-dir: the one recorded at ``up``, else ``KUBELET_ROOT`` (checked by
        :func:`requested_kubelet_root`), else kubelet's default."""
        try:
            recorded = self.kubelet_root_file.read_text().strip()
        except OSError:
            recorded = ""
        return Path(recorded) if recorded else requested_kubelet_root()

    def skewed(self) -> bool:
        """The control plane runs the containerd set's Kubernetes (1.37) beside the CRI-O set's kubelet (1.34):
        recorded at ``up`` from ``SKEW=1``."""
        try:
            recorded = self.runtime_file.read_text().split()
        except OSError:
            return os.environ.get("SKEW") == "1"
        return "skew" in recorded[1:]


def requested_kubelet_root() -> Path:
    """``KUBELET_ROOT`` (kubelet's default when unset or empty). ``down`` removes the whole folder, so it must be an
    absolute path whose last part is ``kubelet`` (``/var/lib/k0s/kubelet``); ValueError otherwise."""
    value = os.environ.get("KUBELET_ROOT") or str(KUBELET_ROOT)
    path = Path(value)
    if not path.is_absolute() or path.name != "kubelet" or ".." in path.parts:
        raise ValueError(f"KUBELET_ROOT is an absolute path ending in /kubelet (cluster-down removes it), "
                         f"not {value!r}")
    return path


def requested_runtime() -> str:
    """``RUNTIME`` (containerd when unset or empty); ValueError for another name."""
    name = os.environ.get("RUNTIME") or "containerd"
    if name not in RUNTIMES:
        raise ValueError(f"RUNTIME is one of {', '.join(RUNTIMES)}, not {name!r}")
    return name
