"""OCI image archives written with the standard library (no registry, no image tool).

:func:`write_archive` writes an OCI image layout as one tarball (``oci-layout``, ``index.json``,
``blobs/sha256/...``) that ``ctr images import`` takes as it is: the index entry carries the image's
full name in ``io.containerd.image.name`` (what ctr names the image after, whatever its ``--base-name``)
and its tag in ``org.opencontainers.image.ref.name``. Layers are uncompressed tars with every file
owned by root and dated 1970, so the same inputs give the same bytes (and digests).

:func:`busybox_layer` is busybox-static with a symlink per applet; :func:`files_layer` is a few files.
Used by :mod:`topology_devkit.containerd` (its test image) and :mod:`topology_devkit.realcluster.images`.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import subprocess
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

INDEX_NAME = "io.containerd.image.name"  # the annotation containerd's importer names the image after
REF_NAME = "org.opencontainers.image.ref.name"  # the OCI layout's own name of the entry (the tag)
EPOCH = "1970-01-01T00:00:00Z"


def goarch() -> str:
    """This machine's architecture as Go (and OCI) spell it."""
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}.get(machine, machine)


def tar_info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    """A tar member owned by root:root and dated 0."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    return info


def busybox_layer(busybox: Path) -> bytes:
    """A root filesystem of busybox-static: /bin/busybox, a symlink per applet, /dev /etc /proc /sys /tmp."""
    binary = busybox.read_bytes()
    listing = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True, timeout=10)
    applets = sorted({a for a in listing.stdout.split() if a and "/" not in a and a != "busybox"})
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp"):
            tar.addfile(tar_info(directory, tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755))
        tar.addfile(tar_info("bin/busybox", tarfile.REGTYPE, 0o755, len(binary)), io.BytesIO(binary))
        for applet in applets:
            tar.addfile(tar_info(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
    return out.getvalue()


def files_layer(files: Mapping[str, tuple[bytes, int]], directories: Iterable[str] = ()) -> bytes:
    """A layer of ``directories`` (mode 0755) and ``files`` (path -> (content, mode)), in that order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in directories:
            tar.addfile(tar_info(directory, tarfile.DIRTYPE, 0o755))
        for name, (data, mode) in files.items():
            tar.addfile(tar_info(name, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))
    return out.getvalue()


def write_archive(path: Path, name: str, layers: Sequence[bytes], config: Mapping[str, Any],
                  architecture: str | None = None, history: Sequence[str] | None = None) -> Path:
    """Write an OCI image layout tarball of ``layers`` (uncompressed tars, lowest first) to ``path``.

    ``config`` is the image config's ``config`` section (Entrypoint, Cmd, Env, WorkingDir, ...); ``name``
    the image's full reference (``localhost/app:tag``). ``history``: one ``created_by`` per layer, for tools
    that build on the image (buildah refuses a base whose history does not account for its layers);
    containerd needs none.
    """
    arch = architecture or goarch()
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    image_config: dict[str, Any] = {
        "architecture": arch, "os": "linux", "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]},
    }
    if history is not None:
        if len(history) != len(layers):
            raise ValueError(f"{len(history)} history entries for {len(layers)} layers")
        image_config["created"] = EPOCH
        image_config["history"] = [{"created": EPOCH, "created_by": step} for step in history]
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   **blob(json.dumps(image_config, sort_keys=True).encode())},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer)} for layer in layers],
    }
    index = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       **blob(json.dumps(manifest, sort_keys=True).encode()),
                       "platform": {"architecture": arch, "os": "linux"},
                       "annotations": {INDEX_NAME: name, REF_NAME: name.rpartition(":")[2]}}],
    }
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
                 "index.json": json.dumps(index, sort_keys=True).encode()}
        files |= {f"blobs/sha256/{digest.split(':', 1)[1]}": data for digest, data in blobs.items()}
        for directory in ("blobs", "blobs/sha256"):
            tar.addfile(tar_info(directory, tarfile.DIRTYPE, 0o755))
        for name_in_tar, data in files.items():
            tar.addfile(tar_info(name_in_tar, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return path
