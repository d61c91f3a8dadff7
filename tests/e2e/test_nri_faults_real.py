"""The NRI enforcement under faults on the real cluster, with ``cpusetEnforcement: nri`` and ``sharedPool: true``
(the lane's containerd 2.4.2, real kubelet, two one-CPU books): what the real runtime and kubelet do when

* the agent restarts with pod-resources off (``agent.podResourcesInterval=0``): its ledger is empty, yet the book a
  running pod holds stays out of the pool (every container the planner pins counts as taken);
* a held book's CPU goes offline (the fake topology's ``online`` flag, changed under the running agent): its holder
  is moved to the pool, said (metric, Node event), and its restarted container is created on the pool, never on
  every CPU;
* every CPU is held: a plain pod's container is refused (CreateContainerError with the agent's reason) rather than
  created on the held books, and created once a book is freed (also: an empty shared pool).

Each pod's CPUs are read from ``/proc/1/status`` of its real container. Local lane only (it changes the release); the
release is put back afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent.topology import snapshot_format as snapshot
from agent.topology.cpulist import parse_cpulist
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import delete_pods, wait_for
from tests.support.e2e.node import agent_pod, metric, metrics, proc_status

pytestmark = pytest.mark.e2e

# Prints its cpuset first, then runs until /tmp/stop exists (a fresh container of the pod starts without it).
SCRIPT = "grep Cpus_allowed_list /proc/self/status; echo END; while [ ! -e /tmp/stop ]; do sleep 0.2; done"
NRI_VALUES = ("--set", "cpusetEnforcement=nri", "--set", "sharedPool=true")


@pytest.fixture(scope="module")
def nri(core: Any, local: E2EEnv, node: str) -> Iterator[E2EEnv]:
    local.helm_upgrade(*NRI_VALUES)
    try:
        synchronized(core, local, node)
        yield local
    finally:
        local.helm_upgrade()


def synchronized(core: Any, env: E2EEnv, node: str) -> Any:
    """The Ready agent pod once its NRI plugin has synchronized with the runtime."""
    def done() -> Any:
        pod = agent_pod(core, env, node)
        logs = env.kubectl("-n", env.namespace, "logs", pod.metadata.name).stdout
        return pod if "NRI: synchronized" in logs else None

    return wait_for("the agent's NRI plugin synchronized", done, timeout=120, interval=0.5)


@pytest.fixture()
def made(core: Any, pod_namespace: str) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    delete_pods(core, pod_namespace, names)


def start(core: Any, namespace: str, env: E2EEnv, node: str, made: list[str], books: int = 0) -> str:
    from kubernetes import client

    name = f"fault-{uuid.uuid4().hex[:8]}"
    limits = {f"{env.prefix}/book": str(books)} if books else None
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Always", termination_grace_period_seconds=0,
            node_selector={"kubernetes.io/hostname": node},
            containers=[client.V1Container(
                name="main", image=env.workload_image, image_pull_policy="Never", command=["/bin/sh", "-c", SCRIPT],
                # A plain pod requests no CPU: the two one-CPU books take the node's whole allocatable cpu.
                resources=client.V1ResourceRequirements(
                    requests={"cpu": "1", "memory": "16Mi"} if books else {"memory": "16Mi"}, limits=limits))])))
    made.append(name)
    return name


def first_line(core: Any, namespace: str, name: str, restarts: int = 0, timeout: float = 120) -> str:
    """The cpuset the pod's current container printed first (after ``restarts`` restarts)."""
    def printed() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        statuses = pod.status.container_statuses or []
        if not statuses or statuses[0].restart_count < restarts or not statuses[0].state.running:
            return None
        text = core.read_namespaced_pod_log(name, namespace)
        return text if "END" in text else None

    log = wait_for(f"{name} to print its first line", printed, timeout=timeout, interval=0.3)
    first = log.splitlines()[0]
    assert first.startswith("Cpus_allowed_list:"), log
    return first.split(":", 1)[1].strip()


def fake_topology_configmap(env: E2EEnv) -> str:
    items = json.loads(env.kubectl("-n", env.namespace, "get", "configmaps", "-l",
                                   f"app.kubernetes.io/instance={env.release}", "-o", "json").stdout)["items"]
    (name,) = [c["metadata"]["name"] for c in items if c["metadata"]["name"].endswith("-fake-topology")]
    return str(name)


def set_offline(env: E2EEnv, offline: set[int]) -> None:
    topology = snapshot.load(env.snapshots / "default.json")
    changed = dataclasses.replace(topology, cpus=tuple(dataclasses.replace(c, online=c.cpu not in offline)
                                                       for c in topology.cpus))
    env.kubectl("-n", env.namespace, "patch", "configmap", fake_topology_configmap(env), "--type", "merge", "-p",
                json.dumps({"data": {"default.json": snapshot.dumps(changed)}}))


def every_cpu(env: E2EEnv) -> set[int]:
    return {c.cpu for c in snapshot.load(env.snapshots / "default.json").cpus}


def test_an_agent_restarted_without_pod_resources_keeps_a_running_holders_book_out_of_the_pool(
        core: Any, pod_namespace: str, nri: E2EEnv, node: str, made: list[str]) -> None:
    """With pod-resources off the restarted agent's ledger holds nothing, but the holder's container still
    runs pinned (its Allocate annotations): the plain pod is not widened onto its book in the Synchronize reply."""
    nri.helm_upgrade(*NRI_VALUES, "--set", "agent.podResourcesInterval=0")
    try:
        synchronized(core, nri, node)
        holder = start(core, pod_namespace, nri, node, made, books=1)
        book = set(parse_cpulist(first_line(core, pod_namespace, holder)))
        plain = start(core, pod_namespace, nri, node, made)
        rest = every_cpu(nri) - book
        assert set(parse_cpulist(first_line(core, pod_namespace, plain))) == rest
        before = agent_pod(core, nri, node)
        core.delete_namespaced_pod(before.metadata.name, nri.namespace)
        after = wait_for("a new agent pod", lambda: (p := synchronized(core, nri, node)).metadata.uid
                         != before.metadata.uid and p, timeout=120, interval=0.5)
        assert metric(metrics(after), "topology_agent_pod_resources_polls_total") == 0  # nothing from kubelet
        # The Synchronize reply has been applied by now: the plain pod is still off the book.
        assert set(parse_cpulist(proc_status(nri, pod_namespace, plain, "Cpus_allowed_list"))) == rest
        assert set(parse_cpulist(proc_status(nri, pod_namespace, holder, "Cpus_allowed_list"))) == book
    finally:
        delete_pods(core, pod_namespace, list(made))
        made.clear()
        nri.helm_upgrade(*NRI_VALUES)
        synchronized(core, nri, node)


def test_a_holder_whose_book_goes_offline_runs_on_the_pool_and_its_restart_too(
        core: Any, pod_namespace: str, nri: E2EEnv, node: str, made: list[str]) -> None:
    """The book's CPU goes offline under the running agent; the holder is moved to the pool at once (the book is
    still allocated: no device state changes), said in a metric and a Node event; its restarted container is created
    on the pool, never on every CPU (no cpuset at all would be every CPU, other pods' books included)."""
    holder = start(core, pod_namespace, nri, node, made, books=1)
    book = set(parse_cpulist(first_line(core, pod_namespace, holder)))
    rest = every_cpu(nri) - book
    set_offline(nri, book)
    try:
        # kubelet rewrites the ConfigMap volume (syncFrequency 10 s here), the agent's rescan (5 s) sees it.
        wait_for("the holder moved to the pool", lambda: set(parse_cpulist(
            proc_status(nri, pod_namespace, holder, "Cpus_allowed_list") or "-1")) == rest, timeout=150, interval=0.5)
        assert metric(metrics(agent_pod(core, nri, node)), "topology_agent_cpuset_holders_offline") == 1
        events = wait_for("the TopologyHolderOffline event", lambda: json.loads(nri.kubectl(
            "-n", "default", "get", "events", "--field-selector", "reason=TopologyHolderOffline", "-o", "json").stdout
        )["items"], timeout=60, interval=1)
        assert any(f"{pod_namespace}/{holder}/main" in e["message"] for e in events), events
        nri.kubectl("-n", pod_namespace, "exec", holder, "--", "touch", "/tmp/stop")  # its container ends
        assert set(parse_cpulist(first_line(core, pod_namespace, holder, restarts=1))) == rest
    finally:  # the next test needs the book online again in the agent's view
        set_offline(nri, set())
        wait_for("the holder back on its book", lambda: set(parse_cpulist(
            proc_status(nri, pod_namespace, holder, "Cpus_allowed_list") or "-1")) == book, timeout=150,
            interval=0.5)


def test_a_plain_pod_is_refused_while_every_cpu_is_held_and_created_once_a_book_is_freed(
        core: Any, pod_namespace: str, nri: E2EEnv, node: str, made: list[str]) -> None:
    """Also: an empty shared pool. Created on every CPU the plain pod would run on both held books: its container is
    refused instead (kubelet shows CreateContainerError with the agent's reason and retries), and it starts on the
    freed book's CPU once one is freed."""
    holders = [start(core, pod_namespace, nri, node, made, books=1) for _ in range(2)]
    books = [set(parse_cpulist(first_line(core, pod_namespace, h))) for h in holders]
    plain = start(core, pod_namespace, nri, node, made)

    def refused() -> Any:
        statuses = core.read_namespaced_pod(plain, pod_namespace).status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return waiting if waiting is not None and waiting.reason == "CreateContainerError" else None

    waiting = wait_for(f"{plain} refused", refused, timeout=90, interval=0.5)
    assert "the shared pool is empty" in waiting.message, waiting.message
    delete_pods(core, pod_namespace, [holders[0]])
    assert set(parse_cpulist(first_line(core, pod_namespace, plain, timeout=180))) == books[0]
