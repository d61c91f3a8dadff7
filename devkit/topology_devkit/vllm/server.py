"""A vLLM server pod of the real-cluster lane: the shipped example (deploy/examples/vllm-*.yaml) with the lane's image
(:mod:`topology_devkit.vllm.image`), its tiny model and sizes. The e2e suite and the vLLM bench run it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from topology_devkit.vllm.image import MODEL_DIR
from topology_devkit.vllm.image import VLLM_IMAGE as BUILT_IMAGE

REPO = Path(__file__).resolve().parents[3]
VLLM_IMAGE = os.environ.get("TOPOLOGY_E2E_VLLM_IMAGE", BUILT_IMAGE)  # the lane passes the image it imported
MODEL = MODEL_DIR
PORT = 8000
NAMESPACE = "topology-e2e-pods"  # the e2e suite's pods


def vllm_pod(name: str, node: str, books: int | None, tp: int, cpu: str = "1", claim: str | None = None,
             prefix: str = "topology", namespace: str = NAMESPACE) -> dict[str, Any]:
    """The shipped example for ``books`` books (one book's for None) with the lane's image, model and sizes.

    ``books=None``: no topology resource at all (an unpinned server); ``claim``: the book comes from that
    ResourceClaim (DRA) instead of ``topology/book``. A /dev/shm of memory (vLLM's workers exchange tensors through
    it; the runtime's 64 MiB is too small) and a readiness probe on vLLM's /health.
    """
    example = "vllm-tp2-two-books.yaml" if books == 2 else "vllm-one-book.yaml"
    doc: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "examples" / example).read_text())
    spec = doc["spec"]
    (container,) = spec["containers"]
    doc["metadata"] = {"name": name, "namespace": namespace, "labels": {"app": "vllm-e2e"}}
    spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    spec["restartPolicy"] = "Never"
    spec["terminationGracePeriodSeconds"] = 5
    container["image"] = VLLM_IMAGE
    container["imagePullPolicy"] = "Never"
    container["command"] = ["vllm", "serve", MODEL]
    container["args"] = ["--served-model-name", "tiny", "--max-model-len", "256", "--enforce-eager",
                         "--host", "0.0.0.0", "--port", str(PORT), "--tensor-parallel-size", str(tp)]
    container["env"] = [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}]
    container["ports"] = [{"containerPort": PORT, "name": "http"}]
    requests: dict[str, Any] = {"cpu": cpu, "memory": "1Gi"}
    limits: dict[str, Any] = {"memory": f"{3 + 2 * tp}Gi"}
    if books is not None and claim is None:
        requests[f"{prefix}/book"] = books
        limits[f"{prefix}/book"] = books
    container["resources"] = {"requests": requests, "limits": limits}
    if claim is not None:
        spec["resourceClaims"] = [{"name": "book", "resourceClaimName": claim}]
        container["resources"]["claims"] = [{"name": "book"}]
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]
    container["readinessProbe"] = {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 2,
                                   "timeoutSeconds": 2, "failureThreshold": 3}
    return doc
