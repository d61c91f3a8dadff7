"""kubelet's CPU manager checkpoint, reservedSystemCPUs, and the warnings when they clash with our groups."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.errors import CpuManagerStateError, KubeletConfigError
from agent.node.cpu_manager import (
    CpuManagerState,
    cpu_manager_findings,
    parse_cpu_manager_state,
    read_cpu_manager_state,
    read_reserved_system_cpus,
)
from agent.policy.grouping import Grouping, group_topology
from agent.topology.embedded import load_embedded

STATIC = ('{"policyName":"static","defaultCpuSet":"0-1,6-7",'
          '"entries":{"pod-a":{"app":"2-5"},"pod-b":{"sidecar":"12,14","main":"13"}},"checksum":1234567}')
NONE = '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}'


@pytest.fixture(scope="module")
def z16() -> Grouping:
    return group_topology(load_embedded("z16-lpar"))  # books: drawer0-book0 = 0-11, drawer0-book1 = 12-21, ...


def test_parse_static() -> None:
    state = parse_cpu_manager_state(STATIC)
    assert state == CpuManagerState(
        policy="static",
        default_cpus=(0, 1, 6, 7),
        exclusive={"pod-a": {"app": (2, 3, 4, 5)}, "pod-b": {"sidecar": (12, 14), "main": (13,)}},
    )
    assert state.exclusive_cpus == (2, 3, 4, 5, 12, 13, 14)


def test_parse_none() -> None:
    state = parse_cpu_manager_state(NONE)
    assert state == CpuManagerState(policy="none", default_cpus=(), exclusive={})
    assert state.exclusive_cpus == ()


def test_parse_static_without_entries() -> None:
    state = parse_cpu_manager_state('{"policyName":"static","defaultCpuSet":"0-3"}')
    assert state.exclusive == {} and state.default_cpus == (0, 1, 2, 3)


@pytest.mark.parametrize(("text", "message"), [
    ("", "not JSON"),
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"defaultCpuSet":""}', "policyName"),
    ('{"policyName":"","defaultCpuSet":""}', "policyName"),
    ('{"policyName":"static","defaultCpuSet":"0-x"}', "defaultCpuSet"),
    ('{"policyName":"static","defaultCpuSet":7}', "defaultCpuSet must be a CPU list string"),
    ('{"policyName":"static","defaultCpuSet":"","entries":[]}', "entries must be an object"),
    ('{"policyName":"static","defaultCpuSet":"","entries":{"c1":"0-1"}}', "pre-1.18"),
    ('{"policyName":"static","defaultCpuSet":"","entries":{"p":{"c":"5-2"}}}', "entries['p']['c']"),
])
def test_malformed_state(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_cpu_manager_state(text)
    assert isinstance(info.value, CpuManagerStateError)
    assert message in str(info.value)


def test_read_absent_file_is_none(tmp_path: Path) -> None:
    assert read_cpu_manager_state(tmp_path / "cpu_manager_state") is None


def test_read_file(tmp_path: Path) -> None:
    path = tmp_path / "cpu_manager_state"
    path.write_text(STATIC)
    state = read_cpu_manager_state(path)
    assert state is not None and state.policy == "static"


def test_read_malformed_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "cpu_manager_state"
    path.write_text('{"policyName": "static", "defaultCpuSet": "oops"}')
    with pytest.raises(CpuManagerStateError, match=r"cpu_manager_state: defaultCpuSet"):
        read_cpu_manager_state(path)


def test_read_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "cpu_manager_state"
    path.mkdir()  # a directory: open() fails with an OSError other than "not found"
    with pytest.raises(CpuManagerStateError, match="cannot read"):
        read_cpu_manager_state(path)


def test_static_policy_warns_what_breaks_and_what_to_do(z16: Grouping) -> None:
    findings = cpu_manager_findings(parse_cpu_manager_state('{"policyName":"static","defaultCpuSet":"0-81"}'), z16)
    (warning,) = findings
    assert "static" in warning
    assert "Guaranteed" in warning  # who gets pinned
    assert "fails or lands on other CPUs" in warning  # what goes wrong
    assert "cpuManagerPolicy: none" in warning  # fix 1
    assert "out of the Guaranteed QoS class" in warning  # fix 2 (integer cpu requests stay: the admission policy)


def test_exclusive_cpus_overlapping_groups_are_named(z16: Grouping) -> None:
    findings = cpu_manager_findings(parse_cpu_manager_state(STATIC), z16)
    assert len(findings) == 2
    overlap = findings[1]
    assert "CPUs 2-5,12-14 exclusively" in overlap
    assert "topology/book drawer0-book0 (CPUs 2-5)" in overlap
    assert "topology/book drawer0-book1 (CPUs 12-14)" in overlap
    assert "pod pod-a container app: 2-5" in overlap
    assert "drawer0-book2" not in overlap


def test_none_policy_has_nothing_to_say(z16: Grouping) -> None:
    assert cpu_manager_findings(parse_cpu_manager_state(NONE), z16) == []
    assert cpu_manager_findings(None, z16) == []


def test_reserved_system_cpus_overlap(z16: Grouping) -> None:
    (finding,) = cpu_manager_findings(None, z16, reserved_system_cpus=(0, 1))
    assert "reservedSystemCPUs 0-1" in finding
    assert "topology/book drawer0-book0 (CPUs 0-1)" in finding
    assert "--reserved-cpus 0-1" in finding


def test_reserved_system_cpus_outside_the_groups(z16: Grouping) -> None:
    all_cpus = {c for g in z16.groups for c in g.cpus}
    outside = max(all_cpus) + 1
    assert cpu_manager_findings(parse_cpu_manager_state(NONE), z16, reserved_system_cpus=(outside,)) == []


def test_exclusive_cpus_outside_the_groups_are_fine() -> None:
    # z16-vertical leaves CPUs 4, 5, 14, 15 out of its groups.
    grouping = group_topology(load_embedded("z16-vertical"))
    state = CpuManagerState(policy="none", exclusive={"pod": {"c": (4, 5, 14, 15)}})
    assert cpu_manager_findings(state, grouping) == []


def test_nothing_advertised_nothing_to_clash() -> None:
    grouping = group_topology(load_embedded("z16-guest-no-topology"))
    assert cpu_manager_findings(parse_cpu_manager_state(STATIC), grouping, reserved_system_cpus=(0, 1)) == []


def test_all_three_findings(z16: Grouping) -> None:
    findings = cpu_manager_findings(parse_cpu_manager_state(STATIC), z16, reserved_system_cpus=(0,))
    assert [f.split(" ")[0:2] for f in findings] == [["kubelet", "runs"], ["kubelet's", "CPU"],
                                                      ["kubelet's", "reservedSystemCPUs"]]


@pytest.mark.parametrize(("text", "expected"), [
    ("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nreservedSystemCPUs: \"0-1\"\n", (0, 1)),
    ("reservedSystemCPUs: 0,4-5\n", (0, 4, 5)),
    ("reservedSystemCPUs: 3\n", (3,)),
    (json.dumps({"kind": "KubeletConfiguration", "reservedSystemCPUs": "2"}), (2,)),
    ("kind: KubeletConfiguration\ncpuManagerPolicy: static\n", ()),
    ("reservedSystemCPUs: \"\"\n", ()),
    ("", ()),
])
def test_reserved_system_cpus(tmp_path: Path, text: str, expected: tuple[int, ...]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert read_reserved_system_cpus(path) == expected


def test_reserved_system_cpus_absent_file(tmp_path: Path) -> None:
    assert read_reserved_system_cpus(tmp_path / "config.yaml") == ()
    assert read_reserved_system_cpus(os.fspath(tmp_path / "config.yaml")) == ()


@pytest.mark.parametrize(("text", "message"), [
    ("reservedSystemCPUs: [0, 1]\n", "must be a CPU list"),
    ("reservedSystemCPUs: \"1-0\"\n", "bad range"),
    ("- a\n- b\n", "must be a mapping"),
    ("a: [unclosed\n", "not YAML/JSON"),
])
def test_reserved_system_cpus_malformed(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(KubeletConfigError, match=message):
        read_reserved_system_cpus(path)


def test_a_changed_policy_is_noticed_without_rescans() -> None:
    from tests.support.harness import running_node, short_tmpdir

    state = short_tmpdir() / "cpu_manager_state"
    state.write_text(NONE)
    with running_node(rescan_interval=0.0, cpu_manager_state=state) as node:
        assert node.agent.reporter.cpu_manager_policy == "none"
        state.write_text(STATIC)  # kubelet restarted with cpuManagerPolicy: static (--rescan-interval 0)
        node.kubelet.wait_for(lambda: node.agent.reporter.cpu_manager_policy == "static", timeout=10,
                              what="the static policy noticed")


def test_a_state_nested_too_deeply_is_refused_in_one_line() -> None:
    with pytest.raises(CpuManagerStateError, match="nested too deeply"):
        parse_cpu_manager_state("[" * 100_000)


def test_a_state_with_a_huge_cpu_list_is_refused_quickly() -> None:
    with pytest.raises(CpuManagerStateError, match="CPU list too large"):
        parse_cpu_manager_state(json.dumps({"policyName": "static", "defaultCpuSet": "0-999999," * 200 + "0"}))


@pytest.mark.parametrize("text", ["reservedSystemCPUs: [\n", "reservedSystemCPUs: " + "[" * 100_000,
                                  "a: b\n c: d\n"])
def test_a_kubelet_config_that_is_not_yaml_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(KubeletConfigError, match="not YAML/JSON") as refused:
        read_reserved_system_cpus(path)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 400


def test_a_kubelet_file_larger_than_any_kubelet_writes_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "cpu_manager_state"
    path.write_bytes(b" " * (5 * 2**20))
    with pytest.raises(CpuManagerStateError, match="larger than 4 MiB"):
        read_cpu_manager_state(path)
