"""The end-to-end suite's waits and its ways to the API server: kubectl (as JSON, apply) and the Kubernetes client
(pods deleted, a node's free CPU), and the environment contract every topology container gets."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

from tests.support.e2e.cluster import E2EEnv
from topology_devkit.testing.wait import wait_until

ENV_CONTRACT = ("TOPOLOGY_CPUS", "TOPOLOGY_GROUPS", "CPU_VISIBLE_MEMORY_NODES", "VLLM_CPU_OMP_THREADS_BIND",
                "TOPOLOGY_RANKS", "OMP_NUM_THREADS", "TOPOLOGY_OMP_NUM_THREADS", "TOPOLOGY_OMP_PLACES",
                "TOPOLOGY_OMP_PLACES_BY_GROUP")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120, interval: float = 2) -> Any:
    """Until ``check`` gives something truthy (:func:`topology_devkit.testing.wait.wait_until`), at the Kubernetes
    client's pace: every 2 s unless told."""
    return wait_until(what, check, timeout, every=interval)


def wait_kubectl(what: str, check: Callable[[], Any], timeout: float = 90, every: float = 0.5) -> Any:
    """Until ``check`` gives something truthy; a kubectl that fails meanwhile (the object is not there yet) counts
    as not yet, and its stderr is the last answer a timeout reports."""
    return wait_until(what, check, timeout, every=every, tolerate=(subprocess.CalledProcessError,))


def delete_pods(core: Any, namespace: str, names: list[str], timeout: float = 90) -> None:
    """Delete the pods and wait until they are gone: the next test must find their devices free."""
    from kubernetes.client.exceptions import ApiException

    for name in names:
        try:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def gone() -> bool:
        left = {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
        return not left & set(names)

    wait_for(f"pods {names} to be deleted", gone, timeout=timeout, interval=0.5)


def cpu_millis(quantity: str | None) -> int:
    if not quantity:
        return 0
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def free_cpu_millis(core: Any, node: str) -> int:
    """The node's allocatable CPU less what its running and pending pods request."""
    total = cpu_millis(core.read_node(node).status.allocatable["cpu"])
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    used = sum(cpu_millis((c.resources.requests or {}).get("cpu")) for p in pods
               if p.status.phase not in ("Succeeded", "Failed") for c in p.spec.containers if c.resources)
    return total - used


def kjson(env: E2EEnv, *args: str) -> Any:
    return json.loads(env.kubectl(*args, "-o", "json").stdout)


def apply(env: E2EEnv, doc: dict[str, Any]) -> None:
    subprocess.run([os.environ.get("TOPOLOGY_E2E_KUBECTL") or "kubectl", "--kubeconfig", str(env.kubeconfig),
                    "apply", "-f", "-"], input=json.dumps(doc), text=True, check=True, capture_output=True,
                   timeout=60)
