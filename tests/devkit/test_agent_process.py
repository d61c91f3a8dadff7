"""AgentProcess, the tests' handle on a real ``serve`` process: one that outlives SIGTERM is not only killed, it is
asked for its threads' stacks first, and those and its log's last lines are printed where pytest shows them."""

from __future__ import annotations

import sys

import pytest

from tests.support.harness import short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.testing.wait import wait_until

# A stand-in for an agent whose shutdown hangs: it dumps its stacks on SIGUSR1 as serve does, and ignores SIGTERM.
STUCK = """
import faulthandler, signal, sys, threading
faulthandler.register(signal.SIGUSR1, all_threads=True)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def stuck_in_a_step():
    print('{"msg": "the last line before the hang"}', file=sys.stderr, flush=True)
    threading.Event().wait()
stuck_in_a_step()
"""


def test_a_process_that_outlives_sigterm_reports_its_stacks_and_log_tail(capsys: pytest.CaptureFixture[str]) -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as kubelet:
        agent = AgentProcess(kubelet, root, entry=[sys.executable, "-c", STUCK])
        wait_until("the stand-in running", lambda: agent.logged("the last line before the hang"), 20)
        assert agent.stop(timeout=0.5) == -9
    report = agent.hang_report
    assert report is not None and "still running 0.5 s after SIGTERM" in report
    assert "in stuck_in_a_step" in report  # the stack of the thread that hangs
    assert "the last line before the hang" in report  # the log's tail
    assert report in capsys.readouterr().err


def test_a_process_that_stops_reports_nothing() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as kubelet:
        agent = AgentProcess(kubelet, root, entry=[sys.executable, "-c", "import sys; sys.exit(0)"])
        assert agent.stop() in (0, -15)  # exited already, or ended by the SIGTERM
    assert agent.hang_report is None
