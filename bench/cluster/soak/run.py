"""``make soak``: pod churn and seeded faults on the real-cluster lane, the truth checked every second.

Run by ``devkit/cluster/e2e.sh soak`` once the cluster is up and the chart installed (``make soak SOAK_SECONDS=...
SOAK_SEED=...``). The soak installs its own base (``--levels book,socket``, device-plugin mode, CRI enforcement),
measures a quiet run of book pods, then for ``--seconds`` creates the plan's pods (``bench/cluster/soak/plan.py``: book,
socket, multi-container, init-container holder, plain, DRA claim, deleted mid-start) and injects its faults one after
the other, while a reader (``truth.py``) snapshots the node and the API server every second and the checker
(``invariants.py``) records every violation with the faults before it. At the end it deletes its pods, puts the base
back, keeps checking for the leak grace, and prints the figures (bench/README.md, section "Soak").

Exit 0 with no violation and pods really admitted; 1 otherwise; 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
for entry in (str(REPO), str(REPO / "devkit")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from agent.cri.client import CriClient  # noqa: E402
from agent.errors import CriError  # noqa: E402
from agent.policy.grouping import GroupingSettings, group_topology  # noqa: E402
from agent.topology import snapshot_format as snapshots  # noqa: E402
from bench.cluster.soak.invariants import KINDS, Allowances, Checker, Violation  # noqa: E402
from bench.cluster.soak.plan import FaultStep, Plan, PodStep, make_plan  # noqa: E402
from bench.cluster.soak.truth import CONTAINERD, DRIVER, Config, Truth  # noqa: E402
from topology_devkit.testing.wait import poll_until, wait_until  # noqa: E402

POD_NS = "topology-soak"
BOOK, SOCKET = "topology/book", "topology/socket"
RUNNING_TIMEOUT = 60.0
MAX_LIVE_PODS = 8


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@dataclass
class Figures:
    created: Counter[str] = field(default_factory=Counter)
    ran: Counter[str] = field(default_factory=Counter)
    mid_start_deleted: int = 0
    pending_timeouts: Counter[str] = field(default_factory=Counter)
    refused: list[str] = field(default_factory=list)  # 4xx at creation: a spec the cluster refuses (a soak bug)
    skipped: int = 0  # too many pods alive at that step
    failures: list[str] = field(default_factory=list)  # admission failures: pod, reason, message
    faults: Counter[str] = field(default_factory=Counter)
    fault_seconds: dict[str, list[float]] = field(default_factory=dict)
    fault_errors: list[str] = field(default_factory=list)
    start_soak: list[float] = field(default_factory=list)
    start_quiet: list[float] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    agent_first: tuple[int, int, int] | None = None  # pid, RSS KiB, fds
    agent_last: tuple[int, int, int] | None = None
    snapshots: int = 0


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        from kubernetes import client, config

        self.args = args
        self.api: Any = config.new_client_from_config(config_file=args.kubeconfig)
        self.core: Any = client.CoreV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        nodes: Any = self.core.list_node(label_selector="topology-e2e/worker=true")
        self.node = str(nodes.items[0].metadata.name)
        self.snapshot_file = Path(args.snapshots) / "default.json"
        topology = snapshots.load(self.snapshot_file)
        grouping = group_topology(topology, GroupingSettings(levels=("book", "socket"), allow_non_s390x=True,
                                                             min_group_cores=0).validated())
        self.cpus = sorted(topology.online_cpus)
        self.config = Config({g.id: frozenset(g.cpus) for g in grouping.groups}, frozenset(self.cpus))
        self.truth = Truth(self.api, self.node, (POD_NS,), args.namespace)
        self.checker = Checker(Allowances())
        self.lock = threading.Lock()
        self.figures = Figures()
        self.stop = threading.Event()
        self.live: set[str] = set()
        self.upgrades = 0
        self.t0 = time.time()
        self.done = threading.Event()

    # --- logging -----------------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"soak [{time.time() - self.t0:7.1f}s] {text}", flush=True)

    # --- kubectl, helm, the lane -------------------------------------------------------------------------------
    def helm_upgrade(self, annotation: bool = False) -> float:
        c = self.config
        argv = [self.args.helm, "upgrade", self.args.release, str(REPO / "deploy" / "helm" / "s390x-topology-agent"),
                "--namespace", self.args.namespace, "--kubeconfig", self.args.kubeconfig,
                "-f", str(REPO / "devkit" / "cluster" / "e2e-values.yaml"),
                "--set-file", f"fakeTopology.snapshots.default\\.json={self.snapshot_file}",
                "--set-json", 'agent.levels=["book","socket"]', "--set", f"mode={c.mode}",
                "--set", f"cpusetEnforcement={c.enforcement}", "--set", f"sharedPool={str(c.shared_pool).lower()}",
                "--wait", "--timeout", "180s"]
        self.upgrades += annotation
        if self.upgrades:  # kept by the upgrades after it (a new value would roll the DaemonSet again)
            argv += ["--set-string", f"podAnnotations.soak-rollout=r{self.upgrades}"]
        t = time.monotonic()
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=240)
        self.wait_agent_ready()
        return time.monotonic() - t

    def agent_ready(self, restarted_after: int = -1) -> bool:
        """The agent's pod is Running and ready (with its container restarted more than ``restarted_after`` times)."""
        pods = self.core.list_namespaced_pod(self.args.namespace,
                                             label_selector=f"app.kubernetes.io/instance={self.args.release}").items
        return any(p.status.phase == "Running" and not p.metadata.deletion_timestamp
                   and all(s.ready and (s.name != "agent" or s.restart_count > restarted_after)
                           for s in p.status.container_statuses or []) for p in pods)

    def agent_restarts(self) -> int:
        pods = self.core.list_namespaced_pod(self.args.namespace,
                                             label_selector=f"app.kubernetes.io/instance={self.args.release}").items
        return max((s.restart_count for p in pods for s in p.status.container_statuses or [] if s.name == "agent"),
                   default=0)

    def wait_agent_ready(self, timeout: float = 180.0, restarted_after: int = -1) -> None:
        deadline = time.monotonic() + timeout
        wait_until("the agent ready", lambda: self.agent_ready(restarted_after), timeout, every=0.5, error=RuntimeError)
        if self.config.mode == "dra":
            wait_until("a ResourceSlice in DRA mode", lambda: self.truth_slices() > 0,
                       max(0.0, deadline - time.monotonic()), every=0.5, error=RuntimeError)

    def truth_slices(self) -> int:
        items = self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                       field_selector=f"spec.driver={DRIVER}")["items"]
        return len(items)

    def cluster(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devkit'}"}
        subprocess.run([sys.executable, "-m", "topology_devkit.realcluster", *args], check=True, timeout=180,
                       cwd=REPO, env=env, capture_output=True, text=True)

    def set_cpu_online(self, cpu: int, online: bool) -> None:
        doc = json.loads(self.snapshot_file.read_text())
        for c in doc["cpus"]:
            if c["cpu"] == cpu:
                c["online"] = online
        maps = self.core.list_namespaced_config_map(self.args.namespace).items
        name = next(m.metadata.name for m in maps if m.metadata.name.endswith("-fake-topology"))
        self.core.patch_namespaced_config_map(name, self.args.namespace,
                                              {"data": {"default.json": json.dumps(doc, indent=1)}})

    # --- pods --------------------------------------------------------------------------------------------------
    def container(self, name: str, resource: str | None = None, command: str = "exec sleep 3600") -> dict[str, Any]:
        requests: dict[str, str] = {"memory": "16Mi"}
        limits: dict[str, str] = {"memory": "32Mi"}
        if resource:  # a whole CPU per one-CPU group, no cpu limit (the chart's admission policy)
            requests.update({"cpu": "1", resource: "1"})
            limits[resource] = "1"
        return {"name": name, "image": self.args.workload_image, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", command], "resources": {"requests": requests, "limits": limits}}

    def manifest(self, step: PodStep) -> tuple[dict[str, Any], dict[str, Any] | None]:
        containers = [self.container("main", BOOK)]
        init: list[dict[str, Any]] = []
        claim = None
        claims: list[dict[str, Any]] = []
        if step.kind == "socket":
            containers = [self.container("main", SOCKET)]
        elif step.kind == "multi":
            containers = [self.container("main", BOOK), self.container("side")]
        elif step.kind == "init":
            init = [self.container("hold", BOOK, command="true")]
            containers = [self.container("main")]
        elif step.kind == "plain":
            containers = [self.container("main")]
        elif step.kind == "dra":
            level = "book" if sum(map(ord, step.name)) % 2 else "socket"
            claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": step.name, "namespace": POD_NS},
                     "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                         "deviceClassName": f"{level}.{DRIVER}", "allocationMode": "ExactCount", "count": 1}}]}}}
            main = self.container("main")
            main["resources"]["requests"]["cpu"] = "1"
            main["resources"]["claims"] = [{"name": "c"}]
            containers = [main]
            claims = [{"name": "c", "resourceClaimName": step.name}]
        spec: dict[str, Any] = {"containers": containers, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                                "nodeSelector": {"topology-e2e/worker": "true"}}
        if init:
            spec["initContainers"] = init
        if claims:
            spec["resourceClaims"] = claims
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": step.name, "namespace": POD_NS, "labels": {"soak": "1", "kind": step.kind}},
               "spec": spec}
        return pod, claim

    def create(self, step: PodStep) -> bool:
        from kubernetes.client.exceptions import ApiException

        pod, claim = self.manifest(step)
        try:
            if claim:
                self.custom.create_namespaced_custom_object("resource.k8s.io", "v1", POD_NS, "resourceclaims", claim)
            self.core.create_namespaced_pod(POD_NS, pod)
        except ApiException as exc:
            why = f"{step.name}: {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
            with self.lock:
                self.figures.refused.append(why)
            self.say(f"REFUSED at creation {why}")
            return False
        with self.lock:
            self.figures.created[step.kind] += 1
        return True

    def delete(self, name: str, claim: bool) -> None:
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, POD_NS)
        if claim:
            with contextlib.suppress(ApiException):
                self.custom.delete_namespaced_custom_object("resource.k8s.io", "v1", POD_NS, "resourceclaims", name)

    def wait_running(self, name: str, timeout: float) -> tuple[str, float | None, str]:
        """('Running', seconds from scheduled to Running seen, '') or the phase and why it is not running."""
        from kubernetes.client.exceptions import ApiException

        created = time.time()
        deadline = time.monotonic() + timeout
        why = ""
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                p = self.core.read_namespaced_pod(name, POD_NS)
            except ApiException as exc:
                return "gone", None, str(exc.status)
            if p.status.phase == "Running":
                scheduled = next((c.last_transition_time.timestamp() for c in p.status.conditions or []
                                  if c.type == "PodScheduled" and c.status == "True"), created)
                return "Running", time.time() - max(created, scheduled), ""
            if p.status.phase in ("Failed", "Succeeded"):
                return p.status.phase, None, f"{p.status.reason}: {p.status.message}"
            why = next((f"{c.reason}: {c.message}" for c in p.status.conditions or [] if c.status == "False"), "")
            time.sleep(0.25)
        return ("stopped" if self.stop.is_set() else "Pending"), None, why

    def run_pod(self, step: PodStep, measure: list[float] | None = None) -> None:
        try:
            if not self.create(step):
                return
            is_claim = step.kind == "dra"
            if step.kind == "mid-start":
                time.sleep(step.lifetime)
                self.delete(step.name, False)
                with self.lock:
                    self.figures.mid_start_deleted += 1
                return
            timeout = RUNNING_TIMEOUT if not (is_claim and self.config.mode != "dra") else 10.0
            phase, seconds, why = self.wait_running(step.name, timeout)
            if phase == "Running":
                with self.lock:
                    self.figures.ran[step.kind] += 1
                    if seconds is not None and step.kind != "plain":
                        (measure if measure is not None else self.figures.start_soak).append(seconds)
                self.stop.wait(step.lifetime)
            elif phase == "Pending":
                with self.lock:
                    self.figures.pending_timeouts[f"{step.kind}: {why[:120]}"] += 1
            elif phase == "Failed":
                self.say(f"pod {step.name} failed: {why}")
            self.delete(step.name, is_claim)
        finally:
            with self.lock:
                self.live.discard(step.name)

    # --- faults ------------------------------------------------------------------------------------------------
    def kill_agent(self) -> None:
        before = self.agent_restarts()
        cri = CriClient(CONTAINERD)
        try:
            for info in cri.list_containers({"io.kubernetes.pod.namespace": self.args.namespace}):
                if info.container_name == "agent":
                    pid = cri.container_status(info.id).pid
                    if pid:
                        os.kill(pid, signal.SIGKILL)
        finally:
            cri.close()
        self.wait_agent_ready(restarted_after=before)  # the kubelet restarts the container (with its back-off)

    def during_admission(self, step: FaultStep, then: list[str], wait: float) -> threading.Thread:
        pod = PodStep(0, "book", f"soak-{self.args.seed}-{step.kind}-{int(step.t)}", 8.0)
        thread = threading.Thread(target=self.run_pod, args=(pod,), daemon=True)
        with self.lock:
            self.live.add(pod.name)
        thread.start()
        time.sleep(wait)
        self.cluster(*then)
        return thread

    def inject(self, step: FaultStep) -> None:
        start = time.time()
        self.say(f"fault {step.label()}")
        with self.lock:  # known to the checker while it lasts, not only once it is over
            index = self.checker.fault_started(step.kind, start, step.cpu if step.kind == "cpu-offline" else None)
        try:
            if step.kind == "agent-kill":
                self.kill_agent()
            elif step.kind == "kubelet-kill":
                self.cluster("crash", "kubelet")
            elif step.kind == "containerd-kill":
                self.cluster("crash", "containerd")
            elif step.kind == "kubelet-restart-admission":
                self.during_admission(step, ["restart", "kubelet"], 0.3)
            elif step.kind == "containerd-restart-nri":
                self.during_admission(step, ["restart", "containerd"], 1.5)
            elif step.kind == "cpu-offline":
                self.set_cpu_online(step.cpu, False)
                self.config.online = frozenset(self.cpus) - {step.cpu}
                self.stop.wait(step.seconds)
                self.set_cpu_online(step.cpu, True)
                self.config.online = frozenset(self.cpus)
            elif step.kind == "helm-upgrade":
                self.helm_upgrade(annotation=True)
            elif step.kind == "mode-switch":
                self.config.mode = step.mode
                self.helm_upgrade()
            elif step.kind == "enforcement-switch":
                self.config.enforcement, self.config.shared_pool = step.enforcement, step.shared_pool
                self.helm_upgrade()
        except (subprocess.SubprocessError, RuntimeError, OSError, CriError) as exc:
            detail = getattr(exc, "stderr", "") or ""
            with self.lock:
                self.figures.fault_errors.append(f"{step.label()}: {exc} {detail[-300:]}")
            self.say(f"fault {step.label()} went wrong: {exc} {detail[-300:]}")
        end = time.time()
        with self.lock:
            self.checker.fault_ended(index, end)
            self.figures.faults[step.kind] += 1
            self.figures.fault_seconds.setdefault(step.kind, []).append(round(end - start, 1))
        self.say(f"fault {step.label()} over after {end - start:.1f} s")

    # --- loops -------------------------------------------------------------------------------------------------
    def check_loop(self) -> None:
        while not self.done.is_set():
            t = time.monotonic()
            snap = self.truth.read(self.config)
            with self.lock:
                found = self.checker.check(snap)
                self.figures.snapshots += 1
                self.figures.violations += found
                self.figures.failures += [f"{f.pod}: {f.reason}: {f.message}" for f in snap.failures]
                if snap.agent:
                    a = (snap.agent.pid, snap.agent.rss_kib, snap.agent.fds)
                    self.figures.agent_first = self.figures.agent_first or a
                    self.figures.agent_last = a
            for v in found:
                self.say(f"VIOLATION {v.line()}")
            for f in snap.failures:
                self.say(f"admission failure {f.pod}: {f.reason}: {f.message}")
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))

    def fault_loop(self, plan: Plan, t0: float) -> None:
        for step in plan.faults:
            if self.stop.wait(max(0.0, t0 + step.t - time.monotonic())):
                return
            self.inject(step)

    def churn(self, plan: Plan, t0: float) -> list[threading.Thread]:
        threads = []
        for step in plan.pods:
            if self.stop.wait(max(0.0, t0 + step.t - time.monotonic())):
                break
            with self.lock:
                if len(self.live) >= MAX_LIVE_PODS:
                    self.figures.skipped += 1
                    continue
                self.live.add(step.name)
            thread = threading.Thread(target=self.run_pod, args=(step,), daemon=True)
            thread.start()
            threads.append(thread)
        return threads

    def quiet_run(self, pods: int) -> None:
        for i in range(pods):
            step = PodStep(0, "book", f"soak-quiet-{i}", 0.0)
            self.live.add(step.name)
            self.run_pod(step, self.figures.start_quiet)
            self.wait_gone(step.name)

    def wait_gone(self, name: str, timeout: float = 60.0) -> None:
        poll_until(lambda: name not in {p.metadata.name for p in self.core.list_namespaced_pod(POD_NS).items}, timeout,
                   every=0.25)

    def clean_namespace(self, timeout: float = 120.0) -> None:
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(ApiException):
            self.core.delete_collection_namespaced_pod(POD_NS, grace_period_seconds=1)
        with contextlib.suppress(ApiException):
            self.custom.delete_collection_namespaced_custom_object("resource.k8s.io", "v1", POD_NS, "resourceclaims")
        poll_until(lambda: not self.core.list_namespaced_pod(POD_NS).items, timeout, every=1)

    def main(self) -> int:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        plan = make_plan(self.args.seed, self.args.seconds, cpus=len(self.cpus))
        print(f"soak: seed {self.args.seed} (SOAK_SEED={self.args.seed} replays this schedule), "
              f"{self.args.seconds:g} s: {len(plan.pods)} pods and {len(plan.faults)} faults planned", flush=True)
        for f in plan.faults:
            print(f"soak:   fault at {f.t:6.1f} s: {f.label()}", flush=True)
        with contextlib.suppress(ApiException):
            self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=POD_NS)))
        self.clean_namespace()
        self.say("base install: --levels book,socket, mode deviceplugin, cpusetEnforcement cri")
        self.helm_upgrade()
        self.say(f"quiet run: {self.args.quiet_pods} book pods one after the other")
        self.quiet_run(self.args.quiet_pods)
        checker = threading.Thread(target=self.check_loop, daemon=True)
        checker.start()
        t0 = time.monotonic()
        faults = threading.Thread(target=self.fault_loop, args=(plan, t0), daemon=True)
        faults.start()
        timer = threading.Timer(self.args.seconds, self.stop.set)
        timer.start()
        threads = self.churn(plan, t0)
        self.stop.wait()  # the checker keeps reading through the end, until done
        self.say("soak over: waiting for the pods' and faults' threads")
        faults.join(timeout=300)
        for thread in threads:
            thread.join(timeout=90)
        self.clean_namespace()
        self.config.online = frozenset(self.cpus)
        if (self.config.mode, self.config.enforcement, self.config.shared_pool) != ("deviceplugin", "cri", False):
            self.config.mode, self.config.enforcement, self.config.shared_pool = "deviceplugin", "cri", False
            self.say("back to the base install")
            with self.lock:  # a mode switch like the faults': judged after its recovery
                index = self.checker.fault_started("mode-switch", time.time())
            try:
                self.helm_upgrade()
            finally:
                with self.lock:
                    self.checker.fault_ended(index, time.time())
        grace = self.checker.allow.leak_grace + 5
        self.say(f"checking for leaks for {grace:g} s")
        time.sleep(grace)
        self.done.set()
        checker.join(timeout=30)
        self.truth.close()
        return self.report(plan)

    def report(self, plan: Plan) -> int:
        f = self.figures
        by_kind = Counter(v.kind for v in f.violations)
        ran = sum(f.ran.values())
        topology_ran = sum(n for k, n in f.ran.items() if k != "plain")
        lines = [
            f"soak: seed {plan.seed}, {plan.seconds:g} s, {f.snapshots} snapshots of the truth",
            f"pods: planned {len(plan.pods)}, created {sum(f.created.values())}, ran {ran} "
            f"({', '.join(f'{k} {n}' for k, n in sorted(f.ran.items()))}), deleted mid-start {f.mid_start_deleted}, "
            f"skipped (>= {MAX_LIVE_PODS} alive) {f.skipped}, refused at creation {len(f.refused)}",
            f"pending past their timeout: {sum(f.pending_timeouts.values())}"
            + "".join(f"\n  {n} x {why}" for why, n in f.pending_timeouts.most_common(6)),
            f"faults: {sum(f.faults.values())}: " + ", ".join(f"{k} {n} ({'/'.join(map(str, f.fault_seconds[k]))} s)"
                                                           for k, n in sorted(f.faults.items())),
            f"fault errors: {len(f.fault_errors)}" + "".join(f"\n  {e}" for e in f.fault_errors),
            f"violations: {sum(by_kind.values())}: " + ", ".join(f"{k} {by_kind.get(k, 0)}" for k in KINDS),
            f"admission failures: {len(f.failures)}" + "".join(f"\n  {x}" for x in f.failures[:10]),
            f"pod start (scheduled -> Running, topology pods) p99: soak {fmt(p99(f.start_soak))} "
            f"(n={len(f.start_soak)}), quiet {fmt(p99(f.start_quiet))} (n={len(f.start_quiet)})",
            f"agent (pid, RSS KiB, fds): start {f.agent_first}, end {f.agent_last}",
            f"truth read errors (a component down): {self.truth.errors.counts or 0}",
        ]
        for v in f.violations:
            lines.append(f"  {v.line()}")
        print("\n".join(lines), flush=True)
        report = {"seed": plan.seed, "seconds": plan.seconds, "violations": [asdict(v) for v in f.violations],
                  "ran": dict(f.ran), "created": dict(f.created), "faults": dict(f.faults),
                  "failures": f.failures, "refused": f.refused, "start_soak_p99": p99(f.start_soak),
                  "start_quiet_p99": p99(f.start_quiet), "agent_first": f.agent_first, "agent_last": f.agent_last}
        if self.args.report:
            Path(self.args.report).write_text(json.dumps(report, indent=1))
        ok = not f.violations and not f.refused and topology_ran > 0
        if topology_ran == 0:
            print("soak: FAILED: no topology pod ran (were they admitted?)", flush=True)
        print(f"soak: {'passed' if ok else 'FAILED'}", flush=True)
        return 0 if ok else 1


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS") or 1800))
    parser.add_argument("--seed", default=os.environ.get("SOAK_SEED") or "")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    parser.add_argument("--namespace", default="topology-system")
    parser.add_argument("--release", default="topology-agent")
    parser.add_argument("--helm", default=os.environ.get("HELM") or "helm")
    parser.add_argument("--snapshots", default=os.environ.get("TOPOLOGY_E2E_SNAPSHOTS", ".cluster/snapshots"))
    parser.add_argument("--workload-image", default="localhost/topology-e2e-busybox:latest")
    parser.add_argument("--quiet-pods", type=int, default=8)
    parser.add_argument("--report", help="write the figures as JSON here")
    parser.add_argument("--plan-only", action="store_true", help="print the seed's schedule and exit (no cluster)")
    args = parser.parse_args(argv)
    try:
        args.seed = int(args.seed) if str(args.seed).strip() else int.from_bytes(os.urandom(2), "big")
    except ValueError:
        print(f"soak: SOAK_SEED must be an integer, not {args.seed!r}", file=sys.stderr)
        return 2
    if args.seconds <= 0:
        print(f"soak: SOAK_SECONDS must be positive, not {args.seconds:g}", file=sys.stderr)
        return 2
    if args.plan_only:
        plan = make_plan(args.seed, args.seconds)
        items: list[PodStep | FaultStep] = [*plan.pods, *plan.faults]
        for item in sorted(items, key=lambda x: x.t):
            what = item.label() if isinstance(item, FaultStep) else f"pod {item.name} for {item.lifetime:g} s"
            print(f"{item.t:7.1f} s  {what}")
        return 0
    if not args.kubeconfig or not Path(args.kubeconfig).is_file():
        print(f"soak: no kubeconfig at {args.kubeconfig!r} (run it through make soak)", file=sys.stderr)
        return 2
    return Soak(args).main()


if __name__ == "__main__":
    sys.exit(main())
