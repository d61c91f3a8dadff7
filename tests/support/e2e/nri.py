"""Pinning at creation through NRI on the local lane: the release upgraded to NRI with the shared pool, and pods
whose first line shows the cpuset they were created with (the fixtures ``nri`` and ``made`` are in
tests/e2e/conftest.py)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.support.e2e.cluster import E2EEnv
from tests.support.e2e.kube import wait_for

FIRST_LINE = "grep Cpus_allowed_list /proc/self/status; echo END; exec sleep 3600"


def first_cpus_line(core: Any, namespace: str, env: E2EEnv, node: str, extended: dict[str, int],
                    annotations: dict[str, str] | None = None) -> tuple[str, str]:
    """A new pod on ``node`` asking for ``extended``: its name and the CPUs its very first line ran on."""
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
