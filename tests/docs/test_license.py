"""LICENSE is the Apache License 2.0 text, and every place that names the licence says the same."""

from __future__ import annotations

import hashlib
import re
import tomllib

import yaml

from tests.support.env import REPO

LICENSE = REPO / "LICENSE"
# SHA-256 of the canonical text as the ASF publishes it (LICENSE-2.0.txt, 11358 bytes; Debian's
# /usr/share/common-licenses/Apache-2.0 is the same file).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
SPDX = "Apache-2.0"


def test_license_is_the_full_apache_2_text() -> None:
    data = LICENSE.read_bytes()
    text = data.decode("ascii")
    assert "Apache License" in text.splitlines()[1] and "Version 2.0, January 2004" in text
    sections = re.findall(r"^\s+(\d)\. (\w[\w ]*)\.", text, re.MULTILINE)
    assert [n for n, _ in sections] == [str(i) for i in range(1, 10)], sections
    assert "END OF TERMS AND CONDITIONS" in text
    assert hashlib.sha256(data).hexdigest() == APACHE_2_SHA256, "LICENSE differs from the canonical Apache-2.0 text"


def test_pyproject_chart_and_image_label_name_the_same_licence() -> None:
    for pyproject in (REPO / "pyproject.toml", REPO / "devkit" / "pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        assert project["license"] == SPDX, pyproject  # the SPDX form (PEP 639): no setuptools deprecation warning
        requires = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
        assert "setuptools>=77.0.1" in requires, pyproject  # the first setuptools that reads it
    chart = yaml.safe_load((REPO / "deploy" / "helm" / "s390x-topology-agent" / "Chart.yaml").read_text())
    assert chart["annotations"]["artifacthub.io/license"] == SPDX
    label = re.search(r'org\.opencontainers\.image\.licenses="([^"]*)"', (REPO / "Dockerfile.s390x").read_text())
    assert label and label.group(1) == SPDX
