"""What the docs tell an admin match what the agent and the chart do (docs/admin/, docs/contributing/)."""

from __future__ import annotations

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
