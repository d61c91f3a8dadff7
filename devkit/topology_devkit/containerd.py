"""A real containerd 1.6 with runc and crun, for tests and benchmarks of the agent's CRI client.

Everything here follows ../shared/docs/real-containerd.md:

* containerd runs in a private mount namespace (held by a process of its own, so that containerd
  can be stopped and started again in the same namespace) with the cgroup2 mount of the hybrid
  layout hidden (crun refuses hybrid cgroups); the host's mounts are untouched, and the overlay and
  shm mounts of the containers stay in that namespace.
* root, state, the gRPC and ttrpc sockets, runc's and crun's state, logs and the CNI directory all
  live under one short directory in /tmp (a Unix socket path has at most 107 bytes).
* both runtime handlers ``runc`` and ``crun`` are configured, no CNI (pods use host networking and
  set no hostname), ``restrict_oom_score_adj`` (the VM lacks CAP_SYS_RESOURCE), no AppArmor, a
  missing hugetlb controller tolerated, the stream server on 127.0.0.1 and a free port.
* no registry: a busybox-static OCI image is built with the standard library, imported with
  ``ctr images import`` and used as the sandbox image too.
* pods get a cgroupfs ``cgroup_parent`` of the harness's own (``/<prefix>/pod<uid>``): the runtime
  removes container cgroups but not the pod-level directories, so teardown removes them.
* teardown cleans up after a failure too: sandboxes over CRI while containerd answers, then the
  harness's own shims (matched on its socket path), whatever still runs in its cgroups, the shim
  sockets in /run/containerd/s, the cgroups and the whole directory. A process in state ``Z`` is dead.

When containerd cannot run here (not root, packages missing, cgroups unusable, containerd does not
come up) :class:`ContainerdUnavailable` says why; tests skip with that reason (and fail under CI).

Usage::

    with Containerd() as ctd:
        pod = ctd.run_pod("web-0", handler="crun")
        ctd.cpus_allowed_list(pod.container_id)      # "0-1"

CLI: ``python -m topology_devkit.containerd`` runs a pod with each handler, pins it, and prints timings.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc

from agent._proto.runtime.v1 import api_pb2 as cri
from agent._proto.runtime.v1 import api_pb2_grpc as cri_grpc
from agent.topology.cpulist import parse_cpulist
from topology_devkit import oci
from topology_devkit.testing.wait import poll_until

# handler -> runtime binary: where Debian and Ubuntu put them, else wherever PATH has them
HANDLERS: dict[str, str] = {name: default if Path(default).is_file() else shutil.which(name) or default
                            for name, default in (("runc", "/usr/sbin/runc"), ("crun", "/usr/bin/crun"))}
# What a containerd 2.x build folder (devkit/cluster/build.sh --print) must hold for the harness.
BUILT_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc")
PACKAGES = "containerd runc crun busybox-static"
IMAGE = "docker.io/library/topology-busybox:test"
NAMESPACE = "k8s.io"  # containerd's namespace for everything the CRI plugin runs
SHIM_SOCKETS = Path("/run/containerd/s")  # where shims put their sockets whatever the config says
# The modes containerd gives those folders itself (2.4: the state folder 0711 in cmd/containerd/server/server.go, the
# socket folder 0700 in pkg/shim/util_unix.go). Debian's 1.6 shims create missing ones 0600, and a 0600
# /run/containerd then stays (containerd keeps an existing folder's mode): the agent, uid 0 without capabilities,
# cannot reach the real-cluster lane's socket in it. The harness makes the folders first and removes what it made.
SHIM_FOLDER_MODES = ((SHIM_SOCKETS.parent, 0o711), (SHIM_SOCKETS, 0o700))
CGROUP_ROOT = Path("/sys/fs/cgroup")
# kubelet's labels on every container (and the first three on every sandbox)
POD_NAME, POD_NAMESPACE, POD_UID, CONTAINER_NAME = (
    "io.kubernetes.pod.name", "io.kubernetes.pod.namespace", "io.kubernetes.pod.uid", "io.kubernetes.container.name")
START_TIMEOUT = 15.0
IMAGE_TIMEOUT = 10.0  # an imported image reaching the CRI plugin's store
CALL_TIMEOUT = 30.0  # a CRI call of the harness (creating a container can take a second on a loaded machine)

T = TypeVar("T")


class ContainerdUnavailable(RuntimeError):
    """containerd cannot run here; ``reason`` says why in one line (for a skip message)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HarnessError(RuntimeError):
    """A harness step failed (a CRI call, an import): the message names the step and the error."""


@dataclass(frozen=True)
class PodContainer:
    """A pod sandbox and one container in it, created the way kubelet creates them."""

    sandbox_id: str
    container_id: str
    handler: str
    pod_name: str
    namespace: str
    pod_uid: str
    container_name: str
    attempt: int = 0
    resources: cri.LinuxContainerResources = field(default_factory=cri.LinuxContainerResources, compare=False)
    annotations: tuple[tuple[str, str], ...] = ()  # what device plugins' Allocate answers add (kubelet passes them)
    mounts: tuple[tuple[str, str], ...] = ()  # (host path, container path), read-only binds
    seccomp: str = ""  # "": Unconfined (kubelet's default); "runtime/default"; else a Localhost profile's path
    cdi_devices: tuple[str, ...] = ()  # qualified CDI device names (kubelet's ContainerConfig.CDI_devices under DRA)
    envs: tuple[tuple[str, str], ...] = ()  # the container's own environment (a pod spec's env)
    pod_annotations: tuple[tuple[str, str], ...] = ()  # the pod's own (kubelet passes all of them to the sandbox)

    @property
    def labels(self) -> dict[str, str]:
        """kubelet's four labels of the container."""
        return {POD_NAME: self.pod_name, POD_NAMESPACE: self.namespace, POD_UID: self.pod_uid,
                CONTAINER_NAME: self.container_name}


# ------------------------------------------------------------------------------------------------
# checks and small helpers


def unavailable_reason(bin_dir: Path | None = None) -> str | None:
    """Why containerd cannot run on this machine, or None when it can be tried (``bin_dir``: the
    folder of a containerd 2.x build, whose containerd, ctr, shim and runc are used)."""
    if sys.platform != "linux":
        return f"containerd needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "containerd needs root (run the tests as root)"
    if bin_dir is not None:
        built = [name for name in BUILT_BINARIES if not (bin_dir / name).is_file()]
        if built:
            return f"{bin_dir} lacks {', '.join(built)} (build them: make cluster-build)"
    tools = {"unshare": "util-linux", "nsenter": "util-linux"}
    if bin_dir is None:
        tools = {"containerd": "containerd", "ctr": "containerd", **tools}
    absent = [f"{tool} ({package})" for tool, package in tools.items() if shutil.which(tool) is None]
    if not Path("/bin/busybox").is_file():
        absent.append("/bin/busybox (busybox-static)")
    if bin_dir is None and not any(Path(binary).is_file() for binary in HANDLERS.values()):
        absent.append("runc or crun")
    if absent:
        return f"missing {', '.join(absent)}: apt-get install {PACKAGES}"
    if not CGROUP_ROOT.is_dir() or not os.access(CGROUP_ROOT, os.W_OK):
        return f"{CGROUP_ROOT} is missing or read-only: containers need writable cgroups"
    if not (cgroup_v2() or (CGROUP_ROOT / "cpuset").is_dir()):
        return f"no cpuset controller under {CGROUP_ROOT}"
    return None


def cgroup_v2() -> bool:
    """The unified hierarchy alone is mounted at /sys/fs/cgroup."""
    return (CGROUP_ROOT / "cgroup.controllers").is_file()


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (this machine's PID 1 reaps slowly)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def status_cpus_allowed(pid: int) -> str:
    """``Cpus_allowed_list`` of /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise HarnessError(f"/proc/{pid}/status has no Cpus_allowed_list")


# ------------------------------------------------------------------------------------------------
# the image: busybox-static in an OCI layout, built with the standard library (topology_devkit.oci)


def _seccomp_profile(seccomp: str) -> cri.SecurityProfile:
    """The CRI profile kubelet sends for a pod's seccompProfile: none (Unconfined), RuntimeDefault or Localhost."""
    if not seccomp:
        return cri.SecurityProfile(profile_type=cri.SecurityProfile.Unconfined)
    if seccomp == "runtime/default":
        return cri.SecurityProfile(profile_type=cri.SecurityProfile.RuntimeDefault)
    return cri.SecurityProfile(profile_type=cri.SecurityProfile.Localhost, localhost_ref=seccomp)


def build_image(path: Path, name: str = IMAGE, busybox: Path = Path("/bin/busybox")) -> Path:
    """Write an OCI image layout tarball of busybox-static (``Entrypoint ["/bin/sleep"]``) to ``path``."""
    config = {"Entrypoint": ["/bin/sleep"], "Cmd": ["infinity"], "Env": ["PATH=/bin"], "WorkingDir": "/"}
    return oci.write_archive(path, name, [oci.busybox_layer(busybox)], config)


# ------------------------------------------------------------------------------------------------
# containerd


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a TOML basic string is a JSON string for these values


class Containerd:
    """A private containerd with runc and crun; a context manager (see the module docstring)."""

    def __init__(self, prefix: str = "topo-cri", workdir: Path | None = None, bin_dir: Path | None = None) -> None:
        """``bin_dir``: a containerd 2.x build folder (containerd, its shim, ctr, runc; crun from the
        system): configured with config version 3 and NRI enabled on :attr:`nri_socket`. None:
        Debian's containerd 1.6 from PATH (no NRI)."""
        self.prefix = f"{prefix}-{uuid.uuid4().hex[:6]}"  # the cgroup parent of every pod of this harness
        self.bin_dir = bin_dir
        self.handler_binaries = dict(HANDLERS)
        if bin_dir is not None:
            self.handler_binaries["runc"] = str(bin_dir / "runc")
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="ctd-", dir="/tmp")) if workdir is None else Path(workdir)
        self.socket = self.workdir / "c.sock"
        self.config_path = self.workdir / "config.toml"
        self.log_path = self.workdir / "containerd.log"
        self.nri_socket = self.workdir / "nri.sock"  # with bin_dir only
        self.cdi_dir = self.workdir / "cdi"  # with bin_dir only: the CDI spec directory (not /etc/cdi, /var/run/cdi)
        self.nri_request_timeout = "2s"  # containerd's default plugin_request_timeout
        self.nri_enabled = True  # with bin_dir: NRI on (containerd 2.x's default); see reconfigure()
        self.pod_annotations: tuple[str, ...] = ()  # with bin_dir: the runtimes' pod_annotations pass-through
        self._holder: subprocess.Popen[bytes] | None = None  # keeps the private mount namespace
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: grpc.Channel | None = None
        self._ids: set[str] = set()  # every sandbox and container id made here (shim sockets hash them)
        self._made_folders: list[Path] = []  # shim socket folders this harness created (removed when empty)
        self._sandboxes: dict[str, PodContainer] = {}  # sandbox id -> its first container
        self._handlers: dict[str, str | None] | None = None  # handler -> None (works) or why not
        self._lock = threading.Lock()
        self.image = IMAGE

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> Containerd:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Prepare the directory and namespace, start containerd, import the image."""
        reason = unavailable_reason(self.bin_dir)
        if reason is not None:
            raise ContainerdUnavailable(reason)
        for sub in ("root", "state", "runc", "crun", "cni", "opt", "logs", "cdi"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self._config())
        self._made_folders = make_shim_folders()
        self._start_holder()
        self.start_containerd()
        self._import_image()

    def _tool(self, name: str) -> str:
        return str(self.bin_dir / name) if self.bin_dir is not None else name

    def _config(self) -> str:
        if self.bin_dir is not None:
            return self._config_v3()
        w = self.workdir
        cri_plugin = 'plugins."io.containerd.grpc.v1.cri"'
        lines = [
            "version = 2",
            f"root = {_toml(w / 'root')}",
            f"state = {_toml(w / 'state')}",
            "[grpc]",
            f"  address = {_toml(self.socket)}",
            "[ttrpc]",
            f"  address = {_toml(w / 't.sock')}",
            "[debug]",
            '  level = "info"',
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {_toml(w / 'opt')}",
            f"[{cri_plugin}]",
            f"  sandbox_image = {_toml(self.image)}",
            "  restrict_oom_score_adj = true",
            "  tolerate_missing_hugetlb_controller = true",
            "  disable_apparmor = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            "  enable_cdi = false",
            f"[{cri_plugin}.cni]",
            f"  conf_dir = {_toml(w / 'cni')}",
            f"  bin_dir = {_toml(w / 'cni')}",
            f"[{cri_plugin}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
        ]
        for handler, binary in self.handler_binaries.items():
            lines += [
                f"[{cri_plugin}.containerd.runtimes.{handler}]",
                '  runtime_type = "io.containerd.runc.v2"',
                f"[{cri_plugin}.containerd.runtimes.{handler}.options]",
                f"  BinaryName = {_toml(binary)}",
                f"  Root = {_toml(w / handler)}",
                "  SystemdCgroup = false",
            ]
        return "\n".join(lines) + "\n"

    def _config_v3(self) -> str:
        """containerd 2.x's layout (``containerd config default``): the CRI plugin split into images and
        runtime, the stream server left in grpc.v1.cri, and NRI on the harness's own socket."""
        w = self.workdir
        images, runtime = "plugins.'io.containerd.cri.v1.images'", "plugins.'io.containerd.cri.v1.runtime'"
        nri = "plugins.'io.containerd.nri.v1.nri'"
        lines = [
            "version = 3",
            f"root = {_toml(w / 'root')}",
            f"state = {_toml(w / 'state')}",
            "[grpc]",
            f"  address = {_toml(self.socket)}",
            "[ttrpc]",
            f"  address = {_toml(w / 't.sock')}",
            "[debug]",
            '  level = "info"',
            "[plugins.'io.containerd.internal.v1.opt']",
            f"  path = {_toml(w / 'opt')}",
            f"[{images}]",
            '  snapshotter = "overlayfs"',
            f"[{images}.pinned_images]",
            f"  sandbox = {_toml(self.image)}",
            f"[{runtime}]",
            "  restrict_oom_score_adj = true",
            "  tolerate_missing_hugetlb_controller = true",
            "  disable_apparmor = true",
            f"  cdi_spec_dirs = [{_toml(self.cdi_dir)}]",
            f"[{runtime}.cni]",
            f"  conf_dir = {_toml(w / 'cni')}",
            f"  bin_dirs = [{_toml(w / 'cni')}]",
            f"[{runtime}.containerd]",
            '  default_runtime_name = "runc"',
        ]
        for handler, binary in self.handler_binaries.items():
            lines += [
                f"[{runtime}.containerd.runtimes.{handler}]",
                '  runtime_type = "io.containerd.runc.v2"',
                f"  pod_annotations = [{', '.join(_toml(a) for a in self.pod_annotations)}]",
                f"[{runtime}.containerd.runtimes.{handler}.options]",
                f"  BinaryName = {_toml(binary)}",
                f"  Root = {_toml(w / handler)}",
                "  SystemdCgroup = false",
            ]
        lines += [
            "[plugins.'io.containerd.grpc.v1.cri']",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            f"[{nri}]",
            f"  disable = {'false' if self.nri_enabled else 'true'}",
            "  disable_connections = false",
            f"  socket_path = {_toml(self.nri_socket)}",
            f"  plugin_path = {_toml(w / 'nri-plugins')}",
            f"  plugin_config_path = {_toml(w / 'nri-conf')}",
            f"  plugin_request_timeout = {_toml(self.nri_request_timeout)}",
        ]
        return "\n".join(lines) + "\n"

    def _start_holder(self) -> None:
        """A process in a private mount namespace (cgroup2 of the hybrid layout unmounted) that
        containerd joins each time it starts."""
        script = ("if [ ! -e /sys/fs/cgroup/cgroup.controllers ] && mountpoint -q /sys/fs/cgroup/unified; "
                  "then umount /sys/fs/cgroup/unified || exit 3; fi; echo ready; exec sleep 2147483647")
        self._holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        assert self._holder.stdout is not None
        line = self._holder.stdout.readline()
        if line.strip() != b"ready":
            self._holder.wait(timeout=5)
            err = self._holder.stderr.read().decode(errors="replace").strip() if self._holder.stderr else ""
            raise ContainerdUnavailable(f"cannot make a private mount namespace: {err or 'unshare failed'}")

    def reconfigure(self) -> None:
        """Restart containerd with the configuration as the attributes say now (``nri_enabled``,
        ``pod_annotations``); the containers keep running in their shims."""
        self.stop_containerd()
        self.config_path.write_text(self._config())
        self.start_containerd()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None and alive(self._process.pid)

    def start_containerd(self) -> None:
        """Start containerd (again) on the same socket, in the same namespace; wait until it answers."""
        if self.running:
            return
        assert self._holder is not None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()  # a stale socket from a killed containerd
        log = self.log_path.open("ab")
        try:
            self._process = subprocess.Popen(
                ["nsenter", f"--mount=/proc/{self._holder.pid}/ns/mnt", "--",
                 self._tool("containerd"), "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=self._env())
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if not self.running:
                raise ContainerdUnavailable(f"containerd exited at start: {self._log_tail()}")
            if self.socket.exists():
                try:
                    self._stub().Version(cri.VersionRequest(), timeout=1.0)
                    return
                except grpc.RpcError:
                    self._reset_channel()
            if time.monotonic() >= deadline:
                self.stop_containerd(kill=True)
                raise ContainerdUnavailable(f"containerd did not answer within {START_TIMEOUT:.0f} s: "
                                            f"{self._log_tail()}")
            time.sleep(0.02)

    def _env(self) -> dict[str, str] | None:
        """A build folder first on PATH: containerd finds its shim there (None: this process's)."""
        if self.bin_dir is None:
            return None
        return {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def stop_containerd(self, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop containerd (SIGTERM, or SIGKILL with ``kill``); the containers keep running in their shims."""
        self._reset_channel()
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(timeout=5)

    def _log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        interesting = [line for line in text if "level=error" in line or "level=fatal" in line] or text
        return " | ".join(interesting[-lines:]) or "empty log"

    def _import_image(self) -> None:
        tarball = build_image(self.workdir / "image.tar", self.image)
        done = subprocess.run([self._tool("ctr"), "--address", str(self.socket), "-n", NAMESPACE, "images", "import",
                               str(tarball)], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise ContainerdUnavailable(f"ctr images import failed: {done.stderr.strip()[-300:]}")
        def seen() -> bool:  # containerd 2.x's CRI image store learns of an import from an event, a moment later
            status = self._call("ImageStatus", cri.ImageStatusRequest(image=cri.ImageSpec(image=self.image)),
                                service="image")
            return bool(status.image.id)

        if not poll_until(seen, IMAGE_TIMEOUT, every=0.05):
            raise ContainerdUnavailable(f"the CRI plugin does not see the imported image {self.image} "
                                        f"within {IMAGE_TIMEOUT:.0f} s")

    # -- CRI calls ----------------------------------------------------------------------------------

    def _reset_channel(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = None

    def _open_channel(self) -> grpc.Channel:
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(
                    f"unix://{self.socket}", options=[("grpc.use_local_subchannel_pool", 1),
                                                     ("grpc.initial_reconnect_backoff_ms", 50),
                                                     ("grpc.min_reconnect_backoff_ms", 50)])
            return self._channel

    def _stub(self) -> cri_grpc.RuntimeServiceStub:
        return cri_grpc.RuntimeServiceStub(self._open_channel())

    def _call(self, method: str, request: Any, service: str = "runtime", timeout: float = CALL_TIMEOUT) -> Any:
        stub: Any = (cri_grpc.RuntimeServiceStub(self._open_channel()) if service == "runtime"
                     else cri_grpc.ImageServiceStub(self._open_channel()))
        try:
            return getattr(stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            self._reset_channel()
            code = exc.code().name if isinstance(exc, grpc.Call) else "error"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise HarnessError(f"CRI {method} failed: {code}: {details}") from None

    @property
    def runtime(self) -> cri_grpc.RuntimeServiceStub:
        """The raw RuntimeService stub (for checks a test makes beside the client under test)."""
        return self._stub()

    # -- pods and containers --------------------------------------------------------------------------

    def run_pod(self, pod_name: str, namespace: str = "default", container: str = "main", handler: str = "runc",
                cpuset_cpus: str = "", cpuset_mems: str = "", memory_limit: int = 64 << 20,
                command: tuple[str, ...] = (), annotations: dict[str, str] | None = None,
                mounts: tuple[tuple[str, str], ...] = (), seccomp: str = "", cdi_devices: tuple[str, ...] = (),
                envs: tuple[tuple[str, str], ...] = (), pod_annotations: dict[str, str] | None = None,
                ) -> PodContainer:
        """A pod sandbox (host network, no hostname) and one running container with kubelet's labels.

        The container's resources are what kubelet would send for a Burstable pod (shares, period,
        a memory limit) with the given cpuset; :meth:`restart_container` reuses them.
        """
        uid = str(uuid.uuid4())
        own = tuple(sorted((pod_annotations or {}).items()))
        sandbox_config = self._sandbox_config(pod_name, namespace, uid, own)
        answer = self._call("RunPodSandbox", cri.RunPodSandboxRequest(config=sandbox_config, runtime_handler=handler))
        self._ids.add(answer.pod_sandbox_id)
        resources = cri.LinuxContainerResources(cpu_period=100_000, cpu_shares=256, memory_limit_in_bytes=memory_limit,
                                                cpuset_cpus=cpuset_cpus, cpuset_mems=cpuset_mems)
        pod = PodContainer(sandbox_id=answer.pod_sandbox_id, container_id="", handler=handler, pod_name=pod_name,
                           namespace=namespace, pod_uid=uid, container_name=container, resources=resources,
                           annotations=tuple(sorted((annotations or {}).items())), mounts=mounts, seccomp=seccomp,
                           cdi_devices=cdi_devices, envs=envs, pod_annotations=own)
        self._sandboxes[pod.sandbox_id] = pod
        return self._create_and_start(pod, sandbox_config, command)

    def _sandbox_config(self, pod_name: str, namespace: str, uid: str,
                        pod_annotations: tuple[tuple[str, str], ...] = ()) -> cri.PodSandboxConfig:
        logs = self.workdir / "logs" / uid
        logs.mkdir(parents=True, exist_ok=True)
        host = cri.NamespaceOption(network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD)
        return cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=pod_name, uid=uid, namespace=namespace, attempt=0),
            hostname="",  # host network: runc cannot set a hostname without a private UTS namespace
            log_directory=str(logs),
            labels={POD_NAME: pod_name, POD_NAMESPACE: namespace, POD_UID: uid},
            annotations={"kubernetes.io/config.source": "topology-devkit", **dict(pod_annotations)},
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=self.pod_cgroup(uid),
                security_context=cri.LinuxSandboxSecurityContext(namespace_options=host)),
        )

    def pod_cgroup(self, uid: str) -> str:
        """The cgroupfs parent of a pod of this harness (what kubelet's cgroupfs driver would name)."""
        return f"/{self.prefix}/pod{uid}"

    def _create_and_start(self, pod: PodContainer, sandbox_config: cri.PodSandboxConfig,
                          command: tuple[str, ...] = ()) -> PodContainer:
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=pod.container_name, attempt=pod.attempt),
            image=cri.ImageSpec(image=self.image),
            command=list(command),
            envs=[cri.KeyValue(key=k, value=v.encode()) for k, v in pod.envs],
            CDI_devices=[cri.CDIDevice(name=name) for name in pod.cdi_devices],
            labels=pod.labels,
            annotations={**dict(pod.annotations), "io.kubernetes.container.restartCount": str(pod.attempt)},
            mounts=[cri.Mount(host_path=host, container_path=inside, readonly=True) for host, inside in pod.mounts],
            log_path=f"{pod.container_name}/{pod.attempt}.log",
            linux=cri.LinuxContainerConfig(
                resources=pod.resources,
                security_context=cri.LinuxContainerSecurityContext(
                    seccomp=_seccomp_profile(pod.seccomp),
                    namespace_options=cri.NamespaceOption(network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD))),
        )
        created = self._call("CreateContainer", cri.CreateContainerRequest(
            pod_sandbox_id=pod.sandbox_id, config=config, sandbox_config=sandbox_config))
        self._ids.add(created.container_id)
        self._call("StartContainer", cri.StartContainerRequest(container_id=created.container_id))
        return replace(pod, container_id=created.container_id)

    def stop_container(self, container_id: str, timeout: int = 0) -> None:
        """Stop a container (SIGKILL at once with ``timeout=0``, as the container's PID 1 ignores SIGTERM)."""
        self._call("StopContainer", cri.StopContainerRequest(container_id=container_id, timeout=timeout))

    def remove_container(self, container_id: str) -> None:
        self._call("RemoveContainer", cri.RemoveContainerRequest(container_id=container_id))

    def restart_container(self, pod: PodContainer, remove_old: bool = False) -> PodContainer:
        """What kubelet does when a container dies: the old one is stopped (and kept, exited, unless
        ``remove_old``), a new container with the next attempt, the same labels and the pod's original
        resources is created in the same sandbox and started. Returns it (a new container id)."""
        self.stop_container(pod.container_id)
        if remove_old:
            self.remove_container(pod.container_id)
        again = replace(pod, attempt=pod.attempt + 1, container_id="")
        first = self._sandboxes[pod.sandbox_id]
        config = self._sandbox_config(first.pod_name, first.namespace, first.pod_uid, first.pod_annotations)
        return self._create_and_start(again, config)

    def remove_pod(self, pod: PodContainer) -> None:
        """Stop and remove a pod sandbox and all its containers."""
        self._call("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=pod.sandbox_id))
        self._call("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=pod.sandbox_id))
        self._sandboxes.pop(pod.sandbox_id, None)
        self._remove_cgroup_dirs(self.pod_cgroup(pod.pod_uid))

    def restrict_pod_cpus(self, pod: PodContainer, cpus: str) -> bool:
        """Write ``cpus`` into the pod-level cgroup's cpuset (this harness's own cgroup, removed with the pod):
        on cgroup v1 a container of the pod can then not be given a CPU outside it (the kernel's EINVAL, a real
        runtime failure). False on cgroup v2, where a child's cpuset may name CPUs its parent lacks."""
        if cgroup_v2():
            return False
        pod_dir = CGROUP_ROOT / "cpuset" / self.pod_cgroup(pod.pod_uid).strip("/")
        children = [d for d in pod_dir.iterdir() if d.is_dir()]
        wanted = set(parse_cpulist(cpus))
        if wanted < set(parse_cpulist((pod_dir / "cpuset.cpus").read_text())):  # narrower: children first
            for child in children:
                (child / "cpuset.cpus").write_text(cpus)
        (pod_dir / "cpuset.cpus").write_text(cpus)
        return True

    def container_pid(self, container_id: str) -> int:
        """The host PID of a running container (verbose ContainerStatus ``info["info"]["pid"]``)."""
        answer = self._call("ContainerStatus", cri.ContainerStatusRequest(container_id=container_id, verbose=True))
        pid = int(json.loads(answer.info["info"]).get("pid", 0)) if "info" in answer.info else 0
        if pid <= 0:
            raise HarnessError(f"container {container_id[:12]} has no process (state "
                               f"{cri.ContainerState.Name(answer.status.state)})")
        return pid

    def cpus_allowed_list(self, container_id: str) -> str:
        """``Cpus_allowed_list`` of the container's process, from /proc/<pid>/status."""
        return status_cpus_allowed(self.container_pid(container_id))

    def wait_exited(self, container_id: str, timeout: float = 10.0) -> int:
        """The exit code of a container once it has exited (HarnessError after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self._call("ContainerStatus", cri.ContainerStatusRequest(container_id=container_id)).status
            if status.state == cri.CONTAINER_EXITED:
                return int(status.exit_code)
            if time.monotonic() > deadline:
                raise HarnessError(f"container {container_id[:12]} still {cri.ContainerState.Name(status.state)} "
                                   f"after {timeout:.0f}s")
            time.sleep(0.02)

    def default_cpus(self) -> str:
        """The CPUs a container without a cpuset of its own runs on: those of the cgroup root its pod's
        cgroup is made under (runc and crun copy the parent's ``cpuset.cpus`` into a new cpuset)."""
        path = CGROUP_ROOT / "cpuset.cpus.effective" if cgroup_v2() else CGROUP_ROOT / "cpuset" / "cpuset.cpus"
        return path.read_text().strip()

    def wait_cpus_allowed(self, container_id: str, expected: str, timeout: float = 5.0) -> str:
        """Wait until the container's ``Cpus_allowed_list`` is ``expected``; the last value read."""
        pid = self.container_pid(container_id)
        seen = [status_cpus_allowed(pid)]

        def matches() -> bool:
            seen.append(status_cpus_allowed(pid))
            return seen[-1] == expected

        poll_until(matches, timeout)
        return seen[-1]

    # -- handlers -----------------------------------------------------------------------------------

    def handler_problems(self) -> dict[str, str | None]:
        """Each configured handler -> None when a pod runs with it here, else why not (probed once)."""
        if self._handlers is None:
            problems: dict[str, str | None] = {}
            for handler, binary in self.handler_binaries.items():
                if not Path(binary).is_file():
                    problems[handler] = f"{binary} is missing (apt-get install {handler})"
                    continue
                try:
                    pod = self.run_pod("probe", namespace="topology-devkit", handler=handler)
                    try:
                        state = self._call("ContainerStatus", cri.ContainerStatusRequest(
                            container_id=pod.container_id)).status.state
                        problems[handler] = (None if state == cri.CONTAINER_RUNNING else
                                             f"a {handler} container is {cri.ContainerState.Name(state)}")
                    finally:
                        self.remove_pod(pod)
                except HarnessError as exc:
                    problems[handler] = str(exc)
            self._handlers = problems
        return dict(self._handlers)

    def handlers(self) -> list[str]:
        """The runtime handlers that run containers here."""
        return [handler for handler, problem in self.handler_problems().items() if problem is None]

    # -- teardown -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove everything this harness made, whatever state it is in. Safe to call twice."""
        errors: list[str] = []
        if self.running:
            for sandbox in self._list_sandboxes():
                try:
                    self._call("StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=sandbox), timeout=20)
                    self._call("RemovePodSandbox", cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=20)
                except HarnessError as exc:
                    errors.append(str(exc))
        self.stop_containerd()
        self._kill_shims()
        self._kill_cgroup_processes()
        self._remove_cgroup_dirs(f"/{self.prefix}")
        self._remove_shim_sockets()
        for folder in reversed(self._made_folders):
            _rmdir(folder)  # only when empty: another containerd's shims may use it now
        self._made_folders = []
        if self._holder is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._holder.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._holder.wait(timeout=5)
            for stream in (self._holder.stdout, self._holder.stderr):
                if stream is not None:
                    stream.close()
            self._holder = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._sandboxes.clear()

    def _list_sandboxes(self) -> list[str]:
        try:
            answer = self._call("ListPodSandbox", cri.ListPodSandboxRequest(), timeout=10)
        except HarnessError:
            return list(self._sandboxes)
        return [sandbox.id for sandbox in answer.items]

    def _own_processes(self) -> list[int]:
        """Shims (and anything else) started for this harness: their command line names its socket."""
        marker = str(self.socket).encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline and alive(int(entry.name)):
                found.append(int(entry.name))
        return found

    def _kill_shims(self) -> None:
        for pid in self._own_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        poll_until(lambda: not self._own_processes(), 5.0)

    def _cgroup_dirs(self, relative: str) -> list[Path]:
        """``relative`` (a cgroupfs path) in every hierarchy this machine mounts under /sys/fs/cgroup."""
        relative = relative.strip("/")
        if cgroup_v2():
            return [CGROUP_ROOT / relative]
        roots = [p for p in CGROUP_ROOT.iterdir() if p.is_dir() and (p / "cgroup.procs").is_file()]
        return [root / relative for root in roots]

    def _kill_cgroup_processes(self) -> None:
        def pids() -> set[int]:
            found: set[int] = set()
            for top in self._cgroup_dirs(f"/{self.prefix}"):
                if top.is_dir():
                    for procs in top.rglob("cgroup.procs"):
                        with contextlib.suppress(OSError, ValueError):
                            found |= {int(p) for p in procs.read_text().split()}
            return {pid for pid in found if alive(pid)}

        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        poll_until(lambda: not pids(), 5.0)

    def _remove_cgroup_dirs(self, relative: str) -> None:
        """rmdir ``relative`` and everything below it, deepest first, in every hierarchy (a cgroup
        directory holds only the kernel's files, so rmdir is how it is removed)."""
        for top in self._cgroup_dirs(relative):
            if not top.is_dir():
                continue
            below = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for directory in [*below, top]:
                poll_until(functools.partial(_rmdir, directory), 2.0, every=0.05)

    def _remove_shim_sockets(self) -> None:
        """A shim's socket is /run/containerd/s/<sha256(address/namespace/id)>; the hash includes our
        socket path, so only this harness's sockets match."""
        for ident in self._ids:
            digest = hashlib.sha256(os.path.join(str(self.socket), NAMESPACE, ident).encode()).hexdigest()
            for path in (SHIM_SOCKETS / digest, SHIM_SOCKETS / f"{digest}.debug"):
                with contextlib.suppress(OSError):
                    path.unlink()


def make_shim_folders(modes: tuple[tuple[Path, int], ...] = SHIM_FOLDER_MODES) -> list[Path]:
    """Create the missing shim socket folders with containerd's own modes; the ones created, outermost first."""
    made = []
    for folder, mode in modes:
        if not folder.exists():
            folder.mkdir(exist_ok=True)
            folder.chmod(mode)
            made.append(folder)
    return made


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


@contextlib.contextmanager
def containerd(prefix: str = "topo-cri") -> Iterator[Containerd]:
    """``with containerd() as ctd:`` -- the same as ``with Containerd() as ctd:``."""
    with Containerd(prefix) as ctd:
        yield ctd


def _timed(label: str, action: Callable[[], T]) -> T:
    started = time.perf_counter()
    result = action()
    print(f"  {label:<34} {1000 * (time.perf_counter() - started):7.1f} ms")
    return result


def _demo(ctd: Containerd, handler: str, cpus: str) -> None:
    print(f"{handler}:")
    pod = _timed("run sandbox + container", lambda: ctd.run_pod("demo", handler=handler))
    print(f"  Cpus_allowed_list before: {ctd.cpus_allowed_list(pod.container_id)}")
    update = cri.UpdateContainerResourcesRequest(container_id=pod.container_id,
                                                 linux=cri.LinuxContainerResources(cpuset_cpus=cpus))
    _timed("UpdateContainerResources", lambda: ctd.runtime.UpdateContainerResources(update, timeout=10))
    print(f"  Cpus_allowed_list after:  {ctd.wait_cpus_allowed(pod.container_id, cpus)}")
    _timed("remove pod", lambda: ctd.remove_pod(pod))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a pod with each runtime handler on a private containerd, "
                                                 "pin it with UpdateContainerResources, print timings.")
    parser.add_argument("--cpus", default="0", help="the cpuset to pin each container to (default 0)")
    args = parser.parse_args(argv)
    try:
        ctd = _timed("start containerd + import image", lambda: Containerd().__enter__())
        try:
            for handler, problem in ctd.handler_problems().items():
                if problem is None:
                    _demo(ctd, handler, args.cpus)
                else:
                    print(f"{handler}: does not work here: {problem}")
        finally:
            _timed("teardown", ctd.close)
    except (ContainerdUnavailable, HarnessError) as exc:
        print(f"containerd: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
