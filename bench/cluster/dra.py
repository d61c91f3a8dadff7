"""DRA mode's figures on the real cluster (docs/admin/modes/dra.md), on a cluster ``make e2e`` set up and left
running (``KEEP_CLUSTER=1 make e2e``):

* **ResourceSlice publication, 16-book shape**: ``topology-agent serve --mode dra`` on this host (production
  defaults: levels auto, the 60 s look) with the ``z17-382`` snapshot (4 drawers x 4 books, 32 sockets, 382 CPUs)
  against the cluster's admin kubeconfig, its kubelet plugin sockets in a scratch directory (this kubelet never sees
  it). Timed from the process spawn to the node's slices complete on the API server (every slice of the plan there,
  with its content, at one generation), from an empty pool; and from a topology change (a CPU of book 5 offline in
  the snapshot, then SIGHUP) to the slices complete with that book tainted, and back. Slice count and size (bytes of
  JSON as the API server returns them) as info.
* **API requests per hour at steady state**: the chart's agent in ``mode: dra`` (the lane's fake topology), counted
  from the API server's audit log (devkit/topology_devkit/realcluster/configs.py audits the accounts of the
  ``topology-system`` namespace at Metadata) over a window with nothing changing, by verb and resource, scaled to an
  hour. Target: zero writes.
* **pod with a claim -> Running, against a device-plugin pod on the same node**: the chart's agent in ``mode: dra``
  serves ``book.topology.s390x.ibm.com``; a second agent on this host in device-plugin mode serves the same books as
  ``benchdp/book`` (another resource name, so both run on one node). Three kinds alternate (A B C, C B A): a
  device-plugin pod (``benchdp/book: 1``), a pod with a ResourceClaimTemplate (the claim made by the controller
  manager), a pod with a ResourceClaim created before it; all with the same cpu request, each timed from the create
  call to phase Running, with when the claim existed, was allocated, the pod bound and the agent logged the claim
  prepared (its own timestamps, same clock). Target: median ratio (claim / device plugin) <= 1.2, both kinds.

Skipped, with the reason, when no such cluster is up. The release is put back as the lane installed it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "devkit"))

from bench.lib.common import (
    INFO,
    MET,
    MISSED,
    ROOT,
    BenchError,
    Row,
    at_most,
    bench_main,
    median,
    skipped,
    spread,
    stop_process,
)
from topology_devkit.testing.wait import wait_until

NAME = "dra"
CLUSTER_DIR = Path(os.environ.get("CLUSTER_DIR") or ROOT / ".cluster")
KUBECONFIG = CLUSTER_DIR / "kubeconfig"
AUDIT_LOG = CLUSTER_DIR / "logs" / "audit.log"
SNAPSHOT = CLUSTER_DIR / "snapshots" / "default.json"
RELEASE, RELEASE_NS = "topology-agent", "topology-system"
NAMESPACE = "topology-bench-dra"
IMAGE = "localhost/topology-e2e-busybox:latest"
DRIVER = "topology.s390x.ibm.com"
BOOK_CLASS = f"book.{DRIVER}"
DP_PREFIX = "benchdp"
OFFLINE_CPU_BOOK = 5  # the group (sixth book) whose first CPU goes offline in the change measurement
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


# --------------------------------------------------------------------------- cluster access

def _api() -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(KUBECONFIG))


def _helm() -> str:
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    local = ROOT / ".tools" / "bin" / "helm"
    return str(local) if local.is_file() else "helm"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (the device-plugin agent on the host registers with the kubelet)"
    if not KUBECONFIG.is_file():
        return f"no cluster: {KUBECONFIG} missing (KEEP_CLUSTER=1 make e2e leaves one up)"
    if not SNAPSHOT.is_file():
        return f"{SNAPSHOT} missing: install the chart as devkit/cluster/e2e.sh does"
    try:
        from kubernetes import client

        node = client.CoreV1Api(_api()).list_node().items[0]
    except Exception as exc:
        return f"the cluster does not answer: {str(exc).splitlines()[0][:120]}"
    if not AUDIT_LOG.is_file():
        return f"no audit log {AUDIT_LOG}: the cluster predates the lane's audit policy (make cluster-down, make e2e)"
    del node
    return None


def _node(core: Any) -> str:
    return str(core.list_node().items[0].metadata.name)


def _raw(api: Any, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None) -> Any:
    """One request as JSON in, JSON out (the client's own auth and TLS); ApiException on an error status."""
    from kubernetes.client.exceptions import ApiException

    params = api.param_serialize(method=method, resource_path=path, query_params=query or [], body=body,
                                 header_params={"Accept": "application/json", "Content-Type": "application/json"},
                                 auth_settings=["BearerToken"])
    response = api.call_api(*params, _request_timeout=30)
    response.read()
    if not 200 <= response.status < 300:
        raise ApiException(http_resp=response)
    return json.loads(response.data) if response.data else None


def _slices(api: Any, node: str) -> list[dict[str, Any]]:
    doc = _raw(api, "GET", "/apis/resource.k8s.io/v1/resourceslices",
               query=[("fieldSelector", f"spec.nodeName={node},spec.driver={DRIVER}")])
    return list(doc["items"])


def _delete_slices(api: Any, node: str) -> None:
    from kubernetes.client.exceptions import ApiException

    for s in _slices(api, node):
        try:
            _raw(api, "DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}")
        except ApiException as exc:
            if exc.status != 404:
                raise


def _helm_upgrade(*extra: str) -> None:
    done = subprocess.run([_helm(), "upgrade", RELEASE, str(ROOT / "deploy" / "helm" / "s390x-topology-agent"),
                           "--namespace", RELEASE_NS, "--kubeconfig", str(KUBECONFIG),
                           "-f", str(ROOT / "devkit" / "cluster" / "e2e-values.yaml"),
                           "--set-file", f"fakeTopology.snapshots.default\\.json={SNAPSHOT}", *extra,
                           "--wait", "--timeout", "180s"], capture_output=True, text=True, timeout=240, check=False)
    if done.returncode != 0:
        raise BenchError(f"helm upgrade {' '.join(extra)}: {done.stderr.strip()[-400:]}")


def _agent_pod(core: Any) -> Any:
    pods = core.list_namespaced_pod(RELEASE_NS, label_selector=f"app.kubernetes.io/instance={RELEASE}").items
    ready = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
             and all(c.ready for c in p.status.container_statuses or [])]
    return ready[0] if ready else None


@contextmanager
def _dra_release(api: Any, core: Any, node: str) -> Iterator[Any]:
    """The chart's release in mode: dra (production defaults otherwise) for the block; the lane's install after."""
    _helm_upgrade("--set", "mode=dra")
    try:
        pod = wait_until("the agent in DRA mode ready with its slices",
                         lambda: _agent_pod(core) if _agent_pod(core) is not None and _slices(api, node) else None,
                         180, every=0.5, error=BenchError)
        yield pod
    finally:
        _helm_upgrade()
        wait_until("the agent in device-plugin mode ready", lambda: _agent_pod(core), 180, every=0.5, error=BenchError)


# --------------------------------------------------------------------------- publication on the 16-book shape

def _plan(topology: Any, node: str, broken: dict[tuple[str, str], str] | None = None) -> Any:
    from agent.policy.grouping import GroupingSettings, group_topology
    from agent.policy.resource_slices import SliceSettings, build_pool

    grouping = group_topology(topology, GroupingSettings().validated())
    return grouping, build_pool(grouping, topology, SliceSettings(node).validated(), broken or {})


def _complete(api: Any, node: str, plan: Any) -> list[dict[str, Any]] | None:
    from agent.policy.resource_slices import CONTENT_ANNOTATION

    have = {s["metadata"]["name"]: s for s in _slices(api, node)}
    if set(have) != {p.name for p in plan.slices}:
        return None
    if len({s["spec"]["pool"]["generation"] for s in have.values()}) != 1:
        return None
    for p in plan.slices:
        if (have[p.name]["metadata"].get("annotations") or {}).get(CONTENT_ANNOTATION) != p.content:
            return None
    return list(have.values())


def _write_snapshot(path: Path, topology: Any) -> None:
    from agent.topology import snapshot_format as snapshot

    tmp = path.with_suffix(".tmp")
    tmp.write_text(snapshot.dumps(topology), encoding="utf-8")
    os.replace(tmp, path)  # a new inode: the agent's fingerprint sees it


def _host_agent(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([str(ROOT / ".venv" / "bin" / "topology-agent"), "serve", *args], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **env})


def publication(api: Any, node: str, quick: bool) -> list[Row]:
    from agent.policy.device_states import machine_health
    from agent.policy.grouping import GroupingSettings
    from bench.lib.shapes import Z17_382
    from topology_devkit.synthetic import build_topology

    topology = build_topology(Z17_382)
    grouping, plan = _plan(topology, node)
    gone = min(grouping.groups[OFFLINE_CPU_BOOK].cpus)  # the first CPU of the sixth book
    offline = dataclasses.replace(topology, cpus=tuple(
        dataclasses.replace(c, online=False) if c.cpu == gone else c for c in topology.cpus))
    broken = machine_health(grouping, offline, GroupingSettings().validated())
    _, tainted_plan = _plan(topology, node, broken)
    starts, changes, backs = [], [], []
    sizes: list[int] = []
    runs = 1 if quick else 3
    with tempfile.TemporaryDirectory(prefix="bench-dra-") as tmp:
        work = Path(tmp)
        snap = work / "z17-382.json"
        for d in ("kubelet", "registry", "plugin", "cdi"):
            (work / d).mkdir()
        args = ["--mode", "dra", "--topology-file", str(snap), "--kubelet-dir", str(work / "kubelet"),
                "--dra-registry-dir", str(work / "registry"), "--dra-plugin-dir", str(work / "plugin"),
                "--cdi-dir", str(work / "cdi"), "--pod-resources-interval", "0", "--no-node-labels",
                "--metrics-port", "0", "--cpuset-enforcement", "none", "--log-format", "text"]
        env = {"NODE_NAME": node, "KUBECONFIG": str(KUBECONFIG)}
        for _ in range(runs):
            _write_snapshot(snap, topology)
            _delete_slices(api, node)
            wait_until("the pool empty", lambda: not _slices(api, node), 30, every=0.02, error=BenchError)
            t0 = time.monotonic()
            proc = _host_agent(args, env, work / "agent.log")
            try:
                got = wait_until("the 16-book slices complete", lambda: _complete(api, node, plan), 120,
                                 every=0.02, error=BenchError)
                starts.append(time.monotonic() - t0)
                sizes = [len(json.dumps(s, separators=(",", ":"))) for s in got]
                time.sleep(1.0)  # the agent past its first publication, into its loops
                _write_snapshot(snap, offline)
                t0 = time.monotonic()
                proc.send_signal(signal.SIGHUP)
                wait_until("the offline book's taint published", lambda: _complete(api, node, tainted_plan), 60,
                           every=0.02, error=BenchError)
                changes.append(time.monotonic() - t0)
                _write_snapshot(snap, topology)
                t0 = time.monotonic()
                proc.send_signal(signal.SIGHUP)
                wait_until("the taint gone", lambda: _complete(api, node, plan), 60, every=0.02, error=BenchError)
                backs.append(time.monotonic() - t0)
            except BenchError as exc:
                raise BenchError(f"{exc}; the agent's log: {(work / 'agent.log').read_text()[-1500:]}") from None
            finally:
                stop_process(proc)
        _delete_slices(api, node)
    devices = len(plan.devices)
    return [
        Row(NAME, "16-book shape: agent start -> ResourceSlices complete",
            f"median {median(starts):.2f} s (min/max {min(starts):.2f}/{max(starts):.2f}, {runs} starts from an "
            f"empty pool; Python start and imports included)", median(starts), "", INFO, raw={"seconds": starts}),
        Row(NAME, "16-book shape: CPU offline (SIGHUP) -> taint published",
            f"median {median(changes) * 1000:.0f} ms, back {median(backs) * 1000:.0f} ms ({runs} each; "
            f"{spread(changes)} s)", median(changes), "", INFO, raw={"offline": changes, "back": backs}),
        Row(NAME, "16-book shape: what is published",
            f"{len(sizes)} slices ({', '.join(f'{b / 1024:.1f} KiB' for b in sizes)}), {devices} devices, "
            f"{sum(len(c) for c in plan.counters.values())} counters in {len(plan.counters)} sets", None, "", INFO,
            raw={"bytes": sizes, "devices": devices}),
    ]


# --------------------------------------------------------------------------- API requests at steady state

def _audit_counts(offset: int, since: float, until: float) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    with AUDIT_LOG.open(errors="replace") as f:
        f.seek(offset)
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("stage") != "ResponseComplete":
                continue
            if not str(event.get("user", {}).get("username", "")).startswith(f"system:serviceaccount:{RELEASE_NS}:"):
                continue
            when = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if since <= when < until:
                ref = event.get("objectRef") or {}
                resource = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
                counts[(event["verb"], resource)] += 1
    return counts


def steady_requests(quick: bool) -> list[Row]:
    window = 90.0 if quick else 300.0
    time.sleep(10.0)  # past the start's publication and first label sync
    offset = AUDIT_LOG.stat().st_size
    since = time.time()
    time.sleep(window)
    until = time.time()
    time.sleep(2.0)  # the audit backend's buffer flushed
    counts = _audit_counts(offset, since, until)
    per_hour = {f"{verb} {resource}": n * 3600.0 / window for (verb, resource), n in sorted(counts.items())}
    writes = sum(n for (verb, _), n in counts.items() if verb in WRITE_VERBS) * 3600.0 / window
    reads = sum(n for (verb, _), n in counts.items() if verb not in WRITE_VERBS) * 3600.0 / window
    detail = ", ".join(f"{k} {v:.0f}" for k, v in per_hour.items()) or "none"
    return [
        Row(NAME, "steady state: API writes per hour (agent's account, audit log)",
            f"{writes:.0f}/h over a {window:.0f} s window", writes, "0 writes/h", MET if writes == 0 else MISSED,
            raw={"per_hour": per_hour, "window": window}),
        Row(NAME, "steady state: API reads per hour", f"{reads:.0f}/h ({detail})", reads, "", INFO,
            raw={"per_hour": per_hour}),
    ]


# --------------------------------------------------------------------------- pod -> Running, claim vs device plugin

def _pod(name: str, kind: str, claim: str | None) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}}
    # A grace period, not 0: a pod deleted with 0 leaves the API at once, before the kubelet stopped it and had its
    # claim unprepared, and the next pod would start beside that teardown.
    spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [{
        "name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", "exec sleep 3600"],
        "resources": resources}]}
    if kind == "deviceplugin":
        resources["limits"][f"{DP_PREFIX}/book"] = "1"
    else:
        source = {"resourceClaimTemplateName": "bench-book"} if kind == "template" else {"resourceClaimName": claim}
        spec["resourceClaims"] = [{"name": "book", **source}]
        resources["claims"] = [{"name": "book"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _claim_body(name: str | None) -> dict[str, Any]:
    spec = {"devices": {"requests": [{"name": "book", "exactly": {
        "deviceClassName": BOOK_CLASS, "allocationMode": "ExactCount", "count": 1}}]}}
    if name is None:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "bench-book"}, "spec": {"spec": spec}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}


CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


@dataclasses.dataclass
class Sample:
    """One pod: seconds from its create call to each step it went through, that call's wall time, its claim."""

    name: str
    marks: dict[str, float]
    wall0: float
    claim: str | None


def _one_pod(api: Any, kind: str) -> Sample:
    name = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
    claim = f"{name}-claim" if kind == "claim" else None
    if claim:
        _raw(api, "POST", CLAIMS, _claim_body(claim))
    marks: dict[str, float] = {}
    wall0 = time.time()
    t0 = time.monotonic()
    _raw(api, "POST", PODS, _pod(name, kind, claim))
    try:
        while "running" not in marks:
            now = time.monotonic() - t0
            if now > 120:
                raise BenchError(f"pod {name} not Running within 120 s: {marks}")
            pod = _raw(api, "GET", f"{PODS}/{name}")
            if kind == "template" and claim is None:
                statuses = pod["status"].get("resourceClaimStatuses") or []
                if statuses and statuses[0].get("resourceClaimName"):
                    claim = statuses[0]["resourceClaimName"]
                    marks["claim made"] = now
            if claim and "allocated" not in marks:
                c = _raw(api, "GET", f"{CLAIMS}/{claim}")
                if (c.get("status") or {}).get("allocation"):
                    marks["allocated"] = now
            if pod["spec"].get("nodeName") and "bound" not in marks:
                marks["bound"] = now
            if pod["status"].get("phase") == "Running":
                marks["running"] = now
            else:
                time.sleep(0.02)
    finally:
        _raw(api, "DELETE", f"{PODS}/{name}")
        wait_until(f"pod {name} gone",
                   lambda: name not in {p["metadata"]["name"] for p in _raw(api, "GET", PODS)["items"]}, 90,
                   every=0.1, error=BenchError)
        if kind == "claim":
            _raw(api, "DELETE", f"{CLAIMS}/{claim}")
        wait_until("the claims gone", lambda: not _raw(api, "GET", CLAIMS)["items"], 90, every=0.1, error=BenchError)
    return Sample(name, marks, wall0, claim)


def _prepared_times(core: Any, agent: str, since: float) -> dict[str, float]:
    """claim name -> wall time the agent logged it prepared (kubectl logs --timestamps: the runtime's clock)."""
    log = core.read_namespaced_pod_log(agent, RELEASE_NS, timestamps=True, since_seconds=int(time.time() - since) + 5)
    times: dict[str, float] = {}
    for line in (log or "").splitlines():
        stamp, _, text = line.partition(" ")
        marker = f"prepared claim {NAMESPACE}/"
        if marker in text and "unprepared" not in text:
            claim = text.split(marker, 1)[1].split(" ", 1)[0]
            times[claim] = datetime.fromisoformat(stamp.replace("Z", "+00:00")[:26] + "+00:00").timestamp()
    return times


KUBELET_LOG = CLUSTER_DIR / "logs" / "kubelet.log"


def _kubelet_adds(offset: int) -> dict[str, float]:
    """pod name -> wall time of the kubelet's "SyncLoop ADD" for it (klog's clock: this host's, in its time zone)."""
    adds: dict[str, float] = {}
    marker = f'"SyncLoop ADD" source="api" pods=["{NAMESPACE}/'
    with KUBELET_LOG.open(errors="replace") as f:
        f.seek(offset)
        for line in f:
            if marker in line:
                name = line.split(marker, 1)[1].split('"', 1)[0]
                stamp = f"{datetime.now().year}{line[1:5]} {line[6:21]}"
                adds.setdefault(name, datetime.strptime(stamp, "%Y%m%d %H:%M:%S.%f").timestamp())
    return adds


def pod_to_running(api: Any, core: Any, agent_pod: str, quick: bool) -> list[Row]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    except ApiException as exc:
        if exc.status != 409:
            raise
    _raw(api, "POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates", _claim_body(None))
    rounds = 3 if quick else 10
    started = time.time()
    kubelet_offset = KUBELET_LOG.stat().st_size
    results: dict[str, list[Sample]] = {"deviceplugin": [], "template": [], "claim": []}
    with tempfile.TemporaryDirectory(prefix="bench-dra-dp-") as tmp:
        dp = _host_agent(["--mode", "deviceplugin", "--topology-file", str(SNAPSHOT), "--resource-prefix", DP_PREFIX,
                          "--cpuset-enforcement", "none", "--no-node-labels", "--metrics-port", "0",
                          "--log-format", "text"], {}, Path(tmp) / "dp.log")
        try:
            wait_until(f"the node advertising {DP_PREFIX}/book", lambda: int(
                (core.read_node(_node(core)).status.allocatable or {}).get(f"{DP_PREFIX}/book", "0")) > 0, 60,
                every=0.2, error=BenchError)
            kinds = ("deviceplugin", "template", "claim")
            for i in range(rounds):
                for kind in kinds if i % 2 == 0 else tuple(reversed(kinds)):
                    results[kind].append(_one_pod(api, kind))
        finally:
            stop_process(dp)
    prepared = _prepared_times(core, agent_pod, started)
    adds = _kubelet_adds(kubelet_offset)
    for samples in results.values():
        for m in samples:
            if m.name in adds:
                m.marks["kubelet ADD"] = adds[m.name] - m.wall0
    rows: list[Row] = []
    running = {k: [m.marks["running"] for m in v] for k, v in results.items()}
    base = median(running["deviceplugin"])
    for kind, label in (("template", "ResourceClaimTemplate"), ("claim", "pre-created ResourceClaim")):
        ratio = median(running[kind]) / base
        pairs = [c / d for c, d in zip(running[kind], running["deviceplugin"], strict=True)]
        steps = _steps(results[kind], prepared)
        rows.append(Row(NAME, f"pod with a {label} -> Running / device-plugin pod",
                        f"{ratio:.2f}x ({kind} {median(running[kind]):.2f} s, device plugin {base:.2f} s, medians of "
                        f"{rounds}; pairs {spread(pairs)}); medians from the create call: {steps}", ratio,
                        "median ratio <= 1.2", at_most(ratio, 1.2),
                        raw={kind: [m.marks for m in results[kind]]}))
    rows.append(Row(NAME, "device-plugin pod -> Running (the baseline)",
                    f"median {base:.2f} s; from the create call: {_steps(results['deviceplugin'], {})}",
                    base, "", INFO, raw={"deviceplugin": [m.marks for m in results["deviceplugin"]]}))
    core.delete_namespace(NAMESPACE)
    return rows


def _steps(samples: list[Sample], prepared: dict[str, float]) -> str:
    out = []
    for step in ("claim made", "allocated", "bound", "kubelet ADD"):
        values = [m.marks[step] for m in samples if step in m.marks]
        if values:
            out.append(f"{step} {median(values):.2f} s")
    prep = [prepared[m.claim] - m.wall0 for m in samples if m.claim in prepared]
    if prep:
        out.append(f"prepared (agent's log) {median(prep):.2f} s")
    out.append(f"Running {median([m.marks['running'] for m in samples]):.2f} s")
    return ", ".join(out)


def run(quick: bool) -> list[Row]:
    why = _why_not()
    if why:
        return [skipped(NAME, "DRA on the real cluster", "-", why)]
    from kubernetes import client

    api = _api()
    core = client.CoreV1Api(api)
    node = _node(core)
    rows = publication(api, node, quick)
    with _dra_release(api, core, node) as agent:
        rows += steady_requests(quick)
        rows += pod_to_running(api, core, agent.metadata.name, quick)
    return rows


if __name__ == "__main__":
    sys.exit(bench_main(NAME, run, __doc__))
