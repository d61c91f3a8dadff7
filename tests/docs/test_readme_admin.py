"""What the docs tell an admin match what the agent and the chart do (docs/admin/, docs/contributing/)."""

from __future__ import annotations

import re
import socket

import yaml

from agent.errors import SocketInUseError
from agent.node.labels import KEY_PREFIX, LABEL_KEYS, NOT_ADVERTISED_CODES
from agent.unix_socket import clear_stale_socket
from tests.support.env import REPO
from tests.support.harness import short_tmpdir

DOCS = REPO / "docs"
RUNNING = " ".join((DOCS / "admin" / "running.md").read_text(encoding="utf-8").split())
LABELS = (DOCS / "admin" / "node-labels.md").read_text(encoding="utf-8")
UNIT_LANE = " ".join((DOCS / "contributing" / "lanes" / "unit.md").read_text(encoding="utf-8").split())


def test_the_docs_say_one_thing_about_a_second_instance() -> None:
    """exit 2 with one line at start (tests/integration/test_serve_process.py runs it); waited out only once serving."""
    assert "a second instance started beside a running one exits 2 with one line" in RUNNING
    assert "At start a live socket of another instance is exit 2 with one line" in RUNNING
    assert "a directory or a live socket of another instance at the agent's socket path is waited out" not in RUNNING
    path = short_tmpdir() / "x.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        live.bind(str(path))
        live.listen(1)
        try:
            clear_stale_socket(path)
        except SocketInUseError as exc:
            message = str(exc)
        else:
            raise AssertionError("a live socket was taken over")
    finally:
        live.close()
    said = message.split(" ", 1)[1]  # the path, then the reason
    assert said == "is served by another running process (another topology-agent instance?); refusing to take it over"
    assert said in RUNNING


def test_every_node_label_and_its_values_are_documented() -> None:
    from tests.support.docs import names

    text = LABELS[LABELS.index("Every label, under"):].splitlines()[1:]
    table = [line.strip() for line in text if line.strip().startswith("|")][:20]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in table[2:]]
    rows = rows[:next((i for i, row in enumerate(rows) if len(row) != 2), len(rows))]
    documented = {n for row in rows for n in names(row[0])}
    assert documented == {k.removeprefix(KEY_PREFIX) for k in LABEL_KEYS}
    (advertised,) = [row[1] for row in rows if names(row[0]) == ["advertised"]]
    assert names(advertised) == ["true", *NOT_ADVERTISED_CODES]


def test_no_example_selects_on_a_label_that_needs_node_labels() -> None:
    for path in sorted((REPO / "deploy" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = doc["spec"]
            pod = spec["template"]["spec"] if "template" in spec else spec
            assert not [k for k in pod.get("nodeSelector", {}) if k.startswith(KEY_PREFIX)], path.name
            assert "affinity" not in pod, path.name


def test_make_test_fetches_helm_and_the_docs_say_what_skipped_tests_need() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("\ntest:"):].split("\n\n", 1)[0]
    assert "tools/get-helm.sh" in recipe and recipe.index("get-helm") < recipe.index("pytest")
    section = UNIT_LANE[UNIT_LANE.index("## What each test group needs"):]
    for need in ("../shared/fixtures/s390x-real", "helm 3", "cel-python", "containerd", "libseccomp", "lscpu",
                 "TOPOLOGY_E2E_KUBECONFIG", "grpcio-tools"):
        assert need in section, need


# What fetches from a registry, in the recipes of the README's two commands: the registry it reaches and how a
# machine without access points it at a mirror. A fetcher not listed here fails the test below until it is.
FETCHERS = {"pip install": ("PyPI", "PIP_INDEX_URL"), "npm pack": ("npm registry", "npm_config_registry"),
            "apt-get install": ("python3-venv", "python3-venv")}
UNKNOWN_FETCHERS = ("curl ", "wget ", "go install", "go get", "npm install", "git clone", "docker pull")


def recipes(*targets: str) -> str:
    """The Makefile recipes of these targets (and of the venv stamp they depend on), with the scripts they run."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    text = []
    for target in (*targets, "$(STAMP)"):
        start = makefile.index(f"\n{target}:") + 1
        end = makefile.find("\n\n", start)
        text.append(makefile[start:end])
    joined = "\n".join(text)
    scripts = set(re.findall(r"\btools/[\w.-]+\.sh", joined))
    return joined + "".join((REPO / script).read_text(encoding="utf-8") for script in sorted(scripts))


def test_the_readme_says_what_the_two_commands_fetch() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    said = " ".join(readme[:readme.index("A Kubernetes node agent")].split())
    run = recipes("demo", "test")
    assert "tools/get-helm.sh" in run  # the scripts are read too
    assert [f for f in UNKNOWN_FETCHERS if f in run] == [], "a new fetch: name its registry and mirror in the README"
    used = [entry for fetcher, entry in FETCHERS.items() if fetcher in run]
    assert used, "the recipes no longer fetch: the README's prerequisites say they do"
    assert [name for entry in used for name in entry if name not in said] == []
    assert "mirror" in said
