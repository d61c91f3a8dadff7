"""The image's hashed locks (deploy/image/, written by `make image-lock`) against pyproject.toml and the generated
gRPC code: what the image installs is what the project asks for and what agent/_proto can load."""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.env import REPO

LOCK = REPO / "deploy" / "image" / "requirements.txt"
BUILD_LOCK = REPO / "deploy" / "image" / "build-requirements.txt"
BUILD_IN = REPO / "deploy" / "image" / "build-requirements.in"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+?)\s*(?:\\)?$")
HASH = re.compile(r"^\s+--hash=sha256:[0-9a-f]{64}\s*(?:\\)?$")


def parse_lock(text: str) -> tuple[dict[str, tuple[Version, int]], list[str]]:
    """(name -> (version, number of hashes), lines that are neither pins, hashes nor comments)."""
    pins: dict[str, tuple[Version, int]] = {}
    stray: list[str] = []
    name = ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if m := PIN.match(line):
            name = canonicalize_name(m.group(1))
            pins[name] = (Version(m.group(2)), 0)
        elif HASH.match(line) and name:
            pins[name] = (pins[name][0], pins[name][1] + 1)
        else:
            stray.append(line)
    return pins, stray


def lock_problems(text: str, requirements: list[str]) -> list[str]:
    """What makes ``text`` (a hashed lock) unfit for ``requirements``: unpinned or unhashed entries, missing or
    out-of-range packages."""
    pins, stray = parse_lock(text)
    problems = [f"not a pin or a hash: {line!r}" for line in stray]
    problems += [f"{name}=={version} has no hash" for name, (version, hashes) in pins.items() if hashes == 0]
    for spec in map(Requirement, requirements):
        name = canonicalize_name(spec.name)
        if spec.marker is not None and not spec.marker.evaluate({"python_version": "3.11", "sys_platform": "linux"}):
            continue
        if name not in pins:
            problems.append(f"{spec} is not in the lock")
        elif not spec.specifier.contains(pins[name][0], prereleases=True):
            problems.append(f"{name}=={pins[name][0]} does not satisfy {spec}")
    return problems


def generated_grpc_version() -> Version:
    found = {m.group(1) for path in (REPO / "agent" / "_proto").rglob("*_pb2_grpc.py")
             if (m := re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", path.read_text()))}
    assert len(found) == 1, found
    return Version(found.pop())


def generated_protobuf_version() -> Version:
    call = re.compile(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),")
    found = {".".join(m.groups()) for path in (REPO / "agent" / "_proto").rglob("*_pb2.py")
             if (m := call.search(path.read_text()))}
    assert len(found) == 1, found
    return Version(found.pop())


# ---------------------------------------------------------------------------------------------------- the locks


def test_the_lock_satisfies_pyprojects_dependencies() -> None:
    assert lock_problems(LOCK.read_text(), PYPROJECT["project"]["dependencies"]) == []


def test_the_build_lock_satisfies_every_build_backend_the_image_runs() -> None:
    build_in = [line.split("#")[0].strip() for line in BUILD_IN.read_text().splitlines()]
    wanted = PYPROJECT["build-system"]["requires"] + [line for line in build_in if line]
    assert lock_problems(BUILD_LOCK.read_text(), wanted) == []


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda t: re.sub(r"^grpcio==\S+", "grpcio==1.80.0", t, flags=re.M), "grpcio==1.80.0 does not satisfy grpcio>="),
    (lambda t: re.sub(r"^protobuf==\S+", "protobuf==9.0.0", t, flags=re.M), "protobuf==9.0.0 does not satisfy"),
    (lambda t: re.sub(r"^prometheus-client==", "prometheus-client-x==", t, flags=re.M), "prometheus-client>="),
    (lambda t: re.sub(r"^(pyyaml==\S+) \\\n(\s+--hash=\S+\s*\\?\n)+", r"\1\n", t, flags=re.M), "has no hash"),
    (lambda t: t + "somepackage>=1\n", "not a pin or a hash"),
])
def test_the_lock_check_catches_a_lock_that_drifted(edit: object, problem: str) -> None:
    assert callable(edit)
    problems = lock_problems(edit(LOCK.read_text()), PYPROJECT["project"]["dependencies"])
    assert any(problem in p for p in problems), problems


def test_the_locks_pins_agree_with_the_generated_grpc_code() -> None:
    """One source of truth for what the image runs: the lock. It must load the code agent/_proto holds."""
    pins, _ = parse_lock(LOCK.read_text())
    grpcio, protobuf = pins["grpcio"][0], pins["protobuf"][0]
    assert grpcio >= generated_grpc_version(), "the generated code refuses an older grpcio at import"
    gencode = generated_protobuf_version()
    # protobuf's cross-version guarantee: runtime >= gencode, within the gencode major and the next one.
    assert gencode <= protobuf and protobuf.major <= gencode.major + 1, (protobuf, gencode)
    grpc_floor = next(Requirement(d) for d in PYPROJECT["project"]["dependencies"] if d.startswith("grpcio"))
    assert grpc_floor.specifier.contains(generated_grpc_version()), "pyproject's grpcio floor is the codegen's"
    dev = PYPROJECT["project"]["optional-dependencies"]["dev"]
    tools = [Requirement(d) for d in dev if d.startswith("grpcio-tools")]
    assert [str(t.specifier) for t in tools] == [f"=={generated_grpc_version()}"], "make proto's tools wrote the code"


def test_the_locks_are_written_by_make_image_lock() -> None:
    for lock in (LOCK, BUILD_LOCK):
        header = lock.read_text().splitlines()[:2]
        assert header == ["# This file was autogenerated by uv via the following command:", "#    make image-lock"]
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("\nimage-lock:"):].split("\n\n")[0]
    assert "deploy/image/lock.py" in recipe and "uv==" in recipe and "$(LOCK_VENV)" in recipe
    assert "-e ." not in recipe and ".venv" not in recipe, "the lock tool runs in a throwaway venv"
    script = (REPO / "deploy" / "image" / "lock.py").read_text()
    for needle in ('"--universal"', '"--generate-hashes"', '"--python-version", "3.11"', '"pyproject.toml"',
                   '"linux/s390x": "s390x"', '"linux/amd64": "x86_64"', '"linux/s390x": {"grpcio"}'):
        assert needle in script, needle


def test_one_lock_serves_both_platforms_because_it_has_no_markers() -> None:
    """A universal resolution with no environment markers pins the same versions on amd64 and s390x."""
    for lock in (LOCK, BUILD_LOCK):
        assert not [line for line in lock.read_text().splitlines() if ";" in line and not line.startswith("#")]
    pins, _ = parse_lock(LOCK.read_text())
    assert pins["grpcio"][1] > 10, "grpcio's entry must hash every file (wheels and the sdist s390x compiles)"
