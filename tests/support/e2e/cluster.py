"""The cluster the end-to-end suite runs against (tests/e2e/conftest.py picks it): why it is not usable, and
E2EEnv, the lane's way to it (kubectl, helm, the node's shell, a kubelet restart)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.env import REPO

DEFAULT_CLUSTER = "topology-e2e"


HOW = ("run `make e2e` (a real cluster on this machine) or `make kind-test` (devkit/kind/run.sh, needs Docker, kind "
       "and kubectl)")




WORKER_LABEL = "topology-e2e/worker"


def _run(argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:200]


def probe(cluster: str) -> str | None:
    """None when the kind cluster is usable, else why not (in the order a person would fix it)."""
    if shutil.which("docker") is None:
        return "no TOPOLOGY_E2E_KUBECONFIG and docker is not on PATH"
    try:
        info = _run(["docker", "info", "--format", "{{.ServerVersion}}"])
    except subprocess.TimeoutExpired:
        return "Docker engine not reachable (docker info timed out)"
    if info.returncode != 0:
        return f"Docker engine not reachable (docker info: {_first_line(info.stderr or info.stdout)})"
    for tool in ("kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    clusters = _run(["kind", "get", "clusters"]).stdout.split()
    if cluster not in clusters:
        return f"kind cluster {cluster!r} not found (have: {', '.join(clusters) or 'none'})"
    ready = _run(["kubectl", "--context", f"kind-{cluster}", "get", "--raw", "/readyz"])
    if ready.returncode != 0:
        return f"API server of kind-{cluster} not ready: {_first_line(ready.stderr)}"
    return None


def probe_kubeconfig(kubeconfig: Path) -> str | None:
    if not kubeconfig.is_file():
        return f"TOPOLOGY_E2E_KUBECONFIG={kubeconfig} does not exist (is the cluster up? make cluster-up)"
    try:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(kubeconfig),
                                            context=os.environ.get("TOPOLOGY_E2E_CONTEXT") or None)
        client.VersionApi(api).get_code(_request_timeout=10)
    except Exception as exc:
        return f"the API server of {kubeconfig} does not answer: {_first_line(str(exc))}"
    return None


# The local lane's CRI sockets by runtime (devkit/topology_devkit/realcluster: layout.py, crio.py) and the values the
# release gets for each on top of devkit/cluster/e2e-values.yaml.
CRI_SOCKETS = {"containerd": Path("/run/containerd/containerd.sock"), "crio": Path("/run/crio/crio.sock")}
RUNTIME_VALUES = {"containerd": [], "crio": ["-f", str(REPO / "devkit" / "cluster" / "e2e-values-crio.yaml")]}


def lane_values(runtime: str) -> list[str]:
    """What e2e.sh adds to devkit/cluster/e2e-values.yaml: the runtime's values, and kubelet's root when the lane
    moved it (KUBELET_ROOT at cluster-up: --set kubelet.root, as docs/admin/kubelet-roots.md says)."""
    root = os.environ.get("TOPOLOGY_E2E_KUBELET_ROOT") or "/var/lib/kubelet"
    return [*RUNTIME_VALUES[runtime], *([] if root == "/var/lib/kubelet" else ["--set", f"kubelet.root={root}"])]


@dataclass(frozen=True)
class E2EEnv:
    lane: str  # local | kind | remote
    kubeconfig: Path | None
    context: str | None
    cluster: str
    namespace: str
    release: str
    image: str
    workload_image: str
    snapshots: Path
    prefix: str = "topology"
    runtime: str = "containerd"  # the node's container runtime (the local lane: containerd or crio)

    @property
    def cri_socket(self) -> Path:
        """The node runtime's CRI socket (the local lane's node is this machine)."""
        return CRI_SOCKETS[self.runtime]

    def node_shell(self, node: str, script: str, timeout: float = 30) -> str:
        """Run ``script`` with sh on ``node`` (here, or in the kind node's container) and return its stdout."""
        if self.lane == "local":
            argv = ["sh", "-c", script]
        elif self.lane == "kind":
            argv = [os.environ.get("TOPOLOGY_E2E_ENGINE") or "docker", "exec", node, "sh", "-c", script]
        else:
            pytest.skip(f"the {self.lane} lane has no access to the node's shell")
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True).stdout

    def kubectl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The lane's kubectl against its cluster (the local lane's own build, else kubectl on PATH)."""
        binary = os.environ.get("TOPOLOGY_E2E_KUBECTL") or "kubectl"
        where = ["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else []
        where += ["--context", self.context] if self.context else []
        return subprocess.run([binary, *where, *args], capture_output=True, text=True, timeout=timeout, check=True)

    def owns_install(self) -> bool:
        """The lane installed the release and says how (the local lane; the kind lane with TOPOLOGY_E2E_VALUES)."""
        return self.lane == "local" or (self.lane == "kind" and bool(os.environ.get("TOPOLOGY_E2E_VALUES")))

    def helm(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        """helm against the lane's cluster, in the release's namespace (a lane whose install this suite owns)."""
        if not self.owns_install():
            pytest.skip(f"the {self.lane} lane's install is not this suite's to change")
        argv = [os.environ.get("TOPOLOGY_E2E_HELM") or "helm", *args, "--namespace", self.namespace,
                "--kubeconfig", str(self.kubeconfig)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout}{done.stderr}"
        return done

    def helm_upgrade(self, *extra: str, install: bool = False, wait: bool = True) -> None:
        """``helm upgrade`` (``--install``: also when the release is gone) the release with the lane's own values
        plus ``extra`` (the local lane; the kind lane: the values file it installed with, TOPOLOGY_E2E_VALUES);
        ``wait=False``: return once the release is changed (an agent expected never to be ready)."""
        if not self.owns_install():
            pytest.skip(f"the {self.lane} lane's install is not this suite's to change")
        values = os.environ.get("TOPOLOGY_E2E_VALUES")
        if values:
            given = ["-f", values]
        else:
            snapshot = self.snapshots / "default.json"
            given = ["-f", str(REPO / "devkit" / "cluster" / "e2e-values.yaml"), *lane_values(self.runtime),
                     "--set-file", f"fakeTopology.snapshots.default\\.json={snapshot}"]
        subprocess.run([os.environ.get("TOPOLOGY_E2E_HELM") or "helm", "upgrade", *(["--install"] if install else []),
                        self.release,
                        str(REPO / "deploy" / "helm" / "s390x-topology-agent"), "--namespace", self.namespace,
                        "--kubeconfig", str(self.kubeconfig), *given, *extra,
                        *(["--wait", "--timeout", "180s"] if wait else [])], check=True, timeout=240,
                       capture_output=True, text=True)
        if wait:
            self.wait_for_rollout()

    def wait_for_rollout(self) -> None:
        """Until every node runs a ready agent of the release's current revision. helm's --wait does not wait for
        that: it counts a DaemonSet ready once NumberReady >= desired - maxUnavailable, which is 0 on one node
        (helm pkg/kube/ready.go daemonSetReady), so a pod created right after the upgrade met kubelet with the old
        agent gone and the new one not registered: "UnexpectedAdmissionError ... no healthy devices present"."""
        for daemonset in self.kubectl("-n", self.namespace, "get", "daemonset", "-o", "name", "-l",
                                      f"app.kubernetes.io/instance={self.release}").stdout.split():
            self.kubectl("-n", self.namespace, "rollout", "status", daemonset, "--timeout=180s", timeout=200)

    def lane_log(self, component: str) -> Path:
        """A component's log on the local lane (devkit/topology_devkit/realcluster/layout.py: CLUSTER_DIR/logs)."""
        return Path(os.environ.get("CLUSTER_DIR") or REPO / ".cluster") / "logs" / f"{component}.log"

    def restart_runtime(self, crash: bool = False) -> None:
        """Stop the node's container runtime (SIGTERM; ``crash``: SIGKILL) and start it again (the local lane)."""
        if self.lane != "local":
            pytest.skip(f"the {self.lane} lane cannot restart the node's runtime")
        how = "crash" if crash else "restart"
        subprocess.run([sys.executable, "-m", "topology_devkit.realcluster", how, "runtime"], check=True, timeout=180,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devkit'}"})

    def restart_kubelet(self, node: str, cpu_manager_policy: str | None = None) -> None:
        if self.lane == "local":
            policy = ["--cpu-manager-policy", cpu_manager_policy] if cpu_manager_policy else []
            subprocess.run([sys.executable, "-m", "topology_devkit.realcluster", "restart-kubelet", *policy],
                           check=True, timeout=180, cwd=REPO,
                           env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devkit'}"})
        elif cpu_manager_policy is not None:
            pytest.skip(f"the {self.lane} lane cannot change the kubelet's CPU manager policy")
        elif self.lane == "kind":
            subprocess.run([os.environ.get("TOPOLOGY_E2E_ENGINE") or "docker", "exec", node, "systemctl", "restart",
                            "kubelet"], check=True, timeout=120)
        else:
            pytest.skip(f"the {self.lane} lane cannot restart a kubelet")
