"""The chart's NOTES, its admission policy's message, the docs and deploy/examples say one thing.

The pod example in NOTES.txt step 3 must follow the docs' contract: one topology resource per container,
an integer cpu request, no cpu limit (a Guaranteed pod is pinned elsewhere by the static CPU manager), and
the variables it lists are those of docs/inference/what-a-container-gets.md (OMP_PLACES/OMP_PROC_BIND only with
agent.openmpEnv). NOTES are rendered only by `helm install`/`upgrade` (``helm template`` leaves them out), so
they are checked three ways: the template text statically, a `helm install --dry-run=server` against the
fake API server of tests/deploy/chart/, and against a real cluster when TOPOLOGY_E2E_KUBECONFIG names its
kubeconfig (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, PRIVILEGED, Installed, Render, chart_install
from tests.support.docs import CONTAINER, names, table_after
from tests.support.env import REPO

NOTES = CHART / "templates" / "NOTES.txt"
EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))


def readme_variables() -> tuple[list[str], list[str]]:
    """(always set, only with --openmp-env) from the docs' contract table (device-plugin mode: the DRA-only rows
    are not what the NOTES' device-plugin example gets)."""
    rows = [row for row in table_after("## The environment", CONTAINER) if "DRA mode only" not in row[1]]
    always = [n for row in rows if "--openmp-env" not in row[1] for n in names(row[0])]
    opt_in = [n for row in rows if "--openmp-env" in row[1] for n in names(row[0])]
    return always, opt_in


def mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Z_]){name}(?![A-Z_])", text) is not None


def step3(notes: str) -> str:
    return notes[notes.index("3. Ask for a whole book"):]


def example_pod_spec(notes: str, prefix: str = "topology/") -> dict[str, Any]:
    """The YAML block of step 3 (from `spec:` to the first blank line), the resource prefix filled in."""
    text = step3(notes)
    start = text.index("     spec:\n")
    block = text[start:text.index("\n\n", start)].replace("{{ $prefix }}", prefix)
    doc = yaml.safe_load(block)
    assert isinstance(doc, dict)
    spec: dict[str, Any] = doc["spec"]
    return spec


def listed_variables(notes: str) -> list[str]:
    text = " ".join(step3(notes).split())
    sentence = text[text.index("The container gets ") + len("The container gets "):text.index(" for the allocated")]
    return [re.sub(r"\s*\(.*\)$", "", part).strip() for part in re.split(r",\s*|\s+and\s+", sentence)]


def assert_pod_follows_the_contract(spec: dict[str, Any], prefix: str = "topology/") -> None:
    for c in spec["containers"]:
        requests, limits = c["resources"]["requests"], c["resources"].get("limits", {})
        topo = [k for k in requests if k.startswith(prefix)]
        assert len(topo) == 1, "one topology resource per container"
        assert limits.get(topo[0], requests[topo[0]]) == requests[topo[0]]
        assert str(requests["cpu"]).isdigit() and int(requests["cpu"]) >= 1, "an integer cpu request"
        assert "cpu" not in limits, "a cpu limit equal to the request makes the pod Guaranteed"


def test_the_notes_template_follows_the_readme_contract() -> None:
    text = NOTES.read_text(encoding="utf-8")
    assert_pod_follows_the_contract(example_pod_spec(text))
    always, opt_in = readme_variables()
    # The unconditional list is the always-set variables; the opt-in ones sit inside the openmpEnv condition.
    unconditional = re.sub(r"\{\{-? if \.Values\.agent\.openmpEnv \}\}.*?\{\{ end \}\}", "", text, flags=re.S)
    assert listed_variables(unconditional) == always
    conditional = re.search(r"\{\{-? if \.Values\.agent\.openmpEnv \}\}(.*?)\{\{ end \}\}", step3(text), re.S)
    assert conditional is not None
    assert [n for n in opt_in if n in conditional.group(1)] == opt_in
    for name in opt_in:
        assert not mentions(unconditional, name), f"{name} is only set with --openmp-env"
    assert "no cpu limit" in step3(text) and "not Guaranteed" in step3(text)


def check_rendered(notes: str, *, openmp: bool) -> None:
    assert "{{" not in notes
    assert_pod_follows_the_contract(example_pod_spec(notes))
    always, opt_in = readme_variables()
    assert listed_variables(notes) == always + (opt_in if openmp else [])
    if not openmp:
        for name in opt_in:
            assert not mentions(notes, name)


def test_rendered_notes_follow_the_readme_contract(install: Callable[..., Installed]) -> None:
    notes = install(*chart_install("-n", "topo"), namespaces={"topo": PRIVILEGED}).notes
    check_rendered(notes, openmp=False)
    notes = install(*chart_install("-n", "topo", "--set", "agent.openmpEnv=true"),
                    namespaces={"topo": PRIVILEGED}).notes
    check_rendered(notes, openmp=True)
    assert "agent.uniformGroups=true" in notes and "agent.uniformGroups is on" not in notes
    notes = install(*chart_install("-n", "topo", "--set", "agent.uniformGroups=true"),
                    namespaces={"topo": PRIVILEGED}).notes
    check_rendered(notes, openmp=False)
    assert "agent.uniformGroups is on: every advertised group of a resource on a node has the same CPUs" in (
        " ".join(notes.split()))
    prefixed = install(*chart_install("-n", "topo", "--set", "agent.resourcePrefix=ibm.example.com"),
                       namespaces={"topo": PRIVILEGED}).notes
    assert_pod_follows_the_contract(example_pod_spec(prefixed, "ibm.example.com/"), "ibm.example.com/")


def test_notes_on_a_real_cluster(helm: str, tmp_path: Path) -> None:
    kubeconfig = os.environ.get("TOPOLOGY_E2E_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("TOPOLOGY_E2E_KUBECONFIG names no kubeconfig of a real cluster")
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env |= {"KUBECONFIG": kubeconfig, "HELM_CACHE_HOME": str(tmp_path / "cache"),
            "HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_DATA_HOME": str(tmp_path / "data")}
    for openmp in (False, True):
        cmd = [helm, "install", "notes-check", str(CHART), "-n", "default", "--dry-run=server", "-o", "json",
               "--set", f"agent.openmpEnv={str(openmp).lower()}"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)
        assert result.returncode == 0, result.stderr
        check_rendered(json.loads(result.stdout)["info"]["notes"], openmp=openmp)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_set_no_cpu_limit(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        spec = doc["spec"]
        assert_pod_follows_the_contract(spec["template"]["spec"] if "template" in spec else spec)


def test_the_admission_message_asks_for_no_cpu_limit(render: Render) -> None:
    (policy,) = [d for d in render() if d["kind"] == "ValidatingAdmissionPolicy"
                 and d["metadata"]["name"].endswith("topology-requests")]
    (cpu_rule,) = [v for v in policy["spec"]["validations"] if "nonIntegerCpu" in v["expression"]]
    for text in (cpu_rule["message"], cpu_rule["messageExpression"]):
        assert "limits.cpu" not in text and "no cpu limit" in text.lower()
        assert "explain" in text  # where the exact request is read


def test_the_docs_say_no_cpu_limit() -> None:
    requesting = " ".join((REPO / "docs" / "inference" / "requesting-groups.md").read_text(encoding="utf-8").split())
    assert "**set no cpu limit**" in requesting
