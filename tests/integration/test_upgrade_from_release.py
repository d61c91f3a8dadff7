"""An upgrade from the last recorded release and a rollback to it, on one node: that release's own agent (its code from
its commit, git archive, run as `serve`) hands out a book, stops as a rolling update stops it, today's agent starts on
the same kubelet and state files, and then the release's agent again. Every hold stays held through both: the held
book's sockets are blocked from each new agent's first answer, with pod-resources, and from the saved holds alone."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import __version__
from tests.support.env import BOOK, REPO, SOCKET
from tests.support.harness import short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import Container, KubeletEmulator
from topology_devkit.testing.wait import wait_until

LAST = json.loads((REPO / "releases.json").read_text())["releases"][-1]


@pytest.fixture(scope="module")
def release_tree() -> Iterator[Path]:
    """The last release's agent/ as its commit has it."""
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", LAST["commit"]], check=False).returncode:
        pytest.skip(f"{LAST['commit'][:12]} is not in this clone (a shallow one)")
    tree = short_tmpdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", LAST["commit"], "agent"], capture_output=True,
                             timeout=60, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, timeout=60, check=True)
    yield tree


def serve(k: KubeletEmulator, root: Path, release: Path | None, *, pod_resources: bool = True) -> AgentProcess:
    """An agent of the release at ``release`` (None: today's), once registered and its devices delivered."""
    books, sockets = k.registrations(BOOK), k.registrations(SOCKET)
    agent = AgentProcess(k, root, "--levels", "book,socket", "--pod-resources-interval", "0.1",
                         pod_resources=None if pod_resources else root / "no-pod-resources.sock",
                         env={**os.environ, "PYTHONPATH": str(release)} if release else None, cwd=release)
    k.wait_for(lambda: k.registrations(BOOK) > books and k.registrations(SOCKET) > sockets, timeout=30,
               what="both resources registered again")
    version = LAST["version"] if release else __version__
    wait_until(f"the agent of {version}", lambda: version in built(agent), 15)
    return agent


def built(agent: AgentProcess) -> set[str]:
    """The versions its topology_agent_build_info names (the release's names no commit, today's does)."""
    return {dict(labels)["version"] for (name, labels) in agent.metrics() if name == "topology_agent_build_info"}


def blocked(k: KubeletEmulator, book: str) -> bool:
    """The held book's sockets are Unhealthy to kubelet, and the others' healthy (the agent's answer, not a gap)."""
    sockets, unhealthy = set(k.devices(SOCKET)), k.unhealthy_devices(SOCKET)
    inside = {d for d in sockets if d.startswith(f"{book}-")}
    return bool(inside) and inside <= unhealthy and bool(sockets - inside - unhealthy)


@pytest.mark.parametrize("pod_resources", [True, False], ids=["with-pod-resources", "saved-holds-alone"])
def test_upgrade_from_the_last_release_and_rollback_keep_every_hold(release_tree: Path, pod_resources: bool) -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as k:
        old = serve(k, root, release_tree)
        pod = k.admit_pod("ns", "llm", [Container("main", {BOOK: 1})])
        book = pod.devices("main", BOOK)[0]
        k.wait_for(lambda: blocked(k, book), timeout=10, what="the held book's sockets blocked (the release)")
        holds = k.device_plugin_dir / "s390x-topology-agent" / "topology" / "holds.json"
        wait_until("the hold saved", lambda: holds.exists() and book in holds.read_text(), 10)
        assert old.stop() == 0  # SIGTERM, as a rolling update stops it: the files stay
        for release in (None, release_tree):  # the upgrade, then the rollback
            agent = serve(k, root, release, pod_resources=pod_resources)
            try:
                k.wait_for(lambda: blocked(k, book), timeout=10, what="the held book's sockets blocked")
                other = k.admit_pod("ns", f"next-{'new' if release is None else 'old'}",
                                    [Container("main", {SOCKET: 1})])
                assert not other.devices("main", SOCKET)[0].startswith(f"{book}-"), "a socket of the held book"
                k.delete_pod("ns", other.name)
                assert json.loads(holds.read_text())["version"] == 1 and book in holds.read_text()
            finally:
                assert agent.stop() == 0
