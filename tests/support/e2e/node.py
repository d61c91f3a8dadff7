"""A real node's side of the end-to-end suite: its kubelet's root and pod-resources, the agent pod on it and its
metrics, pods that print their environment, and a restarted kubelet waited for until it has its pods again."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import wait_for

# kubelet's --root-dir on the node (the local lane's KUBELET_ROOT, which e2e.sh passes on), and its device-plugin
# directory, which does not follow the root (docs/admin/kubelet-roots.md).
KUBELET_ROOT = Path(os.environ.get("TOPOLOGY_E2E_KUBELET_ROOT") or "/var/lib/kubelet")
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")


POD_RESOURCES = KUBELET_ROOT / "pod-resources" / "kubelet.sock"


AGENT_PREFIX = "topology.s390x.ibm.com"
STATE_DIR = DEVICE_PLUGINS / "s390x-topology-agent"  # the agent's state files, a folder per resource prefix


def agent_pod(core: Any, env: E2EEnv, node: str, timeout: float = 120) -> Any:
    """The Ready agent pod on ``node``."""
    def ready() -> Any:
        pods = core.list_namespaced_pod(env.namespace, field_selector=f"spec.nodeName={node}",
                                        label_selector=f"app.kubernetes.io/instance={env.release}").items
        for pod in pods:
            statuses = pod.status.container_statuses or []
            if pod.metadata.deletion_timestamp is None and statuses and all(s.ready for s in statuses):
                return pod
        return None

    return wait_for(f"the agent pod on {node} to be Ready", ready, timeout=timeout, interval=0.5)


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def metrics(pod: Any) -> str:
    port = next(p.container_port for p in pod.spec.containers[0].ports if p.name == "metrics")
    return http_get(f"http://{pod.status.pod_ip}:{port}/metrics")[1]


def metric(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and (labels or {}).items() <= sample.labels.items():
                return float(sample.value)
    return None


def pod_resources() -> dict[tuple[str, str, str], dict[str, list[str]]]:
    """The real kubelet's pod-resources List: (namespace, pod, container) -> resource -> device ids."""
    import grpc

    from agent._proto.podresources.v1 import api_pb2, api_pb2_grpc

    with grpc.insecure_channel(f"unix://{POD_RESOURCES}") as channel:
        answer = api_pb2_grpc.PodResourcesListerStub(channel).List(api_pb2.ListPodResourcesRequest(), timeout=10)
    held: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for pod in answer.pod_resources:
        for container in pod.containers:
            devices = {d.resource_name: sorted(d.device_ids) for d in container.devices if d.device_ids}
            if devices:
                held[(pod.namespace, pod.name, container.name)] = devices
    return held


def running_env(core: Any, namespace: str, name: str, timeout: float = 90) -> dict[str, str]:
    def run() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase == "Failed":
            pytest.fail(f"pod {name} failed: {pod.status.reason}: {pod.status.message}")
        return pod if pod.status.phase == "Running" else None

    wait_for(f"pod {name} to run", run, timeout=timeout, interval=0.3)
    log = wait_for(f"pod {name} to print its environment",
                   lambda: (text := core.read_namespaced_pod_log(name, namespace)) and "ENV-END" in text and text,
                   interval=0.3)
    return dict(line.split("=", 1) for line in log.split("ENV-END")[0].splitlines() if "=" in line)


def proc_status(env: E2EEnv, namespace: str, pod: str, field: str) -> str:
    """A field of the container's PID 1 /proc status via kubectl exec ("" while exec does not answer yet)."""
    try:
        out = env.kubectl("exec", "-n", namespace, pod, "--", "grep", f"^{field}:", "/proc/1/status").stdout
    except subprocess.CalledProcessError:
        return ""
    return out.split(":", 1)[1].strip()


def pinned_to(env: E2EEnv, namespace: str, pod: str, cpus: str | None) -> Callable[[], bool]:
    """A condition: the pod's cpuset reads ``cpus`` (None: reads at all)."""
    def check() -> bool:
        seen = proc_status(env, namespace, pod, "Cpus_allowed_list")
        return bool(seen) and (cpus is None or seen == cpus)

    return check


def _klog_seconds(line: str) -> float:
    """Seconds of the day of a klog line (``I1204 23:10:57.568356 ...``)."""
    hours, minutes, seconds = line.split()[1].split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def registration_latency(log: Path, resource: str) -> float:
    """In the last start of kubelet in ``log``: seconds from its device-plugin registration server's start to the
    registration request for ``resource`` (kubelet's ``server.go`` lines)."""
    lines = log.read_text(errors="replace").split("\n==== ")[-1].splitlines()
    started = next(_klog_seconds(line) for line in lines if "Starting device plugin registration server" in line)
    asked = next(_klog_seconds(line) for line in lines
                 if "Got registration request from device plugin" in line and f'resourceName="{resource}"' in line)
    return asked - started


def settle_after_kubelet_restart(core: Any, node: str, since: float) -> None:
    """Wait until the restarted kubelet has the API server's pods again.

    Until then it is not safe to admit a pod: kubelet's device manager keeps every checkpointed allocation,
    even of pods deleted meanwhile, while its pod sources are not ready (devicemanager/manager.go,
    UpdateAllocatedDevices: ``if !m.sourcesReady.AllReady() { return }``), and answers a new pod with
    UnexpectedAdmissionError "requested number of devices unavailable". Ready means the node's Ready heartbeat is
    newer than the restart and pod-resources lists every running pod that holds a device.
    """
    def settled() -> bool:
        ready = [c for c in core.read_node(node).status.conditions or [] if c.type == "Ready"]
        if not ready or ready[0].status != "True" or ready[0].last_heartbeat_time.timestamp() < int(since):
            return False
        listed = {(k[0], k[1]) for k in pod_resources()}
        holders = {(p.metadata.namespace, p.metadata.name)
                   for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
                   if p.status.phase == "Running" and any(
                       r.startswith("topology/") for c in p.spec.containers
                       for r in ((c.resources.limits or {}) if c.resources else {}))}
        return holders <= listed

    wait_for(f"the restarted kubelet on {node} to settle", settled, timeout=90, interval=0.5)


def book_pods_running(core: Any, namespace: str, pods: Callable[..., str], env: E2EEnv, count: int,
                      ) -> list[tuple[str, dict[str, str]]]:
    book = f"{env.prefix}/book"
    made = [pods({book: 1}) for _ in range(count)]
    return [(name, running_env(core, namespace, name)) for name in made]


def ours(core: Any, node: str) -> dict[str, str]:
    """The node's topology.s390x.ibm.com/ labels and annotations."""
    meta = core.read_node(node).metadata
    keys = {**(meta.labels or {}), **(meta.annotations or {})}
    return {k: v for k, v in keys.items() if k.startswith(f"{AGENT_PREFIX}/")}


def device_state(pod: Any, device: str) -> str:
    """What the agent ``pod``'s /allocations says of ``device`` (allocated, free, ...; "" when it lists none)."""
    status = json.loads(http_get(f"http://{pod.status.pod_ip}:9400/allocations")[1])
    return next((d["state"] for d in status["devices"] if d["id"] == device), "")
