"""The example workloads: valid Kubernetes objects that follow the topology contract."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))


def containers(doc: dict) -> list[dict]:
    spec = doc["spec"]
    pod_spec = spec["template"]["spec"] if "template" in spec else spec
    return pod_spec["containers"]


def test_there_are_three_examples() -> None:
    assert {p.name for p in EXAMPLES} == {"vllm-one-book.yaml", "vllm-tp2-two-books.yaml", "openmp-one-socket.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_container_asks_for_one_topology_resource_and_integer_cpu(path: Path) -> None:
    (doc,) = list(yaml.safe_load_all(path.read_text()))
    for c in containers(doc):
        requests = c["resources"]["requests"]
        topo = [k for k in requests if k.startswith("topology/")]
        assert len(topo) == 1, "one topology resource per container: book and socket set the same variables"
        assert c["resources"]["limits"][topo[0]] == requests[topo[0]]
        assert str(requests["cpu"]).isdigit()
    if "vllm" in path.name:
        (c,) = containers(doc)
        assert "SYS_NICE" in c["securityContext"]["capabilities"]["add"]
        assert c["securityContext"]["seccompProfile"]["type"] != "RuntimeDefault"
        tp = c["args"][c["args"].index("--tensor-parallel-size") + 1]
        assert int(tp) == c["resources"]["requests"]["topology/book"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_kubernetes_schema(path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
