"""DRA mode with NRI on the real cluster: a container that uses a ResourceClaim of
this driver is created on its book's CPUs by the agent's NRI plugin (the CDI device's ``TOPOLOGY_DRA_CLAIM`` names
the prepared claim request), so the first line it prints is the book; with the shared pool every other pod stays
off the book from its first line; a variable a pod writes into its own spec is not believed.

Off by default like tests/e2e/test_dra.py; on the local lane with the chart installed and the image built from this
tree::

    TOPOLOGY_E2E_DRA=1 TOPOLOGY_E2E_KUBECONFIG=.cluster/kubeconfig TOPOLOGY_E2E_LANE=local \\
    TOPOLOGY_E2E_SNAPSHOTS=.cluster/snapshots TOPOLOGY_E2E_HELM=.tools/bin/helm \\
    TOPOLOGY_E2E_KUBECTL="$(devkit/cluster/build.sh --print)/kubectl" \\
    TOPOLOGY_E2E_WORKLOAD_IMAGE=localhost/topology-e2e-busybox:latest \\
    .venv/bin/pytest -m e2e tests/e2e/test_dra_nri.py -v -p no:cacheprovider

The module's fixture runs ``helm upgrade`` with DRA mode, ``cpusetEnforcement: nri`` and ``sharedPool: true``, and
puts the release back in device-plugin mode at the end. The node's fake topology is one single-threaded book (with
one socket) per real CPU, so book N is CPU N.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from agent.topology.cpulist import parse_cpulist
from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.dra import DRA_VALUES, DRIVER, agent_pod, agent_ready, allocated_device, claim, delete, slices
from tests.support.e2e.kube import apply, kjson, wait_kubectl

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TOPOLOGY_E2E_DRA") != "1", reason="DRA mode e2e: set TOPOLOGY_E2E_DRA=1"),
]

PODS = "topology-e2e-pods"
FOREIGN = "topology-e2e-dra-foreign"  # a second namespace, for a pod naming the claim of another
FIRST_LINE = "grep Cpus_allowed_list /proc/self/status; echo \"claim=$TOPOLOGY_DRA_CLAIM\"; echo END; exec sleep 3600"


@pytest.fixture(scope="module")
def dra_nri(local: E2EEnv, node: str, pod_namespace: str) -> Iterator[E2EEnv]:
    """The release in DRA mode with NRI enforcement and the shared pool; device-plugin mode again afterwards."""
    local.helm_upgrade(*DRA_VALUES, "--set", "cpusetEnforcement=nri", "--set", "sharedPool=true")
    try:
        wait_kubectl("the agent in DRA mode to be ready", lambda: agent_ready(local) and len(slices(local, node)) == 2,
                     timeout=180)
        wait_kubectl("the agent's NRI plugin synchronized with the runtime",
                     lambda: "NRI: synchronized" in local.kubectl(
                         "-n", local.namespace, "logs", agent_pod(local)["metadata"]["name"]).stdout or None,
                     timeout=60)
        apply(local, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": FOREIGN}})
        wait_kubectl(f"the default service account of {FOREIGN}",
                     lambda: kjson(local, "-n", FOREIGN, "get", "serviceaccount", "default"), timeout=60)
        yield local
    finally:
        local.kubectl("delete", "pods,resourceclaims", "--all", "-n", PODS, "--wait=true", "--ignore-not-found",
                      timeout=120)
        local.kubectl("delete", "namespace", FOREIGN, "--wait=true", "--ignore-not-found", timeout=120)
        local.helm_upgrade()
        wait_kubectl("the agent in device-plugin mode to be ready", lambda: agent_ready(local), timeout=180)


def first_line_pod(name: str, image: str, namespace: str = PODS, claim_name: str | None = None,
                   env: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main", "image": image, "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", FIRST_LINE],
        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}},
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                            "nodeSelector": {"topology-e2e/worker": "true"}}
    if claim_name:
        spec["resourceClaims"] = [{"name": "c", "resourceClaimName": claim_name}]
        container["resources"]["claims"] = [{"name": "c"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def printed(env: E2EEnv, name: str, namespace: str = PODS) -> tuple[str, str]:
    """The pod's first line (its Cpus_allowed_list at its first instruction) and the claim variable it saw."""
    def log() -> Any:
        p = kjson(env, "-n", namespace, "get", "pod", name)
        if p["status"].get("phase") not in ("Running", "Succeeded"):
            return None
        text = env.kubectl("-n", namespace, "logs", name).stdout
        return text if "END" in text else None

    lines = wait_kubectl(f"pod {namespace}/{name} to print its first lines", log, timeout=120).splitlines()
    assert lines[0].startswith("Cpus_allowed_list:"), lines
    return lines[0].split(":", 1)[1].strip(), lines[1].removeprefix("claim=")


def test_a_claims_container_starts_on_its_book_and_plain_pods_stay_off_it(dra_nri: E2EEnv, node: str) -> None:
    apply(dra_nri, claim("nri-book", f"book.{DRIVER}"))
    apply(dra_nri, first_line_pod("nri-book-pod", dra_nri.workload_image, claim_name="nri-book"))
    device = allocated_device(dra_nri, "nri-book")
    uid = kjson(dra_nri, "-n", PODS, "get", "resourceclaim", "nri-book")["metadata"]["uid"]
    book_cpu = device.removeprefix("drawer0-book")  # one CPU per book: book N is CPU N
    first, seen = printed(dra_nri, "nri-book-pod")
    assert first == book_cpu, f"the first instruction ran on {first}, not on the claim's book {book_cpu}"
    assert seen == f"{uid}/r"  # the CDI device's variable, naming the prepared claim request
    logs = dra_nri.kubectl("-n", dra_nri.namespace, "logs", agent_pod(dra_nri)["metadata"]["name"]).stdout
    assert f"pinned {PODS}/nri-book-pod/main at creation: cpuset {book_cpu}" in logs, logs[-2000:]
    apply(dra_nri, first_line_pod("nri-plain", dra_nri.workload_image))
    plain, _ = printed(dra_nri, "nri-plain")
    assert int(book_cpu) not in parse_cpulist(plain), f"a plain pod's first line ran on {plain}, the held book's too"


def test_a_forged_claim_variable_is_not_believed(dra_nri: E2EEnv, node: str) -> None:
    uid = kjson(dra_nri, "-n", PODS, "get", "resourceclaim", "nri-book")["metadata"]["uid"]
    book_cpu = allocated_device(dra_nri, "nri-book").removeprefix("drawer0-book")
    # The real claim's variable, written into the spec of a pod of another namespace.
    apply(dra_nri, first_line_pod("nri-thief", dra_nri.workload_image, namespace=FOREIGN,
                                  env={"TOPOLOGY_DRA_CLAIM": f"{uid}/r"}))
    first, _ = printed(dra_nri, "nri-thief", namespace=FOREIGN)
    assert int(book_cpu) not in parse_cpulist(first), f"a forged variable put a pod on the held book ({first})"
    # A claim nobody prepared, in the claim's own namespace.
    apply(dra_nri, first_line_pod("nri-guess", dra_nri.workload_image, env={"TOPOLOGY_DRA_CLAIM": "made-up/r"}))
    first, _ = printed(dra_nri, "nri-guess")
    assert int(book_cpu) not in parse_cpulist(first), f"an unknown claim put a pod on the held book ({first})"
    delete(dra_nri, "pod/nri-guess")
    dra_nri.kubectl("-n", FOREIGN, "delete", "pod", "nri-thief", "--wait=true", "--ignore-not-found", timeout=120)


def test_the_book_returns_to_the_pool_when_the_claim_is_unprepared(dra_nri: E2EEnv, node: str) -> None:
    book_cpu = allocated_device(dra_nri, "nri-book").removeprefix("drawer0-book")
    delete(dra_nri, "pod/nri-book-pod", "resourceclaim/nri-book")

    def widened() -> Any:
        out = dra_nri.kubectl("-n", PODS, "exec", "nri-plain", "--", "grep", "Cpus_allowed_list",
                              "/proc/self/status").stdout
        allowed = out.split(":", 1)[1].strip()
        return allowed if int(book_cpu) in parse_cpulist(allowed) else None

    allowed = wait_kubectl("the plain pod widened onto the freed book", widened, timeout=60)
    print(f"after the claim was unprepared the plain pod runs on {allowed}")
    delete(dra_nri, "pod/nri-plain")
