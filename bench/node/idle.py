"""Idle cost with production defaults: the running agent's CPU time and memory on a node doing nothing.

Four agents run side by side over the same windows, each with its own kubelet emulator and probes:
``z16-400`` with the API server up (the row quoted since the start), and the generated ``z17-382``
(``bench/lib/shapes.py``) with the API server up, with the pod's service account and environment but a
port that refuses connections, and with no service account but a ``KUBECONFIG`` naming such a port
(node labels on in all four). Each also gets a row of the warnings it logged.

The agent runs as the chart runs it (``bench/lib/production.py``: the image-like install, node labels over
TLS in a private mount namespace, metrics on with kubelet's probes hitting ``/readyz`` every 5 s and
``/healthz`` every 10 s, kubelet's ``config.yaml`` and ``cpu_manager_state``, JSON logs at info, a rescan
every 5 s, pod-resources every 2 s while devices change hands and every 30 s once nothing has for a
minute) on the ``z16-400`` host-root tree, next to the kubelet emulator in this process. Two references start
alongside and are measured over the same windows: an idle ``python -c "import time; time.sleep(N)"`` and an
idle bare gRPC server (``bench/lib/grpc_load.py echo``: a sync ``grpc.server`` with 16 threads on a Unix socket,
what gRPC alone costs at rest), both with the same interpreter.

* **First minute** (info): from 3 s after registration to 58 s after the spawn, while pod-resources is
  still polled every 2 s.
* **Steady** (the targets): a window from 65 s after the spawn, 120 s long, in 4 parts (their spread is
  the noise). CPU: utime + stime of every thread (``/proc/<pid>/stat``, 10 ms ticks) as a share of one
  core; target <= 0.2 %. RSS: ``VmRSS`` at the end of the window; target <= 64 MiB.

``--quick`` measures only a 10 s window of the first minute and the RSS then; the steady rows are
skipped (pod-resources slows down only after a minute).

    .venv/bin/python bench/node/idle.py [--quick]
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.topology.embedded import load_embedded
from bench.lib.common import INFO, BenchError, Row, at_most, bench_main, skipped, stop_process
from bench.lib.production import NODE_NAME, Prober, Production
from bench.lib.shapes import Z17_382
from bench.node.allocate import spawn_echo
from topology_devkit.agent_process import AgentProcess, cpu_seconds, status_kib
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.synthetic import build_topology
from topology_devkit.sysfs_writer import write_sysfs_tree
from topology_devkit.testing.wait import wait_until

BENCH = "idle"
SHAPE = "z16-400"
RESOURCE = "topology/book"
SETTLE = 3.0  # seconds after registration before the first window
STEADY_FROM = 65.0  # seconds after the spawn: pod-resources has slowed down (60 s without a change)
STEADY_SECONDS = 120.0  # 10 ms CPU ticks: +-0.02 % of a core over the window
STEADY_PARTS = 4
TARGET_CPU_SHARE = 0.002  # of one core
TARGET_RSS_MIB = 64.0
@dataclass(frozen=True)
class Case:
    """One agent of the run: its shape and what its API server does."""

    key: str
    shape: str
    api: str  # Production's api: up, refused, refused-kubeconfig
    label: str  # the row's words


CASES = (
    Case("z16", SHAPE, "up", "400 CPUs"),
    Case("z17-up", Z17_382.name, "up", "z17-382 (382 CPUs), API server up"),
    Case("z17-refused", Z17_382.name, "refused",
         "z17-382, API server refusing connections (in-cluster service account)"),
    Case("z17-kubeconfig", Z17_382.name, "refused-kubeconfig",
         "z17-382, API server refusing connections (KUBECONFIG)"),
)


@dataclass
class Window:
    seconds: float
    agent_cpu: dict[str, float]
    idle_cpu: float
    echo_cpu: float
    pod_resources_calls: dict[str, int]
    api_requests: int
    probes: dict[str, int]
    log_lines: dict[str, int]

    def agent_share(self, key: str) -> float:
        return self.agent_cpu[key] / self.seconds

    @property
    def idle_share(self) -> float:
        return self.idle_cpu / self.seconds

    @property
    def echo_share(self) -> float:
        return self.echo_cpu / self.seconds


@dataclass
class Running:
    case: Case
    prod: Production
    kubelet: KubeletEmulator
    agent: AgentProcess
    prober: Prober | None = None

    def probes(self) -> int:
        return sum(len(v) for v in self.prober.answers.values()) if self.prober is not None else 0

    def log_lines(self) -> int:
        try:
            return len(self.agent.log_path.read_bytes().splitlines())
        except OSError:
            return 0


class Watch:
    def __init__(self, running: list[Running], idle: subprocess.Popen[bytes], echo: subprocess.Popen[bytes]) -> None:
        self.running, self.idle, self.echo = running, idle, echo

    def window(self, seconds: float) -> Window:
        a0 = {r.case.key: cpu_seconds(r.agent.proc.pid) for r in self.running}
        i0, e0, t0 = cpu_seconds(self.idle.pid), cpu_seconds(self.echo.pid), time.monotonic()
        p0 = {r.case.key: r.kubelet.pod_resources_calls for r in self.running}
        q0 = {r.case.key: r.probes() for r in self.running}
        l0 = {r.case.key: r.log_lines() for r in self.running}
        api_since = time.monotonic()
        deadline = t0 + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 1.0))
            for r in self.running:
                if r.agent.proc.poll() is not None:
                    raise BenchError(f"the agent ({r.case.label}) exited ({r.agent.proc.returncode}); log: "
                                     f"{r.agent.log_path}")
        a1 = {r.case.key: cpu_seconds(r.agent.proc.pid) for r in self.running}
        i1, e1, t1 = cpu_seconds(self.idle.pid), cpu_seconds(self.echo.pid), time.monotonic()
        api = sum(r.prod.api.count(since=api_since) for r in self.running if r.prod.api_up and r.prod.api)
        return Window(t1 - t0, {k: a1[k] - a0[k] for k in a1}, i1 - i0, e1 - e0,
                      {r.case.key: r.kubelet.pod_resources_calls - p0[r.case.key] for r in self.running}, api,
                      {r.case.key: r.probes() - q0[r.case.key] for r in self.running},
                      {r.case.key: r.log_lines() - l0[r.case.key] for r in self.running})


def pct(share: float) -> str:
    return f"{100 * share:.3f} %"


def write_tree(name: str, target: Path) -> None:
    model = build_topology(Z17_382) if name == Z17_382.name else load_embedded(name)
    write_sysfs_tree(model, target)


def run(quick: bool) -> list[Row]:
    """Every case's agent side by side (each its own kubelet emulator, API server and probes), one idle
    python and one idle echo alongside, all measured over the same windows."""
    tmp = Path(tempfile.mkdtemp(prefix="bid-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
    rows: list[Row] = []
    idle: subprocess.Popen[bytes] | None = None
    echo: subprocess.Popen[bytes] | None = None
    running: list[Running] = []
    try:
        trees = {}
        for name in dict.fromkeys(c.shape for c in CASES):
            trees[name] = tmp / f"root-{name}"
            write_tree(name, trees[name])
        (tmp / "nothing.pickle").write_bytes(pickle.dumps({}))
        with contextlib.ExitStack() as stack:
            for case in CASES:
                work = tmp / case.key
                work.mkdir()
                prod = stack.enter_context(Production(work, api=case.api))
                kubelet = stack.enter_context(KubeletEmulator(work / "k"))
                running.append(Running(case, prod, kubelet, prod.agent(kubelet, trees[case.shape])))
                stack.callback(running[-1].agent.stop)
            spawned = time.monotonic()
            install = running[0].prod.install
            idle = subprocess.Popen([str(install.python), "-c", "import time; time.sleep(900)"],
                                    stdin=subprocess.DEVNULL, cwd=tmp, env=install.run_env())
            echo = spawn_echo(install, tmp / "echo.sock", tmp / "nothing.pickle")
            registered: dict[str, float] = {}
            for r in running:
                try:
                    r.kubelet.wait_registered(RESOURCE, 30)
                except TimeoutError:
                    raise BenchError(f"the agent ({r.case.label}) never registered {RESOURCE} (log: "
                                     f"{r.agent.log_path})") from None
                registered[r.case.key] = time.monotonic() - spawned
                r.prober = Prober(r.agent.metrics_port)
                stack.callback(r.prober.stop)
            for r in running:
                fake = r.prod.api
                if r.prod.api_up and fake is not None:
                    wait_until("the agent's node labels", functools.partial(lambda f: f.count("PATCH") >= 1, fake), 30)
                    labels = fake.labels()
                    if labels.get("topology.s390x.ibm.com/books") != "16":
                        raise BenchError(f"the node labels are wrong: {labels}")
            time.sleep(SETTLE)
            watch = Watch(running, idle, echo)
            first_len = 10.0 if quick else max(10.0, 58.0 - (time.monotonic() - spawned))
            first = watch.window(first_len)
            rss_first = {r.case.key: r.agent.rss_kib() for r in running}
            steady: list[Window] = []
            rss: dict[str, int] = {}
            hwm: dict[str, int] = {}
            echo_rss = status_kib(echo.pid, "VmRSS")
            if not quick:
                wait = STEADY_FROM - (time.monotonic() - spawned)
                if wait > 0:
                    time.sleep(wait)
                steady = [watch.window(STEADY_SECONDS / STEADY_PARTS) for _ in range(STEADY_PARTS)]
                rss = {r.case.key: r.agent.rss_kib() for r in running}
                hwm = {r.case.key: r.agent.status_kib("VmHWM") for r in running}
            idle_rss = status_kib(idle.pid, "VmRSS")
            for r in running:
                if r.kubelet.registrations(RESOURCE) != 1:
                    raise BenchError(f"the agent ({r.case.label}) registered again while idle")
            probes_ok = all(s == 200 for r in running if r.prober is not None
                            for answers in r.prober.answers.values() for s in answers)
            warnings = {r.case.key: [f"{e.get('logger', '')}: {e.get('msg', '')}" for e in r.agent.log()
                                     if e.get("level") in ("warning", "error", "critical")]
                        for r in running}
            setup = (f"{'; '.join(f'{r.case.key}: {r.prod.labels_note}' for r in running)}; {install.how}; "
                     f"registered {', '.join(f'{registered[r.case.key]:.2f}' for r in running)} s after the spawn")
    finally:
        for proc in (idle, echo):
            if proc is not None:
                stop_process(proc)
        shutil.rmtree(tmp, ignore_errors=True)

    for r in running:
        key, case = r.case.key, r.case
        rows.append(Row(BENCH, f"idle CPU, first minute (pod-resources every 2 s), {case.label}",
                        f"{pct(first.agent_share(key))} of a core over {first.seconds:.0f} s (idle python "
                        f"{pct(first.idle_share)}, idle grpc echo {pct(first.echo_share)}); "
                        f"{first.pod_resources_calls[key]} pod-resources Lists, {first.probes[key]} probes, "
                        f"{first.log_lines[key]} log lines", first.agent_share(key), "", INFO,
                        raw={"case": key, "window": first.__dict__}))
    if quick:
        reason = "quick mode: pod-resources slows down only a minute after the last change"
        for r in running:
            rows.append(Row(BENCH, f"RSS after 15 s (quick), {r.case.label}",
                            f"{rss_first[r.case.key] / 1024:.1f} MiB (idle python {idle_rss / 1024:.1f} MiB, idle "
                            f"grpc echo {echo_rss / 1024:.1f} MiB)", rss_first[r.case.key] / 1024,
                            f"<= {TARGET_RSS_MIB:.0f} MiB", at_most(rss_first[r.case.key] / 1024, TARGET_RSS_MIB),
                            raw={"case": r.case.key, "rss_kib": rss_first[r.case.key], "echo_rss_kib": echo_rss}))
        rows.append(skipped(BENCH, "idle CPU, steady", f"<= {pct(TARGET_CPU_SHARE)}", reason))
        rows.append(skipped(BENCH, "steady RSS", f"<= {TARGET_RSS_MIB:.0f} MiB", reason))
    else:
        total = sum(w.seconds for w in steady)
        idle_share = sum(w.idle_cpu for w in steady) / total
        echo_share = sum(w.echo_cpu for w in steady) / total
        for r in running:
            key, case = r.case.key, r.case
            share = sum(w.agent_cpu[key] for w in steady) / total
            parts = "/".join(f"{100 * w.agent_share(key):.2f}" for w in steady)
            requests = (f", {sum(w.api_requests for w in steady)} API requests (all agents with an API server up)"
                        if key == CASES[0].key else "")
            rows.append(Row(BENCH, f"idle CPU, steady, {case.label}",
                            f"{pct(share)} of a core over {total:.0f} s (parts {parts} %; "
                            f"idle python {pct(idle_share)}, idle grpc echo {pct(echo_share)}); "
                            f"{sum(w.pod_resources_calls[key] for w in steady)} pod-resources Lists, "
                            f"{sum(w.probes[key] for w in steady)} probes, "
                            f"{sum(w.log_lines[key] for w in steady)} log lines{requests}", share,
                            f"<= {pct(TARGET_CPU_SHARE)}", at_most(share, TARGET_CPU_SHARE),
                            raw={"case": key, "windows": [{"seconds": w.seconds, "agent_cpu": w.agent_cpu[key],
                                                           "idle_cpu": w.idle_cpu, "echo_cpu": w.echo_cpu}
                                                          for w in steady]}))
        for r in running:
            key = r.case.key
            rows.append(Row(BENCH, f"steady RSS, {r.case.label}",
                            f"{rss[key] / 1024:.1f} MiB (VmHWM {hwm[key] / 1024:.1f} MiB; idle python "
                            f"{idle_rss / 1024:.1f} MiB, idle grpc echo {echo_rss / 1024:.1f} MiB; "
                            f"{rss_first[key] / 1024:.1f} MiB in the first minute)", rss[key] / 1024,
                            f"<= {TARGET_RSS_MIB:.0f} MiB", at_most(rss[key] / 1024, TARGET_RSS_MIB),
                            raw={"case": key, "rss_kib": rss[key], "hwm_kib": hwm[key], "idle_rss_kib": idle_rss,
                                 "echo_rss_kib": echo_rss, "first_rss_kib": rss_first[key]}))
    for r in running:
        said = warnings[r.case.key]
        rows.append(Row(BENCH, f"warnings logged, {r.case.label}", f"{len(said)}" + (
            f": {' | '.join(m[:160] for m in said[:3])}" if said else ""), len(said), "", INFO))
    rows.append(Row(BENCH, "set-up", f"node {NODE_NAME}; probes all answered 200: {'yes' if probes_ok else 'NO'}",
                    None, "", INFO, setup))
    return rows


def main(argv: list[str] | None = None) -> int:
    return bench_main(BENCH, run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
