"""etcd and kube-apiserver alone, from the lane's cached binaries, on free loopback ports in a folder of their own.

A real API server (its schema validation, CRDs, RBAC and admission) for tests that need nothing else: no node,
no controllers, no host path, so it needs no lane lock and can run beside a lane. Its PKI is the lane's
(:mod:`.pki`); the admin's kubeconfig is ``<folder>/kubeconfig``. ``stop`` ends both processes (by pid) and
leaves the logs in ``<folder>/logs``.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import pki
from .layout import Layout
from .procs import start, stop, wait_until

SERVICE_CIDR = "10.0.0.0/24"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class LoneApiServer:
    """A running etcd and kube-apiserver; ``kubeconfig`` is the admin's (system:masters)."""

    layout: Layout
    port: int

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.layout.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.layout.pki / "admin.crt"), str(self.layout.pki / "admin.key"))
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=3, context=ctx) as answer:
                return bool(answer.status == 200)
        except (OSError, ssl.SSLError):
            return False

    def stop(self) -> None:
        for component in ("kube-apiserver", "etcd"):
            stop(self.layout, component)


def start_apiserver(folder: Path, bins: Path, timeout: float = 90.0) -> LoneApiServer:
    """Start etcd and kube-apiserver (``bins``: a build set's folder) in ``folder``; wait for /readyz."""
    layout = Layout(folder)
    pki.make_pki(layout.pki, "lone", ["127.0.0.1"], ["localhost"])
    client, peer, port = _free_port(), _free_port(), _free_port()
    start(layout, "etcd", [
        str(bins / "etcd"), "--name", "lone", "--data-dir", str(layout.etcd_data),
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"lone=http://127.0.0.1:{peer}", "--unsafe-no-fsync", "--log-level", "warn"])
    p = layout.pki
    start(layout, "kube-apiserver", [
        str(bins / "kube-apiserver"), "--authorization-mode=RBAC", "--allow-privileged=true",
        f"--cert-dir={p}", f"--client-ca-file={p / 'ca.crt'}",
        f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
        f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
        "--endpoint-reconciler-type=none", f"--etcd-servers=http://127.0.0.1:{client}",
        f"--service-cluster-ip-range={SERVICE_CIDR}", "--v=1"])
    server = LoneApiServer(layout, port)
    try:
        wait_until("the API server's /readyz", server.ready, timeout, layout, "kube-apiserver", step=0.5)
    except BaseException:
        server.stop()
        raise
    layout.kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "lone",
        "clusters": [{"name": "lone", "cluster": {"server": server.url,
                                                  "certificate-authority-data": _b64(p / "ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": _b64(p / "admin.crt"),
                                             "client-key-data": _b64(p / "admin.key")}}],
        "contexts": [{"name": "lone", "context": {"cluster": "lone", "user": "admin"}}],
    }, indent=1) + "\n")
    layout.kubeconfig.chmod(0o600)
    return server
