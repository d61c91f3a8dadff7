"""The example workloads: valid Kubernetes objects that follow the topology contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.node import seccomp
from agent.policy.allocation import BINDING_ENV_KEYS
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.embedded import load_embedded
from tests.support.chart import FLOOR
from tests.support.env import REPO

EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
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
        kubernetes_validate.validate(doc, FLOOR, strict=True)


def test_the_openmp_example_binds_through_the_one_line_wrapper() -> None:
    (doc,) = list(yaml.safe_load_all((REPO / "deploy/examples/openmp-one-socket.yaml").read_text()))
    (c,) = containers(doc)
    assert 'OMP_PLACES="$TOPOLOGY_OMP_PLACES" OMP_PROC_BIND=close exec ' in c["command"][-1]
    assert not [e for e in c.get("env", []) if e["name"] in BINDING_ENV_KEYS]


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "vllm" in p.name], ids=lambda p: p.name)
def test_vllm_examples_use_the_shipped_seccomp_profile(path: Path) -> None:
    (doc,) = list(yaml.safe_load_all(path.read_text()))
    (c,) = containers(doc)
    profile = c["securityContext"]["seccompProfile"]
    assert profile == {"type": "Localhost", "localhostProfile": f"profiles/{seccomp.PROFILE_NAME}"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_cpu_requests_match_the_groups_of_the_named_machine(path: Path) -> None:
    """The comments name the vLLM PR #40714 machine: the cpu request is exactly its groups' CPUs."""
    assert "PR #40714" in path.read_text()
    grouping = group_topology(load_embedded("pr40714"), GroupingSettings(levels=("book", "socket")))
    (doc,) = list(yaml.safe_load_all(path.read_text()))
    for c in containers(doc):
        requests = c["resources"]["requests"]
        (resource,) = [k for k in requests if k.startswith("topology/")]
        sizes = {len(g.cpus) for g in grouping.by_resource(resource)}
        assert len(sizes) == 1
        assert int(requests["cpu"]) == sizes.pop() * requests[resource]
