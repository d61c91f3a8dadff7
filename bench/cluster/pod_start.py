"""The real-cluster figures (docs/contributing/lanes/real-cluster.md), on a cluster ``make e2e`` set up and left
running (``KEEP_CLUSTER=1 make e2e``, or ``make cluster-up`` plus the chart as e2e.sh installs it):

* **pod created -> Running with its cpuset pinned**: a ``topology/book: 1`` pod (cpu 1) against a plain pod with
  the same ``cpu`` request, alternating (A B B A), each timed from the create call until it runs and an exec sees
  its cpuset (the book pod's must be its book). Target: median ratio <= 1.2 over >= 10 pods each.
* **container started -> cpuset pinned**: the container prints ``/proc/uptime`` (the host's clock, 10 ms steps)
  and its ``Cpus_allowed_list`` every 10 ms from its first instruction; the pin latency is the first uptime with
  the book's CPUs minus the first uptime printed. Target: p95 <= 1 s.
* **kubelet restarted -> agent re-registered**: 10 kubelet restarts (``realcluster restart-kubelet``), each from
  the kubelet's "Starting device plugin registration server" to its "Got registration request from device
  plugin" for ``topology/book``, both from the kubelet's own log (microseconds, one clock). Target: worst <= 1 s.

Skipped, with the reason, when no such cluster is up.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.common import INFO, ROOT, Row, at_most, bench_main, median, percentile, skipped, spread
from topology_devkit.testing.wait import poll_until, wait_until

NAME = "pod_start"
CLUSTER_DIR = Path(os.environ.get("CLUSTER_DIR") or ROOT / ".cluster")
KUBECONFIG = CLUSTER_DIR / "kubeconfig"
NAMESPACE = "topology-bench"
IMAGE = "localhost/topology-e2e-busybox:latest"
BOOK = "topology/book"
PIN_SCRIPT = ("while :; do read -r up _ < /proc/uptime; c=$(grep Cpus_allowed_list /proc/self/status); "
              "echo \"T $up ${c##*:}\"; case \"$c\" in *-*|*,*) ;; *) n=$((${n:-0}+1));; esac; "
              "[ \"${n:-0}\" -ge 3 ] && break; sleep 0.01; done; exec sleep 3600")


def _client() -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=str(KUBECONFIG)))


def _kubectl() -> str:
    out = subprocess.run([str(ROOT / "devkit" / "cluster" / "build.sh"), "--print"], capture_output=True, text=True,
                         check=True).stdout.strip()
    return str(Path(out) / "kubectl")


def _why_not() -> str | None:
    if not KUBECONFIG.is_file():
        return f"no cluster: {KUBECONFIG} missing (KEEP_CLUSTER=1 make e2e leaves one up)"
    try:
        core = _client()
        node = core.list_node().items[0]
    except Exception as exc:
        return f"the cluster does not answer: {str(exc).splitlines()[0][:120]}"
    if int((node.status.capacity or {}).get(BOOK, "0")) < 1:
        return f"node {node.metadata.name} advertises no {BOOK}: install the chart as devkit/cluster/e2e.sh does"
    return None


def _pod(core: Any, name: str, book: bool, command: str) -> None:
    from kubernetes import client

    limits = {BOOK: "1"} if book else None
    core.create_namespaced_pod(NAMESPACE, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(restart_policy="Never", termination_grace_period_seconds=0, containers=[
            client.V1Container(name="main", image=IMAGE, image_pull_policy="Never", command=["/bin/sh", "-c", command],
                               resources=client.V1ResourceRequirements(requests={"cpu": "1", "memory": "16Mi"},
                                                                       limits=limits))])))


def _delete(core: Any, name: str) -> None:
    core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    poll_until(lambda: name not in {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}, 60, every=0.1)


def _exec_cpus(kubectl: str, name: str) -> str:
    done = subprocess.run([kubectl, "--kubeconfig", str(KUBECONFIG), "exec", "-n", NAMESPACE, name, "--", "grep",
                           "Cpus_allowed_list", "/proc/1/status"], capture_output=True, text=True, check=False)
    return done.stdout.split(":", 1)[1].strip() if done.returncode == 0 and ":" in done.stdout else ""


def _time_to_pinned(core: Any, kubectl: str, book: bool) -> float:
    name = f"bench-{'book' if book else 'plain'}-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    _pod(core, name, book, "exec sleep 3600")
    try:
        while time.monotonic() - t0 < 120:
            pod = core.read_namespaced_pod(name, NAMESPACE)
            if pod.status.phase == "Running":
                cpus = _exec_cpus(kubectl, name)
                if cpus and (not book or ("-" not in cpus and "," not in cpus)):
                    return time.monotonic() - t0
            time.sleep(0.02)
        raise RuntimeError(f"{name} did not run pinned within 120 s")
    finally:
        _delete(core, name)


def _pin_latency(core: Any) -> float:
    name = f"bench-pin-{uuid.uuid4().hex[:6]}"
    _pod(core, name, True, PIN_SCRIPT)
    def latency() -> tuple[float] | None:  # a tuple: a latency of 0 s is an answer too
        try:
            log = core.read_namespaced_pod_log(name, NAMESPACE) or ""
        except Exception:
            log = ""
        samples = [line.split()[1:3] for line in log.splitlines() if line.startswith("T ")]
        pinned = [float(up) for up, cpus in samples if "-" not in cpus and "," not in cpus]
        return (pinned[0] - float(samples[0][0]),) if samples and pinned else None

    try:
        return wait_until(f"{name} to print its book's cpuset", latency, 60, every=0.1, error=RuntimeError)[0]
    finally:
        _delete(core, name)


KLOG = re.compile(r"^[IWE](\d{4}) (\d\d:\d\d:\d\d\.\d{6})")


def _klog_time(line: str) -> float:
    match = KLOG.match(line)
    if not match:
        raise ValueError(line)
    year = datetime.now().year  # klog prints no year; only differences within one restart are used
    return datetime.strptime(f"{year}{match.group(1)} {match.group(2)}", "%Y%m%d %H:%M:%S.%f").timestamp()


def _reregistration(log: Path, start_offset: int) -> float:
    def took() -> tuple[float] | None:  # a tuple: 0 s is an answer too
        with log.open(errors="replace") as f:
            f.seek(start_offset)
            lines = f.read().splitlines()
        server = [ln for ln in lines if "Starting device plugin registration server" in ln]
        got = [ln for ln in lines if "Got registration request from device plugin" in ln and BOOK in ln]
        return (_klog_time(got[0]) - _klog_time(server[0]),) if server and got else None

    return wait_until("the agent to register with the restarted kubelet", took, 30, every=0.1, error=RuntimeError)[0]


def run(quick: bool) -> list[Row]:
    why = _why_not()
    if why:
        return [skipped(NAME, "real cluster", "-", why)]
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = _client()
    kubectl = _kubectl()
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    except ApiException as exc:
        if exc.status != 409:
            raise
    rows: list[Row] = []
    pods = 3 if quick else 10
    book_times: list[float] = []
    plain_times: list[float] = []
    for i in range(pods):
        order = (True, False) if i % 2 == 0 else (False, True)
        for book in order:
            (book_times if book else plain_times).append(_time_to_pinned(core, kubectl, book))
    ratio = median(book_times) / median(plain_times)
    pair_ratios = [b / p for b, p in zip(book_times, plain_times, strict=True)]
    rows.append(Row(NAME, "pod created -> Running, cpuset pinned: book / plain pod",
                    f"{ratio:.2f}x (book {median(book_times):.2f} s, plain {median(plain_times):.2f} s, medians of "
                    f"{pods}; pairs {spread(pair_ratios)})", ratio, "median ratio <= 1.2", at_most(ratio, 1.2),
                    raw={"book": book_times, "plain": plain_times}))
    latencies = [_pin_latency(core) for _ in range(pods)]
    p95 = percentile(latencies, 95)
    rows.append(Row(NAME, "container started -> cpuset pinned (CRI)",
                    f"p95 {p95:.2f} s, median {median(latencies):.2f} s over {pods} pods", p95, "p95 <= 1 s",
                    at_most(p95, 1.0), raw={"latencies": latencies}))
    log = CLUSTER_DIR / "logs" / "kubelet.log"
    restarts = 3 if quick else 10
    times = []
    for _ in range(restarts):
        offset = log.stat().st_size
        subprocess.run([sys.executable, "-m", "topology_devkit.realcluster", "restart-kubelet"], check=True,
                       cwd=ROOT, capture_output=True, env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'devkit'}"})
        times.append(_reregistration(log, offset))
    worst = max(times)
    rows.append(Row(NAME, "kubelet restarted -> agent re-registered",
                    f"worst {worst * 1000:.0f} ms, median {median(times) * 1000:.0f} ms over {restarts} restarts",
                    worst, "worst <= 1 s", at_most(worst, 1.0), raw={"seconds": times}))
    rows.append(Row(NAME, "pods measured", f"{pods} book + {pods} plain, {pods} pin, {restarts} restarts", None, "",
                    INFO))
    core.delete_namespace(NAMESPACE)
    return rows


if __name__ == "__main__":
    sys.exit(bench_main(NAME, run, __doc__))
