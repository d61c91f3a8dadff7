"""Container created -> first instruction with the agent's NRI plugin pinning it, against the same container created
by the same real containerd 2.4.2 (the real-cluster lane's build) with no plugin connected. The agent runs in
``--cpuset-enforcement nri`` mode beside a kubelet emulator; a topology container (its Allocate annotations
set) is created with ``sh -c 'grep Cpus_allowed_list /proc/self/status; ...'`` and timed from RunPodSandbox
until its first line is in its log, alternating (A B B A) with the agent stopped. Target: median ratio
<= 1.1x. The pin latency is 0 by construction: each NRI sample checks that the first line is the book's CPU.

Skipped, with the reason, without the lane's build (make cluster-build), root or containerd's harness.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import shutil
import tempfile

from bench.lib.common import INFO, BenchError, Row, at_most, bench_main, median, skipped, spread
from topology_devkit.agent_process import AgentProcess
from topology_devkit.testing.wait import wait_until

NAME = "nri_enforcement"
BOOK = "topology/book"
FIRST_LINE = ("sh", "-c", "grep Cpus_allowed_list /proc/self/status; exec sleep 3600")


def _registered(agent: AgentProcess) -> bool:
    return "registered with" in agent.get("/readyz")[1]


def run(quick: bool) -> list[Row]:
    import subprocess

    from agent.topology import snapshot_format as snapshot
    from agent.topology.cpulist import parse_cpulist
    from agent.topology.model import Cpu, Machine, Topology
    from topology_devkit.containerd import Containerd, ContainerdUnavailable, PodContainer
    from topology_devkit.kubelet_emulator import Container, KubeletEmulator

    root_dir = Path(__file__).resolve().parents[2]
    folder = Path(subprocess.run([str(root_dir / "devkit/cluster/build.sh"), "--print"], capture_output=True,
                                 text=True, check=False).stdout.strip() or "/nonexistent")
    if not (folder / "build-info.json").is_file():
        return [skipped(NAME, "NRI create -> first instruction", "<= 1.1x", "no containerd 2.4.2: make cluster-build")]
    try:
        ctd = Containerd("bench-nri", bin_dir=folder).__enter__()
    except ContainerdUnavailable as exc:
        return [skipped(NAME, "NRI create -> first instruction", "<= 1.1x", exc.reason)]
    rounds = 4 if quick else 12
    root: Path | None = None
    try:
        cpus = parse_cpulist(ctd.default_cpus())
        if len(cpus) < 2:
            return [skipped(NAME, "NRI create -> first instruction", "<= 1.1x", "needs 2 CPUs")]
        root = Path(tempfile.mkdtemp(prefix="bnr-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
        machine = Machine(arch="s390x", machine_type="3931", environment="lpar", topology_facility=True,
                          dispatching="horizontal", smt_threads=1)
        topology = Topology(machine=machine, cpus=tuple(
            Cpu(cpu=n, core=i, socket=i, book=i, drawer=0, siblings=(n,), polarization="horizontal")
            for i, n in enumerate(cpus[:2])))
        tree = root / "two-books.json"
        tree.write_text(snapshot.dumps(topology))

        def first_line(pod: PodContainer, timeout: float = 20.0) -> tuple[float, str]:
            log = ctd.workdir / "logs" / pod.pod_uid / pod.container_name / f"{pod.attempt}.log"

            def printed() -> tuple[float, str] | None:
                try:
                    lines = log.read_text().splitlines()
                except OSError:
                    return None
                return (time.perf_counter(), lines[0].split(" ", 3)[3].split(":", 1)[1].strip()) if lines else None

            return wait_until(f"the first line in {log}", printed, timeout, every=0.002, error=BenchError)

        with KubeletEmulator(root) as k:
            on: list[float] = []
            off: list[float] = []
            annotations: dict[str, str] = {}
            n = 0
            for i in range(rounds):
                for with_agent in ((True, False) if i % 2 == 0 else (False, True)):
                    n += 1
                    if not with_agent:  # the same container, no plugin connected (its annotations change nothing)
                        started = time.perf_counter()
                        pod = ctd.run_pod(f"p{n}", container="c", annotations=annotations, command=FIRST_LINE)
                        at, _ = first_line(pod)
                        off.append(at - started)
                        ctd.remove_pod(pod)
                        continue
                    agent = AgentProcess(k, root, "--cpuset-enforcement", "nri", "--nri-socket", str(ctd.nri_socket),
                                         "--levels", "book", "--cpu-manager-state", str(root / "no-cpu-manager-state"),
                                         topology=str(tree))
                    try:
                        k.wait_registered(BOOK, timeout=30)
                        wait_until("the NRI plugin registered", functools.partial(_registered, agent), 20)
                        admitted = k.admit_pod("default", f"p{n}", [Container("c", {BOOK: 1})])
                        env = k.start_container("default", f"p{n}", "c")
                        annotations = admitted.annotations("c")
                        started = time.perf_counter()
                        pod = ctd.run_pod(f"p{n}", container="c", annotations=annotations, command=FIRST_LINE)
                        at, line = first_line(pod)
                        if line != env["TOPOLOGY_CPUS"]:
                            raise BenchError(f"with NRI the first line was {line}, not the book {env['TOPOLOGY_CPUS']}")
                        on.append(at - started)
                        ctd.remove_pod(pod)
                        k.delete_pod("default", f"p{n}")
                    finally:
                        agent.stop()
    finally:
        ctd.close()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    ratio = median(on) / median(off)
    pairs = [a / b for a, b in zip(on, off, strict=True)]
    return [
        Row(NAME, "container created -> first instruction: NRI pinning / no plugin",
            f"{ratio:.2f}x (NRI {median(on) * 1000:.0f} ms, none {median(off) * 1000:.0f} ms, medians of {rounds}; "
            f"pairs {spread(pairs)})", ratio, "median ratio <= 1.1", at_most(ratio, 1.1),
            raw={"nri": on, "none": off}),
        Row(NAME, "pin latency with NRI", "0: every first line was the book's CPU", 0.0, "", INFO),
    ]


if __name__ == "__main__":
    sys.exit(bench_main(NAME, run, __doc__))
