"""End to end with what only a real node shows: the real kubelet's admission, its pod-resources API, a kubelet
restart, the DaemonSet recreating the agent, real cpusets, the API server's node restriction and the static CPU
manager. Runs on the local lane (make e2e), where the node is this machine and every book is one real CPU;
the tests that need the node's shell skip on a lane without it (kind runs what it can through docker exec).
"""

from __future__ import annotations

import base64
import json
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.snapshots import Expected
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import ENV_CONTRACT, delete_pods, free_cpu_millis, wait_for
from tests.support.e2e.node import (
    AGENT_PREFIX,
    agent_pod,
    book_pods_running,
    http_get,
    metric,
    metrics,
    pinned_to,
    pod_resources,
    proc_status,
    registration_latency,
    running_env,
    settle_after_kubelet_restart,
)
from topology_devkit.testing.wait import poll_until

pytestmark = pytest.mark.e2e


def pending_reason(core: Any, namespace: str, name: str) -> str:
    pod = core.read_namespaced_pod(name, namespace)
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return cond.message or ""
    return ""


# -------------------------------------------------------------------------------------------------- the tests


def test_a_book_pod_runs_inside_its_book(core: Any, pod_namespace: str, e2e_env: E2EEnv, node: str,
                                         exp: Expected, pods: Callable[..., str]) -> None:
    """The real kubelet admits it; its environment is the contract; CRI enforcement pins it to its book."""
    agent_pod(core, e2e_env, node)
    ((name, env),) = book_pods_running(core, pod_namespace, pods, e2e_env, 1)
    assert not [k for k in ENV_CONTRACT if k not in env], env
    assert env["TOPOLOGY_CPUS"] in exp.cpulists(f"{e2e_env.prefix}/book")
    assert env["CPU_VISIBLE_MEMORY_NODES"] == "0"
    wait_for(f"{name}'s cpuset to be its book {env['TOPOLOGY_CPUS']}",
             lambda: proc_status(e2e_env, pod_namespace, name, "Cpus_allowed_list") == env["TOPOLOGY_CPUS"],
             timeout=10, interval=0.2)
    assert proc_status(e2e_env, pod_namespace, name, "Mems_allowed_list") == "0"


def test_books_are_exclusive_and_a_third_pod_waits_for_one(core: Any, pod_namespace: str, e2e_env: E2EEnv,
                                                           node: str, exp: Expected,
                                                           pods: Callable[..., str]) -> None:
    book = f"{e2e_env.prefix}/book"
    books = exp.allocatable[book]
    agent_pod(core, e2e_env, node)
    if free_cpu_millis(core, node) < 1000 * books:
        pytest.skip(f"{node} has not {books} CPUs free for {books} one-CPU book pods")
    held = book_pods_running(core, pod_namespace, pods, e2e_env, books)
    assert len({env["TOPOLOGY_GROUPS"] for _, env in held}) == books, held
    extra = pods({book: 1})
    message = wait_for(f"{extra} to be unschedulable", lambda: pending_reason(core, pod_namespace, extra),
                       timeout=60, interval=0.5)
    assert f"Insufficient {book}" in message, message
    # The real pod-resources API shows each book held once, by the pod that has it.
    listed = pod_resources()
    owners = {(ns, pod): devs.get(book) for (ns, pod, _), devs in listed.items() if ns == pod_namespace}
    for name, env in held:
        assert owners.get((pod_namespace, name)) == env["TOPOLOGY_GROUPS"].split(","), listed
    # Deleting one frees its book: pod-resources drops it and the waiting pod gets exactly that book.
    freed_name, freed_env = held[0]
    delete_pods(core, pod_namespace, [freed_name])
    wait_for("pod-resources to drop the deleted pod",
             lambda: not [k for k in pod_resources() if k[1] == freed_name], timeout=30, interval=0.5)
    env = running_env(core, pod_namespace, extra, timeout=120)
    assert env["TOPOLOGY_GROUPS"] == freed_env["TOPOLOGY_GROUPS"]


def test_kubelet_restart_keeps_pods_and_the_agent_reregisters(core: Any, pod_namespace: str, local: E2EEnv,
                                                              node: str, exp: Expected,
                                                              pods: Callable[..., str]) -> None:
    book = f"{local.prefix}/book"
    agent = agent_pod(core, local, node)
    held = book_pods_running(core, pod_namespace, pods, local, min(2, exp.allocatable[book]))
    for name, env in held:
        wait_for(f"{name} pinned", pinned_to(local, pod_namespace, name, env["TOPOLOGY_CPUS"]), timeout=10,
                 interval=0.2)
    before = metric(metrics(agent), "topology_agent_registrations_total", {"resource": book}) or 0
    since = time.time()
    local.restart_kubelet(node)
    restarted = time.monotonic()
    wait_for("the agent to register again", lambda: (metric(metrics(agent), "topology_agent_registrations_total",
                                                            {"resource": book}) or 0) > before,
             timeout=30, interval=0.05)
    reregistered = time.monotonic() - restarted
    print(f"the agent registered again {reregistered:.3f} s after the restarted kubelet answered /healthz")
    # kubelet 1.34 answers /healthz up to ~1.6 s before its device-plugin registration server exists (its container
    # manager starts later): the agent's own latency is from that server's start, in kubelet's log.
    served = registration_latency(local.lane_log("kubelet"), book)
    print(f"kubelet's registration server up -> the agent's Register: {served:.3f} s")
    assert served < 1, f"re-registered {served:.2f} s after kubelet's registration server started"
    settle_after_kubelet_restart(core, node, since)
    want = str(exp.allocatable[book])
    wait_for(f"allocatable {book} to be {want} again",
             lambda: (core.read_node(node).status.capacity or {}).get(book) == want, timeout=60, interval=0.5)
    for name, env in held:
        pod = core.read_namespaced_pod(name, pod_namespace)
        assert pod.status.phase == "Running", (name, pod.status.phase, pod.status.reason)
        assert pod.status.container_statuses[0].restart_count == 0
        wait_for(f"{name} to show its cpuset again", pinned_to(local, pod_namespace, name, None), timeout=30,
                 interval=0.3)
        assert proc_status(local, pod_namespace, name, "Cpus_allowed_list") == env["TOPOLOGY_CPUS"]
    listed = wait_for("pod-resources to list the pods again", lambda: (
        r := pod_resources()) and all(any(k[1] == n for k in r) for n, _ in held) and r, timeout=60, interval=0.5)
    for name, env in held:
        assert next(d for k, d in listed.items() if k[1] == name)[book] == env["TOPOLOGY_GROUPS"].split(",")
    failed = [p.metadata.name for p in core.list_namespaced_pod(pod_namespace).items
              if p.status.reason == "UnexpectedAdmissionError"]
    assert not failed, failed


def test_a_recreated_agent_hands_out_no_held_book_twice(core: Any, pod_namespace: str, e2e_env: E2EEnv,
                                                        node: str, exp: Expected,
                                                        pods: Callable[..., str]) -> None:
    book = f"{e2e_env.prefix}/book"
    old = agent_pod(core, e2e_env, node)
    held = book_pods_running(core, pod_namespace, pods, e2e_env, 1)
    core.delete_namespaced_pod(old.metadata.name, e2e_env.namespace)
    new = wait_for("the DaemonSet to recreate the agent", lambda: (
        p := agent_pod(core, e2e_env, node)) and p.metadata.uid != old.metadata.uid and p, timeout=120, interval=0.5)
    assert new.metadata.uid != old.metadata.uid
    others = [pods({book: 1}) for _ in range(exp.allocatable[book])]  # one more than the books left
    groups: list[str] = []

    def the_free_books_running() -> bool:
        groups[:] = [running_env(core, pod_namespace, name)["TOPOLOGY_GROUPS"] for name in others
                     if core.read_namespaced_pod(name, pod_namespace).status.phase == "Running"]
        return len(groups) >= exp.allocatable[book] - 1

    poll_until(the_free_books_running, 30, every=0.5)
    assert held[0][1]["TOPOLOGY_GROUPS"] not in groups, "a held book was handed out again"
    assert len(groups) == len(set(groups)) == exp.allocatable[book] - 1, groups


def test_metrics_and_readyz_from_the_node(core: Any, local: E2EEnv, node: str) -> None:
    pod = agent_pod(core, local, node)
    port = next(p.container_port for p in pod.spec.containers[0].ports if p.name == "metrics")
    status, body = http_get(f"http://{pod.status.pod_ip}:{port}/readyz")
    assert status == 200, body
    text = metrics(pod)
    assert metric(text, "topology_agent_registrations_total", {"resource": f"{local.prefix}/book"}), text[:400]


def _agent_token(env: E2EEnv, pod: Any) -> str:
    account = pod.spec.service_account_name
    out = env.kubectl("create", "token", account, "-n", env.namespace, "--bound-object-kind", "Pod",
                      "--bound-object-name", pod.metadata.name, "--bound-object-uid", pod.metadata.uid,
                      "--duration", "10m").stdout
    return out.strip()


def _as_agent(env: E2EEnv, token: str) -> Any:
    from kubernetes import client

    with open(env.kubeconfig or "", encoding="utf-8") as f:
        cluster = json.load(f)["clusters"][0]["cluster"]
    ca = tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False)  # noqa: SIM115
    ca.write(base64.b64decode(cluster["certificate-authority-data"]))
    ca.close()
    config = client.Configuration()
    config.host = cluster["server"]
    config.ssl_ca_cert = ca.name
    config.api_key = {"authorization": f"Bearer {token}"}
    return client.CoreV1Api(client.ApiClient(config))


def test_node_restriction_lets_the_agent_label_only_its_own_node(core: Any, local: E2EEnv, node: str) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    as_agent = _as_agent(local, _agent_token(local, agent_pod(core, local, node)))
    key = f"{AGENT_PREFIX}/e2e-probe"
    as_agent.patch_node(node, {"metadata": {"labels": {key: "own"}}})
    assert core.read_node(node).metadata.labels[key] == "own"
    as_agent.patch_node(node, {"metadata": {"labels": {key: None}}})
    other = f"e2e-other-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=other)))
    try:
        with pytest.raises(ApiException) as refused:
            as_agent.patch_node(other, {"metadata": {"labels": {key: "other"}}})
        assert refused.value.status in (403, 422), refused.value.body
        assert key not in (core.read_node(other).metadata.labels or {})
    finally:
        core.delete_node(other)


def test_book_and_socket_levels_block_each_other_with_real_pod_resources(
        core: Any, pod_namespace: str, local: E2EEnv, node: str, exp: Expected, pods: Callable[..., str]) -> None:
    book, socket = f"{local.prefix}/book", f"{local.prefix}/socket"
    local.helm_upgrade("--set", "agent.levels=book\\,socket")
    try:
        agent_pod(core, local, node)
        wait_for(f"{node} to advertise {socket}", lambda: (core.read_node(node).status.capacity or {}).get(socket)
                 == str(exp.allocatable[book]), timeout=90, interval=0.5)
        ((_, env),) = book_pods_running(core, pod_namespace, pods, local, 1)
        sockets = exp.allocatable[book]
        wait_for(f"allocatable {socket} to drop to {sockets - 1} (the held book's socket Unhealthy)",
                 lambda: (core.read_node(node).status.allocatable or {}).get(socket) == str(sockets - 1),
                 timeout=60, interval=0.5)
        agent = agent_pod(core, local, node)
        status = json.loads(http_get(f"http://{agent.status.pod_ip}:9400/allocations")[1])
        assert status, status
        assert env["TOPOLOGY_GROUPS"]
    finally:
        local.helm_upgrade()


def test_static_cpu_manager_is_labelled_and_refused(core: Any, pod_namespace: str, local: E2EEnv,
                                                    node: str) -> None:
    label = f"{AGENT_PREFIX}/cpu-manager-policy"
    agent_pod(core, local, node)
    delete_pods(core, pod_namespace, [p.metadata.name for p in core.list_namespaced_pod(pod_namespace).items])
    try:
        since = time.time()
        local.restart_kubelet(node, cpu_manager_policy="static")
        settle_after_kubelet_restart(core, node, since)
        wait_for(f"{node} to be labelled {label}=static",
                 lambda: (core.read_node(node).metadata.labels or {}).get(label) == "static", timeout=90,
                 interval=0.5)
        # The enforcement loop of a node where nothing is held looks every 30 s: the refusal follows by then.
        wait_for("the agent to refuse cpuset enforcement", lambda: metric(
            metrics(agent_pod(core, local, node)), "topology_agent_cpuset_enforcement_refused") == 1, timeout=60,
            interval=0.5)

        def warned() -> bool:
            from kubernetes.client.exceptions import ApiException

            try:  # right after a kubelet restart its log endpoint can answer 404 for a moment
                logs = core.read_namespaced_pod_log(agent_pod(core, local, node).metadata.name, local.namespace)
            except ApiException:
                return False
            return "static policy" in (logs or "")

        wait_for("the agent to warn about the static policy", warned, timeout=60, interval=0.5)
    finally:
        since = time.time()
        local.restart_kubelet(node, cpu_manager_policy="none")
        settle_after_kubelet_restart(core, node, since)
        wait_for(f"{node} to be labelled {label}=none",
                 lambda: (core.read_node(node).metadata.labels or {}).get(label) == "none", timeout=90,
                 interval=0.5)
