"""Discovery as a process: ``topology-agent discover --format json`` on a host-root tree, wall time.

The generated ``z17-382`` (``bench/lib/shapes.py``: 382 CPUs, 4 drawers of 4 books, sockets of 4 or 7 cores, SMT-2)
and the bundled ``z16-400`` (400 CPUs, 16 books) are written as host-root trees, and these processes read them,
interleaved (the order rotates and reverses: A B C C B A ...) and repeated:

* ``agent``: ``topology-agent discover --format json --host-root TREE --proc-root TREE/proc`` run as the image
  runs it (``bench/lib/production.py``: the image-like venv, a plain non-editable install, bytecode compiled, the
  ``topology-agent`` script);
* ``python -c pass`` of the same venv: the interpreter's start alone (reference);
* ``lscpu -J --sysroot TREE -e=CPU,CORE,SOCKET,BOOK,DRAWER,NODE,POLARIZATION,ADDRESS,CONFIGURED,ONLINE``
  (reference: per-CPU topology in JSON from the same files).

Target: on ``z17-382`` the agent's median wall time <= 150 ms (what someone running ``discover`` by hand waits;
the text gives p90 and the slowest). ``z16-400`` and the references are information, with ``read_sysfs``
in this process. 30 repetitions after 3 warm-ups (``--quick``: 8 after 1). The agent's JSON must list only the
tree's usable CPUs, and some, and lscpu every CPU, else the bench is broken.

    .venv/bin/python bench/node/discovery.py [--quick]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.topology.sysfs import read_sysfs
from bench.lib.common import INFO, BenchError, Row, at_most, bench_main, fmt_time, median, percentile
from bench.lib.production import ImageInstall, image_install
from bench.lib.shapes import Z17_382
from topology_devkit.synthetic import SHAPES, LparShape, build_topology
from topology_devkit.sysfs_writer import kernel_view, write_sysfs_tree

BENCH = "discovery"
TARGET_SHAPE = Z17_382.name
LSCPU_COLUMNS = "CPU,CORE,SOCKET,BOOK,DRAWER,NODE,POLARIZATION,ADDRESS,CONFIGURED,ONLINE"
TARGET_S = 0.150


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, bytes]:
    started = time.perf_counter()
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, env=env, cwd=cwd, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchError(f"{command[0]} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return took, done.stdout


def measure_shape(shape: LparShape, install: ImageInstall, lscpu: str | None, reps: int, warmup: int,
                  tmp: Path) -> tuple[dict[str, list[float]], list[float], str]:
    """Times per side (agent, floor and lscpu when it works here), read_sysfs in this process, and why lscpu is
    not among them (empty when it is)."""
    model = build_topology(shape)
    tree = tmp / shape.name
    write_sysfs_tree(model, tree)
    env = install.run_env()
    agent_cmd = [str(install.script), "discover", "--format", "json", "--host-root", str(tree),
                 "--proc-root", str(tree / "proc")]
    _, out = timed(agent_cmd, env, tmp)
    listed = {c for g in json.loads(out).get("groups", []) for c in g.get("cpus", [])}
    usable = {c.cpu for c in model.cpus if c.online and c.configured}
    if not listed or not listed <= usable:
        raise BenchError(f"{shape.name}: discover listed CPUs {sorted(listed)[:8]}..., not the tree's")
    sides: list[tuple[str, list[str]]] = [("agent", agent_cmd), ("floor", [str(install.python), "-c", "pass"])]
    no_lscpu = "lscpu is not on PATH"
    if lscpu is not None:
        lscpu_cmd = [lscpu, "-J", "--sysroot", str(tree), f"-e={LSCPU_COLUMNS}"]
        probe = subprocess.run(lscpu_cmd, capture_output=True, check=False)
        no_lscpu = f"lscpu failed: {probe.stderr.decode().strip()[:200]}" if probe.returncode else ""
        if not no_lscpu:  # not json.loads: lscpu writes an offline CPU's unknown core as a bare -
            if probe.stdout.count(b'"cpu": ') != len(model.cpus):
                raise BenchError(f"{shape.name}: lscpu did not list every CPU of the tree")
            sides.append(("lscpu", lscpu_cmd))
    times: dict[str, list[float]] = {name: [] for name, _ in sides}
    for i in range(warmup + reps):
        order = sides[i % len(sides):] + sides[:i % len(sides)]  # rotate: no side always first
        if (i // len(sides)) % 2:
            order.reverse()
        for name, command in order:
            took, _ = timed(command, env, tmp)
            if i >= warmup:
                times[name].append(took)
    reader: list[float] = []
    want = kernel_view(model)
    for i in range(max(3, reps // 4)):
        started = time.perf_counter()
        got = read_sysfs(tree, tree / "proc", details=False)
        reader.append(time.perf_counter() - started)
        if i == 0 and [c.cpu for c in got.cpus] != [c.cpu for c in want.cpus]:
            raise BenchError(f"{shape.name}: read_sysfs does not see the tree's CPUs")
    shutil.rmtree(tree, ignore_errors=True)
    return times, reader, no_lscpu


def run(quick: bool) -> list[Row]:
    reps, warmup = (8, 1) if quick else (30, 3)
    install = image_install()
    lscpu = shutil.which("lscpu")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp_name:
        for shape in (Z17_382, SHAPES["z16-400"]):
            times, reader, no_lscpu = measure_shape(shape, install, lscpu, reps, warmup, Path(tmp_name))
            agent, floor = times["agent"], times["floor"]
            wall = median(agent)
            references = f"python -c pass {fmt_time(median(floor))}, " + (
                no_lscpu or f"lscpu {fmt_time(median(times['lscpu']))}")
            target = shape.name == TARGET_SHAPE
            rows.append(Row(BENCH, f"discover --format json, {shape.name} ({shape.cpu_count} CPUs), process wall",
                            f"median {fmt_time(wall)} (p90 {fmt_time(percentile(agent, 90))}, slowest "
                            f"{fmt_time(max(agent))}; {len(agent)} runs; {references}; read_sysfs in-process "
                            f"{fmt_time(median(reader))})", wall,
                            f"median <= {fmt_time(TARGET_S)}" if target else "",
                            at_most(wall, TARGET_S) if target else INFO, install.how if target else "",
                            raw={"shape": shape.name, **{f"{k}_s": v for k, v in times.items()},
                                 "read_sysfs_s": reader}))
    return rows


def main(argv: list[str] | None = None) -> int:
    return bench_main(BENCH, run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
