"""Discovery benchmark: the agent's sysfs reader versus ``lscpu -J`` on the same synthetic tree.

Writes the ``z16-400`` shape (400 CPUs, SMT-2, 4 drawers x 4 books x 2 sockets) as a host-root
tree in a temporary directory, then, after a warm-up, times in the same run and interleaved:

* ``agent``: ``read_sysfs(tree)`` in-process (what a periodic rescan costs the agent);
* ``lscpu``: ``lscpu -J --sysroot TREE -e=CPU,CORE,SOCKET,BOOK,DRAWER,NODE,POLARIZATION,ADDRESS,
  CONFIGURED,ONLINE`` as a subprocess (what shelling out to lscpu, as vLLM does, costs).

It prints medians (and p90) in ms, the ratio agent/lscpu (target <= 1.0) and whether the
agent's median is under 50 ms. It reports and never asserts: the exit status is 0 unless
the benchmark cannot run at all in a way that is a bug (it still exits 0 when lscpu or the
reader is missing, saying so).

    .venv/bin/python bench/bench_discovery.py [--reps 30] [--warmup 3] [--shape z16-400]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topology_devkit.synthetic import SHAPES, build_topology
from topology_devkit.sysfs_writer import kernel_view, write_sysfs_tree

LSCPU_COLUMNS = "CPU,CORE,SOCKET,BOOK,DRAWER,NODE,POLARIZATION,ADDRESS,CONFIGURED,ONLINE"
TARGET_MS = 50.0


def _ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000.0


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30, help="timed repetitions of each (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs of each first (default 3)")
    parser.add_argument("--shape", default="z16-400", choices=sorted(SHAPES))
    parser.add_argument("--kernel", default="modern", choices=("modern", "pre-5.7"))
    args = parser.parse_args(argv)

    try:
        from agent.topology.sysfs import read_sysfs
    except ImportError as exc:
        print(f"agent.topology.sysfs is not importable yet ({exc}); nothing to benchmark.")
        return 0

    lscpu = shutil.which("lscpu")
    shape = SHAPES[args.shape]
    model = build_topology(shape)
    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp:
        tree = Path(tmp) / "root"
        write_sysfs_tree(model, tree, kernel=args.kernel)
        lscpu_cmd = [lscpu or "lscpu", "-J", "--sysroot", str(tree), f"-e={LSCPU_COLUMNS}"]

        def run_agent() -> object:
            return read_sysfs(tree)

        def run_lscpu() -> object:
            return subprocess.run(lscpu_cmd, capture_output=True, check=False, timeout=60)

        discovered = run_agent()
        correct = discovered == kernel_view(model, args.kernel)
        lscpu_note = ""
        if lscpu is not None:
            probe = subprocess.run(lscpu_cmd, capture_output=True, text=True, check=False, timeout=60)
            if probe.returncode != 0:
                lscpu_note = f"lscpu failed (exit {probe.returncode}): {probe.stderr.strip()[:200]}"
                lscpu = None

        for _ in range(args.warmup):
            run_agent()
            if lscpu is not None:
                run_lscpu()
        agent_ms: list[float] = []
        lscpu_ms: list[float] = []
        for _ in range(args.reps):
            agent_ms.append(_ms(run_agent))
            if lscpu is not None:
                lscpu_ms.append(_ms(run_lscpu))

    cpus = len(model.cpus)
    print(f"Discovery benchmark: shape {shape.name} ({cpus} CPUs, SMT-{shape.smt}, "
          f"{len({c.book_key for c in model.cpus})} books, {len({c.socket_key for c in model.cpus})} sockets), "
          f"kernel={args.kernel}, {args.reps} interleaved repetitions after {args.warmup} warm-up runs")
    print(f"  read_sysfs result matches the model: {'yes' if correct else 'NO'}")
    agent_median = statistics.median(agent_ms)
    print(f"  agent read_sysfs (in-process): median {agent_median:7.2f} ms   p90 {_p90(agent_ms):7.2f} ms   "
          f"min {min(agent_ms):7.2f} ms")
    if lscpu_ms:
        lscpu_median = statistics.median(lscpu_ms)
        print(f"  lscpu -J --sysroot (subprocess): median {lscpu_median:7.2f} ms   p90 {_p90(lscpu_ms):7.2f} ms   "
              f"min {min(lscpu_ms):7.2f} ms")
        ratio = agent_median / lscpu_median
        print(f"  ratio agent/lscpu: {ratio:.2f} (target <= 1.0: {'met' if ratio <= 1.0 else 'NOT met'})")
    else:
        print(f"  lscpu: not measured ({lscpu_note or 'lscpu not found on PATH'})")
    print(f"  agent median under {TARGET_MS:.0f} ms: {'yes' if agent_median < TARGET_MS else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
