"""The chart's fixtures: the real helm, ``render`` and ``template_error`` over ``helm template``, and ``install``:
``helm install --dry-run=server`` against a fake API server (topology_devkit.testing) that serves a FakeCluster."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.chart import FLOOR, VAP_API, Doc, FakeCluster, Installed, Render, find_helm, helm_template
from tests.support.env import missing
from topology_devkit.testing.apiserver import FakeApiServer, Request


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        missing("helm", "run tools/get-helm.sh, or set HELM=/path/to/helm")
    assert path is not None
    return path


@pytest.fixture(scope="session")
def render(helm: str) -> Render:
    """render("--set", "a=b", kube_version=..., vap=True) -> the rendered objects; RuntimeError on failure."""

    def _render(*args: str, kube_version: str = FLOOR, vap: bool = True, hooks: bool = False) -> list[Doc]:
        extra = ("--kube-version", kube_version, *(("--api-versions", VAP_API) if vap else ()))
        result = helm_template(helm, (*extra, *args))
        if result.returncode:
            raise RuntimeError(result.stderr)
        # The uninstall hook's objects (helm.sh/hook: pre-delete) only with hooks=True
        # (tests/deploy/chart/test_uninstall.py).
        return [d for d in yaml.safe_load_all(result.stdout)
                if d and (hooks or "helm.sh/hook" not in ((d.get("metadata") or {}).get("annotations") or {}))]

    return _render


@pytest.fixture(scope="session")
def template_error(helm: str) -> Callable[..., str]:
    """template_error(args...) -> helm's stderr; fails the test when helm renders fine."""

    def _error(*args: str) -> str:
        result = helm_template(helm, ("--kube-version", FLOOR, *args))
        assert result.returncode != 0, f"helm template {' '.join(args)} should have failed"
        return result.stderr

    return _error


@pytest.fixture(scope="session")
def fake_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeCluster, Path]]:
    """A fake API server on 127.0.0.1 and a kubeconfig for it; tests set the cluster's state before use."""
    cluster = FakeCluster()

    def answer(request: Request) -> tuple[int, Doc]:
        if request.method != "GET":  # helm's dry run only reads
            return 405, {"kind": "Status", "code": 405, "message": f"{request.method} is not served here"}
        return cluster.answer(request.path)

    server = FakeApiServer(answer)
    home = tmp_path_factory.mktemp("fake-api")
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "admin", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "admin"}}],
    }))
    yield cluster, kubeconfig
    server.close()


@pytest.fixture
def install(helm: str, fake_api: tuple[FakeCluster, Path]) -> Callable[..., Installed]:
    """install(*helm_args, minor=34, vap=True, openshift=False, namespaces={...}, releases=[...], more_apis=False) ->
    what `helm install --dry-run=server` (or `helm upgrade`, given the releases' Secrets) would create."""
    cluster, kubeconfig = fake_api

    def _install(*args: str, minor: int = 34, vap: bool = True, openshift: bool = False,
                 namespaces: dict[str, dict[str, str]] | None = None, releases: list[Doc] | None = None,
                 more_apis: bool = False) -> Installed:
        cluster.minor, cluster.vap, cluster.openshift, cluster.dra_and_monitoring = minor, vap, openshift, more_apis
        cluster.namespaces = dict(namespaces or {})
        cluster.secrets = list(releases or [])
        home = kubeconfig.parent
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env |= {"KUBECONFIG": str(kubeconfig), "HELM_CACHE_HOME": str(home / "cache"),
                "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
        # --disable-openapi-validation: the fake server has no OpenAPI documents (kubernetes-validate checks schemas).
        cmd = [helm, *args, "--dry-run=server", "--disable-openapi-validation", "-o", "json"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)
        assert result.returncode == 0, result.stderr
        release = json.loads(result.stdout)
        return Installed([d for d in yaml.safe_load_all(release["manifest"]) if d], release["info"]["notes"])

    return _install
