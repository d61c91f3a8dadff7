#!/usr/bin/env python3
"""make image / make image-base-pin: build and push the multi-arch image, or pin its base image by digest.

    make image REGISTRY=registry.example.com/team [TAG=0.1.0] [DRY_RUN=1]
        docker buildx build --platform linux/s390x,linux/amd64 -f Dockerfile.s390x --tag REGISTRY/NAME:TAG --push
        TAG defaults to the chart's appVersion (agent.__version__ in SemVer form: 0.2.0.dev0 -> 0.2.0-dev.0),
        with VERSION, REVISION, SOURCE_DATE_EPOCH (the last commit's time) and CREATED as build args, then prints the
        pushed manifest list's digest and the helm flags that pin it.
    make image-base-pin [DRY_RUN=1]
        docker buildx imagetools inspect python:3.11-slim-bookworm; checks that the index has linux/amd64 and
        linux/s390x and writes its digest into Dockerfile.s390x's ARG PYTHON_IMAGE.

DRY_RUN=1 prints the exact commands instead of running them. Without docker, its buildx plugin or a reachable
builder both stop with one line saying which is missing, exit 2: nothing is ever reported as built that was not.
Environment: DOCKER (the docker executable), PLATFORMS, IMAGE_NAME, SOURCE_URL,
SOURCE_DATE_EPOCH (default: the last commit's time), REVISION (default: git rev-parse HEAD), DOCKERFILE (default
Dockerfile.s390x), METADATA_FILE (default build/image-metadata.json), BASE_IMAGE (default python:3.11-slim-bookworm,
for image-base-pin).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
IMAGE_NAME = "s390x-topology-agent"
PLATFORMS = "linux/s390x,linux/amd64"
BASE_TAG = "python:3.11-slim-bookworm"
ARG_LINE = re.compile(r"^ARG PYTHON_IMAGE=(?P<ref>\S+)$", re.MULTILINE)
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
UNPINNED = re.compile(r"^# UNPINNED:.*\n", re.MULTILINE)
METADATA = Path(os.environ.get("METADATA_FILE") or REPO / "build" / "image-metadata.json")


class Failure(Exception):
    """One line for the user; exit 2."""


def display(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def say(text: str) -> None:
    print(text, flush=True)


def flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise Failure(f"git {args[0]} failed ({exc}): outside a git checkout, set SOURCE_DATE_EPOCH and REVISION"
                      ) from None


def docker_unavailable(docker: str) -> str | None:
    """None when `docker buildx` can build here, else why not."""
    if shutil.which(docker) is None:
        return f"{docker} is not on PATH"
    try:
        if subprocess.run([docker, "buildx", "version"], capture_output=True, timeout=30).returncode != 0:
            return "the docker buildx plugin is not installed"
        inspect = subprocess.run([docker, "buildx", "inspect"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "docker buildx did not answer"
    if inspect.returncode != 0:
        lines = (inspect.stderr or inspect.stdout).strip().splitlines()
        return f"no buildx builder is reachable ({lines[-1][:160] if lines else 'docker buildx inspect failed'})"
    return None


def execute(argv: list[str], dry: bool, capture: bool = False) -> str:
    say(shlex.join(argv) if dry else "+ " + shlex.join(argv))
    if dry:
        return ""
    result = subprocess.run(argv, cwd=REPO, text=True, check=False, stdout=subprocess.PIPE if capture else None)
    if result.returncode != 0:
        raise Failure(f"{argv[0]} {argv[1]} {argv[2]} failed (exit {result.returncode})")
    return result.stdout if capture else ""


def mode(docker: str) -> bool:
    """True for a dry run (DRY_RUN=1); Failure when docker buildx cannot build here."""
    if flag("DRY_RUN"):
        say("dry run (DRY_RUN=1): the commands are printed, not run")
        return True
    why = docker_unavailable(docker)
    if why:
        raise Failure(f"{why}: nothing was built or pushed (DRY_RUN=1 prints the commands without running them)")
    return False


def image_version() -> str:
    """The image's version label and default tag: the chart's appVersion, the SemVer form of agent.__version__."""
    sys.path.insert(0, str(REPO))
    from agent import __version__
    from agent.version import semver
    return semver(__version__)


def image() -> None:
    registry = os.environ.get("REGISTRY", "").strip().rstrip("/")
    if not registry:
        raise Failure("REGISTRY is required, e.g. make image REGISTRY=registry.example.com/team TAG=0.1.0")
    version = image_version()
    tag = os.environ.get("TAG", "").strip() or version
    ref = f"{registry}/{os.environ.get('IMAGE_NAME') or IMAGE_NAME}:{tag}"
    dockerfile = os.environ.get("DOCKERFILE") or "Dockerfile.s390x"
    docker = os.environ.get("DOCKER") or "docker"
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip() or git("log", "-1", "--format=%ct")
    if not epoch.isdigit():
        raise Failure(f"SOURCE_DATE_EPOCH must be seconds since 1970, not {epoch!r}")
    created = datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    revision = os.environ.get("REVISION", "").strip() or git("rev-parse", "HEAD")
    if not os.environ.get("REVISION") and git("status", "--porcelain", "--untracked-files=no"):
        say(f"warning: the working tree has uncommitted changes; the image is labelled with {revision[:12]} anyway")
    base = ARG_LINE.search((REPO / dockerfile).read_text())
    if base is None:
        raise Failure(f"{dockerfile} has no ARG PYTHON_IMAGE line")
    dry = mode(docker)
    if not DIGEST.search(base.group("ref")):
        message = (f"the base image {base.group('ref')} is not pinned by digest: run make image-base-pin "
                   f"and commit {dockerfile}")
        if not dry:
            raise Failure(message)
        say(f"note: {message}")
    build_args = {"VERSION": version, "REVISION": revision, "SOURCE_DATE_EPOCH": epoch, "CREATED": created}
    if os.environ.get("SOURCE_URL"):
        build_args["SOURCE_URL"] = os.environ["SOURCE_URL"]
    argv = [docker, "buildx", "build", "--platform", os.environ.get("PLATFORMS") or PLATFORMS,
            "-f", dockerfile, "--tag", ref, "--push",
            # With --push, buildx sets push=true on this image exporter; rewrite-timestamp clamps the layers' file
            # times to SOURCE_DATE_EPOCH.
            "--output", "type=image,rewrite-timestamp=true",
            "--metadata-file", display(METADATA)]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    argv.append(".")
    if not dry:
        METADATA.parent.mkdir(parents=True, exist_ok=True)
        METADATA.unlink(missing_ok=True)
    execute(argv, dry)
    inspect = [docker, "buildx", "imagetools", "inspect", ref, "--format", "{{json .Manifest.Digest}}"]
    if dry:
        execute(inspect, dry)
        say(f"then: helm install ... --set image.repository={ref.rsplit(':', 1)[0]} --set image.digest=<that digest>")
        return
    digest = json.loads(METADATA.read_text()).get("containerimage.digest", "")
    if not digest:  # older buildx: ask the registry
        digest = json.loads(execute(inspect, dry, capture=True) or '""')
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise Failure(f"no digest for {ref} (metadata: {display(METADATA)})")
    say(f"pushed {ref}")
    say(f"digest: {digest}")
    say(f"helm: --set image.repository={ref.rsplit(':', 1)[0]} --set image.digest={digest}")


def base_pin() -> None:
    dockerfile = REPO / (os.environ.get("DOCKERFILE") or "Dockerfile.s390x")
    docker = os.environ.get("DOCKER") or "docker"
    tag = os.environ.get("BASE_IMAGE") or BASE_TAG
    dry = mode(docker)
    manifest = execute([docker, "buildx", "imagetools", "inspect", tag, "--format", "{{json .Manifest}}"], dry,
                       capture=True)
    if dry:
        say(f"then: write {tag}@<its digest> into ARG PYTHON_IMAGE in {dockerfile.name} and drop the UNPINNED line")
        return
    index = json.loads(manifest)
    platforms = {f"{m['platform']['os']}/{m['platform']['architecture']}"
                 for m in index.get("manifests", []) if isinstance(m.get("platform"), dict)}
    missing = sorted({"linux/amd64", "linux/s390x"} - platforms)
    if missing:
        raise Failure(f"{tag} ({index.get('digest')}) has no {', '.join(missing)} image: not pinned")
    ref = f"{tag}@{index['digest']}"
    text = ARG_LINE.sub(f"ARG PYTHON_IMAGE={ref}", dockerfile.read_text(), count=1)
    dockerfile.write_text(UNPINNED.sub("", text, count=1))
    say(f"pinned {ref} ({', '.join(sorted(platforms))}) in {dockerfile.name}; commit it")


def main(argv: list[str]) -> int:
    commands = {"image": image, "base-pin": base_pin}
    if len(argv) != 1 or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        commands[argv[0]]()
    except Failure as exc:
        print(f"make {'image' if argv[0] == 'image' else 'image-base-pin'}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
