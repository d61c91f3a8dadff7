"""Idle cost benchmark: the running agent's CPU time and memory on a 400-CPU node doing nothing.

Writes the ``z16-400`` snapshot (400 CPUs, SMT-2, 16 books) as a host-root tree, starts the kubelet
emulator in this process, and runs the agent as a subprocess with its default loops: a topology
rescan every 5 s (reading the whole tree again) and a pod-resources ``List`` every 2 s::

    python -m agent serve --host-root TREE --proc-root TREE/proc --kubelet-dir ... \\
        --pod-resources-socket ... --metrics-port 0 --no-node-labels

After the agent has registered, it is left alone for ``--seconds`` (default 60). Its CPU time
(utime + stime of every thread, ``/proc/<pid>/stat``) over that window, net of what it used up to
registration, is reported as a share of one core (target <= 0.2%), and its ``VmRSS`` from
``/proc/<pid>/status`` (target <= 64 MiB). Baseline in the same run and the same window: an idle
``python -c "import time; time.sleep(N)"`` child started alongside; both are printed with the
difference. Reports only: exits 0 unless the agent never registers or dies (1).

    .venv/bin/python bench/bench_idle.py [--seconds 60] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.topology.embedded import load_embedded
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.kubelet_emulator.constants import LOGGER_NAME
from topology_devkit.sysfs_writer import write_sysfs_tree

ROOT = Path(__file__).resolve().parent.parent
SHAPE = "z16-400"
RESOURCE = "topology/book"
SETTLE = 3.0  # seconds after registration before the idle window starts
TARGET_CPU_SHARE = 0.002  # of one core
TARGET_RSS_MIB = 64.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Sample:
    cpu_s: float  # utime + stime, every thread, seconds
    at: float  # time.monotonic() of the reading


def cpu_sample(pid: int) -> Sample:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()  # fields from 3 (state) on; comm may hold spaces
    utime, stime = int(fields[11]), int(fields[12])
    return Sample((utime + stime) / CLOCK_TICKS, time.monotonic())


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass(frozen=True, slots=True)
class ChildCost:
    startup_cpu_s: float  # CPU time until the idle window starts (registration + settling)
    window_cpu_s: float
    window_s: float
    rss_kib: int
    hwm_kib: int

    @property
    def share(self) -> float:
        return self.window_cpu_s / self.window_s


def cost(pid: int, start: Sample, end: Sample) -> ChildCost:
    return ChildCost(start.cpu_s, end.cpu_s - start.cpu_s, end.at - start.at,
                     status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM"))


def run(seconds: float) -> tuple[ChildCost, ChildCost, int, float]:
    """(agent, idle python, pod-resources calls served, registration seconds after spawn)."""
    tmp = Path(tempfile.mkdtemp(prefix="bid-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
    tree = tmp / "root"
    write_sysfs_tree(load_embedded(SHAPE), tree)
    kubelet = KubeletEmulator(tmp / "k")
    log_path = tmp / "agent.log"
    agent: subprocess.Popen[bytes] | None = None
    idle: subprocess.Popen[bytes] | None = None
    try:
        kubelet.start()
        command = [sys.executable, "-m", "agent", "serve", "--host-root", str(tree), "--proc-root", str(tree / "proc"),
                   "--kubelet-dir", str(kubelet.device_plugin_dir),
                   "--pod-resources-socket", str(kubelet.pod_resources_socket),
                   "--metrics-port", "0", "--no-node-labels"]
        with log_path.open("wb") as log_file:
            spawned = time.monotonic()
            agent = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
            idle = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds + 60})"], cwd=ROOT,
                                    stdin=subprocess.DEVNULL)
        try:
            kubelet.wait_for(lambda: kubelet.registrations(RESOURCE) > 0, 30.0)
        except TimeoutError:
            raise RuntimeError(f"the agent never registered {RESOURCE}; log:\n{log_path.read_text()[-2000:]}") from None
        registered_after = time.monotonic() - spawned
        time.sleep(SETTLE)  # the tail of start-up (first ListAndWatch, first polls) is not idle cost
        agent_start, idle_start = cpu_sample(agent.pid), cpu_sample(idle.pid)
        calls_before = kubelet.pod_resources_calls
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 1.0))
            if agent.poll() is not None:
                raise RuntimeError(f"the agent exited ({agent.returncode}); log:\n{log_path.read_text()[-2000:]}")
        agent_end, idle_end = cpu_sample(agent.pid), cpu_sample(idle.pid)
        agent_cost, idle_cost = cost(agent.pid, agent_start, agent_end), cost(idle.pid, idle_start, idle_end)
        calls = kubelet.pod_resources_calls - calls_before
        if kubelet.registrations(RESOURCE) != 1:
            raise RuntimeError("the agent registered again while idle")
        return agent_cost, idle_cost, calls, registered_after
    finally:
        for proc in (agent, idle):
            if proc is not None:
                stop_process(proc)
        kubelet.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="idle window after registration (default 60)")
    parser.add_argument("--quick", action="store_true", help="a 5-second smoke run")
    args = parser.parse_args(argv)
    seconds = 5.0 if args.quick else args.seconds
    emulator_log = logging.getLogger(LOGGER_NAME)
    emulator_log.addHandler(logging.NullHandler())
    emulator_log.propagate = False

    try:
        agent, idle, calls, registered_after = run(seconds)
    except RuntimeError as exc:
        print(f"bench_idle: BROKEN: {exc}")
        return 1

    print(f"Idle benchmark: agent on the {SHAPE} host-root tree (400 CPUs), rescan every 5 s, pod-resources "
          f"every 2 s, no node labels, no metrics port; {seconds:.0f} s window from {SETTLE:.0f} s after registration "
          f"(registered {registered_after:.2f} s after spawn, {agent.startup_cpu_s:.2f} s CPU by the start "
          f"of the window); "
          f"CPU clock tick {1000 / CLOCK_TICKS:.0f} ms")
    print(f"  pod-resources List calls served in the window: {calls} (expected ~{seconds / 2:.0f})")
    print(f"  {'':18} {'CPU time':>9} {'share of a core':>16} {'VmRSS':>10} {'VmHWM':>10}")
    for name, c in (("agent", agent), ("idle python", idle)):
        print(f"  {name:18} {c.window_cpu_s:8.2f}s {100 * c.share:15.3f}% {c.rss_kib / 1024:7.1f} MiB "
              f"{c.hwm_kib / 1024:6.1f} MiB")
    print(f"  {'difference':18} {agent.window_cpu_s - idle.window_cpu_s:8.2f}s "
          f"{100 * (agent.share - idle.share):15.3f}% {(agent.rss_kib - idle.rss_kib) / 1024:7.1f} MiB")
    rss_mib = agent.rss_kib / 1024
    print(f"  agent CPU share {100 * agent.share:.3f}% of one core (target <= {100 * TARGET_CPU_SHARE:.1f}%: "
          f"{'met' if agent.share <= TARGET_CPU_SHARE else 'NOT met'}); "
          f"RSS {rss_mib:.1f} MiB (target <= {TARGET_RSS_MIB:.0f} MiB: "
          f"{'met' if rss_mib <= TARGET_RSS_MIB else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
