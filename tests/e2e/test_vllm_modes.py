"""vLLM as the judge of every mode the chart offers: the one-book server of tests/e2e/test_vllm.py with
NRI enforcement (the container created on its book), through DRA (a ResourceClaim for a book), and a vLLM server
with no topology resource at all, which runs unpinned in the agent's shared pool and never on a held book.

``make e2e-vllm`` runs it (the ``vllm`` marker); each module fixture switches the release and puts it back.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.topology.cpulist import parse_cpulist
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.dra import DRA_VALUES, DRIVER, agent_ready, allocated_device, claim, slices
from tests.support.e2e.kube import apply, wait_kubectl
from tests.support.e2e.vllm import (
    PODS,
    SECCOMP_VALUES,
    complete,
    delete,
    hold_book,
    judge,
    logged_binding,
    logs,
    serve,
    threads,
    unique,
)
from topology_devkit.vllm.server import vllm_pod

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

NRI_VALUES = ("--set", "cpusetEnforcement=nri", "--set", "sharedPool=true")


def _cleanup(env: E2EEnv) -> None:
    env.kubectl("delete", "pods,resourceclaims", "--all", "-n", PODS, "--wait=true", "--ignore-not-found",
                timeout=180)


@pytest.fixture()
def nri(local: E2EEnv, pod_namespace: str) -> Iterator[E2EEnv]:
    """The release with NRI enforcement and the shared pool (and the seccomp profile); the lane's values after."""
    local.helm_upgrade(*SECCOMP_VALUES, *NRI_VALUES)
    try:
        wait_kubectl("the agent's NRI plugin synchronized with the runtime", lambda: agent_ready(local) and (
            "NRI: synchronized" in local.kubectl("-n", local.namespace, "logs", "-l",
                                                 f"app.kubernetes.io/instance={local.release}",
                                                 "--tail=-1").stdout), timeout=120)
        yield local
    finally:
        _cleanup(local)
        local.helm_upgrade()


@pytest.fixture()
def dra(local: E2EEnv, node: str, pod_namespace: str) -> Iterator[E2EEnv]:
    """The release in DRA mode (and the seccomp profile); device-plugin mode again afterwards."""
    local.helm_upgrade(*SECCOMP_VALUES, *DRA_VALUES)
    try:
        wait_kubectl("the agent in DRA mode to be ready", lambda: agent_ready(local) and len(slices(local, node)) == 2,
                     timeout=180)
        yield local
    finally:
        _cleanup(local)
        local.helm_upgrade()
        wait_kubectl("the agent in device-plugin mode to be ready", lambda: agent_ready(local), timeout=180)


def test_one_book_vllm_with_nri_enforcement(nri: E2EEnv, node: str) -> None:
    name = unique("vllm-nri")
    serve(nri, vllm_pod(name, node, books=1, tp=1, prefix=nri.prefix))
    judge(nri, name, books=1)
    delete(nri, "pod", name)


def test_unpinned_vllm_runs_in_the_shared_pool_off_the_held_book(nri: E2EEnv, node: str) -> None:
    """No topology resource: vLLM binds itself (its default ``auto``) inside what it is allowed, which the agent's
    shared pool keeps off a book another pod holds."""
    held = hold_book(nri, node, unique("holder"), nri.prefix)
    name = unique("vllm-unpinned")
    serve(nri, vllm_pod(name, node, books=None, tp=1, cpu="500m"))
    answer = complete(nri, name)
    assert answer["usage"]["completion_tokens"] == 8, answer
    seen = threads(nri, name)
    on_held = [t for t in seen if t.cpus & held]
    assert not on_held, f"unpinned vLLM threads allowed on the held book {sorted(held)}: {on_held[:5]}"
    bound = logged_binding(logs(nri, name))
    assert bound and not frozenset().union(*bound.values()) & held, f"vLLM bound {bound}, the held book is {held}"


def test_one_book_vllm_through_a_dra_claim(dra: E2EEnv, node: str) -> None:
    claim_name = unique("vllm-book")
    apply(dra, claim(claim_name, f"book.{DRIVER}"))
    name = unique("vllm-dra")
    serve(dra, vllm_pod(name, node, books=1, tp=1, claim=claim_name))
    device = allocated_device(dra, claim_name)
    got = judge(dra, name, books=1)
    assert got["TOPOLOGY_GROUPS"] == device, (got["TOPOLOGY_GROUPS"], device)
    assert len(parse_cpulist(got["TOPOLOGY_CPUS"])) == 1
    delete(dra, "pod", name)
