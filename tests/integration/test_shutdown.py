"""Shutdown is bounded as a whole: every part is stopped against one deadline, so slow parts never add up past the
chart's terminationGracePeriodSeconds, and a watchdog ends whatever hangs after the signal, saying where."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import yaml

from agent.app.agent import EXIT_BOUND, STOP_BOUND
from agent.topology.embedded import load_embedded
from agent.topology.model import Topology
from agent.worker import Worker
from tests.support.env import REPO
from tests.support.harness import running_node
from topology_devkit.testing.wait import wait_until

GRACE = 30  # the chart's default terminationGracePeriodSeconds


def test_the_bounds_sit_inside_the_charts_grace_period() -> None:
    values = yaml.safe_load((REPO / "deploy" / "helm" / "s390x-topology-agent" / "values.yaml").read_text())
    assert values["terminationGracePeriodSeconds"] == GRACE
    assert STOP_BOUND + 4 * 0.5 + 7 < EXIT_BOUND < GRACE  # stages' floors, the log's flush at exit (2 + 5 s)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # the stuck steps end with the test


def test_steps_that_never_end_do_not_add_up(release: threading.Event, caplog: pytest.LogCaptureFixture) -> None:
    entered: set[str] = set()

    def stuck(name: str) -> None:
        entered.add(name)
        release.wait()

    topology = load_embedded("z16-lpar")

    def read_topology() -> Topology:
        stuck("topology rescan")
        return topology

    with running_node(topology, rescan_interval=0.05, loader=read_topology) as node:
        agent = node.agent
        agent.pod_resources_loop.step = lambda: stuck("pod-resources")
        wait_until("both loops inside their stuck step", lambda: len(entered) == 2, 30)
        agent.stop_bound = 2.0
        started = time.monotonic()
        agent.stop()
        took = time.monotonic() - started
        assert took < 2 * Worker.join_timeout  # each stuck loop's join alone waits that long: one after the other
        assert "left behind: topology rescan, pod-resources" in caplog.text
        assert not list(node.kubelet.device_plugin_dir.glob("topology-*.sock"))  # the sockets went all the same


# run_until_signalled with a stand-in agent whose stop never ends.
STOP_HANGS = """
import sys, threading
from agent.app.agent import run_until_signalled

class Stub:
    before_stop = None
    def start(self):
        print("started", flush=True)
    def stop(self):
        threading.Event().wait()

sys.exit(run_until_signalled(Stub(), exit_bound=1.0))
"""


def test_a_stop_that_hangs_ends_at_the_exit_bound_with_every_threads_stack() -> None:
    proc = subprocess.Popen([sys.executable, "-c", STOP_HANGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert "Timeout" in err and "in stop" in err  # the watchdog's dump names the stuck frame
