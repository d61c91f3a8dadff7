"""What N agents cost one real API server and scheduler: a scale figure beyond one machine.

One real etcd, kube-apiserver (audit log on) and kube-scheduler of the real-cluster lane (devkit/cluster/build.sh; no
kubelet, no containerd), and N fake nodes: Node objects with a status (64 CPUs, 110 pods) and no kubelet behind them.
On each, one ``topology-agent serve --mode dra`` process on this host with the z16 snapshot (8 books, 16 sockets:
``agent.levels`` book,socket) and scratch kubelet directories, authenticated as a ServiceAccount of its own, so the
audit log tells each agent's requests apart. The curve grows N in steps (``--agents 1,10,50,100``); at each step:

* **requests per agent at start**: every request of the step's new agents from their spawn until their node's pool is
  complete and 10 s more (the first label sync and the informers' lists and watches included), per agent;
* **requests per agent per hour at steady state**: every request of every agent over a quiet window (``--window``),
  scaled to an hour (watches count once, when opened);
* **slices and bytes per node**: the node's ResourceSlices as the API server returns them (compact JSON);
* **scheduler: 100 claims placed**: 100 ResourceClaims (one book each, no selector) and 100 pods using them, created
  at once; the time from the first create to every pod bound with its claim allocated, with the step's N nodes'
  slices present. The pods never run (no kubelet); they are deleted before the next step.

Needs root, the cluster binaries (make cluster-build) and the machine lock (it uses the real-cluster lane's ports):
``flock /tmp/realcluster.lock .venv/bin/python bench/cluster/agents_per_apiserver.py``; the lane must be down.
Leaves nothing running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from topology_devkit.testing.wait import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "devkit"))

from bench.cluster.control_plane import DRIVER, Agents, ControlPlane, ScaleError, node_status

BOOKS_PER_NODE = 8  # the z16 snapshot's


def audit_counts(log: Path, since: float, until: float) -> Counter[str]:
    """ResponseComplete events of the bench's agents received in [since, until): user -> requests."""
    counts: Counter[str] = Counter()
    for path in sorted(log.parent.glob(log.name + "*")):
        with path.open(errors="replace") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                user = str(event.get("user", {}).get("username", ""))
                if event.get("stage") not in ("ResponseComplete", "ResponseStarted") or ":bench-agent-" not in user:
                    continue
                if event.get("stage") == "ResponseStarted" and event.get("verb") != "watch":
                    continue
                if event.get("stage") == "ResponseComplete" and event.get("verb") == "watch":
                    continue  # a watch counts once, when it starts
                when = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
                if since <= when < until:
                    counts[user.rsplit(":", 1)[1]] += 1
    return counts


def node_doc(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "bench-scale": "true"}}}


class Bench:
    def __init__(self, work: Path, window: float) -> None:
        self.plane = ControlPlane(work)
        self.window = window
        self.layout = self.plane.layout
        self.agents = Agents(self.plane)

    def k(self, *args: str, doc: Any = None, timeout: float = 120) -> str:
        return self.plane.k(*args, doc=doc, timeout=timeout)

    def up(self) -> None:
        self.plane.up()
        self.plane.deviceclasses()

    def down(self) -> None:
        self.agents.stop()
        self.plane.down()

    def start_agent(self, index: int) -> str:
        node = f"bench-node-{index:03d}"
        self.k("create", "-f", "-", doc=node_doc(node))
        self.k("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(node_status(node)))
        # the API server's TaintNodesByCondition admission taints a new Node not-ready; the node lifecycle controller,
        # which would lift it once the node reports Ready, is off here (it would mark kubelet-less nodes unreachable)
        self.k("taint", "node", node, "node.kubernetes.io/not-ready:NoSchedule-")
        self.agents.start(node, f"bench-agent-{index:03d}")
        return node

    def slices(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(self.k("get", "resourceslices", "--field-selector",
                                                        f"spec.driver={DRIVER}", "-o", "json"))["items"]
        return items

    def complete_nodes(self) -> dict[str, list[dict[str, Any]]]:
        by_node: dict[str, list[dict[str, Any]]] = {}
        for s in self.slices():
            by_node.setdefault(s["spec"]["nodeName"], []).append(s)
        done = {}
        for node, items in by_node.items():
            generation = max(s["spec"]["pool"]["generation"] for s in items)
            newest = [s for s in items if s["spec"]["pool"]["generation"] == generation]
            if len(newest) == newest[0]["spec"]["pool"]["resourceSliceCount"]:
                done[node] = newest
        return done

    def place(self, count: int = 100) -> dict[str, float]:
        tag = uuid.uuid4().hex[:5]
        docs: list[dict[str, Any]] = []
        for i in range(count):
            name = f"scale-{tag}-{i:03d}"
            docs.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                         "metadata": {"name": name, "namespace": "default"},
                         "spec": {"devices": {"requests": [{"name": "book", "exactly": {
                             "deviceClassName": f"book.{DRIVER}", "allocationMode": "ExactCount", "count": 1}}]}}})
            docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                         "spec": {"nodeSelector": {"bench-scale": "true"},
                                  "resourceClaims": [{"name": "c", "resourceClaimName": name}],
                                  "containers": [{"name": "main", "image": "localhost/none:never",
                                                  "resources": {"claims": [{"name": "c"}]}}]}})
        t0 = time.monotonic()
        self.k("create", "-f", "-", doc={"apiVersion": "v1", "kind": "List", "items": docs}, timeout=300)
        created = time.monotonic() - t0

        def bound() -> bool:
            pods = json.loads(self.k("get", "pods", "-n", "default", "-o", "json"))["items"]
            return sum(1 for p in pods if p["spec"].get("nodeName")) >= count

        wait_until(f"{count} pods bound", bound, 600, every=0.25, error=ScaleError)
        placed = time.monotonic() - t0
        claims = json.loads(self.k("get", "resourceclaims", "-n", "default", "-o", "json"))["items"]
        allocated = sum(1 for c in claims if (c.get("status") or {}).get("allocation"))
        pods = json.loads(self.k("get", "pods", "-n", "default", "-o", "json"))["items"]
        spread = len({p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")})
        # no kubelet runs the pods: force them away, then the claims (their reservations cleared by the controller)
        self.k("delete", "pods", "--all", "-n", "default", "--grace-period=0", "--force", "--wait=false", timeout=600)
        self.k("delete", "resourceclaims", "--all", "-n", "default", "--wait=false", timeout=600)
        wait_until("the claims gone", lambda: not json.loads(self.k("get", "resourceclaims,pods", "-n", "default", "-o",
                                                                    "json"))["items"], 300, every=1.0, error=ScaleError)
        return {"count": count, "create_s": created, "placed_s": placed, "allocated": allocated,
                "nodes_used": spread}

    def step(self, first: int, last: int) -> dict[str, Any]:
        t_start = time.time()
        new = [self.start_agent(i) for i in range(first, last)]
        wait_until(f"{len(new)} new nodes' pools complete", lambda: set(new) <= set(self.complete_nodes()),
                   120 + 6 * len(new), every=1.0, error=ScaleError)
        up_s = time.time() - t_start
        time.sleep(10.0)
        start_counts = audit_counts(self.layout.log("audit"), t_start, time.time())
        starts = [start_counts.get(n.replace("node", "agent"), 0) for n in new]
        t0 = time.time()
        time.sleep(self.window)
        t1 = time.time()
        time.sleep(2.0)
        steady = audit_counts(self.layout.log("audit"), t0, t1)
        agents = len(self.agents.procs)
        per_hour = sum(steady.values()) * 3600.0 / self.window / agents
        complete = self.complete_nodes()
        some = complete[new[-1]]
        nbytes = sum(len(json.dumps(s, separators=(",", ":"))) for s in some)
        dead = self.agents.dead()
        if dead:
            raise ScaleError(f"agents exited: {dead[:5]}")
        placement = self.place(min(100, BOOKS_PER_NODE * agents))
        return {"agents": agents, "new": len(new), "pools_complete_s": up_s,
                "start_requests_per_agent": sum(starts) / len(starts), "start_requests_max": max(starts),
                "steady_requests_per_agent_hour": per_hour, "window_s": self.window,
                "slices_per_node": len(some), "bytes_per_node": nbytes,
                "devices_per_node": sum(len(s["spec"].get("devices", [])) for s in some),
                "slices_total": len(self.slices()), **{f"sched_{k}": v for k, v in placement.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="1,10,50,100", help="the curve's steps (cumulative agent counts)")
    parser.add_argument("--window", type=float, default=120.0, help="the steady-state window per step, seconds")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    steps = [int(n) for n in args.agents.split(",")]
    if os.geteuid() != 0:
        print("bench_scale: needs root (the real cluster's components)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    bench = Bench(work, args.window)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        bench.up()
        have = 0
        for n in steps:
            row = bench.step(have, n)
            have = n
            rows.append(row)
            print(json.dumps(row), flush=True)
    except (ScaleError, subprocess.CalledProcessError) as exc:
        print(f"bench_scale: {exc}", file=sys.stderr)
        return 1
    finally:
        bench.down()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n== bench_scale: {time.monotonic() - t0:.0f} s")
    print(f"{'N':>4} {'start req/agent':>16} {'steady req/agent/h':>19} {'slices/node':>11} {'bytes/node':>10} "
          f"{'100 claims placed':>17} {'pools up':>8}")
    for r in rows:
        print(f"{r['agents']:>4} {r['start_requests_per_agent']:>16.1f} {r['steady_requests_per_agent_hour']:>19.1f} "
              f"{r['slices_per_node']:>11} {r['bytes_per_node']:>10} {r['sched_placed_s']:>15.1f} s "
              f"{r['pools_complete_s']:>6.1f} s")
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
