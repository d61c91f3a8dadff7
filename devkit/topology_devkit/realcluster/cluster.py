"""Start, stop and inspect a single-node cluster of upstream components on this machine, all on loopback.

``up`` makes the PKI and configs, starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler
(the order and flags of kubernetes' ``hack/local-up-cluster.sh``), then the node's runtime (containerd, or CRI-O
with ``RUNTIME=crio``: :mod:`.crio`) and the kubelet, imports the images (no registry) and waits until the Node is
Ready. A component that does not come up ends ``up``
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

from . import configs, confine, crio, pki
from .layout import (
    APISERVER_PORT,
    BRIDGE,
    BRIDGE_IP,
    CDI_DIR,
    CNI_STATE,
    CONTAINER_LOGS,
    CONTAINERD_SOCKET,
    CONTAINERD_STATE,
    CONTROL_PLANE,
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
    components,
    node_name,
    requested_kubelet_root,
)
from .mounts import mounts_under, remove_tree, unmount
from .procs import (
    ClusterError,
    alive,
    crash,
    kill_and_wait,
    pids_of,
    read_pid,
    run,
    running,
    start,
    stop,
    tail,
    wait_until,
)

BUILD = REPO / "devkit" / "cluster" / "build.sh"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def bin_dir(build_set: str = "containerd") -> Path:
    """The cached binaries of the current pins of one set (build.sh's containerd or crio); ClusterError when
    `make cluster-build` has not built them."""
    folder = Path(run([str(BUILD), "--print", build_set]).stdout.strip())
    if not (folder / "build-info.json").exists():
        how = "make cluster-build" + ("" if build_set == "containerd" else f" RUNTIME={build_set}")
        raise ClusterError(f"the cluster binaries are not built ({folder} missing): run `{how}`")
    return folder


def node_bins(layout: Layout) -> Path:
    """The node's binaries: the runtime's set (its kubelet, runtime, runc and CNI plugins)."""
    return bin_dir(layout.runtime())


def control_plane_bins(layout: Layout) -> Path:
    """The control plane's binaries (etcd, API server, controller manager, scheduler, kubectl): the node's set, or
    with ``SKEW=1`` the containerd set's newer Kubernetes beside the CRI-O set's older kubelet."""
    return bin_dir("containerd") if layout.skewed() else node_bins(layout)


def bins_of(layout: Layout, component: str) -> Path:
    return control_plane_bins(layout) if component in CONTROL_PLANE else node_bins(layout)


def runtime_socket(layout: Layout) -> Path:
    return crio.CRIO_SOCKET if layout.runtime() == "crio" else CONTAINERD_SOCKET


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
    return run([str(control_plane_bins(layout) / "kubectl"), "--kubeconfig", str(layout.kubeconfig), *args],
               timeout=timeout, check=check, input_text=input_text)


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
    if layout.runtime() == "crio":
        crio.write_config(layout, bins)
    else:
        (layout.etc / "containerd.toml").write_text(configs.containerd_config(layout, bins))
    (layout.etc / "scheduler.yaml").write_text(configs.scheduler_config(layout))
    (layout.etc / "audit-policy.yaml").write_text(configs.audit_policy())
    write_kubelet_config(layout, cpu_manager_policy)
    (layout.etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    layout.cni_conf.mkdir(parents=True, exist_ok=True)
    (layout.cni_conf / "10-topology-e2e.conflist").write_text(configs.cni_conflist())


# A kubelet 1.34 under a 1.37 control plane (SKEW=1) takes part in DRA as 1.37's kubelet does with two alpha gates
# of 1.34 on (pkg/features/kube_features.go at v1.34.2): DRAExtendedResource (kubelet prepares the claim the scheduler
# made for a pod's topology/book: 1, pkg/kubelet/cm/dra/manager.go) and ResourceHealthStatus (a device's health in the
# pod's status). The control plane's gates are 1.37's defaults.
SKEWED_KUBELET_GATES = {"DRAExtendedResource": True, "ResourceHealthStatus": True}


def write_kubelet_config(layout: Layout, cpu_manager_policy: str = "none") -> None:
    text = configs.kubelet_config(layout, cpu_manager_policy, runtime_socket(layout))
    if layout.skewed():
        text += "featureGates:\n" + "".join(f"  {gate}: {'true' if on else 'false'}\n"
                                             for gate, on in SKEWED_KUBELET_GATES.items())
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
    if component == "crio":
        return crio.argv(layout, bins)
    if component == "kubelet":
        return [str(bins / "kubelet"), f"--config={layout.etc / 'kubelet.yaml'}",
                f"--kubeconfig={layout.component_kubeconfig('kubelet')}", f"--root-dir={layout.kubelet_root()}",
                "--v=2"]
    raise ValueError(component)


def _wait_healthy(layout: Layout, component: str, timeout: float = 90.0) -> None:
    if component == "crio":
        wait_until(f"CRI-O to answer on {crio.CRIO_SOCKET}", crio.answers, timeout, layout, component)
        return
    if component == "containerd":
        bins = node_bins(layout)
        wait_until("containerd to answer", lambda: run(
            [str(bins / "ctr"), "--address", str(CONTAINERD_SOCKET), "version"], timeout=5, check=False,
        ).returncode == 0, timeout, layout, component)
        return
    url, ctx = health_urls(layout)[component]
    wait_until(f"{component} to be healthy at {url}", lambda: _ok(url, ctx), timeout, layout, component)


def start_component(layout: Layout, component: str, bins: Path | None = None) -> None:
    if running(layout, component) is not None:
        return
    bins = bins_of(layout, component) if bins is None else bins
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


def import_images(layout: Layout) -> None:
    """Build the three images (cached) and import them into the node's runtime."""
    from . import images

    archives = images.build_all(images.default_cache())
    import_archives(layout, list(archives.items()))


def import_archives(layout: Layout, archives: list[tuple[str, Path]]) -> list[str]:
    """(name, OCI archive) pairs into the node's runtime: containerd's k8s.io namespace or CRI-O's storage."""
    from . import images

    bins = node_bins(layout)
    if layout.runtime() == "crio":
        with images.timed(f"import into CRI-O's storage: {', '.join(name for name, _ in archives)}"):
            return crio.import_archives(bins, layout, archives)
    return images.import_all(bins / "ctr", CONTAINERD_SOCKET, [path for _, path in archives])


def import_vllm(layout: Layout) -> str:
    """The lane's vLLM image (built once per pins by :mod:`topology_devkit.vllm.image`, cached) into the node's
    runtime unless it is there; its name."""
    from topology_devkit.vllm import image as vllm_image

    from . import images

    if layout.runtime() != "crio":
        return vllm_image.import_vllm(node_bins(layout) / "ctr", CONTAINERD_SOCKET)
    archive = vllm_image.build_vllm()
    if vllm_image.VLLM_IMAGE in crio.listed_images():
        images.say(f"{vllm_image.VLLM_IMAGE}: already in CRI-O's storage")
        return vllm_image.VLLM_IMAGE
    import_archives(layout, [(vllm_image.VLLM_IMAGE, archive)])
    return vllm_image.VLLM_IMAGE


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


def up(layout: Layout, cpu_manager_policy: str = "none", images: bool = True, runtime: str | None = None,
       skew: bool = False) -> None:
    """Start the cluster with ``runtime`` on the node (default: what ``RUNTIME`` says); ``skew``: the containerd
    set's control plane beside the CRI-O set's kubelet. A cluster already up keeps its runtime."""
    _probe_host()
    up_now = [c for r in ("containerd", "crio") for c in (r, "kubelet") if running(layout, c) is not None]
    if up_now and layout.runtime_file.exists():
        if runtime is not None and runtime != layout.runtime():
            raise ClusterError(f"a cluster with {layout.runtime()} is up: make cluster-down first")
    else:
        wanted = runtime or layout.runtime()
        if wanted == "containerd" and skew:
            raise ClusterError("SKEW=1 pairs the containerd set's control plane with CRI-O's older kubelet: "
                               "RUNTIME=crio")
        layout.root.mkdir(parents=True, exist_ok=True)
        layout.runtime_file.write_text(f"{wanted}{' skew' if skew else ''}\n")
        layout.kubelet_root_file.write_text(f"{requested_kubelet_root()}\n")
    runtime = layout.runtime()
    if runtime == "crio":
        crio.probe_host()
        note = crio.mount_hugetlb(layout)
        if note is not None:
            print(f"cluster-up: {note}", flush=True)
    else:
        note = reachable_state_folder()
        if note is not None:
            print(f"cluster-up: {note}", flush=True)
    bins = node_bins(layout)
    control_plane_bins(layout)  # built, or say how
    order = components(runtime)
    for component in order:
        if running(layout, component) is None and layout.pidfile(component).exists():
            layout.pidfile(component).unlink()
    t0 = time.monotonic()
    _write_configs(layout, bins, cpu_manager_policy)
    for component in order:
        if component == "kubelet" and images:
            import_images(layout)
        start_component(layout, component)
        print(f"cluster-up: {component} up after {time.monotonic() - t0:.1f} s", flush=True)
    wait_node_ready(layout)
    print(f"cluster-up: Node {node_name()} Ready after {time.monotonic() - t0:.1f} s", flush=True)
    print(f"cluster-up: kubeconfig {layout.kubeconfig}", flush=True)


def restart_kubelet(layout: Layout, cpu_manager_policy: str | None = None) -> float:
    """Stop the kubelet (as an upgrade or a crash would) and start it again; seconds until healthy."""
    stop(layout, "kubelet")
    if cpu_manager_policy is not None:
        write_kubelet_config(layout, cpu_manager_policy)
        # kubelet refuses a checkpoint written by another policy; a policy change drains the node first.
        (layout.kubelet_root() / "cpu_manager_state").unlink(missing_ok=True)
    t0 = time.monotonic()
    start_component(layout, "kubelet")
    return time.monotonic() - t0


def node_component(layout: Layout, component: str, what: str) -> str:
    """``component`` when it is a node component of this cluster (kubelet or its runtime); ``runtime`` names the
    runtime in use, whichever it is."""
    runtime = layout.runtime()
    if component == "runtime":
        return runtime
    if component not in ("kubelet", runtime):
        raise ClusterError(f"{what}: {component} is not a node component of this cluster (kubelet or {runtime})")
    return component


def crash_component(layout: Layout, component: str) -> float:
    """SIGKILL a node component (kubelet or the runtime), as a crash would, and start it again; seconds until healthy.
    containerd's shims and CRI-O's conmons outlive it (their containers keep running), as they do when the runtime
    really crashes."""
    component = node_component(layout, component, "crash")
    crash(layout, component)
    t0 = time.monotonic()
    start_component(layout, component)
    return time.monotonic() - t0


def restart_component(layout: Layout, component: str) -> float:
    """Stop a node component (SIGTERM) and start it again; seconds until healthy."""
    component = node_component(layout, component, "restart")
    if component == "kubelet":
        return restart_kubelet(layout)
    stop(layout, component)
    t0 = time.monotonic()
    start_component(layout, component)
    return time.monotonic() - t0


# --- down ----------------------------------------------------------------------------------------------------

def _remove_sandboxes(socket: Path) -> None:
    """StopPodSandbox + RemovePodSandbox for every pod over CRI: the runtime runs CNI DEL and removes netns."""
    if not socket.exists():
        return
    import grpc

    from agent._proto.runtime.v1 import api_pb2 as cri
    from agent._proto.runtime.v1 import api_pb2_grpc as cri_grpc

    channel = grpc.insecure_channel(f"unix://{socket}")
    try:
        stub = cri_grpc.RuntimeServiceStub(channel)
        # Containers first, at once (timeout 0: SIGKILL): a StopPodSandbox stops them with their stop timeout, and a
        # shell or sleep as PID 1 ignores SIGTERM (CRI-O then waits its ctr_stop_timeout, 30 s, per container).
        for container in stub.ListContainers(cri.ListContainersRequest(), timeout=10).containers:
            try:
                stub.StopContainer(cri.StopContainerRequest(container_id=container.id, timeout=0), timeout=30)
            except grpc.RpcError as err:
                print(f"cluster-down: StopContainer {container.id[:12]}: {err.code().name}", flush=True)
        sandboxes = stub.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10).items
        for sandbox in sandboxes:
            for call, request in (("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=sandbox.id)),
                                  ("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id))):
                try:
                    getattr(stub, call)(request, timeout=30)
                except grpc.RpcError as err:
                    print(f"cluster-down: {call} {sandbox.id[:12]}: {err.code().name}", flush=True)
    except grpc.RpcError as err:
        print(f"cluster-down: the runtime at {socket} did not list sandboxes: {err.code().name}", flush=True)
    finally:
        channel.close()


def _own_shims() -> list[int]:
    return pids_of("containerd-shim-runc-v2", str(CONTAINERD_SOCKET))


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


def _remove_empty_parents(path: Path) -> None:
    """The folders ``up`` made above a moved kubelet root (``/var/lib/k0s`` for ``/var/lib/k0s/kubelet``), while
    empty and below the top two levels (``/var/lib`` stays)."""
    for parent in path.parents:
        if len(parent.parts) <= 3:
            return
        try:
            parent.rmdir()
        except OSError:  # not empty (or already gone): whatever is there was not the lane's
            return


def down(layout: Layout) -> None:
    """Stop whichever runtime is up (and anything either runtime left), then the control plane; remove the state."""
    confine.release()  # a bench that died with the lane confined (confine.py)
    stop(layout, "kubelet")
    if running(layout, "containerd") is not None:
        _remove_sandboxes(CONTAINERD_SOCKET)
    if running(layout, "crio") is not None:
        _remove_sandboxes(crio.CRIO_SOCKET)
    stop(layout, "containerd")
    stop(layout, "crio", timeout=30)
    for pid in _own_shims():
        kill_and_wait(pid, 2.0)
    crio.stop_monitors()
    _clean_cgroups()
    for component in CONTROL_PLANE[::-1]:
        stop(layout, component)
    netns = Path("/var/run/netns")
    # The default root too: kubelet makes its device-plugin directory there whatever its root (DEVICE_PLUGIN_DIR).
    kubelet_roots = list(dict.fromkeys([layout.kubelet_root(), KUBELET_ROOT]))
    state_paths = [*kubelet_roots, CONTAINERD_STATE, layout.containerd_root, layout.root, netns, *crio.state_paths()]
    unmount(state_paths)
    crio_left = crio.clean_host(layout)
    for entry in netns.glob("cni-*") if netns.is_dir() else []:
        entry.unlink(missing_ok=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
    for path in (*kubelet_roots, CONTAINERD_STATE, CNI_STATE, POD_LOGS, CONTAINER_LOGS, layout.containerd_root,
                 layout.etcd_data, layout.pki, layout.etc, layout.run, layout.root / "cni"):
        remove_tree(path)  # a folder with a mount left below it stays, and is named below
    _remove_empty_parents(layout.kubelet_root())
    remove_cdi_specs()
    for sock in (CONTAINERD_SOCKET, Path(f"{CONTAINERD_SOCKET}.ttrpc"), NRI_SOCKET):
        sock.unlink(missing_ok=True)
    layout.kubeconfig.unlink(missing_ok=True)
    layout.runtime_file.unlink(missing_ok=True)
    layout.kubelet_root_file.unlink(missing_ok=True)
    left = mounts_under(state_paths) + crio_left + [str(t) for t in _cgroup_trees()]
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
    urls = health_urls(layout) if (layout.pki / "complete").exists() else {}
    rows: list[dict[str, object]] = []
    for component in components(layout.runtime()):
        bins = bins_of(layout, component)
        pid = read_pid(layout, component)
        up_ = pid is not None and alive(pid)
        if component == "crio":
            healthy = up_ and crio.answers()
        elif component == "containerd":
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
    return "\n".join(f"--- {c}:\n{tail(layout.log(c), 5)}" for c in components(layout.runtime())
                     if layout.log(c).exists())


def dump_json(rows: list[dict[str, object]]) -> str:
    return json.dumps(rows, indent=1)
