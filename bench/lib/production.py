"""The agent with production defaults, as the chart runs it, for the benches.

* **The install**: the image runs a plain (non-editable) install in a venv through the ``topology-agent``
  script. The dev venv's editable install adds an import finder (~8 ms a start), so
  :func:`image_install` builds the image's layout once per source version under ``build/bench-image/``:
  a venv without pip, the image lock's packages (``deploy/image/requirements.txt``, hashes checked, from
  pip's cache or PyPI; when that fails, a ``.pth`` line pointing at the dev venv's site-packages,
  which the image constraints pin to the same versions), the agent as a wheel built from a copy of the
  sources, and everything compiled with ``--invalidation-mode unchecked-hash`` as the Dockerfile does.
* **Node labels over TLS as in a pod** (:class:`NodeApiServer`): a tiny HTTPS server in the bench
  process answers GET and merge-PATCH of ``/api/v1/nodes/NAME`` (bearer token checked), and DRA mode's
  ResourceSlice list, create, replace and delete (kept in memory), with a
  self-signed certificate for 127.0.0.1 made by the openssl CLI. The agent runs in a private mount
  namespace (``unshare -m``) through a wrapper script that mounts a tmpfs at
  ``/var/run/secrets/kubernetes.io/serviceaccount`` holding ``token``, ``ca.crt`` and ``namespace``
  (where ``/var/run/secrets`` does not exist, a tmpfs first goes over its deepest existing parent, in
  that namespace only), with ``NODE_NAME`` and ``KUBERNETES_SERVICE_HOST=127.0.0.1`` /
  ``KUBERNETES_SERVICE_PORT`` set. Without unshare (or openssl) the agent runs with
  ``--no-node-labels`` and :attr:`Production.labels_note` says why.
* **Metrics on** a free port on every address (the agent's default address); the chart's kubelet
  probes (``/readyz`` every 5 s, ``/healthz`` every 10 s) come from :class:`Prober`.
* **kubelet's files**: ``config.yaml`` (``bench/kubelet-config.yaml``, a ~100-line kubeadm
  KubeletConfiguration) and ``cpu_manager_state`` (policy none), passed with ``--kubelet-config`` and
  ``--cpu-manager-state``.
* JSON logs at info, the default intervals (rescan 5 s, pod-resources 2 s), the topology from a
  host-root tree (``--host-root``/``--proc-root``), z16-400 unless a bench says otherwise.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.common import ROOT, BenchError
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.testing.apiserver import FakeApiServer, Request

NODE_NAME = "bench-s390x-node"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
KUBELET_CONFIG = Path(__file__).resolve().parent / "kubelet-config.yaml"
CPU_MANAGER_STATE = '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}\n'
IMAGE_CACHE = ROOT / "build" / "bench-image"


# --------------------------------------------------------------------------- the image's install

@dataclass(frozen=True)
class ImageInstall:
    venv: Path
    script: Path  # bin/topology-agent, the image's ENTRYPOINT
    python: Path
    how: str  # one line: how it was built

    def run_env(self) -> dict[str, str]:
        """The environment an image process gets (the image's ENV), without the dev venv's."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TOPOLOGY_AGENT_", "PYTHON", "VIRTUAL_ENV", "KUBERNETES_"))}
        env.update(PATH=f"{self.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", PYTHONUNBUFFERED="1",
                   PYTHONDONTWRITEBYTECODE="1", PYTHONFAULTHANDLER="1")
        return env


def _source_key() -> str:
    digest = hashlib.sha256()
    files = [ROOT / "pyproject.toml", ROOT / "deploy/image/requirements.txt",
             *sorted(p for p in (ROOT / "agent").rglob("*") if p.is_file() and "__pycache__" not in p.parts)]
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(sys.version.encode())
    return digest.hexdigest()[:16]


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, check=False)


def image_install() -> ImageInstall:
    """The image's venv for the current sources: built once at ``build/bench-image/<key>`` (in place: a
    venv's scripts name its path), ``how.txt`` written last marks it complete."""
    target = IMAGE_CACHE / _source_key()
    marker = target / "how.txt"
    if not marker.is_file():
        for old in IMAGE_CACHE.glob("*"):  # older sources' installs, or a build that was interrupted
            shutil.rmtree(old, ignore_errors=True)
        target.mkdir(parents=True)
        try:
            how = _build(target)
        except (subprocess.CalledProcessError, ValueError) as exc:
            shutil.rmtree(target, ignore_errors=True)
            raise BenchError(f"cannot build the image-like install: {exc}") from None
        except BenchError:
            shutil.rmtree(target, ignore_errors=True)
            raise
        marker.write_text(how + "\n")
    return ImageInstall(target, target / "bin" / "topology-agent", target / "bin" / "python",
                        marker.read_text().strip())


def _build(venv: Path) -> str:
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    py = str(venv / "bin" / "python")
    deps = _pip("--python", py, "install", "--no-deps", "--require-hashes", "--only-binary=:all:",
                "-r", str(ROOT / "deploy/image/requirements.txt"))
    if deps.returncode == 0:
        how = "the image lock's packages (hashes checked)"
    else:  # no registry: the dev venv's copies (the dev venv is constrained by the same lock)
        site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True).stdout.strip())
        (site / "bench-dev-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
        last = deps.stderr.strip().splitlines()[-1] if deps.stderr.strip() else "pip failed"
        how = f"the dev venv's packages through a .pth (the image lock could not be installed: {last})"
    with tempfile.TemporaryDirectory(prefix="bench-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy2(ROOT / name, src / name)
        shutil.copytree(ROOT / "agent", src / "agent", ignore=shutil.ignore_patterns("__pycache__"))
        wheel = _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(Path(tmp) / "dist"), str(src))
        if wheel.returncode != 0:
            raise BenchError(f"cannot build the agent's wheel: {wheel.stderr[-800:]}")
        (whl,) = (Path(tmp) / "dist").glob("*.whl")
        installed = _pip("--python", py, "install", "--no-deps", "--no-index", str(whl))
        if installed.returncode != 0:
            raise BenchError(f"cannot install the agent's wheel: {installed.stderr[-800:]}")
    subprocess.run([py, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
                    str(venv / "lib")], check=True, capture_output=True)
    return f"a venv with {how}, the agent installed from its wheel, bytecode compiled (unchecked-hash), " \
           f"started as bin/topology-agent"


# --------------------------------------------------------------------------- the API server

def make_certificate(directory: Path) -> tuple[Path, Path] | str:
    """A self-signed certificate for IP 127.0.0.1 (cert, key), or why there is none."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return "the openssl CLI is missing (needed for the fake API server's certificate)"
    cert, key = directory / "apiserver.crt", directory / "apiserver.key"
    done = subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                           "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                           "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"openssl could not make a certificate: {done.stderr.strip()[-300:]}"
    return cert, key


SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class NodeApiServer(FakeApiServer):
    """One Node (GET, and JSON merge-PATCH of its labels and annotations) and ResourceSlices (list, create, replace,
    delete: DRA mode's publication) over HTTPS behind a bearer token, as an API server answers an agent in a pod;
    every request recorded (``requests``)."""

    def __init__(self, cert: Path, key: Path, node: str = NODE_NAME) -> None:
        self.token = hashlib.sha256(os.urandom(16)).hexdigest()
        self.node_name = node
        self.node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": node, "uid": "00000000-0000-4000-8000-000000000001",
            "labels": {"kubernetes.io/arch": "s390x", "kubernetes.io/hostname": node,
                       "kubernetes.io/os": "linux"}, "annotations": {}}}
        self.slices: dict[str, dict[str, Any]] = {}
        super().__init__(self.answer, tls=(cert, key), keep_alive=True)

    def answer(self, request: Request) -> tuple[int, Any]:
        scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
        if not (scheme.lower() == "bearer" and token == self.token):  # the scheme: any case
            return 401, {"kind": "Status", "message": "Unauthorized", "code": 401}
        if request.path == SLICES or request.path.startswith(SLICES + "/"):
            return self._slices(request)
        if request.target != f"/api/v1/nodes/{self.node_name}":
            return 404, {"kind": "Status", "message": f"{request.target} not found", "code": 404}
        if request.method == "PATCH":
            if request.headers.get("Content-Type") != "application/merge-patch+json":
                return 415, {"kind": "Status", "message": "unsupported patch", "code": 415}
            patch = request.json()
            with self.lock:
                meta = self.node["metadata"]
                for part in ("labels", "annotations"):
                    for k, v in (patch.get("metadata", {}).get(part) or {}).items():
                        if v is None:
                            meta[part].pop(k, None)
                        else:
                            meta[part][k] = v
        with self.lock:
            return 200, json.loads(json.dumps(self.node))

    def _slices(self, request: Request) -> tuple[int, Any]:
        name, body = request.path[len(SLICES) + 1:], request.json()
        with self.lock:
            if request.method == "GET" and not name:
                return 200, {"kind": "ResourceSliceList", "metadata": {},
                             "items": json.loads(json.dumps(list(self.slices.values())))}
            if request.method in ("POST", "PUT") and isinstance(body, dict):
                body["metadata"]["resourceVersion"] = str(len(self.requests))
                self.slices[body["metadata"]["name"]] = body
                return (201 if request.method == "POST" else 200), body
            if request.method == "DELETE" and self.slices.pop(name, None) is not None:
                return 200, {"kind": "Status", "status": "Success"}
        return 404, {"kind": "Status", "message": f"{request.path} not found", "code": 404}

    def labels(self) -> dict[str, str]:
        with self.lock:
            return dict(self.node["metadata"]["labels"])


def refused_port() -> int:
    """A port on 127.0.0.1 that refuses connections (bound, then closed: nothing listens there)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_kubeconfig(path: Path, port: int, token: str, ca: Path | None) -> Path:
    """A kubeconfig for ``https://127.0.0.1:PORT`` with a bearer token (a developer's, or a local run's)."""
    cluster = f"certificate-authority: {ca}" if ca is not None else "insecure-skip-tls-verify: true"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: bench
  cluster:
    server: https://127.0.0.1:{port}
    {cluster}
users:
- name: bench
  user:
    token: {token}
contexts:
- name: bench
  context: {{cluster: bench, user: bench}}
current-context: bench
""")
    return path


# --------------------------------------------------------------------------- the pod's mount namespace

def unshare_problem() -> str | None:
    """None when a private mount namespace with a tmpfs can be made here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is missing"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs bench-probe /mnt && umount /mnt"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        return f"cannot make a private mount namespace with a tmpfs: {probe.stderr.strip()[-200:]}"
    return None


def write_wrapper(directory: Path, secrets: Path) -> Path:
    """``wrapper COMMAND...``: in the (already private) mount namespace, mount a tmpfs at the service
    account directory, copy the token, ca.crt and namespace into it, then exec COMMAND."""
    wrapper = directory / "in-pod.sh"
    wrapper.write_text(f"""#!/bin/sh
set -e
sa={SERVICE_ACCOUNT}
if [ ! -d "$sa" ]; then
    # Mount a tmpfs over the deepest existing parent (only in this namespace), then make the path in it.
    parent=$sa
    while [ ! -d "$parent" ]; do parent=$(dirname "$parent"); done
    mount -t tmpfs -o mode=0755,size=1m bench-run "$parent"
    mkdir -p "$sa"
fi
mount -t tmpfs -o mode=0755,size=1m bench-serviceaccount "$sa"
cp {secrets}/token {secrets}/ca.crt {secrets}/namespace "$sa/"
exec "$@"
""")
    wrapper.chmod(0o755)
    return wrapper


# --------------------------------------------------------------------------- kubelet's probes

class Prober:
    """kubelet's probes as the chart sets them: GET /readyz every 5 s (from 2 s) and /healthz every 10 s
    (from 10 s), each on a new connection, as kubelet's prober does."""

    def __init__(self, port: int, readiness: tuple[float, float] = (2.0, 5.0),
                 liveness: tuple[float, float] = (10.0, 10.0)) -> None:
        self.port = port
        self.answers: dict[str, list[int]] = {"/readyz": [], "/healthz": []}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(path, delay, period), daemon=True,
                                          name=f"probe{path}")
                         for path, (delay, period) in (("/readyz", readiness), ("/healthz", liveness))]
        for t in self._threads:
            t.start()

    def _loop(self, path: str, delay: float, period: float) -> None:
        if self._stop.wait(delay):
            return
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3)
            try:
                conn.request("GET", path, headers={"User-Agent": "kube-probe/1.30"})
                response = conn.getresponse()
                response.read()
                self.answers[path].append(response.status)
            except OSError:
                self.answers[path].append(0)
            finally:
                conn.close()
            if self._stop.wait(period):
                return

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)


# --------------------------------------------------------------------------- all of it

class Production:
    """What stays the same for every agent a bench starts: the install, the API server, the secrets,
    kubelet's files. :meth:`agent` starts one agent with them."""

    def __init__(self, workdir: Path, *, labels: bool = True, api: str = "up") -> None:
        """``api``: ``up`` (the fake API server), ``refused`` (the pod's service account and environment,
        but the API server's port refuses connections) or ``refused-kubeconfig`` (no service account: a
        ``KUBECONFIG`` naming a port that refuses connections)."""
        if api not in ("up", "refused", "refused-kubeconfig"):
            raise ValueError(f"api must be up, refused or refused-kubeconfig, not {api!r}")
        self.api_mode = api
        self.kubeconfig: Path | None = None
        self.refused = 0  # the refusing port, when api is not up
        self.workdir = workdir
        self.install = image_install()
        self.kubelet_files = workdir / "kubelet-root"
        self.kubelet_files.mkdir(parents=True, exist_ok=True)
        shutil.copy(KUBELET_CONFIG, self.kubelet_files / "config.yaml")
        (self.kubelet_files / "cpu_manager_state").write_text(CPU_MANAGER_STATE)
        self.api: NodeApiServer | None = None
        self.wrapper: Path | None = None
        self.pin: list[str] = []  # a command prefix for the agent, e.g. ["taskset", "-c", "1"]
        self.labels_note = "node labels off (asked)"
        if labels:
            problem = unshare_problem()
            certificate = make_certificate(workdir) if problem is None else problem
            if isinstance(certificate, str):
                self.labels_note = f"NO node labels: {certificate}"
            else:
                cert, key = certificate
                self.api = NodeApiServer(cert, key)
                secrets = workdir / "serviceaccount"
                secrets.mkdir(exist_ok=True)
                (secrets / "token").write_text(self.api.token)
                shutil.copy(cert, secrets / "ca.crt")
                (secrets / "namespace").write_text("topology-agent")
                self.wrapper = write_wrapper(workdir, secrets)
                self.labels_note = ("node labels over TLS to a fake API server, service account on a tmpfs in a "
                                    "private mount namespace")
                if api != "up":
                    self.refused = refused_port()
                    self.api.close()  # nothing listens: the agent's requests are refused
                    if api == "refused-kubeconfig":
                        self.wrapper = None  # no service account: the kubeconfig is the agent's only way
                        self.kubeconfig = write_kubeconfig(workdir / "kubeconfig", self.refused, self.api.token, cert)
                        self.labels_note = (f"node labels on, KUBECONFIG naming https://127.0.0.1:{self.refused}, "
                                            f"which refuses connections (no service account)")
                    else:
                        self.labels_note = (f"node labels on, service account as in a pod, KUBERNETES_SERVICE_PORT "
                                            f"{self.refused}, which refuses connections")

    @property
    def labels(self) -> bool:
        return self.api is not None

    @property
    def api_up(self) -> bool:
        return self.api is not None and self.api_mode == "up"

    def env(self) -> dict[str, str]:
        env = self.install.run_env()
        env.pop("KUBECONFIG", None)
        env["NODE_NAME"] = NODE_NAME
        if self.api is not None:
            if self.kubeconfig is not None:
                env["KUBECONFIG"] = str(self.kubeconfig)
            else:
                port = self.api.port if self.api_mode == "up" else self.refused
                env.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(port))
        return env

    def entry(self) -> list[str]:
        """The command up to the subcommand: the installed script, in its own mount namespace with labels
        (after :attr:`pin`, e.g. ``taskset -c 1``, when a bench pins the agent)."""
        if self.wrapper is None:
            return [*self.pin, str(self.install.script)]
        return [*self.pin, "unshare", "-m", "--propagation", "private", str(self.wrapper), str(self.install.script)]

    def wrapper_only(self) -> list[str]:
        """The same namespace and mounts, then ``true``: what the wrapper itself costs a start."""
        if self.wrapper is None:
            return ["true"]
        return ["unshare", "-m", "--propagation", "private", str(self.wrapper), "true"]

    def args(self, tree: Path) -> list[str]:
        return ["--host-root", str(tree), "--proc-root", str(tree / "proc"),
                "--kubelet-config", str(self.kubelet_files / "config.yaml"),
                "--cpu-manager-state", str(self.kubelet_files / "cpu_manager_state"),
                "--log-level", "info", *([] if self.labels else ["--no-node-labels"])]

    def agent(self, kubelet: KubeletEmulator, tree: Path, *extra: str) -> AgentProcess:
        return AgentProcess(kubelet, self.workdir, *self.args(tree), *extra, topology=None, entry=self.entry(),
                            env=self.env(), cwd=self.workdir, rescan_interval=None, metrics_address=None)

    def close(self) -> None:
        if self.api is not None and self.api_mode == "up":
            self.api.close()

    def __enter__(self) -> Production:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

