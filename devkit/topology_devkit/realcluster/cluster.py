"""Start, stop and inspect a single-node cluster of upstream components on this machine, all on loopback.

``up`` makes the PKI and configs, starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler
(the order and flags of kubernetes' ``hack/local-up-cluster.sh``), then containerd and the kubelet, imports
the images (no registry) and waits until the Node is Ready. A component that does not come up ends ``up``
with its last log lines. ``down`` stops every process it started (by pid file), removes the pods' sandboxes
through CRI (CNI cleans the network), the mounts, cgroups, bridge and state it left, and keeps the logs.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from . import configs, pki
from .layout import (
    APISERVER_PORT,
    BRIDGE,
    BRIDGE_IP,
    CDI_DIR,
    CNI_STATE,
    COMPONENTS,
    CONTAINER_LOGS,
    CONTAINERD_SOCKET,
    CONTAINERD_STATE,
    DRA_DRIVER,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    FIRST_SERVICE_IP,
    KCM_PORT,
    KUBELET_HEALTHZ_PORT,
    KUBELET_ROOT,
    NRI_SOCKET,
    POD_LOGS,
    REPO,
    SCHEDULER_PORT,
    SERVICE_CIDR,
    STATE_MODE,
    Layout,
    node_name,
)
from .mounts import mounts_under, remove_tree, unmount
from .procs import ClusterError, alive, crash, kill_and_wait, read_pid, run, running, start, stop, tail, wait_until

BUILD = REPO / "devkit" / "cluster" / "build.sh"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def bin_dir() -> Path:
    """The cached binaries of the current pins; ClusterError when `make cluster-build` has not run."""
    folder = Path(run([str(BUILD), "--print"]).stdout.strip())
    if not (folder / "build-info.json").exists():
        raise ClusterError(f"the cluster binaries are not built ({folder} missing): run `make cluster-build`")
    return folder


def _context(layout: Layout, client: str = "admin") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    ctx.load_cert_chain(str(layout.pki / f"{client}.crt"), str(layout.pki / f"{client}.key"))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
    except (OSError, ssl.SSLError) as err:
        return 0, str(err)


def _ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    return _get(url, ctx)[0] == 200


def health_urls(layout: Layout) -> dict[str, tuple[str, ssl.SSLContext | None]]:
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # the controller manager and scheduler serve self-signed certificates
    return {
        "etcd": (f"http://127.0.0.1:{ETCD_CLIENT_PORT}/health", None),
        "kube-apiserver": (f"https://127.0.0.1:{APISERVER_PORT}/readyz", _context(layout)),
        "kube-controller-manager": (f"https://127.0.0.1:{KCM_PORT}/healthz", insecure),
        "kube-scheduler": (f"https://127.0.0.1:{SCHEDULER_PORT}/healthz", insecure),
        "kubelet": (f"http://127.0.0.1:{KUBELET_HEALTHZ_PORT}/healthz", None),
    }


def kubectl(layout: Layout, *args: str, timeout: float = 60.0, check: bool = True,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    return run([str(bin_dir() / "kubectl"), "--kubeconfig", str(layout.kubeconfig), *args], timeout=timeout,
               check=check, input_text=input_text)


# --- configs -------------------------------------------------------------------------------------------------

def _write_configs(layout: Layout, bins: Path, cpu_manager_policy: str) -> None:
    node = node_name()
    pki.make_pki(layout.pki, node, ["127.0.0.1", FIRST_SERVICE_IP, BRIDGE_IP],
                 ["localhost", node, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                  "kubernetes.default.svc.cluster.local"])
    layout.etc.mkdir(parents=True, exist_ok=True)
    layout.kubeconfig.write_text(configs.kubeconfig(layout, "admin", "admin"))
    layout.kubeconfig.chmod(0o600)
    for component, client in (("controller-manager", "controller-manager"), ("scheduler", "scheduler"),
                              ("kubelet", "kubelet")):
        layout.component_kubeconfig(component).write_text(configs.kubeconfig(layout, component, client))
    (layout.etc / "containerd.toml").write_text(configs.containerd_config(layout, bins))
    (layout.etc / "scheduler.yaml").write_text(configs.scheduler_config(layout))
    (layout.etc / "audit-policy.yaml").write_text(configs.audit_policy())
    write_kubelet_config(layout, cpu_manager_policy)
    (layout.etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    layout.cni_conf.mkdir(parents=True, exist_ok=True)
    (layout.cni_conf / "10-topology-e2e.conflist").write_text(configs.cni_conflist())


def write_kubelet_config(layout: Layout, cpu_manager_policy: str = "none") -> None:
    text = configs.kubelet_config(layout, cpu_manager_policy)
    if cpu_manager_policy == "static":
        text += 'reservedSystemCPUs: "0"\n'  # the static policy needs a reservation
    (layout.etc / "kubelet.yaml").write_text(text)


# --- components ----------------------------------------------------------------------------------------------

def _argv(layout: Layout, bins: Path, component: str) -> list[str]:
    p = layout.pki
    if component == "etcd":
        return [str(bins / "etcd"), "--name", "default", "--data-dir", str(layout.etcd_data),
                "--listen-client-urls", f"http://127.0.0.1:{ETCD_CLIENT_PORT}",
                "--advertise-client-urls", f"http://127.0.0.1:{ETCD_CLIENT_PORT}",
                "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
                "--initial-cluster", f"default=http://127.0.0.1:{ETCD_PEER_PORT}",
                "--listen-metrics-urls", "http://127.0.0.1:2381", "--unsafe-no-fsync", "--log-level", "warn"]
    if component == "kube-apiserver":
        return [str(bins / "kube-apiserver"), "--authorization-mode=Node,RBAC", "--allow-privileged=true",
                f"--cert-dir={p}", f"--client-ca-file={p / 'ca.crt'}",
                f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={p / 'ca.crt'}",
                # The node's host name resolves to 127.0.0.1 here: the API server reaches kubelet on loopback.
                "--kubelet-preferred-address-types=Hostname,InternalIP",
                f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--enable-admission-plugins=NodeRestriction",
                # All addresses: pods reach it at the bridge's address (BRIDGE_IP); nothing else can reach this machine.
                "--bind-address=0.0.0.0", f"--secure-port={APISERVER_PORT}",
                # No kube-proxy: the kubernetes Service gets no endpoints, so nothing is sent to its address.
                "--endpoint-reconciler-type=none",
                f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # The agent's own requests (configs.audit_policy), for bench/cluster/dra.py's requests per hour.
                f"--audit-policy-file={layout.etc / 'audit-policy.yaml'}",
                f"--audit-log-path={layout.log('audit')}", "--audit-log-maxsize=50", "--audit-log-maxbackup=1",
                "--v=1"]
    if component == "kube-controller-manager":
        kc = layout.component_kubeconfig("controller-manager")
        return [str(bins / "kube-controller-manager"), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}", f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}", f"--cluster-signing-cert-file={p / 'ca.crt'}",
                f"--cluster-signing-key-file={p / 'ca.key'}", "--use-service-account-credentials",
                f"--service-cluster-ip-range={SERVICE_CIDR}", "--leader-elect=false", "--controllers=*",
                "--bind-address=127.0.0.1", f"--secure-port={KCM_PORT}", "--v=1"]
    if component == "kube-scheduler":
        kc = layout.component_kubeconfig("scheduler")
        return [str(bins / "kube-scheduler"), f"--config={layout.etc / 'scheduler.yaml'}",
                f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1", f"--secure-port={SCHEDULER_PORT}", "--v=1"]
    if component == "containerd":
        return [str(bins / "containerd"), "--config", str(layout.etc / "containerd.toml")]
    if component == "kubelet":
        return [str(bins / "kubelet"), f"--config={layout.etc / 'kubelet.yaml'}",
                f"--kubeconfig={layout.component_kubeconfig('kubelet')}", f"--root-dir={KUBELET_ROOT}", "--v=2"]
    raise ValueError(component)


def _wait_healthy(layout: Layout, component: str, timeout: float = 90.0) -> None:
    if component == "containerd":
        bins = bin_dir()
        wait_until("containerd to answer", lambda: run(
            [str(bins / "ctr"), "--address", str(CONTAINERD_SOCKET), "version"], timeout=5, check=False,
        ).returncode == 0, timeout, layout, component)
        return
    url, ctx = health_urls(layout)[component]
    wait_until(f"{component} to be healthy at {url}", lambda: _ok(url, ctx), timeout, layout, component)


def start_component(layout: Layout, component: str, bins: Path) -> None:
    if running(layout, component) is not None:
        return
    env = {"PATH": f"{bins}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
    start(layout, component, _argv(layout, bins, component), env)
    _wait_healthy(layout, component)


def wait_node_ready(layout: Layout, timeout: float = 120.0) -> None:
    node = node_name()

    def ready() -> bool:
        done = kubectl(layout, "get", "node", node, "-o",
                       'jsonpath={.status.conditions[?(@.type=="Ready")].status}', check=False, timeout=10)
        return done.stdout.strip() == "True"

    wait_until(f"Node {node} to be Ready", ready, timeout, layout, "kubelet", step=0.5)


def import_images(bins: Path) -> None:
    from . import images

    archives = images.build_all(images.default_cache())
    images.import_all(bins / "ctr", CONTAINERD_SOCKET, archives)


def _probe_host() -> None:
    if os.geteuid() != 0:
        raise ClusterError("the real cluster runs as root (kubelet and containerd manage cgroups and mounts)")
    for controller in ("cpu", "cpuacct", "cpuset", "memory", "pids"):
        if not (CGROUP_ROOT / controller).is_dir():
            raise ClusterError(f"cgroup v1 controller {controller} is not mounted at {CGROUP_ROOT / controller}")
    for tool in ("openssl", "ip", "mount"):
        if shutil.which(tool) is None:
            raise ClusterError(f"{tool} is not installed")


def reachable_state_folder(folder: Path = CONTAINERD_STATE) -> str | None:
    """Make containerd's state folder the 0711 containerd itself gives a new one; a note when it had another mode.

    containerd creates its state folder 0711 but keeps the mode of one that exists (it chmods its root folder, not
    the state: cmd/containerd/server/server.go). Whatever made the folder first decides, and Debian's containerd 1.6
    shims, which `make test`'s CRI tests start, put their sockets in /run/containerd/s whatever the config says and
    create the missing folders with 0600 (runtime/v2/shim/util_unix.go NewSocket: os.MkdirAll(dir, 0600); 0700 in
    2.4). The agent, uid 0 with every capability dropped, cannot pass a folder without its x bit, so the lane sets
    the mode before its containerd starts, whatever ran on the machine before.
    """
    if not folder.exists():
        folder.mkdir(parents=True)
        folder.chmod(STATE_MODE)  # whatever the umask
        return None
    mode = folder.stat().st_mode & 0o7777
    if mode == STATE_MODE:
        return None
    folder.chmod(STATE_MODE)
    return f"{folder} was {mode:04o} (made by an earlier run's shims?): set to {STATE_MODE:04o} as containerd makes it"


def up(layout: Layout, cpu_manager_policy: str = "none", images: bool = True) -> None:
    _probe_host()
    bins = bin_dir()
    note = reachable_state_folder()
    if note is not None:
        print(f"cluster-up: {note}", flush=True)
    for component in COMPONENTS:
        if running(layout, component) is None and layout.pidfile(component).exists():
            layout.pidfile(component).unlink()
    t0 = time.monotonic()
    _write_configs(layout, bins, cpu_manager_policy)
    for component in COMPONENTS:
        if component == "kubelet" and images:
            import_images(bins)
        start_component(layout, component, bins)
        print(f"cluster-up: {component} up after {time.monotonic() - t0:.1f} s", flush=True)
    wait_node_ready(layout)
    print(f"cluster-up: Node {node_name()} Ready after {time.monotonic() - t0:.1f} s", flush=True)
    print(f"cluster-up: kubeconfig {layout.kubeconfig}", flush=True)


def restart_kubelet(layout: Layout, cpu_manager_policy: str | None = None) -> float:
    """Stop the kubelet (as an upgrade or a crash would) and start it again; seconds until healthy."""
    bins = bin_dir()
    stop(layout, "kubelet")
    if cpu_manager_policy is not None:
        write_kubelet_config(layout, cpu_manager_policy)
        # kubelet refuses a checkpoint written by another policy; a policy change drains the node first.
        (KUBELET_ROOT / "cpu_manager_state").unlink(missing_ok=True)
    t0 = time.monotonic()
    start_component(layout, "kubelet", bins)
    return time.monotonic() - t0


def crash_component(layout: Layout, component: str) -> float:
    """SIGKILL a node component (kubelet or containerd), as a crash would, and start it again; seconds until healthy.
    containerd's shims outlive it (their containers keep running), as they do when containerd really crashes."""
    if component not in ("kubelet", "containerd"):
        raise ClusterError(f"crash: {component} is not a node component (kubelet or containerd)")
    bins = bin_dir()
    crash(layout, component)
    t0 = time.monotonic()
    start_component(layout, component, bins)
    return time.monotonic() - t0


def restart_component(layout: Layout, component: str) -> float:
    """Stop a node component (SIGTERM) and start it again; seconds until healthy."""
    if component == "kubelet":
        return restart_kubelet(layout)
    if component != "containerd":
        raise ClusterError(f"restart: {component} is not a node component (kubelet or containerd)")
    bins = bin_dir()
    stop(layout, component)
    t0 = time.monotonic()
    start_component(layout, component, bins)
    return time.monotonic() - t0


# --- down ----------------------------------------------------------------------------------------------------

def _remove_sandboxes() -> None:
    """StopPodSandbox + RemovePodSandbox for every pod over CRI: containerd runs CNI DEL and removes netns."""
    if not CONTAINERD_SOCKET.exists():
        return
    import grpc

    from agent._proto.runtime.v1 import api_pb2 as cri
    from agent._proto.runtime.v1 import api_pb2_grpc as cri_grpc

    channel = grpc.insecure_channel(f"unix://{CONTAINERD_SOCKET}")
    try:
        stub = cri_grpc.RuntimeServiceStub(channel)
        sandboxes = stub.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10).items
        for sandbox in sandboxes:
            for call, request in (("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=sandbox.id)),
                                  ("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id))):
                try:
                    getattr(stub, call)(request, timeout=30)
                except grpc.RpcError as err:
                    print(f"cluster-down: {call} {sandbox.id[:12]}: {err.code().name}", flush=True)
    except grpc.RpcError as err:
        print(f"cluster-down: containerd did not list sandboxes: {err.code().name}", flush=True)
    finally:
        channel.close()


def _own_shims() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"containerd-shim-runc-v2") and str(CONTAINERD_SOCKET).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def _cgroup_trees() -> list[Path]:
    trees = []
    for controller in sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.is_dir() else []:
        tree = controller / "kubepods"
        if tree.is_dir():
            trees.append(tree)
    return trees


def _clean_cgroups() -> None:
    for tree in _cgroup_trees():
        for _ in range(50):
            tasks = [int(t) for procs in tree.rglob("cgroup.procs") for t in procs.read_text().split()]
            if not tasks:
                break
            for pid in tasks:
                if alive(pid):
                    kill_and_wait(pid, 1.0)
        for directory in sorted((d for d in tree.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            _rmdir(directory)
        _rmdir(tree)


def _rmdir(directory: Path) -> None:
    for _ in range(20):
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def remove_cdi_specs(folder: Path = CDI_DIR, driver: str = DRA_DRIVER) -> list[str]:
    """The agent's CDI spec files (``<driver>-<level>_<claim uid>.json``): removed, their names returned. The agent
    removes each at unprepare, but a pod still running at cluster-down is never unprepared, and its file would stay
    for the next run's soak to count as a leak; other drivers' specs are kept."""
    removed = []
    for spec in sorted(folder.glob(f"{driver}-*.json")) if folder.is_dir() else []:
        spec.unlink(missing_ok=True)
        removed.append(spec.name)
    return removed


def down(layout: Layout) -> None:
    stop(layout, "kubelet")
    if running(layout, "containerd") is not None:
        _remove_sandboxes()
    stop(layout, "containerd")
    for pid in _own_shims():
        kill_and_wait(pid, 2.0)
    _clean_cgroups()
    for component in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        stop(layout, component)
    netns = Path("/var/run/netns")
    state_paths = [KUBELET_ROOT, CONTAINERD_STATE, layout.containerd_root, layout.root, netns]
    unmount(state_paths)
    for entry in netns.glob("cni-*") if netns.is_dir() else []:
        entry.unlink(missing_ok=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
    for path in (KUBELET_ROOT, CONTAINERD_STATE, CNI_STATE, POD_LOGS, CONTAINER_LOGS, layout.containerd_root,
                 layout.etcd_data, layout.pki, layout.etc, layout.run, layout.root / "cni"):
        remove_tree(path)  # a folder with a mount left below it stays, and is named below
    remove_cdi_specs()
    for sock in (CONTAINERD_SOCKET, Path(f"{CONTAINERD_SOCKET}.ttrpc"), NRI_SOCKET):
        sock.unlink(missing_ok=True)
    layout.kubeconfig.unlink(missing_ok=True)
    left = mounts_under(state_paths) + [str(t) for t in _cgroup_trees()]
    if left:
        raise ClusterError(f"cluster-down left behind: {', '.join(left)}")


# --- status --------------------------------------------------------------------------------------------------

def _version(bins: Path, component: str) -> str:
    try:
        done = subprocess.run([str(bins / component), "--version"], capture_output=True, text=True, timeout=10,
                              check=False)
    except OSError as err:
        return f"({err.strerror})"
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr).strip() else "?"


def status(layout: Layout) -> list[dict[str, object]]:
    bins = bin_dir()
    urls = health_urls(layout) if (layout.pki / "complete").exists() else {}
    rows: list[dict[str, object]] = []
    for component in COMPONENTS:
        pid = read_pid(layout, component)
        up_ = pid is not None and alive(pid)
        if component == "containerd":
            healthy = up_ and run([str(bins / "ctr"), "--address", str(CONTAINERD_SOCKET), "version"],
                                  timeout=5, check=False).returncode == 0
        else:
            url, ctx = urls.get(component, ("", None))
            healthy = up_ and bool(url) and _ok(url, ctx)
        rows.append({"component": component, "pid": pid if up_ else None, "version": _version(bins, component),
                     "health": "ok" if healthy else ("unhealthy" if up_ else "stopped")})
    return rows


def format_status(rows: list[dict[str, object]]) -> str:
    lines = [f"{'COMPONENT':<25} {'PID':>8}  {'HEALTH':<10} VERSION"]
    for row in rows:
        lines.append(f"{row['component']!s:<25} {row['pid'] or '-'!s:>8}  {row['health']!s:<10} {row['version']}")
    return "\n".join(lines)


def failure_details(layout: Layout) -> str:
    return "\n".join(f"--- {c}:\n{tail(layout.log(c), 5)}" for c in COMPONENTS if layout.log(c).exists())


def dump_json(rows: list[dict[str, object]]) -> str:
    return json.dumps(rows, indent=1)
