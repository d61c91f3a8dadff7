"""State across releases: what a recorded release wrote on a node (tests/fixtures/release-*/, made by that release's
own code: python -m topology_devkit.release_fixtures) is read by today's agent with the same meaning, and a file of a
newer format than today's stops the agent in one line and stays byte for byte as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent._proto.nri.v1alpha1 import api_pb2 as nri
from agent.app.build import build_agent
from agent.app.config import AgentConfig
from agent.cli import main
from agent.dra.prepare import ClaimPreparer, checkpoint_path
from agent.enforce.nri_hooks import running_container
from agent.errors import NewerStateError
from agent.node.labels import ANNOTATION_SCHEMA_VERSION, TOPOLOGY_ANNOTATION
from agent.policy.allocation import AllocationSettings
from agent.policy.grouping import GroupingSettings, group_topology
from agent.policy.resource_slices import DRIVER
from agent.topology.embedded import load_embedded
from tests.support.env import BOOK, REPO
from tests.support.harness import FAST, short_tmpdir

RELEASES = json.loads((REPO / "releases.json").read_text())["releases"]
FIXTURES = REPO / "tests" / "fixtures"
V010 = FIXTURES / "release-0.1.0"
LEVELS = ("book", "socket")
TOPOLOGY = load_embedded("z16-lpar")
UID = "6f1c2d3e-0000-4000-8000-000000000001"


def kubelet_dir(*trees: str) -> Path:
    """A kubelet device-plugin directory holding what the release left there (its state directory), and its cdi/."""
    root = short_tmpdir()
    (root / "dp").mkdir()
    for tree in trees:
        shutil.copytree(V010 / tree / "s390x-topology-agent", root / "dp" / "s390x-topology-agent", dirs_exist_ok=True)
        if (V010 / tree / "cdi").exists():
            shutil.copytree(V010 / tree / "cdi", root / "cdi", dirs_exist_ok=True)
    return root


def config(root: Path, **extra: Any) -> AgentConfig:
    settings: dict[str, Any] = {
        "kubelet_dir": root / "dp", "grouping": GroupingSettings(levels=LEVELS), "node_name": "node-a",
        "pod_resources_socket": root / "no-pod-resources.sock", "pod_resources_interval": 0.05,
        "rescan_interval": 0.0, "timing": FAST, "cdi_dir": root / "cdi",
        "cpu_manager_state": root / "no-cpu-manager-state", "nri_socket": root / "nri.sock", **extra}
    return AgentConfig(**settings)


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``root``: its inode (an atomic write replaces it) and its bytes."""
    return {str(p.relative_to(root)): (p.stat().st_ino, p.read_bytes()) for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_every_recorded_release_has_its_files_here() -> None:
    for release in RELEASES:
        manifest = json.loads((FIXTURES / f"release-{release['version']}" / "MANIFEST.json").read_text())
        assert manifest["commit"] == release["commit"], release


def test_a_device_plugin_agent_starts_from_0_1_0_files_with_their_groups_and_hold() -> None:
    root = kubelet_dir("deviceplugin")
    saved = json.loads((V010 / "deviceplugin/s390x-topology-agent/topology/groups.json").read_text())
    agent = build_agent(TOPOLOGY, config(root))  # pod-resources away: the saved hold is all there is
    assert [g.id for g in agent.grouping.groups] == [g["id"] for g in saved["groups"]]
    assert [g.cpus for g in agent.grouping.groups] == [tuple(g["cpus"]) for g in saved["groups"]]
    assert agent.grouping.groups == group_topology(TOPOLOGY, GroupingSettings(levels=LEVELS)).groups
    assert (BOOK, "drawer0-book0") in agent.devices.held_keys()
    rewritten = json.loads((root / "dp/s390x-topology-agent/topology/groups.json").read_text())
    assert rewritten["version"] == 1 and rewritten["groups"] == saved["groups"]


def test_0_1_0_dra_checkpoint_is_held_in_device_plugin_mode_and_restored_by_the_preparer() -> None:
    root = kubelet_dir("dra")
    cdi_before = tree(root / "cdi")
    agent = build_agent(TOPOLOGY, config(root))
    assert (BOOK, "drawer0-book1") in agent.devices.held_keys()  # held through the claim 0.1.0 prepared
    preparer = ClaimPreparer(driver=DRIVER, pool="node-a", groups={g.id: g for g in agent.grouping.groups},
                             allocation=AllocationSettings(), read_claim=lambda ns, name: {}, cdi_dir=root / "cdi",
                             checkpoint=checkpoint_path(root / "dp"))
    assert list(preparer.claims) == [UID]
    assert [(d.device, d.cdi_ids) for d in preparer.claims[UID].devices] == [
        ("drawer0-book1", (f"topology.s390x.ibm.com/book={UID}-r",))]
    assert tree(root / "cdi") == cdi_before, "its CDI file is the claim's: kept as 0.1.0 wrote it"
    assert preparer.requests()[f"{UID}/r"].devices == ((BOOK, "drawer0-book1"),)


def test_0_1_0_allocate_annotations_name_the_same_groups_to_the_cpuset_planner() -> None:
    written = json.loads((V010 / "allocate-annotations.json").read_text())
    pod = nri.PodSandbox(id="p", name="llm", namespace="ns")
    container = nri.Container(id="c", pod_sandbox_id="p", name="main", annotations=written["annotations"])
    seen = running_container(pod, container, "topology.s390x.ibm.com")
    assert seen.annotated_groups == (written["device"],) and seen.annotated_resource == BOOK


def test_0_1_0_node_annotation_is_the_format_written_today() -> None:
    old = json.loads(json.loads((V010 / "node-annotation.json").read_text())[TOPOLOGY_ANNOTATION])
    assert old["version"] == ANNOTATION_SCHEMA_VERSION


NEWER = [("deviceplugin", "s390x-topology-agent/topology/groups.json"),
         ("deviceplugin", "s390x-topology-agent/topology/holds.json"),
         ("dra", "s390x-topology-agent/dra/claims.json")]


def with_version(path: Path, version: int) -> None:
    doc = json.loads(path.read_text())
    doc["version"] = version
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(("kind", "name"), NEWER, ids=[n.rsplit("/", 1)[1] for _, n in NEWER])
@pytest.mark.parametrize("mode", ["deviceplugin", "dra"])
def test_a_file_of_a_newer_format_stops_the_agent_and_is_kept(kind: str, name: str, mode: str) -> None:
    root = kubelet_dir(kind)
    with_version(root / "dp" / name, 2)
    before = tree(root)
    with pytest.raises(NewerStateError) as refused:
        build_agent(TOPOLOGY, config(root, mode=mode, dra_registry_dir=root / "reg", dra_plugin_dir=root / "plug"))
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{root / 'dp' / name}: ")
    assert "format version 2, newer than this agent reads (1)" in line
    assert "neither uses nor replaces it and does not start" in line
    assert tree(root) == before, "nothing written, nothing removed"


def test_serve_says_it_in_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    root = kubelet_dir("deviceplugin")
    groups = root / "dp/s390x-topology-agent/topology/groups.json"
    with_version(groups, 7)
    before = groups.read_bytes()
    code = main(["serve", "--topology-file", "embedded:z16-lpar", "--kubelet-dir", str(root / "dp"), "--levels",
                 "book,socket", "--pod-resources-socket", str(root / "none.sock"), "--no-node-labels",
                 "--metrics-port", "0", "--log-format", "text"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith(f"topology-agent: error: {groups}: the saved groups are format version 7")
    assert groups.read_bytes() == before


def test_an_older_or_unknown_version_is_still_distrusted_not_fatal() -> None:
    root = kubelet_dir("deviceplugin")
    with_version(root / "dp/s390x-topology-agent/topology/holds.json", 0)
    agent = build_agent(TOPOLOGY, config(root))  # no format 0 was ever written: not trusted, as before
    assert (BOOK, "drawer0-book0") not in agent.devices.held_keys()
