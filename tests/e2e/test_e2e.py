"""End to end on a real cluster with the chart in fake-topology mode, checked through the API server with the
``kubernetes`` client: on kind (make kind-test) two x86 workers advertise a z16-shaped and a z13-shaped topology;
on this machine's real cluster (make e2e) one node advertises one book per real CPU.

Skipped (with the reason) when no such cluster is reachable; REQUIRE_E2E=1 turns the skip into a failure.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.snapshots import Expected, expected
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import ENV_CONTRACT, delete_pods, free_cpu_millis, wait_for

pytestmark = pytest.mark.e2e

WORKER_LABEL = "topology-e2e/worker"
BINDING = ("OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


@pytest.fixture(scope="module")
def workers(core: Any, e2e_env: E2EEnv) -> list[Any]:
    nodes = core.list_node(label_selector=f"{WORKER_LABEL}=true").items
    want = 2 if e2e_env.lane == "kind" else len(nodes) or 1
    assert len(nodes) == want, f"expected {want} workers labelled {WORKER_LABEL}=true, got " \
        f"{[n.metadata.name for n in nodes]}"
    return sorted(nodes, key=lambda n: n.metadata.name)


@pytest.fixture(scope="module")
def expectations(workers: list[Any], e2e_env: E2EEnv) -> dict[str, Expected]:
    return {n.metadata.name: expected(e2e_env.snapshots, n.metadata.name, e2e_env.prefix) for n in workers}


@pytest.fixture(scope="module")
def book_node(expectations: dict[str, Expected], e2e_env: E2EEnv) -> tuple[str, Expected]:
    """The worker with the z16 snapshot (the one advertising books)."""
    resource = f"{e2e_env.prefix}/book"
    name = max(expectations, key=lambda n: expectations[n].allocatable.get(resource, 0))
    assert expectations[name].allocatable.get(resource, 0) >= 2
    return name, expectations[name]


@pytest.fixture(scope="module")
def daemonset_ready(api: Any, e2e_env: E2EEnv, workers: list[Any]) -> Any:
    from kubernetes import client

    apps = client.AppsV1Api(api)

    def ready() -> Any:
        for ds in apps.list_namespaced_daemon_set(e2e_env.namespace).items:
            s: Any = ds.status
            if ((ds.metadata and ds.metadata.labels) or {}).get("app.kubernetes.io/instance") == e2e_env.release \
                    and s.desired_number_scheduled >= len(workers) and s.number_ready == s.desired_number_scheduled \
                    and s.updated_number_scheduled == s.desired_number_scheduled:
                return ds
        return None

    return wait_for("the agent DaemonSet to be ready on every worker", ready, timeout=180)


@pytest.fixture()
def make_pod(core: Any, pod_namespace: str, e2e_env: E2EEnv) -> Iterator[Callable[..., str]]:
    """make_pod(node, {resource: n}, cpu="1") -> pod name; the pod prints its environment and sleeps."""
    from kubernetes import client

    created: list[str] = []

    def _make(node: str, extended: dict[str, int], cpu: str | None = "1", name: str | None = None) -> str:
        name = name or f"e2e-{uuid.uuid4().hex[:8]}"
        limits = {k: str(v) for k, v in extended.items()}
        requests: dict[str, str] = {"memory": "32Mi"}
        if cpu is not None:
            limits["cpu"] = requests["cpu"] = cpu
        limits["memory"] = "32Mi"
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                restart_policy="Never",
                termination_grace_period_seconds=1,
                node_selector={"kubernetes.io/hostname": node},
                containers=[client.V1Container(
                    name="main", image=e2e_env.workload_image, image_pull_policy="Never",
                    command=["/bin/sh", "-c", "env; echo ENV-END; exec sleep 3600"],
                    resources=client.V1ResourceRequirements(requests=requests, limits=limits),
                )],
            ),
        )
        core.create_namespaced_pod(pod_namespace, pod)
        created.append(name)
        return name

    yield _make
    delete_pods(core, pod_namespace, created)


def pod_env(core: Any, namespace: str, name: str) -> dict[str, str]:
    def running() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == "Running" else None

    wait_for(f"pod {name} to run", running, timeout=90)
    log = wait_for(f"pod {name} to print its environment",
                   lambda: (text := core.read_namespaced_pod_log(name, namespace)) and "ENV-END" in text and text)
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)


def places(omp_places: str) -> int:
    return len(re.findall(r"\{[^}]*\}", omp_places)) or len([p for p in omp_places.split(",") if p])


# -------------------------------------------------------------------------------------------------- the tests


def test_daemonset_is_ready_on_every_worker(daemonset_ready: Any, workers: list[Any]) -> None:
    assert daemonset_ready.status.number_ready == len(workers)


def advertised(core: Any, node: str, prefix: str) -> dict[str, str]:
    allocatable = core.read_node(node).status.allocatable or {}
    return {k: v for k, v in allocatable.items() if k.startswith(prefix + "/") and v != "0"}


def test_allocatable_equals_the_snapshot_groups(core: Any, daemonset_ready: Any,
                                                expectations: dict[str, Expected], e2e_env: E2EEnv) -> None:
    for node, exp in expectations.items():
        want = {resource: str(count) for resource, count in exp.allocatable.items()}
        assert want, f"{node}: the snapshot advertises nothing"

        def matches(node: str = node, want: dict[str, str] = want) -> bool:
            return advertised(core, node, e2e_env.prefix) == want

        wait_for(f"{node} to advertise {want}", matches, timeout=60)


def test_node_labels(core: Any, daemonset_ready: Any, expectations: dict[str, Expected]) -> None:
    for node, exp in expectations.items():
        def labelled(node: str = node, exp: Expected = exp) -> bool:
            return exp.labels.items() <= (core.read_node(node).metadata.labels or {}).items()

        wait_for(f"{node} to carry the labels {exp.labels}", labelled, timeout=60)


def test_a_pod_gets_a_book_with_the_environment_contract(core: Any, daemonset_ready: Any, pod_namespace: str,
                                                         book_node: tuple[str, Expected], e2e_env: E2EEnv,
                                                         make_pod: Callable[..., str]) -> None:
    node, exp = book_node
    env = pod_env(core, pod_namespace, make_pod(node, {f"{e2e_env.prefix}/book": 1}))
    missing = [k for k in ENV_CONTRACT if k not in env]
    assert not missing, f"Allocate did not set {missing}"
    assert env["TOPOLOGY_CPUS"] in exp.cpulists(f"{e2e_env.prefix}/book")
    assert int(env["OMP_NUM_THREADS"]) == places(env["TOPOLOGY_OMP_PLACES"]) > 0
    assert re.fullmatch(r"[0-9]+(,[0-9]+)*", env["CPU_VISIBLE_MEMORY_NODES"])
    assert env["VLLM_CPU_OMP_THREADS_BIND"] and env["TOPOLOGY_RANKS"] == "1"
    assert not [k for k in BINDING if k in env], "no OpenMP binding variable for the whole container"


def test_a_second_pod_gets_a_different_book(core: Any, daemonset_ready: Any, pod_namespace: str,
                                            book_node: tuple[str, Expected], e2e_env: E2EEnv,
                                            make_pod: Callable[..., str]) -> None:
    node, exp = book_node
    free = free_cpu_millis(core, node)
    if free < 2000:
        pytest.skip(f"node {node} has {free}m CPU free; two pods with integer cpu requests need 2")
    book = f"{e2e_env.prefix}/book"
    first = pod_env(core, pod_namespace, make_pod(node, {book: 1}))
    second = pod_env(core, pod_namespace, make_pod(node, {book: 1}))
    assert first["TOPOLOGY_CPUS"] != second["TOPOLOGY_CPUS"]
    assert {first["TOPOLOGY_CPUS"], second["TOPOLOGY_CPUS"]} <= exp.cpulists(book)
    assert first["TOPOLOGY_GROUPS"] != second["TOPOLOGY_GROUPS"]


def test_more_books_than_exist_stay_pending(core: Any, daemonset_ready: Any, pod_namespace: str,
                                            book_node: tuple[str, Expected], e2e_env: E2EEnv,
                                            make_pod: Callable[..., str]) -> None:
    node, exp = book_node
    book = f"{e2e_env.prefix}/book"
    name = make_pod(node, {book: exp.allocatable[book] + 1})

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod(name, pod_namespace)
        for cond in pod.status.conditions or []:
            short = f"Insufficient {book}" in (cond.message or "")
            if cond.type == "PodScheduled" and cond.status == "False" and short:
                return pod
        return None

    pod = wait_for(f"{name} to be unschedulable for lack of {book}", unschedulable, timeout=60)
    time.sleep(5)
    assert core.read_namespaced_pod(name, pod_namespace).status.phase == "Pending", pod.status


def _server_minor(api: Any) -> int:
    from kubernetes import client

    version = client.VersionApi(api).get_code()
    return int(re.match(r"[0-9]+", version.minor).group(0))  # type: ignore[union-attr]


def test_admission_policy_rejects_two_topology_resources(api: Any, core: Any, daemonset_ready: Any,
                                                         book_node: tuple[str, Expected], e2e_env: E2EEnv,
                                                         make_pod: Callable[..., str]) -> None:
    from kubernetes.client.exceptions import ApiException

    if _server_minor(api) < 30:
        pytest.skip("the ValidatingAdmissionPolicy needs Kubernetes >= 1.30 (set KIND_NODE_IMAGE)")
    node, _ = book_node
    p = e2e_env.prefix

    def rejected(resources: dict[str, int], cpu: str | None) -> str:
        try:  # the policy becomes active a moment after install: retry until it answers
            make_pod(node, resources, cpu=cpu)
        except ApiException as exc:
            return f"{exc.status} {exc.body}"
        return ""

    two = wait_for("the admission policy to reject two topology resources",
                   lambda: rejected({f"{p}/book": 1, f"{p}/socket": 1}, "1"), timeout=60, interval=3)
    assert two.startswith("422") and f"request more than one {p}/ resource" in two
    no_cpu = rejected({f"{p}/book": 1}, None)
    assert no_cpu.startswith("422") and "without an integer cpu request" in no_cpu
    fraction = rejected({f"{p}/book": 1}, "500m")
    assert fraction.startswith("422") and "without an integer cpu request" in fraction


def _agent_pod(core: Any, e2e_env: E2EEnv, node: str) -> Any:
    pods = core.list_namespaced_pod(e2e_env.namespace, field_selector=f"spec.nodeName={node}",
                                    label_selector=f"app.kubernetes.io/instance={e2e_env.release}").items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def _sockets(env: E2EEnv, node: str) -> set[str]:
    """The agent's sockets in kubelet's device-plugin directory on the node."""
    script = "cd /var/lib/kubelet/device-plugins && for f in *.sock; do [ -S \"$f\" ] && echo \"$f\"; done"
    out = env.node_shell(node, script + "; true")
    return {name for name in out.split() if name != "kubelet.sock"}


def _metrics(core: Any, e2e_env: E2EEnv, agent: Any) -> str:
    """The agent pod's /metrics, through the API server's pod proxy."""
    port = next(p.container_port for p in agent.spec.containers[0].ports if p.name == "metrics")
    return str(core.connect_get_namespaced_pod_proxy_with_path(f"{agent.metadata.name}:{port}", e2e_env.namespace,
                                                              "metrics"))


def _registrations(core: Any, e2e_env: E2EEnv, agent: Any) -> dict[str, float]:
    """topology_agent_registrations per resource: successful Register calls to kubelet since the agent started."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(_metrics(core, e2e_env, agent)):
        if family.name == "topology_agent_registrations":
            return {s.labels["resource"]: s.value for s in family.samples if s.name.endswith("_total")}
    return {}


def test_reregisters_after_its_socket_is_deleted(core: Any, daemonset_ready: Any,
                                                 expectations: dict[str, Expected], e2e_env: E2EEnv) -> None:
    """Freshness is judged by the agent's registration counter, not by inode numbers: the agent closes its old
    listeners before binding new ones and ext4 hands the lowest free inode straight back (fs/ext4/ialloc.c,
    find_inode_bit), so a new socket often has the old one's inode and an inode test could wait forever."""
    node = sorted(expectations)[-1]
    before = wait_for(f"the agent's sockets on {node}", lambda: _sockets(e2e_env, node), timeout=30)
    agent = _agent_pod(core, e2e_env, node)
    restarts = agent.status.container_statuses[0].restart_count
    counted = wait_for(f"the agent on {node} to count its registrations",
                       lambda: _registrations(core, e2e_env, agent), timeout=30)
    assert set(expectations[node].allocatable) <= set(counted), counted
    e2e_env.node_shell(node, "rm -f " + " ".join(f"/var/lib/kubelet/device-plugins/{s}" for s in before))

    def registered_again() -> dict[str, float]:
        now = _registrations(core, e2e_env, agent)
        again = all(now.get(resource, 0) > count for resource, count in counted.items())
        return now if again and _sockets(e2e_env, node) == before else {}

    wait_for(f"the agent on {node} to register every resource again (had {counted})", registered_again, timeout=60)
    want = {r: str(c) for r, c in expectations[node].allocatable.items()}
    wait_for(f"{node} to advertise {want} again", lambda: advertised(core, node, e2e_env.prefix) == want, timeout=60)
    again = _agent_pod(core, e2e_env, node)
    assert again.metadata.uid == agent.metadata.uid
    assert again.status.container_statuses[0].restart_count == restarts, "re-registered by restarting, not by itself"


def test_metrics_are_scrapeable(core: Any, daemonset_ready: Any, workers: list[Any], e2e_env: E2EEnv) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for node in workers:
        agent = _agent_pod(core, e2e_env, node.metadata.name)
        port = next(p.container_port for p in agent.spec.containers[0].ports if p.name == "metrics")
        proxy = f"{agent.metadata.name}:{port}"
        text = _metrics(core, e2e_env, agent)
        families = {f.name for f in text_string_to_metric_families(text)}
        assert families, text[:500]
        assert core.connect_get_namespaced_pod_proxy_with_path(proxy, e2e_env.namespace, "readyz")
        assert core.connect_get_namespaced_pod_proxy_with_path(proxy, e2e_env.namespace, "allocations") is not None
