"""``cpusetEnforcement: auto`` (the chart's default) on the real runtime: the lane's containerd 2.4 and CRI-O 1.34 both
have NRI on by default, so ``auto`` enforces through NRI (``/readyz`` and ``topology_agent_cpuset_enforcement_mode``
say so, naming the runtime that configured it), and a book pod's first instruction runs on its book.

Local lane only (it changes the release); the release is put back afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.snapshots import Expected
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import wait_for
from tests.support.e2e.node import agent_pod, http_get, metric, metrics
from tests.support.e2e.nri import first_cpus_line

pytestmark = pytest.mark.e2e

RUNTIME_NAMES = {"containerd": "containerd", "crio": "cri-o"}  # what each says in NRI's Configure


@pytest.fixture(scope="module")
def auto(core: Any, local: E2EEnv, node: str) -> Iterator[E2EEnv]:
    local.helm_upgrade("--set", "cpusetEnforcement=auto", "--set", "sharedPool=true")
    try:
        yield local
    finally:
        local.helm_upgrade()


def test_auto_enforces_through_the_runtimes_nri_and_pins_at_creation(core: Any, pod_namespace: str, auto: E2EEnv,
                                                                     node: str, exp: Expected,
                                                                     made: list[str]) -> None:
    wait_for("auto to choose NRI", lambda: metric(metrics(agent_pod(core, auto, node)),
                                                   "topology_agent_cpuset_enforcement_mode", {"mode": "nri"}) == 1,
             timeout=60, interval=0.5)
    agent = agent_pod(core, auto, node)
    port = next(p.container_port for p in agent.spec.containers[0].ports if p.name == "metrics")
    said = f"registered with {RUNTIME_NAMES[auto.runtime]}"
    ready = wait_for(f"/readyz to say {said}", lambda: (
        text := http_get(f"http://{agent.status.pod_ip}:{port}/readyz")[1]) and said in text and text,
        timeout=30, interval=0.5)
    print(f"/readyz: {ready.strip()}")
    book = f"{auto.prefix}/book"
    name, cpus = first_cpus_line(core, pod_namespace, auto, node, {book: 1})
    made.append(name)
    assert cpus in exp.cpulists(book), f"the first instruction ran on {cpus}, not on one book"
