"""The images the real single-node cluster runs, built on this machine without a registry.

Three images, each written as an OCI archive (an OCI image layout in one tarball) to the cache folder
(default ``${CLUSTER_CACHE:-${XDG_CACHE_HOME:-~/.cache}/s390x-topology-agent/cluster}/images``), never to
the work tree, and named inside the archive so that ``ctr -n k8s.io images import`` names the image:

``localhost/topology-e2e-pause:3.10``
    The pod sandbox image: ``/pause`` alone, this project's own pause program (``pause.c`` beside this
    module) compiled static with gcc. PID 1 that exits 0 on SIGINT/SIGTERM, reaps children on SIGCHLD and
    otherwise sleeps in pause(). Written with the standard library (:mod:`topology_devkit.oci`); the
    compiled binary is cached by the source's and the compiler's hash.
``localhost/topology-e2e-busybox:latest``
    busybox-static (``/bin/busybox`` of the Debian package) with a symlink per applet, no entrypoint,
    ``Cmd ["sh"]``, ``PATH=/bin``: for test workloads (``kubectl run ... -- sh -c 'grep Cpus_allowed_list
    /proc/self/status'``). Its tag is ``latest``, for which the API server defaults imagePullPolicy to
    Always: pods must say ``imagePullPolicy: IfNotPresent`` (or Never), since no registry has it.
``localhost/s390x-topology-agent:e2e``
    The agent, built from the repository's own ``Dockerfile.s390x`` with buildah for linux/amd64
    (``buildah bud --format docker --isolation chroot --layers``), rebuilt on every run; the layer cache
    makes a build where only agent/ changed re-run the wheel, its install and the last checks only.

The agent image's base: ``python:3.11-slim-bookworm`` cannot be pulled here (no registry), so a stand-in
``localhost/python-standin:3.11-slim-bookworm`` is made from Debian packages: ``debootstrap
--variant=minbase bookworm`` from this machine's Debian mirror (the first bookworm entry of
/etc/apt/sources.list*), then, in the chroot, ``apt-get install --no-install-recommends`` of
:data:`STANDIN_PACKAGES` and ``apt-get dist-upgrade`` from bookworm, bookworm-updates and
bookworm-security, then the slim images' trimming (docs but the copyright files, man pages, locales,
apt lists and caches). It is written to the cache as an OCI archive keyed by the package list, the
suite, the mirror and this recipe's version, and loaded into buildah's storage from there: only the
first build pays for it (about a minute). What differs from the real base (``docker.io/library/
python:3.11-slim-bookworm``):

* Python is Debian's python3.11 (3.11.2 with Debian's security patches, ``3.11.2-6+deb12uN``) in
  /usr/bin, not python.org's CPython 3.11.x (a later 3.11 patch release) built into /usr/local/bin;
  ``python`` is python-is-python3's symlink. Debian splits the standard library: venv and ensurepip come
  from python3.11-venv, distutils from python3-distutils, lib2to3 from python3-lib2to3; tkinter
  (python3-tk), idlelib (idle-python3.11) and the test suite are absent (the official image has idlelib and
  tkinter's Python files, without _tkinter, and strips the test suite too). The system site-packages is
  /usr/lib/python3/dist-packages (empty), not /usr/local/lib/python3.11/site-packages.
* pip inside a venv is the wheel Debian's ensurepip bundles (pip 23.0.1, setuptools 66.1.1, from
  python3-pip-whl and python3-setuptools-whl), not the newer pip the official image bundles; there is no
  system pip (the official image has /usr/local/bin/pip). The Dockerfile uses pip only inside venvs and
  installs the locked build backends and dependencies by hash, so what lands in /opt/venv is the same.
* The standard library's .pyc files are Debian's (py3compile at install, timestamp-based); the official
  image ships none and the Dockerfile's compileall step makes them; here it finds nothing to do.
* No ``PYTHON_VERSION``, ``PYTHON_SHA256``, ``GPG_KEY`` variables; ``Env`` is the official image's
  ``PATH`` (/usr/local first) and ``LANG=C.UTF-8``; ``Cmd ["python3"]`` as there.
* Packages: debootstrap's minbase plus :data:`STANDIN_PACKAGES` and their dependencies (openssl comes with
  ca-certificates), at the current bookworm point release with its security updates, as of the first
  build (the cache key has no date: delete the archive to refresh); the official image is
  debian:bookworm-slim plus ca-certificates, netbase, tzdata and the libraries its CPython links. Both
  have bash, util-linux (lscpu), libssl3 and apt.
* One layer with the files' package times; the agent image's ``org.opencontainers.image.base.name`` label
  reads ``docker.io/library/localhost/python-standin:...`` (the Dockerfile prefixes the build arg).
* ``/etc/pip.conf`` says ``cert = /etc/ssl/certs/ca-certificates.crt`` (pip trusts the system bundle, as
  Debian's own pip does; the official image's pip uses its vendored certifi bundle), and the build
  bind-mounts this machine's bundle (which may hold a TLS proxy's CA, as here) over that file in the RUN
  steps only (``buildah bud -v``): pip reaches PyPI through such a proxy, and the machine's bundle enters
  no image. ``/etc/hostname``, ``/etc/resolv.conf`` and ``/etc/machine-id`` are empty files.

VERSION, REVISION (HEAD), CREATED (the last commit's time) and SOURCE_DATE_EPOCH are passed as build args
like ``make image`` does, but SOURCE_DATE_EPOCH is the time of the last commit that changed Dockerfile.s390x,
deploy/image/ or pyproject.toml (``git log -1 --format=%ct -- ...``), not of the last commit: the Dockerfile
declares it in every stage, so a new value re-runs every RUN step (the locked pip installs too) and each
commit would cost a cold build. The environment's SOURCE_DATE_EPOCH and REVISION win. buildah 1.28 has no
rewrite-timestamp, so layer file times are not clamped (the image is not bit-reproducible; a test image).

Measured on this 2-core VM (loaded): stand-in base 35-45 s (once per package list; then loading its archive
into an empty buildah storage 2 s); agent image cold 27 s (bud 22 s with an empty layer cache and pip cache,
push 3 s); warm 8-10 s when agent/ changed, committed or not (bud 6-7 s: the wheel, its install, compileall
and the checks; push 2-3 s), 4 s when nothing changed; a new SOURCE_DATE_EPOCH costs 19-26 s (every RUN
again); import into containerd 2.4.2 3 s (pause and busybox 0.1 s each).

buildah runs with a storage of its own under the cache folder (``<cache>/buildah``, runroot under /run),
so nothing touches /var/lib/containers; the Dockerfile's ``RUN --mount=type=cache`` (pip's cache) lives
where buildah 1.28 keeps cache mounts, /var/tmp/buildah-cache. Needs root, buildah, debootstrap, gcc with
libc6-dev (static libc), busybox-static and git:
``apt-get install buildah debootstrap gcc libc6-dev busybox-static git``.

CLI::

    python -m topology_devkit.realcluster.images build [--cache DIR]
    python -m topology_devkit.realcluster.images import --ctr PATH --address SOCK [--cache DIR]

``build`` prints each image's archive and the timings; ``import`` builds (cached) and imports all three
into containerd's k8s.io namespace, then checks with ``ctr images ls`` that each name is there.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from agent.version import semver
from topology_devkit import oci
from topology_devkit.realcluster.mounts import mounts_under, remove_tree

REPO = Path(__file__).resolve().parents[3]
PAUSE_SOURCE = Path(__file__).with_name("pause.c")
DOCKERFILE = "Dockerfile.s390x"
DEPENDENCY_INPUTS = (DOCKERFILE, "deploy/image", "pyproject.toml")  # what the layers below the agent's come from

PAUSE = "localhost/topology-e2e-pause:3.10"
BUSYBOX = "localhost/topology-e2e-busybox:latest"
AGENT = "localhost/s390x-topology-agent:e2e"
IMAGES = (PAUSE, BUSYBOX, AGENT)
NAMESPACE = "k8s.io"

STANDIN_REPO = "localhost/python-standin"
STANDIN_TAG = "3.11-slim-bookworm"
SUITE = "bookworm"
# What the agent's Dockerfile needs of python:3.11-slim-bookworm (bash and util-linux are in minbase already;
# netbase and tzdata are what the official image adds to debian:bookworm-slim).
STANDIN_PACKAGES = ("python3.11", "python3.11-venv", "python-is-python3", "bash", "libssl3", "ca-certificates",
                    "util-linux", "netbase", "tzdata")
STANDIN_RECIPE = 3  # bump when the recipe below changes (a new cache key)
STANDIN_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
BUILDAH_RUNROOT = Path("/run/s390x-topology-agent-buildah")
MAX_CACHED_IMAGES = 300  # buildah's storage is emptied past this many images (prune_layer_cache)
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
REQUIRED = {"buildah": "buildah", "debootstrap": "debootstrap", "gcc": "gcc", "git": "git", "tar": "tar",
            "chroot": "coreutils"}
DEBIAN_SECURITY = "http://deb.debian.org/debian-security"
DPKG_EXCLUDES = """\
# as in Debian's slim images: no documentation but the copyright files, no man pages, no translations
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""


class ImageError(RuntimeError):
    """An image could not be built or imported; the message names the step and the tool's output."""


# ------------------------------------------------------------------------------------------------
# small helpers


def default_cache() -> Path:
    """``${CLUSTER_CACHE:-${XDG_CACHE_HOME:-~/.cache}/s390x-topology-agent/cluster}/images``."""
    base = os.environ.get("CLUSTER_CACHE") or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "s390x-topology-agent" / "cluster"
    return Path(base) / "images"


def unavailable_reason() -> str | None:
    """Why the images cannot be built here, or None."""
    if sys.platform != "linux":
        return f"the images are built on Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "building the images needs root (buildah's storage, debootstrap, chroot)"
    absent = [f"{tool} ({package})" for tool, package in REQUIRED.items() if shutil.which(tool) is None]
    if not Path("/bin/busybox").is_file():
        absent.append("/bin/busybox (busybox-static)")
    if shutil.which("gcc") and not _static_libc():
        absent.append("a static libc (libc6-dev)")
    if absent:
        return f"missing {', '.join(absent)}: apt-get install buildah debootstrap gcc libc6-dev busybox-static git"
    return None


def _static_libc() -> bool:
    done = subprocess.run(["gcc", "-print-file-name=libc.a"], capture_output=True, text=True, check=False)
    return done.returncode == 0 and Path(done.stdout.strip()).is_file()


def say(message: str) -> None:
    print(f"images: {message}", flush=True)


@contextlib.contextmanager
def timed(label: str, timings: dict[str, float] | None = None) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        seconds = time.monotonic() - started
        if timings is not None:
            timings[label] = seconds
        say(f"{label}: {seconds:.1f} s")


def _run(argv: Sequence[str | Path], step: str, timeout: float = 3600, quiet: bool = True,
         cwd: Path | None = None) -> str:
    """Run a tool; its stdout. ImageError with the output's tail when it fails."""
    argv = [str(a) for a in argv]
    command = " ".join(str(a) for a in argv[:4])
    try:
        if quiet:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd)
            out, err = done.stdout, done.stderr
        else:  # a long build: its output goes to the terminal as it comes
            done = subprocess.run(argv, text=True, timeout=timeout, check=False, cwd=cwd)
            out, err = "", ""
    except FileNotFoundError as exc:
        raise ImageError(f"{step}: {argv[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{step}: timed out after {timeout:.0f} s") from exc
    if done.returncode != 0:
        tail = "\n".join((err or out).strip().splitlines()[-25:]) or "(its output is above)"
        raise ImageError(f"{step} failed (exit {done.returncode}): {command} ...\n{tail}")
    return out


def _write_atomically(path: Path, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` then rename over ``path`` (a reader never sees half an archive)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _archive_file(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name.removeprefix("localhost/")) + ".oci.tar"


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One build at a time per cache folder (the cluster's start and a test may build together)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------------------
# pause and busybox: written with the standard library


def compile_pause(cache: Path) -> Path:
    """The static pause binary, compiled once per source and compiler (cached under ``cache``)."""
    version = _run(["gcc", "--version"], "gcc --version").splitlines()[0]
    key = hashlib.sha256(PAUSE_SOURCE.read_bytes() + version.encode()).hexdigest()[:16]
    binary = cache / "pause" / key / "pause"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_name(f".pause.{os.getpid()}")
        _run(["gcc", "-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror", "-Wl,--build-id=none",
              "-o", tmp, PAUSE_SOURCE], "compiling pause.c")
        tmp.replace(binary)
    return binary


def build_pause(cache: Path) -> Path:
    """``localhost/topology-e2e-pause:3.10``: /pause alone, entrypoint ["/pause"]."""
    binary = compile_pause(cache).read_bytes()
    layer = oci.files_layer({"pause": (binary, 0o755)})
    config = {"Entrypoint": ["/pause"], "WorkingDir": "/", "User": "65535:65535"}
    return _write_atomically(cache / _archive_file(PAUSE), lambda tmp: oci.write_archive(tmp, PAUSE, [layer], config))


def build_busybox(cache: Path, busybox: Path = Path("/bin/busybox")) -> Path:
    """``localhost/topology-e2e-busybox:latest``: busybox-static with its applets; no entrypoint, ``Cmd ["sh"]``
    (``kubectl run ... -- sh -c '...'`` passes args, which replace Cmd: an entrypoint of sh would run ``sh sh``)."""
    layer = oci.busybox_layer(busybox)
    config = {"Cmd": ["sh"], "Env": ["PATH=/bin"], "WorkingDir": "/"}
    return _write_atomically(cache / _archive_file(BUSYBOX),
                             lambda tmp: oci.write_archive(tmp, BUSYBOX, [layer], config))


# ------------------------------------------------------------------------------------------------
# buildah


def buildah(cache: Path) -> list[str]:
    """The buildah command with this cache's own storage (and run root: two storages never share one)."""
    runroot = BUILDAH_RUNROOT
    if Path(cache).resolve() != default_cache().resolve():
        runroot = Path(f"{BUILDAH_RUNROOT}-{hashlib.sha256(str(Path(cache).resolve()).encode()).hexdigest()[:8]}")
    return ["buildah", "--root", str(cache / "buildah"), "--runroot", str(runroot), "--storage-driver", "overlay"]


def _image_exists(cache: Path, ref: str) -> bool:
    done = subprocess.run([*buildah(cache), "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
                          capture_output=True, text=True, check=False, timeout=120)
    return done.returncode == 0


def debian_mirror(sources: Iterable[Path] | None = None) -> tuple[str, str]:
    """(mirror, security mirror) of bookworm from this machine's apt sources (one-line and deb822 files)."""
    if sources is None:
        sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list")),
                   *sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))]
    main: list[str] = []
    security: list[str] = []
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        entries: list[tuple[list[str], list[str]]] = []  # (uris, suites)
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.MULTILINE))
                if "deb" in fields.get("Types", "").split() and fields.get("Enabled", "yes").lower() != "no":
                    entries.append((fields.get("URIs", "").split(), fields.get("Suites", "").split()))
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    entries.append(([words[1]], [words[2]]))
        for uris, suites in entries:
            for uri in uris:
                if SUITE in suites and uri not in main:
                    main.append(uri.rstrip("/"))
                if f"{SUITE}-security" in suites and uri not in security:
                    security.append(uri.rstrip("/"))
    if not main:
        raise ImageError(f"no '{SUITE}' entry in /etc/apt/sources.list*: cannot tell which Debian mirror to use")
    return main[0], (security[0] if security else DEBIAN_SECURITY)


def standin_ref(cache: Path | None = None, arch: str | None = None) -> tuple[str, str]:
    """(the stand-in's keyed reference, the cache key) for this machine's mirror, the package list and ``arch`` (a
    Debian architecture other than this machine's: debootstrap --arch, its second stage under qemu-user-static)."""
    mirror, security = debian_mirror()
    facts: dict[str, object] = {"packages": STANDIN_PACKAGES, "suite": SUITE, "mirror": mirror, "security": security,
                                "recipe": STANDIN_RECIPE, "env": STANDIN_ENV}
    if arch is not None and arch != oci.goarch():
        facts["arch"] = arch  # the host's own key is unchanged (its cached archive stays valid)
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]
    return f"{STANDIN_REPO}:{STANDIN_TAG}-{key}", key


def build_standin(cache: Path, timings: dict[str, float] | None = None, arch: str | None = None) -> str:
    """The stand-in base in buildah's storage (made once, then loaded from its cached archive); its reference.

    Also tagged ``localhost/python-standin:3.11-slim-bookworm`` (with ``-<arch>`` for another architecture).
    """
    foreign = arch is not None and arch != oci.goarch()
    infix = f"{arch}-" if foreign else ""
    ref, key = standin_ref(arch=arch)
    plain = f"{STANDIN_REPO}:{STANDIN_TAG}" + (f"-{arch}" if foreign else "")
    if _image_exists(cache, ref):
        _run([*buildah(cache), "tag", ref, plain], "buildah tag")
        return ref
    archive = cache / f"python-standin-{infix}{key}.oci.tar"
    if not archive.is_file():
        with timed("stand-in base: debootstrap + apt (first build only)", timings):
            _write_atomically(archive, lambda tmp: _make_standin_archive(cache, tmp, ref, arch))
        for stale in cache.glob(f"python-standin-{infix}*.oci.tar"):  # an older recipe's
            if stale != archive and (foreign or stale.name.count("-") == 2):
                stale.unlink(missing_ok=True)
    with timed("stand-in base: load into buildah", timings):
        out = _run([*buildah(cache), "pull", "--quiet", f"oci-archive:{archive}"], "buildah pull of the stand-in")
        image_id = out.strip().splitlines()[-1]
        _run([*buildah(cache), "tag", image_id, ref, plain], "buildah tag")
    return ref


def _make_standin_archive(cache: Path, archive: Path, ref: str, arch: str | None = None) -> None:
    mirror, security = debian_mirror()
    arch = arch or oci.goarch()
    if arch != oci.goarch() and not Path(f"/proc/sys/fs/binfmt_misc/qemu-{arch}").exists():
        raise ImageError(f"a {arch} stand-in needs qemu-user-static registered for {arch} "
                         f"(apt-get install qemu-user-static binfmt-support)")
    work = Path(tempfile.mkdtemp(prefix="standin-", dir=cache))
    root = work / "rootfs"
    try:
        say(f"debootstrap --arch={arch} --variant=minbase {SUITE} from {mirror}")
        _run(["debootstrap", f"--arch={arch}", "--variant=minbase", SUITE, root, mirror], "debootstrap",
             timeout=3600)
        (root / "etc/dpkg/dpkg.cfg.d/slim-excludes").write_text(DPKG_EXCLUDES)
        (root / "etc/apt/sources.list").write_text(
            f"deb {mirror} {SUITE} main\ndeb {mirror} {SUITE}-updates main\ndeb {security} {SUITE}-security main\n")
        apt: list[str | Path] = ["chroot", root, "env", "DEBIAN_FRONTEND=noninteractive", "LANG=C.UTF-8",
                                 "apt-get", "-q", "-y", "-o", "APT::Install-Recommends=false"]
        _run([*apt, "update"], "apt-get update in the stand-in", timeout=900)
        say(f"apt-get install {' '.join(STANDIN_PACKAGES)}; apt-get dist-upgrade")
        _run([*apt, "install", *STANDIN_PACKAGES], "apt-get install in the stand-in", timeout=1800)
        _run([*apt, "dist-upgrade"], "apt-get dist-upgrade in the stand-in", timeout=1800)
        _run([*apt, "clean"], "apt-get clean")
        _trim(root)
        version = _run(["chroot", root, "python", "--version"], "python --version in the stand-in").strip()
        say(f"stand-in: {version}, {len(list((root / 'var/lib/dpkg/info').glob('*.list')))} packages")
        layer_tar = work / "layer.tar"
        _run(["tar", "--numeric-owner", "--xattrs", "--sort=name", "-C", root, "-cf", layer_tar, "."],
             "tar of the stand-in", timeout=900)
        layer = layer_tar.read_bytes()
        config = {"Env": list(STANDIN_ENV), "Cmd": ["python3"],
                  "Labels": {"org.opencontainers.image.description":
                             "stand-in for python:3.11-slim-bookworm from Debian packages (topology_devkit)",
                             "topology-devkit.standin.packages": " ".join(STANDIN_PACKAGES)}}
        oci.write_archive(archive, ref, [layer], config, architecture=arch, history=[
            f"debootstrap --variant=minbase {SUITE}; apt-get install {' '.join(STANDIN_PACKAGES)}; "
            "apt-get dist-upgrade; slim trimming (topology_devkit.realcluster.images)"])
    finally:
        left = remove_tree(work)  # a debootstrap killed by its timeout leaves the root's /proc and /sys mounted
        if left:
            say(f"left {work}: still mounted below it: {', '.join(left)}")


def _trim(root: Path) -> None:
    """What Debian's slim images leave out, and the machine's own files debootstrap copied."""
    mounted = mounts_under([root])
    if mounted:  # removing dev/* or run/* through a mount would remove the host's files
        raise ImageError(f"the stand-in root still has mounts below it: {', '.join(mounted)}")
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb",
                    "var/cache/debconf/*-old", "var/lib/dpkg/*-old", "usr/share/man/*", "usr/share/info/*",
                    "usr/share/lintian/*", "var/log/*.log", "var/log/apt/*", "dev/*", "run/*", "tmp/*",
                    "var/tmp/*"):
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    for path in (root / "usr/share/locale").glob("*"):
        if path.name != "locale.alias":
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
    for path in (root / "usr/share/doc").glob("*/*"):
        if path.name != "copyright":
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink()
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    for name in ("etc/hostname", "etc/resolv.conf", "etc/machine-id"):  # the machine's; runtimes mount their own
        path = root / name
        path.unlink(missing_ok=True)
        path.write_text("")
    # pip (in the Dockerfile's venvs) trusts the system bundle, as Debian's own pip does; the build mounts the
    # machine's bundle there (a file that exists, so that no mount point is left in a layer)
    (root / "etc/pip.conf").write_text(f"[global]\ncert = {HOST_CA_BUNDLE}\n")
    # Debian's own sources, as in the official image (the machine's mirror was used to build only)
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    (root / "etc/apt/sources.list.d/debian.sources").write_text(
        f"Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        f"Types: deb\nURIs: {DEBIAN_SECURITY}\nSuites: {SUITE}-security\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")


def prune_layer_cache(cache: Path, limit: int = MAX_CACHED_IMAGES) -> bool:
    """Empty buildah's storage when it holds more than ``limit`` images (intermediate ones included); True then.

    Every build where agent/ changed leaves ~15 intermediate images (~65 MB, mostly the venv copied into the
    runtime stage) that ``--layers`` keeps and nothing removes; buildah cannot tell which are still a stage's
    cache. So the storage is emptied now and then: the next build is a cold one (the stand-in is loaded again
    from its archive in 2 s) and the storage stays under ~1.5 GB.
    """
    done = subprocess.run([*buildah(cache), "images", "--all", "--quiet"], capture_output=True, text=True,
                          check=False, timeout=120)
    count = len(done.stdout.split()) if done.returncode == 0 else 0
    if count <= limit:
        return False
    say(f"buildah's storage holds {count} images (more than {limit}): emptied, this build is a cold one")
    _run([*buildah(cache), "rmi", "--all", "--force"], "buildah rmi --all", timeout=900)
    return True


def _git(*args: str, where: Path = REPO) -> str:
    return _run(["git", "-C", where, *args], f"git {args[0]}").strip()


def agent_ref(arch: str | None = None) -> str:
    """The agent image's name: :data:`AGENT` for this machine's architecture, ``...:e2e-<arch>`` for another."""
    return AGENT if arch is None or arch == oci.goarch() else f"{AGENT}-{arch}"


def build_agent(cache: Path, timings: dict[str, float] | None = None, context: Path = REPO,
                arch: str | None = None, image: str | None = None) -> Path:
    """``localhost/s390x-topology-agent:e2e`` from Dockerfile.s390x with buildah; its OCI archive.

    ``arch``: another architecture (``s390x``): the image ``...:e2e-s390x`` for linux/s390x, its RUN steps under
    qemu-user-static but grpcio's compiler, the host's cross gcc (the Dockerfile's ``cross-gcc`` stage); its base a
    debootstrapped s390x stand-in (PYTHON_IMAGE), the build machine's stages on the host's (BUILD_PYTHON_IMAGE).

    ``context``: the build context (default the repository; its Dockerfile.s390x too; a checkout of its own, such
    as a release's worktree, gives its own commit and times); ``image``: the name (default :func:`agent_ref`). The
    build args are
    ``make image``'s: VERSION, REVISION (the environment's, else HEAD), CREATED (RFC 3339) and SOURCE_DATE_EPOCH:
    the environment's, else the time of the last commit that changed
    :data:`DEPENDENCY_INPUTS` (``make image`` takes the last commit's; see the comment below). CREATED is the
    last commit's time (in the runtime stage only, where it re-runs just the two cheap RUN steps)."""
    prune_layer_cache(cache)
    target = arch or oci.goarch()
    image = image or agent_ref(arch)
    base = build_host = build_standin(cache, timings)
    if target != oci.goarch():
        base = build_standin(cache, timings, arch=target)
    # the last commit of the dependency layers' inputs, not of agent/: the Dockerfile declares SOURCE_DATE_EPOCH in
    # every stage, so a new value re-runs every RUN (the locked pip installs too) and a commit to agent/ alone
    # would cost a cold build (19 s instead of 8 s here)
    epoch = (os.environ.get("SOURCE_DATE_EPOCH", "").strip()
             or _git("log", "-1", "--format=%ct", "--", *DEPENDENCY_INPUTS, where=context)
             or _git("log", "-1", "--format=%ct", where=context))
    if not epoch.isdigit():
        raise ImageError(f"SOURCE_DATE_EPOCH must be seconds since 1970, not {epoch!r}")
    last_commit = os.environ.get("SOURCE_DATE_EPOCH", "").strip() or _git("log", "-1", "--format=%ct", where=context)
    created = datetime.fromtimestamp(int(last_commit), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    # the context's own version (agent/__init__.py), in the chart's SemVer form, as make image labels it
    version = re.search(r'^__version__ = "([^"]+)"', (context / "agent" / "__init__.py").read_text(), re.MULTILINE)
    revision = os.environ.get("REVISION", "").strip() or _git("rev-parse", "HEAD", where=context)
    build_args = {"PYTHON_IMAGE": base, "BUILD_PYTHON_IMAGE": build_host, "TARGETARCH": target,
                  "BUILDARCH": oci.goarch(),
                  "SOURCE_DATE_EPOCH": epoch, "CREATED": created,
                  "REVISION": revision, "VERSION": semver(version.group(1)) if version else "0.0.0"}
    argv: list[str] = [*buildah(cache), "bud", "--format", "docker", "--isolation", "chroot", "--layers",
                       "--pull=never", "-f", str(context / DOCKERFILE), "-t", image]
    if target == oci.goarch():
        argv[-4:-4] = ["--platform", f"linux/{target}"]
    # else no --platform: buildah 1.28 then looks every local FROM up for that platform, the build machine's stages'
    # base too (FROM --platform=$BUILDPLATFORM is not honoured for local images). Without it each stage takes the
    # image it names (a warning for the s390x one), and the image is s390x as its base is; TARGETARCH is passed.
    if HOST_CA_BUNDLE.is_file():  # the machine's trust (a TLS proxy's CA) for pip, in RUN steps only
        argv += ["-v", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    argv.append(str(context))
    with timed("agent image: buildah bud", timings):
        _run(argv, "buildah bud of the agent image", quiet=os.environ.get("IMAGES_VERBOSE", "") == "",
             timeout=5400)
    archive = cache / _archive_file(image)
    with timed("agent image: push to an OCI archive", timings):
        def push(tmp: Path) -> None:
            raw = tmp.with_name(tmp.name + ".raw")
            try:
                _run([*buildah(cache), "push", "--quiet", "--disable-compression", image,
                      f"oci-archive:{raw}:{image}"], "buildah push of the agent image", timeout=900)
                name_archive(raw, tmp, image)
            finally:
                raw.unlink(missing_ok=True)

        _write_atomically(archive, push)
    return archive


# ------------------------------------------------------------------------------------------------
# archives: naming and importing


def name_archive(source: Path, target: Path, name: str) -> Path:
    """Copy an OCI archive, its (one) index entry annotated with the full ``name`` containerd imports it as."""
    with tarfile.open(source) as src, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as dst:
        for member in src:
            data = src.extractfile(member) if member.isfile() else None
            if member.name.lstrip("./") == "index.json" and data is not None:
                index = json.loads(data.read())
                if len(index.get("manifests", [])) != 1:
                    raise ImageError(f"{source} has {len(index.get('manifests', []))} images, expected one")
                annotations = index["manifests"][0].setdefault("annotations", {})
                annotations[oci.INDEX_NAME] = name
                annotations[oci.REF_NAME] = name.rpartition(":")[2]
                raw = json.dumps(index, sort_keys=True).encode()
                member.size = len(raw)
                dst.addfile(member, io.BytesIO(raw))
            else:
                dst.addfile(member, data)
    return target


def archive_names(archive: Path) -> list[str]:
    """The image names an OCI archive carries (``io.containerd.image.name`` of its index entries)."""
    with tarfile.open(archive) as tar:
        member = next((m for m in tar if m.name.lstrip("./") == "index.json"), None)
        handle = tar.extractfile(member) if member is not None else None
        if handle is None:
            raise ImageError(f"{archive} is not an OCI archive (no index.json)")
        index = json.loads(handle.read())
    return [entry["annotations"][oci.INDEX_NAME] for entry in index.get("manifests", [])
            if oci.INDEX_NAME in entry.get("annotations", {})]


def build_all(cache: Path | None = None, timings: dict[str, float] | None = None) -> dict[str, Path]:
    """Build the three images (pause and busybox from the cache when unchanged); image name -> OCI archive."""
    cache = Path(cache) if cache is not None else default_cache()
    reason = unavailable_reason()
    if reason is not None:
        raise ImageError(reason)
    with _locked(cache):
        with timed("pause image", timings):
            pause = build_pause(cache)
        with timed("busybox image", timings):
            busybox = build_busybox(cache)
        with timed("agent image (total)", timings):
            agent = build_agent(cache, timings)
    return {PAUSE: pause, BUSYBOX: busybox, AGENT: agent}


def _ctr(ctr: Path, address: Path, *args: str) -> list[str]:
    return [str(ctr), "--address", str(address), "--namespace", NAMESPACE, *args]


def import_all(ctr: Path, address: Path, archives: Mapping[str, Path] | Iterable[Path],
               timings: dict[str, float] | None = None) -> list[str]:
    """``ctr -n k8s.io images import`` each archive (containerd 1.6's and 2.4's ctr both name the image after the
    archive's ``io.containerd.image.name`` and unpack it for overlayfs); ImageError unless ``ctr images ls`` then
    lists every name. The names imported."""
    paths = list(archives.values()) if isinstance(archives, Mapping) else [Path(p) for p in archives]
    names: list[str] = []
    for archive in paths:
        expected = archive_names(archive)
        with timed(f"import {', '.join(expected)}", timings):
            _run(_ctr(ctr, address, "images", "import", str(archive)), f"ctr images import {archive.name}",
                 timeout=900)
        names += expected
    listed = set(_run(_ctr(ctr, address, "images", "ls", "--quiet"), "ctr images ls").split())
    missing = [name for name in names if name not in listed]
    if missing:
        raise ImageError(f"after ctr images import, ctr images ls does not list {', '.join(missing)}")
    return names


# ------------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topology_devkit.realcluster.images",
                                     description="Build the real cluster's images (and import them into containerd).")
    sub = parser.add_subparsers(dest="command", required=True)
    agent = sub.add_parser("build-agent", help="build the agent image alone, for an architecture (linux/ARCH)")
    agent.add_argument("--arch", default=oci.goarch(), help=f"s390x, or this machine's {oci.goarch()} (default)")
    agent.add_argument("--cache", type=Path, default=None, help=f"cache folder (default {default_cache()})")
    for name, text in (("build", "build the three images as OCI archives in the cache folder"),
                       ("import", "build them (cached) and import them into containerd's k8s.io namespace")):
        command = sub.add_parser(name, help=text)
        command.add_argument("--cache", type=Path, default=None, help=f"cache folder (default {default_cache()})")
        if name == "import":
            command.add_argument("--ctr", type=Path, required=True, help="the ctr binary")
            command.add_argument("--address", type=Path, required=True, help="containerd's socket")
    args = parser.parse_args(argv)
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        if args.command == "build-agent":
            reason = unavailable_reason()
            if reason is not None:
                raise ImageError(reason)
            cache = Path(args.cache) if args.cache is not None else default_cache()
            with _locked(cache):
                path = build_agent(cache, timings, arch=args.arch)
            print(f"{agent_ref(args.arch)}\t{path}\t{path.stat().st_size / 1e6:.1f} MB")
            say(f"total: {time.monotonic() - started:.1f} s")
            return 0
        archives = build_all(args.cache, timings)
        for name, path in archives.items():
            print(f"{name}\t{path}\t{path.stat().st_size / 1e6:.1f} MB")
        if args.command == "import":
            import_all(args.ctr, args.address, archives, timings)
            print(f"imported into {args.address} (namespace {NAMESPACE}): {', '.join(archives)}")
    except ImageError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    say(f"total: {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
