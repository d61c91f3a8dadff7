"""CPU-set enforcement (``serve --cpuset-enforcement cri``) against a real containerd: how soon a
topology container is pinned after it is created, and what enforcement costs an idle node.

Setup: the devkit's private containerd (runc), the kubelet emulator, and the agent as a process with the
devkit's test defaults (``AgentProcess``: rescans off, a snapshot as its topology) and the enforcement's
default intervals (``--cpuset-interval 2``, ``--pod-resources-interval 2``) on a node of this machine's
CPUs as one book of two one-core sockets.

* (a) **created -> pinned, new pods**: a pod asks for a socket (Allocate), its container is created
  with the Allocate annotations as kubelet does, and the time from the container's CRI ``created_at``
  to its process's ``Cpus_allowed_list`` becoming the socket's CPU is measured (polled every 5 ms).
  Target: p95 <= 1 s.
* (b) **created -> pinned, restarted containers**: the same for a container kubelet recreates (a new
  id, no Allocate): bounded by ``--cpuset-interval`` (reported, no target).
* (c) **idle cost**: two agents side by side over the same window, one enforcing (with the shared
  pool, six idle containers in the runtime) and one not; the difference of their CPU time as a share
  of one core. Target: <= +0.05 %. No device is held, so the enforcing agent looks at the runtime every
  30 s (it looks every ``--cpuset-interval`` while a device is held).

    .venv/bin/python bench/runtime/cri_enforcement.py [--pods 20] [--seconds 60] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.topology import snapshot_format as snapshot
from agent.topology.cpulist import parse_cpulist
from agent.topology.model import Cpu, Machine, Topology
from bench.lib.common import INFO, Row, at_most, bench_main, median, percentile, skipped
from topology_devkit.agent_process import AgentProcess
from topology_devkit.containerd import Containerd, ContainerdUnavailable, status_cpus_allowed
from topology_devkit.kubelet_emulator import Container, KubeletEmulator
from topology_devkit.testing.wait import wait_until

BENCH = "cri_enforcement"
SOCKET = "topology/socket"
TARGET_P95 = 1.0
TARGET_IDLE = 0.0005  # of one core
FAST_WINDOW = 15.0  # seconds of fast looks at the runtime after devices change hands (CpusetEnforcement)


def two_sockets(cpus: list[int], directory: Path) -> Path:
    machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                      dispatching="horizontal", smt_threads=1)
    topology = Topology(machine=machine, cpus=tuple(
        Cpu(cpu=n, core=i, socket=i, book=0, drawer=0, siblings=(n,), polarization="horizontal")
        for i, n in enumerate(cpus[:2])))
    path = directory / "two-sockets.json"
    path.write_text(snapshot.dumps(topology))
    return path


def pinned_after(ctd: Containerd, container_id: str, expected: str, created_ns: int, timeout: float = 30.0) -> float:
    pid = ctd.container_pid(container_id)
    wait_until(f"container {container_id[:12]} pinned to {expected}", lambda: status_cpus_allowed(pid) == expected,
               timeout, every=0.005)
    return time.time() - created_ns / 1e9


def created_at(ctd: Containerd, container_id: str) -> int:
    from agent._proto.runtime.v1 import api_pb2 as cri

    answer = ctd.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=container_id), timeout=5)
    return int(answer.status.created_at)


def latencies(ctd: Containerd, root: Path, topology: Path, pods: int) -> tuple[list[float], list[float]]:
    new: list[float] = []
    restarted: list[float] = []
    with KubeletEmulator(root / "k1") as k:
        agent = AgentProcess(k, root, "--cpuset-enforcement", "cri", "--cri-socket", str(ctd.socket),
                             "--cpu-manager-state", str(root / "none"), topology=str(topology))
        try:
            k.wait_registered(SOCKET, timeout=30)
            for i in range(pods):  # (a): each right after its Allocate
                name = f"p{i}"
                pod = k.admit_pod("default", name, [Container("c", {SOCKET: 1})])
                cpus = k.start_container("default", name, "c")["TOPOLOGY_CPUS"]
                ctd_pod = ctd.run_pod(name, container="c", annotations=pod.annotations("c"))
                new.append(pinned_after(ctd, ctd_pod.container_id, cpus, created_at(ctd, ctd_pod.container_id)))
                ctd.remove_pod(ctd_pod)
                k.delete_pod("default", name)
            # (b): kubelet recreates a container long after the last Allocate (no fast looks any more)
            pod = k.admit_pod("default", "kept", [Container("c", {SOCKET: 1})])
            cpus = k.start_container("default", "kept", "c")["TOPOLOGY_CPUS"]
            current = ctd.run_pod("kept", container="c", annotations=pod.annotations("c"))
            pinned_after(ctd, current.container_id, cpus, created_at(ctd, current.container_id))
            time.sleep(FAST_WINDOW + 1)  # outlive the fast window the Allocate opened (a wait by design)
            for _ in range(max(3, pods // 2)):
                current = ctd.restart_container(current, remove_old=True)
                restarted.append(pinned_after(ctd, current.container_id, cpus,
                                              created_at(ctd, current.container_id)))
            ctd.remove_pod(current)
        finally:
            agent.stop()
    return new, restarted


def idle_cost(ctd: Containerd, root: Path, topology: Path, seconds: float) -> tuple[float, float]:
    idle = [ctd.run_pod(f"idle{i}", container="c") for i in range(6)]
    try:
        with KubeletEmulator(root / "k2") as k_on, KubeletEmulator(root / "k3") as k_off:
            on = AgentProcess(k_on, root, "--cpuset-enforcement", "cri", "--shared-pool", "--cri-socket",
                              str(ctd.socket), "--cpu-manager-state", str(root / "none"), topology=str(topology))
            off = AgentProcess(k_off, root, "--cpu-manager-state", str(root / "none"), topology=str(topology))
            try:
                k_on.wait_registered(SOCKET, timeout=30)
                k_off.wait_registered(SOCKET, timeout=30)
                wait_until("settled", lambda: on.metric("topology_agent_cpuset_enforcement_steps_total") >= 1, 30)
                time.sleep(3.0)  # the start-up tail is not idle time
                a0, b0, t0 = on.cpu_seconds(), off.cpu_seconds(), time.monotonic()
                time.sleep(seconds)  # the measurement window itself
                a1, b1, t1 = on.cpu_seconds(), off.cpu_seconds(), time.monotonic()
            finally:
                on.stop()
                off.stop()
        window = t1 - t0
        return (a1 - a0) / window, (b1 - b0) / window
    finally:
        for pod in idle:
            ctd.remove_pod(pod)


def run(quick: bool, pods: int = 20, seconds: float = 60.0) -> list[Row]:
    if quick:
        pods, seconds = 5, 10.0
    targets = (f"p95 <= {TARGET_P95 * 1000:.0f} ms", "<= --cpuset-interval (2 s)", f"<= +{TARGET_IDLE * 100:.2f} %")
    names = ("new pod: created -> pinned", "restarted container: created -> pinned", "idle cost of enforcement")
    try:
        ctd = Containerd("bench-pin").__enter__()
    except ContainerdUnavailable as exc:
        return [skipped(BENCH, n, t, f"a real containerd cannot run here: {exc.reason}")
                for n, t in zip(names, targets, strict=True)]
    try:
        root = ctd.workdir / "bench"
        root.mkdir(exist_ok=True)
        cpus = parse_cpulist(ctd.default_cpus())
        if len(cpus) < 2:
            return [skipped(BENCH, n, t, f"needs 2 CPUs for containers, this machine gives them {cpus}")
                    for n, t in zip(names, targets, strict=True)]
        topology = two_sockets(cpus, root)
        new, restarted = latencies(ctd, root, topology, pods)
        on, off = idle_cost(ctd, root, topology, seconds)
    finally:
        ctd.close()
    p95 = percentile(new, 95)
    resolution = 2 * 0.01 / seconds  # one 10 ms tick on each agent's reading
    return [
        Row(BENCH, names[0], f"p50 {median(new) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms ({len(new)} pods)",
            p95, targets[0], at_most(p95, TARGET_P95), raw={"new_ms": [round(x * 1000, 1) for x in new]}),
        Row(BENCH, names[1], f"p50 {median(restarted) * 1000:.0f} ms, "
            f"p95 {percentile(restarted, 95) * 1000:.0f} ms ({len(restarted)} restarts)",
            percentile(restarted, 95), targets[1], INFO,
            raw={"restarted_ms": [round(x * 1000, 1) for x in restarted]}),
        Row(BENCH, names[2], f"{(on - off) * 100:+.3f} % of a core ({on * 100:.3f} enforcing vs {off * 100:.3f} not, "
            f"{seconds:.0f} s side by side)", on - off, targets[2],
            at_most(on - off, TARGET_IDLE) if resolution <= TARGET_IDLE else INFO,
            "" if resolution <= TARGET_IDLE else f"a {seconds:.0f} s window resolves only {100 * resolution:.2f} % "
            "(10 ms CPU ticks): no verdict"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    args, rest = parser.parse_known_args(argv)
    return bench_main(BENCH, lambda quick: run(quick, args.pods, args.seconds), __doc__, rest)


if __name__ == "__main__":
    raise SystemExit(main())
