"""Chart values: agent.levels as a list, agent.uniformGroups, and inputs the chart refuses before the agent
starts (a fake-topology snapshot that is not JSON, a reservedCpus range that runs backwards)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.chart import Render, agent_container, env_of


@pytest.mark.parametrize("args, expected", [
    ((), "auto"),
    (("--set-json", 'agent.levels=["book","socket"]'), "book,socket"),
    (("--set", "agent.levels=book\\,socket"), "book,socket"),
    (("--set-json", 'agent.levels=["socket"]'), "socket"),
])
def test_levels_take_a_list_or_a_comma_string(render: Render, args: tuple[str, ...],
                                              expected: str) -> None:
    assert env_of(agent_container(render(*args)))["TOPOLOGY_AGENT_LEVELS"] == expected


@pytest.mark.parametrize("value", ['["books"]', '[]', '["book","book"]', '[1]'])
def test_levels_list_is_checked(template_error: Callable[..., str], value: str) -> None:
    stderr = template_error("--set-json", f"agent.levels={value}")
    assert "values don't meet the specifications of the schema" in stderr and "levels" in stderr


def test_uniform_groups_reach_the_agent(render: Render) -> None:
    assert env_of(agent_container(render()))["TOPOLOGY_AGENT_UNIFORM_GROUPS"] == "false"
    env = env_of(agent_container(render("--set", "agent.uniformGroups=true")))
    assert env["TOPOLOGY_AGENT_UNIFORM_GROUPS"] == "true"


def test_uniform_groups_is_a_boolean(template_error: Callable[..., str]) -> None:
    assert "uniformGroups" in template_error("--set", "agent.uniformGroups=yes")


@pytest.mark.parametrize("value, ok", [("5-2", False), ("0-1,9-3", False), ("2-5", True), ("0-1,8,10-12", True),
                                       ("", True), ("7", True), ("3-3", True)])
def test_reserved_cpus_ranges_run_forwards(helm: str, value: str, ok: bool) -> None:
    from tests.support.chart import FLOOR, helm_template

    escaped = value.replace(",", chr(92) + ",")
    result = helm_template(helm, ("--kube-version", FLOOR, "--set-string", f"agent.reservedCpus={escaped}"))
    if ok:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0
        assert "agent.reservedCpus: the range" in result.stderr and "runs backwards" in result.stderr


FAKE = ("--set", "fakeTopology.enabled=true")


@pytest.mark.parametrize("text", ["hello", "[1, 2]", "not json at all }"])
def test_a_fake_snapshot_must_look_like_a_json_object(template_error: Callable[..., str],
                                                      tmp_path: Path, text: str) -> None:
    snapshot = tmp_path / "s.json"
    snapshot.write_text(text)
    stderr = template_error(*FAKE, "--set-file", f"fakeTopology.snapshots.default\\.json={snapshot}")
    assert "values don't meet the specifications of the schema" in stderr and "default.json" in stderr


def test_a_fake_snapshot_must_parse_as_json(template_error: Callable[..., str], tmp_path: Path) -> None:
    snapshot = tmp_path / "s.json"
    snapshot.write_text('{"machine": {}, "cpus": [1,]}')
    stderr = template_error(*FAKE, "--set-file", f"fakeTopology.snapshots.default\\.json={snapshot}")
    assert "fakeTopology.snapshots.default.json is not a JSON snapshot" in stderr
    assert "topology-agent snapshot" in stderr


def test_a_real_snapshot_passes(render: Render) -> None:
    from tests.support.env import REPO

    docs = render(*FAKE, "--set-file", f"fakeTopology.snapshots.default\\.json={REPO / 'agent/data/z16-lpar.json'}")
    assert any(d["kind"] == "ConfigMap" for d in docs)
