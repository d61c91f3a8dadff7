"""Where the agent's time goes: the production-default agent under a bench's load, profiled from outside.

Not a bench (no rows, no targets): the tool behind the hotspots ``bench/HISTORY.md`` reports. It starts the
agent as ``bench/lib/production.py`` does on the ``z16-400`` tree, puts one load on it, and while the load runs
samples it with ``py-spy record`` (when given: ``--py-spy PATH``; ``pip install py-spy`` in any venv) and
counts its system calls with ``strace -c -f`` (``--strace``), then prints:

* CPU seconds per thread over the window (``/proc/<pid>/task/*/schedstat``, nanoseconds), by the
  thread's OS name (Python's name where py-spy is given);
* py-spy's samples by function: self (the frame on top) and inclusive (anywhere on the stack), Python
  frames only unless ``--native``;
* strace's table (calls and errors per system call).

Loads: ``allocate`` (a load client as in ``allocate.py``: ``--kind repeated|first-time``,
``--clients N``; the agent alone, no echo), ``cpu-per-call`` (the agent, then the echo, each alone under
the same client), ``idle`` (nothing; the probes of the chart), ``discover`` (``topology-agent discover
--format json`` run once each under ``python -X importtime``, ``cProfile`` and ``strace -c``, against
``lscpu -J`` under ``strace -c``).

    .venv/bin/python bench/profile_agent.py allocate --kind first-time --clients 4 --seconds 10 --py-spy PATH
    .venv/bin/python bench/profile_agent.py idle --seconds 120 --strace
    .venv/bin/python bench/profile_agent.py idle --seconds 60 --wakeups --py-spy PATH
    .venv/bin/python bench/profile_agent.py cpu-per-call --clients 4
    .venv/bin/python bench/profile_agent.py discover
"""

from __future__ import annotations

import argparse
import collections
import io
import itertools
import pickle
import pstats
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.plugin.server import socket_name
from agent.policy.grouping import GroupingSettings, group_topology
from agent.topology.embedded import load_embedded
from agent.topology.sysfs import read_sysfs
from bench.lib.common import median, quiet_emulator, stop_process
from bench.lib.production import Prober, Production, image_install
from bench.node.allocate import (
    LOAD,
    REPEATED_SETS,
    RESOURCE,
    answer_bytes,
    device_sets,
    first_time_sets,
    request_bytes,
    spawn_echo,
)
from topology_devkit.agent_process import AgentProcess
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.sysfs_writer import write_sysfs_tree


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (OS thread name, CPU seconds so far): the scheduler's nanoseconds on a CPU (schedstat),
    not 10 ms ticks, so that an idle thread's share resolves."""
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            on_cpu_ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
        out[int(task.name)] = (name, on_cpu_ns / 1e9)
    return out


def minor_faults(pid: int) -> int:
    """Minor page faults of the process so far (``/proc/<pid>/stat`` field 10): new memory touched."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every live thread so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in lines if "ctxt_switches:" in line)
    return total


def report_threads(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float,
                   names: dict[int, str] | None = None) -> None:
    """CPU per thread name; ``names`` (tid -> Python's thread name, from py-spy) splits the Python threads."""
    by_name: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.defaultdict(int)
    for tid, (name, cpu) in after.items():
        name = (names or {}).get(tid, name)
        by_name[name] += cpu - before.get(tid, (name, 0.0))[1]
        count[name] += 1
    print(f"\nCPU per thread over {seconds:.0f} s (threads that ended in the window are not counted):")
    for name, cpu in sorted(by_name.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<24} x{count[name]:<3} {cpu:8.3f} s  {100 * cpu / seconds:6.3f} % of a core")


def summarize_collapsed(path: Path, top: int = 25) -> None:
    """py-spy's raw (collapsed) stacks: 'frame;frame;... count' per line."""
    self_count: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        count = int(n)
        total += count
        frames = stack.split(";")
        self_count[frames[-1]] += count
        for frame in set(frames):
            incl[frame] += count
    print(f"\npy-spy: {total} samples")
    print("  self (top of the stack):")
    for frame, samples in self_count.most_common(top):
        print(f"    {100 * samples / total:5.1f} %  {frame}")
    print("  inclusive:")
    for frame, samples in incl.most_common(top):
        print(f"    {100 * samples / total:5.1f} %  {frame}")


class Samplers:
    """py-spy and strace attached to ``pid`` until :meth:`finish` (SIGINT: both write their results then)."""

    def __init__(self, pid: int, py_spy: str | None, native: bool, gil: bool, strace: bool, tmp: Path) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        if py_spy:
            out = tmp / "py-spy.txt"
            command = [py_spy, "record", "-p", str(pid), "-r", "250", "--format", "raw", "-o", str(out)]
            command += ["--native"] if native else ["--nonblocking"]  # native stacks need the process paused
            command += ["--gil"] if gil else []
            self.procs.append(("py-spy", subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                                          stderr=subprocess.PIPE), out))
        if strace and shutil.which("strace"):
            out = tmp / "strace.txt"
            self.procs.append(("strace", subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(pid)],
                                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out))
        time.sleep(0.5)  # attached
        self.names = thread_names(pid, py_spy)
        self.before = thread_cpu(pid)
        self.pid = pid
        self.started = time.monotonic()

    def finish(self) -> None:
        after = thread_cpu(self.pid)
        seconds = time.monotonic() - self.started
        for _, proc, _ in self.procs:
            proc.send_signal(signal.SIGINT)
        for name, proc, out in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                stop_process(proc)
            if name == "py-spy" and out.is_file():
                summarize_collapsed(out)
            elif name == "py-spy" and proc.stderr is not None:
                print(f"py-spy failed: {proc.stderr.read().decode()[-500:]}")
            elif out.is_file():
                print("\nstrace -c -f:")
                print(out.read_text())
        report_threads(self.before, after, seconds, self.names)


def profile_allocate(args: argparse.Namespace, tmp: Path, tree: Path) -> None:
    """The agent alone under the load client (one target: side A only)."""
    grouping = group_topology(read_sysfs(tree, tree / "proc", details=False), GroupingSettings())
    groups = grouping.by_id(RESOURCE)
    sets = device_sets(list(groups.values()))
    if args.kind == "repeated":
        requests = [request_bytes(ids) for ids in sets[:REPEATED_SETS]] * 2000
    elif args.kind == "first-time":  # the bench's: about 300 balanced sets, each new to the agent
        requests = [request_bytes(ids) for ids in first_time_sets(sets, REPEATED_SETS)]
    else:  # every ordered list of 1 to 4 books, balanced or not (unbalanced ones log a warning each)
        ids = sorted(groups)
        sets = [p for k in range(1, 5) for p in itertools.permutations(ids, k)]
        random.Random(15).shuffle(sets)
        requests = [request_bytes(s) for s in sets]
    with Production(tmp) as prod, KubeletEmulator(tmp / "k") as kubelet:
        agent = prod.agent(kubelet, tree)
        try:
            kubelet.wait_registered(RESOURCE, 30)
            target = f"unix://{kubelet.device_plugin_dir / socket_name(RESOURCE)}"
            spec = {"targets": (target,), "warmup": [], "blocks": [requests[:args.calls]], "expected": {},
                    "concurrency": args.clients, "compare": "none"}
            (tmp / "spec.pickle").write_bytes(pickle.dumps(spec))
            samplers = Samplers(agent.proc.pid, args.py_spy, args.native, args.gil, args.strace, tmp)
            client = subprocess.Popen([sys.executable, str(LOAD), "drive", str(tmp / "spec.pickle"),
                                       str(tmp / "out.pickle")])
            try:
                client.wait(args.seconds)
            except subprocess.TimeoutExpired:
                stop_process(client)
            samplers.finish()
            if (tmp / "out.pickle").is_file():
                latencies = pickle.loads((tmp / "out.pickle").read_bytes())["latencies"][0][0]
                print(f"\n{len(latencies)} calls, p50 {1e6 * median(latencies):.0f} us")
        finally:
            agent.stop()


def cpu_per_call(args: argparse.Namespace, tmp: Path, tree: Path) -> None:
    """CPU seconds per Allocate of the agent and of the echo (every thread), each alone under the same
    client, repeated and first-time sets, at --clients: where a ratio comes from."""
    grouping = group_topology(read_sysfs(tree, tree / "proc", details=False), GroupingSettings())
    groups = grouping.by_id(RESOURCE)
    sets = device_sets(list(groups.values()))
    table = {request_bytes(ids): answer_bytes(groups, ids) for ids in sets}
    (tmp / "answers.pickle").write_bytes(pickle.dumps(table))
    repeated = [request_bytes(ids) for ids in sets[:REPEATED_SETS]]
    fresh = [request_bytes(ids) for ids in first_time_sets(sets, REPEATED_SETS)]
    with Production(tmp) as prod, KubeletEmulator(tmp / "k") as kubelet:
        agent = prod.agent(kubelet, tree)
        echo = None
        try:
            kubelet.wait_registered(RESOURCE, 30)
            echo = spawn_echo(prod.install, tmp / "echo.sock", tmp / "answers.pickle")
            targets = {"agent": (f"unix://{kubelet.device_plugin_dir / socket_name(RESOURCE)}", agent.proc.pid),
                       "echo": (f"unix://{tmp / 'echo.sock'}", echo.pid)}
            for kind, requests in (("repeated", (repeated * 200)[:4000]), ("first-time", fresh[:4000])):
                for name, (target, pid) in targets.items():
                    spec = {"targets": (target,), "warmup": [], "blocks": [requests], "expected": table,
                            "concurrency": args.clients, "compare": "none"}
                    (tmp / "spec.pickle").write_bytes(pickle.dumps(spec))
                    handler = handler_seconds(agent) if name == "agent" else None
                    before = sum(cpu for _, cpu in thread_cpu(pid).values())
                    switches, faults = context_switches(pid), minor_faults(pid)
                    subprocess.run([sys.executable, str(LOAD), "drive", str(tmp / "spec.pickle"),
                                    str(tmp / "out.pickle")], check=True)
                    used = sum(cpu for _, cpu in thread_cpu(pid).values()) - before
                    switches = context_switches(pid) - switches
                    faults = minor_faults(pid) - faults
                    lat = pickle.loads((tmp / "out.pickle").read_bytes())["latencies"][0][0]
                    inside = ""
                    if handler is not None:  # the servicer's own clock: wall time inside Allocate, GIL waits too
                        after = handler_seconds(agent)
                        per_call = (after[0] - handler[0]) / max(after[1] - handler[1], 1)
                        inside = f", {1e6 * per_call:4.0f} us in Allocate"
                    print(f"{kind:<10} {name:<5} x{args.clients}: {1e6 * used / len(requests):6.0f} us CPU per call, "
                          f"{switches / len(requests):5.1f} context switches and {faults / len(requests):4.1f} minor "
                          f"faults per call, p50 "
                          f"{1e6 * median(lat):6.0f} us ({len(requests)} calls){inside}", flush=True)
        finally:
            agent.stop()
            if echo is not None:
                stop_process(echo)


def handler_seconds(agent: AgentProcess) -> tuple[float, float]:
    """(seconds, calls) of Allocate so far by the agent's own histogram (its servicer's clock)."""
    metrics = agent.metrics()
    labels = (("method", "Allocate"), ("resource", RESOURCE))
    return (metrics.get(("topology_agent_rpc_duration_seconds_sum", labels), 0.0),
            metrics.get(("topology_agent_rpc_duration_seconds_count", labels), 0.0))


def thread_names(pid: int, py_spy: str | None) -> dict[int, str]:
    """tid -> name: Python's thread names from ``py-spy dump`` when given, else the OS's."""
    names = {tid: name for tid, (name, _) in thread_cpu(pid).items()}
    if py_spy:
        dump = subprocess.run([py_spy, "dump", "-p", str(pid)], capture_output=True, text=True, check=False).stdout
        for match in re.finditer(r'Thread (\d+) \([^)]*\): "([^"]+)"', dump):
            names[int(match.group(1))] = match.group(2)
    return names


def wakeups(pid: int, seconds: float, py_spy: str | None, tmp: Path) -> None:
    """Blocking calls per thread (each return is a wake-up) over ``seconds``, from ``strace -f``."""
    names = thread_names(pid, py_spy)
    out = tmp / "wakeups.txt"
    calls = "futex,epoll_wait,epoll_pwait,poll,ppoll,select,pselect6,nanosleep,clock_nanosleep,accept4,recvmsg"
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", str(out), "-p", str(pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    tracer.send_signal(signal.SIGINT)
    tracer.wait(30)
    per: collections.Counter[tuple[int, str]] = collections.Counter()
    for line in out.read_text().splitlines():
        match = re.match(r"(\d+)\s+(\w+)\(", line)
        if match and "resumed" not in line:
            per[(int(match.group(1)), match.group(2))] += 1
    print(f"\nblocking calls per thread over {seconds:.0f} s (strace -f; each one returns once: a wake-up):")
    by_thread: dict[int, list[str]] = collections.defaultdict(list)
    totals: collections.Counter[int] = collections.Counter()
    for (tid, call), n in per.items():
        by_thread[tid].append(f"{call} {n}")
        totals[tid] += n
    for tid, n in totals.most_common():
        print(f"  {names.get(tid, '?'):<28} tid {tid:<7} {n / seconds:7.1f}/s  ({', '.join(sorted(by_thread[tid]))})")


def profile_idle(args: argparse.Namespace, tmp: Path, tree: Path) -> None:
    with Production(tmp) as prod, KubeletEmulator(tmp / "k") as kubelet:
        agent = prod.agent(kubelet, tree)
        prober = None
        try:
            kubelet.wait_registered(RESOURCE, 30)
            prober = Prober(agent.metrics_port)
            print(f"waiting {args.settle:.0f} s for the steady state", flush=True)
            time.sleep(args.settle)
            if args.wakeups:
                wakeups(agent.proc.pid, args.seconds, args.py_spy, tmp)
                return
            samplers = Samplers(agent.proc.pid, args.py_spy, args.native, args.gil, args.strace, tmp)
            start, seen = agent.cpu_seconds(), dict(thread_cpu(agent.proc.pid))
            first = dict(seen)
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:  # threads that come and go are seen too (every 0.2 s)
                time.sleep(0.2)
                seen.update(thread_cpu(agent.proc.pid))
            total = agent.cpu_seconds() - start
            samplers.finish()
            born = {tid: v for tid, v in seen.items() if tid not in first}
            print(f"\nprocess CPU over {args.seconds:.0f} s: {100 * total / args.seconds:.3f} % of a core; "
                  f"threads started in the window: {len(born)} "
                  f"({', '.join(sorted({name for name, _ in born.values()})) or 'none'}), "
                  f"their CPU as last seen {sum(cpu for _, cpu in born.values()):.2f} s")
        finally:
            if prober is not None:
                prober.stop()
            agent.stop()


def profile_discover(args: argparse.Namespace, tmp: Path, tree: Path) -> None:
    install = image_install()
    env = install.run_env()
    command = ["discover", "--format", "json", "--host-root", str(tree), "--proc-root", str(tree / "proc")]
    done = subprocess.run([str(install.python), "-X", "importtime", str(install.script), *command], env=env,
                          cwd=tmp, capture_output=True, text=True, check=True)
    rows: list[tuple[int, int, str]] = []  # (self us, cumulative us, name indented by depth)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, below, module = line.removeprefix("import time:").split("|", 2)
        rows.append((int(own), int(below), module.rstrip()[1:]))
    total = sum(r[0] for r in rows)
    print(f"imports: {len(rows)} modules, {total / 1000:.1f} ms self in all (python -X importtime)")
    print("  top-level imports by cumulative time:")
    for row in sorted((r for r in rows if not r[2].startswith(" ")), key=lambda r: -r[1])[:15]:
        print(f"    {row[1] / 1000:6.1f} ms  {row[2]}")
    print("  modules by self time:")
    for row in sorted(rows, key=lambda r: -r[0])[:15]:
        print(f"    {row[0] / 1000:6.2f} ms  {row[2].strip()}")
    code = ("import cProfile, sys; from agent.cli import main; sys.argv[1:] = " + repr(command) +
            "; cProfile.run('main()', sys.argv[0] + '.prof')")
    prof = tmp / "discover"
    subprocess.run([str(install.python), "-c", code.replace("sys.argv[0] + '.prof'", repr(str(prof) + ".prof"))],
                   env=env, cwd=tmp, stdout=subprocess.DEVNULL, check=True)
    stream = io.StringIO()
    pstats.Stats(str(prof) + ".prof", stream=stream).sort_stats("cumulative").print_stats(25)
    print(stream.getvalue())
    if shutil.which("strace"):
        out = tmp / "strace.txt"
        subprocess.run(["strace", "-c", "-f", "-o", str(out), str(install.script), *command], env=env, cwd=tmp,
                       stdout=subprocess.DEVNULL, check=True)
        print("strace -c -f of discover:\n" + out.read_text())
        lscpu = shutil.which("lscpu")
        if lscpu:
            subprocess.run(["strace", "-c", "-f", "-o", str(out), lscpu, "-J", "--sysroot", str(tree),
                            "-e=CPU,CORE,SOCKET,BOOK,DRAWER,NODE,POLARIZATION,ADDRESS,CONFIGURED,ONLINE"],
                           stdout=subprocess.DEVNULL, check=True)
            print("strace -c -f of lscpu:\n" + out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("load", choices=("allocate", "cpu-per-call", "idle", "discover"))
    parser.add_argument("--kind", choices=("repeated", "first-time", "any-first-time"), default="first-time")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--calls", type=int, default=40000, help="allocate: calls the client sends at most")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=65.0, help="idle: seconds before the window")
    parser.add_argument("--py-spy", help="path of a py-spy binary")
    parser.add_argument("--native", action="store_true", help="py-spy --native (C frames too)")
    parser.add_argument("--gil", action="store_true", help="py-spy --gil (only the thread holding the GIL)")
    parser.add_argument("--strace", action="store_true", help="strace -c -f: system calls counted")
    parser.add_argument("--wakeups", action="store_true", help="idle: blocking calls per thread (strace -f)")
    args = parser.parse_args(argv)
    quiet_emulator()
    tmp = Path(tempfile.mkdtemp(prefix="bpr-", dir="/tmp"))
    try:
        tree = tmp / "root"
        write_sysfs_tree(load_embedded("z16-400"), tree)
        {"allocate": profile_allocate, "cpu-per-call": cpu_per_call, "idle": profile_idle,
         "discover": profile_discover}[args.load](args, tmp, tree)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
