"""The kind lane's control-plane images and the node's runtime spec, written without a registry.

kubeadm runs the control plane as static pods from images; kind's own node-image builder pulls them
(../shared/docs/kind-offline.md §2), so the node image carries its own, made here from the real-cluster lane's
binaries (devkit/cluster/build.sh) with :mod:`topology_devkit.oci`: ``FROM scratch`` plus one static binary in
``/usr/local/bin`` (kubeadm's static pods run ``kube-apiserver``, ``etcd``, ... by name, through PATH), and the
sandbox image from this project's own pause.c. Each is an OCI archive named
``localhost/topology-kind/<name>:<tag>``, the repository the kind config gives kubeadm (``imageRepository``), and
imported into the node's containerd at boot (devkit/kind/node/topology-preload.service). node-image.sh runs it,
with the devkit on PYTHONPATH:

    python devkit/kind/node_images.py images --bin DIR --out DIR     the control-plane images
    python devkit/kind/node_images.py cri-base --ctr CTR > cri-base.json   kind's base runtime spec
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from topology_devkit import oci

REPOSITORY = "localhost/topology-kind"
PATH_ENV = "PATH=/usr/local/bin:/usr/bin:/bin"


def control_plane_images(kubernetes: str, etcd: str) -> dict[str, tuple[str, str]]:
    """Image name -> (binary, its file name in /usr/local/bin) for kubeadm's static pods (kube-proxy and CoreDNS
    are not deployed: the kind config skips both addons)."""
    return {
        f"{REPOSITORY}/kube-apiserver:v{kubernetes}": ("kube-apiserver", "kube-apiserver"),
        f"{REPOSITORY}/kube-controller-manager:v{kubernetes}": ("kube-controller-manager", "kube-controller-manager"),
        f"{REPOSITORY}/kube-scheduler:v{kubernetes}": ("kube-scheduler", "kube-scheduler"),
        # kubeadm names etcd's image <repository>/etcd:<version>-0 (the kind config sets etcd.local.imageTag)
        f"{REPOSITORY}/etcd:{etcd}-0": ("etcd", "etcd"),
    }


def pause_image() -> str:
    return f"{REPOSITORY}/pause:3.10"


def write_images(bins: Path, pause_binary: Path, out: Path, kubernetes: str, etcd: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (binary, target) in control_plane_images(kubernetes, etcd).items():
        data = (bins / binary).read_bytes()
        layer = oci.files_layer({f"usr/local/bin/{target}": (data, 0o755)}, directories=("usr", "usr/local",
                                                                                        "usr/local/bin"))
        path = out / (name.rsplit("/", 1)[1].replace(":", "_") + ".oci.tar")
        written.append(oci.write_archive(path, name, [layer], {"Env": [PATH_ENV]}))
    layer = oci.files_layer({"pause": (pause_binary.read_bytes(), 0o755)})
    written.append(oci.write_archive(out / "pause_3.10.oci.tar", pause_image(), [layer],
                                     {"Entrypoint": ["/pause"], "WorkingDir": "/", "User": "65535:65535"}))
    return written


def cri_base(ctr: Path) -> dict[str, object]:
    """kind's /etc/containerd/cri-base.json: ``ctr oci spec`` with kind's createContainer hook and no rlimits
    (kind images/base/Dockerfile: the same two jq filters)."""
    spec = json.loads(subprocess.run([str(ctr), "oci", "spec"], capture_output=True, text=True, check=True,
                                     timeout=30).stdout)
    hooks = spec.setdefault("hooks", {}).setdefault("createContainer", [])
    hooks.append({"path": "/kind/bin/mount-product-files.sh"})
    spec.get("process", {}).pop("rlimits", None)
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python devkit/kind/node_images.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    images = sub.add_parser("images", help="write the control-plane and pause images as OCI archives")
    images.add_argument("--bin", type=Path, required=True, help="the real-cluster lane's bin folder")
    images.add_argument("--pause", type=Path, required=True, help="the static pause binary")
    images.add_argument("--out", type=Path, required=True)
    images.add_argument("--kubernetes", required=True)
    images.add_argument("--etcd", required=True)
    base = sub.add_parser("cri-base", help="print kind's base runtime spec")
    base.add_argument("--ctr", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "images":
            for path in write_images(args.bin, args.pause, args.out, args.kubernetes, args.etcd):
                print(path)
        else:
            print(json.dumps(cri_base(args.ctr), indent=1))
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"node_images: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
