"""What the agent is worth to an inference user, on a cluster ``make e2e-vllm`` left up
(``KEEP_CLUSTER=1 make e2e-vllm``: the chart installed as devkit/cluster/e2e.sh does, the vLLM image imported):

A vLLM server pod holding one book (topology_devkit.vllm.server's pod: the lane's tiny model, ``--enforce-eager``)
serves a fixed stream of completion requests (``--requests`` of 16 tokens each, one at a time, after 5 to warm
up) while a CPU-hog pod with no topology resource (two busy loops, requesting what CPU the node has left beside the
server: a neighbour of real standing, see :func:`hog_millicores`) runs on the same node. ``--runs`` rounds, each
one run per mode with a fresh server, interleaved (alone, enforcing, none, none, enforcing, alone, alone, ...):

* **alone**: the server with no hog (the ceiling), the agent as in enforcing;
* **enforcing**: ``cpusetEnforcement: cri`` with ``sharedPool: true``: the server on its book, the hog confined to
  the CPUs of no held book (and the reserved ones);
* **none**: ``cpusetEnforcement: none``: both float over every CPU (vLLM still binds its OpenMP thread to the CPU
  the agent named, so the hog lands on it).

Per run: request latency p50 and p99 and tokens per second, from a client on the node that connects to the pod's
address (no port-forward), and where the time went inside the server (bench/cluster/vllm_where.py). Per mode: the
median and min-max of each over the rounds, and of its ratio to the same round's alone run (vllm_figure.py). Target:
the median p99 ratio of enforcing <= 1.15x, and below none's.

As a real node (the default, ``--reserved-cpus 0``): the agent runs with ``agent.reservedCpus`` (``--reserved-cpus``,
as the admin docs say), so the reserved CPUs hold no book, and every user-space process of the host (the lane's, this
client's and any other) runs on them, as OpenShift's performance profile keeps a node's host processes
(topology_devkit.realcluster.confine); ``--lane-only``: only the lane's and this client; ``--unconfined``: every CPU a
book, the host floating. Each run also says what else ran on the book's CPUs (vllm_where.book_cpus). Skipped, with
the reason, when no such cluster is up or the vLLM image is not in its runtime.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.topology.cpulist import format_cpulist, parse_cpulist
from bench.cluster import vllm_figure, vllm_where
from bench.cluster.vllm_figure import Run
from bench.lib.common import INFO, MISSED, ROOT, Row, loadavg, median, percentile, skipped
from topology_devkit.testing.wait import wait_until

NAME = "vllm_beside_hog"
CLUSTER_DIR = Path(os.environ.get("CLUSTER_DIR") or ROOT / ".cluster")
KUBECONFIG = CLUSTER_DIR / "kubeconfig"
NAMESPACE = "topology-e2e-pods"
RELEASE, AGENT_NAMESPACE = "topology-agent", "topology-system"
HOG_IMAGE = "localhost/topology-e2e-busybox:latest"
HOG = "for i in 1 2; do (while :; do :; done) & done; wait"
TOKENS = 16
WARM_UP = 5
REQUESTS = 300  # per run: its p99 is a percentile (with 60 it is the slowest request)
ENFORCING = ("--set", "cpusetEnforcement=cri", "--set", "sharedPool=true")
MODES = {  # run -> (helm --set values, hog); alone runs the agent as enforcing does: only the hog differs
    "alone": (ENFORCING, False),
    "enforcing": (ENFORCING, True),
    "none": (("--set", "cpusetEnforcement=none"), True),
}


def _kubectl() -> str:
    out = subprocess.run([str(ROOT / "devkit" / "cluster" / "build.sh"), "--print"], capture_output=True, text=True,
                         check=True).stdout.strip()
    return str(Path(out) / "kubectl")


def _helm() -> str:
    for candidate in (os.environ.get("HELM"), str(ROOT / ".tools" / "bin" / "helm")):
        if candidate and Path(candidate).is_file():
            return candidate
    return "helm"


def kubectl(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_kubectl(), "--kubeconfig", str(KUBECONFIG), *args], capture_output=True, text=True,
                          timeout=timeout, check=check)


def _why_not(image: str) -> str | None:
    if not KUBECONFIG.is_file():
        return f"no cluster: {KUBECONFIG} missing (KEEP_CLUSTER=1 make e2e-vllm leaves one up)"
    done = kubectl("get", "nodes", "-o", "json", check=False)
    if done.returncode != 0:
        return f"the cluster does not answer: {done.stderr.strip()[:120]}"
    nodes = json.loads(done.stdout)["items"]
    if not nodes or int(nodes[0]["status"].get("capacity", {}).get("topology/book", "0")) < 1:
        return "the node advertises no topology/book: install the chart as devkit/cluster/e2e.sh does"
    def listed() -> bool:  # kubelet lists a new image in the Node's status at its next status update
        done = kubectl("get", "nodes", "-o", "json", check=False)
        return done.returncode == 0 and image in [i for n in json.loads(done.stdout)["items"]
                                                  for img in n["status"].get("images") or []
                                                  for i in img.get("names") or []]

    try:
        wait_until(f"{image} in the Node's images", listed, 90, every=2, error=RuntimeError)
    except RuntimeError:
        return f"{image} is not in the node's containerd (make e2e-vllm imports it)"
    return None


def helm_upgrade(*values: str) -> None:
    snapshot = CLUSTER_DIR / "snapshots" / "default.json"
    subprocess.run([_helm(), "upgrade", RELEASE, str(ROOT / "deploy" / "helm" / "s390x-topology-agent"),
                    "--namespace", AGENT_NAMESPACE, "--kubeconfig", str(KUBECONFIG),
                    "-f", str(ROOT / "devkit" / "cluster" / "e2e-values.yaml"),
                    "--set-file", f"fakeTopology.snapshots.default\\.json={snapshot}",
                    "--set", "seccompProfile.install=true", *values, "--wait", "--timeout", "180s"],
                   check=True, capture_output=True, text=True, timeout=240)
    # helm's --wait counts a one-node DaemonSet ready before its new pod is (E2EEnv.wait_for_rollout in
    # tests/support/e2e/cluster.py)
    for daemonset in kubectl("-n", AGENT_NAMESPACE, "get", "daemonset", "-o", "name", "-l",
                             f"app.kubernetes.io/instance={RELEASE}").stdout.split():
        kubectl("-n", AGENT_NAMESPACE, "rollout", "status", daemonset, "--timeout=180s", timeout=200)


def _pod_json(name: str) -> dict[str, Any]:
    done = kubectl("-n", NAMESPACE, "get", "pod", name, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


class AdmissionRefused(RuntimeError):
    """kubelet refused the pod at admission (its device manager between two registrations of the agent)."""


def _ready(name: str) -> bool:
    status = _pod_json(name).get("status", {})
    if status.get("phase") == "Failed" and status.get("reason") == "UnexpectedAdmissionError":
        raise AdmissionRefused(f"{name}: {status.get('message', '')}")
    if status.get("phase") in ("Failed", "Succeeded"):
        raise RuntimeError(f"{name} stopped: {kubectl('-n', NAMESPACE, 'logs', name, check=False).stdout[-2000:]}")
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def _apply(doc: dict[str, Any]) -> None:
    done = subprocess.run([_kubectl(), "--kubeconfig", str(KUBECONFIG), "apply", "-f", "-"], input=json.dumps(doc),
                          text=True, check=False, capture_output=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl apply of {doc['metadata']['name']}: {done.stderr.strip()}")


def _millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def hog_millicores(allocatable: str, requested: list[str], server: str = "1") -> int:
    """The hog's CPU request: whatever the node has left once the server's is counted (50m kept free), at least
    100m. Its CFS weight then matches what a neighbour of real standing gets: a hog requesting 100m beside a server
    requesting a whole CPU gets a tenth of the server's weight on a CPU both want, which no scheduler lets a real
    batch pod be held to. Pure."""
    left = _millicores(allocatable) - sum(map(_millicores, requested)) - _millicores(server) - 50
    return max(100, left)


def _hog_cpu(node: str) -> str:
    allocatable = json.loads(kubectl("get", "node", node, "-o", "json").stdout)["status"]["allocatable"]["cpu"]
    pods = json.loads(kubectl("get", "pods", "-A", "-o", "json", "--field-selector",
                              f"spec.nodeName={node},status.phase!=Succeeded,status.phase!=Failed").stdout)["items"]
    requested = [c.get("resources", {}).get("requests", {}).get("cpu", "0") for pod in pods
                 for c in pod["spec"]["containers"]]
    return f"{hog_millicores(allocatable, requested)}m"


def _hog(node: str, cpu: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"bench-hog-{uuid.uuid4().hex[:6]}",
                                                            "namespace": NAMESPACE, "labels": {"app": "vllm-bench"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 0, "containers": [{
                         "name": "hog", "image": HOG_IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", HOG],
                         "resources": {"requests": {"cpu": cpu, "memory": "8Mi"}, "limits": {"memory": "16Mi"}}}]}}


def _post_one(base: str) -> int:
    body = json.dumps({"model": "tiny", "prompt": "The agent gives each rank one book", "max_tokens": TOKENS,
                       "temperature": 0, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"{base}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return int(json.loads(answer.read())["usage"]["completion_tokens"])


def _stream(base: str, requests: int) -> tuple[list[float], float, int]:
    """(latencies, wall seconds, completion tokens) of ``requests`` sequential completions."""
    latencies: list[float] = []
    tokens = 0
    started = time.monotonic()
    for _ in range(requests):
        t0 = time.monotonic()
        tokens += _post_one(base)
        latencies.append(time.monotonic() - t0)
    return latencies, time.monotonic() - started, tokens


def _metrics(base: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as answer:
            return vllm_where.histogram_totals(answer.read().decode(errors="replace"))
    except OSError:
        return {}


def _threads(name: str) -> dict[tuple[int, int], vllm_where.Thread]:
    done = kubectl("-n", NAMESPACE, "exec", name, "--", "sh", "-c", vllm_where.THREADS_SCRIPT, timeout=60, check=False)
    return vllm_where.parse_threads(done.stdout)


def _host_threads() -> dict[tuple[int, int], vllm_where.HostThread]:
    """Every thread of the host: CPU time (schedstat), allowed CPUs, cpuset cgroup (read outside the timed window)."""
    from topology_devkit.realcluster import confine

    out: dict[tuple[int, int], vllm_where.HostThread] = {}
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            run_ns = int((task / "schedstat").read_text().split()[0])
            allowed = next(line.split(":", 1)[1].strip() for line in (task / "status").read_text().splitlines()
                           if line.startswith("Cpus_allowed_list:"))
            cgroup = confine.cpuset_path((task / "cgroup").read_text()) or "?"
            comm = (task / "comm").read_text().strip()
            pid, tid = int(task.parent.parent.name), int(task.name)
            out[(pid, tid)] = vllm_where.HostThread(pid, tid, comm, run_ns, frozenset(parse_cpulist(allowed)), cgroup)
        except (OSError, ValueError, IndexError, StopIteration):  # gone meanwhile
            continue
    return out


def _proc_stat() -> dict[int, vllm_where.CpuTicks]:
    return vllm_where.parse_proc_stat(Path("/proc/stat").read_text())


class Agent:
    """The release's values as last applied: an upgrade only when a run needs others."""

    def __init__(self, base: Sequence[str]) -> None:
        self.base = tuple(base)
        self.applied: tuple[str, ...] | None = None

    def ensure(self, values: Sequence[str]) -> None:
        wanted = (*self.base, *values)
        if wanted != self.applied:
            helm_upgrade(*wanted)
            self.applied = wanted


def measure(mode: str, rnd: int, node: str, requests: int, agent: Agent) -> Run:
    from topology_devkit.vllm.server import PORT, vllm_pod

    values, hog = MODES[mode]
    agent.ensure(values)
    made: list[str] = []
    try:
        hog_cpu = ""
        if hog:
            hog_cpu = _hog_cpu(node)
            doc = _hog(node, hog_cpu)
            _apply(doc)
            made.append(doc["metadata"]["name"])
            wait_until("the hog to run", lambda: _pod_json(made[0]).get("status", {}).get("phase") == "Running", 120,
                       every=1, error=RuntimeError)
        for attempt in range(1, 4):  # right after an agent switch kubelet may see no healthy book for a moment
            server = vllm_pod(f"bench-vllm-{uuid.uuid4().hex[:6]}", node, books=1, tp=1, namespace=NAMESPACE)
            server["metadata"]["labels"] = {"app": "vllm-bench"}
            started = time.monotonic()
            _apply(server)
            name = server["metadata"]["name"]
            made.append(name)
            try:
                wait_until(f"{name} to be Ready", functools.partial(_ready, name), 600, every=1, error=RuntimeError)
                break
            except AdmissionRefused as refused:
                if attempt == 3:
                    raise
                print(f"vllm_beside_hog: {refused}; again in 5 s", flush=True)
                time.sleep(5)
        ready_s = time.monotonic() - started
        base = f"http://{_pod_json(name)['status']['podIP']}:{PORT}"
        env = dict(line.split("=", 1) for line in kubectl("-n", NAMESPACE, "exec", name, "--", "sh", "-c",
                                                          "tr '\\0' '\\n' < /proc/1/environ").stdout.splitlines()
                   if "=" in line)
        for _ in range(WARM_UP):
            _post_one(base)
        uid = str(_pod_json(name)["metadata"]["uid"])
        metrics_before, threads_before = _metrics(base), _threads(name)
        host_before, stat_before = _host_threads(), _proc_stat()
        latencies, wall, tokens = _stream(base, requests)
        stat_after, host_after = _proc_stat(), _host_threads()
        threads_after, metrics_after = _threads(name), _metrics(base)
        book = vllm_where.book_cpus(stat_before, stat_after, os.sysconf("SC_CLK_TCK"),
                                    frozenset(parse_cpulist(env.get("TOPOLOGY_CPUS", ""))), host_before, host_after,
                                    (uid, uid.replace("-", "_")))
        log = kubectl("-n", NAMESPACE, "logs", name, "--tail=80", check=False).stdout
        processes = vllm_where.process_times(threads_before, threads_after)
        where = vllm_where.per_request(vllm_where.phase_means(metrics_before, metrics_after),
                                       sum(latencies) / len(latencies), processes, requests)
        top = max(processes, key=lambda p: p.top_wait_s, default=None)
        waiter = f"{top.name}/{top.top_thread} {top.top_wait_s / requests * 1e3:.1f} ms/request" if top else ""
        return Run(mode, rnd, median(latencies), percentile(latencies, 99), tokens / wall, extra={
            "latencies": latencies, "wall": wall, "tokens": tokens, "book": env.get("TOPOLOGY_CPUS", "?"),
            "hog_cpu": hog_cpu, "ready_s": ready_s, "where": where,
            "top_waiter": waiter, "book_cpus": book.__dict__, "book_line": vllm_where.book_line(book, requests),
            "processes": [p.__dict__ for p in processes], "log_tail": log.splitlines()})
    finally:
        if made:
            kubectl("-n", NAMESPACE, "delete", "pod", *made, "--wait=true", "--ignore-not-found",
                    "--grace-period=0", timeout=180, check=False)


def reserved_values(reserved: str) -> tuple[str, ...]:
    """The chart's values for ``reserved`` (a cpulist; commas escaped for --set-string); none for "". The levels
    stay ``book``: ``auto`` advertises sockets when one book is left with usable CPUs."""
    return ("--set-string", "agent.reservedCpus=" + reserved.replace(",", "\\,"), "--set", "agent.levels=book") \
        if reserved else ()


def check_reserved(reserved: str, online: int) -> str:
    """``reserved`` as a canonical cpulist; ValueError unless it parses and leaves at least one CPU for a book."""
    try:
        cpus = set(parse_cpulist(reserved))
    except ValueError as exc:
        raise ValueError(f"--reserved-cpus: {exc}") from None
    if not cpus <= set(range(online)):
        raise ValueError(f"--reserved-cpus {reserved}: this machine has CPUs 0-{online - 1}")
    if len(cpus) >= online:
        raise ValueError(f"--reserved-cpus {reserved}: no CPU left for a book")
    return format_cpulist(sorted(cpus))


def _confine(reserved: str, whole_host: bool) -> str:
    """Every user-space process of the host (``whole_host``), or the lane's host processes and this client, onto
    ``reserved``; what the kubelet is then allowed."""
    from topology_devkit.realcluster import confine
    from topology_devkit.realcluster.layout import Layout
    from topology_devkit.realcluster.procs import running

    layout = Layout(CLUSTER_DIR.resolve())
    pids = confine.host_pids() if whole_host else [*confine.lane_pids(layout), os.getpid()]
    moved = confine.confine(reserved, pids)
    kubelet = running(layout, "kubelet")
    allowed = confine.allowed_cpus(kubelet) if kubelet else "?"
    if allowed != reserved:
        raise RuntimeError(f"confining the host to CPUs {reserved}: the kubelet is allowed {allowed or 'nothing'}")
    what = "processes of the host" if whole_host else "host processes of the lane and this client"
    return f"{len(moved)} {what} on CPUs {reserved} (kubelet allowed {allowed})"


def _release() -> None:
    from topology_devkit.realcluster import confine

    confine.release()


def _machine() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "?")
    return f"{os.cpu_count()} CPUs, {model}, {platform.machine()}, kernel {platform.release()}"


def _save(path: Path | None, runs: list[Run], settings: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps({"bench": NAME, "settings": settings, "runs": [
            {"mode": r.mode, "round": r.round, "p50": r.p50, "p99": r.p99, "tok_s": r.tok_s, **r.extra}
            for r in runs]}, indent=1, default=str))


def where_medians(runs: Sequence[Run], mode: str) -> dict[str, float]:
    """Per figure of ``vllm_where.per_request``: its median over ``mode``'s runs."""
    found: dict[str, list[float]] = {}
    for run in runs:
        if run.mode == mode:
            for key, value in run.extra.get("where", {}).items():
                found.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in found.items()}


def run(quick: bool, requests: int | None = None, rounds: int | None = None, reserved: str = "0",
        max_minutes: float | None = None, raw_out: Path | None = None, whole_host: bool = True) -> list[Row]:
    from topology_devkit.vllm.server import VLLM_IMAGE

    why = _why_not(VLLM_IMAGE)
    if why:
        return [skipped(NAME, "vLLM beside a CPU hog", "-", why)]
    node = json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"][0]["metadata"]["name"]
    # the e2e suite deletes its namespace when it ends: wait until it is gone before making it again
    wait_until(f"namespace {NAMESPACE} to finish terminating", lambda: kubectl(
        "get", "namespace", NAMESPACE, "-o", "jsonpath={.status.phase}", check=False).stdout != "Terminating", 300,
        every=1, error=RuntimeError)
    kubectl("create", "namespace", NAMESPACE, check=False)
    count = requests or (20 if quick else REQUESTS)
    rounds = rounds or (1 if quick else 5)
    host = ("whole host" if whole_host else "lane") + " confined" if reserved else "floating"
    settings = {"requests": count, "rounds": rounds, "reserved_cpus": reserved, "host": host,
                "load_before": loadavg(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": _machine()}
    print(f"vllm_beside_hog: {rounds} round(s) of {', '.join(vllm_figure.MODES)} and back, {count} requests each, "
          f"on {settings['machine']}; load {settings['load_before']}", flush=True)
    agent = Agent(reserved_values(reserved))
    runs: list[Run] = []
    started = time.monotonic()
    try:
        if reserved:
            print(f"vllm_beside_hog: {_confine(reserved, whole_host)}; the agent with agent.reservedCpus={reserved}",
                  flush=True)
        for i, (rnd, mode) in enumerate(vllm_figure.schedule(rounds)):
            if (max_minutes is not None and i % len(vllm_figure.MODES) == 0
                    and time.monotonic() - started > max_minutes * 60):
                print(f"vllm_beside_hog: --max-minutes {max_minutes:g} reached: {rnd} round(s) done", flush=True)
                break
            t0 = time.monotonic()
            r = measure(mode, rnd, node, count, agent)
            runs.append(r)
            _save(raw_out, runs, settings)
            print(f"round {rnd} {mode}: p50 {r.p50 * 1e3:.1f} ms, p99 {r.p99 * 1e3:.1f} ms, {r.tok_s:.1f} tok/s "
                  f"(book {r.extra['book']}{', hog requests ' + r.extra['hog_cpu'] if r.extra['hog_cpu'] else ''}; "
                  f"ready after {r.extra['ready_s']:.0f} s, run {time.monotonic() - t0:.0f} s)\n  "
                  f"{vllm_where.line(r.extra['where'])}; most waiting thread {r.extra['top_waiter']}\n  "
                  f"{r.extra['book_line']}", flush=True)
    finally:
        try:
            helm_upgrade()
        finally:
            if reserved:
                _release()
    settings["load_after"] = loadavg()
    _save(raw_out, runs, settings)
    print(f"vllm_beside_hog: load {settings['load_before']} -> {settings['load_after']}", flush=True)
    found = vllm_figure.figures(runs)
    print("\n".join(vllm_figure.table(found)), flush=True)
    for mode in found:
        print(f"{mode}, medians: {vllm_where.line(where_medians(runs, mode))}", flush=True)
    return rows(found, count, runs)


def rows(found: dict[str, vllm_figure.ModeFigure], count: int, runs: Sequence[Run]) -> list[Row]:
    """The table's rows: the verdicts on the median p99 ratios (spread beside), the medians' cost as information."""
    said = vllm_figure.verdicts(found)
    enforcing, none = found.get("enforcing"), found.get("none")
    if enforcing is None or "p99" not in enforcing.ratio:
        return [Row(NAME, "vLLM beside a CPU hog", "no enforcing run paired with an alone run", None, "<= 1.15",
                    MISSED)]
    hog = next((r.extra.get("hog_cpu", "") for r in runs if r.mode == "enforcing"), "")
    rounds = enforcing.ratio["p99"].count
    out = [Row(NAME, f"1-book vLLM beside a CPU hog (requests {hog}), {count} x {TOKENS}-token requests, "
               f"{rounds} rounds: p99 enforcing / alone, median (min-max)", enforcing.ratio["p99"].ratio_text(),
               enforcing.ratio["p99"].median, f"median <= {vllm_figure.GOAL}", said["goal"])]
    if none is not None and "p99" in none.ratio:
        out.append(Row(NAME, "the same, enforcement none (both float) / alone", none.ratio["p99"].ratio_text(),
                       none.ratio["p99"].median, "enforcing's median below", said["below none"]))
    for fig in (enforcing, none):
        if fig is not None and "p50" in fig.ratio:
            out.append(Row(NAME, f"{fig.mode} / alone: p50, tok/s, median (min-max)",
                           f"p50 {fig.ratio['p50'].ratio_text()}, tok/s {fig.ratio['tok_s'].ratio_text()}",
                           None, "", INFO))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="rounds: runs per mode, interleaved (default 5; "
                        "1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="1 round of 20 requests per run")
    parser.add_argument("--requests", type=int, default=None,
                        help=f"requests per run (after {WARM_UP} to warm up; {REQUESTS})")
    parser.add_argument("--reserved-cpus", default="0", metavar="CPULIST",
                        help="the agent's reserved CPUs, and every process of the host confined to them as on a "
                             "real node (default 0)")
    parser.add_argument("--lane-only", action="store_true",
                        help="confine only the lane's host processes and the client, not the rest of the host")
    parser.add_argument("--unconfined", action="store_true",
                        help="no reserved CPUs: every CPU a book, the host's processes floating over all of them")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="start no new round after this long (the figures are then of the rounds done)")
    parser.add_argument("--json-out", type=Path, default=None, help="the rows (as bench/run_all.py reads them)")
    parser.add_argument("--raw-out", type=Path, default=None, help="every run's numbers, written after each run")
    args = parser.parse_args()
    for flag, value in (("--requests", args.requests), ("--runs", args.runs)):
        if value is not None and value < 1:
            print(f"vllm_beside_hog: {flag} must be at least 1", file=sys.stderr)
            return 2
    reserved = ""
    if not args.unconfined:
        try:
            reserved = check_reserved(args.reserved_cpus, os.cpu_count() or 1)
        except ValueError as exc:
            print(f"vllm_beside_hog: {exc}", file=sys.stderr)
            return 2
    started = time.monotonic()
    try:
        rows_ = run(args.quick, args.requests, args.runs, reserved, args.max_minutes, args.raw_out,
                    whole_host=not args.lane_only)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # the cluster refused or timed out: one line
        print(f"vllm_beside_hog: {exc}", file=sys.stderr)
        return 1
    for row in rows_:
        note = f" {row.reason}" if row.reason else ""
        print(f"{row.bench}\t{row.name}\t{row.measured}\t{row.target}\t{row.verdict}{note}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"bench": NAME, "seconds": time.monotonic() - started,
                                             "rows": [row.__dict__ for row in rows_]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
