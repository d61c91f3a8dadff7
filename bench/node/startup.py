"""Start-up with production defaults: from spawning ``topology-agent serve`` to kubelet counting its Register.

The agent runs as the chart runs it (``bench/lib/production.py``: the image-like install started through its
``topology-agent`` script, node labels over TLS in a private mount namespace, metrics on, kubelet's files,
JSON logs at info, default intervals) on the ``z16-400`` host-root tree (400 CPUs), each start against a
fresh kubelet emulator in this process (a node's first start: no saved state).

Interleaved, repeated (the order rotates), three spawns are timed:

* **agent**: spawn -> the emulator counts the Register call (and, in the text, -> the first
  ListAndWatch snapshot: kubelet's "ready");
* **pod set-up**: the same ``unshare -m`` and wrapper script (two tmpfs mounts, the secrets copied) running
  ``true``: what a pod's runtime has done before the agent's own start, so the row's value is the agent's
  median net of it (the gross median is in the text);
* **floor** (reference): the same interpreter spawned to ``import grpc`` and the generated DevicePlugin
  stubs, then exit.

Target: spawn -> registered <= 0.4 s (median, net of the pod set-up).

    .venv/bin/python bench/node/startup.py [--quick]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.topology.embedded import load_embedded
from bench.lib.common import INFO, BenchError, Row, at_most, bench_main, fmt_time, median, run_timed
from bench.lib.production import Production
from topology_devkit.kubelet_emulator import KubeletEmulator
from topology_devkit.sysfs_writer import write_sysfs_tree

BENCH = "startup"
SHAPE = "z16-400"
RESOURCE = "topology/book"
TARGET_S = 0.4
FLOOR_CODE = "import grpc; from agent._proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc"


def start_once(prod: Production, tree: Path, tmp: Path, n: int) -> tuple[float, float]:
    """(spawn -> registered, spawn -> first snapshot) of one agent against a fresh emulator."""
    with KubeletEmulator(tmp / f"k{n}") as kubelet:
        seen: list[float] = []

        def registered() -> bool:
            if kubelet.registrations(RESOURCE) > 0:
                seen.append(time.perf_counter())
                return True
            return False

        agent = prod.agent(kubelet, tree)
        try:
            try:
                kubelet.wait_for(registered, 30.0)
                kubelet.wait_registered(RESOURCE, 30.0)
            except TimeoutError:
                raise BenchError(f"the agent never registered {RESOURCE} (log: {agent.log_path})") from None
            ready = time.perf_counter()
        finally:
            agent.stop()
        return seen[0] - agent.started_at, ready - agent.started_at


def run(quick: bool) -> list[Row]:
    runs = 3 if quick else 12
    tmp = Path(tempfile.mkdtemp(prefix="bst-", dir="/tmp"))  # short: Unix socket paths < 108 bytes
    try:
        tree = tmp / "root"
        write_sysfs_tree(load_embedded(SHAPE), tree)
        with Production(tmp) as prod:
            env = prod.env()
            floor_cmd = [str(prod.install.python), "-c", FLOOR_CODE]
            times: dict[str, list[float]] = {"agent": [], "ready": [], "wrapper": [], "floor": []}
            start_once(prod, tree, tmp, 0)  # warm the page cache: the image's files, the tree
            for i in range(runs):
                steps = ["agent", "wrapper", "floor"]
                steps = steps[i % 3:] + steps[:i % 3]
                for step in steps:
                    if step == "agent":
                        registered, ready = start_once(prod, tree, tmp, i + 1)
                        times["agent"].append(registered)
                        times["ready"].append(ready)
                    elif step == "wrapper":
                        times["wrapper"].append(run_timed(prod.wrapper_only(), env=env, cwd=tmp))
                    else:
                        times["floor"].append(run_timed(floor_cmd, env=env, cwd=tmp))
            note = f"{prod.labels_note}; {prod.install.how}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gross, wrapper, floor = median(times["agent"]), median(times["wrapper"]), median(times["floor"])
    net = gross - wrapper
    return [
        Row(BENCH, "spawn -> registered, production defaults, 400 CPUs",
            f"{fmt_time(net)} net of the pod set-up ({fmt_time(gross)} gross, min {fmt_time(min(times['agent']))}, "
            f"max {fmt_time(max(times['agent']))}; -> first snapshot {fmt_time(median(times['ready']))}; "
            f"{runs} starts)", net, f"<= {fmt_time(TARGET_S)}", at_most(net, TARGET_S), note, raw=times),
        Row(BENCH, "reference: floor (spawn, import grpc + stubs, exit)",
            f"{fmt_time(floor)} median; agent net - floor {fmt_time(net - floor)}; pod set-up {fmt_time(wrapper)}",
            floor, "", INFO),
    ]


def main(argv: list[str] | None = None) -> int:
    return bench_main(BENCH, run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
