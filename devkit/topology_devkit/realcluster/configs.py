"""The configuration files of the real-cluster lane: kubeconfigs, containerd (config version 3), CNI, the
scheduler and the kubelet. Plain text renderers; nothing here starts a process.

The kubelet settings follow ``hack/local-up-cluster.sh`` (``start_kubelet``) plus what this machine needs
(../shared/docs/real-cluster.md): ``failCgroupV1: false`` (kubelet refuses cgroup v1 by default since 1.35,
KEP-5573), ``cgroupDriver: cgroupfs`` (no systemd here), ``failSwapOn: false``, x509 client CA and webhook
authorization, serving certificates of our own instead of TLS bootstrap, and no image garbage collection
(no registry: an image removed could never come back).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from .layout import (
    APISERVER_PORT,
    BRIDGE,
    CNI_NETWORK,
    CONTAINERD_SOCKET,
    CONTAINERD_STATE,
    KUBELET_HEALTHZ_PORT,
    KUBELET_PORT,
    NRI_SOCKET,
    PAUSE_IMAGE,
    POD_CIDR,
    Layout,
)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(layout: Layout, user: str, client: str) -> str:
    """A kubeconfig for ``user`` with the client pair ``pki/<client>.{crt,key}`` embedded (JSON is YAML)."""
    pki = layout.pki
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "topology-e2e",
        "clusters": [{"name": "topology-e2e", "cluster": {
            "server": f"https://127.0.0.1:{APISERVER_PORT}",
            "certificate-authority-data": _b64(pki / "ca.crt")}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": _b64(pki / f"{client}.crt"),
            "client-key-data": _b64(pki / f"{client}.key")}}],
        "contexts": [{"name": "topology-e2e", "context": {"cluster": "topology-e2e", "user": user}}],
    }, indent=1) + "\n"


def containerd_config(layout: Layout, bin_dir: Path) -> str:
    runc = bin_dir / "runc"
    return f"""version = 4
root = '{layout.containerd_root / "root"}'
state = '{CONTAINERD_STATE}'

[grpc]
  address = '{CONTAINERD_SOCKET}'

[ttrpc]
  address = '{CONTAINERD_SOCKET}.ttrpc'

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '{layout.containerd_root / "opt"}'

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{PAUSE_IMAGE}'

  [plugins.'io.containerd.cri.v1.runtime']
    # This VM lacks CAP_SYS_RESOURCE: the pause container's oom_score_adj of -998 would fail
    # (../shared/docs/real-containerd.md).
    restrict_oom_score_adj = true
    disable_apparmor = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '{runc}'
          Root = '{CONTAINERD_STATE / "runc"}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{bin_dir / "cni"}']
      conf_dir = '{layout.cni_conf}'

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '{NRI_SOCKET}'
"""


def cni_conflist() -> str:
    """A bridge network without masquerading (no iptables rules): pods only need an address to be Ready."""
    return json.dumps({
        "cniVersion": "1.0.0", "name": CNI_NETWORK,
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": POD_CIDR}]}},
            {"type": "loopback"},
        ],
    }, indent=1) + "\n"


AUDITED_GROUP = "system:serviceaccounts:topology-system"  # the chart's accounts in the lane's namespace (e2e.sh)


def audit_policy() -> str:
    """The API server's audit policy: every request of the agent's own accounts at Metadata (who, verb, resource,
    code; no bodies), nothing else. bench/cluster/dra.py counts the agent's requests per hour from it."""
    return f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["{AUDITED_GROUP}"]
  - level: None
"""


def scheduler_config(layout: Layout) -> str:
    return f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {layout.component_kubeconfig("scheduler")}
leaderElection:
  leaderElect: false
"""


def kubelet_config(layout: Layout, cpu_manager_policy: str = "none", runtime_socket: Path = CONTAINERD_SOCKET) -> str:
    """kubelet's KubeletConfiguration; ``runtime_socket`` is the node runtime's CRI socket (containerd's or CRI-O's).
    Every field is known to kubelet 1.34 as to 1.37 (``failCgroupV1`` exists since 1.31; its default became true in
    1.35)."""
    pki = layout.pki
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {KUBELET_HEALTHZ_PORT}
tlsCertFile: {pki / "kubelet-serving.crt"}
tlsPrivateKeyFile: {pki / "kubelet-serving.key"}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {pki / "ca.crt"}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{runtime_socket}
resolvConf: {layout.etc / "resolv.conf"}
cpuManagerPolicy: {cpu_manager_policy}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
serializeImagePulls: false
# The kubelet rewrites a ConfigMap volume at a pod's periodic sync: every 10 s here instead of the default 1 min, so
# a fake-topology snapshot changed under a running agent (tests/e2e/test_dra_shapes.py, a CPU taken offline) reaches
# it in seconds.
syncFrequency: 10s
"""
