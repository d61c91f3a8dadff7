"""What the agent is worth to an inference user, on a cluster ``make e2e-vllm`` left up
(``KEEP_CLUSTER=1 make e2e-vllm``: the chart installed as devkit/cluster/e2e.sh does, the vLLM image imported):

A vLLM server pod holding one book (topology_devkit.vllm.server's pod: the lane's tiny model, ``--enforce-eager``)
serves a fixed stream of completion requests (``--requests`` of 16 tokens each, one at a time, after 5 to warm
up) while a CPU-hog pod with no topology resource (two busy loops, requesting what CPU the node has left beside the
server: a neighbour of real standing, see :func:`hog_millicores`) runs on the same node; three runs, a fresh
server each:

* **enforcing**: ``cpusetEnforcement: cri`` with ``sharedPool: true``: the server on its book, the hog confined to
  the CPUs of no held book;
* **none**: the agent installed, ``cpusetEnforcement: none``: both float over every CPU (vLLM still binds its OpenMP
  thread to the CPU the agent named, so the hog lands on it);
* **alone**: the server with no hog (the ceiling).

Per run: request latency p50 and p99 and tokens per second over the same stream. The requests go through ``kubectl
port-forward`` to 127.0.0.1 (the same path in all three runs). Target: p99 enforcing <= 1.15x alone, and below none.

On the lane each book is one of the machine's two CPUs: the server's own API server, engine core and worker share
that one CPU, and the host's client, kubelet and port-forward float on both. Skipped, with the reason, when no such
cluster is up or the vLLM image is not in its containerd.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.common import INFO, ROOT, Row, at_most, median, percentile, skipped
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
MODES = {  # run -> (helm --set values, hog)
    "alone": ((), False),
    "enforcing": (("--set", "cpusetEnforcement=cri", "--set", "sharedPool=true"), True),
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
    images = [i for n in nodes for img in n["status"].get("images") or [] for i in img.get("names") or []]
    if image not in images:
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


def _ready(name: str) -> bool:
    status = _pod_json(name).get("status", {})
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stream(port: int, requests: int) -> tuple[list[float], float, int]:
    """(latencies, wall seconds, completion tokens) of ``requests`` sequential completions after the warm-up."""
    body = json.dumps({"model": "tiny", "prompt": "The agent gives each rank one book", "max_tokens": TOKENS,
                       "temperature": 0, "ignore_eos": True}).encode()

    def one() -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return int(json.loads(answer.read())["usage"]["completion_tokens"])

    for _ in range(WARM_UP):
        one()
    latencies: list[float] = []
    tokens = 0
    started = time.monotonic()
    for _ in range(requests):
        t0 = time.monotonic()
        tokens += one()
        latencies.append(time.monotonic() - t0)
    return latencies, time.monotonic() - started, tokens


def measure(mode: str, node: str, requests: int) -> dict[str, Any]:
    from topology_devkit.vllm.server import vllm_pod

    values, hog = MODES[mode]
    helm_upgrade(*values)
    made: list[str] = []
    forward: subprocess.Popen[str] | None = None
    try:
        hog_cpu = ""
        if hog:
            hog_cpu = _hog_cpu(node)
            doc = _hog(node, hog_cpu)
            _apply(doc)
            made.append(doc["metadata"]["name"])
            wait_until("the hog to run", lambda: _pod_json(made[0]).get("status", {}).get("phase") == "Running", 120,
                       every=1, error=RuntimeError)
        server = vllm_pod(f"bench-vllm-{uuid.uuid4().hex[:6]}", node, books=1, tp=1, namespace=NAMESPACE)
        server["metadata"]["labels"] = {"app": "vllm-bench"}
        _apply(server)
        name = server["metadata"]["name"]
        made.append(name)
        wait_until(f"{name} to be Ready", lambda: _ready(name), 600, every=1, error=RuntimeError)
        port = _free_port()
        forward = subprocess.Popen([_kubectl(), "--kubeconfig", str(KUBECONFIG), "-n", NAMESPACE, "port-forward",
                                    f"pod/{name}", f"{port}:8000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        wait_until("the port-forward", lambda: forward is not None and forward.stdout is not None
                   and "Forwarding from" in forward.stdout.readline(), 30, every=1, error=RuntimeError)
        env = dict(line.split("=", 1) for line in kubectl("-n", NAMESPACE, "exec", name, "--", "sh", "-c",
                                                          "tr '\\0' '\\n' < /proc/1/environ").stdout.splitlines()
                   if "=" in line)
        latencies, wall, tokens = _stream(port, requests)
        return {"mode": mode, "latencies": latencies, "wall": wall, "tokens": tokens,
                "p50": median(latencies), "p99": percentile(latencies, 99), "tok_s": tokens / wall,
                "book": env.get("TOPOLOGY_CPUS", "?"), "hog_cpu": hog_cpu}
    finally:
        if forward is not None:
            forward.terminate()
            forward.wait(timeout=10)
        if made:
            kubectl("-n", NAMESPACE, "delete", "pod", *made, "--wait=true", "--ignore-not-found",
                    "--grace-period=0", timeout=180, check=False)


def run(quick: bool, requests: int | None = None) -> list[Row]:
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
    count = requests or (20 if quick else 60)
    runs: dict[str, dict[str, Any]] = {}
    try:
        for mode in ("alone", "enforcing", "none"):
            runs[mode] = measure(mode, node, count)
            r = runs[mode]
            print(f"{mode}: p50 {r['p50'] * 1e3:.1f} ms, p99 {r['p99'] * 1e3:.1f} ms, {r['tok_s']:.1f} tok/s "
                  f"(book {r['book']}{', hog requests ' + r['hog_cpu'] if r['hog_cpu'] else ''})", flush=True)
    finally:
        helm_upgrade()
    alone, enforcing, none = runs["alone"], runs["enforcing"], runs["none"]
    ratio = enforcing["p99"] / alone["p99"]

    def show(r: dict[str, Any]) -> str:
        return f"p50 {r['p50'] * 1e3:.1f} ms, p99 {r['p99'] * 1e3:.1f} ms, {r['tok_s']:.1f} tok/s"

    raw = {mode: {k: v for k, v in r.items()} for mode, r in runs.items()}
    return [
        Row(NAME, f"1-book vLLM beside a CPU hog (requests {enforcing['hog_cpu']}), {count} x {TOKENS}-token requests: "
            "p99 enforcing / alone",
            f"{ratio:.2f}x (enforcing {show(enforcing)}; alone {show(alone)})", ratio, "<= 1.15",
            at_most(ratio, 1.15), raw=raw),
        Row(NAME, "the same, enforcement none (both float) / alone",
            f"p99 {none['p99'] / alone['p99']:.2f}x, p50 {none['p50'] / alone['p50']:.2f}x, tok/s "
            f"{none['tok_s'] / alone['tok_s']:.2f}x ({show(none)})", none["p99"] / alone["p99"],
            "enforcing clearly better", at_most(enforcing["p99"], none["p99"])),
        Row(NAME, "enforcing / alone: p50, tok/s",
            f"p50 {enforcing['p50'] / alone['p50']:.2f}x, tok/s {enforcing['tok_s'] / alone['tok_s']:.2f}x",
            None, "", INFO),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 requests per run instead of 60")
    parser.add_argument("--requests", type=int, default=None, help="requests per run (after 5 to warm up)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    if args.requests is not None and args.requests < 1:
        print("bench_vllm: --requests must be at least 1", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        rows = run(args.quick, args.requests)
    except (RuntimeError, subprocess.SubprocessError) as exc:  # the cluster refused or timed out: one line
        print(f"bench_vllm: {exc}", file=sys.stderr)
        return 1
    for row in rows:
        note = f" {row.reason}" if row.reason else ""
        print(f"{row.bench}\t{row.name}\t{row.measured}\t{row.target}\t{row.verdict}{note}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"bench": NAME, "seconds": time.monotonic() - started,
                                             "rows": [row.__dict__ for row in rows]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
