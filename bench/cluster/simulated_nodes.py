"""What our slices cost one real scheduler at 1,000 nodes: simulated nodes (KWOK), the real lane's control plane.

The real-cluster lane's etcd, kube-apiserver, kube-controller-manager and kube-scheduler (``control_plane.py``; no
kubelet, no runtime), their clients' QPS limits lifted as scheduler_perf and ``kwokctl --disable-qps-limits`` lift them
(5,000), and KWOK v0.8.0 (``devkit/cluster/build-kwok.sh``) keeping N fake Nodes Ready (leases, KWOK's own stages)
and moving their pods to Running. Each node is z16-shaped (the ``z16-lpar`` snapshot: 8 books, 16 sockets, 2
drawers). One publisher process (``simulated_nodes.py publish``) writes every node's ResourceSlices through the
agent's own slice builder and publisher (``build_pool``, ``SlicePublisher``, its API client). Beside them a sample of
real ``topology-agent serve --mode dra`` agents on nodes of their own proves that path: their pools must be the
publisher's, slice for slice, and a claim on each must be placed.

Per variant (``--variants``), pods that each want one book are created as fast as the bench can (4 client threads):
0 -> 50 % of the books taken, 50 -> 90 %, then churn at 90 % (one delete and one create at ``--churn-rate`` per
second for ``--churn-seconds``). Per phase: pods/s (placed / (last bound - first create)), create->bound p50/p99,
the scheduler's DynamicResources plugin time per scheduling attempt (its ``/metrics``: plugin durations are sampled
in 10 % of cycles), attempts per pod, the scheduler's CPU per pod, API server and etcd CPU seconds and memory.

Variants: ``counters`` (the agent's pool: books and sockets, shared counters), ``flat`` (the same devices without
counters: what the counters cost), ``books`` (``--levels book``: the agent's pool of books only, their sockets'
counters kept), ``books-flat`` (those 8 books without counters: no two of them overlap), ``extended`` (the counters
pool; pods ask ``topology/book: 1`` and the DeviceClass's ``extendedResourceName`` maps it to DRA), ``deviceplugin``
(no slices; nodes advertise ``topology/book: 8``, pods ask ``topology/book: 1``).

Needs root, the lane's binaries (make cluster-build), KWOK (make kwok-build) and the machine lock; the lane must be
down: ``make bench-scale NODES=1000``. Leaves nothing running.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import http.client
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.policy.resource_slices import PoolPlan, SlicePlan
from agent.topology import snapshot_format
from agent.topology.model import Topology
from bench.cluster.control_plane import DRIVER, SNAPSHOT, ScaleError
from bench.lib.common import percentile

ROOT = Path(__file__).resolve().parents[2]
NS = "bench"
BOOKS_PER_NODE = 8  # the z16 snapshot's
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SIM_LABEL = "bench-sim"
TEMPLATE = "one-book"
EXTENDED = "topology/book"
NOW = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}  # gone at once (no kubelet to wait on)
QPS = 5000  # the scheduler's and controller manager's client QPS and burst (scheduler_perf, kwokctl)
LAYOUTS = {"counters": ("book", "socket"), "flat": ("book", "socket"), "books": ("book",), "books-flat": ("book",)}
VARIANTS = {"counters": ("counters", "claim"), "flat": ("flat", "claim"), "books": ("books", "claim"),
            "books-flat": ("books-flat", "claim"),
            "extended": ("counters", "extended"), "deviceplugin": (None, "deviceplugin")}
DRA_PLUGIN = "DynamicResources"


# --- pure parts ----------------------------------------------------------------------------------------------

def flat_plan(plan: PoolPlan) -> PoolPlan:
    """``plan``'s devices without shared counters: the device slices alone, no ``consumesCounters``."""
    devices = [s for s in plan.slices if "devices" in s.spec]
    slices = []
    for s in devices:
        spec: dict[str, Any] = json.loads(json.dumps(s.spec))
        for device in spec["devices"]:
            device.pop("consumesCounters", None)
        spec["pool"]["resourceSliceCount"] = len(devices)
        slices.append(SlicePlan(s.name, spec))
    return dataclasses.replace(plan, slices=tuple(slices), counters={})


def node_plan(node: str, layout: str) -> PoolPlan:
    """What an agent with the z16 snapshot publishes on ``node`` in ``layout`` (``flat``: without its counters)."""
    from agent.policy.grouping import GroupingSettings, group_topology
    from agent.policy.resource_slices import SliceSettings, build_pool
    topology = _topology()
    plan = build_pool(group_topology(topology, GroupingSettings(levels=LAYOUTS[layout])), topology,
                      SliceSettings(node))
    return flat_plan(plan) if layout.endswith("flat") else plan


_TOPOLOGY: list[Topology] = []


def _topology() -> Topology:
    if not _TOPOLOGY:
        _TOPOLOGY.append(snapshot_format.load(SNAPSHOT))
    return _TOPOLOGY[0]


def run_order(variants: Sequence[str]) -> list[str]:
    """``variants`` as given, ``deviceplugin`` last: its nodes keep advertising ``topology/book``, which would take
    a later DRA variant's ``topology/book: 1`` pods off the DRA path."""
    return sorted(variants, key=lambda v: v == "deviceplugin")


def phase_sizes(nodes: int, books_per_node: int = BOOKS_PER_NODE) -> tuple[int, int]:
    """Pods taking the books from 0 to 50 % and from 50 to 90 % of ``nodes`` nodes."""
    total = nodes * books_per_node
    half = total // 2
    return half, int(total * 0.9) - half


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_metrics(text: str) -> Samples:
    """A Prometheus text page (prometheus_client's parser): (sample name, labels) -> value."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def metric_sum(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def scheduler_figures(before: Samples, after: Samples) -> dict[str, float]:
    """What the scheduler did between two scrapes: the DynamicResources plugin's own computing time per sampled
    scheduling attempt (every extension point but PreBind; PreFilter runs once an attempt), its PreBind apart (the
    claim's allocation written to the API server: a round trip, not computing), and attempts by result."""
    def delta(name: str, **labels: str) -> float:
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    plugin = "scheduler_plugin_execution_duration_seconds"
    sampled = delta(f"{plugin}_count", plugin=DRA_PLUGIN, extension_point="PreFilter")
    every = delta(f"{plugin}_sum", plugin=DRA_PLUGIN)
    prebind = delta(f"{plugin}_sum", plugin=DRA_PLUGIN, extension_point="PreBind")
    filter_s = delta(f"{plugin}_sum", plugin=DRA_PLUGIN, extension_point="Filter")
    attempts = delta("scheduler_schedule_attempts_total")
    scheduled = delta("scheduler_schedule_attempts_total", result="scheduled")

    def per(seconds: float) -> float:
        return 1000 * seconds / sampled if sampled else math.nan

    def mean_ms(name: str, **labels: str) -> float:
        n = delta(f"{name}_count", **labels)
        return 1000 * delta(f"{name}_sum", **labels) / n if n else math.nan

    # Every attempt, not sampled: the Filter extension point (every plugin on every node looked at; the DRA plugin's
    # allocator is most of it with claims) and the whole scheduling algorithm (filter and score).
    points = "scheduler_framework_extension_point_duration_seconds"
    return {"dra_ms_per_attempt": per(every - prebind), "dra_filter_ms_per_attempt": per(filter_s),
            "dra_prebind_ms_per_attempt": per(prebind), "sampled_attempts": sampled, "attempts": attempts,
            "scheduled": scheduled, "filter_ms": mean_ms(points, extension_point="Filter"),
            "algorithm_ms": mean_ms("scheduler_scheduling_algorithm_duration_seconds")}


def latency_figures(created: Mapping[str, float], bound: Mapping[str, float]) -> dict[str, float]:
    """pods/s and create->bound p50/p99 of the pods in ``created`` (name -> when its create was sent), from
    ``bound`` (name -> when the watch saw its node)."""
    names = [n for n in created if n in bound]
    if not names:
        return {"placed": 0, "pods_per_s": 0.0, "p50_s": math.nan, "p99_s": math.nan, "span_s": math.nan}
    waits = [bound[n] - created[n] for n in names]
    span = max(bound[n] for n in names) - min(created.values())
    return {"placed": len(names), "pods_per_s": len(names) / span if span > 0 else math.nan,
            "p50_s": percentile(waits, 50), "p99_s": percentile(waits, 99), "span_s": span}


def pod_doc(name: str, kind: str) -> dict[str, Any]:
    """A pod that wants one book: through a ResourceClaimTemplate (``claim``) or ``topology/book: 1``."""
    container: dict[str, Any] = {"name": "main", "image": "localhost/none:never"}
    spec: dict[str, Any] = {"nodeSelector": {SIM_LABEL: "true"}, "containers": [container],
                            "terminationGracePeriodSeconds": 0}
    if kind == "claim":
        spec["resourceClaims"] = [{"name": "book", "resourceClaimTemplateName": TEMPLATE}]
        container["resources"] = {"claims": [{"name": "book"}]}
    elif kind in ("extended", "deviceplugin"):
        container["resources"] = {"requests": {EXTENDED: "1"}, "limits": {EXTENDED: "1"}}
    else:
        raise ValueError(kind)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def node_doc(name: str, *, sim: bool) -> dict[str, Any]:
    """A Node KWOK manages (its annotation), with a z16-sized status; ``sim``: one the fill pods may use."""
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}
    if sim:
        labels[SIM_LABEL] = "true"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
            "status": {"capacity": capacity, "allocatable": capacity}}


def fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


COLUMNS = (("variant", "variant", 12, None), ("phase", "phase", 8, None), ("pods", "placed", 6, 0),
           ("pods/s", "pods_per_s", 7, 1), ("p50 s", "p50_s", 7, 2), ("p99 s", "p99_s", 7, 2),
           ("Filter ms", "filter_ms", 9, 2), ("DRA ms/att", "dra_ms_per_attempt", 10, 2),
           ("PreBind ms", "dra_prebind_ms_per_attempt", 10, 1),
           ("att/pod", "attempts_per_pod", 7, 2),
           ("sched CPU ms/pod", "sched_cpu_ms_per_pod", 16, 1), ("apiserver CPU s", "apiserver_cpu_s", 15, 1),
           ("etcd CPU s", "etcd_cpu_s", 10, 1), ("apiserver MiB", "apiserver_rss_mib", 13, 0),
           ("etcd MiB", "etcd_rss_mib", 8, 0))


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The phases as one table, and the other layouts' pods/s against ``counters`` in the same phase."""
    lines = [" ".join(f"{h:>{w}}" for h, _, w, _ in COLUMNS)]
    for r in rows:
        lines.append(" ".join(f"{r.get(k, '-'):>{w}}" if d is None else f"{fmt(r.get(k, math.nan), d):>{w}}"
                              for _, k, w, d in COLUMNS))
    base = {r["phase"]: r for r in rows if r["variant"] == "counters"}
    ratios = []
    for r in rows:
        b = base.get(r["phase"])
        if r["variant"] != "counters" and b and b.get("pods_per_s") and r.get("pods_per_s"):
            ratios.append(f"  {r['variant']:>12} {r['phase']:>8}: pods/s {r['pods_per_s'] / b['pods_per_s']:.2f}x, "
                          f"p99 {r['p99_s'] / b['p99_s']:.2f}x, Filter ms {r['filter_ms'] / b['filter_ms']:.2f}x, "
                          f"scheduler CPU/pod {r['sched_cpu_ms_per_pod'] / b['sched_cpu_ms_per_pod']:.2f}x")
    if ratios:
        lines += ["", "against counters (same phase):", *ratios]
    return "\n".join(lines)


# --- the API (the bench's own load: pods, nodes; the slices go through the agent's client) ---------------------

class Api:
    """JSON over HTTPS to the API server with the admin certificate; a keep-alive connection per thread."""

    def __init__(self, ctx: Any, host: str = "127.0.0.1", port: int = 6443) -> None:
        self.ctx, self.host, self.port = ctx, host, port
        self.local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=120)
            self.local.conn = conn
        return conn

    def call(self, method: str, path: str, body: Any = None, *, ok: Iterable[int] = (200, 201, 202),
             content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in range(2):
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        if response.status not in set(ok):
            raise ScaleError(f"{method} {path}: {response.status} {raw[:300]!r}")
        return json.loads(raw) if raw else None

    def count(self, path: str) -> int:
        page = self.call("GET", f"{path}?limit=1")
        return len(page.get("items") or []) + int(page["metadata"].get("remainingItemCount") or 0)


class PodWatch:
    """When each pod of the namespace was first seen with a node (a watch from the bench's start)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.bound: dict[str, float] = {}
        self.stop = threading.Event()
        self.error: str | None = None
        rv = api.call("GET", f"/api/v1/namespaces/{NS}/pods?limit=1")["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, args=(rv,), daemon=True)
        self.thread.start()

    def _run(self, rv: str) -> None:
        while not self.stop.is_set():
            conn = http.client.HTTPSConnection(self.api.host, self.api.port, context=self.api.ctx, timeout=30)
            try:
                conn.request("GET", f"/api/v1/namespaces/{NS}/pods?watch=1&allowWatchBookmarks=true"
                                    f"&resourceVersion={rv}&timeoutSeconds=600")
                response = conn.getresponse()
                if response.status != 200:
                    self.error = f"watch: {response.status}"
                    return
                while not self.stop.is_set():
                    line = response.readline()
                    if not line:
                        break
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if event.get("type") in ("ADDED", "MODIFIED") and (obj.get("spec") or {}).get("nodeName"):
                        self.bound.setdefault(obj["metadata"]["name"], time.monotonic())
                    elif event.get("type") == "ERROR":
                        self.error = f"watch: {obj.get('message')}"
                        return
            except (OSError, http.client.HTTPException, ValueError):
                continue  # a timeout with nothing to say, or the stream ended: watch again from rv
            finally:
                conn.close()


# --- the bench -------------------------------------------------------------------------------------------------

def kwok_bin() -> Path:
    done = subprocess.run([str(ROOT / "devkit" / "cluster" / "build-kwok.sh"), "--print"], capture_output=True,
                          text=True, check=True)
    return Path(done.stdout.strip())


class Sim:
    def __init__(self, work: Path, nodes: int, agents: int, threads: int) -> None:
        from bench.cluster.control_plane import Agents, ControlPlane

        self.plane = ControlPlane(work, node_lifecycle=True, scheduler_qps=QPS, controller_qps=QPS)
        self.agents = Agents(self.plane)
        self.work = work
        self.n = nodes
        self.n_agents = agents
        self.threads = threads
        self.nodes = [f"sim-{i:05d}" for i in range(nodes)]
        self.agent_nodes = [f"agent-node-{i:03d}" for i in range(agents)]
        self.api: Api | None = None
        self.watch: PodWatch | None = None
        self.created: dict[str, float] = {}
        self.live: list[str] = []  # the pods of the current variant
        self.seq = 0

    @property
    def a(self) -> Api:
        assert self.api is not None
        return self.api

    def up(self) -> dict[str, Any]:
        kwok = kwok_bin()
        if not (kwok / "kwok").is_file():
            raise ScaleError(f"no KWOK at {kwok}: make kwok-build")
        self.plane.up()
        self.plane.deviceclasses()
        self.api = Api(self.plane.admin_context())
        config = self.work / "kwok.yaml"
        config.write_text((kwok / "stages.yaml").read_text())
        # The pod addresses KWOK writes into pods' status come from --cidr (a /24 by default: too few for 8,000 pods);
        # nothing is ever sent to them.
        self.plane.start_extra("kwok", [str(kwok / "kwok"), f"--kubeconfig={self.plane.kubeconfig}",
                                        "--manage-all-nodes=false",
                                        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                                        f"--config={config}", "--cidr=10.0.0.1/16", "--node-lease-duration-seconds=40"])
        a = self.a
        a.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        a.call("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": TEMPLATE},
            "spec": {"spec": {"devices": {"requests": [{"name": "book", "exactly": {
                "deviceClassName": f"book.{DRIVER}", "allocationMode": "ExactCount", "count": 1}}]}}}})
        from topology_devkit.testing.wait import wait_until

        wait_until("the default ServiceAccount", lambda: a.count(f"/api/v1/namespaces/{NS}/serviceaccounts") > 0,
                   60, every=0.5, error=ScaleError)
        t0 = time.monotonic()
        self._parallel(lambda n: a.call("POST", "/api/v1/nodes", node_doc(n, sim=True)), self.nodes)
        self._parallel(lambda n: a.call("POST", "/api/v1/nodes", node_doc(n, sim=False)), self.agent_nodes)
        created = time.monotonic() - t0

        def ready() -> bool:
            nodes = a.call("GET", "/api/v1/nodes")["items"]
            good = sum(1 for n in nodes if any(c["type"] == "Ready" and c["status"] == "True"
                                               for c in n["status"].get("conditions", []))
                       and not any(t["key"] == "node.kubernetes.io/not-ready" for t in n["spec"].get("taints", [])))
            return good >= len(self.nodes) + len(self.agent_nodes)

        wait_until(f"{len(self.nodes)} KWOK nodes Ready and untainted", ready, 300 + self.n // 5, every=2.0,
                   error=ScaleError)
        self.watch = PodWatch(a)
        return {"nodes_created_s": created, "nodes_ready_s": time.monotonic() - t0}

    def down(self) -> None:
        if self.watch is not None:
            self.watch.stop.set()
        self.agents.stop()
        self.plane.down()

    def _parallel(self, fn: Any, items: Sequence[Any], threads: int | None = None) -> list[Any]:
        with concurrent.futures.ThreadPoolExecutor(threads or self.threads) as pool:
            return list(pool.map(fn, items))

    # --- slices -------------------------------------------------------------------------------------------------
    def publish(self, layout: str, *, remove: bool = False) -> dict[str, Any]:
        """The publisher process: every simulated node's pool in ``layout`` (or none, ``remove``)."""
        nodes = self.work / "nodes.txt"
        nodes.write_text("\n".join(self.nodes) + "\n")
        usage0 = self.plane.usage()
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "publish", "--layout", layout,
                               "--nodes-file", str(nodes), *(["--remove"] if remove else [])],
                              capture_output=True, text=True, timeout=3600, check=False,
                              env={**os.environ, "KUBECONFIG": str(self.plane.kubeconfig)})
        if done.returncode != 0:
            raise ScaleError(f"publisher: {done.stderr.strip()[-600:]}")
        out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        out["wall_s"] = time.monotonic() - t0
        out.update(self._cpu_delta(usage0, self.plane.usage()))
        return out

    def slice_sizes(self) -> dict[str, Any]:
        """Every slice of the driver as one LIST returns it: count, JSON bytes, and the LIST's time (median of 5)."""
        times, raw = [], b""
        for _ in range(5):
            conn = http.client.HTTPSConnection(self.a.host, self.a.port, context=self.a.ctx, timeout=120)
            t0 = time.monotonic()
            conn.request("GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3D{DRIVER}",
                         headers={"Accept": "application/json"})
            raw = conn.getresponse().read()
            times.append(time.monotonic() - t0)
            conn.close()
        items = json.loads(raw)["items"]
        db = metric_sum(parse_metrics(self.plane.etcd_metrics()), "etcd_mvcc_db_total_size_in_use_in_bytes")
        return {"slices": len(items), "list_bytes": len(raw), "list_s": sorted(times)[2],
                "bytes_per_node": sum(len(json.dumps(i, separators=(",", ":"))) for i in items
                                      if i["spec"].get("nodeName") == self.nodes[0]),
                "etcd_db_in_use_bytes": db}

    # --- real agents -------------------------------------------------------------------------------------------
    def prove_agents(self) -> dict[str, Any]:
        """Real agents on their own nodes: their pools are the publisher's for the node, and a claim on each is
        placed."""
        from topology_devkit.testing.wait import wait_until

        t0 = time.monotonic()
        for i, node in enumerate(self.agent_nodes):
            self.agents.start(node, f"bench-agent-{i:03d}")

        def pools() -> dict[str, dict[str, str]]:
            items = self.a.call("GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3D"
                                       f"{DRIVER}")["items"]
            out: dict[str, dict[str, str]] = {}
            for s in items:
                if s["spec"]["nodeName"] in self.agent_nodes:
                    out.setdefault(s["spec"]["nodeName"], {})[s["metadata"]["name"]] = \
                        (s["metadata"].get("annotations") or {}).get(f"{DRIVER}/content", "")
            return out

        def complete() -> bool:
            have = pools()
            return all(len(have.get(n, {})) == len(node_plan(n, "counters").slices) for n in self.agent_nodes)

        wait_until(f"{len(self.agent_nodes)} real agents' pools", complete, 120 + 10 * len(self.agent_nodes),
                   every=1.0, error=ScaleError)
        up_s = time.monotonic() - t0
        have = pools()
        differ = [n for n in self.agent_nodes
                  if have[n] != {s.name: s.content for s in node_plan(n, "counters").slices}]
        if differ:
            raise ScaleError(f"real agents published pools other than the publisher's builder makes: {differ[:3]}")
        names = []
        for node in self.agent_nodes:
            doc = pod_doc(f"proof-{node}", "claim")
            doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            names.append(doc["metadata"]["name"])
            self.a.call("POST", f"/api/v1/namespaces/{NS}/pods", doc)
        assert self.watch is not None
        wait_until("a claim placed on every real agent's node", lambda: all(n in self.watch.bound for n in names)
                   if self.watch else False, 120, every=0.5, error=ScaleError)
        for name in names:
            self.a.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}", NOW)
        if self.agents.dead():
            raise ScaleError(f"agents exited: {self.agents.dead()}")
        return {"agents": len(self.agent_nodes), "pools_same_as_publisher": True, "agents_up_s": up_s,
                "claims_placed_on_agent_nodes": len(names)}

    # --- load --------------------------------------------------------------------------------------------------
    def _create(self, kind: str, prefix: str) -> str:
        self.seq += 1
        name = f"{prefix}-{self.seq:06d}"
        self.created[name] = time.monotonic()
        self.a.call("POST", f"/api/v1/namespaces/{NS}/pods", pod_doc(name, kind))
        return name

    def _wait_bound(self, names: Sequence[str], stall: float = 90.0, *, strict: bool = True) -> int:
        """Wait until every pod of ``names`` is bound; the count left when nothing moved for ``stall`` seconds (a
        ScaleError then when ``strict``)."""
        assert self.watch is not None
        watch = self.watch
        last, seen = time.monotonic(), -1
        while True:
            left = sum(1 for n in names if n not in watch.bound)
            if not left:
                return 0
            if watch.error:
                raise ScaleError(watch.error)
            if left != seen:
                last, seen = time.monotonic(), left
            elif time.monotonic() - last > stall:
                if strict:
                    raise ScaleError(f"{left} of {len(names)} pods not bound after {stall:.0f} s without progress")
                return left
            time.sleep(0.2)

    def _measure(self, fn: Any) -> dict[str, Any]:
        sched0 = parse_metrics(self.plane.scheduler_metrics())
        usage0 = self.plane.usage()
        names = fn()
        sched1 = parse_metrics(self.plane.scheduler_metrics())
        usage1 = self.plane.usage()
        assert self.watch is not None
        row: dict[str, Any] = latency_figures({n: self.created[n] for n in names}, self.watch.bound)
        row.update(scheduler_figures(sched0, sched1))
        row["attempts_per_pod"] = row["attempts"] / row["placed"] if row["placed"] else math.nan
        row.update(self._cpu_delta(usage0, usage1))
        row["sched_cpu_ms_per_pod"] = (1000 * row["kube-scheduler_cpu_s"] / row["placed"] if row["placed"]
                                       else math.nan)
        return row

    @staticmethod
    def _cpu_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for comp, u in after.items():
            key = {"kube-apiserver": "apiserver", "etcd": "etcd"}.get(comp, comp)
            if comp in before:
                out[f"{key}_cpu_s"] = u.cpu_s - before[comp].cpu_s
            out[f"{key}_rss_mib"] = u.rss / 2**20
            out[f"{key}_hwm_mib"] = u.hwm / 2**20
        return out

    def fill(self, kind: str, count: int, prefix: str) -> dict[str, Any]:
        def go() -> list[str]:
            names = self._parallel(lambda _: self._create(kind, prefix), range(count), threads=4)
            self._wait_bound(names)
            self.live.extend(names)
            return names

        row = self._measure(go)
        row["create_per_s"] = count / (max(self.created[n] for n in self.live[-count:]) -
                                       min(self.created[n] for n in self.live[-count:]) + 1e-9)
        return row

    def churn(self, kind: str, rate: float, seconds: float, prefix: str) -> dict[str, Any]:
        """Delete a pod of the fill and create one, ``rate`` times a second (the new pods are not deleted)."""
        rng = random.Random(42)
        victims = list(self.live)
        left = [0]

        def go() -> list[str]:
            names: list[str] = []
            t0 = time.monotonic()
            i = 0
            while time.monotonic() - t0 < seconds and victims:
                due = t0 + i / rate
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                victim = victims.pop(rng.randrange(len(victims)))
                self.live.remove(victim)
                self.a.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{victim}", NOW, ok=(200, 202, 404))
                names.append(self._create(kind, prefix))
                self.live.append(names[-1])
                i += 1
            left[0] = self._wait_bound(names, strict=False)
            return names

        row = self._measure(go)
        row["unbound"] = left[0]
        return row

    def clear(self) -> float:
        """Every pod gone, and every claim (the controllers delete a template's claims, the garbage collector the
        scheduler's claims of extended resources)."""
        from topology_devkit.testing.wait import wait_until

        t0 = time.monotonic()

        def gone() -> bool:
            # a collection of thousands can outlast the request's 60 s (504): the deletion goes on, ask again
            self.a.call("DELETE", f"/api/v1/namespaces/{NS}/pods", NOW, ok=(200, 504))
            return self.a.count(f"/api/v1/namespaces/{NS}/pods") == 0

        wait_until("every pod gone", gone, 900, every=2.0, error=ScaleError)
        wait_until("every claim gone", lambda: self.a.count(
            f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims") == 0, 900, every=2.0, error=ScaleError)
        self.live.clear()
        return time.monotonic() - t0

    def device_plugin_nodes(self, books: int) -> None:
        """Every simulated node advertises ``topology/book: books`` as a device plugin would make kubelet do."""
        body = {"status": {"capacity": {EXTENDED: str(books)}, "allocatable": {EXTENDED: str(books)}}}
        self._parallel(lambda n: self.a.call("PATCH", f"/api/v1/nodes/{n}/status", body,
                                             content_type="application/merge-patch+json"), self.nodes)

    def variant(self, name: str, churn_rate: float, churn_seconds: float) -> tuple[list[dict[str, Any]],
                                                                                   dict[str, Any]]:
        layout, kind = VARIANTS[name]
        info: dict[str, Any] = {"variant": name}
        if layout is None:
            info["publish"] = self.publish("counters", remove=True)
            self.device_plugin_nodes(BOOKS_PER_NODE)
        else:
            info["publish"] = self.publish(layout)
            info["slices"] = self.slice_sizes()
        half, more = phase_sizes(self.n)
        rows = []
        for phase, fn in (("0-50%", lambda: self.fill(kind, half, f"{name}-a")),
                          ("50-90%", lambda: self.fill(kind, more, f"{name}-b")),
                          ("churn", lambda: self.churn(kind, churn_rate, churn_seconds, f"{name}-c"))):
            row = fn()
            row.update(variant=name, phase=phase, nodes=self.n)
            rows.append(row)
            print(json.dumps(row), flush=True)
        info["clear_s"] = self.clear()
        return rows, info


def publish_main(args: argparse.Namespace) -> int:
    """The publisher: each node's pool through the agent's SlicePublisher and API client, 16 nodes at a time."""
    from agent.dra.publisher import SlicePublisher
    from agent.node.kubeapi import kubeconfig_api

    nodes = [n for n in Path(args.nodes_file).read_text().split() if n]
    api = kubeconfig_api()
    t0 = time.monotonic()

    def one(node: str) -> tuple[int, int]:
        publisher = SlicePublisher(api, node, DRIVER)
        if args.remove:
            return publisher.remove_all(), publisher.lists
        publisher.publish(node_plan(node, args.layout))
        return publisher.writes, publisher.lists

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        done = list(pool.map(one, nodes))
    usage = os.times()
    print(json.dumps({"layout": args.layout, "nodes": len(nodes), "writes": sum(w for w, _ in done),
                      "lists": sum(n for _, n in done), "seconds": time.monotonic() - t0,
                      "publisher_cpu_s": usage.user + usage.system}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    pub = sub.add_parser("publish", help="(the bench's publisher process)")
    pub.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    pub.add_argument("--nodes-file", required=True)
    pub.add_argument("--remove", action="store_true")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=10, help="real agents beside the simulated nodes (>= 10)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--churn-rate", type=float, default=10.0, help="deletes and creates per second")
    parser.add_argument("--churn-seconds", type=float, default=60.0)
    parser.add_argument("--storms", type=int, default=3, help="republications of every pool with nothing changed")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "publish":
        return publish_main(args)
    variants = run_order([v for v in args.variants.split(",") if v])
    bad = [v for v in variants if v not in VARIANTS]
    if bad or args.nodes < 1 or args.agents < 0 or args.churn_rate <= 0:
        print(f"simulated_nodes: variants are {', '.join(VARIANTS)}; nodes >= 1, agents >= 0, churn rate > 0",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("simulated_nodes: needs root (the real cluster's components)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    sim = Sim(work, args.nodes, args.agents, threads=8)
    rows: list[dict[str, Any]] = []
    infos: list[dict[str, Any]] = []
    t0 = time.monotonic()
    result: dict[str, Any] = {"nodes": args.nodes, "rows": rows, "variants": infos}
    try:
        result["up"] = sim.up()
        print(json.dumps(result["up"]), flush=True)
        if args.agents:
            result["agents"] = sim.prove_agents()
            print(json.dumps(result["agents"]), flush=True)
        for name in variants:
            got, info = sim.variant(name, args.churn_rate, args.churn_seconds)
            rows.extend(got)
            infos.append(info)
            print(json.dumps(info), flush=True)
        if args.storms:
            sim.publish("counters")
            result["storms"] = [sim.publish("counters") for _ in range(args.storms)]
            print(json.dumps(result["storms"]), flush=True)
        dead = sim.agents.dead()
        if dead:
            raise ScaleError(f"agents exited: {dead}")
    except (ScaleError, subprocess.CalledProcessError) as exc:
        print(f"simulated_nodes: {exc}", file=sys.stderr)
        return 1
    finally:
        sim.down()
        if args.json_out:
            args.json_out.write_text(json.dumps(result, indent=1))
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n== simulated_nodes: {args.nodes} KWOK nodes (z16: 8 books, 16 sockets), {args.agents} real agents, "
          f"{time.monotonic() - t0:.0f} s")
    print(table(rows))
    for info in infos:
        s = info.get("slices") or {}
        p = info["publish"]
        print(f"  {info['variant']:>12}: publish {p['seconds']:.1f} s ({p['writes']} writes), "
              + (f"{s['slices']} slices, {s['bytes_per_node']} B/node, LIST all {s['list_bytes'] / 2**20:.1f} MiB in "
                 f"{s['list_s']:.2f} s, etcd in use {s['etcd_db_in_use_bytes'] / 2**20:.0f} MiB" if s else "no slices"))
    for storm in result.get("storms", []):
        print(f"  restart storm (every pool republished, nothing changed): {storm['seconds']:.1f} s, "
              f"{storm['lists']} LISTs, {storm['writes']} writes, "
              f"API server CPU {storm.get('apiserver_cpu_s', 0):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
