"""Node labels and the topology annotation (pure): embedded snapshots in, valid label values out."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.node.labels import (
    ANNOTATION_KEYS,
    KEY_PREFIX,
    LABEL_KEYS,
    MAX_ANNOTATION_BYTES,
    TOPOLOGY_ANNOTATION,
    is_valid_label_value,
    node_annotations,
    node_labels,
)
from agent.policy.grouping import Grouping, group_topology
from agent.topology.embedded import embedded_snapshot_names, load_embedded
from agent.topology.model import Cpu, Machine, Topology

P = KEY_PREFIX
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _snapshot(name: str) -> tuple[Topology, Grouping]:
    topology = load_embedded(name)
    return topology, group_topology(topology)


def _assert_valid(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        assert key in LABEL_KEYS, key
        assert is_valid_label_value(value), (key, value)
        assert value, key  # never empty: selectors want a value


def test_z16_lpar_labels() -> None:
    topology, grouping = _snapshot("z16-lpar")
    assert node_labels(topology, grouping, "none") == {
        f"{P}machine": "z16",
        f"{P}machine-type": "3931",
        f"{P}books": "8",
        f"{P}sockets": "0",
        f"{P}smt": "2",
        f"{P}polarization": "horizontal",
        f"{P}fidelity": "lpar",
        f"{P}environment": "lpar",
        f"{P}cpu-manager-policy": "none",
        f"{P}advertised": "true",
    }


def test_guest_without_topology_advertises_nothing() -> None:
    topology, grouping = _snapshot("z16-guest-no-topology")
    labels = node_labels(topology, grouping, None)
    assert labels[f"{P}advertised"] == "no-topology-facility"
    summary = json.loads(node_annotations(topology, grouping)[TOPOLOGY_ANNOTATION])
    assert summary["notAdvertised"]["code"] == "no-topology-facility"
    assert summary["notAdvertised"]["reason"].startswith("degenerate topology: no topology facility (z/VM guest")
    assert labels[f"{P}fidelity"] == "guest-no-topology"
    assert labels[f"{P}books"] == "0"
    assert labels[f"{P}sockets"] == "0"
    assert labels[f"{P}environment"] == "zvm"
    assert labels[f"{P}smt"] == "1"
    assert labels[f"{P}cpu-manager-policy"] == "unknown"  # no state file
    _assert_valid(labels)


def test_pr40714_two_books_advertised() -> None:
    topology, grouping = _snapshot("pr40714")
    labels = node_labels(topology, grouping, "static")
    assert labels[f"{P}books"] == "2"  # the one-core book is too small to advertise
    assert labels[f"{P}sockets"] == "0"
    assert labels[f"{P}machine"] == "z16"
    assert labels[f"{P}cpu-manager-policy"] == "static"
    _assert_valid(labels)


def test_socket_level_counted() -> None:
    topology = load_embedded("pr40714")
    from agent.policy.grouping import GroupingSettings

    grouping = group_topology(topology, GroupingSettings(levels=("book", "socket"), min_group_cores=0))
    labels = node_labels(topology, grouping, "none")
    assert labels[f"{P}books"] == "3"
    assert int(labels[f"{P}sockets"]) == len(grouping.by_resource("topology/socket")) > 0


def test_vertical_polarization() -> None:
    topology, grouping = _snapshot("z16-vertical")
    assert node_labels(topology, grouping, "none")[f"{P}polarization"] == "vertical"


@pytest.mark.parametrize("name", embedded_snapshot_names())
@pytest.mark.parametrize("policy", [None, "none", "static", "", "Some Future/Policy!"])
def test_every_snapshot_gives_valid_labels(name: str, policy: str | None) -> None:
    topology, grouping = _snapshot(name)
    labels = node_labels(topology, grouping, policy)
    _assert_valid(labels)
    assert set(labels) == set(LABEL_KEYS)  # machine-type is known for every shipped snapshot


def test_non_s390_machine() -> None:
    topology = Topology(Machine(arch="x86_64", environment="none", topology_facility=None),
                        (Cpu(0, core=0, socket=0, siblings=(0,)), Cpu(1, core=1, socket=0, siblings=(1,))))
    grouping = group_topology(topology)
    labels = node_labels(topology, grouping, "none")
    assert labels[f"{P}machine"] == "x86_64"
    assert f"{P}machine-type" not in labels  # unknown: omitted
    assert labels[f"{P}fidelity"] == "generic"
    assert labels[f"{P}environment"] == "none"
    assert labels[f"{P}polarization"] == "unknown"
    assert labels[f"{P}advertised"] == "not-ibm-z"
    _assert_valid(labels)


def test_s390_of_unknown_type_is_labelled_by_arch() -> None:
    topology = dataclasses.replace(load_embedded("z16-lpar"),
                                   machine=Machine(arch="s390x", machine_type="9999", environment="lpar",
                                                   topology_facility=True, dispatching="horizontal"))
    labels = node_labels(topology, group_topology(topology), "none")
    assert labels[f"{P}machine"] == "s390x"
    assert labels[f"{P}machine-type"] == "9999"


def test_label_keys_are_ours_and_valid() -> None:
    assert len(set(LABEL_KEYS)) == len(LABEL_KEYS)
    for key in (*LABEL_KEYS, *ANNOTATION_KEYS):
        prefix, _, name = key.partition("/")
        assert key.startswith(P)
        assert len(prefix) <= 253 and len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name), key


@given(environment=st.text(max_size=80), machine_type=st.none() | st.text(max_size=80),
       policy=st.none() | st.text(max_size=80), dispatching=st.text(max_size=20))
def test_any_strings_give_valid_label_values(environment: str, machine_type: str | None, policy: str | None,
                                             dispatching: str) -> None:
    topology = Topology(Machine(arch="s390x", machine_type=machine_type, environment=environment,
                                dispatching=dispatching))
    labels = node_labels(topology, group_topology(topology), policy)
    _assert_valid(labels)


@pytest.mark.parametrize(("value", "valid"), [
    ("z16", True), ("guest-no-topology", True), ("a.b_c-d", True), ("", True), ("x" * 63, True),
    ("x" * 64, False), ("-a", False), ("a-", False), ("a b", False), ("a/b", False), ("é", False),
])
def test_is_valid_label_value(value: str, valid: bool) -> None:
    assert is_valid_label_value(value) is valid


def test_annotation_summarises_groups() -> None:
    topology, grouping = _snapshot("z16-lpar")
    annotations = node_annotations(topology, grouping)
    assert list(annotations) == [TOPOLOGY_ANNOTATION] == list(ANNOTATION_KEYS)
    summary = json.loads(annotations[TOPOLOGY_ANNOTATION])
    assert summary["version"] == 1
    assert summary["machine"] == {
        "arch": "s390x", "type": "3931", "generation": "z16", "environment": "lpar", "topologyFacility": True,
        "dispatching": "horizontal", "smtThreads": 2, "memoryNodes": [0],
    }
    assert summary["fidelity"] == "lpar"
    assert summary["levels"] == ["book"]
    assert summary["groups"][0] == {"resource": "topology/book", "id": "drawer0-book0", "cpus": "0-11",
                                    "memoryNode": 0}
    assert [g["id"] for g in summary["groups"]] == [g.id for g in grouping.groups]
    assert "truncated" not in summary
    assert " " not in annotations[TOPOLOGY_ANNOTATION].replace(summary["levelReason"], "")  # compact


def test_annotation_lists_skipped_reasons() -> None:
    topology, grouping = _snapshot("z16-guest-no-topology")
    summary = json.loads(node_annotations(topology, grouping)[TOPOLOGY_ANNOTATION])
    assert summary["groups"] == []
    assert summary["skipped"] == [{"cpus": "0-7", "reason": grouping.skipped[0].reason}]
    assert "degenerate topology" in summary["levelReason"]


def test_annotation_is_deterministic() -> None:
    # Same input, same bytes: otherwise a steady-state sync would write every time.
    a = node_annotations(*_snapshot("z16-400"))
    b = node_annotations(*_snapshot("z16-400"))
    assert a == b
    assert len(a[TOPOLOGY_ANNOTATION].encode()) < 8 * 1024  # 400 CPUs, 16 books


def test_huge_annotation_is_cut_below_the_limit() -> None:
    topology, grouping = _snapshot("z16-lpar")
    template = grouping.groups[0]
    # 1000 groups of scattered CPUs (~400 KB of cpulists): far beyond any machine; the summary must still fit.
    groups = tuple(dataclasses.replace(template, id=f"drawer0-book{i}", cpus=tuple(range(i, i + 200, 2)))
                   for i in range(1000))
    big = dataclasses.replace(grouping, groups=groups)
    text = node_annotations(topology, big)[TOPOLOGY_ANNOTATION]
    assert len(text.encode()) <= MAX_ANNOTATION_BYTES < 256 * 1024
    summary = json.loads(text)
    assert summary["truncated"] is True
    assert summary["groupCounts"] == {"topology/book": 1000}
    assert summary["machine"]["generation"] == "z16"
