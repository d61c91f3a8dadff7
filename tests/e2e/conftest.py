"""End-to-end gate: the ``e2e``-marked tests run against a real cluster with the chart installed, else skip.

Two lanes provision such a cluster and run the same tests:

* **local** (``make e2e``, devkit/cluster/e2e.sh): upstream kubelet, API server, scheduler, controller manager,
  etcd and containerd as processes on this machine (devkit/topology_devkit/realcluster), one node whose fake
  topology maps each book to one real CPU. Node-level steps (a kubelet restart, the node's files, the agent's
  port) run here.
* **kind** (``make kind-test``, devkit/kind/run.sh): a two-worker kind cluster; node-level steps go through
  ``docker exec``.

Any other cluster with the chart installed works too (``TOPOLOGY_E2E_LANE=remote``): the node-level tests skip.

Environment: TOPOLOGY_E2E_KUBECONFIG (a kubeconfig: use that cluster; else the kind cluster KIND_CLUSTER_NAME,
default topology-e2e), TOPOLOGY_E2E_CONTEXT, TOPOLOGY_E2E_LANE (local, kind or remote; local when a kubeconfig
is given), TOPOLOGY_E2E_NAMESPACE (topology-system), TOPOLOGY_E2E_RELEASE (topology-agent), TOPOLOGY_E2E_IMAGE
(the agent's image, s390x-topology-agent:e2e), TOPOLOGY_E2E_WORKLOAD_IMAGE (the test pods' image, default the
agent's), TOPOLOGY_E2E_SNAPSHOTS (the snapshot dir the lane installed; regenerated for kind when unset),
TOPOLOGY_E2E_VALUES (the values file the kind lane installed the release with: the suite may then upgrade it as
on the local lane), TOPOLOGY_E2E_ENGINE (the kind nodes' engine, docker or podman; docker by default),
TOPOLOGY_E2E_RUNTIME (the local lane's node runtime: containerd, or crio with ``make e2e RUNTIME=crio``).
REQUIRE_E2E=1 (or REQUIRE_KIND=1) turns every skip reason into a failure: a lane that provisions a cluster
must not pass by skipping.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e.cluster import DEFAULT_CLUSTER, HOW, WORKER_LABEL, E2EEnv, probe, probe_kubeconfig
from tests.support.e2e.kube import delete_pods, wait_for
from tests.support.e2e.node import agent_pod, metric, metrics


def _require() -> bool:
    return os.environ.get("REQUIRE_E2E") == "1" or os.environ.get("REQUIRE_KIND") == "1"


@pytest.fixture(scope="session")
def e2e_env(tmp_path_factory: pytest.TempPathFactory) -> E2EEnv:
    kubeconfig_env = os.environ.get("TOPOLOGY_E2E_KUBECONFIG")
    cluster = os.environ.get("KIND_CLUSTER_NAME") or DEFAULT_CLUSTER
    kubeconfig = Path(kubeconfig_env) if kubeconfig_env else None
    lane = os.environ.get("TOPOLOGY_E2E_LANE") or ("local" if kubeconfig else "kind")
    why = probe_kubeconfig(kubeconfig) if kubeconfig else probe(cluster)
    if why:
        if _require():
            pytest.fail(f"REQUIRE_E2E=1 but {why}")
        pytest.skip(f"e2e: {why}; {HOW}")
    snapshots = os.environ.get("TOPOLOGY_E2E_SNAPSHOTS")
    if snapshots:
        snapshot_dir = Path(snapshots)
    elif lane == "kind":
        from tests.e2e.snapshots import write_snapshots

        snapshot_dir = tmp_path_factory.mktemp("snapshots")
        write_snapshots(snapshot_dir, cluster)
    else:
        pytest.fail("TOPOLOGY_E2E_SNAPSHOTS must name the snapshot dir the chart was installed with")
    image = os.environ.get("TOPOLOGY_E2E_IMAGE", "s390x-topology-agent:e2e")
    return E2EEnv(
        lane=lane,
        kubeconfig=kubeconfig,
        context=os.environ.get("TOPOLOGY_E2E_CONTEXT") or (None if kubeconfig else f"kind-{cluster}"),
        cluster=cluster,
        namespace=os.environ.get("TOPOLOGY_E2E_NAMESPACE", "topology-system"),
        release=os.environ.get("TOPOLOGY_E2E_RELEASE", "topology-agent"),
        image=image,
        workload_image=os.environ.get("TOPOLOGY_E2E_WORKLOAD_IMAGE", image),
        snapshots=snapshot_dir,
        runtime=os.environ.get("TOPOLOGY_E2E_RUNTIME") or "containerd",
    )


@pytest.fixture(scope="session")
def api(e2e_env: E2EEnv) -> Any:
    """A kubernetes ApiClient for the lane's cluster."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(e2e_env.kubeconfig) if e2e_env.kubeconfig else None,
                                         context=e2e_env.context)


@pytest.fixture(scope="session")
def core(api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api)


@pytest.fixture(scope="session")
def pod_namespace(core: Any, e2e_env: E2EEnv) -> Iterator[str]:
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


@pytest.fixture(scope="session")
def node(core: Any, e2e_env: E2EEnv) -> str:
    """The first worker (the local lane has one)."""
    nodes = sorted(n.metadata.name for n in core.list_node(label_selector=f"{WORKER_LABEL}=true").items)
    assert nodes, f"no node labelled {WORKER_LABEL}=true"
    return nodes[0]


@pytest.fixture(scope="session")
def exp(e2e_env: E2EEnv, node: str) -> Any:
    """What that node advertises (tests.e2e.snapshots.Expected)."""
    from tests.e2e.snapshots import expected

    return expected(e2e_env.snapshots, node, e2e_env.prefix)


@pytest.fixture(scope="session")
def local(e2e_env: E2EEnv) -> E2EEnv:
    if e2e_env.lane != "local":
        pytest.skip(f"needs the node's own files and processes (the local lane), not {e2e_env.lane}")
    return e2e_env


@pytest.fixture(autouse=True)
def _e2e_gate(request: pytest.FixtureRequest) -> None:
    """Every ``e2e``-marked test needs the cluster: skip (or fail under REQUIRE_E2E=1) before it starts."""
    if request.node.get_closest_marker("e2e"):
        request.getfixturevalue("e2e_env")


@pytest.fixture()
def pods(core: Any, pod_namespace: str, e2e_env: E2EEnv, node: str) -> Iterator[Callable[..., str]]:
    """pods({resource: n}, cpu="1") -> pod name; the pod prints its environment, then its cpuset, and sleeps."""
    from kubernetes import client

    created: list[str] = []

    def _make(extended: dict[str, int], cpu: str | None = "1", name: str | None = None) -> str:
        name = name or f"real-{uuid.uuid4().hex[:8]}"
        limits = {k: str(v) for k, v in extended.items()}
        requests: dict[str, str] = {"memory": "16Mi"}
        if cpu is not None:
            requests["cpu"] = cpu
        script = "env; echo ENV-END; exec sleep 3600"
        core.create_namespaced_pod(pod_namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                restart_policy="Never", termination_grace_period_seconds=1,
                node_selector={"kubernetes.io/hostname": node},
                containers=[client.V1Container(
                    name="main", image=e2e_env.workload_image, image_pull_policy="Never",
                    command=["/bin/sh", "-c", script],
                    resources=client.V1ResourceRequirements(requests=requests, limits=limits or None))])))
        created.append(name)
        return name

    yield _make
    delete_pods(core, pod_namespace, created)


@pytest.fixture(scope="module")
def nri(core: Any, local: E2EEnv, node: str) -> Iterator[E2EEnv]:
    """The release in ``cpusetEnforcement: nri`` with the shared pool for the module; put back after it."""
    local.helm_upgrade("--set", "cpusetEnforcement=nri", "--set", "sharedPool=true")
    try:
        agent = agent_pod(core, local, node)
        wait_for("the agent to enforce through NRI", lambda: metric(
            metrics(agent_pod(core, local, node)), "topology_agent_cpuset_enforcement_mode", {"mode": "nri"}) == 1,
            timeout=60, interval=0.5)
        assert agent
        yield local
    finally:
        local.helm_upgrade()


@pytest.fixture()
def made(core: Any, pod_namespace: str) -> Iterator[list[str]]:
    """The names of the pods a test made, deleted after it."""
    names: list[str] = []
    yield names
    delete_pods(core, pod_namespace, names)
