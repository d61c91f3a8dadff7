"""``topology-agent serve`` as a real process: registers, and on SIGTERM/SIGINT stops serving,
removes its sockets and exits 0; on SIGUSR1 it writes every thread's stack to stderr and serves on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.harness import short_tmpdir
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.testing.wait import wait_until


def serve(kubelet: KubeletEmulator, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "serve", "--topology-file", "embedded:z16-lpar",
         "--kubelet-dir", str(kubelet.device_plugin_dir), "--pod-resources-socket", str(kubelet.pod_resources_socket),
         "--log-format", "json", "--metrics-port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_and_removes_sockets(sig: signal.Signals) -> None:
    with KubeletEmulator(short_tmpdir()) as kubelet:
        proc = serve(kubelet, "--levels", "book,socket")
        try:
            kubelet.wait_registered("topology/book", timeout=20)
            kubelet.wait_registered("topology/socket", timeout=20)
            kubelets_own = {"kubelet.sock", "kubelet_internal_checkpoint", "s390x-topology-agent"}
            ours = {p.name for p in kubelet.device_plugin_dir.iterdir()} - kubelets_own
            assert ours == {"topology-book.sock", "topology-socket.sock"}
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        assert {p.name for p in kubelet.device_plugin_dir.iterdir()} == {"kubelet.sock", "kubelet_internal_checkpoint",
                                                                         "s390x-topology-agent"}  # its saved groups
        assert '"msg": "registered topology/book with kubelet' in err


def test_second_process_is_refused_with_a_clear_error() -> None:
    with KubeletEmulator(short_tmpdir()) as kubelet:
        first = serve(kubelet)
        try:
            kubelet.wait_registered("topology/book", timeout=20)
            second = serve(kubelet)
            _, err = second.communicate(timeout=30)
            assert second.returncode == 2
            assert "served by another running process" in err and "Traceback" not in err
            assert kubelet.registrations("topology/book") == 1
        finally:
            first.send_signal(signal.SIGTERM)
            first.communicate(timeout=20)


def test_sigusr1_dumps_every_threads_stack_and_the_agent_serves_on() -> None:
    root = short_tmpdir()
    with KubeletEmulator(root) as kubelet:
        agent = AgentProcess(kubelet, root, "--levels", "book")
        try:
            kubelet.wait_registered("topology/book", timeout=20)
            agent.proc.send_signal(signal.SIGUSR1)

            def dump() -> str | None:
                text = agent.log_path.read_text(errors="replace")
                return text if "in run_until_signalled" in text else None

            text = wait_until("the main thread's stack in the log", dump, 10)
            assert text.count("(most recent call first)") > 1  # every thread, not only the main one
            assert agent.proc.poll() is None
            assert agent.allocate("topology/book", ["drawer0-book0"]).container_responses  # still serving
        finally:
            assert agent.stop() == 0
        assert agent.hang_report is None


# run_until_signalled with a stand-in agent; the SIGTERM is sent to one of its other threads, as the kernel does when
# the main thread has a signal pending already (a SIGUSR1 just before, say).
SIGNAL_TO_ANOTHER_THREAD = """
import os, signal, sys, threading
from agent.app.agent import run_until_signalled

def main_blocked():  # the main thread, past start(), asleep in the kernel (its wait for a signal)
    frame, names = sys._current_frames()[threading.main_thread().ident], []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    state = open(f"/proc/self/task/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[0]
    return "start" not in names and state == "S"

def kill_me():
    while not main_blocked():
        threading.Event().wait(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Event().wait()  # this thread lives on: the handler must run in the main thread anyway

class Stub:
    before_stop = None
    def start(self):
        threading.Thread(target=kill_me, daemon=True).start()
    def stop(self):
        print("stopped", flush=True)

sys.exit(run_until_signalled(Stub()))
"""


def test_a_sigterm_taken_by_another_thread_stops_the_agent() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_TO_ANOTHER_THREAD], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and out == "stopped\n"


# run_until_signalled with a stand-in agent that raises the signals itself while its main thread holds the log queue's
# lock, as it does inside any log call (Python runs a signal's handler between any two bytecodes of the main thread).
SIGNAL_INSIDE_A_LOG_CALL = """
import logging, signal, sys
from agent.app.agent import run_until_signalled
from agent.observe.logs import setup_logging

setup_logging("info", "json")
log_queue = logging.getLogger().handlers[0].queue

class Rescans:
    running = False
    def run_once(self):
        print("rescanned", flush=True)

class Stub:
    before_stop = None
    full_rescan_requested = False
    rescan_loop = Rescans()
    def start(self):
        with log_queue.mutex:
            signal.raise_signal(signal.SIGHUP)
            signal.raise_signal(signal.SIGTERM)
    def stop(self):
        print("stopped", flush=True)

sys.exit(run_until_signalled(Stub(), exit_bound=None))
"""


def test_signals_that_come_inside_a_log_call_are_acted_on() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_INSIDE_A_LOG_CALL], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and out.count("rescanned") == 1 and out.count("stopped") == 1  # two threads print
    assert "received SIGHUP: rescanning topology" in err and "received SIGTERM: shutting down" in err
