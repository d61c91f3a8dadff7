"""Certificates and keys of the real-cluster lane, made with the openssl command line.

One CA signs everything (as ``hack/local-up-cluster.sh`` does with its client CA and signing CA on one
machine): the API server's serving certificate, the kubelet's serving certificate, and the client
certificates of the admin, the controller manager, the scheduler, the kubelet (``system:node:<node>`` in
``system:nodes``, what the Node authorizer and NodeRestriction admit) and the API server's kubelet client.
The service-account signing key is a separate RSA key pair. Everything is made once per cluster folder.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "3650"


@dataclass(frozen=True)
class Client:
    name: str  # file stem
    cn: str
    org: str = ""


def clients(node: str) -> tuple[Client, ...]:
    return (
        Client("admin", "kubernetes-admin", "system:masters"),
        Client("controller-manager", "system:kube-controller-manager"),
        Client("scheduler", "system:kube-scheduler"),
        Client("kubelet", f"system:node:{node}", "system:nodes"),
        Client("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
    )


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")


def _sign(pki: Path, stem: str, subject: str, extensions: str) -> None:
    ext = pki / f"{stem}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{stem}.key", "-out", f"{stem}.csr",
             "-subj", subject, cwd=pki)
    _openssl("x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", DAYS, "-sha256", "-extfile", ext.name, "-out", f"{stem}.crt", cwd=pki)
    (pki / f"{stem}.csr").unlink()
    ext.unlink()


def make_pki(pki: Path, node: str, serving_ips: list[str], serving_names: list[str]) -> None:
    """Write ca, apiserver, kubelet-serving, every client pair and sa.key/sa.pub into ``pki`` (once)."""
    pki.mkdir(parents=True, exist_ok=True)
    if (pki / "complete").exists():
        return
    _openssl("req", "-x509", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", DAYS, "-subj", "/CN=topology-e2e-ca", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=pki)
    san = ",".join([f"IP:{ip}" for ip in serving_ips] + [f"DNS:{name}" for name in serving_names])
    server_ext = ("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                  f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n")
    _sign(pki, "apiserver", "/CN=kube-apiserver", server_ext)
    kubelet_san = ",".join(["IP:127.0.0.1", f"DNS:{node}", "DNS:localhost"])
    _sign(pki, "kubelet-serving", f"/CN={node}", server_ext.replace(f"subjectAltName={san}",
                                                                     f"subjectAltName={kubelet_san}"))
    client_ext = ("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                  "extendedKeyUsage=clientAuth\n")
    for client in clients(node):
        subject = f"/CN={client.cn}" + (f"/O={client.org}" if client.org else "")
        _sign(pki, client.name, subject, client_ext)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for key in pki.glob("*.key"):
        key.chmod(0o600)
    (pki / "complete").write_text("")
