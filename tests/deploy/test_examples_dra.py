"""deploy/examples/dra: valid Kubernetes 1.37 objects, and their CEL selectors pick what their comments promise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from celpy.adapter import json_to_cel

from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.resource_slices import DRIVER, SliceSettings, build_pool
from agent.topology.embedded import load_embedded
from tests.support.env import REPO

EXAMPLES = sorted((REPO / "deploy" / "examples" / "dra").glob("*.yaml"))


def test_the_dra_examples() -> None:
    assert {p.name for p in EXAMPLES} == {"one-book-min-cores.yaml", "two-books-one-drawer.yaml",
                                          "pod-topology-book.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_validate(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, "1.37", strict=True)


def cel_device(device: dict[str, Any]) -> Any:
    attrs = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
    return json_to_cel({"driver": DRIVER, "attributes": {DRIVER: attrs}})


def matches(expression: str, device: dict[str, Any]) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return bool(program.evaluate({"device": cel_device(device)}))


def test_min_cores_selector_skips_the_small_book_of_pr40714() -> None:
    template = next(yaml.safe_load_all((REPO / "deploy/examples/dra/one-book-min-cores.yaml").read_text()))
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    expression = request["selectors"][0]["cel"]["expression"]
    topology = load_embedded("pr40714")
    grouping = group_topology(topology, GroupingSettings(levels=("book",), min_group_cores=0))
    books = build_pool(grouping, topology, SliceSettings("n")).devices
    assert [d["name"] for d in books if matches(expression, d)] == ["drawer0-book0", "drawer0-book1"]
    assert [d["name"] for d in books if not matches(expression, d)] == ["drawer0-book2"]


def test_two_books_constraint_names_the_drawer_attribute() -> None:
    template = next(yaml.safe_load_all((REPO / "deploy/examples/dra/two-books-one-drawer.yaml").read_text()))
    (constraint,) = template["spec"]["spec"]["devices"]["constraints"]
    assert constraint["matchAttribute"] == f"{DRIVER}/drawer"
    topology = load_embedded("z16-lpar")
    devices = build_pool(group_topology(topology, GroupingSettings(levels=("book",))), topology,
                         SliceSettings("n")).devices
    assert all("drawer" in d["attributes"] for d in devices)
