"""Idle cost with production defaults: the running agent's CPU time and memory on a 400-CPU node doing nothing.

The agent runs as the chart runs it (``bench/production.py``: the image-like install, node labels over
TLS in a private mount namespace, metrics on with kubelet's probes hitting ``/readyz`` every 5 s and
``/healthz`` every 10 s, kubelet's ``config.yaml`` and ``cpu_manager_state``, JSON logs at info, a rescan
every 5 s, pod-resources every 2 s while devices change hands and every 30 s once nothing has for a
minute) on the ``z16-400`` host-root tree, next to the kubelet emulator in this process. Two references start
alongside and are measured over the same windows: an idle ``python -c "import time; time.sleep(N)"`` and an
idle bare gRPC server (``bench/grpc_load.py echo``: a sync ``grpc.server`` with 16 threads on a Unix socket,
what gRPC alone costs at rest), both with the same interpreter.

* **First minute** (info): from 3 s after registration to 58 s after the spawn, while pod-resources is
  still polled every 2 s.
* **Steady** (the targets): a window from 65 s after the spawn, 120 s long, in 4 parts (their spread is
  the noise). CPU: utime + stime of every thread (``/proc/<pid>/stat``, 10 ms ticks) as a share of one
  core; target <= 0.2 %. RSS: ``VmRSS`` at the end of the window; target <= 64 MiB.

``--quick`` measures only a 10 s window of the first minute and the RSS then; the steady rows are
skipped (pod-resources slows down only after a minute).

    .venv/bin/python bench/bench_idle.py [--quick]
"""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.topology.embedded import load_embedded
from bench.bench_allocate import spawn_echo
from bench.common import INFO, BenchError, Row, at_most, bench_main, skipped, stop_process
from bench.production import NODE_NAME, Prober, Production
from topology_devkit.agent_process import AgentProcess, cpu_seconds, status_kib, wait_until
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.sysfs_writer import write_sysfs_tree

BENCH = "idle"
SHAPE = "z16-400"
RESOURCE = "topology/book"
SETTLE = 3.0  # seconds after registration before the first window
STEADY_FROM = 65.0  # seconds after the spawn: pod-resources has slowed down (60 s without a change)
STEADY_SECONDS = 120.0  # 10 ms CPU ticks: +-0.02 % of a core over the window
STEADY_PARTS = 4
TARGET_CPU_SHARE = 0.002  # of one core
TARGET_RSS_MIB = 64.0
@dataclass
class Window:
    seconds: float
    agent_cpu: float
    idle_cpu: float
    echo_cpu: float
    pod_resources_calls: int
    api_requests: int
    probes: int

    @property
    def agent_share(self) -> float:
        return self.agent_cpu / self.seconds

    @property
    def idle_share(self) -> float:
        return self.idle_cpu / self.seconds

    @property
    def echo_share(self) -> float:
        return self.echo_cpu / self.seconds


class Watch:
    def __init__(self, agent: AgentProcess, idle: subprocess.Popen[bytes], echo: subprocess.Popen[bytes],
                 kubelet: KubeletEmulator, prod: Production, prober: Prober) -> None:
        self.agent, self.idle, self.echo = agent, idle, echo
        self.kubelet, self.prod, self.prober = kubelet, prod, prober

    def _probes(self) -> int:
        return sum(len(v) for v in self.prober.answers.values())

    def window(self, seconds: float) -> Window:
        a0, i0, t0 = cpu_seconds(self.agent.proc.pid), cpu_seconds(self.idle.pid), time.monotonic()
        e0 = cpu_seconds(self.echo.pid)
        p0, q0 = self.kubelet.pod_resources_calls, self._probes()
        api_since = time.monotonic()
        deadline = t0 + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 1.0))
            if self.agent.proc.poll() is not None:
                raise BenchError(f"the agent exited ({self.agent.proc.returncode}); log: {self.agent.log_path}")
        a1, i1, t1 = cpu_seconds(self.agent.proc.pid), cpu_seconds(self.idle.pid), time.monotonic()
        e1 = cpu_seconds(self.echo.pid)
        api = self.prod.api.count(since=api_since) if self.prod.api is not None else 0
        return Window(t1 - t0, a1 - a0, i1 - i0, e1 - e0, self.kubelet.pod_resources_calls - p0, api,
                      self._probes() - q0)


def pct(share: float) -> str:
    return f"{100 * share:.3f} %"


def run(quick: bool) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="bid-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
    rows: list[Row] = []
    idle: subprocess.Popen[bytes] | None = None
    echo: subprocess.Popen[bytes] | None = None
    try:
        tree = tmp / "root"
        (tmp / "nothing.pickle").write_bytes(pickle.dumps({}))
        write_sysfs_tree(load_embedded(SHAPE), tree)
        with Production(tmp) as prod, KubeletEmulator(tmp / "k") as kubelet:
            spawned = time.monotonic()
            agent = prod.agent(kubelet, tree)
            idle = subprocess.Popen([str(prod.install.python), "-c", "import time; time.sleep(600)"],
                                    stdin=subprocess.DEVNULL, cwd=tmp, env=prod.install.run_env())
            echo = spawn_echo(prod.install, tmp / "echo.sock", tmp / "nothing.pickle")
            prober: Prober | None = None
            try:
                try:
                    kubelet.wait_registered(RESOURCE, 30)
                except TimeoutError:
                    raise BenchError(f"the agent never registered {RESOURCE} (log: {agent.log_path})") from None
                registered = time.monotonic() - spawned
                prober = Prober(agent.metrics_port)
                if prod.api is not None:
                    wait_until(lambda: prod.api is not None and prod.api.count("PATCH") >= 1, 30,
                               "the agent's node labels")
                    labels = prod.api.labels()
                    if labels.get("topology.s390x.ibm.com/books") != "16":
                        raise BenchError(f"the node labels are wrong: {labels}")
                time.sleep(SETTLE)
                watch = Watch(agent, idle, echo, kubelet, prod, prober)
                first_len = 10.0 if quick else max(10.0, 58.0 - (time.monotonic() - spawned))
                first = watch.window(first_len)
                rss_first = agent.rss_kib()
                steady: list[Window] = []
                rss = hwm = idle_rss = 0
                echo_rss = status_kib(echo.pid, "VmRSS")
                if not quick:
                    wait = STEADY_FROM - (time.monotonic() - spawned)
                    if wait > 0:
                        time.sleep(wait)
                    steady = [watch.window(STEADY_SECONDS / STEADY_PARTS) for _ in range(STEADY_PARTS)]
                    rss, hwm, idle_rss = agent.rss_kib(), agent.status_kib("VmHWM"), status_kib(idle.pid, "VmRSS")
                else:
                    idle_rss = status_kib(idle.pid, "VmRSS")
                if kubelet.registrations(RESOURCE) != 1:
                    raise BenchError("the agent registered again while idle")
                probes_ok = all(s == 200 for answers in prober.answers.values() for s in answers)
            finally:
                if prober is not None:
                    prober.stop()
                agent.stop()
            setup = f"{prod.labels_note}; {prod.install.how}; registered {registered:.2f} s after the spawn"
    finally:
        for proc in (idle, echo):
            if proc is not None:
                stop_process(proc)
        shutil.rmtree(tmp, ignore_errors=True)

    rows.append(Row(BENCH, "idle CPU, first minute (pod-resources every 2 s)",
                    f"{pct(first.agent_share)} of a core over {first.seconds:.0f} s (idle python "
                    f"{pct(first.idle_share)}, idle grpc echo {pct(first.echo_share)}); "
                    f"{first.pod_resources_calls} pod-resources Lists, "
                    f"{first.probes} probes, {first.api_requests} API requests", first.agent_share, "", INFO,
                    raw={"window": first.__dict__}))
    if quick:
        rows.append(Row(BENCH, "RSS after 15 s (quick)", f"{rss_first / 1024:.1f} MiB (idle python "
                        f"{idle_rss / 1024:.1f} MiB, idle grpc echo {echo_rss / 1024:.1f} MiB)", rss_first / 1024,
                        f"<= {TARGET_RSS_MIB:.0f} MiB", at_most(rss_first / 1024, TARGET_RSS_MIB),
                        raw={"rss_kib": rss_first, "echo_rss_kib": echo_rss}))
        reason = "quick mode: pod-resources slows down only a minute after the last change"
        rows.append(skipped(BENCH, "idle CPU, steady", f"<= {pct(TARGET_CPU_SHARE)}", reason))
        rows.append(skipped(BENCH, "steady RSS", f"<= {TARGET_RSS_MIB:.0f} MiB", reason))
    else:
        total = sum(w.seconds for w in steady)
        share = sum(w.agent_cpu for w in steady) / total
        idle_share = sum(w.idle_cpu for w in steady) / total
        echo_share = sum(w.echo_cpu for w in steady) / total
        parts = "/".join(f"{100 * w.agent_share:.2f}" for w in steady)
        rows.append(Row(BENCH, "idle CPU, steady, 400 CPUs",
                        f"{pct(share)} of a core over {total:.0f} s (parts {parts} %; "
                        f"idle python {pct(idle_share)}, idle grpc echo {pct(echo_share)}); "
                        f"{sum(w.pod_resources_calls for w in steady)} pod-resources "
                        f"Lists, {sum(w.probes for w in steady)} probes, {sum(w.api_requests for w in steady)} API "
                        f"requests", share, f"<= {pct(TARGET_CPU_SHARE)}", at_most(share, TARGET_CPU_SHARE),
                        raw={"windows": [w.__dict__ for w in steady]}))
        rows.append(Row(BENCH, "steady RSS", f"{rss / 1024:.1f} MiB (VmHWM {hwm / 1024:.1f} MiB; idle python "
                        f"{idle_rss / 1024:.1f} MiB, idle grpc echo {echo_rss / 1024:.1f} MiB; "
                        f"{rss_first / 1024:.1f} MiB in the first minute)", rss / 1024,
                        f"<= {TARGET_RSS_MIB:.0f} MiB", at_most(rss / 1024, TARGET_RSS_MIB),
                        raw={"rss_kib": rss, "hwm_kib": hwm, "idle_rss_kib": idle_rss, "echo_rss_kib": echo_rss,
                             "first_rss_kib": rss_first}))
    rows.append(Row(BENCH, "set-up", f"node {NODE_NAME}; probes all answered 200: {'yes' if probes_ok else 'NO'}",
                    None, "", INFO, setup))
    return rows


def main(argv: list[str] | None = None) -> int:
    return bench_main(BENCH, run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
