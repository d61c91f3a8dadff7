"""kind e2e gate: run the ``kind``-marked tests when a kind cluster with the chart is reachable, skip otherwise.

tests/kind/run.sh (make kind-test) creates the cluster, builds and loads the image, installs the chart in
fake-topology mode and runs ``pytest -m kind`` with REQUIRE_KIND=1, which turns every skip reason below into a
failure: a lane that provisions kind must not pass by skipping.

Environment: KIND_CLUSTER_NAME (default topology-e2e), TOPOLOGY_E2E_NAMESPACE (topology-system),
TOPOLOGY_E2E_RELEASE (topology-agent), TOPOLOGY_E2E_IMAGE (s390x-topology-agent:e2e), TOPOLOGY_E2E_SNAPSHOTS
(the snapshot dir run.sh installed; regenerated with tests/kind/snapshots.py when unset).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

DEFAULT_CLUSTER = "topology-e2e"
HOW = "run `make kind-test` (tests/kind/run.sh) on a machine with Docker, kind and kubectl"


def _run(argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:200]


def probe(cluster: str) -> str | None:
    """None when the cluster is usable, else why not (in the order a person would fix it)."""
    if shutil.which("docker") is None:
        return "docker is not on PATH"
    try:
        info = _run(["docker", "info", "--format", "{{.ServerVersion}}"])
    except subprocess.TimeoutExpired:
        return "Docker engine not reachable (docker info timed out)"
    if info.returncode != 0:
        return f"Docker engine not reachable (docker info: {_first_line(info.stderr or info.stdout)})"
    for tool in ("kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    clusters = _run(["kind", "get", "clusters"]).stdout.split()
    if cluster not in clusters:
        return f"kind cluster {cluster!r} not found (have: {', '.join(clusters) or 'none'})"
    ready = _run(["kubectl", "--context", f"kind-{cluster}", "get", "--raw", "/readyz"])
    if ready.returncode != 0:
        return f"API server of kind-{cluster} not ready: {_first_line(ready.stderr)}"
    return None


@dataclass(frozen=True)
class KindEnv:
    cluster: str
    context: str
    namespace: str
    release: str
    image: str
    snapshots: Path
    prefix: str = "topology"


@pytest.fixture(scope="session")
def kind_env(tmp_path_factory: pytest.TempPathFactory) -> KindEnv:
    cluster = os.environ.get("KIND_CLUSTER_NAME") or DEFAULT_CLUSTER
    why = probe(cluster)
    if why:
        if os.environ.get("REQUIRE_KIND") == "1":
            pytest.fail(f"REQUIRE_KIND=1 but {why}")
        pytest.skip(f"kind e2e: {why}; {HOW}")
    snapshots = os.environ.get("TOPOLOGY_E2E_SNAPSHOTS")
    if snapshots:
        snapshot_dir = Path(snapshots)
    else:
        from tests.kind.snapshots import write_snapshots

        snapshot_dir = tmp_path_factory.mktemp("snapshots")
        write_snapshots(snapshot_dir, cluster)
    return KindEnv(
        cluster=cluster,
        context=f"kind-{cluster}",
        namespace=os.environ.get("TOPOLOGY_E2E_NAMESPACE", "topology-system"),
        release=os.environ.get("TOPOLOGY_E2E_RELEASE", "topology-agent"),
        image=os.environ.get("TOPOLOGY_E2E_IMAGE", "s390x-topology-agent:e2e"),
        snapshots=snapshot_dir,
    )


@pytest.fixture(scope="session")
def api(kind_env: KindEnv) -> Any:
    """A kubernetes ApiClient for the kind context."""
    from kubernetes import config

    return config.new_client_from_config(context=kind_env.context)


@pytest.fixture(scope="session")
def core(api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api)


@pytest.fixture(scope="session")
def pod_namespace(core: Any, kind_env: KindEnv) -> Iterator[str]:
    """A namespace for the test pods, deleted at the end."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = "topology-e2e-pods"
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except ApiException as exc:
        if exc.status != 409:
            raise
    yield name
    core.delete_namespace(name)


@pytest.fixture(autouse=True)
def _kind_gate(request: pytest.FixtureRequest) -> None:
    """Every ``kind``-marked test needs the cluster: skip (or fail under REQUIRE_KIND=1) before it starts."""
    if request.node.get_closest_marker("kind"):
        request.getfixturevalue("kind_env")
