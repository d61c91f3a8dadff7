"""Discovery as a process: ``topology-agent discover --format json`` against ``lscpu -J`` on the same tree.

For every bundled shape (``topology_devkit.synthetic.SHAPES``: ``z16-400`` first, with 400 CPUs, SMT-2,
4 drawers x 4 books x 2 sockets, then the small ones) and the generated ``z17-382`` (``bench/shapes.py``:
382 CPUs, 4 drawers of 4 books, sockets of 4 or 7 cores, SMT-2), writes the shape as a host-root tree
and times, interleaved (the order rotates and reverses: A B C C B A ...) and repeated, processes that read it:

* ``agent``: ``topology-agent discover --format json --host-root TREE --proc-root TREE/proc`` run as the
  image runs it (``bench/production.py``: the image-like venv, a plain non-editable install, bytecode
  compiled, the ``topology-agent`` script; the dev venv's editable finder is not involved);
* ``lscpu``: ``lscpu -J --sysroot TREE -e=CPU,CORE,SOCKET,BOOK,DRAWER,NODE,POLARIZATION,ADDRESS,CONFIGURED,
  ONLINE`` (per-CPU topology in JSON; the summary form ``lscpu -J`` reads the same ~5,800 files in the same
  time on z16-400);
* ``python -c pass`` of the same venv: the interpreter's start alone (shown in each row as a multiple of
  lscpu: on the small shapes it alone is 1.5-4 x lscpu, and the row's note says what 2 x lscpu leaves for
  discover's own work).

Target per shape: median agent / median lscpu <= 2.0; each pair's ratio (min/median/max) is the noise.
40 repetitions on z16-400 after 3 warm-ups, 20 on the others after 2 (``--quick``: 10 and 6). For
reference (info): the interpreter and the reader alone in this process (``read_sysfs``, what a full
rescan reads). The agent's JSON must list only the tree's usable CPUs (and some, where the shape has the
topology facility) and lscpu every CPU, else the bench is broken.

    .venv/bin/python bench/bench_discovery.py [--quick]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.topology.sysfs import read_sysfs
from bench.common import INFO, BenchError, Row, at_most, bench_main, fmt_time, median, skipped, spread
from bench.production import ImageInstall, image_install
from bench.shapes import Z17_382
from topology_devkit.synthetic import SHAPES, LparShape, build_topology
from topology_devkit.sysfs_writer import kernel_view, write_sysfs_tree

BENCH = "discovery"
SHAPE = "z16-400"
LSCPU_COLUMNS = "CPU,CORE,SOCKET,BOOK,DRAWER,NODE,POLARIZATION,ADDRESS,CONFIGURED,ONLINE"
TARGET_RATIO = 2.0


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, bytes]:
    started = time.perf_counter()
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, env=env, cwd=cwd, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchError(f"{command[0]} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return took, done.stdout


def shapes() -> list[LparShape]:
    """z16-400 first (the row the README has quoted since the start), then every other bundled shape,
    then the generated 382-CPU z17-like tree."""
    return [SHAPES[SHAPE], *(s for name, s in SHAPES.items() if name != SHAPE), Z17_382]


def measure_shape(shape: LparShape, install: ImageInstall, lscpu: str | None, reps: int, warmup: int,
                  tmp: Path) -> tuple[dict[str, list[float]], list[float], str | None]:
    """Times per side (agent, floor, lscpu), read_sysfs in this process, and why lscpu is missing."""
    model = build_topology(shape)
    tree = tmp / shape.name
    write_sysfs_tree(model, tree)
    env = install.run_env()
    agent_cmd = [str(install.script), "discover", "--format", "json", "--host-root", str(tree),
                 "--proc-root", str(tree / "proc")]
    floor_cmd = [str(install.python), "-c", "pass"]
    lscpu_cmd = [lscpu or "lscpu", "-J", "--sysroot", str(tree), f"-e={LSCPU_COLUMNS}"]

    _, out = timed(agent_cmd, env, tmp)
    listed = {c for g in json.loads(out).get("groups", []) for c in g.get("cpus", [])}
    usable = {c.cpu for c in model.cpus if c.online and c.configured}
    if not listed <= usable or (shape.topology_facility and not listed):  # a guest has no groups
        raise BenchError(f"{shape.name}: discover listed CPUs {sorted(listed)[:8]}..., not the tree's")
    lscpu_problem = None
    if lscpu is None:
        lscpu_problem = "lscpu is not on PATH"
    else:
        probe = subprocess.run(lscpu_cmd, capture_output=True, check=False)
        if probe.returncode != 0:
            lscpu_problem = f"lscpu failed: {probe.stderr.decode().strip()[:200]}"
        elif probe.stdout.count(b'"cpu": ') != len(model.cpus):  # not json.loads: lscpu writes an offline
            # CPU's unknown core as a bare - (invalid JSON), so count the CPUs it lists
            raise BenchError(f"{shape.name}: lscpu did not list every CPU of the tree")
    sides: list[tuple[str, list[str]]] = [("agent", agent_cmd), ("floor", floor_cmd)]
    if lscpu_problem is None:
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
    return times, reader, lscpu_problem


def floor_note(agent: float, floor: float, lscpu: float) -> str:
    """What the interpreter's start leaves of 2 x lscpu for discover's own work (imports, reading, output)."""
    left = TARGET_RATIO * lscpu - floor
    if left <= 0:
        return (f"python -c pass alone is {floor / lscpu:.2f} x lscpu: no CPython process is within "
                f"{TARGET_RATIO} x here")
    return (f"{TARGET_RATIO} x lscpu leaves {fmt_time(left)} after the interpreter's start; discover's own work "
            f"(imports, reading, output) takes {fmt_time(agent - floor)}")


def run(quick: bool) -> list[Row]:
    reps, warmup = (10, 2) if quick else (40, 3)
    other_reps = (6, 1) if quick else (20, 2)  # the shapes after z16-400
    install = image_install()
    lscpu = shutil.which("lscpu")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp_name:
        tmp = Path(tmp_name)
        for n, shape in enumerate(shapes()):
            times, reader, lscpu_problem = measure_shape(shape, install, lscpu, *((reps, warmup) if n == 0
                                                                                   else other_reps), tmp)
            cpus = f"{shape.cpu_count} CPUs"
            label = f"discover --format json vs lscpu -J, {shape.name} ({cpus}), processes"
            agent, floor = times["agent"], times["floor"]
            if lscpu_problem is not None:
                rows.append(skipped(BENCH, label, f"ratio <= {TARGET_RATIO}", lscpu_problem))
            else:
                ls = times["lscpu"]
                ratio = median(agent) / median(ls)
                pairs = [a / b for a, b in zip(agent, ls, strict=True)]
                floor_ratio = median(floor) / median(ls)
                rows.append(Row(BENCH, label,
                                f"agent {fmt_time(median(agent))} / lscpu {fmt_time(median(ls))} = {ratio:.2f} (min "
                                f"{fmt_time(min(agent))} / {fmt_time(min(ls))}; pairs {spread(pairs)}; "
                                f"{len(agent)} each; python -c pass {fmt_time(median(floor))} = {floor_ratio:.2f} x "
                                f"lscpu; read_sysfs in-process {fmt_time(median(reader))})", ratio,
                                f"ratio <= {TARGET_RATIO}", at_most(ratio, TARGET_RATIO),
                                install.how if n == 0 else floor_note(median(agent), median(floor), median(ls)),
                                raw={"shape": shape.name, "agent_s": agent, "lscpu_s": ls, "floor_s": floor,
                                     "read_sysfs_s": reader}))
            if n == 0:
                rows.append(Row(BENCH, "reference: python -c pass (same venv)",
                                f"{fmt_time(median(floor))} median; agent - floor "
                                f"{fmt_time(median(agent) - median(floor))}", median(floor), "", INFO))
                rows.append(Row(BENCH, f"reference: read_sysfs in-process, {cpus}",
                                f"{fmt_time(median(reader))} median of {len(reader)} (what a full rescan reads)",
                                median(reader), "", INFO))
    return rows


def main(argv: list[str] | None = None) -> int:
    return bench_main(BENCH, run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
