"""The real-cluster lane's control plane for the cluster benches that bring their own (no kubelet, no runtime): etcd,
kube-apiserver (audit log on), kube-controller-manager and kube-scheduler from the lane's binaries
(devkit/cluster/build.sh), on the lane's ports, in a scratch folder; fake Node objects; real agents on them.

Used by ``agents_per_apiserver.py`` (real agents, one per fake node) and ``simulated_nodes.py`` (KWOK's fake nodes).
Needs root and the machine lock (the lane's ports); the lane must be down. :meth:`ControlPlane.down` leaves nothing
running. The components' CPU seconds and memory come from ``/proc`` (:func:`proc_usage`).
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "topology-system"  # audited by the lane's audit policy (configs.AUDITED_GROUP)
DRIVER = "topology.s390x.ibm.com"
SNAPSHOT = ROOT / "agent" / "data" / "z16-lpar.json"
PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class ScaleError(RuntimeError):
    pass


def kubectl(bins: Path, kubeconfig: Path, *args: str, doc: Any = None, timeout: float = 120) -> str:
    done = subprocess.run([str(bins / "kubectl"), "--kubeconfig", str(kubeconfig), *args], text=True,
                          capture_output=True, timeout=timeout, check=False,
                          input=None if doc is None else json.dumps(doc))
    if done.returncode != 0:
        raise ScaleError(f"kubectl {' '.join(args[:3])}: {done.stderr.strip()[-400:]}")
    return done.stdout


def node_status(name: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """A Ready status of a z16-sized node (64 CPUs, 110 pods), with ``extra`` in capacity and allocatable."""
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "110", **(extra or {})}
    now = datetime.now().astimezone().isoformat(timespec="seconds")
    return {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [
        {"type": "Ready", "status": "True", "reason": "BenchScale", "message": f"a fake node ({name})",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}}


def scheduler_config(text: str, qps: int | None) -> str:
    """The lane's KubeSchedulerConfiguration with the client's QPS and burst set to ``qps`` (None: as it is)."""
    if qps is None:
        return text
    if "clientConnection:\n" not in text:
        raise ScaleError("the lane's scheduler configuration has no clientConnection to set the QPS in")
    return text.replace("clientConnection:\n", f"clientConnection:\n  qps: {qps}\n  burst: {qps}\n", 1)


def controller_manager_argv(argv: list[str], *, node_lifecycle: bool, qps: int | None) -> list[str]:
    """The lane's controller manager, without its node lifecycle controller (which would mark nodes with no kubelet
    heartbeats unreachable) unless ``node_lifecycle``, and with its client's QPS at ``qps`` (None: its default)."""
    out = list(argv)
    if not node_lifecycle:
        out = [a.replace("--controllers=*", "--controllers=*,-node-lifecycle-controller") for a in out]
    if qps is not None:
        out += [f"--kube-api-qps={qps}", f"--kube-api-burst={qps}"]
    return out


@dataclass(frozen=True)
class Usage:
    cpu_s: float  # user + system since the process started
    rss: int  # bytes now
    hwm: int  # peak RSS, bytes


def proc_usage(pid: int) -> Usage | None:
    """A process's CPU seconds and memory from /proc; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    kb = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines()
          if line.startswith(("VmRSS:", "VmHWM:"))}
    return Usage(cpu_s=(int(fields[11]) + int(fields[12])) / ticks, rss=kb.get("VmRSS", 0) * 1024,
                 hwm=kb.get("VmHWM", 0) * 1024)


class ControlPlane:
    """The lane's etcd, API server, controller manager and scheduler in ``work/cluster``."""

    def __init__(self, work: Path, *, node_lifecycle: bool = False, scheduler_qps: int | None = None,
                 controller_qps: int | None = None) -> None:
        from topology_devkit.realcluster import cluster
        from topology_devkit.realcluster.layout import Layout

        self.cluster = cluster
        self.work = work
        self.layout = Layout(work / "cluster")
        self.bins = cluster.bin_dir()
        self.kubeconfig = self.layout.kubeconfig
        self.node_lifecycle = node_lifecycle
        self.scheduler_qps = scheduler_qps
        self.controller_qps = controller_qps
        self.extra: list[str] = []  # components started beside the plane (procs.start), stopped first

    def k(self, *args: str, doc: Any = None, timeout: float = 120) -> str:
        return kubectl(self.bins, self.kubeconfig, *args, doc=doc, timeout=timeout)

    def up(self) -> None:
        cluster = self.cluster
        cluster._probe_host()
        cluster._write_configs(self.layout, self.bins, "none")
        sched = self.layout.etc / "scheduler.yaml"
        sched.write_text(scheduler_config(sched.read_text(), self.scheduler_qps))
        from topology_devkit.realcluster.procs import start

        for component in PLANE:
            if component == "kube-controller-manager":
                argv = controller_manager_argv(cluster._argv(self.layout, self.bins, component),
                                               node_lifecycle=self.node_lifecycle, qps=self.controller_qps)
                start(self.layout, component, argv)
                cluster._wait_healthy(self.layout, component)
            else:
                cluster.start_component(self.layout, component, self.bins)
        self.k("create", "namespace", NAMESPACE)
        self.k("create", "clusterrolebinding", "bench-scale-agents", "--clusterrole", "cluster-admin",
               f"--group=system:serviceaccounts:{NAMESPACE}")

    def deviceclasses(self) -> None:
        """The chart's DeviceClasses (DRA mode), as ``helm template`` renders them."""
        helm = os.environ.get("HELM") or str(ROOT / ".tools" / "bin" / "helm")
        # Offline, helm needs the cluster's version (its own default is below the chart's kubeVersion).
        kube_version = json.loads((self.bins / "build-info.json").read_text())["kubernetes"]
        rendered = subprocess.run([helm, "template", "bench", str(ROOT / "deploy" / "helm" / "s390x-topology-agent"),
                                   "--kube-version", kube_version,
                                   "--set", "mode=dra", "--show-only", "templates/deviceclasses.yaml"],
                                  capture_output=True, text=True, check=True, timeout=120).stdout
        subprocess.run([str(self.bins / "kubectl"), "--kubeconfig", str(self.kubeconfig), "apply", "-f", "-"],
                       input=rendered, text=True, capture_output=True, check=True, timeout=120)

    def start_extra(self, component: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        from topology_devkit.realcluster.procs import start

        start(self.layout, component, argv, env)
        self.extra.append(component)

    def pid(self, component: str) -> int | None:
        from topology_devkit.realcluster.procs import read_pid

        return read_pid(self.layout, component)

    def usage(self) -> dict[str, Usage]:
        """Each running component's CPU seconds and memory (the plane's and the extra ones)."""
        out: dict[str, Usage] = {}
        for component in (*PLANE, *self.extra):
            pid = self.pid(component)
            got = proc_usage(pid) if pid is not None else None
            if got is not None:
                out[component] = got
        return out

    def admin_context(self, verify: bool = True) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.layout.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.layout.pki / "admin.crt"), str(self.layout.pki / "admin.key"))
        if not verify:  # the scheduler serves a self-signed certificate
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def scheduler_metrics(self) -> str:
        from topology_devkit.realcluster.layout import SCHEDULER_PORT

        with urllib.request.urlopen(f"https://127.0.0.1:{SCHEDULER_PORT}/metrics", timeout=30,
                                    context=self.admin_context(verify=False)) as response:
            return str(response.read().decode())

    def etcd_metrics(self) -> str:
        with urllib.request.urlopen("http://127.0.0.1:2381/metrics", timeout=30) as response:
            return str(response.read().decode())

    def down(self) -> None:
        from topology_devkit.realcluster.procs import stop

        for component in reversed(self.extra):
            stop(self.layout, component)
        for component in reversed(PLANE):
            stop(self.layout, component)


class Agents:
    """Real ``topology-agent serve --mode dra`` processes on this host, one per fake node, each with a ServiceAccount
    of its own (``bench-agent-NNN``: the audit log tells them apart) and scratch kubelet folders."""

    def __init__(self, plane: ControlPlane, *, levels: str = "book,socket") -> None:
        self.plane = plane
        self.levels = levels
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str, account: str) -> None:
        """Run an agent for ``node`` (its Node object exists) as ServiceAccount ``account``."""
        plane = self.plane
        plane.k("-n", NAMESPACE, "create", "serviceaccount", account)
        token = plane.k("-n", NAMESPACE, "create", "token", account, "--duration", "4h").strip()
        server = json.loads(plane.kubeconfig.read_text())["clusters"][0]["cluster"]
        home = plane.work / "agents" / node
        for d in ("kubelet", "registry", "plugin", "cdi"):
            (home / d).mkdir(parents=True, exist_ok=True)
        config = home / "kubeconfig"
        config.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "a",
            "clusters": [{"name": "c", "cluster": server}],
            "contexts": [{"name": "a", "context": {"cluster": "c", "user": "a"}}],
            "users": [{"name": "a", "user": {"token": token}}]}))
        args = ["serve", "--mode", "dra", "--topology-file", str(SNAPSHOT), "--levels", self.levels,
                "--kubelet-dir", str(home / "kubelet"), "--dra-registry-dir", str(home / "registry"),
                "--dra-plugin-dir", str(home / "plugin"), "--cdi-dir", str(home / "cdi"),
                "--pod-resources-interval", "0", "--metrics-port", "0", "--cpuset-enforcement", "none",
                "--log-format", "text"]
        with (home / "agent.log").open("ab") as out:
            self.procs[node] = subprocess.Popen(
                [str(ROOT / ".venv" / "bin" / "topology-agent"), *args], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env={**os.environ, "NODE_NAME": node, "KUBECONFIG": str(config)})

    def dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
