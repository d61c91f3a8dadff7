"""`make image` and `make image-base-pin` (deploy/image/build.py): a dry run here, the real path against a fake
docker that records its calls."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.env import REPO

CHART = yaml.safe_load((REPO / "deploy/helm/s390x-topology-agent/Chart.yaml").read_text())


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("SOURCE_DATE_EPOCH", "REVISION", "DOCKER", "DRY_RUN",
                                                             "REGISTRY", "TAG", "DOCKERFILE", "METADATA_FILE")}
    return subprocess.run(["make", "-s", "--no-print-directory", *args, f"PYTHON={sys.executable}"], cwd=REPO,
                          env={**base, **(env or {})}, capture_output=True, text=True, timeout=60, check=False)


def buildx_command(stdout: str) -> list[str]:
    lines = [line.removeprefix("+ ") for line in stdout.splitlines()
             if line.removeprefix("+ ").split(" ")[1:3] == ["buildx", "build"]]
    assert len(lines) == 1, stdout
    return shlex.split(lines[0])


def options(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == name]


def last_commit() -> tuple[str, str]:
    out = subprocess.run(["git", "log", "-1", "--format=%H %ct"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], out[1]


def test_make_image_dry_run_prints_the_buildx_command() -> None:
    result = make("image", "REGISTRY=registry.example.com/team/", "TAG=1.2.3", "DRY_RUN=1")
    assert result.returncode == 0, result.stderr
    assert "dry run (DRY_RUN=1)" in result.stdout
    argv = buildx_command(result.stdout)
    assert argv[:3] == ["docker", "buildx", "build"] and argv[-1] == "."
    assert options(argv, "--platform") == ["linux/s390x,linux/amd64"]
    assert options(argv, "-f") == ["Dockerfile.s390x"]
    assert options(argv, "--tag") == ["registry.example.com/team/s390x-topology-agent:1.2.3"]
    assert "--push" in argv and options(argv, "--output") == ["type=image,rewrite-timestamp=true"]
    assert options(argv, "--metadata-file") == ["build/image-metadata.json"]
    args = dict(a.split("=", 1) for a in options(argv, "--build-arg"))
    revision, epoch = last_commit()
    assert args == {"VERSION": CHART["appVersion"], "REVISION": revision, "SOURCE_DATE_EPOCH": epoch,
                    "CREATED": args["CREATED"]}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", args["CREATED"])
    assert "imagetools inspect registry.example.com/team/s390x-topology-agent:1.2.3" in result.stdout
    assert "--set image.repository=registry.example.com/team/s390x-topology-agent --set image.digest=" in result.stdout


def test_make_image_tag_defaults_to_the_version_and_created_follows_source_date_epoch() -> None:
    result = make("image", "REGISTRY=r.example", env={"DRY_RUN": "1", "SOURCE_DATE_EPOCH": "1700000000"})
    argv = buildx_command(result.stdout)
    assert options(argv, "--tag") == [f"r.example/s390x-topology-agent:{CHART['appVersion']}"]
    assert {"SOURCE_DATE_EPOCH=1700000000", "CREATED=2023-11-14T22:13:20Z"} <= set(options(argv, "--build-arg"))


def test_make_image_without_registry_is_a_one_line_error() -> None:
    result = make("image", "TAG=1.2.3", "DRY_RUN=1")
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "REGISTRY is required" in lines[0], result.stderr


def test_make_image_without_buildx_fails_with_the_reason(tmp_path: Path) -> None:
    for target in ("image", "image-base-pin"):
        result = make(target, "REGISTRY=r.example", env={"DOCKER": str(tmp_path / "no-docker-here")})
        assert result.returncode != 0, result.stdout
        assert "dry run" not in result.stdout and "buildx build" not in result.stdout
        first = result.stderr.strip().splitlines()[0]
        assert first.startswith(f"make {target}: ") and "no-docker-here is not on PATH" in first, result.stderr
        assert "nothing was built or pushed" in first


def test_make_image_without_the_buildx_plugin_or_a_builder_fails(tmp_path: Path) -> None:
    docker = tmp_path / "docker"
    for script, reason in (("sys.exit(1)", "the docker buildx plugin is not installed"),
                           ("sys.exit(0 if sys.argv[2] == 'version' else print('ERROR: no builder', file=sys.stderr)"
                            " or 1)", "no buildx builder is reachable (ERROR: no builder)")):
        docker.write_text(f"#!{sys.executable}\nimport sys\n{script}\n")
        docker.chmod(0o755)
        result = make("image", "REGISTRY=r.example", env={"DOCKER": str(docker)})
        assert result.returncode != 0 and "dry run" not in result.stdout
        assert reason in result.stderr.strip().splitlines()[0], result.stderr


FAKE_DOCKER = '''#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:2] in (["buildx", "version"], ["buildx", "inspect"]):
    sys.exit(0)
if args[:2] == ["buildx", "build"]:
    with open(args[args.index("--metadata-file") + 1], "w") as out:
        json.dump({{"containerimage.digest": "sha256:" + "ab" * 32}}, out)
    sys.exit(0)
if args[:3] == ["buildx", "imagetools", "inspect"]:
    arches = os.environ.get("FAKE_ARCHES", "amd64,s390x").split(",")
    print(json.dumps({{"digest": "sha256:" + "cd" * 32, "manifests": [
        {{"platform": {{"os": "linux", "architecture": a}}}} for a in arches]}}))
    sys.exit(0)
sys.exit(3)
'''


@pytest.fixture()
def fake_docker(tmp_path: Path) -> dict[str, str]:
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text((REPO / "Dockerfile.s390x").read_text())
    return {"DOCKER": str(docker), "FAKE_LOG": str(tmp_path / "calls.jsonl"), "DOCKERFILE": str(dockerfile),
            "METADATA_FILE": str(tmp_path / "metadata.json")}


def calls(env: dict[str, str]) -> list[list[str]]:
    return [json.loads(line) for line in Path(env["FAKE_LOG"]).read_text().splitlines()]


def test_make_image_base_pin_writes_the_digest_only_when_both_platforms_are_there(fake_docker: dict[str, str]) -> None:
    dockerfile = Path(fake_docker["DOCKERFILE"])
    missing = make("image-base-pin", env={**fake_docker, "FAKE_ARCHES": "amd64,arm64"})
    assert missing.returncode != 0 and "no linux/s390x image" in missing.stderr
    unpinned = dockerfile.read_text()
    pinned = make("image-base-pin", env=fake_docker)
    assert pinned.returncode == 0, pinned.stderr
    assert ["buildx", "imagetools", "inspect", "python:3.11-slim-bookworm", "--format", "{{json .Manifest}}"] \
        in calls(fake_docker)
    text = dockerfile.read_text()
    assert f"ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:{'cd' * 32}\n" in text
    assert "# UNPINNED" not in text
    assert len(text.splitlines()) == len(unpinned.splitlines()) - ("# UNPINNED" in unpinned)


def test_make_image_refuses_an_unpinned_base_and_pushes_a_pinned_one(fake_docker: dict[str, str]) -> None:
    dockerfile = Path(fake_docker["DOCKERFILE"])
    dockerfile.write_text(re.sub(r"^ARG PYTHON_IMAGE=.*$", "ARG PYTHON_IMAGE=python:3.11-slim-bookworm",
                                 dockerfile.read_text(), flags=re.M))
    refused = make("image", "REGISTRY=r.example", "TAG=t", env=fake_docker)
    assert refused.returncode != 0 and "not pinned by digest" in refused.stderr
    assert not [c for c in calls(fake_docker) if c[:2] == ["buildx", "build"]]
    assert make("image-base-pin", env=fake_docker).returncode == 0
    pushed = make("image", "REGISTRY=r.example", "TAG=t", env=fake_docker)
    assert pushed.returncode == 0, pushed.stderr
    builds = [c for c in calls(fake_docker) if c[:2] == ["buildx", "build"]]
    assert len(builds) == 1 and "--push" in builds[0]
    assert options(builds[0], "--tag") == ["r.example/s390x-topology-agent:t"]
    digest = f"sha256:{'ab' * 32}"
    assert f"digest: {digest}" in pushed.stdout
    assert f"--set image.repository=r.example/s390x-topology-agent --set image.digest={digest}" in pushed.stdout


def test_the_docs_say_how_to_build_pin_and_refresh() -> None:
    install = (REPO / "docs" / "admin" / "install.md").read_text()
    start = install.index("## Building the image\n")
    section = install[start:install.index("\n## ", start + 1)]
    assert install[start + 1:].split("\n## ", 1)[1].startswith("Installing"), "Installing comes next"
    for needle in ("make image REGISTRY=", "docker buildx build --push", "make image REGISTRY=... DRY_RUN=1",
                   "make image-lock", "make image-base-pin",
                   "docker buildx imagetools inspect python:3.11-slim-bookworm", "--set image.digest=",
                   "SOURCE_DATE_EPOCH", "rewrite-timestamp=true"):
        assert needle in section, needle
    recipe = section[section.index("```sh\n"):section.index("\n```", section.index("```sh\n"))].splitlines()
    commands = [line.split("#")[0].strip() for line in recipe[1:]]
    assert commands.index("make image-base-pin") < commands.index("make image REGISTRY=registry.example.com/team "
                                                                   "TAG=0.1.0"), "the base is pinned before the build"
    makefile = (REPO / "Makefile").read_text()
    for target in ("image:", "image-lock:", "image-base-pin:"):
        assert f"\n{target}" in makefile, target
