"""Pinning at creation through NRI on the real cluster (issue 21): the release upgraded to
``cpusetEnforcement: nri`` with ``sharedPool: true``, the lane's containerd 2.4.2 (NRI on by default) creates each
container with its cpuset already set, so the very first line a container prints is its final cpuset.

Local lane only (it changes the release); the release is put back afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent.topology.cpulist import parse_cpulist
from tests.e2e.conftest import E2EEnv
from tests.e2e.snapshots import Expected
from tests.e2e.test_e2e import delete_pods, wait_for
from tests.e2e.test_real_node import agent_pod, metric, metrics

pytestmark = pytest.mark.e2e
FIRST_LINE = "grep Cpus_allowed_list /proc/self/status; echo END; exec sleep 3600"


@pytest.fixture(scope="module")
def nri(core: Any, local: E2EEnv, node: str) -> Iterator[E2EEnv]:
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


def _first_line(core: Any, namespace: str, env: E2EEnv, node: str, extended: dict[str, int],
                annotations: dict[str, str] | None = None) -> tuple[str, str]:
    from kubernetes import client

    name = f"nri-{uuid.uuid4().hex[:8]}"
    limits = {k: str(v) for k, v in extended.items()} or None
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        spec=client.V1PodSpec(
            restart_policy="Never", termination_grace_period_seconds=0, node_selector={"kubernetes.io/hostname": node},
            containers=[client.V1Container(
                name="main", image=env.workload_image, image_pull_policy="Never", command=["/bin/sh", "-c", FIRST_LINE],
                resources=client.V1ResourceRequirements(requests={"cpu": "1" if extended else "100m",
                                                                  "memory": "16Mi"}, limits=limits))])))
    log = wait_for(f"{name} to print its first line", lambda: (
        text := core.read_namespaced_pod_log(name, namespace) if core.read_namespaced_pod(
            name, namespace).status.phase in ("Running", "Succeeded") else "") and "END" in text and text,
        timeout=90, interval=0.3)
    first = log.splitlines()[0]
    assert first.startswith("Cpus_allowed_list:"), log
    return name, first.split(":", 1)[1].strip()


@pytest.fixture()
def made(core: Any, pod_namespace: str) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    delete_pods(core, pod_namespace, names)


def test_a_book_pods_first_line_shows_its_book(core: Any, pod_namespace: str, nri: E2EEnv, node: str,
                                               exp: Expected, made: list[str]) -> None:
    book = f"{nri.prefix}/book"
    name, cpus = _first_line(core, pod_namespace, nri, node, {book: 1})
    made.append(name)
    assert cpus in exp.cpulists(book), f"the first instruction ran on {cpus}, not on one book"


def test_a_plain_pod_never_runs_on_a_held_book(core: Any, pod_namespace: str, nri: E2EEnv, node: str,
                                               exp: Expected, made: list[str]) -> None:
    book = f"{nri.prefix}/book"
    held, held_cpus = _first_line(core, pod_namespace, nri, node, {book: 1})
    made.append(held)
    plain, plain_cpus = _first_line(core, pod_namespace, nri, node, {})
    made.append(plain)
    overlap = set(parse_cpulist(plain_cpus)) & set(parse_cpulist(held_cpus))
    assert not overlap, f"a plain pod's first line ran on {plain_cpus}, which includes the held book {held_cpus}"
    assert agent_pod(core, nri, node)
