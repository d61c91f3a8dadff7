"""Book/socket exclusivity under the real kubelet's timing, with ``--levels book,socket``: a book pod
followed at once by a socket pod, a kubelet restart while a book is held, and a book held by a plain init
container. On this lane's node every book has one socket of one CPU, so a held book blocks exactly one socket.

The release is upgraded to both levels once for the module and put back afterwards. Local lane only (it
changes the release and restarts the kubelet).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.snapshots import Expected
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import delete_pods, wait_for
from tests.support.e2e.node import agent_pod, running_env, settle_after_kubelet_restart

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def both_levels(core: Any, local: E2EEnv, node: str, exp: Expected) -> Iterator[E2EEnv]:
    socket = f"{local.prefix}/socket"
    local.helm_upgrade("--set", "agent.levels=book\\,socket")
    try:
        agent_pod(core, local, node)
        books = exp.allocatable[f"{local.prefix}/book"]
        wait_for(f"{node} to advertise {books} {socket}",
                 lambda: (core.read_node(node).status.allocatable or {}).get(socket) == str(books), timeout=90,
                 interval=0.5)
        yield local
    finally:
        local.helm_upgrade()


def _pod(core: Any, namespace: str, env: E2EEnv, node: str, main: dict[str, int], init: dict[str, int] | None = None,
         ) -> str:
    from kubernetes import client

    name = f"excl-{uuid.uuid4().hex[:8]}"

    def container(cname: str, extended: dict[str, int], script: str) -> Any:
        limits = {k: str(v) for k, v in extended.items()} or None
        return client.V1Container(name=cname, image=env.workload_image, image_pull_policy="Never",
                                  command=["/bin/sh", "-c", script], resources=client.V1ResourceRequirements(
                                      requests={"cpu": "1" if extended else "100m", "memory": "16Mi"}, limits=limits))

    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Never", termination_grace_period_seconds=0, node_selector={"kubernetes.io/hostname": node},
            init_containers=[container("init", init, "env; true")] if init else None,
            containers=[container("main", main, "env; echo ENV-END; exec sleep 3600")])))
    return name


@pytest.fixture()
def made(core: Any, pod_namespace: str) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    delete_pods(core, pod_namespace, names)


def _phase_or_failure(core: Any, namespace: str, name: str) -> str:
    pod = core.read_namespaced_pod(name, namespace)
    if pod.status.phase == "Failed":
        return f"Failed: {pod.status.reason}: {pod.status.message}"
    return pod.status.phase or ""


def _settled(core: Any, namespace: str, name: str) -> Callable[[], str]:
    def check() -> str:
        outcome = _phase_or_failure(core, namespace, name)
        return outcome if outcome == "Running" or outcome.startswith("Failed") else ""

    return check


def test_a_socket_pod_right_after_a_book_pod_is_admitted_elsewhere(core: Any, pod_namespace: str,
                                                                   both_levels: E2EEnv, node: str,
                                                                   made: list[str]) -> None:
    """kubelet's health view lags behind the agent's: the preference must not offer the socket just blocked."""
    env = both_levels
    book, socket = f"{env.prefix}/book", f"{env.prefix}/socket"
    for _ in range(3):
        first = _pod(core, pod_namespace, env, node, {book: 1})
        second = _pod(core, pod_namespace, env, node, {socket: 1})
        made.extend([first, second])
        book_env = running_env(core, pod_namespace, first)
        outcome = wait_for(f"{second} to run or fail", _settled(core, pod_namespace, second), timeout=60,
                           interval=0.3)
        assert outcome == "Running", f"the socket pod admitted right after a book pod: {outcome}"
        socket_env = running_env(core, pod_namespace, second)
        assert not set(socket_env["TOPOLOGY_CPUS"].split(",")) & set(book_env["TOPOLOGY_CPUS"].split(","))
        delete_pods(core, pod_namespace, [first, second])
        made.clear()


def test_a_kubelet_restart_does_not_release_a_held_book(core: Any, pod_namespace: str, both_levels: E2EEnv,
                                                        node: str, exp: Expected, made: list[str]) -> None:
    env = both_levels
    book, socket = f"{env.prefix}/book", f"{env.prefix}/socket"
    sockets = exp.allocatable[book]
    held = _pod(core, pod_namespace, env, node, {book: 1})
    made.append(held)
    running_env(core, pod_namespace, held)
    wait_for(f"{socket} allocatable {sockets - 1}",
             lambda: (core.read_node(node).status.allocatable or {}).get(socket) == str(sockets - 1), timeout=60,
             interval=0.5)
    since = time.time()
    env.restart_kubelet(node)
    # Right after the restart the real kubelet's pod-resources List is empty until the API server has sent the pods
    # back: the agent must not take that for a release. Watch the node for 20 s.
    deadline = time.monotonic() + 20
    seen: set[str] = set()
    while time.monotonic() < deadline:
        seen.add((core.read_node(node).status.allocatable or {}).get(socket, "?"))
        time.sleep(0.5)
    settle_after_kubelet_restart(core, node, since)
    assert str(sockets) not in seen, f"{socket} allocatable was {sorted(seen)} after the restart (a release)"


def test_a_book_held_by_a_plain_init_container_stays_held(core: Any, pod_namespace: str, both_levels: E2EEnv,
                                                          node: str, exp: Expected, made: list[str]) -> None:
    """kubelet keeps an init container's devices for the pod's lifetime; its List no longer shows them."""
    env = both_levels
    book, socket = f"{env.prefix}/book", f"{env.prefix}/socket"
    sockets = exp.allocatable[book]
    name = _pod(core, pod_namespace, env, node, {}, init={book: 1})
    made.append(name)
    running_env(core, pod_namespace, name)
    wait_for(f"{socket} allocatable {sockets - 1} (the init container's book blocks its socket)",
             lambda: (core.read_node(node).status.allocatable or {}).get(socket) == str(sockets - 1), timeout=60,
             interval=0.5)
    # Past the agent's 2 s grace for unlisted holds and a node-status update (10 s): the block must outlast both.
    deadline = time.monotonic() + 15
    seen: set[str] = set()
    while time.monotonic() < deadline:
        seen.add((core.read_node(node).status.allocatable or {}).get(socket, "?"))
        time.sleep(0.5)
    assert seen == {str(sockets - 1)}, f"{socket} allocatable was {sorted(seen)}: the init container's book released"
